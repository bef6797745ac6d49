package labeler

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/testsupport"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/fxamacker/cbor/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/system"
)

// goodSubscribeURLs are labeler.url values and the endpoint each is dialled at.
var goodSubscribeURLs = map[string]string{
	"https://mod.example.com":  "wss://mod.example.com/xrpc/com.atproto.label.subscribeLabels",
	"https://mod.example.com/": "wss://mod.example.com/xrpc/com.atproto.label.subscribeLabels",
	"http://127.0.0.1:8080":    "ws://127.0.0.1:8080/xrpc/com.atproto.label.subscribeLabels",
	"wss://mod.example.com":    "wss://mod.example.com/xrpc/com.atproto.label.subscribeLabels",
	"wss://mod.example.com/xrpc/com.atproto.label.subscribeLabels?cursor=5#f": "wss://mod.example.com/xrpc/com.atproto.label.subscribeLabels",
	"https://mod.example.com/xrpc/com.atproto.label.subscribeLabels/":         "wss://mod.example.com/xrpc/com.atproto.label.subscribeLabels",
	"ws://127.0.0.1:7700/mod/xrpc/com.atproto.label.subscribeLabels":          "ws://127.0.0.1:7700/mod/xrpc/com.atproto.label.subscribeLabels",
}

// badSubscribeURLs are labeler.url values refused. A path that is not the
// XRPC endpoint is a mistake: dialled as given, it answers 404 forever.
var badSubscribeURLs = []string{"ftp://mod.example.com", "https://", "mod.example.com", "::",
	"ws://127.0.0.1:7700/labeler", "wss://mod.example.com/custom", "https://mod.example.com/xrpc",
	"wss://mod.example.com/xrpc/com.atproto.label.subscribeLabels/extra",
	"https://user:secret@mod.example.com", "wss://user@mod.example.com",
	"ftp://user:secret@mod.example.com", "//user:secret@mod.example.com", "https://user:sec ret@mod.example.com"}

