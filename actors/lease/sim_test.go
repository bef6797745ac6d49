package lease

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
)

// The simulation drives several Machines (one per simulated instance)
// against one simulated database on a virtual clock, injecting store errors,
// hangs, slow successes, process pauses past the TTL, worker failures and
// shutdowns at random points. After every step it checks the custody
// invariants. A failing schedule prints its seed; LEASE_SIM_SEED=N reruns
// exactly that schedule with a trace.

const (
	simSchedules = 10000
	simHorizon   = 90 * time.Second  // traffic before everyone is asked to stop
	simDrain     = 120 * time.Second // everyone must be done by horizon + drain
	simWriteGap  = 700 * time.Millisecond
)

var simTiming = config.Timing{TTL: 15 * time.Second, RenewInterval: 5 * time.Second,
	RenewDeadline: 10 * time.Second, RetryInterval: 2 * time.Second}

type simEventKind int

const (
	evInput simEventKind = iota // deliver an Input to an instance
	evExec                      // a store call reaches the database
	evPause
	evResume
	evWrite // a running worker attempts a fenced write
)

type simEvent struct {
	at   time.Duration // global virtual time
	seq  uint64
	kind simEventKind
	inst int
	in   Input
	exec func() // evExec: apply at the database
	gen  int    // evWrite: worker generation
}

type simQueue []*simEvent

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q simQueue) Swap(i, j int)    { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)      { *q = append(*q, x.(*simEvent)) }
func (q *simQueue) Pop() any        { old := *q; e := old[len(old)-1]; *q = old[:len(old)-1]; return e }
func (q *simQueue) add(e *simEvent) { heap.Push(q, e) }

type simRow struct {
	exists   bool
	holder   string
	fence    int64
	expires  time.Duration
	acquired time.Duration
	released bool // expired in place by a release (renewed_at = expires_at)
}

type simWorker struct {
	fence    int64
	running  bool // spawned or restarted and not failed/stopped
	stopping bool // a stop completion is scheduled
	stopped  bool
}

type simInstance struct {
	name    string
	m       *Machine
	rate    float64 // local clock rate relative to the global clock
	paused  bool
	backlog []*simEvent
	wakeSeq uint64 // only the latest wake is live
	workers map[int]*simWorker
	done    bool

	// worker event bookkeeping for the exactly-once checks
	started, stopped int
	live             bool
}

type simFaults struct {
	pErr, pHang, pSlow float64
	// pLost: the call is applied in the database but its answer is lost
	// (the connection drops after the commit): an error comes back.
	pLost       float64
	pWorkerFail float64
	pauses      int
}

type sim struct {
	t              testing.TB
	seed           uint64
	rng            *rand.Rand
	now            time.Duration
	seq            uint64
	q              simQueue
	row            simRow
	insts          []*simInstance
	faults         simFaults
	trace          bool
	log            []string
	lastFence      int64
	lastWriteFence int64
	steps          int
}

func (s *sim) fail(format string, args ...any) {
	s.t.Helper()
	msg := fmt.Sprintf(format, args...)
	tail := s.log
	if len(tail) > 40 {
		tail = tail[len(tail)-40:]
	}
	s.t.Fatalf("seed %d at %v: %s\nrerun: LEASE_SIM_SEED=%d go test ./actors/lease -run TestSimulation -v\nlast events:\n%s",
		s.seed, s.now, msg, s.seed, strings.Join(tail, "\n"))
}

func (s *sim) tracef(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs ", s.now.Seconds()) + fmt.Sprintf(format, args...)
	if len(s.log) > 200 {
		s.log = s.log[100:]
	}
	s.log = append(s.log, line)
	if s.trace {
		s.t.Log(line)
	}
}

func (s *sim) schedule(at time.Duration, e *simEvent) {
	s.seq++
	e.at, e.seq = at, s.seq
	s.q.add(e)
}

func (s *sim) local(i int) time.Duration {
	return time.Duration(float64(s.now) * s.insts[i].rate)
}

func (s *sim) toGlobal(i int, local time.Duration) time.Duration {
	// Round up (plus a nanosecond) so the instance's clock has surely
	// reached local when the event fires.
	return time.Duration(math.Ceil(float64(local)/s.insts[i].rate)) + 1
}

func (s *sim) latency() time.Duration {
	return time.Duration(s.rng.Int64N(int64(20 * time.Millisecond)))
}

