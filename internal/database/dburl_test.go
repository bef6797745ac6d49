package database

import (
	"strings"
	"testing"
)

func TestParseFindsTheFilePathOfEveryFileURLForm(t *testing.T) {
	for raw, want := range map[string]string{
		"file:./data/appview.db":           "./data/appview.db",
		"file:data/appview.db":             "data/appview.db",
		"file:appview.db":                  "appview.db",
		"file:/tmp/x.db":                   "/tmp/x.db",
		"file:///tmp/x.db":                 "/tmp/x.db",
		"file://localhost/tmp/x.db":        "/tmp/x.db",
		"file://LOCALHOST/tmp/x.db":        "/tmp/x.db",
		"file:///tmp/my%20data/x.db":       "/tmp/my data/x.db",
		"file:my%20data/x.db":              "my data/x.db",
		"file:///tmp/100%25/x.db":          "/tmp/100%/x.db",
		"file://localhost/srv/a%23b/x.db":  "/srv/a#b/x.db",
		"file:../shared/appview.db":        "../shared/appview.db",
		"file:/var/lib/appview/appview.db": "/var/lib/appview/appview.db",
	} {
		loc, err := ParseURL(raw)
		if err != nil {
			t.Errorf("Parse(%q): %v", raw, err)
			continue
		}
		if loc.Path != want || loc.Remote() {
			t.Errorf("Parse(%q) = path %q remote %v, want the file %q", raw, loc.Path, loc.Remote(), want)
		}
	}
}

func TestParseKeepsServerURLsWhole(t *testing.T) {
	for _, raw := range []string{"http://127.0.0.1:8080", "https://db.example", "libsql://appview-org.turso.io", "http://[::1]:8080/"} {
		loc, err := ParseURL(raw)
		if err != nil {
			t.Errorf("Parse(%q): %v", raw, err)
			continue
		}
		if !loc.Remote() || loc.Server.String() != raw || loc.Path != "" {
			t.Errorf("Parse(%q) = %+v, want the server URL unchanged", raw, loc)
		}
	}
}

func TestParseRefusesWhatCannotBeOpenedOrShared(t *testing.T) {
	for raw, reason := range map[string]string{
		"":                            "must not be empty",
		":memory:":                    "in-memory database is private to each go-libsql connection",
		"file::memory:":               "in-memory database",
		"file::memory:?cache=shared":  "in-memory database",
		"file:shared?mode=memory":     "in-memory database",
		"file://db.example/x.db":      `host "db.example": a file database must be on this machine`,
		"file://data/appview.db":      `host "data"`,
		"file://localhost:8080/x.db":  `host "localhost:8080"`,
		"file://me@localhost/x.db":    "no user name",
		"file:x.db?_busy_timeout=500": "query parameters are not supported",
		"file:x.db?":                  "query parameters are not supported",
		"file:a#b.db":                 "write it as %23",
		"file:x.db#":                  "write it as %23",
		"file:":                       "needs a path",
		"file://localhost":            "needs a path",
		"file:bad%zzescape":           "bad escape",
		"ftp://db.example":            "scheme must be one of file, http, https, libsql",
		"./data/appview.db":           "scheme must be one of",
		"postgres://db/appview":       "scheme must be one of",
		"http://":                     "has no host",
		"libsql:appview":              "has no host",
		"http://:8080":                "has no host",
		"http://127.0.0.1:99999":      "port 99999 is not in 1..65535",
		"libsql://db.example:0":       "port 0 is not in 1..65535",
		"http://a b":                  "unparsable URL",
	} {
		_, err := ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), reason) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", raw, err, reason)
		}
		if err != nil && raw != "" && !strings.Contains(err.Error(), raw) {
			t.Errorf("Parse(%q): error %q does not quote the URL", raw, err)
		}
	}
}

// A server URL with credentials is refused, its password never quoted:
// the server takes its token from database.auth_token.
func TestAServerURLWithCredentialsIsRefusedWithoutItsPassword(t *testing.T) {
	for _, raw := range []string{"libsql://u:secret@db.example", "http://u:secret@127.0.0.1:8080", "https://u@db.example"} {
		_, err := ParseURL(raw)
		if err == nil || !strings.Contains(err.Error(), "carries credentials") {
			t.Errorf("Parse(%q) = %v, want a refusal of its credentials", raw, err)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("Parse(%q): the error %q shows the password", raw, err)
		}
	}
}

// Every refusal quotes the URL with its password masked, whatever it is
// refused for: no scheme, another scheme, a file URL with a user (found by
// a new-user pass: these echoed the password whole).
func TestEveryRefusalMasksThePassword(t *testing.T) {
	for _, raw := range []string{"//u:secret@h", "u:secret@h", "ftp://u:secret@h", "ws://u:secret@h/subscribe",
		"file://u:secret@h/x.db", "http://u:secret@/x", "libsql://u:sec ret@h"} {
		_, err := ParseURL(raw)
		if err == nil {
			t.Errorf("Parse(%q) accepted it", raw)
			continue
		}
		if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "sec ret") {
			t.Errorf("Parse(%q): the error %q shows the password", raw, err)
		}
	}
}
