package processor

import (
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
)

type crewRecord struct {
	recordType
	Member      *string   `json:"member"`
	Role        *string   `json:"role"`
	Permissions *[]string `json:"permissions"`
	AddedAt     *string   `json:"addedAt"`
	Tier        *string   `json:"tier"`
}

// crew is a validated io.atcr.hold.crew record.
type crew struct {
	Member, Role string
	Permissions  string // JSON array of strings
	AddedAt      int64
	Tier         string
}

func decodeCrew(raw json.RawMessage) (*crew, error) {
	var r crewRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionCrew, r.Type)
	c.required("member", r.Member != nil)
	c.required("role", r.Role != nil)
	c.required("permissions", r.Permissions != nil)
	c.required("addedAt", r.AddedAt != nil)
	c.nonEmpty("role", r.Role)
	if c.err != nil {
		return nil, c.err
	}
	c.did("member", *r.Member)
	c.text("role", *r.Role)
	c.text("tier", str(r.Tier))
	for _, p := range *r.Permissions {
		c.text("permissions", p)
	}
	perms, err := json.Marshal(*r.Permissions)
	if err != nil {
		return nil, invalid(ReasonMalformedRecord, "permissions: %v", err)
	}
	return &crew{
		Member:      *r.Member,
		Role:        *r.Role,
		Permissions: string(perms),
		AddedAt:     c.datetime("addedAt", r.AddedAt),
		Tier:        str(r.Tier),
	}, c.err
}

func (a *applier) putCrew(o *op) (bool, error) {
	c := o.crew
	n, err := a.exec(`INSERT INTO hold_crew (hold_did, rkey, member_did, role, permissions, tier, added_at, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (hold_did, rkey) DO UPDATE SET member_did = excluded.member_did, role = excluded.role,
  permissions = excluded.permissions, tier = excluded.tier, added_at = excluded.added_at, source_us = excluded.source_us,
  version = excluded.version
WHERE excluded.version > hold_crew.version`,
		o.did, o.rkey, c.Member, c.Role, c.Permissions, c.Tier, c.AddedAt, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert crew: %w", err)
	}
	return n > 0, nil
}

// deleteCrew removes the crew row o's record stored (see deleteRecord).
func (a *applier) deleteCrew(o *op) (int64, error) {
	return a.exec(`DELETE FROM hold_crew WHERE hold_did = ?1 AND rkey = ?2 AND version <= ?3`, o.did, o.rkey, o.version)
}
