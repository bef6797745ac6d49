package processor

import (
	"encoding/json"
	"fmt"

	"github.com/atcr-io/appview/internal/atproto"
)

type captainRecord struct {
	recordType
	Owner              *string `json:"owner"`
	Public             *bool   `json:"public"`
	AllowAllCrew       *bool   `json:"allowAllCrew"`
	EnableBlueskyPosts *bool   `json:"enableBlueskyPosts"`
	DeployedAt         *string `json:"deployedAt"`
	Region             *string `json:"region"`
	Provider           *string `json:"provider"`
	Successor          *string `json:"successor"`
}

// captain is a validated io.atcr.hold.captain record.
type captain struct {
	Owner                                    string
	Public, AllowAllCrew, EnableBlueskyPosts bool
	DeployedAt                               int64
	Region, Provider, Successor              string
}

func decodeCaptain(rkey string, raw json.RawMessage) (*captain, error) {
	var r captainRecord
	if err := atproto.Unmarshal(raw, &r); err != nil {
		return nil, invalid(ReasonMalformedRecord, "%v", err)
	}
	var c check
	c.recordType(CollectionCaptain, r.Type)
	if rkey != "self" {
		c.err = invalid(ReasonBadValue, "record key %q, want literal self", rkey)
	}
	c.required("owner", r.Owner != nil)
	c.required("public", r.Public != nil)
	c.required("allowAllCrew", r.AllowAllCrew != nil)
	c.required("enableBlueskyPosts", r.EnableBlueskyPosts != nil)
	c.required("deployedAt", r.DeployedAt != nil)
	if c.err != nil {
		return nil, c.err
	}
	c.did("owner", *r.Owner)
	if s := str(r.Successor); s != "" {
		c.did("successor", s)
	}
	c.text("region", str(r.Region))
	c.text("provider", str(r.Provider))
	return &captain{
		Owner:              *r.Owner,
		Public:             *r.Public,
		AllowAllCrew:       *r.AllowAllCrew,
		EnableBlueskyPosts: *r.EnableBlueskyPosts,
		DeployedAt:         c.datetime("deployedAt", r.DeployedAt),
		Region:             str(r.Region),
		Provider:           str(r.Provider),
		Successor:          str(r.Successor),
	}, c.err
}

func (a *applier) putCaptain(o *op) (bool, error) {
	c := o.captain
	n, err := a.exec(`INSERT INTO hold_captains (hold_did, owner_did, public, allow_all_crew, enable_bluesky_posts,
  deployed_at, region, provider, successor, source_us, version)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
ON CONFLICT (hold_did) DO UPDATE SET owner_did = excluded.owner_did, public = excluded.public,
  allow_all_crew = excluded.allow_all_crew, enable_bluesky_posts = excluded.enable_bluesky_posts,
  deployed_at = excluded.deployed_at, region = excluded.region, provider = excluded.provider,
  successor = excluded.successor, source_us = excluded.source_us, version = excluded.version
WHERE excluded.version > hold_captains.version`,
		o.did, c.Owner, c.Public, c.AllowAllCrew, c.EnableBlueskyPosts, c.DeployedAt, c.Region, c.Provider, c.Successor, o.ev.TimeUS, o.version)
	if err != nil {
		return false, fmt.Errorf("upsert captain: %w", err)
	}
	return n > 0, nil
}

// deleteCaptain removes the hold's captain row (see deleteRecord).
func (a *applier) deleteCaptain(o *op) (int64, error) {
	return a.exec(`DELETE FROM hold_captains WHERE hold_did = ?1 AND version <= ?2`, o.did, o.version)
}
