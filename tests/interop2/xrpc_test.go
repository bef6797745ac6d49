//go:build interop2

package interop2

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// pdsClient talks to the reference PDS with its real XRPC API.
type pdsClient struct {
	base   string
	bypass string // x-ratelimit-bypass: the suite's own writes skip the limits it sets for the backfill
	http   *http.Client
}

// account is one account created on the PDS.
type account struct {
	DID, Handle, JWT string
}

type xrpcErr struct {
	Status int
	Body   string
}

func (e *xrpcErr) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

func (c *pdsClient) call(ctx context.Context, method, nsid, jwt string, in any, ctype string, out any) error {
	var body io.Reader
	if in != nil {
		switch v := in.(type) {
		case []byte:
			body = bytes.NewReader(v)
		default:
			b, err := json.Marshal(v)
			if err != nil {
				return err
			}
			body = bytes.NewReader(b)
			ctype = "application/json"
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+"/xrpc/"+nsid, body)
	if err != nil {
		return err
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	switch {
	case strings.HasPrefix(jwt, "Basic "): // the PDS's admin password (adminAuth)
		req.Header.Set("Authorization", jwt)
	case jwt != "":
		req.Header.Set("Authorization", "Bearer "+jwt)
	}
	if c.bypass != "" {
		req.Header.Set("x-ratelimit-bypass", c.bypass)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", nsid, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %w", nsid, &xrpcErr{Status: resp.StatusCode, Body: string(b)})
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

func (c *pdsClient) createAccount(t *testing.T, handle string) *account {
	t.Helper()
	var out struct {
		DID       string `json:"did"`
		Handle    string `json:"handle"`
		AccessJwt string `json:"accessJwt"`
	}
	err := c.call(context.Background(), http.MethodPost, "com.atproto.server.createAccount", "", map[string]any{
		"handle": handle, "email": strings.ReplaceAll(handle, ".", "-") + "@example.test", "password": "pw-" + handle,
	}, "", &out)
	if err != nil {
		t.Fatalf("create account %s: %v", handle, err)
	}
	return &account{DID: out.DID, Handle: out.Handle, JWT: out.AccessJwt}
}

// blob uploads data and returns the blob reference the PDS made of it.
func (c *pdsClient) uploadBlob(t *testing.T, a *account, data []byte, mime string) map[string]any {
	t.Helper()
	var out struct {
		Blob map[string]any `json:"blob"`
	}
	if err := c.call(context.Background(), http.MethodPost, "com.atproto.repo.uploadBlob", a.JWT, data, mime, &out); err != nil {
		t.Fatalf("uploadBlob: %v", err)
	}
	return out.Blob
}

// create writes a record (rkey "" lets the PDS choose a TID) with
// validate:false, as io.atcr.* lexicons are unknown to the PDS.
func (c *pdsClient) create(t *testing.T, a *account, col, rkey string, rec map[string]any) string {
	t.Helper()
	rec["$type"] = col
	in := map[string]any{"repo": a.DID, "collection": col, "record": rec, "validate": false}
	if rkey != "" {
		in["rkey"] = rkey
	}
	var out struct {
		URI string `json:"uri"`
	}
	if err := c.call(context.Background(), http.MethodPost, "com.atproto.repo.createRecord", a.JWT, in, "", &out); err != nil {
		t.Fatalf("createRecord %s: %v", col, err)
	}
	return out.URI
}

func (c *pdsClient) put(t *testing.T, a *account, col, rkey string, rec map[string]any) {
	t.Helper()
	rec["$type"] = col
	in := map[string]any{"repo": a.DID, "collection": col, "rkey": rkey, "record": rec, "validate": false}
	if err := c.call(context.Background(), http.MethodPost, "com.atproto.repo.putRecord", a.JWT, in, "", nil); err != nil {
		t.Fatalf("putRecord %s/%s: %v", col, rkey, err)
	}
}

func (c *pdsClient) delete(t *testing.T, a *account, col, rkey string) {
	t.Helper()
	in := map[string]any{"repo": a.DID, "collection": col, "rkey": rkey}
	if err := c.call(context.Background(), http.MethodPost, "com.atproto.repo.deleteRecord", a.JWT, in, "", nil); err != nil {
		t.Fatalf("deleteRecord %s/%s: %v", col, rkey, err)
	}
}

// record is one listRecords entry.
type record struct {
	URI   string          `json:"uri"`
	CID   string          `json:"cid"`
	Value json.RawMessage `json:"value"`
}

// list reads every record of col in a's repository back from the PDS.
func (c *pdsClient) list(t *testing.T, did, col string) []record {
	t.Helper()
	var all []record
	cursor := ""
	for {
		q := url.Values{"repo": {did}, "collection": {col}, "limit": {"100"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Records []record `json:"records"`
			Cursor  string   `json:"cursor"`
		}
		if err := c.call(context.Background(), http.MethodGet, "com.atproto.repo.listRecords?"+q.Encode(), "", nil, "", &page); err != nil {
			t.Fatalf("listRecords %s %s: %v", did, col, err)
		}
		all = append(all, page.Records...)
		if page.Cursor == "" || len(page.Records) == 0 {
			return all
		}
		cursor = page.Cursor
	}
}

// poll calls f until it returns nil or timeout passes, returning its last error.
func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		<-tick.C
	}
}
