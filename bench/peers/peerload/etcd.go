// etcd: the lock, semaphore and KV workloads over clientv3, each client with its own gRPC
// connection.
//
// Locks are the usual etcd recipe: acquire is a txn "create_revision(name) == 0 -> put name owner
// with the client's lease", release a txn "value(name) == owner -> delete name". A request of N
// ops is one txn over N names (all or nothing, where Queen answers each op on its own; etcd has no
// cheaper batch). Renew is a KeepAliveOnce of the lock's own lease (one RPC per lease: etcd has no
// batch of keep-alives). The semaphore is a nested txn trying its 8 permit keys in turn.
package main

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/clientv3"
)

const permits = 8

// etcdTarget: the etcd workloads make nothing before the run and leave nothing to remove after
// it (their keys carry leases that expire).
type etcdTarget struct{ cfg config }

func (e etcdTarget) prepare(ctx context.Context) error  { return nil }
func (e etcdTarget) teardown(ctx context.Context) error { return nil }

func (e etcdTarget) session(ctx context.Context, index int) (session, error) {
	cli, err := connect(e.cfg.endpoint)
	if err != nil {
		return nil, err
	}
	s, err := newSession(e.cfg, cli, index)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return s, nil
}

func keyName(i int) string { return fmt.Sprintf("bench/k%05d", i) }

// keyGroups: client i of C walks its own stretch of the key space, ops keys per request.
func keyGroups(cfg config, index int) [][]string {
	stretch := cfg.keys / cfg.connections
	if stretch < 1 {
		stretch = 1
	}
	first := index * cfg.keys / cfg.connections
	count := (stretch + cfg.ops - 1) / cfg.ops
	if count > 1024 {
		count = 1024
	}
	groups := make([][]string, count)
	for g := range groups {
		for i := 0; i < cfg.ops; i++ {
			groups[g] = append(groups[g], keyName((first+(g*cfg.ops+i)%stretch)%cfg.keys))
		}
	}
	return groups
}

type base struct {
	cfg   config
	cli   *clientv3.Client
	index int
	owner string
	lease clientv3.LeaseID
}

func (b *base) close() { b.cli.Close() }

func (b *base) grant(ctx context.Context) error {
	resp, err := b.cli.Grant(ctx, b.cfg.leaseTTL)
	if err != nil {
		return err
	}
	b.lease = resp.ID
	return nil
}

func acquireTxn(names []string, owner string, lease clientv3.LeaseID) ([]clientv3.Cmp, []clientv3.Op) {
	cmps := make([]clientv3.Cmp, len(names))
	puts := make([]clientv3.Op, len(names))
	for i, n := range names {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(n), "=", 0)
		puts[i] = clientv3.OpPut(n, owner, clientv3.WithLease(lease))
	}
	return cmps, puts
}

func releaseTxn(names []string, owner string) ([]clientv3.Cmp, []clientv3.Op) {
	cmps := make([]clientv3.Cmp, len(names))
	dels := make([]clientv3.Op, len(names))
	for i, n := range names {
		cmps[i] = clientv3.Compare(clientv3.Value(n), "=", owner)
		dels[i] = clientv3.OpDelete(n)
	}
	return cmps, dels
}

// -- lock-cycle ----------------------------------------------------------------------------------

type lockCycle struct {
	base
	groups  [][]string
	pos     int
	holding bool
}

func (s *lockCycle) setup(ctx context.Context) error {
	for g := 0; g < 16; g++ {
		var names []string
		for i := 0; i < s.cfg.ops; i++ {
			names = append(names, fmt.Sprintf("%s-c%d-%d-%d", s.cfg.tag, s.index, g, i))
		}
		s.groups = append(s.groups, names)
	}
	return s.grant(ctx)
}

func (s *lockCycle) owes() bool { return s.holding }

func (s *lockCycle) release(ctx context.Context) error { return s.step(ctx, newTally(), false) }

func (s *lockCycle) step(ctx context.Context, t *tally, counting bool) error {
	names := s.groups[s.pos]
	if !s.holding {
		cmps, puts := acquireTxn(names, s.owner, s.lease)
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			t.error("not_acquired", names[0])
			return nil
		}
		if counting {
			t.pending["acquired"] += int64(len(names))
		}
		s.holding = true
		return nil
	}
	cmps, dels := releaseTxn(names, s.owner)
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(dels...).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		t.error("not_released", names[0])
	} else if counting {
		t.pending["pairs"] += int64(len(names))
	}
	s.holding = false
	s.pos = (s.pos + 1) % len(s.groups)
	return nil
}

// -- lock-renew ----------------------------------------------------------------------------------

