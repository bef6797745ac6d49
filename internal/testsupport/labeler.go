package testsupport

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/gorilla/websocket"
)

// Labeler is a fake labeler service serving
// /xrpc/com.atproto.label.subscribeLabels. Every connection is handed to
// the test (Accept), which scripts the frames it sends.
type Labeler struct {
	srv   *httptest.Server
	conns chan *LabelerConn
	// quiet makes new connections ignore pings, to look stale.
	mu    sync.Mutex
	quiet bool
	all   []*LabelerConn
}

// LabelerConn is one subscriber connection as the fake labeler sees it.
type LabelerConn struct {
	// Cursor is the cursor query parameter of the request ("" if absent).
	Cursor string
	ws     *websocket.Conn
	closed chan struct{}
	wmu    sync.Mutex
}

// NewLabeler starts a fake labeler on loopback; it stops at test cleanup.
func NewLabeler(t testing.TB) *Labeler {
	l := &Labeler{conns: make(chan *LabelerConn, 16)}
	up := websocket.Upgrader{}
	mux := http.NewServeMux()
	mux.HandleFunc("/xrpc/com.atproto.label.subscribeLabels", func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		c := &LabelerConn{Cursor: r.URL.Query().Get("cursor"), ws: ws, closed: make(chan struct{})}
		l.mu.Lock()
		quiet := l.quiet
		l.all = append(l.all, c)
		l.mu.Unlock()
		if quiet {
			ws.SetPingHandler(func(string) error { return nil })
		}
		l.conns <- c
		// Reading answers pings (unless quiet) and notices the subscriber closing.
		for {
			if _, _, err := ws.ReadMessage(); err != nil {
				close(c.closed)
				_ = ws.Close()
				return
			}
		}
	})
	l.srv = httptest.NewServer(mux)
	t.Cleanup(func() {
		// Hijacked connections outlive Server.Close: end them so their
		// handler goroutines return.
		l.mu.Lock()
		all := l.all
		l.mu.Unlock()
		for _, c := range all {
			_ = c.ws.Close()
			<-c.closed
		}
		l.srv.Close()
	})
	return l
}

// URL is the labeler's base URL (http://127.0.0.1:PORT), as an operator
// would configure labeler.url.
func (l *Labeler) URL() string { return l.srv.URL }

// SetQuiet makes later connections ignore pings (no pong), so the
// subscriber sees a stale stream.
func (l *Labeler) SetQuiet(quiet bool) {
	l.mu.Lock()
	l.quiet = quiet
	l.mu.Unlock()
}

// Accept waits up to timeout for the next subscriber connection.
func (l *Labeler) Accept(t testing.TB, timeout time.Duration) *LabelerConn {
	t.Helper()
	select {
	case c := <-l.conns:
		return c
	case <-time.After(timeout):
		t.Fatalf("fake labeler: no connection within %s", timeout)
		return nil
	}
}

// Frame encodes an event-stream frame: header and body as two DAG-CBOR
// items back to back.
func Frame(t testing.TB, header, body any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := cbor.NewEncoder(&buf)
	if err := enc.Encode(header); err != nil {
		t.Fatalf("encode frame header: %v", err)
	}
	if err := enc.Encode(body); err != nil {
		t.Fatalf("encode frame body: %v", err)
	}
	return buf.Bytes()
}

// Label is a com.atproto.label.defs#label as a CBOR map; tests may leave
// out or mistype fields on purpose.
type Label map[string]any

// SendLabels sends a #labels frame.
func (c *LabelerConn) SendLabels(t testing.TB, seq int64, labels ...Label) {
	t.Helper()
	if labels == nil {
		labels = []Label{}
	}
	c.SendRaw(t, Frame(t, map[string]any{"op": 1, "t": "#labels"}, map[string]any{"seq": seq, "labels": labels}))
}

// SendInfo sends an #info frame.
func (c *LabelerConn) SendInfo(t testing.TB, name, message string) {
	t.Helper()
	c.SendRaw(t, Frame(t, map[string]any{"op": 1, "t": "#info"}, map[string]any{"name": name, "message": message}))
}

// SendError sends an error frame (op -1) and closes the connection, as a
// labeler does.
func (c *LabelerConn) SendError(t testing.TB, code, message string) {
	t.Helper()
	c.SendRaw(t, Frame(t, map[string]any{"op": -1}, map[string]any{"error": code, "message": message}))
	c.Close()
}

// SendRaw sends one binary message as is (e.g. a malformed frame).
func (c *LabelerConn) SendRaw(t testing.TB, data []byte) {
	t.Helper()
	c.send(t, websocket.BinaryMessage, data)
}

// SendText sends one text message (subscribeLabels only sends binary).
func (c *LabelerConn) SendText(t testing.TB, data string) {
	t.Helper()
	c.send(t, websocket.TextMessage, []byte(data))
}

func (c *LabelerConn) send(t testing.TB, mt int, data []byte) {
	t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := c.ws.WriteMessage(mt, data); err != nil {
		t.Fatalf("fake labeler: send: %v", err)
	}
}

// Close closes the connection from the labeler's side.
func (c *LabelerConn) Close() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.ws.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	_ = c.ws.Close()
}

// Closed is closed once the connection has ended (either side closed it).
func (c *LabelerConn) Closed() <-chan struct{} { return c.closed }
