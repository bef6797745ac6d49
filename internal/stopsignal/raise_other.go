//go:build !linux

package stopsignal

import "syscall"

// raise sends sig to the process: its action is taken by whichever
// thread the system picks, possibly a moment after raise returns.
func raise(sig syscall.Signal) {
	_ = syscall.Kill(syscall.Getpid(), sig)
}
