"""`python -m bench`: start the servers under test, run the workloads against them, write the report.

A session: measure the data disk's fsync rate (the physical limit of every durable figure); start
every server the chosen workloads and peers need (a fresh `queen serve` on a temporary data
directory, the do-nothing baseline on Queen's HTTP layer, Redis with appendfsync always and without
persistence, single-node etcd, PostgreSQL 15, NATS with JetStream), each pinned to the server CPU,
and wait until each answers; run every (workload, connections, ops per request, system),
`--repeat` rounds interleaved, with the generator pinned to the generator CPU (the raw-socket
generator for Queen and Redis, the Go loader for etcd, PostgreSQL, NATS and queue latency); stop
each server with SIGTERM by its pid. Then results.json,
results.md and chart.png go to the out directory and the Markdown is printed. A peer that is not
installed is reported as such, never skipped in silence. The exit status is 1 when any run saw an
error, so a script cannot mistake a broken run for a slow one.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import shutil
import signal
import sys
import tempfile
import time

from bench import diskprobe, queue_sessions, report, sysinfo
from bench.cluster import CLUSTER_SIZES, QueenCluster, cluster_missing, cluster_system
from bench.loadgen import ENGINES, Generator
from bench.profile import Profiler
from bench.servers import (
    HOST,
    ServerProcess,
    baseline_server,
    etcd_server,
    loader_built,
    nats_server,
    peer_missing,
    postgres_server,
    queen_server,
    redis_call,
    redis_server,
)
from bench.sessions import authorized, redis_setup_commands
from bench.systems import CLUSTER_SYSTEMS, DURABLE_SYSTEMS
from bench.workloads import (
    FAMILY,
    KEYS_TOTAL,
    SYSTEM_ORDER,
    TIMER_FIRE_RATE,
    WORKLOADS,
    Workload,
    preload_requests,
    redis_preload_commands,
)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_WORKLOADS = ("lock-cycle,lock-renew,lock-hot,lock-hot-wait,sem8,sem8-wait,kv-put,kv-get,kv-cas,txn-guarded,"
                     "queue-push,queue-cycle,queue-peak,queue-latency,txn-step,timer-schedule,timer-fire,baseline-http")
QUICK_WORKLOADS = "lock-cycle,lock-hot-wait,kv-put,kv-cas,txn-guarded,queue-push,queue-cycle,txn-step,timer-schedule"
PEERS = {"redis": ("redis-aof", "redis-mem"), "etcd": ("etcd",), "postgres": ("postgres",), "nats": ("nats",)}
# Messages a queue-cycle run starts with, per family: what the fastest run of it measured on a
# 2-core VM consumes in a 12 s run at 64 messages per pop, times 1.3-1.6 (a Redis, PostgreSQL or
# NATS consumer owns a sixteenth of the partitions, so one that finishes its share early would
# find nothing). A run that drains a queue anyway says so (error "ran_dry"): raise --queue-preload.
QUEUE_PRELOAD = {"queen": 1_200_000, "redis": 3_000_000, "postgres": 800_000, "nats": 1_000_000}
# timer-fire: the far-future timers pending while it measures, one run per value.
TIMER_PENDING = [10_000, 1_000_000]


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("give at least one integer, each at least 1")
    return values


def _cpu_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()] if text else []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Load-test Queen (locks, semaphores, KV, guarded transactions, queues) side by side with Redis, "
                    "etcd, PostgreSQL and NATS JetStream and a do-nothing HTTP ceiling; write results.json, "
                    "results.md and chart.png. Run from the repository root.")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds sent before measuring (default 2)")
    parser.add_argument("--connections", type=_int_list, default=[1, 16, 64],
                        help="comma list of connection counts (default 1,16,64)")
    parser.add_argument("--ops", type=_int_list, default=[1, 64], help="comma list of operations per request (default 1,64)")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                        help=f"comma list, run in this order; known: {', '.join(WORKLOADS)} (default {DEFAULT_WORKLOADS})")
    parser.add_argument("--peers", default="redis,etcd,postgres,nats",
                        help="comma list of peers run beside Queen: redis (appendfsync always, and no persistence), "
                             "etcd, postgres (15, synchronous_commit on), nats (JetStream, file storage); 'none' for "
                             "Queen alone (default redis,etcd,postgres,nats)")
    parser.add_argument("--cluster", type=int, choices=CLUSTER_SIZES, default=None, metavar="N",
                        help="also run Queen as an N-node cluster on loopback (one etcd member, a leader and a "
                             "synchronous standby, all pinned to the server CPUs) and report it beside single-node "
                             "Queen, as cluster ÷ single; N is 2 (the leader keeps one follower in its sync set)")
    parser.add_argument("--out", default=None, help="output directory (default bench/out/<timestamp>)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke check under 60 s: 1 s runs after 0.3 s warm-up, 16 connections, 1 and 64 ops, "
                             f"workloads {QUICK_WORKLOADS} unless --workloads says otherwise; checks the harness, not "
                             "the servers")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every run, interleaved; the summary takes the median (default 1)")
    parser.add_argument("--processes", type=int, default=1, help="generator processes, all pinned to the generator CPUs (default 1)")
    parser.add_argument("--engine", choices=ENGINES, default="selectors", help="generator socket engine (default selectors)")
    parser.add_argument("--tls", action="store_true",
                        help="serve Queen and the HTTP-layer baseline over HTTPS (a throwaway CA and certificate made "
                             "with openssl in the output directory; the generator trusts that CA); the peers stay as "
                             "they are. Not for the Go loader's workloads")
    parser.add_argument("--server-cpus", type=_cpu_list, default=[0], help="CPUs the server is pinned to (default 0)")
    parser.add_argument("--generator-cpus", type=_cpu_list, default=[1], help="CPUs the generator is pinned to (default 1)")
    parser.add_argument("--keys", type=int, default=KEYS_TOTAL, help=f"distinct keys, bounding the rows (default {KEYS_TOTAL})")
    parser.add_argument("--queue-preload", type=int, default=None, metavar="N",
                        help="messages in the queue when a queue-cycle run starts (default: per system, enough for a "
                             "12 s run at the fastest rate measured on a 2-core VM at 64 per pop, scaled by the run's "
                             "length; 1/8 of that at 1 per pop)")
    parser.add_argument("--timer-pending", type=_int_list, default=TIMER_PENDING, metavar="LIST",
                        help="timer-fire: comma list of far-future timers pending in the server while it measures, "
                             "one run each (default 10000,1000000)")
    parser.add_argument("--timer-rate", type=int, default=TIMER_FIRE_RATE, metavar="R",
                        help=f"timer-fire: timers falling due per second (default {TIMER_FIRE_RATE})")
    parser.add_argument("--profile", action="store_true",
                        help="after the clean runs, run each workload again with py-spy on its server and report CPU by layer")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                        help="before each run, wait up to S seconds for the machine to be idle (both cores together "
                             "under 15%% busy); for shared hosts (default 0: don't wait)")
    parser.add_argument("--data-parent", default=None,
                        help="directory that holds the temporary data dir (default: the system temp dir); it must be a "
                             "real disk for the durability figures to mean anything")
    parser.add_argument("--keep-data", action="store_true", help="keep the servers' data dirs after the session")
    parser.add_argument("--no-chart", action="store_true", help="skip chart.png (it needs matplotlib: pip install -e '.[bench]')")
    return parser


def chosen_systems(args) -> tuple[list[str], dict[str, str]]:
    """(systems to run, {system: why it cannot run}) for --peers; Queen always runs."""
    names = [name.strip() for name in args.peers.split(",") if name.strip() and name.strip() != "none"]
    unknown = [name for name in names if name not in PEERS]
    if unknown:
        raise SystemExit(f"bench: unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    systems, missing = ["queen"], {}
    if args.cluster:
        why = cluster_missing()
        if why is None:
            systems.append(cluster_system(args.cluster))
        else:
            missing[cluster_system(args.cluster)] = why
    for name in names:
        for system in PEERS[name]:
            why = peer_missing(system)
            if why is None:
                systems.append(system)
            else:
                missing[system] = why
    return systems, missing


def plan_runs(args, systems: list[str]) -> list[tuple[Workload, str, int, int, bool]]:
    """(workload, system, ops, connections, profiled) in run order: the systems of one shape run
    next to each other, so a slow minute on a shared host hits them alike."""
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise SystemExit(f"bench: unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if "queue-latency" in names and "queue-peak" not in names:  # its pace is half of queue-peak's rate
        names.insert(names.index("queue-latency"), "queue-peak")
    runs = []
    for name in names:
        if name == "timer-fire":  # one run per pending count, each named after it
            variants = [dataclasses.replace(WORKLOADS[name], name=f"{name} pending={_count_label(n)}", timer_pending=n)
                        for n in args.timer_pending]
        else:
            variants = [WORKLOADS[name]]
        for workload in variants:
            _plan_workload(workload, args, systems, runs)
    if args.profile:  # the profiler reads Python stacks: Queen and the baseline only
        runs += [(w, system, ops, c, True) for w, system, ops, c, _ in list(runs) if system in ("queen", "baseline")]
    return runs


def _count_label(n: int) -> str:
    """10000 -> 10k, 1000000 -> 1M (as written in the report)."""
    for size, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def _plan_workload(workload: Workload, args, systems: list[str], runs: list) -> None:
    for connections in ([workload.fixed_connections] if workload.fixed_connections else args.connections):
        for ops in ([workload.fixed_ops] if workload.fixed_ops else args.ops):
            for system in SYSTEM_ORDER:
                if (system == "baseline" or system in systems) and FAMILY[system] in workload.drivers:
                    if isinstance(workload.drivers[FAMILY[system]], str) and not loader_built():
                        continue  # said once, in main
                    runs.append((workload, system, ops, connections, False))


def _say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def _sleep_until_ns(deadline_ns: int) -> None:
    delay = (deadline_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


def preload(system: str, server: ServerProcess, keys_total: int) -> None:
    """Every key of the key space written once, so reads find what they ask for."""
    if FAMILY[system] == "queen":
        with authorized(server.token):
            requests = preload_requests(HOST, server.port, keys_total)
        for request in requests:
            status, body = server.post(request)
            if status != 200 or b'"applied":false' in body:
                raise RuntimeError(f"preload failed: HTTP {status} {body[:300]!r}")
    elif FAMILY[system] == "redis":
        commands = redis_preload_commands(keys_total)
        for start in range(0, len(commands), 500):
            replies = redis_call(server.port, commands[start:start + 500])
            if any(reply != b"OK" for reply in replies):
                raise RuntimeError(f"redis preload failed: {replies[:3]!r}")
    elif FAMILY[system] == "etcd":
        from bench.peers.loader import preload as etcd_preload
        etcd_preload(server.port, keys_total)


_run_counter = 0


def run_tag() -> str:
    """A short tag unique to this run: lock names and CAS keys carry it, so what one run leaves held
    (a drained run sends no release) never meets the next one."""
    global _run_counter
    _run_counter += 1
    return f"r{os.getpid() % 1000}x{int(time.time()) % 100000}n{_run_counter}"


def queue_preload_size(args, system: str, ops: int) -> int:
    if args.queue_preload is not None:
        return args.queue_preload
    planned = QUEUE_PRELOAD[FAMILY[system]] * (args.warmup + args.duration) / 12.0
    return max(10_000, int(planned if ops >= 16 else planned / 4))


def make_generator(args, system: str, server: ServerProcess, workload: Workload, ops: int, connections: int, tag: str,
                   loader_args: tuple = ()):
    driver = workload.drivers[FAMILY[system]]
    if isinstance(driver, str):  # the Go loader's workload
        if server.ca_file is not None:
            raise SystemExit(f"bench: {workload.name} runs on the Go loader, which does not speak TLS; run it without --tls")
        from bench.peers.loader import PeerLoader
        return PeerLoader(HOST, server.port, FAMILY[system], driver, workload.loader_ops or ops, connections,
                          cpus=args.generator_cpus or None, keys_total=args.keys, tag=tag, extra=loader_args)
    return Generator(HOST, server.port, workload, system, ops, connections, processes=args.processes,
                     engine=args.engine, cpus=args.generator_cpus or None, keys_total=args.keys, tag=tag,
                     ca_file=server.ca_file)


def prepare_queue(args, system: str, server: ServerProcess, workload: Workload, ops: int, tag: str) -> tuple:
    """Make the run's queue (and fill it, for queue-cycle) when the Python generator drives the
    system; for the Go loader, the flags that make it do the same in its setup."""
    preload = queue_preload_size(args, system, ops) if workload.preload_queue else 0
    family = FAMILY[system]
    if isinstance(workload.drivers[family], str):
        return ("-queue-preload", str(preload)) if preload else ()
    if preload:
        _say(f"  preloading {preload:,} messages into {system}")
    if family == "queen":
        requests = [queue_sessions.queen_configure(HOST, server.port, tag)]
        if workload.next_queue:
            requests.append(queue_sessions.queen_configure(HOST, server.port, tag, queue_sessions.next_queue_name(tag)))
        requests += queue_sessions.queen_preload(HOST, server.port, tag, preload)
        for request in requests:
            status, body = server.post(request)
            if status != 200 or (b'"status":' in body and body.count(b'"status":"queued"') != body.count(b'"status":')):
                raise RuntimeError(f"queue preload failed: HTTP {status} {body[:300]!r}")
    elif family == "redis":
        commands = queue_sessions.redis_queue_setup(tag) + queue_sessions.redis_preload(tag, preload)
        for start in range(0, len(commands), 5000):
            replies = redis_call(server.port, commands[start:start + 5000])
            if any(not isinstance(reply, bytes) for reply in replies):
                raise RuntimeError(f"redis queue preload failed: {[r for r in replies if not isinstance(r, bytes)][:3]!r}")
    return ()


def drop_queue(system: str, server: ServerProcess, workload: Workload, tag: str) -> None:
    """Delete what the Python side made for the run (the Go loader removes its own), so the next
    run starts on a server that does not carry this one's messages."""
    family = FAMILY[system]
    if isinstance(workload.drivers[family], str):
        return
    if family == "queen":
        queues = [queue_sessions.queue_name(tag)] + ([queue_sessions.next_queue_name(tag)] if workload.next_queue else [])
        for queue in queues:
            status, body = server.post(queue_sessions.queen_delete(HOST, server.port, tag, queue))
            if status != 200:
                raise RuntimeError(f"deleting the run's queue {queue} failed: HTTP {status} {body[:300]!r}")
    elif family == "redis":
        redis_call(server.port, queue_sessions.redis_delete(tag))


