"""Failover scenarios: 3 etcd members, 3 (or 2) Queen nodes, every link through a proxy, client
worker processes running W1-W4 while one nemesis strikes; then heal, read the final state from the
leader, read every node's log, and run the checks C1-C9 (tests/cluster/harness/checks.py).

They need `queen serve --cluster`; on a build without it they skip, saying so. Negative controls
at the end run a scenario against a server switched into a deliberate bug (a QUEEN_TEST_* variable,
tests/cluster/harness/nodes.py) and pass only when the check meant to see that bug fails.
"""

from __future__ import annotations

import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from queen.testing import parse_log_line
from tests.cluster.harness import checks
from tests.cluster.harness.etcd import EtcdCluster
from tests.cluster.harness.nodes import QueenCluster, cluster_supported
from tests.cluster.harness.workers import (
    COUNTERS,
    LOCK_TTL_S,
    LOCKS,
    REGISTERS,
    WorkerProcess,
    mono_ms,
    read_log,
    wall_ms,
)

LEADER_TTL_S = 2.0
GRACE_MS = int(LEADER_TTL_S * 1000)
EPS_MS = 100
# C8, asserted generously (a busy 2-core machine): T_l + 1.5 s is the goal, reported in the summary.
FAILOVER_GOAL_MS = (LEADER_TTL_S + 1.5) * 1000
FAILOVER_BOUND_MS = 15_000

pytestmark = pytest.mark.skipif(
    not cluster_supported(),
    reason="queen serve --cluster is not in this build (`queen serve --help` has no --cluster): "
           "the failover scenarios run once the HA nodes land")

# Worker mix per scenario: (kind, count, ops). Bounded, so every scenario ends by itself.
WORKERS = (("W1", 3, 60), ("W2", 2, 10), ("W3", 1, 60), ("W4", 1, 30))
RESULTS: list[dict] = []  # per scenario: name, failover ms, violations by check (printed at the end)


@dataclass
class Outcome:
    name: str
    found: dict = field(default_factory=dict)
    failover_ms: float | None = None
    calls: list = field(default_factory=list)
    cluster: QueenCluster | None = None

    def violations(self, *exempt: str) -> dict:
        return {check: found[:3] for check, found in self.found.items() if found and check not in exempt}


