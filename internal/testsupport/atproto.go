package testsupport

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Request is one XRPC request as a fake saw it.
type Request struct {
	// Method is the XRPC method, e.g. com.atproto.repo.listRecords.
	Method string
	// Repo is the repo parameter (listRecords).
	Repo string
	// Collection is the collection parameter.
	Collection string
	// Cursor is the cursor parameter ("" on a first page).
	Cursor string
	// Limit is the limit parameter (0 if absent).
	Limit int
}

// Interceptor may answer a request itself (returning true), e.g. to fail,
// stall until the client gives up, or change state first. It runs on the
// server's goroutine for that request.
type Interceptor func(w http.ResponseWriter, r *http.Request, req Request) bool

// peer is what the relay and PDS fakes share: a server, a request log and
// an optional interceptor.
type peer struct {
	srv       *httptest.Server
	mu        sync.Mutex
	requests  []Request
	intercept Interceptor
}

func (p *peer) start(t testing.TB, method string, serve func(w http.ResponseWriter, req Request)) {
	p.startRoutes(t, map[string]func(w http.ResponseWriter, req Request){method: serve})
}

// startRoutes serves several XRPC methods; any other path answers 404, as
// a real server does for a method it does not implement.
func (p *peer) startRoutes(t testing.TB, routes map[string]func(w http.ResponseWriter, req Request)) {
	mux := http.NewServeMux()
	for method, serve := range routes {
		mux.HandleFunc("/xrpc/"+method, func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			limit, _ := strconv.Atoi(q.Get("limit"))
			req := Request{Method: method, Repo: q.Get("repo"), Collection: q.Get("collection"), Cursor: q.Get("cursor"), Limit: limit}
			p.mu.Lock()
			p.requests = append(p.requests, req)
			icpt := p.intercept
			p.mu.Unlock()
			if icpt != nil && icpt(w, r, req) {
				return
			}
			serve(w, req)
		})
	}
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
}

// URL is the peer's base URL (http://127.0.0.1:PORT).
func (p *peer) URL() string { return p.srv.URL }

// Requests returns every request received so far, in order.
func (p *peer) Requests() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Request(nil), p.requests...)
}

// Intercept installs (or with nil removes) an interceptor.
func (p *peer) Intercept(i Interceptor) {
	p.mu.Lock()
	p.intercept = i
	p.mu.Unlock()
}

// XRPCError writes an XRPC error answer {error, message} with status.
func XRPCError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "message": message})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// pageLimit is the page size for a request: its limit, else def.
func pageLimit(req Request, def int) int {
	if req.Limit > 0 {
		return req.Limit
	}
	return def
}

// Relay is a fake relay serving com.atproto.sync.listReposByCollection.
// DIDs are listed in sorted order; the cursor is the last DID of the page,
// given whenever the page is full (like the relay's collection directory).
type Relay struct {
	peer
	repos map[string]map[string]bool // collection → DIDs
}

// NewRelay starts a fake relay on loopback; it stops at test cleanup.
func NewRelay(t testing.TB) *Relay {
	r := &Relay{repos: map[string]map[string]bool{}}
	r.start(t, "com.atproto.sync.listReposByCollection", r.serve)
	return r
}

// Add lists dids as having records in collection.
func (r *Relay) Add(collection string, dids ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.repos[collection] == nil {
		r.repos[collection] = map[string]bool{}
	}
	for _, d := range dids {
		r.repos[collection][d] = true
	}
}

// Count returns how many listReposByCollection requests named collection.
func (r *Relay) Count(collection string) int {
	n := 0
	for _, req := range r.Requests() {
		if req.Collection == collection {
			n++
		}
	}
	return n
}

func (r *Relay) serve(w http.ResponseWriter, req Request) {
	if req.Collection == "" {
		XRPCError(w, http.StatusBadRequest, "InvalidRequest", "collection is required")
		return
	}
	r.mu.Lock()
	var dids []string
	for d := range r.repos[req.Collection] {
		if d > req.Cursor {
			dids = append(dids, d)
		}
	}
	r.mu.Unlock()
	sort.Strings(dids)
	limit := pageLimit(req, 500)
	out := struct {
		Repos  []map[string]string `json:"repos"`
		Cursor string              `json:"cursor,omitempty"`
	}{Repos: []map[string]string{}}
	for _, d := range dids {
		if len(out.Repos) == limit {
			break
		}
		out.Repos = append(out.Repos, map[string]string{"did": d})
	}
	if len(out.Repos) == limit {
		out.Cursor = out.Repos[limit-1]["did"]
	}
	writeJSON(w, out)
}

