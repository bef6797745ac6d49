package jetstream

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/testsupport"
)

// closeBound bounds Close and context cancellation in these tests. What
// they catch is a Close that waits on the socket (a silent server: the
// stale timeout, 60 s by default) or on the handler. The brief's 100 ms is
// a figure of `appview-dev bench` (jetstream_close_*), not a timed test: a
// loaded -race run can pause any goroutine for that long.
const closeBound = time.Second

// sink is a Handler that records what it is given and lets tests wait for
// a condition on it.
type sink struct {
	mu       sync.Mutex
	events   []Event
	failures []*DecodeError
	batches  []int // sizes
	changed  chan struct{}
	// onBatch, when set, runs after recording (on the client's goroutine).
	onBatch func(ctx context.Context, b Batch) error
}

func newSink() *sink { return &sink{changed: make(chan struct{}, 1)} }

func (s *sink) handle(ctx context.Context, b Batch) error {
	s.mu.Lock()
	s.events = append(s.events, b.Events...)
	s.failures = append(s.failures, b.Failures...)
	s.batches = append(s.batches, b.Len())
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
	if s.onBatch != nil {
		return s.onBatch(ctx, b)
	}
	return nil
}

// lastTimeUS is the time_us of the last event handled: what a consumer
// would store as its cursor.
func (s *sink) lastTimeUS() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.events) == 0 {
		return 0
	}
	return s.events[len(s.events)-1].TimeUS
}

// waitFor blocks until cond holds over what was handled, or fails the test
// after testWait.
func (s *sink) waitFor(t *testing.T, what string, cond func(evs []Event, fails []*DecodeError) bool) {
	t.Helper()
	deadline := time.NewTimer(testWait)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ok := cond(s.events, s.failures)
		n, f := len(s.events), len(s.failures)
		s.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-s.changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s (have %d events, %d failures)", what, n, f)
		}
	}
}

func (s *sink) waitEvents(t *testing.T, n int) []Event {
	t.Helper()
	s.waitFor(t, fmt.Sprintf("%d events", n), func(evs []Event, _ []*DecodeError) bool { return len(evs) >= n })
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Event(nil), s.events...)
}

// runClient starts a client; the test's cleanup closes it and checks that
// Run returned nil.
func runClient(t *testing.T, opts ClientOptions, h Handler) *Client {
	t.Helper()
	if opts.MinBackoff == 0 {
		opts.MinBackoff = 5 * time.Millisecond
	}
	c, err := NewClient(opts, h)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		c.Close()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return c
}

// metricValue reads one counter or gauge.
func metricValue(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	switch {
	case out.Counter != nil:
		return out.Counter.GetValue()
	case out.Gauge != nil:
		return out.Gauge.GetValue()
	}
	t.Fatalf("%s is neither a counter nor a gauge", m.Desc())
	return 0
}

func testMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// silentServer accepts websockets and then says nothing: it never writes
// and never reads (so it does not even answer pings), like a server whose
// process hangs or whose path drops packets without closing.
type silentServer struct {
	srv   *httptest.Server
	conns atomic.Int64
	up    chan struct{} // one tick per accepted connection
	quit  chan struct{}
	wg    sync.WaitGroup
}

func startSilent(t *testing.T) *silentServer {
	t.Helper()
	s := &silentServer{up: make(chan struct{}, 100), quit: make(chan struct{})}
	var upgrader websocket.Upgrader
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.wg.Add(1)
		defer s.wg.Done()
		ws, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		s.conns.Add(1)
		s.up <- struct{}{}
		<-s.quit
	}))
	t.Cleanup(func() {
		close(s.quit)
		s.srv.Close()
		s.wg.Wait()
	})
	return s
}

func (s *silentServer) url() string {
	return "ws" + strings.TrimPrefix(s.srv.URL, "http") + "/subscribe"
}

func (s *silentServer) waitConnections(t *testing.T, n int64) {
	t.Helper()
	deadline := time.NewTimer(testWait)
	defer deadline.Stop()
	for s.conns.Load() < n {
		select {
		case <-s.up:
		case <-deadline.C:
			t.Fatalf("only %d connections, want %d", s.conns.Load(), n)
		}
	}
}

func TestClientDeliversEveryCapturedEventInOrderRawAndCompressed(t *testing.T) {
	want := captureEvents(t, "expected_v1.jsonl")
	for _, compress := range []bool{false, true} {
		t.Run(fmt.Sprintf("compress=%v", compress), func(t *testing.T) {
			srv := startReplay(t, ReplayOptions{})
			m := testMetrics(t)
			s := newSink()
			runClient(t, ClientOptions{URLs: []string{srv.URL()}, Compress: compress, BatchSize: 10, Metrics: m}, s.handle)
			got := s.waitEvents(t, len(want))
			if !reflect.DeepEqual(got, want) {
				t.Fatal("delivered events differ from the capture")
			}
			s.mu.Lock()
			for _, n := range s.batches {
				if n > 10 || n == 0 {
					t.Errorf("batch of %d, want 1..10", n)
				}
			}
			if len(s.failures) != 0 {
				t.Errorf("failures on a clean capture: %v", s.failures[0])
			}
			s.mu.Unlock()
			if v := metricValue(t, m.frames); v != 152 {
				t.Errorf("frames_total %v, want 152", v)
			}
			if v := metricValue(t, m.events.WithLabelValues(KindCommit)); v != 150 {
				t.Errorf("events_total{commit} %v, want 150", v)
			}
			if v := metricValue(t, m.connected); v != 1 {
				t.Errorf("connected %v, want 1", v)
			}
			if metricValue(t, m.bytes) == 0 {
				t.Error("received_bytes_total is 0")
			}
		})
	}
}

