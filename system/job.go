package system

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cenkalti/backoff/v5"
	"github.com/rs/zerolog"
)

// jobRetryMax caps the retry backoff of a once-only job (Interval 0) that failed.
const jobRetryMax = time.Minute

// jobStopTimeout bounds how long a stopping worker waits for its job to
// return. A job stuck in a call that ignores its context (go-libsql
// ignores contexts; a partitioned database can hang a call for minutes)
// is abandoned after it: its context is cancelled, so fence.Fenced rolls
// back whatever it would still write, and custody can move on.
const jobStopTimeout = 5 * time.Second

// jobPanicked carries a panic out of the job goroutine to the actor, which
// re-raises it so supervision sees a worker failure.
type jobPanicked struct{ value any }

// jobActor runs a Job every Interval (or once, then idles) in its own
// goroutine, cancels it when the actor stops and returns from Stopping
// once the job has returned (or, stuck past jobStopTimeout, has been
// abandoned with its context cancelled, so its fenced writes cannot land).
type jobActor struct {
	w       workers.Spec
	custody fence.Custody
	log     zerolog.Logger
	cancel  context.CancelCauseFunc
	done    chan struct{}
}

func jobProps(w workers.Spec, c fence.Custody, log zerolog.Logger) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &jobActor{w: w, custody: c, log: log.With().Str("worker", w.Name).Logger()}
	})
}

func (j *jobActor) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		run, cancel := context.WithCancelCause(context.Background())
		j.cancel, j.done = cancel, make(chan struct{})
		sys, self := ctx.ActorSystem(), ctx.Self()
		go j.loop(run, func(v any) { sys.Root.Send(self, &jobPanicked{value: v}) })
	case *workers.Drain:
		// Poison follows at once; cancelling here is what tells the job
		// (through the cause) that the stop is graceful.
		if j.cancel != nil {
			j.cancel(workers.ErrDrain)
		}
	case *jobPanicked:
		panic(msg.value)
	case *actor.Stopping, *actor.Restarting:
		j.halt()
	case *actor.Stopped:
	default:
		j.log.Warn().Str("message_type", fmt.Sprintf("%T", msg)).Msg("unexpected message ignored")
	}
}

func (j *jobActor) halt() {
	if j.cancel == nil {
		return
	}
	j.cancel(nil) // a no-op after Drain: the cause stays workers.ErrDrain
	t := time.NewTimer(jobStopTimeout)
	defer t.Stop()
	select {
	case <-j.done:
	case <-t.C:
		j.log.Warn().Str("waited", jobStopTimeout.String()).
			Msg("job did not return after its context was cancelled; abandoning it (its writes are fenced and cancelled)")
	}
	j.cancel = nil
}

func (j *jobActor) loop(ctx context.Context, panicked func(any)) {
	defer close(j.done)
	retry := backoff.NewExponentialBackOff()
	retry.MaxInterval = jobRetryMax
	for {
		start := time.Now()
		err := j.runOnce(ctx)
		var p *panicErr
		switch {
		case errors.As(err, &p):
			panicked(p.value)
			return
		case ctx.Err() != nil:
			return
		case errors.Is(err, fence.ErrSuperseded):
			// Custody has moved on: fail the worker; the directive is Stop.
			panicked(err)
			return
		}
		var wait time.Duration
		switch {
		case err != nil && j.w.Interval == 0:
			wait = retry.NextBackOff()
			j.log.Warn().Err(logval.Error(err)).Dur("retry_in", wait).Msg("job failed; retrying")
		case err != nil:
			j.log.Warn().Err(logval.Error(err)).Msg("job failed; next run at the next interval")
			wait = j.w.Interval - time.Since(start)
		case j.w.Interval == 0:
			<-ctx.Done() // done once: hold custody idle until it ends
			return
		default:
			wait = j.w.Interval - time.Since(start)
		}
		t := time.NewTimer(max(wait, 0))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

type panicErr struct{ value any }

func (p *panicErr) Error() string { return fmt.Sprintf("job panicked: %v", p.value) }

func (j *jobActor) runOnce(ctx context.Context) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &panicErr{value: v}
		}
	}()
	return j.w.Job(ctx, j.custody)
}
