package webhooks

import (
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/fence"
)

func TestAddListRemoveRoundTrip(t *testing.T) {
	e := newEnv(t)
	lax := Guard{AllowPrivate: true}
	a, err := Add(e.ctx, e.db, Webhook{DID: "did:plc:alice", URL: "http://127.0.0.1:1/a", Secret: "x"}, lax)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Add(e.ctx, e.db, Webhook{DID: "did:web:bob.example.com", URL: "https://127.0.0.1/b", Triggers: []string{"push", " push"}}, lax)
	if err != nil {
		t.Fatal(err)
	}
	all, err := List(e.ctx, e.db, "")
	if err != nil || len(all) != 2 || all[0].ID != a || all[1].ID != b {
		t.Fatalf("List all = %+v, %v", all, err)
	}
	if !all[0].Signed() || all[1].Signed() || !reflect.DeepEqual(all[1].Triggers, []string{"push"}) || all[0].CreatedAt == 0 {
		t.Fatalf("listed webhooks = %+v", all)
	}
	bobs, err := List(e.ctx, e.db, "did:web:bob.example.com")
	if err != nil || len(bobs) != 1 || bobs[0].ID != b {
		t.Fatalf("List bob = %+v, %v", bobs, err)
	}
	if err := Remove(e.ctx, e.db, a); err != nil {
		t.Fatal(err)
	}
	if err := Remove(e.ctx, e.db, a); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Remove = %v, want ErrNotFound", err)
	}
	if left, _ := List(e.ctx, e.db, ""); len(left) != 1 || left[0].ID != b {
		t.Fatalf("after remove: %+v", left)
	}
}

func TestAddRejectsBadDIDTriggerAndURL(t *testing.T) {
	e := newEnv(t)
	lax := Guard{AllowPrivate: true}
	cases := []struct {
		w    Webhook
		g    Guard
		want string
	}{
		{Webhook{DID: "alice", URL: "http://127.0.0.1/"}, lax, "did:<method>:<id>"},
		{Webhook{DID: "did:PLC:x", URL: "http://127.0.0.1/"}, lax, "did:<method>:<id>"},
		{Webhook{DID: "did:plc:", URL: "http://127.0.0.1/"}, lax, "did:<method>:<id>"},
		{Webhook{DID: "did:plc:a", URL: "http://127.0.0.1/", Triggers: []string{"pull"}}, lax, `unknown webhook trigger "pull"`},
		// The trigger is checked before the URL's host is resolved (an
		// .invalid name never resolves: RFC 6761).
		{Webhook{DID: "did:plc:a", URL: "http://hooks.example.invalid/", Triggers: []string{"pull"}}, Guard{}, `unknown webhook trigger "pull"`},
		{Webhook{DID: "did:plc:a", URL: "gopher://127.0.0.1/"}, lax, "scheme must be one of http, https"},
		{Webhook{DID: "did:plc:a", URL: "http://127.0.0.1:99999/h"}, lax, "port 99999 is not in 1..65535"},
		{Webhook{DID: "did:plc:a", URL: "http://127.0.0.1:0/h"}, lax, "port 0 is not in 1..65535"},
		{Webhook{DID: "did:plc:a", URL: "http://127.0.0.1/"}, Guard{}, "loopback"},
		{Webhook{DID: "did:plc:a", URL: "http://127.0.0.1/" + strings.Repeat("a", 100<<10)}, lax, "is 102417 bytes: at most 2048 are accepted"},
		{Webhook{DID: "did:plc:a", URL: "http://127.0.0.1/" + strings.Repeat("a", MaxURLBytes-len("http://127.0.0.1/")+1)}, lax, "is 2049 bytes"},
	}
	for _, c := range cases {
		if _, err := Add(e.ctx, e.db, c.w, c.g); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Add(%+v) = %v, want an error containing %q", c.w, err, c.want)
		}
	}
	if all, _ := List(e.ctx, e.db, ""); len(all) != 0 {
		t.Fatalf("rejected webhooks were stored: %+v", all)
	}
	atBound := "http://127.0.0.1/" + strings.Repeat("a", MaxURLBytes-len("http://127.0.0.1/"))
	if _, err := Add(e.ctx, e.db, Webhook{DID: "did:plc:a", URL: atBound}, lax); err != nil {
		t.Fatalf("a URL of exactly %d bytes: %v", MaxURLBytes, err)
	}
}

