package onceamqp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/onceonly/onceonly/backoff"
)

// session is one connection to the broker and the channel consuming on
// it. A lost session is never repaired: the next one starts from a new
// dial, so no delivery of the old channel is ever settled on the new one.
type session struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	// lost is closed, with err set, when the connection or the channel
	// closes or the broker cancels the consumer.
	lost     chan struct{}
	lostOnce sync.Once
	err      error
}

// connectLoop consumes session after session until ctx ends, and returns
// the session open then (nil if none), still consuming: the caller
// cancels its consumer and closes it once the workers are done with its
// deliveries.
func (c *Consumer) connectLoop(ctx context.Context, work chan<- amqp.Delivery) *session {
	bo := backoff.Backoff{Min: c.opts.ReconnectMin, Max: c.opts.ReconnectMax}
	for {
		s, err := c.open(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			wait := bo.Next()
			c.metrics.connects.WithLabelValues("error").Inc()
			c.log.Warn("onceamqp: cannot consume: trying again", "in", wait, "error", err)
			if backoff.Sleep(ctx, wait) != nil {
				return nil
			}
			continue
		}
		bo.Reset()
		c.metrics.connects.WithLabelValues("ok").Inc()
		c.setConnected(true)
		c.log.Info("onceamqp: consuming", "workers", c.opts.Workers, "prefetch", c.opts.Prefetch)
		err = c.pump(ctx, s, work)
		c.setConnected(false)
		if err == nil {
			return s
		}
		s.close()
		wait := bo.Next()
		c.log.Warn("onceamqp: lost the broker: its unsettled deliveries come again; reconnecting", "in", wait, "error", err)
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

func (c *Consumer) setConnected(up bool) {
	c.connected.Store(up)
	if up {
		c.metrics.connected.Set(1)
	} else {
		c.metrics.connected.Set(0)
	}
}

// open dials the broker and starts consuming on a new channel.
func (c *Consumer) open(ctx context.Context) (_ *session, err error) {
	cfg := c.opts.AMQP
	if cfg.Dial == nil {
		cfg.Dial = dialContext(ctx, DefaultDialTimeout)
	}
	conn, err := amqp.DialConfig(c.opts.URL, cfg)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	defer func() {
		if err != nil {
			_ = conn.Close()
		}
	}()
	if c.opts.Declare != nil {
		if err := c.opts.Declare(conn); err != nil {
			return nil, fmt.Errorf("declare: %w", err)
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open a channel: %w", err)
	}
	if err := ch.Qos(c.opts.Prefetch, 0, false); err != nil {
		return nil, fmt.Errorf("set prefetch: %w", err)
	}
	s := &session{conn: conn, ch: ch, lost: make(chan struct{})}
	// Buffered: the library sends at most one error on each before closing
	// it, and must never block on a listener.
	connClosed := conn.NotifyClose(make(chan *amqp.Error, 1))
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	cancelled := ch.NotifyCancel(make(chan string, 1))
	s.deliveries, err = ch.Consume(c.opts.Queue, c.tag, false, false, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume %s: %w", c.opts.Queue, err)
	}
	go func() {
		select {
		case e := <-connClosed:
			s.fail(closed("connection", e))
		case e := <-chClosed:
			s.fail(closed("channel", e))
		case tag := <-cancelled:
			s.fail(fmt.Errorf("the broker cancelled consumer %s (the queue was deleted, or its leader moved)", tag))
		}
	}()
	return s, nil
}

// dialContext dials as amqp.DefaultDial does (a deadline over the TCP and
// AMQP handshakes), and gives up when ctx ends.
func dialContext(ctx context.Context, timeout time.Duration) func(network, addr string) (net.Conn, error) {
	return func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("set the handshake deadline: %w", err)
		}
		return conn, nil
	}
}

func closed(what string, e *amqp.Error) error {
	if e == nil {
		return fmt.Errorf("%s closed", what)
	}
	return fmt.Errorf("%s closed: %w", what, e)
}

func (s *session) fail(err error) {
	s.lostOnce.Do(func() {
		s.err = err
		close(s.lost)
	})
}

// pump hands the session's deliveries to the workers until ctx ends (nil)
// or the session is lost (why). A delivery in hand then is left unsettled:
// the broker requeues it when the channel closes.
func (c *Consumer) pump(ctx context.Context, s *session, work chan<- amqp.Delivery) error {
	for {
		var d amqp.Delivery
		select {
		case <-ctx.Done():
			return nil
		case <-s.lost:
			return s.err
		case next, ok := <-s.deliveries:
			if !ok {
				// The channel is closing; lost says why, or soon will.
				select {
				case <-s.lost:
					return s.err
				case <-time.After(time.Second):
					return errors.New("deliveries ended")
				}
			}
			d = next
		}
		select {
		case work <- d:
		case <-ctx.Done():
			return nil
		case <-s.lost:
			return s.err
		}
	}
}

// cancel stops the broker's deliveries to the consumer tag without
// waiting for the broker's answer (a broker that stopped answering must
// not hold up a shutdown): deliveries already sent stay unsettled, and the
// broker requeues them when the channel closes.
func (s *session) cancel(tag string) {
	_ = s.ch.Cancel(tag, true)
}

// closeTimeout bounds the wait for the broker's answer to connection.close.
const closeTimeout = time.Second

// close closes the connection (and so the channel): the broker requeues
// every delivery of the session left unsettled.
func (s *session) close() {
	_ = s.conn.CloseDeadline(time.Now().Add(closeTimeout))
}
