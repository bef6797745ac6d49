package leasestore

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// MaxRenewBatch is the most grants one renewal statement carries, so a
// statement's time (and the write lock it holds) stays bounded. RenewAll
// splits longer lists into statements of this many.
const MaxRenewBatch = 2000

// The batched renewal takes one holder's grants as one parameter, a JSON
// object of name: fence members (a name listed with two fences is two
// members: json_each yields both), not as two variables a grant: the
// statement has one text for 5 grants or 2,000, so a file connection
// compiles it once and keeps it (database: stmtcache.go; a libSQL server
// compiles it per call, equally fast for any count), and SQLite's
// 32,766-variable cap never applies. An object, not an array of
// [name, fence] pairs: json_each hands each member's key and value over
// as they are, where ->> on an array element parses it again for every
// field (a round of 5 grants took 9.0 µs that way, 6.5 µs this way, on a
// 2-core Xeon). The join on leases.name lets SQLite look every listed
// grant up by the primary key (EXPLAIN QUERY PLAN: a scan of json_each,
// then "SEARCH leases USING INDEX sqlite_autoindex_leases_1 (name=?)"),
// and the per-grant holder and fence match and the released-grant guard
// are renewSQL's, so each grant renews exactly when Renew would renew it.
var (
	renewAllSQL = `UPDATE leases SET renewed_at = ` + database.NowMS + `, expires_at = ` + database.NowMS + ` + ?1
FROM json_each(?2) AS r
WHERE leases.name = r.key AND leases.holder = ?3 AND leases.fence = r.value
  AND leases.renewed_at <> leases.expires_at`

	// renewedSQL finds, of the grants listed, those the table still
	// carries unreleased: after renewAllSQL fell short of renewing them
	// all, exactly the renewed ones (see renewChunk).
	renewedSQL = `SELECT ` + database.Text("leases.name") + `, leases.fence FROM leases, json_each(?1) AS r
WHERE leases.name = r.key AND leases.holder = ?2 AND leases.fence = r.value
  AND leases.renewed_at <> leases.expires_at`
)

// RenewAll renews every grant of cs with one statement (one per holder
// and MaxRenewBatch grants: a process renews under one holder, its
// instance_id), on the database's clock, and returns one error
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
	holder := cs[0].Holder
	if !slices.ContainsFunc(cs, func(c fence.Custody) bool { return c.Holder != holder }) {
		s.renewHolder(ctx, cs, errs)
		return errs
	}
	// Several holders: each holder's grants go as one list, and their
	// outcomes back to where cs listed them.
	var order []string
	at := map[string][]int{}
	for i, c := range cs {
		if _, ok := at[c.Holder]; !ok {
			order = append(order, c.Holder)
		}
		at[c.Holder] = append(at[c.Holder], i)
	}
	for _, h := range order {
		idx := at[h]
		sub, subErrs := make([]fence.Custody, len(idx)), make([]error, len(idx))
		for j, i := range idx {
			sub[j] = cs[i]
		}
		s.renewHolder(ctx, sub, subErrs)
		for j, i := range idx {
			errs[i] = subErrs[j]
		}
	}
	return errs
}

// renewHolder renews cs, grants of one holder, a statement per
// MaxRenewBatch of them, writing each outcome to errs (same length).
func (s *Store) renewHolder(ctx context.Context, cs []fence.Custody, errs []error) {
	for start := 0; start < len(cs); start += MaxRenewBatch {
		chunk := cs[start:min(start+MaxRenewBatch, len(cs))]
		s.renewChunk(ctx, chunk, errs[start:start+len(chunk)])
	}
}

// grantKey singles out a grant: a name holds one fence at a time and
// fences are never reused, so name and fence determine the holder too.
type grantKey struct {
	name  string
	fence int64
}

// renewChunk runs one batched statement for cs, grants of one holder,
// and writes each grant's outcome to errs (same length).
//
// When the statement renewed as many rows as distinct grants were
// listed, every grant was renewed: the common case costs one statement
// and no rows read back (go-libsql crosses cgo several times a row read).
// Otherwise one read finds which grants the table still carries,
// unreleased: a grant that matched no row at the update cannot match
// later (its fence is gone for good, or it was released, and a release is
// never undone under the same fence), so every grant found was renewed.
// A grant renewed and then superseded before the read is reported
// superseded, which it is by then.
func (s *Store) renewChunk(ctx context.Context, cs []fence.Custody, errs []error) {
	holder := cs[0].Holder
	list, distinct, err := grantList(cs)
	var renewed map[grantKey]bool
	if err == nil {
		var res sql.Result
		var release func()
		if release, err = s.turn(ctx); err == nil {
			res, err = s.db.ExecContext(ctx, renewAllSQL, s.ttl.Milliseconds(), list, holder)
			release()
		}
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err == nil && n != int64(distinct) {
			renewed, err = s.queryRenewed(ctx, list, holder, distinct)
		}
	}
	for i, c := range cs {
		switch {
		case err != nil:
			errs[i] = fmt.Errorf("renew lease %q: %w", c.Lease, err)
		case renewed != nil && !renewed[grantKey{c.Lease, c.Fence}]:
			errs[i] = fmt.Errorf("renew lease %q (fence %d): %w", c.Lease, c.Fence, fence.ErrSuperseded)
		}
		s.note(c.Lease, errs[i])
	}
}

// grantList returns cs, grants of one holder, as the JSON parameter of
// renewAllSQL ({"name": fence, ...}), each distinct grant once, and how
// many distinct grants it lists. It is
// written by hand: on a renew tick of a few leases, encoding/json's
// reflection cost more than the statement's own work.
func grantList(cs []fence.Custody) (string, int, error) {
	var seen map[fence.Custody]bool
	if len(cs) > 8 {
		seen = make(map[fence.Custody]bool, len(cs))
	}
	b := make([]byte, 0, 2+len(cs)*32)
	b = append(b, '{')
	n := 0
	for i, c := range cs {
		if seen != nil {
			if seen[c] {
				continue
			}
			seen[c] = true
		} else if slices.Contains(cs[:i], c) {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		var err error
		if b, err = appendJSONString(b, c.Lease); err != nil {
			return "", 0, err
		}
		b = append(b, ':')
		b = strconv.AppendInt(b, c.Fence, 10)
	}
	b = append(b, '}')
	return string(b), n, nil
}

// appendJSONString appends s as a JSON string: as is between quotes when
// it is plain printable ASCII without quotes or backslashes (every lease
// name and instance_id in practice), else through encoding/json.
func appendJSONString(b []byte, s string) ([]byte, error) {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			plain = false
			break
		}
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"'), nil
	}
	q, err := json.Marshal(s)
	if err != nil {
		return b, fmt.Errorf("encode the grants to renew: %w", err)
	}
	return append(b, q...), nil
}

// queryRenewed returns the listed grants the table carries unreleased.
func (s *Store) queryRenewed(ctx context.Context, list, holder string, n int) (map[grantKey]bool, error) {
	rows, err := s.db.QueryContext(ctx, renewedSQL, list, holder)
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
