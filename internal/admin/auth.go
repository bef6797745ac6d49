package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Options are the access rules of the admin endpoint.
type Options struct {
	// Token, when not empty, is required as "Authorization: Bearer <Token>"
	// on every path but the open ones: /healthz, /readyz and (unless
	// ProtectMetrics) /metrics.
	Token string
	// ProtectMetrics puts /metrics behind Token too.
	ProtectMetrics bool
	// Pprof mounts net/http/pprof under /debug/pprof/.
	Pprof bool
}

// Bounds on what one admin request may send. No admin endpoint takes a
// body larger than a few bytes (a nudge has none), so MaxBodyBytes only
// has to be generous for future JSON; headers are bounded by the server
// (it answers 431 above MaxHeaderBytes).
const (
	MaxBodyBytes   = 64 << 10
	MaxHeaderBytes = 16 << 10
)

// Refusal reasons, the values of the reason label of
// appview_admin_auth_failures_total.
const (
	reasonMissing   = "missing"
	reasonMalformed = "malformed"
	reasonWrong     = "wrong"
)

// openPath reports whether path is served without a token: probes must
// work for a load balancer or orchestrator that has no secret.
func openPath(path string, protectMetrics bool) bool {
	switch path {
	case "/healthz", "/readyz":
		return true
	case "/metrics":
		return !protectMetrics
	}
	return false
}

// guard wraps next with the body bound and, when opts.Token is set, the
// bearer check. A refusal is a 401 with a one-line reason and a
// WWW-Authenticate challenge (RFC 6750); it is counted, never logged at
// error level (a scanner must not fill the log).
func guard(next http.Handler, opts Options, failures *prometheus.CounterVec) http.Handler {
	// Comparing digests keeps the compare constant-time whatever the
	// length of the presented token (subtle.ConstantTimeCompare returns
	// early on a length mismatch).
	want := sha256.Sum256([]byte(opts.Token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxBodyBytes {
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("request body of %d bytes is over the admin limit of %d", r.ContentLength, MaxBodyBytes), http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		if opts.Token == "" || openPath(r.URL.Path, opts.ProtectMetrics) {
			next.ServeHTTP(w, r)
			return
		}
		reason, msg := "", ""
		values := r.Header.Values("Authorization")
		switch {
		case len(values) == 0:
			reason, msg = reasonMissing, "missing Authorization header (want: Bearer <admin.token>)"
		case len(values) > 1:
			reason, msg = reasonMalformed, "more than one Authorization header"
		default:
			scheme, token, ok := strings.Cut(values[0], " ")
			switch {
			case !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || strings.ContainsAny(token, " \t"):
				reason, msg = reasonMalformed, "malformed Authorization header (want: Bearer <admin.token>)"
			default:
				got := sha256.Sum256([]byte(token))
				if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
					reason, msg = reasonWrong, "wrong admin token"
				}
			}
		}
		if reason != "" {
			failures.WithLabelValues(reason).Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="appview-admin"`)
			http.Error(w, msg, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// BearerHeader returns the header carrying "Authorization: Bearer
// <token>": the client side of the admin token, for nudges between
// instances (lease.Contenders.Header). An empty token gives nil.
func BearerHeader(token string) http.Header {
	if token == "" {
		return nil
	}
	return http.Header{"Authorization": {"Bearer " + token}}
}

// mountPprof registers net/http/pprof under /debug/pprof/ on mux. (The
// package also registers itself on http.DefaultServeMux when imported;
// nothing in appview serves that mux.)
func mountPprof(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
