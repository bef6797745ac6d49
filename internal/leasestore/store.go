package leasestore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// Grant is the outcome of an acquire attempt.
type Grant struct {
	// Granted is true when this call took custody.
	Granted bool
	// Fence is the new fence when granted, else the current holder's fence.
	Fence int64
	// Holder is the current holder when not granted.
	Holder string
	// TimeLeft is how long the current grant has left on the database's
	// clock when not granted (<= 0 means it has already expired).
	TimeLeft time.Duration
	// Age is how long ago the current grant was made (acquired_at), on the
	// database's clock, when not granted.
	Age time.Duration
	// Own is true, when not granted, if the current grant is this
	// process's: the holder asked for and this Store's process nonce (see
	// Store.Nonce). Another process configured with the same instance_id
	// has the same holder but another nonce, so its grant is never Own.
	Own bool
}

// Row is one row of the leases table (docs/spec.md §4) as seen at Now.
type Row struct {
	Name       string `json:"name"`
	Holder     string `json:"holder"`
	Fence      int64  `json:"fence"`
	AcquiredAt int64  `json:"acquired_at"` // Unix ms
	RenewedAt  int64  `json:"renewed_at"`  // Unix ms
	ExpiresAt  int64  `json:"expires_at"`  // Unix ms
	// Now is the database clock when the row was read, Unix ms.
	Now int64 `json:"now"`
}

// Row states shown by `appview leases` (docs/spec.md §2).
const (
	StateHeld     = "held"
	StateExpired  = "expired"
	StateReleased = "released"
)

// State is held (unexpired), released (expired in place by a clean release,
// which sets renewed_at = expires_at) or expired (ran out its TTL).
func (r Row) State() string {
	switch {
	case r.ExpiresAt > r.Now:
		return StateHeld
	case r.ExpiresAt == r.RenewedAt:
		return StateReleased
	default:
		return StateExpired
	}
}

// TimeLeft is how long the grant has left (0 when not held).
func (r Row) TimeLeft() time.Duration {
	if r.ExpiresAt <= r.Now {
		return 0
	}
	return time.Duration(r.ExpiresAt-r.Now) * time.Millisecond
}

// Listed is a row as `appview leases --json` and GET /debug/leases show it
// (docs/spec.md §2): the row, its state and how long its grant has left.
type Listed struct {
	Row
	State      string `json:"state"`
	TimeLeftMS int64  `json:"time_left_ms"` // 0 when not held
}

// Listed returns r with its state and time left.
func (r Row) Listed() Listed {
	return Listed{Row: r, State: r.State(), TimeLeftMS: r.TimeLeft().Milliseconds()}
}

// Store is the SQL side of named leases. Every statement takes "now" from
// the database's own clock (database.NowMS), so instances whose clocks
// disagree still agree on who holds what.
type Store struct {
	db    *sql.DB
	ttl   time.Duration
	nonce string
	// Check, when set, runs before every acquire and renewal and fails
	// them with its error (database.DB.CheckFile: a file deleted or
	// replaced under the process must end its custody, not leave it
	// holding leases in a file nobody else sees).
	Check func() error
	// Failed, when set, is told the error of every acquire, renewal and
	// release that failed (the caller sees it too), e.g. to say once at
	// error level that the database lost its schema.
	Failed func(error)
}

// NewStore returns a store granting leases of the given TTL. It draws the
// process nonce its grants carry (lease_holders): one Store per process, so
// the holder identity is the instance_id plus a value no other process
// start shares.
func NewStore(db *sql.DB, ttl time.Duration) *Store {
	return &Store{db: db, ttl: ttl, nonce: newNonce()}
}

// newNonce returns 16 random hex digits: a process-start identity.
func newNonce() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Nonce is the process nonce this store writes with every grant and
// matches on every renewal and release.
func (s *Store) Nonce() string { return s.nonce }

// note records how a write for lease name ended in the database's write
// health (see Healthy). It returns err.
func (s *Store) note(name string, err error) error {
	fence.Note(s.db, name+" lease", err)
	if err != nil && s.Failed != nil {
		s.Failed(err)
	}
	return err
}

