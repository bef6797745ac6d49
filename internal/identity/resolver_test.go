package identity

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// chain is a fake PLC directory and a fake handle host (the well-known
// endpoint a PDS serves), both editable while the test runs.
type chain struct {
	mu      sync.Mutex
	docs    map[string]string // DID → declared handle ("" for none)
	handles map[string]string // handle → DID its well-known answers
	plcHits atomic.Int32
	hold    chan struct{} // when set, PLC requests wait for it to close
	plc     *httptest.Server
	wk      *httptest.Server
}

func newChain(t *testing.T) *chain {
	c := &chain{docs: map[string]string{}, handles: map[string]string{}}
	c.plc = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.plcHits.Add(1)
		c.mu.Lock()
		hold := c.hold
		did := strings.TrimPrefix(r.URL.Path, "/")
		h, ok := c.docs[did]
		c.mu.Unlock()
		if hold != nil {
			<-hold
		}
		if !ok {
			http.NotFound(w, r)
			return
		}
		aka := "[]"
		if h != "" {
			aka = `["at://` + h + `"]`
		}
		fmt.Fprintf(w, `{"id":%q,"alsoKnownAs":%s,"service":[{"id":"#atproto_pds","type":"AtprotoPersonalDataServer","serviceEndpoint":"https://pds.test"}]}`, did, aka)
	}))
	t.Cleanup(c.plc.Close)
	c.wk = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		did, ok := c.handles[r.Host]
		c.mu.Unlock()
		if r.URL.Path != "/.well-known/atproto-did" || !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, did)
	}))
	t.Cleanup(c.wk.Close)
	return c
}

func (c *chain) set(did, declared string, handleTo map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.docs[did] = declared
	for h, d := range handleTo {
		c.handles[h] = d
	}
}

func (c *chain) resolver() *Resolver {
	return &Resolver{PLCURL: c.plc.URL, HandleWellKnownURL: c.wk.URL}
}

const (
	didAlice = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
	didBob   = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
)

// The handle is the DID document's, and only when it resolves back to the
// DID; the old resolver had no handle verification at all and the
// processor took whatever an #identity event carried (nothing, from
// Bluesky's relay).
func TestHandlesComeFromTheDocumentVerifiedBothWays(t *testing.T) {
	c := newChain(t)
	c.set(didAlice, "alice.test", map[string]string{"alice.test": didAlice})
	c.set(didBob, "alice.test", nil) // bob claims alice's handle
	r := c.resolver()
	ctx := context.Background()
	if h, err := r.Handle(ctx, didAlice); err != nil || h != "alice.test" {
		t.Fatalf("Handle(alice) = %q, %v; want alice.test", h, err)
	}
	if h, err := r.Handle(ctx, didBob); err != nil || h != "" {
		t.Fatalf("Handle(bob claiming alice's handle) = %q, %v; want none", h, err)
	}
	c.set(didBob, "", nil)
	if h, err := r.RefreshHandle(ctx, didBob); err != nil || h != "" {
		t.Fatalf("Handle(no alsoKnownAs) = %q, %v", h, err)
	}
	// Alice changes handle; an #identity event purges and refreshes.
	c.set(didAlice, "alice2.test", map[string]string{"alice2.test": didAlice})
	if h, err := r.RefreshHandle(ctx, didAlice); err != nil || h != "alice2.test" {
		t.Fatalf("after RefreshHandle: %q, %v; want alice2.test", h, err)
	}
	// A handle that no longer resolves is not kept.
	c.mu.Lock()
	delete(c.handles, "alice2.test")
	c.mu.Unlock()
	if h, err := r.RefreshHandle(ctx, didAlice); err != nil || h != "" {
		t.Fatalf("unresolvable handle: %q, %v; want none", h, err)
	}
}

func TestConcurrentLookupsOfOneDIDAreOneRequest(t *testing.T) {
	c := newChain(t)
	c.set(didAlice, "alice.test", nil)
	hold := make(chan struct{})
	c.mu.Lock()
	c.hold = hold
	c.mu.Unlock()
	r := c.resolver()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.Resolve(context.Background(), didAlice); err != nil {
				errs <- err
			}
		}()
	}
	for c.plcHits.Load() == 0 {
		// The first request is in flight once the PLC counted it.
		waitABit()
	}
	close(hold)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := c.plcHits.Load(); n != 1 {
		t.Fatalf("PLC asked %d times for one DID looked up 20 times at once, want 1", n)
	}
}

func TestTheCacheIsBounded(t *testing.T) {
	c := newChain(t)
	dids := []string{didAlice, didBob, "did:plc:cccccccccccccccccccccccc"}
	for _, d := range dids {
		c.set(d, "", nil)
	}
	r := c.resolver()
	r.Capacity = 2
	ctx := context.Background()
	for _, d := range dids {
		if _, err := r.Resolve(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	before := c.plcHits.Load()
	if _, err := r.Resolve(ctx, dids[0]); err != nil {
		t.Fatal(err)
	}
	if c.plcHits.Load() != before+1 {
		t.Fatal("the least recently used DID stayed cached past the capacity of 2")
	}
}

func TestDidWebIsHostLevelOnlyAsTheATProtocolSpecSays(t *testing.T) {
	r := &Resolver{}
	for _, did := range []string{
		"did:web:example.com:u:alice", // a path
		"did:web:localhost%3A8080",    // a port outside local testing
		"did:web:169.254.169.254",     // not a hostname
		"did:web:printer.local",       // a disallowed TLD
		"did:web:exa%2Fmple.com",      // an escaped slash
	} {
		if _, err := r.Resolve(context.Background(), did); err == nil {
			t.Errorf("Resolve(%q) accepted", did)
		}
	}
	if _, err := r.webHost("did:web:hold01.example.com"); err != nil {
		t.Errorf("a host-level did:web refused: %v", err)
	}
	local := &Resolver{WebScheme: "http"}
	if h, err := local.webHost("did:web:127.0.0.1%3A9000"); err != nil || h != "127.0.0.1:9000" {
		t.Errorf("loopback did:web for tests: %q, %v", h, err)
	}
}

// waitABit yields while polling for a condition a server goroutine sets.
func waitABit() { runtime.Gosched() }

// A DID document's member names are read exactly and once
// (internal/atproto): encoding/json took "AlsoKnownAs" for alsoKnownAs
// and the last of two, so a document every other resolver reads as
// declaring no handle, or another one, declared one here.
func TestDocumentMemberNamesAreMatchedExactlyAndOnlyOnce(t *testing.T) {
	docs := map[string]string{
		didAlice: `{"id":"` + didAlice + `","AlsoKnownAs":["at://alice.test"],"service":[]}`,
		didBob:   `{"id":"` + didBob + `","alsoKnownAs":["at://bob.test"],"alsoKnownAs":["at://alice.test"],"service":[]}`,
	}
	plc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, docs[strings.TrimPrefix(r.URL.Path, "/")])
	}))
	t.Cleanup(plc.Close)
	wk := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, map[string]string{"alice.test": didAlice, "bob.test": didBob}[r.Host])
	}))
	t.Cleanup(wk.Close)
	r := &Resolver{PLCURL: plc.URL, HandleWellKnownURL: wk.URL}
	if h, err := r.Handle(context.Background(), didAlice); h != "" {
		t.Errorf("Handle(a document with AlsoKnownAs only) = %q, %v; want none", h, err)
	}
	if h, err := r.Handle(context.Background(), didBob); h != "" || err == nil {
		t.Errorf("Handle(a document with alsoKnownAs twice) = %q, %v; want none and an error", h, err)
	}
}
