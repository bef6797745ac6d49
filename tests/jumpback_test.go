package tests

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/harness"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/synth"
	"github.com/atcr-io/appview/internal/testsupport"
)

// Shape of the jump-back scenario.
const (
	// jumpbackEvents is the stream's length, split into jumpbackKills
	// equal stretches: each stretch ends with a kill at a random point
	// inside it and a check once the restarted consumer has caught up.
	jumpbackEvents = 1400
	jumpbackKills  = 7
	// jumpbackRewind is jetstream.rewind for the scenario and
	// jumpbackJumpMin the least each stretch's jump back of time_us must
	// be (the generator spaces events 1.5 ms apart on average, so a
	// stretch spans about 300 ms): twice the rewind, so a consumer that
	// resumed by time would ask for a cursor past events it never applied.
	jumpbackRewind  = 50 * time.Millisecond
	jumpbackJumpMin = 2 * jumpbackRewind
	// jumpbackRate paces the replay (events per second) so that a stretch
	// takes most of a second to stream and a kill lands inside it.
	jumpbackRate = 250
	// jumpbackSeedEnv names the variable that replays one seed of the
	// kill points (the test prints the seed it used).
	jumpbackSeedEnv = "JUMPBACK_SEED"
)

// jumpbackTiming is the lease timing of the scenario: each instance
// started after a SIGKILL waits for the killed one's grant to run out,
// and nothing here depends on how long that is, so the TTL is half the
// harness's.
var jumpbackTiming = harness.Timing{TTL: time.Second, RenewInterval: 250 * time.Millisecond,
	RenewDeadline: 750 * time.Millisecond, RetryInterval: 250 * time.Millisecond}

