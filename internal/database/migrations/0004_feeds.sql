-- The feeds from outside the firehose: the backfill worker's runs and
-- checkpoint, and the labeler subscriber's takedowns and cursor.
-- Times are Unix milliseconds from the database's clock. Every row here is
-- written through lease.Fenced under the writing worker's custody.

-- One backfill pass over every io.atcr.* collection (SPEC §8).
-- completed_at is NULL while the run is unfinished; a new holder of the
-- `backfill` lease resumes the latest unfinished run instead of starting a
-- new one. fence is the fence token of the custody that last worked on it.
CREATE TABLE backfill_runs (
  id           INTEGER PRIMARY KEY,
  started_at   INTEGER NOT NULL,
  completed_at INTEGER,
  fence        INTEGER NOT NULL,
  holder       TEXT    NOT NULL DEFAULT '',  -- instance_id that last worked on it
  updated_at   INTEGER NOT NULL,
  repos_done   INTEGER NOT NULL DEFAULT 0,   -- (collection, DID) pairs fully listed
  repos_failed INTEGER NOT NULL DEFAULT 0,   -- skipped: DID unresolvable or PDS broken
  records      INTEGER NOT NULL DEFAULT 0    -- records handed to the processor
);
CREATE INDEX backfill_runs_by_completed ON backfill_runs (completed_at);

-- Checkpoint, per collection: the relay being paged and the cursor of the
-- next relay page to fetch (every DID of the pages before it is finished).
-- A relay's cursor is meaningful only to that relay: switching relays
-- restarts the listing from an empty cursor, and backfill_repos keeps the
-- DIDs already finished from being fetched again.
CREATE TABLE backfill_collections (
  run_id       INTEGER NOT NULL REFERENCES backfill_runs (id) ON DELETE CASCADE,
  collection   TEXT    NOT NULL,
  relay        TEXT    NOT NULL DEFAULT '',
  relay_cursor TEXT    NOT NULL DEFAULT '',
  done         INTEGER NOT NULL DEFAULT 0,
  updated_at   INTEGER NOT NULL,
  PRIMARY KEY (run_id, collection)
);

-- Checkpoint, per (collection, DID): the listRecords cursor after the last
-- page applied. The page's records and this row commit in one transaction,
-- so a resumed run neither skips nor repeats a page.
CREATE TABLE backfill_repos (
  run_id        INTEGER NOT NULL REFERENCES backfill_runs (id) ON DELETE CASCADE,
  collection    TEXT    NOT NULL,
  did           TEXT    NOT NULL,
  state         TEXT    NOT NULL DEFAULT 'running',  -- running | done | failed
  record_cursor TEXT    NOT NULL DEFAULT '',
  records       INTEGER NOT NULL DEFAULT 0,
  error         TEXT    NOT NULL DEFAULT '',         -- why it failed
  updated_at    INTEGER NOT NULL,
  PRIMARY KEY (run_id, collection, did)
);

-- Subjects under a `!takedown` label (SPEC §8), from
-- com.atproto.label.subscribeLabels. repo is '' for a whole account (the
-- label's subject was a bare DID). A negation or an expired label deletes
-- the row. expires_at is the label's `exp` (NULL: no expiry); readers treat
-- a row whose expires_at has passed as not taken down.
CREATE TABLE taken_down_subjects (
  src        TEXT    NOT NULL,               -- DID of the labeler that issued the label
  did        TEXT    NOT NULL,
  repo       TEXT    NOT NULL DEFAULT '',
  uri        TEXT    NOT NULL,               -- the label's subject as issued
  cid        TEXT    NOT NULL DEFAULT '',    -- the label's cid: a specific record version
  created_at INTEGER NOT NULL,               -- the label's cts
  expires_at INTEGER,
  seq        INTEGER NOT NULL,               -- subscribeLabels seq of the frame that carried it
  fence      INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL,
  UNIQUE (src, did, repo)
);
CREATE INDEX taken_down_subjects_by_subject ON taken_down_subjects (did, repo);

-- The subscribeLabels cursor: the seq of the last frame fully applied, per
-- labeler stream. A seq is meaningful only to the service that numbered it,
-- so the key is the stream's endpoint; src records the labeler DIDs seen.
CREATE TABLE labeler_cursors (
  endpoint   TEXT    PRIMARY KEY,            -- wss://HOST/xrpc/com.atproto.label.subscribeLabels
  seq        INTEGER NOT NULL,
  src        TEXT    NOT NULL DEFAULT '',
  fence      INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL
);
