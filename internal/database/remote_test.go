package database

import (
	"context"
	"database/sql"
	"sync"
	"testing"
	"time"
)

// sqldStreamExpiry is how long sqld keeps an idle Hrana stream (measured
// against sqld 0.24: alive after 5 s idle, STREAM_EXPIRED after 12 s).
const sqldStreamExpiry = 10 * time.Second

func openRemote(t *testing.T, url string) *DB {
	t.Helper()
	db, err := Open(context.Background(), Options{URL: url})
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// onConns runs SELECT 1 on n distinct pooled connections at once and
// returns the errors.
func onConns(t *testing.T, db *DB, n int) []error {
	t.Helper()
	ctx := context.Background()
	conns := make([]*sql.Conn, n)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatalf("take connection %d: %v", i, err)
		}
		conns[i] = c
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var one int
			errs[i] = c.QueryRowContext(ctx, "SELECT 1").Scan(&one)
		}()
	}
	wg.Wait()
	for _, c := range conns {
		c.Close()
	}
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	return failed
}
