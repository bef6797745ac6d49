// Package admin serves the operator HTTP endpoint of docs/spec.md §7: /healthz
// (process alive), /readyz (database reachable, migrations done),
// /metrics (Prometheus text format) and the JSON debug views that the
// system and workers register on the same mux (/debug/leases,
// /debug/holds, /debug/stats), plus the lease nudge endpoint.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/atcr-io/appview/internal/database"
)

// readyTimeout bounds the database check behind /readyz.
const readyTimeout = 2 * time.Second

// Server is the admin HTTP server. Mux is where everything registers.
type Server struct {
	Mux *http.ServeMux
	ln  net.Listener
	srv *http.Server

	mu     sync.Mutex
	checks []func() error
}

// AddReadyCheck adds a check /readyz runs after the database's: a non-nil
// error makes it answer 503 with that error on one line.
func (s *Server) AddReadyCheck(check func() error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append(s.checks, check)
}

func (s *Server) ready(ctx context.Context, db *database.DB) error {
	if err := db.Ready(ctx); err != nil {
		return err
	}
	s.mu.Lock()
	checks := append([]func() error(nil), s.checks...)
	s.mu.Unlock()
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// Bind binds addr for the admin endpoint (Listen serves on it). serve
// binds first, before it opens the database, so that a port in use is
// refused before anything is created or written. The error says "listen
// on ADDR: " and the system's reason.
func Bind(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// Listen takes ln (from Bind) and registers /healthz, /readyz and
// /metrics on it, with the access rules of opts (Options{}
// serves everything without a token); Serve then answers. Go runtime and
// process collectors are added to reg. ln is closed when Listen fails.
func Listen(ln net.Listener, db *database.DB, reg *prometheus.Registry, opts Options) (*Server, error) {
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		ln.Close()
		return nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		ln.Close()
		return nil, err
	}
	s := &Server{ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := s.ready(ctx, db); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				err = fmt.Errorf("database did not answer within %s", readyTimeout)
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, OneLine(err.Error()))
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if opts.Pprof {
		mountPprof(mux)
	}
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "appview_admin_auth_failures_total",
		Help: "Admin requests refused with 401, by reason: missing (no Authorization header), malformed (not \"Bearer <token>\"), wrong (another token).",
	}, []string{"reason"})
	for _, r := range []string{reasonMissing, reasonMalformed, reasonWrong} {
		failures.WithLabelValues(r)
	}
	if err := reg.Register(failures); err != nil {
		ln.Close()
		return nil, err
	}
	handler := guard(mux, opts, failures)
	s.Mux, s.srv = mux, &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, MaxHeaderBytes: MaxHeaderBytes}
	return s, nil
}

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the base URL of this server as seen from elsewhere: the bound
// address, with an unspecified host (0.0.0.0, ::) replaced by advertise or
// the hostname.
func (s *Server) URL(advertise string) string {
	if advertise != "" {
		return advertise
	}
	host, port, _ := net.SplitHostPort(s.Addr())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port)
}

// Serve serves until Shutdown; call it in its own goroutine.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops accepting connections and waits for handlers in flight.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// OneLine folds s onto one line: a readiness probe or a debug view shows
// its reason whole, and go-libsql and Hrana errors embed newlines.
func OneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// JSON writes v as indented JSON with status 200.
func JSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
