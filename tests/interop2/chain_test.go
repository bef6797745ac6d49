//go:build interop2

package interop2

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/gorilla/websocket"
)

// What the lifecycle scenarios (lifecycle_test.go) need of the chain: the
// events each hop forwarded, the PDS's own account flows (email tokens
// read from its database), and what an index shows of some accounts.

// forwarded keeps, per DID, the events one hop of the chain sent.
type forwarded struct {
	mu    sync.Mutex
	byDID map[string][]hopEvent
}

type hopEvent struct {
	at   time.Time
	what string // "#account(active)", "#account(deactivated)", "#identity", "#sync", "#commit"
}

func newForwarded() *forwarded { return &forwarded{byDID: map[string][]hopEvent{}} }

func (f *forwarded) add(did, what string) {
	f.mu.Lock()
	f.byDID[did] = append(f.byDID[did], hopEvent{at: time.Now(), what: what})
	f.mu.Unlock()
}

// between names the events of did received from from to to, in order,
// runs of one kind counted ("#commit×2"); commits only with commits.
func (f *forwarded) between(did string, from, to time.Time, commits bool) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	n := 0
	for _, e := range f.byDID[did] {
		if e.at.Before(from) || !e.at.Before(to) || !commits && e.what == "#commit" {
			continue
		}
		if len(out) > 0 && out[len(out)-1] == e.what {
			n++
			continue
		}
		if n > 1 {
			out[len(out)-1] += fmt.Sprintf("×%d", n)
		}
		out, n = append(out, e.what), 1
	}
	if n > 1 {
		out[len(out)-1] += fmt.Sprintf("×%d", n)
	}
	if len(out) == 0 {
		return "nothing"
	}
	return strings.Join(out, " ")
}

func accountWhat(active bool, status string) string {
	if active {
		return "#account(active)"
	}
	return "#account(" + status + ")"
}

// captureRelay follows the relay's com.atproto.sync.subscribeRepos (two
// DAG-CBOR objects a frame: header {op, t}, body) until ctx ends.
func captureRelay(ctx context.Context, t *testing.T, relay string, f *forwarded) {
	c, _, err := websocket.DefaultDialer.DialContext(ctx, strings.Replace(relay, "http://", "ws://", 1)+"/xrpc/com.atproto.sync.subscribeRepos", nil)
	if err != nil {
		t.Errorf("relay capture: %v", err)
		return
	}
	go func() { <-ctx.Done(); c.Close() }()
	go func() {
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				return
			}
			dec := cbor.NewDecoder(bytes.NewReader(b))
			var hdr struct {
				Op int    `cbor:"op"`
				T  string `cbor:"t"`
			}
			var body struct {
				Repo   string  `cbor:"repo"`
				DID    string  `cbor:"did"`
				Active *bool   `cbor:"active"`
				Status *string `cbor:"status"`
			}
			if dec.Decode(&hdr) != nil || hdr.Op != 1 || dec.Decode(&body) != nil {
				continue
			}
			what := hdr.T
			if hdr.T == "#account" && body.Active != nil {
				status := ""
				if body.Status != nil {
					status = *body.Status
				}
				what = accountWhat(*body.Active, status)
			}
			f.add(body.DID+body.Repo, what)
		}
	}()
}

// captureJetstream follows a Jetstream wire (v2 subscribeEvents, or the
// legacy /subscribe) filtered to io.atcr.* until ctx ends.
func captureJetstream(ctx context.Context, t *testing.T, js string, v2 bool, f *forwarded) {
	u := strings.Replace(js, "http://", "ws://", 1) + "/subscribe?wantedCollections=io.atcr.*"
	if v2 {
		u = strings.Replace(js, "http://", "ws://", 1) + "/xrpc/network.bsky.jetstream.subscribeEvents?collections=io.atcr.*"
	}
	c, _, err := websocket.DefaultDialer.DialContext(ctx, u, nil)
	if err != nil {
		t.Errorf("jetstream capture: %v", err)
		return
	}
	go func() { <-ctx.Done(); c.Close() }()
	go func() {
		for {
			_, b, err := c.ReadMessage()
			if err != nil {
				return
			}
			var ev struct {
				Payload *json.RawMessage `json:"payload"`
				Type    string           `json:"$type"`
				DID     string           `json:"did"`
				Kind    string           `json:"kind"`
				Account *struct {
					Active bool   `json:"active"`
					Status string `json:"status"`
				} `json:"account"`
				Active *bool  `json:"active"`
				Status string `json:"status"`
			}
			if json.Unmarshal(b, &ev) != nil {
				continue
			}
			if ev.Payload != nil {
				if json.Unmarshal(*ev.Payload, &ev) != nil {
					continue
				}
				ev.Kind = ev.Type[strings.LastIndex(ev.Type, "#")+1:]
				if ev.Active != nil {
					ev.Account = &struct {
						Active bool   `json:"active"`
						Status string `json:"status"`
					}{*ev.Active, ev.Status}
				}
			}
			what := "#" + ev.Kind
			if ev.Kind == "account" && ev.Account != nil {
				what = accountWhat(ev.Account.Active, ev.Account.Status)
			}
			f.add(ev.DID, what)
		}
	}()
}

