package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/atcr-io/appview/internal/atproto"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/leasestore"
	"github.com/atcr-io/appview/internal/logval"
	"github.com/atcr-io/appview/internal/outbound"
)

// EnvPrefix starts every environment override (docs/spec.md §2).
const EnvPrefix = "APPVIEW_"

var durationType = reflect.TypeOf(time.Duration(0))

// Sources says where Load reads configuration from.
type Sources struct {
	// File is a YAML file path; empty means defaults only.
	File string
	// Environ is the environment as KEY=VALUE lines (os.Environ() in production).
	Environ []string
	// Sets are flag overrides as dotted-key=value (from --set), applied last.
	Sets []string
	// Warn receives one line for each APPVIEW_* variable that is not a
	// config key (see Load); nil drops them.
	Warn func(msg string)
	// Origins, when not nil, receives where each key set from a source got
	// its value: "line 4" (of File), "from APPVIEW_LEASES_TTL", "from
	// --set"; a key left at its default has no entry. PointAt uses it for
	// refusals made after Load.
	Origins map[string]string
}

// Load builds the configuration from defaults, then Sources in order, and
// validates it. Errors are *Error naming the key, except an unreadable file.
//
// The file and --set are strict: an unknown key is an error. The
// environment is shared with other tools, so an APPVIEW_* variable that
// names no key is not: a Kubernetes service link (APPVIEW_PORT=tcp://...,
// APPVIEW_SERVICE_HOST, APPVIEW_PORT_80_TCP_ADDR, ... for a Service named
// "appview") is ignored quietly, and anything else (a deploy script's
// APPVIEW_BIN) is ignored with a warning naming the closest key.
func Load(src Sources) (Config, error) {
	cfg := Default()
	// origins says where each key set from a source got its value, so a
	// refusal of the value by Validate can point at it ("line 4", an
	// environment variable, --set).
	origins := src.Origins
	if origins == nil {
		origins = map[string]string{}
	}
	if src.File != "" {
		data, err := readConfigFile(src.File)
		if err != nil {
			return cfg, &Error{Key: "--config", Reason: err.Error()}
		}
		if err := decodeYAML(data, &cfg, origins); err != nil {
			return cfg, err
		}
	}
	leaves := leafFields(reflect.ValueOf(&cfg).Elem(), "")
	byEnv := make(map[string]string, len(leaves))
	for key := range leaves {
		byEnv[EnvName(key)] = key
	}
	for _, kv := range src.Environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		key, known := byEnv[name]
		if !known {
			if !isServiceLink(name, value) && src.Warn != nil {
				src.Warn(unknownEnvWarning(name, byEnv))
			}
			continue
		}
		if err := setFromString(leaves[key], key, value); err != nil {
			return cfg, from(err, name)
		}
		origins[key] = "from " + name
	}
	for _, kv := range src.Sets {
		key, value, ok := strings.Cut(kv, "=")
		if !ok || strings.TrimSpace(key) == "" {
			return cfg, keyErr(kv, "--set wants key=value")
		}
		if trimmed := strings.TrimSpace(key); trimmed != key {
			return cfg, keyErr(key, "--set key with spaces around it (write %s=...)", trimmed)
		}
		field, known := leaves[key]
		if !known {
			if sub := sectionKeys(key, leaves); len(sub) > 0 {
				return cfg, keyErr(key, "a section, not a value: set one of its keys (%s)", strings.Join(sub, ", "))
			}
			return cfg, keyErr(key, "unknown key%s (from --set)", suggestKey(key, leaves))
		}
		if err := setFromString(field, key, value); err != nil {
			return cfg, from(err, "--set")
		}
		origins[key] = "from --set"
	}
	if cfg.InstanceID == "" {
		cfg.InstanceID = NewInstanceID()
	}
	if err := cfg.readTokenFile(); err != nil {
		return cfg, PointAt(err, origins)
	}
	return cfg, PointAt(cfg.Validate(), origins)
}

// PointAt adds to err, when it is or wraps a refusal (*Error) of a key
// set from a source, where its value came from, as Load's own refusals
// say: " (line 4)" of the file, " (from APPVIEW_LEASES_TTL)", " (from
// --set)"; origins is what Load put in Sources.Origins. It is for
// refusals made after Load, by what the value names: a port that cannot
// be bound, a database that cannot be opened. The result is the refusal
// itself (*Error), whatever wrapped it; err is returned as it is when it
// holds no *Error, names a key left at its default, or already says.
// Load's own refusals come through it too.
func PointAt(err error, origins map[string]string) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	if strings.HasSuffix(e.Reason, ")") && (strings.Contains(e.Reason, " (line ") || strings.Contains(e.Reason, " (from ")) {
		return err
	}
	var parts []string
	if o, ok := origins[e.Key]; ok {
		parts = append(parts, o)
	}
	// A bound against another key (renew_deadline < leases.ttl) may be
	// broken by that key's override: name where it came from too. (Its
	// line in the file the operator can read there.)
	var others []string
	for k, o := range origins {
		if k != e.Key && strings.HasPrefix(o, "from ") && strings.Contains(e.Reason, k) {
			others = append(others, k+" "+o)
		}
	}
	sort.Strings(others)
	parts = append(parts, others...)
	if len(parts) == 0 {
		return err
	}
	return &Error{Key: e.Key, Reason: e.Reason + " (" + strings.Join(parts, "; ") + ")"}
}