// ListReposRelay is a fake relay like Bluesky's indigo relay: it serves
// com.atproto.sync.listRepos (every repository it follows, with its
// active/status) and answers 404 to listReposByCollection, which Bluesky
// serves from a separate service.
type ListReposRelay struct {
	peer
	repos map[string]listedRepo
}

type listedRepo struct {
	active bool
	status string
}

// NewListReposRelay starts one on loopback; it stops at test cleanup.
func NewListReposRelay(t testing.TB) *ListReposRelay {
	r := &ListReposRelay{repos: map[string]listedRepo{}}
	r.start(t, "com.atproto.sync.listRepos", r.serve)
	return r
}

// Add lists dids as active repositories.
func (r *ListReposRelay) Add(dids ...string) {
	for _, d := range dids {
		r.AddStatus(d, true, "")
	}
}

// AddStatus lists did with the given active flag and status (e.g. false,
// "deactivated").
func (r *ListReposRelay) AddStatus(did string, active bool, status string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.repos[did] = listedRepo{active: active, status: status}
}

func (r *ListReposRelay) serve(w http.ResponseWriter, req Request) {
	r.mu.Lock()
	var dids []string
	for d := range r.repos {
		if d > req.Cursor {
			dids = append(dids, d)
		}
	}
	sort.Strings(dids)
	limit := pageLimit(req, 500)
	type entry struct {
		DID    string `json:"did"`
		Head   string `json:"head"`
		Rev    string `json:"rev"`
		Active bool   `json:"active"`
		Status string `json:"status,omitempty"`
	}
	out := struct {
		Repos  []entry `json:"repos"`
		Cursor string  `json:"cursor,omitempty"`
	}{Repos: []entry{}}
	for _, d := range dids {
		if len(out.Repos) == limit {
			break
		}
		st := r.repos[d]
		out.Repos = append(out.Repos, entry{DID: d, Head: "bafyhead", Rev: "3kaaaaaaaaaaa", Active: st.active, Status: st.status})
	}
	r.mu.Unlock()
	if len(out.Repos) == limit {
		out.Cursor = out.Repos[limit-1].DID
	}
	writeJSON(w, out)
}

// Record is one record a fake PDS serves.
type Record struct {
	// RKey is the record key; records are listed in RKey order.
	RKey string
	// URI overrides the record's at:// URI (to serve a bad one).
	URI string
	// CID is the record's CID (when empty, one made from the rkey:
	// "bafyrei" and the hex of its SHA-256, a CID by the AT Protocol
	// syntax).
	CID string
	// Value is the record; json.RawMessage is served as is.
	Value any
}

// PDS is a fake PDS serving com.atproto.repo.listRecords for the
// repositories put in it. Records are listed in rkey order; the cursor is
// the last rkey of the page, given whenever the page is full. An unknown
// repo answers 400 RepoNotFound.
type PDS struct {
	peer
	repos map[string]map[string][]Record // did → collection → records
}

// NewPDS starts a fake PDS on loopback; it stops at test cleanup. It also
// serves com.atproto.repo.describeRepo (the collections a repository has
// records in).
func NewPDS(t testing.TB) *PDS {
	p := &PDS{repos: map[string]map[string][]Record{}}
	p.startRoutes(t, map[string]func(w http.ResponseWriter, req Request){
		"com.atproto.repo.listRecords":  p.serve,
		"com.atproto.repo.describeRepo": p.describe,
	})
	return p
}

func (p *PDS) describe(w http.ResponseWriter, req Request) {
	p.mu.Lock()
	repo, ok := p.repos[req.Repo]
	cols := []string{}
	for c, recs := range repo {
		if len(recs) > 0 {
			cols = append(cols, c)
		}
	}
	p.mu.Unlock()
	if !ok {
		XRPCError(w, http.StatusBadRequest, "RepoNotFound", "Could not find repo: "+req.Repo)
		return
	}
	sort.Strings(cols)
	writeJSON(w, map[string]any{"did": req.Repo, "handle": "handle.invalid", "handleIsCorrect": false,
		"didDoc": map[string]any{"id": req.Repo}, "collections": cols})
}

