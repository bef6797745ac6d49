package main

import (
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
	if _, ok := p.logLine(map[string]string{"level": "error", "msg": "the database file was deleted or replaced under this process: its leases end at their renew deadline and it cannot recover; restart it"}); !ok {
		t.Fatalf("no error line says the file was replaced and a restart is needed:\n%s", strings.Join(p.lines(), "\n"))
	}
	if !strings.Contains(strings.Join(p.lines(), "\n"), "not released") {
		t.Fatalf("the stop does not name the leases it could not release:\n%s", strings.Join(p.lines(), "\n"))
	}
}
