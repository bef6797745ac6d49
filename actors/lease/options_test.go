package lease

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/fence"
)

// A LeaseActor is never built on timing that breaks the relations its
// guarantee rests on, whoever constructs it (config validates the same
// relations through the same Timing.Validate).
func TestNewPropsRefusesTimingThatBreaksARelation(t *testing.T) {
	worker := func(fence.Custody) *actor.Props { return actor.PropsFromFunc(func(actor.Context) {}) }
	bad := fastTiming
	bad.RenewDeadline = 3 * time.Second // beyond the 2 s TTL
	props, err := NewProps(Options{Name: "cleanup", Instance: "a", Timing: bad, Store: NewStore(nil, bad.TTL), Worker: worker})
	var te *config.TimingError
	if props != nil || !errors.As(err, &te) || te.Key != "leases.renew_deadline" || !strings.Contains(err.Error(), "must be less than leases.ttl (3s >= 2s)") {
		t.Fatalf("NewProps = %v, %v; want no props and the renew_deadline/ttl relation", props, err)
	}
	if _, err := NewProps(Options{Name: "cleanup", Instance: "a", Timing: fastTiming, Worker: worker}); err == nil {
		t.Fatal("NewProps accepted a leased worker without a store")
	}
	if _, err := NewProps(Options{Name: "cleanup", Instance: "a", Timing: fastTiming, Unleased: true, Worker: worker}); err != nil {
		t.Fatalf("NewProps refused an unleased worker without a store: %v", err)
	}
}
