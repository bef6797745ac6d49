package webhooks

import (
	"bytes"
	"context"
	"crypto/hmac"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
)

func TestReplayedPushIsDeliveredOnceWithSignedFencedHeaders(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	const secret = "s3cret"
	hook := e.addWebhook(rc.srv.URL+"/hook", secret)
	p := push("app", "sha256:aaa")

	if n := e.enqueue(e.custody, p); n != 1 {
		t.Fatalf("first enqueue recorded %d deliveries, want 1", n)
	}
	if n := e.enqueue(e.custody, p); n != 0 {
		t.Fatalf("replayed enqueue recorded %d deliveries, want 0", n)
	}

	m, _ := NewMetrics(nil)
	pid := e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, m))
	row := e.waitStatus(hook, p.EventKey, "delivered")
	if row.Attempts != 1 || row.Fence != e.custody.Fence || row.StatusCode != 200 {
		t.Fatalf("delivered row = %+v, want 1 attempt under fence %d with status 200", row, e.custody.Fence)
	}

	// Replay once more after delivery, kick, then push a barrier event: the
	// dispatcher handles them in order, so once the barrier is delivered
	// the replay has had every chance to fire again.
	if n := e.enqueue(e.custody, p); n != 0 {
		t.Fatalf("replay after delivery recorded %d deliveries, want 0", n)
	}
	e.sys.Root.Send(pid, &Kick{})
	barrier := push("app", "sha256:bbb")
	e.enqueue(e.custody, barrier)
	e.sys.Root.Send(pid, &Kick{})
	e.waitStatus(hook, barrier.EventKey, "delivered")

	if got := rc.byDelivery(); got[p.EventKey] != 1 || got[barrier.EventKey] != 1 || len(got) != 2 {
		t.Fatalf("requests by delivery = %v, want each key once", got)
	}
	for _, r := range rc.requests() {
		if r.Method != http.MethodPost {
			t.Errorf("method %s, want POST", r.Method)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("Content-Type %q", ct)
		}
		if ev := r.Header.Get(HeaderEvent); ev != "push" {
			t.Errorf("%s = %q, want push", HeaderEvent, ev)
		}
		if f := r.Header.Get(HeaderFence); f != e.custody.String() {
			t.Errorf("%s = %q, want %q", HeaderFence, f, e.custody.String())
		}
		sig := r.Header.Get(HeaderSignature)
		if !hmac.Equal([]byte(sig), []byte(Signature(secret, r.Body))) || !strings.HasPrefix(sig, "sha256=") {
			t.Errorf("signature %q does not verify over the body", sig)
		}
	}
	e.settle(pid)
	if got := metricValue(m.deliveries.WithLabelValues(OutcomeDelivered)); got != 2 {
		t.Errorf("delivered counter = %v, want 2", got)
	}
}

func TestUnsignedWebhookSendsNoSignatureHeader(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil))
	e.waitStatus(hook, p.EventKey, "delivered")
	if sig := rc.requests()[0].Header.Get(HeaderSignature); sig != "" {
		t.Fatalf("unsigned webhook sent %s: %q", HeaderSignature, sig)
	}
}

