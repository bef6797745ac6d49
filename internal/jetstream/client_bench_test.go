package jetstream

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gorilla/websocket"
)

// BenchmarkClient measures the client alone on loopback: a server cycling
// through the captured frames (precomputed, so the server costs next to
// nothing) and a handler that only counts. One op is one event delivered;
// the path is read, decode, batch, deliver.
func BenchmarkClient(b *testing.B) {
	lines := captureLines(b, "expected_v1.jsonl")
	for _, compress := range []bool{false, true} {
		b.Run(fmt.Sprintf("compress=%v", compress), func(b *testing.B) {
			typ, frames := websocket.TextMessage, lines
			if compress {
				typ, frames = websocket.BinaryMessage, make([][]byte, len(lines))
				for i, l := range lines {
					frames[i] = Compress(nil, l)
				}
			}
			var upgrader websocket.Upgrader
			var wg sync.WaitGroup
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				wg.Add(1)
				defer wg.Done()
				ws, err := upgrader.Upgrade(w, r, nil)
				if err != nil {
					return
				}
				defer ws.Close()
				for i := 0; ; i++ {
					if ws.WriteMessage(typ, frames[i%len(frames)]) != nil {
						return
					}
				}
			}))
			defer func() { srv.Close(); wg.Wait() }()

			done := make(chan struct{})
			var once sync.Once
			n := 0
			h := func(_ context.Context, batch Batch) error {
				n += len(batch.Events)
				if n >= b.N {
					once.Do(func() { close(done) })
				}
				return nil
			}
			c, err := NewClient(ClientOptions{URLs: []string{"ws" + strings.TrimPrefix(srv.URL, "http")}}, h)
			if err != nil {
				b.Fatal(err)
			}
			ran := make(chan error, 1)
			b.ReportAllocs()
			b.ResetTimer()
			go func() { ran <- c.Run(context.Background()) }()
			<-done
			b.StopTimer()
			c.Close()
			if err := <-ran; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}
