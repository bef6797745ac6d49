// Package webhooks delivers webhook notifications (docs/spec.md §9) for events the
// Jetstream consumer indexes: a transactional outbox written under the
// consumer's fence, a dispatcher actor that drains it under the same
// custody, request signing, and a guard against server-side request
// forgery.
//
// # Guarantee
//
// Each (webhook, event) pair is delivered at least once while the schedule
// lasts, and a replayed or rewound Jetstream event never creates a second
// delivery. Receivers de-duplicate the rare resend (a request whose outcome
// was lost with the custody that sent it) by X-Appview-Delivery, which is
// the event key and is the same on every attempt.
//
// # Outbox
//
// The consumer calls EnqueueTx inside the fenced transaction that stores the
// manifest, so a delivery exists exactly when its trigger was committed.
// UNIQUE(webhook_id, event_key) makes the insert idempotent. Nothing is sent
// from the consumer's transaction: the dispatcher picks rows up afterwards
// (a Kick says "look now").
//
// # Fencing carried to the edge
//
// The dispatcher is spawned as a child of the consumer with the consumer's
// fence.Custody. Before every attempt it claims the row with a fenced write
// (attempts+1, next_attempt_at pushed past the attempt timeout, fence
// recorded); a former holder's claim fails with fence.ErrSuperseded, it
// sends nothing and the actor fails with that error. Every request carries
// X-Appview-Fence: <lease>:<fence>, so a receiver can tell which custody
// sent it. The outcome is recorded with another fenced write.
//
// A delivery's life, with N = len(webhooks.retry_schedule) ("claimed" is
// not a stored status: it is a pending row whose next_attempt_at the claim
// pushed past the attempt timeout):
//
//	EnqueueTx (consumer's fenced tx; UNIQUE makes a replay a no-op)
//	   │
//	   ▼
//	pending ◄────────────────────────────────────────────────┐
//	   │ due: claim (fenced): attempts+1, fence,             │ non-2xx or no answer
//	   │ next_attempt_at = now + timeout + grace             │ and attempts < N:
//	   ▼                                                     │ next_attempt_at =
//	claimed ── POST ─┬─ 2xx ─────────────────────► delivered │ now + schedule[attempts]
//	   │             ├─ non-2xx / no answer ─────────────────┘
//	   │             ├─ non-2xx / no answer, attempts = N ─► failed
//	   │             └─ address refused (SSRF guard) ──────► failed
//	   │
//	   └─ custody ends mid-request: nothing is recorded; when the claim
//	      expires the row is due again and the next holder resends it
//	      (failed instead if that lost attempt was the N-th)
//
// Times are Unix milliseconds on the database's clock (database.NowMS), the
// same clock the leases use, so a new holder on another host sees the same
// due times. Local time only bounds one attempt (webhooks.timeout).
//
// # Not guaranteed
//
// Exactly-once: a request cut off by a change of custody may have reached
// the receiver; the next holder sends it again (same delivery id, same
// body) once the claim expires. Order: deliveries are sent concurrently
// (webhooks.concurrency) and retried independently.
//
// # Server-side request forgery
//
// Guard refuses loopback, private, link-local, unspecified, multicast and
// other non-public addresses (IPv4 and IPv6, including IPv4-mapped,
// NAT64, 6to4 and Teredo forms) unless webhooks.allow_private is set. It is
// enforced when a webhook is added (for a clear error) and again at dial
// time through net.Dialer.Control, which sees the address actually being
// connected to, so DNS rebinding cannot slip past it; redirects are followed
// only to the same scheme and host with the method kept, and each hop is
// dialled through the same check. Proxies from the environment are ignored,
// since a proxy would hide the real destination from the check.
package webhooks
