"""chart.png: the report as a picture, because people would rather look.

Owns: drawing, from a finished results document, (1) the headline rate of every workload shape
per system (log scale: Queen, Redis and etcd differ by orders of magnitude) and (2) the latency
percentiles p50 / p99 / p99.9 of the same shapes. One connection count is drawn (16 when it was
run, else the middle one) so the bars stay readable; every figure is in results.json.

Needs matplotlib (the `bench` extra); the session notes its absence instead of failing.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from bench.systems import PEER_LABELS, SYSTEMS  # noqa: E402

COLORS = {"queen": "#c0392b", "redis-aof": "#2471a3", "redis-mem": "#85c1e9", "etcd": "#239b56", "postgres": "#7d3c98",
          "nats": "#d68910"}


def _connections(summary: list[dict]) -> int | None:
    counts = sorted({row["connections"] for row in summary})
    if not counts:
        return None
    return 16 if 16 in counts else counts[len(counts) // 2]


def render(document: dict, path: str) -> None:
    summary = [row for row in document.get("summary", []) if row["system"] in SYSTEMS]
    connections = _connections(summary)
    rows = [row for row in summary if row["connections"] == connections]
    shapes = list(dict.fromkeys((row["workload"], row["ops"]) for row in rows))
    systems = [system for system in SYSTEMS if any(row["system"] == system for row in rows)]
    by_key = {(row["system"], row["workload"], row["ops"]): row for row in rows}
    width = 0.8 / max(1, len(systems))
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(max(10, 0.9 * len(shapes) + 3), 10), constrained_layout=True)
    labels = [f"{workload}\n{ops} op{'s' if ops > 1 else ''}" for workload, ops in shapes]
    for index, system in enumerate(systems):
        offset = (index - (len(systems) - 1) / 2) * width
        xs, rates = [], []
        for position, (workload, ops) in enumerate(shapes):
            row = by_key.get((system, workload, ops))
            if row and row["rate_per_s"]:
                xs.append(position + offset)
                rates.append(row["rate_per_s"])
        bars = top.bar(xs, rates, width, label=PEER_LABELS[system], color=COLORS[system])
        for bar, rate in zip(bars, rates, strict=True):
            top.annotate(_short(rate), (bar.get_x() + bar.get_width() / 2, rate), ha="center", va="bottom",
                         fontsize=6, rotation=90, xytext=(0, 2), textcoords="offset points")
        for percentile, marker in (("p50_us", "o"), ("p99_us", "^"), ("p99_9_us", "x")):
            points = [(position + offset, by_key[(system, w, o)][percentile] / 1000)
                      for position, (w, o) in enumerate(shapes)
                      if (system, w, o) in by_key and by_key[(system, w, o)][percentile]]
            if points:
                bottom.scatter(*zip(*points, strict=True), marker=marker, color=COLORS[system], s=22,
                               label=f"{PEER_LABELS[system]} {percentile[:-3].replace('_', '.')}")
    top.set_yscale("log")
    top.set_ylabel("rate per second (log): the workload's unit")
    top.set_title(f"Throughput per workload, {connections} connections "
                  "(its unit: ops, pairs, messages... — see results.md)")
    bottom.set_yscale("log")
    bottom.set_ylabel("latency, ms (log)")
    bottom.set_title(f"Latency, {connections} connections (per request; queue-peak/-latency: push to delivery, "
                     "per message; timer-fire: fire lateness, per timer): p50 (o), p99 (^), p99.9 (x)", fontsize="medium")
    for axis in (top, bottom):
        axis.set_xticks(range(len(shapes)))
        axis.set_xticklabels(labels, fontsize=8)
        axis.grid(axis="y", which="both", alpha=0.3)
    top.legend(fontsize=8, loc="upper right")
    # Below the axes, not on them: the latency points span the whole panel.
    bottom.legend(fontsize=7, ncol=max(1, len(systems)), loc="upper center", bbox_to_anchor=(0.5, -0.12))
    machine = document["machine"]
    figure.suptitle(f"Queen vs peers — {document['started_at']} — {machine['cpu_model']}, {machine['cpus_online']} CPUs, "
                    f"disk {machine.get('disk_fsync', {}).get('fsyncs_per_s', 0):,.0f} fsyncs/s", fontsize=10)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _short(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e3:
        return f"{value / 1e3:.0f}k" if value >= 1e4 else f"{value / 1e3:.1f}k"
    return f"{value:.0f}"
