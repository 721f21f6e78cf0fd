package oncesqs_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/migrations"
	"github.com/onceonly/onceonly/oncesqs"
)

// An order message is sent twice, and once more with the same key and
// another body: one order row, the copy deleted, the reuse dead-lettered
// with its reason.
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

	// SQS: in production sqs.NewFromConfig(cfg) with
	// config.LoadDefaultConfig; here the endpoint the tests run.
	client := sqs.New(sqs.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(os.Getenv("SQS_ENDPOINT")),
		Credentials: aws.AnonymousCredentials{},
	})
	queueURL := createQueue(ctx, client, "orders", map[string]string{"VisibilityTimeout": "30"})
	deadURL := createQueue(ctx, client, "orders-dead", nil) // no redrive policy on "orders"

	c, err := oncesqs.NewConsumer(engine, func(ctx context.Context, msg oncesqs.Message) error {
		fmt.Println("placing", msg.Key)
		tx, err := onceonly.Tx(ctx) // commits with the key
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO orders (id, body) VALUES ($1, $2)`, msg.Key, msg.Payload)
		return err
	}, oncesqs.Options{
		Client: client, QueueURL: queueURL, DeadLetterQueueURL: deadURL,
		Scope: "shop", Workers: 1, WaitTime: time.Second, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	defer c.Stop()

	for _, body := range []string{`{"sku":"book"}`, `{"sku":"book"}`, `{"sku":"lamp"}`} {
		_, err := client.SendMessage(ctx, &sqs.SendMessageInput{
			QueueUrl: aws.String(queueURL), MessageBody: aws.String(body),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"Idempotency-Key": {DataType: aws.String("String"), StringValue: aws.String("order-1")},
			},
		})
		if err != nil {
			panic(err)
		}
	}
	// Wait for the dead letter: the message after the copy.
	for {
		out, err := client.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(deadURL), WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"},
		})
		if err != nil {
			panic(err)
		}
		if len(out.Messages) > 0 {
			dead := out.Messages[0]
			var orders int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
				panic(err)
			}
			fmt.Println("orders:", orders)
			fmt.Println("dead letter:", *dead.Body, *dead.MessageAttributes[oncesqs.AttributeReason].StringValue)
			break
		}
	}
	// Output:
	// placing order-1
	// orders: 1
	// dead letter: {"sku":"lamp"} reused
}

func createQueue(ctx context.Context, client *sqs.Client, name string, attrs map[string]string) string {
	out, err := client.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name), Attributes: attrs})
	if err != nil {
		panic(err)
	}
	return *out.QueueUrl
}
