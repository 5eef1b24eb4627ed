"""A latency histogram in the manner of HdrHistogram: log-linear buckets over integer nanoseconds.

Owns: counting values into buckets whose width is a fixed fraction of their value, merging
histograms from several generator processes, and reading percentiles back. Values below
2**SUB_BITS are counted exactly; above that every power of two is split into 2**(SUB_BITS-1)
equal buckets, so a reported percentile is within 1 / 2**(SUB_BITS-1) of the true value
(SUB_BITS = 8: under 0.8 %), whatever the magnitude. Memory is a flat list of a few thousand ints.

Never: sorts raw samples or keeps them, so recording costs the same at the millionth request as
at the first. The hot loop of the generator inlines `bucket_of` (see loadgen.py); the function
here is the reference it must agree with.
"""

from __future__ import annotations

SUB_BITS = 8
_SUB = 1 << SUB_BITS
_HALF = _SUB >> 1
# Largest value kept apart: 2**40 ns is about 18 minutes; anything longer lands in the last bucket.
VALUE_BITS_MAX = 40
BUCKETS = _SUB + (VALUE_BITS_MAX - SUB_BITS) * _HALF


def bucket_of(value: int) -> int:
    """Index of the bucket holding a non-negative integer value."""
    bits = value.bit_length()
    if bits <= SUB_BITS:
        return value
    if bits > VALUE_BITS_MAX:
        return BUCKETS - 1
    shift = bits - SUB_BITS
    return _SUB + (shift - 1) * _HALF + (value >> shift) - _HALF


def bucket_bounds(index: int) -> tuple[int, int]:
    """(lowest, highest) value that lands in bucket `index`, both inclusive."""
    if index < _SUB:
        return index, index
    shift, offset = divmod(index - _SUB, _HALF)
    shift += 1
    top = offset + _HALF
    return top << shift, ((top + 1) << shift) - 1


class Histogram:
    __slots__ = ("counts", "total", "min", "max", "sum")

    def __init__(self):
        self.counts = [0] * BUCKETS
        self.total = 0
        self.min = None
        self.max = None
        self.sum = 0

    def record(self, value: int) -> None:
        self.counts[bucket_of(value)] += 1
        self.total += 1
        self.sum += value
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
            self.max = value

    def merge(self, other: Histogram) -> None:
        counts = self.counts
        for index, count in enumerate(other.counts):
            if count:
                counts[index] += count
        self.total += other.total
        self.sum += other.sum
        if other.min is not None and (self.min is None or other.min < self.min):
            self.min = other.min
        if other.max is not None and (self.max is None or other.max > self.max):
            self.max = other.max

    def percentile(self, percent: float) -> int | None:
        """The highest value of the bucket holding the given percentile (HdrHistogram's "highest
        equivalent value"), clamped to the exact max; None when empty."""
        if not self.total:
            return None
        rank = max(1, -(-self.total * percent // 100))  # ceil, at least the first value
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(bucket_bounds(index)[1], self.max)
        return self.max

    def mean(self) -> float | None:
        return self.sum / self.total if self.total else None

    def summary_us(self) -> dict:
        """The figures the report prints, in microseconds."""
        def us(value):
            return None if value is None else round(value / 1000, 1)
        return {
            "count": self.total,
            "min_us": us(self.min), "mean_us": us(self.mean()),
            "p50_us": us(self.percentile(50)), "p90_us": us(self.percentile(90)),
            "p99_us": us(self.percentile(99)), "p99_9_us": us(self.percentile(99.9)),
            "max_us": us(self.max),
        }

    # Plain data, to cross a process boundary or land in the JSON report.
    def to_wire(self) -> dict:
        return {"buckets": {i: c for i, c in enumerate(self.counts) if c}, "total": self.total,
                "min": self.min, "max": self.max, "sum": self.sum, "sub_bits": SUB_BITS}

    @classmethod
    def from_wire(cls, wire: dict) -> Histogram:
        assert wire["sub_bits"] == SUB_BITS, "histograms of different precision cannot merge"
        histogram = cls()
        for index, count in wire["buckets"].items():
            histogram.counts[int(index)] = count
        histogram.total, histogram.min, histogram.max, histogram.sum = wire["total"], wire["min"], wire["max"], wire["sum"]
        return histogram
