package harness

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// closeGrace is how long Close lets a process stop on SIGTERM before it
// is killed.
const closeGrace = 15 * time.Second

// Cluster is every instance started for one scenario, sharing one binary
// and one scratch directory.
type Cluster struct {
	// Bin is the appview binary.
	Bin string
	// Dir is the scratch directory; each instance gets Dir/<ID>.
	Dir string

	mu        sync.Mutex
	instances []*Instance
}

// NewCluster returns an empty cluster.
func NewCluster(bin, dir string) *Cluster { return &Cluster{Bin: bin, Dir: dir} }

// Start starts an instance (see StartInstance) and waits until it is ready.
func (c *Cluster) Start(ctx context.Context, s Spec) (*Instance, error) {
	i, err := StartInstance(c.Bin, c.Dir, s)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.instances = append(c.instances, i)
	c.mu.Unlock()
	if _, err := i.Ready(ctx); err != nil {
		return i, err
	}
	return i, nil
}

// Instances returns every instance started, in start order.
func (c *Cluster) Instances() []*Instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Instance(nil), c.instances...)
}

// Running returns the instances whose process has not exited.
func (c *Cluster) Running() []*Instance {
	var out []*Instance
	for _, i := range c.Instances() {
		if i.Running() {
			out = append(out, i)
		}
	}
	return out
}

// Timeline merges every instance's events, plus one ProcessExited event
// per exited process, in time order (see Merge).
func (c *Cluster) Timeline() []Event {
	var logs [][]Event
	for _, i := range c.Instances() {
		evs := i.Log.Events()
		if at := i.ExitedAt(); !at.IsZero() {
			evs = append(evs, Event{Time: at, Seq: len(evs), Event: ProcessExited, Instance: i.ID,
				Reason: i.cmd.ProcessState.String()})
		}
		logs = append(logs, evs)
	}
	return Merge(logs...)
}

// causalRank orders the events of one millisecond from different
// processes: custody ends before custody begins, since the lease protocol
// only lets a grant follow the end of the previous one.
func causalRank(kind string) int {
	switch kind {
	case WorkerStopped, WorkerFailed, ProcessExited:
		return 0
	case LeaseReleased, LeaseLost:
		return 1
	case LeaseAcquired:
		return 3
	case WorkerStarted, WorkerRestarted:
		return 4
	}
	return 2
}

// Merge merges per-process logs into one timeline ordered by Time.
// Custody events are stamped when custody changed (see Event.Time), so
// their order across processes is the order of the changes; other lines
// carry the time they were written and fall where that puts them. Events
// with equal times are ordered causally (custody ends before custody
// begins), then by their position in their own log.
func Merge(logs ...[]Event) []Event {
	var out []Event
	for _, l := range logs {
		out = append(out, l...)
	}
	slices.SortStableFunc(out, func(a, b Event) int {
		if c := a.Time.Compare(b.Time); c != 0 {
			return c
		}
		if c := causalRank(a.Event) - causalRank(b.Event); c != 0 {
			return c
		}
		return a.Seq - b.Seq
	})
	return out
}

// Close stops every running instance: SIGTERM (and SIGCONT, in case it
// was stopped), then SIGKILL after a grace period.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for _, i := range c.Running() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = i.Signal(syscall.SIGCONT)
			_ = i.Signal(syscall.SIGTERM)
			ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
			defer cancel()
			if _, err := i.ExitCode(ctx); err != nil {
				i.Kill()
			}
		}()
	}
	wg.Wait()
}

// Dump renders the last n lines of every instance's log, for a failing
// test's output.
func (c *Cluster) Dump(n int) string {
	var b strings.Builder
	for _, i := range c.Instances() {
		fmt.Fprintf(&b, "--- %s (%s) last %d lines:\n%s\n", i.ID, i.Dir, n, i.Tail(n))
	}
	return b.String()
}

// Races returns the data race reports and panics found in any instance's
// stderr (lines that are not JSON), for binaries built with -race.
func (c *Cluster) Races() []string {
	var out []string
	for _, i := range c.Instances() {
		for _, l := range i.Log.Other() {
			if strings.Contains(l, "DATA RACE") || strings.HasPrefix(l, "panic:") || strings.HasPrefix(l, "fatal error:") {
				out = append(out, i.ID+": "+l)
			}
		}
	}
	return out
}

// StartAll starts every spec at once (so they race for the leases) and
// waits until all are ready.
func (c *Cluster) StartAll(ctx context.Context, specs ...Spec) ([]*Instance, error) {
	var out []*Instance
	for _, s := range specs {
		i, err := StartInstance(c.Bin, c.Dir, s)
		if err != nil {
			return out, err
		}
		c.mu.Lock()
		c.instances = append(c.instances, i)
		c.mu.Unlock()
		out = append(out, i)
	}
	for _, i := range out {
		if _, err := i.Ready(ctx); err != nil {
			return out, err
		}
	}
	return out, nil
}

// WaitAny returns the first event that m matches in any of the instances'
// logs (each from its start), and the instance that logged it. An instance
// whose log ends without a match is no longer waited on; when all have
// ended it returns ErrLogClosed.
func WaitAny(ctx context.Context, m Match, instances ...*Instance) (*Instance, Event, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type hit struct {
		i   *Instance
		e   Event
		err error
	}
	hits := make(chan hit, len(instances))
	for _, i := range instances {
		go func() {
			e, err := i.Log.Wait(ctx, m)
			hits <- hit{i, e, err}
		}()
	}
	var last error = ErrLogClosed
	for range instances {
		h := <-hits
		if h.err == nil {
			return h.i, h.e, nil
		}
		if ctx.Err() != nil {
			return nil, Event{}, ctx.Err()
		}
		last = h.err
	}
	return nil, Event{}, last
}

// Adopt adds a process started with StartCommand (a replay server, say)
// so that Close stops it and Races reads its stderr.
func (c *Cluster) Adopt(i *Instance) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.instances = append(c.instances, i)
}
