package oncekafka_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncekafka"
	"github.com/onceonly/onceonly/oncekafka/kafkatest"
	"github.com/onceonly/onceonly/oncetest"
)

func TestCopiesRunOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.run(t, effect, b.options())

	// Three copies of one message on three partitions, and another.
	for p := range int32(partitions) {
		b.produce(t, p, "order-1", `{"amount":100}`)
	}
	b.produce(t, 0, "order-2", `{"amount":200}`)

	b.awaitSettled(t, 20*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.rows(t, "order-2"))
	require.Equal(t, 2, b.count(t, "ack", "executed"))
	require.Equal(t, 2, b.count(t, "ack", "replayed"))
	require.Empty(t, b.deadLetters(t))
}

func TestTxConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c, err := oncekafka.NewTxConsumer(b.engine, func(ctx context.Context, tx pgx.Tx, msg oncekafka.Message) error {
		require.NotNil(t, msg.Record)
		_, err := tx.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`, msg.Scope, msg.Key, string(msg.Payload))
		return err
	}, b.options())
	require.NoError(t, err)
	b.runConsumer(t, c)
	for range 3 {
		b.produce(t, 1, "order-1", `{"amount":100}`)
	}
	b.awaitSettled(t, 20*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
	require.Equal(t, 2, b.count(t, "ack", "replayed"))
}

func TestReusedKeyIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.run(t, effect, b.options())

	b.produce(t, 0, "order-1", `{"amount":100}`)
	b.awaitSettled(t, 10*time.Second)
	off := b.produce(t, 2, "order-1", `{"amount":999}`) // the same key, another payload

	dead := b.awaitDeadLetters(t, 1)[0]
	require.Equal(t, `{"amount":999}`, string(dead.Value))
	require.Equal(t, "account-7", string(dead.Key), "the original record's key")
	require.Equal(t, "order-1", kafkatest.Header(dead, oncekafka.DefaultKeyHeader))
	require.Equal(t, "t1", kafkatest.Header(dead, "Trace"))
	require.Equal(t, onceonly.ReasonReused, kafkatest.Header(dead, oncekafka.HeaderReason))
	require.Equal(t, b.topic, kafkatest.Header(dead, oncekafka.HeaderTopic))
	require.Equal(t, "2", kafkatest.Header(dead, oncekafka.HeaderPartition))
	require.Equal(t, strconv.FormatInt(off, 10), kafkatest.Header(dead, oncekafka.HeaderOffset))
	b.awaitSettled(t, 10*time.Second) // dead-lettered counts as settled
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "dead_letter", onceonly.ReasonReused))
}

func TestInvalidRecordsAreDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	opts := b.options()
	opts.Payload = func(rec *kgo.Record) ([]byte, error) {
		if string(rec.Value) == "panic" {
			panic("a decoder bug")
		}
		var order struct {
			Amount int `json:"amount"`
		}
		if err := json.Unmarshal(rec.Value, &order); err != nil {
			return nil, fmt.Errorf("an order is JSON: %w", err)
		}
		return rec.Value, nil
	}
	b.run(t, effect, opts)

	b.produce(t, 0, "", `{"amount":100}`)        // no key
	b.produce(t, 0, "order 1", `{"amount":100}`) // a key with a space
	b.produce(t, 1, "order-2", `not json`)       // a payload Options.Payload refuses
	b.produce(t, 1, "order-5", `panic`)          // a payload Options.Payload panics on
	b.produce(t, 2, "order-4", `{"amount":100}`) // valid

	for _, rec := range b.awaitDeadLetters(t, 4) {
		require.Equal(t, onceonly.ReasonInvalid, kafkatest.Header(rec, oncekafka.HeaderReason), kafkatest.Header(rec, oncekafka.HeaderError))
	}
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.rows(t, "order-4"))
	require.Equal(t, 4, b.count(t, "dead_letter", onceonly.ReasonInvalid))
}

func TestFailingKeyIsDeadLetteredThenRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var failing atomic.Bool
	failing.Store(true)
	var calls atomic.Int32
	opts := b.options()
	opts.Policy.MaxFailures = 3
	b.run(t, func(ctx context.Context, msg oncekafka.Message) error {
		calls.Add(1)
		if failing.Load() {
			return errors.New("the gateway declined to answer")
		}
		return effect(ctx, msg)
	}, opts)

	b.produce(t, 0, "order-1", `{"amount":100}`)
	b.produce(t, 0, "order-2", `{"amount":100}`) // behind it, failing too
	for _, dead := range b.awaitDeadLetters(t, 2) {
		require.Equal(t, onceonly.ReasonFailed, kafkatest.Header(dead, oncekafka.HeaderReason))
		require.Contains(t, kafkatest.Header(dead, oncekafka.HeaderError), "the gateway declined to answer")
	}
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 2, b.count(t, "dead_letter", onceonly.ReasonFailed))
	require.Equal(t, 4, b.count(t, "retry", "failed"), "MaxFailures-1 retries for each")
	require.Equal(t, []time.Duration{50 * time.Millisecond, 100 * time.Millisecond}, retries(b, "order-1"))

	// A later copy of the key runs again once the cause is mended.
	failing.Store(false)
	b.produce(t, 1, "order-1", `{"amount":100}`)
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.count(t, "ack", "executed"))
}

// retries returns the delays the consumer gave key's failed executions.
func retries(b *testBundle, key string) []time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	var after []time.Duration
	for _, s := range b.settled {
		if s.Disposition == onceonly.Retry && s.key == key {
			after = append(after, s.After)
		}
	}
	return after
}

func TestCopyOfKeyInFlightIsNeverDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	opts := b.options()
	opts.Policy.MaxFailures = 1 // a failure would dead-letter at once
	b.run(t, func(ctx context.Context, msg oncekafka.Message) error {
		once.Do(func() { close(started) })
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return effect(ctx, msg)
	}, opts)

	b.produce(t, 0, "order-1", `{"amount":100}`)
	<-started
	b.produce(t, 1, "order-1", `{"amount":100}`) // a copy while the first runs
	b.produce(t, 1, "order-2", `{"amount":100}`) // behind the copy: runs meanwhile
	oncetest.Eventually(t, 10*time.Second, "the copy turned away twice while the key is in flight", func() bool {
		return b.count(t, "retry", "in_flight") >= 2
	})
	close(release)
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 1, b.rows(t, "order-1"))
	require.Equal(t, 1, b.rows(t, "order-2"))
	require.Equal(t, 2, b.count(t, "ack", "executed"))
	require.Equal(t, 1, b.count(t, "ack", "replayed"))
	require.Empty(t, b.deadLetters(t), "a key in flight is never dead-lettered")
}

// A record that does not settle holds its partition's committed offset,
// whatever settles behind it; a full window pauses the partition.
func TestCommittedOffsetNeverSkipsAnUnsettledRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	release := make(chan struct{})
	opts := b.options()
	opts.PartitionWindow = 4
	opts.MaxPoll = 1
	b.run(t, func(ctx context.Context, msg oncekafka.Message) error {
		if msg.Key == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effect(ctx, msg)
	}, opts)

	first := b.produce(t, 0, "first", `{}`)
	slow := b.produce(t, 0, "slow", `{}`)
	for i := range 8 {
		b.produce(t, 0, fmt.Sprint("after-", i), `{}`)
	}
	b.produce(t, 1, "elsewhere", `{}`) // another partition goes on
	oncetest.Eventually(t, 10*time.Second, "the records of the window settled behind the slow one", func() bool {
		return b.count(t, "ack", "executed") >= 5 && b.committed(t)[1] == 1 && b.committed(t)[0] == slow
	})
	require.Equal(t, first+1, slow)
	// The window (4: slow and 3 behind it) is full: the partition waits.
	require.Equal(t, float64(1), oncetest.Metric(t, b.reg, "onceonly_kafka_partitions_paused", nil))
	require.Less(t, b.count(t, "ack", "executed"), 11)
	require.Equal(t, slow, b.committed(t)[0], "never past the unsettled record")

	close(release)
	b.awaitSettled(t, 10*time.Second)
	require.Equal(t, 11, b.count(t, "ack", "executed"))
	require.Zero(t, oncetest.Metric(t, b.reg, "onceonly_kafka_partitions_paused", nil))
}

// Members join and leave the group while records flow: every key's effect
// happens once.
func TestRebalance(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var runs, runs1, runs2 atomic.Int32
	handler := func(mine *atomic.Int32) oncekafka.Handler {
		return func(ctx context.Context, msg oncekafka.Message) error {
			runs.Add(1)
			mine.Add(1)
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			return effect(ctx, msg)
		}
	}
	opts1 := b.options()
	opts1.Name = "kafka.member-1" // one engine here; one name per process
	c1, stop1 := b.run(t, handler(&runs1), opts1)

	const keys = 150
	producing := make(chan error, 1)
	go func() {
		var err error
		for i := 0; i < keys && err == nil; i++ {
			key := fmt.Sprint("order-", i)
			err = b.produceErr(int32(i%partitions), key, `{}`)
			if i%5 == 0 && err == nil { // and a copy on another partition
				err = b.produceErr(int32((i+1)%partitions), key, `{}`)
			}
		}
		producing <- err
	}()
	oncetest.Eventually(t, 10*time.Second, "member 1 joined", c1.Joined)
	oncetest.Eventually(t, 10*time.Second, "member 1 consuming", func() bool { return runs.Load() > 20 })
	opts2 := b.options()
	opts2.Name = "kafka.member-2"
	c2, _ := b.run(t, handler(&runs2), opts2)
	oncetest.Eventually(t, 15*time.Second, "member 2 joined", c2.Joined)
	oncetest.Eventually(t, 10*time.Second, "member 2 consuming", func() bool { return runs.Load() > 60 })
	stop1() // member 1 leaves: member 2 takes its partitions
	require.NoError(t, <-producing)
	b.awaitSettled(t, 30*time.Second)

	var doubles int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d`).Scan(&doubles))
	require.Zero(t, doubles, "no key's effect happened twice")
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT key) FROM effects`).Scan(&n))
	require.Equal(t, keys, n)
	require.Equal(t, keys, b.count(t, "ack", "executed"))
	require.Empty(t, b.deadLetters(t))
	require.Positive(t, runs1.Load(), "member 1 ran records")
	require.Positive(t, runs2.Load(), "member 2 ran records")
}

// Stop lets executions finish within the bound, then cancels them; what
// did not settle is not committed, and the next member runs it.
func TestShutdown(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	started := make(chan struct{})
	var once sync.Once
	opts := b.options()
	opts.ShutdownTimeout = 300 * time.Millisecond
	opts.Name = "kafka.first"
	_, stop := b.run(t, func(ctx context.Context, msg oncekafka.Message) error {
		if msg.Key == "stuck" {
			once.Do(func() { close(started) })
			<-ctx.Done() // only the shutdown bound ends it
			return ctx.Err()
		}
		return effect(ctx, msg)
	}, opts)
	b.produce(t, 0, "before", `{}`)
	stuck := b.produce(t, 0, "stuck", `{}`)
	b.produce(t, 0, "after", `{}`)
	<-started
	oncetest.Eventually(t, 10*time.Second, "the record behind the stuck one settled", func() bool { return b.rows(t, "after") == 1 })
	begin := time.Now()
	stop()
	require.Less(t, time.Since(begin), 5*time.Second, "Stop returns soon after the shutdown bound")
	require.Equal(t, stuck, b.committed(t)[0], "the settled prefix, committed at Stop")

	opts = b.options()
	opts.Name = "kafka.second"
	b.run(t, effect, opts)
	b.awaitSettled(t, 15*time.Second)
	require.Equal(t, 1, b.rows(t, "stuck"))
	require.Equal(t, 1, b.rows(t, "before"))
	require.Equal(t, 1, b.rows(t, "after"))
}

// The broker stops and starts again (its data directory keeps records and
// committed offsets), once between two batches and once while records
// run: the consumer goes on, nothing runs twice.
func TestBrokerRestart(t *testing.T) {
	t.Parallel()
	br := privateBroker(t)
	b := setup(t, br)
	b.run(t, func(ctx context.Context, msg oncekafka.Message) error {
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
		return effect(ctx, msg)
	}, b.options())
	for i := range 10 {
		b.produce(t, int32(i%partitions), fmt.Sprint("order-", i), `{}`)
	}
	b.awaitSettled(t, 15*time.Second)

	br.Stop()
	require.NoError(t, br.Start())
	for i := range 20 {
		b.produce(t, int32(i%partitions), fmt.Sprint("order-", 10+i), `{}`)
		b.produce(t, int32((i+1)%partitions), fmt.Sprint("order-", i%10), `{}`) // old copies
	}
	oncetest.Eventually(t, 15*time.Second, "the second batch under way", func() bool {
		return b.count(t, "ack", "executed") >= 15
	})
	br.Stop() // while records run
	require.NoError(t, br.Start())
	b.awaitSettled(t, 30*time.Second)
	var n, total int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT key), count(*) FROM effects`).Scan(&n, &total))
	require.Equal(t, 30, n)
	require.Equal(t, 30, total)
}

