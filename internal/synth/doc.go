// Package synth generates deterministic (seeded) synthetic ATCR traffic as
// Jetstream v1 events, and computes the exact database state the processor
// must produce from it.
//
// The stream covers every io.atcr collection the processor indexes: many
// users pushing image manifests and indexes (layers, annotations, a
// subject; holdDid and the legacy holdEndpoint) to several holds, manifest
// updates and deletes, tags created, moved to a new digest and deleted,
// stars (object and at-uri subjects) and unstars, profiles, repo pages,
// hold captain and crew records, hold stats from several holds for the same
// repository (absolute values; some arriving late with an older updatedAt,
// which must be ignored) and their deletes, identity and account events
// (for known users and for outsiders, which must be ignored), non-io.atcr
// noise and a few records that break their lexicon. time_us grows strictly.
// Some tags, repository names, org.opencontainers.image.created annotations
// and repo page descriptions look like dates, as in real traffic: go-libsql
// hands such TEXT to Go as a time.Time unless it is read through
// database.Text, so Diff catches any reader that forgets it.
//
// Expected is built by an independent model of the processor's rules,
// event by event, while generating: Diff compares it with a database.
// Generator.Next streams, so a stream of a million events never exists in
// memory at once; the model is bounded by users × repositories × holds.
//
// Run is the entry point of `appview-dev synth --seed N --events N --out
// F.jsonl [--expected F.json]`.
package synth
