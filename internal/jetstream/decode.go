package jetstream

import (
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bluesky-social/indigo/atproto/syntax"
	"github.com/klauspost/compress/zstd"

	"github.com/atcr-io/appview/internal/atproto"
)

// DictionaryID is the zstd dictionary ID of the dictionary Jetstream v1 uses
// for compress=true (the ID written in every compressed frame's header).
const DictionaryID uint32 = 1612007021

// DefaultMaxEventBytes bounds one event, in bytes, when the caller gives no
// limit: both the frame as received and the JSON after decompression. It
// matches config.Default().Jetstream.MaxMessageBytes.
const DefaultMaxEventBytes = 2 << 20

// dictionary is the zstd dictionary Jetstream v1 compresses compress=true
// frames with, copied byte for byte from the shared fixture
// testdata/jetstream/legacy_subscribe.zdict (embed cannot reach outside the
// package).
//
//go:embed legacy_subscribe.zdict
var dictionary []byte

// ErrorClass names why a frame could not be turned into an Event. Callers
// count failures by class (the decode_errors_total{class} metric).
type ErrorClass string

// Decode failure classes.
const (
	// ClassMalformedJSON: the frame (or its decompressed content) is not a
	// JSON object of the event shape (syntax error, wrong field type,
	// trailing data).
	ClassMalformedJSON ErrorClass = "malformed_json"
	// ClassBadZstd: a binary frame is not a zstd frame this dictionary can
	// decode (corrupt, truncated, unknown dictionary ID).
	ClassBadZstd ErrorClass = "bad_zstd"
	// ClassInvalidEvent: well-formed JSON that is not a usable Jetstream v1
	// event (unknown kind, no DID, time_us <= 0, incomplete commit).
	ClassInvalidEvent ErrorClass = "invalid_event"
	// ClassOversized: the frame, or its decompressed content, exceeds the
	// size limit; it was not decoded.
	ClassOversized ErrorClass = "oversized"
	// ClassUnwantedCollection: a commit in a collection the Client did not
	// ask for (a server that does not filter, or an event already in flight
	// when an options_update narrowed the filter). Only a Client reports
	// it; Decode does not know the filter.
	ClassUnwantedCollection ErrorClass = "unwanted_collection"
	// ClassUnknownType: a v2 frame or payload whose $type this client does
	// not know (skipped for forward compatibility, counted).
	ClassUnknownType ErrorClass = "unknown_type"
	// ClassSeqRegression: a frame whose sequence number is below one the
	// same connection already carried (a broken server, or one bad frame
	// numbered far ahead); only a Client reports it, counted, and it ends
	// the connection (ErrSeqReset: the host is resumed by time).
	ClassSeqRegression ErrorClass = "seq_regression"
)

// ErrorClasses lists every ErrorClass, for pre-creating metric series.
var ErrorClasses = []ErrorClass{ClassMalformedJSON, ClassBadZstd, ClassInvalidEvent, ClassOversized,
	ClassUnwantedCollection, ClassUnknownType, ClassSeqRegression}

