// txn-step on PostgreSQL: a workflow step as a PostgreSQL user writes it, one SQL transaction per
// step. Queen's side (Python generator, bench/queue_sessions.py QueenTxnStep) pops up to -ops
// messages under a lease, then sends one transaction that acks them, pushes each one's successor
// to a second queue and upserts a KV row per message.
//
// Here, on the queue-cycle table and preload (postgres.go), client i owning the partitions
// p % C == i:
//
//	BEGIN; SELECT id, transaction_id, partition, payload .. FOR UPDATE SKIP LOCKED LIMIT ops   (one round trip)
//	INSERT INTO qn_<tag> the successors (producer id = popped id + "-next", ON CONFLICT DO NOTHING);
//	INSERT INTO kv_<tag> .. ON CONFLICT (ns, key) DO UPDATE (value, version + 1);
//	DELETE the popped rows; COMMIT                                                              (one round trip)
//
// The row locks of FOR UPDATE hold the popped rows for the step (PostgreSQL's lease), and the
// commit answers after its WAL is fsynced (synchronous_commit=on): one durable commit per step,
// every statement pipelined, so the peer does no more round trips than it must. The KV keys follow
// the Python side's layout (bench/sessions.py key_groups): client i walks its own stretch of the
// -keys key space, -ops keys per step, so rows stay bounded and clients never touch one row.
package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v4"
)

const (
	txnStep = "txn-step"
	txnNS   = "orders"
	// Key groups a client cycles through, as the Python side's key_groups(ctx, 64).
	txnKeyGroups = 64
)

func (p *pgTarget) nextTable() string { return "qn_" + queueName(p.cfg.tag) }
func (p *pgTarget) kvTable() string   { return "kv_" + queueName(p.cfg.tag) }

// stepSchema: the successors' queue (the queue table's shape) and the KV table.
func (p *pgTarget) stepSchema() []string {
	return []string{
		"CREATE TABLE " + p.nextTable() + " (id bigserial PRIMARY KEY, partition int NOT NULL, " +
			"transaction_id text NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), " +
			"lease_id bigint, lease_until timestamptz, UNIQUE (partition, transaction_id))",
		"CREATE INDEX ON " + p.nextTable() + " (partition, id)",
		"CREATE TABLE " + p.kvTable() + " (ns text NOT NULL, key text NOT NULL, value jsonb NOT NULL, " +
			"version bigint NOT NULL DEFAULT 1, PRIMARY KEY (ns, key))",
	}
}

// stepKeys: client `index`'s KV keys, -ops per step, as bench/sessions.py key_groups.
func stepKeys(cfg config, index int) [][]string {
	stretch := cfg.keys / cfg.connections
	if stretch < 1 {
		stretch = 1
	}
	first := index * cfg.keys / cfg.connections
	count := (stretch + cfg.ops - 1) / cfg.ops
	if count > txnKeyGroups {
		count = txnKeyGroups
	}
	groups := make([][]string, count)
	for g := range groups {
		for i := 0; i < cfg.ops; i++ {
			groups[g] = append(groups[g], fmt.Sprintf("k%05d", (first+(g*cfg.ops+i)%stretch)%cfg.keys))
		}
	}
	return groups
}

func (p *pgTarget) stepper(conn *pgx.Conn, index int) *pgStep {
	return &pgStep{
		conn: conn,
		popSQL: "SELECT id, transaction_id, partition, payload FROM " + p.table + " WHERE partition = ANY($1) " +
			"AND (lease_until IS NULL OR lease_until < now()) ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED",
		pushSQL: "INSERT INTO " + p.nextTable() + " (partition, transaction_id, payload) " +
			"SELECT * FROM unnest($1::int[], $2::text[], $3::jsonb[]) ON CONFLICT (partition, transaction_id) DO NOTHING",
		kvSQL: "INSERT INTO " + p.kvTable() + " AS kv (ns, key, value) SELECT $1, * FROM unnest($2::text[], $3::jsonb[]) " +
			"ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, version = kv.version + 1",
		ackSQL:     "DELETE FROM " + p.table + " WHERE id = ANY($1)",
		partitions: owned(index, p.cfg.connections, p.cfg.partitions),
		limit:      p.cfg.ops,
		preloaded:  p.cfg.queuePreload,
		keys:       stepKeys(p.cfg, index),
	}
}

