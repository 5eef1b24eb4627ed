// What the queue workloads share: the partition layout, message ids and payloads, and the
// queue-latency run.
//
// queue-latency: C producers and C consumers, each with its own connection, over P partitions.
// Each push is one message. With -rate R > 0, producer j sends its k-th message when it is due,
// at start + (k*C + j)/R; a late producer sends at once but keeps the due time, so its lateness
// counts in the latency (no coordinated omission). With R == 0 a producer sends the next message
// the moment the last push is answered (closed loop: the peak). The payload carries the due time
// (closed loop: the send time) as nanoseconds since the process's epoch; a consumer's latency for
// a message is the time its pop answered minus that. Consumers park on the server when nothing
// has arrived, ack exactly what each pop delivered before the next, and go on past the window
// until every pushed message is delivered or the drain ends.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const queueLatency = "queue-latency"

// epoch: payloads carry times as nanoseconds since it; time.Since(epoch) is monotonic.
var epoch = time.Now()

// queueName: the run's tag as it may appear in a table, channel, stream or subject name.
func queueName(tag string) string {
	return strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			return r
		}
		return '_'
	}, strings.ToLower(tag))
}

// owned: the partitions consumer `index` of `count` takes from: p % count == index.
func owned(index, count, partitions int) []int32 {
	var mine []int32
	for p := index; p < partitions; p += count {
		mine = append(mine, int32(p))
	}
	return mine
}

// pushPartition: where item i of a client's n-th push goes, so consecutive items and clients
// spread over every partition.
func pushPartition(cfg config, client, n, i int) int {
	return (client + n*cfg.ops + i) % cfg.partitions
}

// itemID: a pushed message's producer id, unique in the run, what a broker dedupes on.
func itemID(cfg config, client, n, i int) string {
	return fmt.Sprintf("%s-%d-%d-%d", cfg.tag, client, n, i)
}

// latencyPayload: a queue-latency message's body, the same JSON for every system.
func latencyPayload(due int64) []byte {
	return []byte(fmt.Sprintf(`{"t":%d,"v":"%s"}`, due, value))
}

// dueOf reads the due time back from a latency payload.
func dueOf(payload []byte) (int64, error) {
	var doc struct {
		T *int64 `json:"t"`
	}
	if err := json.Unmarshal(payload, &doc); err != nil || doc.T == nil {
		return 0, failure{"bad_payload", string(payload)}
	}
	return *doc.T, nil
}

// producer pushes one message per call and answers once the system has stored it.
type producer interface {
	push(ctx context.Context, partition int, id string, due int64) error
	close()
}

// delivery: a message as a consumer got it: an id the system gives each message once (to spot a
// redelivery) and when it was due.
type delivery struct {
	id  string
	due int64
}

// consumer pops up to -ops messages of what has arrived, parking on the server for about a
// second when nothing has (then it answers none); ack settles exactly what the last pop delivered.
type consumer interface {
	pop(ctx context.Context) ([]delivery, error)
	ack(ctx context.Context) error
	close()
}

type latencyRun struct {
	cfg       config
	producers []producer
	consumers []consumer
	pushed    int64 // atomic: pushes the system confirmed, warm-up and drain included
	produced  chan struct{}
	mu        sync.Mutex
	delivered map[string]bool // every message delivered so far, by any consumer
}

func connectQueue(cfg config, tgt queueTarget) (*latencyRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	r := &latencyRun{cfg: cfg, produced: make(chan struct{}), delivered: map[string]bool{}}
	for i := 0; i < cfg.connections; i++ {
		p, err := tgt.producer(ctx, i)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("producer %d: %v", i, err)
		}
		r.producers = append(r.producers, p)
		c, err := tgt.consumer(ctx, i)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("consumer %d: %v", i, err)
		}
		r.consumers = append(r.consumers, c)
	}
	return r, nil
}

func (r *latencyRun) run(w window) (*tally, int64) {
	var producing, consuming sync.WaitGroup
	tallies := make([]*tally, 0, len(r.producers)+len(r.consumers))
	for j, p := range r.producers {
		t := newTally()
		tallies = append(tallies, t)
		producing.Add(1)
		go func(j int, p producer) {
			defer producing.Done()
			r.produce(j, p, t, w)
		}(j, p)
	}
	for _, c := range r.consumers {
		t := newTally()
		tallies = append(tallies, t)
		consuming.Add(1)
		go func(c consumer) {
			defer consuming.Done()
			r.consume(c, t, w)
		}(c)
	}
	producing.Wait()
	close(r.produced)
	consuming.Wait()
	return mergeAll(tallies), atomic.LoadInt64(&r.pushed) - int64(len(r.delivered))
}

// due: when producer j's k-th message is to be sent.
func (r *latencyRun) due(w window, j, k int) time.Time {
	if r.cfg.rate == 0 {
		return time.Now()
	}
	slot := float64(k*len(r.producers) + j)
	return w.start.Add(time.Duration(slot * float64(time.Second) / r.cfg.rate))
}

func (r *latencyRun) produce(j int, p producer, t *tally, w window) {
	ctx, cancel := context.WithDeadline(context.Background(), w.drainEnd())
	defer cancel()
	count := len(r.producers)
	for k := 0; ; k++ {
		due := r.due(w, j, k)
		if !due.Before(w.end) {
			return
		}
		time.Sleep(time.Until(due)) // a late producer sends at once, keeping the due time
		id := fmt.Sprintf("%s-%d-%d", r.cfg.tag, j, k)
		err := p.push(ctx, (j+k*count)%r.cfg.partitions, id, due.Sub(epoch).Nanoseconds())
		if err != nil {
			t.fail(err)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		atomic.AddInt64(&r.pushed, 1)
		if w.holds(time.Now()) {
			t.units["pushed"]++
		}
	}
}

func (r *latencyRun) consume(c consumer, t *tally, w window) {
	ctx, cancel := context.WithDeadline(context.Background(), w.drainEnd())
	defer cancel()
	for !r.drained() && ctx.Err() == nil {
		got, err := c.pop(ctx)
		arrived := time.Now()
		if err != nil {
			// A pop cut off by the drain's end is no error: what it left shows as undrained.
			if ctx.Err() == nil {
				t.fail(err)
			}
			continue
		}
		if len(got) == 0 {
			continue
		}
		r.count(got, arrived, t, w)
		if err := c.ack(ctx); err != nil && ctx.Err() == nil {
			t.fail(err)
		}
	}
}

// count files a pop's messages: latency and "messages" once per message, in the window only.
func (r *latencyRun) count(got []delivery, arrived time.Time, t *tally, w window) {
	now := arrived.Sub(epoch).Nanoseconds()
	inWindow := w.holds(arrived)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range got {
		if r.delivered[d.id] {
			if inWindow {
				t.units["redelivered"]++
			}
			continue
		}
		r.delivered[d.id] = true
		t.answered++
		if inWindow {
			t.completed++
			t.units["messages"]++
			t.record(now - d.due)
		}
	}
}

// drained: the producers have stopped and every message they pushed has been delivered.
func (r *latencyRun) drained() bool {
	select {
	case <-r.produced:
	default:
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.delivered)) >= atomic.LoadInt64(&r.pushed)
}

func (r *latencyRun) close() {
	for _, p := range r.producers {
		p.close()
	}
	for _, c := range r.consumers {
		c.close()
	}
}
