package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// Grant is the outcome of an acquire attempt: granted (Fence is the new
// fence), or not, and then the current grant's Fence, Holder, TimeLeft on
// the database's clock (<= 0: expired) and whether it is this process's
// own (Own: this holder and this Store's process nonce; a process started
// under the same instance_id has another nonce).
type Grant struct {
	Granted  bool
	Fence    int64
	Holder   string
	TimeLeft time.Duration
	Own      bool
}

// Store is the SQL side of named leases: the leases table of docs/spec.md
// §4 and its companions (lease_holders: the process nonce of each grant;
// lease_fence_floor: the highest fence each name ever had). Every
// statement takes "now" from the database's own clock (database.NowMS),
// so instances whose clocks disagree still agree on who holds what.
// Every write is urgent (database.DB.Urgent): the holder's own worker
// transactions wait for it.
type Store struct {
	db    *database.DB
	ttl   time.Duration
	nonce string
	check func() error // before every write: database.DB.CheckFile
	// Failed, when set, is told the error of every write that failed
	// (e.g. to say once that the database lost its schema).
	Failed func(error)
	// Released, when set, is told of every release that landed, with the
	// nudge URLs of the other processes' recent contenders of its lease
	// (Contenders.Nudge), read by the release statement itself.
	Released func(lease string, nudgeURLs []string)

	mu      sync.Mutex
	highest map[string]int64 // by lease: the highest fence last seen
}

// NewStore returns a store granting leases of the given TTL on db, with a
// new process nonce: one Store per process, so a holder is its
// instance_id plus a value no other process start shares.
func NewStore(db *database.DB, ttl time.Duration) *Store {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &Store{db: db, ttl: ttl, nonce: hex.EncodeToString(b[:]), check: db.CheckFile, highest: map[string]int64{}}
}

// Nonce is the process nonce this store writes with every grant and
// matches on every release.
func (s *Store) Nonce() string { return s.nonce }

// Healthy returns nil unless, for some lease, the latest write this
// process made for it failed for a reason of the database: its latest
// lease write (acquire, renewal, release) or its worker's latest fenced
// write, each tracked apart (database.DB.WriteHealth). /readyz reports it.
func (s *Store) Healthy() error { return s.db.WriteHealth() }

// note records err as the latest lease write of name and returns it.
func (s *Store) note(name string, err error) error {
	fence.Note(s.db, fence.LeaseWrites(name), 0, err)
	if err != nil && s.Failed != nil {
		s.Failed(err)
	}
	return err
}

const (
	// grantSQL grants lease ?1 to holder ?2 for ?3 ms at fence ?4, in one
	// statement (docs/spec.md §4): only when ?4 is one above the highest
	// fence the name ever had and the name has no grant or its grant
	// expired, so of two contenders the loser's matches no row. One row
	// changed is the grant. It returns nothing: with RETURNING it would be
	// a query, which go-libsql sends to a libSQL server as two requests (a
	// describe first).
	grantSQL = `INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
SELECT ?1, ?2, ?4, n, n, n + ?3
FROM (SELECT ` + database.NowMS + ` AS n) WHERE ` + highestOf + ` + 1 = ?4
ON CONFLICT(name) DO UPDATE SET
  holder      = excluded.holder,
  fence       = excluded.fence,
  acquired_at = excluded.acquired_at,
  renewed_at  = excluded.renewed_at,
  expires_at  = excluded.expires_at
WHERE leases.expires_at <= excluded.acquired_at`

	// highestOf is the highest fence lease ?1 ever had (its row's or
	// lease_fence_floor's), 0 for a name never granted.
	highestOf = `MAX(COALESCE((SELECT fence FROM leases WHERE name = ?1), 0),
  COALESCE((SELECT fence FROM lease_fence_floor WHERE name = ?1), 0))`

	// nonceSQL records the process nonce of the grant at fence ?2, never
	// over a later grant's. A row already at ?2 is a losing claim of an
	// older release (which claimed before acquiring).
	nonceSQL = `INSERT INTO lease_holders (name, fence, nonce) VALUES (?1, ?2, ?3)
ON CONFLICT (name) DO UPDATE SET fence = excluded.fence, nonce = excluded.nonce
WHERE lease_holders.fence <= excluded.fence`

	// renewSQL keeps the fence (renewal is no change of custody) and never
	// extends a released grant (renewed_at = expires_at): a renewal landing
	// after the release must not revive it. A grant that merely ran out
	// carries no other fence, so nobody took it: still renewable. It needs
	// no nonce: a process renews only fences its own acquire returned.
	renewSQL = `UPDATE leases SET renewed_at = ` + database.NowMS + `, expires_at = ` + database.NowMS + ` + ?4
WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND renewed_at <> expires_at`

	// releaseSQL expires the row in place (renewed_at = expires_at marks a
	// clean release), keeping holder and fence, and only this process's
	// grant (nonce ?4): never one of another process under the same
	// instance_id. It returns, as a JSON array, the nudge URLs of the other
	// processes' contenders of the lease seen within the last ?5 ms.
	releaseSQL = `UPDATE leases SET
  renewed_at = MIN(expires_at, ` + database.NowMS + `),
  expires_at = MIN(expires_at, ` + database.NowMS + `)
WHERE name = ?1 AND holder = ?2 AND fence = ?3
  AND EXISTS (SELECT 1 FROM lease_holders h WHERE h.name = ?1 AND h.fence = ?3 AND h.nonce = ?4)
RETURNING (SELECT json_group_array(nudge_url) FROM lease_contenders
  WHERE name = ?1 AND (instance <> ?2 OR nonce <> ?4) AND seen_at > ` + database.NowMS + ` - ?5)`
)

