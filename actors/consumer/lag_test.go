package consumer

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The lag was set when a batch committed, so a consumer that stopped
// committing (a stalled host, a stuck stream, a full disk) showed the
// last batch's lag for ever, and an alert on its growth never fired. It
// is now computed when scraped; 0 while no consumer runs here.
func TestCursorLagGrowsWhileNothingCommits(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(m.cursorLag); v != 0 {
		t.Fatalf("lag %v before any consumer ran, want 0", v)
	}
	m.committed(1, time.Millisecond, time.Now().Add(-90*time.Second).UnixMicro())
	if v := testutil.ToFloat64(m.cursorLag); v < 90 || v > 3600 {
		t.Fatalf("lag %v s, want about 90 s from a cursor 90 s old, whatever the time of the commit", v)
	}
	m.following(0)
	if v := testutil.ToFloat64(m.cursorLag); v != 0 {
		t.Fatalf("lag %v after the consumer stopped, want 0", v)
	}
}
