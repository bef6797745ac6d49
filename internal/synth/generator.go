package synth

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
)

// Options shapes a synthetic stream. Equal Options give byte-identical
// streams.
type Options struct {
	// Seed selects the stream.
	Seed uint64
	// Events is how many events to generate.
	Events int
	// Users is the number of distinct user DIDs (0: 40).
	Users int
	// Holds is the number of distinct hold DIDs (0: 4).
	Holds int
	// StartUS is the time_us of the first event (0: 1750000000000000).
	StartUS int64
}

func (o Options) withDefaults() Options {
	if o.Users <= 0 {
		o.Users = 40
	}
	if o.Holds <= 0 {
		o.Holds = 4
	}
	if o.StartUS <= 0 {
		o.StartUS = 1750000000000000
	}
	return o
}

// Collections of the stream (the processor's, plus noise).
const (
	colManifest = "io.atcr.manifest"
	colTag      = "io.atcr.tag"
	colStar     = "io.atcr.sailor.star"
	colProfile  = "io.atcr.sailor.profile"
	colRepoPage = "io.atcr.repo.page"
	colCaptain  = "io.atcr.hold.captain"
	colCrew     = "io.atcr.hold.crew"
	colStats    = "io.atcr.hold.stats"
)

// Bounds that keep the model's size independent of the stream length.
const (
	maxManifestsPerRepo = 4
	maxCrewPerHold      = 6
)

// Date-like names and values are here because real traffic has them (a
// tag per build day, a repository named after a release) and go-libsql
// returns TEXT that parses as a date as a time.Time: a read that does not
// go through database.Text changes them, and Diff then reports it.
var (
	repoNames = []string{"app", "api", "web", "worker", "cli", "db", "proxy", "base", "2024-06-01"}
	tagNames  = []string{"latest", "stable", "dev", "v1", "v2", "v3", "2024-06-01", "2024-06-01T12-00"}
	roles     = []string{"owner", "admin", "write", "read"}
	regions   = []string{"us-east", "eu-west", "ap-south"}
)

// Generator produces one stream event at a time while tracking the exact
// state the processor must end in. Call Next until it returns false, then
// Expected.
type Generator struct {
	o       Options
	rng     *rand.Rand
	t       int64
	emitted int
	m       *model
}

// NewGenerator returns a generator for o.
func NewGenerator(o Options) *Generator {
	o = o.withDefaults()
	return &Generator{
		o:   o,
		rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)),
		t:   o.StartUS,
		m:   newModel(),
	}
}

// Next returns the next event, or false when Options.Events were generated.
func (g *Generator) Next() (jetstream.Event, bool) {
	if g.emitted >= g.o.Events {
		return jetstream.Event{}, false
	}
	g.t += 1 + g.rng.Int64N(3000)
	for {
		if ev, ok := g.step(); ok {
			g.emitted++
			g.m.maxTimeUS = ev.TimeUS
			if ev.Kind != jetstream.KindCommit || strings.HasPrefix(ev.Commit.Collection, "io.atcr.") {
				g.m.lastUS = ev.TimeUS
			}
			return ev, true
		}
	}
}

// Expected is the state after every generated event (call after Next
// returned false; earlier it is the state so far).
func (g *Generator) Expected() *Expected { return g.m.expected(g.emitted) }

type action struct {
	weight int
	run    func(g *Generator) (jetstream.Event, bool)
}

var actions = []action{
	{20, (*Generator).pushManifest},
	{3, (*Generator).updateManifest},
	{5, (*Generator).deleteManifest},
	{15, (*Generator).setTag},
	{4, (*Generator).deleteTag},
	{6, (*Generator).star},
	{3, (*Generator).unstar},
	{15, (*Generator).holdStats},
	{1, (*Generator).deleteHoldStats},
	{3, (*Generator).profile},
	{1, (*Generator).deleteProfile},
	{3, (*Generator).repoPage},
	{1, (*Generator).deleteRepoPage},
	{1, (*Generator).captain},
	{2, (*Generator).addCrew},
	{1, (*Generator).removeCrew},
	{2, (*Generator).identity},
	{1, (*Generator).account},
	{5, (*Generator).noise},
	{2, (*Generator).invalid},
}

