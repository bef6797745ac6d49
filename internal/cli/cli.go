// Package cli is the command-line plumbing shared by the two binaries,
// `appview` (the product, docs/spec.md §2) and `appview-dev` (developer
// tools): exit codes, the one-line refusal of a bad start, strict usage
// errors, the --config/--set flags and opening the configured database.
package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/config"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // a runtime failure, a forced stop, or a database unavailable at start (*TransientError: restart it)
	ExitConfig  = 2 // refused at start: bad configuration, unusable database, or a usage error (restarting repeats it)
)

// StartError is a problem found before anything started; it exits 2.
// Its line is Err's; Detail, when set, is the whole error behind it (a
// database driver's own words), which only a debug line shows.
type StartError struct {
	Err    error
	Detail string
}

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// Refuse is a *StartError about key: a configuration key (leases.ttl,
// database.url) is reported as a *config.Error, "config: leases.ttl:
// reason"; a flag (--file, --listen: key starts with "-") as a
// *FlagError, "--file: reason", since a flag such as jetstream-replay's,
// or appview-dev's, is no part of the configuration.
func Refuse(key, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	if strings.HasPrefix(key, "-") {
		return &StartError{Err: &FlagError{Flag: key, Reason: reason}}
	}
	return &StartError{Err: &config.Error{Key: key, Reason: reason}}
}

// FlagError is a refusal about the value of a command-line flag that is
// not a configuration key: a capture that does not exist, an address that
// cannot be bound. Its line names the flag and the reason.
type FlagError struct {
	// Flag is the flag as typed, e.g. "--file".
	Flag string
	// Reason says what is wrong with its value.
	Reason string
}

func (e *FlagError) Error() string { return e.Flag + ": " + e.Reason }

// Exit prints err as one stderr line prefixed with name and returns the
// exit code: ExitOK for nil, ExitConfig for a refusal before anything ran
// (a *config.Error, *StartError or *UsageError), else ExitFailure (a
// *TransientError among them).
func Exit(name string, err error) int {
	if err == nil {
		return ExitOK
	}
	// A refusal is one stderr line (docs/spec.md §3); driver errors embed newlines.
	fmt.Fprintln(os.Stderr, name+":", admin.OneLine(err.Error()))
	var cfgErr *config.Error
	var se *StartError
	var ue *UsageError
	if errors.As(err, &cfgErr) || errors.As(err, &se) || errors.As(err, &ue) {
		return ExitConfig
	}
	return ExitFailure
}

// ConfigFlags are the flags every command that reads the configuration takes.
type ConfigFlags struct {
	// Workers are the sections of the registered workers that own one
	// (config.Sources.Workers): set them before Load.
	Workers []config.WorkerKeys

	file string
	sets []string
	// warnings are what the last Load said about APPVIEW_* variables that
	// name no key (Warnings, PrintWarnings).
	warnings []string
	// origins are where the last Load found each key's value (Explain).
	origins map[string]string
}

// Register adds --config and --set to cmd and every command under it.
// --config is given at most once (a *RepeatedFlagError otherwise); --set
// repeats.
func (f *ConfigFlags) Register(cmd *cobra.Command) {
	// One file: a second --config would silently replace the first (an
	// operator's "base + overlay" would run on the overlay alone).
	SingleVar(cmd.PersistentFlags(), &f.file, "config", "", "YAML configuration file, given once (default: built-in defaults)",
		"one configuration file is read; put overrides in --set KEY=VALUE or APPVIEW_* variables")
	cmd.PersistentFlags().StringArrayVar(&f.sets, "set", nil, "override one key, e.g. --set leases.ttl=20s (beats file and environment)")
}

// Load reads the configuration: defaults < file < environment < --set.
// Its error is a *config.Error. An APPVIEW_* variable that is not a key is
// not fatal (the environment is shared with deploy scripts and
// Kubernetes): its warning is kept for Warnings and PrintWarnings.
func (f *ConfigFlags) Load() (config.Config, error) {
	cfg, problems := f.Check()
	return cfg, problems.Err()
}

// Check is Load returning every problem (config.Check), for `config
// check`: the same sources read the same way as for `serve`.
func (f *ConfigFlags) Check() (config.Config, config.Problems) {
	f.warnings, f.origins = nil, map[string]string{}
	return config.Check(config.Sources{File: f.file, Environ: os.Environ(), Sets: f.sets, Workers: f.Workers,
		Warn: func(msg string) { f.warnings = append(f.warnings, msg) }, Origins: f.origins})
}

// Explain adds to a refusal made after Load where the value of the key it
// names came from, as Load's own refusals say: "(from --set)", "(line 4)",
// "(from APPVIEW_DATABASE_URL)". It covers a *StartError about a
// configuration key (an admin.addr port in use, a database.url that
// cannot be opened) and a *TransientError; anything else, or a key left
// at its default, is returned as it is.
func (f *ConfigFlags) Explain(err error) error {
	switch e := err.(type) {
	case *StartError:
		if ce, ok := e.Err.(*config.Error); ok {
			return &StartError{Err: config.PointAt(ce, f.origins), Detail: e.Detail}
		}
	case *TransientError:
		if o, ok := f.origins[e.Key]; ok {
			return &TransientError{Key: e.Key, Reason: e.Reason + " (" + o + ")", Detail: e.Detail}
		}
	}
	return err
}

// File is the --config file ("" when none was given).
func (f *ConfigFlags) File() string { return f.file }

// UseFile makes path the configuration file, as --config does, for a
// command that takes it as an argument (`config check FILE`). It is an
// error when --config names another file.
func (f *ConfigFlags) UseFile(path string) error {
	if f.file != "" && f.file != path {
		return fmt.Errorf("two configuration files (--config %s and %s): give one", f.file, path)
	}
	f.file = path
	return nil
}

// Origins are where the last Load or Check found each key's value
// (config.Sources.Origins): for config.Show.
func (f *ConfigFlags) Origins() map[string]string { return f.origins }

// Warnings returns the warnings of the last Load; serve logs them as JSON
// lines.
func (f *ConfigFlags) Warnings() []string { return f.warnings }

// PrintWarnings writes the warnings of the last Load on stderr, one
// "appview: warning: ..." line each, for the commands that do not log
// JSON.
func (f *ConfigFlags) PrintWarnings() {
	for _, w := range f.warnings {
		fmt.Fprintln(os.Stderr, "appview: warning:", w)
	}
}
