package webhooks

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/testsupport"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
)

const (
	testLease  = "jetstream-consumer"
	testOwner  = "did:plc:owner111"
	waitBudget = 10 * time.Second
)

// env is one test's database, lease and actor system.
type env struct {
	t       *testing.T
	ctx     context.Context
	db      *database.DB
	custody fence.Custody
	sys     *actor.ActorSystem
	// stopped holds the dispatchers already stopped (stop is idempotent).
	stopped map[*actor.PID]bool
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	db := testsupport.OpenDB(t)
	e := &env{t: t, ctx: ctx, db: db, stopped: map[*actor.PID]bool{}}
	e.custody = e.acquire("instance-a")
	e.sys = testsupport.NewActorSystem(t)
	return e
}

// acquire takes the consumer lease for holder (it must be free or expired).
func (e *env) acquire(holder string) fence.Custody {
	e.t.Helper()
	return testsupport.Custody(e.t, e.db, testLease, holder, time.Minute)
}

func (e *env) addWebhook(url, secret string) int64 {
	e.t.Helper()
	id, err := Add(e.ctx, e.db, Webhook{DID: testOwner, URL: url, Secret: secret}, Guard{AllowPrivate: true})
	if err != nil {
		e.t.Fatalf("add webhook: %v", err)
	}
	return id
}

// enqueue runs EnqueueTx in a transaction fenced by c, as the consumer does.
func (e *env) enqueue(c fence.Custody, pushes ...Push) int {
	e.t.Helper()
	var n int
	err := fence.Fenced(e.ctx, e.db, c, func(tx *sql.Tx) error {
		var err error
		n, err = EnqueueTx(e.ctx, tx, pushes)
		return err
	})
	if err != nil {
		e.t.Fatalf("enqueue: %v", err)
	}
	return n
}

func (e *env) options(c fence.Custody, cfg config.Webhooks, m *Metrics) DispatcherOptions {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if len(cfg.RetrySchedule) == 0 {
		cfg.RetrySchedule = []time.Duration{0}
	}
	if m == nil {
		m, _ = NewMetrics(nil)
	}
	client := NewClient(Guard{AllowPrivate: cfg.AllowPrivate})
	e.t.Cleanup(client.CloseIdleConnections)
	return DispatcherOptions{DB: e.db, Custody: c, Config: cfg, Client: client, Metrics: m, Log: zerolog.Nop()}
}

// spawn starts a dispatcher at the root and stops it when the test ends.
func (e *env) spawn(o DispatcherOptions) *actor.PID {
	pid := e.sys.Root.Spawn(NewDispatcherProps(o))
	e.t.Cleanup(func() { e.stop(pid) })
	return pid
}

// stop stops a dispatcher and waits until it has stopped; a second stop
// of the same one does nothing.
func (e *env) stop(pid *actor.PID) {
	if e.stopped[pid] {
		return
	}
	e.stopped[pid] = true
	if err := e.sys.Root.StopFuture(pid).Wait(); err != nil {
		e.t.Errorf("stop dispatcher: %v", err)
	}
}

// settle stops a dispatcher before the test reads its counters. A
// dispatcher counts an outcome after the transaction that records it has
// committed (record, claimDue), so a row the test sees as delivered or
// failed may not be counted yet; the stop waits for every goroutine the
// dispatcher started (shutdown), and with them for every count.
func (e *env) settle(pid *actor.PID) { e.stop(pid) }

// deliveryRow is the part of a webhook_deliveries row tests look at.
type deliveryRow struct {
	Status     string
	Attempts   int
	Fence      int64
	LastError  string
	StatusCode int
	UpdatedAt  int64
	Payload    sql.NullString
}

func (e *env) delivery(webhookID int64, key string) deliveryRow {
	e.t.Helper()
	var r deliveryRow
	err := e.db.QueryRow(`SELECT `+database.Text("status")+`, attempts, fence, `+database.Text("last_error")+`, last_status_code,
		updated_at, `+database.Text("payload")+`
		FROM webhook_deliveries WHERE webhook_id = ?1 AND event_key = ?2`, webhookID, key).
		Scan(&r.Status, &r.Attempts, &r.Fence, &r.LastError, &r.StatusCode, &r.UpdatedAt, &r.Payload)
	if err != nil {
		e.t.Fatalf("read delivery %d %s: %v", webhookID, key, err)
	}
	return r
}

func (e *env) waitStatus(webhookID int64, key, status string) deliveryRow {
	e.t.Helper()
	var r deliveryRow
	testsupport.Eventually(e.t, "delivery "+key+" "+status, func() bool {
		r = e.delivery(webhookID, key)
		return r.Status == status
	})
	return r
}

func push(repo, digest string) Push {
	return Push{
		OwnerDID:   testOwner,
		Repository: repo,
		Digest:     digest,
		MediaType:  "application/vnd.oci.image.manifest.v1+json",
		HoldDID:    "did:web:hold01.example.com",
		PushedAt:   1_700_000_000_123,
		EventKey:   PushEventKey(testOwner, repo, digest),
	}
}

// received is one request as the receiver saw it.
type received struct {
	At     time.Time
	Header http.Header
	Body   []byte
	Method string
}

// receiver is a local webhook endpoint that records every request and
// answers with whatever respond returns.
type receiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	got     []received
	respond func(r *http.Request, n int) int
}

func newReceiver(t *testing.T, respond func(r *http.Request, n int) int) *receiver {
	rc := &receiver{respond: respond}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.got = append(rc.got, received{At: time.Now(), Header: r.Header.Clone(), Body: body, Method: r.Method})
		n := len(rc.got)
		rc.mu.Unlock()
		code := http.StatusOK
		if rc.respond != nil {
			code = rc.respond(r, n)
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// byDelivery counts requests per X-Appview-Delivery.
func (rc *receiver) byDelivery() map[string]int {
	out := map[string]int{}
	for _, r := range rc.requests() {
		out[r.Header.Get(HeaderDelivery)]++
	}
	return out
}

// leakCheck verifies, at the end of the test (after every cleanup that
// was registered later has run), that no goroutine of ours is left.
func leakCheck(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { testsupport.VerifyNone(t, before) })
}

// metricValue reads a counter or gauge (prometheus/testutil would need a
// module the project does not pin).
func metricValue(m prometheus.Metric) float64 {
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		panic(err)
	}
	if c := out.GetCounter(); c != nil {
		return c.GetValue()
	}
	return out.GetGauge().GetValue()
}
