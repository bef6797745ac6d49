package processor

import (
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
)

// blobRef is the {mediaType, digest, size} descriptor of io.atcr.manifest.
type blobRef struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

type platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant"`
}

type manifestRef struct {
	blobRef
	Platform *platform `json:"platform"`
}

type manifestRecord struct {
	recordType
	Repository    *string           `json:"repository"`
	Digest        *string           `json:"digest"`
	MediaType     *string           `json:"mediaType"`
	SchemaVersion *int64            `json:"schemaVersion"`
	CreatedAt     *string           `json:"createdAt"`
	HoldDID       *string           `json:"holdDid"`
	HoldEndpoint  *string           `json:"holdEndpoint"`
	Config        *blobRef          `json:"config"`
	Subject       *blobRef          `json:"subject"`
	Layers        []blobRef         `json:"layers"`
	Manifests     []manifestRef     `json:"manifests"`
	Annotations   map[string]string `json:"annotations"`
}

// manifest is a validated io.atcr.manifest record.
type manifest struct {
	Repository, Digest, MediaType string
	SchemaVersion                 int64
	CreatedAt                     int64 // Unix ms
	HoldDID, HoldEndpoint         string
	ConfigDigest                  string
	ConfigSize                    int64
	SubjectDigest                 string
	Layers                        []blobRef
	Manifests                     []manifestRef
	Annotations                   map[string]string
}

func decodeManifest(raw json.RawMessage) (*manifest, error) {
	var r manifestRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionManifest, r.Type)
	c.required("repository", r.Repository != nil)
	c.required("digest", r.Digest != nil)
	c.required("mediaType", r.MediaType != nil)
	c.required("schemaVersion", r.SchemaVersion != nil)
	c.required("createdAt", r.CreatedAt != nil)
	c.nonEmpty("repository", r.Repository)
	c.nonEmpty("digest", r.Digest)
	c.maxLen("repository", str(r.Repository), maxRepositoryLen)
	c.maxLen("digest", str(r.Digest), maxDigestLen)
	c.maxLen("mediaType", str(r.MediaType), maxMediaTypeLen)
	c.nonEmpty("mediaType", r.MediaType)
	c.repository("repository", str(r.Repository))
	c.key("digest", str(r.Digest))
	c.digest("digest", str(r.Digest))
	c.elements("layers", len(r.Layers))
	c.elements("manifests", len(r.Manifests))
	c.elements("annotations", len(r.Annotations))
	if r.SchemaVersion != nil {
		c.count("schemaVersion", *r.SchemaVersion)
	}
	if r.Config != nil {
		c.blob("config", r.Config)
	}
	if r.Subject != nil {
		c.blob("subject", r.Subject)
	}
	for i := range r.Layers {
		c.blob("layers", &r.Layers[i])
	}
	for i := range r.Manifests {
		c.blob("manifests", &r.Manifests[i].blobRef)
		if p := r.Manifests[i].Platform; p != nil {
			c.text("manifests.platform.os", p.OS)
			c.text("manifests.platform.architecture", p.Architecture)
			c.text("manifests.platform.variant", p.Variant)
		}
	}
	c.text("mediaType", str(r.MediaType))
	c.text("holdEndpoint", str(r.HoldEndpoint))
	for k, v := range r.Annotations {
		c.text("annotations key", k)
		c.text("annotations."+k, v)
	}
	m := &manifest{
		Repository:   str(r.Repository),
		Digest:       str(r.Digest),
		MediaType:    str(r.MediaType),
		CreatedAt:    c.datetime("createdAt", r.CreatedAt),
		HoldEndpoint: str(r.HoldEndpoint),
		Layers:       r.Layers,
		Manifests:    r.Manifests,
		Annotations:  r.Annotations,
	}
	if r.SchemaVersion != nil {
		m.SchemaVersion = *r.SchemaVersion
	}
	switch {
	case r.HoldDID != nil && *r.HoldDID != "":
		c.did("holdDid", *r.HoldDID)
		m.HoldDID = *r.HoldDID
	case m.HoldEndpoint != "":
		did, err := HoldDIDFromEndpoint(m.HoldEndpoint)
		if err != nil && c.err == nil {
			c.err = invalid(ReasonBadValue, "holdEndpoint: %v", err)
		}
		m.HoldDID = did
	}
	if r.Config != nil {
		m.ConfigDigest, m.ConfigSize = r.Config.Digest, r.Config.Size
	}
	if r.Subject != nil {
		m.SubjectDigest = r.Subject.Digest
	}
	return m, c.err
}

