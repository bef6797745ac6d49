// This file is the StatsCache's protocol: the messages its one
// writer (the Jetstream consumer, under its custody) and its readers send
// it, and the shape of one repository's view. It lives below actors/ so
// the consumer can talk to the StatsCache without importing the worker
// package that implements it (actors/statscache): the registration hands
// the consumer a Props builder, and the two meet only here.

package processor

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/fence"
)

// StatsProps builds the StatsCache actor for one grant of custody c: the
// consumer spawns it as its child and sends it Observe under c. Built by
// statscache.New at registration.
type StatsProps func(c fence.Custody) *actor.Props

// ObserveStats tells the cache about per-hold stats rows a committed batch
// changed (Result.HoldStats). The reply, when the message is
// sent with Request, is *Observed, or *StaleCustodyError when Custody is
// not the cache's: the cache accepts writes only under its own fence.
type ObserveStats struct {
	Custody fence.Custody
	Stats   []HoldStat
}

// StatsObserved is the reply to Observe.
type StatsObserved struct {
	// Applied counts stats that changed the view; Ignored those older than
	// what it holds (by updatedAt).
	Applied, Ignored int
}

// GetStats asks for one repository's view; the reply is a *Snapshot.
type GetStats struct {
	OwnerDID, Repository string
}

// StatsSnapshot is one repository as the cache holds it.
type StatsSnapshot struct {
	OwnerDID, Repository string
	// Holds are the per-hold stats, sorted by HoldDID.
	Holds []HoldStat
	// PullCount and PushCount are sums over Holds, capped at
	// MaxSafeInteger like repository_stats; LastPull and LastPush
	// the latest over Holds (Unix ms, nil when no hold has one).
	PullCount, PushCount int64
	LastPull, LastPush   *int64
	// Custody is the grant the cache holds its view under (the consumer's).
	Custody fence.Custody
}

// StaleCustodyError is the reply to a message produced under a custody
// other than the cache's (a superseded holder, or a message from before a
// restart).
type StaleCustodyError struct {
	Have, Got fence.Custody
}

func (e *StaleCustodyError) Error() string {
	return fmt.Sprintf("statscache: message under %s rejected, cache holds %s", e.Got, e.Have)
}
