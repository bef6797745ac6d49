package consumer

import (
	"context"
	"database/sql"
	"time"

	"github.com/atcr-io/appview/internal/jetstream"
)

// resumeAt is the cursor to (re)connect to url with: a sequence number
// (below jetstream.CursorSeqMax) or a Unix-microsecond time.
//
// By sequence number, only on the host the position came from: its seq
// there, exactly (Jetstream replays inclusively; the client drops that
// one event), with no rewind and no reordering window. A sequence number
// is never sent to another host: it means nothing there.
//
// By time everywhere else. On a host without sequence numbers (Jetstream
// v1) the position's own time_us is that host's clock: a reconnect of
// this incarnation resumes at the last event it delivered (see
// resumeAtTime), a first connect rewinds by jetstream.rewind. On another
// host (failover), or for a position stored before per-host positions,
// time_us is a foreign clock (a host that lagged stamps old events with
// late times), so the resume time is the position's shared time (commit
// rev / relay time, sharedTime) less jetstream.rewind, relying on
// idempotent apply for the overlap. The incarnation that found no
// position stored one (pipeline.anchor: an empty host, shared time = when it
// began) and reads the live tail until its first event arrives; after
// that, and for every successor, the anchor is a position in time like
// any other on the v2 wire, so a holder killed before its first commit
// hands on where it began instead of nothing. On the legacy wire an
// anchor alone means no cursor (see the comment inside).
//
// A time is capped at cursorLead ahead of this host's clock: a cursor
// from the future makes Jetstream live-tail and skip everything since.
func (c *consumer) resumeAt(url string) int64 {
	host := jetstream.HostOf(url)
	p := c.pos
	if p.Host == "" && p.TimeUS == 0 && p.SharedUS > 0 &&
		(jetstream.WireOf(url) != jetstream.WireV2 || (c.anchored && c.client.LastEvent().IsZero())) {
		// Only an anchor (nothing processed yet). The incarnation that
		// began it has received nothing: the live tail, as for a first
		// start. On the legacy wire, always: the anchor is this host's
		// wall clock, and a legacy endpoint may serve a capture whose
		// events are all older than that (appview jetstream-replay), so a
		// time cursor from it would skip them all, where no cursor replays
		// them. On the v2 wire a time cursor is translated against when the
		// server saw each event, so the anchor less the rewind is exact.
		return 0
	}
	if p.Host == host && p.Seq > 0 {
		c.dialHighUS = c.highUS
		if p.CheckSeq > 0 && p.CheckSeq <= p.Seq {
			return p.CheckSeq // its event is checked (seqTimeAt)
		}
		return p.Seq
	}
	if p.Host == host || (p.Host == "" && p.SharedUS == 0) {
		return c.resumeAtTime(url)
	}
	c.dialHighUS = c.highUS
	t := p.SharedUS
	if t == 0 {
		t = p.TimeUS
	}
	if t == 0 {
		return 0
	}
	limit := time.Now().Add(cursorLead).UnixMicro()
	return max(jetstream.CursorSeqMax, min(t, limit)-c.o.Jetstream.Rewind.Microseconds())
}

// seqTimeAt is the time_us read for the event at the seq resumeAt gave
// url's host (Position.CheckUS; 0 when unknown or the position is not
// in that host's seq space).
func (c *consumer) seqTimeAt(url string) int64 {
	if p := c.pos; p.Host == jetstream.HostOf(url) && p.Seq > 0 && p.CheckSeq > 0 && p.CheckSeq <= p.Seq {
		return p.CheckUS
	}
	return 0
}

// resumeAtTime is the time cursor for url on a host whose position is in
// time space (Jetstream v1).
//
// On the instance this incarnation last committed a batch from, it resumes
// at that batch's last time_us (inclusive, so that event comes again;
// every write is idempotent), less the reorder window when the last
// connection reached new events on the live tail, but never before where
// that connection began to reach them. Rewinding by jetstream.rewind there would only
// replay what this instance already sent us, and a connection that drops
// more often than it can deliver a rewind's worth of events would then
// never get past the cursor.
//
// Otherwise (the first connect of an incarnation) it rewinds the
// committed cursor by jetstream.rewind.
func (c *consumer) resumeAtTime(url string) int64 {
	limit := time.Now().Add(cursorLead).UnixMicro()
	defer func() { c.dialHighUS = c.highUS }()
	if url == c.resumeURL && c.resumeUS > 0 {
		at := c.resumeUS
		live := c.highUS >= time.Now().Add(-liveTailLag).UnixMicro()
		if live && c.highUS > c.dialHighUS {
			// The last connection reached new events on the live tail,
			// which Jetstream sends out of time_us order: events stamped
			// up to reorderWindow before the newest one may still have
			// been on their way. Everything up to where that connection
			// started to break new ground had come before, so never
			// rewind past it: each connection that reaches new events
			// moves the resume point. (A replay from a cursor, further
			// behind than liveTailLag, is in time_us order: it resumes at
			// the last event, and a server that drops a subscriber every
			// few events still moves it on every connection.)
			window := min(reorderWindow, c.o.Jetstream.Rewind).Microseconds()
			at = min(at, max(c.highUS-window, c.dialHighUS))
		}
		return max(jetstream.CursorSeqMax, min(at, limit))
	}
	cur := c.cursor.Load()
	if cur == 0 {
		return 0
	}
	return max(jetstream.CursorSeqMax, min(cur, limit)-c.o.Jetstream.Rewind.Microseconds())
}

// reorderWindow bounds how far out of time_us order Jetstream sends events
// on its live tail (up to 31 ms in the shared capture of real traffic; a
// loaded instance can do worse). See resumeAt and batchCursor.
const reorderWindow = time.Second

// liveTailLag: events stamped within this of the host's clock are taken
// to come from Jetstream's live tail (stamped as they arrive, out of
// order); older ones from a replay out of its time-ordered store.
const liveTailLag = time.Minute

// seqReset is told (on the client's Run goroutine) that url's host
// numbers its events below the stored seq: it forgot them. The stored
// position drops its seq (fenced), so the host is resumed by time (its
// time_us less jetstream.rewind) and the next batch from it writes its new
// numbering; events the host sent while it was behind our number are not
// lost, they are replayed by time.
func (c *consumer) seqReset(url string) {
	host := jetstream.HostOf(url)
	if c.pos.Host != host {
		return
	}
	c.pos.Seq, c.pos.CheckSeq, c.pos.CheckUS = 0, 0, 0
	c.resumeURL, c.resumeUS = "", 0
	err := c.pipe.write(context.Background(), func(tx *sql.Tx) error {
		_, err := tx.Exec(`UPDATE jetstream_cursor SET seq = 0, check_seq = 0, check_us = 0 WHERE id = 1 AND host = ?1`, host)
		return err
	})
	if err != nil {
		c.log.Error().Err(err).Msg("Jetstream sequence reset not recorded")
	}
}
