package lease

import (
	"context"
	"testing"
)

// HoldTurn takes s's lease-write turn and returns the function that gives
// it back.
func HoldTurn(t *testing.T, s *Store) func() {
	t.Helper()
	release, err := s.db.UrgentTurn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return release
}

// RenewAllSQL and RenewedSQL expose the batched renewal's statements to
// the query-plan test.
var RenewAllSQL, RenewedSQL = renewAllSQL, renewedSQL

// Queued is how many renewals wait for a statement.
func (r *Renewer) Queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

// SetCheck replaces the check s runs before every write (nil: the
// database file's).
func (s *Store) SetCheck(check func() error) {
	if check == nil {
		check = s.db.CheckFile
	}
	s.check = check
}

// Wait blocks until every write and nudge in flight has finished.
func (c *Contenders) Wait() { c.Drain(-1) }
