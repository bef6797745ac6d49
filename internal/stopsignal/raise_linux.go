package stopsignal

import (
	"runtime"
	"syscall"
)

// raise sends sig to the calling thread, so that its action (the runtime
// kills the process, as it would have without Notify) is taken before
// raise returns: a signal sent to the process may be handled by another
// thread while this one runs on.
func raise(sig syscall.Signal) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_ = syscall.Tgkill(syscall.Getpid(), syscall.Gettid(), sig)
}
