package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"
)

// Timing is the leases.* block of docs/spec.md §3.
type Timing struct {
	TTL, RenewInterval, RenewDeadline, RetryInterval time.Duration
}

// ShortTiming is the timing the multi-process tests and the benchmark run
// with: short enough that a crash handover takes seconds, and valid
// (renew_interval < ttl/2, renew_interval < renew_deadline < ttl).
var ShortTiming = Timing{TTL: 2 * time.Second, RenewInterval: 500 * time.Millisecond,
	RenewDeadline: 1500 * time.Millisecond, RetryInterval: 500 * time.Millisecond}

// unreachable is where the harness points every outbound endpoint it does
// not serve itself, so no instance ever reaches past this host: port 1 on
// loopback refuses at once.
const unreachable = "127.0.0.1:1"

// Spec describes one instance to start.
type Spec struct {
	// ID is the instance_id (required; unique per process start).
	ID string
	// DatabaseURL is database.url: file:PATH or http://HOST:PORT (sqld).
	DatabaseURL string
	// Timing is leases.*; zero means ShortTiming.
	Timing Timing
	// AdminAddr is admin.addr; "" means 127.0.0.1:0 (a free port, never 5001).
	AdminAddr string
	// LogLevel is log_level; "" means debug (lease.renewed and
	// lease.contended are debug events, docs/spec.md §5).
	LogLevel string
	// Set holds more keys by dotted YAML path, e.g. "cleanup.interval": "200ms".
	// They override the harness's defaults.
	Set map[string]any
	// Wrap prefixes the command, e.g. ip netns exec NAME. The wrapper must
	// exec the binary, so signals reach appview itself.
	Wrap []string
	// Bin, when set, is the appview binary to run instead of the one
	// StartInstance is given (the cluster's): another build, such as a
	// previous release in a rolling upgrade.
	Bin string
}

// config renders the YAML configuration of s: docs/spec.md §3 keys with every
// outbound endpoint pointed at this host.
func (s Spec) config() ([]byte, error) {
	t := s.Timing
	if t == (Timing{}) {
		t = ShortTiming
	}
	flat := map[string]any{
		"instance_id":              s.ID,
		"log_level":                orDefault(s.LogLevel, "debug"),
		"shutdown_timeout":         "10s",
		"database.url":             s.DatabaseURL,
		"admin.addr":               orDefault(s.AdminAddr, "127.0.0.1:0"),
		"leases.ttl":               t.TTL.String(),
		"leases.renew_interval":    t.RenewInterval.String(),
		"leases.renew_deadline":    t.RenewDeadline.String(),
		"leases.retry_interval":    t.RetryInterval.String(),
		"jetstream.urls":           []string{"ws://" + unreachable + "/subscribe"},
		"backfill.enabled":         false,
		"backfill.relay_endpoints": []string{"http://" + unreachable},
		"identity.plc_url":         "http://" + unreachable,
		"billing.stripe_api_url":   "http://" + unreachable,
		// The fake holds, PDSes and did:web documents listen on loopback,
		// which the outbound guard refuses by default.
		"network.allow_private": true,
	}
	for k, v := range s.Set {
		flat[k] = v
	}
	root := map[string]any{}
	for k, v := range flat {
		node := root
		parts := strings.Split(k, ".")
		for _, p := range parts[:len(parts)-1] {
			child, ok := node[p].(map[string]any)
			if !ok {
				child = map[string]any{}
				node[p] = child
			}
			node = child
		}
		node[parts[len(parts)-1]] = v
	}
	return yaml.Marshal(root)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Instance is one running (or exited) appview serve process.
type Instance struct {
	// ID is its instance_id.
	ID string
	// Dir holds config.yaml and stderr.log.
	Dir string
	// Log is its stderr as events.
	Log *Log

	cmd      *exec.Cmd
	exited   chan struct{}
	mu       sync.Mutex
	exitedAt time.Time
	exitErr  error
	admin    string
}

// StartInstance writes the configuration of s into dir/<ID>/config.yaml
// and starts `bin serve --config` with it. It returns once the process has
// been started, not once it is ready (see Ready).
func StartInstance(bin, dir string, s Spec) (*Instance, error) {
	if s.ID == "" || s.DatabaseURL == "" {
		return nil, errors.New("harness: Spec needs ID and DatabaseURL")
	}
	idir := filepath.Join(dir, s.ID)
	if err := os.MkdirAll(idir, 0o755); err != nil {
		return nil, err
	}
	cfg, err := s.config()
	if err != nil {
		return nil, fmt.Errorf("harness: render config of %s: %w", s.ID, err)
	}
	cfgPath := filepath.Join(idir, "config.yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, err
	}
	if s.Bin != "" {
		bin = s.Bin
	}
	args := append(append([]string(nil), s.Wrap...), bin, "serve", "--config", cfgPath)
	return StartCommand(idir, s.ID, args...)
}

// StartCommand starts any appview command (e.g. jetstream-replay) with
// its stderr read as events, like an instance's; dir receives stderr.log.
func StartCommand(dir, id string, args ...string) (*Instance, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	// Only what the process needs: no APPVIEW_* variables of the caller
	// leak into the configuration under test.
	cmd.Env = cleanEnv()
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	raw, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	i := &Instance{ID: id, Dir: dir, Log: newLog(), cmd: cmd, exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		raw.Close()
		return nil, fmt.Errorf("harness: start %s: %w", id, err)
	}
	go i.read(stderr, raw)
	return i, nil
}

// CleanEnv is this process's environment without APPVIEW_* variables:
// appview refuses an APPVIEW_ variable that names no configuration key
// (a caller's stray one makes it exit 2), and the configuration under test
// must come from the harness alone.
//
// A race-enabled binary sleeps 1 s at exit before it reports the races
// it found (GORACE atexit_sleep_ms defaults to 1000): every short command
// (appview leases, webhooks add, appview-dev synth) and every stop took a
// second longer than the program does. The sleep is set to 0, keeping
// any other GORACE option of the caller: a race found before the exit is
// reported as before (cmd/appview's tests run their children so too).
func CleanEnv() []string { return cleanEnv() }

func cleanEnv() []string {
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
	return append(env, "GORACE="+gorace)
}

// read consumes stderr to its end, then reaps the process: exec requires
// the pipe to be drained before Wait.
func (i *Instance) read(stderr io.Reader, raw *os.File) {
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		fmt.Fprintln(raw, line)
		i.Log.addLine(line)
	}
	err := i.cmd.Wait()
	raw.Close()
	i.mu.Lock()
	i.exitedAt, i.exitErr = time.Now(), err
	i.mu.Unlock()
	i.Log.close()
	close(i.exited)
}

