package main

import (
	"time"

	"github.com/prometheus/procfs"
)

// cpuSample is the CPU time the whole host, and this process with the
// processes it measures, had used at one moment (Linux /proc/stat and
// /proc/PID/stat, through procfs).
type cpuSample struct {
	host, self time.Duration
	ok         bool
}

// sampleCPU reads the host's busy time (user, nice, system, irq, softirq
// and steal over every CPU: steal is a hypervisor's other guests) and the
// user and system time of this process and of pids (the processes under
// measurement). ok is false where /proc cannot be read.
func sampleCPU(pids ...int) cpuSample {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return cpuSample{}
	}
	st, err := fs.Stat()
	if err != nil {
		return cpuSample{}
	}
	p, err := fs.Self()
	if err != nil {
		return cpuSample{}
	}
	ps, err := p.Stat()
	if err != nil {
		return cpuSample{}
	}
	self := ps.CPUTime()
	for _, pid := range pids {
		p, err := fs.Proc(pid)
		if err != nil {
			return cpuSample{}
		}
		ps, err := p.Stat()
		if err != nil {
			return cpuSample{}
		}
		self += ps.CPUTime()
	}
	c := st.CPUTotal
	busy := c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
	return cpuSample{host: seconds(busy), self: seconds(self), ok: true}
}

// others returns the CPU time other processes (than those sampled) used
// between s and a later sample, as a share of one CPU over wall (1 = a whole CPU), and whether
// both samples were read. The host counts in clock ticks (10 ms), so a
// share over a short wall time is coarse.
func (s cpuSample) others(later cpuSample, wall time.Duration) (float64, bool) {
	if !s.ok || !later.ok || wall <= 0 {
		return 0, false
	}
	used := (later.host - s.host) - (later.self - s.self)
	return max(0, used.Seconds()/wall.Seconds()), true
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
