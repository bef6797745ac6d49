package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/rs/zerolog"

	"github.com/gorilla/websocket"
	"github.com/klauspost/compress/zstd"
)

// v2Server is a scripted Jetstream v2 server: it numbers the events of
// its script 1.., serves them from ?cursor= (inclusive), refuses a seq
// cursor below floor with CursorTooOld, serves a zstd dictionary, and
// pings without ever sending more once the script is out (a silent host
// that keeps the socket alive).
type v2Server struct {
	srv *httptest.Server
	// script is the frames by seq (index+1); a frame is a full v2 frame.
	script [][]byte
	floor  int64
	dict   []byte
	dictID uint32
	// extra frames sent first on every connection (an #info, ...).
	first [][]byte
	// firstOnce are frames sent first on the first connection only;
	// beforeOnce[i], frames sent just before script[i] on it.
	firstOnce  [][]byte
	beforeOnce map[int][]byte
	conns      atomic.Int32
	// dictStatus, when set, answers the dictionary endpoint with this
	// status for the first dictFailures requests.
	dictStatus   int
	dictFailures int32
	dictHits     atomic.Int32
	dictQueries  []url.Values // under mu

	mu      sync.Mutex
	queries []url.Values
	quit    chan struct{}
	wg      sync.WaitGroup
}

func v2Commit(seq int64, did, rev string) []byte {
	b, _ := json.Marshal(map[string]any{"$type": "message", "payload": map[string]any{
		"$type": "network.bsky.jetstream.subscribeEvents#commit", "seq": seq, "did": did,
		"time": time.UnixMicro(1_780_000_000_000_000 + seq).UTC().Format("2006-01-02T15:04:05.000000Z"),
		"rev":  rev, "operation": "create", "collection": "io.atcr.tag", "rkey": fmt.Sprintf("r%d", seq), "cid": "bafy",
		"record": map[string]any{"repository": "x", "tag": "latest"}}})
	return b
}

func startV2(t *testing.T, s *v2Server) *v2Server {
	t.Helper()
	s.quit = make(chan struct{})
	up := websocket.Upgrader{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.wg.Add(1)
		defer s.wg.Done()
		if r.URL.Path == PathZstdDictionary {
			s.mu.Lock()
			s.dictQueries = append(s.dictQueries, r.URL.Query())
			s.mu.Unlock()
			if n := s.dictHits.Add(1); s.dictStatus != 0 && n <= s.dictFailures {
				w.WriteHeader(s.dictStatus)
				return
			}
			w.Write(s.dict)
			return
		}
		q := r.URL.Query()
		s.mu.Lock()
		s.queries = append(s.queries, q)
		s.mu.Unlock()
		from := int64(1)
		if c := q.Get("cursor"); c != "" {
			from, _ = strconv.ParseInt(c, 10, 64)
			if from < s.floor {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprintf(w, `{"error":"CursorTooOld","message":"subscribe: cursor too old: cursor %d below lookback floor %d; re-backfill from your last seq"}`, from, s.floor)
				return
			}
		}
		var enc *zstd.Encoder
		if id := q.Get("zstdDictionary"); id != "" {
			if id != strconv.FormatUint(uint64(s.dictID), 10) {
				w.WriteHeader(http.StatusBadRequest)
				fmt.Fprint(w, `{"error":"UnknownZstdDictionary","message":"unknown"}`)
				return
			}
			enc, _ = zstd.NewWriter(nil, zstd.WithEncoderDict(s.dict))
		}
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		send := func(f []byte) error {
			if enc != nil {
				return ws.WriteMessage(websocket.BinaryMessage, enc.EncodeAll(f, nil))
			}
			return ws.WriteMessage(websocket.TextMessage, f)
		}
		frames := s.first
		first := s.conns.Add(1) == 1
		if first {
			frames = append(slices.Clone(s.firstOnce), frames...)
		}
		for _, f := range frames {
			if send(f) != nil {
				return
			}
		}
		if from > int64(len(s.script)) {
			// A cursor beyond the store: a live tail, here the whole
			// script (a server whose numbering restarted below it).
			from = 1
		}
		for i := max(from, 1) - 1; i < int64(len(s.script)); i++ {
			if f, ok := s.beforeOnce[int(i)]; ok && first && send(f) != nil {
				return
			}
			if send(s.script[i]) != nil {
				return
			}
		}
		go func() { // drain: pongs and the close frame
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
			}
		}()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-tick.C:
				if ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second)) != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(func() {
		close(s.quit)
		s.srv.CloseClientConnections()
		s.srv.Close()
		s.wg.Wait()
	})
	return s
}

