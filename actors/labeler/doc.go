// Package labeler is the labeler subscriber: it follows one labeler's
// com.atproto.label.subscribeLabels stream and keeps taken_down_subjects
// (docs/spec.md §8) in step with its `!takedown` labels. It runs under the lease
// "labeler-subscriber", so exactly one instance follows the stream.
//
// # Stream
//
// Each binary websocket message is two DAG-CBOR items back to back
// (atproto.com/specs/event-stream): a header {op, t} and a body.
//
//	op  1, t "#labels"  {seq, labels[]}   apply labels, cursor := seq
//	                                      (seq <= cursor: skip, counted)
//	op  1, t "#info"    {name, message}   log (OutdatedCursor: warn)
//	op  1, other t                        ignore (counted)
//	op -1               {error, message}  the labeler ends the stream:
//	                      FutureCursor     cursor := 0, reconnect (full replay)
//	                      ConsumerTooSlow  reconnect from the stored cursor
//	                      anything else    reconnect from the stored cursor
//
// A frame that does not decode is skipped, logged (sampled: at most 10 a
// minute) and counted; the stream goes on. So is a #labels frame whose seq
// is not above the last applied one (equal included: that frame has
// landed already): nothing is written, the cursor does not move, and
// appview_labeler_frames_total{kind="seq_regression"} counts it. Applying
// it would re-apply labels a later frame may have negated and move the
// stored cursor back, so the next connection would replay from there. A
// label that cannot be applied (malformed, a subject outside the registry)
// is skipped the same way; the rest of its frame still lands.
//
// # Labels
//
// Only `!takedown` is acted on; other values are counted and ignored. A
// label is kept as the protocol keys it (com.atproto.label.defs#label:
// src, uri, val), one row of the labels table each; a later label with the
// same key replaces it, and one with neg true, or whose exp has passed
// (database clock), removes it. taken_down_subjects is derived from those
// rows: a subject (src, did, repo) is there while any label maps to it,
// with the label that lasts longest (no exp before the latest exp), so
// negating one of two labels on a repository leaves it taken down, and
// its expires_at is when the last of them lapses; readers must treat a
// row past its expires_at as not taken down.
//
// The subject (uri) maps to an account or a repository: a bare DID or
// at://DID is the account (repo ""); at://DID/io.atcr.repo.page/REPO is
// REPO; a manifest or tag record URI is the repository of that record,
// looked up in manifests/tags by (did, rkey). A takedown of a record not
// indexed yet (a labeler's history replays in seconds, a backfill takes
// longer) is kept as pending and applied once the record is indexed: the
// subscriber looks again every Options.ResolveEvery (outcome "resolved").
// A label keeps the repository it was resolved to after its record is
// deleted, and a negation finds it by uri, record or not.
// Signatures (sig) are not verified: the subscriber trusts the endpoint the
// operator configured.
//
// # Custody, cursor and shutdown
//
// A frame's labels and the cursor (labeler_cursors, keyed by the stream's
// endpoint, because a seq is numbered by the service that serves it) are
// written in one fence.Fenced transaction under the worker's custody: a
// frame lands whole with its cursor, or not at all and is received again.
// A fenced write that finds the custody superseded makes the actor fail
// with fence.ErrSuperseded (its parent treats that as lost custody).
//
// The actor owns at most one session goroutine (one connection). A session
// ends on a closed or stale stream (no frame and no pong to our pings for
// labeler.stale_timeout), an error frame, or a failed write; the actor then
// schedules a reconnect with exponential backoff and jitter, reset once a
// connection has applied a frame. Stopping cancels the timer, closes the
// socket and waits for the session goroutine, so nothing is written after
// the actor has stopped.
package labeler
