package oncewatermill_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/onceonly/onceonly"
	"github.com/onceonly/onceonly/oncetest"
	"github.com/onceonly/onceonly/oncewatermill"
)

// Copies of a message (one key, new UUIDs, as a publisher that retries
// sends them) run the handler once: every copy is acked, one effect row.
func TestCopiesRunOnce(t *testing.T) {
	forEachPubSub(t, func(t *testing.T, b *testBundle) {
		var r runs
		reg := prometheus.NewRegistry()
		s := b.startRouter(t, func(msg *message.Message) ([]*message.Message, error) {
			r.add(msg.Metadata.Get(oncewatermill.DefaultKeyMetadata))
			return nil, writeEffect(msg)
		}, routerOptions{opts: oncewatermill.Options{Registerer: reg}})
		// A second middleware on the registry shares its metrics.
		_, err := oncewatermill.NewMiddleware(b.engine, oncewatermill.Options{Registerer: reg})
		require.NoError(t, err)
		for range 3 {
			b.publish(t, "order-1", `{"sku":"tea"}`)
		}
		b.publish(t, "order-2", `{"sku":"tea"}`)
		replayed := 0
		for range 4 {
			st := s.next(t)
			require.Equal(t, onceonly.Ack, st.Disposition, "%+v", st)
			if st.Outcome.Replayed {
				replayed++
			}
		}
		require.Equal(t, 2, replayed)
		messages := func(disposition, reason string) float64 {
			return oncetest.Metric(t, reg, "onceonly_watermill_messages_total",
				map[string]string{"handler": handlerName, "disposition": disposition, "reason": reason})
		}
		require.Equal(t, 2.0, messages("ack", "executed"))
		require.Equal(t, 2.0, messages("ack", "replayed"))
		require.Equal(t, 1, r.get("order-1"))
		require.Equal(t, 1, r.get("order-2"))
		b.awaitOneEffect(t, "order-1")
		b.awaitOneEffect(t, "order-2")
	})
}

// A key reused with another payload goes to the poison queue with its
// reason, and the handler does not run for it; so does a message without
// a key, which leaves no key row.
func TestReusedAndInvalidArePoisoned(t *testing.T) {
	forEachPubSub(t, func(t *testing.T, b *testBundle) {
		var r runs
		poisoned := b.collect(t, b.poison)
		s := b.startRouter(t, func(msg *message.Message) ([]*message.Message, error) {
			r.add(msg.Metadata.Get(oncewatermill.DefaultKeyMetadata))
			return nil, writeEffect(msg)
		}, routerOptions{})
		b.publish(t, "order-1", `{"sku":"tea"}`)
		require.Equal(t, onceonly.Ack, s.next(t).Disposition)
		reused := b.publish(t, "order-1", `{"sku":"coffee"}`)
		st := s.next(t)
		require.Equal(t, onceonly.DeadLetter, st.Disposition)
		require.Equal(t, onceonly.ReasonReused, st.Reason)

		got := receive(t, poisoned)
		require.Equal(t, reused.UUID, got.UUID)
		require.JSONEq(t, `{"sku":"coffee"}`, string(got.Payload))
		require.Equal(t, onceonly.ReasonReused, got.Metadata.Get(oncewatermill.ReasonMetadata))
		require.Contains(t, got.Metadata.Get(middleware.ReasonForPoisonedKey), "dead letter (reused)")
		require.Equal(t, handlerName, got.Metadata.Get(middleware.PoisonedHandlerKey))

		keyless := b.publish(t, "", `{"sku":"tea"}`)
		st = s.next(t)
		require.Equal(t, onceonly.DeadLetter, st.Disposition)
		require.Equal(t, onceonly.ReasonInvalid, st.Reason)
		got = receive(t, poisoned)
		require.Equal(t, keyless.UUID, got.UUID)
		require.Equal(t, onceonly.ReasonInvalid, got.Metadata.Get(oncewatermill.ReasonMetadata))

		require.Equal(t, 1, r.get("order-1"))
		require.Equal(t, 0, r.get(""))
		b.awaitOneEffect(t, "order-1")
		var keys int
		require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&keys))
		require.Equal(t, 1, keys, "only order-1 has a key row")
	})
}

