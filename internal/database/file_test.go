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
