package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// writeFile writes a YAML file into a fresh temp dir and returns its path.
func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "appview.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// load runs Load with an optional YAML body, environment and --set flags.
func load(t *testing.T, yaml string, env, sets []string) (Config, error) {
	t.Helper()
	src := Sources{Environ: env, Sets: sets}
	if yaml != "" {
		src.File = writeFile(t, yaml)
	}
	return Load(src)
}

func mustLoad(t *testing.T, yaml string, env, sets []string) Config {
	t.Helper()
	cfg, err := load(t, yaml, env, sets)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return cfg
}

// badConfigs is every kind of invalid configuration the issue lists, each
// with the key the refusal must name and a phrase of its reason. The
// subprocess test in cmd/appview runs the same kinds through the binary.
var badConfigs = []struct {
	name   string
	yaml   string
	env    []string
	sets   []string
	key    string
	reason string
}{
	{name: "unknown top-level key", yaml: "instance_idd: x\n", key: "instance_idd", reason: "unknown key (did you mean instance_id?) (line 1)"},
	{name: "unknown nested key", yaml: "leases:\n  ttl: 15s\n  tll: 15s\n", key: "leases.tll", reason: "unknown key (did you mean leases.ttl?) (line 3)"},
	{name: "misspelt section in the file", yaml: "lease:\n  ttl: 15s\n", key: "lease", reason: "unknown key (did you mean leases?) (line 1)"},
	{name: "misspelt list key in the file", yaml: "jetstream:\n  url: [wss://a.example/subscribe]\n", key: "jetstream.url", reason: "unknown key (did you mean jetstream.urls?) (line 2)"},
	{name: "a key nothing resembles in the file", yaml: "jetstream:\n  firehose_everything: true\n", key: "jetstream.firehose_everything", reason: "unknown key (line 2)"},
	{name: "scalar where a section belongs", yaml: "leases: 15s\n", key: "leases", reason: "expected a mapping"},
	{name: "mapping where a scalar belongs", yaml: "jetstream:\n  compress:\n    on: true\n", key: "jetstream.compress", reason: "expected true or false (line 3)"},
	{name: "fraction for a byte count in the file", yaml: "jetstream:\n  max_message_bytes: 1048576.9\n", key: "jetstream.max_message_bytes", reason: `expected a whole number, got "1048576.9" (line 2)`},
	{name: "fraction for a byte count in --set", sets: []string{"jetstream.max_message_bytes=1.5"}, key: "jetstream.max_message_bytes", reason: `expected a whole number, got "1.5"`},
	{name: "fraction for a count in the environment", env: []string{"APPVIEW_BACKFILL_CONCURRENCY=2.5"}, key: "backfill.concurrency", reason: `expected a whole number, got "2.5"`},
	{name: "duplicate top-level key", yaml: "shutdown_timeout: 5s\nshutdown_timeout: 6s\n", key: "shutdown_timeout", reason: "duplicate key (line 2)"},
	{name: "duplicate nested key", yaml: "leases:\n  ttl: 15s\n  ttl: 20s\n", key: "leases.ttl", reason: "duplicate key (line 3)"},
	{name: "unparsable duration", yaml: "leases:\n  ttl: 15 seconds\n", key: "leases.ttl", reason: `unparsable duration "15 seconds"`},
	{name: "duration without unit", yaml: "leases:\n  ttl: 15\n", key: "leases.ttl", reason: "unparsable duration"},
	{name: "duration too long", yaml: "shutdown_timeout: 3000000h\n", key: "shutdown_timeout", reason: `duration "3000000h" out of range (at most 2562047h0m0s)`},
	{name: "duration too long in parts", yaml: "leases:\n  ttl: 2562047h60m\n", key: "leases.ttl", reason: "out of range"},
	{name: "two points in a duration", yaml: "leases:\n  ttl: 1.5.3h\n", key: "leases.ttl", reason: `unparsable duration "1.5.3h"`},
	{name: "scalar where a list belongs", yaml: "jetstream:\n  urls: wss://a.example/subscribe\n", key: "jetstream.urls", reason: `expected a list such as [a, b], got "wss://a.example/subscribe" (line 2)`},
	{name: "hexadecimal whole number", env: []string{"APPVIEW_HEALTH_CONCURRENCY=0x10"}, key: "health.concurrency", reason: `expected a whole number in decimal digits, got "0x10"`},
	{name: "whole number with an underscore", yaml: "health:\n  concurrency: 1_000\n", key: "health.concurrency", reason: `expected a whole number in decimal digits, got "1_000" (line 2)`},
	{name: "whole number too large", yaml: "health:\n  concurrency: 99999999999999999999\n", key: "health.concurrency", reason: `99999999999999999999 out of range for this key (line 2)`},
	{name: "quoted boolean", yaml: "leases:\n  enabled: \"true\"\n", key: "leases.enabled", reason: `expected true or false, got the quoted string "true" (line 2): write it without quotes`},
	{name: "quoted whole number", yaml: "backfill:\n  concurrency: '4'\n", key: "backfill.concurrency", reason: `expected a whole number, got the quoted string "4" (line 2): write it without quotes`},
	{name: "blank boolean", yaml: "leases:\n  enabled:\n", key: "leases.enabled", reason: "expected true or false, got no value (line 2)"},
	{name: "null boolean", yaml: "backfill:\n  enabled: null\n", key: "backfill.enabled", reason: "expected true or false, got no value (line 2)"},
	{name: "YAML 1.1 boolean", yaml: "leases:\n  enabled: no\n", key: "leases.enabled", reason: `expected true or false, got "no" (line 2)`},
	{name: "YAML 1.1 boolean in the environment", env: []string{"APPVIEW_LEASES_ENABLED=off"}, key: "leases.enabled", reason: `expected true or false, got "off"`},
	{name: "null boolean in --set", sets: []string{"leases.enabled=null"}, key: "leases.enabled", reason: "expected true or false, got no value"},
	{name: "string-tagged boolean", yaml: "leases:\n  enabled: !!str false\n", key: "leases.enabled", reason: `expected true or false, got the string "false" (line 2): write it plainly, with no tag or block style`},
	{name: "folded boolean", yaml: "leases:\n  enabled: >-\n    false\n", key: "leases.enabled", reason: `expected true or false, got the string "false" (line 2)`},
	{name: "empty boolean in the environment", env: []string{"APPVIEW_LEASES_ENABLED="}, key: "leases.enabled", reason: "got no value (from APPVIEW_LEASES_ENABLED)"},
	{name: "list for a boolean", yaml: "leases:\n  enabled: [true]\n", key: "leases.enabled", reason: "expected true or false (line 2)"},
	{name: "quoted text that is no boolean", yaml: "leases:\n  enabled: \"yes please\"\n", key: "leases.enabled", reason: `expected true or false, got "yes please" (line 2)`},
	{name: "unparsable duration in a list", yaml: "webhooks:\n  retry_schedule: [0s, soon]\n", key: "webhooks.retry_schedule", reason: `unparsable duration "soon"`},
	{name: "wrong type for an integer", yaml: "backfill:\n  concurrency: many\n", key: "backfill.concurrency", reason: `expected a whole number, got "many" (line 2)`},
	{name: "invalid YAML", yaml: "leases: [\n", key: "--config", reason: "invalid YAML"},
	{name: "two YAML documents", yaml: "leases:\n  ttl: 20s\n---\nleases:\n  ttl: 1s\n", key: "--config", reason: "more than one YAML document (a second one starts at line 3); keep one"},
	{name: "a trailing document separator", yaml: "log_level: warn\n---\n", key: "--config", reason: "more than one YAML document"},
	{name: "an invalid second document", yaml: "log_level: warn\n---\nleases: [\n", key: "--config", reason: "more than one YAML document, and the second is invalid"},
	{name: "renew_interval equal to half the ttl", sets: []string{"leases.ttl=10s", "leases.renew_interval=5s", "leases.renew_deadline=8s"},
		key: "leases.renew_interval", reason: "must be less than half of leases.ttl"},
	{name: "renew_interval above half the ttl", yaml: "leases:\n  renew_interval: 8s\n", key: "leases.renew_interval", reason: "must be less than half of leases.ttl (8s >= 15s/2)"},
	{name: "ttl below the floor", sets: []string{"leases.ttl=3ms"}, key: "leases.ttl", reason: "must be at least 500ms, got 3ms"},
	{name: "ttl just below the floor", env: []string{"APPVIEW_LEASES_TTL=499ms"}, key: "leases.ttl", reason: "must be at least 500ms, got 499ms"},
	{name: "ttl above the ceiling", sets: []string{"leases.ttl=100000h"}, key: "leases.ttl", reason: "must be at most 1h, got 100000h"},
	{name: "ttl just above the ceiling", yaml: "leases:\n  ttl: 61m\n", key: "leases.ttl", reason: "must be at most 1h, got 1h1m"},
	// A value refused after loading says where it came from.
	{name: "a refused value names its file line", yaml: "leases:\n  ttl: 15s\n  renew_interval: 8s\n", key: "leases.renew_interval", reason: "(8s >= 15s/2) (line 3)"},
	{name: "a refused value names its environment variable", env: []string{"APPVIEW_LEASES_RENEW_INTERVAL=8s"}, key: "leases.renew_interval", reason: "(8s >= 15s/2) (from APPVIEW_LEASES_RENEW_INTERVAL)"},
	{name: "a refused value names --set", yaml: "leases:\n  renew_interval: 1s\n", sets: []string{"leases.renew_interval=8s"}, key: "leases.renew_interval", reason: "(8s >= 15s/2) (from --set)"},
	{name: "a bound broken by the other key's override names it", yaml: "leases:\n  ttl: 30s\n  renew_deadline: 20s\n", env: []string{"APPVIEW_LEASES_TTL=15s"}, key: "leases.renew_deadline", reason: "(20s >= 15s) (line 3; leases.ttl from APPVIEW_LEASES_TTL)"},
	{name: "a default broken by another key's override names it", env: []string{"APPVIEW_LEASES_TTL=8s"}, key: "leases.renew_interval", reason: "(5s >= 8s/2) (leases.ttl from APPVIEW_LEASES_TTL)"},
	{name: "renew_interval below the floor", sets: []string{"leases.ttl=1s", "leases.renew_interval=10ms", "leases.renew_deadline=500ms", "leases.retry_interval=200ms"},
		key: "leases.renew_interval", reason: "must be at least 50ms, got 10ms"},
	{name: "renew_deadline below the floor", sets: []string{"leases.ttl=500ms", "leases.renew_interval=50ms", "leases.renew_deadline=99ms", "leases.retry_interval=100ms"},
		key: "leases.renew_deadline", reason: "must be at least 100ms, got 99ms"},
	{name: "retry_interval below the floor", sets: []string{"leases.retry_interval=49ms"}, key: "leases.retry_interval", reason: "must be at least 50ms, got 49ms"},
	{name: "zero retry_interval", sets: []string{"leases.retry_interval=0"}, key: "leases.retry_interval", reason: "must be positive"},
	{name: "retry_interval above the ttl", sets: []string{"leases.retry_interval=16s"}, key: "leases.retry_interval", reason: "must not exceed leases.ttl (16s > 15s)"},
	{name: "renew_deadline equal to ttl", sets: []string{"leases.renew_deadline=15s"}, key: "leases.renew_deadline", reason: "must be less than leases.ttl"},
	{name: "renew_deadline above ttl", sets: []string{"leases.renew_deadline=1m"}, key: "leases.renew_deadline", reason: "must be less than leases.ttl"},
	{name: "renew_deadline equal to renew_interval", sets: []string{"leases.renew_deadline=5s"}, key: "leases.renew_deadline", reason: "must be greater than leases.renew_interval"},
	{name: "renew_deadline below renew_interval", sets: []string{"leases.renew_interval=6s", "leases.renew_deadline=4s"}, key: "leases.renew_deadline", reason: "must be greater than leases.renew_interval"},
	{name: "database url with an unknown scheme", sets: []string{"database.url=ftp://db.example"}, key: "database.url", reason: "scheme must be one of file, http, https, libsql"},
	{name: "database url with no scheme", sets: []string{"database.url=./data/appview.db"}, key: "database.url", reason: "scheme must be one of"},
	{name: "database url without a host", sets: []string{"database.url=http://"}, key: "database.url", reason: "has no host"},
	{name: "empty database url", sets: []string{"database.url="}, key: "database.url", reason: "must not be empty"},
	{name: "file url naming another host", sets: []string{"database.url=file://db.example/srv/appview.db"}, key: "database.url",
		reason: `host "db.example": a file database must be on this machine`},
	{name: "file url with a relative path after //", sets: []string{"database.url=file://data/appview.db"}, key: "database.url", reason: `host "data"`},
	{name: "in-memory database", sets: []string{"database.url=:memory:"}, key: "database.url", reason: "in-memory database is private to each go-libsql connection"},
	{name: "in-memory database as a file url", env: []string{"APPVIEW_DATABASE_URL=file::memory:"}, key: "database.url", reason: "in-memory database"},
	{name: "in-memory mode on a file url", sets: []string{"database.url=file:x.db?mode=memory"}, key: "database.url", reason: "in-memory database"},
	{name: "file url with a query", sets: []string{"database.url=file:x.db?_busy_timeout=500"}, key: "database.url", reason: "query parameters are not supported"},
	{name: "file url without a path", sets: []string{"database.url=file:"}, key: "database.url", reason: "needs a path"},
	{name: "jetstream url over http", yaml: "jetstream:\n  urls: [\"http://jetstream.example/subscribe\"]\n", key: "jetstream.urls", reason: "scheme must be one of ws, wss"},
	{name: "no jetstream url", yaml: "jetstream:\n  urls: []\n", key: "jetstream.urls", reason: "at least one"},
	{name: "jetstream url with a typo of the v2 path", yaml: "jetstream:\n  urls: [\"wss://j.example/xrpc/network.bsky.jetstream.subscribeEvent\"]\n", key: "jetstream.urls", reason: "is neither /xrpc/network.bsky.jetstream.subscribeEvents (Jetstream v2) nor /subscribe (legacy)"},
	{name: "jetstream url with no path", yaml: "jetstream:\n  urls: [\"wss://j.example\"]\n", key: "jetstream.urls", reason: "is neither"},
	{name: "jetstream url with another path", yaml: "jetstream:\n  urls: [\"wss://j.example/x\"]\n", key: "jetstream.urls", reason: "is neither"},
	{name: "jetstream url filtering by did", yaml: "jetstream:\n  urls: [\"wss://j.example/subscribe?wantedDids=did:plc:a\"]\n", key: "jetstream.urls", reason: "remove wantedDids=: commits of other repositories would never arrive"},
	{name: "jetstream v2 url filtering by kind", yaml: "jetstream:\n  urls: [\"wss://j.example/xrpc/network.bsky.jetstream.subscribeEvents?kinds=commit\"]\n", key: "jetstream.urls", reason: "remove kinds=: identity, account or #sync events"},
	{name: "jetstream url with a size limit", yaml: "jetstream:\n  urls: [\"wss://j.example/subscribe?maxMessageSizeBytes=4096\"]\n", key: "jetstream.urls", reason: "remove maxMessageSizeBytes=: the host would drop larger events silently"},
	{name: "jetstream url with its own collections", yaml: "jetstream:\n  urls: [\"wss://j.example/subscribe?wantedCollections=app.bsky.feed.post\"]\n", key: "jetstream.urls", reason: "remove wantedCollections=: the consumer sets it on every connection, from jetstream.collections"},
	{name: "jetstream url with a cursor", yaml: "jetstream:\n  urls: [\"wss://j.example/xrpc/network.bsky.jetstream.subscribeEvents?cursor=5\"]\n", key: "jetstream.urls", reason: "remove cursor=: the consumer sets it"},
	{name: "jetstream v2 url requiring a hello", yaml: "jetstream:\n  urls: [\"wss://j.example/xrpc/network.bsky.jetstream.subscribeEvents?requireHello=true\"]\n", key: "jetstream.urls", reason: "remove requireHello=: the v2 wire takes no client messages"},
	{name: "jetstream url with a broken query", yaml: "jetstream:\n  urls: [\"wss://j.example/subscribe?a=%zz\"]\n", key: "jetstream.urls", reason: "query: invalid URL escape"},
	{name: "plc url over websocket", sets: []string{"identity.plc_url=wss://plc.directory"}, key: "identity.plc_url", reason: "scheme must be one of http, https"},
	{name: "handle well-known url over websocket", sets: []string{"identity.handle_well_known_url=ws://pds.test"}, key: "identity.handle_well_known_url", reason: "scheme must be one of http, https"},
	{name: "labeler url over ftp", sets: []string{"labeler.url=ftp://labeler.example"}, key: "labeler.url", reason: "scheme must be one of"},
	{name: "relay endpoint over websocket", sets: []string{"backfill.relay_endpoints=wss://relay.example"}, key: "backfill.relay_endpoints", reason: "scheme must be one of http, https"},
	{name: "advertise url over websocket", sets: []string{"admin.advertise_url=ws://10.0.0.5:5001"}, key: "admin.advertise_url", reason: "scheme must be one of http, https"},
	{name: "stripe url over ftp", sets: []string{"billing.enabled=true", "billing.stripe_secret_key=sk", "billing.stripe_api_url=ftp://stripe"},
		key: "billing.stripe_api_url", reason: "scheme must be one of"},
	// Checked with their workers off too: wrong before the day they are used.
	{name: "stripe url with credentials, billing off", sets: []string{"billing.stripe_api_url=http://u:pw@stripe.example"}, key: "billing.stripe_api_url", reason: "credentials"},
	{name: "stripe url that is no url, billing off", sets: []string{"billing.stripe_api_url=notaurl"}, key: "billing.stripe_api_url", reason: ""},
	{name: "relay over ftp, backfill off", sets: []string{"backfill.enabled=false", "backfill.relay_endpoints=ftp://relay.example"}, key: "backfill.relay_endpoints", reason: "scheme must be one of http, https"},
	{name: "admin addr without a port", sets: []string{"admin.addr=localhost"}, key: "admin.addr", reason: "want host:port"},
	{name: "bad collection pattern", sets: []string{"jetstream.collections=io.atcr"}, key: "jetstream.collections", reason: "not an NSID"},
	{name: "a collection name with a hyphen", sets: []string{"jetstream.collections=io.atcr.foo-bar"}, key: "jetstream.collections", reason: "not an NSID"},
	{name: "more collections than Jetstream takes", sets: []string{"jetstream.collections=[" + manyCollections(101) + "]"}, key: "jetstream.collections", reason: "at most 100"},
	{name: "negative shutdown timeout", sets: []string{"shutdown_timeout=-1s"}, key: "shutdown_timeout", reason: "must be positive"},
	{name: "zero shutdown timeout", sets: []string{"shutdown_timeout=0"}, key: "shutdown_timeout", reason: "must be positive"},
	{name: "negative ttl", sets: []string{"leases.ttl=-15s"}, key: "leases.ttl", reason: "must be positive"},
	{name: "negative busy timeout", sets: []string{"database.busy_timeout=-1s"}, key: "database.busy_timeout", reason: "must not be negative"},
	{name: "jetstream url with credentials", sets: []string{"jetstream.urls=[wss://u:secret@js.example.com/subscribe]"}, key: "jetstream.urls", reason: "carries credentials"},
	{name: "relay with credentials", sets: []string{"backfill.relay_endpoints=https://u:secret@relay.example.com"}, key: "backfill.relay_endpoints", reason: "carries credentials"},
	{name: "advertised admin url with credentials", sets: []string{"admin.advertise_url=http://u:secret@10.0.0.5:5001"}, key: "admin.advertise_url", reason: "carries credentials"},
	{name: "labeler url with credentials", sets: []string{"labeler.url=https://u:secret@mod.example.com"}, key: "labeler.url", reason: "carries credentials"},
	{name: "unparsable database url with a password", sets: []string{"database.url=http://u:secret PW@127.0.0.1/"}, key: "database.url", reason: `unparsable URL "http://u:xxxxx@127.0.0.1/": net/url: invalid userinfo`},
	{name: "unparsable jetstream url with a password", sets: []string{"jetstream.urls=[wss://u:secret PW@js.example.com/subscribe]"}, key: "jetstream.urls", reason: `"wss://u:xxxxx@js.example.com/subscribe"`},
	{name: "unparsable labeler url with a password", sets: []string{"labeler.url=https://u:secret PW@mod.example.com"}, key: "labeler.url", reason: `"https://u:xxxxx@mod.example.com"`},
	{name: "cleanup interval of a nanosecond", sets: []string{"cleanup.interval=1ns"}, key: "cleanup.interval", reason: "must be at least 100ms"},
	{name: "stale timeout of a nanosecond", sets: []string{"jetstream.stale_timeout=1ns"}, key: "jetstream.stale_timeout", reason: "must be at least 100ms"},
	{name: "shutdown timeout of a nanosecond", sets: []string{"shutdown_timeout=1ns"}, key: "shutdown_timeout", reason: "must be at least 100ms"},
	{name: "health check interval of a nanosecond", sets: []string{"health.check_interval=1ns"}, key: "health.check_interval", reason: "must be at least 100ms"},
	{name: "webhook timeout of a nanosecond", sets: []string{"webhooks.timeout=1ns"}, key: "webhooks.timeout", reason: "must be at least 10ms"},
	{name: "zero busy timeout", sets: []string{"database.busy_timeout=0s"}, key: "database.busy_timeout", reason: "must be at least 10ms"},
	{name: "busy timeout under a millisecond", sets: []string{"database.busy_timeout=500us"}, key: "database.busy_timeout", reason: "must be at least 10ms"},
	{name: "negative rewind", sets: []string{"jetstream.rewind=-5s"}, key: "jetstream.rewind", reason: "must not be negative"},
	{name: "negative max message bytes", sets: []string{"jetstream.max_message_bytes=-1"}, key: "jetstream.max_message_bytes", reason: "at least 1024"},
	{name: "negative backfill interval", sets: []string{"backfill.interval=-1h"}, key: "backfill.interval", reason: "must not be negative"},
	{name: "backfill interval below its floor", sets: []string{"backfill.interval=1ns"}, key: "backfill.interval", reason: "must be at least 1s (a shorter interval walks every repository of the relays again with no pause), got 1ns"},
	{name: "negative backfill concurrency", sets: []string{"backfill.concurrency=-1"}, key: "backfill.concurrency", reason: "at least 1"},
	{name: "negative retry delay", sets: []string{"webhooks.retry_schedule=[0s, -30s]"}, key: "webhooks.retry_schedule", reason: "must not be negative"},
	{name: "negative cleanup interval", yaml: "cleanup:\n  interval: -1h\n", key: "cleanup.interval", reason: "must be positive"},
	{name: "zero cleanup chunk", sets: []string{"cleanup.chunk_rows=0"}, key: "cleanup.chunk_rows", reason: "at least 1"},
	{name: "negative health concurrency", sets: []string{"health.concurrency=-1"}, key: "health.concurrency", reason: "at least 1"},
	{name: "zero health check interval", yaml: "health:\n  check_interval: 0s\n", key: "health.check_interval", reason: "must be positive, got 0s"},
	{name: "negative health check interval", sets: []string{"health.check_interval=-1s"}, key: "health.check_interval", reason: "must be positive"},
	{name: "zero health timeout", sets: []string{"health.timeout=0s"}, key: "health.timeout", reason: "must be positive, got 0s"},
	{name: "empty collections in the file", yaml: "jetstream:\n  collections: []\n", key: "jetstream.collections", reason: "whole firehose"},
	{name: "empty collections in --set", sets: []string{"jetstream.collections=[]"}, key: "jetstream.collections", reason: "at least one"},
	{name: "empty collections from the environment", env: []string{"APPVIEW_JETSTREAM_COLLECTIONS="}, key: "jetstream.collections", reason: "at least one"},
	{name: "max message bytes above 64 MiB", sets: []string{"jetstream.max_message_bytes=67108865"}, key: "jetstream.max_message_bytes", reason: "at most 67108864"},
	{name: "health timeout not below the check interval", sets: []string{"health.timeout=15s"}, key: "health.timeout", reason: "must be below health.check_interval"},
	{name: "negative webhook concurrency", sets: []string{"webhooks.concurrency=-4"}, key: "webhooks.concurrency", reason: "at least 1"},
	{name: "webhook public url over ftp", sets: []string{"webhooks.public_url=ftp://atcr.example"}, key: "webhooks.public_url", reason: "scheme must be one of http, https"},
	{name: "zero commit budget", sets: []string{"jetstream.commit_budget=0s"}, key: "jetstream.commit_budget", reason: "must be positive, got 0s"},
	{name: "zero labeler stale timeout", sets: []string{"labeler.stale_timeout=0s"}, key: "labeler.stale_timeout", reason: "must be positive"},
	{name: "negative billing timeout", sets: []string{"billing.timeout=-1s"}, key: "billing.timeout", reason: "must be positive"},
	{name: "negative default tier rank", sets: []string{"billing.default_tier_rank=-1"}, key: "billing.default_tier_rank", reason: "must not be negative"},
	{name: "backfill enabled without relays", yaml: "backfill:\n  relay_endpoints: []\n", key: "backfill.relay_endpoints", reason: "at least one relay"},
	{name: "unknown log level", sets: []string{"log_level=verbose"}, key: "log_level", reason: "want debug, info, warn or error"},
	{name: "billing without a secret", sets: []string{"billing.enabled=true"}, key: "billing.stripe_secret_key", reason: "required"},
	{name: "unparsable duration from the environment", env: []string{"APPVIEW_LEASES_TTL=soon"}, key: "leases.ttl", reason: `unparsable duration "soon" (want e.g. 500ms, 15s, 2m, 24h) (from APPVIEW_LEASES_TTL)`},
	{name: "bad boolean from the environment", env: []string{"APPVIEW_LEASES_ENABLED=maybe"}, key: "leases.enabled", reason: `expected true or false, got "maybe" (from APPVIEW_LEASES_ENABLED)`},
	{name: "unknown key in --set", sets: []string{"leases.tll=15s"}, key: "leases.tll", reason: "unknown key"},
	{name: "a --set key with a space", sets: []string{" leases.ttl=15s"}, key: " leases.ttl", reason: "--set key with spaces around it (write leases.ttl=...)"},
	{name: "section name in --set", sets: []string{"leases=15s"}, key: "leases", reason: "a section, not a value: set one of its keys (leases.enabled, "},
	{name: "misspelt key in --set", sets: []string{"jetstream.url=wss://a.example/subscribe"}, key: "jetstream.url", reason: "unknown key (did you mean jetstream.urls?)"},
	{name: "key in the wrong case in --set", sets: []string{"Leases.TTL=20s"}, key: "Leases.TTL", reason: "unknown key (did you mean leases.ttl?) (from --set)"},
	{name: "--set without a key", sets: []string{"=5"}, key: "=5", reason: "--set wants key=value"},
	{name: "bad whole number in --set", sets: []string{"webhooks.concurrency=four"}, key: "webhooks.concurrency", reason: `expected a whole number, got "four"`},
	{name: "--set without a value", sets: []string{"leases.ttl"}, key: "leases.ttl", reason: "--set wants key=value"},
	{name: "unparsable duration in --set", sets: []string{"leases.ttl=[1s]"}, key: "leases.ttl", reason: "expected a duration such as 15s (from --set)"},
	{name: "unterminated list in --set", sets: []string{"jetstream.urls=[wss://a.example/subscribe"}, key: "jetstream.urls", reason: "unparsable value"},
	// Every list-valued key: an empty element or (but for the retry
	// schedule) a repeated one is refused by position, from every source.
	{name: "empty element in an environment list", env: []string{"APPVIEW_JETSTREAM_URLS=wss://a.example/subscribe,,wss://b.example/subscribe"},
		key: "jetstream.urls", reason: "element 2 is empty (from APPVIEW_JETSTREAM_URLS)"},
	{name: "trailing comma in an environment list", env: []string{"APPVIEW_JETSTREAM_URLS=wss://a.example/subscribe, wss://b.example/subscribe,"},
		key: "jetstream.urls", reason: "element 3 is empty"},
	{name: "leading comma in --set", sets: []string{"jetstream.collections=,io.atcr.*"}, key: "jetstream.collections", reason: "element 1 is empty (from --set)"},
	{name: "blank field in --set", sets: []string{"jetstream.collections=io.atcr.*, ,io.atcr.tag"}, key: "jetstream.collections", reason: "element 2 is empty"},
	{name: "trailing comma in a flow list in --set", sets: []string{"jetstream.urls=[wss://a.example/subscribe, ]"}, key: "jetstream.urls", reason: "element 2 is empty (a trailing comma)"},
	{name: "empty string in a flow list from the environment", env: []string{`APPVIEW_BACKFILL_RELAY_ENDPOINTS=["https://r.example", ""]`},
		key: "backfill.relay_endpoints", reason: "element 2 is empty"},
	{name: "trailing comma for relay endpoints in --set", sets: []string{"backfill.relay_endpoints=https://r.example,"}, key: "backfill.relay_endpoints", reason: "element 2 is empty"},
	{name: "blank YAML item", yaml: "jetstream:\n  urls:\n    - wss://a.example/subscribe\n    -\n    - wss://b.example/subscribe\n",
		key: "jetstream.urls", reason: "element 2 is empty (line 4)"},
	{name: "empty string in a YAML list", yaml: "jetstream:\n  collections: [\"io.atcr.*\", \"\"]\n", key: "jetstream.collections", reason: "element 2 is empty (line 2)"},
	{name: "null in a YAML list of durations", yaml: "webhooks:\n  retry_schedule: [0s, ~, 30s]\n", key: "webhooks.retry_schedule", reason: "element 2 is empty (line 2)"},
	{name: "blank YAML item in a list of durations", yaml: "webhooks:\n  retry_schedule:\n    - 0s\n    -\n", key: "webhooks.retry_schedule", reason: "element 2 is empty (line 4)"},
	{name: "empty delay from the environment", env: []string{"APPVIEW_WEBHOOKS_RETRY_SCHEDULE=0s,,30s"}, key: "webhooks.retry_schedule", reason: "element 2 is empty"},
	{name: "jetstream url listed twice in the file", yaml: "jetstream:\n  urls: [wss://a.example/subscribe, wss://b.example/subscribe, wss://a.example/subscribe]\n",
		key: "jetstream.urls", reason: `"wss://a.example/subscribe" is listed twice (elements 1 and 3)`},
	{name: "jetstream url repeated with a trailing slash and another case", env: []string{"APPVIEW_JETSTREAM_URLS=wss://a.example/subscribe,WSS://A.example/subscribe/"},
		key: "jetstream.urls", reason: `element 2 ("WSS://A.example/subscribe/") is the same endpoint as element 1 ("wss://a.example/subscribe"); list it once`},
	// A scheme's default port is the URL without one (ws/http 80, wss/https 443).
	{name: "jetstream url repeated with its default port", yaml: "jetstream:\n  urls: [\"wss://h.example:443/subscribe\", \"wss://h.example/subscribe\"]\n",
		key: "jetstream.urls", reason: `element 2 ("wss://h.example/subscribe") is the same endpoint as element 1 ("wss://h.example:443/subscribe"); list it once`},
	{name: "ws jetstream url repeated with port 80", sets: []string{"jetstream.urls=ws://h.example/subscribe,ws://H.example:80/subscribe/"},
		key: "jetstream.urls", reason: `element 2 ("ws://H.example:80/subscribe/") is the same endpoint as element 1`},
	{name: "jetstream url repeated with an empty port", sets: []string{"jetstream.urls=wss://h.example:/subscribe,wss://h.example/subscribe"},
		key: "jetstream.urls", reason: `element 2 ("wss://h.example/subscribe") is the same endpoint as element 1`},
	{name: "jetstream url on an IPv6 address repeated with its default port", sets: []string{"jetstream.urls=[\"wss://[2001:db8::1]/subscribe\", \"wss://[2001:DB8::1]:443/subscribe\"]"},
		key: "jetstream.urls", reason: `element 2 ("wss://[2001:DB8::1]:443/subscribe") is the same endpoint as element 1`},
	// RFC 3986 §6.2.2 normalisations (outbound.CanonicalURL): dot segments,
	// an unreserved character percent-encoded, a trailing dot of the host.
	{name: "jetstream url repeated with a dot segment, an encoded letter and a host's trailing dot", sets: []string{"jetstream.urls=wss://h.example/subscribe,wss://h.example./x/../%73ubscribe"},
		key: "jetstream.urls", reason: `element 2 ("wss://h.example./x/../%73ubscribe") is the same endpoint as element 1`},
	{name: "relay endpoint repeated with its default https port", env: []string{"APPVIEW_BACKFILL_RELAY_ENDPOINTS=https://r.example:443,https://r.example/"},
		key: "backfill.relay_endpoints", reason: `element 2 ("https://r.example/") is the same endpoint as element 1 ("https://r.example:443")`},
	{name: "http relay endpoint repeated with port 80", sets: []string{"backfill.relay_endpoints=http://r.example,http://r.example:80"},
		key: "backfill.relay_endpoints", reason: `element 2 ("http://r.example:80") is the same endpoint as element 1`},
	// instance_id is written into lease rows, log lines and the columns of
	// `appview leases`: printable, no whitespace, at most 128 bytes.
	{name: "instance id with a space", sets: []string{"instance_id=web 1"}, key: "instance_id", reason: `"web 1" has a whitespace, control or invisible character (U+0020 at byte 3)`},
	{name: "instance id with a trailing newline from the environment", env: []string{"APPVIEW_INSTANCE_ID=web-1\n"}, key: "instance_id", reason: "U+000A at byte 5"},
	{name: "instance id with a tab in the file", yaml: "instance_id: \"web\\t1\"\n", key: "instance_id", reason: "U+0009"},
	{name: "instance id with a terminal escape", sets: []string{"instance_id=web\x1b[31m1"}, key: "instance_id", reason: `"web\x1b[31m1" has a whitespace, control or invisible character (U+001B at byte 3)`},
	{name: "instance id with DEL", sets: []string{"instance_id=web\x7f"}, key: "instance_id", reason: "U+007F"},
	{name: "instance id with a zero-width space", sets: []string{"instance_id=web\u200b1"}, key: "instance_id", reason: "U+200B"},
	{name: "instance id with a no-break space", sets: []string{"instance_id=web\u00a01"}, key: "instance_id", reason: "U+00A0"},
	{name: "instance id that is not UTF-8", env: []string{"APPVIEW_INSTANCE_ID=web\xff"}, key: "instance_id", reason: "not valid UTF-8"},
	{name: "instance id over 128 bytes", sets: []string{"instance_id=" + strings.Repeat("w", 129)}, key: "instance_id", reason: "129 bytes: must be at most 128"},
	// A URL others connect to needs a host name and a port to connect to.
	{name: "advertise url with port 0", sets: []string{"admin.advertise_url=http://10.0.0.5:0"}, key: "admin.advertise_url", reason: `URL "http://10.0.0.5:0": port 0 is not in 1..65535`},
	{name: "advertise url with a port above 65535", sets: []string{"admin.advertise_url=http://10.0.0.5:65536"}, key: "admin.advertise_url", reason: "port 65536 is not in 1..65535"},
	{name: "advertise url without a host", sets: []string{"admin.advertise_url=http://:5001"}, key: "admin.advertise_url", reason: `URL "http://:5001" has no host`},
	{name: "advertise url with only a path", sets: []string{"admin.advertise_url=http:///lease"}, key: "admin.advertise_url", reason: "has no host"},
	{name: "database url with a port above 65535", sets: []string{"database.url=http://127.0.0.1:99999"}, key: "database.url", reason: "port 99999 is not in 1..65535"},
	{name: "database token with a space", sets: []string{"database.url=http://127.0.0.1:8080", "database.auth_token= eyJhbGciOi"}, key: "database.auth_token", reason: "whitespace"},
	{name: "jetstream url with port 0", sets: []string{"jetstream.urls=wss://j.example:0/subscribe"}, key: "jetstream.urls", reason: "port 0 is not in 1..65535"},
	{name: "relay endpoint without a host", sets: []string{"backfill.relay_endpoints=https://:443"}, key: "backfill.relay_endpoints", reason: "has no host"},
	{name: "collection listed twice in --set", sets: []string{"jetstream.collections=io.atcr.*,io.atcr.tag,io.atcr.*"},
		key: "jetstream.collections", reason: `"io.atcr.*" is listed twice (elements 1 and 3)`},
	{name: "relay endpoint repeated with a trailing slash", yaml: "backfill:\n  relay_endpoints: [\"https://r.example\", \"https://r.example/\"]\n",
		key: "backfill.relay_endpoints", reason: "element 2 (\"https://r.example/\") is the same endpoint as element 1"},
	{name: "relay endpoint listed twice with backfill disabled", sets: []string{"backfill.enabled=false", "backfill.relay_endpoints=https://r.example,https://r.example"},
		key: "backfill.relay_endpoints", reason: "listed twice (elements 1 and 2)"},
}