// A handler that fails is retried after a backoff, and its next run
// commits: one effect row, nothing poisoned.
func TestFailureThenSuccess(t *testing.T) {
	forEachPubSub(t, func(t *testing.T, b *testBundle) {
		var r runs
		poisoned := b.collect(t, b.poison)
		s := b.startRouter(t, func(msg *message.Message) ([]*message.Message, error) {
			key := msg.Metadata.Get(oncewatermill.DefaultKeyMetadata)
			if err := writeEffect(msg); err != nil {
				return nil, err
			}
			if r.add(key) == 1 {
				return nil, errors.New("the warehouse did not answer")
			}
			return nil, nil
		}, routerOptions{})
		b.publish(t, "order-1", `{"sku":"tea"}`)
		st := s.next(t)
		require.Equal(t, onceonly.Retry, st.Disposition, "%+v", st)
		require.Equal(t, 1, st.Failures)
		require.ErrorContains(t, st.Err, "the warehouse did not answer")
		st = s.next(t)
		require.Equal(t, onceonly.Ack, st.Disposition, "%+v", st)
		require.False(t, st.Outcome.Replayed)
		require.Equal(t, 2, r.get("order-1"))
		b.awaitOneEffect(t, "order-1")
		requireNone(t, poisoned, 200*time.Millisecond)
	})
}

// A handler that keeps failing is poisoned, reason failed, once
// SettlePolicy.MaxFailures of its executions failed; a panic is a
// failure like an error.
func TestFailuresArePoisonedAtMaxFailures(t *testing.T) {
	forEachPubSub(t, func(t *testing.T, b *testBundle) {
		var r runs
		poisoned := b.collect(t, b.poison)
		s := b.startRouter(t, func(msg *message.Message) ([]*message.Message, error) {
			if r.add(msg.Metadata.Get(oncewatermill.DefaultKeyMetadata))%2 == 0 {
				panic("out of tea")
			}
			return nil, errors.New("the warehouse did not answer")
		}, routerOptions{opts: oncewatermill.Options{Policy: onceonly.SettlePolicy{
			MaxFailures: 3, MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		}}})
		sent := b.publish(t, "order-1", `{"sku":"tea"}`)
		for i := 1; i < 3; i++ {
			st := s.next(t)
			require.Equal(t, onceonly.Retry, st.Disposition, "%+v", st)
			require.Equal(t, i, st.Failures)
		}
		st := s.next(t)
		require.Equal(t, onceonly.DeadLetter, st.Disposition, "%+v", st)
		require.Equal(t, onceonly.ReasonFailed, st.Reason)
		require.ErrorContains(t, st.Err, "the warehouse did not answer")
		got := receive(t, poisoned)
		require.Equal(t, sent.UUID, got.UUID)
		require.Equal(t, onceonly.ReasonFailed, got.Metadata.Get(oncewatermill.ReasonMetadata))
		require.Equal(t, 3, r.get("order-1"))
	})
}

