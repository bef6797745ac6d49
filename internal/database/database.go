// Package database opens the libSQL database every instance shares (an
// embedded file, or a libSQL server such as sqld or Turso) and applies the
// embedded, versioned migrations.
//
// go-libsql facts this package exists to hide: the context passed to a query
// is ignored; busy_timeout starts at 0 on every new connection; a statement
// that returns rows fails under Exec; a multi-statement Exec runs only the
// first statement; a remote connection is one Hrana stream that dies for
// good when sqld restarts or after 10 s idle; every statement is compiled
// anew on every call. Open therefore wraps the driver's connector so every
// pooled connection is configured before use, a failed remote connection
// is retired (remote.go), and Migrate splits each migration into
// statements.
//
// One fact it cannot hide: reading a TEXT value whose content looks like a
// date ("2024-06-01", "2024-06-01T12:00:00.000Z", "2024-06-01 12:00")
// makes go-libsql return a time.Time, which database/sql formats back as
// RFC 3339 when scanned into a string, so the value comes back changed.
// Writes are unaffected. Every query that reads a TEXT value into Go
// selects it through Text (text.go), which casts it to BLOB so the bytes
// arrive untouched.
package database

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/tursodatabase/go-libsql" // registers driver "libsql"
)

// Options says which database to open and how.
type Options struct {
	// URL is file:PATH, http://HOST:PORT, https://HOST or libsql://HOST
	// (every accepted form: package dburl).
	URL string
	// AuthToken is sent to a libSQL server.
	AuthToken string
	// BusyTimeout is PRAGMA busy_timeout for file databases (ms resolution).
	BusyTimeout time.Duration
	// MaxOpenConns bounds the pool; 0 means 8.
	MaxOpenConns int
	// MustExist makes Open refuse a file database that does not exist
	// (an error wrapping ErrNoDatabase) instead of creating it and its
	// directory: read-only commands must not mistake a mistyped path for
	// an empty database. It has no effect on a libSQL server.
	MustExist bool
	// ReadOnly opens a pool that only reads (the read-only commands):
	// connections do not switch the file to WAL (PRAGMA journal_mode is a
	// write, refused in a read-only directory; the file keeps the mode the
	// instance that created it set) and run with PRAGMA query_only, so a
	// write through them fails instead of landing.
	ReadOnly bool
}

// ErrNoDatabase is wrapped by Open's error when Options.MustExist is set
// and the file database does not exist.
var ErrNoDatabase = errors.New("no database")

// DB is an open database: the pool plus what kind of database it is.
type DB struct {
	*sql.DB
	// Remote is true for a libSQL server (http, https, libsql URLs).
	Remote bool
	// Path is the file path of an embedded database ("" when remote).
	Path      string
	connector *connector
	// file is the database file as opened, to notice it being deleted or
	// replaced under a running instance (nil when remote); wal watches
	// its write-ahead log the same way (nil when remote or read-only).
	file os.FileInfo
	wal  *walWatch
	// applied and newer: see AppliedMigrations and NewerMigrations.
	applied, newer []int
	// migrated is set once Migrate succeeded: a missing table is then
	// ErrSchemaLost, not a database never migrated.
	migrated atomic.Bool
	// writes is this process's bookkeeping of its writes here (writes.go).
	writes *writes
	// stopCheckpoints ends the background checkpoints of a writable file
	// database (checkpoint.go) and waits for them, at most closeWait; nil
	// otherwise.
	stopCheckpoints func()
}

