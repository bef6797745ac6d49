package backfill

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// Bluesky's relay (indigo cmd/relay) answers 404 to
// listReposByCollection; on the old code the backfill marked every
// collection unlisted and indexed nothing. It now lists every repository
// with listRepos, skips the inactive ones, asks each PDS once which
// collections a repository has, and lists only those.
func TestARelayWithoutListReposByCollectionIsWalkedWithListRepos(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewListReposRelay(t)
	pds := e.pds(3, "did:plc:a", "did:plc:b", "did:plc:c")
	tagsOnly := testsupport.NewPDS(t)
	e.plc.Register("did:plc:tags", tagsOnly.URL())
	tagsOnly.Put("did:plc:tags", colTag, records(2)...)
	e.plc.Register("did:plc:gone", pds.URL())
	relay.Add("did:plc:a", "did:plc:b", "did:plc:c", "did:plc:tags")
	relay.AddStatus("did:plc:gone", false, "deactivated")

	o := e.options(relay.URL())
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	e.noDuplicates()
	// a, b, c: 3 manifests and 3 tags each; tags: 2 tags.
	if got := e.count(`SELECT COUNT(*) FROM backfilled WHERE collection = ?1`, colManifest); got != 9 {
		t.Errorf("%d manifests, want 9", got)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled WHERE collection = ?1`, colTag); got != 11 {
		t.Errorf("%d tags, want 11", got)
	}
	if n := tagsOnly.Count("did:plc:tags", colManifest); n != 0 {
		t.Errorf("listed manifests of a repository without any %d times", n)
	}
	describes := 0
	for _, req := range append(pds.Requests(), tagsOnly.Requests()...) {
		if req.Method == methodDescribeRepo {
			describes++
			if req.Repo == "did:plc:gone" {
				t.Errorf("asked the PDS about a deactivated repository")
			}
		}
	}
	if describes != 4 {
		t.Errorf("%d describeRepo calls, want 4 (once per active repository per run)", describes)
	}
	// The repository skipped as inactive is noted: its reactivation makes
	// the consumer re-read it (docs/interop.md, "Account lifecycle").
	if n := e.count(`SELECT COUNT(*) FROM repo_incomplete WHERE did = 'did:plc:gone' AND reason = 'backfill-inactive'`); n != 1 {
		t.Errorf("repo_incomplete notes of the skipped repository: %d, want 1", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM repo_incomplete`); n != 1 {
		t.Errorf("%d repo_incomplete rows, want only the inactive repository's", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed'`); n != 0 {
		t.Errorf("%d repositories failed", n)
	}
	// Page size 2 over 5 repositories: the checkpointed relay cursor of an
	// unfinished collection would be a listRepos cursor; the finished ones
	// are marked done.
	if n := e.count(`SELECT COUNT(*) FROM backfill_collections WHERE done = 1`); n != 2 {
		t.Errorf("%d collections done, want 2", n)
	}
}

func TestAResumedFallbackWalkGoesOnWithListRepos(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewListReposRelay(t)
	e.pds(1, "did:plc:a", "did:plc:b", "did:plc:c")
	relay.Add("did:plc:a", "did:plc:b", "did:plc:c")
	o := e.options(relay.URL())
	o.Collections = []string{colManifest}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cursors := 0
	e.afterWrite = func(what string) {
		// The first relay_cursor write records the relay chosen; the
		// second is the cursor after the first listRepos page.
		if what == "relay_cursor" {
			if cursors++; cursors == 2 {
				cancel()
			}
		}
	}
	_ = e.backfiller(o).Run(ctx, e.acquire("instance-a"))
	var cursor string
	if err := e.db.QueryRow(`SELECT relay_cursor FROM backfill_collections WHERE collection = ?1`, colManifest).Scan(&cursor); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cursor, listReposCursorPrefix) {
		t.Fatalf("checkpointed cursor %q, want a %s cursor", cursor, listReposCursorPrefix)
	}
	e.afterWrite = nil
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-b")); err != nil {
		t.Fatal(err)
	}
	e.noDuplicates()
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 3 {
		t.Errorf("%d records after the resumed run, want 3", got)
	}
	for _, req := range relay.Requests() {
		if req.Method != methodListAllRepos {
			t.Errorf("resumed run called %s on the relay", req.Method)
		}
	}
}

