package tests

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
)

// leaseConsumer is the Jetstream consumer's lease (docs/spec.md §4).
const leaseConsumer = "jetstream-consumer"

// resendAcrossHandoverAllowed would tolerate, in a rolling restart
// (graceful handovers only), a push sent again by the next holder. It is
// false: before a graceful stop the LeaseActor sends workers.Drain, the
// consumer stops reading and the webhook dispatcher finishes the requests
// it has in flight and records their outcomes under the custody it still
// holds, so every push reaches the receiver exactly once.
const resendAcrossHandoverAllowed = false

// trafficPoll is how often a traffic scenario reads the database for
// progress: the consumer's commits are not logged one by one, so progress
// is polled, bounded by the step's context.
const trafficPoll = 50 * time.Millisecond

// traffic is synthetic io.atcr traffic (appview-dev synth) served at a bounded
// rate by `appview jetstream-replay`, one webhook per pushing user
// pointed at a local receiver, and the database state the stream must
// produce.
type traffic struct {
	t        *testing.T
	db       string
	url      string // ws:// of the replay server
	expected *synth.Expected
	firstUS  int64 // time_us of the stream's first event
	receiver *receiver
	reader   *database.DB
}

// trafficOptions sizes a stream.
type trafficOptions struct {
	events, users, holds int
	// rate is events per second per consumer connection (0: unpaced).
	rate float64
	// v2 numbers the stream's events (a "cursor" on every line, from 1)
	// and points the consumer at the replay server's v2 wire, which
	// serves them as proposal-0015 frames with those sequence numbers: a
	// consumer stores sequence positions and resumes by them.
	v2 bool
	// creator is the appview binary that creates and migrates the
	// database (its `webhooks add`); "" is the binary under test.
	creator string
}

// startTraffic writes the stream, registers the webhooks in db (before
// any instance runs, so every push is enqueued) and starts the replay
// server as part of c.
func startTraffic(t *testing.T, c *harness.Cluster, db string, o trafficOptions) *traffic {
	t.Helper()
	ctx := within(t, time.Minute)
	dir := filepath.Join(c.Dir, "traffic")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stream, expPath := filepath.Join(dir, "stream.jsonl"), filepath.Join(dir, "expected.json")
	runCmd(t, ctx, devBin, "synth", "--seed", "7", "--events", fmt.Sprint(o.events), "--users", fmt.Sprint(o.users),
		"--holds", fmt.Sprint(o.holds), "--out", stream, "--expected", expPath)
	if o.v2 {
		numberLines(t, stream)
	}
	creator := bin
	if o.creator != "" {
		creator = o.creator
	}
	data, err := os.ReadFile(expPath)
	if err != nil {
		t.Fatal(err)
	}
	tr := &traffic{t: t, db: db, expected: &synth.Expected{}, receiver: newReceiver(t)}
	if err := json.Unmarshal(data, tr.expected); err != nil {
		t.Fatal(err)
	}
	first, err := firstTimeUS(stream)
	if err != nil {
		t.Fatal(err)
	}
	tr.firstUS = first
	if len(tr.expected.PushEventKeys) == 0 {
		t.Fatal("the synthetic stream has no pushes: nothing would test the webhooks")
	}
	// One `webhooks add` per pushing user, as an operator would: the
	// first creates and migrates the database, the others run at once.
	add := func(did string) error {
		return runCmdErr(ctx, creator, "webhooks", "add", "--did", did, "--url", tr.receiver.URL, "--allow-private",
			"--set", "database.url="+db)
	}
	dids := pushingDIDs(tr.expected.PushEventKeys)
	if err := add(dids[0]); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, len(dids)-1)
	for _, did := range dids[1:] {
		go func() { errs <- add(did) }()
	}
	for range dids[1:] {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	addr, err := harness.FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	replay, err := harness.StartCommand(filepath.Join(dir, "replay"), "replay",
		bin, "jetstream-replay", "--file", stream, "--listen", addr, "--rate", fmt.Sprint(o.rate))
	if err != nil {
		t.Fatal(err)
	}
	c.Adopt(replay)
	if _, err := replay.Wait(ctx, harness.Msg("jetstream replay: serving")); err != nil {
		t.Fatal(err)
	}
	tr.url = "ws://" + addr + "/subscribe"
	if o.v2 {
		tr.url = "ws://" + addr + jetstream.PathV2
	}
	tr.reader, err = database.Open(ctx, database.Options{URL: db, BusyTimeout: 5 * time.Second, MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.reader.Close() })
	return tr
}

