package harness

import (
	"fmt"
	"sort"
)

// CheckExclusive reads a timeline (see Merge) and returns an error at the
// first moment two instances ran the worker of one leased worker at once:
// a worker.started for a lease while another instance's worker for it had
// started and neither logged worker.stopped nor exited since. It also
// refuses a second worker.started on one instance without a stop between.
// leased names the leases to check; the health checker and other unleased
// workers are not leases and are left out.
func CheckExclusive(timeline []Event, leased ...string) error {
	check := map[string]bool{}
	for _, l := range leased {
		check[l] = true
	}
	// running[lease][instance] is the worker.started event still in force.
	running := map[string]map[string]Event{}
	for _, e := range timeline {
		switch {
		case e.Event == ProcessExited:
			for _, byInst := range running {
				delete(byInst, e.Instance)
			}
		case !check[e.Lease]:
		case e.Event == WorkerStarted:
			byInst := running[e.Lease]
			if byInst == nil {
				byInst = map[string]Event{}
				running[e.Lease] = byInst
			}
			for inst, prev := range byInst {
				if inst == e.Instance {
					return fmt.Errorf("lease %s: %s started a second worker without stopping the first:\n  %s\n  %s", e.Lease, inst, prev, e)
				}
				return fmt.Errorf("lease %s: two instances run its worker at once:\n  %s\n  %s", e.Lease, prev, e)
			}
			byInst[e.Instance] = e
		case e.Event == WorkerStopped:
			delete(running[e.Lease], e.Instance)
		}
	}
	return nil
}

// Grant is one lease.acquired of a timeline.
type Grant struct {
	Lease, Instance string
	Fence           int64
	Event           Event
}

// Grants lists the lease.acquired events of a timeline, per lease, in order.
func Grants(timeline []Event) map[string][]Grant {
	out := map[string][]Grant{}
	for _, e := range timeline {
		if e.Event == LeaseAcquired {
			out[e.Lease] = append(out[e.Lease], Grant{Lease: e.Lease, Instance: e.Instance, Fence: e.Fence, Event: e})
		}
	}
	return out
}

// CheckFences reads a timeline and returns an error unless, for every
// lease, each grant's fence is exactly one more than the previous grant's
// (docs/spec.md §4: +1 on every change of custody, never on renewal), every
// worker.started carries the fence of its instance's latest grant, and no
// fence was granted twice. first is the fence the first grant of each
// lease must have (the row may predate the timeline); a lease missing from
// it is not checked at its start.
func CheckFences(timeline []Event, first map[string]int64) error {
	grants := Grants(timeline)
	names := make([]string, 0, len(grants))
	for n := range grants {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		gs := grants[name]
		if want, ok := first[name]; ok && gs[0].Fence != want {
			return fmt.Errorf("lease %s: first grant has fence %d, want %d: %s", name, gs[0].Fence, want, gs[0].Event)
		}
		for k := 1; k < len(gs); k++ {
			if gs[k].Fence != gs[k-1].Fence+1 {
				return fmt.Errorf("lease %s: grant with fence %d follows fence %d:\n  %s\n  %s",
					name, gs[k].Fence, gs[k-1].Fence, gs[k-1].Event, gs[k].Event)
			}
		}
	}
	latest := map[[2]string]int64{}
	for _, e := range timeline {
		key := [2]string{e.Lease, e.Instance}
		switch e.Event {
		case LeaseAcquired:
			latest[key] = e.Fence
		case WorkerStarted:
			if e.Fence == 0 {
				continue // unleased
			}
			if latest[key] != e.Fence {
				return fmt.Errorf("lease %s: worker started under fence %d but %s's latest grant is %d: %s",
					e.Lease, e.Fence, e.Instance, latest[key], e)
			}
		}
	}
	return nil
}

// Holding returns the leases an instance's log says it holds now: the
// fence of each lease.acquired not yet followed by lease.released or
// lease.lost.
func Holding(log []Event) map[string]int64 {
	held := map[string]int64{}
	for _, e := range log {
		switch e.Event {
		case LeaseAcquired:
			held[e.Lease] = e.Fence
		case LeaseReleased, LeaseLost:
			delete(held, e.Lease)
		}
	}
	return held
}
