"""queen/histogram.py: where a value lands, and the rows /metrics shows for it."""

from __future__ import annotations

from queen.histogram import Histogram, HistogramSnapshot, RequestSeries


def test_a_value_on_a_bound_counts_in_that_bound_and_rows_are_cumulative():
    histogram = Histogram((1, 10))
    for value in (0.5, 1, 1.5, 10, 11):
        histogram.observe(value)
    assert histogram.counts == [2, 2, 1]  # le=1: 0.5 and 1; le=10: 1.5 and 10; +Inf: 11
    assert histogram.snapshot().samples('queue="q"') == [
        ('_bucket{queue="q",le="1.0"}', 2), ('_bucket{queue="q",le="10.0"}', 4), ('_bucket{queue="q",le="+Inf"}', 5),
        ('_sum{queue="q"}', 24.0), ('_count{queue="q"}', 5)]
    assert histogram.snapshot().samples()[-1] == ("_count", 5)


def test_shards_merge_into_one_histogram():
    a, b = Histogram((1,)), Histogram((1,))
    a.observe(0.5)
    b.observe(2)
    b.observe(3)
    merged = HistogramSnapshot.merged((1,), [a.snapshot(), b.snapshot()])
    assert merged.counts == (1, 2) and merged.sum == 5.5


def test_a_route_keeps_one_histogram_per_status():
    series = RequestSeries("/api/v1/kv/{ns}/{key}", "GET")
    series.observe(200, 0.001)
    series.observe(200, 0.002)
    series.observe(404, 0.0001)
    assert sorted(series.by_status) == [200, 404]
    assert sum(series.by_status[200].counts) == 2 and series.by_status[200].sum == 0.003
