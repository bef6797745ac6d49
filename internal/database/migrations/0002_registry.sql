-- Registry state built from io.atcr.* records (SPEC §8, LEXICONS.md).
-- Times are Unix milliseconds unless a column says _us (microseconds).
-- Every table the processor writes is keyed so that applying an event twice
-- leaves it unchanged; source_us records the Jetstream time of the event
-- that last wrote a row, so an older replayed event never overwrites a newer one.

-- Accounts that have io.atcr records. A row is created by the first user-repo
-- record applied for the DID (identity_us and account_us start at that
-- event's time, so replaying an older identity event cannot change a row
-- the first pass left alone); identity and account events only update rows.
-- updated_at is the Jetstream time (ms) of the event that last changed it.
CREATE TABLE users (
  did                  TEXT    PRIMARY KEY,
  handle               TEXT    NOT NULL DEFAULT '',
  active               INTEGER NOT NULL DEFAULT 1,
  status               TEXT    NOT NULL DEFAULT '',   -- takendown, suspended, deleted, deactivated, ...
  default_hold         TEXT    NOT NULL DEFAULT '',   -- io.atcr.sailor.profile defaultHold
  auto_remove_untagged INTEGER NOT NULL DEFAULT 0,
  profile_created_at   INTEGER,
  profile_updated_at   INTEGER,
  identity_us          INTEGER NOT NULL DEFAULT 0,    -- time_us of the last identity event applied
  account_us           INTEGER NOT NULL DEFAULT 0,    -- time_us of the last account event applied
  profile_us           INTEGER NOT NULL DEFAULT 0,
  updated_at           INTEGER NOT NULL
);

-- io.atcr.manifest (key: tid). One row per (did, repository, digest).
CREATE TABLE manifests (
  id             INTEGER PRIMARY KEY,
  did            TEXT    NOT NULL,
  repository     TEXT    NOT NULL,
  digest         TEXT    NOT NULL,
  rkey           TEXT    NOT NULL,
  cid            TEXT    NOT NULL DEFAULT '',
  hold_did       TEXT    NOT NULL DEFAULT '',
  hold_endpoint  TEXT    NOT NULL DEFAULT '',
  media_type     TEXT    NOT NULL,
  schema_version INTEGER NOT NULL,
  config_digest  TEXT    NOT NULL DEFAULT '',
  config_size    INTEGER NOT NULL DEFAULT 0,
  subject_digest TEXT    NOT NULL DEFAULT '',
  created_at     INTEGER NOT NULL,                    -- record createdAt
  indexed_at     INTEGER NOT NULL,                    -- Jetstream time (ms) of the event that stored it
  source_us      INTEGER NOT NULL DEFAULT 0,
  UNIQUE (did, repository, digest)
);
CREATE INDEX manifests_by_rkey ON manifests (did, rkey);
CREATE INDEX manifests_by_hold ON manifests (hold_did);

-- Layers (image manifest) and child manifests (image index), in record order.
CREATE TABLE manifest_layers (
  manifest_id INTEGER NOT NULL REFERENCES manifests (id) ON DELETE CASCADE,
  position    INTEGER NOT NULL,
  digest      TEXT    NOT NULL,
  size        INTEGER NOT NULL DEFAULT 0,
  media_type  TEXT    NOT NULL DEFAULT '',
  PRIMARY KEY (manifest_id, position)
);
CREATE TABLE manifest_references (
  manifest_id      INTEGER NOT NULL REFERENCES manifests (id) ON DELETE CASCADE,
  position         INTEGER NOT NULL,
  digest           TEXT    NOT NULL,
  size             INTEGER NOT NULL DEFAULT 0,
  media_type       TEXT    NOT NULL DEFAULT '',
  platform_os      TEXT    NOT NULL DEFAULT '',
  platform_arch    TEXT    NOT NULL DEFAULT '',
  platform_variant TEXT    NOT NULL DEFAULT '',
  PRIMARY KEY (manifest_id, position)
);
CREATE TABLE manifest_annotations (
  manifest_id INTEGER NOT NULL REFERENCES manifests (id) ON DELETE CASCADE,
  key         TEXT    NOT NULL,
  value       TEXT    NOT NULL,
  PRIMARY KEY (manifest_id, key)
);

-- io.atcr.tag (key: any). One row per (did, repository, tag).
CREATE TABLE tags (
  did        TEXT    NOT NULL,
  repository TEXT    NOT NULL,
  tag        TEXT    NOT NULL,
  digest     TEXT    NOT NULL,
  rkey       TEXT    NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  source_us  INTEGER NOT NULL DEFAULT 0,
  UNIQUE (did, repository, tag)
);
CREATE INDEX tags_by_rkey ON tags (did, rkey);
CREATE INDEX tags_by_digest ON tags (did, repository, digest);

