package config

import (
	"errors"
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

func TestUnknownAppviewVariablesWarnWithTheClosestKey(t *testing.T) {
	for name, closest := range map[string]string{
		"APPVIEW_LEASES_TLL":     "APPVIEW_LEASES_TTL",
		"APPVIEW_LEASE_TTL":      "APPVIEW_LEASES_TTL",
		"APPVIEW_DATABSE_URL":    "APPVIEW_DATABASE_URL",
		"APPVIEW_LOGLEVEL":       "APPVIEW_LOG_LEVEL",
		"APPVIEW_jetstream_urls": "APPVIEW_JETSTREAM_URLS", // names are compared in upper case
		// A deploy script's own variables: the closest key is named all
		// the same; the line says the variable is ignored.
		"APPVIEW_BIN":     "",
		"APPVIEW_VERSION": "",
		// A value that is not a service link keeps a _PORT name unknown.
		"APPVIEW_PORT": "",
	} {
		_, warnings, err := loadWarned(t, "", []string{name + "=something"})
		if err != nil {
			t.Errorf("%s stopped the start: %v", name, err)
			continue
		}
		if len(warnings) != 1 || !strings.Contains(warnings[0], name+" is not a config key and is ignored (did you mean APPVIEW_") ||
			!strings.Contains(warnings[0], closest) {
			t.Errorf("%s: warnings %q, want one naming it and suggesting %s", name, warnings, closest)
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
