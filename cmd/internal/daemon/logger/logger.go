// Package logger builds a command's slog logger from LOG_LEVEL and
// LOG_FORMAT.
package logger

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// New returns a logger writing to w in format ("json" or "text", any case)
// at level ("debug", "info", "warn", "error", as slog.Level reads them). A
// bad value is a one-line configuration error naming its variable.
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad configuration: LOG_LEVEL=%q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("bad configuration: LOG_FORMAT=%q: use json or text", format)
}
