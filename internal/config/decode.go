package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/atcr-io/appview/internal/logval"
)

// decodeYAML walks the document against the struct so that an unknown key
// or a bad value is reported with its full dotted path; every problem
// goes to p. A file holds one document: yaml.Unmarshal would read the
// first and silently drop the rest (settings the operator believes are
// applied), so a second one, even an empty one after a trailing "---", is
// refused. It reports false when the file is not one YAML document (what
// it meant is unknown).
//
// Each key set gets its line in origins ("line N").
func decodeYAML(data []byte, cfg *Config, origins map[string]string, p *problemList) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF): // empty file, or only comments: defaults
		return true
	case err != nil:
		p.add(&Error{Key: "--config", Reason: "invalid YAML: " + err.Error()})
		return false
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		p.fail("--config", "more than one YAML document (a second one starts at line %d); keep one", next.Line)
		return false
	case !errors.Is(err, io.EOF):
		p.add(&Error{Key: "--config", Reason: "more than one YAML document, and the second is invalid: " + err.Error()})
		return false
	}
	if len(doc.Content) > 0 {
		root := reflect.ValueOf(cfg).Elem()
		decodeNode(doc.Content[0], root, root, "", origins, p)
	}
	return true
}

// decodeNode decodes n into v, the field of key in root (the Config), and
// each key under it;
// each unknown key, key given twice and bad value is a problem in p, and
// the rest is still decoded.
func decodeNode(n *yaml.Node, root, v reflect.Value, key string, origins map[string]string, p *problemList) {
	if v.Kind() != reflect.Struct || v.Type() == durationType {
		if n.Line > 0 {
			origins[key] = fmt.Sprintf("line %d", n.Line)
		}
		p.add(decodeLeaf(n, v, key))
		return
	}
	if n.Kind != yaml.MappingNode {
		if n.Tag != "!!null" {
			p.fail(orRoot(key), "expected a mapping%s", at(n))
		}
		return
	}
	fields := map[string]reflect.Value{}
	for _, f := range fieldsOf(v) {
		fields[f.name] = f.v
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		name := n.Content[i].Value
		child := name
		if key != "" {
			child = key + "." + name
		}
		f, ok := fields[name]
		switch {
		case !ok:
			p.fail(child, "unknown key%s%s", suggestKey(child, everyKey(leafFields(root, ""))), at(n.Content[i]))
		case seen[name]:
			p.fail(child, "duplicate key%s", at(n.Content[i]))
		default:
			seen[name] = true
			decodeNode(n.Content[i+1], root, f, child, origins, p)
		}
	}
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
	case (v.CanInt() || v.CanUint()) && n.Kind == yaml.ScalarNode && !quoted(n) && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float"):
		// An integer key takes a whole number in decimal. yaml.v3 reads
		// 010 as 8, 0x10 as 16 and 1_000 as 1000, truncates 1.5 to 1,
		// and reads 08 and a whole number too large for int64 as floats.
		if !wholeNumber(n.Value) {
			if n.ShortTag() == "!!int" { // 0x10, 0o10, 0b11, 1_000
				return keyErr(key, "expected a whole number in decimal digits, got %q%s", n.Value, at(n))
			}
			return keyErr(key, "expected a whole number, got %q%s", n.Value, at(n))
		}
		bits := v.Type().Bits()
		if v.CanInt() {
			i, err := strconv.ParseInt(n.Value, 10, bits)
			if err != nil {
				return keyErr(key, "%s out of range for this key%s", n.Value, at(n))
			}
			v.SetInt(i)
		} else {
			u, err := strconv.ParseUint(strings.TrimPrefix(n.Value, "+"), 10, bits)
			if err != nil {
				return keyErr(key, "%s out of range for this key%s", n.Value, at(n))
			}
			v.SetUint(u)
		}
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
