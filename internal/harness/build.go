package harness

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// BuildCommit builds ./cmd/appview of commit, from the git repository at
// root, into out, with the race detector when race (as Build). The tree
// is taken with `git archive` once per commit into
// srcRoot/appview-src-COMMIT and built there: from a directory that does
// not change, the build cache (GOCACHE) serves every package of the
// commit after its first build, and the dependencies, shared with the
// build under test, from the start. The tree is extracted into a scratch
// directory and renamed into place whole, so a concurrent or interrupted
// run never builds from half a tree; the binary is kept in it too, for
// the same toolchain and flags (buildKey), so later runs do not link it
// again. The error says when the commit is not in the repository (a
// shallow clone).
func BuildCommit(ctx context.Context, root, commit, srcRoot, out string, race bool) error {
	src := filepath.Join(srcRoot, "appview-src-"+commit)
	if _, err := os.Stat(filepath.Join(src, "go.mod")); err != nil {
		if b, err := exec.CommandContext(ctx, "git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
			return fmt.Errorf("harness: commit %s is not in the git repository at %s (a shallow clone? git fetch --unshallow): %v %s",
				commit, root, err, strings.TrimSpace(string(b)))
		}
		tmp, err := os.MkdirTemp(srcRoot, ".appview-src-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := extract(ctx, root, commit, tmp); err != nil {
			return err
		}
		// Another run may have put it in place meanwhile: theirs is the
		// same tree.
		if err := os.Rename(tmp, src); err != nil {
			if _, serr := os.Stat(filepath.Join(src, "go.mod")); serr != nil {
				return fmt.Errorf("harness: put the tree of %s in place: %w", commit, err)
			}
		}
	}
	// The commit's binary, too, is kept for later runs: a fixed tree
	// links to the same program every time (a race-enabled link is some
	// 6 s of CPU), for as long as the toolchain and the flags that go into
	// the build stay the same, which the name of the kept file records.
	key, err := buildKey(ctx, src, race)
	if err != nil {
		return err
	}
	kept := filepath.Join(src, ".bin", "appview-"+key)
	if _, err := os.Stat(kept); err != nil {
		if err := os.MkdirAll(filepath.Dir(kept), 0o755); err != nil {
			return err
		}
		tmp, err := os.CreateTemp(filepath.Dir(kept), ".appview-")
		if err != nil {
			return err
		}
		tmp.Close()
		defer os.Remove(tmp.Name())
		if err := Build(ctx, src, "./cmd/appview", tmp.Name(), race); err != nil {
			return err
		}
		// Whole or not at all, as the tree: a concurrent run's is the same.
		if err := os.Rename(tmp.Name(), kept); err != nil {
			return err
		}
	}
	return copyFile(kept, out)
}

// buildKey names what a build of the tree at dir depends on besides the
// tree: the toolchain, the flags and the C compiler's settings (go env),
// and the race detector.
func buildKey(ctx context.Context, dir string, race bool) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "env", "GOVERSION", "GOOS", "GOARCH", "GOAMD64", "GOARM64", "GOFLAGS",
		"CGO_ENABLED", "CC", "CGO_CFLAGS", "CGO_CPPFLAGS", "CGO_LDFLAGS", "GOEXPERIMENT")
	cmd.Dir = dir
	env, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("harness: go env: %w", err)
	}
	sum := sha256.Sum256(fmt.Appendf(env, "race=%t\n", race))
	return hex.EncodeToString(sum[:12]), nil
}