// stateSQL reads lease ?1 as a contender sees it: holder (through
// database.Text: an instance_id may look like a date), fence, time left
// on the database's clock (<= 0: expired; 0 for no row), the grant's
// process nonce and the highest fence the name ever had.
var stateSQL = `SELECT COALESCE(` + database.Text("l.holder") + `, ''), COALESCE(l.fence, 0), COALESCE(l.expires_at - n, 0),
  COALESCE((SELECT nonce FROM lease_holders h WHERE h.name = ?1 AND h.fence = l.fence), ''), ` + highestOf + `
FROM (SELECT ` + database.NowMS + ` AS n) LEFT JOIN leases l ON l.name = ?1`

// maxFence is the last fence a lease can be granted under.
const maxFence = 1<<63 - 1

// errFenceExhausted refuses a grant whose fence would overflow.
var errFenceExhausted = errors.New("fence token at its maximum; the lease can no longer change custody")

// Acquire tries to take lease name for holder: granted when it has no row
// or its grant expired on the database's clock, at the next fence. A
// fence at MaxInt64 is never granted again (an error), and a database
// file replaced under the process fails it (database.ErrFileReplaced).
//
// It first tries the grant at one above the highest fence it last saw
// for name (one statement: what a nudged contender does at a handover),
// and reads the lease only when that grant is refused or no fence was
// seen yet; a grant refused for a fence that moved is tried once more.
func (s *Store) Acquire(ctx context.Context, name, holder string) (Grant, error) {
	defer s.db.Urgent()()
	g, err := s.acquire(ctx, name, holder)
	if err != nil {
		err = fmt.Errorf("acquire lease %q: %w", name, err)
	}
	return g, s.note(name, err)
}

func (s *Store) acquire(ctx context.Context, name, holder string) (Grant, error) {
	if err := s.check(); err != nil {
		return Grant{}, err
	}
	s.mu.Lock()
	highest, seen := s.highest[name]
	s.mu.Unlock()
	for try := 0; ; try++ {
		if seen && highest < maxFence {
			granted, err := s.grant(ctx, name, holder, highest+1)
			if err != nil || granted {
				return Grant{Granted: granted, Fence: highest + 1}, err
			}
		}
		var g Grant
		var leftMS, was int64
		var nonce string
		// In this process's turn of lease writes, so that a grant of its
		// own whose nonce is still being written (grant) reads as Own.
		turn, err := s.db.UrgentTurn(ctx)
		if err != nil {
			return Grant{}, err
		}
		err = s.db.QueryRowContext(ctx, stateSQL, name).Scan(&g.Holder, &g.Fence, &leftMS, &nonce, &was)
		turn()
		if err != nil {
			return Grant{}, fmt.Errorf("read the holder: %w", err)
		}
		s.saw(name, was)
		g.Own = g.Holder == holder && nonce == s.nonce
		g.TimeLeft = time.Duration(leftMS) * time.Millisecond
		switch {
		case leftMS <= 0 && was == maxFence:
			return Grant{}, errFenceExhausted
		case leftMS > 0 || try > 0 || (seen && was == highest):
			return g, nil
		}
		highest, seen = was, true
	}
}

// saw records f as the highest fence of lease name this store knows of.
func (s *Store) saw(name string, f int64) {
	s.mu.Lock()
	s.highest[name] = f
	s.mu.Unlock()
}

