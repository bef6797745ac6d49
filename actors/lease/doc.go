// Package lease runs a worker on exactly one instance at a time through a
// named lease in the shared database (docs/spec.md §4), with fencing.
//
// # Guarantee
//
// For each lease name, at any instant at most one instance trusts a grant,
// and only the instance that trusts a grant runs the lease's worker. Every
// change of custody increments the fence token; a write made through
// fence.Fenced commits only while its custody is the current, unexpired grant on
// the database's clock, so a holder that stalled (GC pause, SIGSTOP, a
// partition) and missed its own loss cannot land anything once another
// instance has taken over. Exclusivity is the goal; fencing is what makes
// the residual cases (a worker still mid-write when it learns of the loss)
// harmless.
//
// # What the database is authoritative for
//
// Who holds a lease and until when. Acquire is a single INSERT ... ON
// CONFLICT(name) DO UPDATE ... WHERE leases.expires_at <= now, so two
// contenders racing for one expired grant cannot both win: the loser's
// update matches no row. Renew and release match name, holder and fence
// (renew also a grant not released: a renewal that reaches the database
// after the release must not revive it); zero rows means superseded. Release expires the row in place
// (renewed_at = expires_at = now) and keeps holder and fence, so the fence
// survives and a stalled former holder can never match again. Nothing
// deletes a lease row.
//
// # Clocks
//
// Expiry is decided by one clock only: the database's. Every statement
// computes "now" itself (database.NowMS, Unix ms); no Go time is ever bound
// into a lease statement, so instances whose wall clocks disagree by
// seconds still agree on who holds what.
//
// Local time is used for one thing: to bound how long a holder trusts its
// grant without hearing from the database. The holder measures, on its
// monotonic clock, from the START of its last successful acquire or renew
// attempt; a slow success cannot stretch the window. It stops trusting at
// start + renew_deadline, which is before the grant can expire on the
// database (start + ttl) as long as the two clocks advance at roughly the
// same rate — the one clock assumption, about rates, not offsets.
//
// # States
//
// Custody decisions live in machine.Machine (actors/lease/internal/machine),
// a pure state machine (time and inputs in, commands out) driven by the
// LeaseActor, a thin shell that carries out the commands: store calls in goroutines that answer with messages,
// one timer, the worker spawned as the actor's child.
//
//	            Start               grant (fence+1)
//	idle ─────────────► contending ──────────────────► holding
//	                     │   ▲   ▲                      │  │  │
//	               stop  │   │   │ worker stopped       │  │  │ stop requested
//	                     ▼   │   │                      │  │  ▼
//	                   done  │   └──────── lost ◄───────┘  │ stopping ── worker stopped ──► releasing
//	                     ▲   │   superseded | blackout |   │ (drains; renewals go on)         │
//	                     │   │   error: stop the worker    │                                  │
//	                     │   │   at once, never release    └─ >5 failures/min: worker.failed ─┤
//	                     │   │                                 (stopping, then releasing)     │
//	                     │   └──── released (worker-failed), after one TTL of cooldown ◄──────┤
//	                     └──────── released (shutdown) ◄──────────────────────────────────────┘
//
// In contending, a contended attempt sleeps until min(jittered
// retry_interval, the grant's time left + 1 ms); a nudge retries at once.
// In holding, a successful renewal extends trust to attempt start +
// renew_deadline; a worker panic restarts the worker in place with
// exponential backoff (worker.restarted).
//
// Supervision: the LeaseActor is its worker's supervisor (it implements
// actor.SupervisorStrategy). A panic is a failure whose directive is
// Restart, in place and with exponential backoff, while custody lasts;
// more than maxFailures within failureWindow gives the lease up
// (worker.failed, released, one TTL of cooldown) so another instance can
// try. A renewal blackout, or a fenced write that finds the custody
// superseded, is a failure whose directive is Stop, never Restart.
//
// Shutdown (a *StopRequested message, which the system's root sends to
// every LeaseActor) sends the worker Drain and then poisons it, keeps renewing while it
// drains (its last writes are fenced and must still land), releases, and
// only then stops the actor: the system's shutdown waits for the release
// to commit or definitively fail. A release runs on its own bounded
// context, so a cancelled caller cannot skip it. A stop while contending
// finishes at once, writing nothing; a stop with an acquire in flight
// waits for its answer and hands a grant straight back. A store call the
// machine had already given up on (the driver ignores contexts, so it may
// still land) is waited for too, up to callBound, when the actor stops: a
// grant it obtains after that is released by the call itself (see
// lateOutcomes), so no grant is left for the next holder to wait out.
//
// Every stop of the worker is bounded (machine.WorkerStopTimeout, 10 s):
// a worker still running then is reported (worker.stuck) and left behind
// (its writes are fenced under a custody that has ended or is being
// released); the machine contends again, or releases, as if it had
// stopped.
//
// Health-aware custody: a worker may report its own health
// (workers.Spec.Health). A holder whose worker has reported unhealthy for
// Options.YieldGrace, once it has held the lease for Options.MinHold,
// yields (lease.yielded, drain, release with reason yielded, one TTL out)
// when some contender recorded itself healthy in lease_contenders within
// two TTLs; never when none did.
//
// Handover: libSQL has no LISTEN/NOTIFY. A contender records the URL of
// its nudge endpoint (lease_contenders); a holder that has just released
// POSTs to each recent contender, which makes an acquire attempt at once.
// Correctness never depends on the nudge: a nudge can only cause an
// acquire attempt (at most one per machine.NudgeSpacing, however many arrive), and
// a lost one costs a retry interval. A grant that turns up after custody
// was given up (an acquire or renewal answered too late) is handed back
// at once rather than left to run out its TTL.
// A crashed holder is replaced within about TTL, because a contender
// sleeps until the grant's time left (read from the database) rather
// than a full retry interval.
//
// # Not guaranteed
//
//   - That the worker has stopped acting the instant another instance
//     acquires: a worker mid-write when its custody ends may still be
//     running; its writes fail the fence check. Side effects outside the
//     database (an HTTP request already sent) carry the fence
//     (X-Appview-Fence) so the receiver can reject a superseded holder.
//   - Progress while the database is unreachable: every instance stops
//     its leased workers within renew_deadline and nobody runs them until
//     the database answers again.
//   - Bounded clock-rate drift is assumed (see Clocks); wall-clock offsets
//     do not matter.
//   - Two processes configured with the same instance_id are told apart
//     by a nonce drawn at each process start and stored with every grant
//     (lease_holders): releases match it, and only a grant carrying its
//     own nonce is a process's own. They contend as
//     strangers, and each warns that its instance_id is live elsewhere.
//
// # Package map
//
// This package is what the rest of the program uses: Options and NewProps
// build a LeaseActor; StopRequested, Nudge and StatusRequest are the
// messages it takes; Drain is the message a worker gets before a graceful
// stop. The SQL side (the leases table, Timing and its Validate, the
// contenders table) is internal/leasestore; the state machine is
// actors/lease/internal/machine.
package lease
