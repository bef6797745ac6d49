// Package stopsignal subscribes the process to SIGINT, SIGTERM and SIGHUP while
// it is being initialised, before main runs. Until a Go program calls
// signal.Notify, the runtime's own handler kills it on SIGTERM or SIGINT
// (status 143/130, no output); initialising the packages the appview
// binary links (drivers, Prometheus, the lexicons) takes milliseconds,
// tens under -race, so a stop sent right after the start killed `serve`
// instead of ending it cleanly. This package depends only on os/signal
// and what it needs, so its init runs right after theirs, ahead of
// those packages (GODEBUG=inittrace=1 shows the order); what is left
// before it is the runtime's own start, which no Go code can shorten.
//
// Import it from package main only: the program then either consumes
// the signals (Take) or gives them their default behaviour back
// (Release).
package stopsignal

import (
	"os"
	"os/signal"
	"syscall"
)

// sigs has received the stop signals (stops) since the process started. Two
// slots: two signals often arrive together as one request to stop.
var sigs = make(chan os.Signal, 2)

// ignoredAtStart are the signals the process started with ignored (SIGINT
// in a background job of a non-interactive shell): their default
// behaviour is to be ignored, which Notify ends until Release.
var ignoredAtStart = map[os.Signal]bool{}

// stops are the signals `serve` stops gracefully on: SIGINT, SIGTERM,
// and SIGHUP (a closed terminal, or kill -HUP: its default action killed
// the process with every lease still held, to run out its TTL) unless
// the process started with SIGHUP ignored (nohup), which keeps it
// ignored.
var stops = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

func init() {
	var taken []os.Signal
	for _, s := range stops {
		ignoredAtStart[s] = signal.Ignored(s)
		if s == syscall.SIGHUP && ignoredAtStart[s] {
			continue
		}
		taken = append(taken, s)
	}
	signal.Notify(sigs, taken...)
}

// TakeSignals returns the channel that has received the stop signals since the
// process started, for the command that stops on them (`appview serve`).
// A signal that arrived before the caller looked is waiting in it.
func TakeSignals() chan os.Signal { return sigs }

// ReleaseSignals gives the stop signals back the behaviour they would have had
// without this package, for a command that does not take them: the
// default action (terminate), or none when the signal was ignored at
// start (SIGINT in a background job of a non-interactive shell). A signal
// that arrived meanwhile is raised again, so it takes that action now.
// Call it at most once, before the command runs; do not use Take's
// channel afterwards.
func ReleaseSignals() {
	signal.Stop(sigs) // no more deliveries once it returns
	for {
		select {
		case s := <-sigs:
			if sig, ok := s.(syscall.Signal); ok && !ignoredAtStart[s] {
				raise(sig)
			}
		default:
			return
		}
	}
}
