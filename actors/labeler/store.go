package labeler

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

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
	outcomeUnresolved  = "unresolved"  // manifest/tag record not indexed here
	outcomeMalformed   = "malformed"   // does not decode, lacks a field, bad time or uri
)

var labelOutcomes = []string{
	outcomeTakedown, outcomeNegated, outcomeExpired, outcomeIgnored,
	outcomeUnsupported, outcomeUnresolved, outcomeMalformed,
}

// store is the subscriber's side of the database: takedowns and cursor.
type store struct {
	db       *sql.DB
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

	takedownSQL = `INSERT INTO taken_down_subjects
  (src, did, repo, uri, cid, created_at, expires_at, seq, fence, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ` + database.NowMS + `)
ON CONFLICT (src, did, repo) DO UPDATE SET
  uri        = excluded.uri,
  cid        = excluded.cid,
  created_at = excluded.created_at,
  expires_at = excluded.expires_at,
  seq        = excluded.seq,
  fence      = excluded.fence,
  updated_at = excluded.updated_at`

	removeSQL = `DELETE FROM taken_down_subjects WHERE src = ?1 AND did = ?2 AND repo = ?3`

	nowSQL = `SELECT ` + database.NowMS
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
	sub, err := resolveSubject(ctx, tx, l.URI)
	if err != nil {
		return err
	}
	outcome := outcomeTakedown
	switch {
	case l.Neg:
		outcome = outcomeNegated
	case exp.Valid && exp.Int64 <= nowMS:
		outcome = outcomeExpired
	}
	if outcome == outcomeTakedown {
		_, err = tx.ExecContext(ctx, takedownSQL, l.Src, sub.did, sub.repo, l.URI, l.CID, cts, exp, seq, s.custody.Fence)
	} else {
		_, err = tx.ExecContext(ctx, removeSQL, l.Src, sub.did, sub.repo)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", outcome, l.URI, err)
	}
	outcomes[outcome]++
	return nil
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
	return errors.Is(err, errMalformed) || errors.Is(err, errUnsupportedSubject) || errors.Is(err, errUnknownRecord)
}

func skipOutcome(err error) string {
	switch {
	case errors.Is(err, errUnsupportedSubject):
		return outcomeUnsupported
	case errors.Is(err, errUnknownRecord):
		return outcomeUnresolved
	default:
		return outcomeMalformed
	}
}

// parseTime parses an AT Protocol datetime into Unix ms: the Lexicon
// datetime syntax (atproto.com/specs/lexicon#datetime), stricter than Go's
// RFC 3339 parser (no T3:20:50, no -00:00).
func parseTime(s string) (int64, error) {
	t, err := syntax.ParseDatetimeTime(s)
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}
