package main

// forcedExit is what watchLaterSignals does on a signal that comes too
// late to be part of the first request to stop: it logs msg at warn
// level, with the leases still held (held, when set: named in the last
// line, like an incomplete graceful stop), and calls exit (os.Exit; a
// test's recorder) with cli.ExitFailure.
type forcedExit struct {
	msg  string
	held func() []string
	exit func(int)
}
