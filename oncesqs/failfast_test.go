package oncesqs_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncesqs"
)

// An engine whose schema is gone (rolled back after New): Run stops with
// ErrSchemaBehind, which names the fix; the message is neither deleted nor
// dead-lettered, and is visible again at once, for the consumer that runs
// once it is fixed.
func TestStopsOnAMissingSchema(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{visibility: 60})
	_, err := b.pool.Exec(b.ctx, `DROP TABLE idempotency_keys CASCADE`)
	require.NoError(t, err)
	c, err := oncesqs.NewConsumer(b.engine, effect, b.options())
	require.NoError(t, err)
	b.publish(t, "order-1", `{"amount":100}`)

	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	err = c.Run(ctx)
	require.ErrorIs(t, err, onceonly.ErrSchemaBehind)
	require.NoError(t, ctx.Err(), "Run stopped by itself")
	require.Empty(t, b.deadLetters(t))
	require.Equal(t, 1, b.count(t, "retry", "stopped"))
	out, err := b.client.ReceiveMessage(b.ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(b.queue), WaitTimeSeconds: 2})
	require.NoError(t, err)
	require.Len(t, out.Messages, 1, "not deleted, and visible again at once")
}
