package webhooks

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
)

func TestControlRefusesNonPublicDialAddressesUnlessAllowed(t *testing.T) {
	strict, lax := Guard{}, Guard{AllowPrivate: true}
	for _, addr := range []string{"127.0.0.1:80", "[::1]:443", "[::ffff:192.168.0.1]:8080", "169.254.169.254:80"} {
		err := strict.Control("tcp", addr, nil)
		var re *RefusedError
		if !errors.As(err, &re) || !errors.Is(err, ErrRefused) {
			t.Errorf("strict guard dialling %s: %v, want a *RefusedError", addr, err)
		}
		if err := lax.Control("tcp", addr, nil); err != nil {
			t.Errorf("allow_private guard dialling %s: %v", addr, err)
		}
	}
	if err := strict.Control("tcp", "93.184.216.34:443", nil); err != nil {
		t.Errorf("public address refused: %v", err)
	}
}

func TestCheckURLRefusesNonPublicTargetsWithAClearError(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{
		"http://127.0.0.1/hook",
		"http://localhost:8080/hook",
		"http://localhost./hook", // a trailing dot names the same host
		"https://10.0.0.7/",
		"http://169.254.169.254/latest/meta-data",
		"http://[::1]:9000/",
		"http://[::ffff:127.0.0.1]/",
		"http://[fd12::1]/",
		"http://0.0.0.0/",
	} {
		_, err := Guard{}.CheckURL(ctx, u)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "allow_private") {
			t.Errorf("CheckURL(%s) = %v, want a refusal naming webhooks.allow_private", u, err)
		}
		if _, err := (Guard{AllowPrivate: true}).CheckURL(ctx, u); err != nil {
			t.Errorf("CheckURL(%s) with allow_private: %v", u, err)
		}
	}
	for _, u := range []string{"ftp://example.com/", "/relative", "http:///nohost", "::"} {
		if _, err := (Guard{AllowPrivate: true}).CheckURL(ctx, u); err == nil || errors.Is(err, ErrRefused) {
			t.Errorf("CheckURL(%q) = %v, want a URL error", u, err)
		}
	}
	if _, err := (Guard{}).CheckURL(ctx, "https://93.184.216.34/hook"); err != nil {
		t.Errorf("public IP literal refused: %v", err)
	}
}

// An IPv4 address in a legacy numeric form (inet_aton's, which clients
// dial) is checked as the address it is, never sent to a resolver: a
// loopback or private one is refused as such, a public one accepted.
func TestCheckURLChecksLegacyIPv4FormsAsTheirAddress(t *testing.T) {
	ctx := context.Background()
	// A resolver that cannot answer: any lookup fails the test's cases.
	noDNS := &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no lookup expected")
	}}
	g := Guard{Resolver: noDNS}
	for _, u := range []string{
		"http://2130706433/h", "http://127.1/h", "http://0177.0.0.1/h", "http://0x7f.1/h", "http://0X7F.0.0.1./h",
		"http://10.1/h", "http://0xa9fea9fe/latest/meta-data", "http://0/h",
	} {
		_, err := g.CheckURL(ctx, u)
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "allow_private") {
			t.Errorf("CheckURL(%s) = %v, want a refusal naming webhooks.allow_private", u, err)
		}
	}
	for _, u := range []string{"http://16843009/h", "http://0x01.1.1.1/h", "http://1.1.257/h"} {
		if _, err := g.CheckURL(ctx, u); err != nil {
			t.Errorf("CheckURL(%s) = %v, want it accepted (a public address)", u, err)
		}
	}
}

// One receiver is one URL whatever its spelling: scheme and host case, a
// default port, an empty path and a fragment make no difference; the
// path's case, the query and another port do.
func TestSameURLComparesCanonicalForms(t *testing.T) {
	for _, c := range []struct {
		a, b string
		same bool
	}{
		{"http://127.0.0.1/h", "HTTP://127.0.0.1:80/h", true},
		{"https://Example.COM/h", "https://example.com:443/h", true},
		{"https://example.com", "https://example.com/", true},
		{"https://example.com/h#frag", "https://example.com/h", true},
		{"http://[::1]:80/h", "http://[::1]/h", true},
		{"https://example.com/H", "https://example.com/h", false},
		{"https://example.com/h?a=1", "https://example.com/h", false},
		{"https://example.com:8443/h", "https://example.com/h", false},
		{"http://example.com:443/h", "https://example.com/h", false},
		{"http://127.0.0.1:08080/hook", "http://127.0.0.1:8080/hook", true},
		{"http://127.0.0.1:8080/%68ook", "http://127.0.0.1:8080/hook", true},
		{"http://127.0.0.1:8080/./hook", "http://127.0.0.1:8080/hook", true},
		{"http://127.0.0.1:8080/x/../hook", "http://127.0.0.1:8080/hook", true},
		{"http://127.0.0.1:8080/hook?", "http://127.0.0.1:8080/hook", true},
		{"http://[0:0::1]:8080/h", "http://[::1]:8080/h", true},
		{"http://[0000::1]:8080/h", "http://[::1]:8080/h", true},
		{"http://localhost.:80/", "http://localhost/", true},
		{"http://h/a%2fb", "http://h/a%2Fb", true},
		{"http://h/a%2Fb", "http://h/a/b", false},
		{"http://h/a/", "http://h/a", false},
		{"http://h/a?x=%7e", "http://h/a?x=~", true},
	} {
		if got := SameURL(c.a, c.b); got != c.same {
			t.Errorf("SameURL(%q, %q) = %v, want %v", c.a, c.b, got, c.same)
		}
	}
}

// A refused webhook URL never echoes its password, whether or not it
// parses.
func TestARefusedWebhookURLDoesNotEchoItsPassword(t *testing.T) {
	for _, raw := range []string{"http://u:pa55 word@127.0.0.1/x", "ftp://u:pa55word@127.0.0.1/x", "http://u:pa55word@127.0.0.1:99999/x", "http://u:pa55word@127.0.0.1/x"} {
		_, err := Guard{AllowPrivate: true}.CheckURL(context.Background(), raw)
		if err == nil {
			t.Fatalf("%q accepted", raw)
		}
		if strings.Contains(err.Error(), "pa55") {
			t.Errorf("the refusal of a URL echoes its password: %v", err)
		}
	}
}
