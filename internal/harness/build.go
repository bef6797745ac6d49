package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/fence"
)

// ModuleRoot returns the directory of the go.mod governing the current
// directory (`go env GOMOD`).
func ModuleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("harness: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == "/dev/null" {
		return "", fmt.Errorf("harness: not inside a Go module")
	}
	return filepath.Dir(mod), nil
}

// Build compiles the command pkg (e.g. "./cmd/appview", or
// "./cmd/appview-dev" for bench and synth) of the module at root into out.
// With race the binary is built with the race detector, so a data race in
// a real multi-process run is reported on its stderr (see Cluster.Races).
func Build(ctx context.Context, root, pkg, out string, race bool) error {
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// LeaseRow is one row of `appview leases --json` (docs/spec.md §2, §4).
type LeaseRow = fence.Listed

// Leases runs `bin leases --json` against dbURL (through wrap, e.g. inside
// a network namespace) and returns the rows by name. It is how an operator
// reads the table, so the tests read it the same way.
func Leases(ctx context.Context, bin, dbURL string, wrap ...string) (map[string]LeaseRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args := append(append([]string(nil), wrap...), bin, "leases", "--json", "--set", "database.url="+dbURL)
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.Env = cleanEnv()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("harness: appview leases: %w: %s", err, stderr.String())
	}
	var rows []LeaseRow
	if err := json.Unmarshal(out, &rows); err != nil {
		return nil, fmt.Errorf("harness: appview leases --json: %w: %s", err, out)
	}
	m := make(map[string]LeaseRow, len(rows))
	for _, r := range rows {
		m[r.Name] = r
	}
	return m, nil
}
