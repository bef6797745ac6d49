package identity

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/atcr-io/appview/internal/outbound"
)

// A did:web names its host, and anyone can publish one: the resolver's
// default client refuses loopback and the cloud metadata address at dial
// time, while the PLC directory the operator configured (here on
// loopback) is still reached.
func TestDefaultClientRefusesDidWebOnNonPublicAddresses(t *testing.T) {
	var plcHits, webHits atomic.Int32
	plc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plcHits.Add(1)
		fmt.Fprintf(w, `{"id":%q}`, strings.TrimPrefix(r.URL.Path, "/"))
	}))
	defer plc.Close()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { webHits.Add(1) }))
	defer web.Close()

	r := &Resolver{PLCURL: plc.URL, WebScheme: "http"}
	ctx := context.Background()
	if _, err := r.Resolve(ctx, "did:plc:alice"); err != nil {
		t.Fatalf("the configured PLC directory on loopback: %v", err)
	}
	loopback := "did:web:" + strings.ReplaceAll(strings.TrimPrefix(web.URL, "http://"), ":", "%3A")
	for _, did := range []string{loopback, "did:web:169.254.169.254", "did:web:localhost"} {
		if _, err := r.Resolve(ctx, did); !errors.Is(err, outbound.ErrRefused) {
			t.Errorf("Resolve(%s) = %v, want a refusal", did, err)
		}
	}
	if webHits.Load() != 0 || plcHits.Load() != 1 {
		t.Errorf("did:web host reached %d times, PLC %d times; want 0 and 1", webHits.Load(), plcHits.Load())
	}
}
