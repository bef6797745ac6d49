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