// readTokenFile fills Admin.Token from Admin.TokenFile (issue 11: a
// secrets mount). It refuses both set, an unreadable or oversized file,
// anything but a regular file (a directory, a FIFO, a device) and an
// empty token.
func (c *Config) readTokenFile() error {
	a := &c.Admin
	if a.TokenFile == "" {
		return nil
	}
	if a.Token != "" {
		return keyErr("admin.token_file", "set admin.token or admin.token_file, not both")
	}
	// Non-blocking, so a FIFO with no writer (a secrets mount not filled
	// yet) cannot hang the start past every signal; anything but a regular
	// file is refused once open.
	f, err := os.OpenFile(a.TokenFile, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return keyErr("admin.token_file", "%v", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return keyErr("admin.token_file", "%v", err)
	} else if !st.Mode().IsRegular() {
		return keyErr("admin.token_file", "%s is %s, not a regular file", a.TokenFile, database.FileKind(st.Mode()))
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxTokenFileBytes+1))
	if err != nil {
		return keyErr("admin.token_file", "%v", err) // names the op and the file already
	}
	if len(data) > MaxTokenFileBytes {
		return keyErr("admin.token_file", "%s is larger than %d bytes; it should hold only the token", a.TokenFile, MaxTokenFileBytes)
	}
	a.Token = strings.TrimSpace(string(data))
	if a.Token == "" {
		return keyErr("admin.token_file", "%s is empty", a.TokenFile)
	}
	return nil
}

// MinTokenLength is the shortest admin.token accepted: shorter secrets are
// guessable by anyone who can reach the port.
const MinTokenLength = 16

// loopbackOnly reports whether the host of addr (host:port) only ever
// reaches this machine: a loopback IP or "localhost". An empty host or an
// unspecified address (0.0.0.0, ::) binds every interface.
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// from says where a bad value came from (an environment variable or
// --set), since it may override a file the operator is looking at.
func from(err error, source string) error {
	var e *Error
	if errors.As(err, &e) {
		return &Error{Key: e.Key, Reason: e.Reason + " (from " + source + ")"}
	}
	return err
}

// EnvName is the environment variable for a dotted key: leases.ttl → APPVIEW_LEASES_TTL.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// leafFields maps every dotted key to its settable field.
func leafFields(v reflect.Value, prefix string) map[string]reflect.Value {
	out := map[string]reflect.Value{}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name := yamlName(t.Field(i))
		key := name
		if prefix != "" {
			key = prefix + "." + name
		}
		f := v.Field(i)
		if f.Kind() == reflect.Struct {
			for k, fv := range leafFields(f, key) {
				out[k] = fv
			}
			continue
		}
		out[key] = f
	}
	return out
}

// sectionKeys returns, sorted, the keys of leaves under section key
// (key + "."), none when key is not a section.
func sectionKeys[V any](key string, leaves map[string]V) []string {
	var sub []string
	for k := range leaves {
		if strings.HasPrefix(k, key+".") {
			sub = append(sub, k)
		}
	}
	slices.Sort(sub)
	return sub
}

// everyKey is every dotted key a configuration file may hold: the
// leaves (leases.ttl) and the sections above them (leases), from which
// an unknown key in the file gets its suggestion, as a --set key does
// from the leaves.
func everyKey() map[string]bool {
	cfg := Default()
	keys := map[string]bool{}
	for key := range leafFields(reflect.ValueOf(&cfg).Elem(), "") {
		keys[key] = true
		for i, c := range key {
			if c == '.' {
				keys[key[:i]] = true
			}
		}
	}
	return keys
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}

// decodeYAML walks the document against the struct so that an unknown key
// or a bad value is reported with its full dotted path. A file holds one
// document: yaml.Unmarshal would read the first and silently drop the
// rest (settings the operator believes are applied), so a second one,
// even an empty one after a trailing "---", is refused.
//
// Each key set gets its line in origins ("line N").
func decodeYAML(data []byte, cfg *Config, origins map[string]string) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF): // empty file, or only comments: defaults
		return nil
	case err != nil:
		return &Error{Key: "--config", Reason: "invalid YAML: " + err.Error()}
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		return keyErr("--config", "more than one YAML document (a second one starts at line %d); keep one", next.Line)
	case !errors.Is(err, io.EOF):
		return &Error{Key: "--config", Reason: "more than one YAML document, and the second is invalid: " + err.Error()}
	}
	if len(doc.Content) == 0 {
		return nil
	}
	return decodeNode(doc.Content[0], reflect.ValueOf(cfg).Elem(), "", origins)
}

