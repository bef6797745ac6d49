package database

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
)

func TestChunksCoverEveryRowOnceWithinTheParameterBudget(t *testing.T) {
	for _, c := range []struct{ n, width, fixed int }{
		{0, 5, 0}, {1, 5, 0}, {819, 5, 0}, {820, 5, 0}, {7201, 5, 0}, {698919, 8, 0}, {1365, 3, 1}, {1366, 3, 1},
	} {
		next, calls := 0, 0
		err := Chunks(c.n, c.width, c.fixed, func(lo, hi int) error {
			calls++
			if lo != next || hi <= lo || hi > c.n {
				return fmt.Errorf("range [%d, %d) after %d", lo, hi, next)
			}
			if p := (hi-lo)*c.width + c.fixed; p > chunkParams || p > MaxParams {
				return fmt.Errorf("range [%d, %d) binds %d parameters", lo, hi, p)
			}
			next = hi
			return nil
		})
		if err != nil || next != c.n {
			t.Errorf("Chunks(%d, %d, %d): %v, covered %d rows in %d calls", c.n, c.width, c.fixed, err, next, calls)
		}
	}
	stop := errors.New("stop")
	calls := 0
	if err := Chunks(10000, 5, 0, func(lo, hi int) error { calls++; return stop }); err != stop || calls != 1 {
		t.Errorf("an error from fn: got %v after %d calls, want it at once", err, calls)
	}
}

// A statement at the chunk budget runs on SQLite; one row over MaxParams
// does not (the limit Chunks exists for).
func TestAChunkFitsTheDatabaseAndMaxParamsIsItsLimit(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE t (a, b, c)`); err != nil {
		t.Fatal(err)
	}
	run := func(rows int) error {
		args := make([]any, 3*rows)
		_, err := db.ExecContext(ctx, `INSERT INTO t VALUES `+Values(rows, 3), args...)
		return err
	}
	if err := Chunks(5000, 3, 0, func(lo, hi int) error { return run(hi - lo) }); err != nil {
		t.Fatalf("chunked insert: %v", err)
	}
	if err := run(MaxParams/3 + 1); err == nil {
		t.Fatalf("%d parameters in one statement were accepted: MaxParams is not the limit", 3*(MaxParams/3+1))
	}
}
