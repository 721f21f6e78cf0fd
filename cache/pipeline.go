package cache

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// pipeline sends the commands of concurrent callers together: while
// maxInFlight pipelines are on the wire, new commands wait, and the next
// pipeline carries every command that waited (group commit, as Postgres
// does for WAL flushes). A caller alone sends its command at once, as a
// plain client would; under load one write and one read carry many
// commands, which saves the client and Redis a system call pair, a pool
// checkout and a wakeup per command.
//
// There is no goroutine of its own: the caller whose command opens a
// pipeline sends it, and when it is back, hands the commands that waited
// meanwhile to one of their callers, which sends them.
//
// Not for a cluster client: a pipeline waits for every node it touches, so
// one slow node would hold up commands for all the others (New sends each
// command on its own there).
type pipeline struct {
	rdb redis.UniversalClient

	mu       sync.Mutex
	waiting  []*pipedCmd
	inFlight int

	pipelines atomic.Int64 // round trips made
	commands  atomic.Int64 // commands they carried
}

// maxInFlight is how many pipelines may be on the wire at once; more
// would mostly shrink them. maxBatch bounds the commands of one.
const (
	maxInFlight = 2
	maxBatch    = 128
)

// errRoundTripPanicked is the error of the commands of a pipeline whose
// round trip panicked (in a hook, say); the panic goes on in its sender.
var errRoundTripPanicked = errors.New("redis pipeline: the round trip panicked")

// pipedCmd is one caller's command. done is closed when the command has
// its reply, or when its caller must send batch.
type pipedCmd struct {
	cmd      redis.Cmder
	deadline time.Time // the caller's, if any
	done     chan struct{}
	batch    []*pipedCmd // set when this caller sends the next pipeline
	taken    bool        // in a batch (no longer in waiting)
}

// do runs cmd; its reply or error is in cmd. A caller whose ctx ends while
// its command waits gets ctx.Err() as the command's error, and the command
// is not sent; once sent, the command's reply is awaited: the round trip
// ends by the latest deadline of the callers it carries, or by the
// client's timeouts.
func (p *pipeline) do(ctx context.Context, cmd redis.Cmder) {
	c := &pipedCmd{cmd: cmd}
	c.deadline, _ = ctx.Deadline()
	p.mu.Lock()
	if p.inFlight < maxInFlight {
		p.inFlight++
		p.mu.Unlock()
		p.send(ctx, []*pipedCmd{c})
		return
	}
	c.done = make(chan struct{})
	p.waiting = append(p.waiting, c)
	p.mu.Unlock()

	select {
	case <-c.done:
	case <-ctx.Done():
		p.mu.Lock()
		if !c.taken {
			p.waiting = slices.DeleteFunc(p.waiting, func(w *pipedCmd) bool { return w == c })
			p.mu.Unlock()
			cmd.SetErr(ctx.Err())
			return
		}
		p.mu.Unlock()
		<-c.done // in a pipeline: its reply, or the duty to send it, comes
	}
	if c.batch != nil {
		p.send(ctx, c.batch)
	}
}

// send sends batch as one round trip, then wakes its callers and passes the
// commands that waited meanwhile to the first of theirs, or ends the
// pipeline. batch[0] is the caller of send, whose ctx it is: it needs no
// wakeup. Should the round trip panic, the batch's commands fail and the
// waiting ones are handed on all the same, before the panic goes on.
func (p *pipeline) send(ctx context.Context, batch []*pipedCmd) {
	done := false
	defer func() {
		if !done {
			for _, c := range batch {
				c.cmd.SetErr(errRoundTripPanicked)
			}
		}
		p.handOn(batch)
	}()
	p.roundTrip(ctx, batch)
	done = true
}

// handOn wakes the callers of batch (but its sender) and hands the waiting
// commands to the first of theirs, or ends the pipeline.
func (p *pipeline) handOn(batch []*pipedCmd) {
	for _, c := range batch[1:] {
		close(c.done)
	}
	p.mu.Lock()
	if len(p.waiting) == 0 {
		p.inFlight--
		p.mu.Unlock()
		return
	}
	n := min(len(p.waiting), maxBatch)
	next := slices.Clone(p.waiting[:n])
	p.waiting = slices.Delete(p.waiting, 0, n) // clears the tail: no finished command stays reachable
	for _, c := range next {
		c.taken = true
	}
	p.mu.Unlock()
	next[0].batch = next
	close(next[0].done) // its caller sends them
}

// roundTrip sends the commands and reads their replies. A lone command goes
// as a plain call; several go in one go-redis pipeline. The pipeline runs
// under ctx, its sender's, without its cancellation (the others' replies
// depend on it) but with the latest deadline of the callers, when they all
// have one: a retry of the client does not outlast them all.
func (p *pipeline) roundTrip(ctx context.Context, batch []*pipedCmd) {
	p.pipelines.Add(1)
	p.commands.Add(int64(len(batch)))
	if len(batch) == 1 {
		_ = p.rdb.Process(ctx, batch[0].cmd) // the error is in the command
		return
	}
	ctx = context.WithoutCancel(ctx)
	if latest, ok := latestDeadline(batch); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range batch {
			_ = pipe.Process(ctx, c.cmd) // queued; errors come with the replies
		}
		return nil
	})
}

// latestDeadline returns the latest deadline of the batch's callers; ok is
// false when one of them has none.
func latestDeadline(batch []*pipedCmd) (latest time.Time, ok bool) {
	for _, c := range batch {
		if c.deadline.IsZero() {
			return time.Time{}, false
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	return latest, true
}
