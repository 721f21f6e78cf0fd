package oncesqs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestVisibilitySeconds(t *testing.T) {
	for d, want := range map[time.Duration]int32{
		0: 0, -time.Second: 0, time.Millisecond: 1, 200 * time.Millisecond: 1, time.Second: 1,
		1500 * time.Millisecond: 2, 24 * time.Hour: 43200,
	} {
		require.Equal(t, want, visibilitySeconds(d), "%v", d)
	}
}

func TestRedriveCount(t *testing.T) {
	require.Zero(t, redriveCount(""))
	require.Equal(t, 5, redriveCount(`{"maxReceiveCount":"5","deadLetterTargetArn":"arn:aws:sqs:x:y:z"}`))
	require.Equal(t, 12, redriveCount(`{"deadLetterTargetArn":"a", "maxReceiveCount": 12}`))
}

func TestHeartbeatInterval(t *testing.T) {
	require.Equal(t, 10*time.Second, heartbeatInterval(30*time.Second, 60*time.Second))
	require.Equal(t, 2*time.Second, heartbeatInterval(30*time.Second, 6*time.Second))
	require.Equal(t, 10*time.Millisecond, heartbeatInterval(0, time.Second))
}

func TestQueueName(t *testing.T) {
	require.Equal(t, "orders.fifo", queueName("https://sqs.eu-west-1.amazonaws.com/123/orders.fifo"))
	require.True(t, isFIFO("https://x/123/orders.fifo"))
	require.False(t, isFIFO("https://x/123/orders"))
}