// copyFile copies the executable src to dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// extract writes commit's tree into dir: git archive | tar -x.
func extract(ctx context.Context, root, commit, dir string) error {
	archive := exec.CommandContext(ctx, "git", "-C", root, "archive", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", dir)
	var errs strings.Builder
	archive.Stderr, untar.Stderr = &errs, &errs
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return err
	}
	untar.Stdin = pipe
	if err := archive.Start(); err != nil {
		return fmt.Errorf("harness: git archive %s: %w", commit, err)
	}
	if err := untar.Run(); err != nil {
		_ = archive.Wait()
		return fmt.Errorf("harness: tar -x of git archive %s: %w\n%s", commit, err, errs.String())
	}
	if err := archive.Wait(); err != nil {
		return fmt.Errorf("harness: git archive %s: %w\n%s", commit, err, errs.String())
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

// The version and commit a test run links into the appview binary under
// test (-ldflags -X, as deploy/Dockerfile stamps a release): cmd/appview's
// version test checks them, and the same stamped binary serves tests/.
const TestVersion, TestCommit = "v1.2.3-test", "0123abcd"

// TestBinaryEnv names where the appview binary of a whole test run is
// (scripts/test sets it to a path in a directory of its own): the first
// of cmd/appview's and tests/' TestMain to get there links it
// (BuildTestBinary: with -race, stamped), the other runs it, rather than
// each linking one. Not an APPVIEW_ name: the tests hand their
// environment to appview, which refuses unknown APPVIEW_* variables.
const TestBinaryEnv = "ATCR_TEST_APPVIEW_BIN"

// BuildTestBinary builds ./cmd/appview of the module at root into out as a
// test run needs it: with the race detector when race, stamped with
// TestVersion and TestCommit. The stamps are a command-line -ldflags,
// which replaces an -ldflags of GOFLAGS (scripts/lib/gotest.sh's choice of
// linker): that one is kept in it.
func BuildTestBinary(ctx context.Context, root, out string, race bool) error {
	args := []string{"build", "-o", out, "-ldflags", testLdflags()}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/appview")...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("harness: go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// testLdflags is the stamps, after the -ldflags of GOFLAGS if any.
func testLdflags() string {
	stamps := "-X main.version=" + TestVersion + " -X main.commit=" + TestCommit
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if v, ok := strings.CutPrefix(strings.TrimLeft(f, "-"), "ldflags="); ok && v != "" {
			return v + " " + stamps
		}
	}
	return stamps
}

// TestBinary returns the appview binary for a test process. When
// $ATCR_TEST_APPVIEW_BIN is set it is that path: under an exclusive lock
// on the path + ".lock", the first caller builds it (BuildTestBinary) and
// later ones, of this or another package's test process, wait for the
// lock and find it there, checked with go version -m to be what
// BuildTestBinary would build here (./cmd/appview, the stamps, the race
// detector as race). When the variable is unset (a package tested alone)
// it builds one into out.
func TestBinary(ctx context.Context, root, out string, race bool) (string, error) {
	bin := os.Getenv(TestBinaryEnv)
	if bin == "" {
		return out, BuildTestBinary(ctx, root, out, race)
	}
	lock, err := os.OpenFile(bin+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return "", fmt.Errorf("harness: %s: %w", TestBinaryEnv, err)
	}
	defer lock.Close() // and with it the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("harness: lock %s: %w", lock.Name(), err)
	}
	if _, err := os.Stat(bin); errors.Is(err, fs.ErrNotExist) {
		// Into a scratch name first: a failed build leaves nothing the
		// next caller would take for the binary.
		tmp := bin + ".tmp"
		if err := BuildTestBinary(ctx, root, tmp, race); err != nil {
			return "", err
		}
		return bin, os.Rename(tmp, bin)
	}
	b, err := exec.CommandContext(ctx, "go", "version", "-m", bin).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("harness: %s=%s: go version -m: %w\n%s", TestBinaryEnv, bin, err, b)
	}
	info := string(b)
	if !strings.Contains(info, "\tpath\tgithub.com/atcr-io/appview/cmd/appview\n") ||
		!strings.Contains(info, "-X main.version="+TestVersion+" -X main.commit="+TestCommit) {
		return "", fmt.Errorf("harness: %s=%s is not ./cmd/appview stamped with %s and %s:\n%s", TestBinaryEnv, bin, TestVersion, TestCommit, info)
	}
	if got := strings.Contains(info, "\tbuild\t-race=true\n"); got != race {
		return "", fmt.Errorf("harness: %s=%s: race detector %t, this test process %t", TestBinaryEnv, bin, got, race)
	}
	return bin, nil
}