var totalWeight = func() int {
	n := 0
	for _, a := range actions {
		n += a.weight
	}
	return n
}()

func (g *Generator) step() (jetstream.Event, bool) {
	n := g.rng.IntN(totalWeight)
	for _, a := range actions {
		if n < a.weight {
			return a.run(g)
		}
		n -= a.weight
	}
	panic("unreachable")
}

// --- naming ---------------------------------------------------------------

func (g *Generator) userDID(i int) string { return fmt.Sprintf("did:plc:synthuser%05d", i) }
func (g *Generator) holdHost(i int) string {
	return fmt.Sprintf("hold%02d.synth.example", i)
}
func (g *Generator) holdDID(i int) string { return "did:web:" + g.holdHost(i) }

func (g *Generator) anyUser() string { return g.userDID(g.rng.IntN(g.o.Users)) }
func (g *Generator) anyHold() int    { return g.rng.IntN(g.o.Holds) }
func (g *Generator) anyRepo() string { return repoNames[g.rng.IntN(len(repoNames))] }

const tidAlphabet = "234567abcdefghijklmnopqrstuvwxyz"

// tid is an AT Protocol TID for the current time (13 base32-sortable chars).
func (g *Generator) tid() string { return tidOf(g.t, g.rng.IntN(1024)) }

// tidOf is the TID of time us (Unix µs) with clock identifier clock (0-1023).
func tidOf(us int64, clock int) string {
	v := uint64(us)<<10 | uint64(clock)
	var b [13]byte
	for i := 12; i >= 0; i-- {
		b[i] = tidAlphabet[v&31]
		v >>= 5
	}
	return string(b[:])
}

var rkeyEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// statsRKey is the io.atcr.hold.stats record key: base32(sha256(ownerDid + "/" + repository)[:16]).
func statsRKey(owner, repo string) string {
	sum := sha256.Sum256([]byte(owner + "/" + repo))
	return strings.ToLower(rkeyEncoding.EncodeToString(sum[:16]))
}

func (g *Generator) digest(kind string) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%d/%s/%d/%d", g.o.Seed, kind, g.t, g.rng.Uint64()))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func datetime(ms int64) string { return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z") }

func (g *Generator) ms() int64 { return g.t / 1000 }

// --- events ---------------------------------------------------------------

func (g *Generator) commit(did, op, collection, rkey string, record any) jetstream.Event {
	c := &jetstream.Commit{Rev: g.tid(), Operation: op, Collection: collection, RKey: rkey}
	if record != nil {
		raw, err := json.Marshal(record)
		if err != nil {
			panic(err) // records are built from plain maps
		}
		c.Record = raw
		c.CID = "bafyrei" + g.tid()
	}
	return jetstream.Event{DID: did, TimeUS: g.t, Kind: jetstream.KindCommit, Commit: c}
}

type obj = map[string]any

