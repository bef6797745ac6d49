package database

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// walWatch notices the database's write-ahead log (PATH-wal) being deleted
// or replaced under the process. SQLite keeps writing to the log it has
// open: once it is unlinked, every commit this process makes lands in a
// file no other process (and no restart) reads, so the commits are lost
// while the process reports success. SQLite itself deletes the log only
// when the last connection closes, after checkpointing it into the
// database, and creates a new one on the next open: that is told apart
// from a deletion under the process by asking whether the process still
// holds the old, unlinked log open (/proc/self/fd on Linux; elsewhere a
// changed log is taken as SQLite's own).
type walWatch struct {
	path string // the log's path, resolved as the kernel names open files
	mu   sync.Mutex
	seen os.FileInfo // the log last seen, nil when there was none
}

func newWALWatch(dbPath string) *walWatch {
	p := dbPath + "-wal"
	if abs, err := filepath.Abs(p); err == nil {
		p = abs
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		p = filepath.Join(dir, filepath.Base(p))
	}
	w := &walWatch{path: p}
	w.seen, _ = os.Stat(p)
	return w
}

// check returns an error wrapping ErrFileReplaced when the log this
// process writes is no longer the one at the path.
func (w *walWatch) check() error {
	now, err := os.Stat(w.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil // cannot tell (permissions): the main file's check still runs
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil && (w.seen == nil || os.SameFile(w.seen, now)) {
		w.seen = now
		return nil
	}
	if w.seen == nil && now == nil {
		return nil
	}
	if holdsDeleted(w.path) {
		return fmt.Errorf("%s: %w", w.path, ErrFileReplaced)
	}
	w.seen = now // SQLite's own new log (nil: none yet)
	return nil
}

// holdsDeleted reports whether this process has path open after it was
// unlinked (Linux names such a file "PATH (deleted)" in /proc/self/fd).
func holdsDeleted(path string) bool {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return false
	}
	want := path + " (deleted)"
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && target == want {
			return true
		}
	}
	return false
}
