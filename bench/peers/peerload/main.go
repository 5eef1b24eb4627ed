// peerload drives the systems `python -m bench` compares Queen with (etcd, PostgreSQL, NATS
// JetStream, Redis) and, for queue-latency, Queen itself, in the same shape as the Python
// generator: C clients, each with its own connection, a warm-up, a measured window, and a drain.
//
// It is Go with each system's own client library because a Python client through etcd's JSON
// gateway measured at half the rate of a Go clientv3 loader on these machines: the loader must not
// handicap the system it drives. It builds offline against Debian's packaged sources under
// /usr/share/gocode with GO111MODULE=off; see build_peerload.sh.
//
// Protocol with bench/peers/loader.py: flags say what to run; the loader prepares the system (a
// queue workload's table or stream, and its preload), connects and sets up every client, prints
// "ready" on stdout, waits for one line "<warm-up ms> <measured ms>" on stdin, starts 100 ms later,
// and at the end prints one JSON document in the shape of the Python generator's Tally (histogram
// buckets in the layout of bench/histogram.py, so the two merge and print alike).
//
// Three shapes of run. Closed loop (every workload but queue-latency and timer-fire): each client
// keeps exactly one request outstanding, and the histogram holds request latencies. queue-latency
// (queue.go): producers and consumers, and the histogram holds each message's push-to-delivery
// latency. timer-fire (timer.go, Queen only): paced producers schedule timers, consumers take
// what they fire, and the histogram holds each timer's fire lateness.
// Each system lives in its own file: etcd.go, postgres.go (txn-step in txnstep.go), nats.go,
// queen.go (timer-fire in timer.go), redis.go.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/bits"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

const (
	subBits      = 8
	valueBitsMax = 40
	buckets      = (1 << subBits) + (valueBitsMax-subBits)*(1<<(subBits-1))
	errorSamples = 5
	drain        = 10 * time.Second
	value        = "vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv"
	// Python waits 300 s for "ready"; preparing (a large queue preload) must end before that.
	prepareTimeout = 240 * time.Second
	setupTimeout   = 60 * time.Second
	startDelay     = 100 * time.Millisecond
)

// Workloads per system, in the order -help lists them.
var workloads = map[string][]string{
	"etcd":     {"lock-cycle", "lock-renew", "lock-hot", "sem8", "kv-put", "kv-get", "kv-cas", "txn-guarded"},
	"postgres": {"queue-push", "queue-cycle", queueLatency, txnStep},
	"nats":     {"queue-push", "queue-cycle", queueLatency},
	"queen":    {queueLatency, timerFire},
	"redis":    {queueLatency},
}

// The port each system listens on by default, for -endpoint left unset.
var defaultPorts = map[string]string{"etcd": "2379", "postgres": "5432", "nats": "4222", "queen": "6711",
	"redis": "6379"}

func bucketOf(v int64) int {
	b := bits.Len64(uint64(v))
	if b <= subBits {
		return int(v)
	}
	if b > valueBitsMax {
		return buckets - 1
	}
	shift := b - subBits
	half := 1 << (subBits - 1)
	return (1 << subBits) + (shift-1)*half + int(v>>uint(shift)) - half
}

type tally struct {
	counts     []int64
	total, sum int64
	min, max   int64
	completed  int64
	answered   int64
	errors     map[string]int64
	samples    []string
	units      map[string]int64 // counted inside the window
	pending    map[string]int64 // counted by the last step, not yet placed in or out of the window
	// Further histograms by name beside the main one (timer-fire: delivery lag); only their
	// buckets are used.
	hists map[string]*tally
}

func newTally() *tally {
	return &tally{counts: make([]int64, buckets), min: -1, errors: map[string]int64{}, units: map[string]int64{},
		pending: map[string]int64{}, hists: map[string]*tally{}}
}

// hist: the named further histogram, made on first use.
func (t *tally) hist(name string) *tally {
	h, ok := t.hists[name]
	if !ok {
		h = newTally()
		t.hists[name] = h
	}
	return h
}

func (t *tally) record(ns int64) {
	t.counts[bucketOf(ns)]++
	t.total++
	t.sum += ns
	if t.min < 0 || ns < t.min {
		t.min = ns
	}
	if ns > t.max {
		t.max = ns
	}
}

func (t *tally) error(kind string, sample string) {
	t.errors[kind]++
	if len(t.samples) < errorSamples {
		if len(sample) > 300 {
			sample = sample[:300]
		}
		t.samples = append(t.samples, kind+": "+sample)
	}
}

