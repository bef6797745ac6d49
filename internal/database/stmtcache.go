package database

/*
#include <stdlib.h>

// The libSQL C API that go-libsql links (its static libsql_experimental).
// Declared weak: this package links nothing itself, and if a go-libsql
// version ever stopped carrying one of them the pointer is NULL and the
// cache stays off (statementCacheAvailable) instead of the build failing.
#pragma weak libsql_prepare
#pragma weak libsql_reset_stmt
#pragma weak libsql_free_stmt
#pragma weak libsql_execute_stmt
#pragma weak libsql_bind_int
#pragma weak libsql_bind_float
#pragma weak libsql_bind_null
#pragma weak libsql_bind_string
#pragma weak libsql_bind_blob
#pragma weak libsql_changes
#pragma weak libsql_last_insert_rowid
#pragma weak libsql_free_string
#pragma weak libsql_query_stmt
#pragma weak libsql_free_rows
#pragma weak libsql_column_count
#pragma weak libsql_column_name
#pragma weak libsql_column_type
#pragma weak libsql_next_row
#pragma weak libsql_free_row
#pragma weak libsql_get_string
#pragma weak libsql_get_int
#pragma weak libsql_get_float
#pragma weak libsql_get_blob
#pragma weak libsql_free_blob

#include <stdint.h>

int libsql_prepare(const void *conn, const char *sql, const void **out_stmt, const char **out_err_msg);
int libsql_reset_stmt(const void *stmt, const char **out_err_msg);
void libsql_free_stmt(const void *stmt);
int libsql_execute_stmt(const void *stmt, const char **out_err_msg);
int libsql_bind_int(const void *stmt, int idx, long long value, const char **out_err_msg);
int libsql_bind_float(const void *stmt, int idx, double value, const char **out_err_msg);
int libsql_bind_null(const void *stmt, int idx, const char **out_err_msg);
int libsql_bind_string(const void *stmt, int idx, const char *value, const char **out_err_msg);
int libsql_bind_blob(const void *stmt, int idx, const unsigned char *value, int value_len, const char **out_err_msg);
uint64_t libsql_changes(const void *conn);
int64_t libsql_last_insert_rowid(const void *conn);
void libsql_free_string(const char *ptr);
int libsql_query_stmt(const void *stmt, const void **out_rows, const char **out_err_msg);
void libsql_free_rows(const void *rows);
int libsql_column_count(const void *rows);
int libsql_column_name(const void *rows, int col, const char **out_name, const char **out_err_msg);
int libsql_column_type(const void *rows, const void *row, int col, int *out_type, const char **out_err_msg);
int libsql_next_row(const void *rows, const void **out_row, const char **out_err_msg);
void libsql_free_row(const void *row);
int libsql_get_string(const void *row, int col, const char **out_value, const char **out_err_msg);
int libsql_get_int(const void *row, int col, long long *out_value, const char **out_err_msg);
int libsql_get_float(const void *row, int col, double *out_value, const char **out_err_msg);
typedef struct { const char *ptr; int len; } libsql_blob;
int libsql_get_blob(const void *row, int col, libsql_blob *out_blob, const char **out_err_msg);
void libsql_free_blob(libsql_blob b);

// bind_arg is one argument staged for bind_all: kind (BIND_*), its
// position, and its value: i, f, or n bytes at off in the staging bytes
// (text is NUL-terminated there, as libsql_bind_string reads it).
typedef struct { int kind; int idx; long long i; double f; size_t off; int n; } bind_arg;
enum { BIND_NULL = 0, BIND_INT = 1, BIND_FLOAT = 2, BIND_TEXT = 3, BIND_BLOB = 4 };

// bind_all binds count staged arguments in one call from Go (each bind
// was a cgo crossing, a string's three). On a failure it returns the
// code, with *failed the argument's index.
static int bind_all(const void *stmt, const bind_arg *args, int count, const char *bytes, int *failed, const char **err) {
	for (int k = 0; k < count; k++) {
		const bind_arg *a = &args[k];
		int rc;
		switch (a->kind) {
		case BIND_INT: rc = libsql_bind_int(stmt, a->idx, a->i, err); break;
		case BIND_FLOAT: rc = libsql_bind_float(stmt, a->idx, a->f, err); break;
		case BIND_TEXT: rc = libsql_bind_string(stmt, a->idx, bytes + a->off, err); break;
		case BIND_BLOB: rc = libsql_bind_blob(stmt, a->idx, (const unsigned char *)(bytes + a->off), a->n, err); break;
		default: rc = libsql_bind_null(stmt, a->idx, err); break;
		}
		if (rc != 0) {
			*failed = k;
			return rc;
		}
	}
	*failed = -1;
	return 0;
}

// bind_exec is bind_all, then the statement's execution and its rowid and
// change count: one crossing for a whole Exec. *failed is -1 when the
// binds succeeded (a failure is then the execution's).
static int bind_exec(const void *conn, const void *stmt, const bind_arg *args, int count, const char *bytes,
		int *failed, int64_t *rowid, uint64_t *changes, const char **err) {
	int rc = bind_all(stmt, args, count, bytes, failed, err);
	if (rc != 0) {
		return rc;
	}
	rc = libsql_execute_stmt(stmt, err);
	if (rc != 0) {
		return rc;
	}
	*rowid = libsql_last_insert_rowid(conn);
	*changes = libsql_changes(conn);
	return 0;
}

static int libsql_stmt_api_present(void) {
	return libsql_prepare && libsql_reset_stmt && libsql_free_stmt &&
		libsql_execute_stmt && libsql_bind_int && libsql_bind_float &&
		libsql_bind_null && libsql_bind_string && libsql_bind_blob &&
		libsql_changes && libsql_last_insert_rowid && libsql_free_string &&
		libsql_query_stmt && libsql_free_rows && libsql_column_count &&
		libsql_column_name && libsql_column_type && libsql_next_row &&
		libsql_free_row && libsql_get_string && libsql_get_int &&
		libsql_get_float && libsql_get_blob && libsql_free_blob;
}
*/
import "C"

