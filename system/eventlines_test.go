package system

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/rs/zerolog"
)

func TestEveryCustodyEventLineHasAMessageBesideItsEvent(t *testing.T) {
	for _, k := range append(append([]lease.EventKind{}, lease.EventKinds...), lease.EventKind("lease.unknown")) {
		var buf bytes.Buffer
		zerolog.MessageFieldName = "msg"
		log := zerolog.New(&buf).Level(zerolog.DebugLevel).With().Timestamp().Logger()
		logEvent(log, lease.Event{Kind: k, Lease: "jetstream", Instance: "web-1", Fence: 3, Reason: lease.ReasonShutdown,
			Err: errors.New("boom"), At: time.Now()})
		var m map[string]any
		if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
			t.Fatalf("%s: not one JSON line: %v\n%s", k, err, buf.String())
		}
		if msg, _ := m["msg"].(string); msg == "" {
			t.Errorf("%s: no msg: %s", k, buf.String())
		}
		if m["event"] != string(k) {
			t.Errorf("%s: event = %v", k, m["event"])
		}
	}
}