func (s *v2Server) url() string {
	return "ws" + strings.TrimPrefix(s.srv.URL, "http") + PathV2
}

func (s *v2Server) query(i int) url.Values {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i >= len(s.queries) {
		return nil
	}
	return s.queries[i]
}

func script(n int) [][]byte {
	var out [][]byte
	for i := 1; i <= n; i++ {
		out = append(out, v2Commit(int64(i), "did:plc:a", fmt.Sprintf("3l3qo2vutsw%02d", i)))
	}
	return out
}

func TestWireIsSelectedByTheURLPath(t *testing.T) {
	if WireOf("wss://h/xrpc/network.bsky.jetstream.subscribeEvents") != WireV2 || WireOf("wss://h/subscribe") != WireLegacy {
		t.Fatal("wire not chosen by path")
	}
	if HostOf("wss://H.example:443/subscribe") != HostOf("wss://h.example:443/xrpc/network.bsky.jetstream.subscribeEvents") {
		t.Fatal("two wires of one host are not one position space")
	}
}

func TestV2WireDeliversMessagesWithTheirSeqAndSkipsInfoAndTheResumedEvent(t *testing.T) {
	s := startV2(t, &v2Server{script: script(5),
		first: [][]byte{[]byte(`{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#info","name":"OutdatedCursor","message":"clamped"}}`)}})
	m := testMetrics(t)
	k := newSink()
	runClient(t, ClientOptions{URLs: []string{s.url()}, Collections: []string{"io.atcr.*"}, CursorFor: func(string) int64 { return 2 }, Metrics: m}, k.handle)
	k.waitFor(t, "events 3..5", func(evs []Event, _ []*DecodeError) bool { return len(evs) >= 3 })
	evs := k.waitEvents(t, 3)
	for i, ev := range evs[:3] {
		if ev.Seq != int64(i+3) || ev.Commit == nil || ev.Commit.Collection != "io.atcr.tag" || ev.TimeUS <= 0 {
			t.Fatalf("event %d: %+v", i, ev)
		}
	}
	q := s.query(0)
	if q.Get("cursor") != "2" || q.Get("collections") != "io.atcr.*" || q.Has("wantedCollections") {
		t.Fatalf("subscribe query %v", q)
	}
	if v := metricValue(t, m.infos.WithLabelValues("OutdatedCursor")); v != 1 {
		t.Fatalf("info counted %v times, want 1", v)
	}
}

func TestV2CursorTooOldResumesFromTheFloorAndTellsTheConsumer(t *testing.T) {
	s := startV2(t, &v2Server{script: script(10), floor: 6})
	m := testMetrics(t)
	k := newSink()
	var told sync.Map
	runClient(t, ClientOptions{URLs: []string{s.url()}, CursorFor: func(string) int64 { return 2 }, Metrics: m,
		OnCursorTooOld: func(u string, cursor, floor int64) { told.Store(u, [2]int64{cursor, floor}) }}, k.handle)
	evs := k.waitEvents(t, 5)
	if evs[0].Seq != 6 {
		t.Fatalf("first event after the refusal has seq %d, want the floor 6", evs[0].Seq)
	}
	if v, ok := told.Load(s.url()); !ok || v.([2]int64) != [2]int64{2, 6} {
		t.Fatalf("OnCursorTooOld told %v, want cursor 2 floor 6", v)
	}
	if metricValue(t, m.tooOld) != 1 || metricValue(t, m.tooOldGap) != 4 {
		t.Fatalf("too-old %v gap %v, want 1 and 4", metricValue(t, m.tooOld), metricValue(t, m.tooOldGap))
	}
}