// Put stores records in did's repository, collection col.
func (p *PDS) Put(did, col string, records ...Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.repos[did] == nil {
		p.repos[did] = map[string][]Record{}
	}
	p.repos[did][col] = append(p.repos[did][col], records...)
	sort.Slice(p.repos[did][col], func(i, j int) bool { return p.repos[did][col][i].RKey < p.repos[did][col][j].RKey })
}

// Count returns how many listRecords requests named did and col.
func (p *PDS) Count(did, col string) int {
	n := 0
	for _, req := range p.Requests() {
		if req.Method == "com.atproto.repo.listRecords" && req.Repo == did && req.Collection == col {
			n++
		}
	}
	return n
}

func (p *PDS) serve(w http.ResponseWriter, req Request) {
	p.mu.Lock()
	repo, ok := p.repos[req.Repo]
	var recs []Record
	for _, rec := range repo[req.Collection] {
		if rec.RKey > req.Cursor {
			recs = append(recs, rec)
		}
	}
	p.mu.Unlock()
	if !ok {
		XRPCError(w, http.StatusBadRequest, "RepoNotFound", "Could not find repo: "+req.Repo)
		return
	}
	limit := pageLimit(req, 50)
	type entry struct {
		URI   string `json:"uri"`
		CID   string `json:"cid"`
		Value any    `json:"value"`
	}
	out := struct {
		Records []entry `json:"records"`
		Cursor  string  `json:"cursor,omitempty"`
	}{Records: []entry{}}
	for _, rec := range recs {
		if len(out.Records) == limit {
			break
		}
		e := entry{URI: rec.URI, CID: rec.CID, Value: rec.Value}
		if e.URI == "" {
			e.URI = "at://" + req.Repo + "/" + req.Collection + "/" + rec.RKey
		}
		if e.CID == "" {
			e.CID = fmt.Sprintf("bafyrei%x", sha256.Sum256([]byte(rec.RKey)))
		}
		out.Records = append(out.Records, e)
	}
	if len(out.Records) == limit {
		out.Cursor = recs[limit-1].RKey
	}
	writeJSON(w, out)
}

// PLC is a fake PLC directory: GET /{did} answers the DID document of a
// registered DID (alsoKnownAs and its services: #atproto_pds for a
// repository, #atcr_hold for a hold), else 404.
type PLC struct {
	srv      *httptest.Server
	mu       sync.Mutex
	services map[string]map[string]string // did → service id → endpoint
}

// Service ids a fake DID document can carry (identity.ServicePDS and
// identity.ServiceHold).
const (
	servicePDS  = "#atproto_pds"
	serviceHold = "#atcr_hold"
)

var serviceTypes = map[string]string{servicePDS: "AtprotoPersonalDataServer", serviceHold: "AtcrHoldService"}

// NewPLC starts a fake PLC directory on loopback; it stops at test cleanup.
func NewPLC(t testing.TB) *PLC {
	p := &PLC{services: map[string]map[string]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		did := strings.TrimPrefix(r.URL.Path, "/")
		p.mu.Lock()
		services := []map[string]string{}
		for _, id := range []string{servicePDS, serviceHold} {
			if ep, ok := p.services[did][id]; ok {
				services = append(services, map[string]string{"id": id, "type": serviceTypes[id], "serviceEndpoint": ep})
			}
		}
		_, ok := p.services[did]
		p.mu.Unlock()
		if !ok {
			XRPCError(w, http.StatusNotFound, "NotFound", "DID not registered: "+did)
			return
		}
		writeJSON(w, map[string]any{
			"@context":    []string{"https://www.w3.org/ns/did/v1"},
			"id":          did,
			"alsoKnownAs": []string{"at://" + strings.ReplaceAll(strings.TrimPrefix(did, "did:plc:"), ":", "-") + ".test"},
			"service":     services,
		})
	}))
	t.Cleanup(p.srv.Close)
	return p
}

// URL is the directory's base URL (identity.plc_url).
func (p *PLC) URL() string { return p.srv.URL }

// Register makes did resolve to a document whose PDS is pdsURL.
func (p *PLC) Register(did, pdsURL string) { p.register(did, servicePDS, pdsURL) }

// RegisterHold makes did resolve to a hold's document whose #atcr_hold
// service is holdURL. A did:plc hold is how a test points a real appview
// process at a hold on loopback: a did:web hold resolves over https only.
func (p *PLC) RegisterHold(did, holdURL string) { p.register(did, serviceHold, holdURL) }

func (p *PLC) register(did, service, endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.services[did] == nil {
		p.services[did] = map[string]string{}
	}
	p.services[did][service] = endpoint
}
