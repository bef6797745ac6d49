package lease

import (
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/prometheus/client_golang/prometheus"
)

// leaseSeries counts, per metric family, the gathered series whose lease
// label is lease, and sums the renewals the renew histogram recorded.
func leaseSeries(t *testing.T, reg *prometheus.Registry, lease string) (series map[string]int, renewals uint64) {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series = map[string]int{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() != "lease" || l.GetValue() != lease {
					continue
				}
				series[f.GetName()]++
				if f.GetName() == "appview_lease_renew_duration_seconds" {
					renewals += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return series, renewals
}

// The health worker runs unleased on every instance: it has no lease to
// acquire, renew or hold, and reporting round trips and transitions for
// it would put a lease that does not exist on every dashboard.
func TestAnUnleasedLeaseActorRecordsNoLeaseMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	db := testsupport.OpenDB(t)
	h := newHarness(t)
	leased, unleased := &probe{}, &probe{}
	rl := h.start(Options{Name: "cleanup", Instance: "instance-a", Timing: quickTiming,
		Store: NewStore(db, quickTiming.TTL), Worker: leased.props, Metrics: m})
	ru := h.start(Options{Name: "health", Instance: "instance-a", Timing: quickTiming,
		Unleased: true, Worker: unleased.props, Metrics: m})
	testsupport.Eventually(t, "both workers started", func() bool { return leased.started.Load() == 1 && unleased.started.Load() == 1 })
	// A renewal is due every 20 ms for both actors: once the leased one has
	// recorded several, the unleased one has had as many chances to.
	testsupport.Eventually(t, "five renewals of the leased lease recorded", func() bool {
		_, n := leaseSeries(t, reg, "cleanup")
		return n >= 5
	})
	h.stopAndWait(ru)
	h.stopAndWait(rl)

	unleasedSeries, _ := leaseSeries(t, reg, "health")
	for name, n := range unleasedSeries {
		t.Errorf("%s has %d series for the unleased worker health", name, n)
	}
	leasedSeries, _ := leaseSeries(t, reg, "cleanup")
	for _, name := range []string{"appview_lease_held", "appview_lease_fence", "appview_lease_transitions_total",
		"appview_lease_acquire_duration_seconds", "appview_lease_renew_duration_seconds"} {
		if leasedSeries[name] == 0 {
			t.Errorf("no %s series for the leased worker: the collectors record nothing at all", name)
		}
	}
}