func TestFailingReceiverIsRetriedOnScheduleWithSameDeliveryAndBody(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, func(_ *http.Request, n int) int {
		if n <= 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	hook := e.addWebhook(rc.srv.URL, "k")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)

	const gap = 80 * time.Millisecond
	m, _ := NewMetrics(nil)
	pid := e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true, RetrySchedule: []time.Duration{0, gap, gap, gap}}, m))
	row := e.waitStatus(hook, p.EventKey, "delivered")
	e.settle(pid)

	got := rc.requests()
	if len(got) != 3 || row.Attempts != 3 || row.StatusCode != http.StatusNoContent {
		t.Fatalf("%d requests, row %+v; want 3 requests, 3 attempts, last status 204", len(got), row)
	}
	for i, r := range got {
		if d := r.Header.Get(HeaderDelivery); d != p.EventKey {
			t.Errorf("request %d: %s = %q, want %q", i, HeaderDelivery, d, p.EventKey)
		}
		if !bytes.Equal(r.Body, got[0].Body) {
			t.Errorf("request %d body differs from the first:\n%s\n%s", i, r.Body, got[0].Body)
		}
		// The database clock is in whole ms; allow that much.
		if i > 0 && r.At.Sub(got[i-1].At) < gap-2*time.Millisecond {
			t.Errorf("request %d came %v after the previous one, before the scheduled %v", i, r.At.Sub(got[i-1].At), gap)
		}
	}
	if !row.Payload.Valid || row.Payload.String != string(got[0].Body) {
		t.Errorf("stored payload %q differs from the body sent %q", row.Payload.String, got[0].Body)
	}
	if r := metricValue(m.deliveries.WithLabelValues(OutcomeRetried)); r != 2 {
		t.Errorf("retried counter = %v, want 2", r)
	}
}

// A receiver that answers 429 or 503 with Retry-After says when it can
// take the delivery; the next attempt came on the schedule alone (30 s by
// default), into the receiver's limit.
func TestAReceiversRetryAfterHoldsTheNextAttempt(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	var mu sync.Mutex
	var at []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, time.Now())
		n := len(at)
		mu.Unlock()
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	hook := e.addWebhook(srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true, RetrySchedule: []time.Duration{0, 10 * time.Millisecond, 10 * time.Millisecond}}, nil))
	row := e.waitStatus(hook, p.EventKey, "delivered")
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 2 || row.Attempts != 2 {
		t.Fatalf("%d requests, %d attempts; want 2 of each", len(at), row.Attempts)
	}
	// The database clock is in whole ms; allow that much.
	if gap := at[1].Sub(at[0]); gap < time.Second-2*time.Millisecond {
		t.Fatalf("the second attempt came %v after a 429 with Retry-After: 1, want at least 1s", gap)
	}
}

func TestSendReadsARetryAfterOnlyFromA429OrA503(t *testing.T) {
	now := time.Unix(1_767_000_000, 0)
	for _, tc := range []struct {
		status int
		header http.Header
		want   time.Duration
	}{
		{http.StatusTooManyRequests, http.Header{"Retry-After": {"120"}}, 2 * time.Minute},
		{http.StatusServiceUnavailable, http.Header{"Retry-After": {"Thu, 29 Dec 2025 09:20:30 GMT"}}, 30 * time.Second},
		{http.StatusTooManyRequests, http.Header{"Ratelimit-Reset": {"1767000010"}}, 11 * time.Second},
		{http.StatusTooManyRequests, http.Header{"Retry-After": {"86400"}}, maxReceiverRetryAfter},
		{http.StatusTooManyRequests, nil, 0},
		{http.StatusInternalServerError, http.Header{"Retry-After": {"120"}}, 0},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for k, v := range tc.header {
				w.Header()[k] = v
			}
			w.WriteHeader(tc.status)
		}))
		a := attempt{url: srv.URL, body: []byte("{}"), trigger: TriggerPush, eventKey: "k"}
		r := send(context.Background(), srv.Client(), fence.Custody{Lease: "l", Fence: 1}, a, time.Second, func() time.Time { return now })
		srv.Close()
		if r.result != resultFailed || r.retryAfter != tc.want {
			t.Errorf("HTTP %d %v: result %v, retryAfter %v; want failed, %v", tc.status, tc.header, r.result, r.retryAfter, tc.want)
		}
	}
}

