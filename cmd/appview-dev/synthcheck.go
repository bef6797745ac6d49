package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/synth"
)

// pollEvery is how often `synth-check --wait` reads the database.
const pollEvery = 250 * time.Millisecond

// newSynthCheckCommand is `appview-dev synth-check`: compares the configured
// database with the state `appview-dev synth --expected` wrote (synth.Diff).
// It only reads: it neither migrates nor creates the database. With --wait
// it polls until the stream is consumed and the state matches, so a demo
// has a line that says it is done. load reads the configuration.
func newSynthCheckCommand(load func() (config.Config, error)) *cobra.Command {
	var expected string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "synth-check --expected F.json [--wait DURATION]",
		Short: "Compare the database with the state a synth stream must produce; exit 1 on any difference",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if expected == "" {
				return cli.Refuse("--expected", "is required")
			}
			if wait < 0 {
				return cli.Refuse("--wait", "must not be negative")
			}
			exp, err := synth.ReadExpected(expected)
			if err != nil {
				return cli.Refuse("--expected", "%v", err)
			}
			cfg, err := load()
			if err != nil {
				return err
			}
			open := func(ctx context.Context) (*database.DB, error) { return cli.OpenExisting(ctx, cfg) }
			out := cmd.OutOrStdout()
			if wait > 0 {
				return waitDone(cmd.Context(), expectation{open, exp, expected, wait, pollEvery}, out)
			}
			db, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			diffs := synth.Diff(ctx, db.DB, exp)
			for _, d := range diffs {
				fmt.Fprintln(out, d)
			}
			if len(diffs) > 0 {
				return fmt.Errorf("the database differs from %s (%d lines above)", expected, len(diffs))
			}
			fmt.Fprintf(out, "the database equals %s\n", expected)
			return nil
		},
	}
	cmd.Flags().StringVar(&expected, "expected", "", "the expected state written by appview-dev synth --expected")
	cmd.Flags().DurationVar(&wait, "wait", 0, "poll until the stream is consumed and the database equals the expected state, for at most this long (0: compare once)")
	return cmd
}

// expectation is what waitDone waits for: the database open opens to
// equal exp (read from the file name), polled every `every` for at most
// `wait`.
type expectation struct {
	open        func(context.Context) (*database.DB, error)
	exp         *synth.Expected
	name        string
	wait, every time.Duration
}

// waitDone polls the database every e.every until its Jetstream position
// has reached the stream's last event and it equals e.exp, then prints one
// "done:" line. After e.wait it prints the differences left and fails
// (exit 1) saying why it is not done. A database that does not exist yet,
// or is not migrated yet, is waited for like the rest. A check under way
// when `wait` runs out is finished, not cut short, so what it reports is
// the database's state rather than a cancelled read.
func waitDone(ctx context.Context, e expectation, out io.Writer) error {
	open, exp, name, wait, every := e.open, e.exp, e.name, e.wait, e.every
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	var db *database.DB
	defer func() {
		if db != nil {
			db.Close()
		}
	}()
	var why string
	var diffs []string
	for {
		if db == nil {
			var err error
			if db, err = open(ctx); err != nil {
				db, why = nil, err.Error()
			}
		}
		if db != nil {
			var done bool
			done, why, diffs = progress(ctx, db.DB, exp)
			if done {
				fmt.Fprintf(out, "done: %d events consumed, the database equals %s\n", exp.Events, name)
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			for _, d := range diffs {
				fmt.Fprintln(out, d)
			}
			return fmt.Errorf("not done after %s: %s", wait, why)
		case <-tick.C:
		}
	}
}

// progress says whether db is done with exp's stream: its stored position
// at or past exp.LastUS (the position commits with the rows, so the state
// is then final) and no difference left. When not, why says what is
// missing and diffs lists the differences, if it got that far.
func progress(ctx context.Context, db *sql.DB, exp *synth.Expected) (done bool, why string, diffs []string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var pos int64
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(MAX(time_us), 0) FROM jetstream_cursor`).Scan(&pos); err != nil {
		return false, fmt.Sprintf("cannot read the position: %v", err), nil
	}
	if pos < exp.LastUS {
		return false, fmt.Sprintf("the position is at time_us %d, the stream's last event at %d", pos, exp.LastUS), nil
	}
	if diffs = synth.Diff(ctx, db, exp); len(diffs) > 0 {
		return false, fmt.Sprintf("the stream is consumed but the database differs from the expected state (%d lines above)", len(diffs)), diffs
	}
	return true, "", nil
}
