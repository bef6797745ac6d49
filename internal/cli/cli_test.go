package cli

import (
	"errors"
	"testing"

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
