package main

import (
	"context"
	"errors"
	"fmt"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/atcr-io/appview/internal/cli"
	"github.com/atcr-io/appview/internal/fence"
	"github.com/atcr-io/appview/internal/workers"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/atcr-io/appview/actors/backfill"
	"github.com/atcr-io/appview/actors/lease"
	"github.com/atcr-io/appview/internal/admin"
	"github.com/atcr-io/appview/internal/config"
	"github.com/atcr-io/appview/internal/database"
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

// newServeCommand builds `serve`; sigs carries SIGINT/SIGTERM/SIGHUP (package
// stopsignal subscribes it during initialisation, before main runs).
func newServeCommand(flags *cli.ConfigFlags, sigs chan os.Signal) *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "Run an instance until SIGINT, SIGTERM or SIGHUP; exit 0 once every lease it held is released",
		Args:  cli.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, aborted, err := loadDuringStart(flags, sigs)
			if aborted {
				return nil
			}
			if err != nil {
				// Refused before any JSON log: the warnings (a mistyped
				// APPVIEW_* variable, often the refusal's cause) come
				// first, in the refusal's plain form.
				flags.PrintWarnings()
				return err
			}
			return flags.Explain(serve(cmd.Context(), cfg, sigs, flags.Warnings()...))
		},
	}
}

// loadDuringStart loads the configuration (flags.Load) while watching
// sigs. A signal that comes while the read is blocked (a --config FIFO no
// one writes to, a pipe from a slow generator) aborts the start (aborted
// true, exit 0: nothing was acquired) with one plain line on stderr; the
// blocked read is abandoned and the process exits. A load that finishes
// within loadAbortWait of the signal is kept and the signal put back on
// sigs, so the start is aborted as any signal during start is, logged as
// JSON (openDuringStart).
func loadDuringStart(flags *cli.ConfigFlags, sigs chan os.Signal) (cfg config.Config, aborted bool, err error) {
	done := inBackground(flags.Load)
	var sig os.Signal
	select {
	case l := <-done:
		return l.v, false, l.err
	case sig = <-sigs:
	}
	select {
	case l := <-done:
		select {
		case sigs <- sig:
		default: // the buffer holds later signals: the stop is asked anyway
		}
		return l.v, false, l.err
	case <-time.After(loadAbortWait):
	}
	fmt.Fprintf(os.Stderr, "appview: signal %v while the configuration was read: start aborted, nothing was acquired\n", sig)
	return config.Config{}, true, nil
}

// outcome is what a call run by inBackground returned.
type outcome[T any] struct {
	v   T
	err error
}

// inBackground runs f on its own goroutine and delivers its outcome on
// the returned channel, buffered so f never blocks on a caller that
// stopped waiting (a start aborted by a signal abandons it).
func inBackground[T any](f func() (T, error)) <-chan outcome[T] {
	done := make(chan outcome[T], 1)
	go func() {
		v, err := f()
		done <- outcome[T]{v, err}
	}()
	return done
}

// loadAbortWait is how long a signal during the configuration's load
// waits for the load to finish before it abandons it: a file loads in
// well under this, a blocked read never does.
const loadAbortWait = 200 * time.Millisecond

// startAbortWait is how long a start aborted by a signal waits for the
// database open in progress to return, so that what it opened is closed.
// The driver ignores contexts: an open stuck on a server that accepts
// connections but never answers (a SIGSTOPped sqld, a paused VM) is
// abandoned after this, and the process exits anyway.
const startAbortWait = time.Second

// sqldStallRelease is how long a libSQL server (sqld) takes to release the
// write lock of a client that stalled inside a write transaction: sqld
// rolls such a transaction back only after its transaction timeout of
// about 5 s. A renew_deadline below this lets one stalled instance (SIGSTOP,
// VM pause) make every other instance's renewals wait past their deadline,
// so that every instance loses every lease at once.
const sqldStallRelease = 6 * time.Second

