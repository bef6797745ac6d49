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

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// refuseTag makes the database refuse every tag named name (a constraint
// only these tests have).
func refuseTag(t *testing.T, db *sql.DB, name string) {
	t.Helper()
	if _, err := db.Exec(`CREATE TRIGGER refuse_` + name + ` BEFORE INSERT ON tags WHEN NEW.tag = '` + name + `'
BEGIN SELECT RAISE(ABORT, 'tag ` + name + ` is refused'); END`); err != nil {
		t.Fatal(err)
	}
}

func TestABareSessionStopsAtTheFirstFailingEventWithErrRedo(t *testing.T) {
	db := testsupport.OpenDB(t)
	refuseTag(t, db.DB, "boom")
	const alice = "did:plc:alice"
	events := []jetstream.Event{
		commit(alice, 10, "create", processor.CollectionTag, "t1", tagRecord("app", "one", "sha256:1")),
		commit(alice, 11, "create", processor.CollectionTag, "t2", tagRecord("app", "boom", "sha256:2")),
		commit(alice, 12, "create", processor.CollectionTag, "t3", tagRecord("app", "three", "sha256:3")),
	}
	// An invalid record found only while writing (a tag whose manifest is
	// not stored) fails a bare session the same way.
	unresolved := commit(alice, 13, "create", processor.CollectionTag, "t4",
		map[string]any{"repository": "app", "tag": "four", "manifest": "at://" + alice + "/io.atcr.manifest/nope"})
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	for _, batch := range [][]jetstream.Event{events, {unresolved}} {
		tx, err := db.BeginTx(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		s := p.BeginBareTx(context.Background(), tx, unfenced)
		_, err = s.Apply(batch)
		_ = tx.Rollback()
		if !errors.Is(err, processor.ErrRedo) {
			t.Fatalf("bare Apply of %d events: err = %v, want ErrRedo", len(batch), err)
		}
		if want := fmt.Sprintf("time_us=%d", batch[len(batch)/2].TimeUS); !strings.Contains(err.Error(), want) {
			t.Fatalf("err %q does not name the failing event (%s)", err, want)
		}
	}
	// Apply (bare, then isolating each event) loses only the failing ones.
	res, err := p.Apply(context.Background(), db.DB, unfenced, append(events, unresolved))
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 2 || res.Skipped[processor.ReasonDatabase] != 1 || res.Skipped[processor.ReasonUnresolvedManifest] != 1 {
		t.Fatalf("result %+v: want 2 applied, 1 db_error and 1 unresolved_manifest skip", res)
	}
}

func TestARedoneTransactionCountsAndLogsEachEventOnce(t *testing.T) {
	db := testsupport.OpenDB(t)
	refuseTag(t, db.DB, "boom")
	const alice = "did:plc:alice"
	var events []jetstream.Event
	for i, tag := range []string{"a", "b", "c", "boom", "d"} {
		events = append(events, commit(alice, int64(10+i), "create", processor.CollectionTag, "t"+tag, tagRecord("app", tag, "sha256:"+tag)))
	}
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
	err = processor.Redo(func(bare bool) error {
		attempts++
		return fence.Fenced(context.Background(), db.DB, unfenced, func(tx *sql.Tx) error {
			s := p.BeginTx(context.Background(), tx, unfenced)
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
	if attempts != 2 {
		t.Fatalf("%d attempts, want 2 (bare, then isolated)", attempts)
	}
	if got := metricSum(t, reg, "appview_processor_events_total"); got != float64(len(events)) {
		t.Fatalf("appview_processor_events_total = %v, want %d: a redone transaction counted its events twice", got, len(events))
	}
	if got := metricSum(t, reg, "appview_processor_skipped_total"); got != 1 {
		t.Fatalf("appview_processor_skipped_total = %v, want 1", got)
	}
	if n := strings.Count(logs.String(), "tag boom is refused"); n != 1 {
		t.Fatalf("the refusal is logged %d times, want once:\n%s", n, logs.String())
	}
	if n := countRows(t, db.DB, "tags"); n != 4 {
		t.Fatalf("tags = %d, want 4", n)
	}
}