// A time cursor the host clamped to its oldest event, and said so, is a
// gap in time: the consumer is told the cursor sent and the first event's
// time and seq, once, before that event is delivered. An advisory on a
// connection resumed by seq tells nothing (a seq below the floor is
// refused instead: CursorTooOld).
func TestV2OutdatedCursorTellsTheTimeCursorAndTheFirstEventAfterIt(t *testing.T) {
	info := []byte(`{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#info","name":"OutdatedCursor","message":"clamped"}}`)
	const cursor = int64(1_779_000_000_000_000)
	for _, tc := range []struct {
		name   string
		cursor int64
		first  [][]byte
		want   [3]int64
		told   bool
	}{
		{"time cursor, announced", cursor, [][]byte{info}, [3]int64{cursor, 1_780_000_000_000_001, 1}, true},
		{"time cursor, not announced", cursor, nil, [3]int64{}, false},
		{"seq cursor, announced", 2, [][]byte{info}, [3]int64{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startV2(t, &v2Server{script: script(3), first: tc.first})
			k := newSink()
			var mu sync.Mutex
			var told [][3]int64
			var delivered int
			runClient(t, ClientOptions{URLs: []string{s.url()}, CursorFor: func(string) int64 { return tc.cursor },
				OnOutdatedCursor: func(u string, cursorUS, firstUS, firstSeq int64) {
					mu.Lock()
					defer mu.Unlock()
					if u != s.url() {
						t.Errorf("told of url %q, want %q", u, s.url())
					}
					told = append(told, [3]int64{cursorUS, firstUS, firstSeq})
					k.mu.Lock()
					delivered = len(k.events)
					k.mu.Unlock()
				}}, k.handle)
			k.waitFor(t, "the script's last event", func(evs []Event, _ []*DecodeError) bool {
				return len(evs) > 0 && evs[len(evs)-1].Seq == 3
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case tc.told && (len(told) != 1 || told[0] != tc.want):
				t.Fatalf("told %v, want once %v", told, tc.want)
			case tc.told && delivered != 0:
				t.Fatalf("told after %d events were delivered, want before the first", delivered)
			case !tc.told && len(told) != 0:
				t.Fatalf("told %v, want nothing", told)
			}
		})
	}
}

func TestV2DictionaryCompressionUsesTheHostsDictionary(t *testing.T) {
	id, err := DictionaryIDOf(dictionary)
	if err != nil {
		t.Fatal(err)
	}
	s := startV2(t, &v2Server{script: script(4), dict: dictionary, dictID: id})
	k := newSink()
	runClient(t, ClientOptions{URLs: []string{s.url()}, Compress: true}, k.handle)
	k.waitEvents(t, 4)
	if got := s.query(0).Get("zstdDictionary"); got != strconv.FormatUint(uint64(id), 10) {
		t.Fatalf("zstdDictionary=%q, want %d", got, id)
	}
}

// A dictionary fetch that failed for a reason that may pass (a 503 while
// the host warms up, no answer during a failover) used to leave the host
// uncompressed for the life of the process; a host without a dictionary
// endpoint still is, for good.
func TestV2DictionaryFetchFailingForNowIsTriedAgainLater(t *testing.T) {
	id, err := DictionaryIDOf(dictionary)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		status  int
		forGood bool
	}{{http.StatusServiceUnavailable, false}, {http.StatusTooManyRequests, false}, {http.StatusNotFound, true}} {
		s := startV2(t, &v2Server{dict: dictionary, dictID: id, dictStatus: tc.status, dictFailures: 1})
		c, err := NewClient(ClientOptions{URLs: []string{s.url()}, Compress: true}, func(context.Context, Batch) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		host := HostOf(s.url())
		if _, got, _ := c.v2Decoder(context.Background(), s.url()); got != 0 {
			t.Fatalf("HTTP %d: dictionary %d after a failed fetch, want 0 (uncompressed)", tc.status, got)
		}
		if _, got, _ := c.v2Decoder(context.Background(), s.url()); got != 0 || s.dictHits.Load() != 1 {
			t.Fatalf("HTTP %d: at once again: dictionary %d after %d fetches, want 0 after 1 (not asked again yet)", tc.status, got, s.dictHits.Load())
		}
		if c.noDict[host] != tc.forGood {
			t.Fatalf("HTTP %d: uncompressed for good = %v, want %v", tc.status, c.noDict[host], tc.forGood)
		}
		c.dictRetry[host] = time.Now().Add(-time.Second) // the retry time has come
		_, got, _ := c.v2Decoder(context.Background(), s.url())
		if tc.forGood && (got != 0 || s.dictHits.Load() != 1) {
			t.Fatalf("HTTP %d: dictionary %d after %d fetches, want none asked again", tc.status, got, s.dictHits.Load())
		}
		if !tc.forGood && got != id {
			t.Fatalf("HTTP %d: dictionary %d once the retry time came, want %d", tc.status, got, id)
		}
	}
}

// A URL's own parameter (a proxy's token) was sent with the subscription
// but not with getZstdDictionary, so behind a proxy that checks it the
// host was read uncompressed.
func TestV2DictionaryFetchCarriesTheURLsOwnParameters(t *testing.T) {
	id, err := DictionaryIDOf(dictionary)
	if err != nil {
		t.Fatal(err)
	}
	s := startV2(t, &v2Server{script: script(2), dict: dictionary, dictID: id})
	k := newSink()
	runClient(t, ClientOptions{URLs: []string{s.url() + "?token=abc"}, Compress: true}, k.handle)
	k.waitEvents(t, 2)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.dictQueries) != 1 || s.dictQueries[0].Get("token") != "abc" || len(s.dictQueries[0]) != 1 {
		t.Fatalf("dictionary requests' queries %v, want one with token=abc alone", s.dictQueries)
	}
}

