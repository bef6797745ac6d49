package labeler

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// Header values of an AT Protocol event-stream frame (atproto.com/specs/
// event-stream): op 1 is a message whose type is t, op -1 is an error.
const (
	opMessage = 1
	opError   = -1

	typeLabels = "#labels" // com.atproto.label.subscribeLabels#labels
	typeInfo   = "#info"   // com.atproto.label.subscribeLabels#info
)

// Error and info names of com.atproto.label.subscribeLabels (and the
// event-stream spec) that the subscriber reacts to.
const (
	errFutureCursorName    = "FutureCursor"
	errConsumerTooSlowName = "ConsumerTooSlow"
	infoOutdatedCursorName = "OutdatedCursor"
)

// frameKind classifies a decoded frame.
type frameKind int

const (
	kindLabels  frameKind = iota // op 1, t "#labels": labels with a seq
	kindInfo                     // op 1, t "#info": name and message
	kindError                    // op -1: error and message; the server closes the stream
	kindUnknown                  // op 1 with a type this subscriber does not know: ignored
)

// frame is one decoded subscribeLabels message.
type frame struct {
	kind frameKind
	// t is the header's message type.
	t string
	// seq is the sequence number of a #labels frame.
	seq int64
	// labels are the undecoded labels of a #labels frame, decoded one by
	// one so that one malformed label does not cost the rest of the frame.
	labels []cbor.RawMessage
	// name is the #info name or the error code of an error frame.
	name string
	// message is the human-readable text of an #info or error frame.
	message string
}

type frameHeader struct {
	Op *int64 `cbor:"op"`
	T  string `cbor:"t"`
}

type labelsBody struct {
	Seq    *int64            `cbor:"seq"`
	Labels []cbor.RawMessage `cbor:"labels"`
}

type infoBody struct {
	Name    string `cbor:"name"`
	Message string `cbor:"message"`
}

type errorBody struct {
	Error   string `cbor:"error"`
	Message string `cbor:"message"`
}

// Label is com.atproto.label.defs#label: a labeler's statement (val)
// about a subject (uri: an at:// URI or a bare DID).
type Label struct {
	// Ver is the label format version (1).
	Ver *int64 `cbor:"ver"`
	// Src is the DID of the labeler that issued the label.
	Src string `cbor:"src"`
	// URI is the subject: at://DID[/COLLECTION/RKEY] or a bare DID.
	URI string `cbor:"uri"`
	// CID optionally pins a specific version of a record subject.
	CID string `cbor:"cid"`
	// Val is the label value, e.g. "!takedown".
	Val string `cbor:"val"`
	// Neg true retracts an earlier label with the same src, uri and val.
	Neg bool `cbor:"neg"`
	// Cts is when the label was created (RFC 3339).
	Cts string `cbor:"cts"`
	// Exp optionally says when the label stops applying (RFC 3339).
	Exp string `cbor:"exp"`
	// Sig is the labeler's signature; this subscriber does not verify it.
	Sig []byte `cbor:"sig"`
}

// decMode decodes DAG-CBOR strictly: no indefinite lengths, no duplicate
// map keys, bounded nesting and sizes, so a hostile frame costs little;
// and map keys name struct fields exactly (the data model's keys are
// case-sensitive: a label's "VAL" is not its "val", where the library's
// default would fall back to a case-insensitive match).
var decMode = func() cbor.DecMode {
	dm, err := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		FieldNameMatching: cbor.FieldNameMatchingCaseSensitive,
		IndefLength:       cbor.IndefLengthForbidden,
		MaxNestedLevels:   16,
		MaxArrayElements:  1 << 16,
		MaxMapPairs:       1 << 10,
	}.DecMode()
	if err != nil {
		panic(err) // constant options: a failure is a programming error
	}
	return dm
}()

// errMalformed marks a frame or label that does not decode or lacks a
// required field.
var errMalformed = errors.New("malformed")

// decodeFrame splits one binary websocket message into its header and body
// (two DAG-CBOR items back to back) and decodes the body by the header.
// Errors wrap errMalformed.
func decodeFrame(data []byte) (frame, error) {
	dec := decMode.NewDecoder(bytes.NewReader(data))
	var h frameHeader
	if err := dec.Decode(&h); err != nil {
		return frame{}, fmt.Errorf("%w frame header: %v", errMalformed, err)
	}
	if h.Op == nil {
		return frame{}, fmt.Errorf("%w frame header: no op", errMalformed)
	}
	var (
		f   = frame{t: h.T}
		err error
	)
	switch {
	case *h.Op == opError:
		var b errorBody
		if err = dec.Decode(&b); err == nil && b.Error == "" {
			err = errors.New("error frame without an error code")
		}
		f.kind, f.name, f.message = kindError, b.Error, b.Message
	case *h.Op != opMessage:
		return frame{}, fmt.Errorf("%w frame header: op %d", errMalformed, *h.Op)
	case h.T == typeLabels:
		var b labelsBody
		if err = dec.Decode(&b); err == nil && b.Seq == nil {
			err = errors.New("#labels without seq")
		}
		if err == nil {
			f.kind, f.seq, f.labels = kindLabels, *b.Seq, b.Labels
		}
	case h.T == typeInfo:
		var b infoBody
		if err = dec.Decode(&b); err == nil && b.Name == "" {
			err = errors.New("#info without name")
		}
		f.kind, f.name, f.message = kindInfo, b.Name, b.Message
	default:
		var skip cbor.RawMessage
		err = dec.Decode(&skip)
		f.kind = kindUnknown
	}
	if err != nil {
		return frame{}, fmt.Errorf("%w frame body (t %q): %v", errMalformed, h.T, err)
	}
	if dec.NumBytesRead() != len(data) {
		return frame{}, fmt.Errorf("%w frame: %d trailing bytes", errMalformed, len(data)-dec.NumBytesRead())
	}
	return f, nil
}

// decodeLabel decodes one label and checks its required fields. Errors
// wrap errMalformed.
func decodeLabel(raw cbor.RawMessage) (Label, error) {
	var l Label
	if err := decMode.Unmarshal(raw, &l); err != nil {
		return Label{}, fmt.Errorf("%w label: %v", errMalformed, err)
	}
	switch {
	case l.Src == "":
		return Label{}, fmt.Errorf("%w label: no src", errMalformed)
	case l.URI == "":
		return Label{}, fmt.Errorf("%w label: no uri", errMalformed)
	case l.Val == "":
		return Label{}, fmt.Errorf("%w label: no val", errMalformed)
	case l.Cts == "":
		return Label{}, fmt.Errorf("%w label: no cts", errMalformed)
	}
	return l, nil
}
