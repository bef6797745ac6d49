package database

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// writes is what this process knows of its own writes to one database:
// which writes go first, and whether the latest write of each writer
// failed. It lives on the DB that Open returns, so two databases opened in
// one process share nothing.
//
// Urgent writes. SQLite has one writer and its lock is not fair: a writer
// that finds it taken sleeps in the busy handler (1 ms growing to 100 ms)
// and retries, while a worker committing back to back takes it again
// within microseconds of releasing it. A lease renewal queued behind such
// a worker could miss its renew deadline although every transaction is
// short. So, within one process, urgent writes (the lease store's
// acquire, renewal and release) go first: an ordinary transaction that has
// not begun waits while one is pending (WaitUrgent), up to urgentBound
// after that write began, and urgent writes take turns (UrgentTurn), so
// two of them never meet at the lock as SQLITE_BUSY. Across processes
// there is nothing to coordinate with: only the holder renews a lease,
// and only the holder's worker writes under it.
type writes struct {
	mu      sync.Mutex
	next    uint64
	pending map[uint64]time.Time // urgent writes by ticket: when each began
	changed chan struct{}        // closed and replaced whenever one ends
	turn    chan struct{}        // capacity 1: the urgent write running

	latest map[string]writeOutcome // by writer name (NoteWrite)
	ended  map[string]int64        // by writer name: writes up to this seq no longer count
}

type writeOutcome struct {
	at  time.Time
	err error // nil: the database took (or answered) the write
	seq int64
}

func newWrites() *writes {
	return &writes{pending: map[uint64]time.Time{}, changed: make(chan struct{}), turn: make(chan struct{}, 1),
		latest: map[string]writeOutcome{}, ended: map[string]int64{}}
}

// urgentBound caps how long an ordinary transaction waits for urgent
// writes: one that has not finished by then (a database that does not
// answer, a lock held by another process) holds nothing back any longer;
// its own timeouts decide what becomes of it.
const urgentBound = 500 * time.Millisecond

// Urgent marks an urgent write of this process as pending until done is
// called (done may be called more than once): meanwhile, for at most
// urgentBound, ordinary transactions that have not begun wait for it
// (WaitUrgent).
func (db *DB) Urgent() (done func()) {
	w := db.writes
	w.mu.Lock()
	w.next++
	ticket := w.next
	w.pending[ticket] = time.Now()
	w.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			delete(w.pending, ticket)
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		})
	}
}

// WaitUrgent waits while an urgent write begun less than urgentBound ago
// is pending, or until ctx ends.
func (db *DB) WaitUrgent(ctx context.Context) {
	w := db.writes
	for {
		w.mu.Lock()
		var until time.Time
		for _, began := range w.pending {
			until = later(until, began.Add(urgentBound))
		}
		changed := w.changed
		w.mu.Unlock()
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

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// UrgentTurn waits until no other urgent write of this process is running
// and returns the function that ends this one's turn; ctx.Err() when ctx
// ends first. Queued here, the next urgent write starts the moment the
// last one commits instead of meeting it at the lock (SQLITE_BUSY, and a
// busy handler sleeping 1, 2, 5, 10 ms). Writes of other processes still
// meet the busy handler.
func (db *DB) UrgentTurn(ctx context.Context) (func(), error) {
	t := db.writes.turn
	select {
	case t <- struct{}{}:
		return func() { <-t }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// NoteWrite records how the latest write of writer name ended: err nil
// (or a refusal of the values written, Refused) means the database took
// or answered it; an error from the driver, or ErrFileReplaced, means the
// database failed it. Any other error says nothing of the database and is
// not recorded (a context cancelled by its caller, a worker's own error).
// seq orders a writer's custodies (a fence; 0 when none): a write under a
// seq that EndWrites has ended is not recorded.
func (db *DB) NoteWrite(name string, seq int64, err error) {
	o := writeOutcome{at: time.Now(), seq: seq}
	switch {
	case err == nil, Refused(err):
	case errors.Is(err, context.Canceled):
		return
	case FromDriver(err), errors.Is(err, ErrFileReplaced):
		o.err = err
	default:
		return
	}
	w := db.writes
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq > 0 && seq <= w.ended[name] {
		return
	}
	w.latest[name] = o
}

// EndWrites forgets writer name's latest outcome when it was written
// under seq or an earlier one, and ignores such writes from now on: the
// writer writes nothing more under them (its custody ended), so a failure
// of its last write must not keep WriteHealth failing. A seq of 0 or less
// changes nothing.
func (db *DB) EndWrites(name string, seq int64) {
	if seq <= 0 {
		return
	}
	w := db.writes
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended[name] = max(w.ended[name], seq)
	if o, ok := w.latest[name]; ok && o.seq <= seq {
		delete(w.latest, name)
	}
}

// WriteHealth returns nil unless, for some writer, the latest write noted
// failed for a reason of the database. The database then cannot keep that
// writer's output, whatever a read or a one-page write probe says (a full
// disk still lets a write that fits the WAL's allocated space through),
// and other writers' successes do not hide it. The error names the
// writer, the failure and since when; /readyz reports it.
func (db *DB) WriteHealth() error {
	w := db.writes
	w.mu.Lock()
	defer w.mu.Unlock()
	var name string
	var worst writeOutcome
	for n, o := range w.latest {
		if o.err != nil && (worst.err == nil || o.at.After(worst.at)) {
			name, worst = n, o
		}
	}
	if worst.err == nil {
		return nil
	}
	return fmt.Errorf("database writes (%s) failing since %s: %w", name, worst.at.UTC().Format(time.RFC3339), worst.err)
}