// Prepare sees every delivered event, in stream order, on the reading
// goroutine before the handler gets its batch, and what it leaves in
// Event.Prepared arrives with the event.
func TestClientPreparesEveryEventBeforeItsBatchIsDelivered(t *testing.T) {
	want := captureEvents(t, "expected_v1.jsonl")
	srv := startReplay(t, ReplayOptions{})
	var mu sync.Mutex
	prepared := 0
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{srv.URL()}, BatchSize: 10, Prepare: func(ev *Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Prepared != nil {
			t.Errorf("event %d arrived at Prepare already prepared", prepared)
		}
		ev.Prepared = prepared
		prepared++
	}}, s.handle)
	got := s.waitEvents(t, len(want))
	for i := range got {
		if got[i].Prepared != i {
			t.Fatalf("event %d delivered with Prepared %v, want %d", i, got[i].Prepared, i)
		}
		got[i].Prepared = nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatal("delivered events differ from the capture")
	}
}

func TestClientWithAtcrCollectionsReceivesOnlyIdentityAndAccountEvents(t *testing.T) {
	srv := startReplay(t, ReplayOptions{})
	for _, compress := range []bool{false, true} {
		s := newSink()
		runClient(t, ClientOptions{URLs: []string{srv.URL()}, Collections: []string{"io.atcr.*"}, Compress: compress}, s.handle)
		// The capture ends with the identity and account events, so any
		// commit let through would arrive before them.
		got := s.waitEvents(t, 2)
		if len(got) != 2 || got[0].Kind != KindIdentity || got[1].Kind != KindAccount {
			t.Fatalf("compress=%v: got %d events starting with %q, want exactly identity then account", compress, len(got), got[0].Kind)
		}
	}
}

func TestClientResumesFromTheCursorInclusively(t *testing.T) {
	all := captureEvents(t, "expected_v1.jsonl")
	k := prefixMaxIndex(t, all, 40)
	srv := startReplay(t, ReplayOptions{DropAfter: k + 1})
	m := testMetrics(t)
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{srv.URL()}, Cursor: s.lastTimeUS, Metrics: m}, s.handle)
	got := s.waitEvents(t, k+2)
	if !reflect.DeepEqual(got[:k+1], all[:k+1]) {
		t.Fatal("first connection did not deliver events 0..k")
	}
	if !reflect.DeepEqual(got[k+1], all[k]) {
		t.Fatalf("after reconnecting with cursor = time_us of event %d, got %+v first, want that event again", k, got[k+1])
	}
	if srv.Connections() < 2 {
		t.Fatalf("%d connections, want a reconnect", srv.Connections())
	}
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonReadError)); v < 1 {
		t.Fatalf("reconnects_total{read_error} %v after a drop", v)
	}
}

func TestClientOptionsUpdateNarrowsTheStreamMidConnection(t *testing.T) {
	srv := startReplay(t, ReplayOptions{Loop: true, Rate: 3000})
	s := newSink()
	client := make(chan *Client, 1)
	var once sync.Once
	updated := make(chan error, 1)
	s.onBatch = func(ctx context.Context, b Batch) error {
		// From inside the handler, as a consumer reacting to its stream would.
		once.Do(func() { updated <- (<-client).UpdateOptions([]string{"io.atcr.*"}) })
		return nil
	}
	client <- runClient(t, ClientOptions{URLs: []string{srv.URL()}, Compress: true}, s.handle)
	if err := <-updated; err != nil {
		t.Fatal(err)
	}
	// The looped capture never has more than two non-commit events in a
	// row, so four in a row means the server applied the filter; from
	// there on nothing else may arrive.
	runStart := -1
	s.waitFor(t, "four identity/account events in a row", func(evs []Event, _ []*DecodeError) bool {
		run := 0
		for i, e := range evs {
			if e.Commit != nil {
				run = 0
				continue
			}
			if run++; run == 4 {
				runStart = i - 3
				return true
			}
		}
		return false
	})
	got := s.waitEvents(t, runStart+12)
	if got[0].Commit == nil {
		t.Fatal("the stream was narrow before the update")
	}
	for i, e := range got[runStart:] {
		if e.Commit != nil {
			t.Fatalf("commit %s arrived %d events after the filter took effect", e.Commit.Collection, i)
		}
	}
	if n := srv.Connections(); n != 1 {
		t.Fatalf("%d connections: the update must not need a reconnect", n)
	}
}

