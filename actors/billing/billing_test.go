package billing

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/outbound"
	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/atcr-io/appview/internal/fence"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/identity"
	"github.com/atcr-io/appview/system"
)

func TestMain(m *testing.M) { testsupport.VerifyTestMain(m) }

const secretKey = "sk_test_fake_123"

// fakeStripe serves GET /v1/subscriptions like Stripe: filtered by status,
// paginated by limit and starting_after, Bearer auth.
type fakeStripe struct {
	*httptest.Server
	mu       sync.Mutex
	subs     []map[string]any
	requests atomic.Int32
}

func newFakeStripe(t *testing.T) *fakeStripe {
	t.Helper()
	f := &fakeStripe{}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeStripe) serve(w http.ResponseWriter, r *http.Request) {
	f.requests.Add(1)
	if r.Method != http.MethodGet || r.URL.Path != "/v1/subscriptions" {
		http.NotFound(w, r)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+secretKey {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write([]byte(`{"error":{"type":"invalid_request_error","message":"Invalid API Key provided: sk_test_****"}}`))
		return
	}
	q := r.URL.Query()
	limit, _ := strconv.Atoi(q.Get("limit"))
	if limit < 1 || limit > 100 {
		limit = 10
	}
	expand := q["expand[]"]
	f.mu.Lock()
	var matching []map[string]any
	for _, s := range f.subs {
		if s["status"] == q.Get("status") {
			matching = append(matching, s)
		}
	}
	f.mu.Unlock()
	if after := q.Get("starting_after"); after != "" {
		for i, s := range matching {
			if s["id"] == after {
				matching = matching[i+1:]
				break
			}
		}
	}
	more := len(matching) > limit
	if more {
		matching = matching[:limit]
	}
	page := make([]map[string]any, 0, len(matching))
	for _, s := range matching {
		c := map[string]any{}
		for k, v := range s {
			c[k] = v
		}
		if cust, ok := s["customer"].(map[string]any); ok && !contains(expand, "data.customer") {
			c["customer"] = cust["id"] // unexpanded: just the id
		}
		page = append(page, c)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": page, "has_more": more})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// subscribe sets did's subscription to one price of the given rank
// (replacing an earlier one); rank < 0 cancels it.
func (f *fakeStripe) subscribe(did string, rank int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.subs {
		if s["metadata"].(map[string]string)[MetadataDID] == did && s["status"] == "active" {
			s["status"] = "canceled"
		}
	}
	if rank < 0 {
		return
	}
	f.subs = append(f.subs, subscription(fmt.Sprintf("sub_%d", len(f.subs)), "active",
		map[string]string{MetadataDID: did}, "cus_x", nil, price(rank)))
}

func (f *fakeStripe) add(subs ...map[string]any) {
	f.mu.Lock()
	f.subs = append(f.subs, subs...)
	f.mu.Unlock()
}

func price(rank int) map[string]string {
	return map[string]string{MetadataTierRank: strconv.Itoa(rank), MetadataTier: fmt.Sprintf("plan-%d", rank)}
}

func subscription(id, status string, meta map[string]string, customerID string, customerMeta map[string]string, prices ...map[string]string) map[string]any {
	items := []map[string]any{}
	for i, p := range prices {
		items = append(items, map[string]any{"price": map[string]any{"id": fmt.Sprintf("price_%s_%d", id, i), "metadata": p}})
	}
	if customerMeta == nil {
		customerMeta = map[string]string{}
	}
	return map[string]any{
		"id": id, "object": "subscription", "status": status, "metadata": meta,
		"customer": map[string]any{"id": customerID, "object": "customer", "metadata": customerMeta},
		"items":    map[string]any{"object": "list", "data": items},
	}
}

type push struct {
	User string
	Rank int
}

// fakeHold implements io.atcr.hold.updateCrewTier.
type fakeHold struct {
	*httptest.Server
	did      string
	mu       sync.Mutex
	pushes   []push // accepted
	attempts atomic.Int32
	down     atomic.Bool // 503 to everything
	authReq  atomic.Bool // AuthRequired to everything
	// moved answers every push 302 to /moved, which answers a GET 200
	// with a tierName (a hold that never sees the tier yet says OK).
	moved   atomic.Bool
	unknown map[string]bool
	// answering, when set, runs after a push is accepted and before the
	// hold answers it (a slow hold, or one the client gives up on).
	answering func(r *http.Request)
	// tierName, when set, is the name every accepted push is answered with.
	tierName string
}

func newFakeHold(t *testing.T) *fakeHold {
	t.Helper()
	h := &fakeHold{unknown: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+UpdateCrewTierPath, func(w http.ResponseWriter, r *http.Request) {
		h.attempts.Add(1)
		var in struct {
			UserDID  string `json:"userDid"`
			TierRank *int   `json:"tierRank"`
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case h.down.Load():
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case h.authReq.Load():
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"AuthRequired","message":"service auth token required"}`))
			return
		case h.moved.Load():
			http.Redirect(w, r, "/moved", http.StatusFound)
			return
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.UserDID == "" || in.TierRank == nil ||
			r.Header.Get("Content-Type") != "application/json" {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"InvalidRequest","message":"want {userDid, tierRank}"}`))
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.unknown[in.UserDID] {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"UserNotFound","message":"not crew"}`))
			return
		}
		h.pushes = append(h.pushes, push{in.UserDID, *in.TierRank})
		if h.answering != nil {
			h.mu.Unlock()
			h.answering(r)
			h.mu.Lock()
		}
		name := fmt.Sprintf("hold-tier-%d", *in.TierRank)
		if h.tierName != "" {
			name = h.tierName
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"tierName": name})
	})
	mux.HandleFunc("GET /moved", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"tierName": "moved"})
	})
	h.Server = httptest.NewServer(mux)
	t.Cleanup(h.Close)
	u, _ := url.Parse(h.URL)
	h.did = "did:web:" + strings.ReplaceAll(u.Host, ":", "%3A")
	return h
}

// takePushes returns and forgets the accepted pushes, sorted.
func (h *fakeHold) takePushes() []push {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.pushes
	h.pushes = nil
	sort.Slice(out, func(i, j int) bool { return out[i].User < out[j].User })
	if out == nil {
		out = []push{}
	}
	return out
}

func (h *fakeHold) onAnswer(f func(r *http.Request)) {
	h.mu.Lock()
	h.answering = f
	h.mu.Unlock()
}

func (h *fakeHold) setUnknown(user string, unknown bool) {
	h.mu.Lock()
	h.unknown[user] = unknown
	h.mu.Unlock()
}

type fixture struct {
	db     *database.DB
	stripe *fakeStripe
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := testsupport.OpenDB(t)
	return &fixture{db: db, stripe: newFakeStripe(t)}
}

func (f *fixture) crew(t *testing.T, hold *fakeHold, user, rkey string, addedAt int64) {
	t.Helper()
	if _, err := f.db.Exec(`INSERT INTO hold_crew (hold_did, rkey, member_did, role, added_at) VALUES (?1, ?2, ?3, 'write', ?4)
	  ON CONFLICT (hold_did, rkey) DO UPDATE SET added_at = excluded.added_at`, hold.did, rkey, user, addedAt); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) acquire(t *testing.T, holder string) fence.Custody {
	t.Helper()
	return testsupport.Custody(t, f.db, LeaseName, holder, 15*time.Second)
}

// handOver expires the current grant (as if its holder stalled past the
// TTL) and grants the lease to holder.
func (f *fixture) handOver(t *testing.T, holder string) fence.Custody {
	t.Helper()
	if _, err := f.db.Exec(`UPDATE leases SET expires_at = 0 WHERE name = ?1`, LeaseName); err != nil {
		t.Fatal(err)
	}
	return f.acquire(t, holder)
}

// loopback is a client whose guard lets the fake holds (on 127.0.0.1)
// through, as network.allow_private does.
var loopback = outbound.Guard{AllowPrivate: true}.Client(0)

func (f *fixture) refresher(t *testing.T, log zerolog.Logger) *Refresher {
	t.Helper()
	r, err := New(Options{
		DB:        f.db,
		Source:    &Stripe{BaseURL: f.stripe.URL, SecretKey: secretKey, Log: log},
		Endpoints: &identity.Resolver{WebScheme: "http", HTTP: loopback},
		HTTP:      loopback,
		Log:       log,
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustRound(t *testing.T, r *Refresher, c fence.Custody) Report {
	t.Helper()
	rep, err := r.Round(context.Background(), c)
	if err != nil {
		t.Fatalf("round under fence %d: %v", c.Fence, err)
	}
	return rep
}

func wantPushes(t *testing.T, h *fakeHold, want ...push) {
	t.Helper()
	if want == nil {
		want = []push{}
	}
	if got := h.takePushes(); !reflect.DeepEqual(got, want) {
		t.Errorf("hold %s got pushes %v, want %v", h.URL, got, want)
	}
}

type recorded struct {
	Rank    int
	Name    string
	Outcome string
	Fence   int64
}

func (f *fixture) recorded(t *testing.T, hold *fakeHold, user string) (recorded, bool) {
	t.Helper()
	var r recorded
	err := f.db.QueryRow(`SELECT tier_rank, `+database.Text("tier_name")+`, `+database.Text("outcome")+`, fence
		FROM billing_tier_pushes WHERE hold_did = ?1 AND user_did = ?2`,
		hold.did, user).Scan(&r.Rank, &r.Name, &r.Outcome, &r.Fence)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return r, true
}

const (
	alice = "did:plc:alice"
	bob   = "did:plc:bob"
	carol = "did:plc:carol"
	dave  = "did:plc:dave"
)

func TestOnlyChangedTiersArePushed(t *testing.T) {
	f := newFixture(t)
	h1, h2 := newFakeHold(t), newFakeHold(t)
	f.crew(t, h1, alice, "a", 1)
	f.crew(t, h1, bob, "b", 1)
	f.crew(t, h1, carol, "c", 1) // crew, never subscribed
	f.crew(t, h2, alice, "a", 1)
	f.stripe.subscribe(alice, 2)
	f.stripe.subscribe(bob, 1)
	c := f.acquire(t, "inst-a")
	r := f.refresher(t, zerolog.Nop())

	rep := mustRound(t, r, c)
	wantPushes(t, h1, push{alice, 2}, push{bob, 1})
	wantPushes(t, h2, push{alice, 2})
	if rep.Pushed != 3 || rep.Due != 3 || rep.Failed != 0 || rep.Subscribers != 2 {
		t.Errorf("first round report %+v", rep)
	}
	if got, _ := f.recorded(t, h1, alice); got != (recorded{2, "hold-tier-2", OutcomePushed, c.Fence}) {
		t.Errorf("recorded %+v", got)
	}
	if _, ok := f.recorded(t, h1, carol); ok {
		t.Error("a member without a subscription was recorded without a push")
	}

	rep = mustRound(t, r, c)
	wantPushes(t, h1)
	wantPushes(t, h2)
	if rep.Due != 0 || rep.Pushed != 0 {
		t.Errorf("unchanged round report %+v", rep)
	}

	f.stripe.subscribe(bob, 3)
	mustRound(t, r, c)
	wantPushes(t, h1, push{bob, 3})
	wantPushes(t, h2)

	f.stripe.subscribe(bob, -1) // cancelled: back to billing.default_tier_rank (0)
	mustRound(t, r, c)
	wantPushes(t, h1, push{bob, 0})

	mustRound(t, r, c)
	wantPushes(t, h1)
	wantPushes(t, h2)
	if got := h1.attempts.Load() + h2.attempts.Load(); got != 5 {
		t.Errorf("holds saw %d requests over five rounds, want 5 (one per change)", got)
	}
}

func TestFailingHoldIsRetriedNextInterval(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fail   func(h *fakeHold, on bool)
		metric string
		// plain sends with a client that follows redirects as net/http
		// does by default (what a caller may pass as Options.HTTP).
		plain bool
	}{
		{"unavailable", func(h *fakeHold, on bool) { h.down.Store(on) }, "failed", false},
		{"auth required", func(h *fakeHold, on bool) { h.authReq.Store(on) }, "auth_required", false},
		// A POST answered 302 became a bodyless GET that the hold
		// answered 200, and the push was recorded as done.
		{"redirect", func(h *fakeHold, on bool) { h.moved.Store(on) }, "failed", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			bad, good := newFakeHold(t), newFakeHold(t)
			f.crew(t, bad, alice, "a", 1)
			f.crew(t, bad, bob, "b", 1)
			f.crew(t, good, alice, "a", 1)
			f.stripe.subscribe(alice, 2)
			f.stripe.subscribe(bob, 1)
			c := f.acquire(t, "inst-a")
			var logs bytes.Buffer
			r := f.refresher(t, zerolog.New(&logs))
			reg := prometheus.NewRegistry()
			m, err := NewMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			r.o.Metrics = m
			if tc.plain {
				r.o.HTTP = &http.Client{Transport: loopback.Transport}
			}

			tc.fail(bad, true)
			rep := mustRound(t, r, c)
			wantPushes(t, good, push{alice, 2})
			wantPushes(t, bad)
			if rep.Failed != 2 || rep.Pushed != 1 {
				t.Errorf("report %+v, want 2 failed and 1 pushed", rep)
			}
			if got := bad.attempts.Load(); got != 1 {
				t.Errorf("failing hold was asked %d times in one round, want 1 (skip the rest)", got)
			}
			if _, ok := f.recorded(t, bad, alice); ok {
				t.Error("a failed push was recorded")
			}
			if !strings.Contains(logs.String(), bad.did) {
				t.Errorf("failure not logged with the hold DID:\n%s", logs.String())
			}
			if got := counterValue(t, reg, "appview_billing_tier_pushes_total", tc.metric); got != 2 {
				t.Errorf("pushes_total{outcome=%s} = %v, want 2", tc.metric, got)
			}

			tc.fail(bad, false)
			mustRound(t, r, c)
			wantPushes(t, bad, push{alice, 2}, push{bob, 1})
			wantPushes(t, good)
			mustRound(t, r, c)
			wantPushes(t, bad)
			wantPushes(t, good)
		})
	}
}

func TestEachChangeIsPushedOnceAcrossCustodies(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.stripe.subscribe(alice, 1)

	first := f.acquire(t, "inst-a")
	a := f.refresher(t, zerolog.Nop()) // each instance has its own refresher
	mustRound(t, a, first)
	wantPushes(t, h, push{alice, 1})

	second := f.handOver(t, "inst-b")
	b := f.refresher(t, zerolog.Nop())
	mustRound(t, b, second)
	wantPushes(t, h) // the new holder read what the old one recorded

	f.stripe.subscribe(alice, 2)
	// The stalled former holder wakes up and runs a round at the same time
	// as the current holder, over and over.
	var wg sync.WaitGroup
	var staleErrs, currentErrs atomic.Int32
	for range 5 {
		wg.Go(func() {
			if _, err := a.Round(context.Background(), first); errors.Is(err, fence.ErrSuperseded) {
				staleErrs.Add(1)
			}
		})
		wg.Go(func() {
			if _, err := b.Round(context.Background(), second); err != nil {
				currentErrs.Add(1)
				t.Errorf("current holder's round: %v", err)
			}
		})
	}
	wg.Wait()
	wantPushes(t, h, push{alice, 2})
	if got := staleErrs.Load(); got != 5 {
		t.Errorf("the superseded custody reported ErrSuperseded in %d of 5 rounds", got)
	}
	if got, _ := f.recorded(t, h, alice); got.Fence != second.Fence || got.Rank != 2 {
		t.Errorf("recorded %+v, want rank 2 under fence %d", got, second.Fence)
	}
}

func TestSupersededCustodyPushesNothing(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.stripe.subscribe(alice, 1)
	first := f.acquire(t, "inst-a")
	f.handOver(t, "inst-b")

	_, err := f.refresher(t, zerolog.Nop()).Round(context.Background(), first)
	if !errors.Is(err, fence.ErrSuperseded) {
		t.Fatalf("round under a superseded fence: %v, want ErrSuperseded", err)
	}
	if got := h.attempts.Load(); got != 0 {
		t.Errorf("superseded custody sent %d pushes", got)
	}
	if got := f.stripe.requests.Load(); got != 0 {
		t.Errorf("superseded custody called Stripe %d times", got)
	}
}

func TestUserNotFoundIsRecordedAndRetriedOnlyWhenSomethingChanges(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.crew(t, h, dave, "d", 100)
	f.stripe.subscribe(alice, 1)
	f.stripe.subscribe(dave, 1)
	h.setUnknown(dave, true)
	c := f.acquire(t, "inst-a")
	r := f.refresher(t, zerolog.Nop())

	rep := mustRound(t, r, c)
	wantPushes(t, h, push{alice, 1}) // dave's refusal did not stop alice
	if rep.UserNotFound != 1 || rep.Pushed != 1 || rep.Failed != 0 {
		t.Errorf("report %+v", rep)
	}
	if got, _ := f.recorded(t, h, dave); got.Outcome != OutcomeUserNotFound || got.Rank != 1 {
		t.Errorf("dave recorded %+v", got)
	}
	attempts := h.attempts.Load()

	mustRound(t, r, c)
	if got := h.attempts.Load(); got != attempts {
		t.Errorf("UserNotFound retried with nothing changed (%d more requests)", got-attempts)
	}

	// The hold has learnt about dave, and a new crew record arrives.
	h.setUnknown(dave, false)
	f.crew(t, h, dave, "d", 200)
	mustRound(t, r, c)
	wantPushes(t, h, push{dave, 1})
	if got, _ := f.recorded(t, h, dave); got.Outcome != OutcomePushed {
		t.Errorf("dave recorded %+v after a successful push", got)
	}

	// A tier change is also worth asking again after a refusal.
	h.setUnknown(dave, true)
	f.stripe.subscribe(dave, 2)
	mustRound(t, r, c)
	attempts = h.attempts.Load()
	f.stripe.subscribe(dave, 3)
	mustRound(t, r, c)
	if got := h.attempts.Load(); got != attempts+1 {
		t.Errorf("a new rank after UserNotFound sent %d requests, want 1", got-attempts)
	}
}

// A hold answering a tier name with a NUL made the record of the push
// fail (the database refuses such text), so the round failed, and every
// round after pushed again and failed again. The push is recorded
// without the name, and the next round has nothing to push.
func TestATierNameThatCannotBeStoredIsDroppedNotTheRound(t *testing.T) {
	for _, bad := range []string{"gold\x00x", strings.Repeat("n", maxTierNameBytes+1)} {
		f := newFixture(t)
		h := newFakeHold(t)
		h.tierName = bad
		f.crew(t, h, alice, "a", 1)
		f.stripe.subscribe(alice, 2)
		c := f.acquire(t, "inst-a")
		r := f.refresher(t, zerolog.Nop())
		if rep := mustRound(t, r, c); rep.Pushed != 1 || rep.Failed != 0 {
			t.Fatalf("report %+v, want the push recorded", rep)
		}
		if got, ok := f.recorded(t, h, alice); !ok || got.Outcome != OutcomePushed || got.Name != "" || got.Rank != 2 {
			t.Fatalf("recorded %+v (%v), want pushed at rank 2 without the name", got, ok)
		}
		attempts := h.attempts.Load()
		mustRound(t, r, c)
		if h.attempts.Load() != attempts {
			t.Fatalf("pushed again after the push was recorded")
		}
	}
}

func TestAnswerReceivedWhileStoppingIsStillRecorded(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.crew(t, h, bob, "b", 1)
	f.stripe.subscribe(alice, 1)
	f.stripe.subscribe(bob, 1)
	c := f.acquire(t, "inst-a")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := f.refresher(t, zerolog.Nop())
	r.answered = cancel // custody ends right after alice's push was answered

	if err := r.Run(ctx, c); !errors.Is(err, context.Canceled) {
		t.Fatalf("run stopped mid-round: %v, want context.Canceled", err)
	}
	wantPushes(t, h, push{alice, 1})
	if got, ok := f.recorded(t, h, alice); !ok || got.Rank != 1 {
		t.Errorf("the push the hold applied was not recorded: %+v %v", got, ok)
	}
	if _, ok := f.recorded(t, h, bob); ok {
		t.Error("bob recorded although the worker stopped before pushing")
	}

	mustRound(t, f.refresher(t, zerolog.Nop()), c)
	wantPushes(t, h, push{bob, 1}) // alice is not pushed again
}

// slowAnswer is how long the fake hold takes to answer once the worker
// was told to stop: a client that gives up on the push does so within
// milliseconds.
const slowAnswer = 200 * time.Millisecond

func TestAPushInFlightAtAGracefulStopIsLetFinishAndRecorded(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.crew(t, h, bob, "b", 1)
	f.stripe.subscribe(alice, 1)
	f.stripe.subscribe(bob, 1)
	c := f.acquire(t, "inst-a")
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	var cutShort atomic.Bool
	h.onAnswer(func(r *http.Request) {
		stop(workers.ErrDrain) // the job runner's graceful stop, mid-push
		select {
		case <-r.Context().Done():
			cutShort.Store(true)
		case <-time.After(slowAnswer):
		}
	})
	r := f.refresher(t, zerolog.Nop())
	if err := r.Run(ctx, c); !errors.Is(err, context.Canceled) {
		t.Fatalf("run stopped mid-round: %v, want context.Canceled", err)
	}
	if cutShort.Load() {
		t.Error("a graceful stop cut the push in flight short")
	}
	wantPushes(t, h, push{alice, 1}) // bob is not pushed once stopping
	if got, ok := f.recorded(t, h, alice); !ok || got.Rank != 1 || got.Fence != c.Fence {
		t.Errorf("the push in flight at the graceful stop was not recorded: %+v %v", got, ok)
	}
	h.onAnswer(nil)
	mustRound(t, f.refresher(t, zerolog.Nop()), f.handOver(t, "inst-b"))
	wantPushes(t, h, push{bob, 1}) // alice is not pushed again
}

func TestAPushInFlightWhenCustodyIsLostIsCutShort(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.stripe.subscribe(alice, 1)
	c := f.acquire(t, "inst-a")
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	h.onAnswer(func(r *http.Request) {
		stop(nil) // lost custody: stop at once
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
			t.Error("the push in flight was not cut short when custody was lost")
		}
	})
	if err := f.refresher(t, zerolog.Nop()).Run(ctx, c); !errors.Is(err, context.Canceled) {
		t.Fatalf("run stopped mid-round: %v, want context.Canceled", err)
	}
	if _, ok := f.recorded(t, h, alice); ok {
		t.Error("a push cut short was recorded as pushed")
	}
}

func TestStripeSourceMapsSubscriptionsToTiers(t *testing.T) {
	f := newFakeStripe(t)
	// 150 active subscribers force a second page.
	for i := range 150 {
		f.add(subscription(fmt.Sprintf("sub_bulk_%03d", i), "active",
			map[string]string{MetadataDID: fmt.Sprintf("did:plc:bulk%03d", i)}, "cus_b", nil, price(1)))
	}
	f.add(
		// DID only on the customer.
		subscription("sub_cust", "active", nil, "cus_c", map[string]string{MetadataDID: carol}, price(2)),
		// Two subscriptions and two prices: the highest rank wins.
		subscription("sub_a1", "active", map[string]string{MetadataDID: alice}, "cus_a", nil, price(1), price(4)),
		subscription("sub_a2", "trialing", map[string]string{MetadataDID: alice}, "cus_a", nil, price(3)),
		// Trialing counts.
		subscription("sub_trial", "trialing", map[string]string{MetadataDID: dave}, "cus_d", nil, price(5)),
		// Not current: ignored.
		subscription("sub_gone", "canceled", map[string]string{MetadataDID: bob}, "cus_bob", nil, price(9)),
		// Malformed: skipped and reported.
		subscription("sub_nodid", "active", nil, "cus_n", nil, price(1)),
		subscription("sub_norank", "active", map[string]string{MetadataDID: "did:plc:norank"}, "cus_r", nil,
			map[string]string{MetadataTier: "pro"}),
		subscription("sub_badrank", "active", map[string]string{MetadataDID: "did:plc:badrank"}, "cus_r", nil,
			map[string]string{MetadataTierRank: "-1"}),
	)
	var logs bytes.Buffer
	s := &Stripe{BaseURL: f.URL, SecretKey: secretKey, Log: zerolog.New(&logs)}
	tiers, err := s.Tiers(context.Background())
	if err != nil {
		t.Fatalf("tiers: %v", err)
	}
	if len(tiers) != 153 {
		t.Errorf("%d subscribers, want 153", len(tiers))
	}
	for did, want := range map[string]Tier{
		alice: {"plan-4", 4}, carol: {"plan-2", 2}, dave: {"plan-5", 5}, "did:plc:bulk149": {"plan-1", 1},
	} {
		if got := tiers[did]; got != want {
			t.Errorf("%s: %+v, want %+v", did, got, want)
		}
	}
	for _, absent := range []string{bob, "did:plc:norank", "did:plc:badrank"} {
		if _, ok := tiers[absent]; ok {
			t.Errorf("%s has a tier", absent)
		}
	}
	if !strings.Contains(logs.String(), `"count":3`) || !strings.Contains(logs.String(), "sub_nodid") {
		t.Errorf("skipped subscriptions not reported:\n%s", logs.String())
	}
	if got := f.requests.Load(); got != 3 { // two active pages, one trialing
		t.Errorf("%d requests to Stripe, want 3", got)
	}
}

func TestStripeFailureEndsTheRoundWithoutPushes(t *testing.T) {
	f := newFixture(t)
	h := newFakeHold(t)
	f.crew(t, h, alice, "a", 1)
	f.stripe.subscribe(alice, 1)
	c := f.acquire(t, "inst-a")
	r, err := New(Options{
		DB:        f.db,
		Source:    &Stripe{BaseURL: f.stripe.URL, SecretKey: "sk_test_wrong_key"},
		Endpoints: &identity.Resolver{WebScheme: "http", HTTP: loopback},
		HTTP:      loopback,
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Round(context.Background(), c)
	if err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("round with a bad key: %v, want an error naming HTTP 401", err)
	}
	if strings.Contains(err.Error(), "sk_test_wrong_key") {
		t.Errorf("error leaks the secret key: %v", err)
	}
	if h.attempts.Load() != 0 {
		t.Error("pushed without knowing the tiers")
	}
}

func TestWorkerRegistersOnlyWhenEnabled(t *testing.T) {
	f := newFixture(t)
	cfg := config.Default()
	d := workers.Deps{Config: cfg, DB: f.db, Log: zerolog.Nop(), Metrics: prometheus.NewRegistry()}
	if _, err := Worker(d); !errors.Is(err, workers.ErrDisabled) {
		t.Errorf("disabled: err %v, want ErrDisabled", err)
	}

	cfg.Billing.Enabled = true
	d.Config = cfg
	var ce *config.Error
	if _, err := Worker(d); !errors.As(err, &ce) || ce.Key != "billing.stripe_secret_key" {
		t.Errorf("no key: err %v, want *config.Error for billing.stripe_secret_key", err)
	}

	cfg.Billing.StripeSecretKey, cfg.Billing.Interval = secretKey, 20*time.Minute
	d.Config = cfg
	w, err := Worker(d)
	if err != nil {
		t.Fatalf("worker: %v", err)
	}
	if w.Name != "billing-tier-refresh" || !w.Leased || w.Job == nil || w.Interval != 20*time.Minute {
		t.Errorf("worker %+v", w)
	}
	var reg system.Registry
	if err := reg.Register(w); err != nil {
		t.Errorf("register: %v", err)
	}
}

func counterValue(t *testing.T, g prometheus.Gatherer, name, outcome string) float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestStripeListingThatDoesNotAdvanceStopsAtTheSecondPage: a Stripe (or a
// proxy) that answers has_more with the same last id for every
// starting_after would cost stripeMaxPages requests a round; the listing
// stops once a starting_after repeats.
func TestStripeListingThatDoesNotAdvanceStopsAtTheSecondPage(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "has_more": true,
			"data": []any{subscription("sub_stuck", "active", map[string]string{MetadataDID: alice}, "cus_a", nil, price(1))}})
	}))
	t.Cleanup(srv.Close)
	s := &Stripe{BaseURL: srv.URL, SecretKey: secretKey, Log: zerolog.Nop()}
	_, err := s.Tiers(context.Background())
	if err == nil || !strings.Contains(err.Error(), "does not advance") || !strings.Contains(err.Error(), "sub_stuck") {
		t.Fatalf("tiers: %v, want a listing that does not advance", err)
	}
	if got := requests.Load(); got != 2 {
		t.Errorf("%d requests to Stripe, want 2 (stopped at the second page)", got)
	}
}