// storeCall schedules a call: it reaches the database after a latency, is
// applied there atomically, and its answer returns after another latency —
// unless a fault says otherwise.
func (s *sim) storeCall(i int, apply func() Input, failed func(error) Input) {
	r := s.rng.Float64()
	switch {
	case r < s.faults.pErr:
		s.schedule(s.now+s.latency(), &simEvent{kind: evInput, inst: i, in: failed(errors.New("injected: database error"))})
	case r < s.faults.pErr+s.faults.pLost:
		s.schedule(s.now+s.latency(), &simEvent{kind: evExec, exec: func() {
			apply()
			s.schedule(s.now+s.latency(), &simEvent{kind: evInput, inst: i, in: failed(errors.New("injected: answer lost after commit"))})
		}})
		return
	case r < s.faults.pErr+s.faults.pLost+s.faults.pHang:
		// Hung: the call may still reach the database much later.
		if s.rng.IntN(2) == 0 {
			late := s.now + time.Duration(5+s.rng.IntN(40))*time.Second
			s.schedule(late, &simEvent{kind: evExec, exec: func() {
				in := apply()
				s.schedule(s.now+s.latency(), &simEvent{kind: evInput, inst: i, in: in})
			}})
		}
	default:
		back := s.latency()
		if r < s.faults.pErr+s.faults.pLost+s.faults.pHang+s.faults.pSlow {
			back = time.Duration(s.rng.Int64N(int64(9 * time.Second)))
		}
		s.schedule(s.now+s.latency(), &simEvent{kind: evExec, exec: func() {
			in := apply()
			s.schedule(s.now+back, &simEvent{kind: evInput, inst: i, in: in})
		}})
	}
}

func (s *sim) acquire(holder string) Grant {
	if !s.row.exists || s.row.expires <= s.now {
		fence := s.row.fence + 1
		if fence != s.lastFence+1 {
			s.fail("grant fence %d does not follow %d", fence, s.lastFence)
		}
		s.lastFence = fence
		s.row = simRow{exists: true, holder: holder, fence: fence, expires: s.now + simTiming.TTL, acquired: s.now}
		s.tracef("db: grant %s fence %d", holder, fence)
		return Grant{Granted: true, Fence: fence}
	}
	// Each simulated instance is one process start: its own grants are
	// the ones under its holder.
	return Grant{Holder: s.row.holder, Fence: s.row.fence, TimeLeft: s.row.expires - s.now,
		Own: s.row.holder == holder}
}

func (s *sim) matches(c fence.Custody) bool {
	return s.row.exists && s.row.holder == c.Holder && s.row.fence == c.Fence
}

func (s *sim) execute(i int, cmds []Command) {
	in := s.insts[i]
	for _, c := range cmds {
		switch c := c.(type) {
		case AcquireCmd:
			seq := c.Seq
			s.storeCall(i, func() Input { return AcquireResult{Seq: seq, Grant: s.acquire(in.name)} },
				func(err error) Input { return AcquireResult{Seq: seq, Err: err} })
		case RenewCmd:
			seq, cust := c.Seq, c.Custody
			s.storeCall(i, func() Input {
				if !s.matches(cust) || s.row.released {
					return RenewResult{Seq: seq, Err: fence.ErrSuperseded}
				}
				s.row.expires = s.now + simTiming.TTL
				return RenewResult{Seq: seq}
			}, func(err error) Input { return RenewResult{Seq: seq, Err: err} })
		case ReleaseCmd:
			seq, cust := c.Seq, c.Custody
			s.storeCall(i, func() Input {
				if !s.matches(cust) {
					return ReleaseResult{Seq: seq, Err: fence.ErrSuperseded}
				}
				s.row.expires = min(s.row.expires, s.now)
				s.row.released = true
				s.tracef("db: released by %s fence %d", cust.Holder, cust.Fence)
				for j := range s.insts {
					if j != i {
						s.schedule(s.now+s.latency(), &simEvent{kind: evInput, inst: j, in: Nudge{}})
					}
				}
				return ReleaseResult{Seq: seq}
			}, func(err error) Input { return ReleaseResult{Seq: seq, Err: err} })
		case SpawnWorkerCmd:
			if _, dup := in.workers[c.Gen]; dup {
				s.fail("%s spawned worker gen %d twice", in.name, c.Gen)
			}
			in.workers[c.Gen] = &simWorker{running: true, fence: c.Custody.Fence}
			s.workerLife(i, c.Gen)
		case RestartWorkerCmd:
			w := in.workers[c.Gen]
			if w == nil || w.running || w.stopped {
				s.fail("%s restarted worker gen %d in state %+v", in.name, c.Gen, w)
			}
			w.running = true
			s.workerLife(i, c.Gen)
		case StopWorkerCmd:
			w := in.workers[c.Gen]
			if w == nil {
				s.fail("%s stopped unknown worker gen %d", in.name, c.Gen)
			}
			// Stopping a stopped actor is a no-op (a dead letter), which is
			// what happens when the stop and its answer cross.
			if !w.stopping && !w.stopped {
				w.stopping = true
				d := time.Duration(s.rng.Int64N(int64(300 * time.Millisecond)))
				if c.Graceful {
					d += time.Duration(s.rng.Int64N(int64(time.Second)))
				}
				gen := c.Gen
				s.schedule(s.now+d, &simEvent{kind: evInput, inst: i, in: WorkerTerminated{Gen: gen}})
			}
		case EmitCmd:
			s.onEmit(i, c.Event)
		case WakeCmd:
			in.wakeSeq++
			if c.At != NoWake {
				at := max(s.toGlobal(i, c.At), s.now)
				s.schedule(at, &simEvent{kind: evInput, inst: i, in: Tick{}, gen: int(in.wakeSeq)})
			}
		case FinishedCmd:
			in.done = true
		}
	}
}

