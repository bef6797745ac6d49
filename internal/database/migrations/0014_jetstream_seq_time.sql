-- The host's own time (Unix µs) of the event at jetstream_cursor.seq, as
-- it was read; 0 when unknown (the frame there did not decode, or a
-- position stored before this version). A resume by seq checks that the
-- host replays that very event first: Jetstream v2 renumbers what it
-- reads again after a crash, and a number that now names another event
-- would skip the events renumbered below it (docs/jetstream.md).
ALTER TABLE jetstream_cursor ADD COLUMN seq_us INTEGER NOT NULL DEFAULT 0;
