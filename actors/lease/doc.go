// Package lease runs a worker on exactly one instance at a time through a
// named lease in the shared database (docs/spec.md §4), with fencing.
//
// # Guarantee
//
// For each lease name, at any instant at most one instance trusts a grant,
// and only the instance that trusts a grant runs the lease's worker. Every
// change of custody increments the fence token; a write made through
// fence.Fenced commits only while its custody is the current, unexpired
// grant on the database's clock, so a holder that stalled (GC pause,
// SIGSTOP, a partition) and missed its own loss cannot land anything once
// another instance has taken over. Exclusivity is the goal; fencing makes
// the residual cases (a worker still mid-write when it learns of the loss)
// harmless.
//
// # What the database is authoritative for
//
// Who holds a lease and until when (store.go). Acquire is one INSERT ...
// ON CONFLICT(name) DO UPDATE ... WHERE leases.expires_at <= now: of two
// contenders for one expired grant the loser's update matches no row. The
// fence is one above the highest the name ever had (lease_fence_floor).
// Renew and release match name, holder and fence (zero rows: superseded);
// a renewal never revives a released grant; a release expires the row in
// place and keeps holder and fence. Nothing deletes a lease row.
//
// # Clocks
//
// Expiry is decided by the database's clock only: every statement
// computes "now" itself (database.NowMS), so instances whose wall clocks
// disagree still agree on who holds what. Local time only bounds how long
// a holder trusts its grant: on its monotonic clock, from the START of
// its last successful acquire or renew attempt, until start +
// renew_deadline, before the grant can expire on the database (start +
// ttl) as long as the clocks advance at about the same rate: the one
// clock assumption, about rates, not offsets.
//
// # States
//
// Custody decisions live in Machine (machine.go), a pure state machine
// (time and inputs in, commands out) driven by the LeaseActor (actor.go),
// a thin shell that carries the commands out: store calls in goroutines
// that answer with messages, one timer, the worker spawned as its child.
//
//	            Start               grant (fence+1)
//	idle ─────────────► contending ──────────────────► holding
//	                     │   ▲   ▲                      │  │  │
//	               stop  │   │   │ worker stopped       │  │  │ stop requested,
//	                     ▼   │   │                      │  │  ▼ or yield
//	                   done  │   └──────── lost ◄───────┘  │ stopping ── worker stopped ──► releasing
//	                     ▲   │   superseded | blackout |   │ (drains; renewals go on)         │
//	                     │   │   error: stop the worker    │                                  │
//	                     │   │   at once, never release    └─ >5 failures/min: worker.failed ─┤
//	                     │   │                                 (stopping, then releasing)     │
//	                     │   └──── released (failed, yielded), after one TTL of cooldown ◄────┤
//	                     └──────── released (shutdown) ◄──────────────────────────────────────┘
//
// Contending: a contended attempt sleeps until min(jittered
// retry_interval, the grant's time left + 1 ms), so a crashed holder is
// replaced about one TTL after its last renewal; a Nudge retries at once
// (at most one attempt per NudgeSpacing). An attempt that finds a live
// grant of this very process (its nonce) that no worker uses hands it
// back at once (reason stale-grant) and tries again: an acquire given up
// on that committed later, custody given up after a blackout, the grant
// of a LeaseActor before it was restarted, or an answer lost after the
// nonce landed (lost before it, the grant is nobody's and idles for its
// TTL). An acquire answering after the renew deadline is handed back too.
//
// Holding: a successful renewal extends trust to attempt start +
// renew_deadline; a failed one is retried every renew_interval/4 until the
// deadline; one that finds the row superseded ends custody at once.
//
// Supervision: the LeaseActor is its worker's supervisor (it implements
// actor.SupervisorStrategy). A panic restarts the worker in place with
// exponential backoff (worker.restarted) while custody lasts; more than
// MaxFailures within a minute gives the lease up (worker.failed, released,
// one TTL of cooldown) so another instance can try. A renewal blackout,
// or a fenced write that finds the custody superseded, stops the worker:
// never a restart. Every stop of the worker is bounded (WorkerStopTimeout):
// a worker still running then is reported (worker.stuck) and left behind;
// its writes are fenced under a custody that has ended or is being
// released.
//
// Shutdown (a *StopRequested, which the system's root sends to every
// LeaseActor) sends the worker workers.Drain and then poisons it, keeps
// renewing while it drains (its last writes are fenced and must still
// land), releases, and only then stops the actor: the system's shutdown
// waits for the release to commit or definitively fail. A release runs on
// its own bounded context. A stop while contending finishes at once,
// unless an acquire is in flight (its grant is released) or the last one
// failed (one more attempt finds out whether it committed). A grant given
// up unreleased after a blackout is released as the machine finishes. An
// actor stopped outright (not through StopRequested) releases, bounded,
// what it holds and any grant an acquire obtained that it never took in;
// acquires still running then release their own grants.
//
// Renewals are batched: the LeaseActors of a process renew through one
// Renewer (renew.go), so a renew tick of N leases is one statement.
// Renewals are never starved by the holder's own writes: every lease write
// is urgent (database.DB.Urgent), and the holder's fenced worker
// transactions that have not begun wait for it (fence.Fenced).
//
// Health-aware custody: a worker may report its own health
// (workers.Spec.Health). A holder whose worker has reported unhealthy for
// Options.YieldGrace, once it has held the lease for Options.MinHold,
// yields (lease.yielded, drain, release with reason yielded, one TTL of
// cooldown) when some contender recorded itself healthy in
// lease_contenders within two TTLs; never when none did.
//
// Handover: libSQL has no LISTEN/NOTIFY. A contender records the URL of
// its nudge endpoint in lease_contenders (contenders.go); the release
// statement returns the recent contenders' URLs and the holder POSTs to
// each, which makes an acquire attempt at once. Correctness never depends on the nudge: it can
// only cause an acquire attempt, and a lost one costs a retry interval.
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
//     own nonce is a process's own. They contend as strangers, and each
//     warns that its instance_id is live elsewhere.
//
// # Files
//
// machine.go (the state machine), actor.go (the LeaseActor: Options,
// NewProps; it takes *StopRequested, *Nudge and *StatusRequest), store.go
// (acquire, renew, release), renew.go (batched renewal), contenders.go
// (nudges, contenders' health), events.go, metrics.go. The fencing
// primitives, and the lease rows as reports read them, are package
// internal/fence; the timing rules are config.Timing.
package lease