// A copy of a message whose key another execution holds is nacked after
// about the engine's Retry-After, over and over, not poisoned and not
// counted as a failure; once the holder commits, the copy is acked as a
// replay and the handler never runs for it.
func TestCopyInFlightIsDelayedNotPoisoned(t *testing.T) {
	forEachPubSub(t, func(t *testing.T, b *testBundle) {
		var r runs
		poisoned := b.collect(t, b.poison)
		// The holder: the same message handled elsewhere (another
		// consumer, another router), still running.
		holding, release := make(chan struct{}), make(chan struct{})
		held := make(chan error, 1)
		go func() {
			_, err := b.elsewhere.Do(b.ctx, handlerName, "order-1", []byte(`{"sku":"tea"}`), func(ctx context.Context, tx pgx.Tx) (onceonly.Result, error) {
				close(holding)
				<-release
				_, err := tx.Exec(ctx, `INSERT INTO effects (key, payload) VALUES ('order-1', 'holder')`)
				return onceonly.Result{Status: 200, ContentType: oncewatermill.ResultContentType}, err
			})
			held <- err
		}()
		<-holding
		s := b.startRouter(t, func(msg *message.Message) ([]*message.Message, error) {
			r.add(msg.Metadata.Get(oncewatermill.DefaultKeyMetadata))
			return nil, writeEffect(msg)
		}, routerOptions{})
		b.publish(t, "order-1", `{"sku":"tea"}`)
		retries := make([]settled, 0, 3)
		for range 3 {
			// In the engine's transaction, the key is in flight; in a
			// joined one (REPEATABLE READ), its row may have changed since
			// the snapshot (the holder renews its lease): a conflict. A
			// retry within a second either way, and no failure.
			st := s.next(t)
			require.Equal(t, onceonly.Retry, st.Disposition, "%+v", st)
			_, inFlight := onceonly.IsInFlight(st.Err)
			require.True(t, inFlight || b.ps.joined, "%v", st.Err)
			require.LessOrEqual(t, st.After, onceonly.MaxInFlightRetry)
			require.Positive(t, st.After)
			require.Zero(t, st.Failures)
			retries = append(retries, st)
		}
		// Each copy came again once its delay had passed (the middleware
		// nacks it then), not at once.
		for i := 1; i < len(retries); i++ {
			require.GreaterOrEqual(t, retries[i].at.Sub(retries[i-1].at), retries[i].After*9/10)
		}
		close(release)
		require.NoError(t, <-held)
		var st settled
		for st = s.next(t); st.Disposition == onceonly.Retry; st = s.next(t) {
		}
		require.Equal(t, onceonly.Ack, st.Disposition, "%+v", st)
		require.True(t, st.Outcome.Replayed)
		require.Equal(t, 0, r.get("order-1"))
		b.awaitOneEffect(t, "order-1")
		requireNone(t, poisoned, 200*time.Millisecond)
	})
}

// The messages a handler returns are stored with its result. When the
// publish fails after the key committed (here after the first message
// went out: a crash in the middle), the redelivery replays and publishes
// the same messages again, with the same UUIDs, metadata and payloads,
// and the handler does not run again.
func TestProducedMessagesAreStableAcrossReplays(t *testing.T) {
	forEachPubSub(t, func(t *testing.T, b *testBundle) {
		var r runs
		receipts := b.collect(t, b.out)
		pub := &failingPublisher{Publisher: b.pub}
		pub.fails.Store(1)
		s := b.startRouter(t, func(msg *message.Message) ([]*message.Message, error) {
			key := msg.Metadata.Get(oncewatermill.DefaultKeyMetadata)
			r.add(key)
			if err := writeEffect(msg); err != nil {
				return nil, err
			}
			// New UUIDs on every run: only the stored ones can repeat.
			receipt := message.NewMessage(watermill.NewUUID(), []byte(`{"receipt":"`+key+`"}`))
			receipt.Metadata.Set("kind", "receipt")
			email := message.NewMessage(watermill.NewUUID(), []byte(`{"email":"`+key+`"}`))
			email.Metadata.Set("kind", "email")
			return message.Messages{receipt, email}, nil
		}, routerOptions{publisher: pub})
		b.publish(t, "order-1", `{"sku":"tea"}`)

		// The first try: the key committed, the first message went out,
		// then the publish failed and the router nacked the message.
		first := s.next(t)
		require.Equal(t, onceonly.Ack, first.Disposition)
		require.False(t, first.Outcome.Replayed)
		partial := receive(t, receipts)
		// The redelivery: a replay that publishes both again.
		second := s.next(t)
		require.Equal(t, onceonly.Ack, second.Disposition)
		require.True(t, second.Outcome.Replayed)
		again := []*message.Message{receive(t, receipts), receive(t, receipts)}
		requireNone(t, receipts, 200*time.Millisecond)

		require.EqualValues(t, 2, pub.calls.Load())
		require.Equal(t, 1, r.get("order-1"))
		b.awaitOneEffect(t, "order-1")
		require.Equal(t, partial.UUID, again[0].UUID)
		require.Equal(t, "receipt", again[0].Metadata.Get("kind"))
		require.JSONEq(t, `{"receipt":"order-1"}`, string(again[0].Payload))
		require.Equal(t, "email", again[1].Metadata.Get("kind"))
		require.JSONEq(t, `{"email":"order-1"}`, string(again[1].Payload))
		require.NotEqual(t, again[0].UUID, again[1].UUID)
	})
}

