package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/atcr-io/appview/internal/logval"
)

// Masked stands for the value of a secret that is set: Show never writes
// a secret, nor its length.
const Masked = `"********"`

// Show is cfg as YAML, for `appview config show`: every key, in the order
// of the sample, with a comment saying where its value came from, as
// origins says (what Load wrote in Sources.Origins): "default",
// "FILE:LINE" (file is the --config path), "APPVIEW_…", "--set"; and for
// the generated instance_id, "generated". The value of a secret
// (admin.token, database.auth_token, billing.stripe_secret_key) is
// written as Masked when set; a URL's password as xxxxx.
func Show(cfg Config, origins map[string]string, file string) string {
	var b strings.Builder
	b.WriteString("# appview configuration in effect: defaults < --config file < APPVIEW_* < --set; secrets not shown\n")
	showSection(&b, reflect.ValueOf(&cfg).Elem(), "", func(key string) string {
		o, ok := origins[key]
		switch {
		case strings.HasPrefix(o, "line "):
			return file + ":" + strings.TrimPrefix(o, "line ")
		case ok:
			return strings.TrimPrefix(o, "from ")
		case key == "instance_id" && cfg.InstanceID != Default().InstanceID:
			return "generated"
		case key == "admin.token" && cfg.Admin.TokenFile != "":
			return "read from admin.token_file"
		}
		return "default"
	})
	return b.String()
}

// showSection writes the keys of section v (at key prefix) with their
// sources.
func showSection(b *strings.Builder, v reflect.Value, prefix string, source func(key string) string) {
	indent := strings.Repeat("  ", strings.Count(prefix, ".")+min(len(prefix), 1))
	for _, f := range fieldsOf(v) {
		key := f.name
		if prefix != "" {
			key = prefix + "." + f.name
		}
		if f.v.Kind() == reflect.Struct && f.v.Type() != durationType {
			fmt.Fprintf(b, "\n%s%s:\n", indent, f.name)
			showSection(b, f.v, key, source)
			continue
		}
		value := showValue(f.v)
		if f.secret && !f.v.IsZero() {
			value = Masked
		}
		fmt.Fprintln(b, sampleLine(indent+f.name+": "+value, source(key)))
	}
}

// showValue writes a key's value as the sample does: strings quoted
// (a URL's password masked), durations as an operator writes them, lists
// in flow style.
func showValue(v reflect.Value) string {
	switch {
	case v.Type() == durationType:
		return short(time.Duration(v.Int()))
	case v.Kind() == reflect.String:
		return strconv.Quote(logval.MaskURL(v.String()))
	case v.Kind() == reflect.Slice:
		items := make([]string, v.Len())
		for i := range items {
			items[i] = showValue(v.Index(i))
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}
