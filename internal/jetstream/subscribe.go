package jetstream

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/atcr-io/appview/internal/atproto"
)

// messageTypeOptionsUpdate is the "type" of the only subscriber-sourced
// message Jetstream v1 defines (pkg/models SubMessageOptionsUpdate).
const messageTypeOptionsUpdate = "options_update"

// Jetstream v1 limits on one subscription (pkg/server parseSubscriberOptions).
const (
	maxWantedCollections = 100
	maxWantedDIDs        = 10_000
)

// subscriberMessage is a text message a subscriber sends on the socket.
type subscriberMessage struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// optionsUpdate is the payload of an options_update message. It replaces
// the connection's filters; Jetstream fixes cursor and compression at
// connect time.
type optionsUpdate struct {
	WantedCollections []string `json:"wantedCollections"`
	WantedDIDs        []string `json:"wantedDids"`
	// MaxMessageSizeBytes makes the server skip events larger than this
	// (bytes, as sent: compressed size with compress=true); 0 = no limit.
	MaxMessageSizeBytes int `json:"maxMessageSizeBytes"`
}

// encodeOptionsUpdate builds the options_update text message for a
// collection filter. wantedDids and maxMessageSizeBytes are sent empty: the
// consumer filters by collection only, and it counts oversized frames itself
// rather than letting the server drop them unseen.
func encodeOptionsUpdate(collections []string) ([]byte, error) {
	if collections == nil {
		collections = []string{}
	}
	payload, err := json.Marshal(optionsUpdate{WantedCollections: collections, WantedDIDs: []string{}})
	if err != nil {
		return nil, err
	}
	return json.Marshal(subscriberMessage{Type: messageTypeOptionsUpdate, Payload: payload})
}

// ValidCollection reports whether s is a wantedCollections value Jetstream
// accepts: an NSID or an NSID prefix ending in ".*" (atproto.ValidPattern).
func ValidCollection(s string) bool { return atproto.ValidNSIDPattern(s) }

// collectionFilter is a parsed wantedCollections list.
type collectionFilter struct {
	// all is true when no collection was asked for: everything passes.
	all      bool
	exact    map[string]bool
	prefixes []string
}

// newCollectionFilter parses a wantedCollections list by Jetstream's rules
// (each an NSID or prefix.*, at most maxWantedCollections entries): the
// client refuses what Jetstream would answer with HTTP 400, and the replay
// server refuses it as Jetstream does.
func newCollectionFilter(wanted []string) (collectionFilter, error) {
	if len(wanted) == 0 {
		return collectionFilter{all: true}, nil
	}
	if len(wanted) > maxWantedCollections {
		return collectionFilter{}, fmt.Errorf("%d wantedCollections, Jetstream accepts at most %d", len(wanted), maxWantedCollections)
	}
	f := collectionFilter{exact: map[string]bool{}}
	for _, w := range wanted {
		if !ValidCollection(w) {
			return collectionFilter{}, fmt.Errorf("collection %q is not an NSID or NSID prefix ending in .*", w)
		}
		if p, ok := strings.CutSuffix(w, "*"); ok {
			// Keep the dot: "io.atcr.*" matches "io.atcr.tag", not "io.atcrx.tag".
			f.prefixes = append(f.prefixes, p)
			continue
		}
		f.exact[w] = true
	}
	return f, nil
}

// wants applies Jetstream's rule: an event without a collection (identity,
// account) passes every filter.
func (f collectionFilter) wants(collection string) bool {
	if f.all || collection == "" || f.exact[collection] {
		return true
	}
	for _, p := range f.prefixes {
		if strings.HasPrefix(collection, p) {
			return true
		}
	}
	return false
}
