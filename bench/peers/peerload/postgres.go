// PostgreSQL: the usual queue table with producer dedupe, popped with FOR UPDATE SKIP LOCKED (what
// Queen MQ runs on PostgreSQL). One pgx.Conn per client (not a pool), every statement autocommit:
// with synchronous_commit=on on the server, each push is one durable commit.
package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v4"
)

// The bench's PostgreSQL trusts user bench on 127.0.0.1.
const pgURL = "postgres://bench@%s/postgres?sslmode=disable"

// Rows per preload INSERT: few statements, none too large.
const pgPreloadRows = 1000

// The payload of queue-push and of the preload: the 32 bytes, as the jsonb column wants them.
const pgPayload = `{"v":"` + value + `"}`

type pgTarget struct {
	cfg     config
	table   string // q_<tag>
	channel string // lq_<tag>: queue-latency's inserts notify lq_<tag>_<consumer that owns the partition>
	insert  string // the multi-row INSERT of queue-push and the preload
}

func newPostgres(cfg config) *pgTarget {
	name := queueName(cfg.tag)
	table := "q_" + name
	return &pgTarget{cfg: cfg, table: table, channel: "lq_" + name,
		insert: "INSERT INTO " + table + " (partition, transaction_id, payload) " +
			"SELECT * FROM unnest($1::int[], $2::text[], $3::jsonb[]) ON CONFLICT (partition, transaction_id) DO NOTHING"}
}

func (p *pgTarget) connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.Connect(ctx, fmt.Sprintf(pgURL, p.cfg.endpoint))
}

// notifier: queue-latency's trigger function (and trigger), named after the table.
func (p *pgTarget) notifier() string { return p.table + "_notify" }

func (p *pgTarget) schema() []string {
	statements := []string{
		"CREATE TABLE " + p.table + " (id bigserial PRIMARY KEY, partition int NOT NULL, transaction_id text NOT NULL, " +
			"payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), lease_id bigint, " +
			"lease_until timestamptz, UNIQUE (partition, transaction_id))",
		"CREATE INDEX ON " + p.table + " (partition, id)",
	}
	if p.cfg.workload == txnStep {
		statements = append(statements, p.stepSchema()...)
	}
	if p.cfg.workload == queueLatency {
		// An inserted row wakes only the consumer that owns its partition (one channel each): a
		// single channel woke all 16 on every insert, and PostgreSQL then peaked at ~900 rows/s.
		statements = append(statements,
			"CREATE FUNCTION "+p.notifier()+"() RETURNS trigger LANGUAGE plpgsql AS "+
				fmt.Sprintf("$$ BEGIN PERFORM pg_notify('%s_' || (NEW.partition %% %d), ''); RETURN NULL; END $$",
					p.channel, p.cfg.connections),
			"CREATE TRIGGER "+p.notifier()+" AFTER INSERT ON "+p.table+
				" FOR EACH ROW EXECUTE FUNCTION "+p.notifier()+"()")
	}
	return statements
}

func (p *pgTarget) prepare(ctx context.Context) error {
	conn, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	for _, statement := range p.schema() {
		if _, err := conn.Exec(ctx, statement); err != nil {
			return err
		}
	}
	if p.cfg.workload == "queue-cycle" || p.cfg.workload == txnStep {
		return p.preload(ctx, conn)
	}
	return nil
}

func (p *pgTarget) teardown(ctx context.Context) error {
	conn, err := p.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS "+p.table+", "+p.nextTable()+", "+p.kvTable()); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "DROP FUNCTION IF EXISTS "+p.notifier()+"()")
	return err
}

// pgBatch: rows for the unnest INSERT, one array per column.
type pgBatch struct {
	partitions []int32
	ids        []string
	payloads   []string
}

func (b *pgBatch) add(partition int, id string) {
	b.partitions = append(b.partitions, int32(partition))
	b.ids = append(b.ids, id)
	b.payloads = append(b.payloads, pgPayload)
}

// store inserts a batch in one statement and answers how many rows it stored (a duplicate is not).
func (p *pgTarget) store(ctx context.Context, conn *pgx.Conn, b pgBatch) (int64, error) {
	tag, err := conn.Exec(ctx, p.insert, b.partitions, b.ids, b.payloads)
	return tag.RowsAffected(), err
}