func TestUpdateOptionsBeforeRunAppliesToTheFirstConnection(t *testing.T) {
	srv := startReplay(t, ReplayOptions{})
	s := newSink()
	c, err := NewClient(ClientOptions{URLs: []string{srv.URL()}}, s.handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateOptions([]string{"io.atcr.*"}); err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateOptions([]string{"not valid"}); err == nil {
		t.Fatal("accepted an invalid collection")
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	got := s.waitEvents(t, 2)
	if got[0].Kind != KindIdentity {
		t.Fatalf("first event %s, want the identity event (filter not applied)", got[0].Kind)
	}
	c.Close()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
}

func TestClientReconnectsWhenTheServerGoesSilent(t *testing.T) {
	silent := startSilent(t)
	m := testMetrics(t)
	runClient(t, ClientOptions{URLs: []string{silent.url()}, StaleTimeout: 150 * time.Millisecond, Metrics: m}, newSink().handle)
	silent.waitConnections(t, 2)
	// Run counts the reconnect before it dials again, so the second
	// connection implies the count.
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonStale)); v < 1 {
		t.Fatalf("reconnects_total{stale} %v, want the silent connection counted as stale", v)
	}
}

func TestClientSkipsAndCountsAnOversizedFrameWithoutReconnecting(t *testing.T) {
	lines := captureLines(t, "expected_v1.jsonl")
	// Random bytes do not compress: the frame is oversized either way.
	noise := make([]byte, 48<<10)
	rng := rand.NewChaCha8([32]byte{7})
	rng.Read(noise)
	big := fmt.Sprintf(`{"did":"did:plc:big","time_us":1783175888100000,"kind":"commit","commit":{"rev":"r","operation":"create","collection":"io.atcr.manifest","rkey":"k","record":{"blob":%q}}}`,
		base64.StdEncoding.EncodeToString(noise))
	var capture []string
	var want []Event
	for i, l := range lines[:20] {
		if i == 10 {
			capture = append(capture, big)
		}
		capture = append(capture, string(l))
		ev, _ := Decode(l)
		want = append(want, ev)
	}
	srv := startReplay(t, ReplayOptions{File: writeCapture(t, capture...)})
	for _, compress := range []bool{false, true} {
		m := testMetrics(t)
		s := newSink()
		runClient(t, ClientOptions{URLs: []string{srv.URL()}, Compress: compress, MaxMessageBytes: 16 << 10, Metrics: m}, s.handle)
		got := s.waitEvents(t, len(want))
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("compress=%v: events around the oversized frame differ", compress)
		}
		s.mu.Lock()
		fails := append([]*DecodeError(nil), s.failures...)
		s.mu.Unlock()
		if len(fails) != 1 || fails[0].Class != ClassOversized || fails[0].Size <= 16<<10 {
			t.Fatalf("compress=%v: failures %v, want one oversized frame with its size", compress, fails)
		}
		if v := metricValue(t, m.decodeErrors.WithLabelValues(string(ClassOversized))); v != 1 {
			t.Fatalf("compress=%v: decode_errors_total{oversized} %v, want 1", compress, v)
		}
		if v := metricValue(t, m.frames); v != 21 {
			t.Fatalf("compress=%v: frames_total %v, want 21", compress, v)
		}
		for _, r := range reconnectReasons {
			if v := metricValue(t, m.reconnects.WithLabelValues(r)); v != 0 {
				t.Fatalf("compress=%v: reconnected (%s) over an oversized frame", compress, r)
			}
		}
	}
	if n := srv.Connections(); n != 2 {
		t.Fatalf("%d connections for two clients: an oversized frame caused a reconnect", n)
	}
}

