//go:build interop

package interop

import (
	"flag"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// Every scenario has its own simulator, Jetstreams, ports (freeAddr),
// temporary directory and databases, and stops every process it started
// when it ends, so the scenarios run beside each other: at most
// -interop.parallel at once, the longest first (longestFirst), so that no
// long one is left to run alone at the end.
//
// Go releases the parallel tests together but hands out its own slots
// (-test.parallel) in no particular order, so the order is kept here:
// scripts/interop runs with -test.parallel at least the number of
// scenarios, and each waits in parallel() for its turn. With a smaller
// -test.parallel (plain `go test`), Go's own limit applies and the
// scenarios take their turns in whatever order they reach parallel().
var interopParallel = flag.Int("interop.parallel", 4, "scenarios run at once, the longest first")

// longestFirst: the scenarios by run time on 2 shared cores, longest
// first. One not named here takes its turn after them.
var longestFirst = []string{
	"TestKillAndRestartAtRandomPointsNeitherRegressesNorSkips",
	"TestBothWiresConsumeTheStreamAndThePositionTracksJetstreamsSeq",
	"TestAThawedFirstJetstreamIsSwitchedBackTo",
	"TestAnUnhealthyHolderYieldsToAHealthyContender",
	"TestASilentJetstreamIsLeftWithinTwiceTheStaleTimeout",
	"TestCursorTooOldIsLoggedRecordedAndResumedFromTheFloor",
	"TestAHolderKilledBeforeItsFirstCommitHandsOnWhereItBegan",
	"TestFailoverToASecondJetstreamResumesByTimeWithoutAGap",
	"TestOutdatedTimeCursorIsLoggedRecordedAndResumed",
}

// turns hands out the turns of parallel().
var turns struct {
	sync.Mutex
	cond *sync.Cond
	// registered counts the scenarios that called parallel(), arrived
	// those among them that Go has released (t.Parallel returned).
	registered, arrived int
	running             int
	waiting             []string // names, in arrival order
}

// parallel marks t as a scenario that runs beside the others
// (t.Parallel) and returns once it has its turn; the turn ends when t
// has ended and its cleanups (which stop its processes) have run. It
// logs the scenario's own run time, without the wait for its turn, which
// Go's "--- PASS" time includes.
func parallel(t *testing.T) {
	turns.Lock()
	if turns.cond == nil {
		turns.cond = sync.NewCond(&turns.Mutex)
	}
	turns.registered++
	turns.Unlock()
	// Returns once every top-level test has run up to its own
	// t.Parallel: registered is complete from here on.
	t.Parallel()
	goSlots := flag.Lookup("test.parallel").Value.(flag.Getter).Get().(int)
	rank := func(name string) int {
		if i := slices.Index(longestFirst, name); i >= 0 {
			return i
		}
		return len(longestFirst)
	}
	arrived := time.Now()
	turns.Lock()
	turns.arrived++
	turns.waiting = append(turns.waiting, t.Name())
	turns.cond.Broadcast()
	for {
		// Released together, the scenarios arrive within microseconds of
		// each other: the turns are handed out once all are here (or at
		// once when Go holds some back, see interopParallel).
		all := turns.arrived >= turns.registered || goSlots < turns.registered
		next := slices.MinFunc(turns.waiting, func(a, b string) int { return rank(a) - rank(b) })
		if all && turns.running < *interopParallel && next == t.Name() {
			break
		}
		turns.cond.Wait()
	}
	i := slices.Index(turns.waiting, t.Name())
	turns.waiting = slices.Delete(turns.waiting, i, i+1)
	turns.running++
	// The next in line may take a slot still free.
	turns.cond.Broadcast()
	turns.Unlock()
	began := time.Now()
	t.Cleanup(func() {
		t.Logf("scenario ran %v (after %v waiting for its turn)", time.Since(began).Round(time.Millisecond), began.Sub(arrived).Round(time.Millisecond))
		turns.Lock()
		defer turns.Unlock()
		turns.running--
		turns.cond.Broadcast()
	})
}

// handedOut holds every port freeAddr returned: a port is closed again
// before the process it is meant for binds it, and the scenarios run
// beside each other, so without it the kernel could hand the same free
// port to two of them (or to one that means it to stay dead).
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freeAddr returns a free 127.0.0.1 port, never one it returned before in
// this run.
func freeAddr(t *testing.T) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().(*net.TCPAddr)
		l.Close()
		handedOut.Lock()
		seen := handedOut.ports[addr.Port]
		handedOut.ports[addr.Port] = true
		handedOut.Unlock()
		if !seen {
			return addr.String()
		}
	}
}
