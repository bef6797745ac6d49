package consumer

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/outbound"
)

// A #sync re-read fetches from the PDS a DID document names, so its dial
// is checked like every other request to a host network data names: the
// re-read client was a plain http.Client, and a DID document naming a
// loopback or link-local PDS had the consumer fetch from it.
func TestTheReReadClientRefusesPrivateAddressesUnlessAllowed(t *testing.T) {
	pds := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://other.invalid/", http.StatusFound)
	}))
	t.Cleanup(pds.Close)
	cfg := config.Default()
	if _, err := resyncHTTP(cfg).Get(pds.URL); !errors.Is(err, outbound.ErrRefused) {
		t.Fatalf("a re-read of a loopback PDS: %v, want it refused", err)
	}
	cfg.Network.AllowPrivate = true
	resp, err := resyncHTTP(cfg).Get(pds.URL)
	if err != nil {
		t.Fatalf("with network.allow_private: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Errorf("a redirect to another host was followed (status %d), want the 302 itself", resp.StatusCode)
	}
}