func decodeNode(n *yaml.Node, v reflect.Value, key string, origins map[string]string) error {
	if v.Kind() == reflect.Struct && v.Type() != durationType {
		if n.Kind != yaml.MappingNode {
			if n.Tag == "!!null" {
				return nil
			}
			return keyErr(orRoot(key), "expected a mapping%s", at(n))
		}
		fields := map[string]reflect.Value{}
		t := v.Type()
		for i := 0; i < t.NumField(); i++ {
			fields[yamlName(t.Field(i))] = v.Field(i)
		}
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			name := n.Content[i].Value
			child := name
			if key != "" {
				child = key + "." + name
			}
			f, ok := fields[name]
			if !ok {
				return keyErr(child, "unknown key%s%s", suggestKey(child, everyKey()), at(n.Content[i]))
			}
			if seen[name] {
				return keyErr(child, "duplicate key%s", at(n.Content[i]))
			}
			seen[name] = true
			if err := decodeNode(n.Content[i+1], f, child, origins); err != nil {
				return err
			}
		}
		return nil
	}
	if n.Line > 0 {
		origins[key] = fmt.Sprintf("line %d", n.Line)
	}
	return decodeLeaf(n, v, key)
}

// at is " (line N)" for a node read from the file, and "" for one parsed
// from an environment variable or --set value (line 0), whose line number
// would only mislead.
func at(n *yaml.Node) string {
	if n.Line == 0 {
		return ""
	}
	return fmt.Sprintf(" (line %d)", n.Line)
}

// yamlLine matches the "line N: " prefix of a yaml.v3 type error.
var yamlLine = regexp.MustCompile(`^line \d+: `)

func orRoot(key string) string {
	if key == "" {
		return "(root)"
	}
	return key
}

