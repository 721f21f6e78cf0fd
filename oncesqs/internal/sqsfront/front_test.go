package sqsfront_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly/oncesqs/sqstest"
)

var endpoint string

func TestMain(m *testing.M) {
	s, err := sqstest.Start()
	if err != nil {
		panic(err)
	}
	endpoint = s.Endpoint
	code := m.Run()
	s.Close()
	os.Exit(code)
}

// TestFront runs each operation the front translates through the SDK.
func TestFront(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := sqstest.Client(endpoint)

	dlq, err := sqstest.CreateQueue(ctx, c, "front-dead", nil)
	require.NoError(t, err)
	q, err := sqstest.CreateQueue(ctx, c, "front", map[string]string{"VisibilityTimeout": "7"})
	require.NoError(t, err)
	got, err := c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String("front")})
	require.NoError(t, err)
	require.Equal(t, q, aws.ToString(got.QueueUrl))
	_, err = c.GetQueueUrl(ctx, &sqs.GetQueueUrlInput{QueueName: aws.String("missing")})
	_, ok := errors.AsType[*types.QueueDoesNotExist](err)
	require.True(t, ok, "%v", err)

	_, err = c.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(q), Attributes: map[string]string{
		"RedrivePolicy": `{"maxReceiveCount":"5","deadLetterTargetArn":"arn:aws:sqs:local:queue:front-dead"}`,
	}})
	require.NoError(t, err)
	attrs, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(q), AttributeNames: []types.QueueAttributeName{"VisibilityTimeout", "RedrivePolicy"}})
	require.NoError(t, err)
	require.Equal(t, "7", attrs.Attributes["VisibilityTimeout"])
	require.Contains(t, attrs.Attributes["RedrivePolicy"], "front-dead")
	_ = dlq

	for i := range 3 {
		_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(q), MessageBody: aws.String(`{"n":` + strconv.Itoa(i) + `}`),
			MessageAttributes: map[string]types.MessageAttributeValue{
				"Idempotency-Key": {DataType: aws.String("String"), StringValue: aws.String("k" + strconv.Itoa(i))},
				"Blob":            {DataType: aws.String("Binary"), BinaryValue: []byte{0, 1, 2}},
				"Other":           {DataType: aws.String("Number"), StringValue: aws.String("42")},
			}})
		require.NoError(t, err)
	}
	out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
		MessageAttributeNames: []string{"Idempotency-Key", "Blob"}, MessageSystemAttributeNames: []types.MessageSystemAttributeName{"ApproximateReceiveCount"}})
	require.NoError(t, err)
	require.Len(t, out.Messages, 3)
	m := out.Messages[0]
	require.Equal(t, `{"n":0}`, aws.ToString(m.Body))
	require.Equal(t, "k0", aws.ToString(m.MessageAttributes["Idempotency-Key"].StringValue))
	require.Equal(t, []byte{0, 1, 2}, m.MessageAttributes["Blob"].BinaryValue)
	require.NotContains(t, m.MessageAttributes, "Other", "not asked for")
	require.Equal(t, "1", m.Attributes["ApproximateReceiveCount"])

	_, err = c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(q), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 60})
	require.NoError(t, err)
	_, err = c.ChangeMessageVisibility(ctx, &sqs.ChangeMessageVisibilityInput{QueueUrl: aws.String(q), ReceiptHandle: aws.String("nope"), VisibilityTimeout: 60})
	_, ok = errors.AsType[*types.MessageNotInflight](err)
	require.True(t, ok, "%v", err)
	cb, err := c.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(q), Entries: []types.ChangeMessageVisibilityBatchRequestEntry{
		{Id: aws.String("a"), ReceiptHandle: out.Messages[1].ReceiptHandle, VisibilityTimeout: 0},
		{Id: aws.String("b"), ReceiptHandle: aws.String("nope"), VisibilityTimeout: 0},
	}})
	require.NoError(t, err)
	require.Len(t, cb.Successful, 1)
	require.Len(t, cb.Failed, 1)
	require.Equal(t, "b", aws.ToString(cb.Failed[0].Id))

	_, err = c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(q), ReceiptHandle: m.ReceiptHandle})
	require.NoError(t, err)
	_, err = c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(q), ReceiptHandle: m.ReceiptHandle})
	_, ok = errors.AsType[*types.ReceiptHandleIsInvalid](err)
	require.True(t, ok, "%v", err)
	db, err := c.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(q), Entries: []types.DeleteMessageBatchRequestEntry{
		{Id: aws.String("c"), ReceiptHandle: out.Messages[2].ReceiptHandle},
		{Id: aws.String("d"), ReceiptHandle: aws.String("nope")},
	}})
	require.NoError(t, err)
	require.Len(t, db.Successful, 1)
	require.Equal(t, "c", aws.ToString(db.Successful[0].Id))
	require.Len(t, db.Failed, 1)

	// The message made visible again (visibility 0) comes back.
	out, err = c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(q), MaxNumberOfMessages: 10, WaitTimeSeconds: 1})
	require.NoError(t, err)
	require.Len(t, out.Messages, 1)
	require.Equal(t, `{"n":1}`, aws.ToString(out.Messages[0].Body))
	require.Empty(t, out.Messages[0].MessageAttributes, "none asked for")
}
