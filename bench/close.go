package bench

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/jetstream"
)

// closeEvent is one well-formed Jetstream v1 commit event (text frame),
// enough to put the client's handler to work.
const closeEvent = `{"did":"did:plc:benchclose","time_us":1750000000000000,"kind":"commit",` +
	`"commit":{"rev":"3l","operation":"create","collection":"io.atcr.tag","rkey":"latest",` +
	`"record":{"$type":"io.atcr.tag","repository":"app","tag":"latest",` +
	`"manifestDigest":"sha256:0000000000000000000000000000000000000000000000000000000000000000",` +
	`"createdAt":"2025-06-15T00:00:00Z"},"cid":"bafy"}}`

// closeServer is a Jetstream endpoint that upgrades, sends first (if not
// empty) and then says nothing until the client goes: a server that went
// silent without closing, which is what Close must not wait on.
type closeServer struct {
	srv   *httptest.Server
	quit  chan struct{}
	wg    sync.WaitGroup
	conns chan struct{}
}

func startCloseServer(first string) *closeServer {
	s := &closeServer{quit: make(chan struct{}), conns: make(chan struct{}, 1024)}
	var upgrader websocket.Upgrader
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.wg.Add(1)
		defer s.wg.Done()
		ws, err := upgrader.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer ws.Close()
		if first != "" {
			if err := ws.WriteMessage(websocket.TextMessage, []byte(first)); err != nil {
				return
			}
		}
		s.conns <- struct{}{}
		// Read (and drop) until the client closes, so its close is seen.
		go func() {
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
			}
		}()
		<-s.quit
	}))
	return s
}

func (s *closeServer) url() string {
	return "ws" + strings.TrimPrefix(s.srv.URL, "http") + "/subscribe"
}

func (s *closeServer) stop() {
	close(s.quit)
	s.srv.Close()
	s.wg.Wait()
}

// closeLatency measures jetstream.Client.Close, one client at a time:
// "silent" against a connected server that sends nothing, "blocked" while
// the handler is busy with a batch (it returns only when its context
// ends). The brief's promise is 100 ms.
func (r *runner) closeLatency(ctx context.Context) error {
	n := r.n.close
	for _, c := range []struct {
		name  string
		first string
	}{{"silent", ""}, {"blocked", closeEvent}} {
		samples, err := measureClose(ctx, n, c.first)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		r.figure("jetstream_close_p50_ms_"+c.name, ms(percentile(samples, 50)), "ms")
		r.figure("jetstream_close_p99_ms_"+c.name, ms(percentile(samples, 99)), "ms")
	}
	return nil
}

// measureClose runs rounds clients against a closeServer that sends first,
// and returns how long each Close took once the client was connected (and,
// with an event to send, once its handler had the batch).
func measureClose(ctx context.Context, rounds int, first string) ([]time.Duration, error) {
	srv := startCloseServer(first)
	defer srv.stop()
	samples := make([]time.Duration, 0, rounds)
	for range rounds {
		entered := make(chan struct{}, 1)
		handler := func(ctx context.Context, b jetstream.Batch) error {
			select {
			case entered <- struct{}{}:
			default:
			}
			<-ctx.Done()
			return ctx.Err()
		}
		c, err := jetstream.NewClient(jetstream.ClientOptions{URLs: []string{srv.url()}}, handler)
		if err != nil {
			return nil, err
		}
		ran := make(chan error, 1)
		go func() { ran <- c.Run(context.Background()) }()
		ready := srv.conns
		if first != "" {
			ready = entered
		}
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			c.Close()
			return nil, errors.New("the client never got going")
		case <-ctx.Done():
			c.Close()
			return nil, ctx.Err()
		}
		start := time.Now()
		c.Close()
		samples = append(samples, time.Since(start))
		if err := <-ran; err != nil {
			return nil, fmt.Errorf("Run: %w", err)
		}
		if first != "" {
			<-srv.conns // the connection's own token
		}
	}
	return samples, nil
}
