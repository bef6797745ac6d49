package jetstream

import "encoding/json"

// Event kinds (the "kind" field).
const (
	KindCommit   = "commit"
	KindIdentity = "identity"
	KindAccount  = "account"
)

// Commit operations (the "commit.operation" field).
const (
	OpCreate = "create"
	OpUpdate = "update"
	OpDelete = "delete"
)

// Event is one Jetstream v1 event. Exactly one of Commit, Identity and
// Account is set, matching Kind.
type Event struct {
	// DID is the repository the event is about.
	DID string `json:"did"`
	// TimeUS is the Jetstream timestamp in Unix microseconds; it is the cursor.
	TimeUS   int64     `json:"time_us"`
	Kind     string    `json:"kind"`
	Commit   *Commit   `json:"commit,omitempty"`
	Identity *Identity `json:"identity,omitempty"`
	Account  *Account  `json:"account,omitempty"`
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
	Active bool   `json:"active"`
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
