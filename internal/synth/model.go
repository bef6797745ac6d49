package synth

import (
	"math/rand/v2"
	"sort"
	"strings"
)

type repoKey struct{ did, repo string }

type tagKey struct{ did, repo, tag string }

type starKey struct{ did, rkey string }

type starredKey struct {
	did     string
	subject repoKey
}

type holdKey struct{ owner, repo, hold string }

type crewKey struct{ hold, rkey string }

type manifestKey struct{ did, repo, digest string }

type userM struct {
	handle                             string
	active                             bool
	status                             string
	defaultHold                        string
	autoRemove                         bool
	profileCreatedAt, profileUpdatedAt *int64
	updatedAt                          int64
}

type manifestM struct {
	did, repo, digest, rkey          string
	holdDID, holdEndpoint, mediaType string
	schemaVersion                    int64
	configDigest, subjectDigest      string
	createdAt, indexedAt             int64
	layers, refs                     int
	annotations                      map[string]string
}

type tagM struct {
	digest, rkey         string
	createdAt, updatedAt int64
}

type starM struct {
	subject   repoKey
	createdAt int64
}

type holdStatM struct {
	pull, push         int64
	lastPull, lastPush *int64
	updatedAt          int64
	// us is the time_us of the commit that wrote the row; its rev is
	// newer than tidOf(us-1, _).
	us int64
}

type aggM struct {
	pull, push         int64
	lastPull, lastPush *int64
	stars              int64
	updatedAt          int64
}

type pageM struct {
	description, avatar  string
	createdAt, updatedAt int64
}

type captainM struct {
	owner                       string
	public, allowAllCrew, posts bool
	deployedAt                  int64
	region                      string
}

type crewM struct {
	member, role, permissions, tier string
	addedAt                         int64
}

// pool is a set with deterministic random picks (map iteration order is not seeded).
type pool[K comparable] struct {
	items []K
	idx   map[K]int
}

func (p *pool[K]) add(k K) {
	if p.idx == nil {
		p.idx = map[K]int{}
	}
	if _, ok := p.idx[k]; ok {
		return
	}
	p.idx[k] = len(p.items)
	p.items = append(p.items, k)
}

func (p *pool[K]) remove(k K) {
	i, ok := p.idx[k]
	if !ok {
		return
	}
	last := p.items[len(p.items)-1]
	p.items[i] = last
	p.idx[last] = i
	p.items = p.items[:len(p.items)-1]
	delete(p.idx, k)
}

func (p *pool[K]) pick(r *rand.Rand) (K, bool) {
	var zero K
	if len(p.items) == 0 {
		return zero, false
	}
	return p.items[r.IntN(len(p.items))], true
}

type model struct {
	users        map[string]*userM
	manifests    map[manifestKey]*manifestM
	manifestPool pool[manifestKey]
	liveInRepo   map[repoKey]int
	tags         map[tagKey]*tagM
	tagPool      pool[tagKey]
	stars        map[starKey]*starM
	starPool     pool[starKey]
	starred      map[starredKey]bool
	starCount    map[repoKey]int64 // stars of active accounts
	starsBy      map[string][]starKey
	holdStats    map[holdKey]*holdStatM
	holdStatPool pool[holdKey]
	byRepo       map[repoKey]map[string]*holdStatM
	aggs         map[repoKey]*aggM
	pages        map[repoKey]*pageM
	captains     map[string]*captainM
	crew         map[crewKey]*crewM
	crewPool     pool[crewKey]
	crewCount    map[string]int
	pushKeys     map[string]struct{}
	maxTimeUS    int64
	lastUS       int64 // the last event a consumer of io.atcr.* is sent
}

func newModel() *model {
	return &model{
		users: map[string]*userM{}, manifests: map[manifestKey]*manifestM{}, liveInRepo: map[repoKey]int{},
		tags: map[tagKey]*tagM{}, stars: map[starKey]*starM{}, starred: map[starredKey]bool{},
		starCount: map[repoKey]int64{}, starsBy: map[string][]starKey{}, holdStats: map[holdKey]*holdStatM{}, byRepo: map[repoKey]map[string]*holdStatM{},
		aggs: map[repoKey]*aggM{}, pages: map[repoKey]*pageM{}, captains: map[string]*captainM{},
		crew: map[crewKey]*crewM{}, crewCount: map[string]int{}, pushKeys: map[string]struct{}{},
	}
}

