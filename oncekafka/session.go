package oncekafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A session is one run of the consumer: one kgo client in the group, its
// partitions' offset trackers, the queue of records for the workers.
//
// Offsets: each partition keeps the records taken from Kafka in offset
// order until they settle; the offset committed is the one after the
// longest settled prefix, so a record is never committed past before it
// is settled, whatever order the workers finish in. A record given back
// (Retry) stays in its place and runs again after its delay; the records
// behind it run meanwhile, but the partition's committed offset waits for
// it.
type session struct {
	c  *Consumer
	cl *kgo.Client

	mu       sync.Mutex
	parts    map[topicPartition]*partition
	owned    int
	queue    []*item
	notify   chan struct{} // a record was queued (capacity 1)
	stopping chan struct{} // closed once the intake stops
	closed   bool

	commitMu sync.Mutex // one commit at a time, its offsets read under it
}

type topicPartition struct {
	topic     string
	partition int32
}

// partition tracks the records of one partition this member owns.
type partition struct {
	topicPartition
	pending   []*item         // taken and not settled, or settled behind an unsettled one
	mark      kgo.EpochOffset // the offset after the settled prefix
	marked    bool
	committed int64 // the offset committed last by this member; -1 none
	paused    bool
	gone      bool // revoked or lost: its records are the next owner's
	timers    map[*item]*time.Timer
}

type item struct {
	rec     *kgo.Record
	p       *partition
	settled bool
}

func newSession(c *Consumer) *session {
	return &session{
		c:        c,
		parts:    map[topicPartition]*partition{},
		notify:   make(chan struct{}, 1),
		stopping: make(chan struct{}),
	}
}

// clientOptions are the kgo options of the session's client.
func (s *session) clientOptions() []kgo.Opt {
	o := s.c.opts
	opts := []kgo.Opt{kgo.ConsumeResetOffset(kgo.NewOffset().AtStart())}
	opts = append(opts, o.ClientOptions...)
	return append(opts,
		kgo.SeedBrokers(o.Brokers...),
		kgo.ConsumerGroup(o.Group),
		kgo.ConsumeTopics(o.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
	)
}

// consume runs one session until ctx ends.
func (c *Consumer) consume(ctx context.Context) error {
	s := newSession(c)
	cl, err := kgo.NewClient(s.clientOptions()...)
	if err != nil {
		return fmt.Errorf("oncekafka: create the Kafka client: %w", err)
	}
	s.cl = cl
	defer c.joined.Store(false)

	// Executions run on a context of their own: the end of ctx stops the
	// intake, and only the shutdown bound cancels what is under way.
	execCtx, cancelExecutions := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelExecutions()
	var workers sync.WaitGroup
	for range c.opts.Workers {
		workers.Go(func() {
			for {
				it, ok := s.next()
				if !ok {
					return
				}
				c.handle(execCtx, s, it)
			}
		})
	}

	nextCommit := time.Now().Add(c.opts.CommitInterval)
	for ctx.Err() == nil {
		pctx, cancel := context.WithDeadline(ctx, nextCommit)
		fetches := cl.PollRecords(pctx, c.opts.MaxPoll)
		cancel()
		if fetches.IsClientClosed() {
			break
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return
			}
			c.metrics.errors.WithLabelValues(opPoll).Inc()
			c.log.WarnContext(ctx, "oncekafka: fetch failed", "topic", topic, "partition", partition, "err", err)
		})
		s.take(fetches.Records())
		if now := time.Now(); !now.Before(nextCommit) {
			// Between a poll and AllowRebalance the partitions are this
			// member's: the commit names none it lost.
			s.commit(ctx, nil)
			nextCommit = now.Add(c.opts.CommitInterval)
		}
		cl.AllowRebalance()
	}

	// Stop: no more records to the workers; the queued ones and those
	// waiting for a retry stay unsettled, for the next owner.
	s.closeIntake()
	idle := make(chan struct{})
	go func() { workers.Wait(); close(idle) }()
	bound := time.NewTimer(c.opts.ShutdownTimeout)
	defer bound.Stop()
	select {
	case <-idle:
	case <-bound.C:
		c.log.WarnContext(ctx, "oncekafka: executions still running at the shutdown bound: canceling them", "shutdown_timeout", c.opts.ShutdownTimeout)
		cancelExecutions()
		<-idle
	}
	s.commit(ctx, nil)
	// Leave the group (revoked commits again, with nothing new) within a
	// bound: a broker out of reach must not hold Stop.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.RequestTimeout)
	if err := cl.LeaveGroupContext(lctx); err != nil {
		c.log.WarnContext(ctx, "oncekafka: leaving the group failed; the group's session timeout will end the membership", "err", err)
	}
	cancel()
	cl.Close()
	return nil
}

