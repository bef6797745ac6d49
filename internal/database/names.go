package database

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// oneName refuses a database file that can be reached under another name
// whose WAL another instance would use. SQLite keeps a file database's
// write-ahead log and shared memory beside the name it was opened under
// (PATH-wal, PATH-shm), so two instances opening one file under two
// names each see their own database: both hold the same lease, and the
// file is corrupted (found by a new user: "database disk image is
// malformed"). Two cases are told apart, both refused:
//
//   - a hard link: the file has more than one name (its link count);
//   - a bind mount of the file alone (a container's -v host/appview.db:
//     /data/appview.db): the path is a mount point of its own, and each
//     container keeps its WAL in its own directory. Mount the directory.
//
// A symbolic link is safe: SQLite resolves it and keeps the WAL beside
// the target. st is the file's os.Stat; path its name as configured.
func oneName(path string, st fs.FileInfo) error {
	if s, ok := st.Sys().(*syscall.Stat_t); ok && uint64(s.Nlink) > 1 {
		return fmt.Errorf("database file %s has %d names (hard links): SQLite keeps its WAL beside each name, so instances opening it under two names would each see their own database and corrupt the file; use one name (a symbolic link is fine)", path, s.Nlink)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil // SQLite will say what is wrong with it
	}
	if real, err = filepath.Abs(real); err != nil {
		return nil
	}
	if mountPoint(real) {
		return fmt.Errorf("database file %s is a mount point of its own (a bind mount of the file alone): SQLite keeps its WAL beside it, where instances mounting the same file elsewhere cannot see it, and they would corrupt it; mount its directory instead", path)
	}
	return nil
}

// mountPoint reports whether path is a mount point in this process's
// mount namespace (/proc/self/mountinfo, field 5, octal escapes undone);
// false where that cannot be read (not Linux).
func mountPoint(path string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMount(fields[4]) == path {
			return true
		}
	}
	return false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space,
// \011, \012, \134).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
