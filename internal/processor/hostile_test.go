package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/testsupport"
)

// hostileStats is an io.atcr.hold.stats event as the tester sent it: raw
// JSON, so counts beyond float64's precision arrive exactly.
func hostileStats(hold string, us int64, rkey, owner, repo string, pull, push int64) jetstream.Event {
	rec := fmt.Sprintf(`{"$type":"io.atcr.hold.stats","ownerDid":%q,"repository":%q,"pullCount":%d,"pushCount":%d,"updatedAt":"2025-06-15T15:06:39.345Z"}`,
		owner, repo, pull, push)
	return jetstream.Event{DID: hold, TimeUS: us, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
		Rev: "3lrnqkdzhdqi2", Operation: "create", Collection: processor.CollectionStats, RKey: rkey, Record: json.RawMessage(rec)}}
}

func TestTwoHoldsReportingTheLargestInt64PullCountAreSkippedAndTheBatchLands(t *testing.T) {
	db := testsupport.OpenDB(t)
	const maxInt64 = 1<<63 - 1
	events := []jetstream.Event{
		hostileStats("did:web:holdA.example", 1750000000000100, "aaaa", "did:plc:victim", "app", maxInt64, 5),
		hostileStats("did:web:holdB.example", 1750000000000200, "bbbb", "did:plc:victim", "app", maxInt64, 5),
		hostileStats("did:web:holdA.example", 1750000000000300, "cccc", "did:plc:victim", "other", 7, 1),
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db, acquire(t, db, "jetstream-consumer", "me"), events)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if res.Skipped[processor.ReasonBadValue] != 2 || res.Applied != 1 {
		t.Fatalf("result %+v: want the two out-of-range records skipped as bad_value and the third applied", res)
	}
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM repository_hold_stats WHERE repository = 'app'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d hold stats rows for the hostile repository (%v), want none", n, err)
	}
}

func TestCountsAreValidUpToTheSafeIntegerLimitAndNotBeyond(t *testing.T) {
	db := testsupport.OpenDB(t)
	events := []jetstream.Event{
		hostileStats("did:web:h1.example", 1, "a", "did:plc:o", "at-limit", processor.MaxSafeInteger, 0),
		hostileStats("did:web:h1.example", 2, "b", "did:plc:o", "pull-over", processor.MaxSafeInteger+1, 0),
		hostileStats("did:web:h1.example", 3, "c", "did:plc:o", "push-over", 0, processor.MaxSafeInteger+1),
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db, unfenced, events)
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 1 || res.Skipped[processor.ReasonBadValue] != 2 {
		t.Fatalf("result %+v: want the count at 2^53-1 applied and the two above it skipped", res)
	}
}

