package config

import (
	"reflect"
	"slices"
	"strings"
	"time"
)

// EnvName is the environment variable for a dotted key: leases.ttl → APPVIEW_LEASES_TTL.
func EnvName(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

var durationType = reflect.TypeOf(time.Duration(0))

// leafFields maps every dotted key under v (a section) to its settable field.
func leafFields(v reflect.Value, prefix string) map[string]reflect.Value {
	out := map[string]reflect.Value{}
	for _, f := range fieldsOf(v) {
		key := f.name
		if prefix != "" {
			key = prefix + "." + f.name
		}
		if f.v.Kind() == reflect.Struct && f.v.Type() != durationType {
			for k, fv := range leafFields(f.v, key) {
				out[k] = fv
			}
			continue
		}
		out[key] = f.v
	}
	return out
}

// field is one key of a section: its YAML name and its value, and
// whether it is a secret (tagged secret:"true").
type field struct {
	name   string
	v      reflect.Value
	secret bool
}

// fieldsOf lists the keys of the section v (an addressable struct) in
// order: its fields but those tagged yaml:"-", and at the root (Config)
// then the section of every registered worker (Config.Workers).
func fieldsOf(v reflect.Value) []field {
	var out []field
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if name := yamlName(t.Field(i)); name != "-" {
			out = append(out, field{name, v.Field(i), t.Field(i).Tag.Get("secret") == "true"})
		}
	}
	if c, ok := v.Addr().Interface().(*Config); ok {
		for i := range c.Workers {
			out = append(out, field{c.Workers[i].Keys.Section, reflect.ValueOf(&c.Workers[i]).Elem(), false})
		}
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
func everyKey(leaves map[string]reflect.Value) map[string]bool {
	keys := map[string]bool{}
	for key := range leaves {
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