def _progress(workers, ok_count: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sum(event["type"] == "ok" for w in workers for event in read_log(w.log_path)) >= ok_count:
            return
        time.sleep(0.05)  # polling the workers' logs
    raise AssertionError("the workers made no progress")


def run_scenario(tmp_path, name: str, nemesis, *, nodes: int = 3, env: dict | None = None,
                 node_env: dict | None = None, sync_mode: str | None = None, workers=WORKERS,
                 hold_s: float = 0.0, lock_ttl_s: int = LOCK_TTL_S, deadline_s: float = 90.0,
                 locks: tuple = (), lease_grace_s: float | None = None, worker_hook=None, eps_ms: int = EPS_MS,
                 extra_args: tuple = ()) -> Outcome:
    """Start etcd, the nodes and the workers; strike with nemesis(cluster, leader, workers) once the
    workers are under way (a nemesis that first waits for its moment returns (mono ms, wall ms) of
    the fault); wait for them; heal; read the final state and the logs; check."""
    work = str(tmp_path)
    outcome = Outcome(name)
    running: list[WorkerProcess] = []
    with EtcdCluster(work, 3) as etcd:
        cluster = QueenCluster(work, etcd, nodes, leader_ttl_s=LEADER_TTL_S, sync_mode=sync_mode, env=env,
                               extra_args=(*extra_args, *(("--lease-grace", str(lease_grace_s)) if lease_grace_s else ())))
        cluster.node_env = dict(node_env or {})
        outcome.cluster = cluster
        try:
            cluster.start()
            running = [WorkerProcess(kind, cluster.urls, work, f"{kind.lower()}-{i}", ops=ops, seed=zlib.crc32(f'{name}/{kind}/{i}'.encode()),
                                     hold_s=hold_s if kind == "W2" else 0.0, lock_ttl_s=lock_ttl_s,
                                     deadline_s=deadline_s, locks=locks).start()
                       for kind, count, ops in workers for i in range(count)]
            try:
                _progress(running, 50)
                leader = cluster.wait_leader()
                epoch_before = cluster.epoch()
                fault_t, fault_wall = mono_ms(), wall_ms()
                struck = nemesis(cluster, leader, running)
                if struck is not None:  # the nemesis waited for its moment: it says when it struck
                    fault_t, fault_wall = struck
                for worker in running:
                    worker.wait(180)
            finally:
                for worker in running:
                    worker.kill()
            cluster.heal()
            for node_id, node in cluster.nodes.items():
                if not node.alive():
                    cluster.start_node(node_id)
                elif node.paused:
                    cluster.resume(node_id)
            cluster.wait_leader()
            commit = cluster.wait_converged(60)
            final = cluster.final_rows(REGISTERS + COUNTERS)
        finally:
            cluster.stop()
        logs = {node_id: checks.log_records(node.data_dir) for node_id, node in cluster.nodes.items()
                if os.path.isdir(node.data_dir)}
    events = [event for worker in running for event in worker.events()]
    calls = checks.calls_of(events)
    records = max(logs.values(), key=lambda log: len(log[0]))[0]
    first_versions = checks.epoch_first_versions(records)
    # The configured grace: --lease-grace, or the leader ttl.
    promises = checks.lease_promises(records, int(lease_grace_s * 1000) if lease_grace_s else GRACE_MS)
    later = [e for e in sorted(promises) if epoch_before is None or e > epoch_before]
    failovers = [(fault_wall, *promises[later[0]])] if later else []
    outcome.found = checks.check_all(calls, final_rows=final, store_log=read_log(os.path.join(work, "fenced-store",
                                                                                             "store.jsonl")),
                                     limits=LOCKS, first_versions=first_versions, failovers=failovers, eps_ms=eps_ms)
    outcome.found["C9"] = checks.check_convergence(logs, commit)
    outcome.failover_ms = checks.failover_time_ms(calls, fault_t, epoch_before)
    outcome.calls = calls
    RESULTS.append({"name": name, "failover_ms": outcome.failover_ms, "ok_calls": sum(c.ok for c in calls),
                    "violations": {k: len(v) for k, v in outcome.found.items() if v}})
    print(f"\nscenario {name}: failover {outcome.failover_ms} ms, {sum(c.ok for c in calls)} ok calls, "
          f"violations {RESULTS[-1]['violations']}", file=sys.stderr)
    return outcome


def assert_clean(outcome: Outcome, *exempt: str, failover: bool = True) -> None:
    assert outcome.violations(*exempt) == {}
    if failover:
        assert outcome.failover_ms is not None, "no write answered by a new epoch"
        assert outcome.failover_ms < FAILOVER_BOUND_MS, outcome.failover_ms


def wait_until(condition, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


# -- nemeses -------------------------------------------------------------------------------------


def kill_leader_restart_later(cluster: QueenCluster, leader: str, workers) -> None:
    """N1: SIGKILL the leader; once another leads, start it again (it rejoins and truncates)."""
    cluster.kill(leader)
    cluster.wait_leader(other_than=leader)
    cluster.start_node(leader)


def pause_leader(cluster: QueenCluster, leader: str, workers) -> None:
    """N2: SIGSTOP the leader past 3·T_l (another is elected meanwhile), then SIGCONT: the zombie."""
    stopped = time.monotonic()
    cluster.pause(leader)
    cluster.wait_leader(other_than=leader)
    time.sleep(max(0.0, stopped + 3 * LEADER_TTL_S - time.monotonic()))  # the pause is the fault
    cluster.resume(leader)


def cut_leader_from_etcd(cluster: QueenCluster, leader: str, workers) -> None:
    """N3 / N3b: blackhole leader↔etcd only; it still reaches followers and clients."""
    for proxy in cluster.etcd_link(leader):
        proxy.blackhole()
    cluster.wait_leader(other_than=leader)
    time.sleep(LEADER_TTL_S)  # the old leader keeps trying meanwhile (N3b): that is the fault
    for proxy in cluster.etcd_link(leader):
        proxy.pass_()


def _new_epoch_writes(workers, epoch: int) -> int:
    """How many register and counter writes were answered ok in an epoch after `epoch`."""
    return sum(e["type"] == "ok" and e.get("f") in ("put", "incr") and (e.get("epoch") or 0) > epoch
               for w in workers for e in read_log(w.log_path))


def cut_leader_from_etcd_and_clients(cluster: QueenCluster, leader: str, workers) -> None:
    """N3b's cut, and the old leader's clients cut too, but one: a pinned reader (R1 on the
    node's own address, following nobody) reading every ~20 ms, a client left on the zombie's side.
    The others go to the new leader; the cut holds until it has answered writes, and T_l more.
    Nothing but the pinned reads reaches the zombie, so it has no write of its own waiting for its
    former standby, and each read waits for nothing but what guards reads: its round trip (the
    read barrier) to that standby, which promised a newer epoch and refuses the old one's
    messages (the epoch check)."""
    reader = WorkerProcess("R1", [cluster.nodes[leader].direct_url], cluster.work_dir, "r1-pinned", ops=100_000,
                           seed=1, pinned=True, pace_ms=20).start()
    workers.append(reader)  # run_scenario waits for it and checks its calls with the others'
    first = wait_until(lambda: next((e for e in reader.events() if e["type"] == "ok"), None), 30,
                       "the pinned reader read")
    epoch = first["epoch"]  # the old leader's
    cut = [*cluster.etcd_link(leader), cluster.client_link(leader)]
    for proxy in cut:
        proxy.blackhole()
    cluster.wait_leader(other_than=leader)
    wait_until(lambda: _new_epoch_writes(workers, epoch) >= 5, 30, "writes answered in the new epoch")
    time.sleep(LEADER_TTL_S)  # the zombie keeps trying to serve its pinned reader meanwhile: that is the fault
    for proxy in cut:
        proxy.pass_()
    reader.stop()


def cut_leader_from_standby(cluster: QueenCluster, leader: str, workers) -> None:
    """N4: blackhole leader↔sync standby only; strict: a stall, then the async follower swapped
    in; degrade: sync=[] written before any answer without the standby."""
    standby = (cluster.status(leader) or {}).get("sync", [])[0]
    for proxy in cluster.replication_link(leader, standby):
        proxy.blackhole()
    wait_until(lambda: (s := cluster.status(leader)) and (standby not in s.get("sync", []) or s.get("degraded")),
               30, "the sync set changed")
    for proxy in cluster.replication_link(leader, standby):
        proxy.pass_()


def kill_new_leader_too(cluster: QueenCluster, leader: str, workers) -> None:
    """N6: kill the leader, then the new one as soon as it leads (right after its EPOCH)."""
    cluster.kill(leader)
    second = cluster.wait_leader(other_than=leader)
    cluster.kill(second)
    cluster.start_node(leader)
    third = cluster.wait_leader(other_than=second)
    assert third != second
    cluster.start_node(second)


def switchover(cluster: QueenCluster, leader: str, workers) -> None:
    """Planned: the operator hands leadership to another node (POST /api/v1/cluster/switchover)."""
    from tests.cluster.harness.nodes import _post_json

    _post_json(cluster.nodes[leader].direct_url + "/api/v1/cluster/switchover", {})
    cluster.wait_leader(other_than=leader)


def _force_promote(cluster: QueenCluster, leader: str, target: str) -> None:
    """Kill the leader and its sync standby; force-promote `target`."""
    for node in [leader, *(cluster.status(leader) or {}).get("sync", [])]:
        cluster.kill(node)
    from tests.cluster.harness.nodes import _post_json

    _post_json(cluster.nodes[target].direct_url + "/api/v1/cluster/force-promote", {"node": target})
    cluster.wait_leader()
    assert cluster.leader() == target


def _async_follower(cluster: QueenCluster, leader: str) -> str:
    sync = (cluster.status(leader) or {}).get("sync", [])
    return next(n for n in cluster.nodes if n != leader and n not in sync)


def force_promote_async(cluster: QueenCluster, leader: str, workers) -> None:
    """N9: kill the leader and its sync standby; force-promote the async follower."""
    _force_promote(cluster, leader, _async_follower(cluster, leader))


def _versions_answered(workers, after_t: float) -> list[int]:
    """The versions and tokens ok writes took, answered after after_t (mono ms)."""
    calls = checks.calls_of([event for w in workers for event in read_log(w.log_path)])
    return [v for call in calls if call.ok and call.outcome["t"] > after_t for v in checks.new_versions(call)]


# Answers the lagging follower never received before it is force-promoted: enough that some of
# them are versions its own log would hand out again, were it to go on from there.
BEHIND_WRITES = 10


def force_promote_lagging_async(cluster: QueenCluster, leader: str, workers) -> None:
    """N9-lagging: cut the async follower off the leader's replication until BEHIND_WRITES ok
    writes took versions above its log, then N9. Without the lag the async follower usually holds
    every acknowledged write, so going on from its own log (QUEEN_TEST_IGNORE_CEILING) would repeat
    no version a client saw; with it, only the ceiling keeps its versions above them."""
    target = _async_follower(cluster, leader)
    for proxy in cluster.replication_link(leader, target):
        proxy.blackhole()  # kept through the kill: a healed link would let it catch up
    cut_at = mono_ms()

    def behind() -> list[int]:
        held = (cluster.status(target) or {}).get("lastVersion", 0)
        return [v for v in _versions_answered(workers, cut_at) if v > held]

    wait_until(lambda: len(behind()) >= BEHIND_WRITES, 30, f"{BEHIND_WRITES} ok writes the async follower lacks")
    _force_promote(cluster, leader, target)


# -- scenarios -----------------------------------------------------------------------------------


def test_n1_kill_leader(tmp_path):
    assert_clean(run_scenario(tmp_path, "N1", kill_leader_restart_later))


def test_n2_paused_leader_is_a_zombie(tmp_path):
    assert_clean(run_scenario(tmp_path, "N2", pause_leader))


def test_n3_leader_cut_from_etcd(tmp_path):
    assert_clean(run_scenario(tmp_path, "N3", cut_leader_from_etcd))


N3B_ENV = {"QUEEN_TEST_NO_SELF_FENCE": "1", "QUEEN_TEST_NO_HEARD_LEADER_RULE": "1"}


def test_n3b_data_path_fence_holds_without_timing(tmp_path):
    assert_clean(run_scenario(tmp_path, "N3b", cut_leader_from_etcd, env=N3B_ENV))


@pytest.mark.parametrize("mode,nodes", [("strict", 3), ("degrade", 2)])
def test_n4_leader_cut_from_standby(tmp_path, mode, nodes):
    assert_clean(run_scenario(tmp_path, f"N4-{mode}", cut_leader_from_standby, nodes=nodes, sync_mode=mode),
                 failover=False)


# N5: etcd loses quorum for 5 x T_l. The leader serves at most T_l - T_l/4 after the last
# keepalive etcd accepted (its self-fence), and etcd accepts keepalives until its raft leader is
# paused or steps down for want of a quorum (check-quorum, 1-2 election timeouts: etcd 3.4 renews
# leases on its leader without a quorum round). No write may be answered ok later than that
# plus T_l: the fence's T_l/4 margin and N5_DELIVERY_MS cover the fence loop's tick and an answer
# released just before the fence reaching its worker on a busy machine.
ETCD_OUTAGE_S = 5 * LEADER_TTL_S
N5_DELIVERY_MS = 500


OUTAGE_POLL_S = 0.1  # N5: how often every node's status and etcd's raft leader are read during the outage


def etcd_loses_quorum(keep: str):
    """N5: SIGSTOP two of the three etcd members for ETCD_OUTAGE_S, then SIGCONT them. e0, the
    endpoint every node's etcd client tries first, is made the raft leader; keep: "raft-leader"
    pauses e1 and e2, so e0 answers at once and leads raft until check-quorum demotes it, renewing
    leases meanwhile; "raft-follower" pauses e0 and e1 (each call waits out e0 first).
    Meanwhile, about every 0.1 s: which nodes serve as leader, and whether the member left still
    leads raft (until then it may renew the Queen leader's lease)."""
    def nemesis(cluster: QueenCluster, leader: str, workers):
        etcd = cluster.etcd
        etcd.move_leader(0)
        kept = 0 if keep == "raft-leader" else 2
        paused = [i for i in range(3) if i != kept]
        outage = cluster.outage = {"leader": leader, "epoch": cluster.epoch(), "kept": kept,
                                   "raft_leader": etcd.leader_member(), "rounds": [], "renewals_end_t": None}
        struck = mono_ms(), wall_ms()
        try:
            for member in paused:
                etcd.members[member].pause()
            ends = time.monotonic() + ETCD_OUTAGE_S
            while time.monotonic() < ends:  # the outage is the fault
                serving = [node for node in cluster.nodes if (cluster.status(node, timeout_s=0.5) or {}).get("serving")]
                outage["rounds"].append((mono_ms(), serving))
                if outage["renewals_end_t"] is None and not etcd.leads(kept, timeout_s=0.5):
                    outage["renewals_end_t"] = mono_ms()
                time.sleep(OUTAGE_POLL_S)  # sampling real processes (nodes, etcd) through the outage
        finally:
            for member in paused:
                etcd.members[member].resume()
            outage["paused_t"], outage["paused_wall"], outage["resumed_t"] = *struck, mono_ms()
        etcd.wait_healthy(30)
        outage["etcd_back_ms"] = mono_ms() - outage["resumed_t"]
        return struck
    return nemesis


def _role_changes(cluster: QueenCluster, node: str) -> list[dict]:
    """The node's event=cluster_role log lines, parsed (ts is its wall clock)."""
    with open(cluster.nodes[node].server.stderr_path, errors="replace") as log:
        return [parse_log_line(line.strip()) for line in log if "event=cluster_role" in line]


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f} ms"


def _wall_ms(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000


# Which two to pause: keeping etcd's raft leader, and the endpoint the nodes try first, is the
# harder case (it renews the Queen leader's lease at once until it steps down, up to 2 s after the
# pause: the last ok write came 2.3-3.2 s after it; with the raft leader elsewhere or paused, each
# keepalive first waits out a paused member, and the last came 1.2-1.7 s after), so that is the CI
# case; the other runs nightly.
@pytest.mark.parametrize("keep", ["raft-leader", pytest.param("raft-follower", marks=pytest.mark.nightly)])
def test_n5_etcd_without_quorum(tmp_path, keep):
    outcome = run_scenario(tmp_path, f"N5-{keep}", etcd_loses_quorum(keep))
    assert_clean(outcome, failover=False)  # the new epoch's first write is timed from the resume below
    cluster, outage = outcome.cluster, outcome.cluster.outage
    paused_t, resumed_t = outage["paused_t"], outage["resumed_t"]
    writes = [c for c in outcome.calls if c.ok and c.f in checks.WRITES]
    before_resume = [c for c in writes if c.outcome["t"] < resumed_t]
    after_resume = sorted((c for c in writes if c.outcome["t"] > resumed_t), key=lambda c: c.outcome["t"])
    last_ms = max(c.outcome["t"] for c in before_resume) - paused_t if before_resume else None
    first_ms = after_resume[0].outcome["t"] - resumed_t if after_resume else None
    nodes_by_url = {node.url: node_id for node_id, node in cluster.nodes.items()}
    leader_after = nodes_by_url.get(after_resume[0].outcome["node"]) if after_resume else None
    served_ms = max((t for t, serving in outage["rounds"] if serving), default=paused_t) - paused_t
    fenced = next((r for r in _role_changes(cluster, outage["leader"]) if r["role"] == "fenced"), None)
    fenced_ms = _wall_ms(fenced["ts"]) - outage["paused_wall"] if fenced else None
    renewals_ms = outage["renewals_end_t"] - paused_t if outage["renewals_end_t"] is not None else None
    print(f"N5-{keep}: pause -> etcd stops renewing {_ms(renewals_ms)}, last ok write {_ms(last_ms)} (the leader "
          f"fenced at {_ms(fenced_ms)}, {fenced and fenced.get('reason')}; last seen serving at {_ms(served_ms)}); "
          f"resume -> etcd healthy {_ms(outage['etcd_back_ms'])}, first ok write {_ms(first_ms)}; "
          f"leader {outage['leader']} (epoch {outage['epoch']}) -> {leader_after} "
          f"(epoch {after_resume[0].epoch if after_resume else None}); etcd kept e{outage['kept']}, "
          f"raft leader e{outage['raft_leader']}", file=sys.stderr)
    RESULTS[-1]["failover_ms"] = first_ms
    # etcd without quorum stopped renewing leases (its raft leader paused, or stepped down).
    assert renewals_ms is not None, "the etcd member left still led raft at the end of the outage"
    # The leader stopped itself, by its self-fence, and no write was answered ok beyond the bound.
    assert fenced is not None and fenced["reason"] == "etcd_unreachable", fenced
    bound_ms = renewals_ms + LEADER_TTL_S * 1000 + N5_DELIVERY_MS
    late = [c.outcome for c in before_resume if c.outcome["t"] - paused_t > bound_ms]
    assert late == [], (bound_ms, late[:3])
    # One leader at a time: no poll found two nodes serving, and none served beyond the bound.
    assert all(len(serving) <= 1 for _, serving in outage["rounds"]), outage["rounds"]
    assert served_ms <= bound_ms, (bound_ms, outage["rounds"])
    # No node crashed.
    for node_id, node in cluster.nodes.items():
        with open(node.server.stderr_path, errors="replace") as log:
            assert "Traceback" not in log.read(), f"{node_id} logged a traceback"
    # The cluster leads again and the workers make progress after the heal (etcd's own recovery,
    # 2-6 s after SIGCONT here, is not the coordinator's to bound: timed from etcd healthy again).
    assert first_ms is not None, "no ok write after etcd came back"
    assert first_ms - outage["etcd_back_ms"] < FAILOVER_BOUND_MS, (first_ms, outage["etcd_back_ms"])


SWITCHOVER_BOUND_MS = 5_000  # asserted loosely (busy machine); the goal, < 1 s, is in the summary


def test_switchover_is_quick_and_loses_nothing(tmp_path):
    outcome = run_scenario(tmp_path, "switchover", switchover)
    assert_clean(outcome)
    assert outcome.failover_ms < SWITCHOVER_BOUND_MS, outcome.failover_ms


def test_n6_second_failover_inside_the_first(tmp_path):
    assert_clean(run_scenario(tmp_path, "N6", kill_new_leader_too))


SKEW_MS = 1500
SKEWED = "n3"


def _make_sync_standby(cluster: QueenCluster, leader: str, node: str) -> None:
    """Strict mode, one sync member: make `node` it, by killing the other follower (a strict
    leader swaps an absent member for a caught-up follower at once), then start that one again."""
    sync = (cluster.status(leader) or {}).get("sync", [])
    if node in sync:
        return
    other = next(n for n in cluster.nodes if n not in (leader, node))
    cluster.kill(other)
    wait_until(lambda: node in ((cluster.status(leader) or {}).get("sync") or []), 30, f"{node} is the sync standby")
    cluster.start_node(other)


def skewed_node_takes_over(cluster: QueenCluster, leader: str, workers) -> None:
    """N7: the node with the skewed clock becomes the sync standby, then the leader is killed: it
    is the only node that may take over."""
    from tests.cluster.harness.nodes import _post_json

    if leader == SKEWED:  # n1 usually wins the bootstrap; if not, hand over to n1 first
        _post_json(cluster.nodes[leader].direct_url + "/api/v1/cluster/switchover", {"to": "n1"})
        leader = cluster.wait_leader(other_than=SKEWED)
    _make_sync_standby(cluster, leader, SKEWED)
    cluster.kill(leader)
    assert cluster.wait_leader(other_than=leader) == SKEWED
    cluster.skew_seen = _clock_offset_ms(cluster, SKEWED)  # leading now: its clock after the floor
    cluster.start_node(leader)


def _clock_offset_ms(cluster: QueenCluster, node: str) -> float:
    """The node's clock less this machine's: GET /api/v1/server's startedAt + uptime is its now."""
    from tests.cluster.harness.nodes import _get_json

    before = wall_ms()
    info = _get_json(cluster.nodes[node].direct_url + "/api/v1/server", 2.0)
    return info["startedAt"] + info["uptimeSeconds"] * 1000 - (before + wall_ms()) / 2


# +1500 and -1500 ms: within the failover window (T_l = 2 s), so -1500 never needs the clock floor;
# -8000 (nightly) is far behind the old leader's last time when it takes over: the floor lifts it.
@pytest.mark.parametrize("skew_ms", [SKEW_MS, pytest.param(-SKEW_MS, marks=pytest.mark.nightly),
                                     pytest.param(-8000, marks=pytest.mark.nightly)])
def test_n7_skewed_clock_takes_over(tmp_path, skew_ms):
    # ε = skew + 50 ms for C6 and C7: a lease's expiresAt and a timer's `at` are read on the
    # leader's wall clock, so a leader whose clock is ahead ends them early by up to its skew.
    outcome = run_scenario(tmp_path, f"N7{skew_ms:+d}", skewed_node_takes_over, sync_mode="strict",
                           node_env={SKEWED: {"QUEEN_TEST_WALL_OFFSET_MS": str(skew_ms)}},
                           eps_ms=abs(skew_ms) + 50)
    went_back = checks.check_created_at_rising(outcome.calls)
    assert went_back == [], went_back[:3]
    assert_clean(outcome)
    seen = outcome.cluster.skew_seen
    print(f"N7{skew_ms:+d}: the new leader's clock is {seen:+.0f} ms off", file=sys.stderr)
    if skew_ms > 0 or -skew_ms < LEADER_TTL_S * 1000:  # the skew took effect (no floor needed)
        assert abs(seen - skew_ms) < abs(skew_ms) / 2, seen
    else:  # the floor lifted it to the old leader's last time: behind by about the failover, not the skew
        assert seen > skew_ms * 3 / 4, seen


def wipe_sync_standby(cluster: QueenCluster, leader: str, workers) -> None:
    """N8: SIGKILL the sync standby, rm -rf its data directory, start it again: the async follower
    swaps in (strict) while it rebuilds from the leader; it must catch up and converge."""
    standby = (cluster.status(leader) or {}).get("sync", [])[0]
    cluster.killed_at = mono_ms()
    cluster.kill(standby)
    cluster.wipe(standby)
    wait_until(lambda: standby not in ((cluster.status(leader) or {}).get("sync") or []), 30,
               "the async follower swapped in")
    cluster.start_node(standby)
    wait_until(lambda: (s := cluster.status(standby)) and s.get("role") not in (None, "none")
               and (cluster.status(leader) or {}).get("lastVersion", 0) - s.get("lastVersion", 0) < 50, 60,
               "the wiped node caught up")


# Default sizes: the leader still holds its whole log, so the wiped node catches up from its disk.
# Tiny segments and snapshots (nightly): the leader's early segments are gone, so it streams a snapshot.
SMALL_LOG = ("--segment-bytes-max", "4096", "--snapshot-wal-bytes", "4096")


@pytest.mark.parametrize("extra_args", [(), pytest.param(SMALL_LOG, marks=pytest.mark.nightly)],
                         ids=["catch-up", "snapshot"])
def test_n8_follower_data_dir_wiped(tmp_path, extra_args):
    outcome = run_scenario(tmp_path, "N8" + ("-snapshot" if extra_args else ""), wipe_sync_standby,
                           sync_mode="strict", extra_args=extra_args)
    assert_clean(outcome, failover=False)
    # Serving throughout: the first ok write after the kill (no new epoch: the leader stays).
    stall = checks.failover_time_ms(outcome.calls, outcome.cluster.killed_at, None)
    print(f"N8 first ok write after the kill: {stall} ms", file=sys.stderr)
    RESULTS[-1]["failover_ms"] = stall
    assert stall is not None and stall < FAILOVER_BOUND_MS, stall
    if extra_args:  # the path meant: the leader sent the wiped node a snapshot
        logs = "".join(Path(node.server.stderr_path).read_text(errors="replace") for node in outcome.cluster.nodes.values())
        assert "event=follower_snapshot" in logs, "no snapshot was streamed"


# What a lossy promotion shows in C1: the acknowledged writes it lost, and their traces (a counter
# answering a value again, a message whose ack was lost delivered again).
LOSS_KINDS = ("lost_write", "lost", "lost_increment", "delivered_after_completed")


@pytest.mark.nightly
def test_n9_force_promote_reports_lost_writes(tmp_path):
    outcome = run_scenario(tmp_path, "N9", force_promote_async, sync_mode="strict")
    # Acknowledged writes the promoted node never saw are lost by the operator's choice: reported.
    lost = outcome.found["C1"]
    print(f"N9 lost acknowledged writes: {len(lost)} {lost[:5]}", file=sys.stderr)
    assert all(v["kind"] in LOSS_KINDS for v in lost)
    assert_clean(outcome, "C1", "C2", "C9")  # tokens never repeat (C4) even so


def test_n9_lagging_force_promote_reuses_no_version(tmp_path):
    """The ceiling control's twin: the promoted node lacks at least BEHIND_WRITES acknowledged
    writes, and still hands out no version or fence a client saw (C4) nor one of an older epoch
    (C3). Lost grants, acks and pops may also break C5-C7's promises (the operator's choice)."""
    outcome = run_scenario(tmp_path, "N9-lagging", force_promote_lagging_async, sync_mode="strict", hold_s=0.5)
    lost = outcome.found["C1"]
    print(f"N9-lagging lost acknowledged writes: {len(lost)} {lost[:5]}", file=sys.stderr)
    assert all(v["kind"] in LOSS_KINDS for v in lost)
    assert_clean(outcome, "C1", "C2", "C5", "C6", "C7", "C9")


@pytest.mark.nightly
def test_n10_paused_lock_holder_across_failover(tmp_path):
    paused = {}

    def nemesis(cluster, leader, workers):
        holder = next(w for w in workers if w.kind == "W2")
        # Pause it while it holds (it holds for hold_s before writing the store).
        wait_until(lambda: any(e["type"] == "ok" and e.get("f") == "acquire" and e["result"]["results"][0]["acquired"]
                               for e in read_log(holder.log_path)), 30, "a W2 holder acquired")
        holder.pause()
        paused["worker"] = holder.name
        started = time.monotonic()
        cluster.kill(leader)
        cluster.wait_leader(other_than=leader)
        time.sleep(max(0.0, started + 2 * LOCK_TTL_S - time.monotonic()))  # the pause is the fault
        holder.resume()
        cluster.start_node(leader)

    outcome = run_scenario(tmp_path, "N10", nemesis, hold_s=1.5)
    assert_clean(outcome)


# -- negative controls: each bug must be seen by its check ----------------------------------------


def kill_both_then_follower_leads(cluster: QueenCluster, leader: str, workers) -> None:
    """Kill the follower, then the leader, right after an increment was acknowledged; start the
    follower alone until it campaigns, then the old leader (it is cut back to the follower's log).
    Strict mode: the follower's EPOCH waits for a sync member's ack, here the old leader's, so
    waiting for it to lead before starting the old leader would wait forever."""
    follower = next(n for n in cluster.nodes if n != leader)
    wait_until(lambda: follower in (cluster.status(leader) or {}).get("sync", []), 30, "the follower in sync")
    # The follower, the only sync member, acked that increment's frame before the answer went out;
    # the ACK_BEFORE_FSYNC control writes it LATE_WRITE_S (1.5 s) after it came, so it is still
    # unwritten at the kill. W3 goes on incrementing after the failover, so a lost increment shows
    # as a value answered twice (C1).
    since = mono_ms()
    wait_until(lambda: any(e["type"] == "ok" and e.get("f") == "incr" and e["t"] > max(since, mono_ms() - 300)
                           for w in workers if w.kind == "W3" for e in read_log(w.log_path)),
               30, "an increment acknowledged just now")
    # The follower first: one that outlives its leader sees the stream end and writes what it held
    # (a live node loses nothing), which is what made this control miss about one run in three.
    cluster.kill(follower)
    cluster.kill(leader)
    cluster.start_node(follower)
    wait_until(lambda: (cluster.status(follower) or {}).get("role") in ("promoting", "leader"), 30,
               "the follower campaigned")
    cluster.start_node(leader)
    cluster.wait_leader()


def kill_leader_as_a_lease_begins(cluster: QueenCluster, leader: str, workers) -> None:
    """Kill the leader right after it granted a lock (its holder keeps holding past the TTL), so
    the lease is live at the promotion and ends inside promotion + grace: only the grace keeps it."""
    def fresh_grant():
        now = wall_ms()
        return any(e["type"] == "ok" and e.get("f") == "acquire" and e["result"]["results"][0].get("acquired")
                   and now - e["wall"] < 150 for w in workers if w.kind == "W2" for e in read_log(w.log_path))

    wait_until(fresh_grant, 30, "a lock granted")
    struck = mono_ms(), wall_ms()
    kill_leader_restart_later(cluster, leader, workers)
    return struck


# The lease-grace control: one lock with 2 s leases and four workers after it, the holder keeping
# it 9 s; the kill comes right after a grant, so that lease is live at the old leader's last time
# (the EPOCH's clock floor) and the grace (8 s, --lease-grace) owes it until about grant + 8 s. The
# failover takes 2-5 s on a busy machine, and the lease itself ends at grant + 2 s: a sound server
# keeps it to the grace, under the bug a waiter (parked, waitMs 1 s) gets the lock as soon as the new
# leader serves, seconds inside what was owed. No new operation after 16 s.
LEASE_CONTROL = {"workers": (("W1", 2, 40), ("W2", 4, 30)), "hold_s": 9.0, "lock_ttl_s": 2, "deadline_s": 16.0,
                 "locks": ("L0",), "lease_grace_s": 8.0}


# The epoch-check and read-barrier controls: the old leader, cut from etcd and from its clients
# but a pinned reader, keeps serving (N3B_ENV); registers and counters only, as W2's lease ends and
# W4's timers would make the zombie write by itself, and a read waits until every write before it
# is durable, a wait that the sync set's silence would never end, with or without a barrier.
PINNED_READER = {"workers": (("W1", 3, 60), ("W3", 1, 60))}


@pytest.mark.parametrize("flag,nemesis,nodes,sync_mode,env,check,extra", [
    pytest.param("QUEEN_TEST_FOLLOWER_ACK_BEFORE_FSYNC", kill_both_then_follower_leads, 2, "strict", {}, "C1", {}),
    pytest.param("QUEEN_TEST_NO_EPOCH_CHECK", cut_leader_from_etcd_and_clients, 3, None, N3B_ENV, "C3",
                 PINNED_READER),
    pytest.param("QUEEN_TEST_NO_READ_BARRIER", cut_leader_from_etcd_and_clients, 3, None, N3B_ENV, "C2",
                 PINNED_READER),
    pytest.param("QUEEN_TEST_IGNORE_CEILING", force_promote_lagging_async, 3, "strict", {}, "C4", {}),
    pytest.param("QUEEN_TEST_NO_LEASE_GRACE", kill_leader_as_a_lease_begins, 3, None, {}, "C6", LEASE_CONTROL),
])
def test_negative_control_is_caught(tmp_path, flag, nemesis, nodes, sync_mode, env, check, extra):
    outcome = run_scenario(tmp_path, f"control-{flag}", nemesis, nodes=nodes, sync_mode=sync_mode,
                           env={**env, flag: "1"}, **{"hold_s": 0.5, **extra})
    # A search that ran out of budget proves nothing: only a decided violation catches the bug.
    caught = [v for v in outcome.found[check] if v.get("decided", True)]
    assert caught, f"{flag}: {check} saw nothing (the control was not caught): {outcome.found[check][:3]}"


def test_pinned_reader_twin_is_clean(tmp_path):
    """The epoch-check and read-barrier controls' scenario on a sound server: the zombie's
    pinned reads stall and fail, and every check holds."""
    assert_clean(run_scenario(tmp_path, "control-twin-pinned-reader", cut_leader_from_etcd_and_clients,
                              env=N3B_ENV, hold_s=0.5, **PINNED_READER))


def test_follower_ack_control_twin_is_clean(tmp_path):
    """The follower-ack control's scenario on a sound server: the follower fsyncs what it acks, so
    killing both loses no acknowledged write (every check holds)."""
    assert_clean(run_scenario(tmp_path, "control-twin-follower-ack", kill_both_then_follower_leads, nodes=2,
                              sync_mode="strict", hold_s=0.5))


def test_lease_grace_control_twin_is_clean(tmp_path):
    """The lease-grace control's scenario on a sound server: C6 (and every check) holds."""
    assert_clean(run_scenario(tmp_path, "control-twin-lease-grace", kill_leader_as_a_lease_begins, **LEASE_CONTROL))


def test_zz_report_failover_times():
    """Print C8 for every scenario run (a measurement; asserted only with a generous bound)."""
    for result in RESULTS:
        print(f"C8 {result['name']}: failover {result['failover_ms']} ms (goal {FAILOVER_GOAL_MS:.0f}), "
              f"{result['ok_calls']} ok calls, violations {result['violations']}", file=sys.stderr)
