-- A backfill run's failed attempts, so that every instance, /debug/backfill
-- and `appview backfill status` can say a run is failing and why, not only
-- that it is unfinished. Additive (README.md): an older binary ignores
-- these columns, and an attempt it makes records nothing here. Single
-- spaces in the column definitions: SQLite keeps an added column's text
-- as written, a libSQL server with its runs of spaces collapsed, and the
-- schema must read the same on both.

-- attempts that ended in an error
ALTER TABLE backfill_runs ADD COLUMN failed_attempts INTEGER NOT NULL DEFAULT 0;
-- the latest such attempt's error
ALTER TABLE backfill_runs ADD COLUMN last_error TEXT NOT NULL DEFAULT '';
-- when it was recorded (Unix ms); NULL: never
ALTER TABLE backfill_runs ADD COLUMN last_error_at INTEGER;
