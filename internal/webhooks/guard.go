package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/netguard"
	"github.com/atcr-io/appview/internal/urlcheck"
)

// ErrRefused is wrapped by every *RefusedError, for errors.Is (the
// shared outbound guard's, netguard.ErrRefused).
var ErrRefused = netguard.ErrRefused

// RefusedError says the guard would not let a request reach an address.
type RefusedError = netguard.RefusedError

// Guard decides which addresses webhook requests may reach: the shared
// outbound guard (internal/netguard) with webhooks' own key. The zero
// value refuses every non-public address and resolves names with
// net.DefaultResolver.
type Guard struct {
	// AllowPrivate permits every address (webhooks.allow_private, or
	// network.allow_private, which permits it for every outbound request).
	AllowPrivate bool
	// Resolver resolves host names in CheckURL; nil means net.DefaultResolver.
	Resolver *net.Resolver
	// Key is what a refusal tells the operator to set to permit the
	// address; "" means the key webhooks.allow_private (the CLI names its
	// flag, --allow-private).
	Key string
}

// maxRedirects is how many same-host redirects one attempt follows.
const maxRedirects = 3

// outbound is the shared guard with the key and purpose webhook refusals
// name.
func (g Guard) outbound() netguard.Guard {
	key := g.Key
	if key == "" {
		key = "webhooks.allow_private"
	}
	return netguard.Guard{AllowPrivate: g.AllowPrivate, Key: key, Purpose: "webhook"}
}

// MaxURLBytes bounds a webhook URL when it is added (CheckURL): 2,048
// bytes, the length browsers, proxies and most HTTP servers are known to
// accept in a request line. A longer URL is a mistake (a pasted document,
// a runaway template), and it would be stored, listed and logged with
// every delivery.
const MaxURLBytes = 2048

// CheckURL validates a webhook URL when it is added: at most MaxURLBytes,
// http or https, a host, no credentials (user:password@: they would be stored and listed in the
// clear; the signing secret is what authenticates a delivery), and (unless
// AllowPrivate) every address the host resolves to public. The error is a
// *RefusedError for a non-public address, or says what is wrong with the
// URL and wraps ErrInvalid (also for a host that does not exist). Passing
// this check says nothing about later requests: DNS can change, which is
// why Control repeats it at dial time.
func (g Guard) CheckURL(ctx context.Context, raw string) (*url.URL, error) {
	if len(raw) > MaxURLBytes {
		// Quote only its start (its password masked): the refusal is one
		// readable line.
		shown := logval.MaskURL(raw)
		return nil, invalid("webhook URL %q... is %d bytes: at most %d are accepted", shown[:min(48, len(shown))], len(raw), MaxURLBytes)
	}
	u, err := parseTarget(raw)
	if err != nil {
		return nil, &invalidError{err: err}
	}
	if g.AllowPrivate {
		return u, nil
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if err := g.outbound().Check(host, a); err != nil {
			return nil, err
		}
		return u, nil
	}
	r := g.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	addrs, err := r.LookupNetIP(ctx, "ip", host)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		return nil, invalid("webhook URL %q: resolve %s: %w", logval.MaskURL(raw), host, err)
	}
	if err != nil {
		return nil, fmt.Errorf("webhook URL %q: resolve %s: %w", logval.MaskURL(raw), host, err)
	}
	for _, a := range addrs {
		if err := g.outbound().Check(host, a); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// parseTarget accepts absolute http and https URLs with a host, a port in
// 1..65535 and no credentials (urlcheck.Check): a delivery anywhere else
// could only fail at every attempt, and a password would be stored and
// logged with the target.
func parseTarget(raw string) (*url.URL, error) {
	u, err := urlcheck.Check(raw, "http", "https")
	var e *urlcheck.Error
	if errors.As(err, &e) && e.Credentials {
		return nil, fmt.Errorf("webhook %s; use the signing secret", e.Reason)
	}
	if err != nil {
		return nil, fmt.Errorf("webhook %w", err)
	}
	return u, nil
}

// canonicalURL is u as a delivery requests it, normalised as RFC 3986 §6.2.2
// and §6.2.3 allow: scheme and host in lower case (a trailing dot of the
// host and the textual variants of an IP literal dropped), the port's
// leading zeros and the scheme's default port (80, 443) left out, "/" for
// an empty path, percent-encodings in upper case and those of unreserved
// characters decoded, dot segments removed, an empty query dropped, and
// no fragment (an HTTP client never sends one). Two webhook URLs with one
// canonical form are one receiver.
func canonicalURL(u *url.URL) string {
	c := *u
	c.Scheme = strings.ToLower(c.Scheme)
	host, port := strings.TrimSuffix(strings.ToLower(c.Hostname()), "."), c.Port()
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.String()
	}
	if n, err := strconv.Atoi(port); err == nil {
		port = strconv.Itoa(n)
	}
	if (c.Scheme == "http" && port == "80") || (c.Scheme == "https" && port == "443") {
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

// SameURL reports whether webhook URLs a and b name one receiver: equal
// canonical forms (scheme and host case, a default port, an empty path,
// a fragment make no difference), or equal strings when either does not
// parse.
func SameURL(a, b string) bool {
	ua, errA := url.Parse(a)
	ub, errB := url.Parse(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return canonicalURL(ua) == canonicalURL(ub)
}

// Control is a net.Dialer Control function that refuses a non-public
// dial address unless AllowPrivate (netguard.Guard.Control).
func (g Guard) Control(network, address string, c syscall.RawConn) error {
	return g.outbound().Control(network, address, c)
}

// NewClient returns the HTTP client deliveries are sent with: every
// connection is dialled through the guard, environment proxies are ignored
// (a proxy would be the only address checked), and redirects are followed
// only to the same scheme and host with the method unchanged (307/308), at
// most maxRedirects times; any other redirect is returned as the response
// and counts as a failed attempt. Bound each request with its context.
func NewClient(g Guard) *http.Client {
	return &http.Client{Transport: g.outbound().Transport(), CheckRedirect: sameHostRedirect}
}

func sameHostRedirect(req *http.Request, via []*http.Request) error {
	first := via[0]
	if len(via) > maxRedirects ||
		req.URL.Scheme != first.URL.Scheme ||
		req.URL.Host != first.URL.Host ||
		req.Method != first.Method {
		return http.ErrUseLastResponse
	}
	return nil
}
