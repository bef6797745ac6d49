package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
)

// ErrRefused is wrapped by every *RefusedError, for errors.Is (the
// shared outbound guard's, outbound.ErrRefused).
var ErrRefused = outbound.ErrRefused

// RefusedError says the guard would not let a request reach an address.
type RefusedError = outbound.RefusedError

// Guard decides which addresses webhook requests may reach: the shared
// outbound guard (internal/outbound) with webhooks' own key. The zero
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
func (g Guard) outbound() outbound.Guard {
	key := g.Key
	if key == "" {
		key = "webhooks.allow_private"
	}
	return outbound.Guard{AllowPrivate: g.AllowPrivate, Key: key, Purpose: "webhook"}
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
	// An address written in the URL is checked as itself, whatever its
	// spelling: a legacy numeric IPv4 form ("2130706433", "0x7f.1") is no
	// host name a resolver knows, and the stored URL (outbound.Canonical)
	// names its dotted quad, which is what deliveries dial.
	host := u.Hostname()
	if a, ok := outbound.LiteralAddr(host); ok {
		if err := g.outbound().Check(host, a); err != nil {
			return nil, err
		}
		return u, nil
	}
	r := g.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	// The name as the stored URL has it (outbound.Canonical): without a
	// trailing dot, which the resolver's hosts file lookup does not fold
	// ("localhost." went to DNS and came back "no such host").
	addrs, err := r.LookupNetIP(ctx, "ip", strings.TrimSuffix(host, "."))
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
// 1..65535 and no credentials (outbound.Check): a delivery anywhere else
// could only fail at every attempt, and a password would be stored and
// logged with the target.
func parseTarget(raw string) (*url.URL, error) {
	u, err := outbound.CheckURL(raw, "http", "https")
	var e *outbound.URLError
	if errors.As(err, &e) && e.Credentials {
		return nil, fmt.Errorf("webhook %s; use the signing secret", e.Reason)
	}
	if err != nil {
		return nil, fmt.Errorf("webhook %w", err)
	}
	return u, nil
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
	return outbound.CanonicalURL(ua) == outbound.CanonicalURL(ub)
}

// Control is a net.Dialer Control function that refuses a non-public
// dial address unless AllowPrivate (outbound.Guard.Control).
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
