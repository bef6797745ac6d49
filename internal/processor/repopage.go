package processor

import (
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/bluesky-social/indigo/atproto/syntax"
)

// atprotoBlob is a blob reference in either form the data model has
// (atproto.com/specs/data-model, "Blob Type"): the current one,
// {"$type": "blob", "ref": {"$link": CID}, "mimeType", "size"}, or the
// legacy one still found in old records, {"cid": CID, "mimeType"}, which
// implementations must keep reading.
type atprotoBlob struct {
	Ref *struct {
		Link string `json:"$link"`
	} `json:"ref"`
	// LegacyCID is the legacy form's "cid".
	LegacyCID string `json:"cid"`
}

// cid returns the blob's CID, from whichever form it is in ("" for
// neither).
func (b *atprotoBlob) cid() string {
	if b.Ref != nil && b.Ref.Link != "" {
		return b.Ref.Link
	}
	return b.LegacyCID
}

type repoPageRecord struct {
	recordType
	Repository  *string      `json:"repository"`
	Description *string      `json:"description"`
	Avatar      *atprotoBlob `json:"avatar"`
	CreatedAt   *string      `json:"createdAt"`
	UpdatedAt   *string      `json:"updatedAt"`
}

// repoPage is a validated io.atcr.repo.page record.
type repoPage struct {
	Repository, Description, AvatarCID string
	CreatedAt, UpdatedAt               int64
}

func decodeRepoPage(raw json.RawMessage) (*repoPage, error) {
	var r repoPageRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionRepoPage, r.Type)
	c.required("repository", r.Repository != nil)
	c.required("createdAt", r.CreatedAt != nil)
	c.required("updatedAt", r.UpdatedAt != nil)
	c.nonEmpty("repository", r.Repository)
	c.maxLen("repository", str(r.Repository), maxPageRepositoryLen)
	c.maxLen("description", str(r.Description), maxDescriptionLen)
	c.repository("repository", str(r.Repository))
	c.text("description", str(r.Description))
	p := &repoPage{
		Repository:  str(r.Repository),
		Description: str(r.Description),
		CreatedAt:   c.datetime("createdAt", r.CreatedAt),
		UpdatedAt:   c.datetime("updatedAt", r.UpdatedAt),
	}
	if r.Avatar != nil {
		p.AvatarCID = r.Avatar.cid()
		if _, err := syntax.ParseCID(p.AvatarCID); err != nil && c.err == nil {
			c.err = invalid(ReasonBadValue, "avatar: %q is not a CID (in either blob form)", p.AvatarCID)
		}
	}
	return p, c.err
}

func (a *applier) putRepoPage(o *op) (bool, error) {
	p := o.page
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	n, err := a.exec(`INSERT INTO repo_pages (did, repository, rkey, description, avatar_cid, created_at, updated_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (did, repository) DO UPDATE SET rkey = excluded.rkey, description = excluded.description,
  avatar_cid = excluded.avatar_cid, created_at = excluded.created_at, updated_at = excluded.updated_at,
  source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > repo_pages.version`,
		o.did, p.Repository, o.rkey, p.Description, p.AvatarCID, p.CreatedAt, p.UpdatedAt, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert repo page: %w", err)
	}
	return n > 0, nil
}

// newerRepoPageSQL: see newerVersionSQL.
const newerRepoPageSQL = `SELECT 1 FROM repo_pages WHERE did = ?1 AND rkey = ?2 AND version > ?3 LIMIT 1`

// dropMovedRepoPage removes the page an older version of o's record
// stored under another repository (see dropMoved).
func (a *applier) dropMovedRepoPage(o *op) error {
	_, err := a.exec(`DELETE FROM repo_pages WHERE did = ?1 AND rkey = ?2 AND version < ?3 AND repository <> ?4`,
		o.did, o.rkey, o.version, o.page.Repository)
	return err
}

// deleteRepoPage removes the page o's record stored (see deleteRecord).
func (a *applier) deleteRepoPage(o *op) (int64, error) {
	return a.exec(`DELETE FROM repo_pages WHERE did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, o.version)
}
