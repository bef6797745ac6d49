package consumer

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
)

// Why a repository is queued for a re-read (repo_resyncs.reason).
const (
	// reasonSync: a #sync event said the repository was replaced upstream.
	reasonSync = "sync"
	// reasonGap: Jetstream lost events (CursorTooOld, OutdatedCursor), so
	// deletes and re-creations in the gap were missed; every repository
	// the database holds records of is re-read. These wait behind any
	// other reason (Resyncer.next).
	reasonGap = "jetstream-gap"
)

// maxRevLookup bounds the DIDs looked up in one statement (SQLite caps a
// statement at 32,766 variables; a batch holds far fewer DIDs).
const maxRevLookup = 500

// revScreen screens the chunks of one transaction (see screen) against
// the newest rev of each repository: the revs stored in repo_revs, read
// once for every DID of the transaction's events, and the revs of the
// commits screened so far, kept in memory. Chunk by chunk it therefore
// judges a commit exactly as a fresh look-up after recording the earlier
// chunks' revs would, without a look-up and a write per chunk and DID.
type revScreen struct {
	// newest is the newest rev known per DID (stored or screened).
	newest map[string]string
	// applied is the newest rev of each DID among the commits screened
	// to be applied, in first-seen order (recorded by record).
	applied map[string]string
	order   []string
	// future counts the commits dropped for a rev from the future
	// (futureRev), and lastFuture names the last one ("did rev") for the
	// log.
	future     int
	lastFuture string
}

// futureRevTolerance is how far ahead of this host's clock a commit's rev
// may lie: the reference relay's own rule and bound (indigo cmd/relay,
// futureRevTolerance, 5 minutes), which refuses such a commit as "commit
// revision in the future".
const futureRevTolerance = 5 * time.Minute

// futureRev reports whether rev lies more than futureRevTolerance ahead
// of now (Unix µs). Recorded as its repository's newest rev, it would
// make every later commit of that repository stale until that time (a
// PDS clock years ahead, or a hostile PDS, would silence the repository).
func futureRev(rev syntax.TID, now int64) bool {
	return rev.Time().UnixMicro() > now+futureRevTolerance.Microseconds()
}

// newRevScreen reads the stored revs of every repository with a commit in
// events (maxRevLookup DIDs a query).
func newRevScreen(ctx context.Context, tx *sql.Tx, events []jetstream.Event) (*revScreen, error) {
	var dids []string
	seen := map[string]bool{}
	for i := range events {
		ev := &events[i]
		if ev.Commit != nil && !seen[ev.DID] && validTID(ev.Commit.Rev) {
			seen[ev.DID] = true
			dids = append(dids, ev.DID)
		}
	}
	newest, err := loadRevs(ctx, tx, dids)
	if err != nil {
		return nil, err
	}
	return &revScreen{newest: newest, applied: map[string]string{}}, nil
}

// screen splits a chunk before it is applied: the events to apply, the
// DIDs of #sync events (not for the processor: they queue a re-read), and
// the number of stale commits dropped. A commit is stale when its rev is
// older than the newest rev recorded for its repository (repo_revs, or an
// earlier commit of this transaction): Jetstream delivers at-least-once
// and in order per repository, so an older rev is a replay (after a
// resume by time on another host) or a broken upstream, and applying it
// could only roll the repository back. An equal rev is applied (one
// commit carries several operations, all with its rev; applying again is
// idempotent). A rev that is not a TID is never judged stale. A commit
// whose rev lies in the future (futureRev) is dropped too, as the
// reference relay drops it, and counted in s.future. Every DID of chunk
// must have been among newRevScreen's events.
func (s *revScreen) screen(chunk []jetstream.Event) (apply []jetstream.Event, syncs []string, stale int) {
	apply = make([]jetstream.Event, 0, len(chunk))
	now := time.Now().UnixMicro()
	for i := range chunk {
		ev := &chunk[i]
		switch {
		case ev.Kind == jetstream.KindSync:
			syncs = append(syncs, ev.DID)
			continue
		case ev.Commit != nil:
			rev := ev.Commit.Rev
			tid, err := syntax.ParseTID(rev) // once: the screen runs for every commit
			if err != nil {
				break // not a TID: never judged
			}
			if futureRev(tid, now) {
				s.future++
				s.lastFuture = ev.DID + " " + rev
				continue
			}
			if have, ok := s.newest[ev.DID]; ok && rev < have {
				stale++
				continue
			}
			s.newest[ev.DID] = rev
			if have, ok := s.applied[ev.DID]; !ok {
				s.order = append(s.order, ev.DID)
				s.applied[ev.DID] = rev
			} else if rev > have {
				s.applied[ev.DID] = rev
			}
		}
		apply = append(apply, *ev)
	}
	return apply, syncs, stale
}