func TestClientDeliversDecodeFailuresInStreamWithoutStopping(t *testing.T) {
	lines := captureLines(t, "golden_v1.jsonl")
	var upgrader websocket.Upgrader
	var wg sync.WaitGroup
	quit := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wg.Add(1)
		defer wg.Done()
		ws, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		ws.WriteMessage(websocket.TextMessage, lines[0])
		ws.WriteMessage(websocket.TextMessage, []byte(`{"did":`))
		ws.WriteMessage(websocket.BinaryMessage, []byte("not zstd at all"))
		ws.WriteMessage(websocket.TextMessage, []byte(`{"did":"did:plc:x","time_us":5,"kind":"sync"}`))
		// Well formed, but stamped far beyond any clock error.
		ws.WriteMessage(websocket.TextMessage, []byte(`{"did":"did:plc:x","time_us":9000000000000000000,"kind":"identity","identity":{"did":"did:plc:x","seq":1}}`))
		ws.WriteMessage(websocket.BinaryMessage, Compress(nil, lines[1]))
		<-quit
	}))
	t.Cleanup(func() { close(quit); srv.Close(); wg.Wait() })
	m := testMetrics(t)
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{"ws" + strings.TrimPrefix(srv.URL, "http")}, Metrics: m}, s.handle)
	s.waitFor(t, "2 events and 4 failures", func(evs []Event, fails []*DecodeError) bool { return len(evs) == 2 && len(fails) == 4 })
	want := []ErrorClass{ClassMalformedJSON, ClassBadZstd, ClassInvalidEvent, ClassInvalidEvent}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.failures {
		if f.Class != want[i] {
			t.Errorf("failure %d: %s, want %s", i, f.Class, want[i])
		}
	}
	for class, n := range map[ErrorClass]float64{ClassMalformedJSON: 1, ClassBadZstd: 1, ClassInvalidEvent: 2} {
		if v := metricValue(t, m.decodeErrors.WithLabelValues(string(class))); v != n {
			t.Errorf("decode_errors_total{%s} %v, want %v", class, v, n)
		}
	}
	if s.failures[2].TimeUS != 5 || s.failures[3].TimeUS != 9000000000000000000 {
		t.Errorf("invalid event failures lost their time_us: %+v %+v", s.failures[2], s.failures[3])
	}
	if !strings.Contains(s.failures[3].Error(), "ahead of this host's clock") {
		t.Errorf("the future event's failure does not say why: %v", s.failures[3])
	}
}

func TestClientTriesTheNextURLWhenOneRefuses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String() + "/subscribe"
	ln.Close() // nothing listens there now
	srv := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl")})
	m := testMetrics(t)
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{dead, srv.URL()}, Metrics: m}, s.handle)
	s.waitEvents(t, len(srv.events))
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonDial)); v < 1 {
		t.Fatalf("reconnects_total{dial} %v, want the refused URL counted", v)
	}
}

func TestClientAsksCursorForTheEndpointItDialsAndTagsBatchesWithIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String() + "/subscribe"
	ln.Close() // nothing listens there now
	all := captureEvents(t, "expected_v1.jsonl")
	k := prefixMaxIndex(t, all, 40)
	srv := startReplay(t, ReplayOptions{})
	var mu sync.Mutex
	var asked, from []string
	s := newSink()
	s.onBatch = func(_ context.Context, b Batch) error {
		mu.Lock()
		from = append(from, b.URL)
		mu.Unlock()
		return nil
	}
	runClient(t, ClientOptions{URLs: []string{dead, srv.URL()}, CursorFor: func(url string) int64 {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, url)
		return all[k].TimeUS
	}}, s.handle)
	got := s.waitEvents(t, 1)
	if !reflect.DeepEqual(got[0], all[k]) {
		t.Fatalf("first event %+v, want event %d, whose time_us CursorFor gave", got[0], k)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) < 2 || asked[0] != dead || asked[1] != srv.URL() {
		t.Fatalf("CursorFor asked for %q, want the refused URL then the live one", asked)
	}
	for _, u := range from {
		if u != srv.URL() {
			t.Fatalf("a batch says it came from %q, want %q", u, srv.URL())
		}
	}
}

func TestConnectionLostLinesGiveTheRetryDelayInMilliseconds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String() + "/subscribe"
	ln.Close() // nothing listens there now
	lines := make(chan []byte, 16)
	log := zerolog.New(writerFunc(func(p []byte) (int, error) {
		select {
		case lines <- append([]byte(nil), p...):
		default:
		}
		return len(p), nil
	}))
	const minBackoff, maxBackoff = 40 * time.Millisecond, 80 * time.Millisecond
	runClient(t, ClientOptions{URLs: []string{dead}, Log: log, MinBackoff: minBackoff, MaxBackoff: maxBackoff},
		func(context.Context, Batch) error { return nil })
	deadline := time.After(testWait)
	for {
		select {
		case <-deadline:
			t.Fatal("no connection lost line")
		case raw := <-lines:
			var line map[string]any
			if err := json.Unmarshal(raw, &line); err != nil || line["message"] != "jetstream connection lost" {
				continue
			}
			if _, ok := line["retry_in"]; ok {
				t.Fatalf("a unitless retry_in field: %s", raw)
			}
			ms, ok := line["retry_in_ms"].(float64)
			// ±50% jitter around the backoff, capped at maxBackoff.
			if !ok || ms < float64(minBackoff.Milliseconds())/2 || ms > float64(maxBackoff.Milliseconds()) {
				t.Fatalf("retry_in_ms %v, want milliseconds within [%d, %d]: %s",
					line["retry_in_ms"], minBackoff.Milliseconds()/2, maxBackoff.Milliseconds(), raw)
			}
			return
		}
	}
}

// writerFunc adapts a function to io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestClientRetriesAHealthyURLBeforeRotating(t *testing.T) {
	first := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl"), DropAfter: 3})
	second := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl")})
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{first.URL(), second.URL()}}, s.handle)
	s.waitEvents(t, 9) // three connections' worth
	if n := second.Connections(); n != 0 {
		t.Fatalf("rotated to the second URL (%d connections) although the first kept delivering", n)
	}
	if n := first.Connections(); n < 3 {
		t.Fatalf("first URL saw %d connections, want 3", n)
	}
}

