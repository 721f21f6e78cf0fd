package cache

import (
	"context"
	"sync"
	"sync/atomic"

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

// pipedCmd is one caller's command. done is closed when the command has
// its reply, or when its caller must send batch.
type pipedCmd struct {
	cmd   redis.Cmder
	done  chan struct{}
	batch []*pipedCmd // set when this caller sends the next pipeline
	taken bool        // in a batch (no longer in waiting)
}

// do runs cmd; its reply or error is in cmd. A caller whose ctx ends while
// its command waits gets ctx.Err() as the command's error, and the command
// is not sent; once sent, the command's reply is awaited (bounded by the
// client's read timeout).
func (p *pipeline) do(ctx context.Context, cmd redis.Cmder) {
	c := &pipedCmd{cmd: cmd}
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
			p.waiting = removeCmd(p.waiting, c)
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

// send sends batch as one round trip, then passes the commands that
// waited meanwhile to the first of their callers, or ends the pipeline.
// batch[0] is the caller of send, whose ctx it is: it needs no wakeup.
func (p *pipeline) send(ctx context.Context, batch []*pipedCmd) {
	p.roundTrip(ctx, batch)
	for _, c := range batch[1:] {
		close(c.done)
	}
	p.mu.Lock()
	if len(p.waiting) == 0 {
		p.inFlight--
		p.mu.Unlock()
		return
	}
	next := p.waiting[:min(len(p.waiting), maxBatch)]
	p.waiting = p.waiting[len(next):]
	for _, c := range next {
		c.taken = true
	}
	p.mu.Unlock()
	next[0].batch = next
	close(next[0].done) // its caller sends them
}

// roundTrip sends the commands and reads their replies. A lone command goes
// as a plain call; several go in one go-redis pipeline, which a cluster
// client splits per node. The pipeline runs under ctx, its sender's,
// without its cancellation: the others' replies depend on it.
func (p *pipeline) roundTrip(ctx context.Context, batch []*pipedCmd) {
	p.pipelines.Add(1)
	p.commands.Add(int64(len(batch)))
	if len(batch) == 1 {
		_ = p.rdb.Process(ctx, batch[0].cmd) // the error is in the command
		return
	}
	ctx = context.WithoutCancel(ctx)
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range batch {
			_ = pipe.Process(ctx, c.cmd) // queued; errors come with the replies
		}
		return nil
	})
}

// removeCmd removes c from cmds, keeping the order.
func removeCmd(cmds []*pipedCmd, c *pipedCmd) []*pipedCmd {
	for i, w := range cmds {
		if w == c {
			return append(cmds[:i], cmds[i+1:]...)
		}
	}
	return cmds
}
