package jetstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"sync/atomic"
	"time"

	"github.com/atcr-io/appview/internal/logval"
	"github.com/gorilla/websocket"
)

// connState is one connection: what its reader goroutine (read) needs,
// the queue it fills for deliver, and its reading state.
type connState struct {
	conn *websocket.Conn
	// base is the endpoint (one of ClientOptions.URLs) it was dialled on.
	base string
	v2   bool
	dec  *Decoder
	// items carries the frames read, in order, to deliver; ahead bounds
	// their bytes; stop closes when the session tears the connection
	// down.
	items chan item
	ahead *readAhead
	stop  chan struct{}
	// healthy: a data frame other than a v2 #info arrived; progressed:
	// an event newer than any the client had seen (see sessionEnd).
	healthy, progressed atomic.Bool
	// seen is the highest sequence number this connection has accounted
	// for: an event at it is a replay of the one the cursor named
	// (dropped); a frame below it, or another frame under it, ends the
	// connection (ErrSeqReset).
	seen int64
	// resumed: the connection was dialled with a seq cursor and has not
	// yet delivered a numbered frame (see ErrSeqReset). replayed: the
	// cursor's own event is expected first (a seq cursor, not a floor),
	// stamped seenUS when that is known (ClientOptions.SeqTimeFor).
	// After the first frame, seenUS is the time of the event numbered
	// seen (0 when that frame did not decode).
	// seenHash is the hash of the frame numbered seen (seenHashed: known).
	resumed    bool
	replayed   bool
	seenUS     int64
	seenHash   uint64
	seenHashed bool
	// timeCursor is the time cursor (Unix µs) the connection was dialled
	// with, 0 for none or a seq; outdated: the host announced it clamped
	// it (OutdatedCursor) and no event has come since.
	timeCursor int64
	outdated   bool
}

// infoOutdatedCursor is the v2 #info advisory of a clamped time cursor.
const infoOutdatedCursor = "OutdatedCursor"

// ErrSeqReset ends a connection resumed from a sequence number whose first
// event is numbered below it: the host no longer knows that number (its
// store was reset, or another instance answers under the same name), and
// a future cursor only makes Jetstream live-tail. It also ends one whose
// first event is not the cursor's own, replayed (the host renumbered its
// events after a crash: see ClientOptions.SeqTimeFor), and one that
// carries a frame numbered below an earlier one, or two different frames
// under one number. The client tells
// OnSeqReset and dials again at once; the consumer then resumes that host
// by time.
var ErrSeqReset = errors.New("jetstream: the host's sequence numbers restarted below the resume cursor")

// frameSeed seeds the hashes that tell an exact repeat of a frame.
var frameSeed = maphash.MakeSeed()

// errSeqRegressed marks an ErrSeqReset found after the first frame: a
// frame numbered below one the same connection carried. The host is
// dialled again after its backoff, not at once, so a host that keeps
// doing it is not dialled in a loop.
var errSeqRegressed = errors.New("a frame numbered below an earlier one")