// The reference PDS answers describeRepo only when it can resolve the
// repository's DID and handle itself; on the real chain it refused with
// 400 InvalidRequest "Could not resolve DID: Error: Invalid hostname", and
// the fallback marked every repository failed. Such a refusal now means
// "collections unknown": every collection is listed.
func TestADescribeRepoThePDSCannotAnswerListsEveryCollection(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewListReposRelay(t)
	pds := e.pds(2, "did:plc:a")
	gone := testsupport.NewPDS(t)
	e.plc.Register("did:plc:gone", gone.URL())
	relay.Add("did:plc:a", "did:plc:gone")
	refuse := func(w http.ResponseWriter, _ *http.Request, req testsupport.Request) bool {
		if req.Method == methodDescribeRepo && req.Repo == "did:plc:a" {
			testsupport.XRPCError(w, http.StatusBadRequest, "InvalidRequest", "Could not resolve DID: Error: Invalid hostname")
			return true
		}
		return false
	}
	pds.Intercept(refuse)
	if err := e.backfiller(e.options(relay.URL())).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled WHERE did = 'did:plc:a'`); got != 4 {
		t.Errorf("%d records of the repository whose describeRepo failed, want 4", got)
	}
	// A repository its PDS does not host still fails.
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed' AND did = 'did:plc:gone'`); n != 2 {
		t.Errorf("%d failed (collection, repo) pairs for a repository the PDS does not host, want 2", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed' AND did = 'did:plc:a'`); n != 0 {
		t.Errorf("%d failed for did:plc:a", n)
	}
}

// A relay may list a repository whose account was deactivated since: the
// PDS refuses it (400 RepoDeactivated). That is not a failure: the
// repository is done with no records, as the decided state for inactive
// accounts says (docs/interop.md); on the old code it was marked failed.
//
// The reference PDS answers listRecords for such an account (deactivated,
// taken down or deleted) with 400 InvalidRequest "Could not find repo":
// only describeRepo names the state. That is done too.
func TestARepositoryThePDSRefusesAsInactiveIsDoneNotFailed(t *testing.T) {
	e := newEnv(t)
	relay := testsupport.NewRelay(t)
	pds := e.pds(1, "did:plc:a", "did:plc:off", "did:plc:gone")
	relay.Add(colManifest, "did:plc:a", "did:plc:off", "did:plc:gone")
	pds.Intercept(func(w http.ResponseWriter, _ *http.Request, req testsupport.Request) bool {
		switch req.Repo {
		case "did:plc:off":
			testsupport.XRPCError(w, http.StatusBadRequest, "RepoDeactivated", "Repo has been deactivated: did:plc:off")
			return true
		case "did:plc:gone":
			testsupport.XRPCError(w, http.StatusBadRequest, "InvalidRequest", "Could not find repo: did:plc:gone")
			return true
		}
		return false
	})
	o := e.options(relay.URL())
	o.Collections = []string{colManifest}
	if err := e.backfiller(o).Run(context.Background(), e.acquire("instance-a")); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'failed'`); n != 0 {
		t.Errorf("%d repositories failed", n)
	}
	if n := e.count(`SELECT COUNT(*) FROM backfill_repos WHERE state = 'done' AND did IN ('did:plc:off', 'did:plc:gone')`); n != 2 {
		t.Errorf("%d of the 2 inactive repositories checkpointed done", n)
	}
	if got := e.count(`SELECT COUNT(*) FROM backfilled`); got != 1 {
		t.Errorf("%d records, want did:plc:a's 1", got)
	}
	if n := e.count(`SELECT COUNT(*) FROM repo_incomplete WHERE reason = 'backfill-inactive' AND did IN ('did:plc:off', 'did:plc:gone')`); n != 2 {
		t.Errorf("%d of the 2 inactive repositories noted in repo_incomplete", n)
	}
}
