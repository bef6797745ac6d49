-- The Jetstream position per upstream: which host the stored
-- position came from and, when that host numbers its events (a Jetstream
-- v2 server, on either wire), its sequence number there. time_us and
-- updated_at keep their meaning (SPEC §8): the host's own time of the last
-- processed event. shared_us is a time every host agrees on (the commit
-- rev's TID time, or the upstream relay's time), the resume point on
-- another host. An existing row keeps its time_us: with host '' it resumes
-- by time, as before.
ALTER TABLE jetstream_cursor ADD COLUMN host TEXT NOT NULL DEFAULT '';
ALTER TABLE jetstream_cursor ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jetstream_cursor ADD COLUMN shared_us INTEGER NOT NULL DEFAULT 0;

-- The latest commit rev applied per repository: a commit older than it is
-- stale (skipped and counted).
CREATE TABLE repo_revs (
  did        TEXT PRIMARY KEY,
  rev        TEXT    NOT NULL,
  updated_at INTEGER NOT NULL  -- Unix ms
);

-- Repositories to re-read from their PDS (a #sync event, a CursorTooOld
-- gap): a queue, one row per DID, drained at a bounded rate by the
-- consumer under its lease.
CREATE TABLE repo_resyncs (
  did          TEXT PRIMARY KEY,
  reason       TEXT    NOT NULL,
  requested_at INTEGER NOT NULL,  -- Unix ms
  attempts     INTEGER NOT NULL DEFAULT 0,
  next_at      INTEGER NOT NULL,  -- Unix ms: not before
  last_error   TEXT    NOT NULL DEFAULT ''
);

-- Sequence ranges a host no longer had when asked (CursorTooOld): each
-- one requests a backfill run (see backfill_runs).
CREATE TABLE jetstream_gaps (
  id          INTEGER PRIMARY KEY,
  host        TEXT    NOT NULL,
  from_seq    INTEGER NOT NULL,
  to_seq      INTEGER NOT NULL,
  detected_at INTEGER NOT NULL,  -- Unix ms
  fence       INTEGER NOT NULL
);