// serve runs one instance. A signal while the database is being opened
// aborts the start (exit 0: nothing was acquired). Once started, the
// first signal stops it gracefully within shutdown_timeout; in both
// phases another signal at least secondSignalAfter after the first exits
// at once with status 1. Once the instance has started, every stderr line
// is a JSON log line, including the last one of a failure (*loggedError).
// configWarnings (about APPVIEW_* variables that name no key) are logged
// first, at warn level.
func serve(ctx context.Context, cfg config.Config, sigs <-chan os.Signal, configWarnings ...string) error {
	level, _ := zerolog.ParseLevel(cfg.LogLevel)
	base := system.NewLogger(os.Stderr, level)
	log := base.With().Str("instance", cfg.InstanceID).Logger()
	for _, w := range configWarnings {
		log.Warn().Str("event", "config.unknown_env").Msg(w)
	}
	// net/http logs server errors (a failed accept, a panicking handler)
	// through the standard logger: make those JSON lines too.
	stdlog.SetFlags(0)
	stdlog.SetOutput(slog.NewLogLogger(system.SlogBridge(log.With().Str("component", "stdlog").Logger()).Handler(), slog.LevelWarn).Writer())
	started := time.Now()

	// The admin port is bound before the database is opened, so a port in
	// use is refused before anything is created or written (README: "a
	// busy admin port is refused before anything starts").
	var adminLn net.Listener
	if cfg.Admin.Addr != "" {
		ln, err := admin.Bind(cfg.Admin.Addr)
		if err != nil {
			return refuseAdminAddr(cfg.Admin.Addr, err)
		}
		adminLn = ln
		defer func() {
			if adminLn != nil { // not taken by admin.Listen
				adminLn.Close()
			}
		}()
	}
	db, aborted, err := openDuringStart(ctx, cfg, log, sigs)
	if aborted {
		return nil
	}
	if err != nil {
		return logRefusalDetail(log, err)
	}
	// Closing the pool waits for every statement running on it: after a
	// stop that ran out of shutdown_timeout, one may be stuck in SQLite's
	// busy handler (a release meeting another process's write lock) for
	// up to database.busy_timeout, and the exit must not wait for it
	// (the process ends; SQLite recovers as from any exit).
	closeWait := adminShutdownTimeout
	defer func() { closeBounded(db, closeWait) }()
	if err := unleasedBesideHolders(db, cfg, log); err != nil {
		return err
	}
	if aborted, err := besideUnleased(db, cfg, log, sigs); aborted || err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	if err := registerBuildInfo(reg); err != nil {
		return err
	}
	mux := http.NewServeMux()
	var srv *admin.Server
	if adminLn != nil {
		opts := admin.Options{Token: cfg.Admin.Token, ProtectMetrics: cfg.Admin.ProtectMetrics, Pprof: cfg.Admin.Pprof}
		ln := adminLn
		adminLn = nil // admin.Listen owns it now, and closes it if it fails
		if srv, err = admin.Listen(ln, db, reg, opts); err != nil {
			return cli.Refuse("admin.addr", "%v", err)
		}
		mux = srv.Mux
	}
	deps := workers.Deps{Config: cfg, DB: db, Log: log, Metrics: reg, Admin: mux, Instance: cfg.InstanceID,
		Identity: workers.NewResolver(cfg)}
	workers := &system.Registry{}
	if err := registerWorkers(workers, deps); err != nil {
		if srv != nil {
			srv.Shutdown(context.Background())
		}
		var ce *config.Error
		if errors.As(err, &ce) {
			return &cli.StartError{Err: err}
		}
		return err
	}
	nudgeURL := ""
	if srv != nil {
		nudgeURL = srv.URL(cfg.Admin.AdvertiseURL) + lease.NudgePath
	}
	sys, err := system.New(system.Options{Config: cfg, DB: db, Log: base, Registry: workers, Metrics: reg, NudgeURL: nudgeURL,
		AdminToken: cfg.Admin.Token})
	if err != nil {
		return err
	}
	if srv != nil {
		srv.AddReadyCheck(sys.Ready)
	}
	mux.Handle("POST "+lease.NudgePath, sys.NudgeHandler())
	mux.Handle("GET /debug/leases", debugLeases(db, cfg.InstanceID, sys))
	mux.Handle("GET /debug/backfill", backfill.ProgressHandler(db))
	hist := admin.NewHistory()
	mux.Handle("GET /{$}", statusPage(db, cfg.InstanceID, cfg.Leases.TTL, hist, sys.Statuses))
	if err := reg.Register(backfill.NewProgressCollector(db)); err != nil {
		return err
	}
	if sig := pendingSignal(sigs); sig != nil {
		// Still nothing acquired: the workers have not been spawned.
		if srv != nil {
			srv.Shutdown(context.Background())
		}
		log.Info().Stringer("signal", sig).Msg("signal during start: start aborted, nothing was acquired")
		return nil
	}
	serveErr := make(chan error, 1)
	if srv != nil {
		go func() { serveErr <- srv.Serve() }()
	}
	if srv != nil {
		// The status page's sampler reads only; it stops with the admin server.
		sampleCtx, stopSampling := context.WithCancel(context.Background())
		sampled := make(chan struct{})
		go func() { defer close(sampled); sampleStatus(sampleCtx, db.DB, hist, log) }()
		defer func() { stopSampling(); <-sampled }()
	}
	if err := sys.Start(); err != nil {
		log.Error().Err(err).Msg("cannot start the workers")
		return &loggedError{err: err}
	}
	if db.Remote && cfg.Leases.Enabled && cfg.Leases.RenewDeadline < sqldStallRelease {
		log.Warn().Str("renew_deadline", cfg.Leases.RenewDeadline.String()).Str("want_at_least", sqldStallRelease.String()).
			Msg("leases.renew_deadline is below what a libSQL server takes to release a stalled writer's transaction (about 5 s): " +
				"one stalled instance holding the write lock (SIGSTOP, VM pause) can make every instance's renewals " +
				"outlast the deadline and lose every lease")
	}
	if !db.Remote && cfg.Database.AuthToken != "" {
		log.Warn().Str("key", "database.auth_token").Str("database", cfg.Database.URL).
			Msg("database.auth_token is set but database.url names a file: the token is not used (was a libSQL server's URL meant to reach this process?)")
	}
	if v := db.AppliedMigrations(); len(v) > 0 {
		log.Info().Ints("versions", v).Msg("database migrated")
	}
	if v := db.NewerMigrations(); len(v) > 0 {
		log.Warn().Ints("versions", v).
			Msg("the database carries migrations this version does not know: a newer appview migrated it; running on it, but upgrade this instance")
	}
	ev := log.Info().Str("database", cfg.Database.URL).Float64("start_ms", msSince(started)).Int("workers", len(workers.Workers()))
	if srv != nil {
		ev = ev.Str("admin", srv.Addr())
	}
	ev.Msg("appview started")

	var (
		sig    os.Signal
		runErr error
	)
	select {
	case sig = <-sigs:
	case runErr = <-serveErr:
		log.Error().Err(runErr).Msg("admin server failed; stopping")
	case runErr = <-sys.Conflict():
		// Started at the same moment as another instance, both past the
		// start's check: this one, with leases off, yields.
		log.Error().Err(runErr).Msg("another instance runs on this database beside this one, which runs every worker unfenced: stopping this one")
	case <-ctx.Done():
	}
	stopping := time.Now()
	log.Info().Stringer("signal", sigOrNone{sig}).Str("timeout", cfg.ShutdownTimeout.String()).Msg("stopping: workers drain, leases are released")
	stopDone, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		watchLaterSignals(log, stopping, sigs, stopDone, forcedExit{"second signal: exiting now without waiting for releases; leases still held run out their TTL", sys.HeldLeases, os.Exit})
	}()
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	stopErr := sys.Stop(stopCtx)
	if stopErr != nil {
		closeWait = 0
	}
	if srv != nil {
		actx, acancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
		_ = srv.Shutdown(actx)
		acancel()
	}
	// The stop is over: the line below is the last (README), so the
	// watch of later signals ends first.
	close(stopDone)
	<-watched
	switch {
	case errors.Is(stopErr, system.ErrStoppedLate):
		// Every lease was released: the stop did what it is for, late.
		// The line after this one is the last, as after any stop.
		log.Warn().Err(stopErr).Msg("a worker was still stopping at shutdown_timeout and is left behind (its writes are fenced)")
	case stopErr != nil:
		log.Error().Err(stopErr).Msg("stop incomplete (see error); a lease not released runs out its TTL")
		return &loggedError{err: stopErr}
	}
	given := sys.GivenUp()
	switch {
	case runErr != nil:
		// Stopped cleanly, but because of a runtime failure (the admin
		// endpoint failed, or an instance turned up beside this unleased
		// one): exit 1, and the last line says why (README).
		held := "every lease held at the stop released"
		if !cfg.Leases.Enabled {
			held = "leases off: nothing was held"
		}
		log.Error().Err(runErr).Float64("stop_ms", msSince(stopping)).Strs("given_up", given).
			Msg("stopped because of a runtime failure (see error); " + held)
		return &loggedError{err: runErr}
	case len(given) > 0:
		// Every lease held at the stop was released, but grants given up
		// earlier still stand: "every lease released" would be untrue.
		log.Warn().Float64("stop_ms", msSince(stopping)).Strs("given_up", given).
			Msg("stopped: every lease held at the stop released; grants given up earlier were never handed back and run out their TTL")
	case !cfg.Leases.Enabled:
		log.Info().Float64("stop_ms", msSince(stopping)).Msg("stopped (leases off: nothing was held)")
	default:
		log.Info().Float64("stop_ms", msSince(stopping)).Msg("stopped: every lease released")
	}
	return nil
}

