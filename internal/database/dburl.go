package database

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
)

// URLSchemes are the URL schemes database.url accepts, in the order error
// messages list them.
var URLSchemes = []string{"file", "http", "https", "libsql"}

// Location is where a database URL points: exactly one of Path and Server
// is set.
type Location struct {
	// Path is the file path of an embedded database, percent-decoded; a
	// relative path is relative to the working directory. "" for a server.
	Path string
	// Server is the URL of a libSQL server (http, https or libsql scheme,
	// with a host). Nil for a file.
	Server *url.URL
}

// Remote reports whether the location is a libSQL server.
func (l Location) Remote() bool { return l.Server != nil }

// errMemory is the reason an in-memory database is refused (see doc.go).
var errMemory = errors.New("an in-memory database is private to each go-libsql connection and " +
	"invisible to other instances, so leases cannot work on it; use file:PATH")

// ParseURL checks raw against the forms in the package comment and returns
// where it points. Errors name the URL and say what is wrong with it.
func ParseURL(raw string) (Location, error) {
	if raw == "" {
		return Location{}, errors.New("must not be empty")
	}
	// Every message quotes the URL as typed with its password masked,
	// whatever the form: one without a scheme ("//u:pw@h") or with a
	// wrong one is refused too, and must not echo its secret.
	shown := logval.MaskURL(raw)
	if strings.HasPrefix(raw, ":memory:") {
		return Location{}, fmt.Errorf("URL %q: %w", shown, errMemory)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Location{}, fmt.Errorf("unparsable URL %q: %s", shown, logval.URLParseReason(err))
	}
	switch u.Scheme {
	case "file":
		p, err := filePath(u, raw)
		if err != nil {
			return Location{}, fmt.Errorf("file URL %q: %w", shown, err)
		}
		return Location{Path: p}, nil
	case "http", "https", "libsql":
		// A libSQL server authenticates with database.auth_token; a
		// password in the URL would be echoed by every message naming
		// the URL (each retry of an unavailable server, in the journal).
		if _, err := outbound.CheckURL(raw, u.Scheme); err != nil {
			var e *outbound.URLError
			if errors.As(err, &e) && e.Credentials {
				return Location{}, fmt.Errorf("%w; give the server's token in database.auth_token instead", err)
			}
			return Location{}, err // no host, or a port outside 1..65535
		}
		return Location{Server: u}, nil
	}
	return Location{}, fmt.Errorf("URL %q: scheme must be one of %s", shown, strings.Join(URLSchemes, ", "))
}

// filePath is the path of a file URL (RFC 8089, plus the opaque
// file:rel/path form SQLite and go-libsql take for relative paths).
func filePath(u *url.URL, raw string) (string, error) {
	if u.Query().Get("mode") == "memory" || u.Opaque == ":memory:" {
		return "", errMemory
	}
	switch {
	case u.RawQuery != "" || u.ForceQuery:
		return "", errors.New("query parameters are not supported (database.busy_timeout is its own key)")
	case strings.Contains(raw, "#"):
		return "", errors.New("'#' starts a URL fragment; write it as %23 in a path")
	case u.User != nil:
		return "", errors.New("a file URL takes no user name")
	case u.Host != "" && !strings.EqualFold(u.Host, "localhost"):
		return "", fmt.Errorf("host %q: a file database must be on this machine "+
			"(file:/abs/path, file:///abs/path, file://localhost/abs/path or file:rel/path)", u.Host)
	}
	p := u.Path
	if u.Opaque != "" {
		var err error
		if p, err = url.PathUnescape(u.Opaque); err != nil {
			return "", fmt.Errorf("bad escape in path: %v", err)
		}
	}
	if p == "" {
		return "", errors.New("needs a path (file:./data/appview.db or file:///abs/path)")
	}
	return p, nil
}
