"""`python -m bench.combine OUT DIR...`: one report from several sessions' results.json.

A full comparison (every workload at 1, 16 and 64 connections on four systems) takes longer
than one sitting on a shared host should hold the machine, so it can run as several sessions,
each with its own `--workloads`; this joins their runs into one document (the machine block and
disk measurement of the first session, every session's command and disk figure kept under
"sessions"), derives the summary, ratios and goals again, and writes results.json, results.md
and chart.png to OUT.
"""

from __future__ import annotations

import json
import os
import sys

from bench import report
from bench.workloads import SYSTEM_ORDER, WORKLOADS


def combine(directories: list[str]) -> dict:
    documents = []
    for directory in directories:
        with open(os.path.join(directory, "results.json")) as f:
            documents.append(json.load(f))
    first = documents[0]
    combined = {key: first[key] for key in ("started_at", "machine", "settings")}
    combined["command"] = " ; ".join(document["command"] for document in documents)
    combined["sessions"] = [{"started_at": d["started_at"], "command": d["command"],
                             "disk_fsync": d["machine"].get("disk_fsync"), "git_commit": d["machine"].get("git_commit")}
                            for d in documents]
    combined["systems"] = list(dict.fromkeys(system for d in documents for system in d.get("systems", [])))
    combined["peers_missing"] = {k: v for d in documents for k, v in d.get("peers_missing", {}).items()}
    shapes: dict[tuple, list[dict]] = {}
    replaced = []
    for index, d in enumerate(documents):
        fresh: dict[tuple, list[dict]] = {}
        for run in d["runs"]:
            shape = (run["system"], run["workload"], run["ops"], run["connections"], bool(run.get("profiled")))
            fresh.setdefault(shape, []).append(run)
        for shape, runs in fresh.items():
            if shape in shapes:
                replaced.append(f"{shape[0]} {shape[1]} {shape[2]} op(s) {shape[3]}c by session {index + 1}")
            shapes[shape] = runs
    # In the order a single session would have run them, whichever session measured each shape.
    order = {name: index for index, name in enumerate(WORKLOADS)}
    systems = {name: index for index, name in enumerate(SYSTEM_ORDER)}
    combined["runs"] = [run for shape in sorted(shapes, key=lambda shape: (
        shape[4], order.get(shape[1], len(order)), shape[3], shape[2], systems.get(shape[0], len(systems))))
        for run in shapes[shape]]
    combined["servers"] = [server for d in documents for server in d.get("servers", [])]
    # Notes derived from the runs are made again by derive(); keep only the sessions' own.
    # So are the chart's: this report draws its own.
    combined["notes"] = [note for d in documents for note in d.get("notes", [])
                         if "busy outside our processes" not in note and not note.startswith("no chart:")]
    if replaced:
        combined["notes"].append("re-measured, the later run replaces the earlier: " + ", ".join(replaced))
    commits = {d["machine"].get("git_commit") for d in documents}
    if len(commits) > 1:
        combined["notes"].append(f"the sessions measured different commits: {', '.join(sorted(map(str, commits)))}")
    report.derive(combined)
    return combined


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, directories = argv[0], argv[1:]
    os.makedirs(out, exist_ok=True)
    document = combine(directories)
    report.write_outputs(document, out)
    print(f"wrote {out}/results.json, results.md" + (" and chart.png" if document.get("chart") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
