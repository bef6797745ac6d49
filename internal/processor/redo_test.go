package processor_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// refuse makes the database refuse every row of table whose column holds
// value (a constraint only these tests have).
func refuse(t *testing.T, db *database.DB, table, column, value string) {
	t.Helper()
	if _, err := db.Exec(fmt.Sprintf(`CREATE TRIGGER "refuse_%[1]s_%[3]s" BEFORE INSERT ON %[1]s WHEN NEW.%[2]s = '%[3]s'
BEGIN SELECT RAISE(ABORT, '%[1]s %[3]s is refused'); END`, table, column, value)); err != nil {
		t.Fatal(err)
	}
}

// manifestWithLayer is a manifest record of repo app with one layer.
func manifestWithLayer(digest, layer string) map[string]any {
	return map[string]any{"repository": "app", "digest": digest, "mediaType": "x", "schemaVersion": 2,
		"createdAt": "2026-01-01T00:00:00Z", "holdDid": "did:web:hold.example",
		"layers": []any{map[string]any{"digest": layer, "size": 1, "mediaType": "x"}}}
}

// bareApply applies events in one bare session and rolls it back.
func bareApply(t *testing.T, db *database.DB, p *processor.Processor, events []jetstream.Event) (processor.Result, error) {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	return p.BeginBareTx(context.Background(), tx, unfenced).Apply(events)
}

