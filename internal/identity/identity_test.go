package identity

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/atcr-io/appview/internal/outbound"
)

func TestWebDIDURLFollowsTheDidWebMethod(t *testing.T) {
	cases := map[string]string{
		"did:web:example.com":            "https://example.com/.well-known/did.json",
		"did:web:localhost%3A8080":       "https://localhost:8080/.well-known/did.json",
		"did:web:example.com:user:alice": "https://example.com/user/alice/did.json",
		"did:web:hold01.example.com":     "https://hold01.example.com/.well-known/did.json",
	}
	for did, want := range cases {
		got, err := WebDIDURL(did, "https")
		if err != nil || got != want {
			t.Errorf("WebDIDURL(%q) = %q, %v; want %q", did, got, err, want)
		}
	}
	for _, bad := range []string{"did:plc:abc", "did:web:", "did:web:a%2Fb"} {
		if _, err := WebDIDURL(bad, "https"); err == nil {
			t.Errorf("WebDIDURL(%q) accepted", bad)
		}
	}
}

// The other direction, holdEndpoint → DID, is processor.HoldDIDFromEndpoint
// (tested there).
func TestHoldEndpointFromDIDIsTheHoldsBaseURL(t *testing.T) {
	ep, ok := HoldEndpointFromDID("did:web:hold01.example.com", "https")
	if !ok || ep != "https://hold01.example.com" {
		t.Fatalf("HoldEndpointFromDID = %q, %v", ep, ok)
	}
}

func TestResolverReadsPLCAndWebDocumentsAndCachesThem(t *testing.T) {
	var plcHits, webHits atomic.Int32
	plc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plcHits.Add(1)
		did := strings.TrimPrefix(r.URL.Path, "/")
		if did != "did:plc:alice" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"id":%q,"alsoKnownAs":["at://alice.test"],"service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":"https://pds.test/"}]}`, did)
	}))
	defer plc.Close()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		webHits.Add(1)
		if r.URL.Path != "/.well-known/did.json" {
			http.NotFound(w, r)
			return
		}
		host := strings.ReplaceAll(r.Host, ":", "%3A")
		fmt.Fprintf(w, `{"id":"did:web:%s","service":[{"id":"did:web:%s#atcr_hold","type":"AtcrHoldService","serviceEndpoint":"http://%s"}]}`, host, host, r.Host)
	}))
	defer web.Close()

	// The did:web hold is on loopback: allowed here as network.allow_private does.
	r := &Resolver{PLCURL: plc.URL, WebScheme: "http", HTTP: outbound.Guard{AllowPrivate: true}.Client(0)}
	ctx := context.Background()
	for range 3 {
		pds, err := r.PDSEndpoint(ctx, "did:plc:alice")
		if err != nil || pds != "https://pds.test" {
			t.Fatalf("PDSEndpoint = %q, %v", pds, err)
		}
	}
	if plcHits.Load() != 1 {
		t.Fatalf("PLC asked %d times, want 1 (cache)", plcHits.Load())
	}
	doc, _ := r.Resolve(ctx, "did:plc:alice")
	if doc.Handle() != "alice.test" {
		t.Fatalf("handle = %q", doc.Handle())
	}
	if _, err := r.Resolve(ctx, "did:plc:nobody"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown DID: %v, want ErrNotFound", err)
	}
	host := strings.TrimPrefix(web.URL, "http://")
	holdDID := "did:web:" + strings.ReplaceAll(host, ":", "%3A")
	ep, err := r.HoldEndpoint(ctx, holdDID)
	if err != nil || ep != web.URL {
		t.Fatalf("HoldEndpoint = %q, %v; want %q", ep, err, web.URL)
	}
	if _, err := r.Resolve(ctx, "did:key:z6Mk"); err == nil {
		t.Fatal("did:key accepted")
	}
}

// cancelAfter answers with a DID document and then cancels the request's
// context, as a caller giving up the instant the answer arrives does.
type cancelAfter struct {
	did    string
	cancel context.CancelFunc
}

func (c cancelAfter) RoundTrip(*http.Request) (*http.Response, error) {
	defer c.cancel()
	body := `{"id":"` + c.did + `","service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":"https://pds.example"}]}`
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body))}, nil
}

// A resolution that succeeded just as its caller gave up returns the
// document: it used to return neither a document nor an error, and the
// backfill dereferenced the nil document.
func TestAResolutionThatSucceedsAsTheCallerGivesUpReturnsTheDocument(t *testing.T) {
	const did = "did:plc:abcdefghijklmnopqrstuvwx"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := &Resolver{PLCURL: "https://plc.example", HTTP: &http.Client{Transport: cancelAfter{did: did, cancel: cancel}}}
	pds, err := r.PDSEndpoint(ctx, did)
	if err != nil || pds != "https://pds.example" {
		t.Fatalf("PDSEndpoint = %q, %v; want the document's PDS", pds, err)
	}
}
