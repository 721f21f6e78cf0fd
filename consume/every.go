package consume

import "time"

// Every calls fn every interval, on a goroutine of its own, until the
// returned stop is called; stop waits for fn to return. The broker
// packages keep a message theirs with it while it runs (an in-progress
// mark, a visibility extension).
func Every(interval time.Duration, fn func()) (stop func()) {
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				fn()
			}
		}
	}()
	return func() { close(quit); <-stopped }
}
