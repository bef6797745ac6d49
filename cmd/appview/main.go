// Command appview runs the background worker runtime of an AT Protocol
// container registry AppView (docs/spec.md §2): `serve` runs an instance,
// `config init` writes a commented default configuration, `config check`
// and `config show` check and print the one in effect, `leases` prints
// the lease table, `jetstream-replay` serves a Jetstream capture locally,
// `webhooks` manages webhook subscriptions. The developer tools (bench,
// synth, synth-check) are the separate binary cmd/appview-dev, so this one
// links no test support (see deps_test.go).
package main

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/stopsignal"
)

// loggedError is a failure serve has already written as a JSON log line:
// once an instance has started, every stderr line is JSON (README
// Operations), so run prints nothing more. It exits 1.
type loggedError struct{ err error }

func (e *loggedError) Error() string { return e.err.Error() }
func (e *loggedError) Unwrap() error { return e.err }

func main() {
	// A crash (an unrecovered panic, a fatal runtime error, SIGQUIT) would
	// exit 2, the code docs/spec.md §3 gives a refused configuration, which
	// deploy/appview.service does not restart (RestartPreventExitStatus=2):
	// a crashed instance would stay down. At the "crash" level the runtime
	// prints the same dump and then dies of a signal instead (SIGABRT, or
	// the SIGQUIT itself when it landed on a thread the runtime does not
	// run), which the unit restarts (Restart=on-failure) and no one can
	// take for a refusal. A
	// GOTRACEBACK an operator set asks for more and is left as it is.
	if os.Getenv("GOTRACEBACK") == "" {
		debug.SetTraceback("crash")
	}
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	// SIGINT and SIGTERM have been taken since package initialisation
	// (package stopsignal), before flags and configuration are read and
	// before most packages are initialised: until then SIGTERM killed the
	// process without a word, and SIGINT in a background job of a
	// non-interactive shell (which starts with it ignored) was discarded.
	// serve consumes them, including one that arrived already; any other
	// command gets their default behaviour back (and one that arrived is
	// acted on now). Only a signal arriving during the Go runtime's own
	// start, before any package is initialised, can still be missed.
	sigs := stopsignal.TakeSignals()
	root := newRootCommand(sigs)
	root.SetArgs(args)
	if c, _, err := root.Find(args); err == nil && c.Name() == "serve" {
		defer signal.Stop(sigs)
	} else {
		stopsignal.ReleaseSignals()
	}
	err := root.Execute()
	var logged *loggedError
	if errors.As(err, &logged) {
		return cli.ExitFailure
	}
	return cli.Exit("appview", err)
}

// newRootCommand builds the command tree; serve reads its stop signals
// from sigs (run passes stopsignal's, subscribed to SIGINT and SIGTERM).
func newRootCommand(sigs chan os.Signal) *cobra.Command {
	root := &cobra.Command{
		Use:           "appview",
		Short:         "Background worker runtime of an AT Protocol container registry AppView",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       readBuildIdentity().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	flags := &cli.ConfigFlags{Workers: workerKeys()}
	flags.Register(root)
	opener := func(open func(context.Context, config.Config) (*database.DB, error)) func(context.Context) (*database.DB, error) {
		return func(ctx context.Context) (*database.DB, error) {
			cfg, err := flags.Load()
			flags.PrintWarnings()
			if err != nil {
				return nil, err
			}
			db, err := open(ctx, cfg)
			return db, flags.Explain(err)
		}
	}
	migrated, existing := opener(cli.OpenDatabase), opener(cli.OpenExisting)
	root.AddCommand(newServeCommand(flags, sigs), newConfigCommand(flags), newLeasesCommand(existing),
		newWebhooksCommand(migrated, existing), newReplayCommand(),
		newVersionCommand(), newBackfillCommand(existing), newHealthcheckCommand(flags))
	cli.StrictUsage(root)
	return root
}