// Healthy returns nil unless, for some lease, the latest write this
// process made to the database through the lease package failed for a
// reason of the database: either the latest lease write (acquire,
// renewal, release) or the latest write of its worker (Fenced), each
// tracked apart. The database then cannot keep that lease or its worker's
// output, whatever a read or a one-page write probe says (a full disk
// still lets a write that fits the WAL's allocated space through, and a
// renewal is such a write), and other successful writes do not hide it. A supersession, a
// refusal of the values written, or an error not from the database does
// not count. The error names the lease, the failure and since when;
// /readyz reports it.
func (s *Store) Healthy() error { return fence.Health(s.db) }

const (
	// acquireSQL is the whole acquire: one statement, so two contenders for
	// one expired lease cannot both win; the loser's DO UPDATE ... WHERE
	// matches no row and RETURNING yields nothing.
	//
	// The new fence is one above the highest fence the name ever had
	// (lease_fence_floor), so it never goes backwards even if the row was
	// deleted by hand. A fence at MaxInt64 is never incremented: SQLite
	// would turn it into a REAL that no reader can scan (see maxFence).
	acquireSQL = `INSERT INTO leases (name, holder, fence, acquired_at, renewed_at, expires_at)
SELECT ?1, ?2, ` + floorOf + ` + 1, n, n, n + ?3
FROM (SELECT ` + database.NowMS + ` AS n) WHERE ` + floorOf + ` < 9223372036854775807
ON CONFLICT(name) DO UPDATE SET
  holder      = excluded.holder,
  fence       = ` + handedFrom + ` + 1,
  acquired_at = excluded.acquired_at,
  renewed_at  = excluded.renewed_at,
  expires_at  = excluded.expires_at
WHERE leases.expires_at <= excluded.acquired_at AND leases.fence < 9223372036854775807
RETURNING fence`

	// renewSQL never changes the fence: renewal is not a change of custody.
	// It never extends a released grant (renewed_at = expires_at): a
	// renewal that reaches the database after the release (the driver
	// ignores contexts, so one in flight at shutdown still lands) must not
	// revive the grant for a TTL. A grant that merely ran out is still
	// renewable by its holder and fence: nobody else has taken it, or the
	// fence would differ. (Comparing two columns is cheaper than a third
	// evaluation of the database clock, on the hottest statement.)
	renewSQL = `UPDATE leases SET renewed_at = ` + database.NowMS + `, expires_at = ` + database.NowMS + ` + ?4
WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND renewed_at <> expires_at`

	// releaseSQL expires the row in place and keeps holder and fence, so a
	// stalled former holder can never match again. renewed_at = expires_at
	// marks a clean release; an already expired row keeps its expiry.
	releaseSQL = `UPDATE leases SET
  renewed_at = MIN(expires_at, ` + database.NowMS + `),
  expires_at = MIN(expires_at, ` + database.NowMS + `)
WHERE name = ?1 AND holder = ?2 AND fence = ?3` + ownGrant

	// ownGrant narrows a release to this process's grant: the fence's
	// nonce (?4) is this process's (lease_holders). A hand-back releases a
	// fence it did not just renew, so this is where a grant of another
	// process with our instance_id could be matched. A renewal is only
	// ever of a fence this process's own acquire returned (fences are
	// never reused), so it needs no such check; leaving it out keeps the
	// hottest statement a single-row primary-key update.
	ownGrant = `
  AND EXISTS (SELECT 1 FROM lease_holders h WHERE h.name = ?1 AND h.fence = ?3 AND h.nonce = ?4)`

	// floorOf is the highest fence lease ?1 ever had (lease_fence_floor),
	// 0 for a name never granted: a grant's fence is one above it.
	floorOf = `COALESCE((SELECT fence FROM lease_fence_floor WHERE name = ?1), 0)`

	// handedFrom is the fence a grant over an existing row is one above:
	// the row's or the floor, whichever is higher (acquireSQL's DO UPDATE,
	// and transferSQL).
	handedFrom = `MAX(leases.fence, ` + floorOf + `)`

	// transferSQL hands a grant over (Transfer): the holder's own grant
	// (?1 name, ?2 holder, ?3 fence, ?4 its nonce), still held and not
	// released, becomes successor ?5's at the next fence (acquireSQL's
	// rule, lease_fence_floor included) for the successor's TTL (?7 ms),
	// provided ?5 has a healthy contender record for the lease with nonce
	// ?6 seen within ?8 ms (Contenders.Register): a successor is a process
	// that contends, not any name an answer carries, and not one whose
	// worker reports unhealthy (it would yield the lease straight back).
	transferSQL = `UPDATE leases SET
  holder      = ?5,
  fence       = ` + handedFrom + ` + 1,
  acquired_at = t.n,
  renewed_at  = t.n,
  expires_at  = t.n + ?7
FROM (SELECT ` + database.NowMS + ` AS n) AS t
WHERE name = ?1 AND holder = ?2 AND fence = ?3 AND renewed_at <> expires_at AND expires_at > t.n
  AND ` + handedFrom + ` < 9223372036854775807` + ownGrant + `
  AND EXISTS (SELECT 1 FROM lease_contenders c WHERE c.name = ?1 AND c.instance = ?5 AND c.nonce = ?6 AND c.healthy <> 0 AND c.seen_at > t.n - ?8)
RETURNING fence`

	// holderSQL records the nonce of a grant, in the acquire's transaction.
	holderSQL = `INSERT INTO lease_holders (name, fence, nonce) VALUES (?1, ?2, ?3)
ON CONFLICT (name) DO UPDATE SET fence = excluded.fence, nonce = excluded.nonce`
)

