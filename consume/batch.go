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
// until the batch has n messages, work stays quiet for a tenth of linger,
// linger has passed since first, work is closed or stop is closed (nil:
// never). A backlog, whose messages come back to back, fills a batch at
// once; a message that comes alone waits a tenth of linger, not all of it.
// A worker runs the batch with Executor.SettleBatch.
func Collect[M any](first M, work <-chan M, n int, linger time.Duration, stop <-chan struct{}) []M {
	batch := append(make([]M, 0, n), first)
	if n <= 1 {
		return batch
	}
	deadline := time.NewTimer(linger)
	defer deadline.Stop()
	gap := max(linger/10, time.Microsecond)
	quiet := time.NewTimer(gap)
	defer quiet.Stop()
	for len(batch) < n {
		select {
		case m, ok := <-work:
			if !ok {
				return batch
			}
			batch = append(batch, m)
			quiet.Reset(gap)
		case <-quiet.C:
			return batch
		case <-deadline.C:
			return batch
		case <-stop:
			return batch
		}
	}
	return batch
}