import (
	"container/list"
	"database/sql/driver"
	"fmt"
	"io"
	"reflect"
	"time"
	"unsafe"
)

// Why this file exists: go-libsql compiles every statement on every call.
// Its Stmt keeps only the SQL text, and each Exec with arguments runs
// libsql_prepare (a full SQLite compile), binds, steps and frees the
// statement. On the consumer's write path the compile cost more than the
// execution (docs/performance.md: libsql_prepare was the largest single
// cost of an ingest profile). SQLite's own answer is to keep compiled
// statements and reset them between runs; libSQL's C API offers that
// (libsql_reset_stmt), the Go driver does not use it.
//
// stmtCache keeps the compiled statements (Exec and Query, with or without
// arguments, BEGIN/COMMIT included) of one file connection and runs them
// through the C API go-libsql already links. It changes nothing a caller
// can see: the same arguments bind the same way (by position, as go-libsql
// does: sql.Named binds by position), errors carry go-libsql's text
// ("failed to execute query ...\nerror code = N: ..."), results are
// libsql_changes and libsql_last_insert_rowid as go-libsql reads them, and
// rows read as go-libsql's rows read (keptRows).
//
// Only file connections use it. A libSQL server connection prepares with a
// Hrana "describe" round trip and binds the statement to the stream's
// transaction state at prepare time, so a kept statement would be wrong
// there; those connections go through go-libsql unchanged.

// stmtCacheSize is how many compiled statements one connection keeps
// (least recently used dropped first). The processor, leases, cursor and
// outbox use a few dozen distinct statements, plus the few shapes of each
// bucketed list (Bucket); a pool holds at most Options.MaxOpenConns
// connections, each with its own cache.
const stmtCacheSize = 128

// stmtSeenSize bounds the texts a connection remembers having compiled
// once: a statement is kept the second time it is compiled, so texts that
// never come back (a multi-row VALUES list of an unusual length) do not
// push out the ones that do.
const stmtSeenSize = 512

// stmtCacheMaxArgs: statements with more arguments than this (multi-row
// VALUES lists sized to their batch) are compiled for the call and freed,
// not kept: their text varies with the batch, and one compile is shared by
// many rows anyway.
const stmtCacheMaxArgs = 64

// statementCacheAvailable reports whether the linked libSQL library
// carries every C function the cache calls.
func statementCacheAvailable() bool { return C.libsql_stmt_api_present() != 0 }

// stmtCache is one connection's kept statements. database/sql never uses a
// connection from two goroutines at once, so it needs no lock.
type stmtCache struct {
	conn    unsafe.Pointer // libsql_connection_t, owned by the go-libsql conn
	byQuery map[string]*list.Element
	lru     *list.List          // of *keptStmt, most recently used first
	seen    map[string]struct{} // compiled once, not kept (stmtSeenSize)
	staged  staging             // the arguments of the statement being run
}

