// Package atproto holds the AT Protocol rules the workers share that
// indigo's atproto/syntax does not give as this project needs them:
//
//   - NSIDs and Jetstream's "prefix.*" collection patterns (nsid.go);
//   - the Lexicon datetime, checked as the spec's test vectors say
//     (datetime.go);
//   - a PDS's refusals that mean an account is not active (repostate.go);
//   - strict JSON decoding of network data: member names matched exactly
//     and once, UTF-8 only (strictjson.go).
//
// It imports nothing of this module.
package atproto
