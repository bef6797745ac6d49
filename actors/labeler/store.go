package labeler

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
)

// ValTakedown is the label value this subscriber acts on
// (com.atproto.label.defs#labelValue "!takedown").
const ValTakedown = "!takedown"

// Outcomes of one label, the `outcome` label of appview_labeler_labels_total.
const (
	outcomeTakedown    = "takedown"    // subject recorded as taken down
	outcomeNegated     = "negated"     // neg: true removed the takedown
	outcomeExpired     = "expired"     // exp in the past: not applied, earlier takedown removed
	outcomeIgnored     = "ignored"     // a value other than !takedown
	outcomeUnsupported = "unsupported" // subject outside the registry
	outcomePending     = "pending"     // takedown of a manifest/tag record not indexed yet: kept, applied once it is
	outcomeResolved    = "resolved"    // a pending takedown applied: its record was indexed
	outcomeMalformed   = "malformed"   // does not decode, lacks a field, bad time or uri
)

var labelOutcomes = []string{
	outcomeTakedown, outcomeNegated, outcomeExpired, outcomeIgnored,
	outcomeUnsupported, outcomePending, outcomeResolved, outcomeMalformed,
}

// store is the subscriber's side of the database: takedowns and cursor.
type store struct {
	db       *database.DB
	endpoint string
	custody  fence.Custody
	// skipLog is sampled: a stream of bad labels must not flood the log.
	skipLog zerolog.Logger
	// afterWrite, when set, runs after every committed write.
	afterWrite func()
}

const (
	cursorSQL = `SELECT seq FROM labeler_cursors WHERE endpoint = ?1`

	saveCursorSQL = `INSERT INTO labeler_cursors (endpoint, seq, src, fence, updated_at)
VALUES (?1, ?2, ?3, ?4, ` + database.NowMS + `)
ON CONFLICT (endpoint) DO UPDATE SET
  seq        = excluded.seq,
  src        = CASE WHEN excluded.src <> '' THEN excluded.src ELSE labeler_cursors.src END,
  fence      = excluded.fence,
  updated_at = excluded.updated_at`

	// labelSQL stores a takedown label under its key (src, uri, val);
	// repo NULL: its record is not indexed yet (resolvePending fills it).
	labelSQL = `INSERT INTO labels
  (src, uri, val, did, collection, rkey, repo, cid, created_at, expires_at, seq, fence, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ` + database.NowMS + `)
ON CONFLICT (src, uri, val) DO UPDATE SET
  did        = excluded.did,
  collection = excluded.collection,
  rkey       = excluded.rkey,
  repo       = excluded.repo,
  cid        = excluded.cid,
  created_at = excluded.created_at,
  expires_at = excluded.expires_at,
  seq        = excluded.seq,
  fence      = excluded.fence,
  updated_at = excluded.updated_at`

	removeLabelSQL = `DELETE FROM labels WHERE src = ?1 AND uri = ?2 AND val = ?3`

	resolveLabelSQL = `UPDATE labels SET repo = ?4, fence = ?5, updated_at = ` + database.NowMS + `
WHERE src = ?1 AND uri = ?2 AND val = ?3 AND repo IS NULL`

	// clearSubjectSQL and deriveSubjectSQL rebuild one subject's row of
	// taken_down_subjects from the labels that map to it: there while any
	// does, with the label that lasts longest (no exp first, then the
	// latest exp; the latest seq among equals), so expires_at is when the
	// last of them lapses.
	clearSubjectSQL  = `DELETE FROM taken_down_subjects WHERE src = ?1 AND did = ?2 AND repo = ?3`
	deriveSubjectSQL = `INSERT INTO taken_down_subjects
  (src, did, repo, uri, cid, created_at, expires_at, seq, fence, updated_at)
SELECT src, did, repo, uri, cid, created_at, expires_at, seq, ?4, ` + database.NowMS + `
FROM labels WHERE src = ?1 AND did = ?2 AND repo = ?3 AND val = '` + ValTakedown + `'
ORDER BY expires_at IS NOT NULL, expires_at DESC, seq DESC LIMIT 1`

	nowSQL = `SELECT ` + database.NowMS
)

var (
	// labelRepoSQL reads the subject a stored label maps to (repo NULL:
	// not yet resolved).
	labelRepoSQL = `SELECT ` + database.Text("did") + `, ` + database.Text("repo") + `
FROM labels WHERE src = ?1 AND uri = ?2 AND val = ?3`

	// pendingSQL lists takedowns of records not indexed when they arrived,
	// a page at a time: ?2 of them after rowid ?1, in rowid order.
	pendingSQL = `SELECT rowid, ` + database.Text("src") + `, ` + database.Text("uri") + `, ` + database.Text("val") + `, ` +
		database.Text("did") + `, ` + database.Text("collection") + `, ` + database.Text("rkey") + `
FROM labels WHERE repo IS NULL AND rowid > ?1 ORDER BY rowid LIMIT ?2`
)

