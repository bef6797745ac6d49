package jetstream

import "encoding/json"

// Event kinds (the "kind" field).
const (
	KindCommit   = "commit"
	KindIdentity = "identity"
	KindAccount  = "account"
	// KindSync says a repository was resynchronised upstream: records may
	// have vanished without delete events (Jetstream v2 wire only).
	KindSync = "sync"
)

// Commit operations (the "commit.operation" field).
const (
	OpCreate = "create"
	OpUpdate = "update"
	OpDelete = "delete"
)

// Event is one Jetstream event, from either wire. Exactly one of Commit,
// Identity, Account and Sync is set, matching Kind.
type Event struct {
	// DID is the repository the event is about.
	DID string `json:"did"`
	// TimeUS is the server's own timestamp in Unix microseconds (when that
	// Jetstream instance witnessed the event; the v2 wire's "time"): a
	// time cursor on that server, and only a rough one on another.
	TimeUS int64 `json:"time_us"`
	// Seq is the server's sequence number (the "cursor" field of the
	// legacy wire as a Jetstream v2 server sends it, "seq" on the v2
	// wire): monotonic and 1-based per server instance, 0 when the server
	// (Jetstream v1) sends none. It means nothing to another instance.
	Seq      int64     `json:"cursor,omitempty"`
	Kind     string    `json:"kind"`
	Commit   *Commit   `json:"commit,omitempty"`
	Identity *Identity `json:"identity,omitempty"`
	Account  *Account  `json:"account,omitempty"`
	Sync     *Sync     `json:"sync,omitempty"`
	// Prepared is what ClientOptions.Prepare worked out for this event
	// ahead of delivery (the processor's decoded record), nil when nothing
	// was: never read from or written to the wire.
	Prepared any `json:"-"`
}

// Sync is the upstream #sync event: the repository's state was replaced
// (rev is its new revision); a consumer re-reads the repository.
type Sync struct {
	DID string `json:"did"`
	Rev string `json:"rev"`
	Seq int64  `json:"seq"`
	// Time is the upstream relay's time (RFC 3339).
	Time string `json:"time"`
}

// Commit is a record operation in a repository.
type Commit struct {
	Rev        string `json:"rev"`
	Operation  string `json:"operation"`
	Collection string `json:"collection"`
	RKey       string `json:"rkey"`
	// Record is the record as JSON; absent for deletes.
	Record json.RawMessage `json:"record,omitempty"`
	CID    string          `json:"cid,omitempty"`
}

// Identity reports a handle or DID document change.
type Identity struct {
	DID    string `json:"did"`
	Handle string `json:"handle,omitempty"`
	Seq    int64  `json:"seq"`
	Time   string `json:"time"`
}

// Account reports an account status change. Status is set when Active is
// false: takendown, suspended, deleted, deactivated, ...
type Account struct {
	// Active is required (com.atproto.sync.subscribeRepos#account): nil
	// when the frame did not carry it, which Validate refuses.
	Active *bool  `json:"active"`
	DID    string `json:"did"`
	Seq    int64  `json:"seq"`
	Time   string `json:"time"`
	Status string `json:"status,omitempty"`
}

// Collection is the commit's collection NSID, or "" for identity and account
// events (which is why they pass every wantedCollections filter).
func (e Event) Collection() string {
	if e.Commit == nil {
		return ""
	}
	return e.Commit.Collection
}
