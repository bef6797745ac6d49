package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"
)

// RepeatedFlagError refuses a flag that takes one value and was given
// more than once: pflag's string flag silently keeps the last value, so
// `--config a.yaml --config b.yaml` would drop a.yaml without a word.
// StrictUsage turns it into a *UsageError (exit 2, one line).
type RepeatedFlagError struct {
	// Flag is the flag as typed, e.g. "--config".
	Flag string
	// First and Then are the first value and the one that repeated it.
	First, Then string
	// Hint says why one value and what to do instead ("it takes one
	// value" when empty).
	Hint string
}

func (e *RepeatedFlagError) Error() string {
	hint := e.Hint
	if hint == "" {
		hint = "it takes one value"
	}
	return fmt.Sprintf("%s given twice (%q, then %q): %s", e.Flag, e.First, e.Then, hint)
}

// single is the pflag.Value of a string flag that refuses a second value
// (SingleVar).
type single struct {
	p    *string
	name string
	hint string
	set  bool
}

func (s *single) Set(v string) error {
	if s.set {
		return &RepeatedFlagError{Flag: "--" + s.name, First: *s.p, Then: v, Hint: s.hint}
	}
	// An empty value would mean "not given" (built-in defaults, every
	// webhook, the default URL): a variable that expanded to nothing in a
	// script is refused rather than run on the default.
	if strings.TrimSpace(v) == "" {
		return fmt.Errorf("empty; give a value or leave --%s out", s.name)
	}
	*s.p, s.set = v, true
	return nil
}

func (s *single) Type() string   { return "string" }
func (s *single) String() string { return *s.p }

// SingleVar defines a string flag like fs.StringVar whose value chooses
// what the command works on (a file, a URL, an address), so that giving
// it twice is refused with a *RepeatedFlagError rather than silently
// keeping the last value; hint (may be empty) follows the refusal.
func SingleVar(fs *pflag.FlagSet, p *string, name, value, usage, hint string) {
	*p = value
	fs.Var(&single{p: p, name: name, hint: hint}, name, usage)
}