// read is the connection's reader goroutine: it reads frames, decodes them
// and queues them in order until the connection fails or stop closes.
//
// Deadlines: a connection must bring an event (any data frame but a v2
// #info) within StaleTimeout of the previous one (or of connecting);
// pings and pongs prove the socket, not the stream, and do not count. A
// frame that has started must complete within StaleTimeout.
//
// Oversized frames are read to io.Discard without being buffered, counted,
// and queued as a ClassOversized failure; the connection carries on with
// the next frame. See the package documentation for why this is not
// websocket.Conn.SetReadLimit.
func (c *Client) read(cs *connState) error {
	conn, base := cs.conn, cs.base
	stale := c.opts.StaleTimeout
	limit := c.opts.MaxMessageBytes
	conn.SetPingHandler(func(data string) error {
		// A failed pong is not a read error; if the connection is really
		// gone the next read says so.
		_ = conn.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(writeWait))
		return nil
	})
	lastEvent := time.Now()
	var buf bytes.Buffer
	for {
		conn.SetReadDeadline(lastEvent.Add(stale))
		typ, r, err := conn.NextReader()
		if err != nil {
			return err
		}
		arrived := time.Now() // the frame's first bytes are here
		conn.SetReadDeadline(arrived.Add(stale))
		buf.Reset()
		n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
		if err != nil {
			return err
		}
		var it item
		info := false
		if n > limit {
			rest, err := io.Copy(io.Discard, r)
			if err != nil {
				return err
			}
			n += rest
			it.fail = &DecodeError{Class: ClassOversized, Size: n,
				Err: fmt.Errorf("frame exceeds the %d-byte limit; skipped", limit)}
		} else if cs.v2 {
			d, err := cs.dec.decodeV2(buf.Bytes(), typ == websocket.BinaryMessage)
			switch {
			case err != nil:
				if !errors.As(err, &it.fail) {
					it.fail = &DecodeError{Class: ClassMalformedJSON, Size: n, Err: err}
				}
			case d.err != nil:
				c.opts.Metrics.frame(n)
				return d.err
			case d.info != nil:
				info = true
				if d.info.Name == infoOutdatedCursor && cs.timeCursor > 0 {
					cs.outdated = true
				}
				c.opts.Metrics.info(d.info.Name)
				c.opts.Log.Warn().Str("url", logval.RedactURL(base)).Str("name", bounded(d.info.Name)).Str("message", bounded(d.info.Message)).
					Msg("jetstream #info advisory")
			default:
				it.ev = d.ev
			}
		} else if ev, err := cs.dec.Decode(buf.Bytes(), typ == websocket.BinaryMessage); err != nil {
			if !errors.As(err, &it.fail) {
				it.fail = &DecodeError{Class: ClassMalformedJSON, Size: n, Err: err}
			}
		} else {
			it.ev = ev
		}
		c.opts.Metrics.frame(n)
		// The frame's own bytes tell an exact repeat from another frame
		// under the same number (see the duplicate check below).
		var frameHash uint64
		if max(it.ev.Seq, failSeq(it.fail)) > 0 { // only numbered frames are compared
			frameHash = maphash.Bytes(frameSeed, buf.Bytes())
		}
		if buf.Cap() > keptReadBuffer {
			// A large frame grew the buffer (to up to twice the frame
			// limit): let it go instead of holding it for every frame
			// after. Nothing decoded refers to it.
			buf = bytes.Buffer{}
		}
		if info {
			continue
		}
		lastEvent = time.Now()
		cs.healthy.Store(true)
		if seq := max(it.ev.Seq, failSeq(it.fail)); cs.resumed && seq > 0 {
			cs.resumed = false
			switch {
			case seq < cs.seen:
				return fmt.Errorf("%w: first seq %d, cursor %d", ErrSeqReset, seq, cs.seen)
			case cs.replayed && cs.seenUS > 0 && seq > cs.seen:
				return fmt.Errorf("%w: first seq %d, not the cursor's own %d replayed (the host renumbered its events, or no longer sends that one)",
					ErrSeqReset, seq, cs.seen)
			case cs.replayed && cs.seenUS > 0 && it.fail == nil && it.ev.TimeUS != cs.seenUS:
				return fmt.Errorf("%w: the event at the cursor's seq %d is stamped %d, not %d as read before (the host renumbered its events)",
					ErrSeqReset, seq, it.ev.TimeUS, cs.seenUS)
			}
		} else if seq > 0 && seq < cs.seen {
			// Numbered below a frame this connection already carried: one
			// of the two numbers is wrong (a frame numbered far ahead, a
			// host renumbering), and which cannot be told. Dropping every
			// frame until the stream caught up with the higher number
			// lost them all, and the position stayed on it. The host is
			// resumed by time instead, like a reset at the first frame:
			// what it sends again is applied idempotently. The frame is
			// counted as ClassSeqRegression.
			err := fmt.Errorf("%w: %w: seq %d after seq %d on the same connection", ErrSeqReset, errSeqRegressed, seq, cs.seen)
			c.opts.Metrics.decoded(nil, &DecodeError{Class: ClassSeqRegression, Size: n, TimeUS: it.ev.TimeUS, Seq: seq, Err: err})
			return err
		} else if seq > 0 && seq == cs.seen && (it.fail != nil || !cs.seenHashed || frameHash != cs.seenHash) {
			// The number of the frame before it, on another frame: one of
			// the two is not what the host numbers so (a bogus frame just
			// before a real one took its number, even its DID and time,
			// and dropping the second as a duplicate lost the real event
			// for good). Only a byte-for-byte repeat of a decoded event is
			// a duplicate; anything else resumes the host by time, as
			// above.
			err := fmt.Errorf("%w: %w: seq %d twice on the same connection, on different frames", ErrSeqReset, errSeqRegressed, seq)
			c.opts.Metrics.decoded(nil, &DecodeError{Class: ClassSeqRegression, Size: n, TimeUS: it.ev.TimeUS, Seq: seq, Err: err})
			return err
		}
		if it.fail == nil {
			before := cs.seen
			c.check(&it, n, cs)
			if cs.seen != before {
				cs.seenHash, cs.seenHashed = frameHash, true
			}
		} else if it.fail.Seq > cs.seen {
			cs.seen = it.fail.Seq // delivered, if undecodable: later seqs must be above it
			cs.seenUS, cs.seenHashed = 0, false
		}
		if it.fail == nil && it.ev.Kind == "" {
			continue // a replay of an event already delivered
		}
		if cs.outdated && it.fail == nil {
			cs.outdated = false
			if it.ev.TimeUS > cs.timeCursor && c.opts.OnOutdatedCursor != nil {
				c.opts.OnOutdatedCursor(base, cs.timeCursor, it.ev.TimeUS, it.ev.Seq)
			}
		}
		if it.fail != nil {
			c.opts.Metrics.decoded(nil, it.fail)
		} else {
			c.lastEvent.Store(lastEvent.UnixNano())
			c.opts.Metrics.decoded(&it.ev, nil)
			if c.opts.Prepare != nil {
				c.opts.Prepare(&it.ev)
			}
		}
		if it.fail == nil {
			it.size = n // a failure keeps none of its frame
			it.at = arrived
		}
		if !cs.ahead.wait(it.size, cs.stop) {
			return nil
		}
		select {
		case cs.items <- it:
		case <-cs.stop:
			return nil
		}
	}
}