// workerLife schedules a running worker's writes and maybe its failure.
func (s *sim) workerLife(i, gen int) {
	s.schedule(s.now+time.Duration(s.rng.Int64N(int64(simWriteGap))), &simEvent{kind: evWrite, inst: i, gen: gen})
	if s.rng.Float64() < s.faults.pWorkerFail {
		at := s.now + time.Duration(s.rng.Int64N(int64(20*time.Second)))
		s.schedule(at, &simEvent{kind: evInput, inst: i, in: WorkerPanicked{Gen: gen, Reason: errors.New("injected panic")}})
	}
}

func (s *sim) onEmit(i int, e Event) {
	in := s.insts[i]
	s.tracef("%s: %s fence=%d reason=%s err=%v", in.name, e.Kind, e.Fence, e.Reason, e.Err)
	switch e.Kind {
	case WorkerStarted:
		if in.live {
			s.fail("%s: worker.started while a worker is live", in.name)
		}
		in.live = true
		in.started++
	case WorkerStopped:
		if !in.live {
			s.fail("%s: worker.stopped without a live worker", in.name)
		}
		in.live = false
		in.stopped++
	case WorkerRestarted:
		if !in.live {
			s.fail("%s: worker.restarted without a live worker", in.name)
		}
	}
}

// write is a running worker's fenced write: accepted only under the
// current, unexpired custody; a rejection fails the worker with
// ErrSuperseded, as the real fenced write does.
func (s *sim) write(i, gen int) {
	in := s.insts[i]
	w := in.workers[gen]
	if w == nil || !w.running || w.stopped {
		return
	}
	f := w.fence
	if s.row.exists && s.row.holder == in.name && s.row.fence == f && s.row.expires > s.now {
		if f < s.lastWriteFence {
			s.fail("write under fence %d landed after a write under fence %d", f, s.lastWriteFence)
		}
		s.lastWriteFence = f
	} else {
		s.schedule(s.now, &simEvent{kind: evInput, inst: i, in: WorkerPanicked{Gen: gen, Reason: fmt.Errorf("fenced write: %w", fence.ErrSuperseded)}})
		return
	}
	s.schedule(s.now+simWriteGap, &simEvent{kind: evWrite, inst: i, gen: gen})
}

func (s *sim) deliver(e *simEvent) {
	in := s.insts[e.inst]
	if in.done {
		return
	}
	if in.paused {
		in.backlog = append(in.backlog, e)
		return
	}
	switch e.kind {
	case evWrite:
		s.write(e.inst, e.gen)
		return
	case evInput:
	default:
		return
	}
	if _, tick := e.in.(Tick); tick && uint64(e.gen) != in.wakeSeq {
		return // superseded wake-up
	}
	switch x := e.in.(type) {
	case WorkerTerminated:
		w := in.workers[x.Gen]
		w.stopped, w.running = true, false
	case WorkerPanicked:
		w := in.workers[x.Gen]
		if w == nil || w.stopped || !w.running {
			return // a suspended or stopped actor cannot fail again
		}
		w.running = false
	}
	s.steps++
	if s.steps > 100000 {
		s.fail("livelock: more than 100000 steps: %s phase %s input %T commands %+v", in.name, in.m.Phase(), e.in, in.m.Step(s.local(e.inst), e.in))
	}
	cmds := in.m.Step(s.local(e.inst), e.in)
	if s.trace {
		s.tracef("%s <- %T%+v -> %+v", in.name, e.in, e.in, cmds)
	}
	s.execute(e.inst, cmds)
	for j, other := range s.insts {
		if !other.paused {
			s.check(j)
		}
	}
}