// The lease statements are compiled once per connection and kept: the
// acquire's first compile on a connection was most of a graceful
// handover's time (database.KeepCompiled).
func init() {
	database.KeepCompiled(acquireSQL, holderSQL, renewSQL, releaseSQL, transferSQL, contendedSQL, watchSQL, renewAllSQL,
		"BEGIN IMMEDIATE", "COMMIT")
}

// The reads of a lease row. holder is an instance_id, which an operator
// may set to anything, date-like included, so it is read through
// database.Text to be reported exactly as stored.
var (
	contendedSQL = `SELECT ` + database.Text("holder") + `, fence, expires_at - n, n - acquired_at,
  COALESCE((SELECT nonce FROM lease_holders h WHERE h.name = leases.name AND h.fence = leases.fence), '') FROM leases, (SELECT ` + database.NowMS + ` AS n) WHERE name = ?1`

	listSQL = `SELECT ` + database.Text("name") + `, ` + database.Text("holder") + `, fence, acquired_at, renewed_at, expires_at, ` +
		database.NowMS + ` FROM leases ORDER BY name`
)

// Acquire tries to take the named lease for holder. It grants when the
// lease has no row or its grant has expired on the database's clock; the
// new fence is the old fence + 1 (1 for a name never granted; after a row
// deleted by hand, one above the highest fence the name had, kept in
// lease_fence_floor). When it does not grant it reports the current holder
// and how long its grant has left. A fence at MaxInt64 is never granted
// again: Acquire then returns an error.
func (s *Store) Acquire(ctx context.Context, name, holder string) (Grant, error) {
	defer fence.LeaseWrite(s.db)()
	g, err := s.acquire(ctx, name, holder)
	return g, s.note(name, err)
}

func (s *Store) acquire(ctx context.Context, name, holder string) (Grant, error) {
	if err := s.check(); err != nil {
		return Grant{}, fmt.Errorf("acquire lease %q: %w", name, err)
	}
	var g Grant
	granted, err := s.grant(ctx, acquireSQL, []any{name, holder, s.ttl.Milliseconds()}, s.nonce, &g.Fence)
	if err != nil {
		return Grant{}, fmt.Errorf("acquire lease %q: %w", name, err)
	}
	g.Granted = granted
	if g.Granted {
		return g, nil
	}
	var leftMS, ageMS int64
	var nonce string
	if err := s.db.QueryRowContext(ctx, contendedSQL, name).Scan(&g.Holder, &g.Fence, &leftMS, &ageMS, &nonce); err != nil {
		return Grant{}, fmt.Errorf("read contended lease %q: %w", name, err)
	}
	g.Own = g.Holder == holder && nonce == s.nonce
	g.TimeLeft = time.Duration(leftMS) * time.Millisecond
	g.Age = time.Duration(ageMS) * time.Millisecond
	if g.Fence == maxFence && leftMS <= 0 {
		return Grant{}, fmt.Errorf("acquire lease %q: %w", name, errFenceExhausted)
	}
	return g, nil
}

