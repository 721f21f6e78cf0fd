package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/onceonly/onceonly/oncesqs"
)

// The demo's topology on SQS: standard queue payments-charge, dead letters
// sent by the consumer to standard queue payments-charge-dead (no redrive
// policy: see docs/consumers/sqs.md); created when missing.
const (
	sqsQueue       = "payments-charge"
	sqsDeadQueue   = "payments-charge-dead"
	sqsRegion      = "us-east-1"
	sqsVisibility  = "30"
	sqsCredentials = "onceonly-consumer"
)

// sqsEndpoint is what sqs://[host:port][?region=R&tls=1] says: the
// endpoint (http://host:port, https with tls=1; none: AWS's endpoint of
// the region) and the region (default us-east-1). Credentials come from
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; an
// endpoint of one's own without them gets dummy ones (an emulator's).
type sqsEndpoint struct {
	endpoint, region string
}

func parseSQSURL(raw string) (sqsEndpoint, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return sqsEndpoint{}, errors.New("bad configuration: BROKER_URL is not a URL")
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") {
		return sqsEndpoint{}, fmt.Errorf("bad configuration: BROKER_URL=%q: say sqs://host:port?region=R (an endpoint of one's own) or sqs://?region=R (AWS)", u.Redacted())
	}
	e := sqsEndpoint{region: u.Query().Get("region")}
	if e.region == "" {
		e.region = sqsRegion
	}
	if u.Host != "" {
		scheme := "http"
		if tls := u.Query().Get("tls"); tls == "1" || tls == "true" {
			scheme = "https"
		}
		e.endpoint = scheme + "://" + u.Host
	}
	return e, nil
}

// client returns an SQS client of the endpoint.
func (e sqsEndpoint) client() *sqs.Client {
	id, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	if id == "" && e.endpoint != "" {
		id, secret = "test", "test"
	}
	creds := aws.Credentials{AccessKeyID: id, SecretAccessKey: secret, SessionToken: os.Getenv("AWS_SESSION_TOKEN"), Source: sqsCredentials}
	o := sqs.Options{
		Region:      e.region,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) { return creds, nil }),
		HTTPClient:  &http.Client{Timeout: 60 * time.Second},
	}
	if e.endpoint != "" {
		o.BaseEndpoint = aws.String(e.endpoint)
	}
	return sqs.New(o)
}

// declareSQS creates the demo's queues when missing and returns their
// URLs.
func declareSQS(ctx context.Context, cl *sqs.Client) (queue, dead string, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, q := range []struct {
		name string
		url  *string
	}{{sqsQueue, &queue}, {sqsDeadQueue, &dead}} {
		out, err := cl.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(q.name),
			Attributes: map[string]string{string(types.QueueAttributeNameVisibilityTimeout): sqsVisibility}})
		if err != nil {
			return "", "", fmt.Errorf("create sqs queue %s: %w", q.name, err)
		}
		*q.url = aws.ToString(out.QueueUrl)
	}
	return queue, dead, nil
}

// sqsConsumer is oncesqs's consumer, made once the queues exist (at Run,
// retried until they do).
type sqsConsumer struct {
	c    consumerConfig
	cl   *sqs.Client
	wait time.Duration          // the long poll's; 0 the default
	cons chan *oncesqs.Consumer // the consumer once made (capacity 1)
}

func (s *sqsConsumer) Run(ctx context.Context) error {
	var queue, dead string
	var err error
	for wait := 200 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		if queue, dead, err = declareSQS(ctx, s.cl); err == nil {
			break
		}
		s.c.log.Warn("sqs: creating the queues failed; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	cons, err := oncesqs.NewConsumer(s.c.engine, func(ctx context.Context, msg oncesqs.Message) error {
		return s.c.pay(ctx, msg.Scope, msg.Key, msg.Payload)
	}, oncesqs.Options{
		Client:             s.cl,
		WaitTime:           s.wait,
		QueueURL:           queue,
		DeadLetterQueueURL: dead,
		ScopeOf:            func(msg *types.Message) (string, error) { return merchantOf([]byte(aws.ToString(msg.Body))) },
		Payload:            func(msg *types.Message) ([]byte, error) { return payloadOf([]byte(aws.ToString(msg.Body))) },
		Name:               handlerName,
		Workers:            s.c.workers,
		Policy:             s.c.policy(),
		LeaseTimeout:       s.c.lease,
		ShutdownTimeout:    shutdownTimeout,
		Logger:             s.c.log,
		Registerer:         s.c.registerer,
	})
	if err != nil {
		return fmt.Errorf("sqs consumer: %w", err)
	}
	s.cons <- cons
	return cons.Run(ctx)
}

// Connected is true once the consumer's last receive succeeded.
func (s *sqsConsumer) Connected() bool {
	select {
	case c := <-s.cons:
		s.cons <- c
		return c.Connected()
	default:
		return false
	}
}

// newSQSConsumer returns the consumer of queue payments-charge.
func newSQSConsumer(c consumerConfig) (consumer, func(), error) {
	e, err := parseSQSURL(c.url)
	if err != nil {
		return nil, nil, err
	}
	s := &sqsConsumer{c: c, cl: e.client(), cons: make(chan *oncesqs.Consumer, 1)}
	if e.endpoint != "" {
		// An endpoint of one's own is an emulator's, whose long polls may
		// answer only at their end: short ones.
		s.wait = time.Second
	}
	return s, func() {}, nil
}

// publishSQS sends body copies times to payments-charge with message
// attribute Idempotency-Key, after creating the queues when missing.
func publishSQS(ctx context.Context, raw, key string, body []byte, copies int) error {
	e, err := parseSQSURL(raw)
	if err != nil {
		return err
	}
	cl := e.client()
	queue, _, err := declareSQS(ctx, cl)
	if err != nil {
		return err
	}
	for range copies {
		in := &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageBody: aws.String(string(body))}
		if key != "" {
			in.MessageAttributes = map[string]types.MessageAttributeValue{
				oncesqs.DefaultKeyAttribute: {DataType: aws.String("String"), StringValue: aws.String(key)},
			}
		}
		if _, err := cl.SendMessage(ctx, in); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	return nil
}