// preload spreads -queue-preload messages evenly over the partitions, 1000 rows a statement.
func (p *pgTarget) preload(ctx context.Context, conn *pgx.Conn) error {
	total := p.cfg.queuePreload
	for start := 0; start < total; start += pgPreloadRows {
		var b pgBatch
		for m := start; m < start+pgPreloadRows && m < total; m++ {
			b.add(m%p.cfg.partitions, fmt.Sprintf("%s-pre-%d", p.cfg.tag, m))
		}
		stored, err := p.store(ctx, conn, b)
		if err != nil {
			return err
		}
		if stored != int64(len(b.ids)) {
			return fmt.Errorf("preload stored %d of %d rows", stored, len(b.ids))
		}
	}
	return nil
}

func (p *pgTarget) session(ctx context.Context, index int) (session, error) {
	conn, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	if p.cfg.workload == "queue-push" {
		return &pgPush{target: p, conn: conn, index: index}, nil
	}
	if p.cfg.workload == txnStep {
		return p.stepper(conn, index), nil
	}
	return &pgCycle{pgLeaser: p.leaser(conn, index)}, nil
}

// pgPush: each step is one INSERT of -ops rows, one durable commit.
type pgPush struct {
	target *pgTarget
	conn   *pgx.Conn
	index  int
	n      int
}

func (s *pgPush) setup(ctx context.Context) error   { return nil }
func (s *pgPush) owes() bool                        { return false }
func (s *pgPush) release(ctx context.Context) error { return nil }
func (s *pgPush) close()                            { s.conn.Close(context.Background()) }

func (s *pgPush) step(ctx context.Context, t *tally, counting bool) error {
	cfg := s.target.cfg
	var b pgBatch
	for i := 0; i < cfg.ops; i++ {
		b.add(pushPartition(cfg, s.index, s.n, i), itemID(cfg, s.index, s.n, i))
	}
	s.n++
	stored, err := s.target.store(ctx, s.conn, b)
	if err != nil {
		return err
	}
	if stored != int64(cfg.ops) {
		t.error("duplicate", fmt.Sprintf("%d of %d rows stored, the rest taken for duplicates: %s", stored, cfg.ops,
			b.ids[0]))
	}
	if counting {
		t.pending["messages"] += stored
	}
	return nil
}

// pgLeaser pops a client's own partitions and acks what it popped. Each pop leases its rows under
// a new lease id (client<<40 | n), so an ack deletes only rows this very pop still holds.
type pgLeaser struct {
	conn           *pgx.Conn
	popSQL, ackSQL string
	partitions     []int32
	limit          int
	preloaded      int
	index, n       int64
	lease          int64   // the last pop's
	ids            []int64 // the rows the last pop leased
}

func (p *pgTarget) leaser(conn *pgx.Conn, index int) pgLeaser {
	return pgLeaser{
		conn: conn,
		popSQL: "UPDATE " + p.table + " SET lease_id = $1, lease_until = now() + interval '60 seconds' " +
			"WHERE id IN (SELECT id FROM " + p.table + " WHERE partition = ANY($2) " +
			"AND (lease_until IS NULL OR lease_until < now()) ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED) " +
			"RETURNING id, payload",
		ackSQL:     "DELETE FROM " + p.table + " WHERE id = ANY($1) AND lease_id = $2",
		partitions: owned(index, p.cfg.connections, p.cfg.partitions),
		limit:      p.cfg.ops,
		preloaded:  p.cfg.queuePreload,
		index:      int64(index),
	}
}

