package leasestore

import (
	"context"
	"testing"
)

// HoldTurn takes s's lease-write turn and returns the function that gives
// it back.
func HoldTurn(t *testing.T, s *Store) func() {
	t.Helper()
	release, err := s.turn(context.Background())
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

// WarmConns is how many connections Prepare dialed that wait for a nudge.
func (c *Contenders) WarmConns() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, conns := range c.warm {
		n += len(conns)
	}
	return n
}

// KnownURLs is what a release of lease would nudge at once.
func (c *Contenders) KnownURLs(lease string) []string { return c.knownURLs(lease) }
