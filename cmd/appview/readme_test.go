package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/testsupport"
)

// docFiles are the README and every page of docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(docs) == 0 {
		t.Fatalf("docs/*.md: %v (%d files)", err, len(docs))
	}
	return append([]string{"../../README.md"}, docs...)
}

// Every `appview ...` command line the README and docs/ show names
// commands that exist and flags they take: each answers --help, run in
// this process on the real command tree.
func TestReadmeAndDocsNameOnlyAppviewCommandsThatExist(t *testing.T) {
	testsupport.CheckDocCommands(t, "appview", func() *cobra.Command {
		return newRootCommand(make(chan os.Signal, 1))
	}, docFiles(t)...)
}

// The check itself: a page naming a command or a flag that does not
// exist fails it.
func TestReadmeCheckFailsOnACommandThatDoesNotExist(t *testing.T) {
	page := filepath.Join(t.TempDir(), "page.md")
	body := "Run `appview serve`.\n\n```sh\nAPPVIEW_X=1 bin/appview webhooks frobnicate --did x\nappview leases --colour\n```\n"
	if err := os.WriteFile(page, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	got := testsupport.DocCommands(t, "appview", page)
	if len(got) != 3 {
		t.Fatalf("found %d command lines in %q, want 3: %+v", len(got), body, got)
	}
	rec := &recorder{TB: t}
	testsupport.CheckDocCommands(rec, "appview", func() *cobra.Command {
		return newRootCommand(make(chan os.Signal, 1))
	}, page)
	if len(rec.errs) != 2 {
		t.Fatalf("the check of a page naming `appview webhooks frobnicate` and `appview leases --colour` reported %d errors, want 2: %q", len(rec.errs), rec.errs)
	}
}

// recorder is a testing.TB that keeps what a check reports instead of
// failing the test.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...) }