// keptStmt is one compiled statement and the highest parameter position
// any call has bound on it: a later call that binds fewer gets NULL in the
// rest, as a freshly compiled statement would have (SQLite keeps bindings
// across a reset).
type keptStmt struct {
	query  string
	native unsafe.Pointer // libsql_stmt_t
	bound  int
	kept   bool // in the cache (false: compiled for one call, freed after)
	busy   bool // running, or its rows are open
}

// newStmtCache returns a cache for the go-libsql connection c, or nil when
// c is not one whose native handle this package knows how to read, or the
// C API is missing: the connection then runs every statement through
// go-libsql as before.
func newStmtCache(c driver.Conn) *stmtCache {
	if !statementCacheAvailable() {
		return nil
	}
	p := nativeConn(c)
	if p == nil {
		return nil
	}
	return &stmtCache{conn: p, byQuery: map[string]*list.Element{}, lru: list.New(), seen: map[string]struct{}{}}
}

// nativeConn reads the libsql_connection_t out of a go-libsql connection:
// the driver's conn is `struct { nativePtr C.libsql_connection_t }` and has
// no accessor. The layout is checked field by field (package, type name,
// one field of pointer kind named nativePtr), so a driver version that
// changes it turns the cache off (nil) instead of reading garbage;
// TestFileConnectionsKeepCompiledStatements fails then, so the upgrade is
// noticed.
func nativeConn(c driver.Conn) unsafe.Pointer {
	v := reflect.ValueOf(c)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return nil
	}
	s := v.Elem()
	t := s.Type()
	if t.PkgPath() != "github.com/tursodatabase/go-libsql" || t.Name() != "conn" ||
		t.NumField() != 1 || t.Field(0).Name != "nativePtr" || t.Field(0).Type.Kind() != reflect.Pointer {
		return nil
	}
	return *(*unsafe.Pointer)(unsafe.Pointer(s.Field(0).UnsafeAddr()))
}

// exec runs query with args on the connection, compiling it only the
// first time (per connection, while it stays among the kept ones).
func (c *stmtCache) exec(query string, args []driver.NamedValue) (driver.Result, error) {
	k, err := c.get(query, len(args))
	if err != nil {
		return nil, err
	}
	// Reset after every run, success or not: a statement left mid-step
	// would hold its read of the database and keep COMMIT from finishing.
	defer c.done(k)
	defer c.trim()
	n, high, err := c.stage(k, args)
	if err != nil {
		return nil, err
	}
	var errMsg *C.char
	var failed C.int
	var rowid C.int64_t
	var changes C.uint64_t
	if rc := C.bind_exec(c.conn, k.native, c.staged.args, C.int(n), c.staged.bytes, &failed, &rowid, &changes, &errMsg); rc != 0 {
		if failed >= 0 {
			return nil, c.bindError(args, high, int(failed), rc, errMsg)
		}
		k.bound = max(k.bound, high)
		return nil, libsqlError("failed to execute query "+query, rc, errMsg)
	}
	k.bound = max(k.bound, high)
	return result{id: int64(rowid), changes: int64(changes)}, nil
}

// query runs query with args and returns its rows; the statement is
// reset (and can run again) when the rows are closed.
func (c *stmtCache) query(query string, args []driver.NamedValue) (driver.Rows, error) {
	k, err := c.get(query, len(args))
	if err != nil {
		return nil, err
	}
	if err := c.bind(k, args); err != nil {
		c.done(k)
		return nil, err
	}
	var native unsafe.Pointer
	var errMsg *C.char
	if rc := C.libsql_query_stmt(k.native, &native, &errMsg); rc != 0 {
		c.done(k)
		return nil, libsqlError("failed to execute query "+query, rc, errMsg)
	}
	r := &keptRows{native: native, done: func() { c.done(k) }}
	if err := r.readColumns(); err != nil {
		_ = r.Close()
		return nil, err
	}
	return r, nil
}

