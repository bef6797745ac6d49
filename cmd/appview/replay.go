package main

import (
	"errors"
	"math"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/jetstream"
	"github.com/atcr-io/appview/system"
)

// newReplayCommand is `appview jetstream-replay` (docs/spec.md §2, §6): a local
// Jetstream v1 server for a JSONL capture, for offline runs, demos, tests
// and benchmarks. The server itself is jetstream.ReplayServer.
func newReplayCommand() *cobra.Command {
	var o jetstream.ReplayOptions
	cmd := &cobra.Command{
		Use:   "jetstream-replay --file F.jsonl [--listen ADDR] [--rate N] [--loop]",
		Short: "Serve a JSONL capture as a local Jetstream v1 /subscribe endpoint",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The command reads no configuration: its refusals name the
			// flag, a bad value as a usage error, an unusable capture or
			// address as a refusal to start (cli.Refuse of a flag).
			switch {
			case math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0):
				// ParseFloat takes "NaN" and "Inf": neither is a pace.
				return cli.Usage(cmd, "--rate %v: must be a finite number of events per second", o.Rate)
			case o.Rate < 0:
				return cli.Usage(cmd, "--rate %v: must not be negative", o.Rate)
			case o.Rate > 0 && o.Rate < jetstream.MinReplayRate:
				return cli.Usage(cmd, "--rate %v: must be 0 (unpaced) or at least %v events per second", o.Rate, jetstream.MinReplayRate)
			case o.DropAfter < 0:
				return cli.Usage(cmd, "--drop-after %d: must not be negative", o.DropAfter)
			}
			// The capture first: a missing file is the likelier mistake, and
			// is named even when the address is unusable too.
			if fi, err := os.Stat(o.File); err != nil {
				return cli.Refuse("--file", "%v", err)
			} else if fi.IsDir() {
				return cli.Refuse("--file", "%s is a directory; want the JSONL capture file", o.File)
			}
			// Bound here rather than in ListenAndServe: an unusable address
			// (unparsable, a port in use) is refused before anything ran,
			// exit 2, like a bad admin.addr for serve.
			ln, err := net.Listen("tcp", o.Listen)
			if err != nil {
				return cli.Refuse("--listen", "%v", err)
			}
			log := system.NewLogger(os.Stderr, zerolog.InfoLevel).With().Str("component", "jetstream-replay").Logger()
			srv, err := jetstream.NewReplayServer(o, log)
			if err != nil {
				ln.Close()
				return &cli.StartError{Err: err}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			closed := make(chan struct{})
			go func() { <-ctx.Done(); srv.Close(); close(closed) }()
			err = srv.Serve(ln)
			stop()   // the server stops here either way
			<-closed // subscribers got their going-away frames
			if err != nil && !errors.Is(err, jetstream.ErrReplayClosed) {
				return err
			}
			return nil
		},
	}
	f := cmd.Flags()
	cli.SingleVar(f, &o.File, "file", "", "JSONL capture, one Jetstream v1 event a line (given once)",
		"one capture is served; concatenate captures into one file")
	cli.SingleVar(f, &o.Listen, "listen", jetstream.DefaultReplayListen, "address to listen on (given once)",
		"one address is listened on; run one jetstream-replay per address")
	f.Float64Var(&o.Rate, "rate", 0, "events per second per connection (0: as fast as the client reads)")
	f.BoolVar(&o.Loop, "loop", false, "replay the file again after its end, time_us shifted, forever")
	f.IntVar(&o.DropAfter, "drop-after", 0, "test hook: drop each connection after this many events")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}
