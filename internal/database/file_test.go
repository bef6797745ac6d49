package database

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestCheckFileNoticesTheFileDeletedOrReplaced(t *testing.T) {
	for _, how := range []string{"deleted", "replaced"} {
		t.Run(how, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.db")
			db := openTemp(t, path)
			if err := db.CheckFile(); err != nil {
				t.Fatalf("fresh database: %v", err)
			}
			switch how {
			case "deleted":
				if err := os.Remove(path); err != nil {
					t.Fatal(err)
				}
			case "replaced":
				other := path + ".new"
				if err := os.WriteFile(other, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(other, path); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.CheckFile(); !errors.Is(err, ErrFileReplaced) {
				t.Fatalf("after the file was %s: %v, want ErrFileReplaced", how, err)
			}
			if err := db.Ready(context.Background()); !errors.Is(err, ErrFileReplaced) {
				t.Fatalf("ready after the file was %s: %v, want ErrFileReplaced", how, err)
			}
		})
	}
}

// A database that answers reads but cannot commit a write must be refused
// at start, even when there is no migration left to apply (a read-only
// file or mount, a full disk). A trigger that breaks a deferred foreign
// key makes every commit touching schema_migrations fail, as they would.
func TestMigrateRefusesADatabaseThatCannotCommitAWrite(t *testing.T) {
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE TABLE fk_parent (id INTEGER PRIMARY KEY)`,
		`CREATE TABLE fk_child (pid INTEGER REFERENCES fk_parent (id) DEFERRABLE INITIALLY DEFERRED)`,
		`CREATE TRIGGER no_commit AFTER UPDATE ON schema_migrations BEGIN INSERT INTO fk_child VALUES (1); END`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Migrate(ctx); err == nil {
		t.Fatal("migrate succeeded on a database that cannot commit a write")
	}
	if err := db.Ready(ctx); err == nil {
		t.Fatal("ready on a database that cannot commit a write")
	}
}

// The write-ahead log deleted or replaced under a running process: SQLite
// keeps writing to the log it has open, so every later commit would be
// lost while it reports success. CheckFile must say so.
func TestCheckFileNoticesTheWriteAheadLogDeletedOrReplaced(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skip("no /proc/self/fd: a changed log is taken as SQLite's own")
	}
	for _, how := range []string{"deleted", "replaced"} {
		t.Run(how, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "a.db")
			db := openTemp(t, path)
			if _, err := db.Exec(`CREATE TABLE t (x INTEGER)`); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(path + "-wal"); err != nil {
				t.Fatalf("no write-ahead log after a write: %v", err)
			}
			if err := db.CheckFile(); err != nil {
				t.Fatalf("fresh database: %v", err)
			}
			if err := os.Remove(path + "-wal"); err != nil {
				t.Fatal(err)
			}
			if how == "replaced" {
				if err := os.WriteFile(path+"-wal", nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.CheckFile(); !errors.Is(err, ErrFileReplaced) {
				t.Fatalf("after the log was %s: %v, want ErrFileReplaced", how, err)
			}
		})
	}
}

// SQLite deletes the log itself when the last connection closes (after
// checkpointing it) and makes a new one on the next open: not a loss, and
// told apart from a deletion under the process by nobody holding the old
// log open. Here no process holds it: a new log, then none, then another
// new one are all accepted; an old log still held open is not.
func TestTheLogWatchAcceptsALogNobodyHoldsAnyMore(t *testing.T) {
	if _, err := os.ReadDir("/proc/self/fd"); err != nil {
		t.Skip("no /proc/self/fd")
	}
	path := filepath.Join(t.TempDir(), "a.db")
	if err := os.WriteFile(path+"-wal", []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := newWALWatch(path)
	for _, step := range []string{"remade", "removed", "made again"} {
		if step != "made again" {
			if err := os.Remove(path + "-wal"); err != nil {
				t.Fatal(err)
			}
		}
		if step != "removed" {
			if err := os.WriteFile(path+"-wal", []byte(step), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.check(); err != nil {
			t.Fatalf("log %s while nobody held the old one: %v", step, err)
		}
	}
	held, err := os.Open(path + "-wal")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := os.Remove(path + "-wal"); err != nil {
		t.Fatal(err)
	}
	if err := w.check(); !errors.Is(err, ErrFileReplaced) {
		t.Fatalf("log removed while this process holds it open: %v, want ErrFileReplaced", err)
	}
}
