//go:build interop2

package interop2

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/harness"
)

// Backfill at the PDS's limit: a fresh instance backfills every
// repository of the chain (the backlog's 10,000 records among them) from
// the PDS, whose rate limit tier 2 lowers (INTEROP_PDS_GLOBAL_POINTS per
// INTEROP_PDS_GLOBAL_WINDOW_MS). The instance's own count of requests by
// host and status (appview_backfill_requests_total), read every 50 ms,
// gives the rate the PDS saw; its RateLimit-Policy gives the allowance.

// requestsLine is one appview_backfill_requests_total series.
var requestsLine = regexp.MustCompile(`^appview_backfill_requests_total\{code="([^"]*)",host="([^"]*)"\} (\S+)$`)

// requestCount is the instance's count of requests to one port, at:
// served (answered, but not with 429) and refused with 429.
type requestCount struct {
	at           time.Time
	served, r429 float64
}

// countRequests reads the instance's requests to hosts on port.
func countRequests(admin, port string) (requestCount, error) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return requestCount{}, err
	}
	defer resp.Body.Close()
	c := requestCount{at: time.Now()}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := requestsLine.FindStringSubmatch(sc.Text())
		if m == nil || !strings.HasSuffix(m[2], ":"+port) {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return c, err
		}
		switch m[1] {
		case "429":
			c.r429 += v
		case "error":
		default:
			c.served += v
		}
	}
	return c, sc.Err()
}

// pdsPolicy reads the PDS's stated allowance (RateLimit-Policy "L;w=S")
// from an answer to a request without the suite's bypass key.
func pdsPolicy(base string) (limit int, window time.Duration, err error) {
	resp, err := http.Get(base + "/xrpc/com.atproto.server.describeServer")
	if err != nil {
		return 0, 0, err
	}
	resp.Body.Close()
	p := resp.Header.Get("RateLimit-Policy")
	var w int
	if _, err := fmt.Sscanf(p, "%d;w=%d", &limit, &w); err != nil || limit <= 0 || w <= 0 {
		return 0, 0, fmt.Errorf("RateLimit-Policy %q: want L;w=S", p)
	}
	return limit, time.Duration(w) * time.Second, nil
}

// boundStretch is the stretch over which the limit bound: from the
// moment the first window's allowance was used up to the moment the
// last full window's was, (k-1) windows' worth of requests served. It
// returns the achieved rate over the allowed one and the stretch's
// length.
func boundStretch(samples []requestCount, limit int, window time.Duration) (ratio float64, stretch time.Duration) {
	if len(samples) == 0 {
		return math.NaN(), 0
	}
	k := int(samples[len(samples)-1].served) / limit
	if k < 2 {
		return math.NaN(), 0
	}
	reached := func(n int) time.Time {
		for _, s := range samples {
			if s.served >= float64(n) {
				return s.at
			}
		}
		return time.Time{}
	}
	stretch = reached(k * limit).Sub(reached(limit))
	allowed := float64(limit) / window.Seconds()
	return float64((k-1)*limit) / stretch.Seconds() / allowed, stretch
}

func backfillRate(t *testing.T, ctx context.Context, e *figEnv, bulk []*account) {
	u, err := url.Parse(e.pds.base)
	if err != nil {
		t.Fatal(err)
	}
	port := u.Port()
	dbURL := "file:" + e.work + "/backfill-rate.db"
	in, err := clusterIn(t, e, "backfill-rate").Start(ctx, harness.Spec{ID: "backfill-rate", DatabaseURL: dbURL, LogLevel: "info", Set: map[string]any{
		"backfill.enabled": true, "backfill.relay_endpoints": []string{e.relay},
		"identity.plc_url": e.plc, "identity.handle_well_known_url": e.pds.base,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := in.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		samples []requestCount
	)
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if c, err := countRequests(in.AdminAddr(), port); err == nil {
				mu.Lock()
				samples = append(samples, c)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	ev, err := in.Wait(ctx, harness.Msg("backfill run completed"))
	close(stop)
	<-sampled
	if err != nil {
		t.Fatalf("backfill did not complete: %v\n%s", err, in.Tail(30))
	}
	last, err := countRequests(in.AdminAddr(), port)
	if err != nil {
		t.Fatal(err)
	}
	samples = append(samples, last)
	limit, window, err := pdsPolicy(e.pds.base)
	if err != nil {
		t.Fatal(err)
	}
	var records, failed int64
	var took float64 // ms
	_ = json.Unmarshal(ev.Fields["records"], &records)
	_ = json.Unmarshal(ev.Fields["repos_failed"], &failed)
	_ = json.Unmarshal(ev.Fields["took"], &took)
	ratio, stretch := boundStretch(samples, limit, window)
	figure("backfill_rate_ratio", ratio, "achieved/allowed")
	figure("backfill_429_total", last.r429, "responses")
	figure("backfill_records_per_s", float64(records)/(took/1000), "records/s")
	figure("backfill_bound_s", stretch.Seconds(), "s")
	t.Logf("backfill: %d records, %.0f requests to the PDS served and %.0f refused in %.1f s (allowance %d per %s), %d repositories failed",
		records, last.served, last.r429, took/1000, limit, window, failed)
	if failed != 0 {
		t.Errorf("backfill marked %d repositories failed", failed)
	}
	// Gross violations only: pacing that runs into the limit again and
	// again, or leaves a good part of the allowance unused.
	if last.r429 > 5 || ratio < 0.6 {
		t.Errorf("the backfill's pacing is off: %.0f requests refused with 429, %.2f of the allowance used", last.r429, ratio)
	}
	if stretch < 30*time.Second {
		t.Errorf("the PDS's limit bound the backfill for %s; the figure needs at least 30 s (more records, or a lower INTEROP_PDS_GLOBAL_POINTS)", stretch.Round(time.Millisecond))
	}
	// Every record of the backlog is in the index.
	db := openDB(t, dbURL)
	var dids []string
	for _, a := range bulk {
		dids = append(dids, a.DID)
	}
	list := "'" + strings.Join(dids, "','") + "'"
	for table, want := range map[string]int{"manifests": bulkAccounts * bulkCommits * bulkOps / 2, "tags": bulkAccounts * bulkCommits * bulkOps / 2} {
		var n int
		if err := db.QueryRow(`SELECT COUNT(*) FROM ` + table + ` WHERE did IN (` + list + `)`).Scan(&n); err != nil || n != want {
			t.Errorf("backfill: %d rows of the backlog in %s (%v), want %d", n, table, err, want)
		}
	}
}
