package processor

import (
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
)

type tagRecord struct {
	recordType
	Repository     *string `json:"repository"`
	Tag            *string `json:"tag"`
	Manifest       *string `json:"manifest"`
	ManifestDigest *string `json:"manifestDigest"`
	CreatedAt      *string `json:"createdAt"`
	UpdatedAt      *string `json:"updatedAt"`
}

// tag is a validated io.atcr.tag record. The digest is resolved at apply
// time: from the manifest record the at-uri names, else ManifestDigest.
type tag struct {
	Repository, Tag string
	// ManifestDID and ManifestRKey locate the manifest record of the
	// at-uri in Manifest ("" when absent).
	ManifestDID, ManifestRKey string
	ManifestDigest            string
	CreatedAt, UpdatedAt      int64 // Unix ms; 0 when absent
}

func decodeTag(raw json.RawMessage) (*tag, error) {
	var r tagRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionTag, r.Type)
	c.required("repository", r.Repository != nil)
	c.required("tag", r.Tag != nil)
	c.nonEmpty("repository", r.Repository)
	c.nonEmpty("tag", r.Tag)
	c.maxLen("repository", str(r.Repository), maxRepositoryLen)
	c.maxLen("tag", str(r.Tag), maxTagLen)
	c.maxLen("manifestDigest", str(r.ManifestDigest), maxDigestLen)
	c.repository("repository", str(r.Repository))
	c.tagName("tag", str(r.Tag))
	c.key("manifestDigest", str(r.ManifestDigest))
	c.digest("manifestDigest", str(r.ManifestDigest))
	t := &tag{
		Repository:     str(r.Repository),
		Tag:            str(r.Tag),
		ManifestDigest: str(r.ManifestDigest),
		CreatedAt:      c.datetime("createdAt", r.CreatedAt),
		UpdatedAt:      c.datetime("updatedAt", r.UpdatedAt),
	}
	if r.Manifest != nil && *r.Manifest != "" {
		did, coll, rkey, ok := parseATURI(*r.Manifest)
		if (!ok || coll != CollectionManifest) && c.err == nil {
			c.err = invalid(ReasonBadValue, "manifest %q is not an at-uri of an %s record", *r.Manifest, CollectionManifest)
		}
		t.ManifestDID, t.ManifestRKey = did, rkey
	}
	if c.err == nil && t.ManifestRKey == "" && t.ManifestDigest == "" {
		c.err = invalid(ReasonMissingField, "one of manifest and manifestDigest is required")
	}
	return t, c.err
}

// tagConflict is the newer-wins update of a tag row, shared by every
// tag upsert (putTag, resolvePending).
const tagConflict = `ON CONFLICT (did, repository, tag) DO UPDATE SET digest = excluded.digest, rkey = excluded.rkey,
  created_at = excluded.created_at, updated_at = excluded.updated_at, source_us = excluded.source_us,
  version = excluded.version
WHERE excluded.version > tags.version`

func (a *applier) putTag(o *op) (bool, error) {
	t := o.tag
	at := o.ev.TimeUS / 1000
	createdAt, updatedAt := t.CreatedAt, t.UpdatedAt
	if createdAt == 0 {
		createdAt = at
	}
	if updatedAt == 0 {
		updatedAt = createdAt
	}
	// The digest comes from the manifest record the at-uri names, else
	// from manifestDigest; resolving inside the upsert saves a query. With
	// neither, the digest is NULL and OR IGNORE drops the row (digest is
	// NOT NULL). A one-row VALUES, not INSERT ... SELECT: SQLite opens a
	// statement sub-journal for a statement that may write several rows,
	// which doubled the cost of this one.
	n, err := a.exec(`INSERT OR IGNORE INTO tags (did, repository, tag, digest, rkey, created_at, updated_at, source_us, version)
VALUES (?1, ?2, ?3, NULLIF(COALESCE(
    (SELECT digest FROM manifests WHERE did = ?9 AND rkey = ?10 ORDER BY version DESC LIMIT 1), ?4), ''), ?5, ?6, ?7, ?8, ?11)
`+tagConflict,
		o.did, t.Repository, t.Tag, t.ManifestDigest, o.rkey, createdAt, updatedAt, o.ev.TimeUS, t.ManifestDID, t.ManifestRKey, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert tag: %w", err)
	}
	if n > 0 {
		if err := a.dropPending(o); err != nil {
			return false, err
		}
		return true, a.ensureUser(o)
	}
	if t.ManifestDigest != "" {
		return false, nil // older than the stored tag
	}
	var digest string
	found, err := a.queryRow(`SELECT `+database.Text("digest")+`
FROM manifests WHERE did = ?1 AND rkey = ?2`, []any{t.ManifestDID, t.ManifestRKey}, &digest)
	if err != nil {
		return false, fmt.Errorf("resolve tag manifest: %w", err)
	}
	if !found {
		// A replay of a stored tag (its manifest since deleted) changes
		// nothing; a tag naming a deleted manifest is dangling.
		if replay, err := a.exists(`SELECT 1 FROM tags WHERE did = ?1 AND rkey = ?2 AND version >= ?3`,
			o.did, o.rkey, o.version); err != nil || replay {
			return false, err
		}
		if gone, err := a.exists(`SELECT 1 FROM record_tombstones WHERE did = ?1 AND collection = ?2 AND rkey = ?3`,
			t.ManifestDID, CollectionManifest, t.ManifestRKey); err != nil {
			return false, err
		} else if gone {
			// The record's older pending version is replaced by this
			// one, which names nothing: it must not be resolved later.
			if err := a.dropPending(o); err != nil {
				return false, err
			}
			return false, invalid(ReasonUnresolvedManifest, "manifest at://%s/%s/%s was deleted and the tag has no manifestDigest",
				t.ManifestDID, CollectionManifest, t.ManifestRKey)
		}
		// Not stored yet: any event may arrive late. The tag is kept
		// until its manifest arrives (putManifest resolves it).
		n, err := a.exec(`INSERT INTO pending_tags (did, rkey, repository, tag, manifest_did, manifest_rkey, created_at, updated_at,
  source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
ON CONFLICT (did, rkey) DO UPDATE SET repository = excluded.repository, tag = excluded.tag,
  manifest_did = excluded.manifest_did, manifest_rkey = excluded.manifest_rkey, created_at = excluded.created_at,
  updated_at = excluded.updated_at, source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > pending_tags.version`,
			o.did, o.rkey, t.Repository, t.Tag, t.ManifestDID, t.ManifestRKey, createdAt, updatedAt, o.ev.TimeUS, o.version)
		if err != nil {
			return false, fmt.Errorf("keep tag pending: %w", err)
		}
		a.pend(o.did, t.ManifestDID)
		if n > 0 {
			return true, a.ensureUser(o)
		}
		return false, nil
	}
	return false, nil // older than the stored tag
}

