//go:build !linux

package lease

import (
	"runtime"
	"time"
)

// pauser spaces a standby's reads; elsewhere than Linux it yields the
// goroutine (see standby_linux.go).
type pauser struct{}

func newPauser() *pauser { return &pauser{} }

func (*pauser) pause(time.Duration) { runtime.Gosched() }

func (*pauser) close() {}