func TestClientCloseReturnsPromptlyWhileTheServerIsSilent(t *testing.T) {
	silent := startSilent(t)
	c, err := NewClient(ClientOptions{URLs: []string{silent.url()}}, newSink().handle)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	silent.waitConnections(t, 1)
	start := time.Now()
	c.Close()
	if el := time.Since(start); el > closeBound {
		t.Fatalf("Close took %v against a silent server", el)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestClientCloseReturnsPromptlyWhileTheHandlerIsBlocked(t *testing.T) {
	srv := startReplay(t, ReplayOptions{})
	entered := make(chan struct{}, 1)
	h := func(ctx context.Context, b Batch) error {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return ctx.Err()
	}
	c, err := NewClient(ClientOptions{URLs: []string{srv.URL()}}, h)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	<-entered
	start := time.Now()
	c.Close()
	if el := time.Since(start); el > closeBound {
		t.Fatalf("Close took %v with the handler blocked", el)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestClientCloseReturnsPromptlyWhileAnOptionsUpdateIsStuck(t *testing.T) {
	silent := startSilent(t)
	// Small socket buffers on our side make a 1 MB options_update block
	// for good against a server that never reads.
	dialer := &websocket.Dialer{NetDialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			conn.(*net.TCPConn).SetWriteBuffer(4 << 10)
		}
		return conn, err
	}}
	c, err := NewClient(ClientOptions{URLs: []string{silent.url()}, Dialer: dialer}, newSink().handle)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- c.Run(context.Background()) }()
	silent.waitConnections(t, 1)
	huge := make([]string, 40_000)
	for i := range huge {
		huge[i] = fmt.Sprintf("io.atcr.generated.collection%d", i)
	}
	updating := make(chan error, 1)
	// Past Jetstream's 100-collection limit (which UpdateOptions refuses),
	// so write it the way UpdateOptions does, under writeMu.
	var conn *websocket.Conn
	for wait := time.Now().Add(testWait); conn == nil; runtime.Gosched() {
		if time.Now().After(wait) {
			t.Fatal("no live connection")
		}
		c.mu.Lock()
		conn = c.conn
		c.mu.Unlock()
	}
	go func() {
		c.writeMu.Lock()
		defer c.writeMu.Unlock()
		updating <- writeOptionsUpdate(conn, huge)
	}()
	// Wait until UpdateOptions holds the write lock: it is then writing,
	// and with these buffers the write cannot finish.
	deadline := time.Now().Add(testWait)
	for c.writeMu.TryLock() {
		c.writeMu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("UpdateOptions never started writing")
		}
		runtime.Gosched()
	}
	start := time.Now()
	c.Close()
	if el := time.Since(start); el > closeBound {
		t.Fatalf("Close took %v behind a stuck options_update", el)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := <-updating; err == nil {
		t.Fatal("the stuck options_update reported success")
	}
}

func TestClientRunReturnsPromptlyWhenItsContextEnds(t *testing.T) {
	silent := startSilent(t)
	c, err := NewClient(ClientOptions{URLs: []string{silent.url()}}, newSink().handle)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	silent.waitConnections(t, 1)
	start := time.Now()
	cancel()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el > closeBound {
			t.Fatalf("Run took %v to return after cancel", el)
		}
	case <-time.After(testWait):
		t.Fatal("Run did not return after cancel")
	}
	if err := c.Run(context.Background()); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("second Run: %v", err)
	}
}

func TestClientHandlerErrorStopsRunAndIsReturned(t *testing.T) {
	srv := startReplay(t, ReplayOptions{})
	diskFull := errors.New("disk full")
	c, err := NewClient(ClientOptions{URLs: []string{srv.URL()}}, func(context.Context, Batch) error { return diskFull })
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Run(context.Background()); !errors.Is(err, diskFull) {
		t.Fatalf("Run returned %v, want the handler's error", err)
	}
}

