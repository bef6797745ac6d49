//go:build interop

// Package interop runs real `appview serve` processes against Bluesky's
// own Jetstream v2 server and network simulator (prebuilt in
// ../shared/tools/jetstream-v2, or JETSTREAM_V2_DIR). Tier 1: the
// Jetstream protocol (both wires, positions, failover, silent upstream,
// CursorTooOld, health-aware custody). Run it with scripts/interop.
//
// What "saw" means here: with log_level debug the consumer logs every
// committed batch ("jetstream batch committed": host, first_seq,
// last_seq). A probe client reads the same Jetstream from its first event
// with the same filter; every sequence number the probe saw must fall in
// a committed batch's range (no gap), and every start must resume at or
// past the last committed batch (no regression).
package interop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
)

// Timings of the suite.
const (
	// staleTimeout is jetstream.stale_timeout of every appview here.
	staleTimeout = 3 * time.Second
	// simRate is the simulator's commits per second.
	simRate = 150
	// backlogRate and backlogFor build the backlog the catch-up figures
	// are measured on (commits per second, for how long).
	backlogRate = 1500
	backlogFor  = 15 * time.Second
	// collections: the simulator's traffic is app.bsky.*; the consumer
	// asks for it so that every commit moves its position (the processor
	// skips them as outside io.atcr, counted).
	collections = "app.bsky.*"
)

var (
	bin   string // the appview binary
	tools string // the directory holding jetstream and simulator
)

func TestMain(m *testing.M) {
	start := time.Now()
	code := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		root, err := harness.ModuleRoot(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		scratch, err := os.MkdirTemp("", "appview-interop-*")
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		defer os.RemoveAll(scratch)
		tools, err = findTools(root, scratch)
		if err != nil {
			fmt.Fprintln(os.Stderr, "interop: FAIL:", err)
			return 1
		}
		// Jetstream refuses any JETSTREAM_* variable it does not know,
		// and the processes started here inherit this environment.
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "JETSTREAM_") {
				os.Unsetenv(k)
			}
		}
		bin = filepath.Join(scratch, "appview")
		if err := harness.Build(ctx, root, "./cmd/appview", bin, false); err != nil {
			fmt.Fprintln(os.Stderr, "interop:", err)
			return 1
		}
		return m.Run()
	}()
	fmt.Fprintf(os.Stderr, "interop tier 1: %s\n", time.Since(start).Round(time.Second))
	os.Exit(code)
}

// findTools locates the prebuilt jetstream and simulator: JETSTREAM_V2_DIR
// or ../shared/tools/jetstream-v2 from the module root. Binaries without
// the run bit are copied into scratch and made executable there. Absent
// tools are an error, never a skip.
func findTools(root, scratch string) (string, error) {
	dir := os.Getenv("JETSTREAM_V2_DIR")
	if dir == "" {
		// shared/ sits beside the clone (CI) or two levels up (a worktree).
		dir = filepath.Join(root, "..", "shared", "tools", "jetstream-v2")
		if _, err := os.Stat(dir); err != nil {
			if up := filepath.Join(root, "..", "..", "shared", "tools", "jetstream-v2"); exists(up) {
				dir = up
			}
		}
	}
	var copyTo string
	for _, name := range []string{"jetstream", "simulator"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("Jetstream v2 tools not found (%v): set JETSTREAM_V2_DIR to the folder holding jetstream and simulator", err)
		}
		if fi.Mode()&0o111 == 0 {
			copyTo = filepath.Join(scratch, "tools")
		}
	}
	if copyTo == "" {
		return dir, nil
	}
	if err := os.MkdirAll(copyTo, 0o755); err != nil {
		return "", err
	}
	for _, name := range []string{"jetstream", "simulator"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(copyTo, name), b, 0o755); err != nil {
			return "", err
		}
	}
	return copyTo, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// freeAddr returns a free 127.0.0.1 port.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

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

