package processor_test

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/processor"
)

// Frames captured from the real chain (reference PDS → indigo relay →
// Jetstream v2, legacy /subscribe) by interop tier 2: what Jetstream
// makes of CBOR records. A blob is {"$type":"blob","ref":{"$link":CID},
// "mimeType","size"}; integers up to 2^53-1 arrive as JSON numbers; the
// #identity event carries no handle (the relay forwards none), and every
// event carries the server's sequence number as "cursor".
func TestFramesCapturedFromTheRealChainAreIndexed(t *testing.T) {
	db := openDB(t)
	events := readJSONL(t, "testdata/realchain-subscribe.jsonl")
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db.DB, unfenced, events)
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
	for _, ev := range events {
		if ev.Identity != nil && ev.Identity.Handle != "" {
			t.Errorf("captured #identity carries handle %q: the capture is not what Bluesky's relay sends", ev.Identity.Handle)
		}
	}
}
