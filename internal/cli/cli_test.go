package cli

import (
	"errors"
	"io"
	"testing"

	"github.com/spf13/pflag"

	"github.com/atcr-io/appview/internal/config"
)

// A refusal names what it is about: a configuration key as a config
// error, a flag of a command as itself, never as configuration.
func TestRefuseNamesAKeyAsConfigurationAndAFlagAsItself(t *testing.T) {
	for _, tc := range []struct {
		key, want string
		isConfig  bool
	}{
		{"database.url", "config: database.url: cannot open", true},
		{"admin.addr", "config: admin.addr: cannot open", true},
		{"--file", "--file: cannot open", false},
		{"--listen", "--listen: cannot open", false},
		{"-n", "-n: cannot open", false},
	} {
		err := Refuse(tc.key, "cannot %s", "open")
		var se *StartError
		var ce *config.Error
		var fe *FlagError
		switch {
		case !errors.As(err, &se):
			t.Errorf("Refuse(%q) = %T, want a *StartError (exit 2)", tc.key, err)
		case err.Error() != tc.want:
			t.Errorf("Refuse(%q) = %q, want %q", tc.key, err, tc.want)
		case errors.As(err, &ce) != tc.isConfig || errors.As(err, &fe) == tc.isConfig:
			t.Errorf("Refuse(%q): config error %v, flag error %v; want config %v", tc.key, ce != nil, fe != nil, tc.isConfig)
		}
	}
}

// A flag defined with SingleVar keeps its default until given, takes one
// value, and refuses a second one naming both instead of keeping the last.
func TestSingleVarRefusesASecondValue(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    string
		refused string
	}{
		{nil, "default.yaml", ""},
		{[]string{"--config", "a.yaml"}, "a.yaml", ""},
		{[]string{"--config=a.yaml", "--config", "b.yaml"}, "", `--config given twice ("a.yaml", then "b.yaml"): use --set`},
		{[]string{"--config", "a.yaml", "--config", "a.yaml"}, "", `--config given twice ("a.yaml", then "a.yaml"): use --set`},
	} {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var v string
		SingleVar(fs, &v, "config", "default.yaml", "a file", "use --set")
		err := fs.Parse(tc.args)
		var rep *RepeatedFlagError
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.refused == "" && v != tc.want:
			t.Errorf("%q: value %q, want %q", tc.args, v, tc.want)
		case tc.refused != "" && !errors.As(err, &rep):
			t.Errorf("%q: error %v, want a *RepeatedFlagError", tc.args, err)
		case tc.refused != "" && rep.Error() != tc.refused:
			t.Errorf("%q: %q, want %q", tc.args, rep.Error(), tc.refused)
		}
	}
}