// In watermill-sql's transaction, the key commits with the subscriber's
// ack, and the handler's writes through that transaction with it: after
// the middleware settled the message, while the router publishes, neither
// is visible. The ack then fails (a trigger on the offsets table, once):
// the subscriber rolls back, the key and the effect with it, and the
// redelivery runs the handler again, so exactly one effect is left.
// Without the join (Options.NoJoin), the key commits on its own while the
// effect is rolled back with the subscriber's transaction, and the
// redelivery replays a run whose effect is lost. The first run's receipt
// was published before its rollback; the second run's has the same UUID.
func TestJoinedTransactionCommitsTheKeyWithTheAck(t *testing.T) {
	t.Parallel()
	for _, ps := range pubSubs {
		if !ps.joined {
			continue
		}
		t.Run(ps.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, ps)
			var r runs
			blocked, unblock := make(chan struct{}), make(chan struct{})
			pub := &blockingPublisher{Publisher: b.pub, blocked: blocked, unblock: unblock}
			s := b.startRouter(t, func(msg *message.Message) ([]*message.Message, error) {
				key := msg.Metadata.Get(oncewatermill.DefaultKeyMetadata)
				r.add(key)
				if err := writeEffect(msg); err != nil {
					return nil, err
				}
				id, err := oncewatermill.ProducedUUID(msg.Context(), 0)
				if err != nil {
					return nil, err
				}
				return message.Messages{message.NewMessage(id, []byte(`{"receipt":"`+key+`"}`))}, nil
			}, routerOptions{publisher: pub})
			receipts := b.collect(t, b.out)
			// The router subscribed: the offsets table exists.
			_, err := b.pool.Exec(b.ctx, `
				CREATE SEQUENCE ack_failures;
				CREATE FUNCTION fail_first_ack() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					IF nextval('ack_failures') = 1 THEN
						RAISE EXCEPTION 'test: the first ack fails';
					END IF;
					RETURN NEW;
				END $$;
				CREATE TRIGGER fail_first_ack BEFORE INSERT OR UPDATE ON "watermill_offsets_`+b.in+`"
					FOR EACH ROW EXECUTE FUNCTION fail_first_ack();`)
			require.NoError(t, err)
			b.publish(t, "order-1", `{"sku":"tea"}`)

			st := s.next(t)
			require.Equal(t, onceonly.Ack, st.Disposition)
			<-blocked
			// Settled, not committed: the key and the effect wait for the ack.
			var keys int
			require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&keys))
			require.Zero(t, keys)
			require.Zero(t, b.effects(t, "order-1"))
			close(unblock)

			st = s.next(t)
			require.Equal(t, onceonly.Ack, st.Disposition, "%+v", st)
			require.False(t, st.Outcome.Replayed, "the first run was rolled back with the failed ack")
			require.Equal(t, 2, r.get("order-1"))
			b.awaitOneEffect(t, "order-1")
			// Each run published its receipt before the commit; both runs
			// gave it the same UUID (ProducedUUID), for downstream to
			// deduplicate.
			first, second := receive(t, receipts), receive(t, receipts)
			require.Equal(t, first.UUID, second.UUID)
			oncetest.Eventually(t, 10*time.Second, "the key committed", func() bool {
				var status string
				err := b.pool.QueryRow(b.ctx, `SELECT status FROM idempotency_keys WHERE key = 'order-1'`).Scan(&status)
				return err == nil && status == "completed"
			})
		})
	}
}

// blockingPublisher holds its first Publish until unblock is closed; every
// call publishes.
type blockingPublisher struct {
	message.Publisher
	blocked, unblock chan struct{}
	calls            atomic.Int32
}

func (p *blockingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.calls.Add(1) == 1 {
		close(p.blocked)
		<-p.unblock
	}
	return p.Publisher.Publish(topic, msgs...)
}