// get returns a statement for query, marked busy until done: the kept one
// when it is free; else a new one, kept if query was compiled before
// (seen) and has at most stmtCacheMaxArgs arguments, otherwise compiled
// for this call only (also when the kept one is busy: its rows are open).
func (c *stmtCache) get(query string, nargs int) (*keptStmt, error) {
	if el, ok := c.byQuery[query]; ok {
		if k := el.Value.(*keptStmt); !k.busy {
			c.lru.MoveToFront(el)
			k.busy = true
			return k, nil
		}
		nargs = stmtCacheMaxArgs + 1 // the kept one is busy: one for this call
	}
	cq := C.CString(query)
	defer C.free(unsafe.Pointer(cq))
	var native unsafe.Pointer
	var errMsg *C.char
	if rc := C.libsql_prepare(c.conn, cq, &native, &errMsg); rc != 0 {
		return nil, libsqlError("failed to prepare query "+query, rc, errMsg)
	}
	k := &keptStmt{query: query, native: native, busy: true}
	if nargs > stmtCacheMaxArgs {
		return k, nil
	}
	if _, again := c.seen[query]; !again {
		if len(c.seen) >= stmtSeenSize {
			clear(c.seen)
		}
		c.seen[query] = struct{}{}
		return k, nil
	}
	delete(c.seen, query)
	k.kept = true
	c.byQuery[query] = c.lru.PushFront(k)
	for c.lru.Len() > stmtCacheSize {
		old := c.lru.Back().Value.(*keptStmt)
		if old.busy {
			break // only when every kept statement has rows open
		}
		c.lru.Remove(c.lru.Back())
		delete(c.byQuery, old.query)
		C.libsql_free_stmt(old.native)
	}
	return k, nil
}

// done ends a use of k: it is reset for its next run, or freed if it was
// compiled for one call only.
func (c *stmtCache) done(k *keptStmt) {
	k.busy = false
	if !k.kept {
		C.libsql_free_stmt(k.native)
		return
	}
	c.reset(k)
}

func (c *stmtCache) reset(k *keptStmt) {
	var errMsg *C.char
	if rc := C.libsql_reset_stmt(k.native, &errMsg); rc != 0 && errMsg != nil {
		C.libsql_free_string(errMsg) // only a NULL statement fails here
	}
}

// close frees every kept statement; the connection itself is go-libsql's
// to close, after this. Rows still open keep their statement alive (the
// library counts references), so freeing here is safe.
func (c *stmtCache) close() {
	for el := c.lru.Front(); el != nil; el = el.Next() {
		k := el.Value.(*keptStmt)
		k.kept = false
		if !k.busy {
			C.libsql_free_stmt(k.native)
		} // a busy one is freed by its done
	}
	c.lru.Init()
	clear(c.byQuery)
	C.free(unsafe.Pointer(c.staged.args))
	C.free(unsafe.Pointer(c.staged.bytes))
	c.staged = staging{}
}

// staging is a connection's C memory for the arguments of its next
// statement (a connection runs one statement at a time): bind_arg
// entries and the bytes of text and blob values, grown as needed, freed
// with the cache. C memory, so that the one call binding them all passes
// no Go pointers.
type staging struct {
	args   *C.bind_arg
	nargs  int
	bytes  *C.char
	nbytes int
}

// stage writes args (by position: NamedValue.Ordinal, names ignored, as
// go-libsql does) into the connection's staging, converting values the
// way go-libsql does: int64, float64, string, []byte, nil, bool as 0/1,
// time.Time as RFC 3339 text; positions k's previous run bound and this
// one does not get NULL. It returns how many entries it staged and the
// highest position args bind, or an error for a value of another type.
// Text is NUL-terminated for libsql_bind_string, which (like go-libsql's
// C.CString) ends it at a NUL byte.
func (c *stmtCache) stage(k *keptStmt, args []driver.NamedValue) (n, high int, err error) {
	size := 0
	for _, arg := range args {
		high = max(high, arg.Ordinal)
		switch v := arg.Value.(type) {
		case int64, float64, nil, bool:
		case string:
			size += len(v) + 1
		case []byte:
			size += len(v)
		case time.Time:
			size += len(v.Format(time.RFC3339Nano)) + 1
		default:
			return 0, 0, fmt.Errorf("unsupported type %T", arg.Value)
		}
	}
	n = len(args) + max(k.bound-high, 0)
	c.grow(n, size+1)
	entries := unsafe.Slice(c.staged.args, c.staged.nargs)
	buf := unsafe.Slice((*byte)(unsafe.Pointer(c.staged.bytes)), c.staged.nbytes)
	off := 0
	text := func(e *C.bind_arg, b []byte) {
		e.kind, e.off = C.BIND_TEXT, C.size_t(off)
		off += copy(buf[off:], b)
		buf[off] = 0
		off++
	}
	for j, arg := range args {
		e := &entries[j]
		*e = C.bind_arg{idx: C.int(arg.Ordinal)}
		switch v := arg.Value.(type) {
		case int64:
			e.kind, e.i = C.BIND_INT, C.longlong(v)
		case float64:
			e.kind, e.f = C.BIND_FLOAT, C.double(v)
		case bool:
			e.kind = C.BIND_INT
			if v {
				e.i = 1
			}
		case string:
			text(e, unsafe.Slice(unsafe.StringData(v), len(v)))
		case time.Time:
			text(e, []byte(v.Format(time.RFC3339Nano)))
		case []byte:
			e.kind, e.off, e.n = C.BIND_BLOB, C.size_t(off), C.int(len(v))
			off += copy(buf[off:], v)
		case nil:
			e.kind = C.BIND_NULL
		}
	}
	for j := len(args); j < n; j++ {
		entries[j] = C.bind_arg{kind: C.BIND_NULL, idx: C.int(high + 1 + j - len(args))}
	}
	return n, high, nil
}