func TestExhaustedScheduleMarksDeliveryFailed(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusInternalServerError })
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)

	m, _ := NewMetrics(nil)
	pid := e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true, RetrySchedule: []time.Duration{0, 10 * time.Millisecond}}, m))
	row := e.waitStatus(hook, p.EventKey, "failed")
	e.settle(pid)
	if row.Attempts != 2 || row.StatusCode != 500 || !strings.Contains(row.LastError, "HTTP 500") {
		t.Fatalf("failed row = %+v, want 2 attempts, last status 500", row)
	}
	if n := len(rc.requests()); n != 2 {
		t.Fatalf("receiver saw %d requests, want 2 (the schedule's length)", n)
	}
	if f := metricValue(m.deliveries.WithLabelValues(OutcomeFailed)); f != 1 {
		t.Errorf("failed counter = %v, want 1", f)
	}
}

func TestAttemptWithoutAnswerWithinTimeoutCountsAsFailure(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, func(r *http.Request, _ int) int {
		<-r.Context().Done() // never answers; the client gives up
		return http.StatusOK
	})
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)

	e.spawn(e.options(e.custody, config.Webhooks{
		AllowPrivate:  true,
		Timeout:       100 * time.Millisecond,
		RetrySchedule: []time.Duration{0, 10 * time.Millisecond},
	}, nil))
	row := e.waitStatus(hook, p.EventKey, "failed")
	if row.Attempts != 2 || row.StatusCode != 0 || !strings.Contains(row.LastError, "no answer within 100ms") {
		t.Fatalf("row after timeouts = %+v, want 2 attempts failed for lack of an answer", row)
	}
}

// failureCatcher is a parent that spawns the dispatcher and reports the
// reason its child failed with.
type failureCatcher struct{ child *actor.Props }

func (f *failureCatcher) Receive(c actor.Context) {
	if _, ok := c.Message().(*actor.Started); ok {
		c.Spawn(f.child)
	}
}

func spawnUnderCatcher(e *env, child *actor.Props) <-chan any {
	reasons := make(chan any, 4)
	strategy := actor.NewOneForOneStrategy(0, time.Second, func(reason any) actor.Directive {
		reasons <- reason
		return actor.StopDirective
	})
	props := actor.PropsFromProducer(func() actor.Actor { return &failureCatcher{child: child} },
		actor.WithSupervisor(strategy))
	pid := e.sys.Root.Spawn(props)
	e.t.Cleanup(func() { e.stop(pid) })
	return reasons
}

func TestSupersededDispatcherSendsNothingAndFailsWithErrSuperseded(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)

	// Instance B takes the lease while A still believes it holds it.
	if _, err := e.db.Exec(`UPDATE leases SET expires_at = 0 WHERE name = ?1`, testLease); err != nil {
		t.Fatal(err)
	}
	b := e.acquire("instance-b")
	if b.Fence != e.custody.Fence+1 {
		t.Fatalf("takeover fence %d, want %d", b.Fence, e.custody.Fence+1)
	}

	reasons := spawnUnderCatcher(e, NewDispatcherProps(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil)))
	select {
	case r := <-reasons:
		err, ok := r.(error)
		if !ok || !errors.Is(err, fence.ErrSuperseded) {
			t.Fatalf("dispatcher failed with %v, want an error wrapping fence.ErrSuperseded", r)
		}
	case <-time.After(waitBudget):
		t.Fatal("superseded dispatcher did not fail")
	}
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("superseded dispatcher sent %d requests", n)
	}
	if row := e.delivery(hook, p.EventKey); row.Attempts != 0 || row.Status != "pending" || row.Fence != 0 {
		t.Fatalf("delivery after failed claim = %+v, want untouched", row)
	}
}

