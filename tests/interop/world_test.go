//go:build interop

package interop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
)

// world is a simulator and the Jetstream servers on it.
type world struct {
	t    *testing.T
	dir  string
	c    *harness.Cluster
	sim  *harness.Instance
	js   []*jetstreamServer
	simA string
}

type jetstreamServer struct {
	addr string
	proc *harness.Instance
	args []string
}

func (j *jetstreamServer) v2URL() string {
	return "ws://" + j.addr + "/xrpc/network.bsky.jetstream.subscribeEvents"
}
func (j *jetstreamServer) v1URL() string { return "ws://" + j.addr + "/subscribe" }

// newWorld starts a simulator (100 accounts of 2 records) and n Jetstream
// servers on it (extra flags for every Jetstream in jsFlags), each
// bootstrapped and serving.
func newWorld(t *testing.T, n int, jsFlags ...string) *world {
	return newWorldOf(t, 100, 2, n, jsFlags...)
}

// newWorldOf is newWorld with the simulator's accounts and records per
// account at bootstrap.
func newWorldOf(t *testing.T, accounts, records, n int, jsFlags ...string) *world {
	t.Helper()
	w := &world{t: t, dir: t.TempDir(), simA: freeAddr(t)}
	w.c = harness.NewCluster(bin, w.dir)
	t.Cleanup(func() {
		w.c.Close()
		if t.Failed() {
			t.Log(w.c.Dump(30))
		}
	})
	sim, err := harness.StartCommand(filepath.Join(w.dir, "sim"), "simulator",
		filepath.Join(tools, "simulator"), "serve", "--addr", w.simA, "--data-dir", filepath.Join(w.dir, "sim", "world"),
		"--accounts", fmt.Sprint(accounts), "--initial-records-per-account", fmt.Sprint(records), "--commits-per-sec", fmt.Sprint(simRate), "--reset")
	if err != nil {
		t.Fatal(err)
	}
	w.c.Adopt(sim)
	w.sim = sim
	waitHTTP(t, "http://"+w.simA+"/xrpc/com.atproto.sync.listRepos")
	// The Jetstreams bootstrap side by side, each on its own.
	for i := range n {
		w.js = append(w.js, w.startJetstream(fmt.Sprintf("jetstream%d", i+1), jsFlags...))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, j := range w.js {
		if _, err := j.proc.Wait(ctx, harness.Msg("steady-state consumer running")); err != nil {
			t.Fatalf("%s did not reach its steady state: %v\n%s", j.proc.ID, err, j.proc.Tail(20))
		}
	}
	return w
}

// startJetstream starts a Jetstream on the simulator; it is serving once
// it logs its steady state.
func (w *world) startJetstream(name string, flags ...string) *jetstreamServer {
	t := w.t
	j := &jetstreamServer{addr: freeAddr(t)}
	j.args = append([]string{filepath.Join(tools, "jetstream"), "serve", "--addr", j.addr,
		"--relay-url", "http://" + w.simA, "--plc-url", "http://" + w.simA,
		"--data-dir", filepath.Join(w.dir, name, "data"), "--log-level", "info"}, flags...)
	p, err := harness.StartCommand(filepath.Join(w.dir, name), name, j.args...)
	if err != nil {
		t.Fatal(err)
	}
	w.c.Adopt(p)
	j.proc = p
	return j
}

func waitHTTP(t *testing.T, u string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s never answered", u)
}

// probeEvent is one event as the probe saw it on the v2 wire.
type probeEvent struct {
	seq int64
	// at is the host's time for the event (its "time").
	at time.Time
	// key names the event across Jetstream hosts (the upstream relay's
	// sequence number, or the commit's did/collection/rkey/rev).
	key string
}

// probe reads j's v2 stream with the appview's filter from its first
// event until no event came for quiet, or until it has seen seq until
// (until < 0: until an event witnessed after the call, the live tip).
func probe(t *testing.T, j *jetstreamServer, until int64, quiet time.Duration) []probeEvent {
	called := time.Now()
	t.Helper()
	conn, _, err := websocket.DefaultDialer.Dial(j.v2URL()+"?collections="+collections+"&cursor=1", nil)
	if err != nil {
		t.Fatalf("probe %s: %v", j.addr, err)
	}
	defer conn.Close()
	var out []probeEvent
	for {
		conn.SetReadDeadline(time.Now().Add(quiet))
		_, msg, err := conn.ReadMessage()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return out
			}
			t.Fatalf("probe %s: %v", j.addr, err)
		}
		ev, ok := parseProbe(msg)
		if !ok {
			continue
		}
		out = append(out, ev)
		if (until > 0 && ev.seq >= until) || (until < 0 && ev.at.After(called)) {
			return out
		}
	}
}