func TestABareSessionSkipsAFailingEventThatWroteNothing(t *testing.T) {
	db := testsupport.OpenDB(t)
	refuse(t, db, "tags", "tag", "boom")
	const alice = "did:plc:alice"
	events := []jetstream.Event{
		commit(alice, 10, "create", processor.CollectionTag, "t1", tagRecord("app", "one", "sha256:1")),
		// Refused at its first write.
		commit(alice, 11, "create", processor.CollectionTag, "t2", tagRecord("app", "boom", "sha256:2")),
		commit(alice, 13, "create", processor.CollectionTag, "t4", tagRecord("app", "four", "sha256:4")),
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := bareApply(t, db, p, events)
	if err != nil {
		t.Fatalf("bare Apply: %v (events that wrote nothing need no redo)", err)
	}
	if res.Applied != 2 || res.Skipped[processor.ReasonDatabase] != 1 {
		t.Fatalf("result %+v: want 2 applied and 1 db_error skip", res)
	}
}

func TestABareSessionStopsAtAFailingEventThatWroteWithErrRedo(t *testing.T) {
	db := testsupport.OpenDB(t)
	refuse(t, db, "manifest_layers", "digest", "sha256:bad")
	const alice = "did:plc:alice"
	events := []jetstream.Event{
		commit(alice, 10, "create", processor.CollectionTag, "t1", tagRecord("app", "one", "sha256:1")),
		// The users row and the manifest row are written, then the layer is refused.
		commit(alice, 11, "create", processor.CollectionManifest, "m1", manifestWithLayer("sha256:m1", "sha256:bad")),
		commit(alice, 12, "create", processor.CollectionManifest, "m2", manifestWithLayer("sha256:m2", "sha256:good")),
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	_, err := bareApply(t, db, p, events)
	if !errors.Is(err, processor.ErrRedo) {
		t.Fatalf("bare Apply: err = %v, want ErrRedo", err)
	}
	if !strings.Contains(err.Error(), "time_us=11") {
		t.Fatalf("err %q does not name the failing event (time_us=11)", err)
	}
	// Apply (bare, then isolating each event) loses only the failing one,
	// with everything it wrote.
	res, err := p.Apply(context.Background(), db, unfenced, events)
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 2 || res.Skipped[processor.ReasonDatabase] != 1 || len(res.NewManifests) != 1 {
		t.Fatalf("result %+v: want 2 applied, 1 db_error skip, 1 new manifest", res)
	}
	var digests string
	if err := db.QueryRow(`SELECT group_concat(digest) FROM manifests`).Scan(&digests); err != nil {
		t.Fatal(err)
	}
	if digests != "sha256:m2" {
		t.Fatalf("manifests = %q, want only sha256:m2", digests)
	}
}

func TestARedoneTransactionCountsAndLogsEachEventOnce(t *testing.T) {
	db := testsupport.OpenDB(t)
	refuse(t, db, "manifest_layers", "digest", "sha256:bad")
	const alice = "did:plc:alice"
	var events []jetstream.Event
	for i, tag := range []string{"a", "b", "c"} {
		events = append(events, commit(alice, int64(10+i), "create", processor.CollectionTag, "t"+tag, tagRecord("app", tag, "sha256:"+tag)))
	}
	events = append(events,
		commit(alice, 20, "create", processor.CollectionManifest, "m1", manifestWithLayer("sha256:m1", "sha256:bad")),
		commit(alice, 21, "create", processor.CollectionTag, "td", tagRecord("app", "d", "sha256:d")))
	reg := prometheus.NewRegistry()
	m, err := processor.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	p := processor.New(processor.Options{Log: zerolog.New(&logs), Metrics: m})
	// The consumer's shape: one session, several Apply calls, Finish; the
	// bare attempt fails in the second call, after the first was counted
	// in its Result.
	attempts := 0
	var s *processor.TxSession
	err = processor.Redo(func(bare bool) error {
		attempts++
		return fence.Fenced(context.Background(), db, unfenced, func(tx *sql.Tx) error {
			s = p.BeginTx(context.Background(), tx, unfenced)
			if bare {
				s = p.BeginBareTx(context.Background(), tx, unfenced)
			}
			for _, part := range [][]jetstream.Event{events[:2], events[2:]} {
				if _, err := s.Apply(part); err != nil {
					return err
				}
			}
			return s.Finish()
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Committed()
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2 (bare, then isolated)", attempts)
	}
	if got := metricSum(t, reg, "appview_processor_events_total"); got != float64(len(events)) {
		t.Fatalf("appview_processor_events_total = %v, want %d: a redone transaction counted its events twice", got, len(events))
	}
	if got := metricSum(t, reg, "appview_processor_skipped_total"); got != 1 {
		t.Fatalf("appview_processor_skipped_total = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "manifest_layers sha256:bad is refused"); n != 1 {
		t.Fatalf("the refusal is logged %d times, want once:\n%s", n, logs.String())
	}
	if n := countRows(t, db, "tags"); n != 4 {
		t.Fatalf("tags = %d, want 4", n)
	}
	if n := countRows(t, db, "manifests"); n != 0 {
		t.Fatalf("manifests = %d, want 0", n)
	}
}

func TestATransactionThatDoesNotCommitCountsNothing(t *testing.T) {
	db := testsupport.OpenDB(t)
	const alice = "did:plc:alice"
	events := []jetstream.Event{
		commit(alice, 10, "create", processor.CollectionTag, "t1", tagRecord("app", "one", "sha256:1")),
		commit(alice, 11, "create", processor.CollectionTag, "t2", map[string]any{"repository": "app"}), // missing tag
	}
	reg := prometheus.NewRegistry()
	m, err := processor.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	p := processor.New(processor.Options{Log: zerolog.Nop(), Metrics: m})
	// The consumer after losing custody: applied and finished, then the
	// commit is refused (here: rolled back) and the next holder applies
	// the same events again.
	errLost := errors.New("custody lost at commit")
	err = fence.Fenced(context.Background(), db, unfenced, func(tx *sql.Tx) error {
		s := p.BeginBareTx(context.Background(), tx, unfenced)
		if _, err := s.Apply(events); err != nil {
			return err
		}
		if err := s.Finish(); err != nil {
			return err
		}
		return errLost
	})
	if !errors.Is(err, errLost) {
		t.Fatalf("err = %v", err)
	}
	if got := metricSum(t, reg, "appview_processor_events_total"); got != 0 {
		t.Fatalf("appview_processor_events_total = %v after a transaction that did not commit, want 0", got)
	}
	if _, err := p.Apply(context.Background(), db, unfenced, events); err != nil {
		t.Fatal(err)
	}
	if got := metricSum(t, reg, "appview_processor_skipped_total"); got != 1 {
		t.Fatalf("appview_processor_skipped_total = %v, want 1 (the invalid event, once)", got)
	}
}
