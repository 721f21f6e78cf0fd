package relay

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onceonly/onceonly/keystate"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/outbox"
)

// BenchmarkDrainReplicated measures what the replica guard costs the drain
// (Config.WaitReplicas, on by default under Sentinel): a backlog of
// BENCH_EVENTS (default 200k) events drained by one relay through a
// Sentinel failover client (TEST_REDIS_SENTINEL_URL, else a group of its
// own: a primary and one replica on this machine), at batch 500 (the
// default) and 50. Every round drains two backlogs back to back, one
// without the guard and one with a WAIT for the replica after every batch,
// in alternating order, so both see the same machine; it reports both
// rates and their ratio.
func BenchmarkDrainReplicated(b *testing.B) {
	events := benchEnvInt(b, "BENCH_EVENTS", 200_000)
	url := oncetest.SentinelURL(b)
	for _, batch := range []int{DefaultBatchSize, 50} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			var took [2]time.Duration // by WaitReplicas
			for i := range b.N {
				for j := range 2 {
					wait := (i + j) % 2
					b.StopTimer()
					rdb := oncetest.SentinelClient(b, url)
					bd := setup(b, oncetest.OnRedis(rdb))
					seedBacklog(b, bd, events)
					r := bd.relay(b, Config{BatchSize: batch, WaitReplicas: wait})
					b.StartTimer()
					began := time.Now()
					n, err := r.Drain(bd.Ctx)
					took[wait] += time.Since(began)
					if err != nil || n != events {
						b.Fatalf("wait=%d: drained %d of %d: %v", wait, n, events, err)
					}
					b.StopTimer()
					dropKeys(b, bd) // the next round starts on a small dataset
				}
			}
			b.ReportMetric(float64(events*b.N)/took[0].Seconds(), "events/s_nowait")
			b.ReportMetric(float64(events*b.N)/took[1].Seconds(), "events/s_wait")
			b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "wait/nowait")
		})
	}
}