// newestSeq is the highest sequence number j has served (for the filter).
func newestSeq(t *testing.T, j *jetstreamServer) int64 {
	evs := probe(t, j, -1, 3*time.Second)
	if len(evs) == 0 {
		t.Fatalf("%s served no event", j.addr)
	}
	return evs[len(evs)-1].seq
}

// waitServed waits until j serves seq (for the appview's filter): it
// reads j's stream from its first event until seq or a later one, failing
// the test when the stream went quiet for quiet before that.
func waitServed(t *testing.T, j *jetstreamServer, seq int64, quiet time.Duration) {
	t.Helper()
	evs := probe(t, j, seq, quiet)
	if len(evs) == 0 || evs[len(evs)-1].seq < seq {
		var last int64
		if len(evs) > 0 {
			last = evs[len(evs)-1].seq
		}
		t.Fatalf("%s did not reach seq %d (its stream went quiet for %v at seq %d)", j.addr, seq, quiet, last)
	}
}

// appview starts `appview serve` with the consumer on urls.
func appview(t *testing.T, c *harness.Cluster, id, db string, urls []string, set map[string]any) *harness.Instance {
	t.Helper()
	s := map[string]any{
		"jetstream.urls":            urls,
		"jetstream.collections":     []string{collections},
		"jetstream.compress":        true,
		"jetstream.stale_timeout":   staleTimeout.String(),
		"jetstream.unhealthy_after": (2 * staleTimeout).String(),
		"jetstream.rewind":          "5s",
	}
	for k, v := range set {
		s[k] = v
	}
	i, err := c.Start(context.Background(), harness.Spec{ID: id, DatabaseURL: "file:" + db, Set: s})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := i.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return i
}

