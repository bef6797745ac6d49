package consumer

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/testsupport"
)

// frame is one websocket message a junk server sends.
type frame struct {
	binary bool
	data   []byte
}

// junkServer serves frames on every connection and then holds it open
// until the client goes.
func junkServer(t *testing.T, frames []frame) string {
	t.Helper()
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		for _, f := range frames {
			typ := websocket.TextMessage
			if f.binary {
				typ = websocket.BinaryMessage
			}
			if err := ws.WriteMessage(typ, f.data); err != nil {
				return
			}
		}
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http") + "/subscribe"
}

func TestUndecodableFramesAreLoggedByClassAtASampledRateAndTheStreamGoesOn(t *testing.T) {
	const maxBytes = 1024
	var frames []frame
	for range 30 { // more than a burst of one class
		frames = append(frames, frame{data: []byte(`{"did":`)})
	}
	frames = append(frames,
		frame{binary: true, data: []byte("not a zstd frame")},
		frame{data: []byte(`{"did":"did:plc:x","time_us":1750000000000500,"kind":"mystery"}`)},
		frame{data: []byte(`{"did":"did:plc:x","time_us":1,"kind":"identity","pad":"` + strings.Repeat("x", 2*maxBytes) + `"}`)},
		frame{data: []byte(`{"did":"did:plc:x","time_us":1750000000000900,"kind":"identity","identity":{"did":"did:plc:x","handle":"x.example","seq":1,"time":"2025-06-15T15:06:39Z"}}`)},
	)
	url := junkServer(t, frames)

	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	logs := &testsupport.LockedBuffer{}
	o := optionsFor(db, acquire(t, db, "me"), url)
	o.Jetstream.Compress, o.Jetstream.MaxMessageBytes = false, maxBytes
	o.Log = zerolog.New(logs)
	reg := prometheus.NewRegistry()
	jm, err := jetstream.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	o.ClientMetrics = jm
	pid := sys.Root.Spawn(NewProps(o))
	testsupport.Eventually(t, "the cursor to pass the junk to the good event", func() bool { return cursorAt(db) == 1750000000000900 })
	stop(t, sys, pid)

	perClass := map[string]int{}
	var invalid map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line["message"] != "undecodable Jetstream frame skipped" {
			continue
		}
		class, _ := line["class"].(string)
		perClass[class]++
		if size, _ := line["size"].(float64); size <= 0 || line["error"] == nil || line["url"] != url {
			t.Errorf("a logged failure lacks its size, error or url: %v", line)
		}
		if class == string(jetstream.ClassInvalidEvent) {
			invalid = line
		}
	}
	want := map[string]int{
		string(jetstream.ClassMalformedJSON): logBurst, // 30 sent: the rest are sampled away
		string(jetstream.ClassBadZstd):       1,
		string(jetstream.ClassInvalidEvent):  1,
		string(jetstream.ClassOversized):     1,
	}
	for class, n := range want {
		if perClass[class] != n {
			t.Errorf("%d %s lines logged, want %d (all: %v)\n%s", perClass[class], class, n, perClass, logs.String())
		}
	}
	if invalid == nil || invalid["time_us"] != float64(1750000000000500) {
		t.Errorf("the invalid event's line lacks its time_us: %v", invalid)
	}
	if got := counterValue(t, reg, "appview_jetstream_decode_errors_total", "class", string(jetstream.ClassMalformedJSON)); got != 30 {
		t.Errorf("decode_errors_total{malformed_json} = %v, want every one of the 30 counted", got)
	}
}

// A frame's content quoted in its decode error (here a 100 KB kind) is cut
// with a marker in the log line, which stays short.
func TestAnUndecodableFramesLogLineIsBounded(t *testing.T) {
	url := junkServer(t, []frame{
		{data: []byte(`{"did":"did:plc:x","time_us":1750000000000500,"kind":"` + strings.Repeat("k", 100_000) + `"}`)},
		{data: []byte(`{"did":"did:plc:x","time_us":1750000000000900,"kind":"identity","identity":{"did":"did:plc:x","seq":1,"time":"2025-06-15T15:06:39Z"}}`)},
	})
	db := testsupport.OpenDB(t)
	sys := testsupport.NewActorSystem(t)
	logs := &testsupport.LockedBuffer{}
	o := optionsFor(db, acquire(t, db, "me"), url)
	o.Jetstream.Compress = false
	o.Log = zerolog.New(logs)
	pid := sys.Root.Spawn(NewProps(o))
	testsupport.Eventually(t, "the cursor to pass the junk to the good event", func() bool { return cursorAt(db) == 1750000000000900 })
	stop(t, sys, pid)

	found := false
	for _, line := range strings.Split(logs.String(), "\n") {
		if !strings.Contains(line, "undecodable Jetstream frame skipped") {
			continue
		}
		found = true
		if len(line) > 4<<10 || !strings.Contains(line, "…[truncated ") {
			t.Errorf("a %d-byte frame line, want at most 4 KiB with a truncation marker: %.300s", len(line), line)
		}
	}
	if !found {
		t.Fatalf("the frame was not logged:\n%.2000s", logs.String())
	}
}
