package database

import (
	"io/fs"
	"testing"
)

func TestOfNamesEachKind(t *testing.T) {
	for m, want := range map[fs.FileMode]string{
		0o644:                             "a regular file",
		fs.ModeDir | 0o755:                "a directory",
		fs.ModeNamedPipe:                  "a FIFO",
		fs.ModeSocket:                     "a socket",
		fs.ModeDevice | fs.ModeCharDevice: "a character device",
		fs.ModeDevice:                     "a block device",
		fs.ModeIrregular:                  "a special file (?---------)",
	} {
		if got := FileKind(m); got != want {
			t.Errorf("Of(%v) = %q, want %q", m, got, want)
		}
	}
}