// HoldDIDFromEndpoint derives a hold's did:web from the legacy holdEndpoint
// URL of io.atcr.manifest (did:web method: the host, a port percent-encoded
// as %3A, path segments joined by ":"), e.g. https://hold01.example.com →
// did:web:hold01.example.com. One hold has one DID however its URL is
// spelled: the host is lower-cased, a fully qualified name's trailing dot
// and the scheme's default port (https 443, http 80) are dropped. It
// returns an error for a URL without a host, or one no did:web can name.
func HoldDIDFromEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", err
	}
	if u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return "", fmt.Errorf("%q is not an http(s) URL with a host", endpoint)
	}
	host := strings.TrimSuffix(strings.ToLower(u.Host), ".")
	if port := u.Port(); port != "" {
		name := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
		if strings.Contains(name, ":") {
			name = "[" + name + "]" // an IPv6 literal: refused below
		}
		host = name
		if !(u.Scheme == "https" && port == "443") && !(u.Scheme == "http" && port == "80") {
			host += ":" + port
		}
	}
	did := "did:web:" + strings.ReplaceAll(host, ":", "%3A")
	for _, seg := range strings.Split(strings.Trim(u.Path, "/"), "/") {
		if seg != "" {
			did += ":" + seg
		}
	}
	if !validDID(did) {
		// A host or path with characters the DID syntax refuses (an
		// IPv6 literal's brackets, a space) names no hold.
		return "", fmt.Errorf("%q does not make a valid did:web (%q)", endpoint, did)
	}
	return did, nil
}

func (a *applier) putManifest(o *op) (bool, error) {
	m := o.manifest
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	// Exec, not INSERT ... RETURNING: go-libsql's query path costs about
	// three times its exec path, and the new row's id is LastInsertId.
	r, err := a.tx.ExecContext(a.ctx, `INSERT INTO manifests (did, repository, digest, rkey, cid, hold_did, hold_endpoint, media_type,
  schema_version, config_digest, config_size, subject_digest, created_at, indexed_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)
ON CONFLICT (did, repository, digest) DO NOTHING`,
		o.did, m.Repository, m.Digest, o.rkey, o.cid, m.HoldDID, m.HoldEndpoint, m.MediaType,
		m.SchemaVersion, m.ConfigDigest, m.ConfigSize, m.SubjectDigest, m.CreatedAt, o.ev.TimeUS/1000, o.ev.TimeUS, o.version)
	var inserted int64
	if err == nil {
		inserted, err = r.RowsAffected()
		a.wrote = a.wrote || inserted > 0 || err != nil
	}
	var id int64
	if err == nil && inserted > 0 {
		id, err = r.LastInsertId()
	}
	if err != nil {
		return false, fmt.Errorf("insert manifest: %w", err)
	}
	if inserted > 0 {
		a.pendingManifests = append(a.pendingManifests, NewManifest{
			OwnerDID: o.did, Repository: m.Repository, Digest: m.Digest, MediaType: m.MediaType,
			HoldDID: m.HoldDID, HoldEndpoint: m.HoldEndpoint, PushedAt: m.CreatedAt,
		})
	} else {
		// indexed_at keeps the time the row was first stored.
		updated, err := a.queryRow(`UPDATE manifests SET rkey = ?4, cid = ?5, hold_did = ?6, hold_endpoint = ?7, media_type = ?8,
  schema_version = ?9, config_digest = ?10, config_size = ?11, subject_digest = ?12, created_at = ?13, source_us = ?14,
  version = ?15
WHERE did = ?1 AND repository = ?2 AND digest = ?3 AND version < ?15 RETURNING id`,
			[]any{o.did, m.Repository, m.Digest, o.rkey, o.cid, m.HoldDID, m.HoldEndpoint, m.MediaType,
				m.SchemaVersion, m.ConfigDigest, m.ConfigSize, m.SubjectDigest, m.CreatedAt, o.ev.TimeUS, o.version}, &id)
		if err != nil {
			return false, fmt.Errorf("update manifest: %w", err)
		}
		if !updated {
			return false, nil
		}
		for _, q := range []string{
			`DELETE FROM manifest_layers WHERE manifest_id = ?1`,
			`DELETE FROM manifest_references WHERE manifest_id = ?1`,
			`DELETE FROM manifest_annotations WHERE manifest_id = ?1`,
		} {
			if _, err := a.exec(q, id); err != nil {
				return false, fmt.Errorf("replace manifest children: %w", err)
			}
		}
	}
	if err := a.putManifestChildren(id, m); err != nil {
		return false, err
	}
	return true, a.resolvePending(o.did, o.rkey, m.Digest)
}

