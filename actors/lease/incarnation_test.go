package lease

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"
)

// A LeaseActor that fails itself (here: a worker constructor that panics
// once) is restarted by its parent. Its new incarnation must hand back the
// grant the old one held, not contend against it until the TTL runs out.
func TestARestartedLeaseActorHandsItsPreviousGrantBackAtOnce(t *testing.T) {
	h := newHarness(t)
	db := testsupport.OpenDB(t)
	const ttl = 30 * time.Second // far beyond waitFor: only the hand-back can make this pass
	p := &probe{}
	var built atomic.Int32
	es := h.sys.EventStream
	props, err := NewProps(Options{
		Name: "incarnation", Instance: "a",
		Timing: config.Timing{TTL: ttl, RenewInterval: 100 * time.Millisecond, RenewDeadline: time.Second, RetryInterval: 10 * time.Second},
		Store:  NewStore(db, ttl),
		Worker: func(c fence.Custody) *actor.Props {
			if built.Add(1) == 1 {
				panic("worker constructor bug")
			}
			return p.props(c)
		},
		Publish: func(e Event) { es.Publish(e) },
	})
	if err != nil {
		t.Fatal(err)
	}
	pids := make(chan *actor.PID, 1)
	done := make(chan struct{})
	h.sys.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch c.Message().(type) {
		case *actor.Started:
			pids <- c.Spawn(props)
		case *actor.Terminated:
			close(done)
			c.Stop(c.Self())
		}
	}, actor.WithSupervisor(actor.NewOneForOneStrategy(3, time.Minute, actor.DefaultDecider))))
	pid := <-pids

	_, i := h.events.wait(t, 0, "the old incarnation's grant handed back", func(e Event) bool {
		return e.Kind == LeaseReleased && e.Reason == ReasonStaleGrant && e.Fence == 1
	})
	h.events.wait(t, i, "a fresh grant to the new incarnation", func(e Event) bool {
		return e.Kind == LeaseAcquired && e.Instance == "a" && e.Fence == 2
	})
	h.events.wait(t, i, "its worker", isFor(WorkerStarted, "a", "incarnation"))

	h.sys.Root.Send(pid, &StopRequested{})
	select {
	case <-done:
	case <-time.After(waitFor):
		t.Fatal("lease actor did not stop")
	}
	if r := readRow(t, db, "incarnation"); r.State() != fence.StateReleased || r.Fence != 2 {
		t.Fatalf("row after stop: %+v (%s), want fence 2 released", r, r.State())
	}
}