func TestV2ErrorFrameIsTerminalAndReconnects(t *testing.T) {
	sc := script(2)
	sc = append(sc, []byte(`{"$type":"error","error":"ConsumerTooSlow","message":"slow"}`))
	s := startV2(t, &v2Server{script: sc})
	m := testMetrics(t)
	k := newSink()
	runClient(t, ClientOptions{URLs: []string{s.url()}, Metrics: m}, k.handle)
	waitUntil(t, "a reconnect after the error frame", func() bool {
		return metricValue(t, m.reconnects.WithLabelValues(ReasonErrorFrame)) >= 1 &&
			metricValue(t, m.serverErrors.WithLabelValues(ErrNameConsumerTooSlow)) >= 1
	})
}

func TestBadV2FramesAreCountedSkippedAndThePositionMovesPastThem(t *testing.T) {
	sc := [][]byte{
		v2Commit(1, "did:plc:a", "3l3qo2vutsw01"),
		[]byte(`not json`),
		[]byte(`{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#future","seq":3}}`),
		[]byte(`{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#future","seq":4}}`),
		[]byte(strings.Replace(string(v2Commit(5, "did:plc:a", "3l3qo2vutsw05")), "2026-", "1970-", 1)),
		v2Commit(6, "did:plc:a", "3l3qo2vutsw06"),
	}
	s := startV2(t, &v2Server{script: sc})
	m := testMetrics(t)
	k := newSink()
	var mu sync.Mutex
	var top int64
	k.onBatch = func(_ context.Context, b Batch) error {
		mu.Lock()
		top = max(top, b.MaxSeq)
		mu.Unlock()
		return nil
	}
	runClient(t, ClientOptions{URLs: []string{s.url()}, Metrics: m}, k.handle)
	k.waitFor(t, "the last event", func(evs []Event, _ []*DecodeError) bool { return len(evs) > 0 && evs[len(evs)-1].Seq == 6 })
	for class, want := range map[ErrorClass]float64{ClassMalformedJSON: 1, ClassUnknownType: 2, ClassInvalidEvent: 1} {
		if v := metricValue(t, m.decodeErrors.WithLabelValues(string(class))); v < want {
			t.Errorf("%s counted %v, want %v", class, v, want)
		}
	}
	// onBatch runs after the sink has recorded the batch: wait for it.
	waitUntil(t, "a batch whose MaxSeq reaches 6", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return top >= 6
	})
	mu.Lock()
	defer mu.Unlock()
	if top != 6 {
		t.Fatalf("batches reached seq %d, want 6", top)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestAHostThatOnlyPingsIsLeftForTheNextAfterTheStaleTimeout(t *testing.T) {
	quiet := startV2(t, &v2Server{}) // pings, never an event
	live := startV2(t, &v2Server{script: script(3)})
	m := testMetrics(t)
	k := newSink()
	runClient(t, ClientOptions{URLs: []string{quiet.url(), live.url()}, StaleTimeout: 100 * time.Millisecond, Metrics: m}, k.handle)
	k.waitEvents(t, 3)
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonStale)); v < 1 {
		t.Fatalf("stale reconnects %v, want >= 1: pings kept a silent host", v)
	}
}