// spec is s with the consumer pointed at the replay server and webhooks
// allowed to reach the local receiver.
func (tr *traffic) spec(s harness.Spec) harness.Spec {
	set := map[string]any{
		"jetstream.urls":          []string{tr.url},
		"jetstream.rewind":        "200ms",
		"webhooks.allow_private":  true,
		"webhooks.retry_schedule": []string{"0s", "200ms", "500ms", "1s", "2s"},
	}
	for k, v := range s.Set {
		set[k] = v
	}
	s.Set = set
	return s
}

// cursor is the consumer's stored cursor (docs/spec.md §8), 0 before the first commit.
func (tr *traffic) cursor(ctx context.Context) (int64, error) {
	var us int64
	err := database.Bounded(ctx, func() error {
		err := tr.reader.QueryRow(`SELECT time_us FROM jetstream_cursor WHERE id = 1`).Scan(&us)
		if err == sql.ErrNoRows {
			return nil
		}
		return err
	})
	if err != nil {
		return 0, err // us may still be written by the query left running
	}
	return us, nil
}

// waitCursor polls until the cursor is past after (or at the stream's
// end) and returns it.
func (tr *traffic) waitCursor(ctx context.Context, after int64) (int64, error) {
	var us int64
	err := poll(ctx, trafficPoll, fmt.Sprintf("the cursor past %d (the stream ends at %d)", after, tr.expected.MaxTimeUS), func() (bool, error) {
		got, err := tr.cursor(ctx)
		if err != nil {
			return false, err
		}
		us = got
		return us > after || us >= tr.expected.MaxTimeUS, nil
	})
	if err != nil {
		return us, fmt.Errorf("%w (the cursor: %d)", err, us)
	}
	return us, nil
}