// grant runs a granting statement (acquireSQL, transferSQL: args, the
// lease name first, RETURNING the new fence) and, when it grants, records
// the grant's nonce, in one transaction: a grant whose answer is lost
// after commit still carries its process's nonce, so a later attempt
// recognises it as its own (and hands it back), and no grant is ever
// visible without its nonce. The granting statement is the transaction's
// first and a write, so it takes the write lock at once.
func (s *Store) grant(ctx context.Context, query string, args []any, nonce string, fenceOut *int64) (bool, error) {
	// One connection and explicit BEGIN/COMMIT, as the migrations do: a
	// COMMIT that fails (a deferred constraint, a full disk) leaves
	// SQLite's transaction open, and database/sql would not roll back a
	// *sql.Tx whose Commit failed; the connection would go back to the
	// pool holding the grant uncommitted and the write lock.
	release, err := s.turn(ctx)
	if err != nil {
		return false, err
	}
	defer release()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return false, err
	}
	committed := false
	defer func() {
		if !committed {
			_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		}
	}()
	granted, err := database.QueryReturning(ctx, conn, query, args, fenceOut)
	if err != nil || !granted {
		return false, err
	}
	if _, err := conn.ExecContext(ctx, holderSQL, args[0], *fenceOut, nonce); err != nil {
		return false, err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		return false, err
	}
	committed = true
	return true, nil
}

// Successor is a contender a holder can hand its lease to (Transfer): what
// the contender's answer to the holder's announcement says of it
// (Contenders.Announce).
type Successor struct {
	// Instance is its instance_id, the grant's new holder.
	Instance string `json:"instance"`
	// Nonce is its process nonce (Store.Nonce), recorded with the grant.
	Nonce string `json:"nonce"`
	// TTL is the TTL the successor's own grants have (its leases.ttl):
	// it counts its custody by its own renew deadline, which its TTL
	// bounds.
	TTL time.Duration `json:"-"`
}

// ErrNotTransferred is Transfer's answer when it changed nothing: the
// grant is no longer the caller's to hand over (superseded, released, run
// out, its fence at its maximum) or the successor has no recent, healthy
// contender record for the lease with its nonce. The caller releases
// instead, which tells the two apart.
var ErrNotTransferred = errors.New("lease not handed over")

// Transfer hands the holder's grant c over to successor to in one
// transaction: the row gets to's instance as holder, the next fence (as
// an acquire would give it), acquired_at = renewed_at = now and an expiry
// of now + to.TTL (database clock), and to's nonce is recorded as the new
// grant's (lease_holders). It grants only while c is this process's
// grant, still held and not released, and only to a contender with a
// healthy record for the lease (lease_contenders) carrying to's nonce,
// seen within recent (Contenders.Recent). It returns the new fence,
// ErrNotTransferred when it changed nothing, or the database's error.
//
// The successor, standing by (actors/lease, Standby), reads the row
// granted to itself (Watch) and takes custody trusting it from the start
// of its standby's call, which precedes the grant, so its renew deadline
// ends before the TTL, as after an acquire of its own. A graceful
// handover then needs one write, the holder's, instead of the holder's
// release and the successor's acquire (docs/spec.md §4, docs/lease.md).
func (s *Store) Transfer(ctx context.Context, c fence.Custody, to Successor, recent time.Duration) (int64, error) {
	defer fence.LeaseWrite(s.db)()
	if err := s.check(); err != nil {
		return 0, s.note(c.Lease, fmt.Errorf("hand lease %q over: %w", c.Lease, err))
	}
	if to.Instance == "" || to.Nonce == "" || to.TTL <= 0 {
		return 0, fmt.Errorf("hand lease %q over: successor %q (nonce %q, TTL %v) incomplete: %w", c.Lease, to.Instance, to.Nonce, to.TTL, ErrNotTransferred)
	}
	var next int64
	granted, err := s.grant(ctx, transferSQL, []any{c.Lease, c.Holder, c.Fence, s.nonce, to.Instance, to.Nonce,
		to.TTL.Milliseconds(), recent.Milliseconds()}, to.Nonce, &next)
	if err != nil {
		return 0, s.note(c.Lease, fmt.Errorf("hand lease %q over: %w", c.Lease, err))
	}
	s.note(c.Lease, nil)
	if !granted {
		return 0, fmt.Errorf("hand lease %q (fence %d) over to %s: %w", c.Lease, c.Fence, to.Instance, ErrNotTransferred)
	}
	return next, nil
}