func TestAHostWhoseSeqsRestartedBelowTheCursorIsReportedAndRedialled(t *testing.T) {
	s := startV2(t, &v2Server{script: script(3)})
	m := testMetrics(t)
	k := newSink()
	var mu sync.Mutex
	reset := false
	runClient(t, ClientOptions{URLs: []string{s.url()}, Metrics: m,
		CursorFor: func(string) int64 {
			mu.Lock()
			defer mu.Unlock()
			if reset {
				return 0
			}
			return 500
		},
		OnSeqReset: func(string) { mu.Lock(); reset = true; mu.Unlock() }}, k.handle)
	evs := k.waitEvents(t, 3)
	if evs[0].Seq != 1 {
		t.Fatalf("first event seq %d, want 1 from the redial", evs[0].Seq)
	}
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonSeqReset)); v != 1 {
		t.Fatalf("seq_reset reconnects %v, want 1", v)
	}
	if v := metricValue(t, m.decodeErrors.WithLabelValues(string(ClassSeqRegression))); v != 0 {
		t.Fatalf("%v events skipped as regressions: the reset host's stream was thrown away", v)
	}
}

// Jetstream v2 restarts from the last sequence number it saved and
// numbers the events it reads again anew: a consumer resuming by a
// number above that point got the events after it, and the ones
// renumbered below it were lost (found against the real server, killed
// and restarted). A resume by seq now expects the cursor's own event
// first, stamped as it was read; anything else resumes the host by time.
func TestAResumeBySeqChecksTheHostReplaysTheCursorsOwnEvent(t *testing.T) {
	eventUS := func(seq int64) int64 { return 1_780_000_000_000_000 + seq }
	for name, tc := range map[string]struct {
		script []byte // the frame the host now numbers 2
		seqUS  int64  // what SeqTimeFor says event 2 was stamped
		reset  bool
	}{
		"the same event":               {v2Commit(2, "did:plc:a", "3l3qo2vutsw02"), eventUS(2), false},
		"the same event, time unknown": {v2Commit(2, "did:plc:a", "3l3qo2vutsw02"), 0, false},
		"another event at 2":           {v2Commit(2, "did:plc:a", "3l3qo2vutsw02"), eventUS(2) - 5, true},
		"the cursor's own skipped":     {v2Commit(7, "did:plc:a", "3l3qo2vutsw07"), eventUS(2), true},
	} {
		t.Run(name, func(t *testing.T) {
			sc := [][]byte{v2Commit(1, "did:plc:a", "3l3qo2vutsw01"), tc.script, v2Commit(8, "did:plc:a", "3l3qo2vutsw08")}
			s := startV2(t, &v2Server{script: sc})
			m := testMetrics(t)
			k := newSink()
			var resets atomic.Int32
			runClient(t, ClientOptions{URLs: []string{s.url()}, Metrics: m,
				CursorFor: func(string) int64 {
					if resets.Load() > 0 {
						return 0 // by time: here, from the start
					}
					return 2
				},
				SeqTimeFor: func(string) int64 { return tc.seqUS },
				OnSeqReset: func(string) { resets.Add(1) }}, k.handle)
			want := 1 // the event after the cursor's own
			if tc.reset {
				want = 3 // everything again, by time
			}
			evs := k.waitEvents(t, want)
			if got := metricValue(t, m.reconnects.WithLabelValues(ReasonSeqReset)); (got == 1) != tc.reset || resets.Load() > 1 {
				t.Fatalf("seq_reset reconnects %v (told %d), want reset %v", got, resets.Load(), tc.reset)
			}
			if last := evs[len(evs)-1]; last.Seq != 8 {
				t.Fatalf("last event seq %d, want 8: %+v", last.Seq, evs)
			}
		})
	}
}