func TestParseTriggersAcceptsJSONArrayAndCommaList(t *testing.T) {
	for in, want := range map[string][]string{
		`["push"]`:        {"push"},
		` [ "push", "" ]`: {"push"},
		`push`:            {"push"},
		`push, tag,`:      {"push", "tag"},
		``:                {},
	} {
		got, err := ParseTriggers(in)
		if err != nil || len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
			t.Errorf("ParseTriggers(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseTriggers(`["push"`); err == nil {
		t.Error("truncated JSON array accepted")
	}
}

func TestEnqueueRecordsOneDeliveryPerPushSubscriber(t *testing.T) {
	e := newEnv(t)
	lax := Guard{AllowPrivate: true}
	mine1, _ := Add(e.ctx, e.db, Webhook{DID: testOwner, URL: "http://127.0.0.1/1"}, lax)
	mine2, _ := Add(e.ctx, e.db, Webhook{DID: testOwner, URL: "http://127.0.0.1/2"}, lax)
	others, _ := Add(e.ctx, e.db, Webhook{DID: "did:plc:someoneelse", URL: "http://127.0.0.1/3"}, lax)
	// Written by a newer version or by hand: a comma list without "push",
	// and a column that cannot be parsed. Neither gets push deliveries.
	for _, triggers := range []string{"tag, star", `["push"`} {
		if _, err := e.db.Exec(`INSERT INTO webhooks (did, url, triggers, created_at) VALUES (?1, 'http://127.0.0.1/x', ?2, 0)`,
			testOwner, triggers); err != nil {
			t.Fatal(err)
		}
	}

	p := push("app", "sha256:aaa")
	p.EventKey = "" // derived
	if n := e.enqueue(e.custody, p, push("app", "sha256:bbb")); n != 4 {
		t.Fatalf("enqueue recorded %d deliveries, want 4 (2 pushes x 2 subscribed webhooks)", n)
	}
	rows, err := e.db.Query(`SELECT webhook_id, event_key, status, attempts FROM webhook_deliveries ORDER BY webhook_id, event_key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var (
			id          int64
			key, status string
			attempts    int
		)
		if err := rows.Scan(&id, &key, &status, &attempts); err != nil {
			t.Fatal(err)
		}
		if id == others || status != "pending" || attempts != 0 {
			t.Errorf("unexpected delivery: webhook %d %s %s %d", id, key, status, attempts)
		}
		got = append(got, key)
	}
	want := []string{
		"push:" + testOwner + "/app@sha256:aaa", "push:" + testOwner + "/app@sha256:bbb",
		"push:" + testOwner + "/app@sha256:aaa", "push:" + testOwner + "/app@sha256:bbb",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("delivery keys = %q, want %q (webhooks %d, %d)", got, want, mine1, mine2)
	}
}

// One batch can carry the pushes of many owners (the subscribers are
// looked up for all of them at once, a chunk of DIDs per query): each
// delivery still goes to the pushing owner's own webhooks only.
func TestEnqueueOfManyOwnersDeliversToEachOwnersWebhooksOnly(t *testing.T) {
	e := newEnv(t)
	lax := Guard{AllowPrivate: true}
	owner := func(i int) string { return fmt.Sprintf("did:plc:owner%04d", i) }
	subscribed := []int{0, subscribersChunk - 1, subscribersChunk, 2*subscribersChunk + 3}
	want := map[int64]string{}
	for _, i := range subscribed {
		id, err := Add(e.ctx, e.db, Webhook{DID: owner(i), URL: fmt.Sprintf("http://127.0.0.1/%d", i)}, lax)
		if err != nil {
			t.Fatal(err)
		}
		want[id] = PushEventKey(owner(i), "app", "sha256:aaa")
	}
	var pushes []Push
	for i := range 2*subscribersChunk + 10 {
		p := push("app", "sha256:aaa")
		p.OwnerDID, p.EventKey = owner(i), ""
		pushes = append(pushes, p)
	}
	if n := e.enqueue(e.custody, pushes...); n != len(subscribed) {
		t.Fatalf("enqueue recorded %d deliveries, want %d (one per subscribed owner)", n, len(subscribed))
	}
	rows, err := e.db.Query(`SELECT webhook_id, event_key FROM webhook_deliveries`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]string{}
	for rows.Next() {
		var (
			id  int64
			key string
		)
		if err := rows.Scan(&id, &key); err != nil {
			t.Fatal(err)
		}
		got[id] = key
	}
	if !maps.Equal(got, want) {
		t.Errorf("deliveries %v, want %v", got, want)
	}
}

func TestEnqueueRefusesAPushWithoutItsKeyFieldsAndWritesNothing(t *testing.T) {
	e := newEnv(t)
	e.addWebhook("http://127.0.0.1/1", "")
	bad := push("app", "")
	err := fence.Fenced(e.ctx, e.db, e.custody, func(tx *sql.Tx) error {
		_, err := EnqueueTx(e.ctx, tx, []Push{push("app", "sha256:ok"), bad})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("EnqueueTx with an empty digest = %v, want an error", err)
	}
	var n int
	_ = e.db.QueryRow(`SELECT COUNT(*) FROM webhook_deliveries`).Scan(&n)
	if n != 0 {
		t.Fatalf("%d deliveries written from a refused batch", n)
	}
}

func TestListReturnsADateLikeSecretUnchanged(t *testing.T) {
	e := newEnv(t)
	const secret = "2024-06-01T12:00:00.000Z"
	id, err := Add(e.ctx, e.db, Webhook{DID: "did:plc:alice", URL: "http://127.0.0.1:1/a", Secret: secret}, Guard{AllowPrivate: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := List(e.ctx, e.db, "")
	if err != nil || len(got) != 1 || got[0].ID != id {
		t.Fatalf("List = %+v, %v", got, err)
	}
	if got[0].Secret != secret {
		t.Fatalf("secret read back as %q, want %q", got[0].Secret, secret)
	}
}
