package processor_test

import (
	"context"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Frames captured from the real chain (reference PDS → indigo relay →
// Jetstream v2, legacy /subscribe) by interop tier 2: what Jetstream
// makes of CBOR records. A blob is {"$type":"blob","ref":{"$link":CID},
// "mimeType","size"}; integers up to 2^53-1 arrive as JSON numbers; the
// #identity event carries no handle (the relay forwards none), and every
// event carries the server's sequence number as "cursor".
func TestFramesCapturedFromTheRealChainAreIndexed(t *testing.T) {
	db := testsupport.OpenDB(t)
	events := readJSONL(t, "testdata/realchain-subscribe.jsonl")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db, unfenced, events)
	if err != nil {
		t.Fatal(err)
	}
	if res.SkippedTotal() != 0 {
		t.Fatalf("skipped %v of the captured frames", res.Skipped)
	}
	var layerSize int64
	var cfg string
	if err := db.QueryRow(`SELECT l.size, m.config_digest FROM manifest_layers l JOIN manifests m ON m.id = l.manifest_id`).Scan(&layerSize, &cfg); err != nil {
		t.Fatal(err)
	}
	if layerSize != 9007199254740991 {
		t.Errorf("layer size %d, want 2^53-1 as the record had it", layerSize)
	}
	if cfg == "" {
		t.Error("config digest lost")
	}
	// Written on the PDS: 4 manifests (one a list), 3 tags (one moved to
	// another manifest, one deleted), 3 stars (both subject shapes, one
	// deleted), a profile, a repo page with an avatar blob, a captain, 2
	// crew (one deleted), stats (updated); one account deactivated.
	for table, want := range map[string]int{
		"manifests": 4, "manifest_references": 2, "tags": 2, "stars": 2, "repo_pages": 1,
		"hold_captains": 1, "hold_crew": 1, "repository_hold_stats": 1,
	} {
		if got := countRows(t, db, table); got != want {
			t.Errorf("%s: %d rows, want %d", table, got, want)
		}
	}
	var pulls int64
	if err := db.QueryRow(`SELECT pull_count FROM repository_hold_stats`).Scan(&pulls); err != nil || pulls != 9 {
		t.Errorf("hold stats pull_count = %d (%v), want the update's 9", pulls, err)
	}
	var avatar string
	if err := db.QueryRow(`SELECT avatar_cid FROM repo_pages`).Scan(&avatar); err != nil || !strings.HasPrefix(avatar, "bafkrei") {
		t.Errorf("repo page avatar = %q (%v), want the blob's CID link", avatar, err)
	}
	if n := countRows(t, db, "users WHERE active = 0 AND status = 'deactivated'"); n != 1 {
		t.Errorf("%d deactivated users, want 1", n)
	}
	for _, ev := range events {
		if ev.Identity != nil && ev.Identity.Handle != "" {
			t.Errorf("captured #identity carries handle %q: the capture is not what Bluesky's relay sends", ev.Identity.Handle)
		}
	}
}