// TestJumpBackKillsNeverSkipAnUnappliedEvent proves that the
// stored position is the highest contiguous processed one, whatever order
// time_us comes in. The synthetic stream's time_us jumps back by more
// than twice jetstream.rewind in every stretch (see jumpbackStream),
// while every repository's revs stay in commit order, so the expected
// state is still the generator's (but for one derived value, see
// jumpbackDiff). Every line carries a sequence number,
// as a Jetstream v2 server's legacy /subscribe wire sends it, and the
// replay server answers a cursor below jetstream.CursorSeqMax by sequence
// number.
//
// The stream is served in jumpbackKills stretches: for each, the replay
// server is restarted on the same address with the stream up to the
// stretch's end, the running consumer reconnects to it, is killed at a
// random point inside the stretch (SIGKILL and SIGTERM in turn, points
// from a seeded RNG: $JUMPBACK_SEED replays a run), and a new instance
// is started. Once its stored position reaches the stretch's end, the
// database must equal the generator's state after exactly that many
// events: an event skipped on a resume shows as a missing or stale row.
//
// A consumer that resumed by time (the stored time_us less the rewind)
// fails this: after a jump the stored time_us is ahead of the events
// still to come, and the replay's cursor filter drops them.
func TestJumpBackKillsNeverSkipAnUnappliedEvent(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(jumpbackSeedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", jumpbackSeedEnv, s, err)
		}
		seed = v
	}
	t.Logf("kill points seed %d (rerun with %s=%d)", seed, jumpbackSeedEnv, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	c := newCluster(t)
	db := fileDB(t)
	ctx := within(t, 3*time.Minute)
	lines, expected := jumpbackStream(t)

	addr, err := harness.FreeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	reader, err := database.Open(ctx, database.Options{URL: db, BusyTimeout: 5 * time.Second, MaxOpenConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	seq := func() int64 {
		var s int64
		err := database.Bounded(ctx, func() error {
			err := reader.QueryRow(`SELECT seq FROM jetstream_cursor WHERE id = 1`).Scan(&s)
			if err == sql.ErrNoRows {
				return nil
			}
			return err
		})
		if err != nil {
			t.Fatalf("read the stored position: %v", err)
		}
		return s
	}

	started := 0
	start := func() *harness.Instance {
		started++
		i, err := c.Start(ctx, harness.Spec{ID: fmt.Sprintf("jb%02d", started), DatabaseURL: db, Timing: jumpbackTiming, Set: map[string]any{
			"jetstream.urls":   []string{"ws://" + addr + "/subscribe"},
			"jetstream.rewind": jumpbackRewind.String(),
		}})
		if err != nil {
			t.Fatal(err)
		}
		return i
	}

	var replay *harness.Instance
	var running *harness.Instance
	stretch := jumpbackEvents / jumpbackKills
	for k := range jumpbackKills {
		from, to := k*stretch, (k+1)*stretch
		if k == jumpbackKills-1 {
			to = jumpbackEvents
		}
		if replay != nil {
			if code, err := replay.Stop(ctx); err != nil || code != 0 {
				t.Fatalf("replay server: SIGTERM exit code %d, %v; want 0", code, err)
			}
		}
		replay = jumpbackReplay(t, ctx, c, lines[:to], addr, k)
		if running == nil {
			running = start()
		}
		// A point strictly inside the stretch, leaving room for the
		// batch in flight when the poll sees it.
		target := int64(from + 1 + rng.IntN(to-from-stretch/4))
		testsupport.Eventually(t, fmt.Sprintf("stored seq to reach the kill point %d", target), func() bool { return seq() >= target })
		at := seq()
		sig := "SIGTERM"
		if k%2 == 0 {
			sig = "SIGKILL"
			running.Kill()
		} else if code, err := running.Stop(ctx); err != nil || code != 0 {
			t.Fatalf("%s: SIGTERM exit code %d, %v; want 0", running.ID, code, err)
		}
		killed := seq()
		t.Logf("kill %d: %s to %s at seq %d (stored %d after it exited; stretch %d..%d)", k+1, sig, running.ID, at, killed, from+1, to)
		if killed < int64(from) || killed > int64(to) {
			t.Fatalf("stored seq %d after the kill is outside the stretch %d..%d", killed, from, to)
		}
		running = start()
		testsupport.Eventually(t, fmt.Sprintf("%s to catch up to seq %d", running.ID, to), func() bool { return seq() >= int64(to) })
		if got := seq(); got != int64(to) {
			t.Fatalf("stored seq %d; the stream served has %d events", got, to)
		}
		if diffs := jumpbackDiff(ctx, reader.DB, expected[to]); len(diffs) > 0 {
			for _, d := range diffs {
				t.Errorf("after kill %d (%s at seq %d), caught up to seq %d: %s", k+1, sig, killed, to, d)
			}
			t.FailNow()
		}
	}
	stopCleanly(t, ctx, running)
}

// jumpbackStream returns the scenario's stream as JSONL lines (line i has
// sequence number i+1 in its "cursor" field) and the generator's expected
// state after each prefix that ends a stretch, keyed by its length.
//
// Within each stretch the events of half the repositories (jumpbackLate)
// are sent after those of the others, each repository's in the
// generator's order (its revs ascending, as a relay delivers them): so
// time_us jumps back in every stretch by about the stretch's span (at
// least jumpbackJumpMin; checked), and forward again at its end. Every
// stretch's prefix holds the same events as the generator's, so its state
// is the generator's.
func jumpbackStream(t *testing.T) ([][]byte, map[int]*synth.Expected) {
	t.Helper()
	g := synth.NewGenerator(synth.Options{Seed: 13, Events: 2 * jumpbackEvents, Users: 8, Holds: 3})
	stretch := jumpbackEvents / jumpbackKills
	expected := map[int]*synth.Expected{}
	var events []jetstream.Event
	for {
		ev, ok := g.Next()
		if !ok {
			break
		}
		// Only what the consumer subscribes to, so the stream's last line
		// is the position a caught-up consumer stores.
		if ev.Commit == nil || strings.HasPrefix(ev.Collection(), "io.atcr.") {
			events = append(events, ev)
		}
		if n := len(events); n%stretch == 0 && expected[n] == nil {
			expected[n] = g.Expected()
		}
		if len(events) == jumpbackEvents {
			break
		}
	}
	if len(events) != jumpbackEvents {
		t.Fatalf("the generator made %d events; want %d", len(events), jumpbackEvents)
	}
	var order []jetstream.Event
	for k := range jumpbackKills {
		from, to := k*stretch, (k+1)*stretch
		if k == jumpbackKills-1 {
			to = jumpbackEvents
		}
		var later []jetstream.Event
		for _, ev := range events[from:to] {
			if jumpbackLate(ev.DID) {
				later = append(later, ev)
			} else {
				order = append(order, ev)
			}
		}
		order = append(order, later...)
	}
	lines := make([][]byte, len(order))
	jumps := 0
	for i := range order {
		order[i].Seq = int64(i + 1)
		if i > 0 && order[i].TimeUS < order[i-1].TimeUS-jumpbackJumpMin.Microseconds() {
			jumps++
		}
		line, err := json.Marshal(order[i])
		if err != nil {
			t.Fatal(err)
		}
		lines[i] = line
	}
	if jumps < jumpbackKills {
		t.Fatalf("time_us jumps back by more than %v only %d times; want %d", jumpbackJumpMin, jumps, jumpbackKills)
	}
	return lines, expected
}

// jumpbackDiff is synth.Diff less one derived value the reordering moves
// by design: repository_stats.updated_at is the time of the last event
// that changed the aggregate, and across repositories (a hold's stats
// record and its users' manifests) that depends on arrival order. Every
// other column of repository_stats, and every other table, must match.
func jumpbackDiff(ctx context.Context, db *sql.DB, exp *synth.Expected) []string {
	var out []string
	for _, d := range synth.Diff(ctx, db, exp) {
		rest, ok := strings.CutPrefix(d, "repository_stats: row ")
		_, vals, ok2 := strings.Cut(rest, ": have ")
		have, want, ok3 := strings.Cut(vals, ", want ")
		if ok && ok2 && ok3 && withoutLastField(have) == withoutLastField(want) {
			continue
		}
		out = append(out, d)
	}
	return out
}

// withoutLastField drops the last |-separated field of a Diff row.
func withoutLastField(row string) string {
	if i := strings.LastIndexByte(row, '|'); i >= 0 {
		return row[:i]
	}
	return row
}

// jumpbackLate reports whether a repository's events come second in
// their stretch: half the repositories, by a hash of the DID.
func jumpbackLate(did string) bool {
	h := fnv.New32a()
	h.Write([]byte(did))
	return h.Sum32()%2 == 1
}

// jumpbackReplay writes lines to a file and serves it with `appview
// jetstream-replay` on addr, paced at jumpbackRate.
func jumpbackReplay(t *testing.T, ctx context.Context, c *harness.Cluster, lines [][]byte, addr string, k int) *harness.Instance {
	t.Helper()
	dir := filepath.Join(c.Dir, fmt.Sprintf("replay%02d", k))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "stream.jsonl")
	if err := os.WriteFile(file, append(bytes.Join(lines, []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	replay, err := harness.StartCommand(dir, fmt.Sprintf("replay%02d", k),
		bin, "jetstream-replay", "--file", file, "--listen", addr, "--rate", fmt.Sprint(jumpbackRate))
	if err != nil {
		t.Fatal(err)
	}
	c.Adopt(replay)
	if _, err := replay.Wait(ctx, harness.Msg("jetstream replay: serving")); err != nil {
		t.Fatal(err)
	}
	return replay
}
