"""The fault suite's soak: `python -m tests.faults --minutes N`.

Runs the negative controls once (each must be caught), then the workloads of
tests/faults/workloads.py in turn, each with a new seed and several crashes (SIGKILL, or SIGKILL
and power loss), until N minutes have passed; then the deterministic simulation over as many
seeds as its share of the time allows. Prints a line per run and a Markdown report (--report
writes it to a file). Exit status 1 on any violation or uncaught control.

Replay one run from the line that reported it:

    python -m tests.faults --workload kv --seed 1234 [--kills 8] [--scale 1.0] [--control NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter

from tests.faults.controls import CONTROLS, run_control
from tests.faults.workloads import WORKLOADS

# Crashes per run in the soak: many short cycles, so the count of restarts grows fast.
SOAK_KILLS = {"kv": 12, "locks": 6, "queues": 8, "timers": 8, "recurring": 6, "transactions": 6}
SOAK_SCALE = {"kv": 2.0, "locks": 0.6, "queues": 1.0, "timers": 1.0, "recurring": 1.0, "transactions": 1.0}
# Seeds the simulation runs even when the workloads took all the time (a short soak).
SIMULATION_SEEDS_MIN = 20


def _one(args) -> int:
    work_dir = tempfile.mkdtemp(prefix=f"queen-faults-{args.workload}-")
    if args.control and not args.workload:
        outcome = run_control(args.control, work_dir, args.seed)
    else:
        outcome = WORKLOADS[args.workload](work_dir, args.seed, kills=args.kills, control=args.control or "",
                                           scale=args.scale)
    print(outcome.summary())
    for violation in outcome.violations:
        print(json.dumps(violation, default=str)[:4000])
    print(f"server data and log kept in {work_dir}")
    return 1 if bool(outcome.violations) != bool(args.control) else 0


def _simulation(seconds: float, first_seed: int) -> dict | None:
    """The in-process simulation's seeds for `seconds`, when the module is there."""
    try:
        from tests.faults import simulation
    except ImportError:
        return None
    totals = {"seeds": 0, "ops": 0, "crashes": 0, "violations": 0, "failed_seeds": []}
    deadline = time.monotonic() + seconds
    seed = first_seed
    while time.monotonic() < deadline or totals["seeds"] < SIMULATION_SEEDS_MIN:
        report = simulation.run_seed(seed)
        totals["seeds"] += 1
        totals["ops"] += report.ops
        totals["crashes"] += report.crashes
        totals["violations"] += len(report.violations)
        if report.violations:
            totals["failed_seeds"].append(seed)
            print(f"simulation seed={seed}: {len(report.violations)} violations", flush=True)
        seed += 1
    return totals


def soak(minutes: float, first_seed: int, report_path: str | None) -> int:
    started = time.time()
    base = tempfile.mkdtemp(prefix="queen-soak-")
    lines: list[str] = []

    controls = {}
    for name in CONTROLS:
        outcome = run_control(name, os.path.join(base, f"control-{name}"), first_seed)
        controls[name] = outcome
        print(f"control {'caught' if outcome.violations else 'NOT CAUGHT'}: {outcome.summary()}", flush=True)

    per_workload = {name: Counter() for name in WORKLOADS}
    faults: Counter = Counter()
    failed: list[str] = []
    deadline = time.monotonic() + minutes * 60 * 0.85
    seed = first_seed
    while time.monotonic() < deadline:
        for name, run in WORKLOADS.items():
            if time.monotonic() >= deadline:
                break
            work_dir = os.path.join(base, f"{name}-{seed}")
            outcome = run(work_dir, seed, kills=SOAK_KILLS[name], scale=SOAK_SCALE[name])
            print(outcome.summary(), flush=True)
            tally = per_workload[name]
            tally["runs"] += 1
            tally["ops"] += outcome.ops
            tally["histories"] += outcome.histories
            tally["crashes"] += sum(outcome.faults.values())
            tally["violations"] += len(outcome.violations)
            faults.update(outcome.faults)
            if outcome.violations:
                failed.append(f"python -m tests.faults --workload {name} --seed {seed} "
                              f"--kills {SOAK_KILLS[name]} --scale {SOAK_SCALE[name]}")
                for violation in outcome.violations[:5]:
                    print("  " + json.dumps(violation, default=str)[:2000], flush=True)
            else:
                shutil.rmtree(work_dir, ignore_errors=True)
        seed += 1
    simulated = _simulation(max(0.0, started + minutes * 60 - time.time()), first_seed)
    elapsed = time.time() - started

    cycles = sum(faults.values())
    lines.append("| workload | runs | crash/restart cycles | operations | histories checked | violations |")
    lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, tally in per_workload.items():
        lines.append(f"| {name} | {tally['runs']} | {tally['crashes']} | {tally['ops']:,} | {tally['histories']:,} "
                     f"| {tally['violations']} |")
    total_violations = sum(t["violations"] for t in per_workload.values())
    lines.append(f"| **all** | {sum(t['runs'] for t in per_workload.values())} | {cycles} | "
                 f"{sum(t['ops'] for t in per_workload.values()):,} | "
                 f"{sum(t['histories'] for t in per_workload.values()):,} | {total_violations} |")
    lines.append("")
    lines.append("Faults injected: " + ", ".join(f"{n} {kind}" for kind, n in sorted(faults.items())) + ".")
    caught = [name for name, outcome in controls.items() if outcome.violations]
    lines.append(f"Negative controls caught: {len(caught)} of {len(controls)} ("
                 + ", ".join(f"{name}: {len(outcome.violations)} violations" for name, outcome in controls.items())
                 + ").")
    if simulated is not None:
        lines.append(f"Simulation: {simulated['seeds']} seeds, {simulated['ops']:,} operations, "
                     f"{simulated['crashes']} simulated power losses, {simulated['violations']} violations.")
    lines.append(f"Seeds {first_seed}..{seed}; {elapsed / 60:.1f} minutes on {platform.node() or 'this machine'} "
                 f"({os.cpu_count()} CPUs, Python {platform.python_version()}).")
    if failed:
        lines.append("")
        lines.append("Failed runs, to replay:")
        lines += [f"    {command}" for command in failed]
    report = "\n".join(lines) + "\n"
    print()
    print(report)
    if report_path:
        with open(report_path, "w") as f:
            f.write(report)
    bad_simulation = simulated is not None and simulated["violations"]
    ok = total_violations == 0 and len(caught) == len(controls) and not bad_simulation
    if ok:
        shutil.rmtree(base, ignore_errors=True)
    else:
        print(f"work directories of failed runs kept under {base}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the soak runs (default 10)")
    parser.add_argument("--seed", type=int, default=None, help="first seed of the soak, or the seed to replay")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), help="replay one run of this workload")
    parser.add_argument("--control", choices=sorted(CONTROLS),
                        help="with --workload: run it against this deliberate bug; alone: run the control")
    parser.add_argument("--kills", type=int, default=8, help="crashes in a replayed run (default 8)")
    parser.add_argument("--scale", type=float, default=1.0, help="size of a replayed run (default 1.0)")
    parser.add_argument("--report", help="write the soak's Markdown figures to this file")
    args = parser.parse_args(argv)
    if args.workload or args.control:
        if args.seed is None:
            parser.error("a replay needs --seed")
        return _one(args)
    return soak(args.minutes, args.seed if args.seed is not None else int(time.time()) % 100_000, args.report)


if __name__ == "__main__":
    sys.exit(main())
