package synth

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/atcr-io/appview/internal/jetstream"
)

func (g *Generator) identity() (jetstream.Event, bool) {
	did := g.anyUser()
	if g.rng.IntN(4) == 0 {
		did = fmt.Sprintf("did:plc:outsider%05d", g.rng.IntN(1000))
	}
	handle := fmt.Sprintf("%s-%d.synth.example", strings.TrimPrefix(did, "did:plc:"), g.rng.IntN(10))
	// The first event of a DID makes its users row, active until an
	// #account event says otherwise. The event's handle is never stored
	// (only one verified through the DID document), and the synthetic
	// DIDs resolve nowhere: the row's handle stays empty.
	g.m.ensureUser(did, g.t).updatedAt = g.ms()
	return jetstream.Event{DID: did, TimeUS: g.t, Kind: jetstream.KindIdentity,
		Identity: &jetstream.Identity{DID: did, Handle: handle, Seq: g.t, Time: datetime(g.ms())}}, true
}

func (g *Generator) account() (jetstream.Event, bool) {
	did := g.anyUser()
	if g.rng.IntN(4) == 0 {
		did = fmt.Sprintf("did:plc:outsider%05d", g.rng.IntN(1000))
	}
	active := g.rng.IntN(2) == 0
	acc := &jetstream.Account{Active: &active, DID: did, Seq: g.t, Time: datetime(g.ms())}
	if !active {
		acc.Status = []string{"deactivated", "takendown", "suspended"}[g.rng.IntN(3)]
	}
	if u := g.m.users[did]; u == nil {
		// The first event of a DID makes its users row, with its status
		// (it has no stars yet: a star record would have made the row).
		g.m.users[did] = &userM{active: active, status: acc.Status, updatedAt: g.ms()}
	} else {
		was := u.active
		u.active, u.status, u.updatedAt = active, acc.Status, g.ms()
		if was != active {
			// The account's stars stop or start counting: every
			// repository it starred is refreshed.
			for _, sk := range g.m.starsBy[did] {
				subject := g.m.stars[sk].subject
				if active {
					g.m.starCount[subject]++
				} else {
					g.m.starCount[subject]--
				}
				g.m.refresh(subject, g.t)
			}
		}
	}
	return jetstream.Event{DID: did, TimeUS: g.t, Kind: jetstream.KindAccount, Account: acc}, true
}

func (g *Generator) noise() (jetstream.Event, bool) {
	rec := obj{"$type": "app.bsky.feed.like", "createdAt": datetime(g.ms()),
		"subject": obj{"uri": "at://did:plc:someone/app.bsky.feed.post/3abc", "cid": "bafyreiabc"}}
	return g.commit(g.anyUser(), "create", "app.bsky.feed.like", g.tid(), rec), true
}

// invalid emits a record that breaks its lexicon; the processor must skip
// it and change nothing.
func (g *Generator) invalid() (jetstream.Event, bool) {
	did := g.anyUser()
	switch g.rng.IntN(6) {
	case 0:
		return g.commit(did, "create", colManifest, g.tid(), obj{"repository": "app", "mediaType": "x", "schemaVersion": 2, "createdAt": datetime(g.ms())}), true
	case 1:
		return g.commit(did, "create", colTag, g.tid(), obj{"repository": "app", "tag": strings.Repeat("t", 200), "manifestDigest": "sha256:00"}), true
	case 2:
		return g.commit(g.holdDID(g.anyHold()), "create", colStats, g.tid(), obj{"ownerDid": did, "repository": "app",
			"pullCount": -1, "pushCount": 0, "updatedAt": datetime(g.ms())}), true
	case 3:
		return g.commit(did, "create", colStar, g.tid(), obj{"subject": "at://" + did + "/app.bsky.feed.post/x", "createdAt": datetime(g.ms())}), true
	case 4:
		return g.commit(did, "create", colManifest, g.tid(), obj{"repository": "app", "digest": "sha256:00", "mediaType": "x",
			"schemaVersion": 2, "createdAt": "yesterday", "holdDid": g.holdDID(0)}), true
	default:
		ev := g.commit(did, "create", colRepoPage, "app", nil)
		ev.Commit.Record = json.RawMessage(`["not", "an", "object"]`)
		return ev, true
	}
}
