package processor_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// star_count counted the stars of deactivated and taken-down accounts,
// which are invisible everywhere else (and which the backfill, skipping
// inactive repos, never stores): the live and the backfilled index
// disagreed. It now counts active accounts' stars, and follows an
// account going inactive and coming back.
func TestStarCountCountsOnlyActiveAccountsStars(t *testing.T) {
	const (
		owner = "did:plc:owner"
		t0    = int64(1764547200000000)
	)
	star := func(did string, us int64) jetstream.Event {
		return revCommit(did, us, "create", processor.CollectionStar, "3m6v4ol3afk22",
			`{"$type":"io.atcr.sailor.star","subject":{"did":"`+owner+`","repository":"app"},"createdAt":"2026-01-01T00:00:00Z"}`)
	}
	account := func(did string, us int64, active bool) jetstream.Event {
		return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindAccount,
			Account: &jetstream.Account{DID: did, Active: &active, Status: map[bool]string{false: "deactivated"}[active]}}
	}
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	count := func(events ...jetstream.Event) int {
		t.Helper()
		if res, err := p.Apply(context.Background(), db, unfenced, events); err != nil || len(res.Skipped) != 0 {
			t.Fatalf("apply: %+v, %v", res, err)
		}
		var n int
		if err := db.QueryRow(`SELECT star_count FROM repository_stats WHERE did = ?1 AND repository = 'app'`, owner).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(star("did:plc:a", t0+1), star("did:plc:b", t0+2), star("did:plc:c", t0+3)); n != 3 {
		t.Fatalf("star_count %d, want 3", n)
	}
	if n := count(account("did:plc:b", t0+10, false)); n != 2 {
		t.Fatalf("after b deactivated: star_count %d, want 2", n)
	}
	if n := count(account("did:plc:b", t0+11, false), account("did:plc:c", t0+12, true)); n != 2 {
		t.Fatalf("after events that change nothing: star_count %d, want 2", n)
	}
	// An older account event (replayed) changes nothing.
	if n := count(account("did:plc:b", t0+5, true)); n != 2 {
		t.Fatalf("after a stale event: star_count %d, want 2", n)
	}
	// A star made while inactive does not count until the account is back.
	if n := count(star("did:plc:b", t0+20), account("did:plc:b", t0+21, true)); n != 3 {
		t.Fatalf("after b reactivated: star_count %d, want 3", n)
	}
}
