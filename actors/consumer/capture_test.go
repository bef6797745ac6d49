package consumer

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// captureDir holds real Jetstream v1 traffic (copied with its licence).
var captureDir = filepath.Join("..", "..", "internal", "jetstream", "testdata")

// lastTimeUS is the time_us of the capture's last line: the cursor a
// consumer must end on (docs/spec.md §8: the last fully processed event).
func lastTimeUS(t *testing.T, path string) int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			last = l
		}
	}
	var e struct {
		TimeUS int64 `json:"time_us"`
	}
	if err := json.Unmarshal([]byte(last), &e); err != nil {
		t.Fatal(err)
	}
	return e.TimeUS
}

func TestRealTrafficLeavesNoRecordRowsAndEndsOnTheLastEvent(t *testing.T) {
	path := filepath.Join(captureDir, "expected_v1.jsonl")
	want := lastTimeUS(t, path)
	for _, compress := range []bool{false, true} {
		for _, filter := range [][]string{nil, {"io.atcr.*"}} {
			t.Run(fmt.Sprintf("compress=%v/collections=%v", compress, filter), func(t *testing.T) {
				srv := serveReplay(t, jetstream.ReplayOptions{File: path, Listen: "127.0.0.1:0"}, zerolog.Nop())

				db := testsupport.OpenDB(t)
				sys := testsupport.NewActorSystem(t)
				logs := &testsupport.LockedBuffer{}
				f := &fixture{srv: srv}
				o := f.options(db, acquire(t, db, "me"))
				o.Jetstream.Compress, o.Jetstream.Collections = compress, filter
				o.Log = zerolog.New(logs).Level(zerolog.WarnLevel)
				o.Processor = processor.New(processor.Options{Log: zerolog.New(logs).Level(zerolog.WarnLevel)})
				pid := sys.Root.Spawn(NewProps(o))
				testsupport.Eventually(t, "the cursor to reach the capture's last event", func() bool { return cursorAt(db) == want })
				stop(t, sys, pid)

				for _, table := range []string{"manifests", "tags", "stars", "repo_pages", "hold_captains",
					"hold_crew", "repository_hold_stats", "repository_stats", "webhook_deliveries"} {
					var n int
					if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil || n != 0 {
						t.Errorf("%s has %d rows (%v), want none: the capture has no io.atcr records", table, n, err)
					}
				}
				// Its one #identity/#account account keeps a users row (the
				// first event of a DID is kept) and no profile.
				var n int
				if err := db.QueryRow(`SELECT COUNT(*) FROM users WHERE profile_created_at IS NOT NULL`).Scan(&n); err != nil || n != 0 {
					t.Errorf("%d users rows with a profile (%v), want none", n, err)
				}
				if got := cursorAt(db); got != want {
					t.Errorf("cursor %d, want the last event's %d", got, want)
				}
				if s := logs.String(); s != "" {
					t.Errorf("logged at warn or above on real traffic:\n%s", s)
				}
			})
		}
	}
}

// The same capture delivered in two batches split right after its newest
// event: the second holds only events Jetstream sent later but stamped a
// little earlier (its live tail is out of time_us order). The consumer
// must still end on the last event; it used to keep the newest one's
// time_us for good, since the second batch's own newest time_us was below
// it (what made the test above fail when the linger split there).
func TestASplitAfterTheNewestEventStillEndsOnTheLastEvent(t *testing.T) {
	path := filepath.Join(captureDir, "expected_v1.jsonl")
	want := lastTimeUS(t, path)
	split := newestIndex(t, path) + 1
	srv := serveReplay(t, jetstream.ReplayOptions{File: path, Listen: "127.0.0.1:0"}, zerolog.Nop())

	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	f := &fixture{srv: srv}
	o := f.options(db, acquire(t, db, "me"))
	o.Jetstream.Compress, o.Jetstream.Collections = false, nil
	// The first batch fills at the newest event; the rest lingers into a
	// second one.
	o.BatchSize, o.BatchLinger = split, time.Second
	pid := sys.Root.Spawn(NewProps(o))
	testsupport.Eventually(t, "the cursor to reach the capture's last event", func() bool { return cursorAt(db) == want })
	stop(t, sys, pid)
}

// newestIndex is the index of the capture's line with the largest time_us,
// which must come before its last line.
func newestIndex(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ts []int64
	for _, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l == "" {
			continue
		}
		var e struct {
			TimeUS int64 `json:"time_us"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		ts = append(ts, e.TimeUS)
	}
	best := 0
	for i := range ts {
		if ts[i] > ts[best] {
			best = i
		}
	}
	if best == len(ts)-1 {
		t.Fatal("the capture's newest event is its last: nothing to split after it")
	}
	return best
}