// putManifestChildren inserts layers, references and annotations: a
// multi-row INSERT per kind, split by database.Chunks, so a record with any
// number of them fits the database's parameter limit.
func (a *applier) putManifestChildren(id int64, m *manifest) error {
	err := database.Chunks(len(m.Layers), 5, 0, func(lo, hi int) error {
		args := make([]any, 0, 5*(hi-lo))
		for i := lo; i < hi; i++ {
			l := &m.Layers[i]
			args = append(args, id, i, l.Digest, l.Size, l.MediaType)
		}
		if _, err := a.exec(`INSERT INTO manifest_layers (manifest_id, position, digest, size, media_type) VALUES `+
			database.Values(hi-lo, 5), args...); err != nil {
			return fmt.Errorf("insert layers %d-%d of %d: %w", lo, hi-1, len(m.Layers), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	err = database.Chunks(len(m.Manifests), 8, 0, func(lo, hi int) error {
		args := make([]any, 0, 8*(hi-lo))
		for i := lo; i < hi; i++ {
			r := &m.Manifests[i]
			var p platform
			if r.Platform != nil {
				p = *r.Platform
			}
			args = append(args, id, i, r.Digest, r.Size, r.MediaType, p.OS, p.Architecture, p.Variant)
		}
		if _, err := a.exec(`INSERT INTO manifest_references (manifest_id, position, digest, size, media_type,
  platform_os, platform_arch, platform_variant) VALUES `+database.Values(hi-lo, 8), args...); err != nil {
			return fmt.Errorf("insert manifest references %d-%d of %d: %w", lo, hi-1, len(m.Manifests), err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(m.Annotations))
	for k := range m.Annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys) // a stable insert order keeps two databases fed the same events identical
	return database.Chunks(len(keys), 3, 0, func(lo, hi int) error {
		args := make([]any, 0, 3*(hi-lo))
		for _, k := range keys[lo:hi] {
			args = append(args, id, k, m.Annotations[k])
		}
		if _, err := a.exec(`INSERT INTO manifest_annotations (manifest_id, key, value) VALUES `+
			database.Values(hi-lo, 3), args...); err != nil {
			return fmt.Errorf("insert annotations %d-%d of %d: %w", lo, hi-1, len(keys), err)
		}
		return nil
	})
}

// newerManifestSQL: see newerVersionSQL.
const newerManifestSQL = `SELECT 1 FROM manifests WHERE did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`

// dropMovedManifest removes the manifest an older version of o's record
// stored under another repository or digest (see dropMoved). Layers,
// references and annotations go with it (ON DELETE CASCADE).
func (a *applier) dropMovedManifest(o *op) error {
	_, err := a.exec(`DELETE FROM manifests WHERE did = ?1 AND rkey = ?2 AND version < ?3
  AND NOT (repository = ?4 AND digest = ?5)`, o.did, o.rkey, o.version, o.manifest.Repository, o.manifest.Digest)
	return err
}

// deleteManifest removes the manifest o's record stored (see
// deleteRecord); layers, references and annotations go with it (ON
// DELETE CASCADE), and the tags kept pending for it.
func (a *applier) deleteManifest(o *op) (int64, error) {
	n, err := a.exec(`DELETE FROM manifests WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, o.version)
	if err == nil && a.mayPend(o.did) {
		// Tags waiting for this manifest wait for nothing now.
		_, err = a.exec(`DELETE FROM pending_tags WHERE manifest_did = ?1 AND manifest_rkey = ?2`, o.did, o.rkey)
	}
	return n, err
}