// emailToken reads the token the PDS "emailed" for purpose (no SMTP in the
// chain: nodemailer's JSON transport) from its account database.
func emailToken(t *testing.T, dataDir, did, purpose string) string {
	t.Helper()
	out, err := exec.Command("python3", "-c", `import sqlite3, sys
c = sqlite3.connect("file:" + sys.argv[1] + "?mode=ro", uri=True)
print(c.execute("SELECT token FROM email_token WHERE did = ? AND purpose = ?", (sys.argv[2], sys.argv[3])).fetchone()[0])`,
		filepath.Join(dataDir, "account.sqlite"), did, purpose).CombinedOutput()
	if err != nil {
		t.Fatalf("email token %s of %s: %v\n%s", purpose, did, err, out)
	}
	return strings.TrimSpace(string(out))
}

// migrate moves a's account from old to new with the PDS's own flow
// (atproto.com/guides/account-migration) up to and including the PLC
// operation: service auth from the old PDS, createAccount with the DID on
// the new one (deactivated), getRepo → importRepo, the missing blobs, the
// recommended credentials signed by the old PDS (email token) and
// submitted by the new. It returns the account's session on the new PDS;
// activating it there and deactivating the old one is left to the caller.
func migrate(t *testing.T, old, nu *pdsClient, oldDir string, a *account) *account {
	t.Helper()
	ctx := context.Background()
	var server struct {
		DID string `json:"did"`
	}
	if err := nu.call(ctx, http.MethodGet, "com.atproto.server.describeServer", "", nil, "", &server); err != nil {
		t.Fatalf("describeServer: %v", err)
	}
	var sa struct {
		Token string `json:"token"`
	}
	q := url.Values{"aud": {server.DID}, "lxm": {"com.atproto.server.createAccount"}}
	if err := old.call(ctx, http.MethodGet, "com.atproto.server.getServiceAuth?"+q.Encode(), a.JWT, nil, "", &sa); err != nil {
		t.Fatalf("getServiceAuth: %v", err)
	}
	var created struct {
		AccessJwt string `json:"accessJwt"`
	}
	if err := nu.call(ctx, http.MethodPost, "com.atproto.server.createAccount", sa.Token, map[string]any{
		"did": a.DID, "handle": a.Handle, "email": "moved-" + strings.ReplaceAll(a.Handle, ".", "-") + "@example.test", "password": "pw-" + a.Handle,
	}, "", &created); err != nil {
		t.Fatalf("createAccount on the new PDS: %v", err)
	}
	moved := &account{DID: a.DID, Handle: a.Handle, JWT: created.AccessJwt}
	car, err := old.raw(ctx, "com.atproto.sync.getRepo?did="+url.QueryEscape(a.DID))
	if err != nil {
		t.Fatalf("getRepo: %v", err)
	}
	if err := nu.call(ctx, http.MethodPost, "com.atproto.repo.importRepo", moved.JWT, car, "application/vnd.ipld.car", nil); err != nil {
		t.Fatalf("importRepo: %v", err)
	}
	var missing struct {
		Blobs []struct {
			CID string `json:"cid"`
		} `json:"blobs"`
	}
	if err := nu.call(ctx, http.MethodGet, "com.atproto.repo.listMissingBlobs?limit=500", moved.JWT, nil, "", &missing); err != nil {
		t.Fatalf("listMissingBlobs: %v", err)
	}
	for _, b := range missing.Blobs {
		data, err := old.raw(ctx, "com.atproto.sync.getBlob?did="+url.QueryEscape(a.DID)+"&cid="+url.QueryEscape(b.CID))
		if err != nil {
			t.Fatalf("getBlob %s: %v", b.CID, err)
		}
		if err := nu.call(ctx, http.MethodPost, "com.atproto.repo.uploadBlob", moved.JWT, data, "application/octet-stream", nil); err != nil {
			t.Fatalf("uploadBlob %s: %v", b.CID, err)
		}
	}
	var creds map[string]any
	if err := nu.call(ctx, http.MethodGet, "com.atproto.identity.getRecommendedDidCredentials", moved.JWT, nil, "", &creds); err != nil {
		t.Fatalf("getRecommendedDidCredentials: %v", err)
	}
	if err := old.call(ctx, http.MethodPost, "com.atproto.identity.requestPlcOperationSignature", a.JWT, nil, "", nil); err != nil {
		t.Fatalf("requestPlcOperationSignature: %v", err)
	}
	creds["token"] = emailToken(t, oldDir, a.DID, "plc_operation")
	var signed struct {
		Operation json.RawMessage `json:"operation"`
	}
	if err := old.call(ctx, http.MethodPost, "com.atproto.identity.signPlcOperation", a.JWT, creds, "", &signed); err != nil {
		t.Fatalf("signPlcOperation: %v", err)
	}
	if err := nu.call(ctx, http.MethodPost, "com.atproto.identity.submitPlcOperation", moved.JWT, map[string]any{"operation": signed.Operation}, "", nil); err != nil {
		t.Fatalf("submitPlcOperation: %v", err)
	}
	return moved
}