// Open opens the database and checks that it answers. The URL takes the
// forms of package dburl (file:PATH, file:///PATH, file://localhost/PATH,
// http(s)://HOST, libsql://HOST); anything else is refused before the
// driver sees it. For a file URL the parent directory is created, unless
// Options.MustExist. Errors say which part failed.
func Open(ctx context.Context, o Options) (*DB, error) {
	loc, err := ParseURL(o.URL)
	if err != nil {
		return nil, fmt.Errorf("database url: %w", err)
	}
	if !loc.Remote() {
		// SQLite's own answer for a directory is "unable to open database
		// file" (code 14), which names neither the path nor the cause.
		if st, err := os.Stat(loc.Path); err == nil && st.IsDir() {
			return nil, fmt.Errorf("database file %s is a directory; name a file in it (file:%s)", loc.Path, filepath.Join(loc.Path, "appview.db"))
		} else if err == nil && !st.Mode().IsRegular() {
			// A device, FIFO or socket (file:/dev/null): SQLite would
			// refuse it only after creating PATH-journal or PATH-wal
			// beside it, in /dev for /dev/null.
			return nil, fmt.Errorf("database file %s is %s, not a regular file", loc.Path, FileKind(st.Mode()))
		} else if err == nil {
			if err := oneName(loc.Path, st); err != nil {
				return nil, err
			}
		}
	}
	var inner driver.Connector
	if loc.Remote() {
		dsn := *loc.Server
		if o.AuthToken != "" {
			q := dsn.Query()
			q.Set("authToken", o.AuthToken)
			dsn.RawQuery = q.Encode()
		}
		inner, err = libsqlConnector(dsn.String())
	} else if o.MustExist {
		if _, err := os.Stat(loc.Path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w at %s", ErrNoDatabase, loc.Path)
		} else if err != nil {
			return nil, fmt.Errorf("database file: %w", err)
		}
		inner, err = libsqlConnector(fileDSN(loc.Path))
	} else {
		if dir := filepath.Dir(loc.Path); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("create database directory: %w", err)
			}
		}
		inner, err = libsqlConnector(fileDSN(loc.Path))
	}
	remote, path := loc.Remote(), loc.Path
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	c := &connector{inner: inner, remote: remote, busyTimeout: o.BusyTimeout, readOnly: o.ReadOnly}
	pool := sql.OpenDB(c)
	max := o.MaxOpenConns
	if max <= 0 {
		max = 8
	}
	pool.SetMaxOpenConns(max)
	pool.SetMaxIdleConns(max)
	if remote {
		pool.SetConnMaxIdleTime(remoteMaxIdle)
	}
	db := &DB{DB: pool, Remote: remote, Path: path, connector: c, writes: newWrites()}
	if err := db.Ping(ctx); err != nil {
		_ = db.Close()
		return nil, err
	}
	if path != "" {
		if db.file, err = os.Stat(path); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("database file: %w", err)
		}
		if !o.ReadOnly {
			db.wal = newWALWatch(path)
			stop, done := make(chan struct{}), make(chan struct{})
			go db.checkpoints(stop, done)
			db.stopCheckpoints = sync.OnceFunc(func() {
				close(stop)
				select { // a checkpoint stuck in the driver: Close says so below
				case <-done:
				case <-time.After(closeWait):
				}
			})
		}
	}
	return db, nil
}

// ErrFileReplaced means the database file was deleted or replaced while
// this process had it open: the process keeps writing to the old file
// (its open handle) while every other instance uses the new one, so two
// instances could each hold the same lease in different databases.
var ErrFileReplaced = errors.New("database file was deleted or replaced while open")

// CheckFile reports ErrFileReplaced when Path no longer names the file
// that was opened, or its write-ahead log (Path-wal) was deleted or
// replaced while this process writes it (walfile.go): two stats, a few
// µs. Always nil for a remote database.
func (db *DB) CheckFile() error {
	if db.file == nil {
		return nil
	}
	now, err := os.Stat(db.Path)
	if err != nil || !os.SameFile(db.file, now) {
		return fmt.Errorf("%s: %w", db.Path, ErrFileReplaced)
	}
	if db.wal != nil {
		return db.wal.check()
	}
	return nil
}

// writeProbeSQL rewrites one column of one row with its own value: a real
// write that needs the write lock and lands in the log, and changes nothing.
const writeProbeSQL = `UPDATE schema_migrations SET applied_at = applied_at
WHERE version = (SELECT MAX(version) FROM schema_migrations)`

// CheckWritable makes a real, no-op write and reports why it failed (a
// read-only file or mount, a full disk, a replaced file). Bounded by ctx.
func (db *DB) CheckWritable(ctx context.Context) error {
	if err := db.CheckFile(); err != nil {
		return err
	}
	return Bounded(ctx, func() error {
		if _, err := db.ExecContext(ctx, writeProbeSQL); err != nil {
			return fmt.Errorf("database not writable: %w", err)
		}
		return nil
	})
}

// Ping runs SELECT 1 and waits at most until ctx is done. The driver ignores
// contexts, so a hung call is abandoned (its goroutine finishes on its own).
// The error says what the failure means (openFault) and wraps the
// driver's.
func (db *DB) Ping(ctx context.Context) error {
	return Bounded(ctx, func() error {
		var one int
		if err := db.QueryRow("SELECT 1").Scan(&one); err != nil {
			return &faultError{fault: openFault(err), err: err}
		}
		return nil
	})
}

// faultError is a failure of a new connection's first statements, told
// as what it means (openFault) and, when SQLite answered, in SQLite's own
// words ("not an SQLite database (SQLite: file is not a database)"),
// without the statement and the driver's codes around them, which an
// operator cannot act on. The driver's error stays wrapped, for errors.Is
// and the classifications (Unavailable, AuthRefused).
type faultError struct {
	fault string
	err   error
}

func (e *faultError) Error() string {
	if m := answerText(e.err); m != "" {
		return e.fault + " (SQLite: " + m + ")"
	}
	return e.fault + ": " + e.err.Error()
}

