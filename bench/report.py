"""The report: every figure of a benchmark session as JSON, and the same as a Markdown page.

Owns: the shape of `results.json` (a later comparison with etcd and Redis adds systems and
workloads as more runs of the same shape), the derived figures (ratio to the do-nothing ceiling,
goals, who was saturated) and their Markdown rendering. Pure: documents in, text out; writing
files is the caller's.
"""

from __future__ import annotations

# A side whose process used at least this share of its core was the one that set the pace.
SATURATED_PCT = 90.0

# CPU busy on the cores that no process of ours was charged for, above which a run is flagged:
# quiet runs show 10-35% (loopback TCP in softirq); more means another process shared the cores.
NEIGHBOUR_PCT = 45.0

# The goals, as data so the next issue can add its own.
GOALS = (
    {"name": "kv-put 1 op/request within 80% of the do-nothing h11 ceiling",
     "workload": "kv-put", "ops": 1, "kind": "ceiling_ratio", "at_least": 0.80},
    {"name": "kv-get 1 op/request within 80% of the do-nothing h11 ceiling",
     "workload": "kv-get", "ops": 1, "kind": "ceiling_ratio", "at_least": 0.80},
    {"name": "kv-put 64 ops/request: at least 50,000 durable puts/s",
     "workload": "kv-put", "ops": 64, "kind": "ops_per_s", "at_least": 50_000},
)


# Systems that answer a write only after an fsync covers it.
DURABLE_SYSTEMS = frozenset(("queen", "redis-aof", "etcd"))
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
    """Add the summary (median over rounds of each configuration), the ratios to the do-nothing
    ceiling and the goals' verdicts to a finished document, in place."""
    noisy = []
    for run in document["runs"]:
        run["unattributed_pct"] = unattributed_pct(run["cpu"])
        if run["unattributed_pct"] > NEIGHBOUR_PCT:
            noisy.append(f"{run['workload']} {run['ops']} op(s)"
                         + (" (profiled)" if run.get("profiled") else f" #{run.get('round', 1)}"))
    if noisy:
        document["notes"].append(f"{len(noisy)} run(s) had more than {NEIGHBOUR_PCT:.0f}% of a core busy outside our "
                                 f"processes (another process on the machine, or kernel work): {', '.join(noisy)}. "
                                 "Their req/s and µs/req are likely low; compare medians, or rerun on a quiet machine.")
    groups: dict[tuple, list[dict]] = {}
    for run in document["runs"]:
        if not run.get("profiled"):
            groups.setdefault((run["workload"], run["ops"], run["connections"]), []).append(run)
    summary = []
    for (workload, ops, connections), runs in groups.items():
        rates = [run["requests_per_s"] for run in runs]
        summary.append({
            "workload": workload, "ops": ops, "connections": connections, "rounds": len(runs),
            "requests_per_s": round(_median(rates), 1), "requests_per_s_min": min(rates), "requests_per_s_max": max(rates),
            "ops_per_s": round(_median([run["ops_per_s"] for run in runs]), 1),
            "p50_us": _median([run["latency"]["p50_us"] or 0 for run in runs]),
            "p99_us": _median([run["latency"]["p99_us"] or 0 for run in runs]),
            "p99_9_us": _median([run["latency"]["p99_9_us"] or 0 for run in runs]),
            "server_us_per_request": _median([run["server_us_per_request"] or 0 for run in runs]),
            "errors": sum(sum(run["errors"].values()) + run["undrained"] for run in runs),
        })
    ceilings = {row["connections"]: row["requests_per_s"] for row in summary if row["workload"] == "baseline-h11"}
    for row in summary:
        ceiling = ceilings.get(row["connections"])
        # The ceiling is one request per round trip; only a one-op request is comparable with it.
        if ceiling and row["workload"] != "baseline-h11" and row["ops"] == 1:
            row["ceiling_ratio"] = round(row["requests_per_s"] / ceiling, 3)
    document["summary"] = summary
    verdicts = []
    for goal in GOALS:
        for row in summary:
            if row["workload"] == goal["workload"] and row["ops"] == goal["ops"]:
                value = row.get(goal["kind"])
                verdicts.append({"goal": goal["name"], "connections": row["connections"], "value": value,
                                 "at_least": goal["at_least"],
                                 "met": None if value is None else (value >= goal["at_least"] and not row["errors"])})
    document["goals"] = verdicts


def _ms(value_us):
    return "–" if value_us is None else f"{value_us / 1000:.2f}"