// newWorld starts a simulator and n Jetstream servers on it (extra flags
// for every Jetstream in jsFlags), each bootstrapped and serving.
func newWorld(t *testing.T, n int, jsFlags ...string) *world {
	return newWorldAt(t, simRate, n, jsFlags...)
}

// newWorldAt is newWorld with the simulator at rate commits per second.
func newWorldAt(t *testing.T, rate, n int, jsFlags ...string) *world {
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
		"--accounts", "100", "--initial-records-per-account", "2", "--commits-per-sec", fmt.Sprint(rate), "--reset")
	if err != nil {
		t.Fatal(err)
	}
	w.c.Adopt(sim)
	w.sim = sim
	waitHTTP(t, "http://"+w.simA+"/xrpc/com.atproto.sync.listRepos")
	for i := range n {
		w.js = append(w.js, w.startJetstream(fmt.Sprintf("jetstream%d", i+1), jsFlags...))
	}
	return w
}

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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := p.Wait(ctx, harness.Msg("steady-state consumer running")); err != nil {
		t.Fatalf("%s did not reach its steady state: %v\n%s", name, err, p.Tail(20))
	}
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
		for _, e := range i.Log.Find(0, harness.Msg("jetstream batch committed")) {
			out = append(out, batch{at: e.Logged, host: e.Str("host"), first: num(e, "first_seq"), last: num(e, "last_seq"),
				events: int(num(e, "events")), inst: k})
		}
	}
	return out
}

func num(e harness.Event, key string) int64 {
	var n int64
	_ = json.Unmarshal(e.Fields[key], &n)
	return n
}

// waitSeq waits until i (or any of insts) committed a batch on host
// reaching seq.
func waitSeq(t *testing.T, host string, seq int64, within time.Duration, insts ...*harness.Instance) batch {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, b := range batches(insts...) {
			if b.host == host && b.last >= seq {
				return b
			}
		}
		time.Sleep(20 * time.Millisecond)
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

// Both wires consume the same Jetstream from its first event; the stored
// position ends at Jetstream's own sequence number; every event is
// committed. Prints the catch-up rate of each wire (same run, same server).
func TestBothWiresConsumeTheStreamAndThePositionTracksJetstreamsSeq(t *testing.T) {
	w := newWorldAt(t, backlogRate, 1)
	j := w.js[0]
	time.Sleep(backlogFor) // let a backlog build
	// Freeze the simulator so both wires catch up on the same backlog.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.sim.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	defer w.sim.Signal(syscall.SIGCONT)
	target := newestSeq(t, j)
	probed := probe(t, j, target, 5*time.Second)
	host := j.addr
	// Each wire twice, in the order v2 v1 v1 v2, so neither gains from
	// going second (a warm page cache on the server).
	for round, wire := range []struct{ name, url string }{{"v2", j.v2URL()}, {"v1", j.v1URL()}, {"v1", j.v1URL()}, {"v2", j.v2URL()}} {
		db := filepath.Join(w.dir, fmt.Sprintf("%s-%d.db", wire.name, round))
		seed(t, db, host, 1)
		a := appview(t, w.c, fmt.Sprintf("appview-%s-%d", wire.name, round), db, []string{wire.url}, nil)
		b := waitSeq(t, host, target, 2*time.Minute, a)
		conn, err := a.Wait(context.Background(), harness.Msg("jetstream connected"))
		if err != nil {
			t.Fatal(err)
		}
		took := b.at.Sub(conn.Logged)
		events := 0
		for _, x := range batches(a) {
			if x.last <= target {
				events += x.events
			}
		}
		t.Logf("FIGURE catch-up %s wire: %d events to seq %d in %v from connect = %.0f events/s", wire.name, events, target, took.Round(time.Millisecond),
			float64(events)/took.Seconds())
		checkCovered(t, host, probed, 2, target, batches(a))
		if _, err := a.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		gotHost, seq, timeUS := position(t, db)
		if gotHost != host || seq < target || timeUS == 0 {
			t.Fatalf("%s wire: stored position host %q seq %d time_us %d, want host %q seq >= %d", wire.name, gotHost, seq, timeUS, host, target)
		}
	}
}

// appview is killed (SIGKILL or SIGTERM) and restarted at random points:
// every start resumes at or past the last committed batch, and every
// event is committed.
func TestKillAndRestartAtRandomPointsNeitherRegressesNorSkips(t *testing.T) {
	w := newWorld(t, 1)
	j := w.js[0]
	time.Sleep(3 * time.Second)
	db := filepath.Join(w.dir, "kill.db")
	seed(t, db, j.addr, 1)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 13))
	var starts []*harness.Instance
	for round := range 6 {
		a := appview(t, w.c, fmt.Sprintf("appview-%d", round), db, []string{j.v2URL()}, nil)
		starts = append(starts, a)
		e, err := a.Wait(context.Background(), harness.Msg("consumer started"))
		if err != nil {
			t.Fatal(err)
		}
		var before int64
		for _, b := range batches(starts[:len(starts)-1]...) {
			before = max(before, b.last)
		}
		if got := num(e, "seq"); got < before {
			t.Fatalf("start %d resumed at seq %d, before the last committed batch's %d: regression", round, got, before)
		}
		time.Sleep(time.Duration(300+rng.IntN(2500)) * time.Millisecond)
		sig := syscall.SIGKILL
		if round%2 == 1 {
			sig = syscall.SIGTERM
		}
		_ = a.Signal(sig)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, _ = a.ExitCode(ctx)
		cancel()
	}
	final := appview(t, w.c, "appview-final", db, []string{j.v2URL()}, nil)
	starts = append(starts, final)
	target := newestSeq(t, j)
	waitSeq(t, j.addr, target, time.Minute, starts...)
	checkCovered(t, j.addr, probe(t, j, target, 5*time.Second), 2, target, batches(starts...))
}

