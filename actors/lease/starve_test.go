package lease

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// busyWorker commits fenced transactions back to back, each holding the
// write lock for a few tens of milliseconds, as a consumer catching up
// does: the holder's own writes compete with its renewals for SQLite's
// write lock, which is not fair (a waiter sleeps in the busy handler while
// the next transaction takes the lock).
type busyWorker struct {
	db      *database.DB
	c       fence.Custody
	commits *atomic.Int64
	cancel  context.CancelFunc
	done    chan struct{}
}

func (w *busyWorker) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		run, cancel := context.WithCancel(context.Background())
		w.cancel, w.done = cancel, make(chan struct{})
		go func() {
			defer close(w.done)
			for run.Err() == nil {
				err := fence.Fenced(run, w.db, w.c, func(tx *sql.Tx) error {
					for i := 0; i < 400; i++ {
						if _, err := tx.Exec(`INSERT INTO busy_rows (fence, body) VALUES (?1, randomblob(512))`, w.c.Fence); err != nil {
							return err
						}
					}
					return nil
				})
				if err == nil {
					w.commits.Add(1)
				}
			}
		}()
	case *actor.Stopping:
		w.cancel()
		<-w.done
	}
}

// On a file database with ttl 2 s / renew 900 ms and a worker writing back
// to back, the holder keeps its lease: no fence change, no loss, for the
// whole run: 10 s (eleven renewals) here, a minute in the soak
// (starve_soak_test.go); APPVIEW_STARVE_SECONDS overrides both.
func TestRenewalsAreNotStarvedByTheHoldersOwnWrites(t *testing.T) {
	starve(t, 10*time.Second)
}

func starve(t *testing.T, run time.Duration) {
	if s, err := strconv.Atoi(os.Getenv("APPVIEW_STARVE_SECONDS")); err == nil && s > 0 {
		run = time.Duration(s) * time.Second
	}
	db := testsupport.OpenDB(t)
	if _, err := db.Exec(`CREATE TABLE busy_rows (id INTEGER PRIMARY KEY, fence INTEGER NOT NULL, body BLOB)`); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t)
	timing := config.Timing{TTL: 2 * time.Second, RenewInterval: 900 * time.Millisecond,
		RenewDeadline: 1500 * time.Millisecond, RetryInterval: 500 * time.Millisecond}
	var commits atomic.Int64
	worker := func(c fence.Custody) *actor.Props {
		return actor.PropsFromProducer(func() actor.Actor { return &busyWorker{db: db, c: c, commits: &commits} })
	}
	r := h.start(Options{Name: "jetstream-consumer", Instance: "instance-a", Timing: timing,
		Store: NewStore(db, timing.TTL), Worker: worker})
	h.events.wait(t, 0, "worker.started", is(WorkerStarted, "instance-a"))
	first := readRow(t, db, "jetstream-consumer")
	start := time.Now()
	lost := is(LeaseLost, "instance-a")
	for time.Since(start) < run {
		if h.events.count(lost) > 0 {
			break
		}
		select {
		case <-time.After(100 * time.Millisecond): // the run's length, not a wait for a condition
		case <-r.done:
			t.Fatal("lease actor stopped")
		}
	}
	all, _ := h.events.snapshot()
	last := readRow(t, db, "jetstream-consumer")
	t.Logf("%s: %d fenced batches committed, fence %d -> %d", time.Since(start).Round(time.Second), commits.Load(), first.Fence, last.Fence)
	if n := h.events.count(lost); n > 0 || last.Fence != first.Fence {
		t.Fatalf("the holder lost its lease %d times (fence %d -> %d) while its own worker wrote:\n%s", n, first.Fence, last.Fence, formatEvents(all))
	}
	if commits.Load() < int64(run/time.Second) {
		t.Fatalf("only %d batches in %s: the worker was not busy", commits.Load(), run)
	}
}
