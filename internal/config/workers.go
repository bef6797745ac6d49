package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"time"
)

// WorkerKeys declares the section of a worker that owns one
// (workers.Registration.Keys): <Section>.enabled and <Section>.interval.
// Given to Load (Sources.Workers), they are keys like every other:
// defaults from here, then the file, APPVIEW_<SECTION>_ENABLED and
// APPVIEW_<SECTION>_INTERVAL, --set; refused below MinInterval with the
// one-line refusal of every floor; written by `config init`
// (SampleFor) and shown by `config show`. The values are in
// Config.Workers.
type WorkerKeys struct {
	// Section names the section: lower-case letters, digits and '_',
	// not a section of Config.
	Section string
	// Enabled is the default of <Section>.enabled.
	Enabled bool
	// Interval is the default of <Section>.interval: how often the
	// worker's Job runs.
	Interval time.Duration
	// MinInterval is the least positive <Section>.interval accepted; a
	// shorter one is refused at start as "must be at least MinInterval
	// (Why), got ...". Positive.
	MinInterval time.Duration
	// Why says what a shorter interval would do; empty: "a shorter
	// interval runs the job with no pause".
	Why string
	// Once accepts <Section>.interval 0: the Job runs once, when the
	// lease is first granted, and the lease is then held idle. Without
	// it 0 is refused.
	Once bool
	// About is the comment on the section's line in `config init`'s
	// output: what the worker does, in a few words.
	About string
}

// WorkerConfig is the section of a registered worker: what it declared
// and the values loaded for it.
type WorkerConfig struct {
	Keys     WorkerKeys    `yaml:"-"`
	Enabled  bool          `yaml:"enabled"`
	Interval time.Duration `yaml:"interval"`
}

// Worker returns the section of the registered worker section, and
// whether there is one (Load was given its WorkerKeys).
func (c Config) Worker(section string) (WorkerConfig, bool) {
	for _, w := range c.Workers {
		if w.Keys.Section == section {
			return w, true
		}
	}
	return WorkerConfig{}, false
}

// workerSection is what a WorkerKeys.Section may be.
var workerSection = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

// withWorkers returns cfg with a section for each of keys at its
// defaults, and the problems of keys themselves (a programming error of
// the registration: a bad or taken section name, no floor, a default
// below it), each about the section.
func withWorkers(cfg Config, keys []WorkerKeys) (Config, Problems) {
	var p problemList
	taken := map[string]bool{}
	for _, f := range fieldsOf(reflect.ValueOf(&cfg).Elem()) {
		taken[f.name] = true
	}
	for _, k := range keys {
		switch {
		case !workerSection.MatchString(k.Section):
			p.fail(k.Section, "worker section name must match %s", workerSection)
		case taken[k.Section]:
			p.fail(k.Section, "worker section is taken (a built-in section, or registered twice)")
		case k.MinInterval <= 0:
			p.fail(k.Section, "worker section declares no MinInterval")
		case k.Interval < k.MinInterval && !(k.Once && k.Interval == 0):
			p.fail(k.Section, "worker section's default interval %s is below its MinInterval %s", k.Interval, k.MinInterval)
		default:
			taken[k.Section] = true
			cfg.Workers = append(cfg.Workers, WorkerConfig{Keys: k, Enabled: k.Enabled, Interval: k.Interval})
		}
	}
	return cfg, p.list
}

// checkWorkers checks each registered worker's interval (its floor is
// one of durationFloors).
func (c Config) checkWorkers(p *problemList) {
	for _, w := range c.Workers {
		key := w.Keys.Section + ".interval"
		switch {
		case w.Interval < 0:
			p.fail(key, "must not be negative")
		case w.Interval == 0 && !w.Keys.Once:
			p.fail(key, "must be positive")
		}
	}
}

// workerFloors are the floors of the registered workers' intervals.
func (c Config) workerFloors() []durationFloor {
	var out []durationFloor
	for _, w := range c.Workers {
		why := w.Keys.Why
		if why == "" {
			why = "a shorter interval runs the job with no pause"
		}
		out = append(out, durationFloor{w.Keys.Section + ".interval", w.Interval, w.Keys.MinInterval, why})
	}
	return out
}

// SampleFor is Sample followed by a section for each of workers, at its
// defaults: what `config init` writes. Loading it with the same workers
// yields the defaults.
func SampleFor(workers []WorkerKeys) string {
	var b strings.Builder
	b.WriteString(Sample)
	for _, k := range workers {
		interval := fmt.Sprintf("how often it runs (>= %s)", short(k.MinInterval))
		if k.Once {
			interval = fmt.Sprintf("0: once, when first granted (lease then held); >0: periodic (>= %s)", short(k.MinInterval))
		}
		fmt.Fprintf(&b, "\n%s\n", sampleLine(k.Section+":", k.About))
		fmt.Fprintf(&b, "%s\n", sampleLine(fmt.Sprintf("  enabled: %t", k.Enabled), ""))
		fmt.Fprintf(&b, "%s\n", sampleLine("  interval: "+short(k.Interval), interval))
	}
	return b.String()
}

// sampleLine is a line of the sample: text, and comment (if any) in
// column 33 as the sample's own comments are.
func sampleLine(text, comment string) string {
	if comment == "" {
		return text
	}
	return fmt.Sprintf("%-31s # %s", text, comment)
}
