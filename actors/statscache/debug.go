package statscache

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/bluesky-social/indigo/atproto/syntax"

	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/processor"
	"github.com/atcr-io/appview/internal/workers"
)

// DebugPath is where the view is served on the admin endpoint:
// GET /debug/stats?did=DID&repository=NAME answers one repository's
// per-hold stats and totals as the StatsCache holds them.
const DebugPath = "/debug/stats"

// debugTimeout bounds how long /debug/stats waits for the actor's answer
// (it may be busy warming up).
const debugTimeout = 5 * time.Second

// New is the StatsCache's registration, handed to the consumer
// (consumer.Worker(statscache.New, pm)): it registers the cache's metrics on
// d.Metrics and its /debug/stats handler on d.Admin (when set), and returns
// the builder of its props for each grant of the consumer's custody. It
// returns the metrics registerer's error.
func New(d workers.Deps) (processor.StatsProps, error) {
	m, err := NewMetrics(d.Metrics)
	if err != nil {
		return nil, err
	}
	l := &live{instance: d.Instance}
	if d.Admin != nil {
		d.Admin.Handle(DebugPath, l)
	}
	return func(c fence.Custody) *actor.Props {
		return NewProps(Options{DB: d.DB, Custody: c, Log: d.Log, Metrics: m, live: l})
	}, nil
}

// live records the StatsCache actor currently running on this instance
// (at most one: it is the child of the consumer, which runs only where
// the jetstream-consumer lease is held), so the admin handler can ask it.
type live struct {
	instance string

	mu  sync.Mutex
	sys *actor.ActorSystem
	pid *actor.PID
}

// set records pid as the running cache; a nil *live ignores it.
func (l *live) set(sys *actor.ActorSystem, pid *actor.PID) {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.sys, l.pid = sys, pid
	l.mu.Unlock()
}

// clear forgets pid if it is still the recorded cache (a new grant's cache
// may already have replaced it).
func (l *live) clear(pid *actor.PID) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if l.pid != nil && l.pid.Equal(pid) {
		l.sys, l.pid = nil, nil
	}
	l.mu.Unlock()
}

func (l *live) current() (*actor.ActorSystem, *actor.PID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sys, l.pid
}

// holdJSON is one hold's numbers in /debug/stats.
type holdJSON struct {
	HoldDID   string `json:"hold_did"`
	PullCount int64  `json:"pull_count"`
	PushCount int64  `json:"push_count"`
	LastPull  *int64 `json:"last_pull,omitempty"`
	LastPush  *int64 `json:"last_push,omitempty"`
	UpdatedAt int64  `json:"updated_at"`
}

// statsJSON is the /debug/stats document: the same totals repository_stats
// holds, computed from the cache's in-memory view.
type statsJSON struct {
	Instance   string     `json:"instance"`
	Lease      string     `json:"lease"`
	Fence      int64      `json:"fence"`
	DID        string     `json:"did"`
	Repository string     `json:"repository"`
	PullCount  int64      `json:"pull_count"`
	PushCount  int64      `json:"push_count"`
	LastPull   *int64     `json:"last_pull,omitempty"`
	LastPush   *int64     `json:"last_push,omitempty"`
	Holds      []holdJSON `json:"holds"`
}

// errorJSON is the body of a /debug/stats refusal.
type errorJSON struct {
	Instance string `json:"instance"`
	Error    string `json:"error"`
}

// ServeHTTP answers GET /debug/stats?did=DID&repository=NAME from the
// running StatsCache: 400 for a query that cannot be decoded, without both
// parameters (or with either twice,
// a did that is not a DID, a blank repository), 503 when this instance
// runs no StatsCache (it does not hold the consumer's lease: ask the
// holder, see /debug/leases) or the cache did not answer in time.
func (l *live) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	// url.Values from r.URL.Query() drops a pair it cannot decode (a bad
	// %-escape, a semicolon), which then read as "required": name it.
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		l.write(w, http.StatusBadRequest, errorJSON{Instance: l.instance, Error: "query is not a valid URL query: " + truncate(err.Error())})
		return
	}
	did, repo, problem := statsQuery(q)
	if problem != "" {
		l.write(w, http.StatusBadRequest, errorJSON{Instance: l.instance, Error: problem})
		return
	}
	snap, err := l.get(did, repo)
	if err != nil {
		l.write(w, http.StatusServiceUnavailable, errorJSON{Instance: l.instance, Error: err.Error()})
		return
	}
	out := statsJSON{Instance: l.instance, Lease: snap.Custody.Lease, Fence: snap.Custody.Fence,
		DID: snap.OwnerDID, Repository: snap.Repository, PullCount: snap.PullCount, PushCount: snap.PushCount,
		LastPull: snap.LastPull, LastPush: snap.LastPush, Holds: holds(snap.Holds)}
	l.write(w, http.StatusOK, out)
}

// statsQuery reads the did and repository parameters of a /debug/stats
// request, or says in problem what is wrong with them: each is required
// once, did must be a DID by the AT Protocol syntax and repository must
// not be blank and must be a name a record can carry
// (processor.CheckRepository). A malformed DID can name no repository, and an answer
// for it (zero counts, 200) would read as "no pulls yet".
func statsQuery(q url.Values) (did, repo, problem string) {
	for _, name := range []string{"did", "repository"} {
		switch n := len(q[name]); {
		case n == 0:
			return "", "", "query parameters did and repository are required"
		case n > 1:
			return "", "", fmt.Sprintf("query parameter %s is given %d times; give it once", name, n)
		}
	}
	did, repo = q.Get("did"), q.Get("repository")
	if _, err := syntax.ParseDID(did); err != nil {
		return "", "", fmt.Sprintf("did %q is not a DID (want did:<method>:<id>, e.g. did:plc:abc123)", truncate(did))
	}
	if strings.TrimSpace(repo) == "" {
		return "", "", "query parameter repository is empty"
	}
	if err := processor.CheckRepository(repo); err != nil {
		// A name no record can carry: an answer (zero counts, 200) would
		// read as "no pulls yet".
		return "", "", fmt.Sprintf("no repository can have this name: %s", truncate(err.Error()))
	}
	return did, repo, ""
}

// truncate shortens s for an error message.
func truncate(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "..."
}

// errNoCache: this instance runs no StatsCache.
var errNoCache = errors.New("no StatsCache runs on this instance (it does not hold the jetstream-consumer lease)")

// get asks the running cache for one repository.
func (l *live) get(did, repo string) (*processor.StatsSnapshot, error) {
	sys, pid := l.current()
	if pid == nil {
		return nil, errNoCache
	}
	reply, err := sys.Root.RequestFuture(pid, &processor.GetStats{OwnerDID: did, Repository: repo}, debugTimeout).Result()
	if err != nil {
		return nil, fmt.Errorf("statscache did not answer: %w", err)
	}
	snap, ok := reply.(*processor.StatsSnapshot)
	if !ok {
		return nil, fmt.Errorf("statscache answered %T", reply)
	}
	return snap, nil
}

func holds(hs []processor.HoldStat) []holdJSON {
	out := make([]holdJSON, 0, len(hs))
	for _, h := range hs {
		out = append(out, holdJSON{HoldDID: h.HoldDID, PullCount: h.PullCount, PushCount: h.PushCount,
			LastPull: h.LastPull, LastPush: h.LastPush, UpdatedAt: h.UpdatedAt})
	}
	return out
}

func (l *live) write(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(body)
}
