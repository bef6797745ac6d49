-- The last event the position's host delivered at or below
-- jetstream_cursor.seq that decoded: its sequence number and its time as
-- read (Unix µs); 0 and 0 when unknown (a position stored before this
-- version, or none decoded on this host yet). A resume by seq starts
-- there and checks that the host replays that very event first: Jetstream
-- v2 renumbers what it reads again after a crash, and a number that now
-- names another event would skip the events renumbered below it
-- (docs/jetstream.md).
ALTER TABLE jetstream_cursor ADD COLUMN check_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jetstream_cursor ADD COLUMN check_us INTEGER NOT NULL DEFAULT 0;
