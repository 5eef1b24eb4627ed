"""The fault suite's summary at the end of a pytest run: which promises were checked, on how many
operations and histories, under how many crashes, and which negative controls were caught.
tests/conftest.py writes it, with the runs of every pytest-xdist worker (`as_plain` / `from_plain`
carry them over: a worker's memory is its own)."""

from collections import Counter

from tests.faults.workloads import Outcome


def as_plain(outcomes: list) -> list:
    """(outcome, caught) pairs as plain data (what execnet carries); violations by their count."""
    return [({"workload": o.workload, "seed": o.seed, "control": o.control, "ops": o.ops, "histories": o.histories,
              "faults": dict(o.faults), "violations": len(o.violations), "promises": list(o.promises),
              "detail": o.detail}, caught) for o, caught in outcomes]


def from_plain(plain: list) -> list:
    return [(Outcome(**{**fields, "faults": Counter(fields["faults"]), "violations": [None] * fields["violations"],
                        "promises": tuple(fields["promises"])}), caught) for fields, caught in plain]


def write(terminalreporter, outcomes: list) -> None:
    if not outcomes:
        return
    write_line = terminalreporter.write_line
    terminalreporter.section("fault suite")
    runs = [o for o, caught in outcomes if caught is None]
    faults: Counter = Counter()
    for outcome in runs:
        faults.update(outcome.faults)
        write_line(outcome.summary())
    promises = sorted({p for o in runs for p in o.promises})
    write_line(f"promises {' '.join(promises)}: {sum(o.ops for o in runs)} operations, "
               f"{sum(o.histories for o in runs)} histories, crashes: "
               f"{', '.join(f'{n} {kind}' for kind, n in sorted(faults.items())) or 'none'}, "
               f"violations: {sum(len(o.violations) for o in runs)}")
    controls = [(o, caught) for o, caught in outcomes if caught is not None]
    if controls:
        write_line(f"negative controls caught: {sum(bool(c) for _, c in controls)} of {len(controls)} "
                   f"({', '.join(f'{o.control} {len(o.violations)} violations' for o, _ in controls)})")
