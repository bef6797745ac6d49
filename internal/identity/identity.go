// Package identity resolves AT Protocol DIDs to DID documents: did:plc
// through a PLC directory (GET {plc_url}/{did}) and did:web through
// https://{host}/.well-known/did.json (W3C did:web method spec), and reads
// from them what the workers need: the PDS endpoint (service
// "#atproto_pds"), the hold endpoint ("#atcr_hold") and the handle
// (alsoKnownAs "at://HANDLE").
package identity

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
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

// Handle is the first at:// alias, without the scheme ("" if none): the
// handle the document declares, not verified (Resolver.Handle verifies it).
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