-- io.atcr.sailor.star (key: any). did starred (owner_did, repository).
CREATE TABLE stars (
  did        TEXT    NOT NULL,
  rkey       TEXT    NOT NULL,
  owner_did  TEXT    NOT NULL,
  repository TEXT    NOT NULL,
  created_at INTEGER NOT NULL,
  source_us  INTEGER NOT NULL DEFAULT 0,
  UNIQUE (did, rkey)
);
CREATE INDEX stars_by_subject ON stars (owner_did, repository);

-- io.atcr.repo.page (key: the repository name).
CREATE TABLE repo_pages (
  did         TEXT    NOT NULL,
  repository  TEXT    NOT NULL,
  rkey        TEXT    NOT NULL,
  description TEXT    NOT NULL DEFAULT '',
  avatar_cid  TEXT    NOT NULL DEFAULT '',
  created_at  INTEGER NOT NULL,
  updated_at  INTEGER NOT NULL,
  source_us   INTEGER NOT NULL DEFAULT 0,
  UNIQUE (did, repository)
);
CREATE INDEX repo_pages_by_rkey ON repo_pages (did, rkey);

-- io.atcr.hold.captain (literal:self, in the hold's own repo).
CREATE TABLE hold_captains (
  hold_did             TEXT    PRIMARY KEY,
  owner_did            TEXT    NOT NULL,
  public               INTEGER NOT NULL,
  allow_all_crew       INTEGER NOT NULL,
  enable_bluesky_posts INTEGER NOT NULL,
  deployed_at          INTEGER NOT NULL,
  region               TEXT    NOT NULL DEFAULT '',
  provider             TEXT    NOT NULL DEFAULT '',
  successor            TEXT    NOT NULL DEFAULT '',
  source_us            INTEGER NOT NULL DEFAULT 0
);

-- io.atcr.hold.crew (key: any, in the hold's repo).
CREATE TABLE hold_crew (
  hold_did    TEXT    NOT NULL,
  rkey        TEXT    NOT NULL,
  member_did  TEXT    NOT NULL,
  role        TEXT    NOT NULL,
  permissions TEXT    NOT NULL DEFAULT '[]',          -- JSON array of strings
  tier        TEXT    NOT NULL DEFAULT '',
  added_at    INTEGER NOT NULL,
  source_us   INTEGER NOT NULL DEFAULT 0,
  UNIQUE (hold_did, rkey)
);
CREATE INDEX hold_crew_by_member ON hold_crew (member_did);

-- io.atcr.hold.stats: each hold's own absolute counts for a repository.
-- Written in the fenced batch transaction that applies the record; a newer
-- updatedAt from the same hold replaces that hold's numbers, an older one is
-- ignored (in SQL, so no cache can regress it).
CREATE TABLE repository_hold_stats (
  did        TEXT    NOT NULL,                        -- owner DID of the repository
  repository TEXT    NOT NULL,
  hold_did   TEXT    NOT NULL,
  rkey       TEXT    NOT NULL,                        -- record key in the hold's repo
  pull_count INTEGER NOT NULL DEFAULT 0,
  push_count INTEGER NOT NULL DEFAULT 0,
  last_pull  INTEGER,
  last_push  INTEGER,
  updated_at INTEGER NOT NULL,                        -- the record's updatedAt
  source_us  INTEGER NOT NULL DEFAULT 0,
  UNIQUE (did, repository, hold_did)
);
CREATE INDEX repository_hold_stats_by_rkey ON repository_hold_stats (hold_did, rkey);

-- The aggregate: sums over holds, latest timestamps, star count; absolute
-- values, always computed inside the writing transaction from the persisted
-- repository_hold_stats and stars rows (never from a cache), under the fence
-- recorded here. updated_at is the Jetstream time (ms) of the event that
-- last changed the row (the database clock for a StatsCache reconcile).
CREATE TABLE repository_stats (
  did        TEXT    NOT NULL,
  repository TEXT    NOT NULL,
  pull_count INTEGER NOT NULL DEFAULT 0,
  push_count INTEGER NOT NULL DEFAULT 0,
  last_pull  INTEGER,
  last_push  INTEGER,
  star_count INTEGER NOT NULL DEFAULT 0,
  fence      INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL,
  UNIQUE (did, repository)
);

-- Deleted records: the newest delete seen per record, so a create or update
-- older than it (a rewound replay, or a backfill snapshot taken before the
-- delete) cannot bring the record back. Kept indefinitely; cleanup may prune
-- rows older than any replay or backfill window.
CREATE TABLE record_tombstones (
  did        TEXT    NOT NULL,                        -- repo the record lived in
  collection TEXT    NOT NULL,
  rkey       TEXT    NOT NULL,
  source_us  INTEGER NOT NULL,                        -- time_us of the delete
  PRIMARY KEY (did, collection, rkey)
) WITHOUT ROWID;

-- The Jetstream cursor: one row, the time_us of the last fully processed event.
CREATE TABLE jetstream_cursor (
  id         INTEGER PRIMARY KEY CHECK (id = 1),
  time_us    INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  fence      INTEGER NOT NULL DEFAULT 0
);