func (e *faultError) Unwrap() error { return e.err }

// openFault names what a failure of the first statements on a new
// connection (its PRAGMAs, then SELECT 1) says: no answer at all, or
// SQLite answering that the file is not a database, cannot be written or
// cannot be opened, or a server refusing the token or not being a libSQL
// server (an HTTP answer that retrying does not change). A "not answering" for a text file or a read-only
// mount sent operators looking for a stopped server.
func openFault(err error) string {
	text := driverText(err)
	if cantOpen(text) {
		return "database file cannot be opened (SQLITE_CANTOPEN: a directory that cannot be written, or a path that cannot be created)"
	}
	switch {
	case AuthRefused(err):
		return "the server refused database.auth_token"
	case strings.Contains(text, hrana) && !answered(text) && !TLSMismatch(err) && settled(err, text):
		return "not a libSQL server (a wrong host, port or path?)"
	case !answered(text) || Unavailable(err):
		return "database not answering"
	}
	switch s := strings.ToLower(text); {
	case strings.Contains(s, "file is not a database"):
		return "not an SQLite database"
	case strings.Contains(s, "readonly") || strings.Contains(s, "read-only"):
		return "database is read-only here"
	case strings.Contains(s, "unable to open database"):
		return "database file cannot be opened"
	}
	return "database refused its first statement"
}

// cantOpenMark is how go-libsql words a file database whose connection
// SQLite could not open, followed by the DSN and the result code: "Unable
// to open connection to local database file:PATH: 14".
const cantOpenMark = "Unable to open connection to local database "

// cantOpen reports whether driver text s is go-libsql's failure to open a
// local connection with SQLITE_CANTOPEN (14). It is not in the shape of
// an SQLite answer (answered), though SQLite did answer.
func cantOpen(s string) bool {
	i := strings.LastIndex(s, cantOpenMark)
	return i >= 0 && strings.HasSuffix(strings.TrimRight(s[i:], "`"), ": 14")
}

// closeWait bounds how long Close waits for the native connections still
// in use (a call Bounded abandoned, a connection being opened) to end
// before it closes the native database.
const closeWait = 2 * time.Second

// ErrCloseAbandoned is returned by Close when native connections were
// still busy in the driver after closeWait: the native database handle is
// then left open (a process exit reclaims it) rather than closed under
// them.
var ErrCloseAbandoned = errors.New("database: connections still busy in the driver; the native handle is left open")

// Close closes the pool and then the native database handle, once every
// native connection has closed: the pool closes an in-use connection only
// when its call returns, and a call Bounded gave up on (a cancelled start,
// a stopped instance) may still be running in the driver. libSQL panics
// (database.rs, unwrap on None) when its database is closed under a
// connection that is opening or running, which a stop signal during the
// start's database open did. When they have not ended within closeWait
// (a driver call stuck on a server that never answers), the handle is
// left open and ErrCloseAbandoned returned.
func (db *DB) Close() error {
	if db.stopCheckpoints != nil {
		db.stopCheckpoints()
	}
	db.connector.live.closing()
	err := db.DB.Close()
	if !db.connector.live.wait(closeWait) {
		return errors.Join(err, ErrCloseAbandoned)
	}
	if c, ok := db.connector.inner.(interface{ Close() error }); ok {
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// liveConns counts native connections that are open or being opened,
// and refuses new ones once the database is closing.
type liveConns struct {
	mu     sync.Mutex
	n      int
	none   chan struct{} // closed while n is 0
	closed bool
}

// errClosing is Connect's error once Close has begun: database/sql's
// connection opener can still ask for a connection after DB.Close, and
// libSQL panics when asked to connect to a closed database.
var errClosing = errors.New("database: closed")

// add counts a connection about to be opened; false once closing.
func (l *liveConns) add() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	if l.n == 0 {
		l.none = make(chan struct{})
	}
	l.n++
	return true
}

// closing refuses every later add.
func (l *liveConns) closing() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
}

func (l *liveConns) done() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n--
	if l.n == 0 {
		close(l.none)
	}
}

// wait reports whether the count reached 0 within d.
func (l *liveConns) wait(d time.Duration) bool {
	l.mu.Lock()
	if l.n == 0 {
		l.mu.Unlock()
		return true
	}
	none := l.none
	l.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-none:
		return true
	case <-t.C:
		return false
	}
}

