package leasestore

// RenewAllSQL exposes the batched renewal statement for n grants to the
// query-plan test.
func RenewAllSQL(n int) string { return renewAllSQL(n) }

// Queued is how many renewals wait for a statement.
func (r *Renewer) Queued() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}