func TestTheRepositoryAggregateSaturatesAtTheSafeIntegerLimitInsteadOfOverflowing(t *testing.T) {
	db := testsupport.OpenDB(t)
	// 1100 holds at the limit sum past int64 (2^63 / 2^53 = 1024).
	var events []jetstream.Event
	for i := range 1100 {
		events = append(events, hostileStats(fmt.Sprintf("did:web:h%04d.example", i), int64(i+1), "rk",
			"did:plc:o", "app", processor.MaxSafeInteger, 1))
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	c := acquire(t, db, "jetstream-consumer", "me")
	res, err := p.Apply(context.Background(), db, c, events)
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if res.Applied != len(events) {
		t.Fatalf("result %+v: want every valid record applied", res)
	}
	var pull, push int64
	if err := db.QueryRow(`SELECT pull_count, push_count FROM repository_stats WHERE did = 'did:plc:o' AND repository = 'app'`).
		Scan(&pull, &push); err != nil {
		t.Fatal(err)
	}
	if pull != processor.MaxSafeInteger || push != 1100 {
		t.Fatalf("aggregate pull %d push %d, want pull saturated at %d and push the exact sum 1100", pull, push, int64(processor.MaxSafeInteger))
	}
}

func TestRowsStoredBeforeTheRangeCheckCannotOverflowTheAggregate(t *testing.T) {
	db := testsupport.OpenDB(t)
	// What an older version let in: two holds near the top of int64.
	for _, hold := range []string{"did:web:a.example", "did:web:b.example"} {
		if _, err := db.Exec(`INSERT INTO repository_hold_stats (did, repository, hold_did, rkey, pull_count, push_count, updated_at, source_us)
VALUES ('did:plc:o', 'app', ?, 'rk', 9223372036854775807, 3, 1, 1)`, hold); err != nil {
			t.Fatal(err)
		}
	}
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	// A third hold's report recomputes the aggregate over all three rows.
	if _, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{
		hostileStats("did:web:c.example", 10, "rk", "did:plc:o", "app", 1, 1),
	}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	var pull, push int64
	if err := db.QueryRow(`SELECT pull_count, push_count FROM repository_stats WHERE did = 'did:plc:o'`).Scan(&pull, &push); err != nil {
		t.Fatal(err)
	}
	if pull != processor.MaxSafeInteger || push != 7 {
		t.Fatalf("aggregate pull %d push %d, want %d and 7", pull, push, int64(processor.MaxSafeInteger))
	}
}

func TestSaturatingAddCapsAtTheSafeIntegerLimit(t *testing.T) {
	for _, c := range []struct{ a, b, want int64 }{
		{1, 2, 3},
		{processor.MaxSafeInteger - 1, 1, processor.MaxSafeInteger},
		{processor.MaxSafeInteger, 1, processor.MaxSafeInteger},
		{processor.MaxSafeInteger, processor.MaxSafeInteger, processor.MaxSafeInteger},
	} {
		if got := processor.SaturatingAdd(c.a, c.b); got != c.want {
			t.Errorf("SaturatingAdd(%d, %d) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestKeyFieldsWithANulOrInvalidUTF8AreSkippedAsBadValue(t *testing.T) {
	const alice = "did:plc:alice"
	manifest := func(repo, digest string) map[string]any {
		return map[string]any{"repository": repo, "digest": digest, "mediaType": "x", "schemaVersion": 2,
			"createdAt": "2026-01-01T00:00:00Z", "holdDid": "did:web:hold.example"}
	}
	stats := func(owner, repo string) map[string]any {
		return map[string]any{"ownerDid": owner, "repository": repo, "pullCount": 1, "pushCount": 1, "updatedAt": "2026-01-01T00:00:00Z"}
	}
	cases := map[string]jetstream.Event{
		"manifest repository with NUL":  commit(alice, 1, "create", processor.CollectionManifest, "m1", manifest("a\x00b", "sha256:1")),
		"manifest digest with NUL":      commit(alice, 1, "create", processor.CollectionManifest, "m1", manifest("app", "sha256:\x00")),
		"layer digest with NUL":         commit(alice, 1, "create", processor.CollectionManifest, "m1", mergeMap(manifest("app", "sha256:1"), map[string]any{"layers": []any{map[string]any{"digest": "sha\x00", "size": 1, "mediaType": "x"}}})),
		"layer size beyond 2^53-1":      commit(alice, 1, "create", processor.CollectionManifest, "m1", mergeMap(manifest("app", "sha256:1"), map[string]any{"layers": []any{map[string]any{"digest": "sha256:2", "size": int64(processor.MaxSafeInteger) + 1, "mediaType": "x"}}})),
		"tag name with NUL":             commit(alice, 1, "create", processor.CollectionTag, "t1", tagRecord("app", "v1\x00", "sha256:1")),
		"tag repository with NUL":       commit(alice, 1, "create", processor.CollectionTag, "t1", tagRecord("\x00", "v1", "sha256:1")),
		"tag manifestDigest with NUL":   commit(alice, 1, "create", processor.CollectionTag, "t1", tagRecord("app", "v1", "sha256:\x00")),
		"tag manifest at-uri rkey NUL":  commit(alice, 1, "create", processor.CollectionTag, "t1", map[string]any{"repository": "app", "tag": "v1", "manifest": "at://" + alice + "/io.atcr.manifest/m\x00"}),
		"stats repository with NUL":     commit("did:web:hold.example", 1, "create", processor.CollectionStats, "s1", stats(alice, "app\x00")),
		"stats owner DID with NUL":      commit("did:web:hold.example", 1, "create", processor.CollectionStats, "s1", stats("did:plc:a\x00", "app")),
		"star subject repository NUL":   commit(alice, 1, "create", processor.CollectionStar, "s1", map[string]any{"subject": map[string]any{"did": alice, "repository": "a\x00"}, "createdAt": "2026-01-01T00:00:00Z"}),
		"repo page repository with NUL": commit(alice, 1, "create", processor.CollectionRepoPage, "app", map[string]any{"repository": "app\x00", "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:00Z"}),
		"crew member DID with NUL":      commit("did:web:hold.example", 1, "create", processor.CollectionCrew, "c1", map[string]any{"member": "did:plc:\x00", "role": "read", "permissions": []string{}, "addedAt": "2026-01-01T00:00:00Z"}),
		"event DID with NUL":            commit("did:plc:al\x00ice", 1, "create", processor.CollectionTag, "t1", tagRecord("app", "v1", "sha256:1")),
		"event DID invalid UTF-8":       commit("did:plc:al\xffice", 1, "create", processor.CollectionTag, "t1", tagRecord("app", "v1", "sha256:1")),
		"rkey with NUL":                 commit(alice, 1, "create", processor.CollectionTag, "t\x001", tagRecord("app", "v1", "sha256:1")),
		"rkey invalid UTF-8":            commit(alice, 1, "create", processor.CollectionTag, "t\xff", tagRecord("app", "v1", "sha256:1")),
		"delete with an rkey NUL":       commit(alice, 1, "delete", processor.CollectionTag, "t\x00", nil),
		"identity DID with NUL":         {DID: "did:plc:\x00", TimeUS: 1, Kind: jetstream.KindIdentity, Identity: &jetstream.Identity{DID: "did:plc:\x00", Handle: "x.example"}},
	}
	for name, ev := range cases {
		t.Run(name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			p := processor.New(processor.Options{Log: zerolog.Nop()})
			res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{ev})
			if err != nil {
				t.Fatal(err)
			}
			if res.Skipped[processor.ReasonBadValue] != 1 {
				t.Fatalf("result %+v: want one bad_value skip", res)
			}
			for _, table := range registryTables {
				if n := countRows(t, db, table); n != 0 {
					t.Errorf("%s has %d rows", table, n)
				}
			}
		})
	}
}

func TestValidKeysWithUnicodeAndRecordKeyPunctuationAreApplied(t *testing.T) {
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{
		commit("did:web:example.com%3A8443", 1, "create", processor.CollectionTag, "a.b_c:d~e-f", tagRecord("café", "v1", "sha256:1")),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != 1 {
		t.Fatalf("result %+v: want the tag applied", res)
	}
	var repo string
	if err := db.QueryRow(`SELECT repository FROM tags`).Scan(&repo); err != nil || repo != "café" {
		t.Fatalf("stored repository %q (%v)", repo, err)
	}
}

func mergeMap(a, b map[string]any) map[string]any {
	for k, v := range b {
		a[k] = v
	}
	return a
}

// rawCommit is a create of rec, the record's JSON exactly as a PDS could
// have written it.
func rawCommit(did string, us int64, collection, rkey, rec string) jetstream.Event {
	return jetstream.Event{DID: did, TimeUS: us, Kind: jetstream.KindCommit, Commit: &jetstream.Commit{
		Rev: "3lrnqkdzhdqi2", Operation: "create", Collection: collection, RKey: rkey, Record: json.RawMessage(rec)}}
}

// Record member names are the lexicon's, exactly and once
// (atproto.com/specs/data-model): encoding/json matched them without
// regard to case and kept the last of duplicates, so a record another
// AppView reads as missing a field, or as something else, was applied
// here as it was not written.
func TestRecordMemberNamesAreMatchedExactlyAndOnlyOnce(t *testing.T) {
	const alice = "did:plc:alice"
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	manifest := `{"$type":"io.atcr.manifest","repository":"app","digest":"` + digest + `","mediaType":"x","schemaVersion":2,"createdAt":"2026-01-01T00:00:00Z","holdDid":"did:web:hold.example"`
	for _, tc := range []struct {
		name   string
		ev     jetstream.Event
		reason string
	}{
		{"a tag whose name is under TAG", rawCommit(alice, 2, processor.CollectionTag, "t1",
			`{"$type":"io.atcr.tag","repository":"app","TAG":"latest","manifestDigest":"`+digest+`","createdAt":"2026-01-01T00:00:00Z"}`), processor.ReasonMissingField},
		{"a tag whose name is twice", rawCommit(alice, 2, processor.CollectionTag, "t1",
			`{"$type":"io.atcr.tag","repository":"app","tag":"latest","tag":"evil","manifestDigest":"`+digest+`","createdAt":"2026-01-01T00:00:00Z"}`), processor.ReasonMalformedRecord},
		{"a manifest whose digest is under Digest", rawCommit(alice, 2, processor.CollectionManifest, "m2",
			`{"$type":"io.atcr.manifest","repository":"app","Digest":"`+digest+`","mediaType":"x","schemaVersion":2,"createdAt":"2026-01-01T00:00:00Z","holdDid":"did:web:hold.example"}`), processor.ReasonMissingField},
		{"a manifest with a layer size twice", rawCommit(alice, 2, processor.CollectionManifest, "m2",
			manifest+`,"layers":[{"digest":"sha256:2","size":1,"size":2,"mediaType":"x"}]}`), processor.ReasonMalformedRecord},
		{"a manifest with an annotation twice", rawCommit(alice, 2, processor.CollectionManifest, "m2",
			manifest+`,"annotations":{"a":"1","a":"2"}}`), processor.ReasonMalformedRecord},
		{"a star whose subject DID is under DID", rawCommit(alice, 2, processor.CollectionStar, "s1",
			`{"$type":"io.atcr.sailor.star","subject":{"DID":"did:plc:bob","repository":"app"},"createdAt":"2026-01-01T00:00:00Z"}`), processor.ReasonMissingField},
		{"hold stats whose owner is under OwnerDid", rawCommit("did:web:hold.example", 2, processor.CollectionStats, "s1",
			`{"$type":"io.atcr.hold.stats","OwnerDid":"did:plc:alice","repository":"app","pullCount":1,"pushCount":1,"updatedAt":"2026-01-01T00:00:00Z"}`), processor.ReasonMissingField},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			p := processor.New(processor.Options{Log: zerolog.Nop()})
			// The first event stores the manifest the tags point at.
			res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest+`}`), tc.ev})
			if err != nil {
				t.Fatal(err)
			}
			if res.Applied != 1 || res.Skipped[tc.reason] != 1 {
				t.Fatalf("result %+v: want the manifest applied and the record skipped as %s", res, tc.reason)
			}
			for table, want := range map[string]int{"manifests": 1, "tags": 0, "stars": 0, "repository_hold_stats": 0, "manifest_layers": 0, "manifest_annotations": 0} {
				if n := countRows(t, db, table); n != want {
					t.Errorf("%s has %d rows, want %d", table, n, want)
				}
			}
		})
	}
	// A case variant beside the exact name is an unknown member: the
	// exact one is what is stored, whichever comes last.
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest+`}`),
		rawCommit(alice, 2, processor.CollectionTag, "t1", `{"$type":"io.atcr.tag","repository":"app","tag":"latest","Tag":"evil","manifestDigest":"`+digest+`","createdAt":"2026-01-01T00:00:00Z"}`)})
	if err != nil || res.Applied != 2 {
		t.Fatalf("apply: %+v, %v: want both applied", res, err)
	}
	var tag string
	if err := db.QueryRow(`SELECT tag FROM tags`).Scan(&tag); err != nil || tag != "latest" {
		t.Fatalf("stored tag %q (%v), want \"latest\"", tag, err)
	}
}

