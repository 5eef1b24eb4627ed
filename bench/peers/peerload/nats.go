// NATS JetStream: one file-stored work-queue stream per run, one nats.Conn per client. Producers
// publish with a Msg-Id (JetStream dedupes on it within the stream's duplicate window); consumer i
// has its own durable pull consumer, filtered on the subjects of the partitions it owns.
//
// Subject of partition p: <prefix>.<tag>.<p % C>.<p>, so consumer i's filter <prefix>.<tag>.<i>.*
// takes exactly its partitions (p % C == i) with one subject; a work-queue stream refuses
// consumers whose filters overlap.
package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

const (
	natsAckWait = 60 * time.Second
	// Messages a consumer may hold unacked: well above what one pop takes.
	natsMaxAckPending = 100000
	// Publishes in flight during the preload, before waiting for their acks.
	natsPreloadWindow = 2000
	// How long a queue-cycle pop waits for messages before calling the queue dry.
	natsCycleWait = 2 * time.Second
	// How long a queue-latency pop parks when nothing has arrived.
	natsParkWait = time.Second
)

type natsTarget struct {
	cfg    config
	stream string // Q_<TAG>, LQ_<TAG> for queue-latency
	prefix string // q.<tag>, lq.<tag> for queue-latency
}

func newNats(cfg config) *natsTarget {
	root := "q"
	if cfg.workload == queueLatency {
		root = "lq"
	}
	name := queueName(cfg.tag)
	return &natsTarget{cfg: cfg, stream: strings.ToUpper(root + "_" + name), prefix: root + "." + name}
}

func (n *natsTarget) subject(partition int) string {
	return fmt.Sprintf("%s.%d.%d", n.prefix, partition%n.cfg.connections, partition)
}

func (n *natsTarget) durable(index int) string { return fmt.Sprintf("c%d", index) }

