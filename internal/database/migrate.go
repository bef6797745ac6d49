package database

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/libsql/sqlite-antlr4-parser/sqliteparserutils"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migration is one versioned schema change, from migrations/NNNN_name.sql
// (migrations/README.md gives the rules a migration keeps).
type Migration struct {
	Version    int
	Name       string
	Statements []string
	// Breaking is the reason given by the file's "-- breaking: WHY" line:
	// an older binary could not run correctly on the schema after it, so
	// applying it makes every binary that does not know it refuse to
	// start (schema_compat, compat.go). "" for an additive migration.
	Breaking string
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		num, rest, ok := strings.Cut(strings.TrimSuffix(name, ".sql"), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_name.sql", name)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s share version %d", prev, name, v)
		}
		seen[v] = name
		body, err := migrationFiles.ReadFile("migrations/" + name)
		if err != nil {
			return nil, err
		}
		stmts, _ := sqliteparserutils.SplitStatement(string(body))
		var clean []string
		for _, s := range stmts {
			if s = strings.TrimSpace(s); s != "" && !onlyComments(s) {
				clean = append(clean, s)
			}
		}
		out = append(out, Migration{Version: v, Name: rest, Statements: clean, Breaking: breakingReason(string(body))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

func onlyComments(s string) bool {
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.HasPrefix(line, "--") {
			return false
		}
	}
	return true
}

// Migrate applies every migration not yet recorded in schema_migrations,
// all in one write transaction taken up front (BEGIN IMMEDIATE), so two
// processes starting at once on a new database serialise: the second waits
// for the first and then finds nothing left to do. It returns the versions
// it applied.
func (db *DB) Migrate(ctx context.Context) ([]int, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	applied, err := db.apply(ctx, migs)
	if err == nil {
		db.migrated.Store(true)
	}
	return applied, err
}

// apply is Migrate for a given list of migrations (tests pass their own).
func (db *DB) apply(ctx context.Context, migs []Migration) ([]int, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return nil, fmt.Errorf("migrate: begin: %w", err)
	}
	applied, err := db.migrateLocked(ctx, conn, migs)
	if err != nil {
		_, _ = conn.ExecContext(ctx, "ROLLBACK")
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		_, _ = conn.ExecContext(ctx, "ROLLBACK")
		return nil, fmt.Errorf("migrate: commit: %w", err)
	}
	db.applied = applied
	return applied, nil
}

// AppliedMigrations returns the versions the last Migrate applied (nil
// when the database was already up to date).
func (db *DB) AppliedMigrations() []int { return db.applied }

// ErrForeignDatabase refuses to migrate a database that holds tables but
// no schema_migrations: another program's database (a database.url
// pointing at the wrong file), into which appview would otherwise create
// its tables, or fail half-way on a table of the same name. (Open has
// already set a file's journal mode to WAL by then.)
var ErrForeignDatabase = errors.New("not an appview database")

