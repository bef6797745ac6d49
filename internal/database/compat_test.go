package database

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// A synthetic breaking migration, applied by a binary that knows it, makes
// a binary that does not refuse to migrate, with one line naming both
// versions, before it writes anything. No embedded migration is breaking
// today, so the newer binary is the embedded list plus one.
func TestABreakingMigrationMakesAnOlderBinaryRefuseBeforeWritingAnything(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "appview.db")
	older, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	known := older[len(older)-1].Version
	additive := Migration{Version: known + 1, Name: "add_a_column", Statements: []string{`ALTER TABLE users ADD COLUMN extra TEXT NOT NULL DEFAULT ''`}}
	breaking := Migration{Version: known + 2, Name: "split_tags", Statements: []string{`CREATE TABLE tag_targets (x INTEGER)`},
		Breaking: breakingReason("-- Moves tag targets.\n-- breaking: tags.digest is no longer written;\nCREATE TABLE tag_targets (x INTEGER);\n")}
	if breaking.Breaking != "tags.digest is no longer written;" {
		t.Fatalf("breakingReason = %q", breaking.Breaking)
	}

	// The older binary runs on the additive migration of a newer one.
	newer := openTemp(t, path)
	if _, err := newer.apply(ctx, append(append([]Migration(nil), older...), additive)); err != nil {
		t.Fatal(err)
	}
	old := openTemp(t, path)
	if _, err := old.apply(ctx, older); err != nil {
		t.Fatalf("an older binary on an additive migration: %v; want it to run on", err)
	}
	if got := old.NewerMigrations(); !reflect.DeepEqual(got, []int{known + 1}) {
		t.Fatalf("newer migrations %v, want [%d]", got, known+1)
	}

	// After the breaking one it refuses, and leaves the database as it was.
	if _, err := newer.apply(ctx, append(append([]Migration(nil), older...), additive, breaking)); err != nil {
		t.Fatal(err)
	}
	before := schema(t, newer.DB)
	var stamps string
	if err := newer.QueryRow(`SELECT group_concat(version || ':' || applied_at) FROM schema_migrations`).Scan(&stamps); err != nil {
		t.Fatal(err)
	}
	refused := openTemp(t, path)
	_, err = refused.apply(ctx, append(append([]Migration(nil), older...), Migration{Version: known + 1, Name: "add_a_column"}))
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("an older binary after a breaking migration: %v; want ErrSchemaTooNew", err)
	}
	want := []string{"schema is at version " + strconv.Itoa(known+2), fmt.Sprintf("migration %04d_split_tags", known+2),
		"does not know version " + strconv.Itoa(known+2), "tags.digest is no longer written", "knows versions up to " + strconv.Itoa(known+1), "upgrade it"}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) || strings.Contains(err.Error(), "\n") {
			t.Errorf("refusal %q: want one line containing %q", err, w)
		}
	}
	var after string
	if err := newer.QueryRow(`SELECT group_concat(version || ':' || applied_at) FROM schema_migrations`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != stamps || !reflect.DeepEqual(schema(t, newer.DB), before) {
		t.Errorf("the refused binary wrote to the database (schema_migrations %s, was %s)", after, stamps)
	}

	// A binary that knows the breaking migration runs on.
	if _, err := openTemp(t, path).apply(ctx, append(append([]Migration(nil), older...), additive, breaking)); err != nil {
		t.Fatalf("a binary that knows the breaking migration: %v", err)
	}
}

// A later breaking migration raises the bar; an earlier one, however it
// came to be applied after, never lowers it.
func TestSchemaCompatOnlyRises(t *testing.T) {
	ctx := context.Background()
	db := openTemp(t, filepath.Join(t.TempDir(), "appview.db"))
	migs, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	n := migs[len(migs)-1].Version
	late := Migration{Version: n + 2, Name: "late", Statements: []string{`CREATE TABLE late_t (x)`}, Breaking: "late"}
	early := Migration{Version: n + 1, Name: "early", Statements: []string{`CREATE TABLE early_t (x)`}, Breaking: "early"}
	if _, err := db.apply(ctx, append(append([]Migration(nil), migs...), late)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.apply(ctx, append(append([]Migration(nil), migs...), early, late)); err != nil {
		t.Fatal(err)
	}
	var min int
	var by string
	if err := db.QueryRow(`SELECT min_version, migration FROM schema_compat`).Scan(&min, &by); err != nil {
		t.Fatal(err)
	}
	if min != n+2 || by != fmt.Sprintf("%04d_late", n+2) {
		t.Fatalf("schema_compat %d %s; want %d, set by the later migration", min, by, n+2)
	}
}

func TestBreakingReasonReadsOnlyItsOwnLine(t *testing.T) {
	for body, want := range map[string]string{
		"ALTER TABLE t ADD COLUMN c;\n":                  "",
		"-- not breaking: additive\nCREATE TABLE t (x);": "",
		"  -- breaking:   drops t.c  \nDROP TABLE t;":    "drops t.c",
		"-- breaking:\nDROP TABLE t;":                    "no reason given",
	} {
		if got := breakingReason(body); got != want {
			t.Errorf("breakingReason(%q) = %q, want %q", body, got, want)
		}
	}
}
