package webhooks

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/atcr-io/appview/internal/config"
)

func TestPushPayloadCarriesHandleTagStatsAndHold(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	const digest = "sha256:abc"
	seed := []string{
		`INSERT INTO users (did, handle, updated_at) VALUES ('` + testOwner + `', 'alice.example.com', 0)`,
		`INSERT INTO manifests (did, repository, digest, rkey, hold_did, hold_endpoint, media_type, schema_version, created_at, indexed_at)
		 VALUES ('` + testOwner + `', 'tools/app', '` + digest + `', 'r1', 'did:web:hold01.example.com', 'https://hold01.example.com:8443',
		         'application/vnd.oci.image.index.v1+json', 2, 0, 0)`,
		`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at)
		 VALUES ('` + testOwner + `', 'tools/app', 'old', '` + digest + `', 't1', 0, 1),
		        ('` + testOwner + `', 'tools/app', 'latest', '` + digest + `', 't2', 0, 2),
		        ('` + testOwner + `', 'tools/app', 'other', 'sha256:zzz', 't3', 0, 3)`,
		`INSERT INTO repository_stats (did, repository, pull_count, star_count, updated_at) VALUES ('` + testOwner + `', 'tools/app', 42, 7, 0)`,
	}
	for _, q := range seed {
		if _, err := e.db.Exec(q); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("tools/app", digest)
	p.MediaType = "" // taken from the manifest row
	e.enqueue(e.custody, p)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true, PublicURL: "https://registry.example/"}, nil))
	e.waitStatus(hook, p.EventKey, "delivered")

	var got PushPayload
	if err := json.Unmarshal(rc.requests()[0].Body, &got); err != nil {
		t.Fatal(err)
	}
	want := PushPayload{
		Trigger: "push",
		PushData: PushData{
			PushedAt:  1_700_000_000,
			Pusher:    "alice.example.com",
			PusherDID: testOwner,
			Tag:       "latest",
			Digest:    digest,
		},
		Repository: RepositoryInfo{
			Name:      "tools/app",
			Namespace: "alice.example.com",
			RepoName:  "alice.example.com/tools/app",
			RepoURL:   "https://registry.example/r/alice.example.com/tools/app",
			MediaType: "application/vnd.oci.image.index.v1+json",
			StarCount: 7,
			PullCount: 42,
		},
		Hold: HoldInfo{DID: "did:web:hold01.example.com", Endpoint: "https://hold01.example.com:8443"},
	}
	if got != want {
		t.Fatalf("payload\n got %+v\nwant %+v", got, want)
	}
}

func TestPushPayloadFallsBackToDIDAndDerivedHoldEndpoint(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	rc := newReceiver(t, func(*http.Request, int) int { return http.StatusAccepted })
	hook := e.addWebhook(rc.srv.URL, "")
	p := push("app", "sha256:aaa")
	p.HoldDID = "did:web:hold02.example.com%3A8443"
	e.enqueue(e.custody, p)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil))
	e.waitStatus(hook, p.EventKey, "delivered")

	var got PushPayload
	if err := json.Unmarshal(rc.requests()[0].Body, &got); err != nil {
		t.Fatal(err)
	}
	if got.PushData.Pusher != testOwner || got.Repository.Namespace != testOwner ||
		got.Repository.RepoURL != "https://atcr.io/r/"+testOwner+"/app" || got.PushData.Tag != "" ||
		got.Repository.MediaType != p.MediaType || got.Repository.StarCount != 0 ||
		got.Hold.Endpoint != "https://hold02.example.com:8443" {
		t.Fatalf("payload without users/tags/stats rows = %+v", got)
	}
}

func TestPushWithDateLikeTagRepositoryAndSecretDeliversThemExactly(t *testing.T) {
	leakCheck(t)
	e := newEnv(t)
	// go-libsql returns TEXT that parses as a date as a time.Time; each of
	// these would come back as 2024-06-01T00:00:00Z through a plain read.
	const (
		repo   = "2024-06-01"
		tag    = "2024-06-01"
		secret = "2024-06-01"
		digest = "sha256:abc"
	)
	seed := []string{
		`INSERT INTO manifests (did, repository, digest, rkey, media_type, schema_version, created_at, indexed_at)
		 VALUES ('` + testOwner + `', '` + repo + `', '` + digest + `', 'r1', 'application/vnd.oci.image.manifest.v1+json', 2, 0, 0)`,
		`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at)
		 VALUES ('` + testOwner + `', '` + repo + `', '` + tag + `', '` + digest + `', 't1', 0, 1)`,
	}
	for _, q := range seed {
		if _, err := e.db.Exec(q); err != nil {
			t.Fatalf("seed: %v", err)
		}
	}
	rc := newReceiver(t, nil)
	hook := e.addWebhook(rc.srv.URL, secret)
	p := push(repo, digest)
	e.enqueue(e.custody, p)
	e.spawn(e.options(e.custody, config.Webhooks{AllowPrivate: true}, nil))
	e.waitStatus(hook, p.EventKey, "delivered")

	r := rc.requests()[0]
	var got PushPayload
	if err := json.Unmarshal(r.Body, &got); err != nil {
		t.Fatal(err)
	}
	if got.PushData.Tag != tag || got.Repository.Name != repo {
		t.Fatalf("push_data.tag = %q, repository.name = %q; want %q and %q exactly", got.PushData.Tag, got.Repository.Name, tag, repo)
	}
	if sig := r.Header.Get(HeaderSignature); sig != Signature(secret, r.Body) {
		t.Fatalf("signature %q was not made with the stored secret %q", sig, secret)
	}
}