// stagingKeep is the most staging memory a connection keeps between
// statements: a larger one (a statement with a long JSON parameter) is
// freed once its values are bound (libsql copies them), so an idle
// connection holds at most this much.
const stagingKeep = 64 << 10

// trim frees staging memory above stagingKeep.
func (c *stmtCache) trim() {
	if c.staged.nbytes > stagingKeep {
		C.free(unsafe.Pointer(c.staged.bytes))
		c.staged.bytes, c.staged.nbytes = nil, 0
	}
	if c.staged.nargs*int(unsafe.Sizeof(C.bind_arg{})) > stagingKeep {
		C.free(unsafe.Pointer(c.staged.args))
		c.staged.args, c.staged.nargs = nil, 0
	}
}

// grow makes the staging hold at least n entries and size bytes.
func (c *stmtCache) grow(n, size int) {
	if n > c.staged.nargs {
		n = max(n, 2*c.staged.nargs, 16)
		c.staged.args = (*C.bind_arg)(C.realloc(unsafe.Pointer(c.staged.args), C.size_t(n)*C.size_t(unsafe.Sizeof(C.bind_arg{}))))
		if c.staged.args == nil {
			panic("database: out of C memory for statement arguments")
		}
		c.staged.nargs = n
	}
	if size > c.staged.nbytes {
		size = max(size, 2*c.staged.nbytes, 256)
		c.staged.bytes = (*C.char)(C.realloc(unsafe.Pointer(c.staged.bytes), C.size_t(size)))
		if c.staged.bytes == nil {
			panic("database: out of C memory for statement arguments")
		}
		c.staged.nbytes = size
	}
}

// bind binds args to k (stage, then one call).
func (c *stmtCache) bind(k *keptStmt, args []driver.NamedValue) error {
	defer c.trim()
	n, high, err := c.stage(k, args)
	if err != nil {
		return err
	}
	var errMsg *C.char
	var failed C.int
	if rc := C.bind_all(k.native, c.staged.args, C.int(n), c.staged.bytes, &failed, &errMsg); rc != 0 {
		return c.bindError(args, high, int(failed), rc, errMsg)
	}
	k.bound = max(k.bound, high)
	return nil
}

// bindError words the failure of staged entry j, in go-libsql's words.
func (c *stmtCache) bindError(args []driver.NamedValue, high, j int, rc C.int, errMsg *C.char) error {
	idx, value := high+1+j-len(args), driver.Value(nil)
	if j < len(args) {
		idx, value = args[j].Ordinal, args[j].Value
	}
	return libsqlError(fmt.Sprintf("failed to bind argument no. %d with value %v and type %T", idx, value, value), rc, errMsg)
}

// libsqlError words a C API failure the way go-libsql does, so the
// classification in errors.go reads kept and unkept statements alike.
func libsqlError(message string, code C.int, errMsg *C.char) error {
	if errMsg == nil {
		return fmt.Errorf("%s\nerror code = %d", message, int(code))
	}
	msg := C.GoString(errMsg)
	C.libsql_free_string(errMsg)
	return fmt.Errorf("%s\nerror code = %d: %v", message, int(code), msg)
}

// result is a driver.Result read from the connection after the statement,
// as go-libsql reads it.
type result struct{ id, changes int64 }

func (r result) LastInsertId() (int64, error) { return r.id, nil }
func (r result) RowsAffected() (int64, error) { return r.changes, nil }

