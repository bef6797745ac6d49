//go:build !linux

package lease

import (
	"runtime"
	"time"
)

// pauser spaces a standby's reads; elsewhere than Linux it yields the
// goroutine (see standby_linux.go).
type pauser struct{ spins bool }

func newPauser() *pauser { return &pauser{} }

func (p *pauser) pause(elapsed time.Duration) {
	if p.spins && elapsed >= standbySpin {
		p.release()
	}
	runtime.Gosched()
}

func (p *pauser) close() { p.release() }