// dropKeys deletes the keys under bd's prefix.
func dropKeys(b *testing.B, bd *bundle) {
	b.Helper()
	rdb := bd.Cache.Client()
	iter := rdb.Scan(bd.Ctx, 0, bd.Cache.Prefix()+"*", 5000).Iterator()
	var batch []string
	for iter.Next(bd.Ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 5000 {
			rdb.Unlink(bd.Ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(bd.Ctx, batch...)
	}
	if err := iter.Err(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLagReplicated is BenchmarkLag through a Sentinel failover
// client, without and with the replica guard, alternating as
// BenchmarkDrainReplicated does: BENCH_RATE (default 1000) transitions a
// second for BENCH_SECONDS (default 10), each followed by a NOTIFY after its
// commit (the engine's default path) while a relay runs; it reports the
// commit→Redis lag, which with the guard runs to the replica's
// acknowledgement.
func BenchmarkLagReplicated(b *testing.B) {
	rate := benchEnvInt(b, "BENCH_RATE", 1000)
	seconds := benchEnvInt(b, "BENCH_SECONDS", 10)
	url := oncetest.SentinelURL(b)
	var lags [2][]time.Duration // by WaitReplicas
	for i := range b.N {
		for j := range 2 {
			wait := (i + j) % 2
			rdb := oncetest.SentinelClient(b, url)
			bd := setup(b, oncetest.OnRedis(rdb))
			measured, _, _ := measureLag(b, bd, bd.relay(b, Config{WaitReplicas: wait}), notifyAfterCommit, rate, seconds)
			lags[wait] = append(lags[wait], measured...)
		}
	}
	for wait, name := range []string{"nowait", "wait"} {
		slices.Sort(lags[wait])
		b.ReportMetric(float64(percentile(lags[wait], 0.50).Microseconds())/1000, "p50_ms_"+name)
		b.ReportMetric(float64(percentile(lags[wait], 0.99).Microseconds())/1000, "p99_ms_"+name)
		b.ReportMetric(float64(lags[wait][len(lags[wait])-1].Microseconds())/1000, "max_ms_"+name)
	}
}

// notifyMode is how measureLag's writers wake the relay.
type notifyMode string

const (
	// notifyAfterCommit: claims commit without a NOTIFY; the writer sends
	// one after the commit, coalesced (the engine's default, when its
	// write-through failed).
	notifyAfterCommit notifyMode = "after-commit"
	// notifyInTx: the claim's transaction sends the NOTIFY.
	notifyInTx notifyMode = "in-tx"
)

// lagParts splits every event's commit→Redis lag: until its batch's take
// was sent (the writer's commit, the NOTIFY, waking a worker, or waiting
// for a free one), the take's round trip, and the Redis push.
type lagParts struct{ wait, take, push []time.Duration }

// measureLag claims rate keys a second for seconds from 8 writers while r
// runs, waking it as mode says, and returns every event's commit→Redis lag
// (from the event's created_at, so the writer's commit is included), its
// parts, and the rate the writers achieved.
func measureLag(b *testing.B, bd *bundle, r *Relay, mode notifyMode, rate, seconds int) (lags []time.Duration, parts lagParts, achieved float64) {
	b.Helper()
	var mu sync.Mutex
	r.delivered = func(events []outbox.Event, _ []outbox.FailedEvent, at batchTimes) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			lags = append(lags, at.acked.Sub(e.CreatedAt))
			parts.wait = append(parts.wait, at.began.Sub(e.CreatedAt))
			parts.take = append(parts.take, at.taken.Sub(at.began))
			parts.push = append(parts.push, at.acked.Sub(at.taken))
		}
	}
	ctx, cancel := context.WithCancel(bd.Ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	bd.awaitListening(b, r)

	// The writers have a pool of their own, as the api has in its process:
	// sharing the relay's would queue the relay behind them.
	url := bd.Pool.Config().ConnString()
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool := oncetest.Pool(b, url+sep+"pool_max_conns=16")
	store := outbox.New(outbox.Config{CompletedTTL: time.Hour, DeferNotify: mode == notifyAfterCommit})
	kick := func() {}
	if mode == notifyAfterCommit {
		w := newNotifier(bd.Ctx, func(ctx context.Context) error { return store.Notify(ctx, pool) })
		defer w.stop()
		kick = w.kick
	}
	const writers = 8
	total := rate * seconds
	interval := time.Second / time.Duration(rate)
	began := time.Now()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := w; i < total; i += writers {
				time.Sleep(time.Until(began.Add(time.Duration(i) * interval))) // the writers' schedule (open loop), not a wait for an event
				ref := keystate.Ref{Scope: "bench", Key: "lag-" + strconv.Itoa(i)}
				if _, err := store.Claim(bd.Ctx, pool, ref, "v1:fp", owner, time.Minute); err != nil {
					b.Error(err)
					return
				}
				kick()
			}
		})
	}
	wg.Wait()
	achieved = float64(total) / time.Since(began).Seconds()
	oncetest.Eventually(b, 10*time.Second, "every event delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(lags) >= total
	})
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return lags, parts, achieved
}

// notifier sends NOTIFYs after commits, coalesced as the engine's waker
// does: kicks that arrive while one is on its way are answered by the next.
type notifier struct {
	pending chan struct{}
	done    chan struct{}
	cancel  context.CancelFunc
}

func newNotifier(ctx context.Context, notify func(context.Context) error) *notifier {
	ctx, cancel := context.WithCancel(ctx)
	n := &notifier{pending: make(chan struct{}, 1), done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(n.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-n.pending:
			}
			_ = notify(ctx) // a lost wake-up is covered by the poll
		}
	}()
	return n
}

func (n *notifier) kick() {
	select {
	case n.pending <- struct{}{}:
	default:
	}
}

func (n *notifier) stop() {
	n.cancel()
	<-n.done
}

// BenchmarkReplicaWait measures the guard's own cost, paid once per batch:
// a PUBLISH and a WAIT for one replica on the primary of a Sentinel group
// (TEST_REDIS_SENTINEL_URL, else a group of its own).
func BenchmarkReplicaWait(b *testing.B) {
	rdb := oncetest.SentinelClient(b, oncetest.SentinelURL(b))
	w := &replicaWait{rdb: rdb, replicas: 1, timeout: time.Second, channel: "bench:relay:replicated"}
	ctx := oncetest.Context(b)
	for b.Loop() {
		if err := w.wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