def run_one(args, system: str, server: ServerProcess, workload: Workload, ops: int, connections: int, profiled: bool,
            out_dir: str, disk: dict, loader_args: tuple = ()) -> dict:
    # A Queen with an auth file: every request built for it (here and in the generator processes,
    # forked inside) carries its token.
    with authorized(server.token):
        return _run_one(args, system, server, workload, ops, connections, profiled, out_dir, disk, loader_args)


def _run_one(args, system: str, server: ServerProcess, workload: Workload, ops: int, connections: int, profiled: bool,
             out_dir: str, disk: dict, loader_args: tuple) -> dict:
    tag = run_tag()
    if isinstance(server, QueenCluster):
        server.wait_ready()  # the leader may have moved, or its standby be catching up: measure neither
    if workload.queue:
        loader_args = loader_args + prepare_queue(args, system, server, workload, ops, tag)
    generator = make_generator(args, system, server, workload, ops, connections, tag, loader_args)
    try:
        return measure(args, system, server, workload, ops, connections, profiled, out_dir, disk, generator)
    finally:
        if workload.queue:
            drop_queue(system, server, workload, tag)


def measure(args, system: str, server: ServerProcess, workload: Workload, ops: int, connections: int, profiled: bool,
            out_dir: str, disk: dict, generator) -> dict:
    duration_s, warmup_s = args.duration, args.warmup
    generator.start()
    is_queen = FAMILY[system] == "queen"  # a cluster's figures are its leader's
    has_metrics = FAMILY[system] in ("queen", "etcd")
    _, t_measure, t_end = generator.go(warmup_s, duration_s)
    _sleep_until_ns(t_measure)
    profiler = None
    if profiled:
        name = f"profile-{system}-{workload.name}-{ops}ops-{connections}c.txt"
        profiler = Profiler(server.pid, duration_s, os.path.join(out_dir, name), args.generator_cpus or None)
        profiler.start()
    pids = {"server": [server.pid], "generator": generator.pids}
    cluster = isinstance(server, QueenCluster)
    if cluster:  # the standby and etcd, each its own column: "server" stays the leader
        pids.update(server.cpu_roles())
    if profiler is not None:
        pids["profiler"] = [profiler.process.pid]
    metrics_before = server.metrics() if has_metrics else {}
    cpu_before = sysinfo.CpuSample(pids, split_pid=server.pid)
    _sleep_until_ns(t_end)
    cpu_after = sysinfo.CpuSample(pids, split_pid=server.pid)
    metrics_after = server.metrics() if has_metrics else {}
    tally = generator.finish()
    cpu = cpu_after.since(cpu_before)
    if server.process.poll() is not None:
        tally.error("server_died", f"{server.name} exited with {server.process.returncode} during the run")
    if cluster:
        trouble = server.check_after_run()
        if trouble:  # a failover or a dropped standby: the figures are not those of leader + sync standby
            tally.error("cluster_changed", trouble)
    if tally.completed == 0:
        # Nothing answered inside the window: a stalled server or loader, never a rate of zero.
        tally.error("no_answers", f"no request completed in the {duration_s} s window ({tally.answered} answered in all)")
    wall_s = duration_s  # the window the generator counted in; cpu["wall_s"] is the sampler's view of it
    units_per_s = {unit: round(count / wall_s, 1) for unit, count in sorted(tally.units.items())}
    run = {
        "workload": workload.name,
        "system": system,
        "target": system,
        "description": workload.description,
        "unit": workload.unit,
        "ops": ops,
        "connections": connections,
        "profiled": profiled,
        "requests": tally.completed,
        "requests_per_s": round(tally.completed / wall_s, 1),
        "rate_per_s": units_per_s.get(workload.unit, 0.0),
        "units_per_s": units_per_s,
        "ops_per_s": units_per_s.get(workload.unit, 0.0),
        "latency": tally.histogram.summary_us(),
        "histogram": tally.histogram.to_wire(),
        "errors": tally.errors,
        "error_samples": tally.error_samples,
        "undrained": tally.undrained,
        "answered_total": tally.answered,
        "mib_received_per_s": round(tally.bytes_received / (1 << 20) / (wall_s + warmup_s), 2),
        "cpu": cpu,
        "wal": report.wal_figures(metrics_before, metrics_after, cpu["wall_s"]) if is_queen else None,
        "timers": (report.timer_figures(metrics_before, metrics_after, cpu["wall_s"])
                   if is_queen and workload.name.startswith("timer-") else None),
        "other_histograms": {name: h.summary_us() for name, h in tally.histograms.items()},
        "fsync": report.fsync_figures(FAMILY[system], metrics_before, metrics_after, cpu["wall_s"], disk),
        "durable": system in DURABLE_SYSTEMS,
    }
    run["generator_us_per_request"] = (round(cpu["processes_pct_of_core"]["generator"] / 100 / run["requests_per_s"] * 1e6, 1)
                                       if run["requests_per_s"] else None)
    run["server_us_per_request"] = (round(cpu["processes_pct_of_core"]["server"] / 100 / run["requests_per_s"] * 1e6, 1)
                                    if run["requests_per_s"] else None)
    if cluster:
        for role in ("standby", "etcd"):
            run[f"{role}_us_per_request"] = (round(cpu["processes_pct_of_core"][role] / 100 / run["requests_per_s"] * 1e6, 1)
                                             if run["requests_per_s"] else None)
    run["bottleneck"] = report.bottleneck(report.server_side_cpu(cpu), len(args.server_cpus) or os.cpu_count(),
                                          len(args.generator_cpus) or os.cpu_count(), run["fsync"], run["durable"])
    if profiler is not None:
        run["profile"] = profiler.finish()
    return run


