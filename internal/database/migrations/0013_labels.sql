-- Every `!takedown` label in force, one row per label, keyed as the label
-- itself is (com.atproto.label.defs#label: src, uri, val; a later label
-- with the same key, neg or an exp, overwrites it). taken_down_subjects
-- (SPEC §8) is derived from these rows by actors/labeler: a subject
-- (src, did, repo) is there while any row maps to it. Kept per label, a
-- negation lifts only its own label (a repository taken down through its
-- page and through one of its manifests stays down until both are
-- negated), a negation finds its label by uri even after the record it
-- names was deleted, and a label on a manifest or tag record not indexed
-- yet is kept (repo NULL) and applied once the record is.
CREATE TABLE labels (
  src        TEXT    NOT NULL,               -- DID of the labeler that issued the label
  uri        TEXT    NOT NULL,               -- the label's subject as issued
  val        TEXT    NOT NULL,
  did        TEXT    NOT NULL,               -- the subject's account
  collection TEXT    NOT NULL DEFAULT '',    -- for a record subject, its collection and rkey
  rkey       TEXT    NOT NULL DEFAULT '',
  repo       TEXT,                           -- '' for the account; NULL while the record is not indexed
  cid        TEXT    NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,               -- the label's cts (Unix ms)
  expires_at INTEGER,                        -- the label's exp (Unix ms); NULL: none
  seq        INTEGER NOT NULL,               -- subscribeLabels seq of the frame that carried it
  fence      INTEGER NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (src, uri, val)
);
CREATE INDEX labels_by_subject ON labels (src, did, repo);
CREATE INDEX labels_unresolved ON labels (did, rkey) WHERE repo IS NULL;

-- The takedowns stored before this migration, one label each (what the
-- old table kept of them).
INSERT OR IGNORE INTO labels (src, uri, val, did, repo, cid, created_at, expires_at, seq, fence, updated_at)
SELECT src, uri, '!takedown', did, repo, cid, created_at, expires_at, seq, fence, updated_at FROM taken_down_subjects;
