package jetstream

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/logval"
)

// The Jetstream v2 wire (docs/README.md §5.2 of
// github.com/bluesky-social/jetstream): proposal-0015 JSON frames on
// /xrpc/network.bsky.jetstream.subscribeEvents.
const (
	// PathV2 is the v2 stream's path; a configured URL with this path
	// selects the v2 wire, any other path the legacy /subscribe wire.
	PathV2 = "/xrpc/network.bsky.jetstream.subscribeEvents"
	// PathZstdDictionary serves the v2 wire's compression dictionary.
	PathZstdDictionary = "/xrpc/network.bsky.jetstream.getZstdDictionary"

	v2Prefix = "network.bsky.jetstream.subscribeEvents#"
)

// XRPC error names the client branches on (pre-upgrade refusals and
// terminal error frames).
const (
	ErrNameCursorTooOld          = "CursorTooOld"
	ErrNameUnknownZstdDictionary = "UnknownZstdDictionary"
	ErrNameConsumerTooSlow       = "ConsumerTooSlow"
)

// CursorSeqMax splits the two cursor spaces a Jetstream v2 server
// accepts on ?cursor= (docs/README.md §5.1): a value below it is a
// sequence number, one at or above it a Unix-microsecond time.
const CursorSeqMax = 1_000_000_000_000_000

// Wire is the protocol a configured URL speaks.
type Wire string

// Wires.
const (
	WireLegacy Wire = "legacy" // /subscribe: v1 JSON events (a v2 server adds "cursor")
	WireV2     Wire = "v2"     // /xrpc/network.bsky.jetstream.subscribeEvents
)

// WireOf returns the wire a configured endpoint URL selects by its path.
func WireOf(endpoint string) Wire {
	u, err := url.Parse(endpoint)
	if err == nil && strings.TrimSuffix(u.Path, "/") == PathV2 {
		return WireV2
	}
	return WireLegacy
}

// HostOf is the key a sequence number belongs to: the endpoint's
// host:port. Both wires of one server share its sequence, so two URLs on
// one host (one /subscribe, one v2) are one position space.
func HostOf(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return endpoint
	}
	return strings.ToLower(u.Host)
}

// v2Frame is one v2 websocket frame: a message (with payload), or a
// terminal error.
type v2Frame struct {
	Type    string          `json:"$type"`
	Payload json.RawMessage `json:"payload"`
	Error   string          `json:"error"`
	Message string          `json:"message"`
}

// v2Payload is the union of the message variants the client reads.
type v2Payload struct {
	Type       string          `json:"$type"`
	Seq        int64           `json:"seq"`
	DID        string          `json:"did"`
	Time       string          `json:"time"`
	Rev        string          `json:"rev"`
	Operation  string          `json:"operation"`
	Collection string          `json:"collection"`
	RKey       string          `json:"rkey"`
	CID        string          `json:"cid"`
	Record     json.RawMessage `json:"record"`
	Identity   *Identity       `json:"identity"`
	Account    *Account        `json:"account"`
	Sync       *Sync           `json:"sync"`
	// #info
	Name    string `json:"name"`
	Message string `json:"message"`
}

// Info is a v2 #info advisory (e.g. OutdatedCursor): no sequence number,
// not an event.
type Info struct {
	Name    string
	Message string
}

// ServerError is a v2 error frame (terminal: the server closes the
// connection after it) or a pre-upgrade XRPC refusal.
type ServerError struct {
	// Name is the XRPC error name (ConsumerTooSlow, CursorTooOld, ...).
	Name    string
	Message string
	// Status is the HTTP status of a pre-upgrade refusal, 0 for a frame.
	Status int
}

func (e *ServerError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("jetstream refused (HTTP %d): %s: %s", e.Status, e.Name, e.Message)
	}
	return fmt.Sprintf("jetstream error frame: %s: %s", e.Name, e.Message)
}

// decodedV2 is what one v2 frame is: an event, an advisory or a terminal
// error (exactly one set), or a *DecodeError.
type decodedV2 struct {
	ev   Event
	info *Info
	err  *ServerError
}

