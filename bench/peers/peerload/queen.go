// Queen, for queue-latency and timer-fire only (the Python generator drives its other workloads):
// its HTTP/1.1 queue API through net/http. Every producer and consumer has its own http.Client with its own
// Transport holding one keep-alive connection, so one client is one connection, as elsewhere.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// How long a pop parks on the server when nothing has arrived.
const queenParkMs = 1000

type queenTarget struct {
	cfg   config
	queue string // lq-<tag>; timer-fire: tq-<tag>, where the timers fire
	far   string // timer-fire: tfar-<tag>, holding the far-future timers; "" otherwise
	base  string // http://<endpoint>/api/v1
}

func newQueen(cfg config) *queenTarget {
	q := &queenTarget{cfg: cfg, queue: "lq-" + queueName(cfg.tag), base: "http://" + cfg.endpoint + "/api/v1"}
	if cfg.workload == timerFire {
		q.queue, q.far = "tq-"+queueName(cfg.tag), "tfar-"+queueName(cfg.tag)
	}
	return q
}

// queenClient: one keep-alive connection to Queen.
type queenClient struct {
	http *http.Client
	base string
}

func (q *queenTarget) client() *queenClient {
	transport := &http.Transport{MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true,
		IdleConnTimeout: time.Minute}
	return &queenClient{http: &http.Client{Transport: transport}, base: q.base}
}

// call sends a request and decodes the 200 answer into `answer`; any other status is a failure
// named after it.
func (c *queenClient) call(ctx context.Context, method, path string, body interface{}, answer interface{}) error {
	var reader io.Reader
	if body != nil {
		encoded, err := json.Marshal(body)
		if err != nil {
			return err
		}
		reader = bytes.NewReader(encoded)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, reader)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// Read the whole body even when it is not wanted, so the connection goes back for the next.
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return failure{"http_" + strconv.Itoa(resp.StatusCode), method + " " + path + ": " + string(data)}
	}
	if err := json.Unmarshal(data, answer); err != nil {
		return failure{"bad_answer", method + " " + path + ": " + string(data)}
	}
	return nil
}

func (c *queenClient) close() { c.http.CloseIdleConnections() }

func (q *queenTarget) prepare(ctx context.Context) error {
	c := q.client()
	defer c.close()
	body := map[string]interface{}{"queue": q.queue,
		"options": map[string]interface{}{"leaseTimeSeconds": 60, "maxSize": 100000000}}
	var answer struct {
		Configured bool `json:"configured"`
	}
	if err := c.call(ctx, http.MethodPost, "/configure", body, &answer); err != nil {
		return err
	}
	if !answer.Configured {
		return fmt.Errorf("queue %s not configured", q.queue)
	}
	if q.far != "" {
		return q.preloadTimers(ctx)
	}
	return nil
}

// teardown deletes the run's queue (and timer-fire's far queue: its pending timers go with it).
func (q *queenTarget) teardown(ctx context.Context) error {
	c := q.client()
	defer c.close()
	for _, queue := range []string{q.queue, q.far} {
		if queue == "" {
			continue
		}
		var answer interface{}
		if err := c.call(ctx, http.MethodDelete, "/resources/queues/"+url.PathEscape(queue), nil, &answer); err != nil {
			return err
		}
	}
	return nil
}

func (q *queenTarget) producer(ctx context.Context, index int) (producer, error) {
	return &queenProducer{target: q, client: q.client()}, nil
}

// queenProducer: each push is one POST of one item.
type queenProducer struct {
	target *queenTarget
	client *queenClient
}

type queenItem struct {
	Queue         string          `json:"queue"`
	Partition     string          `json:"partition"`
	Payload       json.RawMessage `json:"payload"`
	TransactionID string          `json:"transactionId"`
}

func (p *queenProducer) push(ctx context.Context, partition int, id string, due int64) error {
	body := map[string][]queenItem{"items": {{Queue: p.target.queue, Partition: "p" + strconv.Itoa(partition),
		Payload: latencyPayload(due), TransactionID: id}}}
	var answer []struct {
		Status string `json:"status"`
	}
	if err := p.client.call(ctx, http.MethodPost, "/push", body, &answer); err != nil {
		return err
	}
	if len(answer) != 1 || answer[0].Status != "queued" {
		return failure{"not_queued", fmt.Sprintf("%s: %+v", id, answer)}
	}
	return nil
}

func (p *queenProducer) close() { p.client.close() }

func (q *queenTarget) consumer(ctx context.Context, index int) (consumer, error) {
	path := fmt.Sprintf("/pop/queue/%s?batch=%d&waitMs=%d", url.PathEscape(q.queue), q.cfg.ops, queenParkMs)
	return &queenConsumer{client: q.client(), popPath: path}, nil
}

// queenAck: one message's acknowledgment, named by its partition, lease and offset.
type queenAck struct {
	PartitionID int64  `json:"partitionId"`
	LeaseID     int64  `json:"leaseId"`
	Offset      int64  `json:"offset"`
	Status      string `json:"status"`
}

// queenConsumer pops the queue (any partition Queen hands it), parking up to a second.
type queenConsumer struct {
	client  *queenClient
	popPath string
	acks    []queenAck // what the last pop delivered
}

func (c *queenConsumer) pop(ctx context.Context) ([]delivery, error) {
	var answer struct {
		Success  bool   `json:"success"`
		Reason   string `json:"reason"`
		Messages []struct {
			TransactionID string          `json:"transactionId"`
			PartitionID   int64           `json:"partitionId"`
			LeaseID       int64           `json:"leaseId"`
			Offset        int64           `json:"offset"`
			Data          json.RawMessage `json:"data"`
		} `json:"messages"`
	}
	c.acks = c.acks[:0]
	if err := c.client.call(ctx, http.MethodGet, c.popPath, nil, &answer); err != nil {
		return nil, err
	}
	if !answer.Success {
		if answer.Reason == "timeout" || answer.Reason == "empty" {
			return nil, nil // nothing arrived while parked: pop again
		}
		return nil, failure{"pop_failed", answer.Reason}
	}
	got := make([]delivery, len(answer.Messages))
	for i, m := range answer.Messages {
		due, err := dueOf(m.Data)
		if err != nil {
			return nil, err
		}
		got[i] = delivery{id: m.TransactionID, due: due}
		c.acks = append(c.acks, queenAck{PartitionID: m.PartitionID, LeaseID: m.LeaseID, Offset: m.Offset,
			Status: "completed"})
	}
	return got, nil
}

func (c *queenConsumer) ack(ctx context.Context) error {
	var answer []struct {
		Success bool `json:"success"`
	}
	body := map[string][]queenAck{"acknowledgments": c.acks}
	if err := c.client.call(ctx, http.MethodPost, "/ack/batch", body, &answer); err != nil {
		return err
	}
	if len(answer) != len(c.acks) {
		return failure{"ack_failed", fmt.Sprintf("%d answers to %d acks", len(answer), len(c.acks))}
	}
	for i, a := range answer {
		if !a.Success {
			return failure{"ack_failed", fmt.Sprintf("%+v", c.acks[i])}
		}
	}
	return nil
}

func (c *queenConsumer) close() { c.client.close() }
