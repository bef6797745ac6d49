package logval

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A sampled log passes burst lines a period, drops the rest, and says how
// many it dropped on the first line it passes in a later period.
func TestSampledSaysHowManyLinesItHeldBack(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(1_750_000_000, 0)
	l := zerolog.New(&buf)
	s := &countingSampler{burst: 2, period: time.Minute, what: "event skipped", report: l, now: func() time.Time { return clock }}
	sampled := l.Sample(s)
	for i := range 5 {
		sampled.Warn().Int("i", i).Msg("event skipped")
	}
	if got := strings.Count(buf.String(), `"message":"event skipped"`); got != 2 {
		t.Fatalf("%d lines in the first period, want the burst of 2:\n%s", got, buf.String())
	}
	if strings.Contains(buf.String(), "held_back") {
		t.Fatalf("a held-back count before the period ended:\n%s", buf.String())
	}
	buf.Reset()
	clock = clock.Add(time.Minute)
	sampled.Warn().Int("i", 5).Msg("event skipped")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want the held-back report then the line, got:\n%s", buf.String())
	}
	var report struct {
		Lines    string    `json:"lines"`
		HeldBack uint64    `json:"held_back"`
		Since    time.Time `json:"since"`
		Level    string    `json:"level"`
	}
	if err := json.Unmarshal([]byte(lines[0]), &report); err != nil {
		t.Fatal(err)
	}
	if report.HeldBack != 3 || report.Lines != "event skipped" || report.Level != "warn" || !report.Since.Equal(time.Unix(1_750_000_000, 0)) {
		t.Errorf("report %+v: want 3 held back since the first period's start", report)
	}
	if !strings.Contains(lines[1], `"i":5`) {
		t.Errorf("second line %s, want the new period's line", lines[1])
	}
	// A period with nothing dropped reports nothing.
	buf.Reset()
	clock = clock.Add(time.Minute)
	sampled.Warn().Msg("event skipped")
	if strings.Contains(buf.String(), "held_back") {
		t.Errorf("a report after a period that dropped nothing:\n%s", buf.String())
	}
}

func TestSampledWithoutALimitPassesEverything(t *testing.T) {
	var buf bytes.Buffer
	l := Sampled(zerolog.New(&buf), 0, time.Minute, "x")
	for range 50 {
		l.Warn().Msg("x")
	}
	if n := strings.Count(buf.String(), "\n"); n != 50 {
		t.Errorf("%d lines, want 50", n)
	}
}
