-- A tag names its manifest by at-uri (did, rkey) and takes the digest of the
-- newest version stored under that rkey: with the version in the index, that
-- lookup reads one index entry instead of sorting the rkey's rows.
DROP INDEX manifests_by_rkey;
CREATE INDEX manifests_by_rkey ON manifests (did, rkey, version);