def start_servers(targets: list[str], args, out_dir: str, data_parent: str) -> tuple[dict, dict, dict]:
    """Every server the session needs, started and healthy: ({target: server}, {target: data dir},
    {target: why it did not start}). Only a cluster may fail to start without ending the session:
    it is new, and single-node Queen's figures stand without it."""
    servers, data_dirs, failed = {}, {}, {}
    cpus = args.server_cpus or None
    try:
        for target in targets:
            log_path = os.path.join(out_dir, f"server-{target}.log")
            if target != "baseline":
                data_dirs[target] = tempfile.mkdtemp(prefix=f"{target}-bench-", dir=data_parent)
            if target == "queen":
                server = queen_server(data_dirs[target], log_path, cpus, REPO_ROOT,
                                      tls_dir=os.path.join(out_dir, "tls-queen") if args.tls else None)
            elif target in CLUSTER_SYSTEMS:
                if args.tls:
                    raise SystemExit("bench: --cluster runs without --tls")
                server = QueenCluster(target, args.cluster, data_dirs[target], out_dir, cpus, REPO_ROOT)
            elif target == "baseline":
                server = baseline_server(log_path, cpus, REPO_ROOT,
                                         tls_dir=os.path.join(out_dir, "tls-baseline") if args.tls else None)
            elif target.startswith("redis"):
                server = redis_server(target, data_dirs[target], log_path, cpus)
            elif target == "postgres":
                server = postgres_server(data_dirs[target], log_path, cpus)
            elif target == "nats":
                server = nats_server(data_dirs[target], log_path, cpus)
            else:
                server = etcd_server(data_dirs[target], log_path, cpus)
            servers[target] = server
            if isinstance(server, QueenCluster):
                _say(f"starting {server.name}: data dirs under {data_dirs[target]}")
                try:
                    server.start()
                except RuntimeError as error:
                    _say(f"  FAILED: {error}")
                    failed[target] = f"failed to start: {error}"
                    continue
                _say(f"  etcd on {HOST}:{server.etcd.port}, nodes on "
                     f"{', '.join(f'{HOST}:{node.port}' for node in server.nodes)}; "
                     f"{server.leader.name} leads epoch {server.epoch}, its standby in sync")
            else:
                _say(f"starting {server.name}" + (f", data dir {data_dirs[target]}" if target in data_dirs else ""))
                server.start()  # on the port it picked, which it is known by from here
                _say(f"  on {HOST}:{server.port}")
            if FAMILY[target] == "redis":
                replies = redis_call(server.port, redis_setup_commands())
                if any(not isinstance(reply, bytes) for reply in replies):
                    raise RuntimeError(f"{target}: SCRIPT LOAD failed: {replies!r}")
    except BaseException:
        stop_servers(servers, data_dirs, args, {"servers": [], "notes": []})
        raise
    return servers, data_dirs, failed


