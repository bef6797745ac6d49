package harness

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ev(ms int, inst, kind, lease string, fence int64) Event {
	return Event{Time: t0.Add(time.Duration(ms) * time.Millisecond), Instance: inst, Event: kind, Lease: lease, Fence: fence}
}

// logOf numbers one process's events as the Log would.
func logOf(evs ...Event) []Event {
	for i := range evs {
		evs[i].Seq = i
	}
	return evs
}

func TestCheckExclusiveAcceptsAHandoverWithinOneMillisecond(t *testing.T) {
	a := logOf(ev(0, "a", LeaseAcquired, "l", 1), ev(0, "a", WorkerStarted, "l", 1),
		ev(10, "a", WorkerStopped, "l", 1), ev(10, "a", LeaseReleased, "l", 1))
	b := logOf(ev(10, "b", LeaseAcquired, "l", 2), ev(10, "b", WorkerStarted, "l", 2))
	// b's log is listed first: the merge must still put a's stop first.
	tl := Merge(b, a)
	if err := CheckExclusive(tl, "l"); err != nil {
		t.Fatal(err)
	}
	if err := CheckFences(tl, map[string]int64{"l": 1}); err != nil {
		t.Fatal(err)
	}
}

func TestCheckExclusiveReportsTwoWorkersRunningAtOnce(t *testing.T) {
	a := logOf(ev(0, "a", WorkerStarted, "l", 1), ev(20, "a", WorkerStopped, "l", 1))
	b := logOf(ev(10, "b", WorkerStarted, "l", 2))
	err := CheckExclusive(Merge(a, b), "l")
	if err == nil || !strings.Contains(err.Error(), "two instances") {
		t.Fatalf("err = %v; want the overlap between a and b reported", err)
	}
}

func TestCheckExclusiveIgnoresUnleasedWorkers(t *testing.T) {
	a := logOf(ev(0, "a", WorkerStarted, "health", 0))
	b := logOf(ev(1, "b", WorkerStarted, "health", 0))
	if err := CheckExclusive(Merge(a, b), "l"); err != nil {
		t.Fatal(err)
	}
}

func TestAProcessExitEndsItsCustodyInTheTimeline(t *testing.T) {
	a := logOf(ev(0, "a", WorkerStarted, "l", 1), ev(5, "a", ProcessExited, "", 0))
	b := logOf(ev(2000, "b", WorkerStarted, "l", 2))
	if err := CheckExclusive(Merge(a, b), "l"); err != nil {
		t.Fatal(err)
	}
	a = logOf(ev(0, "a", WorkerStarted, "l", 1), ev(3000, "a", ProcessExited, "", 0))
	if err := CheckExclusive(Merge(a, b), "l"); err == nil {
		t.Fatal("a worker whose process was still alive overlapped another; want an error")
	}
}

func TestCheckFencesReportsASkippedOrRepeatedFence(t *testing.T) {
	a := logOf(ev(0, "a", LeaseAcquired, "l", 1), ev(0, "a", WorkerStarted, "l", 1))
	b := logOf(ev(10, "b", LeaseAcquired, "l", 3), ev(10, "b", WorkerStarted, "l", 3))
	if err := CheckFences(Merge(a, b), nil); err == nil {
		t.Fatal("fence 3 after 1 accepted")
	}
	b = logOf(ev(10, "b", LeaseAcquired, "l", 1))
	if err := CheckFences(Merge(a, b), nil); err == nil {
		t.Fatal("fence 1 granted twice accepted")
	}
	b = logOf(ev(10, "b", LeaseAcquired, "l", 2), ev(10, "b", WorkerStarted, "l", 1))
	if err := CheckFences(Merge(a, b), nil); err == nil {
		t.Fatal("a worker started under an old fence accepted")
	}
	if err := CheckFences(Merge(a), map[string]int64{"l": 2}); err == nil {
		t.Fatal("first fence 1 accepted where 2 was expected")
	}
}

func TestParseEventReadsSpecFieldsAndKeepsOtherLines(t *testing.T) {
	l := newLog()
	l.addLine(`{"level":"info","event":"lease.acquired","lease":"cleanup","instance":"a","fence":7,"at":"2026-11-29T09:50:06.790123Z","time":"2026-11-29T09:50:06.791Z"}`)
	l.addLine(`WARNING: DATA RACE`)
	evs := l.Events()
	if len(evs) != 1 || evs[0].Fence != 7 || evs[0].Lease != "cleanup" || evs[0].Instance != "a" ||
		!evs[0].Time.Equal(time.Date(2026, 11, 29, 9, 50, 6, 790123e3, time.UTC)) ||
		!evs[0].Logged.Equal(time.Date(2026, 11, 29, 9, 50, 6, 791e6, time.UTC)) {
		t.Fatalf("events %+v", evs)
	}
	if o := l.Other(); len(o) != 1 || o[0] != "WARNING: DATA RACE" {
		t.Fatalf("other lines %q", o)
	}
}

func TestLogWaitReturnsWhenTheProcessLogEnds(t *testing.T) {
	l := newLog()
	done := make(chan error, 1)
	go func() {
		_, err := l.Wait(t.Context(), Is(LeaseAcquired, "l"))
		done <- err
	}()
	l.addLine(`{"event":"lease.contended","lease":"l","time":"2026-11-29T09:50:06.791Z"}`)
	l.close()
	if err := <-done; err != ErrLogClosed {
		t.Fatalf("err = %v; want ErrLogClosed", err)
	}
}
