package oncekafka_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncekafka"
	"github.com/onceonly/onceonly/oncekafka/kafkatest"
	"github.com/onceonly/onceonly/oncetest"
)

// kfakeBin is the kfakeserver binary TestMain builds; sharedBroker the
// broker most tests share (each with topics and a group of its own).
var (
	kfakeBin     string
	sharedBroker *broker
)

// TestMain builds kfakeserver and starts a broker process for the
// package, fails the tests when a goroutine outlives them, and gives the
// runnable example DATABASE_URL, REDIS_URL and KAFKA_BROKERS.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(oncetest.WithExampleEnv(kafkaEnv{m}, "oncekafka"))
}

type kafkaEnv struct{ m *testing.M }

func (e kafkaEnv) Run() int {
	dir, err := os.MkdirTemp("", "kfakeserver")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	kfakeBin, err = kafkatest.Build(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	sharedBroker = &broker{Bin: kfakeBin}
	if err := sharedBroker.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer sharedBroker.Stop()
	_ = os.Setenv("KAFKA_BROKERS", sharedBroker.Addr)
	return e.m.Run()
}

// broker is a kfakeserver process.
type broker = kafkatest.Broker

// privateBroker starts a broker of the test's own, keeping its data in a
// directory of the test's, stopped when the test ends.
func privateBroker(t testing.TB) *broker {
	t.Helper()
	b := &broker{Bin: kfakeBin, DataDir: t.TempDir()}
	require.NoError(t, b.Start())
	t.Cleanup(b.Stop)
	return b
}

type testBundle struct {
	ctx    context.Context
	pool   *pgxpool.Pool
	engine *onceonly.Engine
	reg    *prometheus.Registry
	broker *broker
	cl     *kgo.Client // produces, reads offsets and dead letters
	adm    *kadm.Client
	topic  string
	dead   string
	group  string

	mu      sync.Mutex
	settled []settlement
	dlc     *kgo.Client // reads the dead-letter topic
	dls     []*kgo.Record
}

// settlement is one the consumer made of a record with key.
type settlement struct {
	key string
	onceonly.Settlement
}

// partitions is how many partitions a test topic has.
const partitions = 3

// setup gives a test a database with an effects table, an engine on it
// and the test Redis, and a topic, a dead-letter topic and a group of its
// own on br (nil: the shared broker).
func setup(t testing.TB, br *broker) *testBundle {
	t.Helper()
	if br == nil {
		br = sharedBroker
	}
	b := &testBundle{ctx: oncetest.Context(t), pool: oncetest.DB(t), reg: prometheus.NewRegistry(), broker: br}
	_, err := b.pool.Exec(b.ctx, `CREATE TABLE effects (scope text NOT NULL, key text NOT NULL, payload text NOT NULL)`)
	require.NoError(t, err)
	rdb, prefix := oncetest.Redis(t)
	b.engine, err = onceonly.New(onceonly.Config{
		Pool: b.pool, Redis: rdb, RedisPrefix: prefix, LeaseTimeout: 2 * time.Second,
		ResumeInterval: 100 * time.Millisecond, Logger: oncetest.QuietLogger(),
	})
	require.NoError(t, err)
	t.Cleanup(b.engine.Close)

	sfx := oncetest.RandomSuffix(10)
	b.topic, b.dead, b.group = "t-"+sfx, "t-"+sfx+"-dead", "g-"+sfx
	b.cl, err = kgo.NewClient(kgo.SeedBrokers(br.Addr), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	require.NoError(t, err)
	t.Cleanup(b.cl.Close)
	b.adm = kadm.NewClient(b.cl)
	_, err = b.adm.CreateTopic(b.ctx, partitions, 1, nil, b.topic)
	require.NoError(t, err)
	_, err = b.adm.CreateTopic(b.ctx, 1, 1, nil, b.dead)
	require.NoError(t, err)
	return b
}

// options returns consumer options on the bundle's topic and group.
func (b *testBundle) options() oncekafka.Options {
	return oncekafka.Options{
		Brokers:         []string{b.broker.Addr},
		Group:           b.group,
		Topics:          []string{b.topic},
		ClientOptions:   []kgo.Opt{kgo.FetchMaxWait(100 * time.Millisecond), kgo.SessionTimeout(3 * time.Second), kgo.HeartbeatInterval(200 * time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond })},
		Scope:           "tenant",
		DeadLetterTopic: b.dead,
		Policy:          onceonly.SettlePolicy{MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
		Workers:         4,
		CommitInterval:  100 * time.Millisecond,
		Logger:          oncetest.QuietLogger(),
		Registerer:      b.reg,
		Settled: func(rec *kgo.Record, s onceonly.Settlement) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.settled = append(b.settled, settlement{kafkatest.Header(rec, oncekafka.DefaultKeyHeader), s})
		},
	}
}

// run creates a consumer running fn with opts and runs it until the test
// ends or stop is called; the test fails if Run returns an error.
func (b *testBundle) run(t testing.TB, fn oncekafka.Handler, opts oncekafka.Options) (c *oncekafka.Consumer, stop func()) {
	t.Helper()
	c, err := oncekafka.NewConsumer(b.engine, fn, opts)
	require.NoError(t, err)
	return c, b.runConsumer(t, c)
}

func (b *testBundle) runConsumer(t testing.TB, c *oncekafka.Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(15 * time.Second):
				t.Error("Run did not return within 15s of its context's end")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// produce produces body to partition with the key in the Idempotency-Key
// header (none when key is ""), and returns its offset.
func (b *testBundle) produce(t testing.TB, partition int32, key, body string) int64 {
	t.Helper()
	rec := &kgo.Record{Topic: b.topic, Partition: partition, Key: []byte("account-7"), Value: []byte(body),
		Headers: []kgo.RecordHeader{{Key: "Trace", Value: []byte("t1")}}}
	if key != "" {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: oncekafka.DefaultKeyHeader, Value: []byte(key)})
	}
	r, err := b.cl.ProduceSync(b.ctx, rec).First()
	require.NoError(t, err)
	return r.Offset
}

