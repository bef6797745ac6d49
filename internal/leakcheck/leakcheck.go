// Package leakcheck is goleak with the project's one standing exception:
// protoactor-go's dead-letter log throttle, a library goroutine that is
// started when a message reaches a stopped actor and ends on its own one
// throttle window (1 s) later. Everything else left running is a leak.
package leakcheck

import (
	"testing"

	"go.uber.org/goleak"
)

// Options are the project's goleak options plus extra.
func Options(extra ...goleak.Option) []goleak.Option {
	return append([]goleak.Option{
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	}, extra...)
}

// VerifyTestMain runs the package's tests and then fails if goroutines
// are left behind.
func VerifyTestMain(m *testing.M, extra ...goleak.Option) {
	goleak.VerifyTestMain(m, Options(extra...)...)
}

// VerifyNone fails t if goroutines other than those running when the test
// started are left behind; call it with defer or from t.Cleanup.
func VerifyNone(t testing.TB, extra ...goleak.Option) {
	t.Helper()
	goleak.VerifyNone(t, Options(extra...)...)
}