// WarmTransfer runs Transfer's transaction for lease c.Lease with a fence
// no grant carries (0), so it matches no row, writes nothing and rolls
// back. A holder runs it while it waits for its contenders' answers to
// the announcement (actors/lease), so that the Transfer right after runs
// on this process's code and the database's pages made hot: cold, the
// transaction took 427 µs p50 in a graceful handover on the 2-core host of
// docs/performance.md, warmed 320. It holds the write lock for about as
// long as an empty transaction. Errors are not reported: the Transfer
// that follows meets them.
func (s *Store) WarmTransfer(ctx context.Context, c fence.Custody) {
	var next int64
	_, _ = s.grant(ctx, transferSQL, []any{c.Lease, c.Holder, int64(0), s.nonce, "", "", int64(1), int64(1)}, "", &next)
}

// maxFence is the last fence a lease can be granted under.
const maxFence = 1<<63 - 1

// errFenceExhausted refuses a grant whose fence would overflow.
var errFenceExhausted = errors.New("fence token at its maximum; the lease can no longer change custody")

// Renew extends the grant to now + TTL (database clock). It returns
// ErrSuperseded when the row no longer carries this holder and fence
// (another instance acquired it since) or when the grant was released: a
// renewal never revives a released grant. A grant that ran out its TTL but
// that nobody acquired since still carries this holder and fence, so
// nobody else has had custody in between, and Renew extends it; the
// LeaseActor never relies on that, because it gives custody up at its
// renew deadline, before the TTL runs out.
func (s *Store) Renew(ctx context.Context, c fence.Custody) error {
	defer fence.LeaseWrite(s.db)()
	if err := s.check(); err != nil {
		return s.note(c.Lease, fmt.Errorf("renew lease %q: %w", c.Lease, err))
	}
	return s.note(c.Lease, s.matchOne(ctx, "renew", renewSQL, c, s.ttl.Milliseconds()))
}

func (s *Store) check() error {
	if s.Check == nil {
		return nil
	}
	return s.Check()
}

// Release expires the grant in place (expires_at = now), keeping holder
// and fence. It returns ErrSuperseded when the row no longer carries this
// holder and fence.
//
// Like Acquire and Renew it runs Check first: a release written to a
// database file that was deleted or replaced lands nowhere anyone reads,
// so it must fail rather than report the lease released.
func (s *Store) Release(ctx context.Context, c fence.Custody) error {
	defer fence.LeaseWrite(s.db)()
	if err := s.check(); err != nil {
		return s.note(c.Lease, fmt.Errorf("release lease %q: %w", c.Lease, err))
	}
	return s.note(c.Lease, s.matchOne(ctx, "release", releaseSQL, c, s.nonce))
}

