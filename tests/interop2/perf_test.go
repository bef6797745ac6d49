//go:build interop2

package interop2

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/internal/harness"
)

// TestFigures measures what users of an AppView feel, on the real chain
// (docs/performance.md, "Freshness and backfill"): how soon a write on
// the PDS is in the index (freshness: live, then while the appview
// catches up a 10,000-event backlog), and how close the backfill runs to
// the PDS's rate limit. It prints `name value unit` lines.
//
// It runs last (go test runs the files in name order): its accounts and
// their 10,000 records would otherwise reach the backfill passes of
// TestTier2 and TestLifecycle, which compare whole tables.
func TestFigures(t *testing.T) {
	started := time.Now()
	defer func() { t.Logf("figures ran in %s", time.Since(started).Round(time.Millisecond)) }()
	e := &figEnv{
		work:  env(t, "INTEROP2_WORK"),
		pds:   &pdsClient{base: env(t, "INTEROP2_PDS"), bypass: env(t, "INTEROP2_BYPASS"), http: &http.Client{Timeout: 30 * time.Second}},
		plc:   env(t, "INTEROP2_PLC"),
		relay: env(t, "INTEROP2_RELAY"),
		js:    strings.Replace(env(t, "INTEROP2_JETSTREAM"), "http://", "ws://", 1),
		bin:   env(t, "INTEROP2_APPVIEW"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	t.Logf("load average before: %s", loadAverage())
	bulk := freshness(t, ctx, e)
	backfillRate(t, ctx, e, bulk)
	t.Logf("load average after: %s", loadAverage())
}

// figEnv is the chain TestFigures runs on.
type figEnv struct {
	work                string
	pds                 *pdsClient
	plc, relay, js, bin string
}

// figure prints one figure as `name value unit`, the form
// scripts/interop.d/tier2 gathers at the end of the run.
func figure(name string, value float64, unit string) {
	fmt.Printf("%s %s %s\n", name, formatFigure(value), unit)
}

func formatFigure(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// quantile is the nearest-rank q-quantile of xs (NaN when empty).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// tap is a plain subscriber of Jetstream's v2 wire on this host: it
// notes when each commit's first frame arrived, by DID and rev, and
// counts frames by DID.
type tap struct {
	mu     sync.Mutex
	byRev  map[string]tapFrame // did|rev
	frames map[string]int      // by DID
}

type tapFrame struct {
	seq int64
	at  time.Time
}

// startTap connects to the live tail before it returns; it reads until
// ctx ends.
func startTap(t *testing.T, ctx context.Context, e *figEnv) *tap {
	t.Helper()
	url := e.js + "/xrpc/network.bsky.jetstream.subscribeEvents?collections=io.atcr.*"
	c, _, err := websocket.DefaultDialer.DialContext(ctx, url, nil)
	if err != nil {
		t.Fatalf("tap: %v", err)
	}
	tp := &tap{byRev: map[string]tapFrame{}, frames: map[string]int{}}
	go func() { <-ctx.Done(); c.Close() }()
	go func() {
		for {
			_, b, err := c.ReadMessage()
			at := time.Now()
			if err != nil {
				return
			}
			var f struct {
				Payload struct {
					Type string `json:"$type"`
					Seq  int64  `json:"seq"`
					DID  string `json:"did"`
					Rev  string `json:"rev"`
				} `json:"payload"`
			}
			if json.Unmarshal(b, &f) != nil || !strings.HasSuffix(f.Payload.Type, "#commit") {
				continue
			}
			tp.mu.Lock()
			k := f.Payload.DID + "|" + f.Payload.Rev
			if _, ok := tp.byRev[k]; !ok {
				tp.byRev[k] = tapFrame{seq: f.Payload.Seq, at: at}
			}
			tp.frames[f.Payload.DID]++
			tp.mu.Unlock()
		}
	}()
	return tp
}

func (tp *tap) frame(did, rev string) (tapFrame, bool) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	f, ok := tp.byRev[did+"|"+rev]
	return f, ok
}

// framesOf counts the frames seen of dids, and the largest seq among the
// first frames of their commits.
func (tp *tap) framesOf(dids map[string]bool) (n int, maxSeq int64) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	for d, c := range tp.frames {
		if dids[d] {
			n += c
		}
	}
	for k, f := range tp.byRev {
		if dids[k[:strings.Index(k, "|")]] {
			maxSeq = max(maxSeq, f.seq)
		}
	}
	return n, maxSeq
}

// commitMark is one "jetstream batch committed" debug line of an
// appview: every event up to lastSeq was visible at committed.
type commitMark struct {
	firstSeq, lastSeq int64
	events            int
	committed         time.Time
	// arrived is when the commit's first frame reached the appview's
	// socket (zero when the line has no arrived_us).
	arrived time.Time
}

// commitsOf reads the commits an instance has logged so far, in order.
func commitsOf(in *harness.Instance) []commitMark {
	var out []commitMark
	for _, ev := range in.Log.Events() {
		if ev.Msg != "jetstream batch committed" {
			continue
		}
		var first, last, us int64
		var n int
		_ = json.Unmarshal(ev.Fields["first_seq"], &first)
		_ = json.Unmarshal(ev.Fields["last_seq"], &last)
		_ = json.Unmarshal(ev.Fields["events"], &n)
		if json.Unmarshal(ev.Fields["committed_us"], &us) != nil || us == 0 {
			continue
		}
		m := commitMark{firstSeq: first, lastSeq: last, events: n, committed: time.UnixMicro(us)}
		if json.Unmarshal(ev.Fields["arrived_us"], &us) == nil && us > 0 {
			m.arrived = time.UnixMicro(us)
		}
		out = append(out, m)
	}
	return out
}

// committedIn is the commit of the event numbered seq: the first commit
// whose position reached it.
func committedIn(marks []commitMark, seq int64) (commitMark, bool) {
	for _, m := range marks {
		if m.lastSeq >= seq {
			return m, true
		}
	}
	return commitMark{}, false
}

// committedAt is when the event numbered seq committed.
func committedAt(marks []commitMark, seq int64) (time.Time, bool) {
	m, ok := committedIn(marks, seq)
	return m.committed, ok
}

// appviewSpec is an instance consuming the chain's Jetstream on the
// consumer's defaults (the v2 wire, compressed), with the production
// lease timing, logging at debug level for its commit lines.
func appviewSpec(e *figEnv, id, dbURL string) harness.Spec {
	return harness.Spec{ID: id, DatabaseURL: dbURL,
		Timing: harness.Timing{TTL: 15 * time.Second, RenewInterval: 5 * time.Second, RenewDeadline: 10 * time.Second, RetryInterval: 2 * time.Second},
		Set: map[string]any{
			"jetstream.urls":   []string{e.js + "/xrpc/network.bsky.jetstream.subscribeEvents"},
			"identity.plc_url": e.plc, "identity.handle_well_known_url": e.pds.base,
		}}
}

func clusterIn(t *testing.T, e *figEnv, name string) *harness.Cluster {
	c := harness.NewCluster(e.bin, filepath.Join(e.work, name))
	t.Cleanup(c.Close)
	return c
}

// eventCommitHistogram is an instance's appview_jetstream_event_commit_seconds
// as "≤1ms 120, ≤2ms 180, ..." (cumulative counts up to 64 ms, and the
// total): the appview's own view of frame arrival to commit.
func eventCommitHistogram(admin string) string {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 16<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		const prefix = `appview_jetstream_event_commit_seconds_bucket{le="`
		if !strings.HasPrefix(l, prefix) {
			if n, ok := strings.CutPrefix(l, "appview_jetstream_event_commit_seconds_count "); ok {
				out = append(out, "count "+n)
			}
			continue
		}
		le, count, _ := strings.Cut(strings.TrimPrefix(l, prefix), `"} `)
		if v, err := strconv.ParseFloat(le, 64); err == nil && v <= 0.064 {
			out = append(out, fmt.Sprintf("≤%gms %s", v*1000, count))
		}
	}
	return strings.Join(out, ", ")
}