func TestNewClientRejectsBadOptions(t *testing.T) {
	h := newSink().handle
	for name, o := range map[string]ClientOptions{
		"no urls":            {},
		"http url":           {URLs: []string{"http://example.com/subscribe"}},
		"no host":            {URLs: []string{"ws:///subscribe"}},
		"bad collection":     {URLs: []string{"ws://h/s"}, Collections: []string{"io.atcr"}},
		"negative staleness": {URLs: []string{"ws://h/s"}, StaleTimeout: -time.Second},
	} {
		if _, err := NewClient(o, h); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewClient(ClientOptions{URLs: []string{"ws://h/s"}}, nil); err == nil {
		t.Error("nil handler accepted")
	}
}

func TestSubscribeURLCarriesTheSubscriptionAndKeepsOtherParameters(t *testing.T) {
	got, err := subscribeURL("wss://js.example/subscribe?requireHello=false&cursor=1", []string{"io.atcr.*", "app.bsky.feed.like"}, 1783175888085434, true)
	if err != nil {
		t.Fatal(err)
	}
	want := "wss://js.example/subscribe?compress=true&cursor=1783175888085434&requireHello=false&wantedCollections=io.atcr.%2A&wantedCollections=app.bsky.feed.like"
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	live, _ := subscribeURL("ws://h/subscribe", nil, 0, false)
	if live != "ws://h/subscribe" {
		t.Fatalf("live tail URL %s", live)
	}
}

func TestOptionsUpdateMessageHasJetstreamsShape(t *testing.T) {
	msg, err := encodeOptionsUpdate([]string{"io.atcr.*"})
	if err != nil {
		t.Fatal(err)
	}
	var got any
	json.Unmarshal(msg, &got)
	var want any
	json.Unmarshal([]byte(`{"type":"options_update","payload":{"wantedCollections":["io.atcr.*"],"wantedDids":[],"maxMessageSizeBytes":0}}`), &want)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %s", msg)
	}
}

// The collectors are built once per process and shared by the clients of
// successive grants: what any of them counts is in the one registered set,
// and a second set cannot be registered beside it.
func TestMetricsRegisterOnceAndEveryClientCountsIntoThem(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Fatal("a second set of jetstream collectors registered beside the first")
	}
	for range 2 {
		c, err := NewClient(ClientOptions{URLs: []string{"ws://127.0.0.1:1/subscribe"}, Metrics: m}, func(context.Context, Batch) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		c.opts.Metrics.frame(10)
	}
	if v := metricValue(t, m.frames); v != 2 {
		t.Fatalf("registered counter %v, want the frames of both clients (2)", v)
	}
	var none *Metrics
	none.frame(1) // a nil *Metrics records nothing and does not panic
	families, err := reg.Gather()
	if err != nil || len(families) != 8 {
		t.Fatalf("gathered %d metric families, want 8 (the vectors without series are not gathered): %v", len(families), err)
	}
}

// connectionLostLines starts a client on urls whose log lines named
// "jetstream connection lost" arrive, decoded, on the returned channel.
func connectionLostLines(t *testing.T, opts ClientOptions) <-chan map[string]any {
	t.Helper()
	lines := make(chan map[string]any, 64)
	opts.Log = zerolog.New(writerFunc(func(p []byte) (int, error) {
		var line map[string]any
		if json.Unmarshal(p, &line) == nil && line["message"] == "jetstream connection lost" {
			select {
			case lines <- line:
			default:
			}
		}
		return len(p), nil
	}))
	runClient(t, opts, func(context.Context, Batch) error { return nil })
	return lines
}

func nextLine(t *testing.T, lines <-chan map[string]any) map[string]any {
	t.Helper()
	select {
	case line := <-lines:
		return line
	case <-time.After(testWait):
		t.Fatal("no \"jetstream connection lost\" line")
		return nil
	}
}

// gorilla/websocket reports any refused upgrade as "bad handshake"
// (gorilla/websocket#780): a CDN's 429, a proxy's 502 page, a redirect
// or a v1 host's plain-text 400 said nothing more in the log.
func TestARefusedUpgradeWithoutAnXRPCErrorIsLoggedWithItsStatusAndBody(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		header http.Header
		body   string
		want   []string
		label  string
	}{
		{"cdn 429", http.StatusTooManyRequests, nil, "<html>\n<body>Too   many requests</body></html>",
			[]string{"HTTP 429 Too Many Requests", "<html> <body>Too many requests</body></html>"}, "HTTP_429"},
		{"proxy 502", http.StatusBadGateway, nil, strings.Repeat("x", 5000),
			[]string{"HTTP 502 Bad Gateway: " + strings.Repeat("x", maxRefusalExcerpt) + "…"}, "HTTP_502"},
		{"v1 plain text 400", http.StatusBadRequest, nil, "invalid cursor\n",
			[]string{"HTTP 400 Bad Request: invalid cursor"}, "HTTP_400"},
		{"redirect", http.StatusPermanentRedirect, http.Header{"Location": {"wss://u:secret@js.example/subscribe"}}, "",
			[]string{"HTTP 308 Permanent Redirect, Location wss://u:xxxxx@js.example/subscribe", "redirects are not followed"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header()[k] = v
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			m := testMetrics(t)
			line := nextLine(t, connectionLostLines(t, ClientOptions{URLs: []string{"ws" + strings.TrimPrefix(srv.URL, "http") + "/subscribe"},
				Metrics: m, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
			msg, _ := line["error"].(string)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q, want it to contain %q", msg, w)
				}
			}
			if strings.Contains(msg, "secret") {
				t.Errorf("the Location's password was logged: %q", msg)
			}
			if tc.label != "" {
				if line["reason"] != ReasonRefused {
					t.Errorf("reason %v, want %s", line["reason"], ReasonRefused)
				}
				if v := metricValue(t, m.serverErrors.WithLabelValues(tc.label)); v < 1 {
					t.Errorf("server_errors_total{error=%q} = %v, want the refusal counted", tc.label, v)
				}
			}
		})
	}
}

