package synth

import (
	"fmt"
	"slices"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
)

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
