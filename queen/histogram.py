"""Cumulative-bucket histograms for /metrics, kept in plain lists: a count per bucket and a sum.

Why not prometheus_client: an observation here is the hot path's price, paid on every request and
every WAL frame. Measured with timeit in this project's venv (Python 3.11, prometheus_client 0.26,
on the shared 2-core build machine, best of 7 x 200,000): `Histogram.labels(route, status)
.observe(x)` 3.8 us and `Counter.labels(route, status).inc()` 3.0 us, 1.6 us even on a child bound
in advance (its lock and its own bucket search), against 0.5 us for a dict lookup, a bisect into a
list of counts and a sum in Python. A request costs 20-40 us end to end, so the library would
add 15-30% to it; this costs 1-3%. The exposition text stays ours (queen/runtime/metrics.py) and
the tests hold it to prometheus_client's own parser (and promtool's, where installed).

Buckets are `le` bounds: a value lands in the first bucket whose bound is >= it (bisect_left), the
last slot being +Inf. Counts are cumulated only when rendered.
"""

from __future__ import annotations

from bisect import bisect_left

# Seconds a request takes, from its arrival whole to its answer ready to send. Parked calls (a pop
# or an acquire with waitMs) take up to their wait, hence the long tail.
REQUEST_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                   2.5, 5.0, 10.0, 30.0, 60.0)
# Seconds a WAL frame's write + fdatasync takes.
FSYNC_SECONDS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Bytes in a WAL frame (the ceiling frame written with it included).
FRAME_BYTES = (128, 512, 2048, 8192, 32768, 131072, 524288, 2097152, 8388608)
# Seconds a timer fired after its due time (the tick is 10 ms; a backlog or a restart makes more).
TIMER_LATE_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class Histogram:
    """counts[i]: observations in bucket i alone (not cumulated); the last is +Inf."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self.bounds, tuple(self.counts), self.sum)


class HistogramSnapshot:
    """A histogram's figures at one moment, cumulated as Prometheus shows them."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple, counts: tuple, total):
        self.bounds = bounds
        self.counts = counts
        self.sum = total

    @staticmethod
    def merged(bounds: tuple, snapshots) -> HistogramSnapshot:
        """One histogram of several with the same bounds (one per shard, say)."""
        counts = [0] * (len(bounds) + 1)
        total = 0.0
        for snapshot in snapshots:
            counts = [a + b for a, b in zip(counts, snapshot.counts, strict=True)]
            total += snapshot.sum
        return HistogramSnapshot(bounds, tuple(counts), total)

    def samples(self, labels: str = "") -> list[tuple[str, float]]:
        """(suffix and labels, value) rows: _bucket per bound and +Inf, _sum, _count. labels: the
        series' own, as 'a="x",b="y"' (no braces), "" for none."""
        rows = []
        running = 0
        sep = "," if labels else ""
        for bound, count in zip((*self.bounds, "+Inf"), self.counts, strict=True):
            running += count
            rows.append((f'_bucket{{{labels}{sep}le="{_bound(bound)}"}}', running))
        braced = f"{{{labels}}}" if labels else ""
        rows.append((f"_sum{braced}", round(self.sum, 9)))
        rows.append((f"_count{braced}", running))  # from the buckets, so the two always agree
        return rows


class RequestSeries:
    """One route's requests (a route's template and method), a histogram of seconds per answer
    status. The routes make one per (template, method) they know, so the labels stay bounded."""

    __slots__ = ("route", "method", "by_status")

    def __init__(self, route: str, method: str):
        self.route = route
        self.method = method
        self.by_status: dict[int, Histogram] = {}

    def observe(self, status: int, seconds: float) -> None:
        """The HTTP layer does this inline (queen/http/connection.py)."""
        (self.by_status.get(status) or self.add(status)).observe(seconds)

    def add(self, status: int) -> Histogram:
        histogram = self.by_status[status] = Histogram(REQUEST_SECONDS)
        return histogram


def answered(series, low: int, high: int) -> int:
    """Requests of every series answered with a status from low up to (not including) high: the
    4xx or 5xx counts /api/v1/server shows the operator, the dashboard's error rates."""
    return sum(sum(histogram.counts) for one in series for status, histogram in one.by_status.items()
               if low <= status < high)


def _bound(bound) -> str:
    return bound if isinstance(bound, str) else repr(float(bound))
