package oncesqs

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/consume"
)

// AttributeKey returns an Options.Key that takes the key from the String
// message attribute name. A message without it is invalid.
func AttributeKey(name string) func(msg *types.Message) (string, error) {
	return func(msg *types.Message) (string, error) {
		a, ok := msg.MessageAttributes[name]
		if !ok || a.StringValue == nil || *a.StringValue == "" {
			return "", fmt.Errorf("no %s message attribute", name)
		}
		return *a.StringValue, nil
	}
}

// handle runs one message and settles it, extending its visibility every
// interval meanwhile. On an error no message can get past (consume.Fatal)
// it stops the consumer instead and makes the message visible again,
// neither deleted nor dead-lettered.
func (c *Consumer) handle(ctx context.Context, msg *types.Message, del *deleter, visibility, every time.Duration) {
	start := time.Now()
	c.metrics.inFlight.Inc()
	defer c.metrics.inFlight.Dec()

	keep := c.heartbeat(ctx, msg, visibility, every)
	s := c.exec.Settle(ctx, msg)
	keep()
	if err := consume.Fatal(s); err != nil {
		c.life.Fail(err)
		c.retry(ctx, msg, 0)
		c.metrics.messages.WithLabelValues(onceonly.Retry.String(), consume.ReasonStopped).Inc()
		return
	}
	disposition, reason := c.settle(ctx, msg, s, del)
	if c.opts.Settled != nil {
		c.opts.Settled(msg, s)
	}
	c.metrics.messages.WithLabelValues(disposition, reason).Inc()
	c.metrics.duration.WithLabelValues(disposition).Observe(time.Since(start).Seconds())
}

// config is the consumer's configuration of its executor.
func (c *Consumer) config() consume.Config[*types.Message] {
	return consume.Config[*types.Message]{
		Package:    "oncesqs",
		Engine:     c.engine,
		Identifier: identifier(c.opts),
		Policy:     c.opts.Policy,
		Logger:     c.log,
		Attrs:      func(msg *types.Message) []any { return []any{"message_id", aws.ToString(msg.MessageId)} },
	}
}

// identifier takes a message's identity as opts say.
func identifier(opts Options) consume.Identifier[*types.Message] {
	return consume.Identifier[*types.Message]{
		Scope:   opts.Scope,
		ScopeOf: opts.ScopeOf,
		Key:     opts.Key,
		Payload: opts.Payload,
		Body:    func(msg *types.Message) []byte { return []byte(aws.ToString(msg.Body)) },
	}
}

// message is the Message a handler gets: msg is nil in a resumption.
func message(id consume.Identity, msg *types.Message) Message {
	return Message{Scope: id.Scope, Key: id.Key, Payload: id.Payload, Msg: msg}
}

// heartbeat extends msg's visibility to visibility every interval until
// the returned function is called (which waits for it to stop).
func (c *Consumer) heartbeat(ctx context.Context, msg *types.Message, visibility, every time.Duration) (stop func()) {
	return consume.Every(every, func() {
		if err := c.changeVisibility(ctx, msg, visibility); err != nil {
			c.settleError(ctx, opHeartbeat, msg, err)
		}
	})
}

// settle does on SQS what s says and returns the disposition and reason
// it counts under.
func (c *Consumer) settle(ctx context.Context, msg *types.Message, s onceonly.Settlement, del *deleter) (disposition, reason string) {
	switch s.Disposition {
	case onceonly.Ack:
		// A delete lost leaves the message to come back after its
		// visibility timeout and be deleted as a replay.
		if err := del.delete(ctx, msg); err != nil {
			c.settleError(ctx, opDelete, msg, err)
		}
		return onceonly.Ack.String(), consume.Reason(s)
	case onceonly.DeadLetter:
		if err := c.deadLetter(ctx, msg, s); err != nil {
			// Not deleted: it comes back, and is dead-lettered then.
			c.settleError(ctx, opDeadLetter, msg, err)
			c.retry(ctx, msg, c.opts.Policy.Backoff(1))
			return onceonly.Retry.String(), reasonDeadLetterFailed
		}
		c.log.WarnContext(ctx, "oncesqs: message dead-lettered", "reason", s.Reason, "err", s.Err,
			"message_id", aws.ToString(msg.MessageId), "dead_letter_queue", c.opts.DeadLetterQueueURL)
		if err := del.delete(ctx, msg); err != nil {
			// It comes back and is dead-lettered again: a second copy on
			// a standard dead-letter queue (see the package comment).
			c.settleError(ctx, opDelete, msg, err)
		}
		return onceonly.DeadLetter.String(), s.Reason
	case onceonly.Retry:
	}
	reason = consume.RetryReason(s.Err)
	switch reason {
	case consume.ReasonFailed:
		c.log.InfoContext(ctx, "oncesqs: execution failed; the message comes again", "err", s.Err, "failures", s.Failures, "after", s.After, "message_id", aws.ToString(msg.MessageId))
	case consume.ReasonError:
		c.log.WarnContext(ctx, "oncesqs: message not settled; it comes again", "err", s.Err, "after", s.After, "message_id", aws.ToString(msg.MessageId))
	}
	c.retry(ctx, msg, s.After)
	return onceonly.Retry.String(), reason
}

// retry makes msg visible again after delay (whole seconds, rounded up).
// SQS counts the next receive against a redrive policy's maxReceiveCount.
func (c *Consumer) retry(ctx context.Context, msg *types.Message, delay time.Duration) {
	if err := c.changeVisibility(ctx, msg, delay); err != nil {
		c.settleError(ctx, opVisibility, msg, err)
	}
}