// UserTables returns the names of the database's tables and views, those
// of SQLite's own (sqlite_*) left out, in name order; schema_migrations
// among them marks appview's own database. It returns the database's
// error.
func UserTables(ctx context.Context, q Querier) ([]string, error) {
	names, err := Column(ctx, q, `SELECT `+Text("name")+` FROM sqlite_master
WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite\_%' ESCAPE '\' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("read the schema: %w", err)
	}
	return names, nil
}

// Foreign reports whether a database with these tables (UserTables) is
// another program's: tables or views, but no schema_migrations.
func Foreign(tables []string) bool {
	return len(tables) > 0 && !slices.Contains(tables, "schema_migrations")
}

// checkNotForeign returns ErrForeignDatabase (wrapped, naming up to five of
// its tables and views) when the database is Foreign.
func checkNotForeign(ctx context.Context, conn *sql.Conn) error {
	tables, err := UserTables(ctx, conn)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if !Foreign(tables) {
		return nil
	}
	shown := tables[:min(len(tables), 5)]
	more := ""
	if len(tables) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(tables)-len(shown))
	}
	return fmt.Errorf("%w: it has tables (%s%s) but no schema_migrations: another program's database? appview migrates only an empty database or its own", ErrForeignDatabase, strings.Join(shown, ", "), more)
}

func (db *DB) migrateLocked(ctx context.Context, conn *sql.Conn, migs []Migration) ([]int, error) {
	if err := checkNotForeign(ctx, conn); err != nil {
		return nil, err
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    INTEGER PRIMARY KEY,
		name       TEXT    NOT NULL,
		applied_at INTEGER NOT NULL
	)`); err != nil {
		return nil, fmt.Errorf("migrate: create schema_migrations: %w", err)
	}
	// Before anything is applied: a binary too old for the schema
	// refuses here, and the transaction rolls back with nothing written.
	if err := checkCompat(ctx, conn, migs); err != nil {
		return nil, err
	}
	rows, err := conn.QueryContext(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("migrate: read schema_migrations: %w", err)
	}
	done := map[int]bool{}
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			rows.Close()
			return nil, err
		}
		done[v] = true
	}
	rows.Close()
	known := map[int]bool{}
	for _, m := range migs {
		known[m.Version] = true
	}
	var unknown []int
	for v := range done {
		if !known[v] {
			unknown = append(unknown, v)
		}
	}
	sort.Ints(unknown)
	if len(unknown) > 0 {
		// A newer version migrated this database; it runs on it, as
		// migrations only ever add, but its operator should know.
		db.newer = unknown
	}
	var applied []int
	for _, m := range migs {
		if done[m.Version] {
			continue
		}
		for i, stmt := range m.Statements {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return nil, fmt.Errorf("migration %04d_%s statement %d: %w", m.Version, m.Name, i+1, err)
			}
		}
		if _, err := conn.ExecContext(ctx,
			"INSERT INTO schema_migrations(version, name, applied_at) VALUES (?, ?, "+NowMS+")",
			m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("migrate: record %d: %w", m.Version, err)
		}
		if err := recordBreaking(ctx, conn, m); err != nil {
			return nil, err
		}
		applied = append(applied, m.Version)
	}
	// With nothing to apply the transaction would write nothing, and a
	// read-only file or mount would pass for a working database: make it
	// write.
	if _, err := conn.ExecContext(ctx, writeProbeSQL); err != nil {
		return nil, fmt.Errorf("migrate: database not writable: %w", err)
	}
	return applied, nil
}

// NewerMigrations returns the versions recorded in schema_migrations that
// this binary does not know, as the last Migrate found them: a newer
// version of appview migrated the database (nil otherwise).
func (db *DB) NewerMigrations() []int { return db.newer }

// Ready reports whether the database answers, every embedded migration is
// recorded, and it takes writes (for /readyz): an instance that cannot
// write can hold no lease and run no leased worker.
func (db *DB) Ready(ctx context.Context) error {
	migs, err := Migrations()
	if err != nil {
		return err
	}
	want := migs[len(migs)-1].Version
	if err := db.CheckFile(); err != nil {
		return err
	}
	if err := Bounded(ctx, func() error {
		var have sql.NullInt64
		if err := db.QueryRow("SELECT MAX(version) FROM schema_migrations").Scan(&have); err != nil {
			if db.migrated.Load() && SchemaLost(err) {
				return fmt.Errorf("%w: %v", ErrSchemaLost, err)
			}
			if AuthRefused(err) { // an expired token, one revoked
				return fmt.Errorf("the server refused database.auth_token: %w", err)
			}
			return fmt.Errorf("database not answering: %w", err)
		}
		if !have.Valid || have.Int64 < int64(want) {
			return fmt.Errorf("migrations pending: at %d, want %d", have.Int64, want)
		}
		return nil
	}); err != nil {
		return err
	}
	return db.CheckWritable(ctx)
}
