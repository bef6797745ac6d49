package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func TestEveryStepDeclaresItsFigures(t *testing.T) {
	for _, s := range Steps {
		if len(stepFigures[s]) == 0 {
			t.Errorf("step %s declares no figures", s)
		}
	}
	if len(stepFigures) != len(Steps) {
		t.Errorf("%d steps declare figures, %d steps exist", len(stepFigures), len(Steps))
	}
}

func TestOnlySelectsStepsAndFigures(t *testing.T) {
	for _, c := range []struct {
		only    []string
		steps   []string
		figures map[string][]string
	}{
		{nil, Steps, map[string][]string{}},
		{[]string{"ingest", "graceful"}, []string{"graceful", "ingest"}, map[string][]string{}},
		{[]string{"ingest_ratio"}, []string{"ingest"}, map[string][]string{"ingest": {"ingest_ratio"}}},
		{[]string{"ingest_ratio_max", "bare_rows_per_s"}, []string{"ingest"}, map[string][]string{"ingest": {"ingest_ratio", "bare_rows_per_s"}}},
		{[]string{"ingest_ratio_sqld"}, []string{"ingest-sqld"}, map[string][]string{"ingest-sqld": {"ingest_ratio_sqld"}}},
		{[]string{"renew_cost_ratio_100"}, []string{"renew-cost"}, map[string][]string{"renew-cost": {"renew_cost_ratio_100"}}},
		// A whole step wins over one of its figures.
		{[]string{"ingest_ratio", "ingest"}, []string{"ingest"}, map[string][]string{}},
		{[]string{"replay_1m_events_per_s"}, []string{"replay-1m"}, map[string][]string{"replay-1m": {"replay_1m_events_per_s"}}},
	} {
		sel, err := selectSteps(c.only)
		if err != nil {
			t.Errorf("selectSteps(%q): %v", c.only, err)
			continue
		}
		if !slices.Equal(sel.steps, c.steps) {
			t.Errorf("selectSteps(%q) steps %q, want %q", c.only, sel.steps, c.steps)
		}
		if len(sel.figures) != len(c.figures) {
			t.Errorf("selectSteps(%q) figures %q, want %q", c.only, sel.figures, c.figures)
		}
		for s, f := range c.figures {
			if !slices.Equal(sel.figures[s], f) {
				t.Errorf("selectSteps(%q) figures of %s %q, want %q", c.only, s, sel.figures[s], f)
			}
		}
	}
}

func TestOnlyRefusesAnUnknownName(t *testing.T) {
	for _, name := range []string{"ingest-ratio", "ratio", "", "ingest_rat"} {
		err := CheckOnly([]string{name})
		if err == nil || !strings.Contains(err.Error(), "ingest_ratio") {
			t.Errorf("CheckOnly(%q) = %v, want an error listing the figures", name, err)
		}
	}
}

func TestFiguresPrintTheMedianAndTheSpreadOfTheRuns(t *testing.T) {
	s := newFigureSet()
	for _, v := range []float64{0.7, 0.9, 0.5, 0.8, 0.6} {
		s.add("ingest_ratio", v, "ratio")
		s.add("ingest_events_per_s", v*1000, "events/s")
	}
	var all, one bytes.Buffer
	s.write(&all, nil)
	want := `ingest_ratio 0.700 ratio
ingest_ratio_min 0.500 ratio
ingest_ratio_max 0.900 ratio
ingest_events_per_s 700.000 events/s
ingest_events_per_s_min 500.000 events/s
ingest_events_per_s_max 900.000 events/s
`
	if all.String() != want {
		t.Errorf("write:\n%s\nwant:\n%s", all.String(), want)
	}
	s.write(&one, []string{"ingest_events_per_s"})
	if !strings.HasPrefix(one.String(), "ingest_events_per_s 700.000") || strings.Contains(one.String(), "ingest_ratio") {
		t.Errorf("write keeping ingest_events_per_s:\n%s", one.String())
	}
}
