package consume

import "time"

// Defaults of the broker packages' batches (their Options.BatchSize and
// BatchLinger), measured in docs/BENCHMARKS.md ("Consumers in batches").
const (
	// DefaultBatchSize is how many messages a batch takes at most.
	DefaultBatchSize = 32
	// DefaultBatchLinger is how long a batch waits for more messages
	// after its first.
	DefaultBatchLinger = 2 * time.Millisecond
)

// Collect returns a batch that begins with first: what work hands over
// until the batch has n messages, linger has passed since first, work is
// closed or stop is closed (nil: never). A worker runs the batch with
// Executor.SettleBatch.
func Collect[M any](first M, work <-chan M, n int, linger time.Duration, stop <-chan struct{}) []M {
	batch := append(make([]M, 0, n), first)
	if n <= 1 {
		return batch
	}
	timer := time.NewTimer(linger)
	defer timer.Stop()
	for len(batch) < n {
		select {
		case m, ok := <-work:
			if !ok {
				return batch
			}
			batch = append(batch, m)
		case <-timer.C:
			return batch
		case <-stop:
			return batch
		}
	}
	return batch
}