// A 429 or 503 names how long to stay away (Retry-After, RateLimit-Reset);
// the URL was dialled again after its backoff alone (0.5 s by default),
// into a limit that refusals may extend.
func TestARefusedUpgradeHoldsItsURLForWhatRetryAfterAsks(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		header   http.Header
		min, max time.Duration
	}{
		{"429 retry-after", http.StatusTooManyRequests, http.Header{"Retry-After": {"3"}}, 3 * time.Second, 3 * time.Second},
		{"429 ratelimit-reset", http.StatusTooManyRequests, http.Header{"Ratelimit-Reset": {"7"}}, 7 * time.Second, 7 * time.Second},
		{"429 retry-after 0", http.StatusTooManyRequests, http.Header{"Retry-After": {"0"}}, minRateLimitHold, minRateLimitHold},
		{"429 without a header", http.StatusTooManyRequests, nil, minRateLimitHold, minRateLimitHold},
		{"503 retry-after", http.StatusServiceUnavailable, http.Header{"Retry-After": {"2"}}, 2 * time.Second, 2 * time.Second},
		{"429 retry-after of a day", http.StatusTooManyRequests, http.Header{"Retry-After": {"86400"}}, maxRefusalHold, maxRefusalHold},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				for k, v := range tc.header {
					w.Header()[k] = v
				}
				w.WriteHeader(tc.status)
			}))
			defer srv.Close()
			line := nextLine(t, connectionLostLines(t, ClientOptions{URLs: []string{"ws" + strings.TrimPrefix(srv.URL, "http") + "/subscribe"},
				MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}))
			ms, _ := line["retry_in_ms"].(float64)
			// The line is written a moment after the hold was set.
			if got := time.Duration(ms) * time.Millisecond; got < tc.min-100*time.Millisecond || got > tc.max {
				t.Fatalf("retry_in_ms %v, want %s to %s (the server's hold, bounded)", ms, tc.min, tc.max)
			}
			if n := hits.Load(); n != 1 {
				t.Fatalf("%d upgrades when the line was written, want 1", n)
			}
		})
	}
}

// refuseFirst is a listener that closes its first n connections at once:
// a host that refused a client once (a 503 while it warmed up, a
// handshake timeout) and answers afterwards.
type refuseFirst struct {
	net.Listener
	n atomic.Int32
}

func (l *refuseFirst) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.n.Add(-1) < 0 {
			return c, err
		}
		c.Close()
	}
}

// startReplayRefusingFirst is startReplay whose first n connections are
// refused.
func startReplayRefusingFirst(t *testing.T, opts ReplayOptions, n int32) *ReplayServer {
	t.Helper()
	return startReplayOn(t, opts, func(ln net.Listener) net.Listener {
		rl := &refuseFirst{Listener: ln}
		rl.n.Store(n)
		return rl
	})
}

// One refused dial used to move the client to the next URL for as long as
// that one delivered: with the default list, the frozen v1 host, without
// #sync and resuming by time only.
func TestClientSwitchesBackToAnEarlierURLThatAnswersAgain(t *testing.T) {
	first := startReplayRefusingFirst(t, ReplayOptions{File: capturePath("golden_v1.jsonl"), Rate: 200, Loop: true}, 1)
	second := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl"), Rate: 200, Loop: true})
	m := testMetrics(t)
	s := newSink()
	var mu sync.Mutex
	var from []string
	s.onBatch = func(_ context.Context, b Batch) error {
		mu.Lock()
		defer mu.Unlock()
		if len(from) == 0 || from[len(from)-1] != b.URL {
			from = append(from, b.URL)
		}
		return nil
	}
	runClient(t, ClientOptions{URLs: []string{first.URL(), second.URL()}, Metrics: m,
		FailbackInterval: 50 * time.Millisecond, StaleTimeout: testWait}, s.handle)
	s.waitFor(t, "batches from the second URL, then the first again", func([]Event, []*DecodeError) bool {
		mu.Lock()
		defer mu.Unlock()
		return len(from) >= 2 && from[0] == second.URL() && from[1] == first.URL()
	})
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonFailback)); v != 1 {
		t.Fatalf("reconnects_total{failback} = %v, want 1", v)
	}
}

// A probe of an earlier URL that accepts but sends nothing (a stuck host,
// as one v1 host has been seen) does not switch back to it.
func TestClientDoesNotSwitchBackToAnEarlierURLThatSendsNothing(t *testing.T) {
	silent := startSilent(t)
	second := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl"), Rate: 200, Loop: true})
	m := testMetrics(t)
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{silent.url(), second.URL()}, Metrics: m,
		FailbackInterval: 20 * time.Millisecond, StaleTimeout: 100 * time.Millisecond}, s.handle)
	// The first session on the silent URL goes stale; then the probes
	// (each waiting StaleTimeout for a frame) connect to it again.
	silent.waitConnections(t, 4)
	if v := metricValue(t, m.reconnects.WithLabelValues(ReasonFailback)); v != 0 {
		t.Fatalf("reconnects_total{failback} = %v, want 0: the earlier URL never sent a frame", v)
	}
	if n := s.waitEvents(t, 1); len(n) == 0 {
		t.Fatal("no event from the second URL")
	}
}

