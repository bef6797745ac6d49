package config

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// serviceLinkName matches the variables Kubernetes injects for every
// Service visible to a pod (kubernetes.io/docs/concepts/services-networking/service/#environment-variables),
// here for Services whose name begins with "appview": NAME_SERVICE_HOST,
// NAME_SERVICE_PORT, NAME_SERVICE_PORT_<PORTNAME>, and the Docker-link
// compatible NAME_PORT_<N>_<PROTO>[_PROTO|_PORT|_ADDR].
var serviceLinkName = regexp.MustCompile(`_SERVICE_HOST$|_SERVICE_PORT(_[A-Z0-9_]+)?$|_PORT_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?$`)

// serviceLinkURL is the value of the bare NAME_PORT variable of a service
// link: tcp://10.0.0.1:80.
var serviceLinkURL = regexp.MustCompile(`^(tcp|udp|sctp)://`)

// isServiceLink reports whether name=value has the shape of a Kubernetes
// service-link variable. Load asks only about names that are not config
// keys, so a key that happens to end in _PORT is never mistaken for one.
func isServiceLink(name, value string) bool {
	if serviceLinkName.MatchString(name) {
		return true
	}
	return strings.HasSuffix(name, "_PORT") && serviceLinkURL.MatchString(value)
}

// unknownEnvWarning is the line for an APPVIEW_* variable that names no
// key: it says the variable is ignored and, when the variable is a near
// miss of a key's (nearMiss: APPVIEW_LEASES_TLL, APPVIEW_LOGLEVEL,
// APPVIEW_jetstream_urls), names that key's variable. A variable that
// resembles no key (a deploy script's APPVIEW_BIN) gets no suggestion.
func unknownEnvWarning(name string, byEnv map[string]string) string {
	keys := make(map[string]bool, len(byEnv))
	for _, key := range byEnv {
		keys[key] = true
	}
	msg := fmt.Sprintf("environment variable %s is not a config key and is ignored", name)
	if key := nearMiss(strings.TrimPrefix(name, EnvPrefix), keys); key != "" {
		msg += fmt.Sprintf(" (did you mean %s, key %s?)", EnvName(key), key)
	}
	return msg
}

// suggestKey is the " (did you mean K?)" of an unknown key of the file or
// --set: its near miss among known (nearMiss), or "" when there is none.
func suggestKey[V any](key string, known map[string]V) string {
	if best := nearMiss(key, known); best != "" {
		return " (did you mean " + best + "?)"
	}
	return ""
}

// nearMiss returns the key of known that name (a dotted key path, or the
// part of an environment variable after APPVIEW_) is a near miss of, or
// "" when it is none's. A near miss is the same path in another case or
// with other separators ("Leases.TTL", "leases_ttl", "log-level", and any
// environment name, whose "_" may stand for "." or "_"), a path at most
// two single-character edits from a key, and fewer than a third of the
// name's length ("leases.tll", "lease.ttl", "loglevel", "jetstream.url"), or
// the address of a section named by a word for one ("admin.port",
// APPVIEW_ADMIN_PORT: admin.addr). Ties go to the first key in sorted
// order, so a suggestion is the same every start.
func nearMiss[V any](name string, known map[string]V) string {
	keys := slices.Sorted(maps.Keys(known))
	want := pathForm(name)
	best, bestDist := "", 3
	for _, k := range keys {
		if d := editDistance(want, pathForm(k)); d < bestDist && 3*d < len(want) {
			best, bestDist = k, d
		}
	}
	if best != "" {
		return best
	}
	return addressOf(want, keys)
}

// pathForm is a key path as nearMiss compares it: in lower case, with
// every separator ('.', '_', '-') written as '_'.
func pathForm(path string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '-':
			return '_'
		}
		return unicode.ToLower(r)
	}, path)
}

// addressWords name what a section's addr key holds.
var addressWords = []string{"port", "host", "listen", "bind", "address"}

// addressOf returns SECTION.addr from keys when name (in pathForm) is
// SECTION_WORD for one of addressWords, else "".
func addressOf(name string, keys []string) string {
	for _, k := range keys {
		section, leaf, ok := strings.Cut(k, ".")
		if !ok || leaf != "addr" {
			continue
		}
		for _, w := range addressWords {
			if name == pathForm(section)+"_"+w {
				return k
			}
		}
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b, in bytes
// (variable names are ASCII): insertions, deletions and substitutions
// each cost 1.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
