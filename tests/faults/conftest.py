"""The fault suite's summary at the end of a pytest run: which promises were checked, on how many
operations and histories, under how many crashes, and which negative controls were caught."""

from collections import Counter

from tests.faults.workloads import OUTCOMES


def pytest_terminal_summary(terminalreporter):
    if not OUTCOMES:
        return
    write = terminalreporter.write_line
    terminalreporter.section("fault suite")
    runs = [o for o, caught in OUTCOMES if caught is None]
    faults: Counter = Counter()
    for outcome in runs:
        faults.update(outcome.faults)
        write(outcome.summary())
    promises = sorted({p for o in runs for p in o.promises})
    write(f"promises {' '.join(promises)}: {sum(o.ops for o in runs)} operations, "
          f"{sum(o.histories for o in runs)} histories, crashes: "
          f"{', '.join(f'{n} {kind}' for kind, n in sorted(faults.items())) or 'none'}, "
          f"violations: {sum(len(o.violations) for o in runs)}")
    controls = [(o, caught) for o, caught in OUTCOMES if caught is not None]
    if controls:
        write(f"negative controls caught: {sum(bool(c) for _, c in controls)} of {len(controls)} "
              f"({', '.join(f'{o.control} {len(o.violations)} violations' for o, _ in controls)})")
