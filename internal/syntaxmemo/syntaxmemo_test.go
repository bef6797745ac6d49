package syntaxmemo

import (
	"strings"
	"sync"
	"testing"

	"github.com/atcr-io/appview/internal/syntaxvectors"
)

// TestTheTablesAnswerAsTheSpecsVectorsSay checks each table against the
// AT Protocol interop syntax vectors, twice: the first answer runs the
// check, the second may come from the table, and both must agree with
// the specification.
func TestTheTablesAnswerAsTheSpecsVectorsSay(t *testing.T) {
	for _, c := range []struct {
		kind  string
		valid func(string) bool
	}{
		{syntaxvectors.DID, DID},
		{syntaxvectors.TID, TID},
		{syntaxvectors.RecordKey, RecordKey},
	} {
		good, bad := syntaxvectors.Valid(c.kind), syntaxvectors.Invalid(c.kind)
		if len(good) == 0 || len(bad) == 0 {
			t.Fatalf("%s: no vectors (%d valid, %d invalid)", c.kind, len(good), len(bad))
		}
		for round := range 2 {
			for _, s := range good {
				if !c.valid(s) {
					t.Errorf("%s, round %d: %q refused, the spec says valid", c.kind, round, s)
				}
			}
			for _, s := range bad {
				if c.valid(s) {
					t.Errorf("%s, round %d: %q accepted, the spec says invalid", c.kind, round, s)
				}
			}
		}
	}
}

// TestOnlyAcceptanceIsRemembered drives a one-slot table, so every
// string shares the slot: refusals are never stored, an eviction costs a
// check and changes no answer, and a string past MaxLen is checked on
// every call.
func TestOnlyAcceptanceIsRemembered(t *testing.T) {
	calls := map[string]int{}
	m := New(1, func(s string) bool {
		calls[s]++
		return !strings.HasPrefix(s, "bad")
	})
	long := strings.Repeat("x", MaxLen+1)
	for range 3 {
		if !m.Valid("a") {
			t.Fatal("a refused")
		}
		if m.Valid("bad1") {
			t.Fatal("bad1 accepted")
		}
		if !m.Valid("a") {
			t.Fatal("a refused after a refusal shared its slot")
		}
		if !m.Valid(long) {
			t.Fatal("the long string refused")
		}
	}
	// "a" is checked once: a refusal never takes its slot, and the long
	// string is never stored.
	if calls["a"] != 1 || calls["bad1"] != 3 || calls[long] != 3 {
		t.Fatalf("checks per string: a %d (want 1), bad1 %d (want 3), long %d (want 3)", calls["a"], calls["bad1"], calls[long])
	}
	// Another accepted string evicts "a", which is then checked again.
	m.Valid("b")
	m.Valid("a")
	if calls["a"] != 2 {
		t.Fatalf("a checked %d times after an eviction, want 2", calls["a"])
	}
}

// TestConcurrentUse runs lookups and stores from several goroutines on a
// small table (go test -race): every answer stays the check's.
func TestConcurrentUse(t *testing.T) {
	m := New(4, func(s string) bool { return len(s)%2 == 0 })
	words := []string{"aa", "b", "cccc", "ddd", "ee", "f", "gggggg", "hhhhh"}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				w := words[(i+g)%len(words)]
				if m.Valid(w) != (len(w)%2 == 0) {
					t.Errorf("%q: wrong answer", w)
					return
				}
			}
		})
	}
	wg.Wait()
}
