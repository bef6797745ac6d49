package leasestore

import (
	"context"
	"fmt"
	"strings"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// MaxRenewBatch is the most grants one renewal statement carries: three
// variables a grant plus the TTL stay well under SQLite's 32,766
// variables per statement. RenewAll splits longer lists into statements of
// this many.
const MaxRenewBatch = 2000

// renewAllHead and renewAllTail surround the VALUES list of the batched
// renewal. Each row of the list is (name, holder, fence); SQLite names
// the columns column1..column3. The join on leases.name lets SQLite look
// every listed grant up by the primary key (EXPLAIN QUERY PLAN: a scan of
// the VALUES list, then "SEARCH leases USING INDEX sqlite_autoindex_leases_1
// (name=?)"), and the per-row holder and fence match and the released-grant
// guard are renewSQL's, so each grant renews exactly when Renew would
// renew it. RETURNING tells which grants did: the ones it does not name
// are superseded or released. (The name is read through database.Text:
// an operator's lease name may look like a date.)
var (
	renewAllHead = `UPDATE leases SET renewed_at = ` + database.NowMS + `, expires_at = ` + database.NowMS + ` + ?1
FROM (VALUES `
	renewAllTail = `) AS r
WHERE leases.name = r.column1 AND leases.holder = r.column2 AND leases.fence = r.column3
  AND leases.renewed_at <> leases.expires_at
RETURNING ` + database.Text("leases.name") + `, leases.fence`
)

// renewAllSQL returns the batched renewal statement for n grants.
func renewAllSQL(n int) string {
	var b strings.Builder
	b.Grow(len(renewAllHead) + len(renewAllTail) + n*10)
	b.WriteString(renewAllHead)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?)")
	}
	b.WriteString(renewAllTail)
	return b.String()
}

// RenewAll renews every grant of cs with one statement (one per
// MaxRenewBatch grants), on the database's clock, and returns one error
// per grant, in the order of cs: nil when renewed, an error wrapping
// fence.ErrSuperseded when the row no longer carries that holder and
// fence or the grant was released (never revived), or the statement's
// error for every grant of a statement that failed. Each grant renews
// exactly when Renew would renew it; Check runs once per call, and each
// grant's outcome goes into the write health as Renew's would. A grant
// listed twice is renewed once and both entries get its outcome.
func (s *Store) RenewAll(ctx context.Context, cs []fence.Custody) []error {
	errs := make([]error, len(cs))
	if len(cs) == 0 {
		return errs
	}
	defer fence.LeaseWrite(s.db)()
	if err := s.check(); err != nil {
		for i, c := range cs {
			errs[i] = s.note(c.Lease, fmt.Errorf("renew lease %q: %w", c.Lease, err))
		}
		return errs
	}
	for start := 0; start < len(cs); start += MaxRenewBatch {
		chunk := cs[start:min(start+MaxRenewBatch, len(cs))]
		s.renewChunk(ctx, chunk, errs[start:start+len(chunk)])
	}
	return errs
}

// grantKey is how a RETURNING row is matched to the grants asked for: a
// name holds one fence at a time and fences are never reused, so name and
// fence single out the grant (and its holder).
type grantKey struct {
	name  string
	fence int64
}

// renewChunk runs one batched statement for cs and writes each grant's
// outcome to errs (same length).
func (s *Store) renewChunk(ctx context.Context, cs []fence.Custody, errs []error) {
	args := make([]any, 0, 1+3*len(cs))
	args = append(args, s.ttl.Milliseconds())
	for _, c := range cs {
		args = append(args, c.Lease, c.Holder, c.Fence)
	}
	renewed, err := s.queryRenewed(ctx, renewAllSQL(len(cs)), args, len(cs))
	for i, c := range cs {
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("renew lease %q: %w", c.Lease, err)
		case !renewed[grantKey{c.Lease, c.Fence}]:
			errs[i] = fmt.Errorf("renew lease %q (fence %d): %w", c.Lease, c.Fence, fence.ErrSuperseded)
		}
		s.note(c.Lease, errs[i])
	}
}

// queryRenewed runs the statement and returns the grants it renewed.
// go-libsql fails a row-returning statement under Exec, so it is a Query.
func (s *Store) queryRenewed(ctx context.Context, query string, args []any, n int) (map[grantKey]bool, error) {
	rows, err := s.db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	renewed := make(map[grantKey]bool, n)
	for rows.Next() {
		var k grantKey
		if err := rows.Scan(&k.name, &k.fence); err != nil {
			return nil, err
		}
		renewed[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return renewed, rows.Close()
}