// take registers the records of a poll with their partitions, queues
// them for the workers, and pauses a partition whose window is full.
func (s *session) take(recs []*kgo.Record) {
	if len(recs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var pause map[string][]int32
	for _, rec := range recs {
		tp := topicPartition{rec.Topic, rec.Partition}
		p := s.parts[tp]
		if p == nil {
			p = &partition{topicPartition: tp, committed: -1, timers: map[*item]*time.Timer{}}
			s.parts[tp] = p
		}
		it := &item{rec: rec, p: p}
		p.pending = append(p.pending, it)
		s.queue = append(s.queue, it)
		if !p.paused && len(p.pending) >= s.c.opts.PartitionWindow {
			p.paused = true
			if pause == nil {
				pause = map[string][]int32{}
			}
			pause[tp.topic] = append(pause[tp.topic], tp.partition)
			s.c.metrics.paused.Inc()
		}
	}
	if pause != nil {
		// Under s.mu, so that a resume decided by a worker never runs
		// before it. Records of a paused partition the client holds are
		// dropped and fetched again at resumption.
		s.cl.PauseFetchPartitions(pause)
	}
	s.signal()
}

func (s *session) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// next returns the next queued record of a partition still owned, or
// false once the intake stopped.
func (s *session) next() (*item, bool) {
	for {
		s.mu.Lock()
		for len(s.queue) > 0 && !s.closed {
			it := s.queue[0]
			s.queue[0] = nil
			s.queue = s.queue[1:]
			if it.p.gone {
				continue
			}
			more := len(s.queue) > 0
			s.mu.Unlock()
			if more {
				s.signal() // another worker may take the next
			}
			return it, true
		}
		s.mu.Unlock()
		select {
		case <-s.notify:
		case <-s.stopping:
			return nil, false
		}
	}
}

// closeIntake stops handing records to the workers and cancels the
// retries waiting.
func (s *session) closeIntake() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.queue = nil
	for _, p := range s.parts {
		for it, t := range p.timers {
			t.Stop()
			delete(p.timers, it)
		}
	}
	close(s.stopping)
}

// settle marks it settled and moves its partition's mark over the
// settled prefix, resuming the partition when its window has room again.
func (s *session) settle(it *item) {
	s.mu.Lock()
	defer s.mu.Unlock()
	it.settled = true
	p := it.p
	if p.gone {
		return
	}
	for len(p.pending) > 0 && p.pending[0].settled {
		rec := p.pending[0].rec
		p.mark = kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset + 1}
		p.marked = true
		p.pending[0] = nil
		p.pending = p.pending[1:]
	}
	if p.paused && len(p.pending) < s.c.opts.PartitionWindow {
		p.paused = false
		s.c.metrics.paused.Dec()
		s.cl.ResumeFetchPartitions(map[string][]int32{p.topic: {p.partition}})
	}
}

// retry queues it again after delay, unless its partition is gone or the
// intake stopped by then.
func (s *session) retry(it *item, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if it.p.gone || s.closed {
		return
	}
	it.p.timers[it] = time.AfterFunc(delay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := it.p.timers[it]; !ok {
			return // stopped meanwhile
		}
		delete(it.p.timers, it)
		if it.p.gone || s.closed {
			return
		}
		s.queue = append(s.queue, it)
		s.signal()
	})
}

// commit commits the settled prefix of parts (nil: every partition still
// owned) where it moved since the last commit.
func (s *session) commit(ctx context.Context, parts []*partition) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	if parts == nil {
		for _, p := range s.parts {
			if !p.gone {
				parts = append(parts, p)
			}
		}
	}
	offsets := map[string]map[int32]kgo.EpochOffset{}
	marks := map[topicPartition]int64{}
	for _, p := range parts {
		if !p.marked || p.mark.Offset <= p.committed {
			continue
		}
		if offsets[p.topic] == nil {
			offsets[p.topic] = map[int32]kgo.EpochOffset{}
		}
		offsets[p.topic][p.partition] = p.mark
		marks[p.topicPartition] = p.mark.Offset
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.c.opts.RequestTimeout)
	defer cancel()
	var failed error
	done := map[topicPartition]bool{}
	s.cl.CommitOffsetsSync(cctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			failed = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					failed = err
					continue
				}
				done[topicPartition{t.Topic, p.Partition}] = true
			}
		}
	})
	if failed != nil {
		// The offsets are committed again with the next ones; until then
		// a new owner runs the records again, as replays.
		s.c.metrics.errors.WithLabelValues(opCommit).Inc()
		s.c.log.WarnContext(ctx, "oncekafka: offset commit failed", "err", failed)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range parts {
		if done[p.topicPartition] {
			p.committed = max(p.committed, marks[p.topicPartition])
		}
	}
}

// assigned counts the partitions this member owns.
func (s *session) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ps := range m {
		s.owned += len(ps)
	}
	s.c.joined.Store(s.owned > 0)
}

// revoked commits the settled prefix of the partitions taken away, then
// forgets them: their unsettled records are the next owner's, and an
// execution of one still running is fenced by the engine (its key's lease).
func (s *session) revoked(ctx context.Context, _ *kgo.Client, m map[string][]int32) {
	s.commit(ctx, s.drop(m))
}

// lost forgets the partitions lost (the member was fenced out of the
// group): no commit, which the group would refuse.
func (s *session) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	s.drop(m)
}

// drop marks the partitions of m gone and returns them.
func (s *session) drop(m map[string][]int32) []*partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	var gone []*partition
	resume := map[string][]int32{}
	for topic, ps := range m {
		s.owned -= len(ps)
		for _, n := range ps {
			tp := topicPartition{topic, n}
			p := s.parts[tp]
			if p == nil {
				continue
			}
			delete(s.parts, tp)
			p.gone = true
			for it, t := range p.timers {
				t.Stop()
				delete(p.timers, it)
			}
			if p.paused {
				// Paused stays paused in the client: were it given back
				// to this member, it would never be fetched.
				p.paused = false
				s.c.metrics.paused.Dec()
				resume[topic] = append(resume[topic], n)
			}
			gone = append(gone, p)
		}
	}
	if len(resume) > 0 {
		s.cl.ResumeFetchPartitions(resume)
	}
	s.owned = max(s.owned, 0)
	s.c.joined.Store(s.owned > 0)
	return gone
}