// popRows leases up to `limit` rows of the client's partitions and answers their payloads.
func (l *pgLeaser) popRows(ctx context.Context) ([][]byte, error) {
	l.lease = l.index<<40 | l.n
	l.n++
	l.ids = l.ids[:0]
	rows, err := l.conn.Query(ctx, l.popSQL, l.lease, l.partitions, l.limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var payloads [][]byte
	for rows.Next() {
		var id int64
		var payload []byte
		if err := rows.Scan(&id, &payload); err != nil {
			return nil, err
		}
		l.ids = append(l.ids, id)
		payloads = append(payloads, payload)
	}
	return payloads, rows.Err()
}

// ackRows deletes the rows the last pop leased and answers how many it deleted.
func (l *pgLeaser) ackRows(ctx context.Context) (int64, error) {
	tag, err := l.conn.Exec(ctx, l.ackSQL, l.ids, l.lease)
	return tag.RowsAffected(), err
}

// lost: an ack that deleted fewer rows than the pop leased lost the rest's lease.
func (l *pgLeaser) lost(acked int64) error {
	if acked == int64(len(l.ids)) {
		return nil
	}
	return failure{"ack_lost", fmt.Sprintf("ack of lease %d deleted %d of %d rows", l.lease, acked, len(l.ids))}
}

func (l *pgLeaser) close() { l.conn.Close(context.Background()) }

// pgCycle: each step pops up to -ops rows of the client's partitions, then deletes them.
type pgCycle struct{ pgLeaser }

func (s *pgCycle) setup(ctx context.Context) error   { return nil }
func (s *pgCycle) owes() bool                        { return false }
func (s *pgCycle) release(ctx context.Context) error { return nil }

func (s *pgCycle) step(ctx context.Context, t *tally, counting bool) error {
	payloads, err := s.popRows(ctx)
	if err != nil {
		return err
	}
	if len(payloads) == 0 {
		if counting {
			t.pending["empty"]++
		}
		t.error("ran_dry", fmt.Sprintf("pop found nothing: the preload of %d messages is exhausted", s.preloaded))
		return nil
	}
	acked, err := s.ackRows(ctx)
	if err != nil {
		return err
	}
	if err := s.lost(acked); err != nil {
		t.fail(err)
	}
	if counting {
		t.pending["messages"] += acked
	}
	return nil
}

func (p *pgTarget) producer(ctx context.Context, index int) (producer, error) {
	conn, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	return &pgProducer{conn: conn, insert: "INSERT INTO " + p.table + " (partition, transaction_id, payload) " +
		"VALUES ($1, $2, $3) ON CONFLICT (partition, transaction_id) DO NOTHING"}, nil
}

// pgProducer: each push is a single-row INSERT, one durable commit.
type pgProducer struct {
	conn   *pgx.Conn
	insert string
}

func (p *pgProducer) push(ctx context.Context, partition int, id string, due int64) error {
	tag, err := p.conn.Exec(ctx, p.insert, int32(partition), id, string(latencyPayload(due)))
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return failure{"duplicate", id}
	}
	return nil
}

func (p *pgProducer) close() { p.conn.Close(context.Background()) }

func (p *pgTarget) consumer(ctx context.Context, index int) (consumer, error) {
	conn, err := p.connect(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("LISTEN %s_%d", p.channel, index)); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return &pgConsumer{pgLeaser: p.leaser(conn, index)}, nil
}

// pgConsumer pops its partitions; when they are empty it parks in LISTEN until an insert
// notifies (notifications that came while it was busy are queued on the connection, so none is
// missed) or a second passes.
type pgConsumer struct{ pgLeaser }

func (c *pgConsumer) pop(ctx context.Context) ([]delivery, error) {
	payloads, err := c.popRows(ctx)
	if err != nil {
		return nil, err
	}
	if len(payloads) == 0 {
		return nil, c.wait(ctx)
	}
	got := make([]delivery, len(payloads))
	for i, payload := range payloads {
		due, err := dueOf(payload)
		if err != nil {
			return nil, err
		}
		got[i] = delivery{id: strconv.FormatInt(c.ids[i], 10), due: due}
	}
	return got, nil
}

// wait parks until a notification or a second has passed; the second passing is no error.
func (c *pgConsumer) wait(ctx context.Context) error {
	parked, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := c.conn.WaitForNotification(parked)
	if parked.Err() != nil {
		return nil
	}
	if err != nil {
		return err
	}
	c.discardQueued()
	return nil
}

// discardQueued drops the notifications that came while the consumer was busy: the next pop sees
// every row they announce, so one pop answers them all. With a context already done,
// WaitForNotification hands out what is queued and then returns at once, without reading.
func (c *pgConsumer) discardQueued() {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for {
		if n, _ := c.conn.WaitForNotification(done); n == nil {
			return
		}
	}
}

func (c *pgConsumer) ack(ctx context.Context) error {
	acked, err := c.ackRows(ctx)
	if err != nil {
		return err
	}
	return c.lost(acked)
}
