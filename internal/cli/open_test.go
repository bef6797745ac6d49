package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// An open or migration that ran out of time names the likely cause of
// the kind of database: on a file, another process's write lock (found
// by a new-user pass: a file locked by an sqlite3 shell was reported as
// "a server that accepts connections but is stopped or paused?"); on a
// server, one that does not answer. Other errors pass through.
func TestNoAnswerNamesTheLikelyCauseForTheKindOfDatabase(t *testing.T) {
	timedOut := fmt.Errorf("migrate: %w", context.DeadlineExceeded)
	for _, c := range []struct{ url, want string }{
		{"file:data/appview.db", "another process holding its write lock"},
		{"file:///var/lib/appview/appview.db", "another process holding its write lock"},
		{"libsql://db.example.com", "a server that accepts connections but is stopped or paused?"},
		{"http://127.0.0.1:8080", "a server that accepts connections but is stopped or paused?"},
	} {
		got := noAnswer(timedOut, "migrating", 20*time.Second, c.url).Error()
		if !strings.Contains(got, "no answer within 20s while migrating it (") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want the cause %q", c.url, got, c.want)
		}
	}
	other := errors.New("file is not a database")
	if got := noAnswer(other, "opening", time.Second, "file:x.db"); got != other {
		t.Errorf("another error became %v", got)
	}
}
