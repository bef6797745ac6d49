package system

import (
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// LogTimeFormat is RFC 3339 with milliseconds (docs/spec.md §5), always in UTC.
const LogTimeFormat = "2006-01-02T15:04:05.000Z07:00"

var configureZerolog sync.Once

// NewLogger returns the process logger: one JSON object per line on w with
// at least "time", "level" and "msg". zerolog's message key is set to "msg"
// so the slog bridge's keys do not collide with it.
func NewLogger(w io.Writer, level zerolog.Level) zerolog.Logger {
	configureZerolog.Do(func() {
		zerolog.TimeFieldFormat = LogTimeFormat
		zerolog.MessageFieldName = "msg"
		zerolog.TimestampFunc = func() time.Time { return time.Now().UTC() }
	})
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// SlogBridge returns a log/slog logger writing through log, for libraries
// that log with slog (protoactor-go).
func SlogBridge(log zerolog.Logger) *slog.Logger {
	return slog.New(zerolog.NewSlogHandler(log))
}