// check is the safety invariant: a machine that treats its worker as
// active holds, at this instant, the lease in the database.
func (s *sim) check(i int) {
	in := s.insts[i]
	if !in.m.WorkerActive() {
		return
	}
	c := in.m.Custody()
	if !s.row.exists || s.row.holder != in.name || s.row.fence != c.Fence || s.row.expires <= s.now {
		s.fail("%s treats fence %d as active but the database says holder=%s fence=%d expires=%v",
			in.name, c.Fence, s.row.holder, s.row.fence, s.row.expires)
	}
	// Stronger: the local trust window never outlives the grant on the
	// database's clock, whatever the timing of the answers.
	if until := s.toGlobal(i, in.m.TrustedUntil()); until > s.row.expires {
		s.fail("%s trusts fence %d until %v but the database grant ends at %v", in.name, c.Fence, until, s.row.expires)
	}
	for j, other := range s.insts {
		if j != i && !other.paused && other.m.WorkerActive() {
			s.fail("%s and %s both treat the lease's worker as active", in.name, other.name)
		}
	}
}

func runSim(t testing.TB, seed uint64, trace bool) {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &sim{t: t, seed: seed, rng: rng, trace: trace}
	// A third of the schedules are calm, a third rough, a third stormy.
	storm := float64(1 + rng.IntN(3))
	s.faults = simFaults{
		pErr:        rng.Float64() * 0.1 * storm,
		pHang:       rng.Float64() * 0.05 * storm,
		pSlow:       rng.Float64() * 0.15 * storm,
		pLost:       rng.Float64() * 0.05 * storm,
		pWorkerFail: rng.Float64() * 0.5,
		pauses:      rng.IntN(3),
	}
	n := 2 + rng.IntN(2)
	for i := range n {
		name := fmt.Sprintf("inst-%d", i)
		s.insts = append(s.insts, &simInstance{
			name:    name,
			m:       NewMachine("test", name, simTiming, rand.New(rand.NewPCG(seed, uint64(i))), 0),
			rate:    0.999 + 0.002*rng.Float64(),
			workers: map[int]*simWorker{},
		})
		s.schedule(time.Duration(rng.Int64N(int64(3*time.Second))), &simEvent{kind: evInput, inst: i, in: Start{}})
	}
	for range s.faults.pauses {
		i := rng.IntN(n)
		at := time.Duration(rng.Int64N(int64(simHorizon)))
		s.schedule(at, &simEvent{kind: evPause, inst: i})
		s.schedule(at+time.Duration(1+rng.IntN(30))*time.Second, &simEvent{kind: evResume, inst: i})
	}
	// Some instances stop early (a rolling restart); the rest at the horizon.
	for i := range n {
		at := simHorizon
		if rng.IntN(3) == 0 {
			at = time.Duration(rng.Int64N(int64(simHorizon)))
		}
		s.schedule(at, &simEvent{kind: evInput, inst: i, in: StopRequested{}})
	}
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(*simEvent)
		s.now = e.at
		if s.now > simHorizon+simDrain {
			break
		}
		switch e.kind {
		case evExec:
			e.exec()
			for j, other := range s.insts {
				if !other.paused {
					s.check(j)
				}
			}
		case evPause:
			s.insts[e.inst].paused = true
			s.tracef("%s: paused", s.insts[e.inst].name)
		case evResume:
			in := s.insts[e.inst]
			if !in.paused {
				continue
			}
			in.paused = false
			s.tracef("%s: resumed with %d queued", in.name, len(in.backlog))
			backlog := in.backlog
			in.backlog = nil
			for _, b := range backlog {
				s.deliver(b)
			}
		default:
			s.deliver(e)
		}
	}
	for _, in := range s.insts {
		if in.paused {
			continue
		}
		if !in.done {
			s.fail("%s not done %v after stop (phase %s)", in.name, simDrain, in.m.Phase())
		}
		if in.live || in.started != in.stopped {
			s.fail("%s: %d workers started, %d stopped", in.name, in.started, in.stopped)
		}
		for gen, w := range in.workers {
			if !w.stopped {
				s.fail("%s: worker gen %d never stopped", in.name, gen)
			}
		}
	}
}

func TestSimulationKeepsCustodyExclusiveUnderFaults(t *testing.T) {
	if v := os.Getenv("LEASE_SIM_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		runSim(t, seed, true)
		return
	}
	start := time.Now()
	for seed := uint64(1); seed <= simSchedules; seed++ {
		runSim(t, seed, false)
		if t.Failed() {
			return
		}
	}
	t.Logf("%d schedules in %v", simSchedules, time.Since(start))
}
