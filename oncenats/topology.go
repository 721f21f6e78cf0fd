package oncenats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Topology names a stream and the durable pull consumer a Consumer reads:
// what Declare creates when it is missing.
type Topology struct {
	// Stream is the stream's name (file storage, the server's default
	// duplicate window).
	Stream string
	// Subject is the subject the messages are published on; the stream
	// takes it and the consumer reads it alone.
	Subject string
	// DeadLetterSubject, when set, is taken by the stream too, so the
	// copies of dead-lettered messages are kept beside the messages (the
	// consumer does not read them). Config.DeadLetterSubject names it.
	DeadLetterSubject string
	// Consumer is the durable pull consumer's name: explicit acks, no
	// MaxDeliver limit, AckWait as below.
	Consumer string
	// AckWait is how long the server waits for an ack before it delivers a
	// message again (default 30s). Keep it near the engine's LeaseTimeout:
	// after a crash the message comes back about when the key's lease runs
	// out.
	AckWait time.Duration
}

// DemoTopology is the topology of the demo's consumer
// (docs/consumer.md#topology): stream PAYMENTS on payments.charge and
// payments.dead, durable pull consumer payments on payments.charge, AckWait
// 30s.
func DemoTopology() Topology {
	return Topology{
		Stream:            "PAYMENTS",
		Subject:           "payments.charge",
		DeadLetterSubject: "payments.dead",
		Consumer:          "payments",
		AckWait:           30 * time.Second,
	}
}

// Declare creates the stream and the consumer when they are missing and
// returns the consumer. It is idempotent and safe to run from several
// processes at once. What exists is left as it is (an operator's settings
// stand), but a stream that does not take the topology's subjects is an
// error.
func (t Topology) Declare(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	if t.Stream == "" || t.Subject == "" || t.Consumer == "" {
		return nil, errors.New("oncenats: Topology needs Stream, Subject and Consumer")
	}
	subjects := []string{t.Subject}
	if t.DeadLetterSubject != "" {
		subjects = append(subjects, t.DeadLetterSubject)
	}
	stream, err := js.Stream(ctx, t.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:     t.Stream,
			Subjects: subjects,
			Storage:  jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			stream, err = js.Stream(ctx, t.Stream) // declared meanwhile by another
		}
	}
	if err != nil {
		return nil, fmt.Errorf("oncenats: declare stream %s: %w", t.Stream, err)
	}
	for _, s := range subjects {
		if !takes(stream.CachedInfo().Config.Subjects, s) {
			return nil, fmt.Errorf("oncenats: stream %s exists but does not take subject %s (it takes %s)",
				t.Stream, s, strings.Join(stream.CachedInfo().Config.Subjects, ", "))
		}
	}
	ackWait := t.AckWait
	if ackWait <= 0 {
		ackWait = 30 * time.Second
	}
	cons, err := stream.Consumer(ctx, t.Consumer)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		cons, err = stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       t.Consumer,
			FilterSubject: t.Subject,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       ackWait,
			MaxDeliver:    -1,
		})
		if errors.Is(err, jetstream.ErrConsumerExists) {
			cons, err = stream.Consumer(ctx, t.Consumer)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("oncenats: declare consumer %s on stream %s: %w", t.Consumer, t.Stream, err)
	}
	return cons, nil
}

// takes reports whether one of a stream's subject patterns matches
// subject.
func takes(patterns []string, subject string) bool {
	for _, p := range patterns {
		if subjectMatches(p, subject) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether the NATS subject pattern (tokens split by
// '.', '*' one token, '>' the rest) matches subject.
func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		switch {
		case p == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case p != "*" && p != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}