// dropPending removes the pending_tags row of o's tag record, if one is
// older than o: the record is now stored, replaced or deleted.
func (a *applier) dropPending(o *op) error {
	if !a.mayPend(o.did) {
		return nil
	}
	if _, err := a.exec(`DELETE FROM pending_tags WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, o.version); err != nil {
		return fmt.Errorf("drop pending tag: %w", err)
	}
	return nil
}

// resolvePending writes the tags kept pending for the manifest record
// (did, rkey), now stored with digest, and removes them from
// pending_tags.
func (a *applier) resolvePending(did, rkey, digest string) error {
	if !a.mayPend(did) {
		return nil
	}
	type pendingTag struct {
		did, rkey, repository, tag, version string
		createdAt, updatedAt, sourceUS      int64
	}
	rows, err := a.tx.QueryContext(a.ctx, `SELECT `+database.Text("did")+`, `+database.Text("rkey")+`, `+
		database.Text("repository")+`, `+database.Text("tag")+`, `+database.Text("version")+`, created_at, updated_at, source_us
FROM pending_tags WHERE manifest_did = ?1 AND manifest_rkey = ?2`, did, rkey)
	if err != nil {
		return fmt.Errorf("read pending tags: %w", err)
	}
	var found []pendingTag
	for rows.Next() {
		var p pendingTag
		if err := rows.Scan(&p.did, &p.rkey, &p.repository, &p.tag, &p.version, &p.createdAt, &p.updatedAt, &p.sourceUS); err != nil {
			rows.Close()
			return fmt.Errorf("read pending tags: %w", err)
		}
		found = append(found, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read pending tags: %w", err)
	}
	for _, p := range found {
		if _, err := a.exec(`INSERT INTO tags (did, repository, tag, digest, rkey, created_at, updated_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
`+tagConflict,
			p.did, p.repository, p.tag, digest, p.rkey, p.createdAt, p.updatedAt, p.sourceUS, p.version); err != nil {
			return fmt.Errorf("write pending tag: %w", err)
		}
		if _, err := a.exec(`DELETE FROM pending_tags WHERE did = ?1 AND rkey = ?2`, p.did, p.rkey); err != nil {
			return fmt.Errorf("drop pending tag: %w", err)
		}
	}
	return nil
}

// newerTagSQL: see newerVersionSQL.
const newerTagSQL = `SELECT 1 FROM tags WHERE did = ?1 AND rkey = ?2 AND version > ?3
UNION ALL SELECT 1 FROM pending_tags WHERE did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`

// dropMovedTag removes the tag an older version of o's record stored
// under another repository or tag name (see dropMoved).
func (a *applier) dropMovedTag(o *op) error {
	_, err := a.exec(`DELETE FROM tags WHERE did = ?1 AND rkey = ?2 AND version < ?3
  AND NOT (repository = ?4 AND tag = ?5)`, o.did, o.rkey, o.version, o.tag.Repository, o.tag.Tag)
	return err
}

// deleteTag removes the tag o's record stored, and its pending version
// (see deleteRecord).
func (a *applier) deleteTag(o *op) (int64, error) {
	n, err := a.exec(`DELETE FROM tags WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, o.version)
	if err == nil {
		err = a.dropPending(o)
	}
	return n, err
}
