package jetstream

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// identityEvent is one well-formed Jetstream v1 identity event.
const identityEvent = `{"did":"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa","time_us":1725911162329308,"kind":"identity","identity":{"did":"did:plc:aaaaaaaaaaaaaaaaaaaaaaaa","handle":"a.example","seq":1,"time":"2024-09-09T19:46:02.102Z"}}`

// wsServer serves each websocket connection with serve (the connection is
// closed when it returns) and returns the server's /subscribe URL; the
// server is closed at the end of the test.
func wsServer(t *testing.T, serve func(r *http.Request, ws *websocket.Conn)) string {
	t.Helper()
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		serve(r, ws)
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/subscribe"
}

// readUntilClosed reads (and drops) what the client sends until it goes.
func readUntilClosed(ws *websocket.Conn) {
	for {
		if _, _, err := ws.ReadMessage(); err != nil {
			return
		}
	}
}

// Jetstream refuses a subscription with more than 100 wantedCollections
// (HTTP 400 on the dial, and it ends a socket whose options_update
// carries them): a client that took them would dial into a 400 forever.
func TestClientRefusesMoreThan100Collections(t *testing.T) {
	var cols []string
	for i := range 101 {
		cols = append(cols, fmt.Sprintf("io.atcr.c%d", i))
	}
	noop := func(context.Context, Batch) error { return nil }
	if _, err := NewClient(ClientOptions{URLs: []string{"ws://127.0.0.1:1/subscribe"}, Collections: cols}, noop); err == nil {
		t.Error("NewClient accepted 101 wantedCollections")
	}
	if _, err := NewClient(ClientOptions{URLs: []string{"ws://127.0.0.1:1/subscribe"}, Collections: cols[:100]}, noop); err != nil {
		t.Errorf("NewClient refused 100 wantedCollections: %v", err)
	}
	c, err := NewClient(ClientOptions{URLs: []string{"ws://127.0.0.1:1/subscribe"}, Collections: []string{"io.atcr.*"}}, noop)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.UpdateOptions(cols); err == nil {
		t.Error("UpdateOptions accepted 101 wantedCollections (and would keep them for every later dial)")
	}
}

// requireHello=true makes Jetstream wait for an options_update before it
// sends anything: the client must send one even when its filter did not
// change while it was dialling.
func TestClientSaysHelloWhenTheURLRequiresIt(t *testing.T) {
	var hellos atomic.Int64
	url := wsServer(t, func(r *http.Request, ws *websocket.Conn) {
		if r.URL.Query().Get("requireHello") == "true" {
			for {
				typ, msg, err := ws.ReadMessage()
				if err != nil {
					return
				}
				var m subscriberMessage
				if typ == websocket.TextMessage && json.Unmarshal(msg, &m) == nil && m.Type == messageTypeOptionsUpdate {
					hellos.Add(1)
					break
				}
			}
		}
		_ = ws.WriteMessage(websocket.TextMessage, []byte(identityEvent))
		readUntilClosed(ws)
	})
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{url + "?requireHello=true"}, Collections: []string{"io.atcr.*"}}, s.handle)
	s.waitEvents(t, 1)
	if n := hellos.Load(); n != 1 {
		t.Fatalf("%d hellos, want 1", n)
	}
}

// A server that sends one frame and then closes every connection (on a
// resumed connection that frame is the cursor's own event, a duplicate)
// must not count as healthy enough to reset the backoff, or the client
// redials at MinBackoff forever.
func TestAServerThatClosesAfterOneFrameIsRedialledWithAGrowingBackoff(t *testing.T) {
	var mu sync.Mutex
	var dials []time.Time
	url := wsServer(t, func(_ *http.Request, ws *websocket.Conn) {
		mu.Lock()
		dials = append(dials, time.Now())
		mu.Unlock()
		_ = ws.WriteMessage(websocket.TextMessage, []byte(identityEvent))
		_ = ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseInternalServerErr, "boom"), time.Now().Add(time.Second))
	})
	const minBackoff = 50 * time.Millisecond
	runClient(t, ClientOptions{URLs: []string{url}, MinBackoff: minBackoff, MaxBackoff: 5 * time.Second}, newSink().handle)
	const want = 6
	deadline := time.Now().Add(testWait)
	for {
		mu.Lock()
		n := len(dials)
		mu.Unlock()
		if n >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d dials", n)
		}
		<-time.After(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	// Doubling from 50 ms with ±50% jitter, the wait before the 6th dial
	// is at least 800 ms × 0.5; a backoff reset every time keeps it under
	// 75 ms.
	if gap := dials[want-1].Sub(dials[want-2]); gap < 4*minBackoff {
		t.Fatalf("the 6th dial came %v after the 5th: the backoff does not grow (dials %v)", gap, dials)
	}
}