// check applies the client's rules to a decoded event: not stamped far
// in the future, in a wanted collection, and in sequence. A replay of the
// event the cursor named (inclusive replay) is blanked (Kind "") for the
// caller to drop.
func (c *Client) check(it *item, n int64, cs *connState) {
	ev := &it.ev
	if ev.Seq > 0 {
		switch {
		case ev.Seq == cs.seen:
			*ev = Event{}
			return
		}
		cs.seen, cs.seenUS = ev.Seq, ev.TimeUS
	}
	if limit := time.Now().Add(MaxFutureSkew).UnixMicro(); ev.TimeUS > limit {
		it.fail = &DecodeError{Class: ClassInvalidEvent, Size: n, TimeUS: ev.TimeUS, Seq: ev.Seq,
			Err: fmt.Errorf("time_us %d is more than %s ahead of this host's clock", ev.TimeUS, MaxFutureSkew)}
		return
	}
	if ev.Commit != nil && !c.filter.Load().wants(ev.Commit.Collection) {
		it.fail = &DecodeError{Class: ClassUnwantedCollection, Size: n, TimeUS: ev.TimeUS, Seq: ev.Seq,
			Err: fmt.Errorf("collection %q is not in wantedCollections", ev.Commit.Collection)}
		return
	}
	if ev.TimeUS > c.newestUS || ev.Seq > 0 {
		c.newestUS = max(c.newestUS, ev.TimeUS)
		cs.progressed.Store(true)
	}
}

