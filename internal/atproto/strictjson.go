// This file decodes JSON that comes from the network (records,
// Jetstream frames, XRPC and DID-document responses) the way the AT
// Protocol data model reads it, where encoding/json would read it
// differently from every other implementation:
//
//   - object member names match struct field names exactly: "Digest" or
//     "DIGEST" is an unknown member, not the lexicon's "digest"
//     (encoding/json matches names case-insensitively, so a record
//     carrying only "TAG" would be read as a tag that a JavaScript or
//     Rust AppView finds missing);
//   - a member name repeated in one object is an error, where
//     encoding/json keeps the last value (the data model forbids
//     duplicate keys: atproto.com/specs/data-model; DAG-CBOR cannot carry
//     them);
//   - strings must be valid UTF-8 (the data model's strings are Unicode),
//     where encoding/json replaces invalid bytes with U+FFFD;
//   - a document that is JSON null where an object is decoded (a struct)
//     is an error (ErrNull), where encoding/json leaves the struct zero
//     and says nothing: a Jetstream line "null" was reported as an event
//     whose DID "" is not a DID.
//
// Unknown members are still ignored: lexicons evolve by adding fields.
// The decoder is github.com/go-json-experiment/json with its default
// options, which is encoding/json/v2 itself when built with
// GOEXPERIMENT=jsonv2 (the module aliases the standard package then).

package atproto

import (
	"bytes"
	"errors"
	"io"
	"reflect"

	json "github.com/go-json-experiment/json"
)

// Unmarshal decodes the single JSON value in data into v (a non-nil
// pointer) under the package's rules. Trailing non-whitespace after the
// value is an error. Errors describe the offending member by its JSON
// pointer (e.g. within "/layers/0/size").
func Unmarshal(data []byte, v any) error {
	if isNull(data) && decodesObject(v) {
		return ErrNull
	}
	return json.Unmarshal(data, v)
}

// ErrNull is the error for a document that is JSON null where an object
// is decoded.
var ErrNull = errors.New("the document is null, not a JSON object")

// isNull reports whether data is the JSON value null (surrounding JSON
// whitespace allowed).
func isNull(data []byte) bool {
	return bytes.Equal(bytes.Trim(data, " \t\r\n"), []byte("null"))
}

// decodesObject reports whether v points to a struct.
func decodesObject(v any) bool {
	t := reflect.TypeOf(v)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct
}

// UnmarshalRead decodes the single JSON value read from r (to io.EOF)
// into v under the package's rules; like Unmarshal, trailing
// non-whitespace is an error. Bound r (io.LimitReader) when it comes from
// the network.
func UnmarshalRead(r io.Reader, v any) error {
	if !decodesObject(v) {
		return json.UnmarshalRead(r, v)
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return Unmarshal(data, v)
}
