"""The report: every figure of a benchmark session as JSON, and the same as a Markdown page.

Owns: the shape of `results.json` (a later comparison with etcd and Redis adds systems and
workloads as more runs of the same shape), the derived figures (ratio to the do-nothing ceiling,
goals, who was saturated) and their Markdown rendering, pure (documents in, text out); and
`write_outputs`, the one place a report's files are written.
"""

from __future__ import annotations

import json
import os

from bench.systems import CLUSTER_SYSTEMS, PEER_LABELS, PEER_NOTES, SYSTEMS

# A side whose process used at least this share of its core was the one that set the pace.
SATURATED_PCT = 90.0

# CPU busy on the cores that no process of ours was charged for, above which a run is flagged:
# quiet runs show 10-35% (loopback TCP in softirq); more means another process shared the cores.
NEIGHBOUR_PCT = 45.0

# The goals for locks, as data: Queen's lock-cycle pairs/s against a peer's best.
LOCK_GOALS = (
    # etcd's best at any client count and any shape (one lock per txn, or 64 in one all-or-nothing txn).
    {"name": "64 ops/request: Queen ≥ 10× etcd's best lock pairs/s at any client count", "ops": 64,
     "peer": "etcd", "peer_ops": None, "at_least": 10.0},
    {"name": "64 ops/request: Queen ≥ 10× etcd's best with one lock per txn (etcd's usual recipe)", "ops": 64,
     "peer": "etcd", "peer_ops": 1, "at_least": 10.0},
    {"name": "64 ops/request: Queen ≥ 25× etcd's best (further out)", "ops": 64, "peer": "etcd", "peer_ops": None,
     "at_least": 25.0},
    {"name": "64 ops/request: Queen level with Redis appendfsync-always, pipelined 64 (further out)", "ops": 64,
     "peer": "redis-aof", "peer_ops": 64, "at_least": 1.0},
    {"name": "1 op/request, 16 connections: Queen ≥ 1.3× etcd", "ops": 1, "connections": 16, "peer": "etcd",
     "peer_ops": 1, "at_least": 1.3},
)

# The queue targets: durable push at 64 messages per request on the server's one core
# (Queen MQ publishes 104k msg/s batched on 32 vCPUs), twice PostgreSQL's SKIP LOCKED queue for
# push and for pop+ack, and push-to-delivery p99 at half of the peak end-to-end rate.
QUEUE_PUSH_TARGET = 100_000
QUEUE_OVER_POSTGRES = 2.0
QUEUE_P99_TARGET_US = 10_000
# The transaction and timer targets: a workflow step (pop, then one transaction of ack + push + KV
# upsert) at 3x PostgreSQL's same step in one SQL transaction; and timers firing on time with a
# million of them pending (lateness = the fired message's createdAt - the timer's at, server clock).
TXN_OVER_POSTGRES = 3.0
TIMER_P99_TARGET_US = 60_000
TIMER_GOAL_WORKLOAD = "timer-fire pending=1M"

# A server whose WAL spent at least this share of the window inside write+fsync was disk-bound.
DISK_BUSY_PCT = 80.0


def bottleneck(cpu: dict, server_cores: int, generator_cores: int, fsync: dict | None = None,
               durable: bool = False) -> str:
    """Which side set the pace, from CPU use over the measured window: "generator", "server CPU",
    "disk" (the server's fsyncs kept the disk busy most of the window), or, when nothing was
    saturated, "latency" (the closed loop waited on round trips: fsync latency for a durable
    server, or the answers of a lock that makes clients wait). Percentages are of one core and
    summed over a side's processes, so a side saturates at 100% per core it is pinned to."""
    server = cpu["processes_pct_of_core"].get("server", 0.0) / max(1, server_cores)
    generator = cpu["processes_pct_of_core"].get("generator", 0.0) / max(1, generator_cores)
    if generator >= SATURATED_PCT:
        return "generator"
    if server >= SATURATED_PCT:
        return "server CPU"
    if fsync and (fsync.get("fsync_busy_pct") or 0) >= DISK_BUSY_PCT:
        return "disk"
    return "latency (fsync waits)" if durable else "latency"


def server_side_cpu(cpu: dict) -> dict:
    """cpu with "server" standing for every process on the server CPUs: a cluster's leader, its
    standby and etcd share them, so together they are what saturates the server side."""
    processes = cpu["processes_pct_of_core"]
    if "standby" not in processes:
        return cpu
    together = sum(processes.get(role, 0.0) for role in ("server", "standby", "etcd"))
    return dict(cpu, processes_pct_of_core=dict(processes, server=together))


