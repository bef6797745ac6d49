package consumer

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// countingHandles is a processor.HandleResolver counting its lookups.
type countingHandles struct{ lookups atomic.Int64 }

func (c *countingHandles) Handle(context.Context, string) (string, error) {
	c.lookups.Add(1)
	return "", nil
}

func (c *countingHandles) RefreshHandle(ctx context.Context, did string) (string, error) {
	return c.Handle(ctx, did)
}

// stampedPDS answers a re-read of a repository without io.atcr.* records
// (getLatestCommit, describeRepo) and keeps when each request came.
type stampedPDS struct {
	mu    sync.Mutex
	at    []time.Time // getLatestCommit requests: one per re-read
	total int
	srv   *httptest.Server
}

func newStampedPDS(t *testing.T) *stampedPDS {
	p := &stampedPDS{}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.total++
		if strings.HasSuffix(r.URL.Path, "getLatestCommit") {
			p.at = append(p.at, time.Now())
		}
		p.mu.Unlock()
		switch strings.TrimPrefix(r.URL.Path, "/xrpc/") {
		case "com.atproto.sync.getLatestCommit":
			fmt.Fprint(w, `{"cid":"bafy","rev":"3l3qo2vutsw44"}`)
		case "com.atproto.repo.describeRepo":
			fmt.Fprintf(w, `{"did":%q,"handle":"x.test","collections":["app.bsky.actor.profile"]}`, r.URL.Query().Get("repo"))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *stampedPDS) stamps() ([]time.Time, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.at...), p.total
}

// A storm of #account events for accounts the index has no rows of (1,000
// in one second: Jetstream sends every account's lifecycle events) must
// not flood their PDS or the database: each DID gets one users row, the
// rows share a transaction when they arrive while the one before
// commits, each DID is queued for a
// re-read once, the re-reads share the #sync
// queue and its rate limit (one per jetstream.resync_interval, two
// requests each for a repository without io.atcr.* records), and the
// consumer keeps up with the stream while the queue drains.
func TestAStormOfAccountEventsForUnknownAccountsStaysBounded(t *testing.T) {
	const (
		dids     = 1000
		storm    = time.Second // dids events, evenly spaced
		interval = 10 * time.Millisecond
	)
	path := filepath.Join(t.TempDir(), "storm.jsonl")
	var lines []string
	base := time.Now().Add(-time.Minute).UnixMicro()
	for i := range dids {
		did := fmt.Sprintf("did:plc:storm%05d", i)
		us := base + int64(i)*int64(storm/time.Microsecond)/dids
		lines = append(lines, fmt.Sprintf(`{"did":%q,"time_us":%d,"kind":"account","account":{"active":true,"did":%q,"seq":%d,"time":%q}}`,
			did, us, did, i+1, time.UnixMicro(us).UTC().Format("2006-01-02T15:04:05.000Z")))
	}
	last := base + int64(dids-1)*int64(storm/time.Microsecond)/dids
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := serveReplay(t, jetstream.ReplayOptions{File: path, Listen: "127.0.0.1:0", Rate: dids}, zerolog.Nop())

	db := testsupport.OpenDB(t)
	c := acquire(t, db, "me")
	reg := prometheus.NewRegistry()
	cm, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rm, err := NewResyncMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	pds := newStampedPDS(t)
	handles := &countingHandles{}
	o := optionsFor(db, c, srv.URL())
	o.Metrics = cm
	o.Processor = processor.New(processor.Options{Log: zerolog.Nop(), Handles: handles})
	o.Resync = NewResyncer(db, staticPDS(pds.srv.URL), o.Processor, interval, zerolog.Nop(), rm)
	sys := testsupport.NewActorSystem(t)
	start := time.Now()
	pid := sys.Root.Spawn(NewProps(o))
	defer stop(t, sys, pid)

	// The consumer keeps up: it reaches the last event while the queue
	// holds most of the storm, and the queue never holds a DID twice.
	maxQueue := 0
	testsupport.Eventually(t, "the cursor to reach the storm's last event", func() bool {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM repo_resyncs`).Scan(&n); err == nil {
			maxQueue = max(maxQueue, n)
		}
		return cursorAt(db) == last
	})
	caughtUp := time.Since(start)
	var users, distinct, active int
	if err := db.QueryRow(`SELECT COUNT(*), COUNT(DISTINCT did), COALESCE(SUM(active), 0) FROM users`).Scan(&users, &distinct, &active); err != nil {
		t.Fatal(err)
	}
	if users != dids || distinct != dids || active != dids {
		t.Fatalf("users: %d rows, %d DIDs, %d active; want one active row per DID (%d)", users, distinct, active, dids)
	}
	batches := testutil.ToFloat64(cm.batches)
	queuedTotal := testutil.ToFloat64(cm.lifecycleRereads.WithLabelValues("queued"))
	// A batch is what arrived while the one before committed: one event
	// a commit when commits are quicker than the events' spacing, more
	// when not. How soon it keeps up is a figure (tier 2's freshness and
	// catch-up lines, logged below), not a timed assertion here.
	if queuedTotal != dids || maxQueue > dids {
		t.Fatalf("%v re-reads queued, the queue held at most %d: want each of the %d DIDs queued once", queuedTotal, maxQueue, dids)
	}
	if n := handles.lookups.Load(); n != dids {
		t.Fatalf("%d handle lookups, want one per new DID (%d)", n, dids)
	}
	// The re-reads drain at the rate limit: never two within one interval.
	testsupport.Eventually(t, "a hundred re-reads", func() bool {
		at, _ := pds.stamps()
		return len(at) >= 100
	})
	at, total := pds.stamps()
	elapsed := at[len(at)-1].Sub(at[0])
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < interval-time.Millisecond {
			t.Fatalf("re-reads %d and %d began %s apart, under the %s rate limit", i-1, i, gap, interval)
		}
	}
	if reads := len(at); total > 2*reads+2 {
		t.Fatalf("%d PDS requests for %d re-reads: want at most 2 each (getLatestCommit, describeRepo)", total, reads)
	}
	var left int
	if err := db.QueryRow(`SELECT COUNT(*) FROM repo_resyncs`).Scan(&left); err != nil || left > dids-len(at)+2 {
		t.Fatalf("%d re-reads still queued after %d done (%v)", left, len(at), err)
	}
	t.Logf("FIGURE storm: %d #account events for unknown DIDs in 1 s: caught up in %s, %v batches, "+
		"queue at most %d, re-reads %.1f/s (limit %.0f/s), %d PDS requests for %d re-reads, %d users rows",
		dids, caughtUp.Round(time.Millisecond), batches, maxQueue, float64(len(at)-1)/elapsed.Seconds(),
		float64(time.Second/interval), total, len(at), users)
}
