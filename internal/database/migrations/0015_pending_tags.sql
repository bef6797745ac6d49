-- io.atcr.tag records whose manifest at-uri names a manifest not stored
-- yet, and without a manifestDigest: kept until that manifest arrives
-- (then the tag is written with its digest and the row removed), or the
-- tag record is deleted or replaced. Any event may arrive late; a tag
-- committed before its manifest record existed was skipped for good.
CREATE TABLE pending_tags (
  did           TEXT    NOT NULL,                  -- repo of the tag record
  rkey          TEXT    NOT NULL,                  -- the tag record's key
  repository    TEXT    NOT NULL,
  tag           TEXT    NOT NULL,
  manifest_did  TEXT    NOT NULL,                  -- the at-uri's repo
  manifest_rkey TEXT    NOT NULL,                  -- the at-uri's record key
  created_at    INTEGER NOT NULL,                  -- Unix ms
  updated_at    INTEGER NOT NULL,                  -- Unix ms
  source_us     INTEGER NOT NULL,
  version       TEXT    NOT NULL,
  PRIMARY KEY (did, rkey)
) WITHOUT ROWID;
CREATE INDEX pending_tags_by_manifest ON pending_tags (manifest_did, manifest_rkey);