def fsync_figures(system: str, before: dict, after: dict, wall_s: float, disk: dict) -> dict | None:
    """fsyncs per second of a durable server over the window and how much of the disk's measured
    fsync rate they used, from its own metrics (Queen: WAL frames; etcd: WAL fsyncs). Redis
    exposes no fsync count; None there."""
    names = {"queen": ("queen_wal_batches_total", "queen_wal_fsync_seconds_total"),
             "etcd": ("etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_wal_fsync_duration_seconds_sum")}
    if system not in names or not before or not after or names[system][0] not in after:
        return None
    count_name, seconds_name = names[system]
    count = after.get(count_name, 0.0) - before.get(count_name, 0.0)
    seconds = after.get(seconds_name, 0.0) - before.get(seconds_name, 0.0)
    rate = count / wall_s
    limit = (disk or {}).get("fsyncs_per_s")
    return {"fsyncs_per_s": round(rate, 1), "fsync_busy_pct": round(100 * seconds / wall_s, 1),
            "fsync_ms_mean": round(1000 * seconds / count, 3) if count else None,
            "share_of_disk_fsync_rate": round(rate / limit, 3) if limit else None}


def wal_figures(before: dict, after: dict, wall_s: float) -> dict | None:
    """Group commit over the window, from the server's /metrics deltas."""
    if not before or not after or "queen_wal_batches_total" not in after:
        return None

    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    batches = delta("queen_wal_batches_total")
    records = delta("queen_wal_records_total")
    fsync_s = delta("queen_wal_fsync_seconds_total")
    return {
        "frames_per_s": round(batches / wall_s, 1),
        "records_per_s": round(records / wall_s, 1),
        "records_per_frame": round(records / batches, 1) if batches else None,
        "write_fsync_ms_mean": round(1000 * fsync_s / batches, 3) if batches else None,
        "write_fsync_busy_pct": round(100 * fsync_s / wall_s, 1),
        "bytes_per_s": round(delta("queen_wal_bytes_total") / wall_s),
        "snapshots": int(delta("queen_snapshots_total")),
    }


def timer_figures(before: dict, after: dict, wall_s: float) -> dict | None:
    """Queen's own view of its timers over the window, from /metrics: the cross-check of what
    the loader measured. The max is the server's since it started, not the window's."""
    if not before or not after or "queen_timers_fired_total" not in after:
        return None

    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    fired = delta("queen_timers_fired_total")
    late_count = delta("queen_timer_fire_late_seconds_count")
    return {
        "pending_at_start": int(before.get("queen_timers_pending", 0)),
        "pending_at_end": int(after.get("queen_timers_pending", 0)),
        "fired_per_s": round(fired / wall_s, 1),
        "late_ms_mean": round(1000 * delta("queen_timer_fire_late_seconds_sum") / late_count, 2) if late_count else None,
        "late_ms_max_since_start": round(1000 * after.get("queen_timer_fire_late_seconds_max", 0.0), 1),
        "fire_duplicates": int(delta("queen_timer_fire_duplicates_total")),
    }


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def unattributed_pct(cpu: dict) -> float:
    """Busy time of all cores minus what our own processes used, in % of one core."""
    cores = sum(value or 0 for value in cpu["cores_busy_pct"].values())
    ours = sum(cpu["processes_pct_of_core"].values())
    return round(cores - ours, 1)


