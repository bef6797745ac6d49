package jetstream

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
)

// replayEvent is one line of the capture, ready to send.
type replayEvent struct {
	timeUS int64
	// seq is the line's "cursor" field (a v2 server's sequence number on
	// the legacy wire), 0 when it has none.
	seq        int64
	did        string
	collection string
	// raw is the line as captured; compressed is raw as a binary frame,
	// built the first time a compressed subscription sends it (once).
	// Lazily, event by event: compressing a large capture up front
	// (seconds to minutes) would keep the first subscriber waiting with
	// nothing on the wire, and a client counts that as a silent host.
	raw, compressed []byte
	once            sync.Once
	// prefix and suffix surround the digits of the top-level time_us in
	// raw, so a looped copy is the same bytes with another number.
	prefix, suffix []byte
	// v2 is the event as a v2 wire frame, built when first sent
	// (replay_v2.go).
	v2 v2Copy
}

// maxSkipLogs bounds the per-line warnings of skipped capture lines.
const maxSkipLogs = 20

// loadCapture reads a JSONL capture; name is only for error messages. A
// line that is not an event is passed to skip (its 1-based number and why)
// and left out; it fails on a read error or when no line is an event.
func loadCapture(name string, r io.Reader, skip func(lineNo int, err error)) ([]replayEvent, error) {
	br := bufio.NewReader(r)
	var events []replayEvent
	for lineNo := 1; ; lineNo++ {
		line, err := br.ReadBytes('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("jetstream replay: %s:%d: %w", name, lineNo, err)
		}
		if lineNo == 1 {
			// A UTF-8 byte-order mark, as some editors write one, is not
			// part of the first event (RFC 8259 §8.1 lets a parser ignore
			// it).
			line = bytes.TrimPrefix(line, []byte("\ufeff"))
		}
		if trimmed := bytes.TrimSpace(line); len(trimmed) > 0 {
			ev, derr := Decode(trimmed)
			var prefix, suffix []byte
			if derr == nil {
				prefix, suffix, derr = splitAtTimeUS(trimmed)
			}
			if derr != nil {
				skip(lineNo, derr)
				if errors.Is(err, io.EOF) {
					break
				}
				continue
			}
			raw := append([]byte(nil), trimmed...)
			events = append(events, replayEvent{
				timeUS:     ev.TimeUS,
				seq:        ev.Seq,
				did:        ev.DID,
				collection: ev.Collection(),
				raw:        raw,
				prefix:     prefix,
				suffix:     suffix,
			})
		}
		if errors.Is(err, io.EOF) {
			break
		}
	}
	if len(events) == 0 {
		return nil, fmt.Errorf("jetstream replay: %s: no events", name)
	}
	return events, nil
}

// splitAtTimeUS returns the bytes of an event object before and after the
// digits of its top-level "time_us" value (the last one, as encoding/json
// keeps the last of duplicate keys). It walks the top level with a tokenizer
// so a "time_us" inside a record cannot be mistaken for it.
func splitAtTimeUS(obj []byte) (prefix, suffix []byte, err error) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if _, err := dec.Token(); err != nil { // the opening brace; Decode checked the shape
		return nil, nil, err
	}
	start, end := -1, -1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		keyEnd := int(dec.InputOffset())
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, nil, err
		}
		if tok == "time_us" {
			valueEnd := int(dec.InputOffset())
			i := bytes.IndexAny(obj[keyEnd:valueEnd], "-0123456789")
			if i < 0 || !bytes.Equal(obj[keyEnd+i:keyEnd+i+len(value)], value) {
				return nil, nil, fmt.Errorf("time_us %s is not an integer literal", value)
			}
			start, end = keyEnd+i, keyEnd+i+len(value)
		}
	}
	if start < 0 {
		return nil, nil, errors.New("no top-level time_us")
	}
	return append([]byte(nil), obj[:start]...), append([]byte(nil), obj[end:]...), nil
}

// frame is event e with time_us shifted by shift, as a text or binary frame
// payload.
func (e *replayEvent) frame(shift int64, compress bool) []byte {
	if shift == 0 {
		if compress {
			e.once.Do(func() { e.compressed = Compress(nil, e.raw) })
			return e.compressed
		}
		return e.raw
	}
	line := make([]byte, 0, len(e.prefix)+20+len(e.suffix))
	line = append(line, e.prefix...)
	line = strconv.AppendInt(line, e.timeUS+shift, 10)
	line = append(line, e.suffix...)
	if compress {
		return Compress(nil, line)
	}
	return line
}
