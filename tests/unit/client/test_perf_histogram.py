"""The latency histogram of ``tidelog perf``: log-linear buckets as HdrHistogram keeps them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidelog.perf import Histogram, PerfResult


@given(st.lists(st.floats(min_value=0.0005, max_value=1e6, allow_nan=False), min_size=1, max_size=200))
def test_every_latency_is_counted_under_a_bound_within_a_sixteenth_of_it(latencies):
    h = Histogram.of(latencies)
    assert h.total == len(latencies)
    bounds = [upper for upper, _ in h.buckets]
    assert bounds == sorted(set(bounds))
    for ms in latencies:
        upper = min(b for b in bounds if b >= ms)  # its bucket's bound: the first at or above it
        assert upper <= max(ms, 0.001) * (1 + 1 / 16) + 1e-12


def test_the_tail_shows_as_it_is():
    result = PerfResult(records=1001, bytes=0, seconds=1.0, latencies_ms=[1.0] * 1000 + [250.0], expected=1001)
    h = result.histogram()
    assert [n for _, n in h.buckets] == [1000, 1] and 250.0 <= h.buckets[-1][0] <= 250.0 * 17 / 16
    lines = h.lines()
    assert lines[0].split()[-2:] == ["99.900", "%"] and lines[-1].split()[-2:] == ["100.000", "%"]
