package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
)

// A database file replaced under a running instance: its releases would
// land in the unlinked file nobody reads. The stop must say so and exit 1,
// never log "every lease released" while the real file still shows the
// leases held.
func TestAStopAfterTheDatabaseFileWasReplacedDoesNotClaimItReleased(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startServe(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0"))
	p.started()
	started, _ := p.logLine(map[string]string{"msg": "appview started"})
	instance := asString(started["instance"])
	path := filepath.Join(dir, "data", "appview.db")
	db := testsupport.OpenUnmigrated(t, path)
	p.waitFor(startTimeout, "a lease held by the instance", func() bool { return len(heldLeases(t, db.DB, instance)) > 0 })
	db.Close()

	// Replace the file the way a restore from backup does: a copy, renamed
	// over the original.
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	copyPath := path + ".restored"
	if err := os.WriteFile(copyPath, body, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(copyPath, path); err != nil {
		t.Fatal(err)
	}
	for _, suffix := range []string{"-wal", "-shm"} {
		_ = os.Remove(path + suffix)
	}

	p.signal(syscall.SIGTERM)
	code, _ := p.wait(stopBound + 10*time.Second)
	if code != 1 {
		t.Fatalf("exit %d after SIGTERM on a replaced file, want 1", code)
	}
	if _, ok := p.logLine(map[string]string{"msg": "stopped: every lease released"}); ok {
		t.Fatalf("the stop claimed every lease released:\n%s", strings.Join(p.lines(), "\n"))
	}
	if _, ok := p.logLine(map[string]string{"level": "error", "msg": "the database file was deleted or replaced under this process: its workers stop (their writes are refused, its leases given up at their next renewal) and it cannot recover; restart it"}); !ok {
		t.Fatalf("no error line says the file was replaced and a restart is needed:\n%s", strings.Join(p.lines(), "\n"))
	}
	if !strings.Contains(strings.Join(p.lines(), "\n"), "not released") {
		t.Fatalf("the stop does not name the leases it could not release:\n%s", strings.Join(p.lines(), "\n"))
	}
}

// A new user deleted the database file under a running holder and started
// a second instance, which created a new file and acquired the leases
// there: the first instance's consumer went on committing into its
// deleted file (which nobody reads) for five more seconds, until its
// renew deadline, while the second ran the same worker. Once the
// replacement is detected, the holder's fenced writes are refused and
// each lease is given up at its next renewal, well before the deadline.
func TestAReplacedDatabaseFileEndsCustodyAtTheNextRenewalNotAtTheDeadline(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := startServe(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0",
		"APPVIEW_LEASES_TTL=20s", "APPVIEW_LEASES_RENEW_INTERVAL=200ms", "APPVIEW_LEASES_RENEW_DEADLINE=15s"))
	p.started()
	started, _ := p.logLine(map[string]string{"msg": "appview started"})
	instance := asString(started["instance"])
	path := filepath.Join(dir, "data", "appview.db")
	db := testsupport.OpenUnmigrated(t, path)
	var held []string
	p.waitFor(startTimeout, "a lease held by the instance", func() bool {
		held = heldLeases(t, db.DB, instance)
		return len(held) > 0
	})
	db.Close()

	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	deleted := time.Now()
	// The renew deadline is 15 s: custody ending within 10 s of the
	// deletion can only be the renewal's doing (about 200 ms on an idle
	// host; the margin is for a loaded one under -race).
	for _, name := range held {
		lost := p.waitLog(10*time.Second, map[string]string{"event": "lease.lost", "lease": name})
		if r := asString(lost["reason"]); r != "error" {
			t.Errorf("%s lost with reason %q, want error", name, r)
		}
		if e := asString(lost["error"]); !strings.Contains(e, "deleted or replaced") {
			t.Errorf("%s lost with error %q, want it to say the file was deleted or replaced", name, e)
		}
	}
	t.Logf("every lease given up %v after the deletion", time.Since(deleted).Round(time.Millisecond))
	p.signal(syscall.SIGTERM)
	if code, _ := p.wait(stopBound + 10*time.Second); code != 0 {
		t.Fatalf("exit %d: nothing was held when the stop began (README: 0)", code)
	}
	// The grants given up stand in the deleted file until their TTL (the
	// hand-backs cannot land): the last line must not say every lease was
	// released, and names them (a new user read "every lease released"
	// after three warnings that the hand-backs failed).
	if _, ok := p.logLine(map[string]string{"msg": "stopped: every lease released"}); ok {
		t.Fatalf("the stop claimed every lease released:\n%s", strings.Join(p.lines(), "\n"))
	}
	last, ok := p.logLine(map[string]string{"level": "warn", "msg": "stopped: every lease held at the stop released; grants given up earlier were never handed back and run out their TTL"})
	if !ok {
		t.Fatalf("no last line names the grants given up:\n%s", strings.Join(p.lines(), "\n"))
	}
	for _, name := range held {
		if !strings.Contains(fmt.Sprint(last["given_up"]), name) {
			t.Errorf("the last line's given_up %v does not name %s", last["given_up"], name)
		}
	}
}
