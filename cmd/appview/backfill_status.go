package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/actors/backfill"
	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/database"
	"github.com/atcr-io/appview/internal/fence"
)

// newBackfillCommand is `appview backfill status`: the latest
// run's progress from the checkpoint tables, and its state from them and
// the backfill lease (an unfinished run no instance holds is "stopped",
// not "running": its row outlives the process). Like `appview leases` it only
// reads (open must be openExisting), so it is safe beside running instances.
func newBackfillCommand(open func(context.Context) (*database.DB, error)) *cobra.Command {
	cmd := &cobra.Command{Use: "backfill", Short: "Backfill helpers"}
	var asJSON bool
	status := &cobra.Command{
		Use:   "status",
		Short: "Print the latest backfill run's progress and whether an instance holds it (a bar on a terminal, plain lines otherwise)",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return readOnly(cmd.Context(), open, "backfill_runs", func(ctx context.Context, db *database.DB) error {
				p, err := backfill.ReadProgress(ctx, db)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(p)
				}
				writeProgress(out, p, isTerminal(out), time.Now())
				return nil
			})
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON (the /debug/backfill view)")
	cmd.AddCommand(status)
	return cmd
}

// isTerminal reports whether w is a terminal (a bar is drawn only there;
// a pipe or file gets plain key: value lines a script can read).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// barWidth is the width of the progress bar in cells.
const barWidth = 30

// writeProgress prints p: on a terminal a bar and a summary line, else
// one "key: value" line per figure.
func writeProgress(w io.Writer, p backfill.Progress, tty bool, now time.Time) {
	if !p.Run {
		fmt.Fprintln(w, "no backfill run recorded")
		return
	}
	state := p.State
	var etaText strings.Builder
	writeETA(&etaText, p)
	eta := etaText.String()
	known := fmt.Sprint(p.ReposKnown)
	if !p.ListingDone && p.CompletedAt == nil {
		known += "+" // still listing: more repositories may come
	}
	if tty {
		filled := int(p.Fraction * barWidth)
		bar := strings.Repeat("█", filled) + strings.Repeat("░", barWidth-filled)
		switch state {
		case backfill.StateStopped:
			fmt.Fprintf(w, "backfill run %d (stopped: no instance holds the backfill lease, %s; last holder %s, fence %d)\n",
				p.RunID, leaseText(p.Lease), p.Holder, p.Fence)
		case backfill.StateFailing:
			fmt.Fprintf(w, "backfill run %d (failing: %d failed attempts, the last %s ago; holder %s, fence %d)\n",
				p.RunID, p.FailedAttempts, lastErrorAgo(p, now), p.Holder, p.Fence)
		case backfill.StateUnknown:
			fmt.Fprintf(w, "backfill run %d (unknown: written with leases disabled, last progress %s; holder %s)\n",
				p.RunID, p.UpdatedAt.Format(time.RFC3339), p.Holder)
		default:
			fmt.Fprintf(w, "backfill run %d (%s, holder %s, fence %d)\n", p.RunID, state, p.Holder, p.Fence)
		}
		fmt.Fprintf(w, "%s %5.1f%%  %d/%s repos  %d failed  %d records  %.1f repos/s  ETA %s\n",
			bar, p.Fraction*100, p.Finished(), known, p.ReposFailed, p.Records, p.ReposPerSecond, eta)
		if p.LastError != "" && p.State != backfill.StateCompleted {
			fmt.Fprintf(w, "last error (%s ago): %s\n", lastErrorAgo(p, now), p.LastError)
		}
		return
	}
	lines := [][2]string{
		{"run", fmt.Sprint(p.RunID)},
		{"state", state},
		{"holder", p.Holder},
		{"fence", fmt.Sprint(p.Fence)},
		{"lease", leaseText(p.Lease)},
		{"started_at", p.StartedAt.Format(time.RFC3339)},
		{"updated_at", p.UpdatedAt.Format(time.RFC3339)},
		{"repos_done", fmt.Sprint(p.ReposDone)},
		{"repos_failed", fmt.Sprint(p.ReposFailed)},
		{"repos_known", known},
		{"records_applied", fmt.Sprint(p.Records)},
		{"percent", fmt.Sprintf("%.1f", p.Fraction*100)},
		{"repos_per_second", fmt.Sprintf("%.2f", p.ReposPerSecond)},
		{"records_per_second", fmt.Sprintf("%.2f", p.RecordsPerSecond)},
		{"eta", eta},
		{"failed_attempts", fmt.Sprint(p.FailedAttempts)},
	}
	if p.LastErrorAt != nil {
		lines = append(lines, [2]string{"last_error_at", p.LastErrorAt.Format(time.RFC3339)}, [2]string{"last_error", p.LastError})
	}
	for _, l := range lines {
		fmt.Fprintf(w, "%s: %s\n", l[0], l[1])
	}
}

// lastErrorAgo is how long before now the run's last failed attempt was
// recorded, to the second ("?" when none was).
func lastErrorAgo(p backfill.Progress, now time.Time) string {
	if p.LastErrorAt == nil {
		return "?"
	}
	return max(now.Sub(*p.LastErrorAt), 0).Round(time.Second).String()
}

// leaseText says what the backfill lease row tells of the run's custody,
// on the database's clock: "held by H (fence F, 12.5s left)", "released
// by H (fence F) 3m0s ago", "expired: H's grant (fence F) ran out 3m0s
// ago", or "never taken" when there is no row.
func leaseText(l *fence.Listed) string {
	if l == nil {
		return "never taken"
	}
	ago := func(ms int64) string { return (time.Duration(l.Now-ms) * time.Millisecond).Round(time.Second).String() }
	switch l.State {
	case fence.StateHeld:
		return fmt.Sprintf("held by %s (fence %d, %s left)", l.Holder, l.Fence, l.TimeLeft().Round(100*time.Millisecond))
	case fence.StateReleased:
		return fmt.Sprintf("released by %s (fence %d) %s ago", l.Holder, l.Fence, ago(l.RenewedAt))
	default:
		return fmt.Sprintf("expired: %s's grant (fence %d) ran out %s ago", l.Holder, l.Fence, ago(l.ExpiresAt))
	}
}

// writeETA writes p's estimated time left: "unknown" before a repository
// finished, "at least ..." while the listing is incomplete.
func writeETA(w io.Writer, p backfill.Progress) {
	switch {
	case p.CompletedAt != nil:
		fmt.Fprint(w, "0s")
	case p.ETASeconds >= 0:
		if !p.ListingDone {
			fmt.Fprint(w, "at least ")
		}
		fmt.Fprint(w, time.Duration(p.ETASeconds)*time.Second)
	default:
		fmt.Fprint(w, "unknown")
	}
}