func (c *Consumer) changeVisibility(ctx context.Context, msg *types.Message, d time.Duration) error {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CallTimeout)
	defer cancel()
	_, err := c.opts.Client.ChangeMessageVisibility(actx, &sqs.ChangeMessageVisibilityInput{
		QueueUrl: aws.String(c.opts.QueueURL), ReceiptHandle: msg.ReceiptHandle, VisibilityTimeout: visibilitySeconds(d),
	})
	return err
}

// deadLetter sends a copy of msg to the dead-letter queue: its body, its
// message attributes, Onceonly-Reason and Onceonly-Error as room allows
// (SQS takes 10 attributes); on a FIFO queue in the original's message
// group, deduplicated by dead-<MessageId> (a copy sent again after a crash
// before the delete is dropped within SQS's five-minute window).
func (c *Consumer) deadLetter(ctx context.Context, msg *types.Message, s onceonly.Settlement) error {
	if c.opts.DeadLetterQueueURL == "" {
		return nil
	}
	attrs := make(map[string]types.MessageAttributeValue, len(msg.MessageAttributes)+2)
	maps.Copy(attrs, msg.MessageAttributes)
	if len(attrs) < maxAttributes {
		attrs[AttributeReason] = stringAttribute(s.Reason)
	}
	if len(attrs) < maxAttributes && s.Err != nil {
		attrs[AttributeError] = stringAttribute(truncate(s.Err.Error(), 1024))
	}
	in := &sqs.SendMessageInput{QueueUrl: aws.String(c.opts.DeadLetterQueueURL), MessageBody: msg.Body, MessageAttributes: attrs}
	if isFIFO(c.opts.DeadLetterQueueURL) {
		group := msg.Attributes[string(types.MessageSystemAttributeNameMessageGroupId)]
		if group == "" {
			group = "onceonly-dead"
		}
		in.MessageGroupId = aws.String(group)
		in.MessageDeduplicationId = aws.String(truncate("dead-"+aws.ToString(msg.MessageId), 128))
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CallTimeout)
	defer cancel()
	if _, err := c.opts.Client.SendMessage(actx, in); err != nil {
		return fmt.Errorf("send the dead letter to %s: %w", c.opts.DeadLetterQueueURL, err)
	}
	return nil
}

func stringAttribute(v string) types.MessageAttributeValue {
	return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
}

func (c *Consumer) settleError(ctx context.Context, op string, msg *types.Message, err error) {
	c.metrics.settleErrors.WithLabelValues(op).Inc()
	c.log.WarnContext(ctx, "oncesqs: "+op+" failed", "err", err, "message_id", aws.ToString(msg.MessageId))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// maxBatch is how many entries an SQS batch call takes.
const maxBatch = 10

// deleter deletes messages in batches (DeleteMessageBatch): what workers
// ask for while a batch is on its way goes in the next one, so a batch
// waits for no timer, and a lone delete is sent at once.
type deleter struct {
	c    *Consumer
	reqs chan deleteReq
	done chan struct{}
	n    int
}

type deleteReq struct {
	handle *string
	result chan error
}

// newDeleter starts flushers whose calls run on ctx (the executions'
// context: it ends at the shutdown bound), each bounded by CallTimeout.
func newDeleter(ctx context.Context, c *Consumer, flushers int) *deleter {
	d := &deleter{c: c, reqs: make(chan deleteReq), done: make(chan struct{}), n: flushers}
	for range flushers {
		go d.run(ctx)
	}
	return d
}

// delete deletes msg and returns once SQS confirmed it (or failed).
func (d *deleter) delete(ctx context.Context, msg *types.Message) error {
	r := deleteReq{handle: msg.ReceiptHandle, result: make(chan error, 1)}
	select {
	case d.reqs <- r:
	case <-ctx.Done():
		return fmt.Errorf("delete: %w", context.Cause(ctx))
	}
	return <-r.result
}

// close stops the flushers once no delete is asked for any more.
func (d *deleter) close() {
	close(d.reqs)
	for range d.n {
		<-d.done
	}
}

func (d *deleter) run(ctx context.Context) {
	defer func() { d.done <- struct{}{} }()
	for r := range d.reqs {
		batch := []deleteReq{r}
	gather:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-d.reqs:
				if !ok {
					break gather
				}
				batch = append(batch, r)
			default:
				break gather
			}
		}
		d.flush(ctx, batch)
	}
}

func (d *deleter) flush(ctx context.Context, batch []deleteReq) {
	entries := make([]types.DeleteMessageBatchRequestEntry, len(batch))
	for i, r := range batch {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: r.handle}
	}
	ctx, cancel := context.WithTimeout(ctx, d.c.opts.CallTimeout)
	defer cancel()
	out, err := d.c.opts.Client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(d.c.opts.QueueURL), Entries: entries})
	d.c.metrics.deleteBatch.Observe(float64(len(batch)))
	if err != nil {
		for _, r := range batch {
			r.result <- err
		}
		return
	}
	failed := make(map[string]error, len(out.Failed))
	for _, f := range out.Failed {
		failed[aws.ToString(f.Id)] = fmt.Errorf("%s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
	}
	for i, r := range batch {
		if err, ok := failed[strconv.Itoa(i)]; ok {
			r.result <- err
			continue
		}
		r.result <- nil
	}
}
