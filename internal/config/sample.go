package config

// Sample is the commented default configuration printed by
// `appview config init`. Loading it yields Default() (a test keeps them equal).
const Sample = `# appview configuration. Every key can also be set from the environment:
# APPVIEW_ + the dotted path in upper case with "_" for ".", e.g.
# APPVIEW_DATABASE_URL, APPVIEW_LEASES_TTL. Environment beats this file;
# --set key=value flags beat the environment. Durations: 500ms, 15s, 2m, 24h.

instance_id: ""                 # default: <hostname>-<pid>-<random>; unique per process start
                                # at most 128 bytes, no whitespace, control or invisible characters
shutdown_timeout: 30s           # upper bound on a graceful stop (workers drain, leases released)
log_level: info                 # debug shows lease.renewed and lease.contended

database:
  url: "file:./data/appview.db" # file:rel/path, file:///abs/path; or http://HOST:PORT / libsql://HOST (sqld or Turso)
  auth_token: ""                # for a libSQL server
  busy_timeout: 5s              # file databases: wait this long on a lock before failing (at least 10ms)

admin:
  addr: "127.0.0.1:5001"        # /healthz /readyz /metrics /debug/leases /debug/holds; "" disables; port 0 = any
  advertise_url: ""             # how other instances reach this endpoint for lease nudges; "" = from addr
  token: ""                     # bearer token for /lease/nudge, /debug/*, / (status page); same on every instance; >= 16 chars
  token_file: ""                # or read the token from this file (secrets mount); not both
  protect_metrics: false        # true: /metrics needs the token too (/healthz and /readyz stay open)
  allow_unauthenticated: false  # true: allow a non-loopback addr without a token (otherwise refused at start)
  pprof: false                  # true: net/http/pprof under /debug/pprof/ (behind the token)

leases:
  enabled: true                 # false: every worker runs unconditionally (single instance only)
  ttl: 15s                      # how long a grant lasts without renewal (database clock); 500ms..1h
  renew_interval: 5s            # holder renews this often (>= 50ms, < ttl/2)
  renew_deadline: 10s           # holder stops its worker when no renewal has succeeded for this long (>= 100ms, < ttl)
                                # on sqld/Turso keep it >= 6s: sqld frees a stalled writer's transaction only after ~5s,
                                # so one paused instance holding the write lock would make every instance lose its leases
  retry_interval: 2s            # a contender retries this often, with jitter (>= 50ms, <= ttl)
  yield_grace: 30s              # a holder whose worker reports unhealthy this long yields to a healthy contender; 0 never
  min_hold: 1m                  # a holder keeps a lease at least this long before it may yield it

jetstream:
  # tried in order; the path picks the wire: /xrpc/network.bsky.jetstream.subscribeEvents (v2) or /subscribe (legacy); any other path is refused
  urls: ["wss://jetstream.us-east.bsky.network/xrpc/network.bsky.jetstream.subscribeEvents", "wss://jetstream.us-west.bsky.network/xrpc/network.bsky.jetstream.subscribeEvents", "wss://jetstream2.us-east.bsky.network/subscribe"]
  collections: ["io.atcr.*"]    # at least one (none would mean the whole firehose)
  compress: true                # zstd binary frames (legacy dictionary, or the v2 host's getZstdDictionary)
  rewind: 30s                   # margin of a resume by time (another host, or a v1 host); same-host seq resumes never rewind
  stale_timeout: 30s            # leave a host that sent no event for this long (pings do not count) for the next
  failback_interval: 5m         # while on a later URL, probe the earlier ones this often and switch back to one that answers; 0: never
  unhealthy_after: 1m30s        # report the consumer unhealthy after this long without any event from any host
  resync_interval: 1s           # at most one repository re-read (#sync, #account/#identity, gap) per interval
  max_message_bytes: 2097152    # websocket read limit per frame, 1024 (1 KiB)..67108864 (64 MiB)
  commit_budget: 250ms          # one transaction applies events at most this long (checked every 25), then commits them and goes on in the next: bounds a renewal's wait for the write lock

backfill:
  enabled: true
  interval: 0s                  # 0: once, when first granted (lease then held); >0: periodic (>= 1s)
  rerun_after: 24h              # interval 0: a new holder skips a run that completed more recently
  relay_endpoints: ["https://relay1.us-east.bsky.network"]
  concurrency: 4                # repositories fetched at once

identity:
  plc_url: "https://plc.directory"  # DID resolution for did:plc
  handle_well_known_url: ""     # local test chains only: verify handles at this URL's /.well-known/atproto-did

labeler:
  # https://HOST (or wss://HOST): /xrpc/com.atproto.label.subscribeLabels is appended; a URL with a path
  # must end in that path (wss://HOST/prefix/xrpc/com.atproto.label.subscribeLabels); any other path is refused
  url: ""                       # empty disables the labeler subscriber
  stale_timeout: 60s            # reconnect when no frame or pong arrives for this long

cleanup:
  interval: 1h
  retention: 720h               # keep finished webhook deliveries and backfill runs this long
  chunk_rows: 500               # rows deleted per transaction (bounds write-lock time)

billing:
  enabled: false
  interval: 1h
  stripe_secret_key: ""         # required when enabled
  stripe_api_url: "https://api.stripe.com"
  timeout: 10s                  # per request to Stripe or to a hold
  default_tier_rank: 0          # pushed when a user's subscription ends (after an earlier push)

health:
  check_interval: 15s
  timeout: 5s                   # per GET /xrpc/_health (< check_interval)
  concurrency: 8                # holds checked at once

webhooks:
  allow_private: false          # refuse webhook URLs that resolve to loopback/private addresses
  retry_schedule: [0s, 30s, 2m, 8m]
  timeout: 10s                  # per delivery attempt
  concurrency: 4                # deliveries in flight at once
  public_url: "https://atcr.io" # payloads link to <public_url>/r/<namespace>/<repository>

network:
  allow_private: false          # let requests to hosts named by network data (holds, did:web, PDSes) reach loopback/private/link-local addresses
`