// One frame numbered far ahead of the stream (a broken server, a bad
// proxy) was kept as the connection's high mark, and every real frame
// after it was dropped as a regression until the stream caught up with
// it: all lost, the position parked on the bad number. A frame numbered
// below an earlier one now ends the connection as a seq reset (counted
// as seq_regression), the host is resumed by time, and no real event is
// lost.
func TestAFrameNumberedFarAheadCostsNoEventsAfterIt(t *testing.T) {
	s := startV2(t, &v2Server{script: script(3), firstOnce: [][]byte{
		[]byte(`{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#bogus","seq":999999990}}`)}})
	m := testMetrics(t)
	k := newSink()
	var resets atomic.Int32
	runClient(t, ClientOptions{URLs: []string{s.url()}, Metrics: m,
		OnSeqReset: func(string) { resets.Add(1) }}, k.handle)
	evs := k.waitEvents(t, 3)
	for i, ev := range evs[:3] {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d, want %d: %+v", i, ev.Seq, i+1, evs)
		}
	}
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonSeqReset)); v != 1 {
		t.Fatalf("seq_reset reconnects %v, want 1", v)
	}
	if v := metricValue(t, m.decodeErrors.WithLabelValues(string(ClassSeqRegression))); v != 1 {
		t.Fatalf("seq_regression counted %v, want 1", v)
	}
	if resets.Load() != 1 {
		t.Fatalf("OnSeqReset told %d times, want 1", resets.Load())
	}
}

// A bogus frame carrying the number of the real event after it made the
// client drop that event as a duplicate (found against the real server
// through a proxy): the real update was lost for good. Two different
// frames under one number now resume the host by time; an exact repeat
// of an event is still a duplicate.
func TestTwoFramesUnderOneNumberCostNoEvent(t *testing.T) {
	bogus := []byte(`{"$type":"message","payload":{"$type":"network.bsky.jetstream.subscribeEvents#bogus","seq":2}}`)
	for name, tc := range map[string]struct {
		before []byte
		reset  bool
	}{
		"a bogus frame takes the number": {bogus, true},
		"another event takes the number": {v2Commit(2, "did:plc:b", "3l3qo2vutsw02"), true},
		"an exact repeat":                {v2Commit(2, "did:plc:a", "3l3qo2vutsw02"), false},
		// Found against the real server: a twin with the real event's
		// number, DID and time, another record.
		"a twin of another record": {[]byte(strings.Replace(string(v2Commit(2, "did:plc:a", "3l3qo2vutsw02")), `"rkey":"r2"`, `"rkey":"twin"`, 1)), true},
	} {
		t.Run(name, func(t *testing.T) {
			s := startV2(t, &v2Server{script: script(3), beforeOnce: map[int][]byte{1: tc.before}})
			m := testMetrics(t)
			k := newSink()
			runClient(t, ClientOptions{URLs: []string{s.url()}, Metrics: m}, k.handle)
			k.waitFor(t, "the event numbered 2 from did:plc:a, record r2", func(evs []Event, _ []*DecodeError) bool {
				for _, ev := range evs {
					if ev.Seq == 2 && ev.DID == "did:plc:a" && ev.Commit != nil && ev.Commit.RKey == "r2" {
						return true
					}
				}
				return false
			})
			if got := metricValue(t, m.reconnects.WithLabelValues(ReasonSeqReset)); (got >= 1) != tc.reset {
				t.Fatalf("seq_reset reconnects %v, want a reset %v", got, tc.reset)
			}
		})
	}
}

// The v2 frame and its payload are read with exact, once-only member
// names too (internal/atproto): a "Seq" is no seq, and a second "seq"
// or "did" is a malformed frame, not a choice of the last one.
func TestV2MemberNamesAreMatchedExactlyAndOnlyOnce(t *testing.T) {
	base := string(v2Commit(7, "did:plc:a", "3l3qo2vutsw07"))
	if d, err := decodeV2([]byte(base)); err != nil || d.ev.Seq != 7 {
		t.Fatalf("the base frame: %+v, %v", d, err)
	}
	for name, tc := range map[string]struct {
		frame string
		class ErrorClass
	}{
		"seq under Seq":         {strings.Replace(base, `"seq":7`, `"Seq":7`, 1), ClassInvalidEvent},
		"payload under Payload": {strings.Replace(base, `"payload"`, `"Payload"`, 1), ClassMalformedJSON},
		"seq twice":             {strings.Replace(base, `"seq":7`, `"seq":7,"seq":1000000`, 1), ClassMalformedJSON},
		"did twice":             {strings.Replace(base, `"did":"did:plc:a"`, `"did":"did:plc:a","did":"did:plc:b"`, 1), ClassMalformedJSON},
		"$type twice":           {strings.Replace(base, `"$type":"message"`, `"$type":"message","$type":"error"`, 1), ClassMalformedJSON},
	} {
		_, err := decodeV2([]byte(tc.frame))
		if ClassOf(err) != tc.class {
			t.Errorf("%s: %v (class %q), want class %q", name, err, ClassOf(err), tc.class)
		}
	}
}