// fail files an error under its kind: a failure names its own, anything else is a failed call.
func (t *tally) fail(err error) {
	var f failure
	if errors.As(err, &f) {
		t.error(f.kind, f.detail)
		return
	}
	t.error("rpc_error", err.Error())
}

func (t *tally) merge(o *tally) {
	for i, c := range o.counts {
		t.counts[i] += c
	}
	t.total += o.total
	t.sum += o.sum
	if o.min >= 0 && (t.min < 0 || o.min < t.min) {
		t.min = o.min
	}
	if o.max > t.max {
		t.max = o.max
	}
	t.completed += o.completed
	t.answered += o.answered
	for k, v := range o.errors {
		t.errors[k] += v
	}
	for _, s := range o.samples {
		if len(t.samples) < errorSamples {
			t.samples = append(t.samples, s)
		}
	}
	for k, v := range o.units {
		t.units[k] += v
	}
	for name, h := range o.hists {
		t.hist(name).merge(h)
	}
}

// failure is an answer the system gave that is not what was asked (a duplicate, a lost ack), where
// a plain error is a call that failed.
type failure struct{ kind, detail string }

func (f failure) Error() string { return f.kind + ": " + f.detail }

type config struct {
	system, endpoint, workload, tag string
	ops, connections, keys          int
	partitions, queuePreload        int
	timerPending                    int     // timer-fire: far-future timers pending while it measures
	rate                            float64 // queue-latency: messages per second over all producers; 0 = closed loop
	warmup, duration                time.Duration
	leaseTTL                        int64
}

// A client's conversation: step sends one request (which may depend on the last answer) and
// counts what it achieved when counting is true; owes says it holds something to give back.
type session interface {
	setup(ctx context.Context) error
	step(ctx context.Context, t *tally, counting bool) error
	owes() bool
	release(ctx context.Context) error
	close()
}

// A system made ready for one workload: prepare runs once before any client connects (a queue's
// table or stream, its preload); teardown once after the drain, to remove what prepare made.
type target interface {
	prepare(ctx context.Context) error
	teardown(ctx context.Context) error
}

// closedTarget serves the closed-loop workloads: one connected session per client.
type closedTarget interface {
	target
	session(ctx context.Context, index int) (session, error)
}

// queueTarget serves queue-latency: producers and consumers, each with its own connection.
type queueTarget interface {
	target
	producer(ctx context.Context, index int) (producer, error)
	consumer(ctx context.Context, index int) (consumer, error)
}

func newTarget(cfg config) target {
	switch cfg.system {
	case "etcd":
		return etcdTarget{cfg: cfg}
	case "postgres":
		return newPostgres(cfg)
	case "nats":
		return newNats(cfg)
	case "queen":
		return newQueen(cfg)
	}
	return newRedis(cfg)
}

// window: the run's clock, set when the line on stdin arrives.
type window struct{ start, measure, end time.Time }

// holds says whether an answer at `at` counts: inside [measure, end), as in the Python generator.
func (w window) holds(at time.Time) bool { return !at.Before(w.measure) && at.Before(w.end) }

func (w window) drainEnd() time.Time { return w.end.Add(drain) }

// A run's clients, connected and set up: run drives them through the window and returns their
// merged tally and what the system still held undelivered at the end.
type clients interface {
	run(w window) (*tally, int64)
	close()
}

type closedRun struct{ sessions []session }

func connectClosed(cfg config, tgt closedTarget) (*closedRun, error) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	r := &closedRun{}
	for i := 0; i < cfg.connections; i++ {
		s, err := tgt.session(ctx, i)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("connect: %v", err)
		}
		r.sessions = append(r.sessions, s)
		if err := s.setup(ctx); err != nil {
			r.close()
			return nil, fmt.Errorf("setup: %v", err)
		}
	}
	return r, nil
}

func (r *closedRun) run(w window) (*tally, int64) {
	tallies := make([]*tally, len(r.sessions))
	var wg sync.WaitGroup
	for i, s := range r.sessions {
		tallies[i] = newTally()
		wg.Add(1)
		go func(s session, t *tally) {
			defer wg.Done()
			runSession(s, t, w)
		}(s, tallies[i])
	}
	wg.Wait()
	return mergeAll(tallies), 0
}