// keptRows reads the rows of a query the way go-libsql's rows do (same
// column types, same text-to-time conversion), then hands its statement
// back to the cache when closed.
type keptRows struct {
	native  unsafe.Pointer // libsql_rows_t; nil once closed
	columns []string
	done    func()
}

func (r *keptRows) readColumns() error {
	n := int(C.libsql_column_count(r.native))
	r.columns = make([]string, n)
	for i := range n {
		var name, errMsg *C.char
		if rc := C.libsql_column_name(r.native, C.int(i), &name, &errMsg); rc != 0 {
			return libsqlError(fmt.Sprint("failed to get column name for index ", i), rc, errMsg)
		}
		r.columns[i] = C.GoString(name)
		C.libsql_free_string(name)
	}
	return nil
}

func (r *keptRows) Columns() []string { return r.columns }

func (r *keptRows) Close() error {
	if r.native != nil {
		C.libsql_free_rows(r.native)
		r.native = nil
		r.done()
	}
	return nil
}

func (r *keptRows) Next(dest []driver.Value) error {
	if r.native == nil {
		return io.EOF
	}
	var row unsafe.Pointer
	var errMsg *C.char
	if rc := C.libsql_next_row(r.native, &row, &errMsg); rc != 0 {
		return libsqlError("failed to get next row", rc, errMsg)
	}
	if row == nil {
		_ = r.Close()
		return io.EOF
	}
	defer C.libsql_free_row(row)
	for i := range min(len(dest), len(r.columns)) {
		v, err := columnValue(r.native, row, i)
		if err != nil {
			return err
		}
		dest[i] = v
	}
	return nil
}

// go-libsql's column type codes (libsql.h).
const (
	typeInt   = 1
	typeFloat = 2
	typeText  = 3
	typeBlob  = 4
	typeNull  = 5
)

// timeFormats are the layouts go-libsql tries, in order, on every TEXT
// value; the first that parses turns the value into a time.Time. Kept so
// a statement reads the same through the cache as through go-libsql (see
// the package doc and Text for why readers cast such columns to BLOB).
var timeFormats = []string{
	time.RFC3339Nano,
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04:05",
	"2006-01-02T15:04:05",
	"2006-01-02 15:04",
	"2006-01-02T15:04",
	"2006-01-02",
}

func columnValue(rows, row unsafe.Pointer, i int) (driver.Value, error) {
	col := C.int(i)
	var typ C.int
	var errMsg *C.char
	if rc := C.libsql_column_type(rows, row, col, &typ, &errMsg); rc != 0 {
		return nil, libsqlError(fmt.Sprint("failed to get column type for index ", i), rc, errMsg)
	}
	switch typ {
	case typeNull:
		return nil, nil
	case typeInt:
		var v C.longlong
		if rc := C.libsql_get_int(row, col, &v, &errMsg); rc != 0 {
			return nil, libsqlError(fmt.Sprint("failed to get integer for column ", i), rc, errMsg)
		}
		return int64(v), nil
	case typeFloat:
		var v C.double
		if rc := C.libsql_get_float(row, col, &v, &errMsg); rc != 0 {
			return nil, libsqlError(fmt.Sprint("failed to get float for column ", i), rc, errMsg)
		}
		return float64(v), nil
	case typeBlob:
		var b C.libsql_blob
		if rc := C.libsql_get_blob(row, col, &b, &errMsg); rc != 0 {
			return nil, libsqlError(fmt.Sprint("failed to get blob for column ", i), rc, errMsg)
		}
		v := C.GoBytes(unsafe.Pointer(b.ptr), b.len)
		C.libsql_free_blob(b)
		return v, nil
	case typeText:
		var p *C.char
		if rc := C.libsql_get_string(row, col, &p, &errMsg); rc != 0 {
			return nil, libsqlError(fmt.Sprint("failed to get string for column ", i), rc, errMsg)
		}
		str := C.GoString(p)
		C.libsql_free_string(p)
		if looksLikeTime(str) {
			for _, f := range timeFormats {
				if t, err := time.ParseInLocation(f, str, time.UTC); err == nil {
					return t, nil
				}
			}
		}
		return str, nil
	}
	return nil, nil // go-libsql leaves an unknown type's column as it was: nil here
}

// looksLikeTime is a cheap guard before the ten layouts: every one of them
// starts with four digits and a '-'.
func looksLikeTime(s string) bool {
	if len(s) < 10 || s[4] != '-' {
		return false
	}
	for _, c := range s[:4] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
