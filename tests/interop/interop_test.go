//go:build interop

// Package interop runs real `appview serve` processes against Bluesky's
// own Jetstream v2 server and network simulator (prebuilt in
// ../shared/tools/jetstream-v2, or JETSTREAM_V2_DIR). Tier 1: the
// Jetstream protocol (both wires, positions, failover, silent upstream,
// CursorTooOld, health-aware custody). Run it with scripts/interop.
//
// What "saw" means here: with log_level debug the consumer logs every
// committed batch ("jetstream batch committed": host, first_seq,
// last_seq). A probe client reads the same Jetstream from its first event
// with the same filter; every sequence number the probe saw must fall in
// a committed batch's range (no gap), and every start must resume at or
// past the last committed batch (no regression).
package interop

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// Timings of the suite.
const (
	// staleTimeout is jetstream.stale_timeout of every appview here.
	staleTimeout = 3 * time.Second
	// simRate is the simulator's commits per second.
	simRate = 150
	// backlogEvents is the backlog the catch-up figures are measured on,
	// about what 15 s of the simulator at 1500 commits per second gave on
	// 2 shared cores (it signs one commit at a time, and Jetstream
	// verifies each: those 15 s took both cores). Three quarters of it
	// are backlogAccounts x backlogRecords records at bootstrap, which
	// Jetstream serves as creates within seconds; the rest is the live
	// traffic of those seconds at simRate (creates, updates, deletes,
	// identity events), so that both wires meet every kind of event.
	backlogEvents   = 4000
	backlogAccounts = 100
	backlogRecords  = 30
	// collections: the simulator's traffic is app.bsky.*; the consumer
	// asks for it so that every commit moves its position (the processor
	// skips them as outside io.atcr, counted).
	collections = "app.bsky.*"
)

var (
	bin   string // the appview binary
	tools string // the directory holding jetstream and simulator
)

func TestMain(m *testing.M) {
	start := time.Now()
	code := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		root, err := harness.ModuleRoot(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		scratch, err := os.MkdirTemp("", "appview-interop-*")
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		defer os.RemoveAll(scratch)
		tools, err = findTools(root, scratch)
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop: FAIL:", err)
			return 1
		}
		// Jetstream refuses any JETSTREAM_* variable it does not know,
		// and the processes started here inherit this environment.
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "JETSTREAM_") {
				os.Unsetenv(k)
			}
		}
		bin = filepath.Join(scratch, "appview")
		if err := harness.Build(ctx, root, "./cmd/appview", bin, false); err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "interop tier 1: appview built in %s\n", time.Since(start).Round(100*time.Millisecond))
		return m.Run()
	}()
	fmt.Fprintf(os.Stderr, "interop tier 1: %s\n", time.Since(start).Round(time.Second))
	os.Exit(code)
}

// findTools locates the prebuilt jetstream and simulator: JETSTREAM_V2_DIR
// or ../shared/tools/jetstream-v2 from the module root. Binaries without
// the run bit are copied into scratch and made executable there. Absent
// tools are an error, never a skip.
func findTools(root, scratch string) (string, error) {
	dir := os.Getenv("JETSTREAM_V2_DIR")
	if dir == "" {
		// shared/ sits beside the clone (CI) or two levels up (a worktree).
		dir = filepath.Join(root, "..", "shared", "tools", "jetstream-v2")
		if _, err := os.Stat(dir); err != nil {
			if up := filepath.Join(root, "..", "..", "shared", "tools", "jetstream-v2"); exists(up) {
				dir = up
			}
		}
	}
	var copyTo string
	for _, name := range []string{"jetstream", "simulator"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("Jetstream v2 tools not found (%v): set JETSTREAM_V2_DIR to the folder holding jetstream and simulator", err)
		}
		if fi.Mode()&0o111 == 0 {
			copyTo = filepath.Join(scratch, "tools")
		}
	}
	if copyTo == "" {
		return dir, nil
	}
	if err := os.MkdirAll(copyTo, 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"jetstream", "simulator"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(copyTo, name), b, 0o755); err != nil {
			return "", err
		}
	}
	return copyTo, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
