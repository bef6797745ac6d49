package identity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/outbound"
	"github.com/bluesky-social/indigo/atproto/identity"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// Cache defaults.
const (
	ttlDefault      = 10 * time.Minute
	capacityDefault = 100_000
)

// maxDocBytes bounds a DID document read (they are a few KB).
const maxDocBytes = 1 << 20

// Resolver resolves DIDs and verifies handles the way the AT Protocol's
// reference implementation does, on github.com/bluesky-social/indigo's
// atproto/identity: a bounded LRU cache with TTLs (identity.CacheDirectory)
// in which concurrent lookups of one DID or handle are coalesced into one
// request; Purge drops an entry when an #identity event says it changed.
// did:web is accepted at host level only, as the AT Protocol DID spec
// restricts it (https://atproto.com/specs/did). Handles come from the DID
// document's alsoKnownAs and count only when verified both ways
// (https://atproto.com/specs/handle): the handle resolves (DNS TXT
// _atproto.<handle>, else https://<handle>/.well-known/atproto-did) to the
// same DID.
//
// One Resolver serves the whole process (workers.Deps.Identity) so the
// cache is shared. Set the fields before first use; it is then safe for
// concurrent use.
type Resolver struct {
	// PLCURL is the PLC directory base URL (identity.plc_url).
	PLCURL string
	// WebScheme is "https" (the did:web method); tests on loopback set
	// "http", which also allows a host:port did:web.
	WebScheme string
	// HTTP is the client used; nil means a client with a 10 s timeout.
	HTTP *http.Client
	// TTL is how long a resolved document or handle is cached; 0 means 10
	// minutes. Failures are cached for TTL/10 so one bad DID cannot cause a
	// storm.
	TTL time.Duration
	// Capacity bounds the entries cached (DIDs and handles, each); 0 means
	// 100,000.
	Capacity int
	// HandleWellKnownURL, when set, verifies every handle with
	// GET {HandleWellKnownURL}/.well-known/atproto-did carrying the handle
	// as its Host header, instead of DNS and https://<handle>: for a local
	// chain whose PDS serves handles no DNS knows (docs/interop.md).
	HandleWellKnownURL string

	once sync.Once
	dir  *identity.CacheDirectory
	base *identity.BaseDirectory
}

func (r *Resolver) init() {
	r.once.Do(func() {
		ttl := r.TTL
		if ttl <= 0 {
			ttl = ttlDefault
		}
		capacity := r.Capacity
		if capacity <= 0 {
			capacity = capacityDefault
		}
		r.base = &identity.BaseDirectory{HTTPClient: *r.client(), UserAgent: "atcr-appview"}
		// Documents are cached without their handle verified (that is a
		// second lookup, made only by Handle), so "invalid handle" entries
		// live as long as the others.
		r.dir = identity.NewCacheDirectory(directory{r}, capacity, ttl, ttl/10, ttl)
	})
}

func (r *Resolver) client() *http.Client {
	if r.HTTP != nil {
		return r.HTTP
	}
	return outbound.Guard{Purpose: "DID resolution"}.TrustURLs(r.PLCURL, r.HandleWellKnownURL).Client(DefaultTimeout)
}

// DefaultTimeout bounds one resolution request when the Resolver was
// given no client.
const DefaultTimeout = 10 * time.Second

// Resolve returns the DID document of a did:plc or host-level did:web.
// Errors wrap ErrNotFound for unknown DIDs; other errors are transport or
// format errors (a malformed DID, a did:web with a path).
func (r *Resolver) Resolve(ctx context.Context, did string) (*Document, error) {
	ident, err := r.lookup(ctx, did)
	if err != nil {
		return nil, err
	}
	return documentOf(ident), nil
}

func (r *Resolver) lookup(ctx context.Context, did string) (*identity.Identity, error) {
	d, err := syntax.ParseDID(did)
	if err != nil {
		return nil, fmt.Errorf("resolve %q: %w", did, err)
	}
	r.init()
	ident, err := r.dir.LookupDID(ctx, d)
	if err != nil && ctx.Err() != nil {
		// Our caller gave up: do not leave its cancellation cached.
		_ = r.dir.Purge(context.Background(), d.AtIdentifier())
		return nil, err
	}
	return ident, err
}

