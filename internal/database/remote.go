package database

import (
	"context"
	"database/sql/driver"
	"strings"
	"time"
)

// remoteMaxIdle is how long a pooled connection to a libSQL server may sit
// idle before the pool closes it. Each go-libsql remote connection is one
// Hrana stream, sqld expires a stream after 10 s without a request
// (STREAM_EXPIRED), and go-libsql never reopens it: an older idle
// connection would fail every statement from then on. database/sql closes
// an idle connection within about a second of this limit.
const remoteMaxIdle = 4 * time.Second

// libsqlConn is what a go-libsql connection implements.
type libsqlConn interface {
	driver.Conn
	driver.ConnPrepareContext
	driver.ConnBeginTx
	driver.ExecerContext
	driver.QueryerContext
}

// remoteConn is a connection that the pool discards after a failed call
// that retire says poisons it (driver.Validator, driver.SessionResetter);
// go-libsql never reports driver.ErrBadConn itself.
//
// For a libSQL server every error retires the connection (retireRemote): a
// Hrana stream that failed once, because the server restarted or the
// stream expired, fails forever ("Received an invalid baton"). An SQL error
// (a constraint, a syntax error) also retires it; a new stream costs one
// request, which is cheap next to a pool that never heals.
//
// For a file, only errors that stick to the SQLite connection retire it
// (retireFile): a connection that opened the file read-only (or lost it to
// an I/O error) keeps failing after the file is writable again, while a new
// one opens it read-write.
//
// database/sql never uses one connection from two goroutines at once, so
// broken needs no lock.
type remoteConn struct {
	inner  libsqlConn
	retire func(error) bool
	remote bool // a libSQL server's: writes with arguments are inlined
	broken bool
	// closed, when set, is called once the native connection is closed
	// (connector.live: DB.Close waits for it before closing the native
	// database).
	closed func()
}

func wrapRemote(c driver.Conn) driver.Conn { return guard(c, retireRemote, true) }

func wrapFile(c driver.Conn) driver.Conn { return guard(c, retireFile, false) }

func guard(c driver.Conn, retire func(error) bool, remote bool) driver.Conn {
	inner, ok := c.(libsqlConn)
	if !ok {
		return c
	}
	return &remoteConn{inner: inner, retire: retire, remote: remote}
}

func retireRemote(err error) bool { return true }

// stickyFileErrors are SQLite messages after which a file connection is
// not trusted again.
var stickyFileErrors = []string{
	"readonly database",
	"disk I/O error",
	"unable to open database file",
	"database disk image is malformed",
	"file is not a database",
}

func retireFile(err error) bool {
	msg := err.Error()
	for _, s := range stickyFileErrors {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

func (c *remoteConn) note(err error) error {
	if err != nil && c.retire(err) {
		c.broken = true
	}
	return err
}

func (c *remoteConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *remoteConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	s, err := c.inner.PrepareContext(ctx, query)
	if err != nil {
		return nil, c.note(err)
	}
	if ls, ok := s.(libsqlStmt); ok {
		return &remoteStmt{inner: ls, c: c}, nil
	}
	return s, nil
}

func (c *remoteConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *remoteConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.inner.BeginTx(ctx, opts)
	if err != nil {
		return nil, c.note(err)
	}
	return &remoteTx{inner: tx, c: c}, nil
}

func (c *remoteConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := textNUL(args); err != nil {
		return nil, err
	}
	if c.remote {
		if q, ok := inline(query, args); ok {
			query, args = q, nil // one request, not a describe and then the write
		}
	}
	r, err := c.inner.ExecContext(ctx, query, args)
	return r, c.note(err)
}

func (c *remoteConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := textNUL(args); err != nil {
		return nil, err
	}
	r, err := c.inner.QueryContext(ctx, query, args)
	return r, c.note(err)
}

func (c *remoteConn) Close() error {
	err := c.inner.Close()
	if c.closed != nil {
		c.closed()
		c.closed = nil
	}
	return err
}

// IsValid is asked before the connection goes back to the pool.
func (c *remoteConn) IsValid() bool { return !c.broken }

// ResetSession is asked before a pooled connection is reused.
func (c *remoteConn) ResetSession(context.Context) error {
	if c.broken {
		return driver.ErrBadConn
	}
	return nil
}

type remoteTx struct {
	inner driver.Tx
	c     *remoteConn
}

func (t *remoteTx) Commit() error   { return t.c.note(t.inner.Commit()) }
func (t *remoteTx) Rollback() error { return t.c.note(t.inner.Rollback()) }

// libsqlStmt is what a go-libsql prepared statement implements.
type libsqlStmt interface {
	driver.Stmt
	driver.StmtExecContext
	driver.StmtQueryContext
}

// remoteStmt notes failures of prepared statements (go-libsql runs them on
// its connection without going through remoteConn).
type remoteStmt struct {
	inner libsqlStmt
	c     *remoteConn
}

func (s *remoteStmt) Close() error  { return s.inner.Close() }
func (s *remoteStmt) NumInput() int { return s.inner.NumInput() }

// Exec and Query complete driver.Stmt; database/sql calls the Context forms.
func (s *remoteStmt) Exec(args []driver.Value) (driver.Result, error) {
	if err := textNULValues(args); err != nil {
		return nil, err
	}
	r, err := s.inner.Exec(args)
	return r, s.c.note(err)
}

func (s *remoteStmt) Query(args []driver.Value) (driver.Rows, error) {
	if err := textNULValues(args); err != nil {
		return nil, err
	}
	r, err := s.inner.Query(args)
	return r, s.c.note(err)
}

func (s *remoteStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if err := textNUL(args); err != nil {
		return nil, err
	}
	r, err := s.inner.ExecContext(ctx, args)
	return r, s.c.note(err)
}

func (s *remoteStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := textNUL(args); err != nil {
		return nil, err
	}
	r, err := s.inner.QueryContext(ctx, args)
	return r, s.c.note(err)
}
