-- A gap can also be a span of time: a v2 host clamps a time cursor older
-- than its lookback to its oldest event (#info OutdatedCursor). Such a gap
-- records the time cursor sent and the first event's time (Unix µs), with
-- from_seq 0 (no seq was sent) and to_seq the first event's seq. Seq gaps
-- (CursorTooOld) leave both NULL.
ALTER TABLE jetstream_gaps ADD COLUMN from_time_us INTEGER;
ALTER TABLE jetstream_gaps ADD COLUMN to_time_us INTEGER;
