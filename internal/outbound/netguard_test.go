package outbound

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestClassNamesEveryNonRoutableForm(t *testing.T) {
	cases := map[string]string{
		"8.8.8.8":              "",
		"1.1.1.1":              "",
		"2606:4700:4700::1111": "",
		"127.0.0.1":            "loopback",
		"127.9.9.9":            "loopback",
		"::1":                  "loopback",
		"::ffff:127.0.0.1":     "loopback",
		"10.1.2.3":             "private",
		"172.16.0.1":           "private",
		"192.168.1.1":          "private",
		"fd00::1":              "private",
		"::ffff:10.0.0.1":      "private",
		"169.254.169.254":      "link-local",
		"fe80::1%eth0":         "link-local",
		"0.0.0.0":              "unspecified",
		"::":                   "unspecified",
		"224.0.0.1":            "multicast",
		"ff02::1":              "multicast",
		"0.1.2.3":              "this-network",
		"100.64.0.1":           "shared (carrier-grade NAT)",
		"255.255.255.255":      "reserved",
		"fec0::1":              "site-local",
		"64:ff9b::7f00:1":      "loopback (embedded IPv4)",
		"64:ff9b::808:808":     "",
		"::7f00:1":             "loopback (embedded IPv4)",
		"2002:c0a8:101::1":     "private (embedded IPv4)",
		"2002:808:808::1":      "",
		// Teredo stores the client address inverted: ^127.0.0.1.
		"2001:0:4136:e378:8000:63bf:80ff:fffe": "loopback (embedded IPv4)",
	}
	for in, want := range cases {
		if got := Class(netip.MustParseAddr(in)); got != want {
			t.Errorf("Class(%s) = %q, want %q", in, got, want)
		}
	}
}

func TestRefusalNamesTheAddressClassWithTheRightArticle(t *testing.T) {
	for addr, want := range map[string]string{
		"0.0.0.0":     "0.0.0.0 is an unspecified address",
		"192.0.0.8":   "192.0.0.8 is an IETF protocol assignment address",
		"127.0.0.1":   "127.0.0.1 is a loopback address",
		"10.0.0.1":    "10.0.0.1 is a private address",
		"100.64.0.1":  "100.64.0.1 is a shared (carrier-grade NAT) address",
		"192.0.2.1":   "192.0.2.1 is a documentation address",
		"224.0.0.251": "224.0.0.251 is a multicast address",
		// An IPv4-mapped IPv6 address (what localhost may resolve to) is
		// named as the IPv4 address it is.
		"::ffff:127.0.0.1": "hooks.example: 127.0.0.1 is a loopback address",
	} {
		a := netip.MustParseAddr(addr)
		err := (&RefusedError{Target: "hooks.example", Addr: a, AddrClass: Class(a)}).Error()
		if !strings.Contains(err, want) {
			t.Errorf("refusal of %s = %q, want it to say %q", addr, err, want)
		}
	}
}

func TestControlRefusesNonPublicDialAddressesUnlessAllowed(t *testing.T) {
	strict, lax := Guard{Purpose: "hold health check"}, Guard{AllowPrivate: true}
	for _, addr := range []string{"127.0.0.1:80", "[::1]:443", "[::ffff:192.168.0.1]:8080", "169.254.169.254:80",
		"[64:ff9b::a9fe:a9fe]:80", "[2002:a9fe:a9fe::1]:80"} {
		err := strict.Control("tcp", addr, nil)
		var re *RefusedError
		if !errors.As(err, &re) || !errors.Is(err, ErrRefused) ||
			!strings.Contains(err.Error(), "refused hold health check target") || !strings.Contains(err.Error(), DefaultKey) {
			t.Errorf("strict guard dialling %s: %v, want a *RefusedError naming the purpose and %s", addr, err, DefaultKey)
		}
		if err := lax.Control("tcp", addr, nil); err != nil {
			t.Errorf("allow_private guard dialling %s: %v", addr, err)
		}
	}
	if err := strict.Control("tcp", "93.184.216.34:443", nil); err != nil {
		t.Errorf("public address refused: %v", err)
	}
}