func (s *Store) matchOne(ctx context.Context, op, query string, c fence.Custody, extra ...any) error {
	args := append([]any{c.Lease, c.Holder, c.Fence}, extra...)
	release, err := s.turn(ctx)
	if err != nil {
		return fmt.Errorf("%s lease %q: %w", op, c.Lease, err)
	}
	res, err := s.db.ExecContext(ctx, query, args...)
	release()
	if err != nil {
		return fmt.Errorf("%s lease %q: %w", op, c.Lease, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s lease %q: %w", op, c.Lease, err)
	}
	if n == 0 {
		return fmt.Errorf("%s lease %q (fence %d): %w", op, c.Lease, c.Fence, fence.ErrSuperseded)
	}
	return nil
}

// watchSQL reads whether a lease is free to acquire, on the database's
// clock, by acquireSQL's own test (expires_at <= now), the fence the row
// carries, whether the grant is this process's (holder ?2, nonce ?3: a
// holder handed it over, Transfer), and the grant's age and time left.
var watchSQL = `SELECT expires_at <= n, fence,
  holder = ?2 AND COALESCE((SELECT nonce FROM lease_holders h WHERE h.name = leases.name AND h.fence = leases.fence), '') = ?3,
  n - acquired_at, expires_at - n
FROM leases, (SELECT ` + database.NowMS + ` AS n) WHERE name = ?1`

// Vacancy is what a standby's read of a lease row finds (Store.Watch).
type Vacancy struct {
	// Free: no row, or a grant released or run out, on the database's
	// clock (the acquire's own test).
	Free bool
	// Fence is the row's fence (0 without a row).
	Fence int64
	// Ours: the grant carries the holder asked for and this process's
	// nonce, that is a holder handed it to this process (Transfer).
	Ours bool
	// Age and TimeLeft are the grant's, on the database's clock, as
	// Grant's (set with Ours).
	Age, TimeLeft time.Duration
}

// Watch reads what an acquire by holder would find on lease name now (see
// Vacancy). It only reads: a contender standing by for an announced
// release polls it (actors/lease, Standby) instead of attempting
// acquires, which would take the write lock the releasing holder needs.
// It returns the database's error.
func (s *Store) Watch(ctx context.Context, name, holder string) (Vacancy, error) {
	var free, ours, ageMS, leftMS int64
	var v Vacancy
	err := s.db.QueryRowContext(ctx, watchSQL, name, holder, s.nonce).Scan(&free, &v.Fence, &ours, &ageMS, &leftMS)
	if errors.Is(err, sql.ErrNoRows) {
		return Vacancy{Free: true}, nil
	}
	if err != nil {
		return Vacancy{}, fmt.Errorf("read lease %q: %w", name, err)
	}
	v.Free, v.Ours = free != 0, ours != 0
	if v.Ours {
		v.Age, v.TimeLeft = time.Duration(ageMS)*time.Millisecond, time.Duration(leftMS)*time.Millisecond
	}
	return v, nil
}

// PendingAcquire marks an acquire this process is about to make (a
// standby watching for an announced release: actors/lease) as a pending
// lease write (fence.LeaseWrite) until done is called: fenced
// transactions of this process on the database that have not begun wait
// for it, at most fence's yield bound (500 ms; a standby's watch lasts at
// most 50 ms). So a worker that has just started under another lease
// does not take the write lock the acquire needs.
func (s *Store) PendingAcquire() (done func()) { return fence.LeaseWrite(s.db) }

// List returns every lease row, read at one instant of the database clock.
func (s *Store) List(ctx context.Context) ([]Row, error) {
	return List(ctx, s.db)
}

// Querier is the part of *sql.DB that reading the lease table needs.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// ListBounded is List that returns ctx.Err() when ctx ends first (the
// driver ignores contexts).
func ListBounded(ctx context.Context, db Querier) ([]Row, error) {
	type result struct {
		rows []Row
		err  error
	}
	done := make(chan result, 1)
	go func() {
		rows, err := List(ctx, db)
		done <- result{rows, err}
	}()
	select {
	case r := <-done:
		return r.rows, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("list leases: %w", ctx.Err())
	}
}

// List returns every lease row in the database.
func List(ctx context.Context, db Querier) ([]Row, error) {
	rows, err := db.QueryContext(ctx, listSQL)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.Name, &r.Holder, &r.Fence, &r.AcquiredAt, &r.RenewedAt, &r.ExpiresAt, &r.Now); err != nil {
			return nil, fmt.Errorf("list leases: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
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
	rows, err := s.db.QueryContext(ctx, liveElsewhereSQL, instance, s.nonce, window.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("look for instance %q elsewhere: %w", instance, err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("look for instance %q elsewhere: %w", instance, err)
		}
		names = append(names, n)
	}
	return names, rows.Err()
}

// turns holds, per database handle, the turn this process's lease writes
// take one at a time (a channel of capacity 1).
var turns sync.Map

// turn waits until no other lease write of this process is running on
// the store's database, and returns the function that ends this one's
// turn; ctx.Err() when ctx ends first.
//
// SQLite has one writer: two lease writes of one process on two
// connections (the grants a contender's LeaseActors ask for on one nudge,
// a renewal beside a release) would otherwise meet as SQLITE_BUSY, and
// the busy handler retries after sleeps of 1, 2, 5, 10 ms and more, which
// made a graceful handover take milliseconds where the statements take a
// fraction of one. Queued here, the next write starts the moment the last
// one commits. Writes of other processes still meet the busy handler.
func (s *Store) turn(ctx context.Context) (func(), error) {
	t, ok := turns.Load(s.db) // no allocation on every write
	if !ok {
		t, _ = turns.LoadOrStore(s.db, make(chan struct{}, 1))
	}
	ch := t.(chan struct{})
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
