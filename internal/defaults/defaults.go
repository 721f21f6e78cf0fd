// Package defaults fills the unset fields of a configuration struct, so each
// constructor states its defaults in one line apiece.
package defaults

import "log/slog"

// Positive sets *v to def unless *v is positive: zero means "unset", and a
// negative size or duration is never meant.
func Positive[T ~int | ~int32 | ~int64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Logger sets *l to slog.Default() when it is nil.
func Logger(l **slog.Logger) {
	if *l == nil {
		*l = slog.Default()
	}
}