func TestFailoverResumesPendingDeliveriesUnderNextFenceWithoutResending(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	first := []Push{push("app", "sha256:a1"), push("app", "sha256:a2")}
	second := []Push{push("app", "sha256:b1"), push("app", "sha256:b2"), push("web", "sha256:b3")}

	// Holder A delivers the first batch.
	e.enqueue(e.custody, first...)
	a := e.sys.Root.Spawn(NewDispatcherProps(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil)))
	for _, p := range first {
		e.waitStatus(hook, p.EventKey, "delivered")
	}
	e.stop(a)
	// A commits the second batch, then dies before dispatching it.
	e.enqueue(e.custody, second...)
	testsupport.Release(t, e.db, e.custody)

	b := e.acquire("instance-b")
	e.spawn(e.options(b, config.Webhooks{AllowPrivate: true}, nil))
	for _, p := range second {
		if row := e.waitStatus(hook, p.EventKey, "delivered"); row.Fence != b.Fence {
			t.Errorf("%s delivered under fence %d, want %d", p.EventKey, row.Fence, b.Fence)
		}
	}

	want := map[string]string{}
	for _, p := range first {
		want[p.EventKey] = e.custody.String()
	}
	for _, p := range second {
		want[p.EventKey] = b.String()
	}
	got := rc.requests()
	if len(got) != len(want) {
		t.Fatalf("receiver saw %d requests, want %d (each delivery once): %v", len(got), len(want), rc.byDelivery())
	}
	for _, r := range got {
		key := r.Header.Get(HeaderDelivery)
		if f := r.Header.Get(HeaderFence); f != want[key] {
			t.Errorf("%s sent under %q, want %q", key, f, want[key])
		}
		delete(want, key)
	}
	if len(want) != 0 {
		t.Errorf("never delivered: %v", want)
	}
}

func TestDispatcherKeepsAtMostConcurrencyRequestsInFlight(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	var active, peak atomic.Int32
	release := make(chan struct{})
	rc := newReceiver(t, func(*http.Request, int) int {
		n := active.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		active.Add(-1)
		return http.StatusOK
	})
	hook := e.addWebhook(rc.srv.URL, "")
	var pushes []Push
	for _, d := range []string{"sha256:1", "sha256:2", "sha256:3", "sha256:4", "sha256:5", "sha256:6"} {
		pushes = append(pushes, push("app", d))
	}
	e.enqueue(e.custody, pushes...)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true, Concurrency: 2}, nil))

	for i := range pushes {
		want := min(i+2, len(pushes))
		testsupport.Eventually(t, "requests to arrive", func() bool { return len(rc.requests()) >= want })
		release <- struct{}{}
	}
	for _, p := range pushes {
		e.waitStatus(hook, p.EventKey, "delivered")
	}
	if p := peak.Load(); p != 2 {
		t.Fatalf("peak requests in flight = %d, want 2 (webhooks.concurrency)", p)
	}
}

func TestStoppingMidRequestCancelsItAndWritesNothingAfter(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	arrived := make(chan struct{}, 1)
	cancelled := make(chan struct{}, 1)
	rc := newReceiver(t, func(r *http.Request, _ int) int {
		arrived <- struct{}{}
		<-r.Context().Done()
		cancelled <- struct{}{}
		return http.StatusOK
	})
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)

	// A timeout far beyond the wait below: only the stop can end the request.
	pid := e.sys.Root.Spawn(NewDispatcherProps(e.options(e.custody,
		config.Webhooks{AllowPrivate: true, Timeout: time.Hour}, nil)))
	select {
	case <-arrived:
	case <-time.After(waitBudget):
		t.Fatal("request never arrived")
	}
	claimed := e.delivery(hook, p.EventKey)
	e.stop(pid)
	select {
	case <-cancelled:
	case <-time.After(waitBudget):
		t.Fatal("stopping the dispatcher did not cancel the request in flight")
	}
	after := e.delivery(hook, p.EventKey)
	if after != claimed {
		t.Fatalf("delivery changed after stop:\nclaimed %+v\nafter   %+v", claimed, after)
	}
	if after.Status != "pending" || after.Attempts != 1 || after.LastError != "" {
		t.Fatalf("delivery after stop = %+v, want claimed (1 attempt) with no outcome", after)
	}
}