// A holder that dies before its first commit on a fresh database hands
// its successor where it began, not nothing: the first appview stores its
// starting time and is killed before it reads a single event (its only
// URL is dead); events go on arriving at Jetstream; the successor, on the
// real URL, must cover every event Jetstream saw from the first one's
// start on. (Before, it started at its own, later, live tail and the
// events in between were lost: the real-PDS suite met this in CI.)
func TestAHolderKilledBeforeItsFirstCommitHandsOnWhereItBegan(t *testing.T) {
	w := newWorld(t, 1)
	j := w.js[0]
	db := filepath.Join(w.dir, "fresh.db")
	first := appview(t, w.c, "first", db, []string{"ws://" + freeAddr(t) + "/xrpc/network.bsky.jetstream.subscribeEvents"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	started, err := first.Wait(ctx, harness.Msg("consumer started"))
	if err != nil {
		t.Fatalf("the first appview's consumer never started: %v\n%s", err, first.Tail(20))
	}
	_ = first.Signal(syscall.SIGKILL)
	if _, err := first.ExitCode(ctx); err != nil {
		t.Fatal(err)
	}
	// Let Jetstream see events the dead holder owed, for a few seconds.
	mark := newestSeq(t, j)
	waitNewer := time.Now().Add(20 * time.Second)
	for newestSeq(t, j) < mark+50 && time.Now().Before(waitNewer) {
	}
	next := appview(t, w.c, "next", db, []string{j.v2URL()}, nil)
	target := newestSeq(t, j)
	waitSeq(t, j.addr, target, time.Minute, next)
	probed := probe(t, j, target, 3*time.Second)
	from := int64(0)
	for _, p := range probed {
		if !p.at.Before(started.Time) {
			from = p.seq
			break
		}
	}
	if from == 0 {
		t.Fatalf("Jetstream saw no event after the first appview started at %v", started.Time)
	}
	t.Logf("the successor must cover seq %d (the first event after the dead holder began) to %d", from, target)
	checkCovered(t, j.addr, probed, from, target, batches(next))
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

// Two Jetstreams on one simulator: the first is killed, appview moves to
// the second and resumes there by time, with no gap: every event the
// second serves from the first one appview had not committed from the
// first on is committed. Prints the failover time.
func TestFailoverToASecondJetstreamResumesByTimeWithoutAGap(t *testing.T) {
	w := newWorld(t, 2)
	j1, j2 := w.js[0], w.js[1]
	p1 := startProbe(t, j1)
	time.Sleep(2 * time.Second)
	db := filepath.Join(w.dir, "failover.db")
	a := appview(t, w.c, "appview", db, []string{j1.v2URL(), j2.v2URL()}, nil)
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	time.Sleep(time.Second)
	killed := time.Now()
	j1.proc.Kill()
	<-p1.done
	var lastOn1 int64
	for _, b := range batches(a) {
		if b.host == j1.addr {
			lastOn1 = max(lastOn1, b.last)
		}
	}
	seenOn1 := map[string]bool{}
	for _, p := range p1.snapshot() {
		if p.seq <= lastOn1 {
			seenOn1[p.key] = true
		}
	}
	var first batch
	deadline := time.Now().Add(time.Minute)
	for first.host == "" && time.Now().Before(deadline) {
		for _, b := range batches(a) {
			if b.host == j2.addr {
				first = b
				break
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if first.host == "" {
		t.Fatal("appview never committed a batch from the second Jetstream")
	}
	t.Logf("FIGURE failover: first batch from the second Jetstream %v after the first was killed", first.at.Sub(killed).Round(time.Millisecond))
	target := newestSeq(t, j2)
	p2 := probe(t, j2, target, 5*time.Second)
	waitSeq(t, j2.addr, target, time.Minute, a)
	var from int64
	for _, p := range p2 {
		if !seenOn1[p.key] {
			from = p.seq
			break
		}
	}
	if from == 0 {
		t.Fatal("every event on the second Jetstream had been committed from the first: no failover traffic to check")
	}
	checkCovered(t, j2.addr, p2, from, target, batches(a))
	if host, _, _ := position(t, db); host != j2.addr {
		t.Fatalf("stored position on %q, want the second Jetstream %q", host, j2.addr)
	}
}

// The simulator is frozen (SIGSTOP): both Jetstreams stay up, answer
// pings, and send nothing. appview leaves its host within 2x
// stale_timeout. Prints the detection time (last event to the dial of
// the other host).
func TestASilentJetstreamIsLeftWithinTwiceTheStaleTimeout(t *testing.T) {
	w := newWorld(t, 2)
	j1, j2 := w.js[0], w.js[1]
	time.Sleep(2 * time.Second)
	db := filepath.Join(w.dir, "silent.db")
	a := appview(t, w.c, "appview", db, []string{j1.v2URL(), j2.v2URL()}, nil)
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.sim.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	t.Cleanup(func() { _ = w.sim.Signal(syscall.SIGCONT) })
	from := a.Log.Len()
	e, err := a.Log.WaitFrom(ctx, from, func(e harness.Event) bool {
		return e.Msg == "jetstream connected" && e.Str("url") == j2.v2URL()
	})
	if err != nil {
		t.Fatalf("appview did not move to the second Jetstream within 10s of the freeze: %v\n%s", err, a.Tail(20))
	}
	var lastEvent time.Time
	for _, b := range batches(a) {
		if b.host == j1.addr && b.at.Before(e.Logged) {
			lastEvent = b.at
		}
	}
	silentFrom := frozen
	if lastEvent.After(frozen) {
		silentFrom = lastEvent
	}
	since := e.Logged.Sub(silentFrom)
	t.Logf("FIGURE silent host: moved to the second Jetstream %v after the freeze (%v after the last batch; stale_timeout %v)",
		e.Logged.Sub(frozen).Round(time.Millisecond), e.Logged.Sub(lastEvent).Round(time.Millisecond), staleTimeout)
	if since > 2*staleTimeout {
		t.Fatalf("moved %v after the stream went silent, want within 2 x stale_timeout (%v)", since, 2*staleTimeout)
	}
}

// The first Jetstream is frozen (SIGSTOP), so appview moves to the
// second; once the first is thawed, appview switches back to it within a
// few failback intervals (jetstream.failback_interval) and goes on
// consuming there. Before failback, one bad moment of the first host left
// appview on the second for as long as that one delivered. Prints the time
// from the thaw to the switch.
func TestAThawedFirstJetstreamIsSwitchedBackTo(t *testing.T) {
	w := newWorld(t, 2)
	j1, j2 := w.js[0], w.js[1]
	time.Sleep(2 * time.Second)
	db := filepath.Join(w.dir, "failback.db")
	a := appview(t, w.c, "appview", db, []string{j1.v2URL(), j2.v2URL()}, map[string]any{"jetstream.failback_interval": "1s"})
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := j1.proc.Freeze(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j1.proc.Signal(syscall.SIGCONT) })
	from := a.Log.Len()
	if _, err := a.Log.WaitFrom(ctx, from, func(e harness.Event) bool {
		return e.Msg == "jetstream connected" && e.Str("url") == j2.v2URL()
	}); err != nil {
		t.Fatalf("appview did not move to the second Jetstream after the first froze: %v\n%s", err, a.Tail(20))
	}
	// Frozen, the first one takes connections (the kernel's backlog) and
	// never answers them: the probes must not switch back yet.
	time.Sleep(3 * time.Second)
	const switchedBack = "jetstream switching back to an earlier URL, which answers again"
	if early := a.Log.Find(from, harness.Msg(switchedBack)); len(early) > 0 {
		t.Fatalf("switched back to a frozen Jetstream: %+v", early[0])
	}
	if err := j1.proc.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()
	back, err := a.Log.WaitFrom(ctx, from, func(e harness.Event) bool {
		return e.Msg == switchedBack && e.Str("next_url") == j1.v2URL()
	})
	if err != nil {
		t.Fatalf("appview did not switch back to the thawed first Jetstream within a minute: %v\n%s", err, a.Tail(20))
	}
	t.Logf("FIGURE failback: switched back %v after the thaw (failback_interval 1s, stale_timeout %v)",
		back.Logged.Sub(thawed).Round(time.Millisecond), staleTimeout)
	waitSeq(t, j1.addr, newestSeq(t, j1), time.Minute, a)
	if host, _, _ := position(t, db); host != j1.addr {
		t.Fatalf("stored position on %q, want the first Jetstream %q", host, j1.addr)
	}
}

// A stored seq older than Jetstream's lookback is refused (CursorTooOld):
// appview logs the gap with its size, records it, requests a backfill
// run, resumes from the oldest event and keeps consuming.
func TestCursorTooOldIsLoggedRecordedAndResumedFromTheFloor(t *testing.T) {
	// Jetstream's lookback floor moves by sealed segment; a compaction
	// pass seals the active one, so a short interval seals every second.
	w := newWorld(t, 1, "--cursor-lookback", "3s", "--compaction-interval", "1s")
	j := w.js[0]
	db := filepath.Join(w.dir, "old.db")
	seed(t, db, j.addr, 1)
	waitTooOld(t, j, 1, 30*time.Second)
	a := appview(t, w.c, "appview", db, []string{j.v2URL()}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	isGap := func(e harness.Event) bool { return strings.HasPrefix(e.Msg, "Jetstream gap") }
	if _, err := a.Wait(ctx, isGap); err != nil {
		t.Fatalf("no gap logged: %v\n%s", err, a.Tail(20))
	}
	// The floor moves every second here, so the resume at the floor can
	// itself be refused: each refusal is a gap of its own, from the floor
	// the one before named; the first batch starts at the last floor.
	first := waitSeq(t, j.addr, 1, 30*time.Second, a)
	gaps := a.Log.Find(0, isGap)
	from := int64(1)
	var spans [][2]int64
	for _, e := range gaps {
		floor := num(e, "floor")
		if num(e, "cursor") != from || num(e, "gap_events") != floor-from || floor <= from {
			t.Fatalf("gap logged from seq %d, want a gap from %d with its size: %s", num(e, "cursor"), from, e.Line)
		}
		spans = append(spans, [2]int64{from, floor})
		from = floor
	}
	if first.first > from {
		t.Fatalf("first batch after the refusal starts at seq %d, want the floor %d", first.first, from)
	}
	d := stoppedDB(t, a, db)
	rows, err := d.Query(`SELECT from_seq, to_seq FROM jetstream_gaps WHERE host = ?1 ORDER BY from_seq`, j.addr)
	if err != nil {
		t.Fatal(err)
	}
	var stored [][2]int64
	for rows.Next() {
		var s [2]int64
		if err := rows.Scan(&s[0], &s[1]); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	var runs int
	if err := d.QueryRow(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NULL`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(stored) != fmt.Sprint(spans) || runs != 1 {
		t.Fatalf("gap rows %v and %d pending backfill runs, want %v (the gaps logged) and 1", stored, runs, spans)
	}
}

// A position by time older than Jetstream's lookback (a resume on another
// host than the stored one's) is clamped to the host's oldest event and
// announced (#info OutdatedCursor): appview logs the gap in time, records
// it with the time cursor and the first event's time and seq, requests a
// backfill run and keeps consuming.
func TestOutdatedTimeCursorIsLoggedRecordedAndResumed(t *testing.T) {
	w := newWorld(t, 1, "--cursor-lookback", "3s", "--compaction-interval", "1s")
	j := w.js[0]
	db := filepath.Join(w.dir, "old.db")
	seed(t, db, "elsewhere.invalid:443", 5)
	// The stored host is not j: the consumer resumes j by the shared time,
	// ten minutes ago, far below a 3 s lookback.
	old := time.Now().Add(-10 * time.Minute).UnixMicro()
	func() {
		d, err := database.Open(context.Background(), database.Options{URL: "file:" + db, BusyTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		if _, err := d.Exec(`UPDATE jetstream_cursor SET time_us = ?1, shared_us = ?1 WHERE id = 1`, old); err != nil {
			t.Fatal(err)
		}
	}()
	a := appview(t, w.c, "appview", db, []string{j.v2URL()}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	isGap := func(e harness.Event) bool { return strings.HasPrefix(e.Msg, "Jetstream gap") }
	gap, err := a.Wait(ctx, isGap)
	if err != nil {
		t.Fatalf("no gap logged: %v\n%s", err, a.Tail(20))
	}
	cursorUS, firstUS := num(gap, "cursor_us"), num(gap, "first_us")
	if cursorUS <= 0 || cursorUS > old || firstUS <= cursorUS {
		t.Fatalf("gap logged from %d to %d µs, want from at most the stored %d to a later first event: %s", cursorUS, firstUS, old, gap.Line)
	}
	waitSeq(t, j.addr, 1, 30*time.Second, a)
	d := stoppedDB(t, a, db)
	var fromSeq, toSeq, fromUS, toUS int64
	if err := d.QueryRow(`SELECT from_seq, to_seq, from_time_us, to_time_us FROM jetstream_gaps WHERE host = ?1`, j.addr).
		Scan(&fromSeq, &toSeq, &fromUS, &toUS); err != nil {
		t.Fatalf("gap row of %s: %v", j.addr, err)
	}
	var runs int
	if err := d.QueryRow(`SELECT COUNT(*) FROM backfill_runs WHERE completed_at IS NULL`).Scan(&runs); err != nil {
		t.Fatal(err)
	}
	if fromSeq != 0 || toSeq <= 0 || fromUS != cursorUS || toUS != firstUS || runs != 1 {
		t.Fatalf("gap row seq %d..%d, time %d..%d, %d pending backfill runs; want seq 0..first, the logged times %d..%d and 1 run",
			fromSeq, toSeq, fromUS, toUS, runs, cursorUS, firstUS)
	}
}

// stoppedDB stops a and opens its file database db, closed when t ends.
func stoppedDB(t *testing.T, a *harness.Instance, db string) *database.DB {
	t.Helper()
	if _, err := a.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, err := database.Open(context.Background(), database.Options{URL: "file:" + db, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// waitTooOld returns once j refuses cursor as older than its lookback
// (CursorTooOld at the upgrade), failing the test after within.
func waitTooOld(t *testing.T, j *jetstreamServer, cursor int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		conn, resp, err := websocket.DefaultDialer.Dial(fmt.Sprintf("%s?collections=%s&cursor=%d", j.v2URL(), collections, cursor), nil)
		if err == nil {
			conn.Close()
		} else if resp != nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(body), "CursorTooOld") {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still serves cursor %d after %v", j.addr, cursor, within)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Health-aware custody: two appviews on one database; the holder's
// Jetstream is unreachable, the contender's fine: the holder yields, the
// contender takes the lease and consumes with no gap. Needs the lease
// runtime's yield (skipped, saying so, without it).
func TestAnUnhealthyHolderYieldsToAHealthyContender(t *testing.T) {
	root, err := harness.ModuleRoot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command("grep", "-rl", "lease.yielded", filepath.Join(root, "actors", "lease")).Output()
	if len(strings.TrimSpace(string(out))) == 0 {
		t.Skip("skipped: needs lease yield (the lease runtime does not yield custody on workers.Health yet)")
	}
	w := newWorld(t, 1)
	j := w.js[0]
	db := filepath.Join(w.dir, "custody.db")
	fast := map[string]any{"leases.yield_grace": "2s", "leases.min_hold": "2s"}
	holder := appview(t, w.c, "holder", db, []string{"ws://" + freeAddr(t) + "/xrpc/network.bsky.jetstream.subscribeEvents"}, fast)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := holder.Wait(ctx, harness.Is("worker.started", "jetstream-consumer")); err != nil {
		t.Fatal(err)
	}
	contender := appview(t, w.c, "contender", db, []string{j.v2URL()}, fast)
	started := time.Now()
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
	defer cancel2()
	if _, err := holder.Wait(ctx2, harness.Is("lease.yielded", "jetstream-consumer")); err != nil {
		t.Fatalf("the unhealthy holder never yielded: %v\n%s\n%s", err, holder.Tail(10), contender.Tail(10))
	}
	if _, err := contender.Wait(ctx2, harness.Is("worker.started", "jetstream-consumer")); err != nil {
		t.Fatalf("the healthy contender never took the lease: %v\n%s\n%s", err, holder.Tail(10), contender.Tail(10))
	}
	t.Logf("FIGURE health-aware custody: the contender consumes %v after it started (unhealthy_after %v, yield_grace 2s, min_hold 2s)",
		time.Since(started).Round(time.Millisecond), 2*staleTimeout)
	target := newestSeq(t, j)
	waitSeq(t, j.addr, target, time.Minute, contender)
	// The holder never reached Jetstream, so it stored only where it
	// began (no event): the contender resumes from there, by time, and
	// from its first batch on misses nothing.
	bs := batches(contender)
	checkCovered(t, j.addr, probe(t, j, target, 3*time.Second), bs[0].first, target, bs)
	if host, seq, _ := position(t, db); host != j.addr || seq < target {
		t.Fatalf("stored position %s seq %d, want %s seq >= %d", host, seq, j.addr, target)
	}
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
