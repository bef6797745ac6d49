// Package identity resolves AT Protocol DIDs to DID documents: did:plc
// through a PLC directory (GET {plc_url}/{did}) and did:web through
// https://{host}/.well-known/did.json (W3C did:web method spec), and reads
// from them what the workers need: the PDS endpoint (service
// "#atproto_pds"), the hold endpoint ("#atcr_hold") and the handle
// (alsoKnownAs "at://HANDLE").
package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/atcr-io/appview/internal/netguard"
)

// ErrNotFound means the directory or host has no document for the DID.
var ErrNotFound = errors.New("did not found")

// Document is the part of a DID document the workers read.
type Document struct {
	ID          string    `json:"id"`
	AlsoKnownAs []string  `json:"alsoKnownAs"`
	Service     []Service `json:"service"`
}

// Service is one service entry of a DID document.
type Service struct {
	ID              string `json:"id"`
	Type            string `json:"type"`
	ServiceEndpoint string `json:"serviceEndpoint"`
}

// Service ids (fragments) defined by the AT Protocol and by ATCR holds.
const (
	ServicePDS  = "#atproto_pds"
	ServiceHold = "#atcr_hold"
)

// ServiceEndpoint returns the endpoint of the service whose id is fragment
// (either "#frag" or "<did>#frag"), or ErrNotFound.
func (d *Document) ServiceEndpoint(fragment string) (string, error) {
	for _, s := range d.Service {
		if s.ID == fragment || strings.HasSuffix(s.ID, fragment) {
			if s.ServiceEndpoint == "" {
				break
			}
			return strings.TrimRight(s.ServiceEndpoint, "/"), nil
		}
	}
	return "", fmt.Errorf("%s has no %s service: %w", d.ID, fragment, ErrNotFound)
}

// PDSEndpoint is the base URL of the DID's personal data server.
func (d *Document) PDSEndpoint() (string, error) { return d.ServiceEndpoint(ServicePDS) }

// Handle is the first at:// alias, without the scheme ("" if none).
func (d *Document) Handle() string {
	for _, aka := range d.AlsoKnownAs {
		if h, ok := strings.CutPrefix(aka, "at://"); ok && h != "" {
			return h
		}
	}
	return ""
}

// WebDIDURL returns the URL of the DID document of a did:web, with scheme
// "https" in production: did:web:example.com → https://example.com/.well-known/did.json,
// did:web:example.com:u:alice → https://example.com/u/alice/did.json; a port
// is percent-encoded in the DID (did:web:localhost%3A8080).
func WebDIDURL(did, scheme string) (string, error) {
	rest, ok := strings.CutPrefix(did, "did:web:")
	if !ok || rest == "" {
		return "", fmt.Errorf("not a did:web: %q", did)
	}
	parts := strings.Split(rest, ":")
	host, err := url.PathUnescape(parts[0])
	if err != nil || host == "" || strings.ContainsAny(host, "/?#@") {
		return "", fmt.Errorf("did:web %q: bad host", did)
	}
	if len(parts) == 1 {
		return scheme + "://" + host + "/.well-known/did.json", nil
	}
	path := make([]string, 0, len(parts)-1)
	for _, p := range parts[1:] {
		seg, err := url.PathUnescape(p)
		if err != nil || seg == "" {
			return "", fmt.Errorf("did:web %q: bad path", did)
		}
		path = append(path, url.PathEscape(seg))
	}
	return scheme + "://" + host + "/" + strings.Join(path, "/") + "/did.json", nil
}

// HoldEndpointFromDID derives a hold's base URL from a did:web hold DID
// (did:web:hold01.example.com → https://hold01.example.com); false for
// other methods, which need resolution.
func HoldEndpointFromDID(did, scheme string) (string, bool) {
	rest, ok := strings.CutPrefix(did, "did:web:")
	if !ok || rest == "" || strings.Contains(rest, ":") {
		return "", false
	}
	host, err := url.PathUnescape(rest)
	if err != nil || host == "" {
		return "", false
	}
	return scheme + "://" + host, true
}

