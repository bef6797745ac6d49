package labeler

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/testsupport"
)

// A label is keyed by (src, uri, val) (com.atproto.label.defs#label), not
// by the repository it takes down: these tests pin what follows from that.

const erinManifest = "at://did:plc:erin/io.atcr.manifest/3kmanifest1"

func seedManifest(t *testing.T, db *database.DB, rkey, repo string) {
	t.Helper()
	if _, err := db.Exec(fmt.Sprintf(`INSERT INTO manifests (did, repository, digest, rkey, media_type, schema_version, created_at, indexed_at)
VALUES ('did:plc:erin', '%s', 'sha256:%s', '%s', 'application/vnd.oci.image.manifest.v1+json', 2, 0, 0)`, repo, rkey, rkey)); err != nil {
		t.Fatalf("seed manifest %s: %v", rkey, err)
	}
}

func (h *harness) wantTakedowns(want ...takedown) {
	h.t.Helper()
	got := h.takedowns()
	ok := len(got) == len(want)
	for _, td := range want {
		ok = ok && got[td]
	}
	if !ok {
		h.t.Fatalf("taken_down_subjects = %v, want %v", got, want)
	}
}

// The labeler's history replays at once on a first connection (cursor 0),
// long before a backfill has indexed every record: a takedown of a record
// not indexed yet is kept and applied when the record is.
func TestATakedownOfARecordNotIndexedYetAppliesOnceItIs(t *testing.T) {
	h := newHarness(t)
	h.opts.ResolveEvery = 10 * time.Millisecond
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	conn.SendLabels(t, 1, takedownLabel(erinManifest), takedownLabel("at://did:plc:erin/io.atcr.tag/3klatertag"))
	h.waitCursor(1)
	h.wantTakedowns()
	if got := testutil.ToFloat64(h.metrics.Labels.WithLabelValues(outcomePending)); got != 2 {
		t.Fatalf("labels{outcome=pending} = %v, want 2", got)
	}

	seedManifest(t, h.db, "3kmanifest1", "api")
	testsupport.Eventually(t, "the manifest's takedown applied", func() bool {
		return h.takedowns()[takedown{src, "did:plc:erin", "api"}]
	})
	h.wantTakedowns(takedown{src, "did:plc:erin", "api"})
	if _, err := h.db.Exec(`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at)
VALUES ('did:plc:erin', 'web', 'latest', 'sha256:aa', '3klatertag', 0, 0)`); err != nil {
		t.Fatal(err)
	}
	testsupport.Eventually(t, "the tag's takedown applied", func() bool {
		return h.takedowns()[takedown{src, "did:plc:erin", "web"}]
	})
	if got := testutil.ToFloat64(h.metrics.Labels.WithLabelValues(outcomeResolved)); got != 2 {
		t.Fatalf("labels{outcome=resolved} = %v, want 2", got)
	}
	var fence int64
	if err := h.db.QueryRow(`SELECT fence FROM taken_down_subjects WHERE repo = 'api'`).Scan(&fence); err != nil || fence == 0 {
		t.Fatalf("resolved row fence = %d, %v; want the subscriber's", fence, err)
	}
}

// Negating (or letting expire) one label lifts that label only: the
// repository stays taken down while another label still names it.
func TestNegatingOneLabelLeavesTheOtherLabelsOfItsRepository(t *testing.T) {
	h := newHarness(t)
	seedManifest(t, h.db, "3kmanifest1", "api")
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	api := takedown{src, "did:plc:erin", "api"}
	page := "at://did:plc:erin/io.atcr.repo.page/api"
	past, future := rfc3339(time.Now().Add(-time.Hour)), rfc3339(time.Now().Add(time.Hour))

	conn.SendLabels(t, 1, takedownLabel(page))
	conn.SendLabels(t, 2, takedownLabel(erinManifest))
	conn.SendLabels(t, 3, with(takedownLabel(erinManifest), "neg", true))
	h.waitCursor(3)
	h.wantTakedowns(api)

	// An expired label for the manifest does not lift the page's.
	conn.SendLabels(t, 4, with(takedownLabel(erinManifest), "exp", past))
	// Nor does one with an expiry make the page's permanent takedown lapse.
	conn.SendLabels(t, 5, with(takedownLabel(erinManifest), "exp", future))
	h.waitCursor(5)
	h.wantTakedowns(api)
	var expires sql.NullInt64
	var uri string
	if err := h.db.QueryRow(`SELECT uri, expires_at FROM taken_down_subjects`).Scan(&uri, &expires); err != nil {
		t.Fatal(err)
	}
	if expires.Valid || uri != page {
		t.Fatalf("row = uri %q expires_at %v, want the page's label, no expiry", uri, expires)
	}

	// With the page's label negated, the manifest's (with its exp) remains.
	conn.SendLabels(t, 6, with(takedownLabel(page), "neg", true))
	h.waitCursor(6)
	h.wantTakedowns(api)
	if err := h.db.QueryRow(`SELECT uri, expires_at FROM taken_down_subjects`).Scan(&uri, &expires); err != nil {
		t.Fatal(err)
	}
	if !expires.Valid || uri != erinManifest {
		t.Fatalf("row = uri %q expires_at %v, want the manifest's label and its expiry", uri, expires)
	}
	conn.SendLabels(t, 7, with(takedownLabel(erinManifest), "neg", true))
	h.waitCursor(7)
	h.wantTakedowns()
}

// A negation finds its label by uri: the record it named may be deleted
// (or never indexed) by then, and a takedown sent again after the delete
// (a replay) still holds the repository it was resolved to.
func TestALabelOfADeletedRecordIsStillNegatedAndReplayed(t *testing.T) {
	h := newHarness(t)
	seedManifest(t, h.db, "3kmanifest1", "api")
	h.start(acquire(t, h.db, "instance-a"))
	conn := h.fake.Accept(t, waitFor)
	api := takedown{src, "did:plc:erin", "api"}
	conn.SendLabels(t, 1, takedownLabel(erinManifest))
	h.waitCursor(1)
	h.wantTakedowns(api)

	if _, err := h.db.Exec(`DELETE FROM manifests WHERE rkey = '3kmanifest1'`); err != nil {
		t.Fatal(err)
	}
	conn.SendLabels(t, 2, takedownLabel(erinManifest))
	h.waitCursor(2)
	h.wantTakedowns(api)
	if got := testutil.ToFloat64(h.metrics.Labels.WithLabelValues(outcomePending)); got != 0 {
		t.Fatalf("labels{outcome=pending} = %v, want 0: the label was resolved before", got)
	}

	conn.SendLabels(t, 3, with(takedownLabel(erinManifest), "neg", true),
		with(takedownLabel("at://did:plc:erin/io.atcr.tag/3knever"), "neg", true))
	h.waitCursor(3)
	h.wantTakedowns()
	var n int
	if err := h.db.QueryRow(`SELECT count(*) FROM labels`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("labels rows = %d, %v; want 0", n, err)
	}
}