// runSession: one request outstanding until the window ends, and on while the session owes a
// release, up to the drain's end.
func runSession(s session, t *tally, w window) {
	ctx, cancel := context.WithDeadline(context.Background(), w.drainEnd())
	defer cancel()
	for time.Now().Before(w.end) || s.owes() {
		sent := time.Now()
		err := s.step(ctx, t, true)
		done := time.Now()
		// An answer counts when it completes inside the window, as in the Python generator: what
		// the step counted moves into the tally only then.
		inWindow := w.holds(done)
		for k, v := range t.pending {
			if inWindow {
				t.units[k] += v
			}
			delete(t.pending, k)
		}
		if err != nil {
			t.fail(err)
			if ctx.Err() != nil {
				break
			}
			continue
		}
		t.answered++
		if inWindow {
			t.completed++
			t.record(done.Sub(sent).Nanoseconds())
		}
	}
}

func (r *closedRun) close() {
	for _, s := range r.sessions {
		s.close()
	}
}

func mergeAll(tallies []*tally) *tally {
	merged := newTally()
	for _, t := range tallies {
		merged.merge(t)
	}
	return merged
}

type output struct {
	Histogram    map[string]interface{} `json:"histogram"`
	Completed    int64                  `json:"completed"`
	Answered     int64                  `json:"answered"`
	Errors       map[string]int64       `json:"errors"`
	ErrorSamples []string               `json:"error_samples"`
	Bytes        int64                  `json:"bytes_received"`
	Undrained    int64                  `json:"undrained"`
	Units        map[string]int64       `json:"units"`
	Histograms   map[string]interface{} `json:"histograms,omitempty"`
	WindowMs     [2]int64               `json:"window_ms"` // the warm-up and window used, checked by the caller
}

// wireHistogram: a tally's buckets in the shape of bench/histogram.py's to_wire.
func wireHistogram(t *tally) map[string]interface{} {
	hist := map[string]int64{}
	for i, c := range t.counts {
		if c != 0 {
			hist[fmt.Sprint(i)] = c
		}
	}
	var min, max interface{}
	if t.total > 0 {
		min, max = t.min, t.max
	}
	return map[string]interface{}{"buckets": hist, "total": t.total, "min": min, "max": max, "sum": t.sum,
		"sub_bits": subBits}
}

func emit(cfg config, merged *tally, undrained int64) {
	out := output{
		Histogram: wireHistogram(merged),
		Completed: merged.completed, Answered: merged.answered, Errors: merged.errors,
		ErrorSamples: merged.samples, Undrained: undrained, Units: merged.units,
		WindowMs: [2]int64{cfg.warmup.Milliseconds(), cfg.duration.Milliseconds()},
	}
	if len(merged.hists) > 0 {
		out.Histograms = map[string]interface{}{}
		for name, h := range merged.hists {
			out.Histograms[name] = wireHistogram(h)
		}
	}
	if out.ErrorSamples == nil {
		out.ErrorSamples = []string{}
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("%v", err)
	}
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "peerload: "+format+"\n", args...)
	os.Exit(2)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func usageWorkloads() string {
	systems := make([]string, 0, len(workloads))
	for s := range workloads {
		systems = append(systems, s)
	}
	sort.Strings(systems)
	var lines []string
	for _, s := range systems {
		lines = append(lines, s+": "+strings.Join(workloads[s], ", "))
	}
	return strings.Join(lines, "; ")
}

func parseFlags() (cfg config, doPreload bool) {
	var warmupMs, durationMs int
	flag.StringVar(&cfg.system, "system", "etcd", "system to drive: etcd, postgres, nats, queen, redis")
	flag.StringVar(&cfg.endpoint, "endpoint", "", "host:port of the system (127.0.0.1 only; default: its usual port)")
	flag.StringVar(&cfg.workload, "workload", "lock-cycle", "per system: "+usageWorkloads())
	flag.StringVar(&cfg.tag, "tag", "r", "run tag, unique per run: lock names, CAS keys, queue names carry it")
	flag.IntVar(&cfg.ops, "ops", 1, "operations per request (queue-latency: the consumers' pop batch)")
	flag.IntVar(&cfg.connections, "connections", 16, "clients, each with its own connection "+
		"(queue-latency: this many producers and as many consumers)")
	flag.IntVar(&cfg.keys, "keys", 10000, "distinct KV keys (etcd)")
	flag.IntVar(&cfg.partitions, "partitions", 64, "queue partitions")
	flag.IntVar(&cfg.queuePreload, "queue-preload", 0, "messages put in the queue before the run (queue-cycle)")
	flag.Float64Var(&cfg.rate, "rate", 0, "queue-latency: messages per second over all producers; 0 = closed loop; "+
		"timer-fire: timers falling due per second (0: 5000)")
	flag.IntVar(&cfg.timerPending, "timer-pending", 10000, "timer-fire: far-future timers scheduled before the run, "+
		"pending while it measures")
	flag.IntVar(&warmupMs, "warmup-ms", 2000, "warm-up before measuring (stdin may say otherwise)")
	flag.IntVar(&durationMs, "duration-ms", 10000, "measured window (stdin may say otherwise)")
	flag.BoolVar(&doPreload, "preload", false, "etcd: write every key once, then exit")
	flag.Parse()
	cfg.warmup = time.Duration(warmupMs) * time.Millisecond
	cfg.duration = time.Duration(durationMs) * time.Millisecond
	if cfg.endpoint == "" {
		cfg.endpoint = "127.0.0.1:" + defaultPorts[cfg.system]
	}
	if err := validate(cfg, doPreload); err != nil {
		fail("%v", err)
	}
	return cfg, doPreload
}

