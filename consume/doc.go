// Package consume is the core every broker integration of onceonly shares
// (onceamqp, oncenats, oncekafka, oncewatermill): running a delivered
// message once. It identifies the message (scope, key, payload), executes it through the
// engine — Engine.Run with a registered handler, which may call systems
// outside Postgres, or Engine.Do with a handler that writes in the key's
// transaction — with panics recovered, and turns the engine's answer into
// a Settlement by a SettlePolicy. What a settlement means in the broker's
// verbs (ack, nack, requeue, a delay, a dead letter), the connection and
// the delivery loop stay in each integration.
//
// It is generic over the broker client's message type M and imports no
// broker client. An integration for a broker onceonly does not ship is a
// delivery loop around one Executor:
//
//	exec, err := consume.New(consume.Config[*Msg]{
//		Package:    "oncemybroker",
//		Engine:     engine,
//		Identifier: consume.Identifier[*Msg]{
//			Scope: "orders",
//			Key:   func(m *Msg) (string, error) { return m.Header("Idempotency-Key"), nil },
//			Body:  func(m *Msg) []byte { return m.Body },
//		},
//		Policy: onceonly.SettlePolicy{MaxFailures: 5},
//	}, "orders.charge", consume.Work[*Msg]{Handler: charge})
//	…
//	for m := range deliveries {
//		s := exec.Settle(ctx, m)
//		switch s.Disposition { // onceonly.Ack, onceonly.Retry (after s.After), onceonly.DeadLetter
//		…
//		}
//	}
//
// Reason and RetryReason give the metric labels the shipped integrations
// use, and SharedCollector lets several consumers share one registry's
// metrics.
package consume
