// Package jetstream speaks Jetstream v1 (github.com/bluesky-social/jetstream),
// the JSON projection of the AT Protocol firehose: the event model, frame
// decoding, a websocket client and a replay server.
//
// # Wire format
//
// A subscriber opens a websocket on /subscribe. Query parameters:
// wantedCollections (repeated; an NSID or an NSID prefix ending in ".*"),
// wantedDids (repeated), cursor (Unix microseconds; replay every event with
// time_us >= cursor, then live tail; absent = live tail only), compress=true
// and maxMessageSizeBytes. Each event is one websocket message: a text frame
// holding one JSON object, or with compress=true a binary frame holding one
// zstd frame compressed with the dictionary embedded here (ID 1612007021).
// Identity and account events carry no collection and so pass every
// collection filter. The subscriber may send a text message
//
//	{"type":"options_update","payload":{"wantedCollections":[...],"wantedDids":[...],"maxMessageSizeBytes":0}}
//
// to replace its filters on the live socket; cursor and compression are fixed
// for the life of the connection.
//
// # Decoding
//
// Decode (JSON) and Decoder.Decode (JSON or zstd, size-bounded) return a
// validated Event or a *DecodeError whose Class says why not:
// malformed_json, bad_zstd, invalid_event, oversized. Validation is what the
// processor relies on (known kind, DID, time_us > 0, the matching
// sub-object, a complete commit); it is not a lexicon check of the record,
// which stays raw JSON. Unknown fields are ignored, so Jetstream can add
// fields without breaking us.
package jetstream
