// This file keeps outbound requests to hosts that network data
// names away from addresses an outsider should not be able to reach
// through this process (server-side request forgery): loopback, private,
// link-local (which holds cloud metadata services, 169.254.169.254),
// carrier-grade NAT, reserved and documentation ranges, and IPv6 forms that
// embed such an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo).
//
// The check runs at dial time, on the literal address being connected to
// (net.Dialer.Control), after name resolution and on every redirect, so
// neither a DNS answer that changes between check and use nor a redirect
// can get around it. Hosts the operator configured (a relay, the PLC
// directory) can be trusted by name: they are not network data.
//
// Who uses it: webhook deliveries, the hold health checker, the identity
// resolver (did:web), the backfill (PDS endpoints from DID documents) and
// billing (hold endpoints). The operator allows private addresses with
// network.allow_private (webhooks.allow_private also, for webhooks only).

package outbound

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"
)

// DefaultKey is the configuration key that permits non-public addresses
// for every outbound request, named in refusals.
const DefaultKey = "network.allow_private"

// ErrRefused is wrapped by every *RefusedError, for errors.Is.
var ErrRefused = errors.New("address refused by the outbound guard")

// RefusedError says the guard would not let a request reach an address.
type RefusedError struct {
	// Purpose is what the request was for ("webhook", "hold health
	// check"); "" reads as "outbound".
	Purpose string
	// Target is what was being reached: a URL's host or a dial address.
	Target string
	// Addr is the refused IP address (invalid when the target was unusable);
	// Error names an IPv4-mapped IPv6 address as its IPv4 address.
	Addr netip.Addr
	// AddrClass names the address range, e.g. "loopback", "private", "link-local".
	AddrClass string
	// Key is the configuration key that would permit the address.
	Key string
}

func (e *RefusedError) Error() string {
	purpose := e.Purpose
	if purpose == "" {
		purpose = "outbound"
	}
	if !e.Addr.IsValid() {
		return fmt.Sprintf("refused %s target %s: %s", purpose, e.Target, e.AddrClass)
	}
	key := e.Key
	if key == "" {
		key = DefaultKey
	}
	verb := "set"
	if strings.HasPrefix(key, "-") {
		verb = "pass" // a command-line flag
	}
	return fmt.Sprintf("refused %s target %s: %s is %s %s address (%s %s to permit it)",
		purpose, e.Target, e.Addr.Unmap(), article(e.AddrClass), e.AddrClass, verb, key)
}

// Unwrap makes errors.Is(err, ErrRefused) true.
func (e *RefusedError) Unwrap() error { return ErrRefused }

// article is the indefinite article before class: "an unspecified",
// "an IETF protocol assignment", "a loopback". Every class is an English
// word or an initialism read letter by letter, so the first letter decides.
func article(class string) string {
	if class != "" && strings.ContainsRune("aeiouAEIOU", rune(class[0])) {
		return "an"
	}
	return "a"
}

// Guard decides which addresses outbound requests may reach. The zero
// value refuses every non-public address and trusts no host.
type Guard struct {
	// AllowPrivate permits every address (network.allow_private).
	AllowPrivate bool
	// Key is the configuration key named in refusals; "" means DefaultKey.
	Key string
	// Purpose names the requests in refusals ("webhook", "did:web
	// resolution"); "" means "outbound".
	Purpose string
	// Trusted lists hosts the operator configured, as lower-case
	// host:port (TrustURLs builds them from URLs). A dial to one of them
	// by that name is not checked: the address is the operator's choice,
	// not network data's. A dial to the same address under another name
	// is.
	Trusted []string
}

// TrustURLs returns g with the hosts of the given URLs added to Trusted,
// each as host:port (the scheme's default port when the URL has none).
// Empty strings and URLs without a host are skipped: the configuration
// validates them elsewhere.
func (g Guard) TrustURLs(urls ...string) Guard {
	trusted := append([]string(nil), g.Trusted...)
	for _, raw := range urls {
		u, err := url.Parse(raw)
		if err != nil || u.Hostname() == "" {
			continue
		}
		trusted = append(trusted, hostPort(u))
	}
	g.Trusted = trusted
	return g
}

