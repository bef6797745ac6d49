// Package jetstream speaks Jetstream (github.com/bluesky-social/jetstream),
// the JSON projection of the AT Protocol firehose, on both of its wires:
// the event model, frame decoding, a websocket client and a replay server.
//
// # The v2 wire
//
// A URL whose path is /xrpc/network.bsky.jetstream.subscribeEvents (PathV2)
// speaks the v2 wire (docs/README.md §5.2 upstream): every frame is one
// JSON object, {"$type":"message","payload":{...}} with the payload's
// $type network.bsky.jetstream.subscribeEvents#commit|#identity|#account|
// #sync|#info, or a terminal {"$type":"error","error":NAME,...}. Events
// carry seq (the server's sequence number) and time (RFC 3339, µs).
// Filters: repeated collections (commits only; identity, account and sync
// always arrive). cursor is a seq below CursorSeqMax, else a time. A seq
// cursor below the server's lookback is refused before the upgrade
// (XRPC error CursorTooOld, naming the floor): the client tells
// ClientOptions.OnCursorTooOld and resumes from the floor. Compression:
// the host's dictionary from getZstdDictionary, zstdDictionary=<id>. No
// client frames (a filter change reconnects). Every event is decoded into
// the same Event as the legacy wire's, with Seq set.
//
// # The legacy wire
//
// Any other URL (normally /subscribe) speaks the v1 wire. A Jetstream v2
// server adds "cursor" (its sequence number, Event.Seq) to every event
// there and accepts a seq cursor too. Query parameters:
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
//
// # Client
//
// A Client holds one connection at a time and runs three goroutines per
// connection: a reader (reads and decodes frames, in order, into a buffer
// of BatchSize), a pinger, and the Run goroutine, which gathers the frames
// that have arrived into a Batch (at most BatchSize entries, without
// waiting for more unless BatchLinger is set) and calls the Handler. The Handler blocks the Run goroutine; the reader stops once the
// buffer is full, so a consumer that has not acknowledged a batch holds the
// stream back rather than queueing it in memory. Frames that fail to decode
// travel in the batch as Failures, counted by class, and the stream goes
// on: the next good event advances the consumer's cursor past them.
//
//	              Run(ctx)
//	                 │ CursorFor(url) → subscribe URL (wantedCollections, cursor, compress)
//	                 ▼
//	  ┌────────── dialing ◀──────────────────── backoff (×2, ±50% jitter;
//	  │              │ ok                         reset after a healthy
//	  │ fail         ▼                            connection; next URL after
//	  │          connected ── read fails ────────▶ a failed or never-healthy one)
//	  │              │        stale / server close
//	  │              │ ctx ends, Close, handler error
//	  ▼              ▼
//	backoff       stopped (Run returns)
//
// Liveness: Jetstream servers can go silent without closing, and some keep
// answering pings while they send nothing. A connection must bring an
// event (any data frame but a v2 #info) within StaleTimeout of the last
// one; pings and pongs do not count. Missing the deadline ends the
// connection (reason "stale") and the client moves to the next URL: on
// the real network identity and account events arrive every few seconds
// whatever the filter, so a silent host is a stuck one. The client still
// pings (StaleTimeout/3) and answers pings, to keep proxies from closing
// an idle socket. Each URL has its own backoff; a URL that refused, went
// stale or died before its first event is left for the next, one that
// was delivering is retried first.
//
// Sequence numbers: on a connection resumed from a seq cursor the event
// at the cursor (Jetstream replays inclusively) is dropped; a frame whose
// seq is below one the connection already carried is counted as a
// ClassSeqRegression failure and ends the connection with ErrSeqReset, so
// the host is resumed by time (dropping every frame below a number one
// bad frame had set lost them all). Batch.MaxSeq is the highest seq a batch
// covers, failures included, so a consumer's position moves past frames
// it could not use.
//
// Oversized frames: websocket.Conn.SetReadLimit is deliberately not used.
// gorilla/websocket treats the limit as fatal to the connection (it sends
// close 1009 and every later read fails), so the only recovery is a
// reconnect from the stored cursor — which replays the same frame and fails
// the same way, forever. Skipping it by cursor is impossible (its time_us
// is inside the frame we refused to read), and asking the server to drop
// such events (maxMessageSizeBytes) would hide them from our counters. So
// the reader reads at most MaxMessageBytes+1 bytes of a frame into memory;
// if there is more, it streams the rest to io.Discard, reports the frame as
// a ClassOversized failure, and carries on with the next frame on the same
// connection. Memory stays bounded by the limit, the frame is counted, and
// there is nothing to loop on. A frame must still arrive whole within
// StaleTimeout (pings do not extend a frame in progress), so an endless
// frame from a hostile server ends in a stale reconnect, paced by the
// backoff, rather than a hang.
// Binary frames are also bounded after decompression (the zstd decoder's
// memory limit), so a small frame cannot inflate without bound.
//
// Close (or cancelling Run's context) cancels the handler's context, sends a
// close frame with a 10 ms budget, closes the socket and waits for every
// goroutine; it returns as soon as the handler honours its context.
//
// A frame's way through the client, file by file: client.go (the Client,
// its options and the Run loop over URLs), failback.go (probes of earlier
// URLs), connection.go (one connection: dial, refusals, options_update,
// teardown), dictionary.go (the v2 host's zstd dictionary), frames.go
// (read: a frame decoded by decode.go or v2.go, checked and queued;
// deliver: frames gathered into a Batch for the Handler).
//
// # Replay server
//
// ReplayServer serves a JSONL capture through the same protocol, for
// `appview jetstream-replay`, demos and tests. See its documentation for the
// ways it differs from a real Jetstream.
package jetstream
