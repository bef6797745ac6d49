package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// DefaultRepeat is how many times Run runs each selected step when
// Options.Repeat is 0: one noisy run must not decide a target, so every
// figure is the median of at least this many runs.
const DefaultRepeat = 5

// stepFigures names the figures each step writes (see the package doc).
// A name given to --only that is not a step selects the step that writes
// it and keeps only that figure (see selection).
var stepFigures = map[string][]string{
	"graceful":        {"graceful_handover_p50_ms", "graceful_handover_p99_ms", "graceful_handover_rtt_ratio"},
	"rtt-file":        {"acquire_rtt_p50_ms_file", "renew_rtt_p50_ms_file"},
	"rtt-sqld":        {"acquire_rtt_p50_ms_sqld", "renew_rtt_p50_ms_sqld"},
	"graceful-sqld":   {"graceful_handover_p50_ms_sqld", "graceful_handover_p99_ms_sqld", "graceful_handover_rtt_ratio_sqld"},
	"crash":           {"crash_handover_minus_ttl_p50_ms"},
	"renew-cost":      {"renew_cost_ratio", "renew_cost_ratio_100", "renew_cost_ratio_5"},
	"rss":             {"idle_rss_mb"},
	"ingest":          {"ingest_ratio", "ingest_cpu_ratio", "ingest_events_per_s", "bare_rows_per_s"},
	"ingest-sqld":     {"ingest_ratio_sqld", "ingest_cpu_ratio_sqld", "ingest_events_per_s_sqld", "bare_rows_per_s_sqld"},
	"replay-1m":       {"replay_1m_rss_mb_at_10pct", "replay_1m_rss_mb_at_50pct", "replay_1m_rss_mb_at_100pct", "replay_1m_rss_growth_ratio", "replay_1m_events_per_s"},
	"replay-serve":    {"replay_serve_events_per_s"},
	"jetstream-close": {"jetstream_close_p50_ms_silent", "jetstream_close_p99_ms_silent", "jetstream_close_p50_ms_blocked", "jetstream_close_p99_ms_blocked"},
}

// selection is what --only asked for: the steps to run and, per step, the
// figures to print (nil: all of them).
type selection struct {
	steps   []string
	figures map[string][]string
}

// selectSteps resolves the names given to --only (none: every step, every
// figure). A name is a step (all its figures), a figure of stepFigures, or
// a figure of one with a suffix after "_" (e.g. a per-size variant
// "renew_cost_ratio_100"): that step runs and prints only the figures
// named. An unknown name is an error naming the valid ones.
func selectSteps(only []string) (selection, error) {
	sel := selection{figures: map[string][]string{}}
	if len(only) == 0 {
		sel.steps = slices.Clone(Steps)
		return sel, nil
	}
	whole := map[string]bool{}
	for _, name := range only {
		name = strings.TrimSpace(name)
		if slices.Contains(Steps, name) {
			whole[name] = true
			continue
		}
		// A spread line's name selects its figure.
		if base, ok := strings.CutSuffix(name, "_min"); ok && stepOf(base) != "" {
			name = base
		} else if base, ok := strings.CutSuffix(name, "_max"); ok && stepOf(base) != "" {
			name = base
		}
		step := stepOf(name)
		if step == "" {
			return selection{}, fmt.Errorf("%q is not a step (%s) nor one of their figures (%s)",
				name, strings.Join(Steps, ", "), strings.Join(allFigures(), ", "))
		}
		if !slices.Contains(sel.figures[step], name) {
			sel.figures[step] = append(sel.figures[step], name)
		}
	}
	for _, s := range Steps { // Run's order, whatever the order asked
		if whole[s] {
			delete(sel.figures, s)
		}
		if whole[s] || sel.figures[s] != nil {
			sel.steps = append(sel.steps, s)
		}
	}
	return sel, nil
}

// stepOf returns the step that writes figure name, "" for none.
// An exact name wins over a prefix: ingest_ratio_sqld is the ingest-sqld
// step's, not a variant of ingest_ratio.
func stepOf(name string) string {
	for _, s := range Steps {
		if slices.Contains(stepFigures[s], name) {
			return s
		}
	}
	for _, s := range Steps {
		for _, f := range stepFigures[s] {
			if strings.HasPrefix(name, f+"_") {
				return s
			}
		}
	}
	return ""
}

func allFigures() []string {
	var out []string
	for _, s := range Steps {
		out = append(out, stepFigures[s]...)
	}
	return out
}

// figureSet collects the values one step wrote over its repeated runs, in
// the order the figures first appeared.
type figureSet struct {
	names  []string
	units  map[string]string
	values map[string][]float64
}

func newFigureSet() *figureSet {
	return &figureSet{units: map[string]string{}, values: map[string][]float64{}}
}

func (s *figureSet) add(name string, value float64, unit string) {
	if _, ok := s.units[name]; !ok {
		s.names = append(s.names, name)
		s.units[name] = unit
	}
	s.values[name] = append(s.values[name], value)
}

// write prints, for each figure kept (keep nil: all), "name median unit",
// then "name_min min unit" and "name_max max unit" over the runs: the
// median decides a target, the spread shows how far one run can be off.
func (s *figureSet) write(w io.Writer, keep []string) {
	for _, name := range s.names {
		if keep != nil && !slices.Contains(keep, name) {
			continue
		}
		vs, unit := s.values[name], s.units[name]
		fmt.Fprintf(w, "%s %.3f %s\n", name, median(vs), unit)
		fmt.Fprintf(w, "%s_min %.3f %s\n", name, slices.Min(vs), unit)
		fmt.Fprintf(w, "%s_max %.3f %s\n", name, slices.Max(vs), unit)
	}
}

// CheckOnly reports whether every name in only is a step or a figure
// (what Options.Only accepts), so a command can refuse a bad --only
// before anything runs; the error names the valid names.
func CheckOnly(only []string) error {
	_, err := selectSteps(only)
	return err
}