func (g *Generator) pushManifest() (jetstream.Event, bool) {
	did, repo := g.anyUser(), g.anyRepo()
	if g.m.liveInRepo[repoKey{did, repo}] >= maxManifestsPerRepo {
		return jetstream.Event{}, false
	}
	hold := g.anyHold()
	mf := &manifestM{
		did: did, repo: repo, digest: g.digest("manifest"), rkey: g.tid(),
		schemaVersion: 2, createdAt: g.ms() - g.rng.Int64N(1000), indexedAt: g.ms(),
		annotations: map[string]string{},
	}
	if g.rng.IntN(5) == 0 {
		mf.holdEndpoint = "https://" + g.holdHost(hold)
	}
	mf.holdDID = g.holdDID(hold)
	rec := obj{"$type": colManifest, "repository": repo, "digest": mf.digest, "schemaVersion": 2, "createdAt": datetime(mf.createdAt)}
	if mf.holdEndpoint != "" {
		rec["holdEndpoint"] = mf.holdEndpoint
	} else {
		rec["holdDid"] = mf.holdDID
	}
	if g.rng.IntN(4) == 0 {
		mf.mediaType = "application/vnd.oci.image.index.v1+json"
		var refs []obj
		for i, arch := range []string{"amd64", "arm64", "arm"}[:1+g.rng.IntN(3)] {
			p := obj{"os": "linux", "architecture": arch}
			if arch == "arm" {
				p["variant"] = "v7"
			}
			refs = append(refs, obj{"mediaType": "application/vnd.oci.image.manifest.v1+json",
				"digest": g.digest(fmt.Sprint("child", i)), "size": 500 + g.rng.IntN(2000), "platform": p})
		}
		rec["manifests"] = refs
		mf.refs = len(refs)
	} else {
		mf.mediaType = "application/vnd.oci.image.manifest.v1+json"
		mf.configDigest = g.digest("config")
		rec["config"] = obj{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": mf.configDigest, "size": 1000 + g.rng.IntN(5000)}
		var layers []obj
		for i := range 1 + g.rng.IntN(4) {
			layers = append(layers, obj{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
				"digest": g.digest(fmt.Sprint("layer", i)), "size": 1 << (10 + g.rng.IntN(16))})
		}
		rec["layers"] = layers
		mf.layers = len(layers)
		if g.rng.IntN(10) == 0 {
			mf.subjectDigest = g.digest("subject")
			rec["subject"] = obj{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mf.subjectDigest, "size": 700}
		}
	}
	rec["mediaType"] = mf.mediaType
	g.annotate(mf, rec)
	g.m.addManifest(mf)
	g.m.ensureUser(did, g.t)
	return g.commit(did, "create", colManifest, mf.rkey, rec), true
}

func (g *Generator) annotate(mf *manifestM, rec obj) {
	clear(mf.annotations)
	for range g.rng.IntN(3) {
		k := []string{"org.opencontainers.image.source", "org.opencontainers.image.version", "org.opencontainers.image.title",
			"org.opencontainers.image.created"}[g.rng.IntN(4)]
		mf.annotations[k] = fmt.Sprintf("v%d", g.rng.IntN(100))
		if k == "org.opencontainers.image.created" { // RFC 3339 (OCI image-spec annotations)
			mf.annotations[k] = datetime(mf.createdAt)
		}
	}
	if len(mf.annotations) > 0 {
		a := obj{}
		for k, v := range mf.annotations {
			a[k] = v
		}
		rec["annotations"] = a
	}
}

// manifestRecord rebuilds the record of a stored manifest (for an update).
func (g *Generator) manifestRecord(mf *manifestM) obj {
	rec := obj{"$type": colManifest, "repository": mf.repo, "digest": mf.digest, "mediaType": mf.mediaType,
		"schemaVersion": mf.schemaVersion, "createdAt": datetime(mf.createdAt)}
	if mf.holdEndpoint != "" {
		rec["holdEndpoint"] = mf.holdEndpoint
	} else {
		rec["holdDid"] = mf.holdDID
	}
	if mf.configDigest != "" {
		rec["config"] = obj{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": mf.configDigest, "size": 1234}
	}
	var layers []obj
	for i := range mf.layers {
		layers = append(layers, obj{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": fmt.Sprintf("%s-l%d", mf.digest, i), "size": 4096})
	}
	if len(layers) > 0 {
		rec["layers"] = layers
	}
	var refs []obj
	for i := range mf.refs {
		refs = append(refs, obj{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": fmt.Sprintf("%s-m%d", mf.digest, i), "size": 800,
			"platform": obj{"os": "linux", "architecture": "amd64"}})
	}
	if len(refs) > 0 {
		rec["manifests"] = refs
	}
	if mf.subjectDigest != "" {
		rec["subject"] = obj{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mf.subjectDigest, "size": 700}
	}
	return rec
}

func (g *Generator) updateManifest() (jetstream.Event, bool) {
	key, ok := g.m.manifestPool.pick(g.rng)
	if !ok {
		return jetstream.Event{}, false
	}
	mf := g.m.manifests[key]
	rec := g.manifestRecord(mf)
	// Older records carry mediaType inside the record; keep it.
	rec["mediaType"] = mf.mediaType
	g.annotate(mf, rec)
	g.m.ensureUser(mf.did, g.t)
	return g.commit(mf.did, "update", colManifest, mf.rkey, rec), true
}

func (g *Generator) deleteManifest() (jetstream.Event, bool) {
	key, ok := g.m.manifestPool.pick(g.rng)
	if !ok {
		return jetstream.Event{}, false
	}
	mf := g.m.manifests[key]
	g.m.removeManifest(key)
	return g.commit(mf.did, "delete", colManifest, mf.rkey, nil), true
}

func (g *Generator) setTag() (jetstream.Event, bool) {
	key, ok := g.m.manifestPool.pick(g.rng)
	if !ok {
		return jetstream.Event{}, false
	}
	mf := g.m.manifests[key]
	tk := tagKey{mf.did, mf.repo, tagNames[g.rng.IntN(len(tagNames))]}
	tg, exists := g.m.tags[tk]
	op := "update"
	if !exists {
		op = "create"
		tg = &tagM{rkey: g.tid(), createdAt: g.ms()}
		g.m.tags[tk] = tg
		g.m.tagPool.add(tk)
	}
	tg.digest, tg.updatedAt = mf.digest, g.ms()
	rec := obj{"$type": colTag, "repository": tk.repo, "tag": tk.tag, "createdAt": datetime(tg.createdAt), "updatedAt": datetime(tg.updatedAt)}
	if g.rng.IntN(5) == 0 {
		rec["manifestDigest"] = mf.digest
	} else {
		rec["manifest"] = "at://" + mf.did + "/" + colManifest + "/" + mf.rkey
	}
	g.m.ensureUser(mf.did, g.t)
	return g.commit(tk.did, op, colTag, tg.rkey, rec), true
}

func (g *Generator) deleteTag() (jetstream.Event, bool) {
	tk, ok := g.m.tagPool.pick(g.rng)
	if !ok {
		return jetstream.Event{}, false
	}
	tg := g.m.tags[tk]
	delete(g.m.tags, tk)
	g.m.tagPool.remove(tk)
	return g.commit(tk.did, "delete", colTag, tg.rkey, nil), true
}

func (g *Generator) star() (jetstream.Event, bool) {
	did := g.anyUser()
	subject := repoKey{g.anyUser(), g.anyRepo()}
	if g.m.starred[starredKey{did, subject}] {
		return jetstream.Event{}, false
	}
	sk := starKey{did, g.tid()}
	createdAt := g.ms()
	rec := obj{"$type": colStar, "createdAt": datetime(createdAt)}
	if g.rng.IntN(3) == 0 {
		rec["subject"] = "at://" + subject.did + "/" + colRepoPage + "/" + subject.repo
	} else {
		rec["subject"] = obj{"did": subject.did, "repository": subject.repo}
	}
	g.m.stars[sk] = &starM{subject: subject, createdAt: createdAt}
	g.m.starPool.add(sk)
	g.m.starred[starredKey{did, subject}] = true
	g.m.starsBy[did] = append(g.m.starsBy[did], sk)
	if g.m.ensureUser(did, g.t).active {
		g.m.starCount[subject]++ // an inactive account's stars do not count
	}
	g.m.refresh(subject, g.t)
	return g.commit(did, "create", colStar, sk.rkey, rec), true
}

func (g *Generator) unstar() (jetstream.Event, bool) {
	sk, ok := g.m.starPool.pick(g.rng)
	if !ok {
		return jetstream.Event{}, false
	}
	st := g.m.stars[sk]
	delete(g.m.stars, sk)
	g.m.starPool.remove(sk)
	delete(g.m.starred, starredKey{sk.did, st.subject})
	g.m.starsBy[sk.did] = slices.DeleteFunc(g.m.starsBy[sk.did], func(k starKey) bool { return k == sk })
	if u := g.m.users[sk.did]; u != nil && u.active {
		g.m.starCount[st.subject]--
	}
	g.m.refresh(st.subject, g.t)
	return g.commit(sk.did, "delete", colStar, sk.rkey, nil), true
}

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

func (g *Generator) profile() (jetstream.Event, bool) {
	did := g.anyUser()
	u := g.m.ensureUser(did, g.t)
	created := g.ms() - g.rng.Int64N(100000)
	rec := obj{"$type": colProfile, "createdAt": datetime(created)}
	u.profileCreatedAt, u.profileUpdatedAt = &created, nil
	u.defaultHold, u.autoRemove = "", false
	if g.rng.IntN(2) == 0 {
		v := g.ms()
		u.profileUpdatedAt = &v
		rec["updatedAt"] = datetime(v)
	}
	if g.rng.IntN(2) == 0 {
		u.defaultHold = g.holdDID(g.anyHold())
		rec["defaultHold"] = u.defaultHold
	}
	if g.rng.IntN(3) == 0 {
		u.autoRemove = true
		rec["autoRemoveUntagged"] = true
	}
	u.updatedAt = g.ms()
	return g.commit(did, "create", colProfile, "self", rec), true
}

func (g *Generator) deleteProfile() (jetstream.Event, bool) {
	did := g.anyUser()
	if u := g.m.users[did]; u != nil {
		u.profileCreatedAt, u.profileUpdatedAt, u.defaultHold, u.autoRemove = nil, nil, "", false
		u.updatedAt = g.ms()
	}
	return g.commit(did, "delete", colProfile, "self", nil), true
}

func (g *Generator) repoPage() (jetstream.Event, bool) {
	pk := repoKey{g.anyUser(), g.anyRepo()}
	p, exists := g.m.pages[pk]
	op := "update"
	if !exists {
		op = "create"
		p = &pageM{createdAt: g.ms()}
		g.m.pages[pk] = p
	}
	p.updatedAt = g.ms()
	switch g.rng.IntN(6) {
	case 0: // a page whose whole description is a date
		p.description = time.UnixMilli(p.updatedAt).UTC().Format(time.DateOnly)
	case 1:
		p.description = datetime(p.updatedAt)
	default:
		p.description = fmt.Sprintf("# %s\n\nBuilt %d times.", pk.repo, g.rng.IntN(1000))
	}
	p.avatar = ""
	rec := obj{"$type": colRepoPage, "repository": pk.repo, "description": p.description,
		"createdAt": datetime(p.createdAt), "updatedAt": datetime(p.updatedAt)}
	if g.rng.IntN(3) == 0 {
		p.avatar = "bafkrei" + g.tid()
		rec["avatar"] = obj{"$type": "blob", "ref": obj{"$link": p.avatar}, "mimeType": "image/png", "size": 1234}
	}
	g.m.ensureUser(pk.did, g.t)
	return g.commit(pk.did, op, colRepoPage, pk.repo, rec), true
}

func (g *Generator) deleteRepoPage() (jetstream.Event, bool) {
	pk := repoKey{g.anyUser(), g.anyRepo()}
	delete(g.m.pages, pk)
	return g.commit(pk.did, "delete", colRepoPage, pk.repo, nil), true
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

func (g *Generator) identity() (jetstream.Event, bool) {
	did := g.anyUser()
	if g.rng.IntN(4) == 0 {
		did = fmt.Sprintf("did:plc:outsider%05d", g.rng.IntN(1000))
	}
	handle := fmt.Sprintf("%s-%d.synth.example", strings.TrimPrefix(did, "did:plc:"), g.rng.IntN(10))
	if u := g.m.users[did]; u != nil {
		// The event's handle is never stored (only one verified through
		// the DID document), and the synthetic DIDs resolve nowhere: the
		// row's handle stays empty.
		u.updatedAt = g.ms()
	}
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
	if u := g.m.users[did]; u != nil {
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

// --- the model ------------------------------------------------------------

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

// ensureUser mirrors the processor: the first applied user-repo record
// creates the row.
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
