// Command appview runs the background worker runtime of an AT Protocol
// container registry AppView (SPEC §2): `serve` runs an instance,
// `config init` writes a commented default configuration, `leases` prints
// the lease table, `jetstream-replay` serves a Jetstream capture locally,
// `webhooks` manages webhook subscriptions.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // a runtime failure (or a forced stop)
	exitConfig  = 2 // refused at start: bad configuration, unusable database, or a usage error
)

// startError is a problem found before anything started; it exits 2.
type startError struct{ err error }

func (e *startError) Error() string { return e.err.Error() }
func (e *startError) Unwrap() error { return e.err }

// loggedError is a failure serve has already written as a JSON log line:
// once an instance has started, every stderr line is JSON (README
// Operations), so run prints nothing more. It exits 1.
type loggedError struct{ err error }

func (e *loggedError) Error() string { return e.err.Error() }
func (e *loggedError) Unwrap() error { return e.err }

func refuse(key, format string, args ...any) error {
	return &startError{err: &config.Error{Key: key, Reason: fmt.Sprintf(format, args...)}}
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := newRootCommand()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var logged *loggedError
	if errors.As(err, &logged) {
		return exitFailure
	}
	// A refusal is one stderr line (SPEC §3); driver errors embed newlines.
	fmt.Fprintln(os.Stderr, "appview:", admin.OneLine(err.Error()))
	var cfgErr *config.Error
	var se *startError
	var ue *usageError
	if errors.As(err, &cfgErr) || errors.As(err, &se) || errors.As(err, &ue) {
		return exitConfig
	}
	return exitFailure
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "appview",
		Short:         "Background worker runtime of an AT Protocol container registry AppView",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	flags := &configFlags{}
	flags.register(root)
	opener := func(open func(context.Context, config.Config) (*database.DB, error)) func(context.Context) (*database.DB, error) {
		return func(ctx context.Context) (*database.DB, error) {
			cfg, err := flags.load()
			if err != nil {
				return nil, err
			}
			return open(ctx, cfg)
		}
	}
	migrated, existing := opener(openDatabase), opener(openExisting)
	root.AddCommand(newServeCommand(flags), newConfigCommand(), newLeasesCommand(existing),
		newWebhooksCommand(migrated, existing), newReplayCommand(), newSynthCommand(), newSynthCheckCommand(existing), newBenchCommand())
	strictUsage(root)
	return root
}

// configFlags are the flags every command that reads the configuration takes.
type configFlags struct {
	file string
	sets []string
}

func (f *configFlags) register(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&f.file, "config", "", "YAML configuration file (default: built-in defaults)")
	cmd.PersistentFlags().StringArrayVar(&f.sets, "set", nil, "override one key, e.g. --set leases.ttl=20s (beats file and environment)")
}

func (f *configFlags) load() (config.Config, error) {
	return config.Load(config.Sources{File: f.file, Environ: os.Environ(), Sets: f.sets})
}
