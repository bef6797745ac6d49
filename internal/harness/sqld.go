package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// probeEvery is the polling period of readiness probes (sqld /health, a
// command that must succeed): there is no event to wait on from outside
// the process, so the harness polls, bounded by the caller's context.
const probeEvery = 20 * time.Millisecond

// SqldSpec describes one sqld server to start.
type SqldSpec struct {
	// Bin is the sqld binary.
	Bin string
	// Dir is its --db-path.
	Dir string
	// Listen is --http-listen-addr; "" picks a free loopback port.
	Listen string
	// Wrap prefixes the command (e.g. ip netns exec NAME).
	Wrap []string
	// Probe says whether the server answers; nil means GET /health on
	// Listen from this process (which cannot reach into a namespace).
	Probe func(ctx context.Context) error
}

// Sqld is a running sqld server.
type Sqld struct {
	// URL is the database.url that reaches it: http://Listen.
	URL string
	// Listen is its HTTP address.
	Listen string
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

// StartSqld starts sqld and waits until it answers or ctx ends. A missing
// binary is an error naming the path (callers must fail, not skip).
func StartSqld(ctx context.Context, s SqldSpec) (*Sqld, error) {
	if _, err := os.Stat(s.Bin); err != nil {
		return nil, fmt.Errorf("harness: sqld binary: %w (set SQLD_BIN or run scripts/test, which installs it)", err)
	}
	if s.Listen == "" {
		addr, err := FreeLoopbackAddr()
		if err != nil {
			return nil, err
		}
		s.Listen = addr
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(filepath.Dir(s.Dir), filepath.Base(s.Dir)+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	args := append(append([]string(nil), s.Wrap...), s.Bin, "--db-path", s.Dir, "--http-listen-addr", s.Listen, "--no-welcome")
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = cleanEnv()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("harness: start sqld: %w", err)
	}
	q := &Sqld{URL: "http://" + s.Listen, Listen: s.Listen, cmd: cmd, exited: make(chan struct{}), log: logPath}
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(q.exited)
	}()
	probe := s.Probe
	if probe == nil {
		probe = q.probeHealth
	}
	if err := q.poll(ctx, probe); err != nil {
		q.Stop()
		return nil, err
	}
	return q, nil
}

func (q *Sqld) probeHealth(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, q.URL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sqld /health: HTTP %d", resp.StatusCode)
	}
	return nil
}

func (q *Sqld) poll(ctx context.Context, probe func(context.Context) error) error {
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	var last error
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		last = probe(pctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-q.exited:
			data, _ := os.ReadFile(q.log)
			return fmt.Errorf("harness: sqld exited before answering: %s", data)
		case <-ctx.Done():
			return fmt.Errorf("harness: sqld not answering on %s: %w (last: %v)", q.Listen, ctx.Err(), last)
		case <-t.C:
		}
	}
}

// Signal sends sig to sqld (SIGSTOP makes the database hang, not refuse).
func (q *Sqld) Signal(sig syscall.Signal) error { return q.cmd.Process.Signal(sig) }

// Stop stops sqld (SIGTERM, then SIGKILL after closeGrace) and waits.
func (q *Sqld) Stop() {
	select {
	case <-q.exited:
		return
	default:
	}
	_ = q.cmd.Process.Signal(syscall.SIGCONT)
	_ = q.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-q.exited:
	case <-time.After(closeGrace):
		_ = q.cmd.Process.Kill()
		<-q.exited
	}
}

// FreeLoopbackAddr returns 127.0.0.1:PORT with a port the kernel picked
// and that was free a moment ago. It never returns 5001, the default
// admin port of a real instance that may be running on this host.
func FreeLoopbackAddr() (string, error) {
	for range 8 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		if err := ln.Close(); err != nil {
			return "", err
		}
		if _, port, _ := net.SplitHostPort(addr); port != "5001" {
			return addr, nil
		}
	}
	return "", errors.New("harness: no free loopback port")
}
