package workers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/outbound"
)

// The process's resolver trusts the PLC directory the operator named and
// guards did:web hosts, which network data names, unless
// network.allow_private.
func TestTheSharedResolverGuardsDidWebButNotThePLCDirectory(t *testing.T) {
	plc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"id":%q}`, strings.TrimPrefix(r.URL.Path, "/"))
	}))
	defer plc.Close()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"id":"did:web:%s"}`, strings.ReplaceAll(r.Host, ":", "%3A"))
	}))
	defer web.Close()
	webDID := "did:web:" + strings.ReplaceAll(strings.TrimPrefix(web.URL, "http://"), ":", "%3A")
	ctx := context.Background()

	cfg := config.Default()
	cfg.Identity.PLCURL = plc.URL
	r := Deps{Config: cfg}.Resolver()
	r.WebScheme = "http"
	if _, err := r.Resolve(ctx, "did:plc:alice"); err != nil {
		t.Fatalf("PLC directory on loopback: %v", err)
	}
	if _, err := r.Resolve(ctx, webDID); !errors.Is(err, outbound.ErrRefused) || !strings.Contains(err.Error(), "network.allow_private") {
		t.Fatalf("did:web on loopback: %v, want a refusal naming network.allow_private", err)
	}

	cfg.Network.AllowPrivate = true
	r = NewResolver(cfg)
	r.WebScheme = "http"
	if _, err := r.Resolve(ctx, webDID); err != nil {
		t.Fatalf("did:web on loopback with network.allow_private: %v", err)
	}
}