// decodeV2 decodes the JSON of one v2 frame: an event (validated like a
// legacy one), an #info advisory or a terminal error frame. Errors are
// *DecodeError.
func decodeV2(data []byte) (decodedV2, error) {
	size := int64(len(data))
	var f v2Frame
	if err := atproto.Unmarshal(data, &f); err != nil {
		return decodedV2{}, &DecodeError{Class: ClassMalformedJSON, Size: size, Err: err}
	}
	switch f.Type {
	case "message":
	case "error":
		return decodedV2{err: &ServerError{Name: bounded(f.Error), Message: bounded(f.Message)}}, nil
	default:
		return decodedV2{}, &DecodeError{Class: ClassUnknownType, Size: size, Err: fmt.Errorf("frame $type %q", bounded(f.Type))}
	}
	var p v2Payload
	if err := atproto.Unmarshal(f.Payload, &p); err != nil {
		return decodedV2{}, &DecodeError{Class: ClassMalformedJSON, Size: size, Err: fmt.Errorf("payload: %w", err)}
	}
	kind, ok := strings.CutPrefix(p.Type, v2Prefix)
	if !ok {
		return decodedV2{}, &DecodeError{Class: ClassUnknownType, Size: size, Seq: max(p.Seq, 0),
			Err: fmt.Errorf("payload $type %q", bounded(p.Type))}
	}
	if kind == "info" {
		return decodedV2{info: &Info{Name: p.Name, Message: p.Message}}, nil
	}
	switch kind {
	case KindCommit, KindIdentity, KindAccount, KindSync:
	default:
		return decodedV2{}, &DecodeError{Class: ClassUnknownType, Size: size, Seq: max(p.Seq, 0),
			Err: fmt.Errorf("payload $type %q", bounded(p.Type))}
	}
	ev := Event{DID: p.DID, Seq: p.Seq, Kind: kind}
	if p.Seq <= 0 {
		return decodedV2{}, &DecodeError{Class: ClassInvalidEvent, Size: size,
			Err: fmt.Errorf("%s event without a positive seq (%d)", kind, p.Seq)}
	}
	t, err := time.Parse(time.RFC3339Nano, p.Time)
	if err != nil {
		return decodedV2{}, &DecodeError{Class: ClassInvalidEvent, Size: size, Seq: p.Seq,
			Err: fmt.Errorf("time %q: %w", bounded(p.Time), err)}
	}
	ev.TimeUS = t.UnixMicro()
	switch kind {
	case KindCommit:
		ev.Commit = &Commit{Rev: p.Rev, Operation: p.Operation, Collection: p.Collection, RKey: p.RKey, CID: p.CID, Record: p.Record}
	case KindIdentity:
		ev.Identity = p.Identity
	case KindAccount:
		ev.Account = p.Account
	case KindSync:
		ev.Sync = p.Sync
	}
	if err := Validate(&ev); err != nil {
		return decodedV2{}, &DecodeError{Class: ClassInvalidEvent, Size: size, TimeUS: ev.TimeUS, Seq: p.Seq, Err: err}
	}
	return decodedV2{ev: ev}, nil
}

// bounded bounds a value a server chose (a $type, a time, an #info or
// error message) before it is quoted in an error or a log line: at most
// logval.MaxBytes, cut at whole UTF-8 characters, keeping both ends (the
// end of a message often carries its number: "... starting at seq N").
// Never a metric label: those go through label (a fixed set).
func bounded(s string) string { return logval.String(s) }

// zstdMagicDict opens a zstd dictionary; the 4 bytes after it are its ID
// (little endian), the ID a client sends as zstdDictionary=<id>.
var zstdMagicDict = []byte{0x37, 0xa4, 0x30, 0xec}

// DictionaryIDOf reads a zstd dictionary's ID from its header.
func DictionaryIDOf(dict []byte) (uint32, error) {
	if len(dict) < 8 || !bytes.Equal(dict[:4], zstdMagicDict) {
		return 0, errors.New("not a zstd dictionary (bad magic)")
	}
	return binary.LittleEndian.Uint32(dict[4:8]), nil
}