func (n *natsTarget) connect() (*nats.Conn, nats.JetStreamContext, error) {
	nc, err := nats.Connect("nats://"+n.cfg.endpoint, nats.Timeout(10*time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := nc.JetStream()
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func (n *natsTarget) prepare(ctx context.Context) error {
	nc, js, err := n.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	_, err = js.AddStream(&nats.StreamConfig{Name: n.stream, Subjects: []string{n.prefix + ".>"},
		Storage: nats.FileStorage, Retention: nats.WorkQueuePolicy, Replicas: 1}, nats.Context(ctx))
	if err != nil {
		return err
	}
	if n.cfg.workload == "queue-push" {
		return nil
	}
	for i := 0; i < n.cfg.connections; i++ {
		_, err := js.AddConsumer(n.stream, &nats.ConsumerConfig{Durable: n.durable(i),
			FilterSubject: fmt.Sprintf("%s.%d.*", n.prefix, i), AckPolicy: nats.AckExplicitPolicy,
			AckWait: natsAckWait, MaxAckPending: natsMaxAckPending}, nats.Context(ctx))
		if err != nil {
			return err
		}
	}
	if n.cfg.workload == "queue-cycle" {
		return n.preload(ctx, js)
	}
	return nil
}

func (n *natsTarget) teardown(ctx context.Context) error {
	nc, js, err := n.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	return js.DeleteStream(n.stream, nats.Context(ctx))
}

// preload spreads -queue-preload messages evenly over the partitions, publishing a window of them
// at a time and checking every ack before the next.
func (n *natsTarget) preload(ctx context.Context, js nats.JetStreamContext) error {
	total := n.cfg.queuePreload
	for start := 0; start < total; start += natsPreloadWindow {
		var futures []nats.PubAckFuture
		for m := start; m < start+natsPreloadWindow && m < total; m++ {
			f, err := js.PublishAsync(n.subject(m%n.cfg.partitions), []byte(value),
				nats.MsgId(fmt.Sprintf("%s-pre-%d", n.cfg.tag, m)))
			if err != nil {
				return err
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			if _, err := settle(ctx, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// settle waits for a publish's ack; a duplicate is a failure: the stream did not store it.
func settle(ctx context.Context, f nats.PubAckFuture) (*nats.PubAck, error) {
	select {
	case ack := <-f.Ok():
		if ack.Duplicate {
			return nil, failure{"duplicate", f.Msg().Header.Get(nats.MsgIdHdr)}
		}
		return ack, nil
	case err := <-f.Err():
		return nil, failure{"not_stored", err.Error()}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (n *natsTarget) session(ctx context.Context, index int) (session, error) {
	nc, js, err := n.connect()
	if err != nil {
		return nil, err
	}
	if n.cfg.workload == "queue-push" {
		return &natsPush{target: n, nc: nc, js: js, index: index}, nil
	}
	return &natsCycle{natsPuller: natsPuller{target: n, nc: nc, js: js, index: index}}, nil
}

// natsPush: each step publishes -ops messages asynchronously, then waits for all their acks.
type natsPush struct {
	target *natsTarget
	nc     *nats.Conn
	js     nats.JetStreamContext
	index  int
	n      int
}

func (s *natsPush) setup(ctx context.Context) error   { return nil }
func (s *natsPush) owes() bool                        { return false }
func (s *natsPush) release(ctx context.Context) error { return nil }
func (s *natsPush) close()                            { s.nc.Close() }

func (s *natsPush) step(ctx context.Context, t *tally, counting bool) error {
	cfg := s.target.cfg
	futures := make([]nats.PubAckFuture, 0, cfg.ops)
	for i := 0; i < cfg.ops; i++ {
		f, err := s.js.PublishAsync(s.target.subject(pushPartition(cfg, s.index, s.n, i)), []byte(value),
			nats.MsgId(itemID(cfg, s.index, s.n, i)))
		if err != nil {
			return err
		}
		futures = append(futures, f)
	}
	s.n++
	for _, f := range futures {
		if _, err := settle(ctx, f); err != nil {
			if ctx.Err() != nil {
				return err
			}
			t.fail(err)
			continue
		}
		if counting {
			t.pending["messages"]++
		}
	}
	return nil
}

// natsPuller: a client bound to its own durable pull consumer.
type natsPuller struct {
	target *natsTarget
	nc     *nats.Conn
	js     nats.JetStreamContext
	index  int
	sub    *nats.Subscription
	msgs   []*nats.Msg // what the last fetch delivered
}

func (p *natsPuller) setup(ctx context.Context) error {
	durable := p.target.durable(p.index)
	sub, err := p.js.PullSubscribe(fmt.Sprintf("%s.%d.*", p.target.prefix, p.index), durable,
		nats.Bind(p.target.stream, durable))
	p.sub = sub
	return err
}

// fetch takes up to -ops messages, waiting up to `wait` for the first; none is no error.
func (p *natsPuller) fetch(wait time.Duration) error {
	msgs, err := p.sub.Fetch(p.target.cfg.ops, nats.MaxWait(wait))
	if errors.Is(err, nats.ErrTimeout) {
		msgs, err = nil, nil
	}
	p.msgs = msgs
	return err
}

// ackAll acks what the last fetch delivered: asynchronously but the last, which waits for its
// answer; a connection's acks are processed in order, so then all of them are in.
func (p *natsPuller) ackAll() error {
	last := len(p.msgs) - 1
	for i, m := range p.msgs {
		var err error
		if i == last {
			err = m.AckSync()
		} else {
			err = m.Ack()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (p *natsPuller) close() { p.nc.Close() }

// natsCycle: each step fetches up to -ops messages of the client's partitions, then acks them.
type natsCycle struct{ natsPuller }

func (s *natsCycle) owes() bool                        { return false }
func (s *natsCycle) release(ctx context.Context) error { return nil }

func (s *natsCycle) step(ctx context.Context, t *tally, counting bool) error {
	if err := s.fetch(natsCycleWait); err != nil {
		return err
	}
	if len(s.msgs) == 0 {
		if counting {
			t.pending["empty"]++
		}
		t.error("ran_dry", fmt.Sprintf("fetch found nothing in %v: the preload of %d messages is exhausted",
			natsCycleWait, s.target.cfg.queuePreload))
		return nil
	}
	if err := s.ackAll(); err != nil {
		return err
	}
	if counting {
		t.pending["messages"] += int64(len(s.msgs))
	}
	return nil
}

func (n *natsTarget) producer(ctx context.Context, index int) (producer, error) {
	nc, js, err := n.connect()
	if err != nil {
		return nil, err
	}
	return &natsProducer{target: n, nc: nc, js: js}, nil
}

// natsProducer: each push is a synchronous publish, answered once the stream stored it.
type natsProducer struct {
	target *natsTarget
	nc     *nats.Conn
	js     nats.JetStreamContext
}

func (p *natsProducer) push(ctx context.Context, partition int, id string, due int64) error {
	ack, err := p.js.Publish(p.target.subject(partition), latencyPayload(due), nats.MsgId(id), nats.Context(ctx))
	if err != nil {
		return err
	}
	if ack.Duplicate {
		return failure{"duplicate", id}
	}
	return nil
}

func (p *natsProducer) close() { p.nc.Close() }

func (n *natsTarget) consumer(ctx context.Context, index int) (consumer, error) {
	nc, js, err := n.connect()
	if err != nil {
		return nil, err
	}
	c := &natsConsumer{natsPuller{target: n, nc: nc, js: js, index: index}}
	if err := c.setup(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// natsConsumer pops with a fetch that parks up to a second; a message's id is its stream sequence.
type natsConsumer struct{ natsPuller }

func (c *natsConsumer) pop(ctx context.Context) ([]delivery, error) {
	if err := c.fetch(natsParkWait); err != nil {
		return nil, err
	}
	got := make([]delivery, len(c.msgs))
	for i, m := range c.msgs {
		meta, err := m.Metadata()
		if err != nil {
			return nil, err
		}
		due, err := dueOf(m.Data)
		if err != nil {
			return nil, err
		}
		got[i] = delivery{id: strconv.FormatUint(meta.Sequence.Stream, 10), due: due}
	}
	return got, nil
}

func (c *natsConsumer) ack(ctx context.Context) error { return c.ackAll() }
