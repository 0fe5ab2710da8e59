"""A read from a worker thread (the group coordinator's load, a ListOffsets search by
timestamp) while the log's owner swaps its segments: cleaned segments swapped in, a
truncation, retention. The swap is interleaved deterministically inside the read."""

from __future__ import annotations

import threading

import pytest

from tests.unit.log.helpers import make_batch, merge_first_two, open_log
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.segment import LogSegment
from tidelog.protocol.errors import OffsetOutOfRangeError
from tidelog.protocol.records import iter_all_records


def _log(tmp_path):
    """Segments at 0, 10, 20 and the active one at 30; offset n has timestamp 1000 + n."""
    log = open_log(tmp_path, LogConfig(retention_ms=-1))
    for n in range(35):
        if n and n % 10 == 0:
            log.roll()
        log.append_as_leader(make_batch(1, ts=1000 + n), leader_epoch=0)
    log.update_high_watermark(log.log_end_offset)
    log.release_appended()
    return log


def _during_first(monkeypatch, method: str, swap) -> None:
    """Run ``swap`` once, inside the first call of ``LogSegment.<method>``."""
    original = getattr(LogSegment, method)
    pending = [swap]

    def interleaved(self, *args, **kwargs):
        if pending:
            pending.pop()()
        return original(self, *args, **kwargs)
    monkeypatch.setattr(LogSegment, method, interleaved)


def _offsets(data: bytes) -> list[int]:
    return [r.offset for r in iter_all_records(data)]


def test_a_read_continues_on_the_cleaned_segments_swapped_in_under_it(tmp_path, monkeypatch):
    log = _log(tmp_path)
    _during_first(monkeypatch, "translate_offset", lambda: merge_first_two(log))
    assert _offsets(log.read(15, 1 << 20))[0] == 15
    assert [s.base_offset for s in log.segments] == [0, 20, 30]
    assert _offsets(log.read(0, 1 << 20)) == list(range(20))


def test_every_offset_is_read_once_across_a_swap(tmp_path, monkeypatch):
    log = _log(tmp_path)
    _during_first(monkeypatch, "read", lambda: merge_first_two(log))
    offset, seen = 5, []
    while offset < log.log_end_offset:
        got = _offsets(log.read(offset, 1 << 20))
        seen += got
        offset = got[-1] + 1
    assert seen == list(range(5, 35))


def test_a_read_of_a_truncated_segment_finds_the_new_end(tmp_path, monkeypatch):
    log = _log(tmp_path)
    _during_first(monkeypatch, "translate_offset", lambda: log.truncate_to(30))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(32, 1 << 20)
    assert log.log_end_offset == 30


def test_a_read_of_a_truncated_and_refilled_log_reads_the_new_records(tmp_path, monkeypatch):
    log = _log(tmp_path)
    refill = make_batch(1, values=[b"after the truncation"])

    def truncate_and_refill():
        log.truncate_fully_and_start_at(0)
        for _ in range(3):
            log.append_as_leader(refill, leader_epoch=1)
    _during_first(monkeypatch, "translate_offset", truncate_and_refill)
    got = list(iter_all_records(log.read(1, 1 << 20)))
    assert [r.offset for r in got] == [1, 2]
    assert {r.value for r in got} == {b"after the truncation"}


def test_a_read_below_the_start_left_by_retention_is_out_of_range(tmp_path, monkeypatch):
    log = _log(tmp_path)

    def retention():
        log.maybe_increment_log_start_offset(20)
        assert log.delete_old_segments() == [0, 10]
    _during_first(monkeypatch, "translate_offset", retention)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(15, 1 << 20)


def test_a_search_by_timestamp_continues_on_the_cleaned_segments_swapped_in_under_it(tmp_path, monkeypatch):
    log = _log(tmp_path)
    _during_first(monkeypatch, "find_offset_by_timestamp", lambda: merge_first_two(log))
    assert log.offset_for_timestamp(1015) == (15, 1015)
    assert log.offset_for_timestamp(1025) == (25, 1025)


def test_a_search_by_timestamp_during_a_truncation(tmp_path, monkeypatch):
    log = _log(tmp_path)
    _during_first(monkeypatch, "find_offset_by_timestamp", lambda: log.truncate_to(12))
    assert log.offset_for_timestamp(1005) == (5, 1005)
    assert log.offset_for_timestamp(1020) is None


def test_the_search_for_the_largest_timestamp_during_a_truncation(tmp_path, monkeypatch):
    # ListOffsets MAX_TIMESTAMP: the segment holding it dropped under the search
    log = _log(tmp_path)
    assert log.offset_of_max_timestamp() == (34, 1034)
    _during_first(monkeypatch, "find_offset_by_timestamp", lambda: log.truncate_to(12))
    assert log.offset_of_max_timestamp() == (11, 1011)


def test_a_worker_threads_read_across_a_swap_on_the_owner_thread(tmp_path, monkeypatch):
    # the worker stops inside its segment read while this (the owner) thread swaps
    log = _log(tmp_path)
    inside, swapped = threading.Event(), threading.Event()
    original = LogSegment.read

    def paused(self, *args, **kwargs):
        if threading.current_thread() is not threading.main_thread() and not inside.is_set():
            inside.set()
            swapped.wait()
        return original(self, *args, **kwargs)
    monkeypatch.setattr(LogSegment, "read", paused)
    results, errors = [], []

    def worker():
        try:
            results.append(log.read(15, 1 << 20))
        except Exception as e:
            errors.append(e)
    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert inside.wait(60)  # a bound for a broken run only
        merge_first_two(log)
    finally:
        swapped.set()
        thread.join()
    assert errors == [] and _offsets(results[0])[0] == 15