// Purge drops what the cache holds for did and for the handle its cached
// document declared, so the next lookup asks the network: an #identity
// event means either may have changed.
func (r *Resolver) Purge(ctx context.Context, did string) {
	d, err := syntax.ParseDID(did)
	if err != nil {
		return
	}
	r.init()
	if ident, err := r.dir.LookupDID(ctx, d); err == nil {
		if h, err := ident.DeclaredHandle(); err == nil {
			_ = r.dir.Purge(ctx, h.AtIdentifier())
		}
	}
	_ = r.dir.Purge(ctx, d.AtIdentifier())
}

// Handle returns did's handle verified both ways: the handle its DID
// document declares (alsoKnownAs), provided that handle resolves back to
// did. It returns "" and no error when the document declares no handle or
// the handle does not resolve to did (the reference's "handle.invalid"),
// and an error when the DID or the handle could not be resolved at all
// (network, server), so a caller can keep what it had.
func (r *Resolver) Handle(ctx context.Context, did string) (string, error) {
	ident, err := r.lookup(ctx, did)
	if err != nil {
		return "", err
	}
	declared, err := ident.DeclaredHandle()
	if err != nil {
		return "", nil
	}
	hident, err := r.dir.LookupHandle(ctx, declared)
	switch {
	case err == nil && hident.DID.String() == did:
		return declared.String(), nil
	case err == nil:
		return "", nil
	case errors.Is(err, identity.ErrHandleNotFound), errors.Is(err, identity.ErrHandleMismatch),
		errors.Is(err, identity.ErrInvalidHandle), errors.Is(err, identity.ErrHandleReservedTLD),
		errors.Is(err, identity.ErrHandleNotDeclared):
		return "", nil
	case ctx.Err() != nil:
		_ = r.dir.Purge(context.Background(), declared.AtIdentifier())
		return "", err
	}
	return "", fmt.Errorf("verify handle %s of %s: %w", declared, did, err)
}

// RefreshHandle is Purge then Handle: what an #identity event calls for.
func (r *Resolver) RefreshHandle(ctx context.Context, did string) (string, error) {
	r.Purge(ctx, did)
	h, err := r.Handle(ctx, did)
	if h != "" {
		// A handle that moved from another DID may still be cached as that
		// DID's; verify it afresh.
		r.init()
		if hh, perr := syntax.ParseHandle(h); perr == nil {
			_ = r.dir.Purge(ctx, hh.AtIdentifier())
			return r.Handle(ctx, did)
		}
	}
	return h, err
}

// documentOf turns a parsed identity back into the Document the workers read.
func documentOf(ident *identity.Identity) *Document {
	doc := &Document{ID: ident.DID.String(), AlsoKnownAs: ident.AlsoKnownAs}
	for id, s := range ident.Services {
		doc.Service = append(doc.Service, Service{ID: "#" + id, Type: s.Type, ServiceEndpoint: s.URL})
	}
	return doc
}

// directory is the uncached identity.Directory under the cache: DID
// documents from PLC or did:web, handles from DNS/well-known (or
// HandleWellKnownURL).
type directory struct{ r *Resolver }

// LookupDID fetches the DID document; the handle is left invalid (it is
// verified by LookupHandle, on demand).
func (d directory) LookupDID(ctx context.Context, did syntax.DID) (*identity.Identity, error) {
	raw, err := d.r.fetch(ctx, did.String())
	if err != nil {
		return nil, err
	}
	var doc identity.DIDDocument
	if err := atproto.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("resolve %s: decode DID document: %w", did, err)
	}
	if doc.DID != did {
		return nil, fmt.Errorf("resolve %s: document is for %q", did, doc.DID)
	}
	ident := identity.ParseIdentity(&doc)
	return &ident, nil
}

// LookupHandle resolves h to a DID and that DID's document, and checks the
// document declares h: the two-way verification of the handle spec.
func (d directory) LookupHandle(ctx context.Context, h syntax.Handle) (*identity.Identity, error) {
	h = h.Normalize()
	did, err := d.r.resolveHandle(ctx, h)
	if err != nil {
		return nil, err
	}
	ident, err := d.LookupDID(ctx, did)
	if err != nil {
		return nil, err
	}
	declared, err := ident.DeclaredHandle()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", identity.ErrHandleNotDeclared, did)
	}
	if declared != h {
		return nil, fmt.Errorf("%w: %s declares %s, not %s", identity.ErrHandleMismatch, did, declared, h)
	}
	ident.Handle = h
	return ident, nil
}