def stop_servers(servers: dict, data_dirs: dict, args, document: dict) -> None:
    for target, server in servers.items():
        server.stop()
        for process in (server.members if isinstance(server, QueenCluster) else [server]):
            if process.process is None:  # never started (a cluster node after an earlier one failed)
                continue
            document["servers"].append({"name": process.name, "pid": process.process.pid if process.process else None,
                                        "port": process.port, "exit_code": process.exit_code, "killed": process.killed,
                                        "log": os.path.basename(process.log_path)})
            # etcd and Redis end on SIGTERM by re-raising it (exit -15 as Popen sees it), and nats-server
            # 2.9 exits 1 after logging a clean shutdown: each is a clean stop.
            clean = (0, -signal.SIGTERM, 1) if target == "nats" else (0, -signal.SIGTERM)
            if process.exit_code not in clean or process.killed:
                document["notes"].append(f"{process.name} exited with {process.exit_code}"
                                         f"{' after SIGKILL' if process.killed else ''}; see "
                                         f"{os.path.basename(process.log_path)}")
        if target in data_dirs and not args.keep_data:
            shutil.rmtree(data_dirs[target], ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 1.0, 0.3
        explicit = set(argv if argv is not None else sys.argv[1:])
        if "--workloads" not in explicit:
            args.workloads = QUICK_WORKLOADS
        if "--connections" not in explicit:
            args.connections = [16]
    systems, missing = chosen_systems(args)
    for system, why in missing.items():
        _say(f"{system}: {why}")
    runs = plan_runs(args, systems)
    unbuilt = sorted({name for name in args.workloads.split(",") if name.strip() in WORKLOADS
                      and isinstance(WORKLOADS[name.strip()].drivers.get("queen"), str)}) if not loader_built() else []
    if unbuilt:
        _say(f"{', '.join(unbuilt)}: not run, they need the Go loader (run bench/peers/install.sh)")
    started = datetime.datetime.now()
    out_dir = args.out or os.path.join(REPO_ROOT, "bench", "out", started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    if args.generator_cpus:
        os.sched_setaffinity(0, args.generator_cpus)  # this process only waits, but keep it off the server's core
    data_parent = args.data_parent or tempfile.gettempdir()
    _say(f"measuring the data disk's fsync rate under {data_parent}")
    disk = diskprobe.fsync_rate(data_parent, 0.5 if args.quick else 2.0)
    _say(f"  {disk['fsyncs_per_s']:,.0f} fsyncs/s (4 KiB write + fdatasync), mean {disk['mean_us']} us")
    document = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), "-m", "bench"] + (argv if argv is not None else sys.argv[1:])),
        "machine": dict(sysinfo.machine(data_parent), disk_fsync=disk),
        "settings": {"duration_s": args.duration, "warmup_s": args.warmup, "repeat": args.repeat,
                     "engine": args.engine, "processes": args.processes, "server_cpus": args.server_cpus,
                     "generator_cpus": args.generator_cpus, "keys_total": args.keys,
                     "wait_quiet_s": args.wait_quiet, "connections": args.connections, "ops": args.ops,
                     "workloads": args.workloads, "peers": args.peers, "cluster": args.cluster},
        "systems": systems,
        "peers_missing": missing,
        "runs": [],
        "servers": [],
        "notes": [f"{', '.join(unbuilt)} not run: the Go loader that drives them (bench/peers/peerload) is not built; "
                  "run bench/peers/install.sh"] if unbuilt else [],
    }
    if document["machine"].get("data_dir_filesystem") in ("tmpfs", "ramfs"):
        document["notes"].append(f"the data dir is on {document['machine']['data_dir_filesystem']}: fsync is free there, "
                                 "so durable-write figures are not meaningful")
    targets = [system for system in SYSTEM_ORDER if any(run[1] == system for run in runs)]
    # Every server stays up for the whole session (an idle one costs nothing), so the rounds can
    # interleave the workloads: a slow minute on a shared host then spreads over all of them
    # instead of landing on one.
    servers, data_dirs, failed_to_start = start_servers(targets, args, out_dir, data_parent)
    for target, why in failed_to_start.items():  # reported where the system would be, and an error
        dropped = [run for run in runs if run[1] == target]
        runs = [run for run in runs if run[1] != target]
        document["systems"].remove(target)
        document["peers_missing"][target] = why
        document["notes"].append(f"{target}: {why}; its {len(dropped)} run(s) not made")
        document["failed_runs"] = document.get("failed_runs", 0) + len(dropped)
    preloaded = set()
    peaks: dict[str, float | None] = {}  # queue-peak's rate per system, the pace of queue-latency
    try:
        for round_index in range(args.repeat):
            for workload, system, ops, connections, profiled in runs:
                if profiled and round_index:
                    continue  # one profile per workload is enough
                server = servers[system]
                if workload.preload and system not in preloaded:
                    _say(f"preloading {args.keys} keys into {system}")
                    preload(system, server, args.keys)
                    preloaded.add(system)
                quiet = None
                if args.wait_quiet > 0:
                    quiet, waited_s = sysinfo.wait_quiet(15.0, args.wait_quiet)
                    if waited_s >= 1 or not quiet:
                        _say(f"waited {waited_s} s for a quiet machine" + ("" if quiet else ": still busy, running anyway"))
                _say(f"round {round_index + 1}/{args.repeat} {system} {workload.name} ops={ops} connections={connections}"
                     f"{' profiled' if profiled else ''}: {args.warmup} s warm-up + {args.duration} s")
                loader_args = ()
                if workload.name == "queue-peak":
                    loader_args = ("-rate", "0")
                elif workload.name == "queue-latency":
                    peak = peaks.get(system)
                    if not peak:
                        _say(f"  skipped: no queue-peak rate measured for {system} to pace it at half of")
                        document["notes"].append(f"{system} queue-latency round {round_index + 1} not run: its "
                                                 "queue-peak run measured no rate")
                        continue
                    loader_args = ("-rate", str(max(1, round(peak / 2))))
                elif workload.timer_pending:
                    loader_args = ("-timer-pending", str(workload.timer_pending), "-rate", str(args.timer_rate))
                try:
                    run = run_one(args, system, server, workload, ops, connections, profiled, out_dir, disk,
                                  loader_args)
                except RuntimeError as error:  # a generator process failed: say so, keep the rest
                    _say(f"  RUN FAILED: {error}")
                    document["notes"].append(f"{system} {workload.name} ops={ops} connections={connections} "
                                             f"round {round_index + 1} failed: {error}")
                    document["failed_runs"] = document.get("failed_runs", 0) + 1
                    continue
                run["round"] = round_index + 1
                run["started_quiet"] = quiet
                if workload.name == "queue-peak":
                    peaks[system] = run["rate_per_s"] if not run["errors"] else None
                elif workload.name == "queue-latency":
                    run["offered_per_s"] = float(loader_args[1])
                errors = sum(run["errors"].values())
                extra = " ".join(f"{unit} {rate:,.0f}/s" for unit, rate in run["units_per_s"].items() if unit != workload.unit)
                _say(f"  {run['requests_per_s']:,.0f} req/s {run['rate_per_s']:,.0f} {workload.unit}/s {extra} "
                     f"p50 {run['latency']['p50_us']} us p99 {run['latency']['p99_us']} us; "
                     f"server {run['cpu']['processes_pct_of_core']['server']}% generator "
                     f"{run['cpu']['processes_pct_of_core']['generator']}% of a core; {run['bottleneck']}; errors {errors}")
                document["runs"].append(run)
    finally:
        stop_servers(servers, data_dirs, args, document)
    report.derive(document)
    failed = [run for run in document["runs"] if run["errors"] or run["undrained"]]
    if failed or document.get("failed_runs"):
        document["notes"].append(f"{len(failed)} run(s) had errors or unanswered requests: their figures are not valid")
    text = report.write_outputs(document, out_dir, with_chart=not args.no_chart)
    print(text)
    _say(f"wrote {os.path.join(out_dir, 'results.json')}, results.md" + (" and chart.png" if document.get("chart") else ""))
    if failed or document.get("failed_runs"):
        banner = "!" * 72
        _say(f"\n{banner}\nERRORS in {len(failed)} run(s): " + "; ".join(
            f"{run['system']} {run['workload']} ops={run['ops']} c={run['connections']}: {run['errors']} "
            f"undrained={run['undrained']}" for run in failed)
            + (f"; {document['failed_runs']} run(s) failed outright" if document.get("failed_runs") else "")
            + f"\n{banner}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