// Bounded runs fn and returns its error, or ctx.Err() if ctx ends first. The
// driver ignores contexts, so this is how a caller puts a bound on a call;
// fn keeps running in its goroutine until the driver returns.
func Bounded(ctx context.Context, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// fileDSN is the go-libsql DSN of a file path. go-libsql decodes percent
// escapes in a file: DSN, as SQLite URIs do, so the path (decoded by
// Parse) is escaped again: "%", "#" or "?" in a directory name reach
// the file system as they are.
func fileDSN(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath()
}

// libsqlConnector asks the registered go-libsql driver for a connector, so
// one native database handle backs the whole pool.
func libsqlConnector(dsn string) (driver.Connector, error) {
	probe, err := sql.Open("libsql", "file::memory:")
	if err != nil {
		return nil, err
	}
	drv := probe.Driver()
	_ = probe.Close()
	dc, ok := drv.(driver.DriverContext)
	if !ok {
		return nil, errors.New("go-libsql driver has no OpenConnector")
	}
	return dc.OpenConnector(dsn)
}

// connector configures each new connection before database/sql uses it.
type connector struct {
	inner       driver.Connector
	remote      bool
	busyTimeout time.Duration
	readOnly    bool
	// live counts the native connections open or being opened (DB.Close).
	live liveConns
}

// Connect opens and configures a native connection, counted in c.live
// from before the driver is asked until the connection is closed; once
// DB.Close has begun it returns errClosing without asking the driver.
func (c *connector) Connect(ctx context.Context) (driver.Conn, error) {
	if !c.live.add() {
		return nil, errClosing
	}
	conn, err := c.connect(ctx)
	if err != nil {
		c.live.done()
		return nil, err
	}
	if rc, ok := conn.(*remoteConn); ok {
		rc.closed = c.live.done
	} else {
		c.live.done() // not a libSQL connection (tests): nothing native to wait for
	}
	return conn, nil
}

func (c *connector) connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if c.remote { // sqld refuses PRAGMA busy_timeout; the server handles locking
		return wrapRemote(conn), nil
	}
	pragmas := []string{
		fmt.Sprintf("PRAGMA busy_timeout = %d", c.busyTimeout.Milliseconds()),
		"PRAGMA journal_mode = WAL",
		"PRAGMA synchronous = NORMAL",
		"PRAGMA foreign_keys = ON",
	}
	if c.readOnly {
		pragmas[1] = "PRAGMA query_only = ON"
	} else {
		pragmas = append(pragmas, commitCheckpoint)
	}
	for _, p := range pragmas {
		if _, err := firstRow(ctx, conn, p); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	return wrapFile(conn), nil
}

func (c *connector) Driver() driver.Driver { return c.inner.Driver() }

// firstRow runs query on a native connection and returns its first row
// (nil: none), reading the rest: PRAGMAs return rows, so Query, not Exec.
// The error names the query.
func firstRow(ctx context.Context, conn driver.Conn, query string) ([]driver.Value, error) {
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return nil, errors.New("libsql connection cannot run queries")
	}
	rows, err := q.QueryContext(ctx, query, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", query, err)
	}
	defer rows.Close()
	var first []driver.Value
	dest := make([]driver.Value, len(rows.Columns()))
	for rows.Next(dest) == nil {
		if first == nil {
			first = append([]driver.Value{}, dest...)
		}
	}
	return first, nil
}

// NowMS is the SQL expression for the database's clock in Unix milliseconds.
// Every expiry comparison uses it, so all instances share one clock.
const NowMS = "CAST(unixepoch('subsec') * 1000 AS INTEGER)"

// NowUS is the database's clock in Unix microseconds (its resolution is
// SQLite's: a millisecond).
const NowUS = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"

// Column runs query on q and returns the first column of every row, as
// strings, in the order the rows came. Errors are the query's or a scan's.
func Column(ctx context.Context, q Querier, query string, args ...any) ([]string, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// Querier is what QueryReturning and Column need: a *sql.DB, *sql.Tx or
// *sql.Conn.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// QueryReturning runs a write with a RETURNING clause and scans its first
// row into dest, reporting whether there was one. It reads the result to
// the end before returning: an autocommit statement commits only when it
// has run to completion, and a failed commit (disk full, read-only file)
// surfaces there. sql.Row.Scan stops after the first row, and go-libsql
// ignores the error of closing a statement early, so with it a write that
// never committed would look as if it had.
func QueryReturning(ctx context.Context, q Querier, query string, args []any, dest ...any) (bool, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	found := false
	for rows.Next() {
		if !found {
			if err := rows.Scan(dest...); err != nil {
				return false, err
			}
			found = true
		}
	}
	if err := rows.Err(); err != nil {
		return false, err
	}
	return found, rows.Close()
}

// Wrap returns a DB over a pool opened some other way (a test that records
// the statements it runs through its own connector): no file checks, its
// own write bookkeeping.
func Wrap(pool *sql.DB) *DB { return &DB{DB: pool, writes: newWrites()} }