// waitDrained polls until the cursor has reached the stream's last event
// and no webhook delivery is pending.
func (tr *traffic) waitDrained(ctx context.Context) error {
	var us int64
	pending := -1
	err := poll(ctx, trafficPoll, fmt.Sprintf("the cursor at %d and no delivery pending", tr.expected.MaxTimeUS), func() (bool, error) {
		got, err := tr.cursor(ctx)
		if err != nil {
			return false, err
		}
		us = got
		var n int // written by a query Bounded may leave running
		err = database.Bounded(ctx, func() error {
			return tr.reader.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries WHERE status = 'pending'`).Scan(&n)
		})
		if err != nil {
			return false, err
		}
		pending = n
		return us >= tr.expected.MaxTimeUS && pending == 0, nil
	})
	if err != nil {
		return fmt.Errorf("not drained: %w (the cursor: %d, deliveries pending: %d)", err, us, pending)
	}
	return nil
}

// check compares the final database with the generator's expected state,
// checks repository_stats against the sums over holds, and checks that
// every push was delivered to the receiver exactly once, or, with
// resendAcrossCustody, at most once per custody (a push may be resent by
// the next holder, never twice by one).
func (tr *traffic) check(ctx context.Context, resendAcrossCustody bool) {
	t := tr.t
	t.Helper()
	for _, d := range synth.Diff(ctx, tr.reader.DB, tr.expected) {
		t.Errorf("database differs from the generator's expected state: %s", d)
	}
	rows, err := tr.reader.QueryContext(ctx, `SELECT `+database.Text("s.did")+`, `+database.Text("s.repository")+`, s.pull_count, s.push_count,
  COALESCE(SUM(h.pull_count), 0), COALESCE(SUM(h.push_count), 0)
FROM repository_stats s LEFT JOIN repository_hold_stats h ON h.did = s.did AND h.repository = s.repository
GROUP BY s.did, s.repository`)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for rows.Next() {
		var did, repo string
		var pull, push, sumPull, sumPush int64
		if err := rows.Scan(&did, &repo, &pull, &push, &sumPull, &sumPush); err != nil {
			t.Fatal(err)
		}
		checked++
		if pull != sumPull || push != sumPush {
			t.Errorf("repository_stats %s/%s: pull %d push %d; the sums over its holds are %d and %d", did, repo, pull, push, sumPull, sumPush)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if checked == 0 {
		t.Error("no repository_stats rows: the stream's hold stats were not applied")
	}
	var failed int
	if err := tr.reader.QueryRowContext(ctx, `SELECT COUNT(*) FROM webhook_deliveries WHERE status <> 'delivered'`).Scan(&failed); err != nil {
		t.Fatal(err)
	}
	if failed > 0 {
		t.Errorf("%d webhook deliveries are not delivered", failed)
	}
	got, fences := tr.receiver.counts(), tr.receiver.fenceLists()
	resent := 0
	for _, k := range tr.expected.PushEventKeys {
		switch n := got[k]; {
		case n == 1:
		case n == 0:
			t.Errorf("push %s never reached the receiver", k)
		case resendAcrossCustody && allDistinct(fences[k]):
			resent++
			t.Logf("push %s resent by the next holder (X-Appview-Fence %v)", k, fences[k])
		default:
			t.Errorf("push %s reached the receiver %d times (X-Appview-Fence %v); want exactly once", k, n, fences[k])
		}
		delete(got, k)
	}
	if resent > 0 {
		t.Logf("%d of %d pushes reached the receiver twice, each resent by the next holder after a change of custody", resent, len(tr.expected.PushEventKeys))
	}
	for k, n := range got {
		t.Errorf("the receiver got %d deliveries of %s, which is no push of the stream", n, k)
	}
	t.Logf("traffic: %d events, %d pushes delivered, %d repository_stats rows checked", tr.expected.Events, len(tr.expected.PushEventKeys), checked)
}

// fencedTables are the tables whose rows record the fence of their writer
// (docs/spec.md §8 and the webhooks outbox).
var fencedTables = []string{"repository_stats", "jetstream_cursor", "webhook_deliveries"}

// rowsUnderFence returns, per fenced table, every row whose fence column
// is fence, each rendered whole as a string: a row that appears or
// changes between two reads was written under that fence in between.
func (tr *traffic) rowsUnderFence(ctx context.Context, fence int64) map[string]map[string]bool {
	t := tr.t
	t.Helper()
	out := map[string]map[string]bool{}
	for _, table := range fencedTables {
		q, err := testsupport.SelectAll(ctx, tr.reader, table)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := testsupport.DumpRows(ctx, tr.reader.DB, q+" WHERE fence = ?1", fence)
		if err != nil {
			t.Fatal(err)
		}
		out[table] = map[string]bool{}
		for _, l := range lines {
			out[table][l] = true
		}
	}
	return out
}

// progress returns the cursor that marks fraction f (0..1) of the stream.
func (tr *traffic) progress(f float64) int64 {
	return tr.firstUS + int64(f*float64(tr.expected.MaxTimeUS-tr.firstUS))
}

// numberLines gives every event of the JSONL stream at path its sequence
// number, line i+1 in a "cursor" member put first, as a Jetstream v2
// server's legacy /subscribe wire sends it (the replay server serves such
// a capture on the v2 wire too); the rest of each line stays byte for
// byte.
func numberLines(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for i, line := range bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n")) {
		if len(line) < 2 || line[0] != '{' || bytes.Contains(line, []byte(`"cursor"`)) {
			t.Fatalf("%s line %d is no event without a cursor: %.80s", path, i+1, line)
		}
		fmt.Fprintf(&out, "{\"cursor\":%d,%s\n", i+1, line[1:])
	}
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// firstTimeUS reads the time_us of a JSONL stream's first event.
func firstTimeUS(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var ev struct {
		TimeUS int64 `json:"time_us"`
	}
	if err := json.NewDecoder(f).Decode(&ev); err != nil {
		return 0, fmt.Errorf("first event of %s: %w", path, err)
	}
	return ev.TimeUS, nil
}

// allDistinct reports whether no value repeats.
func allDistinct(vals []string) bool {
	seen := map[string]bool{}
	for _, v := range vals {
		if seen[v] {
			return false
		}
		seen[v] = true
	}
	return true
}

// pushingDIDs returns the DIDs of "push:<did>/<repository>@<digest>" keys.
func pushingDIDs(keys []string) []string {
	seen := map[string]bool{}
	for _, k := range keys {
		did, _, _ := strings.Cut(strings.TrimPrefix(k, "push:"), "/")
		seen[did] = true
	}
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// runCmd runs a command to completion and fails the test on error.
func runCmd(t *testing.T, ctx context.Context, name string, args ...string) {
	t.Helper()
	if err := runCmdErr(ctx, name, args...); err != nil {
		t.Fatal(err)
	}
}

// runCmdErr runs a command to completion; its error names the command
// and carries its output.
func runCmdErr(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = harness.CleanEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// receiver is the local webhook endpoint: it answers 200 and counts each
// X-Appview-Delivery (docs/spec.md §9) it receives.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	seen   map[string]int
	fences map[string][]string
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{seen: map[string]int{}, fences: map[string][]string{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		key := req.Header.Get("X-Appview-Delivery")
		r.mu.Lock()
		r.seen[key]++
		r.fences[key] = append(r.fences[key], req.Header.Get("X-Appview-Fence"))
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) fenceLists() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]string, len(r.fences))
	for k, v := range r.fences {
		out[k] = append([]string(nil), v...)
	}
	return out
}

func (r *receiver) counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.seen))
	for k, v := range r.seen {
		out[k] = v
	}
	return out
}