func TestLoadRefusesInvalidConfigurationNamingTheKeyAndReason(t *testing.T) {
	for _, tc := range badConfigs {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.yaml, tc.env, tc.sets)
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v (%T), want *config.Error", err, err)
			}
			if ce.Key != tc.key || !strings.Contains(ce.Reason, tc.reason) {
				t.Fatalf("err = {Key: %q, Reason: %q}, want key %q and a reason containing %q", ce.Key, ce.Reason, tc.key, tc.reason)
			}
			if strings.ContainsAny(ce.Error(), "\r\n") {
				t.Fatalf("error spans lines: %q", ce.Error())
			}
			if strings.Contains(ce.Error(), ":secret") {
				t.Fatalf("the refusal shows a password: %q", ce.Error())
			}
		})
	}
}

func TestEveryFileURLFormIsAccepted(t *testing.T) {
	for _, u := range []string{"file:./data/appview.db", "file:data/appview.db", "file:/var/lib/appview/appview.db",
		"file:///var/lib/appview/appview.db", "file://localhost/var/lib/appview/appview.db", "file:///srv/my%20data/appview.db"} {
		if _, err := load(t, "", nil, []string{"database.url=" + u}); err != nil {
			t.Errorf("database.url=%s: %v", u, err)
		}
	}
}

