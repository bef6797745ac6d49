package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/synth"
)

// newSynthCheckCommand is `appview-dev synth-check`: compares the configured
// database with the state `appview-dev synth --expected` wrote (synth.Diff).
// It only reads: open neither migrates nor creates the database.
func newSynthCheckCommand(open func(context.Context) (*database.DB, error)) *cobra.Command {
	var expected string
	cmd := &cobra.Command{
		Use:   "synth-check --expected F.json",
		Short: "Compare the database with the state a synth stream must produce; exit 1 on any difference",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if expected == "" {
				return cli.Refuse("--expected", "is required")
			}
			exp, err := synth.ReadExpected(expected)
			if err != nil {
				return cli.Refuse("--expected", "%v", err)
			}
			db, err := open(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			diffs := synth.Diff(ctx, db.DB, exp)
			out := cmd.OutOrStdout()
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
	cmd.Flags().StringVar(&expected, "expected", "", "the expected state written by `appview-dev synth --expected`")
	return cmd
}
