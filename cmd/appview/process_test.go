package main

// The subprocess side of the command's tests: TestMain builds the real
// binary once (with -race when the tests run with -race, so a data race
// in a child process fails the test that started it), and the helpers
// here run it the way an operator would, in a temp dir, with an
// environment free of the caller's APPVIEW_* variables.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/stopsignal"
	"github.com/atcr-io/appview/internal/testsupport"
)

// appviewBin is the binary TestMain built.
var appviewBin string

const (
	// runTimeout bounds a command that should finish on its own.
	runTimeout = 60 * time.Second
	// startTimeout bounds how long a serve process may take to report
	// "appview started" (a race-enabled binary on a loaded 2-core machine
	// is slow; a healthy one takes tens of ms).
	startTimeout = 30 * time.Second
	// pollEvery is the polling period of waitFor.
	pollEvery = 20 * time.Millisecond
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	// The test binary links package main, and with it the subscription to
	// SIGINT and SIGTERM that run hands to serve: give them back their
	// default action, so that an interrupted test run stops.
	stopsignal.ReleaseSignals()
	dir, err := os.MkdirTemp("", "appview-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// Stamped as a release build is (deploy/Dockerfile): that one link
	// serves every test, TestLdflagsOverrideVersionAndCommit included,
	// which used to link a binary of its own; under scripts/test it is
	// the one linked for tests/ too (harness.TestBinary).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := harness.ModuleRoot(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if appviewBin, err = harness.TestBinary(ctx, root, filepath.Join(dir, "appview"), raceEnabled); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// childEnv is the test process's environment without APPVIEW_* variables
// (a developer's APPVIEW_DATABASE_URL, or the SQLD_BIN that
// scripts/test exports, would otherwise reach the child, and config.Load
// refuses unknown APPVIEW_* names), plus extra.
//
// A race-enabled child would sleep 1 s at exit (GORACE atexit_sleep_ms
// defaults to 1000), which is not the product's stop time: it is set to 0.
func childEnv(extra ...string) []string {
	var env []string
	gorace := "atexit_sleep_ms=0"
	for _, kv := range os.Environ() {
		switch {
		case strings.HasPrefix(kv, "APPVIEW_"):
		case strings.HasPrefix(kv, "GORACE="):
			gorace = strings.TrimPrefix(kv, "GORACE=") + " " + gorace
		default:
			env = append(env, kv)
		}
	}
	env = append(env, "GORACE="+gorace)
	return append(env, extra...)
}

// result is a finished command.
type result struct {
	stdout, stderr string
	code           int
}

// runAppview runs the binary to completion in dir.
func runAppview(t *testing.T, dir string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, appviewBin, args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("appview %s: no exit within %s\nstderr:\n%s", strings.Join(args, " "), runTimeout, stderr.String())
	}
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("appview %s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// proc is a running `appview serve`.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	dir    string
	stderr *testsupport.LockedBuffer
	done   chan struct{}
	code   int // valid after done is closed
}

// startServe starts `appview serve args...` in dir.
func startServe(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	return startAppview(t, dir, env, append([]string{"serve"}, args...)...)
}

// startAppview starts `appview args...` in dir.
func startAppview(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(appviewBin, args...)
	cmd.Dir, cmd.Env = dir, env
	p := &proc{t: t, cmd: cmd, dir: dir, stderr: &testsupport.LockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = io.Discard, p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start appview %s: %v", strings.Join(args, " "), err)
	}
	go func() {
		err := cmd.Wait()
		p.code = 0
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.code = 128 + int(ws.Signal())
			}
		} else if err != nil {
			p.code = -1
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("appview serve stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// wait waits at most d for the process to exit and returns its exit code.
func (p *proc) wait(d time.Duration) (int, time.Duration) {
	p.t.Helper()
	start := time.Now()
	select {
	case <-p.done:
		return p.code, time.Since(start)
	case <-time.After(d):
		p.t.Fatalf("appview serve did not exit within %s\nstderr:\n%s", d, p.stderr.String())
		return 0, 0
	}
}

// lines returns every complete stderr line so far.
func (p *proc) lines() []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out
}

// logLines returns every stderr line that is a JSON object, decoded.
func (p *proc) logLines() []map[string]any {
	var out []map[string]any
	for _, line := range p.lines() {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// logLine finds the first stderr JSON line whose fields include want.
func (p *proc) logLine(want map[string]string) (map[string]any, bool) {
	for _, m := range p.logLines() {
		match := true
		for k, v := range want {
			if s, _ := m[k].(string); s != v {
				match = false
				break
			}
		}
		if match {
			return m, true
		}
	}
	return nil, false
}

// waitLog waits for a stderr line with the given fields.
func (p *proc) waitLog(d time.Duration, want map[string]string) map[string]any {
	p.t.Helper()
	var m map[string]any
	p.waitFor(d, fmt.Sprintf("a log line with %v", want), func() bool {
		var ok bool
		m, ok = p.logLine(want)
		return ok
	})
	return m
}

// waitFor polls cond until it holds, failing the test at the deadline or
// when the process exits first.
func (p *proc) waitFor(d time.Duration, what string, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !cond() {
		if p.exited() {
			p.t.Fatalf("appview serve exited (code %d) while waiting for %s\nstderr:\n%s", p.code, what, p.stderr.String())
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("no %s within %s\nstderr:\n%s", what, d, p.stderr.String())
		}
		<-tick.C
	}
}

// started waits for "appview started" and returns the admin base URL.
func (p *proc) started() string {
	p.t.Helper()
	m := p.waitLog(startTimeout, map[string]string{"msg": "appview started"})
	addr, _ := m["admin"].(string)
	if addr == "" {
		p.t.Fatalf("\"appview started\" names no admin address: %v", m)
	}
	return "http://" + addr
}

// get fetches url and returns the status and body (status 0 on a
// transport error).
func get(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// freePort returns a TCP port that was free a moment ago, for servers
// (sqld) that cannot report the port they bound.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