// record stores the newest applied rev of every repository screened so
// far (recordRevs), maxRevLookup repositories a statement.
func (s *revScreen) record(ctx context.Context, tx *sql.Tx) error {
	for start := 0; start < len(s.order); start += maxRevLookup {
		chunk := s.order[start:min(start+maxRevLookup, len(s.order))]
		args := make([]any, 0, 2*len(chunk))
		for _, did := range chunk {
			args = append(args, did, s.applied[did])
		}
		q := `INSERT INTO repo_revs (did, rev, updated_at) VALUES (?, ?, ` + database.NowMS + `)` +
			strings.Repeat(`, (?, ?, `+database.NowMS+`)`, len(args)/2-1) + recordRevsConflict
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			return fmt.Errorf("record revs of %d repositories: %w", len(chunk), err)
		}
	}
	return nil
}

// validTID reports whether rev is a TID, so that two revs compare by
// time as strings (TIDs are fixed-length, sortable base32).
func validTID(rev string) bool {
	_, err := syntax.ParseTID(rev)
	return err == nil
}

func loadRevs(ctx context.Context, tx *sql.Tx, dids []string) (map[string]string, error) {
	out := make(map[string]string, len(dids))
	for start := 0; start < len(dids); start += maxRevLookup {
		chunk := dids[start:min(start+maxRevLookup, len(dids))]
		args := make([]any, len(chunk))
		for i, d := range chunk {
			args[i] = d
		}
		q := `SELECT ` + database.Text("did") + `, ` + database.Text("rev") + ` FROM repo_revs WHERE did IN (` +
			database.InList(len(args)) + `)`
		rows, err := tx.QueryContext(ctx, q, args...)
		if err != nil {
			return nil, fmt.Errorf("load repository revs: %w", err)
		}
		for rows.Next() {
			var did, rev string
			if err := rows.Scan(&did, &rev); err != nil {
				rows.Close()
				return nil, fmt.Errorf("load repository revs: %w", err)
			}
			out[did] = rev
		}
		if err := rows.Close(); err != nil {
			return nil, fmt.Errorf("load repository revs: %w", err)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("load repository revs: %w", err)
		}
	}
	return out, nil
}

// recordRevsConflict keeps the newest rev per repository (never moves
// back); a VALUES list naming each DID once precedes it.
const recordRevsConflict = `
ON CONFLICT (did) DO UPDATE SET rev = excluded.rev, updated_at = excluded.updated_at
WHERE excluded.rev > repo_revs.rev`

// recordRevsSQL stores one repository's rev (the re-reader's).
const recordRevsSQL = `INSERT INTO repo_revs (did, rev, updated_at) VALUES (?1, ?2, ` + database.NowMS + `)` + recordRevsConflict

// requestResyncSQL queues a repository for a re-read, at once; a repository
// already queued keeps its attempts and is due now.
const requestResyncSQL = `INSERT INTO repo_resyncs (did, reason, requested_at, next_at) VALUES (?1, ?2, ` + database.NowMS + `, ` + database.NowMS + `)
ON CONFLICT (did) DO UPDATE SET reason = excluded.reason, requested_at = excluded.requested_at, next_at = excluded.next_at`

// requestResyncs queues dids for a re-read (see resync.go).
func requestResyncs(ctx context.Context, tx *sql.Tx, dids []string, reason string) error {
	for _, did := range dids {
		if _, err := tx.ExecContext(ctx, requestResyncSQL, did, reason); err != nil {
			return fmt.Errorf("queue re-read of %s: %w", did, err)
		}
	}
	return nil
}
