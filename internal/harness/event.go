package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Event kinds of docs/spec.md §5 as they appear in the "event" field, plus the
// synthetic kind the harness adds when a process exits.
const (
	LeaseAcquired   = "lease.acquired"
	LeaseContended  = "lease.contended"
	LeaseRenewed    = "lease.renewed"
	LeaseLost       = "lease.lost"
	LeaseReleased   = "lease.released"
	WorkerStarted   = "worker.started"
	WorkerStopped   = "worker.stopped"
	WorkerFailed    = "worker.failed"
	WorkerRestarted = "worker.restarted"
	// ProcessExited is added by the harness (never logged by appview) at the
	// moment the harness saw the process end; Reason holds the exit status.
	ProcessExited = "process.exited"
)

// logTimeLayout parses docs/spec.md §5 times (RFC 3339 with milliseconds).
const logTimeLayout = time.RFC3339Nano

// Event is one JSON line of an appview process's stderr.
type Event struct {
	// Time is when the event happened: the custody event's "at"
	// (microseconds) where the line has one, else its "time".
	Time time.Time
	// Logged is the line's "time": when it was written (milliseconds).
	Logged time.Time
	// Seq is the line's position in its process's log (0-based).
	Seq      int
	Level    string
	Event    string
	Lease    string
	Instance string
	// Fence is 0 where the line carries none (unleased workers).
	Fence  int64
	Reason string
	Msg    string
	Error  string
	// Fields holds every field of the line, for the ones above and the rest
	// (e.g. "outcome" of a cleanup sweep, "admin" of "appview started").
	Fields map[string]json.RawMessage
	// Line is the raw line.
	Line string
}

// Str returns the string field key ("" when absent or not a string).
func (e Event) Str(key string) string {
	raw, ok := e.Fields[key]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", e.Time.Format("15:04:05.000"), e.Instance)
	if e.Event != "" {
		fmt.Fprintf(&b, " %s", e.Event)
	}
	if e.Lease != "" {
		fmt.Fprintf(&b, " lease=%s", e.Lease)
	}
	if e.Fence != 0 {
		fmt.Fprintf(&b, " fence=%d", e.Fence)
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " reason=%s", e.Reason)
	}
	if e.Event == "" && e.Msg != "" {
		fmt.Fprintf(&b, " %q", e.Msg)
	}
	return b.String()
}

// parseEvent decodes one log line. ok is false for a line that is not a
// JSON object with a parsable time (a panic trace, a race report).
func parseEvent(line string) (Event, bool) {
	var fields map[string]json.RawMessage
	if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &fields) != nil {
		return Event{}, false
	}
	var raw struct {
		Time     string `json:"time"`
		At       string `json:"at"`
		Level    string `json:"level"`
		Event    string `json:"event"`
		Lease    string `json:"lease"`
		Instance string `json:"instance"`
		Fence    int64  `json:"fence"`
		Reason   string `json:"reason"`
		Msg      string `json:"msg"`
		Error    string `json:"error"`
	}
	if json.Unmarshal([]byte(line), &raw) != nil {
		return Event{}, false
	}
	logged, err := time.Parse(logTimeLayout, raw.Time)
	if err != nil {
		return Event{}, false
	}
	t := logged
	if at, err := time.Parse(logTimeLayout, raw.At); err == nil {
		t = at
	}
	return Event{Time: t, Logged: logged, Level: raw.Level, Event: raw.Event, Lease: raw.Lease, Instance: raw.Instance,
		Fence: raw.Fence, Reason: raw.Reason, Msg: raw.Msg, Error: raw.Error, Fields: fields, Line: line}, true
}

// Match selects events.
type Match func(Event) bool

// Is matches events of kind for lease ("" matches any lease).
func Is(kind, lease string) Match {
	return func(e Event) bool { return e.Event == kind && (lease == "" || e.Lease == lease) }
}

// Msg matches lines whose "msg" is msg.
func Msg(msg string) Match { return func(e Event) bool { return e.Msg == msg } }

// Fence matches events that carry fence f.
func Fence(f int64) Match { return func(e Event) bool { return e.Fence == f } }

// Or matches events any m matches.
func Or(ms ...Match) Match {
	return func(e Event) bool {
		for _, m := range ms {
			if m(e) {
				return true
			}
		}
		return false
	}
}

// And matches events every m matches.
func And(ms ...Match) Match {
	return func(e Event) bool {
		for _, m := range ms {
			if !m(e) {
				return false
			}
		}
		return true
	}
}

// ErrLogClosed is returned by Log.Wait when the process's stderr ended (it
// exited) before a matching event arrived.
var ErrLogClosed = errors.New("process log ended")

// Log is the growing list of events of one process. It is safe for
// concurrent use: one goroutine appends, any number wait.
type Log struct {
	mu     sync.Mutex
	events []Event
	other  []string
	wake   chan struct{}
	closed bool
}

func newLog() *Log { return &Log{wake: make(chan struct{})} }

func (l *Log) addLine(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := parseEvent(line); ok {
		e.Seq = len(l.events)
		l.events = append(l.events, e)
	} else {
		l.other = append(l.other, line)
	}
	close(l.wake)
	l.wake = make(chan struct{})
}

func (l *Log) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	close(l.wake)
	l.wake = make(chan struct{})
}

// Events returns a copy of every event so far.
func (l *Log) Events() []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Event(nil), l.events...)
}

// Len is the number of events so far; pass it to WaitFrom to wait only for
// what comes next.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

// Other returns the lines that were not JSON events (panics, race reports).
func (l *Log) Other() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.other...)
}

// Find returns every event from index from on that m matches.
func (l *Log) Find(from int, m Match) []Event {
	var out []Event
	for _, e := range l.Events()[min(from, l.Len()):] {
		if m(e) {
			out = append(out, e)
		}
	}
	return out
}

// Wait returns the first event (from the start of the log) that m matches.
func (l *Log) Wait(ctx context.Context, m Match) (Event, error) { return l.WaitFrom(ctx, 0, m) }

// WaitFrom returns the first event at index from or later that m matches,
// waiting for it. It returns ErrLogClosed when the process's log ends
// first and ctx.Err() when ctx ends first.
func (l *Log) WaitFrom(ctx context.Context, from int, m Match) (Event, error) {
	for {
		l.mu.Lock()
		for i := from; i < len(l.events); i++ {
			if m(l.events[i]) {
				e := l.events[i]
				l.mu.Unlock()
				return e, nil
			}
		}
		from = max(from, len(l.events))
		closed, wake := l.closed, l.wake
		l.mu.Unlock()
		if closed {
			return Event{}, ErrLogClosed
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}