func failSeq(f *DecodeError) int64 {
	if f == nil {
		return 0
	}
	return f.Seq
}

// item is one frame as read: an event or the reason it was skipped.
type item struct {
	ev   Event
	fail *DecodeError
	// size is the frame's length in bytes, counted against the read-ahead
	// bound (readAhead) until the batch holding it has been handled.
	size int64
	// at is when an event's frame was read off the socket (Batch.Received).
	at time.Time
}

// readAhead bounds the bytes of frames read and not yet handled: the
// reader takes (wait) before it queues a frame and deliver gives back
// (done) once the handler has returned from the batch holding it.
type readAhead struct {
	limit   int64
	held    atomic.Int64
	settled chan struct{} // a token whenever done gives bytes back
}

func newReadAhead(limit int64) *readAhead {
	return &readAhead{limit: limit, settled: make(chan struct{}, 1)}
}

// wait blocks until n more bytes fit under the limit (any n fits when
// nothing is held, so one frame larger than the limit still passes), then
// holds them. It returns false when stop closes first.
func (r *readAhead) wait(n int64, stop <-chan struct{}) bool {
	for {
		held := r.held.Load()
		if held == 0 || held+n <= r.limit {
			r.held.Add(n)
			return true
		}
		select {
		case <-r.settled:
		case <-stop:
			return false
		}
	}
}

// done gives back n bytes.
func (r *readAhead) done(n int64) {
	if n == 0 {
		return
	}
	r.held.Add(-n)
	select {
	case r.settled <- struct{}{}:
	default:
	}
}

// deliver batches items and calls the handler until items closes (the
// connection ended: what was read is still delivered), ctx ends (a partial
// batch is dropped; the cursor replays it) or the handler fails.
//
// A batch is what has arrived: every item already queued when the first
// is taken (up to BatchSize and BatchBytes), delivered at once, so a lone
// frame on an idle stream goes to the handler the moment it is read, and
// under load a batch holds what came while the handler was busy with the
// one before (the reader decodes ahead meanwhile). Only a BatchLinger set
// above 0 makes a partial batch wait for more.
func (c *Client) deliver(ctx context.Context, cs *connState) error {
	var b Batch
	var size int64 // of b's frames
	var linger *time.Timer
	var lingerC <-chan time.Time
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	flush := func() error {
		if linger != nil {
			linger.Stop()
			linger, lingerC = nil, nil
		}
		if b.Len() == 0 {
			return nil
		}
		out := b
		out.URL = cs.base
		for i := range out.Events {
			out.MaxSeq = max(out.MaxSeq, out.Events[i].Seq)
		}
		for _, f := range out.Failures {
			out.MaxSeq = max(out.MaxSeq, f.Seq)
		}
		held := size
		b, size = Batch{}, 0
		err := c.handler(ctx, out)
		cs.ahead.done(held)
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case it, ok := <-cs.items:
			for ok {
				if it.fail != nil {
					b.Failures = append(b.Failures, it.fail)
				} else {
					b.Events = append(b.Events, it.ev)
					b.Received = append(b.Received, it.at)
				}
				size += it.size
				if b.Len() >= c.opts.BatchSize || size >= c.opts.BatchBytes {
					break
				}
				// Take what else has arrived, without waiting for more.
				select {
				case it, ok = <-cs.items:
					continue
				default:
				}
				break
			}
			if !ok {
				return flush()
			}
			if b.Len() >= c.opts.BatchSize || size >= c.opts.BatchBytes || c.opts.BatchLinger <= 0 {
				if err := flush(); err != nil {
					return err
				}
			} else if linger == nil {
				linger = time.NewTimer(c.opts.BatchLinger)
				lingerC = linger.C
			}
		case <-lingerC:
			if err := flush(); err != nil {
				return err
			}
		}
	}
}
