package lease

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
)

// hungStore never answers until released, and counts the calls waiting in it.
type hungStore struct {
	inFlight, most atomic.Int32
	release        chan struct{}
}

func (h *hungStore) wait() error {
	n := h.inFlight.Add(1)
	for {
		m := h.most.Load()
		if n <= m || h.most.CompareAndSwap(m, n) {
			break
		}
	}
	<-h.release
	h.inFlight.Add(-1)
	return errors.New("database came back")
}

func (h *hungStore) Acquire(context.Context, string, string) (Grant, error) {
	return Grant{}, h.wait()
}
func (h *hungStore) Renew(context.Context, fence.Custody) error   { return h.wait() }
func (h *hungStore) Release(context.Context, fence.Custody) error { return h.wait() }

// The driver ignores contexts, so a call to a hung database keeps its
// goroutine. A contender that gives up on such calls must not start a new
// one every call timeout: at most maxStuckCalls wait in the store, and the
// attempts beyond fail at once (and are logged).
func TestCallsToAHungDatabaseDoNotPileUp(t *testing.T) {
	h := newHarness(t)
	store := &hungStore{release: make(chan struct{})}
	timing := config.Timing{TTL: time.Second, RenewInterval: 50 * time.Millisecond,
		RenewDeadline: 200 * time.Millisecond, RetryInterval: 50 * time.Millisecond}
	r := h.start(Options{Name: "stuck", Instance: "a", Timing: timing, Store: store, Worker: (&probe{}).props})
	deadline := time.Now().Add(waitFor)
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		res, err := h.sys.Root.RequestFuture(r.pid, &StatusRequest{}, time.Second).Result()
		if st, ok := res.(Status); err == nil && ok && strings.Contains(st.LastError, ErrStoreStuck.Error()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no attempt was refused for stuck calls within %s (last status %v, %v)", waitFor, res, err)
		}
		<-poll.C
	}
	if most := store.most.Load(); most > maxStuckCalls {
		t.Fatalf("%d calls waited in the hung store at once, want at most %d", most, maxStuckCalls)
	}
	close(store.release)
	h.stopAndWait(r)
	if n := h.events.count(is(WorkerStarted, "a")); n != 0 {
		t.Fatalf("%d workers started against a hung database", n)
	}
}
