-- Account lifecycle: every #account or #identity event can reach an index
-- that never saw the account's records (a backfill that skipped an
-- inactive repository, a reactivation, a PDS migration), so such an event
-- may queue a re-read of the repository (repo_resyncs). Additive only: an
-- older binary keeps running on this schema.

-- The PDS endpoint the account's DID document named when the row was last
-- written from a verified lookup ('' unknown): an #identity event naming
-- another one means the repository moved, and it is re-read there.
-- A users row is now also created by the first #identity or #account
-- event of a DID (its status from the event), not only by a record.
ALTER TABLE users ADD COLUMN pds TEXT NOT NULL DEFAULT '';

-- Repositories this index may hold incompletely although their users row
-- says nothing of it: a backfill skipped them as inactive or failed on
-- them, or a re-read was refused as inactive. The next #account event
-- making the account active, or #identity event, re-reads them; a
-- successful re-read removes the row.
CREATE TABLE repo_incomplete (
  did      TEXT    PRIMARY KEY,
  reason   TEXT    NOT NULL,   -- backfill-inactive, backfill-failed, resync-inactive
  noted_at INTEGER NOT NULL    -- Unix ms
);

-- Re-reads queued by the first event of a DID with no users row are
-- bounded in number (actors/consumer): counted by reason.
CREATE INDEX repo_resyncs_by_reason ON repo_resyncs (reason);
