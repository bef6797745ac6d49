package lease

import (
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// standbyPauseFor is the pause between two reads of a standby.
const standbyPauseFor = 10 * time.Microsecond

// pauser spaces a standby's reads once it has run for standbySpin (see
// pause). time.Sleep cannot: its timers have a millisecond's granularity
// here (a 50 µs Sleep took 1.1 ms on the 2-core VM of
// docs/performance.md), and a nanosleep holds the goroutine's P in a
// system call, which starved the process's other goroutines (its admin
// endpoint's answer to the holder among them) for up to 10 ms, until the
// runtime's monitor took the P back. A timerfd read parks the goroutine
// on the network poller instead, for about 30 µs (10 µs asked).
type pauser struct {
	spins bool // yields for standbySpin before it pauses (newWatchPauser)
	fd    int
	f     *os.File
	b     [8]byte
}

// newPauser returns a pauser, or one that only yields the goroutine when
// the timerfd cannot be had.
func newPauser() *pauser {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return &pauser{fd: -1}
	}
	return &pauser{fd: fd, f: os.NewFile(uintptr(fd), "standby-timerfd")}
}

// pause spaces two reads: a spinning pauser, within standbySpin of the
// start, only yields the goroutine, so the process stays on its core and
// its acquire runs hot when the release lands (a pause between reads let
// the core go idle, and the acquire that followed took longer than the
// pause saved: graceful_handover_p50_ms 0.59–0.90 ms with pauses against
// 0.44–0.57 without, three alternating runs each); after it (giving the
// spin up), and for the process's other watches, a timerfd pause.
func (p *pauser) pause(elapsed time.Duration) {
	if p.spins && elapsed >= standbySpin {
		p.release()
	}
	if !p.spins && p.f != nil {
		spec := unix.ItimerSpec{Value: unix.NsecToTimespec(int64(standbyPauseFor))}
		if unix.TimerfdSettime(p.fd, 0, &spec, nil) == nil {
			if _, err := p.f.Read(p.b[:]); err == nil {
				return
			}
		}
	}
	runtime.Gosched()
}

func (p *pauser) close() {
	if p.f != nil {
		_ = p.f.Close()
	}
	p.release()
}
