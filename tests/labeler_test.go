package tests

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/testsupport"
)

// labelerSrc is the DID the fake labeler signs its labels with.
const labelerSrc = "did:plc:fakelabeler"

// acceptWithin bounds the wait for a subscriber to connect to the fake labeler.
const acceptWithin = 20 * time.Second

// takedown is a !takedown label on subject, created now.
func takedown(subject string) testsupport.Label {
	return testsupport.Label{"ver": 1, "src": labelerSrc, "uri": subject, "val": "!takedown",
		"cts": time.Now().UTC().Format(time.RFC3339Nano)}
}

// metricValue scrapes i's /metrics and returns the value of the series
// written exactly as series (name{labels}), or an error when it is absent.
func metricValue(ctx context.Context, i *harness.Instance, series string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+i.AdminAddr()+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no series %s in /metrics", i.ID, series)
}

// TestTheLabelerSubscriberResumesFromTheStoredCursorAfterAGracefulHandover
// runs the labeler subscriber on two instances: the holder follows the
// fake labeler from cursor 0 and stores each frame's seq with its labels;
// after its SIGTERM it closes its connection, and the other instance
// connects with cursor=<last seq>. A takedown sent after the handover is
// applied once, by the new holder, under its fence.
func TestTheLabelerSubscriberResumesFromTheStoredCursorAfterAGracefulHandover(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	db := fileDB(t)
	reader := newDBReader(t, db)
	labeler := testsupport.NewLabeler(t)
	ctx := within(t, 60*time.Second)
	spec := func(id string) harness.Spec {
		return feedSpec(id, db, map[string]any{"labeler.url": labeler.URL()})
	}
	a, err := c.Start(ctx, spec("a"))
	if err != nil {
		t.Fatal(err)
	}
	started, err := a.Wait(ctx, harness.Is(harness.WorkerStarted, leaseLabeler))
	if err != nil {
		t.Fatal(err)
	}
	first := labeler.Accept(t, acceptWithin)
	if first.Cursor != "0" {
		t.Errorf("the first holder connected with cursor %q; want 0 (nothing stored yet)", first.Cursor)
	}
	b, err := c.Start(ctx, spec("b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Wait(ctx, harness.Is(harness.LeaseContended, leaseLabeler)); err != nil {
		t.Fatal(err)
	}
	first.SendLabels(t, 1, takedown("did:plc:spammer1"))
	first.SendLabels(t, 2, takedown("at://did:plc:spammer2"))
	first.SendLabels(t, 3, testsupport.Label{"ver": 1, "src": labelerSrc, "uri": "did:plc:spammer1", "val": "spam",
		"cts": time.Now().UTC().Format(time.RFC3339Nano)})
	if err := reader.pollInt(ctx, 3, `SELECT COALESCE(MAX(seq), 0) FROM labeler_cursors`); err != nil {
		t.Fatalf("a did not store the cursor of its last frame: %v", err)
	}

	mark := b.Log.Len()
	stopCleanly(t, ctx, a)
	select {
	case <-first.Closed():
	case <-ctx.Done():
		t.Fatalf("a exited and its labeler connection is still open: %v", ctx.Err())
	}
	acq, err := b.Log.WaitFrom(ctx, mark, harness.Is(harness.LeaseAcquired, leaseLabeler))
	if err != nil {
		t.Fatal(err)
	}
	if acq.Fence != started.Fence+1 {
		t.Errorf("b took the labeler over with fence %d; want %d", acq.Fence, started.Fence+1)
	}
	second := labeler.Accept(t, acceptWithin)
	if second.Cursor != "3" {
		t.Errorf("b connected with cursor %q; want 3, the last seq a stored", second.Cursor)
	}
	second.SendLabels(t, 4, takedown("did:plc:spammer3"))
	if err := reader.pollInt(ctx, 1, `SELECT COUNT(*) FROM labeler_cursors WHERE seq = 4 AND fence = ?1`, acq.Fence); err != nil {
		t.Fatalf("b did not store seq 4 under its fence: %v", err)
	}
	for _, row := range []struct {
		did   string
		seq   int64
		fence int64
	}{{"did:plc:spammer1", 1, started.Fence}, {"did:plc:spammer2", 2, started.Fence}, {"did:plc:spammer3", 4, acq.Fence}} {
		if n := reader.int(t, ctx, `SELECT COUNT(*) FROM taken_down_subjects WHERE src = ?1 AND did = ?2 AND repo = ''`, labelerSrc, row.did); n != 1 {
			t.Errorf("%s is taken down in %d rows; want 1", row.did, n)
		}
		if n := reader.int(t, ctx, `SELECT COUNT(*) FROM taken_down_subjects WHERE did = ?1 AND seq = ?2 AND fence = ?3`, row.did, row.seq, row.fence); n != 1 {
			t.Errorf("%s's takedown is not the one of seq %d under fence %d", row.did, row.seq, row.fence)
		}
	}
	if n := reader.int(t, ctx, `SELECT COUNT(*) FROM taken_down_subjects`); n != 2+1 {
		t.Errorf("%d subjects taken down; want 3 (the spam label is not a takedown)", n)
	}
	// b applied one takedown: the one sent after the handover, nothing of a's replayed.
	if v, err := metricValue(ctx, b, `appview_labeler_labels_total{outcome="takedown"}`); err != nil || v != 1 {
		t.Errorf("b applied %v takedown labels (%v); want exactly 1", v, err)
	}
	stopCleanly(t, ctx, b)
	select {
	case <-second.Closed():
	case <-ctx.Done():
		t.Fatalf("b exited and its labeler connection is still open: %v", ctx.Err())
	}
	tl := c.Timeline()
	if err := harness.CheckExclusive(tl, leaseLabeler); err != nil {
		t.Error(err)
	}
	if err := harness.CheckFences(tl, map[string]int64{leaseLabeler: 1}); err != nil {
		t.Error(err)
	}
}
