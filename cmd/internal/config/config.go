// Package config reads a command's settings from flags whose defaults come
// from environment variables, so every env var also has a flag. Bad values
// are collected and reported as one line before anything starts.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Set is a flag set whose flags fall back to environment variables.
type Set struct {
	fs   *flag.FlagSet
	out  io.Writer
	errs []error
	envs map[string]string // flag name -> env var
}

// NewSet returns a Set for the named command; usage goes to out.
func NewSet(command string, out io.Writer) *Set {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	// Parse errors are reported by the caller as one line; usage is printed
	// only for -h.
	fs.SetOutput(io.Discard)
	return &Set{fs: fs, out: out, envs: map[string]string{}}
}

// FlagSet returns the underlying flag set (for boolean switches and the like).
func (s *Set) FlagSet() *flag.FlagSet { return s.fs }

// SetSynopsis makes -h print synopsis (the command's usage lines), then
// every flag with its default and environment variable.
func (s *Set) SetSynopsis(synopsis string) {
	s.fs.Usage = func() {
		fmt.Fprintln(s.fs.Output(), synopsis+"\n\nflags:")
		s.fs.PrintDefaults()
	}
}

func (s *Set) env(name, env string) (string, bool) {
	s.envs[name] = env
	return os.LookupEnv(env)
}

func usage(env, text string) string { return text + " (env " + env + ")" }

// String defines a string setting.
func (s *Set) String(name, env, def, text string) *string {
	if v, ok := s.env(name, env); ok {
		def = v
	}
	return s.fs.String(name, def, usage(env, text))
}

// Duration defines a positive duration setting in Go syntax (e.g. 30s).
func (s *Set) Duration(name, env string, def time.Duration, text string) *time.Duration {
	v := &durationValue{d: def}
	if raw, ok := s.env(name, env); ok {
		if err := v.Set(raw); err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: %w", env, raw, err))
		}
	}
	s.fs.Var(v, name, usage(env, text))
	return &v.d
}

// Int defines a positive integer setting.
func (s *Set) Int(name, env string, def int, text string) *int {
	v := &intValue{n: def}
	if raw, ok := s.env(name, env); ok {
		if err := v.Set(raw); err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: %w", env, raw, err))
		}
	}
	s.fs.Var(v, name, usage(env, text))
	return &v.n
}

// Count defines a non-negative integer setting (0 allowed).
func (s *Set) Count(name, env string, def int, text string) *int {
	v := &intValue{n: def, zero: true}
	if raw, ok := s.env(name, env); ok {
		if err := v.Set(raw); err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: %w", env, raw, err))
		}
	}
	s.fs.Var(v, name, usage(env, text))
	return &v.n
}

// IsSet reports whether the setting name was given, as a flag or through
// its environment variable (call it after Parse).
func (s *Set) IsSet(name string) bool {
	set := false
	s.fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if env, ok := s.envs[name]; ok && !set {
		_, set = os.LookupEnv(env)
	}
	return set
}

// Bool defines a boolean setting; the environment variable takes true,
// false, 1 or 0.
func (s *Set) Bool(name, env string, def bool, text string) *bool {
	if raw, ok := s.env(name, env); ok {
		v, err := strconv.ParseBool(raw)
		if err != nil {
			s.errs = append(s.errs, fmt.Errorf("%s=%q: use true or false", env, raw))
		} else {
			def = v
		}
	}
	return s.fs.Bool(name, def, usage(env, text))
}

// Parse parses args and returns the first problem as one line.
func (s *Set) Parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			s.fs.SetOutput(s.out)
			s.fs.Usage()
			return flag.ErrHelp
		}
		return fmt.Errorf("bad flag: %w", err)
	}
	if len(s.errs) > 0 {
		return fmt.Errorf("bad configuration: %w", s.errs[0])
	}
	return nil
}

// Args returns the arguments left after the flags.
func (s *Set) Args() []string { return s.fs.Args() }

// Require returns an error naming the env var of every empty setting.
func (s *Set) Require(settings map[string]*string) error {
	var missing []string
	for name, v := range settings {
		if strings.TrimSpace(*v) == "" {
			missing = append(missing, s.envs[name]+" (or -"+name+")")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("bad configuration: %s is required", strings.Join(missing, ", "))
	}
	return nil
}

type durationValue struct{ d time.Duration }

func (v *durationValue) String() string { return v.d.String() }

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration (use Go syntax such as 500ms, 30s, 24h)")
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	v.d = d
	return nil
}

type intValue struct {
	n    int
	zero bool // 0 is allowed
}

func (v *intValue) String() string { return strconv.Itoa(v.n) }

func (v *intValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if v.zero && (err != nil || n < 0) {
		return errors.New("must be a non-negative integer")
	}
	if !v.zero && (err != nil || n <= 0) {
		return errors.New("must be a positive integer")
	}
	v.n = n
	return nil
}