// The client refuses a loopback server at dial time, before any byte is
// sent; it reaches the same server when the operator allows private
// addresses or configured that host.
func TestClientRefusesAtDialTimeUnlessAllowedOrTrusted(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	get := func(g Guard, url string) error {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
		resp, err := g.Client(0).Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return err
	}
	if err := get(Guard{}, srv.URL); !errors.Is(err, ErrRefused) {
		t.Fatalf("strict guard: %v, want ErrRefused", err)
	}
	if hits.Load() != 0 {
		t.Fatalf("the refused server was reached %d times", hits.Load())
	}
	if err := get(Guard{AllowPrivate: true}, srv.URL); err != nil {
		t.Fatalf("allow_private: %v", err)
	}
	if err := get(Guard{}.TrustURLs(srv.URL), srv.URL); err != nil {
		t.Fatalf("a trusted (operator-configured) host: %v", err)
	}
	// Trust is by name: the same address under another name is checked.
	other := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)
	if err := get(Guard{}.TrustURLs(srv.URL), other); !errors.Is(err, ErrRefused) {
		t.Fatalf("%s (an untrusted name for a trusted address): %v, want ErrRefused", other, err)
	}
	// A redirect from a trusted host to a private one is dialled afresh,
	// even by a client that follows cross-host redirects (Client's own
	// rule, SameHostRedirect, does not follow it at all).
	redirect := httptest.NewServer(http.RedirectHandler("http://localhost:1/x", http.StatusFound))
	defer redirect.Close()
	follows := Guard{}.TrustURLs(redirect.URL).Client(0)
	follows.CheckRedirect = nil
	if _, err := follows.Get(redirect.URL); !errors.Is(err, ErrRefused) {
		t.Fatalf("redirect to a private address: %v, want ErrRefused", err)
	}
	if hits.Load() != 2 {
		t.Fatalf("server reached %d times, want 2", hits.Load())
	}
}

func TestTrustURLsUsesTheSchemesDefaultPort(t *testing.T) {
	g := Guard{}.TrustURLs("https://Relay.Example/", "http://plc.example:2582", "wss://jet.example/subscribe", "", "::")
	for addr, want := range map[string]bool{
		"relay.example:443": true, "RELAY.example:443": true, "relay.example:80": false,
		"plc.example:2582": true, "plc.example:80": false, "jet.example:443": true, "other.example:443": false,
	} {
		if got := g.trusts(addr); got != want {
			t.Errorf("trusts(%s) = %v, want %v", addr, got, want)
		}
	}
}

// Outbound clients followed any redirect (net/http's default: 10, to any
// host, a POST turned into a bodyless GET on 302). Only a same-host
// redirect that keeps the method is followed now; any other one leaves
// the caller with the 3xx itself.
func TestClientFollowsOnlySameHostRedirectsThatKeepTheMethod(t *testing.T) {
	var otherHits atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		otherHits.Add(1)
		_, _ = io.WriteString(w, "other")
	}))
	t.Cleanup(other.Close)
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, r.Method+" ok") })
	mux.HandleFunc("/same", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/cross", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, other.URL+"/", http.StatusFound) })
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c := Guard{AllowPrivate: true}.Client(5 * time.Second)
	t.Cleanup(c.CloseIdleConnections)

	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader("{}"))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := do(http.MethodGet, "/same"); code != http.StatusOK || body != "GET ok" {
		t.Errorf("same-host GET redirect: %d %q, want it followed", code, body)
	}
	if code, _ := do(http.MethodGet, "/cross"); code != http.StatusFound || otherHits.Load() != 0 {
		t.Errorf("cross-host redirect: %d, %d requests to the other host; want the 302 and none", code, otherHits.Load())
	}
	if code, _ := do(http.MethodPost, "/same"); code != http.StatusFound {
		t.Errorf("POST answered 302: %d, want the 302 (following it would send a bodyless GET)", code)
	}
	if code, _ := do(http.MethodGet, "/loop"); code != http.StatusFound {
		t.Errorf("redirect loop: %d, want the 302 after %d redirects", code, MaxRedirects)
	}

	plain := &http.Client{CheckRedirect: NoRedirect}
	resp, err := plain.Get(srv.URL + "/same")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound {
		t.Errorf("NoRedirect: %d, want the 302", resp.StatusCode)
	}
}
