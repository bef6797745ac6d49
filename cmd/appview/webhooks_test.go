package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/webhooks"
)

// runWebhooks runs `appview webhooks args...` against the database at path.
func runWebhooks(t *testing.T, path, stdin string, args ...string) (string, error) {
	t.Helper()
	open := func(ctx context.Context) (*database.DB, error) {
		db, err := database.Open(ctx, database.Options{URL: "file:" + path, BusyTimeout: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		if _, err := db.Migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
		return db, nil
	}
	openRead := func(ctx context.Context) (*database.DB, error) {
		return database.Open(ctx, database.Options{URL: "file:" + path, BusyTimeout: 5 * time.Second, MustExist: true})
	}
	cmd := newWebhooksCommand(open, openRead)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestWebhooksCommandAddsListsAndRemoves(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	out, err := runWebhooks(t, path, "", "add", "--did", "did:plc:alice", "--url", "http://127.0.0.1:9/hook", "--allow-private")
	if err != nil || strings.TrimSpace(out) != "1" {
		t.Fatalf("add: %q, %v; want id 1", out, err)
	}
	out, err = runWebhooks(t, path, "topsecret\n", "add", "--did", "did:plc:bob", "--url", "http://127.0.0.1:9/b",
		"--secret", "-", "--allow-private")
	if err != nil || strings.TrimSpace(out) != "2" {
		t.Fatalf("add with secret from stdin: %q, %v", out, err)
	}

	out, err = runWebhooks(t, path, "", "list", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "topsecret") {
		t.Fatalf("list --json printed a secret: %s", out)
	}
	var listed []struct {
		ID       int64    `json:"id"`
		DID      string   `json:"did"`
		Triggers []string `json:"triggers"`
		Signed   bool     `json:"signed"`
	}
	if err := json.Unmarshal([]byte(out), &listed); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if len(listed) != 2 || listed[0].Signed || !listed[1].Signed || listed[1].DID != "did:plc:bob" ||
		len(listed[0].Triggers) != 1 || listed[0].Triggers[0] != webhooks.TriggerPush {
		t.Fatalf("list --json = %+v", listed)
	}

	out, err = runWebhooks(t, path, "", "list", "--did", "did:plc:bob")
	if err != nil || !strings.Contains(out, "http://127.0.0.1:9/b") || strings.Contains(out, "/hook") || strings.Contains(out, "topsecret") {
		t.Fatalf("list --did bob: %q, %v", out, err)
	}

	if out, err = runWebhooks(t, path, "", "rm", "1"); err != nil || !strings.Contains(out, "removed webhook 1") {
		t.Fatalf("rm 1: %q, %v", out, err)
	}
	if _, err = runWebhooks(t, path, "", "rm", "1"); err == nil || !strings.Contains(err.Error(), "no webhook with id 1") {
		t.Fatalf("rm 1 again: %v", err)
	}
	if _, err = runWebhooks(t, path, "", "rm", "one"); err == nil {
		t.Fatal("rm with a non-numeric id succeeded")
	}
}

func TestWebhooksAddRefusesLoopbackWithoutAllowPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	_, err := runWebhooks(t, path, "", "add", "--did", "did:plc:alice", "--url", "http://localhost:9/hook")
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("add loopback: %v, want a refusal", err)
	}
	if _, err := runWebhooks(t, path, "", "add", "--url", "https://93.184.216.34/"); err == nil {
		t.Fatal("add without --did succeeded")
	}
}

// An explicit empty secret, from the flag or from stdin, is refused
// before the database is opened, and a repeated secret is never echoed.
func TestWebhooksAddRefusesAnEmptySecretAndARepeatedFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "appview.db")
	add := []string{"add", "--did", "did:plc:alice", "--url", "http://127.0.0.1:9/hook", "--allow-private"}
	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"--secret", ""}, "omit --secret for an unsigned webhook"},
		{"", []string{"--secret="}, "--secret: the secret given is empty"},
		{"", []string{"--secret", "  "}, "--secret: the secret given is empty or only whitespace"},
		{"\t \n", []string{"--secret", "-"}, "standard input gave an empty secret"},
		{"", []string{"--secret", "first-secret", "--secret", "second-secret"}, "--secret given 2 times"},
	} {
		_, err := runWebhooks(t, path, tc.stdin, append(append([]string{}, add...), tc.args...)...)
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("add %q (stdin %q): %v, want a usage error containing %q", tc.args, tc.stdin, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "-secret\"") {
			t.Errorf("add %q: the refusal prints a secret: %v", tc.args, err)
		}
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("a refused add created the database (stat: %v)", err)
	}
}
