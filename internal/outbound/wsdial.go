// This file opens websocket connections that a cancelled context
// really interrupts. gorilla/websocket (v1.5) honours the context while it
// connects, but not while it waits for the server's answer to the upgrade:
// that wait ends only at the dialer's HandshakeTimeout. A server that
// accepts the TCP connection and never answers (a frozen Jetstream, a
// labeler behind a stuck proxy) then held a stop for up to that timeout,
// past a short shutdown_timeout.

package outbound

import (
	"context"
	"net"
	"net/http"
	"sync"

	"github.com/gorilla/websocket"
)

// DialWebsocket is d.DialContext(ctx, target, header), except that when ctx ends
// before the upgrade is answered the connection is closed, so the call
// returns at once with an error. The returned connection, once the
// upgrade succeeded, is no longer tied to ctx. d is not modified.
func DialWebsocket(ctx context.Context, d *websocket.Dialer, target string, header http.Header) (*websocket.Conn, *http.Response, error) {
	dd := *d
	dial := d.NetDialContext
	if dial == nil {
		var nd net.Dialer
		dial = nd.DialContext
	}
	var (
		mu    sync.Mutex
		stops []func() bool
	)
	dd.NetDialContext = func(dctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(dctx, network, addr)
		if err != nil {
			return nil, err
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		mu.Lock()
		stops = append(stops, stop)
		mu.Unlock()
		return c, nil
	}
	conn, resp, err := dd.DialContext(ctx, target, header)
	mu.Lock()
	for _, stop := range stops {
		stop()
	}
	mu.Unlock()
	if err != nil && ctx.Err() != nil {
		err = context.Cause(ctx)
	}
	return conn, resp, err
}
