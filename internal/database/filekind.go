// This file names what a file that is not a regular file is, for
// the refusals of paths an operator gives (a database file, a token
// file): "a directory", "a FIFO", "a character device", ...

package database

import "io/fs"

// FileKind names the kind of a file with mode m that is not a regular file:
// "a directory", "a FIFO", "a socket", "a character device", "a block
// device", else "a special file (MODE)"; "a regular file" for one.
func FileKind(m fs.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a block device"
	}
	return "a special file (" + m.Type().String() + ")"
}
