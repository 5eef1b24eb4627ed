// timer-fire (Queen only: no peer has durable timers): how late timers fire while many others are
// pending.
//
// Before the run, -timer-pending timers are scheduled an hour (and up to ten minutes more) ahead
// in the queue tfar-<tag>, 1024 per request: pending through the whole run, never due in it.
// During the run, timerProducers producers, each with its own connection, schedule timers in the
// queue tq-<tag>, -ops per request, paced as queue-latency paces its pushes: request k of
// producer j is sent at start + (k*P + j) * ops / rate (a late producer sends at once and keeps
// the schedule). Each timer of a request is set timerDelayMinMs..+timerDelaySpanMs ahead of the
// send, the delays spread evenly over the span, so that once the first span has passed -rate
// timers fall due per second. A timer's `at` (absolute ms on the wall clock the server's clock
// started from) and a serial number ride in its payload; the answer must say scheduled, at that
// `at`.
//
// -connections consumers, each with its own connection, long-poll tq-<tag> (-ops per pop,
// autoAck, parking up to a second) and go on past the window until every scheduled timer has been
// delivered or the drain ends. Per timer delivered in the window: the histogram gets its fire
// lateness, the fired message's createdAt minus its at, both the server's clock (ms, recorded as
// ms * 1e6 ns so the report's "ms" columns read as lateness in ms); the further histogram
// "delivery_lag" gets the pop answer's arrival on this process's wall clock minus at. A timer that
// fires before its at is an error ("early_fire"); one delivered twice counts as "redelivered".
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

const (
	timerFire         = "timer-fire"
	timerProducers    = 4
	timerDelayMinMs   = 200
	timerDelaySpanMs  = 800
	timerRateDefault  = 5000
	timerOpsMax       = 1024 // operations per timers call, the server's limit
	timerFarMs        = 3600000
	timerFarSpreadMs  = 600000
	timerPreloaders   = 4   // connections scheduling the far timers, each 1024 per request
	timerDelayStride  = 797 // coprime with timerDelaySpanMs: consecutive timers spread over the span
	timerLagHistogram = "delivery_lag"
)

type timerOp struct {
	Op        string          `json:"op"`
	Queue     string          `json:"queue"`
	Key       string          `json:"key"`
	Partition string          `json:"partition"`
	At        int64           `json:"at,omitempty"`
	DelayMs   int64           `json:"delayMs,omitempty"`
	Payload   json.RawMessage `json:"payload"`
}

type timerAnswer struct {
	Results []struct {
		Scheduled bool   `json:"scheduled"`
		Replaced  bool   `json:"replaced"`
		At        int64  `json:"at"`
		Reason    string `json:"reason"`
	} `json:"results"`
}

// schedule sends one timers call and checks that every timer was scheduled new, at the time asked
// (ats[i]; 0: not checked).
func (c *queenClient) schedule(ctx context.Context, ops []timerOp, ats []int64) error {
	var answer timerAnswer
	if err := c.call(ctx, http.MethodPost, "/timers", map[string][]timerOp{"operations": ops}, &answer); err != nil {
		return err
	}
	if len(answer.Results) != len(ops) {
		return failure{"not_scheduled", fmt.Sprintf("%d results for %d timers", len(answer.Results), len(ops))}
	}
	for i, r := range answer.Results {
		if !r.Scheduled || r.Replaced || (ats != nil && r.At != ats[i]) {
			return failure{"not_scheduled", fmt.Sprintf("%s: %+v (asked at %d)", ops[i].Key, r, ats[i])}
		}
	}
	return nil
}

