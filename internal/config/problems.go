package config

import (
	"errors"
	"strings"
)

// Problems are the problems found in a configuration, in the order they
// were found: the file (in document order), the environment, --set,
// admin.token_file, then the rules of Validate. `serve` refuses with the
// first; `config check` prints them all.
type Problems []*Error

// Err is the first problem, or nil when there is none.
func (p Problems) Err() error {
	if len(p) == 0 {
		return nil
	}
	return p[0]
}

// problemList collects Problems. A rule that relates keys is only
// meaningful when the keys it reads hold what the operator wrote, so once
// a key has a problem, later problems about it, or naming it, are not
// added: a refused leases.ttl would otherwise also be reported as a
// renew_deadline "not less than leases.ttl" against the default it kept.
type problemList struct {
	list Problems
	// bad are the keys (and sections) with a problem.
	bad map[string]bool
}

// add records err (a *Error, or an error wrapping one; anything else is
// recorded under "(config)") unless its key already has a problem or its
// reason names a key that has one.
func (p *problemList) add(err error) {
	if err == nil {
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Key: "(config)", Reason: err.Error()}
	}
	if !p.ok(e.Key) || p.named(e.Reason) {
		return
	}
	if p.bad == nil {
		p.bad = map[string]bool{}
	}
	p.bad[e.Key] = true
	p.list = append(p.list, e)
}

// fail records a problem of key (see add).
func (p *problemList) fail(key, format string, args ...any) {
	p.add(keyErr(key, format, args...))
}

// ok reports whether none of keys has a problem, nor a section above it
// (a section given as a scalar: "leases: 5").
func (p *problemList) ok(keys ...string) bool {
	for _, k := range keys {
		for {
			if p.bad[k] {
				return false
			}
			i := strings.LastIndexByte(k, '.')
			if i < 0 {
				break
			}
			k = k[:i]
		}
	}
	return true
}

// named reports whether reason names a key (a dotted path) that has a
// problem.
func (p *problemList) named(reason string) bool {
	for k := range p.bad {
		if strings.Contains(k, ".") && strings.Contains(reason, k) {
			return true
		}
	}
	return false
}