def derive(document: dict) -> None:
    """Add the summary (median over rounds of each system, workload, ops and connections), the
    ceiling ratios, the Queen / peer ratios and the goals' verdicts to a finished document, in place."""
    noisy = []
    for run in document["runs"]:
        run["unattributed_pct"] = unattributed_pct(run["cpu"])
        if run["unattributed_pct"] > NEIGHBOUR_PCT:
            noisy.append(f"{run['system']} {run['workload']} {run['ops']} op(s) {run['connections']}c"
                         + (" (profiled)" if run.get("profiled") else f" #{run.get('round', 1)}"))
    if noisy:
        document["notes"].append(f"{len(noisy)} run(s) had more than {NEIGHBOUR_PCT:.0f}% of a core busy outside our "
                                 f"processes (another process on the machine, or kernel work): {', '.join(noisy)}. "
                                 "Their rates are likely low; compare medians, or rerun on a quiet machine.")
    groups: dict[tuple, list[dict]] = {}
    for run in document["runs"]:
        if not run.get("profiled"):
            groups.setdefault((run["system"], run["workload"], run["ops"], run["connections"]), []).append(run)
    summary = []
    for (system, workload, ops, connections), runs in groups.items():
        rates = [run["rate_per_s"] for run in runs]
        units = sorted({unit for run in runs for unit in run["units_per_s"]})
        summary.append({
            "system": system, "workload": workload, "unit": runs[0]["unit"], "ops": ops, "connections": connections,
            "rounds": len(runs),
            "rate_per_s": round(_median(rates), 1), "rate_per_s_min": min(rates), "rate_per_s_max": max(rates),
            "units_per_s": {unit: round(_median([run["units_per_s"].get(unit, 0.0) for run in runs]), 1) for unit in units},
            "requests_per_s": round(_median([run["requests_per_s"] for run in runs]), 1),
            "p50_us": _median([run["latency"]["p50_us"] or 0 for run in runs]),
            "p99_us": _median([run["latency"]["p99_us"] or 0 for run in runs]),
            "p99_9_us": _median([run["latency"]["p99_9_us"] or 0 for run in runs]),
            "server_cpu_pct": _median([run["cpu"]["processes_pct_of_core"].get("server", 0) for run in runs]),
            "generator_cpu_pct": _median([run["cpu"]["processes_pct_of_core"].get("generator", 0) for run in runs]),
            "server_us_per_request": _median([run["server_us_per_request"] or 0 for run in runs]),
            **{f"{role}_us_per_request": _median([run.get(f"{role}_us_per_request") or 0 for run in runs])
               for role in ("standby", "etcd") if f"{role}_us_per_request" in runs[0]},
            **{f"{role}_cpu_pct": _median([run["cpu"]["processes_pct_of_core"].get(role, 0) for run in runs])
               for role in ("standby", "etcd") if role in runs[0]["cpu"]["processes_pct_of_core"]},
            "bottleneck": sorted(run["bottleneck"] for run in runs)[len(runs) // 2],
            "durable": runs[0].get("durable", False),
            "fsync": runs[len(runs) // 2].get("fsync"),
            "errors": sum(sum(run["errors"].values()) + run["undrained"] for run in runs),
        })
    ceilings = {row["connections"]: row["requests_per_s"] for row in summary if row["workload"] == "baseline-http"}
    for row in summary:
        ceiling = ceilings.get(row["connections"])
        # The ceiling is one request per round trip; only a one-op KV request is comparable with it.
        if ceiling and row["system"] == "queen" and row["workload"].startswith("kv-") and row["ops"] == 1:
            row["ceiling_ratio"] = round(row["requests_per_s"] / ceiling, 3)
    document["summary"] = summary
    document["comparison"] = comparison(summary)
    document["cluster_comparison"] = cluster_comparison(summary)
    systems = document.get("systems", [])
    document["goals"] = lock_goals(summary, systems) + queue_goals(summary, systems) + txn_timer_goals(summary, systems)


def comparison(summary: list[dict]) -> list[dict]:
    """One row per (workload, ops, connections) Queen ran: each system's headline rate and
    Queen's ratio to each peer."""
    by_shape: dict[tuple, dict] = {}
    for row in summary:
        if row["system"] not in SYSTEMS:
            continue
        shape = by_shape.setdefault((row["workload"], row["ops"], row["connections"]),
                                    {"workload": row["workload"], "ops": row["ops"], "connections": row["connections"],
                                     "unit": row["unit"], "rates": {}, "bottlenecks": {}, "errors": 0})
        shape["rates"][row["system"]] = row["rate_per_s"]
        shape["bottlenecks"][row["system"]] = row["bottleneck"]
        shape["errors"] += row["errors"]
    rows = []
    for shape in by_shape.values():
        queen = shape["rates"].get("queen")
        shape["queen_over"] = {system: (round(queen / rate, 3) if queen is not None and rate else None)
                               for system, rate in shape["rates"].items() if system != "queen"}
        rows.append(shape)
    return rows


def cluster_comparison(summary: list[dict]) -> list[dict]:
    """One row per shape a Queen cluster ran: its rate and latency beside single-node Queen's,
    cluster ÷ single, and what each of its processes spent per request (the leader's extra = its
    µs/req minus single Queen's at the same shape)."""
    singles = {(row["workload"], row["ops"], row["connections"]): row for row in summary if row["system"] == "queen"}
    rows = []
    for row in summary:
        if row["system"] not in CLUSTER_SYSTEMS:
            continue
        single = singles.get((row["workload"], row["ops"], row["connections"]))

        def over(name, row=row, single=single):
            return round(row[name] / single[name], 3) if single and single[name] and row[name] is not None else None

        leader_us = row["server_us_per_request"]
        rows.append({
            "system": row["system"], "workload": row["workload"], "unit": row["unit"], "ops": row["ops"],
            "connections": row["connections"],
            "single_rate": single["rate_per_s"] if single else None, "cluster_rate": row["rate_per_s"],
            "rate_ratio": over("rate_per_s"), "p50_ratio": over("p50_us"), "p99_ratio": over("p99_us"),
            "single_p50_us": single["p50_us"] if single else None, "cluster_p50_us": row["p50_us"],
            "single_p99_us": single["p99_us"] if single else None, "cluster_p99_us": row["p99_us"],
            "single_us_per_request": single["server_us_per_request"] if single else None,
            "leader_us_per_request": leader_us,
            "leader_extra_us_per_request": (round(leader_us - single["server_us_per_request"], 1)
                                            if single and leader_us and single["server_us_per_request"] else None),
            "standby_us_per_request": row.get("standby_us_per_request"),
            "etcd_us_per_request": row.get("etcd_us_per_request"),
            "leader_cpu_pct": row["server_cpu_pct"], "standby_cpu_pct": row.get("standby_cpu_pct"),
            "etcd_cpu_pct": row.get("etcd_cpu_pct"),
            "bottleneck": row["bottleneck"], "single_bottleneck": single["bottleneck"] if single else None,
            "errors": row["errors"] + (single["errors"] if single else 0),
        })
    return rows


def lock_goals(summary: list[dict], systems: list[str]) -> list[dict]:
    verdicts = []
    for goal in LOCK_GOALS:
        queen = [row for row in summary if row["system"] == "queen" and row["workload"] == "lock-cycle"
                 and row["ops"] == goal["ops"] and row["connections"] == goal.get("connections", row["connections"])]
        peer = [row for row in summary if row["system"] == goal["peer"] and row["workload"] == "lock-cycle"
                and row["connections"] == goal.get("connections", row["connections"])
                and (goal["peer_ops"] is None or row["ops"] == goal["peer_ops"])]
        verdict = {"area": "locks", "goal": goal["name"], "at_least": goal["at_least"], "peer": goal["peer"]}
        verdicts.append(_ratio_verdict(verdict, queen, peer, goal["at_least"], systems, "pairs/s"))
    return verdicts


def _ratio_verdict(verdict: dict, queen: list[dict], peer: list[dict], at_least: float, systems: list[str],
                   unit: str) -> dict:
    """Queen's best row against the peer's best: met when the ratio reaches at_least."""
    if not queen or not peer:
        why = "not installed" if verdict["peer"] not in systems else "not measured in this run"
        return dict(verdict, met=None, why=why)
    best_queen = max(queen, key=lambda row: row["rate_per_s"])
    best_peer = max(peer, key=lambda row: row["rate_per_s"])
    ratio = best_queen["rate_per_s"] / best_peer["rate_per_s"] if best_peer["rate_per_s"] else None
    text = (f"Queen {_num(best_queen['rate_per_s'])} {unit} ({best_queen['ops']} op(s)/request, "
            f"{best_queen['connections']} conns) vs {PEER_LABELS[verdict['peer']]} {_num(best_peer['rate_per_s'])} "
            f"({best_peer['ops']} op(s)/request, {best_peer['connections']} conns): {_ratio(ratio)}")
    return dict(verdict, queen=best_queen["rate_per_s"], queen_connections=best_queen["connections"],
                peer_rate=best_peer["rate_per_s"], peer_ops=best_peer["ops"], peer_connections=best_peer["connections"],
                ratio=None if ratio is None else round(ratio, 3), text=text,
                met=None if ratio is None else bool(ratio >= at_least and not best_queen["errors"] and not best_peer["errors"]))


def queue_goals(summary: list[dict], systems: list[str]) -> list[dict]:
    def rows(system, workload, ops=None):
        return [row for row in summary if row["system"] == system and row["workload"] == workload
                and (ops is None or row["ops"] == ops)]

    verdicts = []
    push = rows("queen", "queue-push", 64)
    verdict = {"area": "queues", "goal": f"queue-push, 64 messages/request: Queen ≥ {QUEUE_PUSH_TARGET:,} messages/s, "
                                         "durable, on the server's one core", "peer": None}
    if push:
        best = max(push, key=lambda row: row["rate_per_s"])
        verdicts.append(dict(verdict, queen=best["rate_per_s"], met=bool(best["rate_per_s"] >= QUEUE_PUSH_TARGET
                                                                         and not best["errors"]),
                             text=f"Queen {_num(best['rate_per_s'])} messages/s ({best['connections']} conns, "
                                  f"server CPU {best['server_cpu_pct']:.0f}% of a core)"))
    else:
        verdicts.append(dict(verdict, met=None, why="not measured in this run"))
    for workload, what in (("queue-push", "push"), ("queue-cycle", "pop+ack")):
        for ops in sorted({row["ops"] for row in rows("queen", workload)}) or [64]:
            verdict = {"area": "queues", "peer": "postgres", "at_least": QUEUE_OVER_POSTGRES,
                       "goal": f"{workload}, {ops} message(s)/request: Queen ≥ {QUEUE_OVER_POSTGRES:g}× PostgreSQL "
                               f"SKIP LOCKED for {what}"}
            verdicts.append(_ratio_verdict(verdict, rows("queen", workload, ops), rows("postgres", workload, ops),
                                           QUEUE_OVER_POSTGRES, systems, "messages/s"))
    latency = rows("queen", "queue-latency")
    verdict = {"area": "queues", "peer": None,
               "goal": f"queue-latency: Queen's push → delivery p99 ≤ {QUEUE_P99_TARGET_US / 1000:g} ms at half of its peak"}
    if latency:
        row = latency[0]
        verdicts.append(dict(verdict, queen=row["p99_us"], met=bool(row["p99_us"] <= QUEUE_P99_TARGET_US and not row["errors"]),
                             text=f"p50 {_ms(row['p50_us'])} ms, p99 {_ms(row['p99_us'])} ms at "
                                  f"{_num(row['rate_per_s'])} messages/s delivered"))
    else:
        verdicts.append(dict(verdict, met=None, why="not measured in this run"))
    return verdicts


def txn_timer_goals(summary: list[dict], systems: list[str]) -> list[dict]:
    def rows(system, workload, ops=None):
        return [row for row in summary if row["system"] == system and row["workload"] == workload
                and (ops is None or row["ops"] == ops)]

    verdicts = []
    for ops in sorted({row["ops"] for row in rows("queen", "txn-step")}) or [1]:
        verdict = {"area": "transactions", "peer": "postgres", "at_least": TXN_OVER_POSTGRES,
                   "goal": f"txn-step, {ops} message(s)/pop: Queen ≥ {TXN_OVER_POSTGRES:g}× PostgreSQL's step in one "
                           "SQL transaction (pop + ack + push + KV upsert)"}
        verdicts.append(_ratio_verdict(verdict, rows("queen", "txn-step", ops), rows("postgres", "txn-step", ops),
                                       TXN_OVER_POSTGRES, systems, "steps/s"))
    fire = rows("queen", TIMER_GOAL_WORKLOAD)
    verdict = {"area": "timers", "peer": None,
               "goal": f"{TIMER_GOAL_WORKLOAD}: fire lateness p99 ≤ {TIMER_P99_TARGET_US / 1000:g} ms with a million "
                       "timers pending"}
    if fire:
        row = fire[0]
        verdicts.append(dict(verdict, queen=row["p99_us"], met=bool(row["p99_us"] <= TIMER_P99_TARGET_US and not row["errors"]),
                             text=f"lateness p50 {_ms(row['p50_us'])} ms, p99 {_ms(row['p99_us'])} ms, p99.9 "
                                  f"{_ms(row['p99_9_us'])} ms at {_num(row['rate_per_s'])} fires/s"))
    else:
        verdicts.append(dict(verdict, met=None, why="not measured in this run"))
    return verdicts


def _timer_section(document: dict) -> list[str]:
    """timer-fire's lateness and delivery lag with Queen's own metrics beside them, and what
    timer-schedule left pending. No peer has timers, so these are Queen's alone."""
    fire = [run for run in document["runs"] if run["workload"].startswith("timer-fire") and not run.get("profiled")]
    schedule = [run for run in document["runs"] if run["workload"] == "timer-schedule" and not run.get("profiled")]
    if not fire and not schedule:
        return []
    repeat = document["settings"].get("repeat", 1) > 1

    def name(run):
        return run["workload"] + (f" #{run.get('round', 1)}" if repeat else "")

    lines = ["## Timers (Queen only: Redis, etcd, PostgreSQL and NATS have no durable timers to compare with)", ""]
    if fire:
        lines += ["timer-fire: lateness = the fired message's `createdAt` − the timer's `at` (both the server's clock), "
                  "per timer delivered in the window; its p50/p99 are the \"p50 ms / p99 ms\" of the run tables. "
                  "Delivery lag = the pop answer's arrival (loader's wall clock) − `at`. Metrics: Queen's "
                  "/metrics over the same window (mean from `queen_timer_fire_late_seconds_sum/_count`; its max is "
                  "since the server started, so it carries earlier runs).", "",
                  "| run | pending at start / end | fires/s | scheduled/s | lateness p50 / p99 / p99.9 / max ms "
                  "| delivery lag p50 / p99 / max ms | metrics: fired/s, mean late ms, max late ms | server CPU | errors |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for run in fire:
            latency, lag = run["latency"], run.get("other_histograms", {}).get("delivery_lag") or {}
            timers = run.get("timers") or {}
            errors = sum(run["errors"].values()) + run["undrained"]
            lines.append(
                f"| {name(run)} | {_num(timers.get('pending_at_start'))} / {_num(timers.get('pending_at_end'))} "
                f"| {_num(run['rate_per_s'])} | {_num(run['units_per_s'].get('scheduled'))} "
                f"| {_ms(latency['p50_us'])} / {_ms(latency['p99_us'])} / {_ms(latency['p99_9_us'])} / {_ms(latency['max_us'])} "
                f"| {_ms(lag.get('p50_us'))} / {_ms(lag.get('p99_us'))} / {_ms(lag.get('max_us'))} "
                f"| {_num(timers.get('fired_per_s'))}, {_num(timers.get('late_ms_mean'), 2)}, "
                f"{_num(timers.get('late_ms_max_since_start'), 1)} "
                f"| {run['cpu']['processes_pct_of_core'].get('server', 0):.0f}% | {'**' + str(errors) + '**' if errors else 0} |")
        lines.append("")
    if schedule:
        lines += ["timer-schedule: timers an hour ahead, new keys only; pending at the window's start and end "
                  "(the run's queue is deleted afterwards, with its timers).", "",
                  "| run | ops | conns | timers/s | req/s | p50 / p99 ms | pending at start / end |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for run in schedule:
            timers = run.get("timers") or {}
            lines.append(f"| {name(run)} | {run['ops']} | {run['connections']} | {_num(run['rate_per_s'])} | {_num(run['requests_per_s'])} "
                         f"| {_ms(run['latency']['p50_us'])} / {_ms(run['latency']['p99_us'])} "
                         f"| {_num(timers.get('pending_at_start'))} / {_num(timers.get('pending_at_end'))} |")
        lines.append("")
    return lines


def _cluster_section(document: dict) -> list[str]:
    """A Queen cluster beside single-node Queen, shape by shape; or why it did not run."""
    missing = {system: why for system, why in document.get("peers_missing", {}).items() if system in CLUSTER_SYSTEMS}
    rows = document.get("cluster_comparison", [])
    if not rows and not missing:
        return []
    lines = ["## Queen cluster ÷ single node", ""]
    for system, why in missing.items():
        lines += [f"{PEER_LABELS[system]}: **{why}**.", ""]
    if not rows:
        return lines
    lines += ["The same workloads against the leader of a cluster (one etcd member, leader and synchronous standby, all "
              "on the server CPUs) and against a single Queen. Ratios are cluster ÷ single (rate: below 1 is slower; "
              "latency: above 1 is slower). CPU per request in µs, over the same window: single = the single "
              "Queen's; leader and standby = the cluster's nodes; leader extra = leader − single. etcd works by the "
              "clock (the leader's lease keep-alives, the coordinator's polls, version-ceiling reservations), not "
              "per request, so its column is % of a core. Bound by: the cluster's side counts leader + standby + "
              "etcd together, as they share the server CPUs.", "",
              "| workload | unit | ops | conns | single | cluster | rate ÷ | p50 ms single / cluster | "
              "p99 ms single / cluster | single µs/req | leader µs/req | leader extra | standby µs/req "
              "| CPU % leader / standby / etcd | bound by (single, cluster) |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        errors = f" **{row['errors']} errors**" if row["errors"] else ""
        lines.append(
            f"| {row['workload']} | {row['unit']}/s | {row['ops']} | {row['connections']} | {_num(row['single_rate'])} "
            f"| {_num(row['cluster_rate'])}{errors} | {_num(row['rate_ratio'], 2)} "
            f"| {_ms(row['single_p50_us'])} / {_ms(row['cluster_p50_us'])} "
            f"| {_ms(row['single_p99_us'])} / {_ms(row['cluster_p99_us'])} "
            f"| {_num(row['single_us_per_request'])} | {_num(row['leader_us_per_request'])} "
            f"| {_signed(row['leader_extra_us_per_request'])} | {_num(row['standby_us_per_request'])} "
            f"| {_num(row['leader_cpu_pct'])} / {_num(row['standby_cpu_pct'])} / {_num(row['etcd_cpu_pct'], 1)} "
            f"| {_short_bound(row['single_bottleneck'] or '–')}, {_short_bound(row['bottleneck'])} |")
    lines.append("")
    return lines


def _signed(value):
    return "–" if value is None else f"{value:+,.0f}"


def _ms(value_us):
    return "–" if value_us is None else f"{value_us / 1000:.2f}"


def _num(value, digits=0):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _ratio(value):
    if value is None:
        return "–"
    return f"{value:.2f}×" if value < 10 else f"{value:.1f}×"


def _short_bound(bound: str) -> str:
    return {"server CPU": "CPU", "generator": "gen", "disk": "disk"}.get(bound, "lat" if bound.startswith("latency") else bound)


def markdown(document: dict) -> str:
    m = document["machine"]
    s = document["settings"]
    disk = m.get("disk_fsync") or {}
    lines = [
        f"# Queen benchmark — {document['started_at']}",
        "",
        f"Machine: {m['cpu_model']}, {m['cpus_online']} CPUs, kernel {m['kernel']}, {m['memory_gib']} GiB, "
        f"Python {m['python']}; data dirs on {m.get('data_dir_filesystem', '?')}; queen at {m.get('git_commit')}.",
        f"Disk: {_num(disk.get('fsyncs_per_s'))} fsyncs/s ({disk.get('method', '?')}, {disk.get('duration_s', '?')} s; "
        f"mean {disk.get('mean_us')} µs, p99 {disk.get('p99_us')} µs): the most a server can do with one fsync per "
        "durable write, and the unit of the \"fsync share\" column.",
        f"Servers pinned to CPU {s['server_cpus']}, generators to CPU {s['generator_cpus']} (Queen and Redis: the "
        f"Python raw-socket generator, {s['engine']}, {s['processes']} process(es); etcd, PostgreSQL, NATS, and "
        "queue-peak / queue-latency for every system: the Go loader, bench/peers/peerload). "
        f"Closed loop: each connection keeps one request outstanding. Warm-up {s['warmup_s']} s, measured "
        f"{s['duration_s']} s per run; {s['keys_total']:,} keys. Command: `{document.get('command', '')}`.",
        "",
    ]
    peers = document.get("systems", [])
    missing = document.get("peers_missing", {})
    status = [f"{PEER_LABELS.get(system, system)}: ran" for system in peers if system != "queen"]
    status += [f"{PEER_LABELS.get(system, system)}: **{why}**" for system, why in missing.items()]
    if status:
        lines += ["Peers: " + "; ".join(status) + ".", ""]
    lines += [f"{PEER_NOTES[system]}" for system in peers if system in PEER_NOTES]
    if any(system in PEER_NOTES for system in peers):
        lines.append("")
    comparison_rows = document.get("comparison", [])
    shown = [system for system in SYSTEMS if system in peers or system in missing]
    if comparison_rows and len(shown) > 1:
        peers_only = [system for system in shown if system != "queen"]
        lines += ["## Queen / peers",
                  "",
                  "Headline rate per workload (unit in the second column; median over rounds), then Queen ÷ peer. "
                  "Bound by: CPU = the server used ≥ 90% of its core, gen = the generator did, disk = the server's "
                  "fsyncs kept the disk busy ≥ 80% of the window, lat = neither (the closed loop waited on round "
                  "trips and fsyncs). \"n/a\": the peer has no such operation.",
                  "",
                  "| workload | unit | ops | conns | " + " | ".join(PEER_LABELS[x] for x in shown) + " | "
                  + " | ".join(f"Queen ÷ {PEER_LABELS[x]}" for x in peers_only) + " | bound by (" + ", ".join(
                      PEER_LABELS[x] for x in shown) + ") |",
                  "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in shown) + " | "
                  + " | ".join("---:" for _ in peers_only) + " | --- |"]
        for row in comparison_rows:
            cells = []
            for system in shown:
                if system in missing:
                    cells.append("not installed")
                else:
                    cells.append(_num(row["rates"].get(system)) if system in row["rates"] else "n/a")
            ratios = [("–" if system in missing else _ratio(row["queen_over"].get(system))) for system in peers_only]
            bounds = ", ".join(_short_bound(row["bottlenecks"][x]) if x in row["bottlenecks"] else "–" for x in shown)
            lines.append(f"| {row['workload']} | {row['unit']}/s | {row['ops']} | {row['connections']} | "
                         + " | ".join(cells) + " | " + " | ".join(ratios) + f" | {bounds} |")
        lines.append("")
    lines += _cluster_section(document)
    if document.get("goals"):
        lines += ["## Goals (durable, server and loader on separate cores)", ""]
        for verdict in document["goals"]:
            mark = {True: "MET", False: "NOT MET", None: "?"}[verdict["met"]]
            lines.append(f"- {mark}: {verdict['goal']}: {verdict.get('text') or verdict.get('why')}")
        lines.append("")
    lines += _timer_section(document)
    lines += ["## Every run", "",
              "Rates are per second over the measured window; \"also\" lists the workload's other counters "
              "(acquired = grants, i.e. hand-overs on a contended lock; answers = acquire answers). "
              "CPU in % of one core. fsync share = the server's fsyncs/s ÷ the disk's measured rate (Queen and etcd "
              "report their fsyncs; Redis does not).",
              "",
              "| system | workload | ops | conns | req/s | rate | also | p50 ms | p99 ms | p99.9 ms | server CPU | generator CPU "
              "| server µs/req | fsyncs/s (share) | bound by | errors |",
              "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    cpu_lines = [
        "CPU detail, in % of one core (server = all its threads; main / workers = Queen's event loop and its "
        "WAL threads; cores include kernel and softirq work and any other process; unattributed = both cores' "
        "busy time minus our processes'):",
        "",
        "| system | workload | ops | conns | main / workers | generator µs/req | cpu0 busy | cpu1 busy | steal | unattributed |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in document["runs"]:
        latency = run["latency"]
        cpu = run["cpu"]
        procs = cpu["processes_pct_of_core"]
        threads = cpu.get("server_threads_pct_of_core", {})
        cores = cpu["cores_busy_pct"]
        steal = sum(v or 0 for v in cpu.get("cores_steal_pct", {}).values())
        errors = sum(run["errors"].values()) + run["undrained"]
        name = run["workload"] + (" (profiled)" if run.get("profiled") else "")
        if document["settings"].get("repeat", 1) > 1 and not run.get("profiled"):
            name += f" #{run.get('round', 1)}"
        also = ", ".join(f"{unit} {_num(rate)}" for unit, rate in run["units_per_s"].items() if unit != run["unit"])
        fsync = run.get("fsync")
        fsync_cell = (f"{_num(fsync['fsyncs_per_s'])} ({100 * fsync['share_of_disk_fsync_rate']:.1f}%)"
                      if fsync and fsync.get("share_of_disk_fsync_rate") is not None else "–")
        lines.append(
            f"| {run['system']} | {name} | {run['ops']} | {run['connections']} | {_num(run['requests_per_s'])} "
            f"| {_num(run['rate_per_s'])} {run['unit']} | {also} "
            f"| {_ms(latency['p50_us'])} | {_ms(latency['p99_us'])} | {_ms(latency['p99_9_us'])} "
            f"| {procs.get('server', 0):.0f}% | {procs.get('generator', 0):.0f}% | {_num(run['server_us_per_request'])} "
            f"| {fsync_cell} | {run['bottleneck']} | {'**' + str(errors) + '**' if errors else 0} |")
        main_workers = (f"{max(0.0, threads.get('main thread', 0)):.0f}% / {max(0.0, threads.get('other threads', 0)):.0f}%"
                        if threads else "–")
        cpu_lines.append(
            f"| {run['system']} | {name} | {run['ops']} | {run['connections']} | {main_workers} "
            f"| {_num(run['generator_us_per_request'])} | {_num(cores.get('cpu0'))}% | {_num(cores.get('cpu1'))}% "
            f"| {steal:.1f}% | {max(0.0, run.get('unattributed_pct', 0)):.0f}% |")
    lines += [""] + cpu_lines + [""]
    summary = document.get("summary", [])
    if document["settings"].get("repeat", 1) > 1:
        lines += [f"Median of {document['settings']['repeat']} interleaved rounds (range of the rate in brackets):", "",
                  "| system | workload | ops | conns | rate | p50 ms | p99 ms | p99.9 ms | server CPU µs/req | errors |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in summary:
            lines.append(f"| {row['system']} | {row['workload']} | {row['ops']} | {row['connections']} "
                         f"| {_num(row['rate_per_s'])} {row['unit']} ({_num(row['rate_per_s_min'])}–{_num(row['rate_per_s_max'])}) "
                         f"| {_ms(row['p50_us'])} | {_ms(row['p99_us'])} | {_ms(row['p99_9_us'])} "
                         f"| {_num(row['server_us_per_request'])} | {row['errors']} |")
        lines.append("")
    ratios = [row for row in summary if "ceiling_ratio" in row]
    if ratios:
        lines += ["Share of the do-nothing HTTP ceiling (Queen 1-op KV req/s ÷ baseline-http req/s at the same connections):", ""]
        for row in ratios:
            lines.append(f"- {row['workload']}, {row['connections']} connections: {100 * row['ceiling_ratio']:.0f}%")
        lines.append("")
    wal_runs = [run for run in document["runs"] if run.get("wal")]
    if wal_runs:
        lines += ["Queen's group commit over each window (from its /metrics):", "",
                  "| workload | ops | conns | frames/s | records/frame | write+fsync ms/frame | writer busy in write+fsync | snapshots |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for run in wal_runs:
            wal = run["wal"]
            lines.append(f"| {run['workload']}{' (profiled)' if run.get('profiled') else ''} | {run['ops']} | {run['connections']} "
                         f"| {_num(wal['frames_per_s'])} | {_num(wal['records_per_frame'], 1)} | {_num(wal['write_fsync_ms_mean'], 3)} "
                         f"| {_num(wal['write_fsync_busy_pct'], 1)}% | {wal['snapshots']} |")
        lines.append("")
    for run in document["runs"]:
        if run.get("profile"):
            lines += _profile_section(run)
    failed = [run for run in document["runs"] if run["errors"] or run["undrained"]]
    if failed:
        lines += ["## ERRORS", ""]
        for run in failed:
            lines.append(f"- **{run['system']} {run['workload']} {run['ops']} op(s), {run['connections']} connections: "
                         f"{run['errors']}; {run['undrained']} request(s) never answered**")
            for sample in run["error_samples"]:
                lines.append(f"  - `{sample[:200]}`")
        lines.append("")
    for note in document.get("notes", []):
        lines.append(f"Note: {note}")
    if document.get("chart"):
        lines += ["", f"![throughput and latency per workload and system]({document['chart']})"]
    return "\n".join(lines).rstrip() + "\n"


def _profile_section(run: dict) -> list[str]:
    profile = run["profile"]
    title = f"Server CPU by layer, {run['system']} {run['workload']} {run['ops']} op(s)/request, {run['connections']} connections"
    if "error" in profile:
        return [f"{title}: profile failed: {profile['error']}", ""]
    threads = run["cpu"].get("server_threads_pct_of_core", {})
    loop_pct = threads.get("main thread", run["cpu"]["processes_pct_of_core"].get("server", 0))
    rate = run["requests_per_s"] or 1
    loop = profile["event_loop"]
    lines = [f"{title} (py-spy at {profile.get('rate_hz')} Hz, profiled run: {_num(rate)} req/s). "
             f"Event-loop thread, {loop_pct:.0f}% of a core by /proc, {loop['samples']} samples; "
             "µs/req = its CPU per request × share:", "",
             "| layer (innermost recognized frame) | share | µs/req |", "| --- | ---: | ---: |"]
    for row in loop["layers"]:
        lines.append(f"| {row['name']} | {row['pct']}% | {row['pct'] / 100 * loop_pct / 100 / rate * 1e6:.1f} |")
    stages = ", ".join(f"{row['name']} {row['pct']}%" for row in loop.get("stages_inclusive", []))
    top = ", ".join(f"`{row['name']}` {row['pct']}%" for row in loop["top_functions_self"][:8])
    lines += ["", f"Stages, inclusive (they nest, so they overlap): {stages}.", "", f"Top self frames: {top}.", ""]
    workers = profile.get("workers", {})
    if workers.get("samples"):
        worker_pct = threads.get("other threads")
        cpu_note = f"{worker_pct:.0f}% of a core by /proc" if worker_pct is not None else "CPU unknown"
        spread = ", ".join(f"{row['name']} {row['pct']}%" for row in workers["layers"])
        lines += [f"Worker threads ({cpu_note}; {workers['samples']} samples while busy, "
                  f"{workers.get('idle_samples_dropped', 0)} idle dropped): {spread}.", ""]
    return lines


def write_outputs(document: dict, out_dir: str, with_chart: bool = True) -> str:
    """results.json, chart.png (unless asked not to, or matplotlib is missing) and results.md in
    out_dir; returns the Markdown. The JSON is written first, so a chart that fails cannot lose
    the figures, and again once the chart is in."""
    def dump() -> None:
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(document, f, indent=1)

    dump()
    if with_chart:
        try:
            from bench import chart
            chart.render(document, os.path.join(out_dir, "chart.png"))
            document["chart"] = "chart.png"
        except ImportError as error:
            document["notes"].append(f"no chart: {error} (pip install -e '.[bench]' brings matplotlib)")
        dump()
    text = markdown(document)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    return text
