package database

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
)

// Migration 0008 gives every row stored before it the no-rev version of its
// source_us: "0" and 20 digits, below every TID, so any event with a rev
// replaces it, and rows keep their old order among themselves.
func TestMigration8GivesExistingRowsAVersionBelowEveryRev(t *testing.T) {
	db, ctx := migratedBelow(t, 8)
	for _, q := range []string{
		`INSERT INTO users (did, profile_us, updated_at) VALUES ('did:plc:a', 1750000000000001, 1)`,
		`INSERT INTO users (did, updated_at) VALUES ('did:plc:b', 1)`,
		`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at, source_us)
		 VALUES ('did:plc:a', 'app', 'latest', 'sha256:1', 't1', 1, 1, 1750000000000002)`,
		`INSERT INTO record_tombstones (did, collection, rkey, source_us) VALUES ('did:plc:a', 'io.atcr.tag', 't2', 42)`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for q, want := range map[string]string{
		`SELECT profile_version FROM users WHERE did = 'did:plc:a'`: "000001750000000000001",
		`SELECT profile_version FROM users WHERE did = 'did:plc:b'`: "",
		`SELECT version FROM tags`:                                  "000001750000000000002",
		`SELECT version FROM record_tombstones`:                     "000000000000000000042",
	} {
		var got string
		if err := db.QueryRowContext(ctx, q).Scan(&got); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", q, got, want)
		}
		if got != "" && (len(got) != 21 || got >= "2222222222222") {
			t.Errorf("%s = %q: not 21 characters below every TID", q, got)
		}
	}
}

// Migration 0013 keeps every takedown stored before it as a label of its
// own, resolved to the subject it had, so deriving taken_down_subjects
// from labels afterwards loses none of them.
func TestMigration13KeepsEveryStoredTakedownAsALabel(t *testing.T) {
	db, ctx := migratedBelow(t, 13)
	if _, err := db.ExecContext(ctx, `INSERT INTO taken_down_subjects (src, did, repo, uri, created_at, expires_at, seq, fence, updated_at)
VALUES ('did:plc:l', 'did:plc:a', 'api', 'at://did:plc:a/io.atcr.manifest/3k', 5, 9, 3, 2, 1),
       ('did:plc:l', 'did:plc:b', '', 'did:plc:b', 6, NULL, 4, 2, 1)`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, err := db.QueryContext(ctx, `SELECT `+Text("uri")+`, `+Text("val")+`, `+Text("did")+`, `+Text("repo")+`,
  created_at, COALESCE(expires_at, -1), seq FROM labels ORDER BY did`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var uri, val, did, repo string
		var cts, exp, seq int64
		if err := rows.Scan(&uri, &val, &did, &repo, &cts, &exp, &seq); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s %s %q %d %d %d", uri, val, did, repo, cts, exp, seq))
	}
	want := []string{
		`at://did:plc:a/io.atcr.manifest/3k !takedown did:plc:a "api" 5 9 3`,
		`did:plc:b !takedown did:plc:b "" 6 -1 4`,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("labels = %q, want %q", got, want)
	}
}

// migratedBelow opens a new file database with every migration below
// version applied.
func migratedBelow(t *testing.T, version int) (*DB, context.Context) {
	t.Helper()
	db := openTemp(t, filepath.Join(t.TempDir(), "a.db"))
	ctx := context.Background()
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var before []Migration
	for _, m := range migs {
		if m.Version < version {
			before = append(before, m)
		}
	}
	if _, err := db.apply(ctx, before); err != nil {
		t.Fatal(err)
	}
	return db, ctx
}
