// Package urlcheck holds the rules every absolute URL appview takes from
// its operator shares: configuration keys (internal/config), webhook
// targets (internal/webhooks) and `appview healthcheck --url`. One place,
// so that the three refuse the same URLs with the same words.
package urlcheck

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/atcr-io/appview/internal/logval"
)

// Error is a URL Check refused. Its message is one line naming the URL
// with any password masked (logval.MaskURL, url.URL.Redacted): callers
// prefix the key or flag it came from.
type Error struct {
	// Reason is the whole message, e.g. `URL "http://h:0": port 0 is not
	// in 1..65535`.
	Reason string
	// Credentials is set when the only fault is a user:password@ part:
	// callers say why their URL cannot carry one.
	Credentials bool
}

func (e *Error) Error() string { return e.Reason }

// Check parses raw as an absolute URL whose scheme is one of schemes
// (compared as url.Parse leaves them: in lower case), with a host name
// (RFC 3986 §3.2.2; "http://:5001" has none), a port, when one is given,
// in 1..65535 (url.Parse takes any digits; an empty port means the
// scheme's), and no userinfo (no URL appview takes is allowed one: a
// password there would be logged, stored or sent on). It returns the
// parsed URL, or an *Error.
func Check(raw string, schemes ...string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &Error{Reason: fmt.Sprintf("unparsable URL %q: %s", logval.MaskURL(raw), logval.URLParseReason(err))}
	}
	shown := u.Redacted()
	found := false
	for _, s := range schemes {
		found = found || u.Scheme == s
	}
	if !found {
		return nil, &Error{Reason: fmt.Sprintf("URL %q: scheme must be one of %s", shown, strings.Join(schemes, ", "))}
	}
	if u.Hostname() == "" {
		return nil, &Error{Reason: fmt.Sprintf("URL %q has no host", shown)}
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, &Error{Reason: fmt.Sprintf("URL %q: port %s is not in 1..65535", shown, p)}
		}
	}
	if u.User != nil {
		return nil, &Error{Reason: fmt.Sprintf("URL %q carries credentials (user:password@)", shown), Credentials: true}
	}
	return u, nil
}