func decodeLeaf(n *yaml.Node, v reflect.Value, key string) error {
	if v.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode {
		if err := noEmptyItems(n, key); err != nil {
			return err
		}
	}
	switch {
	case v.Kind() == reflect.Slice && n.Kind == yaml.ScalarNode && n.ShortTag() != "!!null" && at(n) != "":
		// From the file (--set and the environment also take a
		// comma-separated string, setFromString): a scalar where a list
		// belongs.
		return keyErr(key, "expected a list such as [a, b], got %q%s", n.Value, at(n))
	case v.Type() == durationType:
		if n.Kind != yaml.ScalarNode {
			return keyErr(key, "expected a duration such as 15s%s", at(n))
		}
		d, err := parseDuration(n.Value)
		if err != nil {
			return keyErr(key, "%v%s", err, at(n))
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.Slice && v.Type().Elem() == durationType:
		if n.Kind != yaml.SequenceNode {
			return keyErr(key, "expected a list of durations%s", at(n))
		}
		out := make([]time.Duration, 0, len(n.Content))
		for _, item := range n.Content {
			d, err := parseDuration(item.Value)
			if err != nil {
				return keyErr(key, "%v%s", err, at(item))
			}
			out = append(out, d)
		}
		v.Set(reflect.ValueOf(out))
	case v.Kind() == reflect.Bool:
		// Only YAML 1.2's own booleans. yaml.v3 also takes YAML 1.1's
		// yes/no/on/off (and a blank value as false), so a blank
		// "enabled:" left by a template, or a typo of "on", turned
		// leases.enabled off without a word: the one switch that lets two
		// instances run every worker at once.
		b, isBool := yamlBools[n.Value]
		switch {
		case n.Kind != yaml.ScalarNode:
			return keyErr(key, "expected true or false%s", at(n))
		case isBool && quoted(n):
			return keyErr(key, "expected true or false, got the quoted string %q%s: write it without quotes", n.Value, at(n))
		case isBool && n.ShortTag() != "!!bool":
			// "!!str true", or a block scalar (| or >): YAML reads it as
			// a string, as it does a quoted one.
			return keyErr(key, "expected true or false, got the string %q%s: write it plainly, with no tag or block style", n.Value, at(n))
		case isBool:
			v.SetBool(b)
		case n.ShortTag() == "!!null":
			return keyErr(key, "expected true or false, got no value%s", at(n))
		default:
			return keyErr(key, "expected true or false, got %q%s", n.Value, at(n))
		}
	case (v.CanInt() || v.CanUint()) && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!float":
		// yaml.v3 would truncate 1.5 to 1 (and accept 1048576.7): an
		// integer key takes an integer. (It also reads a whole number
		// too large for int64 as a float.)
		if wholeNumber(n.Value) {
			return keyErr(key, "%s out of range for this key%s", n.Value, at(n))
		}
		return keyErr(key, "expected a whole number, got %q%s", n.Value, at(n))
	default:
		fresh := reflect.New(v.Type())
		if err := n.Decode(fresh.Interface()); err != nil {
			var te *yaml.TypeError
			if errors.As(err, &te) && len(te.Errors) > 0 {
				if want := wantedKind(v.Kind()); want != "" && n.Kind == yaml.ScalarNode {
					if quotedButFits(n, v.Type()) {
						return keyErr(key, "expected %s, got the quoted string %q%s: write it without quotes", want, n.Value, at(n))
					}
					if (v.CanInt() || v.CanUint()) && wholeNumber(n.Value) && !quoted(n) {
						return keyErr(key, "%s out of range for this key%s", n.Value, at(n))
					}
					return keyErr(key, "expected %s, got %q%s", want, n.Value, at(n))
				}
				return keyErr(key, "%s%s", yamlLine.ReplaceAllString(te.Errors[0], ""), at(n))
			}
			return keyErr(key, "%v", err)
		}
		v.Set(fresh.Elem())
	}
	return nil
}

// wholeNumber reports whether s is written as a whole number (an
// optional sign, then digits), so that a refusal of it for an integer key
// is about its size.
func wholeNumber(s string) bool {
	s = strings.TrimLeft(s, "+-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// quoted reports whether n is a quoted scalar ("…" or '…'), which YAML
// reads as a string whatever it holds.
func quoted(n *yaml.Node) bool {
	return n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0
}

// yamlBools are the booleans a boolean key takes: YAML 1.2's own.
var yamlBools = map[string]bool{"true": true, "True": true, "TRUE": true, "false": false, "False": false, "FALSE": false}

// quotedButFits reports whether n is a quoted scalar ("true", '5') that,
// written without its quotes, would be a value of type t: YAML reads a
// quoted scalar as a string, which is what the operator is then told.
func quotedButFits(n *yaml.Node, t reflect.Type) bool {
	if !quoted(n) {
		return false
	}
	plain := *n
	plain.Style, plain.Tag = 0, ""
	return plain.Decode(reflect.New(t).Interface()) == nil
}

// noEmptyItems refuses a list with an empty element, naming its
// position (1-based) and, from the file, its line: a blank YAML item
// ("-" alone, ~, null, "" or only spaces), or an empty field of a
// comma-separated environment or --set value (setFromString keeps those
// as "" for this check). An empty element is a mistake, such as a
// variable that expanded to nothing, never an entry the operator meant;
// dropping it silently would hide the mistake.
func noEmptyItems(n *yaml.Node, key string) error {
	for i, item := range n.Content {
		if item.Kind == yaml.ScalarNode && (item.ShortTag() == "!!null" || strings.TrimSpace(item.Value) == "") {
			return keyErr(key, "element %d is empty%s", i+1, at(item))
		}
	}
	return nil
}

// wantedKind names what a scalar of kind k must be written as, for the
// refusal of one that is not (yaml.v3's own words, "cannot unmarshal
// !!str `maybe` into bool", name its internals); "" for other kinds.
func wantedKind(k reflect.Kind) string {
	switch k {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return ""
}

// parseDuration is time.ParseDuration that also takes a bare "0".
func parseDuration(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		if durationShaped(s) {
			return 0, fmt.Errorf("duration %q out of range (at most %s)", s, time.Duration(math.MaxInt64).Truncate(time.Hour))
		}
		return 0, fmt.Errorf("unparsable duration %q (want e.g. 500ms, 15s, 2m, 24h)", s)
	}
	return d, nil
}

// durationShaped reports whether s is written as a duration (numbers, each
// with a unit time.ParseDuration knows), so that ParseDuration refused it
// only for its size: at most 2562047h fit in a time.Duration.
func durationShaped(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if s == "" {
		return false
	}
	for s != "" {
		i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
		if i <= 0 || strings.Count(s[:i], ".") > 1 || s[:i] == "." {
			return false // no number, a malformed one, or one without a unit
		}
		s = s[i:]
		unit := false
		for _, u := range []string{"ns", "us", "µs", "μs", "ms", "s", "m", "h"} {
			if strings.HasPrefix(s, u) {
				s, unit = s[len(u):], true
				break
			}
		}
		if !unit {
			return false
		}
	}
	return true
}

// setFromString applies an environment or --set value. Lists take YAML flow
// syntax ([a, b]) or a comma-separated string. An empty value is an empty
// list; an empty field of a comma-separated list (a,,b, a trailing or
// leading comma) is refused by position, like a trailing comma in the
// flow syntax ([a, b,], which YAML itself would read as two elements).
func setFromString(v reflect.Value, key, raw string) error {
	trimmed := strings.TrimSpace(raw)
	trailingComma := false
	switch {
	case v.Kind() == reflect.String:
		v.SetString(raw)
		return nil
	case v.Kind() == reflect.Slice && strings.HasPrefix(trimmed, "["):
		inner, closed := strings.CutSuffix(trimmed, "]")
		trailingComma = closed && strings.HasSuffix(strings.TrimSpace(inner), ",")
	case v.Kind() == reflect.Slice:
		parts := []string{}
		if trimmed != "" {
			for _, p := range strings.Split(raw, ",") {
				parts = append(parts, strconv.Quote(strings.TrimSpace(p)))
			}
		}
		raw = "[" + strings.Join(parts, ", ") + "]"
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(raw), &doc); err != nil || len(doc.Content) == 0 {
		if strings.TrimSpace(raw) == "" {
			return keyErr(key, "got no value") // as a blank key in the file says
		}
		return keyErr(key, "unparsable value %q", logval.MaskURL(raw))
	}
	forgetLines(doc.Content[0])
	if n := doc.Content[0]; trailingComma && n.Kind == yaml.SequenceNode {
		if err := noEmptyItems(n, key); err != nil {
			return err // an earlier empty element is named first
		}
		return keyErr(key, "element %d is empty (a trailing comma)", len(n.Content)+1)
	}
	return decodeLeaf(doc.Content[0], v, key)
}

// forgetLines zeroes the line numbers of a value that did not come from
// the file (see at).
func forgetLines(n *yaml.Node) {
	n.Line = 0
	for _, c := range n.Content {
		forgetLines(c)
	}
}

// durationFloor is the least value a duration key takes, and why.
type durationFloor struct {
	key      string
	got, min time.Duration
	why      string
}

// durationFloors lists the duration keys whose positive but tiny values
// (1ns passes "must be positive") would break the instance rather than
// tune it: a loop with no pause, a timeout no request or stop can meet,
// a stream dropped before its first event. The floors sit well below any
// value an operator would mean and below every value the test suites use.
func durationFloors(c Config) []durationFloor {
	const (
		loop    = "a shorter interval runs the loop with no pause"
		request = "no request completes in less"
		stream  = "a quieter stream would be dropped and redialed without pause"
	)
	ms := time.Millisecond
	return []durationFloor{
		{"shutdown_timeout", c.ShutdownTimeout, 100 * ms, "a stop cannot release its leases in less"},
		{"jetstream.stale_timeout", c.Jetstream.StaleTimeout, 100 * ms, stream},
		{"jetstream.unhealthy_after", c.Jetstream.UnhealthyAfter, 100 * ms, "a shorter silence is no sign of trouble"},
		{"jetstream.failback_interval", c.Jetstream.FailbackInterval, time.Second, "the probes would load the earlier hosts"},
		{"jetstream.commit_budget", c.Jetstream.CommitBudget, ms, "a transaction would commit every group of events"},
		{"backfill.interval", c.Backfill.Interval, time.Second, "a shorter interval walks every repository of the relays again with no pause"},
		{"cleanup.interval", c.Cleanup.Interval, 100 * ms, loop},
		{"labeler.stale_timeout", c.Labeler.StaleTimeout, 100 * ms, stream},
		{"billing.interval", c.Billing.Interval, 100 * ms, loop},
		{"billing.timeout", c.Billing.Timeout, 10 * ms, request},
		{"health.check_interval", c.Health.CheckInterval, 100 * ms, loop},
		{"health.timeout", c.Health.Timeout, 10 * ms, request},
		{"webhooks.timeout", c.Webhooks.Timeout, 10 * ms, request},
	}
}

// maxWantedCollections is Jetstream's limit on wantedCollections (its
// subscribe handler answers more with HTTP 400).
const maxWantedCollections = 100

// Validate checks the relations between keys. It returns the first problem
// as a *Error.
func (c Config) Validate() error {
	if err := checkInstanceID(c.InstanceID); err != nil {
		return err
	}
	l := c.Leases
	switch {
	case c.ShutdownTimeout <= 0:
		return keyErr("shutdown_timeout", "must be positive, got %s", c.ShutdownTimeout)
	case !validLogLevel(c.LogLevel):
		return keyErr("log_level", "want debug, info, warn or error, got %q", c.LogLevel)
	case c.Database.BusyTimeout < 0:
		return keyErr("database.busy_timeout", "must not be negative")
	case c.Database.BusyTimeout < MinBusyTimeout:
		return keyErr("database.busy_timeout", "must be at least %s (below it a lock held by an ordinary commit fails lease renewals and writes that only had to wait), got %s",
			short(MinBusyTimeout), short(c.Database.BusyTimeout))
	// Operator floors and ceilings first; the relations the custody
	// guarantee rests on are the lease package's own (Timing.Validate,
	// also checked by the LeaseActor's constructor).
	case l.TTL > 0 && l.TTL < MinLeaseTTL:
		return keyErr("leases.ttl", "must be at least %s, got %s", short(MinLeaseTTL), short(l.TTL))
	case l.TTL > MaxLeaseTTL:
		return keyErr("leases.ttl", "must be at most %s, got %s", short(MaxLeaseTTL), short(l.TTL))
	case l.RenewInterval > 0 && l.RenewInterval < MinLeaseRenewInterval:
		return keyErr("leases.renew_interval", "must be at least %s, got %s", short(MinLeaseRenewInterval), short(l.RenewInterval))
	case l.RenewDeadline > 0 && l.RenewDeadline < MinLeaseRenewDeadline:
		return keyErr("leases.renew_deadline", "must be at least %s, got %s", short(MinLeaseRenewDeadline), short(l.RenewDeadline))
	case l.RetryInterval > 0 && l.RetryInterval < MinLeaseRetryInterval:
		return keyErr("leases.retry_interval", "must be at least %s, got %s", short(MinLeaseRetryInterval), short(l.RetryInterval))
	case l.YieldGrace < 0:
		return keyErr("leases.yield_grace", "must not be negative, got %s", l.YieldGrace)
	case l.MinHold < 0:
		return keyErr("leases.min_hold", "must not be negative, got %s", l.MinHold)
	}
	if err := l.Timing().Validate(); err != nil {
		var te *leasestore.TimingError
		if errors.As(err, &te) {
			return keyErr(te.Key, "%s", te.Reason)
		}
		return keyErr("leases", "%v", err)
	}
	if _, err := database.ParseURL(c.Database.URL); err != nil {
		return keyErr("database.url", "%v", err)
	}
	if c.Admin.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Admin.Addr); err != nil {
			return keyErr("admin.addr", "want host:port: %v", err)
		}
	}
	if c.Admin.Token != "" && len(c.Admin.Token) < MinTokenLength {
		if c.Admin.TokenFile != "" {
			return keyErr("admin.token_file", "the token in %s must be at least %d characters (got %d)", c.Admin.TokenFile, MinTokenLength, len(c.Admin.Token))
		}
		return keyErr("admin.token", "must be at least %d characters (got %d)", MinTokenLength, len(c.Admin.Token))
	}
	if c.Admin.Token != "" && strings.ContainsAny(c.Admin.Token, " \t\r\n") {
		return keyErr("admin.token", "must not contain whitespace (it is sent in an Authorization header)")
	}
	if c.Admin.Addr != "" && c.Admin.Token == "" && !c.Admin.AllowUnauthenticated && !loopbackOnly(c.Admin.Addr) {
		return keyErr("admin.token", "required when admin.addr (%s) is not a loopback address: set admin.token or admin.token_file, "+
			"or admin.allow_unauthenticated: true to serve the admin endpoint to anyone who reaches it", c.Admin.Addr)
	}
	if c.Admin.ProtectMetrics && c.Admin.Token == "" {
		return keyErr("admin.protect_metrics", "needs admin.token or admin.token_file")
	}
	if c.Admin.AdvertiseURL != "" {
		if err := checkURL("admin.advertise_url", c.Admin.AdvertiseURL, "http", "https"); err != nil {
			return err
		}
	}
	if len(c.Jetstream.URLs) == 0 {
		return keyErr("jetstream.urls", "must list at least one endpoint")
	}
	if err := checkList("jetstream.urls", c.Jetstream.URLs, sameEndpoint); err != nil {
		return err
	}
	for _, u := range c.Jetstream.URLs {
		if err := checkURL("jetstream.urls", u, "ws", "wss"); err != nil {
			return err
		}
		if err := checkJetstreamPath(u); err != nil {
			return err
		}
		if err := checkJetstreamQuery(u); err != nil {
			return err
		}
	}
	if len(c.Jetstream.Collections) == 0 {
		// Jetstream reads an absent wantedCollections as "everything": an
		// empty list would subscribe this instance to the whole firehose.
		return keyErr("jetstream.collections", "must list at least one NSID or prefix.* (an empty list subscribes to the whole firehose)")
	}
	if err := checkList("jetstream.collections", c.Jetstream.Collections, strings.TrimSpace); err != nil {
		return err
	}
	for _, col := range c.Jetstream.Collections {
		if !atproto.ValidNSIDPattern(col) {
			return keyErr("jetstream.collections", "%q is not an NSID or NSID prefix ending in .*", col)
		}
	}
	if n := len(c.Jetstream.Collections); n > maxWantedCollections {
		return keyErr("jetstream.collections", "%d collections: Jetstream accepts at most %d", n, maxWantedCollections)
	}
	// A key's floor is its own bound, so it comes before the rules relating
	// keys (health.timeout below health.check_interval); zero and negative
	// values are left to the "must be positive" cases below.
	for _, f := range durationFloors(c) {
		if f.got > 0 && f.got < f.min {
			return keyErr(f.key, "must be at least %s (%s), got %s", short(f.min), f.why, f.got)
		}
	}
	switch {
	case c.Jetstream.Rewind < 0:
		return keyErr("jetstream.rewind", "must not be negative")
	case c.Jetstream.StaleTimeout <= 0:
		return keyErr("jetstream.stale_timeout", "must be positive")
	case c.Jetstream.FailbackInterval < 0:
		return keyErr("jetstream.failback_interval", "must not be negative (0: never switch back)")
	case c.Jetstream.UnhealthyAfter <= 0:
		return keyErr("jetstream.unhealthy_after", "must be positive")
	case c.Jetstream.ResyncInterval < time.Millisecond:
		return keyErr("jetstream.resync_interval", "must be at least 1ms, got %v", c.Jetstream.ResyncInterval)
	case c.Jetstream.CommitBudget <= 0:
		return keyErr("jetstream.commit_budget", "must be positive, got %v", c.Jetstream.CommitBudget)
	case c.Jetstream.MaxMessageBytes < MinMaxMessageBytes:
		return keyErr("jetstream.max_message_bytes", "must be at least %d (1 KiB), got %d", MinMaxMessageBytes, c.Jetstream.MaxMessageBytes)
	case c.Jetstream.MaxMessageBytes > MaxMaxMessageBytes:
		return keyErr("jetstream.max_message_bytes", "must be at most %d (64 MiB), got %d", MaxMaxMessageBytes, c.Jetstream.MaxMessageBytes)
	case c.Backfill.Interval < 0:
		return keyErr("backfill.interval", "must not be negative")
	case c.Backfill.RerunAfter < 0:
		return keyErr("backfill.rerun_after", "must not be negative")
	case c.Backfill.Concurrency < 1:
		return keyErr("backfill.concurrency", "must be at least 1")
	case c.Cleanup.Interval <= 0:
		return keyErr("cleanup.interval", "must be positive")
	case c.Cleanup.ChunkRows < 1:
		return keyErr("cleanup.chunk_rows", "must be at least 1")
	case c.Labeler.StaleTimeout <= 0:
		return keyErr("labeler.stale_timeout", "must be positive, got %s", c.Labeler.StaleTimeout)
	case c.Billing.Timeout <= 0:
		return keyErr("billing.timeout", "must be positive")
	case c.Billing.DefaultTierRank < 0:
		return keyErr("billing.default_tier_rank", "must not be negative")
	case c.Health.Concurrency < 1:
		return keyErr("health.concurrency", "must be at least 1")
	// Each key's own bounds come before the rule relating them, so a
	// zero check_interval is reported as itself, not as a timeout too long.
	case c.Health.CheckInterval <= 0:
		return keyErr("health.check_interval", "must be positive, got %s", c.Health.CheckInterval)
	case c.Health.Timeout <= 0:
		return keyErr("health.timeout", "must be positive, got %s", c.Health.Timeout)
	case c.Health.Timeout >= c.Health.CheckInterval:
		return keyErr("health.timeout", "must be below health.check_interval (%s), got %s", c.Health.CheckInterval, c.Health.Timeout)
	case c.Webhooks.Concurrency < 1:
		return keyErr("webhooks.concurrency", "must be at least 1, got %d", c.Webhooks.Concurrency)
	case c.Cleanup.Retention <= 0:
		return keyErr("cleanup.retention", "must be positive")
	case c.Billing.Interval <= 0:
		return keyErr("billing.interval", "must be positive")
	case len(c.Webhooks.RetrySchedule) == 0:
		return keyErr("webhooks.retry_schedule", "must list at least one delay (the first attempt)")
	case c.Webhooks.Timeout <= 0:
		return keyErr("webhooks.timeout", "must be positive")
	}
	for _, d := range c.Webhooks.RetrySchedule {
		if d < 0 {
			return keyErr("webhooks.retry_schedule", "delays must not be negative")
		}
	}
	if err := checkURL("webhooks.public_url", c.Webhooks.PublicURL, "http", "https"); err != nil {
		return err
	}
	if err := checkList("backfill.relay_endpoints", c.Backfill.RelayEndpoints, sameEndpoint); err != nil {
		return err
	}
	if c.Backfill.Enabled && len(c.Backfill.RelayEndpoints) == 0 {
		return keyErr("backfill.relay_endpoints", "must list at least one relay when backfill.enabled is true")
	}
	// URLs are checked whether or not their worker is on: a URL that is
	// wrong (or carries credentials) is wrong before the day it is used.
	for _, u := range c.Backfill.RelayEndpoints {
		if err := checkURL("backfill.relay_endpoints", u, "http", "https"); err != nil {
			return err
		}
	}
	if err := checkURL("identity.plc_url", c.Identity.PLCURL, "http", "https"); err != nil {
		return err
	}
	if c.Identity.HandleWellKnownURL != "" {
		if err := checkURL("identity.handle_well_known_url", c.Identity.HandleWellKnownURL, "http", "https"); err != nil {
			return err
		}
	}
	if c.Labeler.URL != "" {
		if err := checkURL("labeler.url", c.Labeler.URL, "http", "https", "ws", "wss"); err != nil {
			return err
		}
	}
	if c.Billing.Enabled && c.Billing.StripeSecretKey == "" {
		return keyErr("billing.stripe_secret_key", "required when billing.enabled is true")
	}
	if c.Billing.Enabled || c.Billing.StripeAPIURL != "" {
		if err := checkURL("billing.stripe_api_url", c.Billing.StripeAPIURL, "http", "https"); err != nil {
			return err
		}
	}
	return nil
}

// checkList refuses an empty element and an element listed twice in the
// list-valued key key, naming the element's position (1-based). Two
// elements are the same when same gives them the same form. (Loading
// already refuses empty elements by position, with the file's line; this
// covers a Config built in code too.) webhooks.retry_schedule, the one
// list of durations, is not checked for repeats: a schedule may space
// several attempts alike (0s, 30s, 30s).
func checkList(key string, items []string, same func(string) string) error {
	first := make(map[string]int, len(items))
	for i, item := range items {
		if strings.TrimSpace(item) == "" {
			return keyErr(key, "element %d is empty", i+1)
		}
		form := same(item)
		j, seen := first[form]
		switch {
		case !seen:
			first[form] = i
		case strings.TrimSpace(items[j]) == strings.TrimSpace(item):
			return keyErr(key, "%q is listed twice (elements %d and %d)", redacted(strings.TrimSpace(item)), j+1, i+1)
		default:
			return keyErr(key, "element %d (%q) is the same endpoint as element %d (%q); list it once", i+1, redacted(item), j+1, redacted(items[j]))
		}
	}
	return nil
}

// redacted is s with a URL's password replaced by xxxxx (s itself when
// it is not a URL with one), for error messages.
func redacted(s string) string {
	if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
		return u.Redacted()
	}
	return logval.MaskURL(s)
}