def _num(value, digits=0):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def markdown(document: dict) -> str:
    m = document["machine"]
    s = document["settings"]
    lines = [
        f"# Queen benchmark — {document['started_at']}",
        "",
        f"Machine: {m['cpu_model']}, {m['cpus_online']} CPUs, kernel {m['kernel']}, {m['memory_gib']} GiB, "
        f"Python {m['python']}; data dir on {m.get('data_dir_filesystem', '?')}; queen at {m.get('git_commit')}.",
        f"Server pinned to CPU {s['server_cpus']}, generator ({s['engine']}, {s['processes']} process(es)) to CPU "
        f"{s['generator_cpus']}. Closed loop: each connection keeps one request outstanding. "
        f"Warm-up {s['warmup_s']} s, measured {s['duration_s']} s per run; {s['keys_total']:,} keys.",
        "",
        "| workload | ops/req | conns | req/s | ops/s | p50 ms | p99 ms | p99.9 ms | errors | saturated |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    cpu_lines = [
        "CPU over each measured window, in % of one core (server = all its threads; main = the event loop, "
        "workers = trio threads doing WAL write+fsync; cores include kernel and softirq work and any other process, "
        "so a core much busier than the processes pinned to it had a neighbour during that run; unattributed = "
        "both cores' busy time minus our processes'):",
        "",
        "| workload | ops/req | server | main / workers | server µs/req | generator | generator µs/req | cpu0 busy | cpu1 busy | steal | unattributed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
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
        lines.append(
            f"| {name} | {run['ops']} | {run['connections']} | {_num(run['requests_per_s'])} | {_num(run['ops_per_s'])} "
            f"| {_ms(latency['p50_us'])} | {_ms(latency['p99_us'])} | {_ms(latency['p99_9_us'])} "
            f"| {'**' + str(errors) + '**' if errors else 0} | {run['bottleneck']} |")
        cpu_lines.append(
            f"| {name} | {run['ops']} | {procs.get('server', 0):.0f}% "
            f"| {max(0.0, threads.get('main thread', 0)):.0f}% / {max(0.0, threads.get('other threads', 0)):.0f}% "
            f"| {_num(run['server_us_per_request'])} | {procs.get('generator', 0):.0f}% | {_num(run['generator_us_per_request'])} "
            f"| {_num(cores.get('cpu0'))}% | {_num(cores.get('cpu1'))}% | {steal:.1f}% | {max(0.0, run.get('unattributed_pct', 0)):.0f}% |")
    lines += [""] + cpu_lines + [""]
    summary = document.get("summary", [])
    if document["settings"].get("repeat", 1) > 1:
        lines += [f"Median of {document['settings']['repeat']} interleaved rounds (range of req/s in brackets):", "",
                  "| workload | ops/req | conns | req/s | ops/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/req | errors |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for row in summary:
            lines.append(f"| {row['workload']} | {row['ops']} | {row['connections']} | {_num(row['requests_per_s'])} "
                         f"({_num(row['requests_per_s_min'])}–{_num(row['requests_per_s_max'])}) | {_num(row['ops_per_s'])} "
                         f"| {_ms(row['p50_us'])} | {_ms(row['p99_us'])} | {_ms(row['p99_9_us'])} "
                         f"| {_num(row['server_us_per_request'])} | {row['errors']} |")
        lines.append("")
    ratios = [row for row in summary if "ceiling_ratio" in row]
    if ratios:
        lines += ["Share of the do-nothing trio+h11 ceiling (1-op req/s ÷ baseline-h11 req/s at the same connections):", ""]
        for row in ratios:
            lines.append(f"- {row['workload']}, {row['connections']} connections: {100 * row['ceiling_ratio']:.0f}%")
        lines.append("")
    if document.get("goals"):
        lines += ["Goals:", ""]
        for verdict in document["goals"]:
            mark = {True: "MET", False: "NOT MET", None: "?"}[verdict["met"]]
            value = verdict["value"]
            shown = f"{100 * value:.0f}%" if value is not None and value < 10 else _num(value)
            lines.append(f"- {mark}: {verdict['goal']} ({verdict['connections']} connections): {shown}")
        lines.append("")
    wal_runs = [run for run in document["runs"] if run.get("wal")]
    if wal_runs:
        lines += ["Group commit over each window (from the server's /metrics):", "",
                  "| workload | ops/req | frames/s | records/frame | write+fsync ms/frame | writer busy in write+fsync | snapshots |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for run in wal_runs:
            wal = run["wal"]
            lines.append(f"| {run['workload']}{' (profiled)' if run.get('profiled') else ''} | {run['ops']} | {_num(wal['frames_per_s'])} "
                         f"| {_num(wal['records_per_frame'], 1)} | {_num(wal['write_fsync_ms_mean'], 3)} "
                         f"| {_num(wal['write_fsync_busy_pct'], 1)}% | {wal['snapshots']} |")
        lines.append("")
    for run in document["runs"]:
        if run.get("profile"):
            lines += _profile_section(run)
    failed = [run for run in document["runs"] if run["errors"] or run["undrained"]]
    if failed:
        lines += ["## ERRORS", ""]
        for run in failed:
            lines.append(f"- **{run['workload']} {run['ops']} op(s), {run['connections']} connections: "
                         f"{run['errors']}; {run['undrained']} request(s) never answered**")
            for sample in run["error_samples"]:
                lines.append(f"  - `{sample[:200]}`")
        lines.append("")
    for note in document.get("notes", []):
        lines.append(f"Note: {note}")
    return "\n".join(lines).rstrip() + "\n"


def _profile_section(run: dict) -> list[str]:
    profile = run["profile"]
    title = f"Server CPU by layer, {run['workload']} {run['ops']} op(s)/request"
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
