// Redis streams, for queue-latency only (the Python generator drives its other workloads): one
// stream per partition, lq:<tag>:<p>, each with consumer group "g"; consumer i reads the streams
// of the partitions it owns. One redigo connection per producer and per consumer.
package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/gomodule/redigo/redis"
)

const (
	redisGroup = "g"
	// How long XREADGROUP parks when nothing has arrived, in ms.
	redisParkMs = 1000
)

type redisTarget struct {
	cfg  config
	name string // the tag, as stream keys carry it
}

func newRedis(cfg config) *redisTarget { return &redisTarget{cfg: cfg, name: queueName(cfg.tag)} }

func (r *redisTarget) key(partition int) string { return fmt.Sprintf("lq:%s:%d", r.name, partition) }

func (r *redisTarget) dial() (redis.Conn, error) { return redis.Dial("tcp", r.cfg.endpoint) }

// each sends one command per partition in a pipeline and checks every answer.
func (r *redisTarget) each(command func(key string) []interface{}) error {
	conn, err := r.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	for p := 0; p < r.cfg.partitions; p++ {
		args := command(r.key(p))
		if err := conn.Send(args[0].(string), args[1:]...); err != nil {
			return err
		}
	}
	if err := conn.Flush(); err != nil {
		return err
	}
	for p := 0; p < r.cfg.partitions; p++ {
		if _, err := conn.Receive(); err != nil {
			return err
		}
	}
	return nil
}

// prepare makes every partition's stream and group; "$": the group starts at the stream's end.
func (r *redisTarget) prepare(ctx context.Context) error {
	return r.each(func(key string) []interface{} {
		return []interface{}{"XGROUP", "CREATE", key, redisGroup, "$", "MKSTREAM"}
	})
}

func (r *redisTarget) teardown(ctx context.Context) error {
	return r.each(func(key string) []interface{} { return []interface{}{"DEL", key} })
}

func (r *redisTarget) producer(ctx context.Context, index int) (producer, error) {
	conn, err := r.dial()
	if err != nil {
		return nil, err
	}
	return &redisProducer{target: r, conn: conn}, nil
}

// redisProducer: each push is one XADD (appendfsync always: answered once it is on disk).
type redisProducer struct {
	target *redisTarget
	conn   redis.Conn
}

func (p *redisProducer) push(ctx context.Context, partition int, id string, due int64) error {
	_, err := redis.String(p.conn.Do("XADD", p.target.key(partition), "*", "t", due, "v", value))
	return err
}

func (p *redisProducer) close() { p.conn.Close() }

func (r *redisTarget) consumer(ctx context.Context, index int) (consumer, error) {
	conn, err := r.dial()
	if err != nil {
		return nil, err
	}
	var keys []interface{}
	var cursors []interface{}
	for _, p := range owned(index, r.cfg.connections, r.cfg.partitions) {
		keys = append(keys, r.key(int(p)))
		cursors = append(cursors, ">") // only entries never delivered to the group
	}
	args := []interface{}{"GROUP", redisGroup, fmt.Sprintf("c%d", index), "COUNT", r.cfg.ops, "BLOCK", redisParkMs,
		"STREAMS"}
	return &redisConsumer{conn: conn, args: append(append(args, keys...), cursors...)}, nil
}

// redisConsumer: one XREADGROUP over all its streams, parking up to a second; COUNT bounds each
// stream's share, not the sum.
type redisConsumer struct {
	conn    redis.Conn
	args    []interface{}   // XREADGROUP's, the same every pop
	entries []streamEntries // what the last pop delivered, stream by stream
}

// streamEntries: the entry ids one stream delivered.
type streamEntries struct {
	key string
	ids []string
}

func (c *redisConsumer) pop(ctx context.Context) ([]delivery, error) {
	c.entries = c.entries[:0]
	streams, err := redis.Values(c.conn.Do("XREADGROUP", c.args...))
	if err == redis.ErrNil {
		return nil, nil // nothing arrived while parked
	}
	if err != nil {
		return nil, err
	}
	var got []delivery
	for _, stream := range streams {
		delivered, err := c.read(stream)
		if err != nil {
			return nil, err
		}
		got = append(got, delivered...)
	}
	return got, nil
}

// read parses one stream of an XREADGROUP answer: [key, [[id, [field, value, ...]], ...]].
func (c *redisConsumer) read(stream interface{}) ([]delivery, error) {
	pair, err := redis.Values(stream, nil)
	if err != nil || len(pair) != 2 {
		return nil, failure{"bad_answer", fmt.Sprintf("XREADGROUP stream %v", stream)}
	}
	key, err := redis.String(pair[0], nil)
	if err != nil {
		return nil, err
	}
	entries, err := redis.Values(pair[1], nil)
	if err != nil {
		return nil, err
	}
	got := make([]delivery, 0, len(entries))
	delivered := streamEntries{key: key}
	for _, entry := range entries {
		fields, err := redis.Values(entry, nil)
		if err != nil || len(fields) != 2 {
			return nil, failure{"bad_answer", fmt.Sprintf("XREADGROUP entry %v", entry)}
		}
		id, err := redis.String(fields[0], nil)
		if err != nil {
			return nil, err
		}
		values, err := redis.StringMap(fields[1], nil)
		if err != nil {
			return nil, err
		}
		due, err := strconv.ParseInt(values["t"], 10, 64)
		if err != nil {
			return nil, failure{"bad_payload", fmt.Sprintf("%s %s: %v", key, id, values)}
		}
		delivered.ids = append(delivered.ids, id)
		got = append(got, delivery{id: key + "/" + id, due: due})
	}
	c.entries = append(c.entries, delivered)
	return got, nil
}

// ack sends one XACK per stream that delivered, pipelined, and checks each acked all its entries.
func (c *redisConsumer) ack(ctx context.Context) error {
	for _, stream := range c.entries {
		args := []interface{}{stream.key, redisGroup}
		for _, id := range stream.ids {
			args = append(args, id)
		}
		if err := c.conn.Send("XACK", args...); err != nil {
			return err
		}
	}
	if err := c.conn.Flush(); err != nil {
		return err
	}
	// Read every answer, even past a failed one, so the next command reads its own.
	var failed error
	for _, stream := range c.entries { // answers come in the order the XACKs went
		acked, err := redis.Int(c.conn.Receive())
		if err == nil && acked != len(stream.ids) {
			err = failure{"ack_lost", fmt.Sprintf("XACK %s acked %d of %d", stream.key, acked, len(stream.ids))}
		}
		if failed == nil {
			failed = err
		}
	}
	return failed
}

func (c *redisConsumer) close() { c.conn.Close() }
