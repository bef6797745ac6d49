-- Record versions. Every row written from a repo record, and
-- every tombstone, carries the version of the event that wrote it: the
-- commit's rev (a TID: 13 characters of base32-sortable, strictly
-- increasing per repo), compared as a string. An event without a rev (a
-- backfill read) has the version '0' followed by its time_us as 20 digits:
-- it sorts below every TID (whose first character is 2-9 or a-j), so any
-- event with a rev replaces such a row, and such versions order among
-- themselves by time as before. source_us and the record's own timestamps
-- stay as data only.
--
-- Existing rows have no rev: they get the no-rev version of their
-- source_us, so any event with a rev replaces them, and a no-rev event
-- compares with them exactly as the old source_us rule did.
ALTER TABLE manifests ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE tags ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE stars ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE repo_pages ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE hold_captains ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE hold_crew ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE repository_hold_stats ADD COLUMN version TEXT NOT NULL DEFAULT '';
ALTER TABLE record_tombstones ADD COLUMN version TEXT NOT NULL DEFAULT '';
-- The version of the io.atcr.sailor.profile record last applied ('' none).
ALTER TABLE users ADD COLUMN profile_version TEXT NOT NULL DEFAULT '';

UPDATE manifests SET version = '0' || printf('%020d', source_us);
UPDATE tags SET version = '0' || printf('%020d', source_us);
UPDATE stars SET version = '0' || printf('%020d', source_us);
UPDATE repo_pages SET version = '0' || printf('%020d', source_us);
UPDATE hold_captains SET version = '0' || printf('%020d', source_us);
UPDATE hold_crew SET version = '0' || printf('%020d', source_us);
UPDATE repository_hold_stats SET version = '0' || printf('%020d', source_us);
UPDATE record_tombstones SET version = '0' || printf('%020d', source_us);
UPDATE users SET profile_version = '0' || printf('%020d', profile_us) WHERE profile_us > 0;
