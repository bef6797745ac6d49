package processor

import (
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
)

type profileRecord struct {
	recordType
	CreatedAt          *string `json:"createdAt"`
	UpdatedAt          *string `json:"updatedAt"`
	DefaultHold        *string `json:"defaultHold"`
	AutoRemoveUntagged *bool   `json:"autoRemoveUntagged"`
}

// profile is a validated io.atcr.sailor.profile record.
type profile struct {
	CreatedAt, UpdatedAt int64 // UpdatedAt 0 when absent
	DefaultHold          string
	AutoRemoveUntagged   bool
}

func decodeProfile(rkey string, raw json.RawMessage) (*profile, error) {
	var r profileRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionProfile, r.Type)
	if rkey != "self" {
		c.err = invalid(ReasonBadValue, "record key %q, want literal self", rkey)
	}
	c.required("createdAt", r.CreatedAt != nil)
	p := &profile{
		CreatedAt:   c.datetime("createdAt", r.CreatedAt),
		UpdatedAt:   c.datetime("updatedAt", r.UpdatedAt),
		DefaultHold: str(r.DefaultHold),
	}
	if p.DefaultHold != "" {
		c.did("defaultHold", p.DefaultHold)
	}
	if r.AutoRemoveUntagged != nil {
		p.AutoRemoveUntagged = *r.AutoRemoveUntagged
	}
	return p, c.err
}

func (a *applier) putProfile(o *op) (bool, error) {
	p := o.profile
	if err := a.ensureUser(o); err != nil {
		return false, err
	}
	var updatedAt any
	if p.UpdatedAt != 0 {
		updatedAt = p.UpdatedAt
	}
	n, err := a.exec(`UPDATE users SET default_hold = ?1, auto_remove_untagged = ?2, profile_created_at = ?3,
  profile_updated_at = ?4, profile_us = ?5, updated_at = ?6, profile_version = ?8
WHERE did = ?7 AND profile_version < ?8`, p.DefaultHold, p.AutoRemoveUntagged, p.CreatedAt, updatedAt,
		o.ev.TimeUS, o.ev.TimeUS/1000, o.did, o.version)
	if err != nil {
		return false, fmt.Errorf("update profile: %w", err)
	}
	return n > 0, nil
}

// deleteProfile clears the profile o's record set on its users row (see
// deleteRecord); the row itself stays.
func (a *applier) deleteProfile(o *op) (int64, error) {
	t := o.ev.TimeUS
	return a.exec(`UPDATE users SET default_hold = '', auto_remove_untagged = 0, profile_created_at = NULL,
  profile_updated_at = NULL, profile_us = ?2, updated_at = ?3, profile_version = ?4
WHERE did = ?1 AND (profile_version < ?4 OR (profile_version = ?4 AND profile_created_at IS NOT NULL))`, o.did, t, t/1000, o.version)
}
