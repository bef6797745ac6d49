package main

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/admin"
	"github.com/atcr-io/appview/config"
	"github.com/atcr-io/appview/identity"
	"github.com/atcr-io/appview/system"
)

// adminShutdownTimeout bounds closing the admin server after the workers stopped.
const adminShutdownTimeout = 2 * time.Second

// secondSignalAfter is how long after the first stop signal another one
// forces an immediate exit. Two signals often arrive together as one
// request to stop: `timeout -s INT` signals the process and its group, a
// terminal's Ctrl-C reaches every process of the foreground group, a
// process manager may send SIGTERM to both. Only a signal that comes
// later is an operator who will not wait for the leases to be released.
const secondSignalAfter = 500 * time.Millisecond

func newServeCommand(flags *configFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run an instance until SIGINT/SIGTERM; exit 0 once every lease it held is released",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := flags.load()
			if err != nil {
				return err
			}
			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
			defer signal.Stop(sigs)
			return serve(cmd.Context(), cfg, sigs)
		},
	}
}

// serve runs one instance. The first signal stops it gracefully within
// shutdown_timeout; a second one, at least secondSignalAfter later, exits
// at once with status 1.
func serve(ctx context.Context, cfg config.Config, sigs <-chan os.Signal) error {
	level, _ := zerolog.ParseLevel(cfg.LogLevel)
	base := system.NewLogger(os.Stderr, level)
	log := base.With().Str("instance", cfg.InstanceID).Logger()
	started := time.Now()

	db, err := openDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	defer db.Close()

	reg := prometheus.NewRegistry()
	mux := http.NewServeMux()
	var srv *admin.Server
	if cfg.Admin.Addr != "" {
		if srv, err = admin.Listen(cfg.Admin.Addr, db, reg); err != nil {
			return refuse("admin.addr", "%v", err)
		}
		mux = srv.Mux
	}
	deps := system.Deps{Config: cfg, DB: db.DB, Log: log, Metrics: reg, Admin: mux, Instance: cfg.InstanceID,
		Identity: &identity.Resolver{PLCURL: cfg.Identity.PLCURL}}
	workers := &system.Registry{}
	if err := registerWorkers(workers, deps); err != nil {
		if srv != nil {
			srv.Shutdown(context.Background())
		}
		var ce *config.Error
		if errors.As(err, &ce) {
			return &startError{err: err}
		}
		return err
	}
	nudgeURL := ""
	if srv != nil {
		nudgeURL = srv.URL(cfg.Admin.AdvertiseURL) + "/lease/nudge"
	}
	sys, err := system.New(system.Options{Config: cfg, DB: db, Log: base, Registry: workers, Metrics: reg, NudgeURL: nudgeURL})
	if err != nil {
		return err
	}
	mux.Handle("POST /lease/nudge", sys.NudgeHandler())
	mux.Handle("GET /debug/leases", debugLeases(db.DB, cfg.InstanceID, sys))
	serveErr := make(chan error, 1)
	if srv != nil {
		go func() { serveErr <- srv.Serve() }()
	}
	if err := sys.Start(); err != nil {
		return err
	}
	ev := log.Info().Str("database", cfg.Database.URL).Float64("start_ms", msSince(started)).Int("workers", len(workers.Workers()))
	if srv != nil {
		ev = ev.Str("admin", srv.Addr())
	}
	ev.Msg("appview started")

	var sig os.Signal
	select {
	case sig = <-sigs:
	case err := <-serveErr:
		log.Error().Err(err).Msg("admin server failed; stopping")
	case <-ctx.Done():
	}
	stopping := time.Now()
	log.Info().Stringer("signal", sigOrNone{sig}).Str("timeout", cfg.ShutdownTimeout.String()).Msg("stopping: workers drain, leases are released")
	go func() {
		for s := range sigs {
			if since := time.Since(stopping); since < secondSignalAfter {
				log.Info().Stringer("signal", s).Float64("after_ms", float64(since.Microseconds())/1000).
					Msg("signal arrived with the first: still stopping gracefully")
				continue
			}
			log.Warn().Stringer("signal", s).Msg("second signal: exiting now without waiting for releases")
			os.Exit(exitFailure)
		}
	}()
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	stopErr := sys.Stop(stopCtx)
	if srv != nil {
		actx, acancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
		_ = srv.Shutdown(actx)
		acancel()
	}
	if stopErr != nil {
		log.Error().Err(stopErr).Msg("stopped before every lease was released; they will run out their TTL")
		return stopErr
	}
	log.Info().Float64("stop_ms", msSince(stopping)).Msg("stopped: every lease released")
	return nil
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

type sigOrNone struct{ s os.Signal }

func (s sigOrNone) String() string {
	if s.s == nil {
		return "none"
	}
	return s.s.String()
}

// debugLeases serves GET /debug/leases: every row of the leases table
// (SPEC §4) with its state, and this instance's own view of each lease.
func debugLeases(db lease.Querier, instance string, sys *system.System) http.Handler {
	type row struct {
		lease.Row
		State      string `json:"state"`
		TimeLeftMS int64  `json:"time_left_ms"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		out := struct {
			Instance string         `json:"instance"`
			Leases   []row          `json:"leases"`
			Local    []lease.Status `json:"local"`
			Error    string         `json:"error,omitempty"`
		}{Instance: instance, Leases: []row{}, Local: sys.Statuses()}
		rows, err := lease.ListBounded(ctx, db)
		if err != nil {
			out.Error = err.Error()
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		for _, rw := range rows {
			out.Leases = append(out.Leases, row{Row: rw, State: rw.State(), TimeLeftMS: rw.TimeLeft().Milliseconds()})
		}
		admin.JSON(w, out)
	})
}