// A graceful stop (the LeaseActor drains its worker before poisoning it,
// custody still held) lets the request in flight finish and records its
// outcome, so the next holder does not send the push again.
func TestDrainFinishesTheRequestInFlightAndRecordsItsOutcome(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	rc := newReceiver(t, func(r *http.Request, _ int) int {
		arrived <- struct{}{}
		<-release
		return http.StatusOK
	})
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	pid := e.sys.Root.Spawn(NewDispatcherProps(e.options(e.custody,
		config.Webhooks{AllowPrivate: true, Timeout: time.Hour}, nil)))
	select {
	case <-arrived:
	case <-time.After(waitBudget):
		t.Fatal("request never arrived")
	}
	drained := e.sys.Root.RequestFuture(pid, &Drain{}, waitBudget)
	close(release)
	if res, err := drained.Result(); err != nil {
		t.Fatalf("drain: %v", err)
	} else if _, ok := res.(*Drained); !ok {
		t.Fatalf("drain answered %T", res)
	}
	if row := e.delivery(hook, p.EventKey); row.Status != "delivered" || row.Attempts != 1 {
		t.Fatalf("delivery after drain = %+v, want delivered on its one attempt", row)
	}
	// A Kick after the drain claims nothing more.
	e.enqueue(e.custody, push("app", "sha256:bbb"))
	e.sys.Root.Send(pid, &Kick{})
	e.stop(pid)
	if n := len(rc.requests()); n != 1 {
		t.Fatalf("receiver saw %d requests, want the one in flight only", n)
	}
}

func TestLoopbackTargetsAreRefusedAtDialTime(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	_, port, _ := strings.Cut(strings.TrimPrefix(rc.srv.URL, "http://"), ":")
	// Added while private targets were allowed, so only the dial-time check
	// stands between the dispatcher and the receiver.
	byIP := e.addWebhook("http://127.0.0.1:"+port+"/hook", "")
	byName := e.addWebhook("http://localhost:"+port+"/hook", "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)

	m, _ := NewMetrics(nil)
	pid := e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: false, RetrySchedule: []time.Duration{0, 0, 0}}, m))
	for _, hook := range []int64{byIP, byName} {
		row := e.waitStatus(hook, p.EventKey, "failed")
		if row.Attempts != 1 || !strings.Contains(row.LastError, "loopback") {
			t.Errorf("webhook %d: row %+v, want refused (final) on the first attempt as loopback", hook, row)
		}
	}
	e.settle(pid)
	if n := len(rc.requests()); n != 0 {
		t.Fatalf("receiver saw %d requests through the guard", n)
	}
	if r := metricValue(m.deliveries.WithLabelValues(OutcomeRefused)); r != 2 {
		t.Errorf("refused counter = %v, want 2", r)
	}
}

func TestRedirectToAnotherHostIsNotFollowed(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	other := newReceiver(t, nil)
	redirector := newReceiver(t, nil)
	redirector.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.srv.URL+"/elsewhere", http.StatusTemporaryRedirect)
	})
	hook := e.addWebhook(redirector.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil))

	row := e.waitStatus(hook, p.EventKey, "failed")
	if row.StatusCode != http.StatusTemporaryRedirect || !strings.Contains(row.LastError, "not followed") {
		t.Fatalf("row = %+v, want the 307 recorded as a failure", row)
	}
	if n := len(other.requests()); n != 0 {
		t.Fatalf("redirect target received %d requests", n)
	}
}

func TestSameHostRedirectKeepingMethodIsFollowed(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	var mu sync.Mutex
	var bodies []string
	rc := newReceiver(t, nil)
	rc.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/old" {
			http.Redirect(w, r, "/new", http.StatusPermanentRedirect)
			return
		}
		var b bytes.Buffer
		_, _ = b.ReadFrom(r.Body)
		mu.Lock()
		bodies = append(bodies, r.Method+" "+r.URL.Path+" "+b.String())
		mu.Unlock()
	})
	hook := e.addWebhook(rc.srv.URL+"/old", "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil))
	row := e.waitStatus(hook, p.EventKey, "delivered")
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || !strings.HasPrefix(bodies[0], "POST /new {") || !strings.HasSuffix(bodies[0], row.Payload.String) {
		t.Fatalf("after 308: %q, want the same POST body at /new", bodies)
	}
}

