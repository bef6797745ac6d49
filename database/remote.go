package database

import (
	"context"
	"database/sql/driver"
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

// remoteConn is a connection to a libSQL server that the pool discards
// after any failed call (driver.Validator, driver.SessionResetter). A
// Hrana stream that failed once, because the server restarted or the
// stream expired, fails forever ("Received an invalid baton"), and
// go-libsql does not report it as driver.ErrBadConn. An SQL error (a
// constraint, a syntax error) also retires the connection; a new stream
// costs one request, which is cheap next to a pool that never heals.
//
// database/sql never uses one connection from two goroutines at once, so
// broken needs no lock.
type remoteConn struct {
	inner  libsqlConn
	broken bool
}

func wrapRemote(c driver.Conn) driver.Conn {
	inner, ok := c.(libsqlConn)
	if !ok {
		return c
	}
	return &remoteConn{inner: inner}
}

func (c *remoteConn) note(err error) error {
	if err != nil {
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
	r, err := c.inner.ExecContext(ctx, query, args)
	return r, c.note(err)
}

func (c *remoteConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.inner.QueryContext(ctx, query, args)
	return r, c.note(err)
}

func (c *remoteConn) Close() error { return c.inner.Close() }

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
	r, err := s.inner.Exec(args)
	return r, s.c.note(err)
}

func (s *remoteStmt) Query(args []driver.Value) (driver.Rows, error) {
	r, err := s.inner.Query(args)
	return r, s.c.note(err)
}

func (s *remoteStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	r, err := s.inner.ExecContext(ctx, args)
	return r, s.c.note(err)
}

func (s *remoteStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	r, err := s.inner.QueryContext(ctx, args)
	return r, s.c.note(err)
}
