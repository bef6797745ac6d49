package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
