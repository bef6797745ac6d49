package processor_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// manifestFrame is a Jetstream frame carrying an io.atcr.manifest whose
// list field (layers, manifests or annotations) holds n copies of item
// (the annotations' items are "kI":"" pairs, item unused). It is built
// in one allocation of its final size: at the element limit the frames
// are megabytes, and under the race detector every buffer regrown and
// copied on the way costs shadow memory faulted in, a good part of what
// the tests of the limit spent.
func manifestFrame(field, item string, n int) []byte {
	head := `{"did":"did:plc:big","time_us":1750000000000000,"kind":"commit","commit":{"rev":"3lrnqkdzhdq22",` +
		`"operation":"create","collection":"io.atcr.manifest","rkey":"3lrnqkdzhdq22","cid":"bafyreibig",` +
		`"record":{"$type":"io.atcr.manifest","repository":"app","digest":"sha256:big","schemaVersion":2,` +
		`"mediaType":"application/vnd.oci.image.manifest.v1+json","createdAt":"2026-01-01T00:00:00Z",` +
		strconv.Quote(field) + ":"
	per := len(item) + 1
	if field == "annotations" {
		per = len(`"k":"",`) + len(strconv.Itoa(n))
	}
	b := make([]byte, 0, len(head)+2+n*per+len(`}}}`))
	b = append(b, head...)
	if field == "annotations" {
		b = append(b, '{')
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `"k`...)
			b = strconv.AppendInt(b, int64(i), 10)
			b = append(b, `":""`...)
		}
		b = append(b, '}')
	} else {
		b = append(b, '[')
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, item...)
		}
		b = append(b, ']')
	}
	return append(b, `}}}`...)
}

// storeFrame decodes frame as the consumer does (its default frame limit)
// and applies it; the manifest must be stored with every list entry.
func storeFrame(t *testing.T, db *database.DB, frame []byte, table string, want int) {
	t.Helper()
	dec, err := jetstream.NewDecoder(max(jetstream.DefaultMaxEventBytes, int64(len(frame))))
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	ev, err := dec.Decode(frame, false)
	if err != nil {
		t.Fatalf("decode a %d-byte frame: %v", len(frame), err)
	}
	var logs bytes.Buffer
	p := processor.New(processor.Options{Log: zerolog.New(&logs)})
	res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{ev})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if res.Applied != 1 {
		t.Fatalf("result %+v, want the manifest applied; log: %.2000s", res, logs.String())
	}
	if n := countRows(t, db, table); n != want {
		t.Fatalf("%s has %d rows, want %d", table, n, want)
	}
}

// The manifest of the report: 7,201 layers, 5 parameters each, was
// dropped with "too many SQL variables" when stored in one INSERT.
func TestAManifestWith7201LayersIsStored(t *testing.T) {
	storeFrame(t, testsupport.OpenDB(t), manifestFrame("layers", realisticLayer, 7201), "manifest_layers", 7201)
}

// realisticLayer is an OCI layer descriptor as a registry writes it.
var realisticLayer = `{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:` +
	strings.Repeat("ab", 32) + `","size":1234567}`

// The largest record the consumer accepts fills its largest frame
// (jetstream.DefaultMaxEventBytes, jetstream.max_message_bytes' default).
func TestTheLargestFrameOfLayersIsStoredWhole(t *testing.T) {
	n := (jetstream.DefaultMaxEventBytes - len(manifestFrame("layers", "", 0))) / (len(realisticLayer) + 1)
	frame := manifestFrame("layers", realisticLayer, n)
	if len(frame) > jetstream.DefaultMaxEventBytes || len(manifestFrame("layers", realisticLayer, n+1)) <= jetstream.DefaultMaxEventBytes {
		t.Fatalf("%d layers make a %d-byte frame: not the largest under %d", n, len(frame), jetstream.DefaultMaxEventBytes)
	}
	t.Logf("%d layers in a %d-byte frame", n, len(frame))
	storeFrame(t, testsupport.OpenDB(t), frame, "manifest_layers", n)
}

// The most parameters a record can bind: each list at the AT Protocol's
// element limit, with the shortest entries (a descriptor needs a digest:
// "a:0" is the shortest the OCI grammar allows, and at the limit that
// makes a frame a little over the stream's default bound, so storeFrame
// decodes it with a bound that fits: the processor's limits are what is
// tested here, the client's frame bound elsewhere). One more element is skipped as too_long before it costs a
// statement.
func TestListsAtTheElementLimitAreStoredWholeAndOneMoreIsSkipped(t *testing.T) {
	for _, c := range []struct{ field, item, table string }{
		{"layers", `{"digest":"a:0"}`, "manifest_layers"},
		{"manifests", `{"digest":"a:0"}`, "manifest_references"},
		{"annotations", ``, "manifest_annotations"},
	} {
		t.Run(c.field, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			storeFrame(t, db, manifestFrame(c.field, c.item, processor.MaxContainerLen), c.table, processor.MaxContainerLen)

			ev, err := jetstream.Decode(manifestFrame(c.field, c.item, processor.MaxContainerLen+1))
			if err != nil {
				t.Fatal(err)
			}
			ev.Commit.Rev, ev.Commit.RKey = "3lrnqkdzhdq23", "3lrnqkdzhdq23"
			res, err := processor.New(processor.Options{Log: zerolog.Nop()}).Apply(context.Background(), db, unfenced, []jetstream.Event{ev})
			if err != nil || res.Skipped[processor.ReasonTooLong] != 1 {
				t.Fatalf("one element over the limit: %+v, %v; want it skipped as too_long", res, err)
			}
		})
	}
}

// Over sqld the same records land whole: the statement limits are
// SQLite's, and Hrana requests stay bounded by database.Chunks too.
func TestTheLargestRecordsAreStoredOverSqld(t *testing.T) {
	srv := testsupport.StartSQLD(t)
	db, err := database.Open(context.Background(), database.Options{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	storeFrame(t, db, manifestFrame("layers", realisticLayer, 7201), "manifest_layers", 7201)
	// The most parameters one record can bind: 8 per manifest list entry.
	frame := bytes.Replace(manifestFrame("manifests", `{"digest":"a:0"}`, processor.MaxContainerLen), []byte("sha256:big"), []byte("sha256:bi2"), 1)
	storeFrame(t, db, frame, "manifest_references", processor.MaxContainerLen)
}