func TestRemovedWebhookDropsItsPendingDeliveries(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	gone := e.addWebhook(rc.srv.URL+"/gone", "")
	kept := e.addWebhook(rc.srv.URL+"/kept", "")
	p := push("app", "sha256:aaa")
	if n := e.enqueue(e.custody, p); n != 2 {
		t.Fatalf("enqueue for two webhooks recorded %d, want 2", n)
	}
	if err := Remove(e.ctx, e.db, gone); err != nil {
		t.Fatal(err)
	}
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil))
	e.waitStatus(kept, p.EventKey, "delivered")
	var left int
	if err := e.db.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries WHERE webhook_id = ?1`, gone).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 || len(rc.requests()) != 1 {
		t.Fatalf("removed webhook: %d deliveries left, %d requests; want 0 and 1", left, len(rc.requests()))
	}
}

func TestDueTimeOfFirstAttemptFollowsTheSchedule(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	var enqueued int64
	if err := e.db.QueryRow(`SELECT created_at FROM webhook_deliveries`).Scan(&enqueued); err != nil {
		t.Fatal(err)
	}
	const first = 150 * time.Millisecond
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true, RetrySchedule: []time.Duration{first}}, nil))
	e.waitStatus(hook, p.EventKey, "delivered")
	sent := rc.requests()[0].At.UnixMilli()
	if sent-enqueued < first.Milliseconds()-1 {
		t.Fatalf("first attempt %d ms after enqueue, want at least %d", sent-enqueued, first.Milliseconds())
	}
}

func TestAbandonedFinalAttemptIsMarkedFailedByTheNextHolder(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	e.enqueue(e.custody, p)
	// The previous holder claimed the only attempt and never recorded it;
	// its claim has expired.
	if _, err := e.db.Exec(`UPDATE webhook_deliveries SET attempts = 1, payload = '{}', next_attempt_at = 0`); err != nil {
		t.Fatal(err)
	}
	m, _ := NewMetrics(nil)
	pid := e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, m))
	row := e.waitStatus(hook, p.EventKey, "failed")
	e.settle(pid)
	if !strings.Contains(row.LastError, "no outcome recorded") || len(rc.requests()) != 0 {
		t.Fatalf("row = %+v with %d requests, want failed without sending", row, len(rc.requests()))
	}
	if f := metricValue(m.deliveries.WithLabelValues(OutcomeFailed)); f != 1 {
		t.Errorf("failed counter = %v, want 1", f)
	}
}

func TestPendingGaugeCountsPendingDeliveriesAndResetsOnStop(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	e.addWebhook(rc.srv.URL, "")
	e.enqueue(e.custody, push("app", "sha256:1"), push("app", "sha256:2"), push("app", "sha256:3"))
	m, _ := NewMetrics(nil)
	// A first delay far in the future keeps them pending.
	pid := e.sys.Root.Spawn(NewDispatcherProps(e.options(e.custody,
		config.Webhooks{AllowPrivate: true, RetrySchedule: []time.Duration{time.Hour}}, m)))
	testsupport.Eventually(t, "pending gauge", func() bool { return metricValue(m.pending) == 3 })
	e.stop(pid)
	if g := metricValue(m.pending); g != 0 {
		t.Fatalf("pending gauge after stop = %v, want 0", g)
	}
}

func TestUndecodableTriggerDataFailsThatDeliveryOnly(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	bad, good := push("app", "sha256:bad"), push("app", "sha256:good")
	e.enqueue(e.custody, bad, good)
	if _, err := e.db.Exec(`UPDATE webhook_deliveries SET trigger_data = '{not json' WHERE event_key = ?1`, bad.EventKey); err != nil {
		t.Fatal(err)
	}
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil))
	e.waitStatus(hook, good.EventKey, "delivered")
	if row := e.waitStatus(hook, bad.EventKey, "failed"); !strings.Contains(row.LastError, "cannot build body") {
		t.Fatalf("bad row = %+v", row)
	}
}

func TestUnfencedCustodyDeliversWithoutALeaseRow(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	unfenced := fence.Custody{Lease: testLease, Holder: "solo"}
	p := push("app", "sha256:aaa")
	e.enqueue(unfenced, p)
	e.spawn(e.options(unfenced, config.Webhooks{AllowPrivate: true}, nil))
	e.waitStatus(hook, p.EventKey, "delivered")
	if f := rc.requests()[0].Header.Get(HeaderFence); f != testLease+":0" {
		t.Fatalf("%s = %q, want %s:0", HeaderFence, f, testLease)
	}
}

func TestConfigValidateNamesTheOffendingWebhooksKey(t *testing.T) {
	base := config.Default()
	good := base.Webhooks
	cases := map[string]func(c *config.Webhooks){
		"webhooks.retry_schedule": func(c *config.Webhooks) { c.RetrySchedule = nil },
		"webhooks.timeout":        func(c *config.Webhooks) { c.Timeout = 0 },
		"webhooks.concurrency":    func(c *config.Webhooks) { c.Concurrency = 0 },
		"webhooks.public_url":     func(c *config.Webhooks) { c.PublicURL = "atcr.io" },
	}
	for key, breakIt := range cases {
		c := good
		c.RetrySchedule = append([]time.Duration(nil), good.RetrySchedule...)
		breakIt(&c)
		var ce *config.Error
		cfg := base
		cfg.Webhooks = c
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Key != key {
			t.Errorf("breaking %s: got %v", key, err)
		}
	}
}

// The registration builds the dispatcher options once per process; every
// grant's dispatcher gets a copy, and all of them count into the one set
// of collectors registered (a second set cannot be registered beside it).
func TestDispatcherOptionsFromDepsShareCollectorsAcrossCalls(t *testing.T) {
	reg := prometheus.NewRegistry()
	d := workers.Deps{Config: config.Default(), Metrics: reg, Log: zerolog.Nop()}
	opts, err := NewDispatcherOptions(d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewDispatcherOptions(d); err == nil {
		t.Fatal("a second set of webhook collectors registered beside the first")
	}
	first, second := opts, opts // two grants' dispatchers
	first.Metrics.deliveries.WithLabelValues(OutcomeDelivered).Inc()
	if v := metricValue(second.Metrics.deliveries.WithLabelValues(OutcomeDelivered)); v != 1 {
		t.Fatalf("second options count %v deliveries, want the shared collector's 1", v)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
	}
	for _, n := range []string{"appview_webhook_deliveries_total", "appview_webhook_attempt_duration_seconds", "appview_webhook_deliveries_pending"} {
		if !names[n] {
			t.Errorf("metric %s not registered (have %v)", n, names)
		}
	}
}

// The start of a receiver's refusal is kept in last_error; a NUL in it
// made the database refuse the outcome (it cuts text at a NUL), so the
// delivery's state could not be recorded. Control characters are kept as
// spaces.
func TestARefusalsAnswerWithControlCharactersIsStorable(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte("oops\x00bad\x1b[31mred"))
	}))
	defer srv.Close()
	a := attempt{url: srv.URL, body: []byte("{}"), trigger: TriggerPush, eventKey: "k"}
	r := send(context.Background(), srv.Client(), fence.Custody{Lease: "l", Fence: 1}, a, time.Second, time.Now)
	if r.result != resultFailed || r.message != "HTTP 500: oops bad [31mred" {
		t.Fatalf("result %v, message %q", r.result, r.message)
	}
}