// DecodeError is the error returned by Decode and Decoder.Decode (always as
// *DecodeError). It is also what a Client delivers for a frame it skipped.
type DecodeError struct {
	// Class is why the frame was rejected.
	Class ErrorClass
	// Size is the frame's length in bytes as received (compressed size for a
	// binary frame).
	Size int64
	// TimeUS is the event's time_us in Unix microseconds when the JSON got
	// far enough to tell (ClassInvalidEvent), else 0.
	TimeUS int64
	// Seq is the frame's sequence number when it got far enough to tell,
	// else 0: a consumer's position may move past it.
	Seq int64
	// Err is the underlying cause.
	Err error
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("jetstream frame (%d bytes): %s: %v", e.Size, e.Class, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// ClassOf returns the class of a decode error, or "" when err is not (and
// does not wrap) a *DecodeError.
func ClassOf(err error) ErrorClass {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Class
	}
	return ""
}

// Decode decodes one JSON event (the payload of a text frame) and validates
// it (see Validate). Unknown fields are ignored. It does not bound the size;
// a Decoder does. The error is always a *DecodeError of class
// ClassMalformedJSON or ClassInvalidEvent.
func Decode(data []byte) (Event, error) {
	var ev Event
	if err := atproto.Unmarshal(data, &ev); err != nil {
		return Event{}, &DecodeError{Class: ClassMalformedJSON, Size: int64(len(data)), Err: err}
	}
	if err := Validate(&ev); err != nil {
		return Event{}, &DecodeError{Class: ClassInvalidEvent, Size: int64(len(data)), TimeUS: ev.TimeUS, Seq: max(ev.Seq, 0), Err: err}
	}
	return ev, nil
}

// MinEventTimeUS is the earliest time an event may carry (2023-01-01 UTC,
// before any Jetstream ran, in Unix microseconds): an earlier time_us is
// a broken server or a unit mistake (milliseconds read as microseconds),
// and is refused rather than used as a version or a cursor.
const MinEventTimeUS int64 = 1672531200_000000

// Validate checks that an event is complete enough for a processor to act on
// without further nil checks: a known kind, a DID (AT Protocol syntax), time_us > 0,
// the sub-object matching the kind, and for a commit an operation
// (create/update/delete), a collection, an rkey, and a record (a non-null
// JSON value) on create and update. It clears the sub-objects that do not
// match the kind, so exactly one of Commit, Identity and Account is set.
func Validate(ev *Event) error {
	if !validDID(ev.DID) {
		return fmt.Errorf("did %q is not a DID", ev.DID)
	}
	if ev.TimeUS < MinEventTimeUS {
		return fmt.Errorf("time_us %d is not a Unix-microsecond time after %s", ev.TimeUS, time.UnixMicro(MinEventTimeUS).UTC().Format(time.DateOnly))
	}
	if ev.Seq < 0 {
		return fmt.Errorf("sequence number %d is negative", ev.Seq)
	}
	switch ev.Kind {
	case KindCommit:
		c := ev.Commit
		if c == nil {
			return errors.New("commit event without a commit")
		}
		switch c.Operation {
		case OpCreate, OpUpdate:
			if len(c.Record) == 0 || string(c.Record) == "null" {
				return fmt.Errorf("commit %s %s/%s without a record", c.Operation, c.Collection, c.RKey)
			}
		case OpDelete:
		default:
			return fmt.Errorf("commit operation %q is not create, update or delete", c.Operation)
		}
		if c.Collection == "" {
			return errors.New("commit without a collection")
		}
		if c.RKey == "" {
			return errors.New("commit without an rkey")
		}
		ev.Identity, ev.Account, ev.Sync = nil, nil, nil
	case KindIdentity:
		if ev.Identity == nil {
			return errors.New("identity event without an identity")
		}
		ev.Commit, ev.Account, ev.Sync = nil, nil, nil
	case KindAccount:
		if ev.Account == nil {
			return errors.New("account event without an account")
		}
		if ev.Account.Active == nil {
			// Required: read as false it would hide the account.
			return errors.New("account event without active")
		}
		ev.Commit, ev.Identity, ev.Sync = nil, nil, nil
	case KindSync:
		if ev.Sync == nil {
			return errors.New("sync event without a sync")
		}
		ev.Commit, ev.Identity, ev.Account = nil, nil, nil
	default:
		return fmt.Errorf("unknown kind %q", ev.Kind)
	}
	return nil
}

// validDID reports whether s is a DID by the AT Protocol syntax
// (atproto.com/specs/did), as syntax.ParseDID checks it: an event whose
// repo is not one names nothing the processor could store.
func validDID(s string) bool {
	_, err := syntax.ParseDID(s)
	return err == nil
}

// Decoder decodes websocket frames: text frames are JSON, binary frames are
// one zstd frame each, compressed with Jetstream's dictionary. It bounds the
// size of both. A Decoder is safe for concurrent use; it is expensive to
// build, so build one and reuse it.
type Decoder struct {
	zd  *zstd.Decoder
	max int64
	// dictID is the dictionary's ID for a v2 decoder (0: the legacy one).
	dictID uint32
}

// NewDecoder returns a Decoder that rejects (ClassOversized) frames, and
// decompressed events, larger than maxEventBytes bytes; <= 0 means
// DefaultMaxEventBytes. Binary frames use the legacy wire's dictionary.
// The error is only about building the zstd decoder.
func NewDecoder(maxEventBytes int64) (*Decoder, error) {
	return NewDecoderDict(maxEventBytes, dictionary)
}

// NewDecoderDict is NewDecoder for binary frames compressed with dict (the
// v2 wire's dictionary, from getZstdDictionary).
func NewDecoderDict(maxEventBytes int64, dict []byte) (*Decoder, error) {
	if maxEventBytes <= 0 {
		maxEventBytes = DefaultMaxEventBytes
	}
	zd, err := zstd.NewReader(nil,
		zstd.WithDecoderDicts(dict),
		// Bounds DecodeAll's output, so a small frame cannot inflate into
		// gigabytes before the size check below.
		zstd.WithDecoderMaxMemory(uint64(maxEventBytes)),
	)
	if err != nil {
		return nil, fmt.Errorf("jetstream zstd decoder: %w", err)
	}
	return &Decoder{zd: zd, max: maxEventBytes}, nil
}

// MaxEventBytes is the limit the Decoder enforces, in bytes.
func (d *Decoder) MaxEventBytes() int64 { return d.max }

// Decode decodes one legacy-wire frame. compressed is true for a binary
// websocket frame (zstd with the dictionary), false for a text frame
// (JSON). The error is always a *DecodeError; the Event is only valid when
// err is nil.
func (d *Decoder) Decode(frame []byte, compressed bool) (Event, error) {
	var ev Event
	err := d.open(frame, compressed, func(js []byte) error {
		var err error
		ev, err = Decode(js)
		return err
	})
	return ev, err
}

// decodeV2 decodes one v2-wire frame (see decodeV2).
func (d *Decoder) decodeV2(frame []byte, compressed bool) (decodedV2, error) {
	var out decodedV2
	err := d.open(frame, compressed, func(js []byte) error {
		var err error
		out, err = decodeV2(js)
		return err
	})
	return out, err
}

// open bounds a frame, decompresses it when compressed, and hands the JSON
// to fn (valid only during the call). Errors are *DecodeError, sized as
// received.
func (d *Decoder) open(frame []byte, compressed bool, fn func(js []byte) error) error {
	size := int64(len(frame))
	if size > d.max {
		return &DecodeError{Class: ClassOversized, Size: size,
			Err: fmt.Errorf("frame exceeds the %d-byte limit", d.max)}
	}
	if !compressed {
		return fn(frame)
	}
	if size == 0 {
		// DecodeAll accepts empty input as zero frames; a binary message
		// must hold exactly one.
		return &DecodeError{Class: ClassBadZstd, Err: errors.New("empty binary frame")}
	}
	// A pooled scratch buffer keeps the steady state allocation-free apart
	// from the Event itself (json.Unmarshal copies what it keeps).
	bp := scratch.Get().(*[]byte)
	defer scratch.Put(bp)
	js, err := d.zd.DecodeAll(frame, (*bp)[:0])
	if err != nil {
		class := ClassBadZstd
		// Every way zstd says "larger than the limit" is an oversized
		// event, not a broken frame: a frame without its content size
		// declares a window above the limit (ErrWindowSizeExceeded).
		if errors.Is(err, zstd.ErrDecoderSizeExceeded) || errors.Is(err, zstd.ErrWindowSizeExceeded) ||
			errors.Is(err, zstd.ErrFrameSizeExceeded) {
			class = ClassOversized
		}
		return &DecodeError{Class: class, Size: size, Err: err}
	}
	if int64(len(js)) > d.max {
		return &DecodeError{Class: ClassOversized, Size: size,
			Err: fmt.Errorf("decompressed event of %d bytes exceeds the %d-byte limit", len(js), d.max)}
	}
	if cap(js) <= maxPooledScratch {
		*bp = js
	}
	err = fn(js)
	var de *DecodeError
	if errors.As(err, &de) {
		de.Size = size
	}
	return err
}

// Close releases the zstd decoder's buffers. The Decoder must not be used
// afterwards.
func (d *Decoder) Close() { d.zd.Close() }

// maxPooledScratch keeps one rare huge event from pinning its buffer in the
// pool for the life of the process (bytes).
const maxPooledScratch = 1 << 20

var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// encoder compresses at the fastest level: the replay server compresses
// each event as it first sends it, and with a dictionary the default
// level's per-frame reset costs about 5× as much (7 ms vs 1.5 ms an event
// under -race, 153 real events) for frames within 1 % of the same size.
var encoder = sync.OnceValues(func() (*zstd.Encoder, error) {
	return zstd.NewWriter(nil, zstd.WithEncoderDict(dictionary), zstd.WithEncoderLevel(zstd.SpeedFastest))
})

// Compress encodes one JSON event as a Jetstream v1 binary frame: a single
// zstd frame using the Jetstream dictionary (its ID in the frame header),
// appended to dst. Safe for concurrent use.
func Compress(dst, event []byte) []byte {
	enc, err := encoder()
	if err != nil {
		// The dictionary is embedded and checked by the tests; failing here
		// means the binary itself is broken.
		panic(fmt.Sprintf("jetstream: zstd encoder with the embedded dictionary: %v", err))
	}
	return enc.EncodeAll(event, dst)
}
