package outbound_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/atcr-io/appview/internal/outbound"
)

// A server that takes the connection and never answers the upgrade held
// gorilla's DialContext until HandshakeTimeout, whatever the context.
func TestACancelledContextEndsADialWaitingForTheUpgrade(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c // read nothing, answer nothing
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := outbound.DialWebsocket(ctx, &websocket.Dialer{HandshakeTimeout: time.Hour}, "ws://"+ln.Addr().String()+"/", nil)
		done <- err
	}()
	c := <-accepted
	defer c.Close()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Dial = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Dial did not return after its context was cancelled")
	}
}