// A failback probe refused with Retry-After holds that URL's probes as
// long as asked: they came every FailbackInterval into the limit.
func TestFailbackProbesHonourTheProbedURLsRetryAfter(t *testing.T) {
	var hits atomic.Int32
	limited := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // the first dial: no hold, the backoff
			return
		}
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer limited.Close()
	second := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl"), Rate: 200, Loop: true})
	lines := make(chan map[string]any, 64)
	log := zerolog.New(writerFunc(func(p []byte) (int, error) {
		var line map[string]any
		if json.Unmarshal(p, &line) == nil && line["message"] == "jetstream failback probe: the earlier URL does not answer yet" {
			select {
			case lines <- line:
			default:
			}
		}
		return len(p), nil
	})).Level(zerolog.DebugLevel)
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{"ws" + strings.TrimPrefix(limited.URL, "http") + "/subscribe", second.URL()},
		FailbackInterval: 20 * time.Millisecond, StaleTimeout: testWait, Log: log,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, s.handle)
	s.waitEvents(t, 1)
	select {
	case line := <-lines:
		if ms, _ := line["retry_in_ms"].(float64); ms != float64(maxRefusalHold.Milliseconds()) {
			t.Fatalf("probe line %v, want retry_in_ms %d (Retry-After 3600 capped)", line, maxRefusalHold.Milliseconds())
		}
	case <-time.After(testWait):
		t.Fatal("no probe line")
	}
	// Many failback intervals later (20 ms each), the limited URL has
	// seen its first dial and the one probe it refused.
	n := len(s.waitEvents(t, 1))
	s.waitEvents(t, n+40)
	if n := hits.Load(); n != 2 {
		t.Fatalf("the rate-limited URL was asked %d times, want 2 (the dial, one probe)", n)
	}
}

// A token in a configured URL's query (jetstream.urls keeps it for a
// proxy) reached the connection_state label on /metrics and the log
// lines in clear.
func TestAURLsQueryValuesStayOutOfLogsAndMetrics(t *testing.T) {
	srv := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl")})
	m := testMetrics(t)
	var logs testsupport.LockedBuffer
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{srv.URL() + "?token=s3cr3t"}, Metrics: m, Log: zerolog.New(&logs)}, s.handle)
	s.waitEvents(t, 1)
	if strings.Contains(logs.String(), "s3cr3t") {
		t.Fatalf("the token was logged: %s", logs.String())
	}
	if v := metricValue(t, m.connState.WithLabelValues(srv.URL()+"?token=xxxxx", StateConnected)); v != 1 {
		t.Fatalf("connection_state for the redacted URL = %v, want 1", v)
	}
}

// Upstream says where the client is: the URL it reads, that URL's wire and
// state, when the last event came, and why the last connection before it
// ended (here the refused URL tried first).
func TestUpstreamSaysWhereTheClientIsAndWhyTheLastConnectionEnded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String() + "/subscribe"
	ln.Close() // nothing listens there now
	srv := startReplay(t, ReplayOptions{File: capturePath("golden_v1.jsonl")})
	s := newSink()
	c := runClient(t, ClientOptions{URLs: []string{dead, srv.URL()}}, s.handle)
	s.waitEvents(t, len(srv.events))
	var u Upstream
	testsupport.Eventually(t, "the client connected to the replay server", func() bool {
		u = c.Upstream()
		return u.State == StateConnected && u.URL == srv.URL()
	})
	if u.Wire != WireLegacy || u.LastEvent.IsZero() || time.Since(u.LastEvent) > time.Minute {
		t.Errorf("upstream %+v: want the legacy wire and a recent last event", u)
	}
	if !strings.Contains(u.LastError, "connection refused") {
		t.Errorf("upstream last error %q: want the refused dial's", u.LastError)
	}
}

// A run of failed connections (every host unreachable) is said at warn
// once; the retries after it, until a connection delivers, at debug.
func TestARunOfFailedConnectionsIsLoggedAtWarnOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "ws://" + ln.Addr().String() + "/subscribe"
	ln.Close() // nothing listens there now
	lines := connectionLostLines(t, ClientOptions{URLs: []string{dead}, MinBackoff: 5 * time.Millisecond, MaxBackoff: 10 * time.Millisecond})
	levels := []any{nextLine(t, lines)["level"], nextLine(t, lines)["level"], nextLine(t, lines)["level"]}
	if levels[0] != "warn" || levels[1] != "debug" || levels[2] != "debug" {
		t.Fatalf("levels of the first three connection lost lines %v; want warn, then debug", levels)
	}
}
