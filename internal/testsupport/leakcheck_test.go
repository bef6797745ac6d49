package testsupport_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/atcr-io/appview/internal/testsupport"
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
	if err := goleak.Find(testsupport.LeakOptions()...); err != nil {
		t.Fatalf("Options no longer match protoactor-go's dead-letter throttle goroutine: %v", err)
	}
}

// leakedUntil blocks until release is closed: a goroutine that shows in
// goleak's report under this name.
func leakedUntil(release <-chan struct{}) { <-release }

func TestFindWaitsForAGoroutineOnItsWayOutAndReportsOneThatStays(t *testing.T) {
	before := goleak.IgnoreCurrent()
	// Ends 1 s from now: later than goleak's own retries (about 0.4 s),
	// well within Settle.
	release := make(chan struct{})
	go leakedUntil(release)
	timer := time.AfterFunc(time.Second, func() { close(release) })
	defer timer.Stop()
	if err := testsupport.FindLeaks(before); err != nil {
		t.Fatalf("a goroutine that ended after 1 s was reported: %v", err)
	}
	stay := make(chan struct{})
	defer close(stay)
	go leakedUntil(stay)
	err := testsupport.FindLeaks(before)
	if err == nil || !strings.Contains(err.Error(), "leakedUntil") {
		t.Fatalf("a goroutine left running was not reported: %v", err)
	}
}
