package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Check reports every problem of the file (in document order), the
// environment and --set, then every rule the values break, each naming its key and where its
// value came from; Load refuses with the first of them.
func TestCheckReportsEveryProblemAndLoadTheFirst(t *testing.T) {
	file := writeFile(t, "log_level: loud\nleases:\n  tll: 15s\n  renew_interval: soon\nadmin:\n  addr: 127.0.0.1:0\n  addr: 127.0.0.1:1\nhealth:\n  timeout: 1h\n")
	src := Sources{File: file, Environ: []string{"APPVIEW_CLEANUP_CHUNK_ROWS=many"}, Sets: []string{"jetstream.rewnd=1s", "billing.enabled=true"}}
	_, problems := Check(src)
	want := []struct{ key, reason string }{
		{"leases.tll", "unknown key (did you mean leases.ttl?) (line 3)"},
		{"leases.renew_interval", `unparsable duration "soon"`},
		{"admin.addr", "duplicate key (line 7)"},
		{"cleanup.chunk_rows", `expected a whole number, got "many" (from APPVIEW_CLEANUP_CHUNK_ROWS)`},
		{"jetstream.rewnd", "unknown key (did you mean jetstream.rewind?) (from --set)"},
		// Then the rules, in Validate's order.
		{"log_level", `want debug, info, warn or error, got "loud" (line 1)`},
		{"health.timeout", "must be below health.check_interval (15s), got 1h0m0s (line 9)"},
		{"billing.stripe_secret_key", "required when billing.enabled is true (billing.enabled from --set)"},
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.Error())
	}
	if len(problems) != len(want) {
		t.Fatalf("Check found %d problems, want %d:\n%s", len(problems), len(want), strings.Join(got, "\n"))
	}
	for i, w := range want {
		if problems[i].Key != w.key || !strings.Contains(problems[i].Reason, w.reason) {
			t.Errorf("problem %d = %q, want key %s and a reason containing %q", i+1, got[i], w.key, w.reason)
		}
	}
	_, err := Load(src)
	if err == nil || err.Error() != got[0] {
		t.Errorf("Load refused with %v, want the first problem %q", err, got[0])
	}
}

// A rule relating keys is not checked against a key whose own value was
// refused: that key holds its default, not what the operator wrote.
func TestCheckSkipsRulesReadingAKeyThatWasRefused(t *testing.T) {
	_, problems := Check(Sources{Sets: []string{"leases.ttl=fifteen", "leases.renew_deadline=20s", "health.check_interval=0s", "health.timeout=1h"}})
	var keys []string
	for _, p := range problems {
		keys = append(keys, p.Key)
	}
	if fmt.Sprint(keys) != "[leases.ttl health.check_interval]" {
		t.Errorf("problems %v, want leases.ttl (unparsable) and health.check_interval (zero) only: %v", keys, problems)
	}
}

// A file that is not one YAML document is one problem: what it meant is
// unknown, so the rules are not checked, but the environment and --set
// still are.
func TestCheckOfAFileThatIsNotYAMLStillChecksTheOtherSources(t *testing.T) {
	file := writeFile(t, "leases: [ttl\n")
	_, problems := Check(Sources{File: file, Environ: []string{"APPVIEW_LEASES_TTL=1"}, Sets: []string{"billing.enabled=true"}})
	if len(problems) != 2 || problems[0].Key != "--config" || !strings.Contains(problems[0].Reason, "invalid YAML") ||
		problems[1].Key != "leases.ttl" {
		t.Fatalf("problems = %v, want the invalid YAML, then leases.ttl from the environment (and no rule)", problems)
	}
}

func TestValidateIsTheFirstOfProblems(t *testing.T) {
	cfg := Default()
	cfg.ShutdownTimeout, cfg.LogLevel, cfg.Cleanup.ChunkRows = 0, "loud", 0
	problems := cfg.Problems()
	var ce *Error
	if len(problems) != 3 || !errors.As(cfg.Validate(), &ce) || ce.Error() != problems[0].Error() || ce.Key != "shutdown_timeout" {
		t.Fatalf("Problems = %v, Validate = %v; want three, Validate the first (shutdown_timeout)", problems, cfg.Validate())
	}
	if err := Default().Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
}