// hostPort is u's host:port, lower case, with the scheme's default port.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "https", "wss":
			port = "443"
		default:
			port = "80"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// trusts reports whether the dial address (host:port as the HTTP
// transport passes it, before resolution) names a trusted host.
func (g Guard) trusts(address string) bool {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	return slices.Contains(g.Trusted, net.JoinHostPort(strings.ToLower(host), port))
}

// Check returns a *RefusedError when a is not public and g does not allow
// it, naming target (what was being reached) in the error.
func (g Guard) Check(target string, a netip.Addr) error {
	if g.AllowPrivate {
		return nil
	}
	if class := Class(a); class != "" {
		return &RefusedError{Purpose: g.Purpose, Target: target, Addr: a, AddrClass: class, Key: g.Key}
	}
	return nil
}

// Control is a net.Dialer Control function: it runs after name resolution,
// just before each connect, with the literal address being dialled, so it
// is the one place a rebinding DNS answer or a redirect cannot get around.
// It returns a *RefusedError for a non-public address unless AllowPrivate.
func (g Guard) Control(_, address string, _ syscall.RawConn) error {
	if g.AllowPrivate {
		return nil
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Purpose: g.Purpose, Target: address, AddrClass: "unparsable dial address", Key: g.Key}
	}
	return g.Check(address, ap.Addr())
}

// dialTimeout bounds one TCP connect; requests are bounded as a whole by
// their context or their client's timeout.
const dialTimeout = 10 * time.Second

// DialContext dials like net.Dialer.DialContext, with every connection to
// an untrusted host passing Control. Its errors wrap a *RefusedError when
// the guard refused every address the host resolved to.
func (g Guard) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d := &net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second}
	if !g.trusts(address) {
		d.Control = g.Control
	}
	return d.DialContext(ctx, network, address)
}

// Transport returns an HTTP transport that dials through DialContext.
// Environment proxies are ignored: through a proxy, the proxy's address
// would be the only one checked.
func (g Guard) Transport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           g.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          32,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}

// Client returns an HTTP client on Transport with the given overall
// timeout per request (0: none; bound requests with their context then).
// Redirects follow SameHostRedirect; each one dials through the guard
// again.
func (g Guard) Client(timeout time.Duration) *http.Client {
	return &http.Client{Transport: g.Transport(), Timeout: timeout, CheckRedirect: SameHostRedirect}
}

// MaxRedirects bounds the redirects SameHostRedirect follows for one
// request.
const MaxRedirects = 5

// SameHostRedirect is the redirect rule of every outbound client (an
// http.Client's CheckRedirect). A redirect is followed only when it keeps
// the request's meaning: the same host (and port), the same scheme or an
// upgrade from http to https, the same method (net/http turns a POST into
// a bodyless GET on 301, 302 and 303), and at most MaxRedirects of them.
// Any other redirect is not followed: the caller gets the 3xx answer
// itself, which no caller takes for success.
func SameHostRedirect(req *http.Request, via []*http.Request) error {
	first := via[0]
	if len(via) > MaxRedirects ||
		req.URL.Host != first.URL.Host ||
		(req.URL.Scheme != first.URL.Scheme && (first.URL.Scheme != "http" || req.URL.Scheme != "https")) ||
		req.Method != first.Method {
		return http.ErrUseLastResponse
	}
	return nil
}

// NoRedirect never follows a redirect (an http.Client's CheckRedirect):
// the caller gets the 3xx answer itself. It is the rule of requests whose
// effect must reach exactly the URL named (billing's updateCrewTier POST).
func NoRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

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

// Class returns the class of a as a non-public address, or "" when a is
// publicly routable. IPv6 forms that embed an IPv4 address (mapped,
// compatible, NAT64, 6to4, Teredo) are judged by the embedded address,
// since that is where the packets end up.
func Class(a netip.Addr) string {
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
			if class := Class(embedded); class != "" {
				return class + " (embedded IPv4)"
			}
		}
	}
	return ""
}