func TestOptions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	for name, broken := range map[string]func(o *oncekafka.Options){
		"no brokers":        func(o *oncekafka.Options) { o.Brokers = nil },
		"no group":          func(o *oncekafka.Options) { o.Group = "" },
		"no topics":         func(o *oncekafka.Options) { o.Topics = nil },
		"no scope":          func(o *oncekafka.Options) { o.Scope = "" },
		"bad scope":         func(o *oncekafka.Options) { o.Scope = "a:b" },
		"negative":          func(o *oncekafka.Options) { o.PartitionWindow = -1 },
		"dead letter eaten": func(o *oncekafka.Options) { o.Topics = append(o.Topics, o.DeadLetterTopic) },
	} {
		opts := b.options()
		opts.Name = "kafka.options." + name
		broken(&opts)
		_, err := oncekafka.NewConsumer(b.engine, effect, opts)
		require.Error(t, err, name)
	}
}

// A partition is revoked while its record runs on the first member: the
// new owner's run of the record is turned away as in flight (the key's
// lease fences it) until the first execution commits, then settles as a
// replay; the first member's settlement of the revoked record is dropped.
func TestRevokedExecutionIsFenced(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	release := make(chan struct{})
	var running atomic.Int32
	handler := func(ctx context.Context, msg oncekafka.Message) error {
		running.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return effect(ctx, msg)
	}
	opts1 := b.options()
	opts1.Name = "kafka.member-1"
	b.run(t, handler, opts1)
	for p := range int32(partitions) {
		b.produce(t, p, fmt.Sprint("held-", p), `{}`)
	}
	oncetest.Eventually(t, 10*time.Second, "member 1 runs a record of each partition", func() bool { return running.Load() == partitions })

	opts2 := b.options()
	opts2.Name = "kafka.member-2"
	c2, _ := b.run(t, handler, opts2)
	oncetest.Eventually(t, 15*time.Second, "member 2 joined", c2.Joined)
	oncetest.Eventually(t, 10*time.Second, "member 2's copy turned away while member 1 runs it", func() bool {
		return b.count(t, "retry", "in_flight") >= 1
	})
	require.Equal(t, int32(partitions), running.Load(), "the copy never ran")
	for p, off := range b.committed(t) {
		require.Zero(t, off, "partition %d: nothing settled, nothing committed", p)
	}

	close(release)
	b.awaitSettled(t, 15*time.Second)
	for p := range partitions {
		require.Equal(t, 1, b.rows(t, fmt.Sprint("held-", p)))
	}
	require.Equal(t, partitions, b.count(t, "ack", "executed"))
	require.GreaterOrEqual(t, b.count(t, "ack", "replayed"), 1)
	require.Empty(t, b.deadLetters(t))
}

// With the broker gone, Stop still returns within its bounds.
func TestStopWithoutBroker(t *testing.T) {
	t.Parallel()
	br := privateBroker(t)
	b := setup(t, br)
	opts := b.options()
	opts.RequestTimeout = time.Second
	opts.ShutdownTimeout = time.Second
	_, stop := b.run(t, effect, opts)
	b.produce(t, 0, "order-1", `{}`)
	b.awaitSettled(t, 15*time.Second)

	br.Stop()
	begin := time.Now()
	stop()
	require.Less(t, time.Since(begin), 6*time.Second, "ShutdownTimeout and two RequestTimeouts, and some slack")
	require.Equal(t, 1, b.rows(t, "order-1"))
}
