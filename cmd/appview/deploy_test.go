package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
)

// deployDir is the packaging folder, from this package.
const deployDir = "../../deploy"

// TestComposeFileParsesWithTheDemoServices parses deploy/compose.yaml
// (anchors and merge keys resolved, as Compose does) and checks the demo's
// shape: sqld, three appview instances with distinct ids and advertised
// URLs sharing sqld and the token secret, and a replay server.
// `docker compose config` needs the Compose plugin, absent here.
func TestComposeFileParsesWithTheDemoServices(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(deployDir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Secrets     []string          `yaml:"secrets"`
			Ports       []string          `yaml:"ports"`
			DependsOn   map[string]any    `yaml:"depends_on"`
			Build       struct {
				Context    string `yaml:"context"`
				Dockerfile string `yaml:"dockerfile"`
			} `yaml:"build"`
		} `yaml:"services"`
		Secrets map[string]struct {
			File string `yaml:"file"`
		} `yaml:"secrets"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for _, name := range []string{"sqld", "replay", "appview-1", "appview-2", "appview-3"} {
		if _, ok := doc.Services[name]; !ok {
			t.Errorf("compose.yaml has no service %q", name)
		}
	}
	if got := doc.Services["replay"].Command; len(got) == 0 || got[0] != "jetstream-replay" {
		t.Errorf("replay runs %v, want appview jetstream-replay", got)
	}
	ids, adverts := map[string]bool{}, map[string]bool{}
	for _, name := range []string{"appview-1", "appview-2", "appview-3"} {
		s := doc.Services[name]
		env := s.Environment
		if env["APPVIEW_DATABASE_URL"] != "http://sqld:8080" || env["APPVIEW_ADMIN_TOKEN_FILE"] != "/run/secrets/admin_token" ||
			env["APPVIEW_JETSTREAM_URLS"] != "ws://replay:6008/subscribe" {
			t.Errorf("%s environment %v: want sqld, the token secret and the replay server", name, env)
		}
		ids[env["APPVIEW_INSTANCE_ID"]], adverts[env["APPVIEW_ADMIN_ADVERTISE_URL"]] = true, true
		if len(s.Secrets) != 1 || s.Secrets[0] != "admin_token" || s.Build.Dockerfile != "deploy/Dockerfile" {
			t.Errorf("%s: secrets %v, dockerfile %q", name, s.Secrets, s.Build.Dockerfile)
		}
		if _, ok := s.DependsOn["sqld"]; !ok {
			t.Errorf("%s does not depend on sqld", name)
		}
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s publishes %s beyond loopback", name, p)
			}
		}
	}
	if len(ids) != 3 || len(adverts) != 3 {
		t.Errorf("instance ids %v, advertised URLs %v: want three distinct of each", ids, adverts)
	}
	if doc.Secrets["admin_token"].File == "" {
		t.Error("the admin_token secret has no file")
	}
	// Every APPVIEW_* variable must name a real key: config.Load refuses
	// unknown ones, so a typo here would stop the demo at start.
	for name, s := range doc.Services {
		for k, v := range s.Environment {
			if !strings.HasPrefix(k, config.EnvPrefix) {
				continue
			}
			// The value may not validate here (a secret path that does not
			// exist on this machine); only an unknown name is a fault.
			_, err := config.Load(config.Sources{Environ: []string{k + "=" + v}})
			if err != nil && strings.Contains(err.Error(), "unknown environment variable") {
				t.Errorf("%s sets %s, which is no configuration key: %v", name, k, err)
			}
		}
	}
}

// TestDockerfileIsMultiStageNonRootWithVolumeAndSelfHealthcheck checks
// what can be checked of deploy/Dockerfile without a Docker engine (none
// runs here): a build stage and a glibc runtime, a non-root USER, a VOLUME
// for the data, and a HEALTHCHECK that runs a subcommand the binary has.
func TestDockerfileIsMultiStageNonRootWithVolumeAndSelfHealthcheck(t *testing.T) {
	t.Parallel()
	f, err := os.Open(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var from []string
	var user, volume, health, entry string
	sc := bufio.NewScanner(f)
	var line string
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") {
			continue
		}
		line += l
		if strings.HasSuffix(line, `\`) {
			line = strings.TrimSuffix(line, `\`) + " "
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			from = append(from, rest)
		case "USER":
			user = rest
		case "VOLUME":
			volume = rest
		case "HEALTHCHECK":
			health = rest
		case "ENTRYPOINT":
			entry = rest
		}
		line = ""
	}
	if len(from) < 2 || !regexp.MustCompile(`^golang:\S+ AS build$`).MatchString(from[0]) ||
		!regexp.MustCompile(`(distroless/cc|debian:\S+-slim)\S* AS runtime$`).MatchString(from[len(from)-1]) {
		t.Errorf("stages %q: want a golang build stage and a distroless/cc or slim Debian runtime", from)
	}
	if user == "" || strings.HasPrefix(user, "0") || strings.HasPrefix(user, "root") {
		t.Errorf("USER %q: want a non-root user", user)
	}
	if !strings.Contains(volume, "/data") {
		t.Errorf("VOLUME %q: want /data", volume)
	}
	m := regexp.MustCompile(`CMD \["/usr/local/bin/appview", "(\w+)"\]`).FindStringSubmatch(health)
	if m == nil || entry != `["/usr/local/bin/appview"]` {
		t.Fatalf("HEALTHCHECK %q, ENTRYPOINT %q: want the binary's own probe", health, entry)
	}
	if r := runAppview(t, t.TempDir(), childEnv(), m[1], "--help"); r.code != 0 || !strings.Contains(r.stdout, "/readyz") {
		t.Errorf("appview %s --help: exit %d, %q; the HEALTHCHECK names a command the binary lacks", m[1], r.code, r.stdout)
	}
}

// TestSystemdUnitPassesSystemdAnalyzeVerify runs `systemd-analyze verify`
// on deploy/appview.service in a scratch root holding the host's unit
// directory and the built binary at the unit's ExecStart path. verify
// exits 0 even for unknown keys and bad values, so any output fails too.
// Like the browser test, a missing systemd-analyze fails unless the
// developer opts out outside CI (.ci/run installs Debian's systemd).
func TestSystemdUnitPassesSystemdAnalyzeVerify(t *testing.T) {
	t.Parallel()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "true" && os.Getenv("APPVIEW_SKIP_SYSTEMD_TESTS") == "1" {
			t.Skip("no systemd-analyze and APPVIEW_SKIP_SYSTEMD_TESTS=1")
		}
		t.Fatal("systemd-analyze not found (apt-get install systemd, or outside CI set APPVIEW_SKIP_SYSTEMD_TESTS=1)")
	}
	unit, err := os.ReadFile(filepath.Join(deployDir, "appview.service"))
	if err != nil {
		t.Fatal(err)
	}
	exec1 := regexp.MustCompile(`(?m)^ExecStart=(\S+)`).FindSubmatch(unit)
	if exec1 == nil {
		t.Fatal("appview.service has no ExecStart")
	}
	root := t.TempDir()
	for _, dir := range []string{"etc/systemd/system", "usr/lib/systemd", filepath.Dir(strings.TrimPrefix(string(exec1[1]), "/"))} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hostUnits := "/usr/lib/systemd/system"
	if _, err := os.Stat(hostUnits); err != nil {
		hostUnits = "/lib/systemd/system"
	}
	if out, err := exec.Command("cp", "-r", hostUnits, filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy the host's units: %v %s", err, out)
	}
	if out, err := exec.Command("cp", appviewBin, filepath.Join(root, string(exec1[1]))).CombinedOutput(); err != nil {
		t.Fatalf("copy the binary: %v %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/systemd/system/appview.service"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--man=no", "--root="+root, "appview.service").CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSystemdUnitRestartsATransientStartAndNotARefusal checks the unit's
// restart policy against the exit codes: a refusal (cli.ExitConfig) is
// not restarted, it would only repeat; a failure (cli.ExitFailure),
// including a database unavailable at start (sqld not up yet when the host
// boots, a backup holding the write lock), is restarted, with no start
// limit that would give up on it.
func TestSystemdUnitRestartsATransientStartAndNotARefusal(t *testing.T) {
	unit, err := os.ReadFile(filepath.Join(deployDir, "appview.service"))
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string][]string{}
	for _, line := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(line, "#") {
			keys[k] = append(keys[k], strings.Fields(v)...)
		}
	}
	if got := strings.Join(keys["Restart"], " "); got != "on-failure" && got != "always" {
		t.Errorf("Restart=%s: exit %d (a database unavailable at start) must be restarted", got, cli.ExitFailure)
	}
	prevent := keys["RestartPreventExitStatus"]
	if !slices.Contains(prevent, strconv.Itoa(cli.ExitConfig)) {
		t.Errorf("RestartPreventExitStatus=%v: exit %d (a refused configuration) would be restarted in a loop", prevent, cli.ExitConfig)
	}
	if slices.Contains(prevent, strconv.Itoa(cli.ExitFailure)) {
		t.Errorf("RestartPreventExitStatus=%v: exit %d (a database unavailable at start) would never be retried", prevent, cli.ExitFailure)
	}
	if got := strings.Join(keys["StartLimitIntervalSec"], " "); got != "0" {
		t.Errorf("StartLimitIntervalSec=%q: the default start limit (5 in 10 s) gives up on a database that is not up yet; want 0", got)
	}
}

// dashboardMetric matches a metric name in a PromQL expression of the
// dashboard (label names and functions have no such prefix).
var dashboardMetric = regexp.MustCompile(`\b((?:appview|process|go)_[a-zA-Z0-9_]+)`)

// TestGrafanaDashboardQueriesOnlyMetricsARunningInstanceExports loads
// deploy/grafana-dashboard.json and checks that every metric its panels
// query appears in /metrics of a running instance: a renamed
// metric breaks this test rather than a dashboard in production.
// Histograms are queried by their _bucket series, which is what is
// looked for. A series that exists only once something happened (a lease
// renewal, a webhook attempt) is waited for, up to a bound.
func TestGrafanaDashboardQueriesOnlyMetricsARunningInstanceExports(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(deployDir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	want := map[string]string{} // metric → panel
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range dashboardMetric.FindAllStringSubmatch(tg.Expr, -1) {
				want[m[1]] = p.Title
			}
		}
	}
	if len(want) < 20 {
		t.Fatalf("the dashboard queries %d metrics; the extraction is broken", len(want))
	}
	dir := t.TempDir()
	p := startServe(t, dir, childEnv("APPVIEW_ADMIN_ADDR=127.0.0.1:0", "APPVIEW_JETSTREAM_URLS=ws://127.0.0.1:1/subscribe",
		"APPVIEW_BACKFILL_RELAY_ENDPOINTS=http://127.0.0.1:1", "APPVIEW_IDENTITY_PLC_URL=http://127.0.0.1:1",
		"APPVIEW_LEASES_TTL=2s", "APPVIEW_LEASES_RENEW_INTERVAL=200ms", "APPVIEW_LEASES_RENEW_DEADLINE=1s", "APPVIEW_LEASES_RETRY_INTERVAL=200ms"))
	base := p.started()
	var missing []string
	exported := func() bool {
		_, body := get(base + "/metrics")
		names := map[string]bool{}
		for _, line := range strings.Split(body, "\n") {
			if line == "" || line[0] == '#' {
				continue
			}
			name, _, _ := strings.Cut(line, " ")
			name, _, _ = strings.Cut(name, "{")
			names[name] = true
		}
		missing = missing[:0]
		for m := range want {
			if !names[m] {
				missing = append(missing, m)
			}
		}
		return len(missing) == 0
	}
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * pollEvery)
	defer tick.Stop()
	for !exported() && time.Now().Before(deadline) && !p.exited() {
		<-tick.C
	}
	for _, m := range missing {
		t.Errorf("panel %q queries %s, which /metrics of a running instance does not export", want[m], m)
	}
}