func validate(cfg config, doPreload bool) error {
	if host, _, err := net.SplitHostPort(cfg.endpoint); err != nil || host != "127.0.0.1" {
		return fmt.Errorf("only 127.0.0.1 endpoints, not %q", cfg.endpoint)
	}
	supported, ok := workloads[cfg.system]
	if !ok {
		return fmt.Errorf("unknown system %q", cfg.system)
	}
	if doPreload {
		if cfg.system != "etcd" {
			return fmt.Errorf("-preload is for etcd's KV keys")
		}
		return nil
	}
	if !contains(supported, cfg.workload) {
		return fmt.Errorf("%s has no workload %q (it has %s)", cfg.system, cfg.workload, strings.Join(supported, ", "))
	}
	if cfg.ops < 1 || cfg.connections < 1 || cfg.partitions < 1 || cfg.queuePreload < 0 || cfg.rate < 0 ||
		cfg.timerPending < 0 {
		return fmt.Errorf("-ops, -connections and -partitions must be positive, -queue-preload, -rate and " +
			"-timer-pending not negative")
	}
	if cfg.workload == timerFire && cfg.ops > timerOpsMax {
		return fmt.Errorf("timer-fire schedules at most %d timers per request", timerOpsMax)
	}
	// A consumer owns the partitions p with p % connections == its index: each must own one.
	if (cfg.workload == "queue-cycle" || cfg.workload == queueLatency || cfg.workload == txnStep) &&
		cfg.connections > cfg.partitions {
		return fmt.Errorf("%d consumers over %d partitions: each consumer must own a partition at least",
			cfg.connections, cfg.partitions)
	}
	return nil
}

func connectClients(cfg config, tgt target) (clients, error) {
	if cfg.workload == queueLatency {
		return connectQueue(cfg, tgt.(queueTarget))
	}
	if cfg.workload == timerFire {
		return connectTimers(cfg, tgt.(*queenTarget))
	}
	return connectClosed(cfg, tgt.(closedTarget))
}

// readWindow: the window comes on stdin as "<warm-up ms> <measured ms>"; the flags' values stand
// otherwise.
func readWindow(cfg *config) window {
	var warmupMs, durationMs int
	if n, _ := fmt.Scanln(&warmupMs, &durationMs); n == 2 {
		cfg.warmup = time.Duration(warmupMs) * time.Millisecond
		cfg.duration = time.Duration(durationMs) * time.Millisecond
	}
	start := time.Now().Add(startDelay)
	measure := start.Add(cfg.warmup)
	return window{start: start, measure: measure, end: measure.Add(cfg.duration)}
}

func main() {
	cfg, doPreload := parseFlags()
	if doPreload {
		if err := preload(cfg); err != nil {
			fail("preload: %v", err)
		}
		return
	}
	// etcd's leases outlive the whole run as the flags give it.
	cfg.leaseTTL = int64((cfg.warmup+cfg.duration+drain)/time.Second) + 60

	tgt := newTarget(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), prepareTimeout)
	err := tgt.prepare(ctx)
	cancel()
	if err != nil {
		teardown(tgt) // what prepare made before it failed
		fail("prepare: %v", err)
	}
	conns, err := connectClients(cfg, tgt)
	if err != nil {
		teardown(tgt)
		fail("%v", err)
	}
	fmt.Println("ready")
	w := readWindow(&cfg)
	time.Sleep(time.Until(w.start))
	merged, undrained := conns.run(w)
	conns.close()
	teardown(tgt)
	emit(cfg, merged, undrained)
}

// teardown removes the run's queue; a failure there is the operator's to see, not the run's.
func teardown(tgt target) {
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	if err := tgt.teardown(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "peerload: teardown: %v\n", err)
	}
}
