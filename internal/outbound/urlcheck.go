// This file holds the rules every absolute URL appview takes from
// its operator shares: configuration keys (internal/config), webhook
// targets (internal/webhooks) and `appview healthcheck --url`. One place,
// so that the three refuse the same URLs with the same words.

package outbound

import (
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/atcr-io/appview/internal/logval"
)

// URLError is a URL Check refused. Its message is one line naming the URL
// with any password masked (logval.MaskURL, url.URL.Redacted): callers
// prefix the key or flag it came from.
type URLError struct {
	// Reason is the whole message, e.g. `URL "http://h:0": port 0 is not
	// in 1..65535`.
	Reason string
	// Credentials is set when the only fault is a user:password@ part:
	// callers say why their URL cannot carry one.
	Credentials bool
}

func (e *URLError) Error() string { return e.Reason }

// CheckURL parses raw as an absolute URL whose scheme is one of schemes
// (compared as url.Parse leaves them: in lower case), with a host name
// (RFC 3986 §3.2.2; "http://:5001" has none), a port, when one is given,
// in 1..65535 (url.Parse takes any digits; an empty port means the
// scheme's), and no userinfo (no URL appview takes is allowed one: a
// password there would be logged, stored or sent on). It returns the
// parsed URL, or an *Error.
func CheckURL(raw string, schemes ...string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, &URLError{Reason: fmt.Sprintf("unparsable URL %q: %s", logval.MaskURL(raw), logval.URLParseReason(err))}
	}
	// The URL as typed, its password masked: u.String() would drop what
	// parsing emptied ("http://" reads back as "http:").
	shown := logval.MaskURL(raw)
	found := false
	for _, s := range schemes {
		found = found || u.Scheme == s
	}
	if !found {
		return nil, &URLError{Reason: fmt.Sprintf("URL %q: scheme must be one of %s", shown, strings.Join(schemes, ", "))}
	}
	if u.Hostname() == "" {
		return nil, &URLError{Reason: fmt.Sprintf("URL %q has no host", shown)}
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, &URLError{Reason: fmt.Sprintf("URL %q: port %s is not in 1..65535", shown, p)}
		}
	}
	if u.User != nil {
		return nil, &URLError{Reason: fmt.Sprintf("URL %q carries credentials (user:password@)", shown), Credentials: true}
	}
	return u, nil
}

// defaultPorts are the ports a URL of each scheme means when it names
// none.
var defaultPorts = map[string]string{"http": "80", "ws": "80", "https": "443", "wss": "443"}

// CanonicalURL is u as a client requests it, normalised as RFC 3986 §6.2.2
// and §6.2.3 allow: scheme and host in lower case (a trailing dot of the
// host and the textual variants of an IP literal dropped; an IPv4 address
// in a legacy numeric form (legacyIPv4) or IPv4-mapped in an IPv6 literal
// written as its dotted quad, as clients connect to it), the port's
// leading zeros and the scheme's default port (http and ws 80, https and
// wss 443) left out, "/" for an empty path, percent-encodings in upper
// case and those of unreserved characters decoded, dot segments removed,
// an empty query dropped, and no fragment (a client never sends one).
// Two URLs with one canonical form name one endpoint: webhook targets are
// stored in it (internal/webhooks), and endpoint lists of the
// configuration compare in it (internal/config).
func CanonicalURL(u *url.URL) string {
	c := *u
	c.Scheme = strings.ToLower(c.Scheme)
	host, port := strings.TrimSuffix(strings.ToLower(c.Hostname()), "."), c.Port()
	if a, ok := LiteralAddr(host); ok {
		host = a.String()
	}
	if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n)
	}
	if port == defaultPorts[c.Scheme] {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	c.Host = host
	if port != "" {
		c.Host += ":" + port
	}
	if c.Opaque == "" {
		escaped := removeDotSegments(normalizePercent(c.EscapedPath()))
		if escaped == "" {
			escaped = "/"
		}
		if p, err := url.PathUnescape(escaped); err == nil {
			c.Path, c.RawPath = p, escaped
		}
	}
	c.RawQuery = normalizePercent(c.RawQuery)
	c.ForceQuery = false
	c.Fragment, c.RawFragment = "", ""
	return c.String()
}

// LiteralAddr is the IP address a URL's host (url.URL.Hostname) names
// without a lookup, as clients connect to it: an IP literal (an
// IPv4-mapped IPv6 one as its IPv4 address), or an IPv4 address in a
// legacy numeric form (legacyIPv4: "2130706433" and "127.1" are
// 127.0.0.1). A trailing dot and the case of hex digits make no
// difference. ok is false for a host name, which only a resolver can
// turn into addresses.
func LiteralAddr(host string) (a netip.Addr, ok bool) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap(), true
	}
	return legacyIPv4(host)
}

// legacyIPv4 parses host as inet_aton(3) does (and so the resolvers of
// most clients, and WHATWG URL hosts): one to four parts separated by
// dots, each decimal, hex after "0x" or octal after a leading "0"; the
// last part fills the bytes the others leave ("127.1" is 127.0.0.1,
// "16843009" is 1.1.1.1). ok is false for anything else ("1.2.3.4.5",
// "999.1.1.1", "0x", "08.1.1.1"), which is then a host name.
func legacyIPv4(host string) (a netip.Addr, ok bool) {
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var v uint64
	for i, p := range parts {
		base, digits := 10, p
		switch {
		case len(p) > 1 && (p[:2] == "0x" || p[:2] == "0X"):
			base, digits = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, digits = 8, p[1:]
		}
		n, err := strconv.ParseUint(digits, base, 32) // "" is an error
		if err != nil {
			return netip.Addr{}, false
		}
		last := i == len(parts)-1
		if !last && n > 255 || last && n >= 1<<(8*(4-i)) {
			return netip.Addr{}, false
		}
		if last {
			v |= n
		} else {
			v |= n << (8 * (3 - i))
		}
	}
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), true
}

// normalizePercent upper-cases the hex digits of s's percent-encodings and
// decodes those of unreserved characters (RFC 3986 §2.3, §6.2.2.2).
func normalizePercent(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			v, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			if ch := byte(v); ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || strings.IndexByte("-._~", ch) >= 0 {
				b.WriteByte(ch)
			} else {
				b.WriteString(strings.ToUpper(s[i : i+3]))
			}
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// removeDotSegments is RFC 3986 §5.2.4's, for an absolute path.
func removeDotSegments(p string) string {
	if !strings.Contains(p, ".") {
		return p
	}
	var out []string
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		last := i == len(segs)-1
		switch seg {
		case ".":
			if last {
				out = append(out, "")
			}
		case "..":
			if len(out) > 1 {
				out = out[:len(out)-1]
			}
			if last {
				out = append(out, "")
			}
		default:
			out = append(out, seg)
		}
	}
	return strings.Join(out, "/")
}
