package webhooks

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestNonPublicClassifiesEveryNonRoutableForm(t *testing.T) {
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
		if got := nonPublic(netip.MustParseAddr(in)); got != want {
			t.Errorf("nonPublic(%s) = %q, want %q", in, got, want)
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
	} {
		a := netip.MustParseAddr(addr)
		err := (&RefusedError{Target: "hooks.example", Addr: a, Class: nonPublic(a)}).Error()
		if !strings.Contains(err, want) {
			t.Errorf("refusal of %s = %q, want it to say %q", addr, err, want)
		}
	}
}

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
