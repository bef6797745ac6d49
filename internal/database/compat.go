package database

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// Migrations only add (migrations/README.md), so a binary older than the
// database's schema runs on it: it warns once (NewerMigrations) and runs
// on, which is what makes a rolling upgrade and a rollback safe. A
// migration that cannot keep that promise says so in a line of its own,
//
//	-- breaking: WHY
//
// and applying it records its version in schema_compat: from then on a
// binary that does not know that version refuses to migrate, before it
// writes anything (ErrSchemaTooNew; serve refuses its start with one
// line, exit 2), so it never runs half on a schema it would misread.
// Binaries built before this check existed (migration 16 and earlier)
// do not read schema_compat: a breaking migration must not ship while
// one of them may still start on the database.

// ErrSchemaTooNew is wrapped by Migrate's error when a breaking migration
// this binary does not know was applied to the database.
var ErrSchemaTooNew = errors.New("the database needs a newer appview")

var (
	// compatTableSQL holds at most one row: the version an appview must
	// know to run on this database, and the migration that set it.
	compatTableSQL = `CREATE TABLE IF NOT EXISTS schema_compat (
		id          INTEGER PRIMARY KEY CHECK (id = 1),
		min_version INTEGER NOT NULL,
		migration   TEXT    NOT NULL,
		why         TEXT    NOT NULL
	)`
	compatReadSQL = `SELECT c.min_version, ` + Text("c.migration") + `, ` + Text("c.why") + `, (SELECT MAX(version) FROM schema_migrations)
FROM schema_compat c WHERE c.id = 1`
	// compatRecordSQL never lowers the bar: an older breaking migration
	// applied late (versions are applied in order, so only by a bug)
	// keeps the higher one.
	compatRecordSQL = `INSERT INTO schema_compat (id, min_version, migration, why) VALUES (1, ?1, ?2, ?3)
ON CONFLICT (id) DO UPDATE SET min_version = excluded.min_version, migration = excluded.migration, why = excluded.why
WHERE excluded.min_version > schema_compat.min_version`
)

// breakingPrefix starts a migration file's line that marks it breaking.
const breakingPrefix = "-- breaking:"

// breakingReason returns the WHY of a migration body's "-- breaking: WHY"
// line ("" when it has none: an additive migration).
func breakingReason(body string) string {
	for _, line := range strings.Split(body, "\n") {
		if why, ok := strings.CutPrefix(strings.TrimSpace(line), breakingPrefix); ok {
			if why = strings.TrimSpace(why); why != "" {
				return why
			}
			return "no reason given"
		}
	}
	return ""
}

// checkCompat creates schema_compat when missing and returns an error
// wrapping ErrSchemaTooNew when it asks for a version above the newest of
// migs (what this binary knows). It runs inside Migrate's transaction.
func checkCompat(ctx context.Context, conn *sql.Conn, migs []Migration) error {
	if _, err := conn.ExecContext(ctx, compatTableSQL); err != nil {
		return fmt.Errorf("migrate: create schema_compat: %w", err)
	}
	known := 0
	for _, m := range migs {
		known = max(known, m.Version)
	}
	var need, at sql.NullInt64
	var migration, why string
	err := conn.QueryRowContext(ctx, compatReadSQL).Scan(&need, &migration, &why, &at)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("migrate: read schema_compat: %w", err)
	case need.Int64 <= int64(known):
		return nil
	}
	return fmt.Errorf("%w: its schema is at version %d, and migration %s made every appview that does not know version %d refuse to run on it (%s); this appview knows versions up to %d: upgrade it",
		ErrSchemaTooNew, at.Int64, migration, need.Int64, oneLine(why), known)
}

// recordBreaking raises schema_compat to m's version when m is breaking.
func recordBreaking(ctx context.Context, conn *sql.Conn, m Migration) error {
	if m.Breaking == "" {
		return nil
	}
	if _, err := conn.ExecContext(ctx, compatRecordSQL, m.Version, fmt.Sprintf("%04d_%s", m.Version, m.Name), m.Breaking); err != nil {
		return fmt.Errorf("migrate: record migration %d in schema_compat: %w", m.Version, err)
	}
	return nil
}

// oneLine joins s's lines with spaces.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