// A server that does not filter (or commits already in flight when an
// options_update narrowed the filter) must not hand the handler events
// of collections the client did not ask for; identity and account events
// pass every filter, as on Jetstream.
func TestCommitsOutsideWantedCollectionsAreSkippedAsUnwanted(t *testing.T) {
	lines, err := os.ReadFile(capturePath("golden_v1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	url := wsServer(t, func(_ *http.Request, ws *websocket.Conn) {
		// Everything, whatever wantedCollections said.
		for _, l := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
			_ = ws.WriteMessage(websocket.TextMessage, []byte(l))
		}
		readUntilClosed(ws)
	})
	s := newSink()
	runClient(t, ClientOptions{URLs: []string{url}, Collections: []string{"app.bsky.feed.*", "app.bsky.graph.follow"}}, s.handle)
	// golden_v1: like, post, repost, follow, profile, a hypercerts claim,
	// a place.stream origin, identity, account, block.
	s.waitFor(t, "10 frames", func(evs []Event, fails []*DecodeError) bool { return len(evs)+len(fails) >= 10 })
	s.mu.Lock()
	defer s.mu.Unlock()
	var got []string
	for _, e := range s.events {
		if e.Commit != nil {
			got = append(got, e.Commit.Collection)
		} else {
			got = append(got, e.Kind)
		}
	}
	want := []string{"app.bsky.feed.like", "app.bsky.feed.post", "app.bsky.feed.repost", "app.bsky.graph.follow", "identity", "account"}
	if !slices.Equal(got, want) {
		t.Errorf("delivered %v, want %v", got, want)
	}
	if len(s.failures) != 4 {
		t.Fatalf("%d failures, want the 4 unwanted commits", len(s.failures))
	}
	for _, f := range s.failures {
		if f.Class != ClassUnwantedCollection || f.TimeUS == 0 {
			t.Errorf("failure %v, want %s with its time_us", f, ClassUnwantedCollection)
		}
	}
}

// A server that drops the connection every few events (as Jetstream drops
// a slow subscriber) but brings new events each time is redialled at the
// minimum backoff: escalating it would leave the consumer ever further
// behind. (Doubling from 20 ms over the dozen or more connections this
// capture takes at 10 events each would add up to over a minute.)
func TestAServerThatDropsAfterNewEventsIsRedialledAtOnce(t *testing.T) {
	srv := startReplay(t, ReplayOptions{File: capturePath("expected_v1.jsonl"), DropAfter: 10})
	s := newSink()
	var newest atomic.Int64
	start := time.Now()
	runClient(t, ClientOptions{
		URLs:       []string{srv.URL()},
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 10 * time.Second,
		// Resume after the newest event seen (inclusive replay).
		Cursor: func() int64 { return newest.Load() + 1 },
	}, func(ctx context.Context, b Batch) error {
		for _, e := range b.Events {
			if e.TimeUS > newest.Load() {
				newest.Store(e.TimeUS)
			}
		}
		return s.handle(ctx, b)
	})
	s.waitFor(t, "the capture's newest event", func(evs []Event, _ []*DecodeError) bool {
		for _, e := range evs {
			if e.TimeUS == 1783175888403568 {
				return true
			}
		}
		return false
	})
	took := time.Since(start)
	t.Logf("%d connections in %v", srv.Connections(), took)
	if srv.Connections() < 10 {
		t.Fatalf("%d connections: the server did not drop as configured", srv.Connections())
	}
	if took > 5*time.Second {
		t.Fatalf("the capture took %v over %d connections: the backoff grew although each brought new events", took, srv.Connections())
	}
}