// openDuringStart opens and migrates the database (cli.OpenDatabase) while
// watching sigs. A signal aborts the start: the open is cancelled, what it
// opened is closed if it returns within startAbortWait (otherwise it is
// abandoned: the driver ignores contexts), and aborted is true. From the
// first signal on, another one at least secondSignalAfter later exits 1.
func openDuringStart(ctx context.Context, cfg config.Config, log zerolog.Logger, sigs <-chan os.Signal) (db *database.DB, aborted bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := inBackground(func() (*database.DB, error) { return cli.OpenDatabase(ctx, cfg) })
	var sig os.Signal
	select {
	case o := <-done:
		return o.v, false, o.err
	case sig = <-sigs:
	}
	first := time.Now()
	cancel()
	log.Info().Stringer("signal", sig).Str("database", cfg.Database.URL).
		Msg("signal during start: aborting the database open, nothing was acquired")
	go watchLaterSignals(log, first, sigs, nil, forcedExit{"second signal: exiting now without waiting for the database open", nil, os.Exit})
	select {
	case o := <-done:
		// Its error, if any, is the cancellation itself.
		if o.v != nil {
			o.v.Close()
		}
		log.Info().Float64("abort_ms", msSince(first)).Msg("start aborted")
	case <-time.After(startAbortWait):
		log.Warn().Str("waited", startAbortWait.String()).
			Msg("start aborted; the database open is stuck in the driver and is abandoned")
	}
	return nil, true, nil
}