type lockRenew struct {
	base
	leases []clientv3.LeaseID
}

func (s *lockRenew) setup(ctx context.Context) error {
	for i := 0; i < s.cfg.ops; i++ {
		resp, err := s.cli.Grant(ctx, s.cfg.leaseTTL)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s-c%d-0-%d", s.cfg.tag, s.index, i)
		cmps, puts := acquireTxn([]string{name}, s.owner, resp.ID)
		tx, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return err
		}
		if !tx.Succeeded {
			return fmt.Errorf("lock %s not acquired", name)
		}
		s.leases = append(s.leases, resp.ID)
	}
	return nil
}

func (s *lockRenew) owes() bool                        { return false }
func (s *lockRenew) release(ctx context.Context) error { return nil }

func (s *lockRenew) step(ctx context.Context, t *tally, counting bool) error {
	for _, lease := range s.leases {
		resp, err := s.cli.KeepAliveOnce(ctx, lease)
		if err != nil {
			return err
		}
		if resp.TTL <= 0 {
			t.error("not_renewed", fmt.Sprint(lease))
			continue
		}
		if counting {
			t.pending["renewals"]++
		}
	}
	return nil
}

// -- contended: hot lock and semaphore -----------------------------------------------------------

type contended struct {
	base
	key     string
	slots   int // 1: the hot lock; 8: the semaphore
	holding string
}

func (s *contended) setup(ctx context.Context) error { return s.grant(ctx) }
func (s *contended) owes() bool                      { return s.holding != "" }
func (s *contended) release(ctx context.Context) error {
	return s.step(ctx, newTally(), false)
}

// semaphoreTxn: try permit `slot`; if taken, the else branch tries the next, nested.
func (s *contended) permitTxn(slot int) clientv3.Op {
	name := fmt.Sprintf("%s#%d", s.key, slot)
	cmp := clientv3.Compare(clientv3.CreateRevision(name), "=", 0)
	put := clientv3.OpPut(name, s.owner, clientv3.WithLease(s.lease))
	if slot == s.slots-1 {
		return clientv3.OpTxn([]clientv3.Cmp{cmp}, []clientv3.Op{put}, nil)
	}
	return clientv3.OpTxn([]clientv3.Cmp{cmp}, []clientv3.Op{put}, []clientv3.Op{s.permitTxn(slot + 1)})
}

func (s *contended) step(ctx context.Context, t *tally, counting bool) error {
	if s.holding != "" {
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(s.holding), "=", s.owner)).
			Then(clientv3.OpDelete(s.holding)).Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			t.error("not_released", s.holding)
		} else if counting {
			t.pending["pairs"]++
		}
		s.holding = ""
		return nil
	}
	if counting {
		t.pending["answers"]++
	}
	if s.slots == 1 {
		cmps, puts := acquireTxn([]string{s.key}, s.owner, s.lease)
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			s.holding = s.key
		}
	} else {
		op := s.permitTxn(0)
		cmps, thens, elses := op.Txn()
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(thens...).Else(elses...).Commit()
		if err != nil {
			return err
		}
		// Walk the nested answers: the first level that succeeded names the permit.
		succeeded, responses := resp.Succeeded, resp.Responses
		for slot := 0; slot < s.slots; slot++ {
			if succeeded {
				s.holding = fmt.Sprintf("%s#%d", s.key, slot)
				break
			}
			if len(responses) == 0 || responses[0].GetResponseTxn() == nil {
				break
			}
			inner := responses[0].GetResponseTxn()
			succeeded, responses = inner.Succeeded, inner.Responses
		}
	}
	if s.holding != "" && counting {
		t.pending["acquired"]++
	}
	return nil
}

// -- KV ------------------------------------------------------------------------------------------

type kv struct {
	base
	op     string
	groups [][]string
	pos    int
}

func (s *kv) setup(ctx context.Context) error {
	s.groups = keyGroups(s.cfg, s.index)
	return s.grant(ctx)
}
func (s *kv) owes() bool                        { return false }
func (s *kv) release(ctx context.Context) error { return nil }

func (s *kv) step(ctx context.Context, t *tally, counting bool) error {
	keys := s.groups[s.pos]
	s.pos = (s.pos + 1) % len(s.groups)
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		if s.op == "put" {
			ops[i] = clientv3.OpPut(k, value, clientv3.WithLease(s.lease))
		} else {
			ops[i] = clientv3.OpGet(k)
		}
	}
	if len(ops) == 1 {
		resp, err := s.cli.Do(ctx, ops[0])
		if err != nil {
			return err
		}
		if s.op == "get" && (resp.Get() == nil || len(resp.Get().Kvs) != 1) {
			t.error("not_found", keys[0])
			return nil
		}
	} else {
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return err
		}
		if s.op == "get" {
			for _, r := range resp.Responses {
				if rr := r.GetResponseRange(); rr == nil || len(rr.Kvs) != 1 {
					t.error("not_found", keys[0])
					return nil
				}
			}
		}
	}
	if counting {
		t.pending["ops"] += int64(len(keys))
	}
	return nil
}

