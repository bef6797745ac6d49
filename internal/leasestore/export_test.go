package leasestore

// RenewAllSQL and RenewedSQL expose the batched renewal's statements to
// the query-plan test.
var RenewAllSQL, RenewedSQL = renewAllSQL, renewedSQL

// Queued is how many renewals wait for a statement.
func (r *Renewer) Queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}
