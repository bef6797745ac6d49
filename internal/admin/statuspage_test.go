package admin

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestHistoryRecordsHolderChangesWithTheirGap(t *testing.T) {
	h := NewHistory()
	h.ObserveLeases([]LeaseSnap{{Name: "backfill", Holder: "a", Fence: 1, AcquiredAt: 1000, RenewedAt: 5000}})
	// Same holder renewing, and the same holder re-acquiring: no handover.
	h.ObserveLeases([]LeaseSnap{{Name: "backfill", Holder: "a", Fence: 1, AcquiredAt: 1000, RenewedAt: 6000}})
	h.ObserveLeases([]LeaseSnap{{Name: "backfill", Holder: "a", Fence: 2, AcquiredAt: 7000, RenewedAt: 7000}})
	if got := h.Handovers(); len(got) != 0 {
		t.Fatalf("handovers %v without a holder change", got)
	}
	h.ObserveLeases([]LeaseSnap{{Name: "backfill", Holder: "b", Fence: 3, AcquiredAt: 7250, RenewedAt: 7250}})
	got := h.Handovers()
	if len(got) != 1 {
		t.Fatalf("handovers = %v, want one", got)
	}
	if ho := got[0]; ho.From != "a" || ho.To != "b" || ho.FromFence != 2 || ho.ToFence != 3 || ho.Gap != 250*time.Millisecond {
		t.Fatalf("handover = %+v, want a→b, fence 2→3, gap 250ms", ho)
	}
	h.MaxHandovers = 2
	for i := int64(0); i < 5; i++ {
		holder := []string{"a", "b"}[i%2]
		h.ObserveLeases([]LeaseSnap{{Name: "backfill", Holder: holder, Fence: 4 + i, AcquiredAt: 8000 + i, RenewedAt: 8000 + i}})
	}
	if got := h.Handovers(); len(got) != 2 || got[0].ToFence != 8 {
		t.Fatalf("kept %v, want the newest 2, newest first", got)
	}
}

func TestHistoryKeepsLagPointsOfTheWindowOnly(t *testing.T) {
	h := NewHistory()
	start := time.Unix(1_800_000_000, 0)
	for i := 0; i < 80; i++ {
		h.ObserveLag(start.Add(time.Duration(i)*time.Minute), time.Duration(i)*time.Second)
	}
	pts := h.Points()
	if len(pts) != 61 || pts[0].At != start.Add(19*time.Minute) {
		t.Fatalf("%d points from %v, want 61 covering the last hour", len(pts), pts[0].At)
	}
}

func TestRenderEscapesAndShowsEverySection(t *testing.T) {
	p := Page{
		Instance: `evil<script>alert(1)</script>`, Version: "v1", Now: time.Now(),
		Instances: []Instance{{ID: "appview-1", Self: true, Holds: []string{"backfill"}}, {ID: "appview-2"}},
		Leases:    []Lease{{Name: "backfill", Holder: "appview-1", State: "held", Fence: 4, TimeLeft: 12 * time.Second}},
		Handovers: []Handover{{Lease: "backfill", From: "appview-2", To: "appview-1", FromFence: 3, ToFence: 4, Gap: 300 * time.Millisecond}},
		Jetstream: Jetstream{Known: true, Position: time.Now(), Lag: 2 * time.Second,
			Points: []Point{{At: time.Now().Add(-time.Minute), Lag: time.Second}, {At: time.Now(), Lag: 3 * time.Second}}},
		Consumer: Consumer{Here: true, Healthy: true, URL: "wss://jetstream.example/xrpc/network.bsky.jetstream.subscribeEvents", Wire: "v2",
			State: "connected", Events: true, LastEventAgo: 2 * time.Second},
		Backfill: Backfill{Run: true, RunID: 1, State: "stopped", Finished: 5, Known: 10, Fraction: 0.5, ETA: "10s",
			FailedAttempts: 2, LastError: "every relay failed", LastErrorAgo: time.Minute},
		Outbox: []StateCount{{"pending", 2}, {"delivered", 7}, {"failed", 1}},
	}
	var b bytes.Buffer
	if err := RenderStatus(&b, p); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, "<script>") {
		t.Fatal("an instance id was not escaped")
	}
	for _, want := range []string{"appview-1</code> (this page)", "appview-2", "<polyline", "300ms", "5/10 repos", "<td>delivered</td><td>7</td>", "width:50.0%", "run 1 (stopped,",
		`consumer <span class="healthy">healthy</span>`, "(v2 wire, connected) · last event 2s ago",
		`<span id="backfill-error" class="muted">2 failed attempts, the last 1m0s ago: every relay failed`} {
		if !strings.Contains(out, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, banned := range []string{"http://", "https://", "<link", "<img", "@import"} {
		if strings.Contains(out, banned) {
			t.Errorf("page refers to an external asset (%q)", banned)
		}
	}
}

// The consumer's row says who runs it when this instance does not, and
// says so loudly when nobody does.
func TestTheConsumerRowNamesItsHolderElsewhere(t *testing.T) {
	for c, want := range map[Consumer]string{
		{Holder: "appview-2"}: `<p id="consumer" class="muted">consumer run by <code>appview-2</code>: its own status page shows its health</p>`,
		{}:                    `<p id="consumer" class="unhealthy">no instance runs the consumer: its lease is not held</p>`,
	} {
		var b bytes.Buffer
		if err := RenderStatus(&b, Page{Consumer: c}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), want) {
			t.Errorf("consumer %+v: page lacks %q", c, want)
		}
	}
}

func TestViewedWithin(t *testing.T) {
	h := NewHistory()
	now := time.Unix(1_800_000_000, 0)
	if h.ViewedWithin(now, time.Minute) {
		t.Fatal("never viewed, yet ViewedWithin")
	}
	h.Viewed(now)
	if !h.ViewedWithin(now.Add(time.Minute), time.Minute) || h.ViewedWithin(now.Add(61*time.Second), time.Minute) {
		t.Fatal("ViewedWithin does not follow the last view")
	}
}
