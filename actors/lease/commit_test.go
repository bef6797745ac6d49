package lease

import (
	"context"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
)

// A grant exists only once its statement has committed. The RETURNING row
// arrives before the commit of an autocommit statement; when the commit
// then fails (a full disk, a read-only file; here a deferred foreign key
// that a test trigger breaks), Acquire must report the error, not a grant
// the table does not hold.
func TestAnAcquireWhoseCommitFailsIsNotAGrant(t *testing.T) {
	db := testsupport.OpenDB(t)
	for _, stmt := range []string{
		`CREATE TABLE fk_parent (id INTEGER PRIMARY KEY)`,
		`CREATE TABLE fk_child (pid INTEGER REFERENCES fk_parent (id) DEFERRABLE INITIALLY DEFERRED)`,
		`CREATE TRIGGER leases_commit_fails AFTER INSERT ON leases BEGIN INSERT INTO fk_child VALUES (42); END`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	g, err := NewStore(db, time.Minute).Acquire(context.Background(), "doomed", "a")
	if err == nil {
		t.Fatalf("acquire reported %+v although its commit failed", g)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM leases`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d lease rows (%v), want none", n, err)
	}
}
