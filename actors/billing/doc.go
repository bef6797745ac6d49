// Package billing is the billing tier refresh: a leased Job (lease
// "billing-tier-refresh", every billing.interval, only when
// billing.enabled) that reads every user's tier from the billing source and
// tells the holds where the user is crew, pushing only what changed.
//
// # The round
//
//  1. Read the tier of every subscriber from the Source (Stripe in
//     production). A failure ends the round; the next interval retries.
//  2. Read the crew memberships (hold_crew: hold DID, member DID, newest
//     addedAt) and what each hold was last told (billing_tier_pushes).
//  3. A membership needs a push when the desired rank differs from the
//     last one the hold accepted. The desired rank is the subscriber's
//     rank, or billing.default_tier_rank for a user with no active
//     subscription. A member who has never been pushed and has no
//     subscription is left alone: the hold's own default applies.
//  4. For each hold with pushes due: resolve its endpoint from its DID
//     (identity: the "#atcr_hold" service, or a did:web's host) and POST
//     /xrpc/io.atcr.hold.updateCrewTier {userDid, tierRank} → {tierName}
//     for each member (docs/lexicons.md, hold XRPC). After the hold answers,
//     the outcome is written to billing_tier_pushes with fence.Fenced.
//
// Hold answers:
//
//	2xx {tierName}      recorded as pushed (rank and the hold's name for it)
//	UserNotFound        recorded as user_not_found: the hold does not know the
//	                    member (our hold_crew is ahead of or behind the hold).
//	                    Not retried until the desired rank or the member's crew
//	                    record (addedAt) changes.
//	AuthRequired        the hold wants credentials this worker does not send:
//	                    logged, the rest of that hold is skipped, retried next
//	                    interval. Nothing recorded.
//	other XRPC error    (4xx) logged, that member retried next interval.
//	transport error/5xx the hold is down: logged, the rest of that hold is
//	                    skipped, retried next interval.
//
// # Exactly one push per change
//
// The record is what makes a change "done", and it is written under the
// fence, so a restart or a new holder (fence n+1) reads it and does not
// push again. At the start of each round and before every push the worker
// also checks its custody with a fenced no-op transaction: a former holder
// that stalled past its TTL finds itself superseded and stops before it
// pushes, instead of pushing and then failing to record. Rounds on one
// Refresher are serialised, and an answer already received is recorded
// even when the worker is being stopped. A graceful stop (SIGTERM: the
// job's context ends with cause workers.ErrDrain) lets the push in flight
// finish and records its answer under the custody still held, then pushes
// nothing more; a lost custody cuts the push short at once. What is not
// guaranteed: if the process dies (or is superseded, or the hold answers
// slower than the job runner waits for a stopping job) between the hold
// receiving a push and the record, the next holder pushes that change
// again. updateCrewTier sets an absolute rank, so the repeat is harmless.
//
// # Stripe mapping (Stripe type)
//
// The Stripe source lists subscriptions with status active and trialing
// (GET {billing.stripe_api_url}/v1/subscriptions, Bearer
// billing.stripe_secret_key, 100 per page, expand[]=data.customer):
//
//	user DID   subscription metadata "did", else the customer's metadata "did"
//	tier rank  price metadata "tier_rank" (integer >= 0) of the subscription's
//	           items; the highest rank among a user's subscriptions wins
//	tier name  price metadata "tier" (informational: holds name ranks themselves)
//
// A subscription without a DID or a rank is skipped and reported in one
// warning per round, and the rest of the round goes on.
//
// Metrics: appview_billing_tier_pushes_total{outcome} (pushed,
// user_not_found, auth_required, failed), appview_billing_rounds_total{outcome}
// (ok, error, superseded), appview_billing_subscribers (users with a tier
// at the last successful read).
package billing
