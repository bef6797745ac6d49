package main

import (
	"os/exec"
	"strings"
	"testing"
)

// testSupport names, by import path element, the packages whose job is
// testing or measuring: none may be linked into the shipped binary.
var testSupport = []string{"tests", "harness", "fakepeer", "rowcapture", "sqldtest", "leakcheck", "dbdump", "testsupport", "bench", "synth"}

func TestTheShippedBinaryLinksNoTestSupport(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/appview: %v", err)
	}
	const module = "github.com/atcr-io/appview/"
	ours := 0
	for _, pkg := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(pkg, module)
		if !ok {
			continue
		}
		ours++
		for _, elem := range strings.Split(rel, "/") {
			for _, bad := range testSupport {
				if elem == bad {
					t.Errorf("cmd/appview links %s (%s is test or developer support: it belongs in cmd/appview-dev or a _test.go file)", pkg, bad)
				}
			}
		}
	}
	if ours == 0 {
		t.Fatalf("go list -deps named none of the module's packages: %q", out)
	}
}
