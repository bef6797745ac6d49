//go:build interop

package interop

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
)

// A stored seq older than Jetstream's lookback is refused (CursorTooOld):
// appview logs the gap with its size, records it, requests a backfill
// run, resumes from the oldest event and keeps consuming.
func TestCursorTooOldIsLoggedRecordedAndResumedFromTheFloor(t *testing.T) {
	parallel(t)
	// Jetstream's lookback floor moves by sealed segment; a compaction
	// pass seals the active one, so a short interval seals every second.
	w := newWorld(t, 1, "--cursor-lookback", "3s", "--compaction-interval", "1s")
	j := w.js[0]
	db := filepath.Join(w.dir, "old.db")
	seed(t, db, j.addr, 1)
	waitTooOld(t, j, 1, 30*time.Second)
	a := appview(t, w.c, "appview", db, []string{j.v2URL()}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	isGap := func(e harness.Event) bool { return strings.HasPrefix(e.Msg, "Jetstream gap") }
	if _, err := a.Wait(ctx, isGap); err != nil {
		t.Fatalf("no gap logged: %v\n%s", err, a.Tail(20))
	}
	// The floor moves every second here, so the resume at the floor can
	// itself be refused: each refusal is a gap of its own, from the floor
	// the one before named; the first batch starts at the last floor.
	first := waitSeq(t, j.addr, 1, 30*time.Second, a)
	gaps := a.Log.Find(0, isGap)
	from := int64(1)
	var spans [][2]int64
	for _, e := range gaps {
		floor := num(e, "floor")
		if num(e, "cursor") != from || num(e, "gap_events") != floor-from || floor <= from {
			t.Fatalf("gap logged from seq %d, want a gap from %d with its size: %s", num(e, "cursor"), from, e.Line)
		}
		spans = append(spans, [2]int64{from, floor})
		from = floor
	}
	if first.first > from {
		t.Fatalf("first batch after the refusal starts at seq %d, want the floor %d", first.first, from)
	}
	d := stoppedDB(t, a, db)
	rows, err := d.Query(`SELECT from_seq, to_seq FROM jetstream_gaps WHERE host = ?1 ORDER BY from_seq`, j.addr)
	if err != nil {
		t.Fatal(err)
	}
	var stored [][2]int64
	for rows.Next() {
		var s [2]int64
		if err := rows.Scan(&s[0], &s[1]); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var runs int
	if err := d.QueryRow(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NULL`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(stored) != fmt.Sprint(spans) || runs != 1 {
		t.Fatalf("gap rows %v and %d pending backfill runs, want %v (the gaps logged) and 1", stored, runs, spans)
	}
}

// A position by time older than Jetstream's lookback (a resume on another
// host than the stored one's) is clamped to the host's oldest event and
// announced (#info OutdatedCursor): appview logs the gap in time, records
// it with the time cursor and the first event's time and seq, requests a
// backfill run and keeps consuming.
func TestOutdatedTimeCursorIsLoggedRecordedAndResumed(t *testing.T) {
	parallel(t)
	w := newWorld(t, 1, "--cursor-lookback", "3s", "--compaction-interval", "1s")
	j := w.js[0]
	db := filepath.Join(w.dir, "old.db")
	seed(t, db, "elsewhere.invalid:443", 5)
	// The stored host is not j: the consumer resumes j by the shared time,
	// ten minutes ago, far below a 3 s lookback.
	old := time.Now().Add(-10 * time.Minute).UnixMicro()
	func() {
		d, err := database.Open(context.Background(), database.Options{URL: "file:" + db, BusyTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if _, err := d.Exec(`UPDATE jetstream_cursor SET time_us = ?1, shared_us = ?1 WHERE id = 1`, old); err != nil {
			t.Fatal(err)
		}
	}()
	a := appview(t, w.c, "appview", db, []string{j.v2URL()}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	isGap := func(e harness.Event) bool { return strings.HasPrefix(e.Msg, "Jetstream gap") }
	gap, err := a.Wait(ctx, isGap)
	if err != nil {
		t.Fatalf("no gap logged: %v\n%s", err, a.Tail(20))
	}
	cursorUS, firstUS := num(gap, "cursor_us"), num(gap, "first_us")
	if cursorUS <= 0 || cursorUS > old || firstUS <= cursorUS {
		t.Fatalf("gap logged from %d to %d µs, want from at most the stored %d to a later first event: %s", cursorUS, firstUS, old, gap.Line)
	}
	waitSeq(t, j.addr, 1, 30*time.Second, a)
	d := stoppedDB(t, a, db)
	var fromSeq, toSeq, fromUS, toUS int64
	if err := d.QueryRow(`SELECT from_seq, to_seq, from_time_us, to_time_us FROM jetstream_gaps WHERE host = ?1`, j.addr).
		Scan(&fromSeq, &toSeq, &fromUS, &toUS); err != nil {
		t.Fatalf("gap row of %s: %v", j.addr, err)
	}
	var runs int
	if err := d.QueryRow(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NULL`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if fromSeq != 0 || toSeq <= 0 || fromUS != cursorUS || toUS != firstUS || runs != 1 {
		t.Fatalf("gap row seq %d..%d, time %d..%d, %d pending backfill runs; want seq 0..first, the logged times %d..%d and 1 run",
			fromSeq, toSeq, fromUS, toUS, runs, cursorUS, firstUS)
	}
}

// stoppedDB stops a and opens its file database db, closed when t ends.
func stoppedDB(t *testing.T, a *harness.Instance, db string) *database.DB {
	t.Helper()
	if _, err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, err := database.Open(context.Background(), database.Options{URL: "file:" + db, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// waitTooOld returns once j refuses cursor as older than its lookback
// (CursorTooOld at the upgrade), failing the test after within.
func waitTooOld(t *testing.T, j *jetstreamServer, cursor int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		conn, resp, err := websocket.DefaultDialer.Dial(fmt.Sprintf("%s?collections=%s&cursor=%d", j.v2URL(), collections, cursor), nil)
		if err == nil {
			conn.Close()
		} else if resp != nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), "CursorTooOld") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still serves cursor %d after %v", j.addr, cursor, within)
		}
		time.Sleep(100 * time.Millisecond) // a poll: the refusal has no signal of its own
	}
}