// Resolver resolves DIDs with a small in-memory cache. Safe for concurrent use.
type Resolver struct {
	// PLCURL is the PLC directory base URL (identity.plc_url).
	PLCURL string
	// WebScheme is "https" (the did:web method); tests on loopback set "http".
	WebScheme string
	// HTTP is the client used; nil means a client with a DefaultTimeout
	// whose dials pass the outbound guard (netguard: no non-public
	// address, the PLC directory trusted by name).
	HTTP *http.Client
	// TTL is how long a resolved document is cached; 0 means 10 minutes.
	// Failures are cached for TTL/10 so one bad DID cannot cause a storm.
	TTL time.Duration

	mu    sync.Mutex
	cache map[string]cached
}

type cached struct {
	doc     *Document
	err     error
	expires time.Time
}

// DefaultTimeout bounds one resolution request when the Resolver was
// given no client.
const DefaultTimeout = 10 * time.Second

// maxDocBytes bounds a DID document read (they are a few KB).
const maxDocBytes = 1 << 20

// Resolve returns the DID document of did:plc or did:web DID. Errors wrap
// ErrNotFound for unknown DIDs; other errors are transport or format errors.
func (r *Resolver) Resolve(ctx context.Context, did string) (*Document, error) {
	now := time.Now()
	r.mu.Lock()
	if c, ok := r.cache[did]; ok && now.Before(c.expires) {
		r.mu.Unlock()
		return c.doc, c.err
	}
	r.mu.Unlock()

	doc, err := r.fetch(ctx, did)
	if err != nil && ctx.Err() != nil {
		// Our caller gave up: do not cache its cancellation. (A fetch that
		// succeeded just before the cancellation is a good answer: it is
		// returned and cached; returning nil, nil here crashed callers.)
		return nil, err
	}
	ttl := r.TTL
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	if err != nil {
		ttl /= 10
	}
	r.mu.Lock()
	if r.cache == nil {
		r.cache = map[string]cached{}
	}
	r.cache[did] = cached{doc: doc, err: err, expires: now.Add(ttl)}
	r.mu.Unlock()
	return doc, err
}

func (r *Resolver) fetch(ctx context.Context, did string) (*Document, error) {
	var u string
	switch {
	case strings.HasPrefix(did, "did:plc:"):
		if r.PLCURL == "" {
			return nil, errors.New("resolve did:plc: no PLC directory configured")
		}
		u = strings.TrimRight(r.PLCURL, "/") + "/" + url.PathEscape(did)
	case strings.HasPrefix(did, "did:web:"):
		scheme := r.WebScheme
		if scheme == "" {
			scheme = "https"
		}
		var err error
		if u, err = WebDIDURL(did, scheme); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("resolve %q: unsupported DID method", did)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", did, err)
	}
	req.Header.Set("Accept", "application/did+ld+json, application/json")
	client := r.HTTP
	if client == nil {
		client = netguard.Guard{Purpose: "DID resolution"}.TrustURLs(r.PLCURL).Client(DefaultTimeout)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", did, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return nil, fmt.Errorf("resolve %s: HTTP %d: %w", did, resp.StatusCode, ErrNotFound)
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("resolve %s: HTTP %d", did, resp.StatusCode)
	}
	var doc Document
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxDocBytes)).Decode(&doc); err != nil {
		return nil, fmt.Errorf("resolve %s: decode DID document: %w", did, err)
	}
	if doc.ID != did {
		return nil, fmt.Errorf("resolve %s: document is for %q", did, doc.ID)
	}
	return &doc, nil
}

// PDSEndpoint resolves did and returns its PDS base URL.
func (r *Resolver) PDSEndpoint(ctx context.Context, did string) (string, error) {
	doc, err := r.Resolve(ctx, did)
	if err != nil {
		return "", err
	}
	return doc.PDSEndpoint()
}

// HoldEndpoint returns a hold's base URL: the "#atcr_hold" service of its
// DID document, or for a did:web hold without one, its host.
func (r *Resolver) HoldEndpoint(ctx context.Context, did string) (string, error) {
	doc, err := r.Resolve(ctx, did)
	if err == nil {
		if ep, err := doc.ServiceEndpoint(ServiceHold); err == nil {
			return ep, nil
		}
	}
	scheme := r.WebScheme
	if scheme == "" {
		scheme = "https"
	}
	if ep, ok := HoldEndpointFromDID(did, scheme); ok {
		return ep, nil
	}
	if err == nil {
		err = fmt.Errorf("%s has no %s service: %w", did, ServiceHold, ErrNotFound)
	}
	return "", err
}