// seed writes a position into a new database: host's seq.
func seed(t *testing.T, db, host string, seq int64) {
	t.Helper()
	ctx := context.Background()
	d, err := database.Open(ctx, database.Options{URL: "file:" + db, BusyTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Exec(`INSERT INTO jetstream_cursor (id, time_us, updated_at, fence, host, seq) VALUES (1, 0, 0, 0, ?1, ?2)`, host, seq); err != nil {
		t.Fatal(err)
	}
}

// batch is one "jetstream batch committed" line.
type batch struct {
	at          time.Time
	host        string
	first, last int64
	events      int
	inst        int // index of the process (start) that logged it
}

func batches(insts ...*harness.Instance) []batch {
	var out []batch
	for k, i := range insts {
		for _, e := range i.Log.Find(0, harness.Msg(committedMsg)) {
			out = append(out, batchOf(e, k))
		}
	}
	return out
}

const committedMsg = "jetstream batch committed"

// batchOf reads a committed batch line of the process insts[inst].
func batchOf(e harness.Event, inst int) batch {
	return batch{at: e.Logged, host: e.Str("host"), first: num(e, "first_seq"), last: num(e, "last_seq"),
		events: int(num(e, "events")), inst: inst}
}

// committedOn matches a committed batch on host reaching seq.
func committedOn(host string, seq int64) harness.Match {
	return func(e harness.Event) bool {
		return e.Msg == committedMsg && e.Str("host") == host && num(e, "last_seq") >= seq
	}
}

func num(e harness.Event, key string) int64 {
	var n int64
	_ = json.Unmarshal(e.Fields[key], &n)
	return n
}

// waitSeq waits until any of insts committed a batch on host reaching seq
// (an instance that exited is searched too) and returns that batch.
func waitSeq(t *testing.T, host string, seq int64, within time.Duration, insts ...*harness.Instance) batch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if i, e, err := harness.WaitAny(ctx, committedOn(host, seq), insts...); err == nil {
		return batchOf(e, slices.Index(insts, i))
	}
	var last int64
	for _, b := range batches(insts...) {
		if b.host == host {
			last = max(last, b.last)
		}
	}
	t.Fatalf("no batch on %s reached seq %d within %v (last committed seq %d)", host, seq, within, last)
	return batch{}
}

// checkCovered fails for every probed seq in [from, to] that no committed
// batch on host covers (a gap).
func checkCovered(t *testing.T, host string, probed []probeEvent, from, to int64, bs []batch) {
	t.Helper()
	var missing []int64
	for _, p := range probed {
		if p.seq < from || p.seq > to {
			continue
		}
		ok := false
		for _, b := range bs {
			if b.host == host && b.first <= p.seq && p.seq <= b.last {
				ok = true
				break
			}
		}
		if !ok {
			missing = append(missing, p.seq)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("gap: %d events on %s never committed, e.g. seqs %v", len(missing), host, missing[:min(10, len(missing))])
	}
}

// position reads the stored position.
func position(t *testing.T, db string) (host string, seq, timeUS int64) {
	t.Helper()
	d, err := database.Open(context.Background(), database.Options{URL: "file:" + db, BusyTimeout: 5 * time.Second, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.QueryRow(`SELECT `+database.Text("host")+`, seq, time_us FROM jetstream_cursor WHERE id = 1`).Scan(&host, &seq, &timeUS); err != nil {
		t.Fatal(err)
	}
	return host, seq, timeUS
}

// liveProbe reads a Jetstream's v2 stream in the background from its
// first event until the connection ends.
type liveProbe struct {
	mu     chan struct{} // a one-slot lock
	events []probeEvent
	done   chan struct{}
}

func startProbe(t *testing.T, j *jetstreamServer) *liveProbe {
	t.Helper()
	conn, _, err := websocket.DefaultDialer.Dial(j.v2URL()+"?collections="+collections+"&cursor=1", nil)
	if err != nil {
		t.Fatalf("probe %s: %v", j.addr, err)
	}
	p := &liveProbe{mu: make(chan struct{}, 1), done: make(chan struct{})}
	t.Cleanup(func() { conn.Close(); <-p.done })
	go func() {
		defer close(p.done)
		for {
			_, msg, err := conn.ReadMessage()
			if err != nil {
				return
			}
			if ev, ok := parseProbe(msg); ok {
				p.mu <- struct{}{}
				p.events = append(p.events, ev)
				<-p.mu
			}
		}
	}()
	return p
}

func (p *liveProbe) snapshot() []probeEvent {
	p.mu <- struct{}{}
	defer func() { <-p.mu }()
	return slices.Clone(p.events)
}

// parseProbe reads one v2 frame as a probeEvent.
func parseProbe(msg []byte) (probeEvent, bool) {
	var f struct {
		Type    string `json:"$type"`
		Payload struct {
			Type       string `json:"$type"`
			Seq        int64  `json:"seq"`
			DID        string `json:"did"`
			Collection string `json:"collection"`
			RKey       string `json:"rkey"`
			Rev        string `json:"rev"`
			Time       string `json:"time"`
			Identity   struct{ Seq int64 }
			Account    struct{ Seq int64 }
			Sync       struct{ Seq int64 }
		} `json:"payload"`
	}
	if json.Unmarshal(msg, &f) != nil || f.Type != "message" || f.Payload.Seq == 0 {
		return probeEvent{}, false
	}
	p := f.Payload
	at, _ := time.Parse(time.RFC3339Nano, p.Time)
	key := fmt.Sprintf("%s %s %d %d %d", p.Type, p.DID, p.Identity.Seq, p.Account.Seq, p.Sync.Seq)
	if strings.HasSuffix(p.Type, "#commit") {
		key = p.DID + "/" + p.Collection + "/" + p.RKey + "@" + p.Rev
	}
	return probeEvent{seq: p.Seq, key: key, at: at}, true
}
