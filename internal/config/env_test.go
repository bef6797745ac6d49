package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// loadWarned loads with env and returns the configuration, the error and
// every warning Load gave.
func loadWarned(t *testing.T, yaml string, env []string) (Config, []string, error) {
	t.Helper()
	var warnings []string
	src := Sources{Environ: env, Warn: func(msg string) { warnings = append(warnings, msg) }}
	if yaml != "" {
		src.File = writeFile(t, yaml)
	}
	cfg, err := Load(src)
	return cfg, warnings, err
}

// The variables Kubernetes injects for a Service named "appview" (and
// "appview-admin"), as a pod sees them.
var kubernetesServiceLinks = []string{
	"APPVIEW_PORT=tcp://10.0.0.1:80",
	"APPVIEW_SERVICE_HOST=10.0.0.1",
	"APPVIEW_SERVICE_PORT=80",
	"APPVIEW_SERVICE_PORT_HTTP=80",
	"APPVIEW_PORT_80_TCP=tcp://10.0.0.1:80",
	"APPVIEW_PORT_80_TCP_PROTO=tcp",
	"APPVIEW_PORT_80_TCP_PORT=80",
	"APPVIEW_PORT_80_TCP_ADDR=10.0.0.1",
	"APPVIEW_ADMIN_PORT=tcp://10.0.0.2:5001",
	"APPVIEW_ADMIN_SERVICE_HOST=10.0.0.2",
	"APPVIEW_ADMIN_PORT_5001_UDP_ADDR=10.0.0.2",
}

func TestKubernetesServiceLinksAreIgnoredQuietly(t *testing.T) {
	env := append([]string{"APPVIEW_LEASES_TTL=30s"}, kubernetesServiceLinks...)
	cfg, warnings, err := loadWarned(t, "", env)
	if err != nil {
		t.Fatalf("a pod's service links refused: %v", err)
	}
	if len(warnings) != 0 {
		t.Errorf("service links warned about: %q", warnings)
	}
	if cfg.Leases.TTL.String() != "30s" {
		t.Errorf("a key set beside the service links was lost: ttl %s", cfg.Leases.TTL)
	}
}

// A "did you mean" names a key only for a near miss of it: a typo of a
// character or two, another case or separator, or a word for a section's
// address. A name that resembles no key gets none: "did you mean
// APPVIEW_LOG_LEVEL" for APPVIEW_FOO sent operators after the wrong key.
func TestSuggestionsOnlyForANearMiss(t *testing.T) {
	for _, tc := range []struct {
		source, name, want string // want "" for no suggestion
	}{
		{"env", "APPVIEW_LEASES_TLL", "leases.ttl"},
		{"env", "APPVIEW_LEASE_TTL", "leases.ttl"},
		{"env", "APPVIEW_DATABSE_URL", "database.url"},
		{"env", "APPVIEW_LOGLEVEL", "log_level"},
		{"env", "APPVIEW_jetstream_urls", "jetstream.urls"}, // names are compared in any case
		{"env", "APPVIEW_ADMIN_TOKENS", "admin.token"},
		{"env", "APPVIEW_ADMIN_PORT", "admin.addr"},
		{"env", "APPVIEW_ADMIN_LISTEN", "admin.addr"},
		// A deploy script's own variables, and words that are no key.
		{"env", "APPVIEW_FOO", ""},
		{"env", "APPVIEW_BIN", ""},
		{"env", "APPVIEW_VERSION", ""},
		{"env", "APPVIEW_DEBUG", ""},
		{"env", "APPVIEW_TOKEN", ""},
		{"env", "APPVIEW_PORT", ""}, // not a service link's value: still unknown
		{"env", "APPVIEW_LEASES_TIMEOUT", ""},
		{"--set", "leases.tll", "leases.ttl"},
		{"--set", "Leases.TTL", "leases.ttl"},
		{"--set", "leases_ttl", "leases.ttl"},
		{"--set", "log-level", "log_level"},
		{"--set", "log.level", "log_level"},
		{"--set", "jetstream.url", "jetstream.urls"},
		{"--set", "backfill.intervall", "backfill.interval"},
		{"--set", "admin.port", "admin.addr"},
		{"--set", "foo", ""},
		{"--set", "leases.timeout", ""},
		{"--set", "jetstream.firehose_everything", ""},
		{"file", "lease", "leases"},
		{"file", "instance_idd", "instance_id"},
		{"file", "databse.url", "database"}, // the section is what is unknown
		{"file", "foo", ""},
		{"file", "admin.tls", ""},
	} {
		var said string
		switch tc.source {
		case "env":
			_, warnings, err := loadWarned(t, "", []string{tc.name + "=something"})
			if err != nil || len(warnings) != 1 || !strings.HasPrefix(warnings[0], "environment variable "+tc.name+" is not a config key and is ignored") {
				t.Errorf("%s: warnings %q, err %v; want one warning saying it is ignored", tc.name, warnings, err)
				continue
			}
			said = warnings[0]
			if tc.want != "" && !strings.HasSuffix(said, fmt.Sprintf(" (did you mean %s, key %s?)", EnvName(tc.want), tc.want)) {
				t.Errorf("%s: %q, want it to suggest %s", tc.name, said, tc.want)
			}
		case "--set":
			_, err := Load(Sources{Sets: []string{tc.name + "=1"}})
			said = fmt.Sprint(err)
			if tc.want != "" && !strings.Contains(said, "unknown key (did you mean "+tc.want+"?) (from --set)") {
				t.Errorf("--set %s: %q, want it to suggest %s", tc.name, said, tc.want)
			}
		case "file":
			section, leaf, nested := strings.Cut(tc.name, ".")
			body := section + ": 1\n"
			if nested {
				body = section + ":\n  " + leaf + ": 1\n"
			}
			_, err := Load(Sources{File: writeFile(t, body)})
			said = fmt.Sprint(err)
			if tc.want != "" && !strings.Contains(said, "unknown key (did you mean "+tc.want+"?) (line") {
				t.Errorf("file key %s: %q, want it to suggest %s", tc.name, said, tc.want)
			}
		}
		if tc.want == "" && strings.Contains(said, "did you mean") {
			t.Errorf("%s %s: %q, want no suggestion", tc.source, tc.name, said)
		}
	}
}

func TestTheConfigFileAndSetStayStrict(t *testing.T) {
	var ce *Error
	if _, _, err := loadWarned(t, "leases:\n  tll: 15s\n", kubernetesServiceLinks); !errors.As(err, &ce) || ce.Key != "leases.tll" {
		t.Errorf("unknown file key: %v, want a refusal naming leases.tll", err)
	}
	if _, err := Load(Sources{Sets: []string{"bin=x"}}); !errors.As(err, &ce) || ce.Key != "bin" {
		t.Errorf("unknown --set key: %v, want a refusal naming bin", err)
	}
	// A known key's bad value from the environment is still refused.
	if _, _, err := loadWarned(t, "", []string{"APPVIEW_LEASES_TTL=soon"}); !errors.As(err, &ce) || ce.Key != "leases.ttl" {
		t.Errorf("bad APPVIEW_LEASES_TTL: %v, want a refusal naming leases.ttl", err)
	}
}

func TestEditDistanceCountsSingleByteEdits(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{{"", "", 0}, {"abc", "", 3}, {"", "ab", 2}, {"kitten", "sitting", 3}, {"TTL", "TLL", 1}, {"LEASE", "LEASES", 1}, {"ab", "ba", 2}} {
		if got := editDistance(tc.a, tc.b); got != tc.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
