// This file is goleak with the project's standing exceptions:
// protoactor-go's dead-letter log throttle, a library goroutine that is
// started when a message reaches a stopped actor and ends on its own one
// throttle window (1 s) later; and the expiry janitor of each
// golang-lru/v2 expirable cache (two per identity.Resolver, under indigo's
// identity cache), which that library never stops (v2.0.7 has no Close):
// a process has one Resolver, tests build many. Everything else left
// running is a leak.
//
// goleak itself gives up after about 0.4 s of retries (v1.3.0 has no
// option to extend that); a goroutine that is on its way out (an HTTP
// connection's reader, an actor's mailbox) can take longer than that on a
// loaded -race host. The checks here go on looking for up to Settle.

package testsupport

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// LeakSettle is how long a check keeps looking before it reports the
// goroutines still running as leaked.
const LeakSettle = 5 * time.Second

// LeakOptions are the project's goleak options plus extra.
func LeakOptions(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		goleak.IgnoreTopFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"),
	}, extra...)
}

// FindLeaks returns nil once no goroutine is left behind (per Options(extra)),
// or goleak's error naming those still running after Settle.
func FindLeaks(extra ...goleak.Option) error {
	opts := LeakOptions(extra...)
	deadline := time.Now().Add(LeakSettle)
	for {
		// Each Find retries (and sleeps) for about 0.4 s before it errs.
		err := goleak.Find(opts...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
	}
}

// VerifyTestMain runs the package's tests and then, if they passed, fails
// the run (exit 1) if goroutines are left behind.
func VerifyTestMain(m *testing.M, extra ...goleak.Option) {
	code := m.Run()
	if code == 0 {
		if err := FindLeaks(extra...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: Errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// VerifyNone fails t if goroutines other than those running when the test
// started are left behind; call it with defer or from t.Cleanup.
func VerifyNone(t testing.TB, extra ...goleak.Option) {
	t.Helper()
	if err := FindLeaks(extra...); err != nil {
		t.Error(err)
	}
}