// pendingSignal returns a signal already waiting on sigs, or nil.
func pendingSignal(sigs <-chan os.Signal) os.Signal {
	select {
	case s := <-sigs:
		return s
	default:
		return nil
	}
}

// watchLaterSignals reads sigs after a first signal taken at first. One
// arriving within secondSignalAfter of it is part of the same request to
// stop and is logged; a later one is an operator who will not wait: it is
// logged and force.exit(cli.ExitFailure) called (forcedExit). It returns when
// sigs is closed or done is (nil: never), so a signal read after the stop
// ended logs nothing after the stop's last line.
func watchLaterSignals(log zerolog.Logger, first time.Time, sigs <-chan os.Signal, done <-chan struct{}, force forcedExit) {
	for {
		var s os.Signal
		var ok bool
		select {
		case <-done:
			return
		case s, ok = <-sigs:
		}
		if !ok {
			return
		}
		if since := time.Since(first); since < secondSignalAfter {
			log.Info().Stringer("signal", s).Float64("after_ms", float64(since.Microseconds())/1000).
				Msg("signal arrived with the first: still stopping gracefully")
			continue
		}
		ev := log.Warn().Stringer("signal", s)
		if force.held != nil {
			// Named in the last line, like an incomplete graceful stop.
			ev = ev.Strs("leases_left_held", force.held())
		}
		ev.Msg(force.msg)
		force.exit(cli.ExitFailure)
		return
	}
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
// (docs/spec.md §4) with its state, and this instance's own view of each lease.
// When the database fails the check the lease store makes before each
// renewal (a file deleted or replaced under the process), or cannot be
// read, it answers 503 with a one-line "error" and no rows: rows read from
// a file no other instance uses would show custody that is not real.
func debugLeases(db *database.DB, instance string, sys *system.System) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		out := struct {
			Instance string         `json:"instance"`
			Leases   []fence.Listed `json:"leases"`
			Local    []lease.Status `json:"local"`
			Error    string         `json:"error,omitempty"`
		}{Instance: instance, Leases: []fence.Listed{}, Local: sys.Statuses()}
		err := db.CheckFile()
		var rows []fence.Row
		if err == nil {
			rows, err = fence.ListBounded(ctx, db)
		}
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = errors.New("database did not answer within 2s")
			}
			out.Error = admin.OneLine(err.Error())
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			rows = nil
		}
		for _, rw := range rows {
			out.Leases = append(out.Leases, rw.Listed())
		}
		admin.JSON(w, out)
	})
}

// leaseCheckBound bounds unleasedBesideHolders' read of the lease table.
const leaseCheckBound = 5 * time.Second

// closeBounded closes db, waiting at most wait for it (the statements
// still running on it; 0: not at all, the close goes on in the
// background while the process exits).
func closeBounded(db *database.DB, wait time.Duration) {
	done := make(chan struct{})
	go func() { defer close(done); db.Close() }()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
