package main

import (
	"strings"
	"testing"

	"github.com/atcr-io/appview/internal/cli"
)

func TestEveryUsageErrorExitsTwoWithOneLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--bogus"}, "unknown flag: --bogus (see appview serve --help)"},
		{[]string{"--bogus"}, "unknown flag: --bogus (see appview --help)"},
		{[]string{"leases", "--json=maybe"}, `invalid argument "maybe" for "--json" flag`},
		{[]string{"jetstream-replay", "--rate", "fast"}, `invalid argument "fast" for "--rate" flag`},
		{[]string{"jetstream-replay", "--file", "x.jsonl", "--rate", "-1"}, "appview: --rate -1: must not be negative (see appview jetstream-replay --help)"},
		{[]string{"jetstream-replay", "--file", "x.jsonl", "--rate", "1e-300"}, "appview: --rate 1e-300: must be 0 (unpaced) or at least 1e-06 events per second (see appview jetstream-replay --help)"},
		{[]string{"jetstream-replay", "--file", "x.jsonl", "--rate", "NaN"}, "appview: --rate NaN: must be a finite number of events per second (see appview jetstream-replay --help)"},
		{[]string{"jetstream-replay", "--file", "x.jsonl", "--rate", "Inf"}, "appview: --rate +Inf: must be a finite number of events per second"},
		{[]string{"jetstream-replay", "--file", "x.jsonl", "--rate", "-inf"}, "appview: --rate -Inf: must be a finite number of events per second"},
		{[]string{"jetstream-replay", "--file", "x.jsonl", "--drop-after", "-1"}, "appview: --drop-after -1: must not be negative (see appview jetstream-replay --help)"},
		{[]string{"jetstream-replay"}, `appview: required flag(s) "file" not set (see appview jetstream-replay --help)`},
		{[]string{"serve", "--config", ""}, `invalid argument "" for "--config" flag: empty; give a value or leave --config out`},
		// webhooks add's words for a bad DID, not the DID library's.
		{[]string{"webhooks", "list", "--did", "bad"}, `appview: webhook did "bad": want did:<method>:<id>, e.g. did:plc:abc123 (see appview webhooks list --help)`},
		{[]string{"webhooks", "add", "--did", "bad", "--url", "https://hooks.example/x"}, `appview: webhook did "bad": want did:<method>:<id>, e.g. did:plc:abc123 (see appview webhooks add --help)`},
		{[]string{"jetstream-replay", "--file", ""}, "appview: invalid argument \"\" for \"--file\" flag: empty; give a value or leave --file out (see appview jetstream-replay --help)"},
		{[]string{"serve", "--config"}, "flag needs an argument: --config"},
		// A flag that chooses what a command works on is given once: pflag
		// would silently keep the last value (a "base + overlay" pair of
		// --config ran on the overlay alone, with the default database).
		{[]string{"serve", "--config", "a.yaml", "--config", "b.yaml"},
			`--config given twice ("a.yaml", then "b.yaml"): one configuration file is read; put overrides in --set KEY=VALUE or APPVIEW_* variables (see appview serve --help)`},
		{[]string{"--config=a.yaml", "leases", "--config=b.yaml"}, `--config given twice ("a.yaml", then "b.yaml")`},
		{[]string{"webhooks", "list", "--config", "a.yaml", "--config", "a.yaml"}, `--config given twice ("a.yaml", then "a.yaml")`},
		{[]string{"backfill", "status", "--config", "a.yaml", "--config", "b.yaml"}, `--config given twice`},
		{[]string{"healthcheck", "--config", "a.yaml", "--config", "b.yaml"}, `--config given twice`},
		{[]string{"config", "init", "--config", "a.yaml", "--config", "b.yaml"}, `--config given twice`},
		{[]string{"healthcheck", "--url", "http://127.0.0.1:9/readyz", "--url", "http://127.0.0.1:8/readyz"},
			`--url given twice ("http://127.0.0.1:9/readyz", then "http://127.0.0.1:8/readyz"): one instance is probed per run`},
		{[]string{"webhooks", "list", "--did", "did:plc:alice", "--did", "did:plc:bob"}, `--did given twice ("did:plc:alice", then "did:plc:bob"): one DID is listed`},
		{[]string{"jetstream-replay", "--file", "a.jsonl", "--file", "b.jsonl"}, `--file given twice ("a.jsonl", then "b.jsonl"): one capture is served`},
		{[]string{"jetstream-replay", "--file", "a.jsonl", "--listen", "127.0.0.1:0", "--listen", "127.0.0.1:1"}, `--listen given twice ("127.0.0.1:0", then "127.0.0.1:1")`},
		{[]string{"serv"}, `unknown command "serv" for "appview" (did you mean serve?)`},
		{[]string{"webhooks", "lst"}, `unknown command "lst" for "appview webhooks" (did you mean list?)`},
		{[]string{"config", "bogus"}, `unknown command "bogus" for "appview config"`},
		{[]string{"--set", "leases.ttl=15s"}, `--set given without a command: name the command it is for (appview COMMAND --set ...) (see appview --help)`},
		{[]string{"webhooks", "--config", "a.yaml"}, `--config given without a command: name the command it is for (appview webhooks COMMAND --config ...)`},
		{[]string{"help", "bogus"}, `appview: unknown help topic "bogus" (see appview help --help)`},
		{[]string{"help", "webhooks", "bogus"}, `unknown help topic "webhooks bogus"`},
		{[]string{"config", "init", ""}, "FILE is empty (omit it, or give -, to write to stdout)"},
		{[]string{"serve", "extra"}, `takes no arguments, got "extra" (its inputs are flags, see --help) (see appview serve --help)`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice", "https://hooks.example/x"}, `takes no arguments, got "https://hooks.example/x"`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice", "--url", "http://127.0.0.1:9/x"}, "(pass --allow-private to permit it)"},
		{[]string{"config", "init", "a.yaml", "b.yaml"}, "accepts at most 1 arg(s), received 2"},
		{[]string{"webhooks", "rm"}, "accepts 1 arg(s), received 0 (see appview webhooks rm --help)"},
		{[]string{"webhooks", "rm", "first"}, `webhook id "first": want a positive integer`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice"}, `required flag(s) "url" not set (see appview webhooks add --help)`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice", "--url", "https://hooks.example/x", "--secret", ""},
			`--secret: the secret given is empty or only whitespace (omit --secret for an unsigned webhook) (see appview webhooks add --help)`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice", "--url", "https://hooks.example/x", "--secret", " \t"}, `--secret: the secret given is empty or only whitespace`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice", "--did", "did:plc:bob", "--url", "https://hooks.example/x"},
			`--did given 2 times (["did:plc:alice" "did:plc:bob"]): a webhook belongs to one DID; run webhooks add once for each`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice", "--url", "https://a.example/x", "--url", "https://b.example/x"},
			`--url given 2 times (["https://a.example/x" "https://b.example/x"]): a webhook delivers to one URL`},
		{[]string{"webhooks", "add", "--did", "did:plc:alice", "--url", "https://hooks.example/x", "--secret", "s3cr3t-one", "--secret", "s3cr3t-two"},
			"--secret given 2 times: a webhook has one secret"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			r := runAppview(t, dir, childEnv(), tc.args...)
			if r.code != cli.ExitConfig {
				t.Errorf("exit code %d, want %d", r.code, cli.ExitConfig)
			}
			lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.HasPrefix(lines[0], "appview: ") || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("stderr = %q, want one line \"appview: ...\" containing %q", r.stderr, tc.want)
			}
			if r.stdout != "" {
				t.Errorf("printed %q on stdout for a usage error", r.stdout)
			}
			assertEmptyDir(t, dir)
		})
	}
}

func TestACommandGroupCalledBarePrintsItsHelp(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"webhooks"}, {"config"}, {"serve", "--help"}} {
		r := runAppview(t, t.TempDir(), childEnv(), args...)
		if r.code != 0 || r.stderr != "" || !strings.Contains(r.stdout, "Usage:") {
			t.Errorf("appview %s: exit %d, stderr %q, stdout %q; want the help and exit 0", strings.Join(args, " "), r.code, r.stderr, r.stdout)
		}
	}
}