// grant runs grantSQL at fence f and, when granted, records this
// process's nonce for it, in the background but within the same urgent
// turn: the grant is answered one statement sooner, and this process's
// next lease write (its release among them) waits for the nonce. A
// nonce that fails to land (Failed is told) leaves the grant this
// process's, but its release will find it superseded.
func (s *Store) grant(ctx context.Context, name, holder string, f int64) (bool, error) {
	turn, err := s.db.UrgentTurn(ctx)
	if err != nil {
		return false, err
	}
	res, err := s.db.ExecContext(ctx, grantSQL, name, holder, s.ttl.Milliseconds(), f)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err != nil || n == 0 {
		turn()
		return false, err
	}
	s.saw(name, f)
	urgent := s.db.Urgent()
	go func() {
		defer turn()
		defer urgent()
		if _, err := s.db.ExecContext(context.WithoutCancel(ctx), nonceSQL, name, f, s.nonce); err != nil && s.Failed != nil {
			s.Failed(fmt.Errorf("record the process nonce of lease %q (fence %d): %w", name, f, err))
		}
	}()
	return true, nil
}

// Renew extends the grant c to now + TTL (database clock). It returns an
// error wrapping fence.ErrSuperseded when the row no longer carries this
// holder and fence (another instance acquired it since) or when the grant
// was released: a renewal never revives a released grant. The LeaseActors
// of a process renew through a Renewer, which batches them (RenewAll).
func (s *Store) Renew(ctx context.Context, c fence.Custody) error {
	defer s.db.Urgent()()
	if err := s.check(); err != nil {
		return s.note(c.Lease, fmt.Errorf("renew lease %q: %w", c.Lease, err))
	}
	return s.note(c.Lease, s.matchOne(ctx, "renew", renewSQL, c, s.ttl.Milliseconds()))
}

// Release expires the grant c in place (expires_at = now), keeping holder
// and fence, and tells Released. It returns an error wrapping
// fence.ErrSuperseded when the row no longer carries this holder, fence
// and process nonce. Like Acquire and Renew it checks the database file
// first: a release written to a file that was deleted or replaced lands
// nowhere anyone reads.
func (s *Store) Release(ctx context.Context, c fence.Custody) error {
	defer s.db.Urgent()()
	err := s.check()
	var found bool
	var urls string
	if err == nil {
		var turn func()
		if turn, err = s.db.UrgentTurn(ctx); err == nil {
			found, err = database.QueryReturning(ctx, s.db, releaseSQL,
				[]any{c.Lease, c.Holder, c.Fence, s.nonce, (3 * s.ttl).Milliseconds()}, &urls)
			turn()
		}
	}
	switch {
	case err != nil:
		err = fmt.Errorf("release lease %q: %w", c.Lease, err)
	case !found:
		err = fmt.Errorf("release lease %q (fence %d): %w", c.Lease, c.Fence, fence.ErrSuperseded)
	case s.Released != nil:
		var nudge []string
		_ = json.Unmarshal([]byte(urls), &nudge) // SQLite's own JSON: a list of strings
		s.Released(c.Lease, nudge)
	}
	return s.note(c.Lease, err)
}

func (s *Store) matchOne(ctx context.Context, op, query string, c fence.Custody, extra any) error {
	release, err := s.db.UrgentTurn(ctx)
	if err != nil {
		return fmt.Errorf("%s lease %q: %w", op, c.Lease, err)
	}
	res, err := s.db.ExecContext(ctx, query, c.Lease, c.Holder, c.Fence, extra)
	release()
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	switch {
	case err != nil:
		return fmt.Errorf("%s lease %q: %w", op, c.Lease, err)
	case n == 0:
		return fmt.Errorf("%s lease %q (fence %d): %w", op, c.Lease, c.Fence, fence.ErrSuperseded)
	}
	return nil
}

// liveElsewhereSQL finds the leases for which instance is live from another
// process start: a grant not yet expired, or a contender record fresher
// than the window (?3 ms), carrying another nonce.
var liveElsewhereSQL = `SELECT ` + database.Text("l.name") + ` FROM leases l JOIN lease_holders h ON h.name = l.name AND h.fence = l.fence
WHERE l.holder = ?1 AND h.nonce <> ?2 AND l.expires_at > ` + database.NowMS + `
UNION
SELECT ` + database.Text("name") + ` FROM lease_contenders
WHERE instance = ?1 AND nonce <> ?2 AND nonce <> '' AND seen_at > ` + database.NowMS + ` - ?3
ORDER BY 1`

// LiveElsewhere returns the names of the leases that instance holds, or
// contended for within the last window, from another process start than
// this store's: a sign that two running processes share one instance_id
// (or that this instance's previous run ended less than window ago without
// releasing). Custody stays correct either way (grants carry the nonce);
// the caller warns.
func (s *Store) LiveElsewhere(ctx context.Context, instance string, window time.Duration) ([]string, error) {
	names, err := database.Column(ctx, s.db, liveElsewhereSQL, instance, s.nonce, window.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("look for instance %q elsewhere: %w", instance, err)
	}
	return names, nil
}
