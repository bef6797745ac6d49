package config

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
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
// key: it says the variable is ignored and suggests the nearest variable
// that is one (a misspelt APPVIEW_LEASES_TLL gets APPVIEW_LEASES_TTL).
func unknownEnvWarning(name string, byEnv map[string]string) string {
	// Variable names are upper case: compare in it, so APPVIEW_jetstream_urls
	// suggests APPVIEW_JETSTREAM_URLS, not the nearest name by bytes.
	best, _ := nearest(strings.ToUpper(name), byEnv)
	return fmt.Sprintf("environment variable %s is not a config key and is ignored (did you mean %s, key %s?)", name, best, byEnv[best])
}

// nearest returns the name in known nearest to name by editDistance, and
// that distance ("", -1 when known is empty). Ties go to the first name
// in sorted order, so the suggestion is the same every start.
func nearest[V any](name string, known map[string]V) (string, int) {
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	best, bestDist := "", -1
	for _, n := range names {
		if d := editDistance(name, n); bestDist < 0 || d < bestDist {
			best, bestDist = n, d
		}
	}
	return best, bestDist
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

// suggestKey is the " (did you mean K?)" of an unknown --set key: the
// known key nearest to key by editDistance, or "" when the nearest is
// more than a third of key away (a different word, not a typo).
func suggestKey[V any](key string, known map[string]V) string {
	// Keys are lower case: "Leases.TTL" is one case fold from leases.ttl.
	best, bestDist := nearest(strings.ToLower(key), known)
	if best == "" || bestDist > max(2, len(key)/3) {
		return ""
	}
	return " (did you mean " + best + "?)"
}
