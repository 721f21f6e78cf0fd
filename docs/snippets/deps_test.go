package snippets_test

// The packages the snippets import, so that this module requires their
// modules (go mod tidy keeps what a test imports); TestImportsRequired
// checks that every path of imports and importsIn is here.
import (
	_ "github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	_ "github.com/aws/aws-sdk-go-v2/service/sqs"
	_ "github.com/go-chi/chi/v5"
	_ "github.com/go-chi/chi/v5/middleware"
	_ "github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/rabbitmq/amqp091-go"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/riverqueue/river"
	_ "github.com/riverqueue/river/riverdriver/riverpgxv5"

	_ "github.com/onceonly/onceonly"
	_ "github.com/onceonly/onceonly/client"
	_ "github.com/onceonly/onceonly/console"
	_ "github.com/onceonly/onceonly/migrations"
	_ "github.com/onceonly/onceonly/onceamqp"
	_ "github.com/onceonly/onceonly/oncekafka"
	_ "github.com/onceonly/onceonly/oncenats"
	_ "github.com/onceonly/onceonly/onceriver"
	_ "github.com/onceonly/onceonly/oncesqs"
	_ "github.com/onceonly/onceonly/oncewatermill"
)