// sameEndpoint is the form in which two endpoint URLs of a list are
// compared: surrounding whitespace dropped, the URL's canonical form
// (outbound.Canonical: scheme and host case, the scheme's default port —
// wss://h:443/x is wss://h/x, and so is an empty port, wss://h:/x —
// percent-encoding and dot segments make no difference), and one
// trailing slash of the path dropped. A trailing slash counts as the same
// endpoint because the code that uses these lists ignores it too:
// backfill trims it from a relay's base URL before appending /xrpc/...,
// and Jetstream's wire is chosen by the path without it. Listing one
// endpoint twice would only make the consumer or the backfill fail over
// to the host it is leaving. A URL that does not parse is compared as
// written (its own check refuses it).
func sameEndpoint(raw string) string {
	raw = strings.TrimSpace(raw)
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	c, err := url.Parse(outbound.CanonicalURL(u))
	if err != nil {
		return raw
	}
	c.Path = strings.TrimSuffix(c.Path, "/")
	c.RawPath = strings.TrimSuffix(c.RawPath, "/")
	return c.String()
}

// short renders d as an operator writes it: 1h rather than 1h0m0s.
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") { // 2m0s, 1h0m0s
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") { // 1h0m
		s = s[:len(s)-2]
	}
	return s
}

func validLogLevel(s string) bool {
	switch s {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

// checkURL refuses, naming key, a URL outbound.Check refuses for schemes.
func checkURL(key, raw string, schemes ...string) error {
	_, err := outbound.CheckURL(raw, schemes...)
	var e *outbound.URLError
	switch {
	case errors.As(err, &e) && e.Credentials:
		// No URL key takes credentials. A websocket endpoint
		// (jetstream.urls, labeler.url) is dialed by gorilla/websocket,
		// which refuses a URL with them (RFC 6455 §3 has no userinfo):
		// accepted, it would fail every dial for ever and log the
		// password with each failure. The others are public endpoints
		// (relays, PLC, Stripe's API) or this instance's own URLs, which
		// are stored in the database (admin.advertise_url, a backfill's
		// relay) or sent to others (webhooks.public_url): a password
		// there would be logged, stored or handed out.
		if slices.Contains(schemes, "ws") {
			return keyErr(key, "%s, which an endpoint dialed as a websocket cannot send; remove them", e.Reason)
		}
		return keyErr(key, "%s, which would be logged and stored in the clear; remove them", e.Reason)
	case err != nil:
		return keyErr(key, "%s", err.Error())
	}
	return nil
}

// The two Jetstream paths (internal/jetstream WireOf; this package does
// not import it): the v2 XRPC method and the legacy /subscribe.
const (
	jetstreamPathV2     = "/xrpc/network.bsky.jetstream.subscribeEvents"
	jetstreamPathLegacy = "/subscribe"
)

// jetstreamQuerySet are the subscription parameters the consumer sets on
// every connection itself (from jetstream.collections, its position and
// jetstream.compress); jetstreamQueryNarrowing are those that would narrow
// the stream under it. Jetstream (v1 and v2) reads both sets; a URL
// carrying one is refused rather than overridden or passed on.
var (
	jetstreamQuerySet = map[string]string{
		"wantedCollections": "from jetstream.collections", "collections": "from jetstream.collections",
		"cursor": "at its stored position", "compress": "after jetstream.compress",
		"zstdDictionary": "after jetstream.compress",
	}
	jetstreamQueryNarrowing = map[string]string{
		"wantedDids":          "commits of other repositories would never arrive",
		"dids":                "commits of other repositories would never arrive",
		"kinds":               "identity, account or #sync events (takedowns, deactivations, re-reads) could stop arriving",
		"maxMessageSizeBytes": "the host would drop larger events silently, where the consumer counts and logs each",
	}
)

// checkJetstreamQuery refuses a jetstream.urls entry whose query sets a
// subscription parameter: one the consumer sets itself, one that narrows
// the stream (a filter by DID or event kind, a size limit), or, on the v2
// path, requireHello (the v2 wire takes no client frames, so the host
// would wait forever; Jetstream v2 answers 400). Other parameters (a
// proxy's token) are kept and sent.
func checkJetstreamQuery(raw string) error {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil // checkURL reported it
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return keyErr("jetstream.urls", "%q: query: %v", raw, err)
	}
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if from, ok := jetstreamQuerySet[k]; ok {
			return keyErr("jetstream.urls", "%q: remove %s=: the consumer sets it on every connection, %s", raw, k, from)
		}
		if why, ok := jetstreamQueryNarrowing[k]; ok {
			return keyErr("jetstream.urls", "%q: remove %s=: %s", raw, k, why)
		}
		if k == "requireHello" && strings.TrimSuffix(u.Path, "/") == jetstreamPathV2 {
			return keyErr("jetstream.urls", "%q: remove requireHello=: the v2 wire takes no client messages (Jetstream v2 refuses it)", raw)
		}
	}
	return nil
}

// checkJetstreamPath refuses a jetstream.urls element whose path is
// neither Jetstream path (one trailing slash aside): exactly the v2 path
// (WireOf picks the v2 wire only for it), or one ending in /subscribe (a
// proxy's prefix before it is kept; the legacy wire dials it as given).
// Anything else the consumer would dial as the legacy wire and retry its
// failed handshake for ever (a typo of the v2 path, "/x"), as labeler.url
// would.
func checkJetstreamPath(raw string) error {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil // checkURL reported it
	}
	p := strings.TrimSuffix(u.Path, "/")
	if p == jetstreamPathV2 || strings.HasSuffix(p, jetstreamPathLegacy) {
		return nil
	}
	return keyErr("jetstream.urls", "%q: path %q is neither %s (Jetstream v2) nor %s (legacy); give the full endpoint URL", raw, u.Path, jetstreamPathV2, jetstreamPathLegacy)
}

// readConfigFile reads the --config file, at most MaxConfigFileBytes: a
// longer one (or one that never ends) is an error naming the bound.
// Errors name the file.
func readConfigFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxConfigFileBytes {
		return nil, fmt.Errorf("%s is larger than %d bytes (1 MiB): not a configuration file", path, MaxConfigFileBytes)
	}
	return data, nil
}
