// Package strictjson decodes JSON that comes from the network (records,
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
//     where encoding/json replaces invalid bytes with U+FFFD.
//
// Unknown members are still ignored: lexicons evolve by adding fields.
// The decoder is github.com/go-json-experiment/json with its default
// options, which is encoding/json/v2 itself when built with
// GOEXPERIMENT=jsonv2 (the module aliases the standard package then).
package strictjson

import (
	"io"

	json "github.com/go-json-experiment/json"
)

// Unmarshal decodes the single JSON value in data into v (a non-nil
// pointer) under the package's rules. Trailing non-whitespace after the
// value is an error. Errors describe the offending member by its JSON
// pointer (e.g. within "/layers/0/size").
func Unmarshal(data []byte, v any) error {
	return json.Unmarshal(data, v)
}

// UnmarshalRead decodes the single JSON value read from r (to io.EOF)
// into v under the package's rules; like Unmarshal, trailing
// non-whitespace is an error. Bound r (io.LimitReader) when it comes from
// the network.
func UnmarshalRead(r io.Reader, v any) error {
	return json.UnmarshalRead(r, v)
}