// preloadTimers schedules -timer-pending far-future timers in the far queue, 1024 per request
// over timerPreloaders connections.
func (q *queenTarget) preloadTimers(ctx context.Context) error {
	total := q.cfg.timerPending
	requests := (total + timerOpsMax - 1) / timerOpsMax
	payload := json.RawMessage(`{"n":1}`)
	errs := make(chan error, timerPreloaders)
	var next int64 = -1
	for w := 0; w < timerPreloaders; w++ {
		go func() {
			c := q.client()
			defer c.close()
			for {
				r := int(atomic.AddInt64(&next, 1))
				if r >= requests {
					errs <- nil
					return
				}
				var ops []timerOp
				for m := r * timerOpsMax; m < (r+1)*timerOpsMax && m < total; m++ {
					ops = append(ops, timerOp{Op: "schedule", Queue: q.far, Key: "far-" + strconv.Itoa(m),
						Partition: "p" + strconv.Itoa(m%q.cfg.partitions), DelayMs: timerFarMs + int64(m%timerFarSpreadMs),
						Payload: payload})
				}
				if err := c.schedule(ctx, ops, nil); err != nil {
					errs <- fmt.Errorf("preloading far timers: %v", err)
					return
				}
			}
		}()
	}
	var first error
	for w := 0; w < timerPreloaders; w++ {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

type timerRun struct {
	cfg       config
	target    *queenTarget
	producers []*queenClient
	consumers []*queenClient
	rate      float64
	scheduled int64 // atomic: timers the server confirmed, warm-up and drain included
	produced  chan struct{}
	mu        sync.Mutex
	delivered map[int64]bool // serial numbers of every timer delivered so far
}

func connectTimers(cfg config, tgt *queenTarget) (*timerRun, error) {
	r := &timerRun{cfg: cfg, target: tgt, rate: cfg.rate, produced: make(chan struct{}), delivered: map[int64]bool{}}
	if r.rate == 0 {
		r.rate = timerRateDefault
	}
	for i := 0; i < timerProducers; i++ {
		r.producers = append(r.producers, tgt.client())
	}
	for i := 0; i < cfg.connections; i++ {
		r.consumers = append(r.consumers, tgt.client())
	}
	return r, nil
}

func (r *timerRun) run(w window) (*tally, int64) {
	var producing, consuming sync.WaitGroup
	var tallies []*tally
	for j, c := range r.producers {
		t := newTally()
		tallies = append(tallies, t)
		producing.Add(1)
		go func(j int, c *queenClient) {
			defer producing.Done()
			r.produce(j, c, t, w)
		}(j, c)
	}
	for _, c := range r.consumers {
		t := newTally()
		tallies = append(tallies, t)
		consuming.Add(1)
		go func(c *queenClient) {
			defer consuming.Done()
			r.consume(c, t, w)
		}(c)
	}
	producing.Wait()
	close(r.produced)
	consuming.Wait()
	r.mu.Lock()
	delivered := int64(len(r.delivered))
	r.mu.Unlock()
	return mergeAll(tallies), atomic.LoadInt64(&r.scheduled) - delivered
}

func (r *timerRun) produce(j int, c *queenClient, t *tally, w window) {
	ctx, cancel := context.WithDeadline(context.Background(), w.drainEnd())
	defer cancel()
	ops := r.cfg.ops
	count := len(r.producers)
	batch := make([]timerOp, ops)
	ats := make([]int64, ops)
	for k := 0; ; k++ {
		request := k*count + j
		due := w.start.Add(time.Duration(float64(request*ops) * float64(time.Second) / r.rate))
		if !due.Before(w.end) {
			return
		}
		time.Sleep(time.Until(due))
		now := time.Now().UnixNano() / int64(time.Millisecond)
		for i := 0; i < ops; i++ {
			serial := int64(request*ops + i)
			delay := timerDelayMinMs + (serial*timerDelayStride)%timerDelaySpanMs
			ats[i] = now + delay
			batch[i] = timerOp{Op: "schedule", Queue: r.target.queue, Key: "t" + strconv.FormatInt(serial, 10),
				Partition: "p" + strconv.FormatInt(serial%int64(r.cfg.partitions), 10), At: ats[i],
				Payload: json.RawMessage(fmt.Sprintf(`{"at":%d,"n":%d}`, ats[i], serial))}
		}
		sent := time.Now()
		err := c.schedule(ctx, batch, ats)
		done := time.Now()
		if err != nil {
			t.fail(err)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		atomic.AddInt64(&r.scheduled, int64(ops))
		if w.holds(done) {
			t.units["scheduled"] += int64(ops)
			t.hist("schedule_rtt").record(done.Sub(sent).Nanoseconds())
		}
	}
}

type timerPop struct {
	Success  bool   `json:"success"`
	Reason   string `json:"reason"`
	Messages []struct {
		CreatedAt int64 `json:"createdAt"`
		Data      struct {
			At *int64 `json:"at"`
			N  int64  `json:"n"`
		} `json:"data"`
	} `json:"messages"`
}

func (r *timerRun) consume(c *queenClient, t *tally, w window) {
	ctx, cancel := context.WithDeadline(context.Background(), w.drainEnd())
	defer cancel()
	path := fmt.Sprintf("/pop/queue/%s?batch=%d&waitMs=%d&autoAck=true", url.PathEscape(r.target.queue), r.cfg.ops,
		queenParkMs)
	for !r.drained() && ctx.Err() == nil {
		var answer timerPop
		err := c.call(ctx, http.MethodGet, path, nil, &answer)
		arrived := time.Now()
		if err != nil {
			if ctx.Err() == nil { // a pop cut off by the drain's end is no error: what it left is undrained
				t.fail(err)
			}
			continue
		}
		if !answer.Success {
			if answer.Reason != "timeout" && answer.Reason != "empty" {
				t.error("pop_failed", answer.Reason)
			}
			continue
		}
		r.count(&answer, arrived, t, w)
	}
}

// count files a pop's fired timers: lateness, delivery lag and "fires", in the window only.
func (r *timerRun) count(answer *timerPop, arrived time.Time, t *tally, w window) {
	arrivedNs := arrived.UnixNano()
	inWindow := w.holds(arrived)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range answer.Messages {
		if m.Data.At == nil {
			t.error("bad_payload", fmt.Sprintf("a fired message without its at: %+v", m))
			continue
		}
		at := *m.Data.At
		if r.delivered[m.Data.N] {
			if inWindow {
				t.units["redelivered"]++
			}
			continue
		}
		r.delivered[m.Data.N] = true
		t.answered++
		late := m.CreatedAt - at
		if late < 0 {
			t.error("early_fire", fmt.Sprintf("timer %d fired at %d, %d ms before its at %d", m.Data.N, m.CreatedAt,
				-late, at))
			continue
		}
		if inWindow {
			t.completed++
			t.units["fires"]++
			t.record(late * int64(time.Millisecond))
			lag := arrivedNs - at*int64(time.Millisecond)
			if lag < 0 {
				lag = 0
			}
			t.hist(timerLagHistogram).record(lag)
		}
	}
}

// drained: the producers have stopped and every timer they scheduled has been delivered.
func (r *timerRun) drained() bool {
	select {
	case <-r.produced:
	default:
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(len(r.delivered)) >= atomic.LoadInt64(&r.scheduled)
}

func (r *timerRun) close() {
	for _, c := range r.producers {
		c.close()
	}
	for _, c := range r.consumers {
		c.close()
	}
}
