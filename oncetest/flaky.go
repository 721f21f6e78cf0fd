package oncetest

import (
	"errors"
	"sync"
)

// ErrFlaky is what Flaky.Try returns on the first try of its Fail key.
var ErrFlaky = errors.New("oncetest: the first try fails")

// Flaky counts a handler's tries per key, and makes the first try of one
// key fail (Fail: ErrFlaky) and of another panic (Panic): the consumer
// tests of failures beside successes in one batch. It is safe for
// concurrent use.
type Flaky struct {
	Fail, Panic string

	mu    sync.Mutex
	tries map[string]int
}

// Try records a try of key, and fails or panics if it is the first of
// Fail or Panic.
func (f *Flaky) Try(key string) error {
	f.mu.Lock()
	if f.tries == nil {
		f.tries = map[string]int{}
	}
	f.tries[key]++
	first := f.tries[key] == 1
	f.mu.Unlock()
	switch {
	case first && key == f.Fail:
		return ErrFlaky
	case first && key == f.Panic:
		panic("oncetest: the first try panics")
	}
	return nil
}

// Tries returns how often key was tried.
func (f *Flaky) Tries(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tries[key]
}