// cursor returns the seq of the last applied frame, 0 when none.
func (s *store) cursor(ctx context.Context) (int64, error) {
	var seq int64
	err := database.Bounded(ctx, func() error {
		return s.db.QueryRowContext(ctx, cursorSQL, s.endpoint).Scan(&seq)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read labeler cursor: %w", err)
	}
	return seq, nil
}

// resetCursor sets the cursor back to 0, so the next connection replays
// the labeler's whole history (applying labels is idempotent).
func (s *store) resetCursor(ctx context.Context) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, saveCursorSQL, s.endpoint, 0, "", s.custody.Fence)
		return err
	})
}

// applyFrame applies the labels of one #labels frame and moves the cursor
// to seq, in one fenced transaction: either the whole frame lands with its
// cursor, or nothing does and the frame is received again after a
// reconnect. A label that cannot be applied is skipped and counted; only a
// database error (or lost custody: ErrSuperseded) fails the frame.
// It returns how many labels had each outcome.
func (s *store) applyFrame(ctx context.Context, f frame) (map[string]int, error) {
	var outcomes map[string]int
	err := s.write(ctx, func(tx *sql.Tx) error {
		outcomes = map[string]int{}
		var nowMS int64
		if err := tx.QueryRowContext(ctx, nowSQL).Scan(&nowMS); err != nil {
			return fmt.Errorf("read database clock: %w", err)
		}
		src := ""
		for i, raw := range f.labels {
			l, err := decodeLabel(raw)
			if err == nil {
				src = l.Src
				err = s.applyLabel(ctx, tx, f.seq, l, nowMS, outcomes)
			}
			if err != nil {
				if !isSkip(err) {
					return fmt.Errorf("apply label %d of seq %d: %w", i, f.seq, err)
				}
				outcomes[skipOutcome(err)]++
				s.skipLog.Warn().Err(logval.Error(err)).Int64("seq", f.seq).Int("label", i).Msg("label skipped")
			}
		}
		if _, err := tx.ExecContext(ctx, saveCursorSQL, s.endpoint, f.seq, src, s.custody.Fence); err != nil {
			return fmt.Errorf("save labeler cursor %d: %w", f.seq, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return outcomes, nil
}

func (s *store) applyLabel(ctx context.Context, tx *sql.Tx, seq int64, l Label, nowMS int64, outcomes map[string]int) error {
	if l.Val != ValTakedown {
		outcomes[outcomeIgnored]++
		return nil
	}
	if _, err := syntax.ParseDID(l.Src); err != nil {
		// src is the labeler's DID and part of the takedown's key.
		return fmt.Errorf("%w label src %q: %v", errMalformed, l.Src, err)
	}
	cts, err := parseTime(l.Cts)
	if err != nil {
		return fmt.Errorf("%w label cts %q: %v", errMalformed, l.Cts, err)
	}
	var exp sql.NullInt64
	if l.Exp != "" {
		ms, err := parseTime(l.Exp)
		if err != nil {
			return fmt.Errorf("%w label exp %q: %v", errMalformed, l.Exp, err)
		}
		exp = sql.NullInt64{Int64: ms, Valid: true}
	}
	if l.CID != "" {
		// Stored with the label: a CID, or the label is malformed (a NUL
		// or stray text would otherwise reach the database).
		if _, err := syntax.ParseCID(l.CID); err != nil {
			return fmt.Errorf("%w label cid %q: %v", errMalformed, l.CID, err)
		}
	}
	sub, err := resolveSubject(ctx, tx, l.URI)
	if err != nil {
		return err
	}
	// The subject the label mapped to before this copy of it, if stored.
	var old struct{ did, repo sql.NullString }
	err = tx.QueryRowContext(ctx, labelRepoSQL, l.Src, l.URI, l.Val).Scan(&old.did, &old.repo)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read label %s: %w", l.URI, err)
	}
	// What the label maps to from now on: its record's repository, or, for
	// a record not indexed (any more), the one an earlier copy resolved to.
	next := sub
	if sub.pending && old.repo.Valid {
		next.repo, next.pending = old.repo.String, false
	}
	outcome := outcomeTakedown
	switch {
	case l.Neg:
		outcome = outcomeNegated
	case exp.Valid && exp.Int64 <= nowMS:
		outcome = outcomeExpired
	case next.pending:
		outcome = outcomePending
	}
	stored := false
	if outcome == outcomeTakedown || outcome == outcomePending {
		repo := sql.NullString{String: next.repo, Valid: !next.pending}
		_, err = tx.ExecContext(ctx, labelSQL, l.Src, l.URI, l.Val, next.did, next.collection, next.rkey, repo,
			l.CID, cts, exp, seq, s.custody.Fence)
		stored = err == nil && !next.pending
		if stored {
			err = s.deriveSubject(ctx, tx, l.Src, next.did, next.repo)
		}
	} else {
		_, err = tx.ExecContext(ctx, removeLabelSQL, l.Src, l.URI, l.Val)
	}
	if err == nil && old.repo.Valid && !(stored && old.did.String == next.did && old.repo.String == next.repo) {
		// Removed, or now mapped elsewhere: the subject it mapped to is
		// derived again without it.
		err = s.deriveSubject(ctx, tx, l.Src, old.did.String, old.repo.String)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", outcome, l.URI, err)
	}
	outcomes[outcome]++
	return nil
}

// deriveSubject rebuilds the taken_down_subjects row of (src, did, repo)
// from the labels that map to it: it is there while any label does.
func (s *store) deriveSubject(ctx context.Context, tx *sql.Tx, src, did, repo string) error {
	if _, err := tx.ExecContext(ctx, clearSubjectSQL, src, did, repo); err != nil {
		return fmt.Errorf("clear subject %s %q: %w", did, repo, err)
	}
	if _, err := tx.ExecContext(ctx, deriveSubjectSQL, src, did, repo, s.custody.Fence); err != nil {
		return fmt.Errorf("derive subject %s %q: %w", did, repo, err)
	}
	return nil
}

// pendingBatch is the most pending labels read per query.
const pendingBatch = 500

// pendingLabel is a stored takedown whose record was not indexed.
type pendingLabel struct {
	src, uri, val, did, collection, rkey string
	repo                                 string // once found
}

// resolvePending applies the takedowns that arrived for manifest or tag
// records not indexed at the time (outcome pending) and whose records are
// indexed now. It looks with reads, all pending labels in pages of
// pendingBatch; only when some record is found does it write, in one
// fenced transaction: each such label takes its record's repository and
// that subject is derived again. It returns how many it applied; errors
// are the database's, or fence.ErrSuperseded when the custody is lost.
func (s *store) resolvePending(ctx context.Context) (int, error) {
	var found []pendingLabel
	after := int64(0)
	for {
		var page []pendingLabel
		err := database.Bounded(ctx, func() error {
			page = page[:0]
			rows, err := s.db.QueryContext(ctx, pendingSQL, after, pendingBatch)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var p pendingLabel
				if err := rows.Scan(&after, &p.src, &p.uri, &p.val, &p.did, &p.collection, &p.rkey); err != nil {
					return err
				}
				page = append(page, p)
			}
			return rows.Err()
		})
		if err != nil {
			return 0, fmt.Errorf("list pending labels: %w", err)
		}
		for _, p := range page {
			if _, ok := recordRepoSQL[p.collection]; !ok {
				continue // not a record label: stored only by a broken writer
			}
			var (
				repo string
				ok   bool
			)
			err := database.Bounded(ctx, func() (err error) {
				repo, ok, err = recordRepo(ctx, s.db, p.did, p.collection, p.rkey)
				return err
			})
			if err != nil {
				return 0, err
			}
			if ok {
				p.repo = repo
				found = append(found, p)
			}
		}
		if len(page) < pendingBatch {
			break
		}
	}
	if len(found) == 0 {
		return 0, nil
	}
	var resolved int
	err := s.write(ctx, func(tx *sql.Tx) error {
		resolved = 0
		for _, p := range found {
			r, err := tx.ExecContext(ctx, resolveLabelSQL, p.src, p.uri, p.val, p.repo, s.custody.Fence)
			var n int64
			if err == nil {
				n, err = r.RowsAffected()
			}
			if err != nil {
				return fmt.Errorf("resolve label %s: %w", p.uri, err)
			}
			if n == 0 {
				continue // negated, or applied by a newer copy, since the read
			}
			if err := s.deriveSubject(ctx, tx, p.src, p.did, p.repo); err != nil {
				return err
			}
			resolved++
		}
		return nil
	})
	return resolved, err
}

// write runs fn in a transaction fenced by the subscriber's custody.
func (s *store) write(ctx context.Context, fn func(tx *sql.Tx) error) error {
	if err := fence.Fenced(ctx, s.db, s.custody, fn); err != nil {
		return err
	}
	if s.afterWrite != nil {
		s.afterWrite()
	}
	return nil
}

// isSkip reports whether a label error means "skip this label" rather than
// "this frame cannot be applied".
func isSkip(err error) bool {
	return errors.Is(err, errMalformed) || errors.Is(err, errUnsupportedSubject)
}

func skipOutcome(err error) string {
	switch {
	case errors.Is(err, errUnsupportedSubject):
		return outcomeUnsupported
	default:
		return outcomeMalformed
	}
}

// parseTime parses an AT Protocol datetime into Unix ms: the Lexicon
// datetime syntax (atproto.com/specs/lexicon#datetime), stricter than Go's
// RFC 3339 parser (no T3:20:50, no -00:00).
func parseTime(s string) (int64, error) {
	t, err := atproto.ParseDatetime(s)
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}