func TestLeaseTimingsAtTheirBoundsAreAccepted(t *testing.T) {
	for _, sets := range [][]string{
		{"leases.ttl=500ms", "leases.renew_interval=50ms", "leases.renew_deadline=100ms", "leases.retry_interval=50ms"},
		{"leases.ttl=1h", "leases.renew_interval=20m", "leases.renew_deadline=40m", "leases.retry_interval=1h"},
		{"leases.retry_interval=15s"}, // equal to the default ttl
	} {
		if _, err := load(t, "", nil, sets); err != nil {
			t.Errorf("%v: %v", sets, err)
		}
	}
}

func TestShortDurationsDropTrailingZeroUnits(t *testing.T) {
	for d, want := range map[time.Duration]string{
		time.Hour: "1h", 100000 * time.Hour: "100000h", 61 * time.Minute: "1h1m", 90 * time.Minute: "1h30m",
		2 * time.Minute: "2m", 500 * time.Millisecond: "500ms", 15 * time.Second: "15s", time.Hour + time.Second: "1h0m1s",
	} {
		if got := short(d); got != want {
			t.Errorf("short(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestValuesOutsideTheFileCarryNoLineNumber(t *testing.T) {
	for _, src := range []struct {
		env, sets []string
	}{
		{env: []string{"APPVIEW_WEBHOOKS_RETRY_SCHEDULE=0s,later"}},
		{sets: []string{"webhooks.retry_schedule=0s,later"}},
		{sets: []string{"backfill.concurrency=lots"}},
	} {
		_, err := load(t, "", src.env, src.sets)
		if err == nil || strings.Contains(err.Error(), "line ") {
			t.Errorf("env %v sets %v: err = %v, want a refusal without a (meaningless) line number", src.env, src.sets, err)
		}
	}
}

func TestSampleLoadsToExactlyTheDefaults(t *testing.T) {
	cfg := mustLoad(t, Sample, nil, nil)
	if cfg.InstanceID == "" {
		t.Fatal("instance_id was not filled in")
	}
	cfg.InstanceID = ""
	if want := Default(); !reflect.DeepEqual(cfg, want) {
		t.Fatalf("Sample loads to\n%+v\nwant Default()\n%+v", cfg, want)
	}
}

func TestSampleMentionsEveryKey(t *testing.T) {
	for _, key := range keys() {
		leaf := key[strings.LastIndex(key, ".")+1:]
		if !strings.Contains(Sample, "\n"+strings.Repeat(" ", 2*strings.Count(key, "."))+leaf+":") {
			t.Errorf("Sample has no line for %s", key)
		}
	}
}

func TestDefaultsAreValid(t *testing.T) {
	cfg := Default()
	cfg.InstanceID = "test"
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Default() does not validate: %v", err)
	}
}

func TestEmptyFileAndEmptySectionsKeepDefaults(t *testing.T) {
	for _, body := range []string{"\n", "# only a comment\n", "leases:\njetstream:\n", "---\n", "---\nleases:\n...\n"} {
		cfg := mustLoad(t, body, nil, nil)
		cfg.InstanceID = ""
		if !reflect.DeepEqual(cfg, Default()) {
			t.Errorf("file %q: config differs from Default(): %+v", body, cfg)
		}
	}
}

func TestEnvironmentBeatsFileAndSetBeatsEnvironment(t *testing.T) {
	file := "leases:\n  ttl: 20s\nlog_level: warn\n"
	env := []string{"APPVIEW_LEASES_TTL=30s", "APPVIEW_LOG_LEVEL=error"}
	sets := []string{"leases.ttl=40s"}

	if got := mustLoad(t, file, nil, nil).Leases.TTL; got != 20*time.Second {
		t.Errorf("file only: ttl = %s, want 20s", got)
	}
	if got := mustLoad(t, file, env, nil); got.Leases.TTL != 30*time.Second || got.LogLevel != "error" {
		t.Errorf("file+env: ttl = %s, log_level = %s; want 30s, error", got.Leases.TTL, got.LogLevel)
	}
	got := mustLoad(t, file, env, sets)
	if got.Leases.TTL != 40*time.Second {
		t.Errorf("file+env+set: ttl = %s, want 40s", got.Leases.TTL)
	}
	if got.LogLevel != "error" {
		t.Errorf("file+env+set: log_level = %s, want error (from the environment: --set did not name it)", got.LogLevel)
	}
	if got := mustLoad(t, "", nil, []string{"leases.ttl=1m", "leases.ttl=50s"}).Leases.TTL; got != 50*time.Second {
		t.Errorf("repeated --set: ttl = %s, want the last one, 50s", got)
	}
}

func TestValidationSeesTheMergedConfigurationNotEachSource(t *testing.T) {
	// The file alone is invalid (renew_interval 8s >= 15s/2); the
	// environment raises the ttl, and only the merged result counts.
	cfg := mustLoad(t, "leases:\n  renew_interval: 8s\n", []string{"APPVIEW_LEASES_TTL=30s", "APPVIEW_LEASES_RENEW_DEADLINE=20s"}, nil)
	if cfg.Leases.RenewInterval != 8*time.Second || cfg.Leases.TTL != 30*time.Second {
		t.Fatalf("leases = %+v", cfg.Leases)
	}
}

func TestListsFromTheEnvironmentTakeCommaListsAndFlowSyntax(t *testing.T) {
	want := []string{"wss://a.example/subscribe", "wss://b.example/subscribe"}
	for _, v := range []string{
		"wss://a.example/subscribe,wss://b.example/subscribe",
		" wss://a.example/subscribe , wss://b.example/subscribe ",
		"[wss://a.example/subscribe, wss://b.example/subscribe]",
		`["wss://a.example/subscribe", "wss://b.example/subscribe"]`,
	} {
		cfg := mustLoad(t, "", []string{"APPVIEW_JETSTREAM_URLS=" + v}, nil)
		if !reflect.DeepEqual(cfg.Jetstream.URLs, want) {
			t.Errorf("APPVIEW_JETSTREAM_URLS=%q: urls = %q, want %q", v, cfg.Jetstream.URLs, want)
		}
	}
	wantSchedule := []time.Duration{0, 30 * time.Second, 2 * time.Minute}
	for _, v := range []string{"0s,30s,2m", "0, 30s, 2m", "[0, 30s, 2m]", "[0s,30s,2m]"} {
		cfg := mustLoad(t, "", []string{"APPVIEW_WEBHOOKS_RETRY_SCHEDULE=" + v}, nil)
		if !reflect.DeepEqual(cfg.Webhooks.RetrySchedule, wantSchedule) {
			t.Errorf("APPVIEW_WEBHOOKS_RETRY_SCHEDULE=%q: schedule = %v, want %v", v, cfg.Webhooks.RetrySchedule, wantSchedule)
		}
	}
	cfg := mustLoad(t, "", []string{"APPVIEW_JETSTREAM_COLLECTIONS=io.atcr.manifest,io.atcr.tag"}, nil)
	if want := []string{"io.atcr.manifest", "io.atcr.tag"}; !reflect.DeepEqual(cfg.Jetstream.Collections, want) {
		t.Errorf("collections = %q, want %q", cfg.Jetstream.Collections, want)
	}
}

func TestListsKeepRepeatedDelaysAndDistinctEndpoints(t *testing.T) {
	cfg := mustLoad(t, "", []string{"APPVIEW_WEBHOOKS_RETRY_SCHEDULE=0s,30s,30s"}, nil)
	if want := []time.Duration{0, 30 * time.Second, 30 * time.Second}; !reflect.DeepEqual(cfg.Webhooks.RetrySchedule, want) {
		t.Errorf("retry_schedule = %v, want %v (a delay may repeat)", cfg.Webhooks.RetrySchedule, want)
	}
	// Same host, other path or port: other endpoints. A port is default
	// only for its own scheme: wss://h:80 is not wss://h, nor ws://h:443
	// ws://h, nor ws://h wss://h.
	for _, urls := range [][]string{
		{"wss://a.example/subscribe", "wss://a.example/xrpc/network.bsky.jetstream.subscribeEvents", "wss://a.example:6008/subscribe"},
		{"wss://a.example/subscribe", "wss://a.example:80/subscribe", "ws://a.example:443/subscribe", "ws://a.example/subscribe"},
	} {
		cfg = mustLoad(t, "", nil, []string{"jetstream.urls=" + strings.Join(urls, ",")})
		if !reflect.DeepEqual(cfg.Jetstream.URLs, urls) {
			t.Errorf("urls = %q, want %q", cfg.Jetstream.URLs, urls)
		}
	}
	relays := []string{"https://r.example", "https://r.example:80", "http://r.example:443", "http://r.example"}
	cfg = mustLoad(t, "", nil, []string{"backfill.relay_endpoints=" + strings.Join(relays, ",")})
	if !reflect.DeepEqual(cfg.Backfill.RelayEndpoints, relays) {
		t.Errorf("relay_endpoints = %q, want %q", cfg.Backfill.RelayEndpoints, relays)
	}
	// A list empty as a whole is a list with no element, not an empty
	// element (refused, where it is, for being empty).
	if got := mustLoad(t, "", []string{"APPVIEW_BACKFILL_RELAY_ENDPOINTS= "}, []string{"backfill.enabled=false"}).Backfill.RelayEndpoints; len(got) != 0 {
		t.Errorf("relay_endpoints = %q, want none", got)
	}
}

func TestValidateRefusesAnEmptyListElementOfAConfigBuiltInCode(t *testing.T) {
	cfg := Default()
	cfg.Jetstream.URLs = append(cfg.Jetstream.URLs, " ")
	var ce *Error
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Key != "jetstream.urls" || ce.Reason != "element 4 is empty" {
		t.Fatalf("Validate = %v, want jetstream.urls: element 4 is empty", err)
	}
}

// A leading zero is a decimal digit like any other: yaml.v3 alone read
// 010 as octal 8, and 08 as a float it then called out of range.
func TestWholeNumbersAreDecimalWithLeadingZeros(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{{"010", 10}, {"08", 8}, {"+5", 5}, {"007", 7}} {
		fromFile := mustLoad(t, "health:\n  concurrency: "+c.in+"\n", nil, nil)
		fromEnv := mustLoad(t, "", []string{"APPVIEW_HEALTH_CONCURRENCY=" + c.in}, nil)
		fromSet := mustLoad(t, "", nil, []string{"health.concurrency=" + c.in})
		if fromFile.Health.Concurrency != c.want || fromEnv.Health.Concurrency != c.want || fromSet.Health.Concurrency != c.want {
			t.Errorf("%q: file %d, env %d, --set %d; want %d", c.in,
				fromFile.Health.Concurrency, fromEnv.Health.Concurrency, fromSet.Health.Concurrency, c.want)
		}
	}
}

func TestZeroDurationsAcceptBareZeroAndZeroSeconds(t *testing.T) {
	cfg := Default()
	cfg.Backfill.Interval = time.Hour // so that 0 is visibly applied
	for _, v := range []string{"0", "0s", "0ms", " 0 "} {
		fromFile := mustLoad(t, "backfill:\n  interval: 1h\n  rerun_after: \""+v+"\"\n", nil, nil)
		fromEnv := mustLoad(t, "backfill:\n  interval: 1h\n", []string{"APPVIEW_BACKFILL_INTERVAL=" + v}, nil)
		fromSet := mustLoad(t, "backfill:\n  interval: 1h\n", nil, []string{"backfill.interval=" + v})
		if fromFile.Backfill.RerunAfter != 0 || fromEnv.Backfill.Interval != 0 || fromSet.Backfill.Interval != 0 {
			t.Errorf("%q: file rerun_after %s, env interval %s, --set interval %s; want all 0",
				v, fromFile.Backfill.RerunAfter, fromEnv.Backfill.Interval, fromSet.Backfill.Interval)
		}
	}
	if got := mustLoad(t, "webhooks:\n  retry_schedule: [0, 0s, 1s]\n", nil, nil).Webhooks.RetrySchedule; !reflect.DeepEqual(got, []time.Duration{0, 0, time.Second}) {
		t.Errorf("retry_schedule [0, 0s, 1s] = %v", got)
	}
}

func TestEveryKeyHasItsOwnEnvironmentVariable(t *testing.T) {
	seen := map[string]string{}
	for _, key := range keys() {
		name := EnvName(key)
		if other, dup := seen[name]; dup {
			t.Errorf("%s and %s share the environment variable %s", key, other, name)
		}
		seen[name] = key
	}
	if EnvName("leases.renew_deadline") != "APPVIEW_LEASES_RENEW_DEADLINE" {
		t.Errorf("EnvName(leases.renew_deadline) = %s", EnvName("leases.renew_deadline"))
	}
}

func TestEveryKeyCanBeSetFromTheEnvironmentAndFromSet(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A value each kind of key accepts, chosen to pass validation.
	values := map[string]string{
		"admin.token": "0123456789abcdef", "admin.token_file": tokenFile,
		"admin.protect_metrics": "false", // true needs a token too
		"instance_id":           "x", "log_level": "debug", "database.url": "file:./x.db", "database.auth_token": "t",
		"admin.addr": "127.0.0.1:0", "admin.advertise_url": "http://10.0.0.5:5001",
		"jetstream.urls": "wss://j.example/subscribe", "jetstream.collections": "io.atcr.*",
		"backfill.relay_endpoints": "https://r.example", "identity.plc_url": "https://plc.example", "identity.handle_well_known_url": "http://127.0.0.1:2583",
		"labeler.url": "https://labeler.example", "billing.stripe_secret_key": "sk", "billing.stripe_api_url": "https://s.example",
		"webhooks.retry_schedule": "0s,1s", "webhooks.public_url": "https://atcr.example",
		"leases.ttl": "15s", "leases.renew_interval": "5s", "leases.renew_deadline": "10s", "leases.retry_interval": "2s",
		"jetstream.max_message_bytes": "4096", "billing.enabled": "false", // true needs a secret key too
		"health.timeout": "1s", // below health.check_interval
	}
	def := Default()
	fields := leafFields(reflect.ValueOf(&def).Elem(), "")
	for _, key := range keys() {
		v, ok := values[key]
		if !ok {
			switch f := fields[key]; {
			case f.Type() == durationType:
				v = "1h"
			case f.Kind() == reflect.Bool:
				v = "true"
			case f.Kind() == reflect.Int || f.Kind() == reflect.Int64:
				v = "3"
			default:
				t.Errorf("no test value for %s (%s)", key, f.Type())
				continue
			}
		}
		if _, err := load(t, "", []string{EnvName(key) + "=" + v}, nil); err != nil {
			t.Errorf("%s=%s: %v", EnvName(key), v, err)
		}
		if _, err := load(t, "", nil, []string{key + "=" + v}); err != nil {
			t.Errorf("--set %s=%s: %v", key, v, err)
		}
	}
}

// The instance ids the docs, the deploy files and the tests use, and any
// other printable characters, are accepted up to 128 bytes; so are a
// default port written out, or left empty, in a URL.
func TestInstanceIDsAndURLsWithinTheRulesAreAccepted(t *testing.T) {
	for _, id := range []string{"web-1", "appview-1", "instance-a", "instance-x", "appview.eu-west_2", "host:5001", "café-1", "ノード1",
		strings.Repeat("w", MaxInstanceIDBytes), strings.Repeat("é", MaxInstanceIDBytes/2)} {
		if got := mustLoad(t, "", nil, []string{"instance_id=" + id}).InstanceID; got != id {
			t.Errorf("instance_id = %q, want %q", got, id)
		}
	}
	for _, u := range []string{"http://10.0.0.5:5001", "http://appview-1:5001", "https://appview.example", "http://[::1]:5001", "http://10.0.0.5:65535", "http://h.example:"} {
		if got := mustLoad(t, "", nil, []string{"admin.advertise_url=" + u}).Admin.AdvertiseURL; got != u {
			t.Errorf("admin.advertise_url = %q, want %q", got, u)
		}
	}
}

// Query parameters that are not the subscription's own (a proxy's token)
// are kept, and requireHello stays allowed on the legacy wire, which
// answers it with the consumer's options_update.
func TestJetstreamURLsKeepQueryParametersThatAreNotTheSubscriptions(t *testing.T) {
	urls := []string{"wss://j.example/subscribe?requireHello=true", "wss://j.example/xrpc/network.bsky.jetstream.subscribeEvents?token=abc"}
	got := mustLoad(t, "", nil, []string{"jetstream.urls=" + strings.Join(urls, ",")}).Jetstream.URLs
	if !slices.Equal(got, urls) {
		t.Fatalf("jetstream.urls = %q, want %q", got, urls)
	}
}

// A generated instance_id is valid whatever the hostname holds.
func TestAGeneratedInstanceIDIsValid(t *testing.T) {
	if id := NewInstanceID(); checkInstanceID(id) != nil {
		t.Fatalf("NewInstanceID() = %q: %v", id, checkInstanceID(id))
	}
	for _, tc := range []struct{ host, want string }{
		{"web-1", "web-1"},
		{"", "appview"},
		{"my host", "my-host"},
		{"web\x1b[31m", "web-[31m"},
		{"web\xff1", "web-1"},
		{"café", "café"},
		{strings.Repeat("h", 70), strings.Repeat("h", 64)},
		{strings.Repeat("h", 63) + "é", strings.Repeat("h", 63)},
	} {
		got := idHost(tc.host)
		if got != tc.want {
			t.Errorf("idHost(%q) = %q, want %q", tc.host, got, tc.want)
		}
		if id := got + "-4194304-abcdef"; checkInstanceID(id) != nil {
			t.Errorf("id %q from host %q: %v", id, tc.host, checkInstanceID(id))
		}
	}
}

func TestInstanceIDIsUniquePerLoadUnlessGiven(t *testing.T) {
	a, b := mustLoad(t, "", nil, nil), mustLoad(t, "", nil, nil)
	if a.InstanceID == b.InstanceID {
		t.Errorf("two loads share instance_id %q", a.InstanceID)
	}
	host, _ := os.Hostname()
	if !strings.HasPrefix(a.InstanceID, host+"-") {
		t.Errorf("instance_id %q does not start with the hostname %q", a.InstanceID, host)
	}
	if got := mustLoad(t, "instance_id: web-1\n", nil, nil).InstanceID; got != "web-1" {
		t.Errorf("instance_id = %q, want web-1", got)
	}
}

func TestUnreadableFileIsRefusedNamingTheFlag(t *testing.T) {
	_, err := Load(Sources{File: filepath.Join(t.TempDir(), "missing.yaml")})
	var ce *Error
	if !errors.As(err, &ce) || ce.Key != "--config" || !strings.Contains(ce.Reason, "no such file") {
		t.Fatalf("err = %v, want a --config error saying the file is missing", err)
	}
}

func TestOtherEnvironmentVariablesAreIgnored(t *testing.T) {
	cfg := mustLoad(t, "", []string{"HOME=/root", "APPVIEWX=1", "appview_leases_ttl=1s", "NOEQUALS"}, nil)
	if cfg.Leases.TTL != Default().Leases.TTL {
		t.Errorf("ttl = %s, want the default", cfg.Leases.TTL)
	}
}

// manyCollections is a comma-separated list of n distinct NSIDs.
func manyCollections(n int) string {
	cols := make([]string, n)
	for i := range cols {
		cols[i] = fmt.Sprintf("io.atcr.c%d", i)
	}
	return strings.Join(cols, ",")
}

// keys lists every leaf key in dotted form (the tests check each has a
// default and an environment name).
func keys() []string {
	cfg := Default()
	var keys []string
	for k := range leafFields(reflect.ValueOf(&cfg).Elem(), "") {
		keys = append(keys, k)
	}
	return keys
}
