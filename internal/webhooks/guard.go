package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrRefused is wrapped by every *RefusedError, for errors.Is.
var ErrRefused = errors.New("webhook address refused")

// RefusedError says the guard would not let a request reach an address.
type RefusedError struct {
	// Target is what was being reached: a URL's host or a dial address.
	Target string
	// Addr is the refused IP address (invalid when the target was unusable).
	Addr netip.Addr
	// Class names the address range, e.g. "loopback", "private", "link-local".
	Class string
}

func (e *RefusedError) Error() string {
	if !e.Addr.IsValid() {
		return fmt.Sprintf("refused webhook target %s: %s", e.Target, e.Class)
	}
	return fmt.Sprintf("refused webhook target %s: %s is %s %s address (set webhooks.allow_private to permit it)",
		e.Target, e.Addr, article(e.Class), e.Class)
}

// article is the indefinite article before class: "an unspecified",
// "an IETF protocol assignment", "a loopback". Every class is an English
// word or an initialism read letter by letter, so the first letter decides.
func article(class string) string {
	if class != "" && strings.ContainsRune("aeiouAEIOU", rune(class[0])) {
		return "an"
	}
	return "a"
}

// Unwrap makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// Guard decides which addresses webhook requests may reach (the SSRF guard).
// The zero value refuses every non-public address and resolves names with
// net.DefaultResolver.
type Guard struct {
	// AllowPrivate permits every address (webhooks.allow_private).
	AllowPrivate bool
	// Resolver resolves host names in CheckURL; nil means net.DefaultResolver.
	Resolver *net.Resolver
}

// Timing of the HTTP client built by NewClient.
const (
	// dialTimeout bounds one TCP connect; the attempt as a whole is bounded
	// by webhooks.timeout through the request's context.
	dialTimeout = 10 * time.Second
	// maxRedirects is how many same-host redirects one attempt follows.
	maxRedirects = 3
)

// CheckURL validates a webhook URL when it is added: http or https, a host,
// no credentials (user:password@: they would be stored and listed in the
// clear; the signing secret is what authenticates a delivery), and (unless
// AllowPrivate) every address the host resolves to public. The error is a
// *RefusedError for a non-public address, or says what is wrong with the
// URL and wraps ErrInvalid (also for a host that does not exist). Passing
// this check says nothing about later requests: DNS can change, which is
// why Control repeats it at dial time.
func (g Guard) CheckURL(ctx context.Context, raw string) (*url.URL, error) {
	u, err := parseTarget(raw)
	if err != nil {
		return nil, &invalidError{err: err}
	}
	if u.User != nil {
		return nil, invalid("webhook url %q: must not carry credentials (user:password@); use the signing secret", u.Redacted())
	}
	if g.AllowPrivate {
		return u, nil
	}
	host := u.Hostname()
	if a, err := netip.ParseAddr(host); err == nil {
		if class := nonPublic(a); class != "" {
			return nil, &RefusedError{Target: host, Addr: a, Class: class}
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
		return nil, invalid("webhook url %q: resolve %s: %w", raw, host, err)
	}
	if err != nil {
		return nil, fmt.Errorf("webhook url %q: resolve %s: %w", raw, host, err)
	}
	for _, a := range addrs {
		if class := nonPublic(a); class != "" {
			return nil, &RefusedError{Target: host, Addr: a, Class: class}
		}
	}
	return u, nil
}

// parseTarget accepts absolute http and https URLs with a host.
func parseTarget(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("webhook url %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("webhook url %q: scheme must be http or https", raw)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("webhook url %q: no host", raw)
	}
	return u, nil
}

// Control is a net.Dialer Control function: it runs after name resolution,
// just before each connect, with the literal address being dialled, so it
// is the one place a rebinding DNS answer or a redirect cannot get around.
// It returns a *RefusedError for a non-public address unless AllowPrivate.
func (g Guard) Control(network, address string, _ syscall.RawConn) error {
	if g.AllowPrivate {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Target: address, Class: "unparsable dial address"}
	}
	if class := nonPublic(ap.Addr()); class != "" {
		return &RefusedError{Target: address, Addr: ap.Addr(), Class: class}
	}
	return nil
}

// NewClient returns the HTTP client deliveries are sent with: every
// connection is dialled through g.Control, environment proxies are ignored
// (a proxy would be the only address checked), and redirects are followed
// only to the same scheme and host with the method unchanged (307/308), at
// most maxRedirects times; any other redirect is returned as the response
// and counts as a failed attempt. Bound each request with its context.
func NewClient(g Guard) *http.Client {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second, Control: g.Control}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          32,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &http.Client{Transport: tr, CheckRedirect: sameHostRedirect}
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

// specialRanges are non-public ranges the netip predicates do not cover
// (RFC 6890 special-purpose registries), with the class reported.
var specialRanges = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared (carrier-grade NAT)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignment"},
	{netip.MustParsePrefix("192.0.2.0/24"), "documentation"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("198.51.100.0/24"), "documentation"},
	{netip.MustParsePrefix("203.0.113.0/24"), "documentation"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"}, // includes 255.255.255.255
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("2001:db8::/32"), "documentation"},
	{netip.MustParsePrefix("fec0::/10"), "site-local"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64"},
}

var (
	nat64      = netip.MustParsePrefix("64:ff9b::/96")
	ipv4Compat = netip.MustParsePrefix("::/96")
	sixToFour  = netip.MustParsePrefix("2002::/16")
	teredo     = netip.MustParsePrefix("2001::/32")
)

// nonPublic returns the class of a as a non-public address, or "" when a
// is publicly routable. IPv6 forms that embed an IPv4 address (mapped,
// compatible, NAT64, 6to4, Teredo) are judged by the embedded address,
// since that is where the packets end up.
func nonPublic(a netip.Addr) string {
	a = a.WithZone("").Unmap()
	switch {
	case !a.IsValid():
		return "invalid"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	if a.Is6() {
		b := a.As16()
		var embedded netip.Addr
		switch {
		case nat64.Contains(a), ipv4Compat.Contains(a):
			embedded = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
		case sixToFour.Contains(a):
			embedded = netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]})
		case teredo.Contains(a):
			// The client address is stored inverted (RFC 4380 §4).
			embedded = netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		}
		if embedded.IsValid() {
			if class := nonPublic(embedded); class != "" {
				return class + " (embedded IPv4)"
			}
		}
	}
	return ""
}
