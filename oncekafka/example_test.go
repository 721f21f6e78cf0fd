package oncekafka_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncekafka"
)

// An order record is produced twice, and once more with the same key and
// another value: one order row, the copy settled as a replay, the reuse
// dead-lettered with its reason.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if _, err := migrations.Up(ctx, pool); err != nil { // onceonly's tables
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, body text)`); err != nil {
		panic(err)
	}
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	engine, err := onceonly.New(onceonly.Config{
		Pool: pool, Redis: rdb, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	defer engine.Close()
	// The relay, the reconciler and the resumer, beside the consumer.
	if err := engine.Start(ctx); err != nil {
		panic(err)
	}

	// Kafka: the topic and its dead-letter topic.
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopics(ctx, 3, 1, nil, "orders", "orders.dead"); err != nil {
		panic(err)
	}

	c, err := oncekafka.NewConsumer(engine, func(ctx context.Context, msg oncekafka.Message) error {
		fmt.Println("placing", msg.Key)
		tx, err := onceonly.Tx(ctx) // commits with the key
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, msg.Key, msg.Payload)
		return err
	}, oncekafka.Options{
		Brokers: brokers, Group: "orders", Topics: []string{"orders"},
		Scope: "shop", DeadLetterTopic: "orders.dead",
		Workers: 1, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	defer c.Stop()

	for _, body := range []string{`{"sku":"book"}`, `{"sku":"book"}`, `{"sku":"lamp"}`} {
		rec := &kgo.Record{Topic: "orders", Key: []byte("customer-7"), Value: []byte(body),
			Headers: []kgo.RecordHeader{{Key: "Idempotency-Key", Value: []byte("order-1")}}}
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			panic(err)
		}
	}
	// Wait until the group has committed all three.
	for settled := false; !settled; time.Sleep(10 * time.Millisecond) {
		ends, err := adm.ListEndOffsets(ctx, "orders")
		if err != nil {
			panic(err)
		}
		committed, err := adm.FetchOffsets(ctx, "orders")
		if errors.Is(err, kerr.GroupIDNotFound) {
			continue // the group has not joined yet
		}
		if err != nil {
			panic(err)
		}
		settled = true
		ends.Each(func(end kadm.ListedOffset) {
			if c, ok := committed.Lookup("orders", end.Partition); end.Offset > 0 && (!ok || c.At < end.Offset) {
				settled = false
			}
		})
	}

	var orders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		panic(err)
	}
	dl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("orders.dead"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		panic(err)
	}
	defer dl.Close()
	dead := dl.PollFetches(ctx).Records()[0]
	fmt.Println("orders:", orders)
	for _, h := range dead.Headers {
		if h.Key == oncekafka.HeaderReason {
			fmt.Println("dead letter:", string(dead.Value), string(h.Value))
		}
	}
	// Output:
	// placing order-1
	// orders: 1
	// dead letter: {"sku":"lamp"} reused
}
