package fence

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// SQLite's write lock is not fair: a writer that finds it taken sleeps in
// the busy handler (1 ms growing to 100 ms) and retries, while a worker
// committing back to back takes it again within microseconds of releasing
// it. A renewal queued behind such a worker can miss its renew deadline
// although every transaction is short (issue 14.5: a busy consumer cost
// its holder the lease several times a minute). So, within one process,
// lease writes (acquire, renew, release) go first: a fenced transaction
// that has not begun yet waits while one is pending, up to yieldBound
// after that write began, and the lock, once free, goes to the lease
// write. Across processes there is nothing to coordinate with: only the
// holder renews a lease, and only the holder's worker writes under it.
//
// yieldBound caps the wait: a lease write that has not finished by then
// (a database that does not answer, a lock held by another process) does
// not hold the worker back any longer; its own timeouts decide custody.
const yieldBound = 500 * time.Millisecond

// writeGate tracks the lease writes pending on one database.
type writeGate struct {
	mu      sync.Mutex
	next    uint64
	pending map[uint64]time.Time // by ticket: when the write began
	changed chan struct{}        // closed and replaced whenever a write ends
}

// gates holds one writeGate per *sql.DB, like healths.
var gates sync.Map

func gateOf(db *sql.DB) *writeGate {
	if g, ok := gates.Load(db); ok { // no allocation on every write
		return g.(*writeGate)
	}
	g, _ := gates.LoadOrStore(db, &writeGate{pending: map[uint64]time.Time{}, changed: make(chan struct{})})
	return g.(*writeGate)
}

// LeaseWrite marks a lease write to db (an acquire, renewal or release
// of this process) as pending until done is called: until then, or
// until yieldBound has passed since this call, Fenced transactions on db
// that have not begun wait for it. done may be called more than once.
func LeaseWrite(db *sql.DB) (done func()) {
	g := gateOf(db)
	g.mu.Lock()
	g.next++
	ticket := g.next
	g.pending[ticket] = time.Now()
	g.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			delete(g.pending, ticket)
			close(g.changed)
			g.changed = make(chan struct{})
			g.mu.Unlock()
		})
	}
}

// yield waits while a lease write begun less than yieldBound ago is
// pending on db, or until ctx ends.
func yield(ctx context.Context, db *sql.DB) {
	g := gateOf(db)
	for {
		g.mu.Lock()
		var until time.Time
		for _, began := range g.pending {
			if end := began.Add(yieldBound); end.After(until) {
				until = end
			}
		}
		changed := g.changed
		g.mu.Unlock()
		wait := time.Until(until)
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		if ctx.Err() != nil {
			return
		}
	}
}
