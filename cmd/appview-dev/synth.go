package main

import (
	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/synth"
)

// newSynthCommand is `appview-dev synth`: deterministic synthetic io.atcr.*
// traffic as Jetstream v1 JSONL, and the exact database state it must
// produce (for demos, tests and benchmarks).
func newSynthCommand() *cobra.Command {
	var o synth.CommandOptions
	cmd := &cobra.Command{
		Use:   "synth --events N --out F.jsonl [--seed N] [--expected F.json]",
		Short: "Write synthetic io.atcr.* Jetstream traffic and the state it must produce",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Events <= 0 {
				return cli.Refuse("--events", "must be positive")
			}
			return synth.Run(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&o.Seed, "seed", 1, "selects the stream; the same seed gives the same bytes")
	f.IntVar(&o.Events, "events", 10000, "number of events")
	f.IntVar(&o.Users, "users", 0, "distinct user DIDs (0: 40)")
	f.IntVar(&o.Holds, "holds", 0, "distinct hold DIDs (0: 4)")
	f.StringVar(&o.Out, "out", "-", "JSONL output file (- for stdout)")
	f.StringVar(&o.ExpectedOut, "expected", "", "also write the expected database state as JSON here")
	return cmd
}