func (d directory) Lookup(ctx context.Context, a syntax.AtIdentifier) (*identity.Identity, error) {
	if h, err := a.AsHandle(); err == nil {
		return d.LookupHandle(ctx, h)
	}
	did, err := a.AsDID()
	if err != nil {
		return nil, fmt.Errorf("at-identifier %q is neither a handle nor a DID", a)
	}
	return d.LookupDID(ctx, did)
}

// Purge: nothing is cached at this level.
func (d directory) Purge(context.Context, syntax.AtIdentifier) error { return nil }

// resolveHandle maps a handle to the DID it claims: the AT Protocol's
// methods (indigo's BaseDirectory: DNS TXT, then HTTPS well-known), or
// HandleWellKnownURL when set.
func (r *Resolver) resolveHandle(ctx context.Context, h syntax.Handle) (syntax.DID, error) {
	if r.HandleWellKnownURL == "" {
		return r.base.ResolveHandle(ctx, h)
	}
	if !h.AllowedTLD() {
		return "", identity.ErrHandleReservedTLD
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(r.HandleWellKnownURL, "/")+"/.well-known/atproto-did", nil)
	if err != nil {
		return "", fmt.Errorf("%w: %w", identity.ErrHandleResolutionFailed, err)
	}
	req.Host = h.String()
	resp, err := r.client().Do(req)
	if err != nil {
		return "", fmt.Errorf("%w: well-known %s: %w", identity.ErrHandleResolutionFailed, h, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return "", fmt.Errorf("%w: well-known %s: HTTP 404", identity.ErrHandleNotFound, h)
	case resp.StatusCode != http.StatusOK:
		return "", fmt.Errorf("%w: well-known %s: HTTP %d", identity.ErrHandleResolutionFailed, h, resp.StatusCode)
	}
	did, err := syntax.ParseDID(strings.TrimSpace(string(b)))
	if err != nil {
		return "", fmt.Errorf("%w: well-known %s: %w", identity.ErrHandleNotFound, h, err)
	}
	return did, nil
}

// webHost returns the host of a did:web the AT Protocol accepts: host
// level only (no path), a valid hostname on an allowed TLD; with
// WebScheme "http" (tests, local chains) a host:port as well.
func (r *Resolver) webHost(did string) (string, error) {
	rest := strings.TrimPrefix(did, "did:web:")
	if strings.Contains(rest, ":") {
		return "", fmt.Errorf("resolve %s: did:web with a path is not an AT Protocol DID", did)
	}
	host, err := url.PathUnescape(rest)
	if err != nil || host == "" {
		return "", fmt.Errorf("resolve %s: bad did:web host", did)
	}
	if r.WebScheme == "http" {
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if net.ParseIP(host) != nil || host == "localhost" {
			return url.PathUnescape(rest)
		}
	} else if strings.Contains(host, ":") {
		return "", fmt.Errorf("resolve %s: did:web with a port is for local testing only", did)
	}
	hh, err := syntax.ParseHandle(host)
	if err != nil || !hh.AllowedTLD() {
		return "", fmt.Errorf("resolve %s: did:web host %q is not a hostname on an allowed TLD", did, host)
	}
	return url.PathUnescape(rest)
}

// fetch GETs the DID document: {PLCURL}/{did} or
// {scheme}://{host}/.well-known/did.json.
func (r *Resolver) fetch(ctx context.Context, did string) ([]byte, error) {
	var u string
	switch {
	case strings.HasPrefix(did, "did:plc:"):
		if r.PLCURL == "" {
			return nil, errors.New("resolve did:plc: no PLC directory configured")
		}
		u = strings.TrimRight(r.PLCURL, "/") + "/" + url.PathEscape(did)
	case strings.HasPrefix(did, "did:web:"):
		host, err := r.webHost(did)
		if err != nil {
			return nil, err
		}
		scheme := r.WebScheme
		if scheme == "" {
			scheme = "https"
		}
		u = scheme + "://" + host + "/.well-known/did.json"
	default:
		return nil, fmt.Errorf("resolve %q: unsupported DID method", did)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", did, err)
	}
	req.Header.Set("Accept", "application/did+ld+json, application/json")
	resp, err := r.client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", did, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, fmt.Errorf("resolve %s: HTTP %d: %w", did, resp.StatusCode, errors.Join(ErrNotFound, identity.ErrDIDNotFound))
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("resolve %s: HTTP %d: %w", did, resp.StatusCode, identity.ErrDIDResolutionFailed)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocBytes))
	if err != nil {
		return nil, fmt.Errorf("resolve %s: read DID document: %w", did, err)
	}
	return b, nil
}
