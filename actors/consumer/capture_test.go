package consumer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

func TestRealTrafficLeavesNoRowsAndEndsOnTheLastEvent(t *testing.T) {
	path := filepath.Join(captureDir, "expected_v1.jsonl")
	want := lastTimeUS(t, path)
	for _, compress := range []bool{false, true} {
		for _, filter := range [][]string{nil, {"io.atcr.*"}} {
			t.Run(fmt.Sprintf("compress=%v/collections=%v", compress, filter), func(t *testing.T) {
				srv, err := jetstream.NewReplayServer(jetstream.ReplayOptions{File: path, Listen: "127.0.0.1:0"}, zerolog.Nop())
				if err != nil {
					t.Fatal(err)
				}
				served := make(chan error, 1)
				go func() { served <- srv.ListenAndServe(context.Background()) }()
				<-srv.Listening()
				t.Cleanup(func() { srv.Close(); <-served })

				db := testsupport.OpenDB(t)
				sys := testsupport.NewActorSystem(t)
				logs := &syncBuffer{}
				f := &fixture{srv: srv}
				o := f.options(db.DB, acquire(t, db.DB, "me"))
				o.Jetstream.Compress, o.Jetstream.Collections = compress, filter
				o.Log = zerolog.New(logs).Level(zerolog.WarnLevel)
				o.Processor = processor.New(processor.Options{Log: zerolog.New(logs).Level(zerolog.WarnLevel)})
				pid := sys.Root.Spawn(NewProps(o))
				testsupport.Eventually(t, "the cursor to reach the capture's last event", func() bool { return cursorAt(db.DB) == want })
				stop(t, sys, pid)

				for _, table := range []string{"manifests", "tags", "stars", "repo_pages", "hold_captains",
					"hold_crew", "repository_hold_stats", "repository_stats", "users", "webhook_deliveries"} {
					var n int
					if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil || n != 0 {
						t.Errorf("%s has %d rows (%v), want none: the capture has no io.atcr records", table, n, err)
					}
				}
				if got := cursorAt(db.DB); got != want {
					t.Errorf("cursor %d, want the last event's %d", got, want)
				}
				if s := logs.String(); s != "" {
					t.Errorf("logged at warn or above on real traffic:\n%s", s)
				}
			})
		}
	}
}