// A record names its own lexicon: one whose $type is another collection's
// NSID is skipped as bad_value (the reference AppView refuses it too);
// one without $type is read as the registry's records are.
func TestARecordWhoseTypeIsAnotherCollectionIsSkipped(t *testing.T) {
	const alice = "did:plc:alice"
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	manifest := `"repository":"app","digest":"` + digest + `","mediaType":"x","schemaVersion":2,"createdAt":"2026-01-01T00:00:00Z","holdDid":"did:web:hold.example"}`
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{
		rawCommit(alice, 1, processor.CollectionManifest, "m1", `{"$type":"io.atcr.manifest",`+manifest),
		rawCommit(alice, 2, processor.CollectionManifest, "m2", `{`+manifest),
		rawCommit(alice, 3, processor.CollectionManifest, "m3", `{"$type":"io.atcr.tag",`+manifest),
		rawCommit(alice, 4, processor.CollectionTag, "t1", `{"$type":"io.atcr.manifest","repository":"app","tag":"latest","manifestDigest":"`+digest+`"}`),
		rawCommit(alice, 5, processor.CollectionTag, "t2", `{"$type":"IO.ATCR.TAG","repository":"app","tag":"v2","manifestDigest":"`+digest+`"}`),
		rawCommit(alice, 6, processor.CollectionTag, "t3", `{"$type":"io.atcr.tag","repository":"app","tag":"v3","manifestDigest":"`+digest+`"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied+res.Unchanged != 3 || res.Skipped[processor.ReasonBadValue] != 3 {
		t.Fatalf("result %+v: want m1, m2 (the same manifest again) and t3 applied, the three others skipped as bad_value", res)
	}
	if n := countRows(t, db, "tags"); n != 1 {
		t.Errorf("%d tags, want 1", n)
	}
}

// A repo page's avatar is read from either blob form of the data model:
// the legacy {"cid", "mimeType"} one was stored as no avatar at all. An
// avatar with no CID in either form is a bad value.
func TestARepoPageAvatarIsReadFromEitherBlobForm(t *testing.T) {
	const alice = "did:plc:alice"
	const cid = "bafkreibme22gw2h7y2h7tg2fhqotaqjucnbc24deqo72b6mkl2egezxhvy"
	page := func(repo, avatar string) string {
		return `{"$type":"io.atcr.repo.page","repository":"` + repo + `","createdAt":"2026-01-01T00:00:00Z","updatedAt":"2026-01-01T00:00:00Z","avatar":` + avatar + `}`
	}
	db := testsupport.OpenDB(t)
	p := processor.New(processor.Options{Log: zerolog.Nop()})
	res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{
		rawCommit(alice, 1, processor.CollectionRepoPage, "current", page("current", `{"$type":"blob","ref":{"$link":"`+cid+`"},"mimeType":"image/png","size":10}`)),
		rawCommit(alice, 2, processor.CollectionRepoPage, "legacy", page("legacy", `{"cid":"`+cid+`","mimeType":"image/png"}`)),
	})
	if err != nil || res.Applied != 2 {
		t.Fatalf("apply: %+v, %v: want both applied", res, err)
	}
	res, err = p.Apply(context.Background(), db, unfenced, []jetstream.Event{
		rawCommit(alice, 3, processor.CollectionRepoPage, "nocid", page("nocid", `{"mimeType":"image/png"}`)),
		rawCommit(alice, 4, processor.CollectionRepoPage, "badcid", page("badcid", `{"$type":"blob","ref":{"$link":"not a cid"},"mimeType":"image/png","size":1}`)),
	})
	if err != nil || res.Skipped[processor.ReasonBadValue] != 2 {
		t.Fatalf("apply: %+v, %v: want both avatars without a CID skipped as bad_value", res, err)
	}
	for _, repo := range []string{"current", "legacy"} {
		var got string
		if err := db.QueryRow(`SELECT avatar_cid FROM repo_pages WHERE repository = ?`, repo).Scan(&got); err != nil || got != cid {
			t.Errorf("%s: avatar_cid %q (%v), want %s", repo, got, err, cid)
		}
	}
}

// Names and digests are checked as the names and digests they are, not
// only as keys: a digest has the OCI grammar (algorithm:encoded), a
// descriptor has one, a repository's path segments stay under its owner
// (a webhook's repo_url is built from it) and no name carries a control
// or white-space character. A new user's run stored "hello world" as a
// digest and sent "../../admin?x=<script>" in a webhook link.
func TestNamesAndDigestsAreCheckedAsWhatTheyAre(t *testing.T) {
	const alice = "did:plc:alice"
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	manifest := func(repo, dig, extra string) string {
		b, _ := json.Marshal(repo)
		d, _ := json.Marshal(dig)
		return `{"$type":"io.atcr.manifest","repository":` + string(b) + `,"digest":` + string(d) + `,"mediaType":"x","schemaVersion":2,"createdAt":"2026-01-01T00:00:00Z","holdDid":"did:web:hold.example"` + extra + `}`
	}
	tag := func(repo, name, dig string) string {
		b, _ := json.Marshal(map[string]any{"$type": "io.atcr.tag", "repository": repo, "tag": name, "manifestDigest": dig, "createdAt": "2026-01-01T00:00:00Z"})
		return string(b)
	}
	for _, tc := range []struct {
		name   string
		ev     jetstream.Event
		reason string // "" when applied
	}{
		{"an OCI digest", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app", digest, "")), ""},
		{"a repository with a path and Unicode", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("org/café", digest, "")), ""},
		{"a tag with punctuation", rawCommit(alice, 1, processor.CollectionTag, "t1", tag("app", "v1.0_rc-1", digest)), ""},
		{"a digest that is not one", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app", "hello world", "")), processor.ReasonBadValue},
		{"a digest without an algorithm", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app", ":abc", "")), processor.ReasonBadValue},
		{"an empty mediaType", rawCommit(alice, 1, processor.CollectionManifest, "m1", strings.Replace(manifest("app", digest, ""), `"mediaType":"x"`, `"mediaType":""`, 1)), processor.ReasonMissingField},
		{"a negative schemaVersion", rawCommit(alice, 1, processor.CollectionManifest, "m1", strings.Replace(manifest("app", digest, ""), `"schemaVersion":2`, `"schemaVersion":-7`, 1)), processor.ReasonBadValue},
		{"a layer without a digest", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app", digest, `,"layers":[{"size":1,"mediaType":"x"}]`)), processor.ReasonMissingField},
		{"a layer whose digest is under Digest", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app", digest, `,"layers":[{"Digest":"`+digest+`","size":1,"mediaType":"x"}]`)), processor.ReasonMissingField},
		{"a config digest that is not one", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app", digest, `,"config":{"digest":"nocolon","size":1,"mediaType":"x"}`)), processor.ReasonBadValue},
		{"a layer of negative size", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app", digest, `,"layers":[{"digest":"`+digest+`","size":-1,"mediaType":"x"}]`)), processor.ReasonBadValue},
		{"a repository climbing out", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("../../admin?x=<script>", digest, "")), processor.ReasonBadValue},
		{"a repository with an empty segment", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("org//app", digest, "")), processor.ReasonBadValue},
		{"a repository ending in a slash", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("app/", digest, "")), processor.ReasonBadValue},
		{"a repository with a space", rawCommit(alice, 1, processor.CollectionManifest, "m1", manifest("my app", digest, "")), processor.ReasonBadValue},
		{"a tag with CR LF", rawCommit(alice, 1, processor.CollectionTag, "t1", tag("app", "latest\r\nX-Injected: 1", digest)), processor.ReasonBadValue},
		{"a tag with a zero-width space", rawCommit(alice, 1, processor.CollectionTag, "t1", tag("app", "\u200bv1", digest)), processor.ReasonBadValue},
		{"a tag with a slash", rawCommit(alice, 1, processor.CollectionTag, "t1", tag("app", "a/b", digest)), processor.ReasonBadValue},
		{"a tag that is ..", rawCommit(alice, 1, processor.CollectionTag, "t1", tag("app", "..", digest)), processor.ReasonBadValue},
		{"a tag's manifestDigest that is not one", rawCommit(alice, 1, processor.CollectionTag, "t1", tag("app", "v1", "xyz")), processor.ReasonBadValue},
		{"a star of a repository climbing out", rawCommit(alice, 1, processor.CollectionStar, "s1", `{"$type":"io.atcr.sailor.star","subject":{"did":"did:plc:bob","repository":"../x"},"createdAt":"2026-01-01T00:00:00Z"}`), processor.ReasonBadValue},
		{"hold stats of a repository with a tab", rawCommit("did:web:hold.example", 1, processor.CollectionStats, "s1", `{"$type":"io.atcr.hold.stats","ownerDid":"did:plc:alice","repository":"a\tb","pullCount":1,"pushCount":1,"updatedAt":"2026-01-01T00:00:00Z"}`), processor.ReasonBadValue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := testsupport.OpenDB(t)
			p := processor.New(processor.Options{Log: zerolog.Nop()})
			res, err := p.Apply(context.Background(), db, unfenced, []jetstream.Event{tc.ev})
			if err != nil {
				t.Fatal(err)
			}
			if tc.reason == "" {
				if res.Applied != 1 {
					t.Fatalf("result %+v: want it applied", res)
				}
				return
			}
			if res.Skipped[tc.reason] != 1 {
				t.Fatalf("result %+v: want it skipped as %s", res, tc.reason)
			}
			for _, table := range registryTables {
				if n := countRows(t, db, table); n != 0 {
					t.Errorf("%s has %d rows", table, n)
				}
			}
		})
	}
}
