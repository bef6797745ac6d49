package main

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/atcr-io/appview/"

// goListImports returns every package of the module with its imports from
// the module (non-test), as `go list` sees them.
func goListImports(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}|{{join .Imports " "}}`, "./...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		p, imps, _ := strings.Cut(line, "|")
		var deps []string
		for _, i := range strings.Fields(imps) {
			if d, ok := strings.CutPrefix(i, module); ok {
				deps = append(deps, d)
			}
		}
		slices.Sort(deps)
		pkgs[strings.TrimPrefix(p, module)] = deps
	}
	return pkgs
}

// The package map of docs/architecture.md is the code's: every package of
// the module has one row, and its imports column lists exactly what the
// package imports from the module. On a mismatch the test prints the rows
// as they should read.
func TestTheArchitectureDocsPackageMapIsTheCodes(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `([a-z0-9/-]+)` \\| (.*) \\| (.*) \\|$")
	documented := map[string][]string{}
	what := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		if _, twice := documented[m[1]]; twice {
			t.Errorf("docs/architecture.md lists %s twice", m[1])
		}
		deps := []string{}
		for _, d := range regexp.MustCompile("`([a-z0-9/-]+)`").FindAllStringSubmatch(m[3], -1) {
			deps = append(deps, d[1])
		}
		slices.Sort(deps)
		documented[m[1]], what[m[1]] = deps, m[2]
	}
	actual := goListImports(t)
	var want []string
	wrong := false
	for p, deps := range actual {
		doc, ok := documented[p]
		if !ok || !slices.Equal(doc, deps) {
			wrong = true
		}
		line := "| `" + p + "` | " + what[p] + " | "
		if len(deps) == 0 {
			line += "—"
		}
		for i, d := range deps {
			if i > 0 {
				line += ", "
			}
			line += "`" + d + "`"
		}
		want = append(want, line+" |")
	}
	for p := range documented {
		if _, ok := actual[p]; !ok {
			wrong = true
			t.Errorf("docs/architecture.md lists %s, which is not a package", p)
		}
	}
	if wrong {
		slices.Sort(want)
		t.Errorf("docs/architecture.md's package map differs from go list; its rows should read:\n%s", strings.Join(want, "\n"))
	}
}

// The layering rule of docs/architecture.md: internal packages import
// neither actors nor system; a worker package imports no other actors
// package; system imports no worker package but the LeaseActor's.
func TestTheLayeringRuleHolds(t *testing.T) {
	for p, deps := range goListImports(t) {
		for _, d := range deps {
			switch {
			case strings.HasPrefix(p, "internal/") && (strings.HasPrefix(d, "actors/") || d == "system"):
				t.Errorf("%s imports %s: internal packages never import actors or system", p, d)
			case strings.HasPrefix(p, "actors/") && (strings.HasPrefix(d, "actors/") || d == "system"):
				t.Errorf("%s imports %s: an actor package imports no other actor package, nor system", p, d)
			case p == "system" && strings.HasPrefix(d, "actors/") && d != "actors/lease":
				t.Errorf("system imports %s: it wires workers it is given, and imports none", d)
			}
		}
	}
}
