"""`python -m bench.ab`: the same Queen workloads against several builds of Queen, interleaved, to
price a change to a hot path.

Each variant is a checkout of the repository (a git worktree, say) whose `queen serve` runs from
that directory, pinned to the server CPU like the main bench. Every (workload, ops, connections)
shape runs on every variant back to back, the order rotated each round, so a slow minute on a
shared host hits them alike. The first figure is server CPU per request (all threads, from /proc),
then the rate; both are given per round as a ratio to the first variant and summarized as the
median over rounds. Runs use the main bench's generator and accounting (bench/__main__.py,
run_one), so the figures are comparable with its reports.

    git worktree add /tmp/before <commit>
    python -m bench.ab --variant before=/tmp/before --variant after=. \\
        --workloads lock-cycle,kv-put --ops 1,64 --connections 1,16 --rounds 4

`--tls NAME` serves that variant over HTTPS (bench/servers.py makes its certificate), so one
checkout can be measured with TLS off and on:

    python -m bench.ab --variant plain=. --variant tls=. --tls tls

`--auth NAME` runs that variant with an auth file, its clients sending an admin token of a named
tenant (so every name also goes through the tenant's prefix): the price of checking tokens.

    python -m bench.ab --variant open=. --variant auth=. --auth auth
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from bench import diskprobe
from bench.__main__ import _int_list, build_parser, preload, run_one
from bench.servers import queen_server
from bench.workloads import WORKLOADS


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, metavar="NAME=PATH",
                        help="a build to measure: a name and the repository checkout it runs from (repeat; the first is the reference)")
    parser.add_argument("--workloads", default="lock-cycle,kv-put")
    parser.add_argument("--ops", type=_int_list, default=[1, 64])
    parser.add_argument("--connections", type=_int_list, default=[16])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--server-cpus", default="0")
    parser.add_argument("--generator-cpus", default="1")
    parser.add_argument("--data-parent", default=None)
    parser.add_argument("--auth", action="append", default=[], metavar="NAME",
                        help="run this variant with an auth file, its clients sending an admin token of a named "
                             "tenant (repeat for more)")
    parser.add_argument("--tls", action="append", default=[], metavar="NAME",
                        help="serve this variant over HTTPS, its clients trusting a throwaway CA (repeat for more)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    variants = []
    for text in args.variant:
        name, _, path = text.partition("=")
        if not name or not os.path.isdir(os.path.join(path, "queen")):
            raise SystemExit(f"bench.ab: --variant {text!r} is not NAME=PATH of a checkout with queen/ in it")
        variants.append((name, os.path.abspath(path)))
    unknown = (set(args.tls) | set(args.auth)) - {name for name, _ in variants}
    if unknown:
        raise SystemExit(f"bench.ab: --tls/--auth {', '.join(sorted(unknown))}: no such variant")
    bench_args = build_parser().parse_args(["--duration", str(args.duration), "--warmup", str(args.warmup),
                                            "--server-cpus", args.server_cpus, "--generator-cpus", args.generator_cpus])
    out_dir = tempfile.mkdtemp(prefix="queen-ab-")
    data_parent = args.data_parent or tempfile.gettempdir()
    disk = diskprobe.fsync_rate(data_parent, 1.0)
    print(f"disk: {disk['fsyncs_per_s']:,.0f} fsyncs/s; logs in {out_dir}", file=sys.stderr)
    servers, data_dirs = {}, []
    try:
        for name, path in variants:
            data_dir = tempfile.mkdtemp(prefix=f"ab-{name}-", dir=data_parent)
            data_dirs.append(data_dir)
            server = queen_server(data_dir, os.path.join(out_dir, f"{name}.log"), bench_args.server_cpus, path,
                                  tls_dir=os.path.join(out_dir, f"{name}-tls") if name in args.tls else None,
                                  auth_dir=os.path.join(out_dir, f"{name}-auth") if name in args.auth else None)
            server.start()
            servers[name] = server
        shapes = [(WORKLOADS[w], ops, c) for w in args.workloads.split(",") for c in args.connections
                  for ops in ([WORKLOADS[w].fixed_ops] if WORKLOADS[w].fixed_ops else args.ops)]
        if any(workload.preload for workload, _, _ in shapes):
            for server in servers.values():
                preload("queen", server, bench_args.keys)
        figures = {}  # (shape, name) -> [(us_per_request, rate)]
        for round_index in range(args.rounds):
            for shape_index, (workload, ops, connections) in enumerate(shapes):
                order = variants[(round_index + shape_index) % len(variants):] + variants[:(round_index + shape_index) % len(variants)]
                for name, _ in order:
                    run = run_one(bench_args, "queen", servers[name], workload, ops, connections, False, out_dir, disk)
                    errors = sum(run["errors"].values())
                    key = (workload.name, ops, connections)
                    figures.setdefault((key, name), []).append((run["server_us_per_request"], run["rate_per_s"], errors))
                    print(f"round {round_index + 1} {name:>10} {workload.name} ops={ops} c={connections}: "
                          f"{run['server_us_per_request']} us/req {run['rate_per_s']:,.0f} {workload.unit}/s"
                          f"{f' ERRORS {errors}' if errors else ''}", file=sys.stderr)
        print(report(variants, shapes, figures, args.rounds))
    finally:
        for server in servers.values():
            server.stop()
        for data_dir in data_dirs:
            shutil.rmtree(data_dir, ignore_errors=True)
    return 0


def report(variants, shapes, figures, rounds) -> str:
    reference = variants[0][0]
    lines = ["| workload | ops | conns | " + " | ".join(f"{name} µs/req" for name, _ in variants) + " | "
             + " | ".join(f"{name} rate" for name, _ in variants) + " | "
             + " | ".join(f"{name} µs ratio / rate ratio" for name, _ in variants[1:]) + " |",
             "| --- | ---: | ---: |" + " ---: |" * (2 * len(variants) + len(variants) - 1)]
    for workload, ops, connections in shapes:
        key = (workload.name, ops, connections)
        cells = [workload.name, str(ops), str(connections)]
        cells += [f"{statistics.median(f[0] for f in figures[(key, name)]):.1f}" for name, _ in variants]
        cells += [f"{statistics.median(f[1] for f in figures[(key, name)]):,.0f}" for name, _ in variants]
        for name, _ in variants[1:]:
            us = [mine[0] / ref[0] for mine, ref in zip(figures[(key, name)], figures[(key, reference)], strict=True)]
            rate = [mine[1] / ref[1] for mine, ref in zip(figures[(key, name)], figures[(key, reference)], strict=True)]
            cells.append(f"{statistics.median(us):.2f} / {statistics.median(rate):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    errors = sum(f[2] for runs in figures.values() for f in runs)
    lines.append("")
    lines.append(f"Medians of {rounds} interleaved rounds; ratios are per round against {reference}. Errors: {errors}.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
