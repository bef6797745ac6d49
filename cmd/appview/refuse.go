package main

import (
	"errors"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/atcr-io/appview/internal/cli"
)

// refuseAdminAddr is the refusal of an admin.addr that could not be
// bound (err, from admin.Bind): one line naming the address and the
// system's reason, and for a port in use the likely cause.
func refuseAdminAddr(addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return cli.Refuse("admin.addr", "cannot listen on %s (is another appview running?): address already in use", addr)
	}
	// The innermost error is the system's reason ("permission denied",
	// "cannot assign requested address", "lookup h: no such host");
	// what wraps it repeats the address.
	for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(u) {
		err = u
	}
	return cli.Refuse("admin.addr", "cannot listen on %s: %v", addr, err)
}

// logRefusalDetail logs, at debug level, the whole error behind a refused
// start (the database driver's own words: cli.StartError.Detail), which
// the refusal's one line leaves out, and returns err.
func logRefusalDetail(log zerolog.Logger, err error) error {
	var se *cli.StartError
	var te *cli.TransientError
	detail := ""
	switch {
	case errors.As(err, &se):
		detail = se.Detail
	case errors.As(err, &te):
		detail = te.Detail
	}
	if detail != "" {
		log.Debug().Str("event", "start.refused").Str("detail", detail).Msg("the error behind the refusal, in the driver's words")
	}
	return err
}