type cas struct {
	base
	keys []string
	revs []int64
}

func (s *cas) setup(ctx context.Context) error {
	for i := 0; i < s.cfg.ops; i++ {
		s.keys = append(s.keys, fmt.Sprintf("bench/%s-cas-%d-%d", s.cfg.tag, s.index, i))
	}
	if err := s.grant(ctx); err != nil {
		return err
	}
	ops := make([]clientv3.Op, len(s.keys))
	for i, k := range s.keys {
		ops[i] = clientv3.OpPut(k, value, clientv3.WithLease(s.lease))
	}
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return err
	}
	s.revs = make([]int64, len(s.keys))
	for i := range s.revs {
		s.revs[i] = resp.Header.Revision
	}
	return nil
}
func (s *cas) owes() bool                        { return false }
func (s *cas) release(ctx context.Context) error { return nil }

func (s *cas) step(ctx context.Context, t *tally, counting bool) error {
	cmps := make([]clientv3.Cmp, len(s.keys))
	puts := make([]clientv3.Op, len(s.keys))
	for i, k := range s.keys {
		cmps[i] = clientv3.Compare(clientv3.ModRevision(k), "=", s.revs[i])
		puts[i] = clientv3.OpPut(k, value, clientv3.WithLease(s.lease))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		t.error("cas_missed", s.keys[0])
		return nil
	}
	for i := range s.revs {
		s.revs[i] = resp.Header.Revision // every put of one txn takes the txn's revision
	}
	if counting {
		t.pending["ops"] += int64(len(s.keys))
	}
	return nil
}

type guarded struct {
	base
	lock   string
	groups [][]string
	pos    int
}

func (s *guarded) setup(ctx context.Context) error {
	s.groups = keyGroups(s.cfg, s.index)
	if err := s.grant(ctx); err != nil {
		return err
	}
	s.lock = fmt.Sprintf("%s-txn-%d", s.cfg.tag, s.index)
	cmps, puts := acquireTxn([]string{s.lock}, s.owner, s.lease)
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(puts...).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("lock %s not acquired", s.lock)
	}
	return nil
}
func (s *guarded) owes() bool                        { return false }
func (s *guarded) release(ctx context.Context) error { return nil }

func (s *guarded) step(ctx context.Context, t *tally, counting bool) error {
	keys := s.groups[s.pos]
	s.pos = (s.pos + 1) % len(s.groups)
	puts := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		puts[i] = clientv3.OpPut(k, value, clientv3.WithLease(s.lease))
	}
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.Value(s.lock), "=", s.owner)).Then(puts...).Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		t.error("txn_failed", s.lock)
	} else if counting {
		t.pending["txns"]++
		t.pending["ops"] += int64(len(keys))
	}
	return nil
}

func newSession(cfg config, cli *clientv3.Client, index int) (session, error) {
	b := base{cfg: cfg, cli: cli, index: index, owner: fmt.Sprintf("%s-o%d", cfg.tag, index)}
	switch cfg.workload {
	case "lock-cycle":
		return &lockCycle{base: b}, nil
	case "lock-renew":
		return &lockRenew{base: b}, nil
	case "lock-hot":
		return &contended{base: b, key: cfg.tag + "-hot", slots: 1}, nil
	case "sem8":
		return &contended{base: b, key: cfg.tag + "-sem", slots: permits}, nil
	case "kv-put":
		return &kv{base: b, op: "put"}, nil
	case "kv-get":
		return &kv{base: b, op: "get"}, nil
	case "kv-cas":
		return &cas{base: b}, nil
	case "txn-guarded":
		return &guarded{base: b}, nil
	}
	return nil, fmt.Errorf("unknown workload %q", cfg.workload)
}

func connect(endpoint string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 10 * time.Second})
}

func preload(cfg config) error {
	cli, err := connect(cfg.endpoint)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx := context.Background()
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		return err
	}
	for start := 0; start < cfg.keys; start += 100 {
		var ops []clientv3.Op
		for k := start; k < start+100 && k < cfg.keys; k++ {
			ops = append(ops, clientv3.OpPut(keyName(k), value, clientv3.WithLease(lease.ID)))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			return err
		}
	}
	return nil
}