// ensureUser mirrors the processor: the first applied user-repo record,
// or #identity or #account event, creates the row.
func (m *model) ensureUser(did string, t int64) *userM {
	u := m.users[did]
	if u == nil {
		u = &userM{active: true, updatedAt: t / 1000}
		m.users[did] = u
	}
	return u
}

func (m *model) addManifest(mf *manifestM) {
	k := manifestKey{mf.did, mf.repo, mf.digest}
	m.manifests[k] = mf
	m.manifestPool.add(k)
	m.liveInRepo[repoKey{mf.did, mf.repo}]++
	m.pushKeys["push:"+mf.did+"/"+mf.repo+"@"+mf.digest] = struct{}{}
}

func (m *model) removeManifest(k manifestKey) {
	delete(m.manifests, k)
	m.manifestPool.remove(k)
	m.liveInRepo[repoKey{k.did, k.repo}]--
}

func (m *model) holdsOf(k repoKey) map[string]*holdStatM {
	h := m.byRepo[k]
	if h == nil {
		h = map[string]*holdStatM{}
		m.byRepo[k] = h
	}
	return h
}

// refresh mirrors the processor's repository_stats refresh (refreshManySQL) after an event at t
// changed k's stars or hold stats: updated_at is the time of the latest
// such event.
func (m *model) refresh(k repoKey, t int64) {
	next := aggM{stars: m.starCount[k]}
	for _, h := range m.byRepo[k] {
		next.pull += h.pull
		next.push += h.push
		next.lastPull = maxPtr(next.lastPull, h.lastPull)
		next.lastPush = maxPtr(next.lastPush, h.lastPush)
	}
	next.updatedAt = t / 1000
	m.aggs[k] = &next
}

func maxPtr(a, b *int64) *int64 {
	switch {
	case a == nil:
		return b
	case b == nil || *a >= *b:
		return a
	}
	return b
}

func nullable(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func (m *model) expected(events int) *Expected {
	e := &Expected{Tables: map[string]map[string]string{}, Events: events, MaxTimeUS: m.maxTimeUS, LastUS: m.lastUS}
	for _, t := range tables {
		e.Tables[t.name] = map[string]string{}
	}
	for did, u := range m.users {
		e.put("users", 1, did, u.handle, u.active, u.status, u.defaultHold, u.autoRemove,
			nullable(u.profileCreatedAt), nullable(u.profileUpdatedAt), u.updatedAt)
	}
	for k, mf := range m.manifests {
		keys := make([]string, 0, len(mf.annotations))
		for a, v := range mf.annotations {
			keys = append(keys, a+"="+v)
		}
		sort.Strings(keys)
		e.put("manifests", 3, k.did, k.repo, k.digest, mf.rkey, mf.holdDID, mf.holdEndpoint, mf.mediaType, mf.schemaVersion,
			mf.configDigest, mf.subjectDigest, mf.createdAt, mf.indexedAt, mf.layers, mf.refs, strings.Join(keys, ","))
	}
	for k, tg := range m.tags {
		e.put("tags", 3, k.did, k.repo, k.tag, tg.digest, tg.rkey, tg.createdAt, tg.updatedAt)
	}
	for k, st := range m.stars {
		e.put("stars", 2, k.did, k.rkey, st.subject.did, st.subject.repo, st.createdAt)
	}
	for k, p := range m.pages {
		e.put("repo_pages", 2, k.did, k.repo, k.repo, p.description, p.avatar, p.createdAt, p.updatedAt)
	}
	for hold, c := range m.captains {
		e.put("hold_captains", 1, hold, c.owner, c.public, c.allowAllCrew, c.posts, c.deployedAt, c.region, "synth", "")
	}
	for k, c := range m.crew {
		e.put("hold_crew", 2, k.hold, k.rkey, c.member, c.role, c.permissions, c.tier, c.addedAt)
	}
	for k, h := range m.holdStats {
		e.put("repository_hold_stats", 3, k.owner, k.repo, k.hold, h.pull, h.push, nullable(h.lastPull), nullable(h.lastPush), h.updatedAt)
	}
	for k, a := range m.aggs {
		e.put("repository_stats", 2, k.did, k.repo, a.pull, a.push, nullable(a.lastPull), nullable(a.lastPush), a.stars, a.updatedAt)
	}
	for k := range m.pushKeys {
		e.PushEventKeys = append(e.PushEventKeys, k)
	}
	sort.Strings(e.PushEventKeys)
	return e
}
