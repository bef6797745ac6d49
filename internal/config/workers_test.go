package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// digestKeys are the keys of a worker registered with its own section.
var digestKeys = WorkerKeys{Section: "digest", Enabled: true, Interval: 24 * time.Hour, MinInterval: time.Minute,
	Why: "a digest more often than every minute is noise", About: "writes a digest row"}

// A registered worker's keys are keys like the built-in ones: defaults,
// the file (with its line), the environment and --set, in that order of
// precedence.
func TestARegisteredWorkersKeysComeFromEverySource(t *testing.T) {
	workers := []WorkerKeys{digestKeys}
	cfg, err := Load(Sources{Workers: workers})
	if w, ok := cfg.Worker("digest"); err != nil || !ok || !w.Enabled || w.Interval != 24*time.Hour {
		t.Fatalf("defaults: %+v %v %v, want enabled every 24h", w, ok, err)
	}
	origins := map[string]string{}
	file := writeFile(t, "digest:\n  enabled: false\n  interval: 2h\n")
	cfg, err = Load(Sources{File: file, Environ: []string{"APPVIEW_DIGEST_INTERVAL=3h"}, Workers: workers, Origins: origins})
	if w, _ := cfg.Worker("digest"); err != nil || w.Enabled || w.Interval != 3*time.Hour ||
		origins["digest.enabled"] != "line 2" || origins["digest.interval"] != "from APPVIEW_DIGEST_INTERVAL" {
		t.Fatalf("file then environment: %+v %v, origins %v", w, err, origins)
	}
	cfg, err = Load(Sources{File: file, Environ: []string{"APPVIEW_DIGEST_INTERVAL=3h"}, Sets: []string{"digest.interval=90m", "digest.enabled=true"}, Workers: workers})
	if w, _ := cfg.Worker("digest"); err != nil || !w.Enabled || w.Interval != 90*time.Minute {
		t.Fatalf("--set last: %+v %v", w, err)
	}
	if _, ok := Default().Worker("digest"); ok {
		t.Fatal("Default has a worker section")
	}
}

// Its interval has a floor and must be positive (0 only for a worker
// that runs once), refused in the words of every other key.
func TestARegisteredWorkersIntervalIsRefusedLikeAnyKey(t *testing.T) {
	once := digestKeys
	once.Section, once.Once, once.Interval = "snapshot", true, 0
	workers := []WorkerKeys{digestKeys, once}
	for _, tc := range []struct {
		src  Sources
		want string // "" accepted
	}{
		{Sources{Sets: []string{"digest.interval=1s"}}, "config: digest.interval: must be at least 1m (a digest more often than every minute is noise), got 1s (from --set)"},
		{Sources{Environ: []string{"APPVIEW_DIGEST_INTERVAL=0s"}}, "config: digest.interval: must be positive (from APPVIEW_DIGEST_INTERVAL)"},
		{Sources{Sets: []string{"digest.interval=-1h"}}, "config: digest.interval: must not be negative (from --set)"},
		{Sources{Sets: []string{"digest.interval=soon"}}, `config: digest.interval: unparsable duration "soon" (want e.g. 500ms, 15s, 2m, 24h) (from --set)`},
		{Sources{Sets: []string{"digest.enabled=yes"}}, `config: digest.enabled: expected true or false, got "yes" (from --set)`},
		{Sources{Sets: []string{"digest.intervall=1h"}}, "config: digest.intervall: unknown key (did you mean digest.interval?) (from --set)"},
		{Sources{Sets: []string{"digest=1h"}}, "config: digest: a section, not a value: set one of its keys (digest.enabled, digest.interval)"},
		{Sources{File: writeFile(t, "digest:\n  every: 1h\n")}, "config: digest.every: unknown key (line 2)"},
		{Sources{Sets: []string{"snapshot.interval=0"}}, ""},
		{Sources{Sets: []string{"snapshot.interval=10ms"}}, "config: snapshot.interval: must be at least 1m (a digest more often than every minute is noise), got 10ms (from --set)"},
	} {
		tc.src.Workers = workers
		_, err := Load(tc.src)
		if got := fmt.Sprint(err); (tc.want == "" && err != nil) || (tc.want != "" && got != tc.want) {
			t.Errorf("%+v: %v, want %q", tc.src, err, tc.want)
		}
	}
	// Without its registration the section is no key at all.
	if _, err := Load(Sources{Sets: []string{"digest.interval=1h"}}); err == nil || !strings.Contains(err.Error(), "config: digest.interval: unknown key") {
		t.Errorf("digest.interval without the worker registered: %v, want unknown key", err)
	}
}

// `config init`'s output with registered workers loads to their
// defaults; without any it is Sample, unchanged.
func TestTheSampleOfRegisteredWorkersLoadsToTheirDefaults(t *testing.T) {
	if SampleFor(nil) != Sample {
		t.Fatal("SampleFor(nil) is not Sample")
	}
	once := digestKeys
	once.Section, once.Once, once.Interval, once.Enabled = "snapshot", true, 0, false
	workers := []WorkerKeys{digestKeys, once}
	sample := SampleFor(workers)
	for _, line := range []string{
		"digest:                         # writes a digest row\n  enabled: true\n  interval: 24h                 # how often it runs (>= 1m)\n",
		"snapshot:                       # writes a digest row\n  enabled: false\n  interval: 0s                  # 0: once, when first granted (lease then held); >0: periodic (>= 1m)\n",
	} {
		if !strings.Contains(sample, line) {
			t.Errorf("the sample lacks\n%s\ngot the tail\n%s", line, sample[len(Sample):])
		}
	}
	cfg, err := Load(Sources{File: writeFile(t, sample), Workers: workers})
	want, _ := withWorkers(Default(), workers)
	cfg.InstanceID = ""
	if err != nil || fmt.Sprint(cfg) != fmt.Sprint(want) {
		t.Fatalf("the sample loads to\n%+v (%v)\nwant\n%+v", cfg, err, want)
	}
}

// A registration whose section cannot be a worker's is refused naming
// the section: a programming error, found by the first Load.
func TestABadWorkerRegistrationIsRefused(t *testing.T) {
	for _, tc := range []struct {
		keys []WorkerKeys
		want string
	}{
		{[]WorkerKeys{{Section: "cleanup", Interval: time.Hour, MinInterval: time.Second}}, "config: cleanup: worker section is taken"},
		{[]WorkerKeys{digestKeys, digestKeys}, "config: digest: worker section is taken"},
		{[]WorkerKeys{{Section: "Daily-Digest", Interval: time.Hour, MinInterval: time.Second}}, "config: Daily-Digest: worker section name must match"},
		{[]WorkerKeys{{Section: "digest", Interval: time.Hour}}, "config: digest: worker section declares no MinInterval"},
		{[]WorkerKeys{{Section: "digest", Interval: time.Second, MinInterval: time.Minute}}, "config: digest: worker section's default interval 1s is below its MinInterval 1m0s"},
	} {
		if _, err := Load(Sources{Workers: tc.keys}); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.keys, err, tc.want)
		}
	}
}
