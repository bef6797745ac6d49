package database

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Two instances opening one database file under two names (a hard link,
// a bind mount of the file alone) kept two WALs, both held the same
// lease, and the file was corrupted. Such a file is refused at open,
// naming the cause; a symbolic link, which SQLite resolves, is not.
func TestADatabaseFileWithASecondNameIsRefused(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "appview.db")
	db, err := Open(context.Background(), Options{URL: "file:" + path})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	link := filepath.Join(dir, "link.db")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if db, err := Open(context.Background(), Options{URL: "file:" + link}); err != nil {
		t.Fatalf("a symbolic link refused: %v", err)
	} else {
		db.Close()
	}
	if err := os.Link(path, filepath.Join(dir, "hard.db")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"appview.db", "hard.db"} {
		_, err := Open(context.Background(), Options{URL: "file:" + filepath.Join(dir, name)})
		if err == nil || !strings.Contains(err.Error(), "has 2 names (hard links)") {
			t.Errorf("open %s with a second name: %v, want the hard link refused", name, err)
		}
	}
}

func TestMountPointReadsMountinfo(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mountinfo is Linux's")
	}
	if !mountPoint("/") {
		t.Error("/ is not a mount point")
	}
	if mountPoint(t.TempDir()) && mountPoint(filepath.Join(t.TempDir(), "x")) {
		t.Error("a new file is a mount point")
	}
	if got := unescapeMount(`/a\040b\134c`); got != `/a b\c` {
		t.Errorf("unescape = %q", got)
	}
}
