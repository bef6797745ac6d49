package database_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/testsupport"
)

func TestRemotePoolHealsAfterTheServerRestarts(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	const conns = 4
	if errs := database.OnConns(t, db, conns); len(errs) > 0 {
		t.Fatalf("before the restart: %v", errs)
	}

	srv.Restart()
	// Every pooled connection now holds a stream the new server does not
	// know. Each may fail once; then the pool must be whole again.
	first := database.OnConns(t, db, conns)
	t.Logf("first round after the restart: %d of %d failed", len(first), conns)
	for round := 2; round <= 3; round++ {
		if errs := database.OnConns(t, db, conns); len(errs) > 0 {
			t.Fatalf("round %d after the restart: %d of %d connections failed: %v", round, len(errs), conns, errs[0])
		}
	}
}

func TestRemoteConnectionIdleLongerThanTheServersStreamExpiryStillWorks(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	if errs := database.OnConns(t, db, 2); len(errs) > 0 {
		t.Fatal(errs)
	}
	// The idleness itself is under test, so this waits out a duration
	// rather than a condition.
	<-time.After(database.SqldStreamExpiry + 2*time.Second)
	if errs := database.OnConns(t, db, 2); len(errs) > 0 {
		t.Fatalf("after %s idle: %d connections failed: %v", database.SqldStreamExpiry+2*time.Second, len(errs), errs[0])
	}
}

func TestRemoteMigrateAndReadyWorkOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	ctx := context.Background()
	applied, err := db.Migrate(ctx)
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	migs, _ := database.Migrations()
	if len(applied) != len(migs) {
		t.Fatalf("applied %v, want all %d", applied, len(migs))
	}
	if again, err := db.Migrate(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second migrate: %v, %v; want nothing applied", again, err)
	}
	if err := db.Ready(ctx); err != nil {
		t.Fatalf("ready: %v", err)
	}
}

func TestConcurrentMigrateOverSqldAppliesEachMigrationOnce(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	migs, _ := database.Migrations()
	const handles = 4
	dbs := make([]*database.DB, handles)
	for i := range dbs {
		dbs[i] = database.OpenRemote(t, srv.URL)
	}
	database.MigrateAtOnce(t, dbs, len(migs))
}
func TestTextWithANULIsRefusedNotCutOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	database.AssertNULRefused(t, database.OpenRemote(t, srv.URL))
}
func TestTextReadsEveryDateLikeValueBackUnchangedOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	database.AssertTextRoundTrips(t, database.OpenRemote(t, srv.URL))
}

// A write with arguments goes to sqld with them written as literals (one
// request, not a describe first): each value comes back with the type
// and bytes a bound argument stores.
func TestAWriteWithArgumentsStoresTheirTypesOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	db := database.OpenRemote(t, srv.URL)
	if _, err := db.Exec(`CREATE TABLE t (k INTEGER PRIMARY KEY, a, b, c, d, e, f)`); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 6, 1, 2, 3, 4, time.UTC)
	if _, err := db.Exec(`INSERT INTO t VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)`,
		1, "O'Brien -- not a comment ?2", -42, []byte{0, 1, 0xff}, nil, true, at); err != nil {
		t.Fatal(err)
	}
	var types, a, f string
	var b int64
	var c []byte
	if err := db.QueryRow(`SELECT typeof(a)||typeof(b)||typeof(c)||typeof(d)||typeof(e)||typeof(f), `+
		database.Text("a")+`, b, c, `+database.Text("f")+` FROM t WHERE k = 1 AND e = 1`).Scan(&types, &a, &b, &c, &f); err != nil {
		t.Fatal(err)
	}
	if types != "textintegerblobnullintegertext" || a != "O'Brien -- not a comment ?2" || b != -42 ||
		string(c) != "\x00\x01\xff" || f != at.Format(time.RFC3339Nano) {
		t.Fatalf("stored %s: %q %d %x %q", types, a, b, c, f)
	}
}

func TestARefusalIsRefusedInEveryStatementShapeOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	database.AssertRefusalsRefused(t, database.OpenRemote(t, srv.URL))
}

// A token the server stops taking while the process runs (expired,
// revoked) is what /readyz names, not a server that does not answer.
func TestReadyNamesATokenTheServerRefusesOverSqld(t *testing.T) {
	t.Parallel()
	srv := testsupport.StartSQLD(t)
	// A TCP forwarder to sqld that, once refusing, cuts the connections it
	// forwards and answers every new one 401, as sqld does an expired JWT.
	// (net/http/httputil's ReverseProxy cut Hrana's streamed answers.)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var (
		mu      sync.Mutex
		refuse  bool
		forward []net.Conn
	)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if refuse {
				mu.Unlock()
				go func() {
					defer c.Close()
					_, _ = http.ReadRequest(bufio.NewReader(c))
					_, _ = io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 19\r\nConnection: close\r\n\r\nThe JWT has expired")
				}()
				continue
			}
			up, err := net.Dial("tcp", srv.Addr)
			if err != nil {
				mu.Unlock()
				c.Close()
				continue
			}
			forward = append(forward, c, up)
			mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	db := database.OpenRemote(t, "http://"+ln.Addr().String())
	ctx := context.Background()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := db.Ready(ctx); err != nil {
		t.Fatalf("ready before the refusal: %v", err)
	}
	mu.Lock()
	refuse = true
	for _, c := range forward {
		c.Close()
	}
	mu.Unlock()
	// A pooled connection that was cut fails once ("not answering") and
	// is retired; a new one meets the refusal.
	for try := 1; ; try++ {
		err = db.Ready(ctx)
		if err != nil && strings.Contains(err.Error(), "the server refused database.auth_token") && !database.Unavailable(err) {
			return
		}
		if try == 5 {
			t.Fatalf("ready with the token refused: %v; want it named, and not unavailable", err)
		}
	}
}
