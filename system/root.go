package system

import (
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/lease"
)

// shutdown asks the root to stop every worker gracefully and then itself.
type shutdown struct{}

// childSpec is one child of the root: a LeaseActor (or an unleased one)
// per registered worker.
type childSpec struct {
	name  string
	props *actor.Props
}

// rootActor owns every worker's LeaseActor. On shutdown it asks each to
// stop gracefully (stop the worker, release the lease) and stops itself
// once all of them have stopped, so waiting for the root waits for every
// release to land.
type rootActor struct {
	specs    []childSpec
	children map[string]*actor.PID
	stopping bool
	log      zerolog.Logger
}

// leaseActorRestarts bounds how often a LeaseActor that itself panics (a
// bug, not a worker failure) is restarted before the root stops it.
const (
	leaseActorRestarts = 10
	leaseActorWindow   = time.Minute
)

func rootProps(specs []childSpec, log zerolog.Logger) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &rootActor{specs: specs, log: log}
	}, actor.WithSupervisor(actor.NewOneForOneStrategy(leaseActorRestarts, leaseActorWindow, actor.DefaultDecider)))
}

func (r *rootActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		r.children = map[string]*actor.PID{}
		for _, s := range r.specs {
			pid, err := ctx.SpawnNamed(s.props, s.name)
			if err != nil {
				r.log.Error().Err(err).Str("worker", s.name).Msg("could not spawn lease actor")
				continue
			}
			r.children[pid.Id] = pid
		}
	case *shutdown:
		if r.stopping {
			return
		}
		r.stopping = true
		for _, pid := range r.children {
			ctx.Send(pid, &lease.StopRequested{})
		}
		r.maybeDone(ctx)
	case *actor.Terminated:
		delete(r.children, msg.Who.Id)
		if !r.stopping {
			r.log.Error().Str("actor", msg.Who.Id).Msg("a lease actor stopped while the instance is running")
		}
		r.maybeDone(ctx)
	case *actor.Stopping, *actor.Stopped, *actor.Restarting:
	default:
		r.log.Warn().Str("message_type", fmt.Sprintf("%T", msg)).Msg("unexpected message ignored")
	}
}

func (r *rootActor) maybeDone(ctx actor.Context) {
	if r.stopping && len(r.children) == 0 {
		ctx.Stop(ctx.Self())
	}
}
