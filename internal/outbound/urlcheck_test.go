package outbound

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for raw, want := range map[string]string{
		"https://h.example/x":         "",
		"HTTP://h.example:8080/x":     "", // url.Parse lowers the scheme
		"http://h.example:/x":         "", // an empty port is the scheme's
		"wss://h.example/subscribe":   "scheme must be one of http, https",
		"notaurl":                     `URL "notaurl": scheme must be one of http, https`,
		"http://:5001/x":              "has no host",
		"http:///x":                   `URL "http:///x" has no host`,
		"http://":                     `URL "http://" has no host`, // as typed, not as it reads back ("http:")
		"http://u:secret@:80/":        `URL "http://u:xxxxx@:80/" has no host`,
		"http://h.example:0/":         "port 0 is not in 1..65535",
		"http://h.example:65536/":     "port 65536 is not in 1..65535",
		"http://u:secret@h.example/":  "carries credentials (user:password@)",
		"http://u:sec ret@h.example/": "unparsable URL",
	} {
		_, err := CheckURL(raw, "http", "https")
		if want == "" {
			if err != nil {
				t.Errorf("Check(%q) = %v, want nil", raw, err)
			}
			continue
		}
		var e *URLError
		if !errors.As(err, &e) || !strings.Contains(e.Error(), want) {
			t.Errorf("Check(%q) = %v, want an *Error containing %q", raw, err, want)
			continue
		}
		if strings.Contains(e.Error(), "secret") || strings.Contains(e.Error(), "sec ret") {
			t.Errorf("Check(%q) echoes the password: %q", raw, e.Error())
		}
		if e.Credentials != strings.Contains(want, "credentials") {
			t.Errorf("Check(%q).Credentials = %v", raw, e.Credentials)
		}
	}
}

func TestCanonical(t *testing.T) {
	for raw, want := range map[string]string{
		"HTTPS://H.Example:443":             "https://h.example/",
		"http://h.example:0080/a/./b/../c":  "http://h.example/a/c",
		"wss://h.example:443/subscribe#x":   "wss://h.example/subscribe",
		"ws://h.example:80/subscribe?":      "ws://h.example/subscribe",
		"ws://h.example:8080/%7e%2f":        "ws://h.example:8080/~%2F",
		"http://[0:0::1]:80/x":              "http://[::1]/x",
		"https://localhost./hook?a=%2a&b=c": "https://localhost/hook?a=%2A&b=c",
		// An IPv4 address in inet_aton's legacy forms is the address
		// clients connect to: one webhook, not two.
		"https://16843009/x":            "https://1.1.1.1/x",
		"https://127.1/x":               "https://127.0.0.1/x",
		"https://10.1.258/x":            "https://10.1.1.2/x",
		"https://0x7f.0.0.1/x":          "https://127.0.0.1/x",
		"https://0X7F.0.0.1/x":          "https://127.0.0.1/x",
		"https://0x7f000001/x":          "https://127.0.0.1/x",
		"https://0177.0.0.1/x":          "https://127.0.0.1/x",
		"https://127.000.000.001:443/x": "https://127.0.0.1/x",
		"https://4294967295./x":         "https://255.255.255.255/x",
		"https://0/x":                   "https://0.0.0.0/x",
		"https://[::ffff:127.0.0.1]/x":  "https://127.0.0.1/x",
		"https://[::FFFF:7f00:1]:8443/": "https://127.0.0.1:8443/",
		// Not such a number: a host name, left as it is.
		"https://1.2.3.4.5/x":        "https://1.2.3.4.5/x",
		"https://999.1.1.1/x":        "https://999.1.1.1/x",
		"https://4294967296/x":       "https://4294967296/x",
		"https://1.2.65536/x":        "https://1.2.65536/x",
		"https://example.com/x":      "https://example.com/x",
		"https://0x/x":               "https://0x/x",
		"https://08.1.1.1/x":         "https://08.1.1.1/x",
		"https://1..1/x":             "https://1..1/x",
		"https://0x1_0.0.0.1/x":      "https://0x1_0.0.0.1/x",
		"https://1.2.3.0xg/x":        "https://1.2.3.0xg/x",
		"https://[::ffff:1:2]/x":     "https://0.1.0.2/x",
		"https://[::127.0.0.1]/x":    "https://[::7f00:1]/x", // IPv4-compatible, not mapped
		"https://[64:ff9b::1.2.3.4]": "https://[64:ff9b::102:304]/",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := CanonicalURL(u); got != want {
			t.Errorf("Canonical(%q) = %q, want %q", raw, got, want)
		}
	}
}
