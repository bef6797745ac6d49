package system

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/actors/lease"
)

// A contender logs lease.contended at debug on every attempt and, once
// per grant it waits for, one info line with the holder and the time the
// grant has left; an acquire (or a new grant) starts over.
func TestTheFirstContendedAttemptOfEachGrantIsSaidAtInfo(t *testing.T) {
	var buf bytes.Buffer
	l := &eventLog{log: zerolog.New(&buf).Level(zerolog.InfoLevel), waiting: map[string]contendedGrant{}}
	contended := func(holder string, fence int64, left time.Duration) lease.Event {
		return lease.Event{Kind: lease.LeaseContended, Lease: "cleanup", Instance: "me", Holder: holder, Fence: fence, TimeLeft: left}
	}
	for _, e := range []lease.Event{
		contended("other", 4, 9*time.Second), // said
		contended("other", 4, 8*time.Second),
		contended("other", 4, 0),              // ran out: not waited for
		contended("third", 5, 15*time.Second), // said
		{Kind: lease.LeaseAcquired, Lease: "cleanup", Instance: "me", Fence: 6},
		contended("third", 5, 15*time.Second), // said again after custody in between
	} {
		l.write(e)
	}
	var said []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if m["event"] == nil {
			said = append(said, m["holder"].(string))
			if m["level"] != "info" || m["lease"] != "cleanup" || m["time_left_ms"] == nil {
				t.Errorf("waiting line %q: want info with lease, holder and time_left_ms", line)
			}
		}
	}
	if got := strings.Join(said, ","); got != "other,third,third" {
		t.Fatalf("waiting lines for holders %q, want other,third,third", got)
	}
}

// A row held by an unused grant of this instance's own (a late acquire
// being handed back) is not said to be another instance's.
func TestAContendedOwnLateGrantIsNotCalledAnotherInstances(t *testing.T) {
	var buf bytes.Buffer
	l := &eventLog{log: zerolog.New(&buf).Level(zerolog.InfoLevel), waiting: map[string]contendedGrant{}}
	l.write(lease.Event{Kind: lease.LeaseContended, Lease: "cleanup", Instance: "me", Holder: "me", Fence: 16,
		TimeLeft: 15 * time.Second, Reason: lease.ReasonStaleGrant})
	l.write(lease.Event{Kind: lease.LeaseContended, Lease: "backfill", Instance: "me", Holder: "other", Fence: 3,
		TimeLeft: 15 * time.Second})
	out := buf.String()
	own, other, _ := strings.Cut(out, "\n")
	if strings.Contains(own, "another instance") || !strings.Contains(own, "this instance's own") {
		t.Fatalf("own late grant said as %q", own)
	}
	if !strings.Contains(other, "another instance") {
		t.Fatalf("another instance's grant said as %q", other)
	}
}
