"""`python -m bench`: start the servers under test, run the workloads against them, write the report.

A session: start every server the chosen workloads need (a fresh `queen serve` on a temporary
data directory, the do-nothing trio+h11 baseline), each pinned to the server CPU, and wait for
their /healthz; run every (workload, ops per request, connections), `--repeat` rounds
interleaved, with generator processes pinned to the generator CPU; stop each server with SIGTERM
by its pid. Then results.json and results.md go to the out directory and the Markdown is printed. The exit status is 1 when any run saw an error, so a
script cannot mistake a broken run for a slow one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time

from bench import report, sysinfo
from bench.loadgen import ENGINES, Generator
from bench.profile import Profiler
from bench.servers import HOST, ServerProcess, baseline_server, queen_server
from bench.workloads import KEYS_TOTAL, WORKLOADS, Workload, preload_requests

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_WORKLOADS = "baseline-h11,kv-put,kv-get"


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
        description="Load-test Queen's KV API against a do-nothing trio+h11 ceiling; write results.json and "
                    "results.md. Run from the repository root.")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds sent before measuring (default 2)")
    parser.add_argument("--connections", type=_int_list, default=[16], help="comma list of connection counts (default 16)")
    parser.add_argument("--ops", type=_int_list, default=[1, 64], help="comma list of operations per request (default 1,64)")
    parser.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                        help=f"comma list, run in this order; known: {', '.join(WORKLOADS)} (default {DEFAULT_WORKLOADS})")
    parser.add_argument("--out", default=None, help="output directory (default bench/out/<timestamp>)")
    parser.add_argument("--quick", action="store_true", help="2 s runs after 0.5 s warm-up: checks the harness, not the server")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of every run, interleaved; the summary takes the median (default 1)")
    parser.add_argument("--processes", type=int, default=1, help="generator processes, all pinned to the generator CPUs (default 1)")
    parser.add_argument("--engine", choices=ENGINES, default="selectors", help="generator socket engine (default selectors)")
    parser.add_argument("--server-cpus", type=_cpu_list, default=[0], help="CPUs the server is pinned to (default 0)")
    parser.add_argument("--generator-cpus", type=_cpu_list, default=[1], help="CPUs the generator is pinned to (default 1)")
    parser.add_argument("--keys", type=int, default=KEYS_TOTAL, help=f"distinct keys, bounding the rows (default {KEYS_TOTAL})")
    parser.add_argument("--profile", action="store_true",
                        help="after the clean runs, run each workload again with py-spy on its server and report CPU by layer")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="S",
                        help="before each run, wait up to S seconds for the machine to be idle (both cores together "
                             "under 15%% busy); for shared hosts (default 0: don't wait)")
    parser.add_argument("--data-parent", default=None,
                        help="directory that holds the temporary data dir (default: the system temp dir); it must be a "
                             "real disk for the durability figures to mean anything")
    parser.add_argument("--keep-data", action="store_true", help="keep Queen's data dir after the session")
    return parser


def plan_runs(args) -> list[tuple[Workload, int, int, bool]]:
    names = [name.strip() for name in args.workloads.split(",") if name.strip()]
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        raise SystemExit(f"bench: unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    runs = []
    for name in names:
        workload = WORKLOADS[name]
        for connections in args.connections:
            for ops in ([workload.fixed_ops] if workload.fixed_ops else args.ops):
                runs.append((workload, ops, connections, False))
    if args.profile:
        runs += [(w, ops, c, True) for w, ops, c, _ in list(runs)]
    return runs


def _say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def _sleep_until_ns(deadline_ns: int) -> None:
    delay = (deadline_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


def preload(server: ServerProcess, keys_total: int) -> None:
    for request in preload_requests(HOST, server.port, keys_total):
        status, body = server.post(request)
        if status != 200 or b'"applied":false' in body:
            raise RuntimeError(f"preload failed: HTTP {status} {body[:300]!r}")


def run_one(args, server: ServerProcess, workload: Workload, ops: int, connections: int, profiled: bool,
            out_dir: str) -> dict:
    duration_s, warmup_s = args.duration, args.warmup
    generator = Generator(HOST, server.port, workload, ops, connections, processes=args.processes,
                          engine=args.engine, cpus=args.generator_cpus or None, keys_total=args.keys)
    generator.start()
    is_queen = workload.target == "queen"
    _, t_measure, t_end = generator.go(warmup_s, duration_s)
    _sleep_until_ns(t_measure)
    profiler = None
    if profiled:
        name = f"profile-{workload.name}-{ops}ops-{connections}c.txt"
        profiler = Profiler(server.pid, duration_s, os.path.join(out_dir, name), args.generator_cpus or None)
        profiler.start()
    pids = {"server": [server.pid], "generator": generator.pids}
    if profiler is not None:
        pids["profiler"] = [profiler.process.pid]
    metrics_before = server.metrics() if is_queen else {}
    cpu_before = sysinfo.CpuSample(pids, split_pid=server.pid)
    _sleep_until_ns(t_end)
    cpu_after = sysinfo.CpuSample(pids, split_pid=server.pid)
    metrics_after = server.metrics() if is_queen else {}
    tally = generator.finish()
    cpu = cpu_after.since(cpu_before)
    if server.process.poll() is not None:
        tally.error("server_died", f"{server.name} exited with {server.process.returncode} during the run")
    wall_s = duration_s  # the window the generator counted in; cpu["wall_s"] is the sampler's view of it
    run = {
        "workload": workload.name,
        "target": workload.target,
        "description": workload.description,
        "ops": ops,
        "connections": connections,
        "profiled": profiled,
        "requests": tally.completed,
        "requests_per_s": round(tally.completed / wall_s, 1),
        "ops_per_s": round(tally.completed * ops / wall_s, 1),
        "latency": tally.histogram.summary_us(),
        "histogram": tally.histogram.to_wire(),
        "errors": tally.errors,
        "error_samples": tally.error_samples,
        "undrained": tally.undrained,
        "answered_total": tally.answered,
        "mib_received_per_s": round(tally.bytes_received / (1 << 20) / (wall_s + warmup_s), 2),
        "cpu": cpu,
        "wal": report.wal_figures(metrics_before, metrics_after, cpu["wall_s"]) if is_queen else None,
    }
    run["generator_us_per_request"] = (round(cpu["processes_pct_of_core"]["generator"] / 100 / run["requests_per_s"] * 1e6, 1)
                                       if run["requests_per_s"] else None)
    run["server_us_per_request"] = (round(cpu["processes_pct_of_core"]["server"] / 100 / run["requests_per_s"] * 1e6, 1)
                                    if run["requests_per_s"] else None)
    run["bottleneck"] = report.bottleneck(cpu, len(args.server_cpus) or os.cpu_count(), len(args.generator_cpus) or os.cpu_count())
    if profiler is not None:
        run["profile"] = profiler.finish()
    return run


def start_servers(targets: list[str], args, out_dir: str, data_parent: str) -> tuple[dict, dict]:
    """Every server the session needs, started and healthy: ({target: server}, {target: data dir})."""
    servers, data_dirs = {}, {}
    try:
        for target in targets:
            log_path = os.path.join(out_dir, f"server-{target}.log")
            if target == "queen":
                data_dirs[target] = tempfile.mkdtemp(prefix="queen-bench-", dir=data_parent)
                server = queen_server(data_dirs[target], log_path, args.server_cpus or None, REPO_ROOT)
            else:
                server = baseline_server(log_path, args.server_cpus or None, REPO_ROOT)
            servers[target] = server
            _say(f"starting {server.name} on {HOST}:{server.port}"
                 + (f", data dir {data_dirs[target]}" if target in data_dirs else ""))
            server.start()
    except BaseException:
        stop_servers(servers, data_dirs, args, {"servers": [], "notes": []})
        raise
    return servers, data_dirs


def stop_servers(servers: dict, data_dirs: dict, args, document: dict) -> None:
    for target, server in servers.items():
        server.stop()
        document["servers"].append({"name": server.name, "pid": server.process.pid if server.process else None,
                                    "port": server.port, "exit_code": server.exit_code, "killed": server.killed,
                                    "log": os.path.basename(server.log_path)})
        if server.exit_code != 0:
            document["notes"].append(f"{server.name} exited with {server.exit_code}"
                                     f"{' after SIGKILL' if server.killed else ''}; see {os.path.basename(server.log_path)}")
        if target in data_dirs and not args.keep_data:
            shutil.rmtree(data_dirs[target], ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 2.0, 0.5
    runs = plan_runs(args)
    started = datetime.datetime.now()
    out_dir = args.out or os.path.join(REPO_ROOT, "bench", "out", started.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out_dir, exist_ok=True)
    if args.generator_cpus:
        os.sched_setaffinity(0, args.generator_cpus)  # this process only waits, but keep it off the server's core
    data_parent = args.data_parent or tempfile.gettempdir()
    document = {
        "started_at": started.isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), "-m", "bench"] + (argv if argv is not None else sys.argv[1:])),
        "machine": sysinfo.machine(data_parent),
        "settings": {"duration_s": args.duration, "warmup_s": args.warmup, "repeat": args.repeat,
                     "engine": args.engine, "processes": args.processes, "server_cpus": args.server_cpus,
                     "generator_cpus": args.generator_cpus, "keys_total": args.keys,
                     "wait_quiet_s": args.wait_quiet},
        "runs": [],
        "servers": [],
        "notes": [],
    }
    if document["machine"].get("data_dir_filesystem") in ("tmpfs", "ramfs"):
        document["notes"].append(f"the data dir is on {document['machine']['data_dir_filesystem']}: fsync is free there, "
                                 "so durable-write figures are not meaningful")
    targets = list(dict.fromkeys(workload.target for workload, *_ in runs))
    # Every server stays up for the whole session (an idle one costs nothing), so the rounds can
    # interleave the workloads: a slow minute on a shared host then spreads over all of them
    # instead of landing on one.
    servers, data_dirs = start_servers(targets, args, out_dir, data_parent)
    preloaded = set()
    try:
        for round_index in range(args.repeat):
            for workload, ops, connections, profiled in runs:
                if profiled and round_index:
                    continue  # one profile per workload is enough
                server = servers[workload.target]
                if workload.preload and workload.target not in preloaded:
                    _say(f"preloading {args.keys} keys")
                    preload(server, args.keys)
                    preloaded.add(workload.target)
                quiet = None
                if args.wait_quiet > 0:
                    quiet, waited_s = sysinfo.wait_quiet(15.0, args.wait_quiet)
                    if waited_s >= 1 or not quiet:
                        _say(f"waited {waited_s} s for a quiet machine" + ("" if quiet else ": still busy, running anyway"))
                _say(f"round {round_index + 1}/{args.repeat} {workload.name} ops={ops} connections={connections}"
                     f"{' profiled' if profiled else ''}: {args.warmup} s warm-up + {args.duration} s")
                try:
                    run = run_one(args, server, workload, ops, connections, profiled, out_dir)
                except RuntimeError as error:  # a generator process failed: say so, keep the rest
                    _say(f"  RUN FAILED: {error}")
                    document["notes"].append(f"{workload.name} ops={ops} connections={connections} "
                                             f"round {round_index + 1} failed: {error}")
                    document["failed_runs"] = document.get("failed_runs", 0) + 1
                    continue
                run["round"] = round_index + 1
                run["started_quiet"] = quiet
                errors = sum(run["errors"].values())
                _say(f"  {run['requests_per_s']:,.0f} req/s {run['ops_per_s']:,.0f} ops/s "
                     f"p50 {run['latency']['p50_us']} us p99 {run['latency']['p99_us']} us; "
                     f"server {run['cpu']['processes_pct_of_core']['server']}% generator "
                     f"{run['cpu']['processes_pct_of_core']['generator']}% of a core; errors {errors}")
                document["runs"].append(run)
    finally:
        stop_servers(servers, data_dirs, args, document)
    report.derive(document)
    failed = [run for run in document["runs"] if run["errors"] or run["undrained"]]
    if failed or document.get("failed_runs"):
        document["notes"].append(f"{len(failed)} run(s) had errors or unanswered requests: their figures are not valid")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(document, f, indent=1)
    text = report.markdown(document)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    print(text)
    _say(f"wrote {os.path.join(out_dir, 'results.json')} and results.md")
    if failed or document.get("failed_runs"):
        banner = "!" * 72
        _say(f"\n{banner}\nERRORS in {len(failed)} run(s): " + "; ".join(
            f"{run['workload']} ops={run['ops']}: {run['errors']} undrained={run['undrained']}" for run in failed)
            + (f"; {document['failed_runs']} run(s) failed outright" if document.get("failed_runs") else "")
            + f"\n{banner}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
