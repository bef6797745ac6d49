package jetstream

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

// testWait bounds every wait for something that should happen promptly; it
// only turns a hang into a failure.
const testWait = 10 * time.Second

func capturePath(name string) string { return filepath.Join("testdata", name) }

// startReplay serves opts (File defaulting to expected_v1.jsonl) on a
// loopback port until the test ends.
func startReplay(t testing.TB, opts ReplayOptions) *ReplayServer {
	t.Helper()
	return startReplayOn(t, opts, func(ln net.Listener) net.Listener { return ln })
}

// startReplayOn is startReplay serving on wrap of the loopback listener.
func startReplayOn(t testing.TB, opts ReplayOptions, wrap func(net.Listener) net.Listener) *ReplayServer {
	t.Helper()
	if opts.File == "" {
		opts.File = capturePath("expected_v1.jsonl")
	}
	s, err := NewReplayServer(opts, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(wrap(ln)) }()
	select {
	case <-s.Listening():
	case err := <-served:
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close replay server: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s
}

// dialReplay opens a raw websocket to s with the given query.
func dialReplay(t *testing.T, s *ReplayServer, q url.Values) *websocket.Conn {
	t.Helper()
	ws, resp, err := websocket.DefaultDialer.Dial(s.URL()+"?"+q.Encode(), nil)
	if err != nil {
		t.Fatalf("dial %v: %v (%v)", q, err, resp)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// readFrames reads n data messages, failing on error or after testWait.
func readFrames(t *testing.T, ws *websocket.Conn, n int) (types []int, frames [][]byte) {
	t.Helper()
	ws.SetReadDeadline(time.Now().Add(testWait))
	for range n {
		typ, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("after %d of %d frames: %v", len(frames), n, err)
		}
		types = append(types, typ)
		frames = append(frames, msg)
	}
	return types, frames
}

// readEvents reads and decodes n events.
func readEvents(t *testing.T, ws *websocket.Conn, n int) []Event {
	t.Helper()
	d := newTestDecoder(t, 0)
	types, frames := readFrames(t, ws, n)
	evs := make([]Event, n)
	for i := range frames {
		ev, err := d.Decode(frames[i], types[i] == websocket.BinaryMessage)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		evs[i] = ev
	}
	return evs
}

// prefixMaxIndex returns an index k > from whose time_us exceeds every
// earlier one, so "time_us >= time_us[k]" in file order starts exactly at k.
func prefixMaxIndex(t *testing.T, evs []Event, from int) int {
	t.Helper()
	var maxT int64
	for i, e := range evs {
		if i > from && e.TimeUS > maxT {
			return i
		}
		maxT = max(maxT, e.TimeUS)
	}
	t.Fatalf("no prefix maximum after %d", from)
	return 0
}

func writeCapture(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "capture.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A capture line that is not an event is logged with its number and
// skipped; the good lines around it are served. Found from outside: one
// bad line refused a whole 73 MB capture.
func TestReplaySkipsABadLineNamingItsNumberAndServesTheRest(t *testing.T) {
	good := captureLines(t, "golden_v1.jsonl")
	cases := map[string]string{
		"not json":      `{"did":`,
		"invalid event": `{"did":"did:plc:x","time_us":0,"kind":"identity","identity":{}}`,
		"no time_us":    `{"did":"did:plc:x","kind":"identity","identity":{"did":"did:plc:x","seq":1,"time":"2024-01-01T00:00:00Z"}}`,
		// What the README promises the replay drops: whatever the
		// consumer's decoder refuses, so a capture cannot feed it one.
		"a member given twice": `{"did":"did:plc:x","did":"did:plc:y","time_us":1700000000000000,"kind":"identity","identity":{"did":"did:plc:x","seq":1,"time":"2024-01-01T00:00:00Z"}}`,
		"did in another case":  `{"DID":"did:plc:x","time_us":1700000000000000,"kind":"identity","identity":{"did":"did:plc:x","seq":1,"time":"2024-01-01T00:00:00Z"}}`,
		"not UTF-8":            "{\"did\":\"did:plc:x\",\"time_us\":1700000000000000,\"kind\":\"identity\",\"identity\":{\"did\":\"did:plc:x\",\"handle\":\"\xff\",\"seq\":1,\"time\":\"2024-01-01T00:00:00Z\"}}",
		"time_us before 2023":  `{"did":"did:plc:x","time_us":1600000000000000,"kind":"identity","identity":{"did":"did:plc:x","seq":1,"time":"2024-01-01T00:00:00Z"}}`,
		"commit without rkey":  `{"did":"did:plc:x","time_us":1700000000000000,"kind":"commit","commit":{"operation":"create","collection":"io.atcr.tag","record":{}}}`,
	}
	for name, bad := range cases {
		p := writeCapture(t, string(good[0]), "", string(good[1]), bad, string(good[2]))
		var logs bytes.Buffer
		s, err := NewReplayServer(ReplayOptions{File: p}, zerolog.New(&logs))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(s.events) != 3 || !bytes.Equal(s.events[2].raw, good[2]) {
			t.Errorf("%s: %d events loaded, want the 3 good lines", name, len(s.events))
		}
		if !strings.Contains(logs.String(), `"line":4`) || !strings.Contains(logs.String(), `"skipped":1`) {
			t.Errorf("%s: the skipped line 4 was not logged:\n%s", name, logs.String())
		}
	}
	if _, err := NewReplayServer(ReplayOptions{File: writeCapture(t, `{"did":`, "nope")}, zerolog.Nop()); err == nil ||
		!strings.Contains(err.Error(), "no events") {
		t.Errorf("a capture without one event: %v, want refused with no events", err)
	}
	for name, opts := range map[string]ReplayOptions{
		"no file":        {},
		"missing file":   {File: filepath.Join(t.TempDir(), "nope.jsonl")},
		"empty file":     {File: writeCapture(t, "", "  ")},
		"negative rate":  {File: capturePath("golden_v1.jsonl"), Rate: -1},
		"NaN rate":       {File: capturePath("golden_v1.jsonl"), Rate: math.NaN()},
		"infinite rate":  {File: capturePath("golden_v1.jsonl"), Rate: math.Inf(1)},
		"negative drops": {File: capturePath("golden_v1.jsonl"), DropAfter: -1},
	} {
		if _, err := NewReplayServer(opts, zerolog.Nop()); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A capture saved with a UTF-8 byte-order mark keeps its first event: the
// mark is not part of it. One inside a later line is still malformed.
func TestReplayIgnoresAByteOrderMarkBeforeTheFirstLine(t *testing.T) {
	good := captureLines(t, "golden_v1.jsonl")
	p := writeCapture(t, "\ufeff"+string(good[0]), string(good[1]), "\ufeff"+string(good[2]))
	var logs bytes.Buffer
	s, err := NewReplayServer(ReplayOptions{File: p}, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	if len(s.events) != 2 || !bytes.Equal(s.events[0].raw, good[0]) {
		t.Fatalf("%d events loaded, want the first two lines, the first without its mark", len(s.events))
	}
	if !strings.Contains(logs.String(), `"line":3`) {
		t.Errorf("a mark inside line 3 was not reported:\n%s", logs.String())
	}
}

func TestReplayServesEveryLineAsCapturedRawAndCompressed(t *testing.T) {
	s := startReplay(t, ReplayOptions{})
	lines := captureLines(t, "expected_v1.jsonl")
	if len(s.events) != len(lines) {
		t.Fatalf("Len %d, want %d", len(s.events), len(lines))
	}
	types, frames := readFrames(t, dialReplay(t, s, nil), len(lines))
	for i := range lines {
		if types[i] != websocket.TextMessage || !bytes.Equal(frames[i], lines[i]) {
			t.Fatalf("frame %d (type %d) is not line %d as captured", i, types[i], i+1)
		}
	}
	d := newTestDecoder(t, 0)
	types, frames = readFrames(t, dialReplay(t, s, url.Values{"compress": {"true"}}), len(lines))
	for i := range lines {
		ev, err := d.Decode(frames[i], true)
		want, _ := Decode(lines[i])
		if types[i] != websocket.BinaryMessage || err != nil || !reflect.DeepEqual(ev, want) {
			t.Fatalf("compressed frame %d (type %d): %v", i, types[i], err)
		}
	}
}

func TestReplayCursorIsInclusiveAndKeepsFileOrder(t *testing.T) {
	s := startReplay(t, ReplayOptions{})
	all := captureEvents(t, "expected_v1.jsonl")
	k := prefixMaxIndex(t, all, 60)
	cursor := all[k].TimeUS
	var want []Event
	for _, e := range all {
		if e.TimeUS >= cursor {
			want = append(want, e)
		}
	}
	got := readEvents(t, dialReplay(t, s, url.Values{"cursor": {itoa(cursor)}}), len(want))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("cursor replay differs from the file's events with time_us >= cursor")
	}
	if !reflect.DeepEqual(got[0], all[k]) {
		t.Fatalf("first replayed event is not the cursor's own event")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestReplayCollectionFiltersMatchJetstream(t *testing.T) {
	s := startReplay(t, ReplayOptions{})
	all := captureEvents(t, "expected_v1.jsonl")
	for _, wanted := range [][]string{
		{"io.atcr.*"},
		{"app.bsky.feed.*"},
		{"app.bsky.graph.follow", "app.bsky.feed.repost"},
		{"app.*"},
	} {
		f, err := newCollectionFilter(wanted)
		if err != nil {
			t.Fatal(err)
		}
		var want []Event
		for _, e := range all {
			if f.wants(e.Collection()) {
				want = append(want, e)
			}
		}
		got := readEvents(t, dialReplay(t, s, url.Values{"wantedCollections": wanted}), len(want))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%v: filtered stream differs", wanted)
		}
		if wanted[0] == "io.atcr.*" && (len(got) != 2 || got[0].Kind != KindIdentity || got[1].Kind != KindAccount) {
			t.Errorf("io.atcr.* let through %d events, want exactly the identity and the account event", len(got))
		}
	}
	// A prefix keeps its dot: app.bsky.feed.* must not match app.bsky.feedx.
	f, _ := newCollectionFilter([]string{"app.bsky.feed.*"})
	if f.wants("app.bsky.feedx.like") || !f.wants("app.bsky.feed.like") {
		t.Error("prefix matching ignores the segment boundary")
	}
}

func TestReplayWantedDidsAndMaxMessageSizeFilterLikeJetstream(t *testing.T) {
	s := startReplay(t, ReplayOptions{})
	all := captureEvents(t, "expected_v1.jsonl")
	lines := captureLines(t, "expected_v1.jsonl")
	did := all[150].DID // the identity/account DID
	got := readEvents(t, dialReplay(t, s, url.Values{"wantedDids": {did}}), 2)
	if got[0].DID != did || got[1].DID != did {
		t.Fatalf("wantedDids let through %s/%s", got[0].DID, got[1].DID)
	}
	var small []Event
	for i, l := range lines {
		if len(l) <= 400 {
			small = append(small, all[i])
		}
	}
	if len(small) == 0 || len(small) == len(all) {
		t.Fatalf("400 bytes does not split the capture (%d of %d)", len(small), len(all))
	}
	got = readEvents(t, dialReplay(t, s, url.Values{"maxMessageSizeBytes": {"400"}}), len(small))
	if !reflect.DeepEqual(got, small) {
		t.Fatal("maxMessageSizeBytes did not skip exactly the larger events")
	}
}

func TestReplayRefusesBadSubscriptionsWithBadRequest(t *testing.T) {
	s := startReplay(t, ReplayOptions{})
	for _, q := range []url.Values{
		{"cursor": {"yesterday"}},
		{"wantedCollections": {"not an nsid"}},
		{"wantedCollections": {"two.segments"}},
		{"wantedDids": {"alice"}},
	} {
		_, resp, err := websocket.DefaultDialer.Dial(s.URL()+"?"+q.Encode(), nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%v: got %v, %v; want 400", q, resp, err)
		}
		if resp != nil {
			resp.Body.Close()
		}
	}
}

func TestReplayLoopShiftsTimeSoEachLoopStartsAfterThePreviousEnds(t *testing.T) {
	s := startReplay(t, ReplayOptions{Loop: true})
	all := captureEvents(t, "expected_v1.jsonl")
	n := len(all)
	for _, compress := range []string{"false", "true"} {
		got := readEvents(t, dialReplay(t, s, url.Values{"compress": {compress}}), 3*n)
		var maxPrev int64
		for loop := range 3 {
			shift := int64(loop) * s.span
			minThis := got[loop*n].TimeUS
			for i, e := range got[loop*n : (loop+1)*n] {
				want := all[i]
				want.TimeUS += shift
				if !reflect.DeepEqual(e, want) {
					t.Fatalf("loop %d event %d is not the capture's shifted by %d", loop, i, shift)
				}
				minThis = min(minThis, e.TimeUS)
			}
			if loop > 0 && minThis <= maxPrev {
				t.Fatalf("loop %d starts at %d, not after the previous loop's end %d", loop, minThis, maxPrev)
			}
			for _, e := range got[loop*n : (loop+1)*n] {
				maxPrev = max(maxPrev, e.TimeUS)
			}
		}
	}
}

func TestReplayLoopCursorSkipsWholeLoops(t *testing.T) {
	s := startReplay(t, ReplayOptions{Loop: true})
	all := captureEvents(t, "expected_v1.jsonl")
	k := prefixMaxIndex(t, all, 30)
	cursor := all[k].TimeUS + 2*s.span
	got := readEvents(t, dialReplay(t, s, url.Values{"cursor": {itoa(cursor)}}), 1)
	want := all[k]
	want.TimeUS = cursor
	if !reflect.DeepEqual(got[0], want) {
		t.Fatalf("first event %+v, want loop 2's copy of event %d", got[0], k)
	}
}

func TestSplitAtTimeUSFindsTheTopLevelKeyOnly(t *testing.T) {
	line := []byte(`{"kind":"commit","commit":{"record":{"time_us":5,"x":"\"time_us\":5"}},"did":"did:plc:a", "time_us" : 5 ,"z":1}`)
	prefix, suffix, err := splitAtTimeUS(line)
	if err != nil {
		t.Fatal(err)
	}
	got := string(prefix) + "77" + string(suffix)
	want := strings.Replace(string(line), `"time_us" : 5`, `"time_us" : 77`, 1)
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if _, _, err := splitAtTimeUS([]byte(`{"did":"x"}`)); err == nil {
		t.Fatal("accepted an object without time_us")
	}
}

func TestReplayOptionsUpdateWidensAndBadUpdatesEndTheSubscription(t *testing.T) {
	s := startReplay(t, ReplayOptions{Loop: true, Rate: 5000})
	ws := dialReplay(t, s, url.Values{"wantedCollections": {"io.atcr.*"}})
	for _, e := range readEvents(t, ws, 4) {
		if e.Commit != nil {
			t.Fatalf("commit %s before any update", e.Commit.Collection)
		}
	}
	msg, err := encodeOptionsUpdate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.WriteMessage(websocket.TextMessage, msg); err != nil {
		t.Fatal(err)
	}
	d := newTestDecoder(t, 0)
	ws.SetReadDeadline(time.Now().Add(testWait))
	for {
		typ, frame, err := ws.ReadMessage()
		if err != nil {
			t.Fatalf("no commit arrived after widening: %v", err)
		}
		ev, err := d.Decode(frame, typ == websocket.BinaryMessage)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Commit != nil {
			break
		}
	}
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"options_update","payload":{"wantedCollections":["bad"]}}`)); err != nil {
		t.Fatal(err)
	}
	for {
		_, _, err := ws.ReadMessage()
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			if ce.Code != websocket.ClosePolicyViolation {
				t.Fatalf("closed with %d, want policy violation", ce.Code)
			}
			break
		}
		if err != nil {
			t.Fatalf("connection ended without a close frame: %v", err)
		}
	}
}

func TestReplayDropAfterClosesEachConnectionAbruptlyAfterNEvents(t *testing.T) {
	s := startReplay(t, ReplayOptions{DropAfter: 5})
	for conn := 1; conn <= 2; conn++ {
		ws := dialReplay(t, s, nil)
		readFrames(t, ws, 5)
		_, _, err := ws.ReadMessage()
		// 1006 is gorilla's name for "ended without a close frame".
		if !websocket.IsCloseError(err, websocket.CloseAbnormalClosure) {
			t.Fatalf("connection %d: got %v after 5 events, want an abrupt end", conn, err)
		}
	}
	if s.Connections() != 2 {
		t.Fatalf("Connections %d, want 2", s.Connections())
	}
}

func TestReplayDropConnectionsEndsOpenConnectionsAndKeepsServing(t *testing.T) {
	s := startReplay(t, ReplayOptions{})
	ws := dialReplay(t, s, nil)
	readFrames(t, ws, len(s.events)) // the whole file: now a silent live tail
	if n := s.DropConnections(); n != 1 {
		t.Fatalf("dropped %d connections, want 1", n)
	}
	ws.SetReadDeadline(time.Now().Add(testWait))
	if _, _, err := ws.ReadMessage(); err == nil {
		t.Fatal("read after drop succeeded")
	}
	readFrames(t, dialReplay(t, s, nil), 1)
}

func TestReplayRatePacesEventsPerSecond(t *testing.T) {
	s := startReplay(t, ReplayOptions{Rate: 200})
	// The clock starts before the dial: the server paces from the upgrade
	// on, and a late reader finds frames already buffered.
	start := time.Now()
	ws := dialReplay(t, s, nil)
	readFrames(t, ws, 21)
	// 21 events at 200/s are 20 intervals of 5 ms after the first: a lower
	// bound, so a slow machine cannot fail it.
	if el := time.Since(start); el < 95*time.Millisecond {
		t.Fatalf("21 events at 200/s took %v", el)
	}
}

func TestReplayListenAndServeStopsWhenTheContextEnds(t *testing.T) {
	s, err := NewReplayServer(ReplayOptions{File: capturePath("golden_v1.jsonl"), Listen: "127.0.0.1:0"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.ListenAndServe(ctx) }()
	select {
	case <-s.Listening():
	case err := <-done:
		t.Fatal(err)
	}
	ws := dialReplay(t, s, nil)
	readFrames(t, ws, len(s.events))
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testWait):
		t.Fatal("ListenAndServe did not return")
	}
	_, _, err = ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseGoingAway {
		t.Fatalf("client saw %v, want a going-away close", err)
	}
	if err := s.Serve(nil); !errors.Is(err, ErrReplayClosed) {
		t.Fatalf("Serve after close: %v", err)
	}
}

func TestReplayCloseDoesNotWaitForAClientThatStoppedReading(t *testing.T) {
	s := startReplay(t, ReplayOptions{Loop: true})
	ws := dialReplay(t, s, nil)
	readFrames(t, ws, 1) // then never read again: the server's writes block
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testWait):
		t.Fatal("Close hung on a client that does not read")
	}
}