// raw GETs an XRPC query's undecoded answer.
func (c *pdsClient) raw(ctx context.Context, nsidAndQuery string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/xrpc/"+nsidAndQuery, nil)
	if err != nil {
		return nil, err
	}
	if c.bypass != "" {
		req.Header.Set("x-ratelimit-bypass", c.bypass)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if resp.StatusCode/100 != 2 {
		return nil, &xrpcErr{Status: resp.StatusCode, Body: string(b)}
	}
	return b, err
}

// handleProxy answers /.well-known/atproto-did for the handles of either
// PDS (the appview's identity.handle_well_known_url is one URL; an account
// moves between the two).
func handleProxy(t *testing.T, pdses ...string) string {
	client := &http.Client{Timeout: 5 * time.Second}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, base := range pdses {
			req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, base+"/.well-known/atproto-did", nil)
			req.Host = r.Host
			resp, err := client.Do(req)
			if err != nil {
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				_, _ = w.Write(b)
				return
			}
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// shown is what readers of an index see of some accounts, one string per
// account: the rows of the tables `queries` reads whose owner it is, and
// its users row (handle), when the account is active; "hidden" when it is
// not active or has no row (nothing of an inactive account is visible).
func shown(db *sql.DB, dids []string) (map[string]string, error) {
	all, err := readRows(db)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, did := range dids {
		var handle string
		var active int
		err := db.QueryRow(`SELECT handle, active FROM users WHERE did = ?1`, did).Scan(&handle, &active)
		if err == sql.ErrNoRows || err == nil && active == 0 {
			out[did] = did + " hidden"
			continue
		}
		if err != nil {
			return nil, err
		}
		lines := []string{did + " visible " + handle}
		for table, list := range all {
			for _, row := range list {
				if strings.HasPrefix(row, did+"|") {
					lines = append(lines, table+" "+row)
				}
			}
		}
		sort.Strings(lines)
		out[did] = strings.Join(lines, "\n")
	}
	return out, nil
}

// watch samples what some indexes show of some accounts (shown), every
// 100 ms, keeping when each account's state changed on each index.
type watch struct {
	mu   sync.Mutex
	seen map[string]map[string][]sample // index → DID → transitions
}

type sample struct {
	at    time.Time
	state string
}

func startWatch(ctx context.Context, dbs map[string]*sql.DB, dids []string) *watch {
	w := &watch{seen: map[string]map[string][]sample{}}
	for id, db := range dbs {
		w.seen[id] = map[string][]sample{}
		go func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				at := time.Now()
				if states, err := shown(db, dids); err == nil {
					w.mu.Lock()
					for did, st := range states {
						h := w.seen[id][did]
						if len(h) == 0 || h[len(h)-1].state != st {
							w.seen[id][did] = append(h, sample{at, st})
						}
					}
					w.mu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	return w
}

// settled returns when index id last came to show want for did, if that
// is what it shows now.
func (w *watch) settled(id, did, want string) (time.Time, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.seen[id][did]
	if len(h) == 0 {
		return time.Time{}, fmt.Errorf("%s: nothing sampled yet", id)
	}
	if last := h[len(h)-1]; last.state != want {
		return time.Time{}, diff(last.state, want)
	}
	return h[len(h)-1].at, nil
}

// diff says how got differs from want, line by line.
func diff(got, want string) error {
	g, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	in := func(l string, list []string) bool {
		for _, x := range list {
			if x == l {
				return true
			}
		}
		return false
	}
	var out []string
	for _, l := range g {
		if !in(l, wl) {
			out = append(out, "+ "+l)
		}
	}
	for _, l := range wl {
		if !in(l, g) {
			out = append(out, "- "+l)
		}
	}
	sort.Strings(out)
	return fmt.Errorf("index differs from what the PDS serves (+ extra, - missing):\n%s", strings.Join(out, "\n"))
}

// served is what the PDS serves of a, in shown's form: the records of an
// active account as readRows would hold them, "hidden" for another.
func served(t *testing.T, pds *pdsClient, a *account, active bool) string {
	t.Helper()
	if !active {
		return a.DID + " hidden"
	}
	lines := []string{a.DID + " visible " + a.Handle}
	for table, list := range expectedRows(t, pds, []*account{a}) {
		for _, row := range list {
			lines = append(lines, table+" "+row)
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// starCount is repository_stats.star_count of (owner, repo) (0: no row).
func starCount(db *sql.DB, owner, repo string) int {
	var n int
	_ = db.QueryRow(`SELECT star_count FROM repository_stats WHERE did = ?1 AND repository = ?2`, owner, repo).Scan(&n)
	return n
}
