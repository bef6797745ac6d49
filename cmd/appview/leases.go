package main

import (
	"context"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/system"
)

// newLeasesCommand is `appview leases` (docs/spec.md §2). It only reads: open must
// neither migrate nor create the database (cli.OpenExisting).
func newLeasesCommand(open func(context.Context) (*database.DB, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "Print every lease: name, holder, fence, state (held, expired, released), time left; and any instance running with leases off",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return readOnly(cmd.Context(), open, "leases", func(ctx context.Context, db *database.DB) error {
				rows, err := fence.ListBounded(ctx, db)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					list := make([]fence.Listed, 0, len(rows))
					for _, r := range rows {
						list = append(list, r.Listed())
					}
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(list)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tHOLDER\tFENCE\tSTATE\tTIME LEFT")
				for _, r := range rows {
					left := "-"
					if r.State() == fence.StateHeld {
						left = r.TimeLeft().Round(time.Millisecond).String()
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", r.Name, r.Holder, r.Fence, r.State(), left)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				// An instance with leases off holds no lease, so the table
				// cannot show it; it is what refuses every other start.
				// (A database older than the table has none to show.)
				unleased, _ := system.ListUnleased(ctx, db)
				for _, u := range unleased {
					if u.Live() {
						fmt.Fprintf(out, "instance %s runs with leases off: every worker runs there, unfenced, and no other instance starts beside it\n", u)
					}
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