// Pid is the process id.
func (i *Instance) Pid() int { return i.cmd.Process.Pid }

// Ready waits for the "appview started" line and returns it.
func (i *Instance) Ready(ctx context.Context) (Event, error) {
	e, err := i.Log.Wait(ctx, Msg("appview started"))
	if err != nil {
		return e, fmt.Errorf("harness: %s not started: %w (last lines:\n%s)", i.ID, err, i.Tail(10))
	}
	i.mu.Lock()
	i.admin = e.Str("admin")
	i.mu.Unlock()
	return e, nil
}

// AdminAddr is the bound admin address (known after Ready).
func (i *Instance) AdminAddr() string {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.admin
}

// Wait returns the first event m matches, waiting for it (see Log.WaitFrom).
func (i *Instance) Wait(ctx context.Context, m Match) (Event, error) {
	e, err := i.Log.Wait(ctx, m)
	if err != nil {
		return e, fmt.Errorf("harness: %s: %w", i.ID, err)
	}
	return e, nil
}

// Signal sends sig to the process.
func (i *Instance) Signal(sig syscall.Signal) error {
	return i.cmd.Process.Signal(sig)
}

// Freeze sends SIGSTOP and returns once every thread of the process is
// stopped (state T in /proc/PID/task/TID/stat). kill(2) only queues the
// signal: until the kernel delivers it, a thread running on another CPU
// goes on and may, for instance, take a database lock in that window.
// Errors: ctx.Err() when the threads have not all stopped in time.
func (i *Instance) Freeze(ctx context.Context) error {
	if err := i.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return WaitStopped(ctx, i.Pid())
}

// WaitStopped polls (every millisecond) until every thread of pid is in
// the stopped state (T, or t when traced), per proc(5).
func WaitStopped(ctx context.Context, pid int) error {
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for {
		running, err := runningThreads(pid)
		if err != nil {
			return err
		}
		if running == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("harness: pid %d: %d threads not stopped: %w", pid, running, ctx.Err())
		case <-t.C:
		}
	}
}

// runningThreads counts the threads of pid not in the stopped state.
func runningThreads(pid int) (int, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	running := 0
	for _, task := range tasks {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread exited between the two reads
			}
			return 0, err
		}
		// The state is the field after the command, which is in
		// parentheses and may itself contain ") ".
		end := strings.LastIndexByte(string(data), ')')
		if end < 0 || end+2 >= len(data) {
			return 0, fmt.Errorf("harness: unexpected /proc stat %q", data)
		}
		if state := data[end+2]; state != 'T' && state != 't' {
			running++
		}
	}
	return running, nil
}

// Exited is closed once the process has exited and its log is complete.
func (i *Instance) Exited() <-chan struct{} { return i.exited }

// Running reports whether the process has not exited yet.
func (i *Instance) Running() bool {
	select {
	case <-i.exited:
		return false
	default:
		return true
	}
}

// ExitedAt is when the harness saw the process end (zero while running).
func (i *Instance) ExitedAt() time.Time {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.exitedAt
}

// ExitCode waits for the process to exit and returns its exit code (-1
// when a signal killed it), or ctx.Err().
func (i *Instance) ExitCode(ctx context.Context) (int, error) {
	select {
	case <-i.exited:
	case <-ctx.Done():
		return 0, fmt.Errorf("harness: %s still running: %w", i.ID, ctx.Err())
	}
	return i.cmd.ProcessState.ExitCode(), nil
}

// Stop sends SIGTERM and waits for the exit code.
func (i *Instance) Stop(ctx context.Context) (int, error) {
	if i.Running() {
		if err := i.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return 0, err
		}
	}
	return i.ExitCode(ctx)
}

// Kill sends SIGKILL (also resuming a SIGSTOPped process's death) and
// waits for it to be reaped.
func (i *Instance) Kill() {
	if !i.Running() {
		return
	}
	_ = i.Signal(syscall.SIGKILL)
	<-i.exited
}

// RSS returns the process's resident set size in bytes (Linux
// /proc/PID/status VmRSS).
func (i *Instance) RSS() (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", i.Pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) == 2 && f[1] == "kB" {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024, err
			}
		}
	}
	return 0, errors.New("harness: no VmRSS in /proc status")
}

// Tail returns the last n lines of the raw stderr, for failure messages.
func (i *Instance) Tail(n int) string {
	data, _ := os.ReadFile(filepath.Join(i.Dir, "stderr.log"))
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
