package jetstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/rs/zerolog"
)

// numberedCapture writes expected_v1.jsonl with every line numbered as a
// Jetstream v2 server's legacy wire numbers it ("cursor", from 1) and
// returns its path and events.
func numberedCapture(t *testing.T) (string, []Event) {
	t.Helper()
	var out bytes.Buffer
	var evs []Event
	for i, line := range captureLines(t, "expected_v1.jsonl") {
		numbered := fmt.Appendf(nil, `{"cursor":%d,%s`, i+1, line[1:])
		ev, err := Decode(numbered)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
		out.Write(numbered)
		out.WriteByte('\n')
	}
	p := filepath.Join(t.TempDir(), "numbered.jsonl")
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p, evs
}

// v2URL is the v2 wire's URL on s.
func v2URL(s *ReplayServer) string { return "ws://" + s.Addr().String() + PathV2 }

// A numbered capture is served on the v2 wire to a real Client, compressed
// with the dictionary the server hands out: every event arrives as
// Decode reads its line (seq, time, commit, record, identity, account),
// and a seq cursor resumes after the cursor's own event.
func TestReplayServesANumberedCaptureOnTheV2WireCompressed(t *testing.T) {
	file, want := numberedCapture(t)
	s := startReplay(t, ReplayOptions{File: file})
	for _, tc := range []struct {
		name   string
		cursor int64
		from   int
	}{{"from the start", 0, 0}, {"by seq", 40, 40}} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var logs strings.Builder
			log := zerolog.New(writerFunc(func(p []byte) (int, error) {
				mu.Lock()
				defer mu.Unlock()
				return logs.Write(p)
			}))
			k := newSink()
			runClient(t, ClientOptions{URLs: []string{v2URL(s)}, Compress: true, Log: log,
				CursorFor: func(string) int64 { return tc.cursor }}, k.handle)
			got := k.waitEvents(t, len(want)-tc.from)
			if !reflect.DeepEqual(got, want[tc.from:]) {
				for i := range got {
					if !reflect.DeepEqual(got[i], want[tc.from+i]) {
						t.Fatalf("event %d on the v2 wire:\n%+v\nwant, as its line decodes:\n%+v", i, got[i], want[tc.from+i])
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if !strings.Contains(logs.String(), `"wire":"v2"`) || !strings.Contains(logs.String(), `"compress":true`) {
				t.Errorf("the client did not connect on the v2 wire compressed:\n%s", logs.String())
			}
		})
	}
}

// The v2 wire filters commits by collections (identity and account events
// pass), and refuses a capture without sequence numbers and a dictionary
// it does not have, each with an XRPC error.
func TestReplayV2FiltersByCollectionsAndRefusesWhatAV2ServerWould(t *testing.T) {
	file, all := numberedCapture(t)
	s := startReplay(t, ReplayOptions{File: file})
	ws, _, err := websocket.DefaultDialer.Dial(v2URL(s)+"?"+url.Values{"collections": {"app.bsky.feed.post", "app.bsky.graph.*"}}.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	var want []int64
	for _, ev := range all {
		if c := ev.Collection(); c == "" || c == "app.bsky.feed.post" || strings.HasPrefix(c, "app.bsky.graph.") {
			want = append(want, ev.Seq)
		}
	}
	if len(want) < 20 || len(want) == len(all) {
		t.Fatalf("the filter keeps %d of %d events: it tests nothing", len(want), len(all))
	}
	_, frames := readFrames(t, ws, len(want))
	for i, f := range frames {
		d, err := decodeV2(f)
		if err != nil || d.ev.Seq != want[i] {
			t.Fatalf("frame %d: seq %d, %v; want seq %d", i, d.ev.Seq, err, want[i])
		}
	}

	plain := startReplay(t, ReplayOptions{})
	for _, tc := range []struct {
		s     *ReplayServer
		query string
		name  string
	}{
		{plain, "", "InvalidRequest"},
		{s, "zstdDictionary=7", ErrNameUnknownZstdDictionary},
	} {
		_, resp, err := websocket.DefaultDialer.Dial(v2URL(tc.s)+"?"+tc.query, nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s?%s: %v %v; want 400", v2URL(tc.s), tc.query, err, resp)
		}
		var body struct{ Error string }
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Error != tc.name {
			t.Errorf("%s?%s: error %q, %v; want %s", v2URL(tc.s), tc.query, body.Error, err, tc.name)
		}
		resp.Body.Close()
	}
}
