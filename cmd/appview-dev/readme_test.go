package main

import (
	"path/filepath"
	"testing"

	"github.com/atcr-io/appview/internal/testsupport"
)

// Every `appview-dev ...` command line the README and docs/ show names
// commands that exist and flags they take: each answers --help, run in
// this process on the real command tree.
func TestReadmeAndDocsNameOnlyAppviewDevCommandsThatExist(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("docs/*.md: %v (%d files)", err, len(docs))
	}
	testsupport.CheckDocCommands(t, "appview-dev", newRootCommand, append([]string{"../../README.md"}, docs...)...)
}