func TestSubscribeURLTurnsTheConfiguredURLIntoTheXRPCWebsocket(t *testing.T) {
	for in, want := range goodSubscribeURLs {
		got, err := SubscribeURL(in)
		if err != nil || got != want {
			t.Errorf("SubscribeURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range badSubscribeURLs {
		if got, err := SubscribeURL(bad); err == nil {
			t.Errorf("SubscribeURL(%q) = %q, want an error", bad, got)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("SubscribeURL(%q): the error %q shows the password", bad, err)
		}
	}
}

// The configuration refuses every labeler.url the worker would: `config
// check` refuses what `serve` does, without building the worker.
func TestTheConfigurationRefusesTheLabelerURLsTheWorkerRefuses(t *testing.T) {
	valid := func(u string) error {
		cfg := config.Default()
		cfg.Labeler.URL = u
		return cfg.Validate()
	}
	for u := range goodSubscribeURLs {
		if err := valid(u); err != nil {
			t.Errorf("labeler.url %q: %v, but the worker takes it", u, err)
		}
	}
	for _, u := range badSubscribeURLs {
		var ce *config.Error
		if err := valid(u); !errors.As(err, &ce) || ce.Key != "labeler.url" {
			t.Errorf("labeler.url %q: %v, want a refusal naming labeler.url, as the worker refuses it", u, err)
		}
	}
}

func TestSubjectsMapToAnAccountOrARepository(t *testing.T) {
	db := testsupport.OpenDB(t)
	if _, err := db.Exec(`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at)
VALUES ('did:plc:erin', 'api', 'latest', 'sha256:aa', '3ktag', 0, 0)`); err != nil {
		t.Fatalf("seed tag: %v", err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	ctx := context.Background()
	for uri, want := range map[string]subject{
		"did:plc:bob":                               {did: "did:plc:bob"},
		"did:web:hold01.example.com":                {did: "did:web:hold01.example.com"},
		"at://did:plc:bob":                          {did: "did:plc:bob"},
		"at://did:plc:bob/io.atcr.repo.page/my-app": {did: "did:plc:bob", repo: "my-app", collection: "io.atcr.repo.page", rkey: "my-app"},
		"at://did:plc:erin/io.atcr.tag/3ktag":       {did: "did:plc:erin", repo: "api", collection: "io.atcr.tag", rkey: "3ktag"},
		// Not indexed (yet): kept, to be resolved when it is.
		"at://did:plc:erin/io.atcr.tag/3kmissing": {did: "did:plc:erin", collection: "io.atcr.tag", rkey: "3kmissing", pending: true},
	} {
		got, err := resolveSubject(ctx, tx, uri)
		if err != nil || got != want {
			t.Errorf("resolveSubject(%q) = %+v, %v; want %+v", uri, got, err, want)
		}
	}
	for uri, want := range map[string]error{
		"at://did:plc:erin/app.bsky.feed.post/3k":    errUnsupportedSubject,
		"at://alice.example.com/io.atcr.repo.page/x": errMalformed,
		"at://did:plc:bob/io.atcr.repo.page":         errUnsupportedSubject,
		"at://did:plc:bob/short/stuff":               errMalformed,
		"at://did:plc:bob/":                          errMalformed,
		"at://did:plc:bob/io.atcr.repo.page/x?y=1":   errMalformed,
		"did:":                errMalformed,
		"https://example.com": errMalformed,
	} {
		if _, err := resolveSubject(ctx, tx, uri); !errors.Is(err, want) {
			t.Errorf("resolveSubject(%q) error = %v, want %v", uri, err, want)
		}
	}
}

func TestWorkerIsDisabledWithoutAURLAndRefusesBadSettings(t *testing.T) {
	d := workers.Deps{Config: config.Default(), DB: testsupport.OpenDB(t), Metrics: prometheus.NewRegistry()}
	if _, err := Worker(d); !errors.Is(err, workers.ErrDisabled) {
		t.Fatalf("Worker without labeler.url: %v, want ErrDisabled", err)
	}

	d.Config.Labeler.URL = "ftp://mod.example.com"
	var cerr *config.Error
	if _, err := Worker(d); !errors.As(err, &cerr) || cerr.Key != "labeler.url" {
		t.Fatalf("Worker with a bad URL: %v, want a config error on labeler.url", err)
	}
	d.Config.Labeler.URL = "ws://127.0.0.1:7700/labeler"
	if _, err := Worker(d); !errors.As(err, &cerr) || cerr.Key != "labeler.url" || !strings.Contains(err.Error(), "/labeler") {
		t.Fatalf("Worker with a path that is not subscribeLabels: %v, want a config error on labeler.url naming the path", err)
	}
	d.Config.Labeler.URL = "https://mod.example.com"
	d.Config.Labeler.StaleTimeout = 0
	if err := d.Config.Validate(); !errors.As(err, &cerr) || cerr.Key != "labeler.stale_timeout" {
		t.Fatalf("Worker with stale_timeout 0: %v, want a config error on labeler.stale_timeout", err)
	}

	d.Config.Labeler.StaleTimeout = time.Minute
	w, err := Worker(d)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != LeaseName || !w.Leased || w.Actor == nil || w.Job != nil {
		t.Fatalf("Worker = %+v, want a leased actor worker named %s", w, LeaseName)
	}
	if err := new(system.Registry).Register(w); err != nil {
		t.Fatalf("the registry refuses the worker: %v", err)
	}
	if _, err := Worker(d); err == nil {
		t.Fatal("a second Worker on the same metrics registry did not report the duplicate collectors")
	}
}

// A label's keys name its fields exactly: the CBOR library's default
// falls back to a case-insensitive match, so a label carrying "VAL" and
// no "val" was read as one with that value.
func TestLabelKeysAreMatchedExactly(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{"ver": 1, "src": "did:plc:labeler", "uri": "did:plc:alice", "val": "!takedown", "cts": "2026-01-01T00:00:00Z"}
	}
	enc := func(m map[string]any) cbor.RawMessage {
		b, err := cbor.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if l, err := decodeLabel(enc(base())); err != nil || l.Val != "!takedown" {
		t.Fatalf("the base label: %+v, %v", l, err)
	}
	upper := base()
	delete(upper, "val")
	upper["VAL"] = "!takedown"
	if l, err := decodeLabel(enc(upper)); !errors.Is(err, errMalformed) {
		t.Errorf("a label with VAL and no val decoded as %+v (%v), want malformed (no val)", l, err)
	}
	both := base()
	both["Val"] = "other"
	if l, err := decodeLabel(enc(both)); err != nil || l.Val != "!takedown" {
		t.Errorf("a label with val and Val: %+v, %v; want val's value", l, err)
	}
}