func TestV2ServerTextIsBoundedWithoutLosingItsEndOrSplittingACharacter(t *testing.T) {
	// The floor's seq is at the end, and a two-byte character straddles
	// byte 64, where the old cut fell.
	msg := strings.Repeat("x", 63) + "é requested timestamp cursor below retention floor; starting at seq 4242"
	info, _ := json.Marshal(map[string]any{"$type": "message", "payload": map[string]any{
		"$type": "network.bsky.jetstream.subscribeEvents#info", "name": "OutdatedCursor", "message": msg}})
	s := startV2(t, &v2Server{script: script(1), first: [][]byte{info}})
	lines := make(chan string, 16)
	log := zerolog.New(writerFunc(func(p []byte) (int, error) {
		if strings.Contains(string(p), "jetstream #info advisory") {
			lines <- string(p)
		}
		return len(p), nil
	}))
	k := newSink()
	runClient(t, ClientOptions{URLs: []string{s.url()}, Log: log}, k.handle)
	k.waitEvents(t, 1)
	select {
	case line := <-lines:
		// zerolog writes valid UTF-8 as is and a split character as \ufffd.
		if !strings.Contains(line, msg) {
			t.Fatalf("#info line %s does not hold the whole message %q", line, msg)
		}
	case <-time.After(testWait):
		t.Fatal("no #info line")
	}

	// Longer than the bound: both ends kept, whole characters only.
	long := strings.Repeat("é", 600) + " starting at seq 4242"
	for _, d := range [][]byte{
		[]byte(`{"$type":"message","payload":{"$type":"` + long + `"}}`),
		[]byte(`{"$type":"` + long + `"}`),
	} {
		_, err := decodeV2(d)
		if err == nil || !utf8.ValidString(err.Error()) || !strings.Contains(err.Error(), "seq 4242") ||
			len(err.Error()) > logval.MaxBytes+100 {
			t.Errorf("decodeV2 error %q: want it valid UTF-8, bounded, with its end", err)
		}
	}
	d, err := decodeV2([]byte(`{"$type":"error","error":"ConsumerTooSlow","message":"` + long + `"}`))
	if err != nil || d.err == nil || d.err.Name != ErrNameConsumerTooSlow ||
		!utf8.ValidString(d.err.Message) || len(d.err.Message) > logval.MaxBytes+100 || !strings.HasSuffix(d.err.Message, "seq 4242") {
		t.Errorf("error frame = %+v, %v: want its name, and its message bounded with its end", d.err, err)
	}
}

// With a host's dictionary endpoint failing for now at every retry (the
// host unreachable), the first failure is said at warn and the next ones
// at debug, until a fetch succeeds.
func TestV2DictionaryFetchFailingAgainWarnsOnlyTheFirstTime(t *testing.T) {
	id, err := DictionaryIDOf(dictionary)
	if err != nil {
		t.Fatal(err)
	}
	s := startV2(t, &v2Server{dict: dictionary, dictID: id, dictStatus: http.StatusServiceUnavailable, dictFailures: 3})
	var mu sync.Mutex
	var levels []string
	log := zerolog.New(writerFunc(func(p []byte) (int, error) {
		var line struct{ Level, Message string }
		if err := json.Unmarshal(p, &line); err == nil && strings.Contains(line.Message, "dictionary not fetched") {
			mu.Lock()
			levels = append(levels, line.Level)
			mu.Unlock()
		}
		return len(p), nil
	})).Level(zerolog.DebugLevel)
	c, err := NewClient(ClientOptions{URLs: []string{s.url()}, Compress: true, Log: log}, func(context.Context, Batch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	host := HostOf(s.url())
	fetch := func() uint32 {
		if _, ok := c.dictRetry[host]; ok {
			c.dictRetry[host] = time.Now().Add(-time.Second) // the retry time has come
		}
		_, got, _ := c.v2Decoder(context.Background(), s.url())
		return got
	}
	for range 3 {
		if got := fetch(); got != 0 {
			t.Fatalf("dictionary %d while the endpoint fails", got)
		}
	}
	if got := fetch(); got != id {
		t.Fatalf("dictionary %d once the endpoint answers, want %d", got, id)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"warn", "debug", "debug"}; !slices.Equal(levels, want) {
		t.Fatalf("levels %v, want %v", levels, want)
	}
}
