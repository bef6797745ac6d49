-- Upkeep workers: the billing tier refresh (lease billing-tier-refresh).
-- Times are Unix milliseconds on the database's clock.

-- The last tier rank the billing worker told each hold about each crew
-- member, written under the worker's fence only after the hold answered,
-- so a later round, a restart or a new holder pushes only what changed.
-- outcome 'pushed': the hold accepted tier_rank and named it tier_name.
-- outcome 'user_not_found': the hold did not know the member when
-- crew_added_at was the newest crew record; not retried until the rank or
-- the crew record changes. The cleanup sweep removes rows whose member is
-- no longer crew of the hold.
CREATE TABLE billing_tier_pushes (
  hold_did      TEXT    NOT NULL,
  user_did      TEXT    NOT NULL,
  tier_rank     INTEGER NOT NULL,
  tier_name     TEXT    NOT NULL DEFAULT '',
  outcome       TEXT    NOT NULL CHECK (outcome IN ('pushed', 'user_not_found')),
  crew_added_at INTEGER NOT NULL DEFAULT 0,   -- hold_crew.added_at (newest record) when answered
  fence         INTEGER NOT NULL,
  updated_at    INTEGER NOT NULL,
  PRIMARY KEY (hold_did, user_did)
);
CREATE INDEX billing_tier_pushes_by_age ON billing_tier_pushes (updated_at);
