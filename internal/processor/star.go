package processor

import (
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
)

type starSubject struct {
	DID        string `json:"did"`
	Repository string `json:"repository"`
}

type starRecord struct {
	recordType
	Subject   json.RawMessage `json:"subject"`
	CreatedAt *string         `json:"createdAt"`
}

// star is a validated io.atcr.sailor.star record.
type star struct {
	OwnerDID, Repository string
	CreatedAt            int64
}

func decodeStar(raw json.RawMessage) (*star, error) {
	var r starRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionStar, r.Type)
	c.required("subject", len(r.Subject) > 0 && string(r.Subject) != "null")
	c.required("createdAt", r.CreatedAt != nil)
	s := &star{CreatedAt: c.datetime("createdAt", r.CreatedAt)}
	if c.err != nil {
		return nil, c.err
	}
	// Two published shapes: an object {did, repository}, or the at-uri of
	// the starred repository's io.atcr.repo.page record.
	var uri string
	if atproto.Unmarshal(r.Subject, &uri) == nil {
		did, coll, rkey, ok := parseATURI(uri)
		if !ok || coll != CollectionRepoPage {
			return nil, invalid(ReasonBadValue, "subject %q is not an at-uri of an %s record", uri, CollectionRepoPage)
		}
		s.OwnerDID, s.Repository = did, rkey
	} else {
		var obj starSubject
		if err := atproto.Unmarshal(r.Subject, &obj); err != nil {
			return nil, invalid(ReasonMalformedRecord, "subject: %v", err)
		}
		s.OwnerDID, s.Repository = obj.DID, obj.Repository
		c.required("subject.did", obj.DID != "")
		c.required("subject.repository", obj.Repository != "")
	}
	c.did("subject.did", s.OwnerDID)
	c.maxLen("subject.repository", s.Repository, maxPageRepositoryLen)
	c.repository("subject.repository", s.Repository)
	return s, c.err
}

func (a *applier) putStar(o *op) (bool, error) {
	s := o.star
	n, err := a.exec(`INSERT INTO stars (did, rkey, owner_did, repository, created_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
ON CONFLICT (did, rkey) DO NOTHING`, o.did, o.rkey, s.OwnerDID, s.Repository, s.CreatedAt, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("insert star: %w", err)
	}
	if n == 0 {
		// An update of a stored star, or a replay: it may move the star to
		// another repository, whose count changes too.
		var oldOwner, oldRepo, version string
		if _, err := a.queryRow(`SELECT `+database.Text("owner_did")+`, `+database.Text("repository")+`, `+database.Text("version")+`
FROM stars WHERE did = ?1 AND rkey = ?2`,
			[]any{o.did, o.rkey}, &oldOwner, &oldRepo, &version); err != nil {
			return false, fmt.Errorf("read star: %w", err)
		}
		if version >= o.version {
			return false, nil
		}
		if _, err := a.exec(`UPDATE stars SET owner_did = ?3, repository = ?4, created_at = ?5, source_us = ?6, version = ?7
WHERE did = ?1 AND rkey = ?2`, o.did, o.rkey, s.OwnerDID, s.Repository, s.CreatedAt, o.ev.TimeUS, o.version); err != nil {
			return false, fmt.Errorf("update star: %w", err)
		}
		if oldOwner != s.OwnerDID || oldRepo != s.Repository {
			a.pendingTouched = append(a.pendingTouched, repoKey{oldOwner, oldRepo})
		}
	}
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	a.pendingTouched = append(a.pendingTouched, repoKey{s.OwnerDID, s.Repository})
	return true, nil
}

// deleteStar removes the star o's record stored (see deleteRecord), in
// one statement that reads its subject back (stars is keyed by (did,
// rkey), so at most one row): that repository's count changes.
func (a *applier) deleteStar(o *op) (int64, error) {
	var owner, repo string
	found, err := a.queryRow(`DELETE FROM stars WHERE did = ?1 AND rkey = ?2 AND version <= ?3
RETURNING `+database.Text("owner_did")+`, `+database.Text("repository"),
		[]any{o.did, o.rkey, o.version}, &owner, &repo)
	if err != nil || !found {
		return 0, err
	}
	a.pendingTouched = append(a.pendingTouched, repoKey{owner, repo})
	return 1, nil
}