// produceErr is produce for a goroutine other than the test's.
func (b *testBundle) produceErr(partition int32, key, body string) error {
	rec := &kgo.Record{Topic: b.topic, Partition: partition, Key: []byte("account-7"), Value: []byte(body),
		Headers: []kgo.RecordHeader{{Key: oncekafka.DefaultKeyHeader, Value: []byte(key)}}}
	return b.cl.ProduceSync(b.ctx, rec).FirstErr()
}

// effect is a handler that writes one effects row through the execution's
// transaction.
func effect(ctx context.Context, msg oncekafka.Message) error {
	tx, err := onceonly.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `INSERT INTO effects (scope, key, payload) VALUES ($1, $2, $3)`, msg.Scope, msg.Key, string(msg.Payload))
	return err
}

// rows counts the effects rows of key.
func (b *testBundle) rows(t testing.TB, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM effects WHERE key = $1`, key).Scan(&n))
	return n
}

// committed returns the group's committed offset of each partition of the
// topic (absent: none).
func (b *testBundle) committed(t testing.TB) map[int32]int64 {
	t.Helper()
	offs, err := b.adm.FetchOffsets(b.ctx, b.group)
	m := map[int32]int64{}
	if errors.Is(err, kerr.GroupIDNotFound) {
		return m // the group has not joined yet
	}
	require.NoError(t, err)
	for p, o := range offs[b.topic] {
		if o.Err == nil {
			m[p] = o.At
		}
	}
	return m
}

// awaitSettled waits until the group's committed offsets reach the end of
// every partition of the topic.
func (b *testBundle) awaitSettled(t testing.TB, timeout time.Duration) {
	t.Helper()
	oncetest.Eventually(t, timeout, "every record settled and committed", func() bool {
		ends, err := b.adm.ListEndOffsets(b.ctx, b.topic)
		if err != nil {
			return false
		}
		offs, err := b.adm.FetchOffsets(b.ctx, b.group)
		if err != nil {
			return false
		}
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			if o.Offset == 0 {
				return
			}
			c, found := offs.Lookup(b.topic, o.Partition)
			if !found || c.At != o.Offset {
				ok = false
			}
		})
		return ok
	})
}

// deadLetters returns the records on the dead-letter topic so far.
func (b *testBundle) deadLetters(t testing.TB) []*kgo.Record {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dlc == nil {
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.broker.Addr), kgo.ConsumeTopics(b.dead),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(50*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(cl.Close)
		b.dlc = cl
	}
	ctx, cancel := context.WithTimeout(b.ctx, 200*time.Millisecond)
	defer cancel()
	b.dls = append(b.dls, b.dlc.PollFetches(ctx).Records()...)
	return b.dls
}

// awaitDeadLetters waits until n records are on the dead-letter topic and
// returns them.
func (b *testBundle) awaitDeadLetters(t testing.TB, n int) []*kgo.Record {
	t.Helper()
	var recs []*kgo.Record
	oncetest.Eventually(t, 15*time.Second, "dead letters", func() bool {
		recs = b.deadLetters(t)
		return len(recs) >= n
	})
	require.Len(t, recs, n)
	return recs
}

// count reads onceonly_kafka_records_total{disposition, reason}.
func (b *testBundle) count(t testing.TB, disposition, reason string) int {
	t.Helper()
	return int(oncetest.Metric(t, b.reg, "onceonly_kafka_records_total", map[string]string{"disposition": disposition, "reason": reason}))
}
