package leakcheck

import (
	"io"
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"go.uber.org/goleak"
)

func TestOptionsMatchProtoactorsDeadLetterThrottle(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}))
	pid := sys.Root.Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	if err := sys.Root.StopFuture(pid).Wait(); err != nil {
		t.Fatal(err)
	}
	sys.Root.Send(pid, "a dead letter")
	sys.Shutdown()
	// The throttle goroutine lives 1 s; goleak gives up well before, so a
	// name in Options that no longer matches protoactor-go fails here.
	if err := goleak.Find(Options()...); err != nil {
		t.Fatalf("Options no longer match protoactor-go's dead-letter throttle goroutine: %v", err)
	}
}
