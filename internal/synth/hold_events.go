package synth

import (
	"encoding/json"

	"github.com/atcr-io/appview/internal/jetstream"
)

func (g *Generator) holdStats() (jetstream.Event, bool) {
	hold := g.holdDID(g.anyHold())
	owner, repo := g.anyUser(), g.anyRepo()
	hk := holdKey{owner, repo, hold}
	cur := g.m.holdStats[hk]
	next := &holdStatM{}
	outOfOrder := cur != nil && g.rng.IntN(6) == 0
	switch {
	case outOfOrder:
		// An older commit arriving late (a rewound replay, another
		// Jetstream host): a hold's absolute counts as of an earlier rev
		// and updatedAt. It must be ignored.
		*next = *cur
		next.updatedAt = cur.updatedAt - 1 - g.rng.Int64N(60000)
		next.pull = max(0, cur.pull-1-g.rng.Int64N(5))
	case cur != nil:
		*next = *cur
		next.us = g.t
		next.updatedAt = max(g.ms(), cur.updatedAt+1)
		if d := g.rng.Int64N(20); d > 0 {
			next.pull += d
			v := next.updatedAt
			next.lastPull = &v
		}
		if d := g.rng.Int64N(3); d > 0 {
			next.push += d
			v := next.updatedAt
			next.lastPush = &v
		}
	default:
		next.us = g.t
		next.updatedAt = g.ms()
		next.pull, next.push = g.rng.Int64N(50), 1+g.rng.Int64N(3)
		if next.pull > 0 {
			v := next.updatedAt - g.rng.Int64N(100000)
			next.lastPull = &v
		}
		v := next.updatedAt - g.rng.Int64N(100000)
		next.lastPush = &v
	}
	rec := obj{"$type": colStats, "ownerDid": owner, "repository": repo, "pullCount": next.pull,
		"pushCount": next.push, "updatedAt": datetime(next.updatedAt)}
	if next.lastPull != nil {
		rec["lastPull"] = datetime(*next.lastPull)
	}
	if next.lastPush != nil {
		rec["lastPush"] = datetime(*next.lastPush)
	}
	if !outOfOrder {
		if cur == nil {
			g.m.holdStatPool.add(hk)
		}
		g.m.holdStats[hk] = next
		g.m.holdsOf(repoKey{owner, repo})[hold] = next
		g.m.refresh(repoKey{owner, repo}, g.t)
	}
	ev := g.commit(hold, "create", colStats, statsRKey(owner, repo), rec)
	if outOfOrder {
		// The rev, not updatedAt, orders a hold's records: a rev older
		// than the stored row's makes the record the older one.
		ev.Commit.Rev = tidOf(cur.us-1, 0)
	}
	return ev, true
}

func (g *Generator) deleteHoldStats() (jetstream.Event, bool) {
	hk, ok := g.m.holdStatPool.pick(g.rng)
	if !ok {
		return jetstream.Event{}, false
	}
	delete(g.m.holdStats, hk)
	g.m.holdStatPool.remove(hk)
	rk := repoKey{hk.owner, hk.repo}
	delete(g.m.holdsOf(rk), hk.hold)
	g.m.refresh(rk, g.t)
	return g.commit(hk.hold, "delete", colStats, statsRKey(hk.owner, hk.repo), nil), true
}

func (g *Generator) captain() (jetstream.Event, bool) {
	hold := g.holdDID(g.anyHold())
	c := &captainM{owner: g.anyUser(), public: g.rng.IntN(2) == 0, allowAllCrew: g.rng.IntN(4) == 0,
		posts: g.rng.IntN(2) == 0, deployedAt: g.ms() - g.rng.Int64N(1e9), region: regions[g.rng.IntN(len(regions))]}
	op := "update"
	if g.m.captains[hold] == nil {
		op = "create"
	}
	g.m.captains[hold] = c
	rec := obj{"$type": colCaptain, "owner": c.owner, "public": c.public, "allowAllCrew": c.allowAllCrew,
		"enableBlueskyPosts": c.posts, "deployedAt": datetime(c.deployedAt), "region": c.region, "provider": "synth"}
	return g.commit(hold, op, colCaptain, "self", rec), true
}

func (g *Generator) addCrew() (jetstream.Event, bool) {
	hold := g.holdDID(g.anyHold())
	if g.m.crewCount[hold] >= maxCrewPerHold {
		return jetstream.Event{}, false
	}
	ck := crewKey{hold, g.tid()}
	c := &crewM{member: g.anyUser(), role: roles[g.rng.IntN(len(roles))], addedAt: g.ms()}
	perms := []string{"blob:read"}
	if c.role != "read" {
		perms = append(perms, "blob:write")
	}
	p, _ := json.Marshal(perms)
	c.permissions = string(p)
	rec := obj{"$type": colCrew, "member": c.member, "role": c.role, "permissions": perms, "addedAt": datetime(c.addedAt)}
	if g.rng.IntN(2) == 0 {
		c.tier = []string{"deckhand", "bosun", "quartermaster"}[g.rng.IntN(3)]
		rec["tier"] = c.tier
	}
	g.m.crew[ck] = c
	g.m.crewPool.add(ck)
	g.m.crewCount[hold]++
	return g.commit(hold, "create", colCrew, ck.rkey, rec), true
}

func (g *Generator) removeCrew() (jetstream.Event, bool) {
	ck, ok := g.m.crewPool.pick(g.rng)
	if !ok {
		return jetstream.Event{}, false
	}
	delete(g.m.crew, ck)
	g.m.crewPool.remove(ck)
	g.m.crewCount[ck.hold]--
	return g.commit(ck.hold, "delete", colCrew, ck.rkey, nil), true
}