// pgStep: each step is one SQL transaction: pop (SKIP LOCKED), push the successors, upsert the KV
// rows, delete the popped rows, commit.
type pgStep struct {
	conn                       *pgx.Conn
	popSQL, pushSQL, kvSQL     string
	ackSQL                     string
	partitions                 []int32
	limit, preloaded, position int
	keys                       [][]string
	ids                        []int64
	nextPartitions             []int32
	nextIDs, nextPayloads      []string
}

func (s *pgStep) setup(ctx context.Context) error   { return nil }
func (s *pgStep) owes() bool                        { return false }
func (s *pgStep) release(ctx context.Context) error { return nil }
func (s *pgStep) close()                            { s.conn.Close(context.Background()) }

func (s *pgStep) step(ctx context.Context, t *tally, counting bool) error {
	n, err := s.pop(ctx)
	if err != nil {
		s.rollback()
		return err
	}
	if n == 0 {
		s.rollback()
		if counting {
			t.pending["empty"]++
		}
		t.error("ran_dry", fmt.Sprintf("pop found nothing: the preload of %d messages is exhausted", s.preloaded))
		return nil
	}
	keys := s.keys[s.position][:n]
	s.position = (s.position + 1) % len(s.keys)
	batch := &pgx.Batch{}
	batch.Queue(s.pushSQL, s.nextPartitions, s.nextIDs, s.nextPayloads)
	batch.Queue(s.kvSQL, txnNS, keys, s.nextPayloads)
	batch.Queue(s.ackSQL, s.ids)
	batch.Queue("COMMIT")
	results := s.conn.SendBatch(ctx, batch)
	counts := make([]int64, 3)
	for i := range counts {
		tag, err := results.Exec()
		if err != nil {
			results.Close()
			s.rollback()
			return err
		}
		counts[i] = tag.RowsAffected()
	}
	if _, err := results.Exec(); err != nil { // the COMMIT
		results.Close()
		s.rollback()
		return err
	}
	if err := results.Close(); err != nil {
		return err
	}
	if counts[0] != int64(n) || counts[1] != int64(n) || counts[2] != int64(n) {
		t.error("step_short", fmt.Sprintf("%d popped: %d pushed, %d upserted, %d acked", n, counts[0], counts[1],
			counts[2]))
	}
	if counting {
		t.pending["steps"] += counts[2]
	}
	return nil
}

// pop opens the transaction and locks up to `limit` rows of the client's partitions, in one round
// trip; it fills the successors' columns and answers how many rows it locked.
func (s *pgStep) pop(ctx context.Context) (int, error) {
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(s.popSQL, s.partitions, s.limit)
	results := s.conn.SendBatch(ctx, batch)
	defer results.Close()
	if _, err := results.Exec(); err != nil {
		return 0, err
	}
	rows, err := results.Query()
	if err != nil {
		return 0, err
	}
	s.ids, s.nextPartitions, s.nextIDs, s.nextPayloads = s.ids[:0], s.nextPartitions[:0], s.nextIDs[:0], s.nextPayloads[:0]
	for rows.Next() {
		var id int64
		var tid string
		var partition int32
		var payload []byte
		if err := rows.Scan(&id, &tid, &partition, &payload); err != nil {
			rows.Close()
			return 0, err
		}
		s.ids = append(s.ids, id)
		s.nextPartitions = append(s.nextPartitions, partition)
		s.nextIDs = append(s.nextIDs, tid+"-next")
		s.nextPayloads = append(s.nextPayloads, `{"step":2,"from":"`+tid+`"}`)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return len(s.ids), results.Close()
}

// rollback ends whatever transaction a failed or empty step left open.
func (s *pgStep) rollback() {
	_, _ = s.conn.Exec(context.Background(), "ROLLBACK")
}
