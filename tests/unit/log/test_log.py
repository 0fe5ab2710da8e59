"""Unit tests of Log through broker.log.loader.load_log: appends, reads, timestamps,
truncation, leader epochs, follower appends, validation, retention, flushing and rolling."""

from __future__ import annotations

import os
import struct
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.log.helpers import (
    FakeClock,
    headers_of,
    make_batch,
    open_log,
    read_batches,
    read_records,
    segment_file_sizes,
)
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import Log
from tidelog.broker.log.segment import LOG_SUFFIX, LogSegment
from tidelog.protocol.errors import (
    FENCED_LEADER_EPOCH,
    RECORD_LIST_TOO_LARGE,
    CorruptRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TidelogError,
)
from tidelog.protocol.records import (
    CRC_AT,
    CRC_START,
    LOG_OVERHEAD,
    MAGIC_AT,
    NO_TIMESTAMP,
    BatchBuilder,
    Codec,
    TimestampType,
    build_batch,
    iter_all_records,
    iter_headers,
    patch_batch,
    read_header,
    validate_batches,
)

CODECS = st.sampled_from(list(Codec))
SMALL = settings(max_examples=40)


def _tmpdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="tidelog-log-")


def small_config(**kw) -> LogConfig:
    # retention.ms off unless a test sets it: record timestamps here are far in the past
    defaults = {"segment_bytes": 600, "index_interval_bytes": 100, "retention_ms": -1}
    defaults.update(kw)
    return LogConfig(**defaults)


batch_specs = st.lists(
    st.tuples(st.integers(1, 5), st.integers(0, 120), CODECS),  # (records, value size, codec)
    min_size=1, max_size=25)

configs = st.builds(
    small_config,
    segment_bytes=st.integers(800, 3000),
    index_interval_bytes=st.integers(0, 400),
    segment_index_bytes=st.sampled_from([16, 24, 10 * 1024 * 1024]),
)


class Appended:
    """What the test appended: per batch (base offset, last offset, producer bytes, epoch)."""

    def __init__(self):
        self.batches: list[tuple[int, int, bytes, int]] = []

    def add(self, log, raw: bytes, epoch: int) -> None:
        info = log.append_as_leader(raw, epoch)
        pos = 0
        offset = info.first_offset
        for _, h in iter_headers(raw):
            self.batches.append((offset, offset + h.last_offset_delta, raw[pos:pos + h.size], epoch))
            offset += h.record_count
            pos += h.size
        assert info.last_offset == offset - 1

    def stored_bytes(self, base: int, raw: bytes, epoch: int) -> bytes:
        b = bytearray(raw)
        struct.pack_into(">q", b, 0, base)
        struct.pack_into(">i", b, 12, epoch)
        return bytes(b)

    def expected(self, from_offset: int = 0) -> bytes:
        return b"".join(self.stored_bytes(b, raw, e)
                        for b, last, raw, e in self.batches if last >= from_offset)


def _fill(log, specs, epoch: int = 0, ts: int = 1000) -> Appended:
    app = Appended()
    for n, size, codec in specs:
        app.add(log, make_batch(n, size, ts, codec=codec), epoch)
    return app


# -- appends and reads --------------------------------------------------------------------------


@SMALL
@given(configs, batch_specs, st.integers(0, 2**31 - 1))
def test_append_as_leader_then_read_returns_the_stored_batches(config, specs, epoch):
    with _tmpdir() as d:
        log = open_log(d, config)
        app = Appended()
        expected_offset = 0
        for n, size, codec in specs:
            raw = make_batch(n, size, 1000, codec=codec)
            info = log.append_as_leader(raw, epoch)
            assert (info.first_offset, info.last_offset, info.record_count) == (
                expected_offset, expected_offset + n - 1, n)
            assert info.valid_bytes == len(raw)
            expected_offset += n
            pos = 0
            for _, h in iter_headers(raw):
                app.batches.append((info.first_offset, info.last_offset, raw[pos:pos + h.size], epoch))
                pos += h.size
        assert log.log_end_offset == expected_offset
        data = read_batches(log)
        assert data == app.expected()
        for (pos, h), (base, last, raw, e) in zip(iter_headers(data), app.batches):
            stored = data[pos:pos + h.size]
            assert (h.base_offset, h.last_offset, h.leader_epoch) == (base, last, e)
            assert stored[CRC_START:] == raw[CRC_START:]  # the checksummed part is untouched
            assert stored[8:12] == raw[8:12] and stored[MAGIC_AT:CRC_START] == raw[MAGIC_AT:CRC_START]
        # the segment files hold exactly what reads return, and segments roll at segment.bytes
        on_disk = b"".join(seg.read_all() for seg in log.segments)
        assert on_disk == data
        for seg in log.segments:
            assert seg.size <= config.segment_bytes or len(headers_of(seg.read_all())) == 1
        assert [s.base_offset for s in log.segments] == sorted(s.base_offset for s in log.segments)
        log.close()


@SMALL
@given(configs, batch_specs, st.data())
def test_read_of_any_offset_starts_with_the_batch_holding_it(config, specs, data):
    with _tmpdir() as d:
        log = open_log(d, config)
        app = _fill(log, specs)
        stored = app.expected()
        by_pos = list(iter_headers(stored))
        for offset in range(log.log_end_offset):
            max_bytes = data.draw(st.integers(0, 1500), label="max_bytes")
            out = log.read(offset, max_bytes)
            hs = validate_batches(out)
            first = hs[0][1]
            assert first.base_offset <= offset <= first.last_offset
            assert len(out) <= max(max_bytes, first.size)
            # a whole-batch slice of the stored bytes, from that batch on, within one segment
            start = next(p for p, h in by_pos if h.base_offset == first.base_offset)
            assert stored[start:start + len(out)] == out
            seg = next(s for s in reversed(log.segments) if s.base_offset <= offset)
            last = hs[-1][1]
            assert last.next_offset <= seg.next_offset
            if last.next_offset < seg.next_offset and len(hs) > 0:
                following = read_header(stored, start + len(out))
                assert len(out) + following.size > max_bytes, "read stopped early"
        assert log.read(log.log_end_offset, 1000) == b""


@SMALL
@given(configs, batch_specs, st.data())
def test_read_never_returns_a_batch_reaching_max_offset(config, specs, data):
    with _tmpdir() as d:
        log = open_log(d, config)
        _fill(log, specs)
        hw = data.draw(st.integers(0, log.log_end_offset), label="hw")
        assert log.update_high_watermark(hw) == hw
        for offset in range(log.log_end_offset + 1):
            out = log.read(offset, data.draw(st.integers(0, 3000)), max_offset=log.high_watermark)
            for _, h in iter_headers(out):
                assert h.last_offset < hw
            if out:
                first = read_header(out)
                assert first.base_offset <= offset <= first.last_offset
            else:
                # nothing is returned only when the batch holding ``offset`` reaches the HW
                holding = read_header(log.read(offset, 1)) if offset < log.log_end_offset else None
                assert holding is None or holding.last_offset >= hw
        # everything below the HW is readable through HW-bounded reads
        assert [r.offset for r in read_records(log, max_offset=hw)] == [
            r.offset for r in read_records(log) if read_header(log.read(r.offset, 1)).last_offset < hw]


def test_min_one_message_returns_a_batch_larger_than_max_bytes(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=10_000))
    big = make_batch(3, 400)
    log.append_as_leader(big, 0)
    log.append_as_leader(make_batch(1, 10), 0)
    out = log.read(1, 50)
    assert len(out) == len(big) > 50
    assert validate_batches(out)[0][1].base_offset == 0
    assert log.read(1, 50, min_one_message=False) == b""
    assert log.read(0, len(big), min_one_message=False) == out


def test_read_without_min_one_message_does_not_skip_to_the_next_segment(tmp_path):
    """The batch holding the offset does not fit: the answer is empty, never a later batch."""
    log = open_log(tmp_path, small_config(segment_bytes=500))
    log.append_as_leader(make_batch(1, 400), 0)  # offset 0, alone in segment 0
    log.append_as_leader(make_batch(1, 10), 0)  # offset 1, rolls to segment 1
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert log.read(0, 100, min_one_message=False) == b""
    assert read_header(log.read(0, 100)).base_offset == 0


def test_read_out_of_range_raises(tmp_path):
    log = open_log(tmp_path, small_config())
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 100)
    assert log.read(0, 100) == b""
    for _ in range(4):
        log.append_as_leader(make_batch(2, 50), 0)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(9, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    log.update_high_watermark(8)
    log.maybe_increment_log_start_offset(3)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 100)
    assert read_header(log.read(3, 1)).base_offset == 2
    assert log.read(8, 100) == b""


def test_a_batch_larger_than_a_segment_is_rejected(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    records = make_batch(1, 100) + make_batch(1, 400)
    with pytest.raises(TidelogError) as e:
        log.append_as_leader(records, 0)
    assert e.value.error is RECORD_LIST_TOO_LARGE
    assert log.log_end_offset == 0 and log.size == 0


@pytest.mark.parametrize("as_leader", [True, False])
def test_batches_larger_than_a_segment_together_are_spread_over_segments(tmp_path, as_leader):
    """A follower's fetch (or a producer's run of batches) may carry more than a segment."""
    log = open_log(tmp_path, small_config(segment_bytes=300))
    batches = [make_batch(1, 200) for _ in range(4)]
    if as_leader:
        log.append_as_leader(b"".join(batches), 0)
    else:
        stamped = bytearray()
        for i, b in enumerate(batches):
            b = bytearray(b)
            patch_batch(b, 0, i, 0)
            stamped += b
        log.append_as_follower(bytes(stamped))
    assert log.log_end_offset == 4 and len(log.segments) == 4
    assert all(seg.size <= 300 for seg in log.segments)
    assert [read_header(log.read(o, 1)).base_offset for o in range(4)] == [0, 1, 2, 3]


# -- timestamps ---------------------------------------------------------------------------------


def oracle_offset_for_timestamp(records: list[tuple[int, int]], target: int):
    """The first (offset, timestamp) with timestamp >= target, in offset order."""
    return next(((o, t) for o, t in records if t >= target), None)


def _stamped_log(d, config, stamp_lists):
    """A CreateTime log of one batch per list of record timestamps, its HW at its end, and
    its (offset, timestamp) model."""
    log = open_log(d, config.with_overrides({"segment.ms": 2**62}))
    model = []
    for stamps in stamp_lists:
        info = log.append_as_leader(make_batch(len(stamps), 20, stamps), 0)
        model += [(info.first_offset + i, t) for i, t in enumerate(stamps)]
    log.update_high_watermark(log.log_end_offset)
    return log, model


@SMALL
@given(configs,
       st.lists(st.lists(st.integers(0, 5000), min_size=1, max_size=5), min_size=1, max_size=20),
       st.data())
def test_offset_for_timestamp_matches_brute_force_create_time(config, stamp_lists, data):
    with _tmpdir() as d:
        log, model = _stamped_log(d, config, stamp_lists)
        assert [(r.offset, r.timestamp) for r in read_records(log)] == model
        if data.draw(st.booleans(), label="move log start"):
            start = data.draw(st.integers(0, log.log_end_offset), label="log start")
            log.maybe_increment_log_start_offset(start)
            model = [(o, t) for o, t in model if o >= start]
        targets = data.draw(st.lists(st.integers(-1, 5002), max_size=10), label="targets")
        for target in targets + [t for _, t in model] + [t + 1 for _, t in model]:
            assert log.offset_for_timestamp(target) == oracle_offset_for_timestamp(model, target), target


@SMALL
@given(configs, st.lists(st.tuples(st.integers(1, 4), st.integers(-50, 1000)), min_size=1, max_size=20),
       st.data())
def test_offset_for_timestamp_log_append_time(config, appends, data):
    """LogAppendTime: every record of a batch carries the broker's clock at its append, even
    when that clock steps backwards."""
    clock = FakeClock(10_000)
    with _tmpdir() as d:
        cfg = config.with_overrides({"message.timestamp.type": "LogAppendTime", "segment.ms": 2**62})
        log = open_log(d, cfg, clock=clock)
        model = []
        for n, step in appends:
            now = clock.advance(step)
            info = log.append_as_leader(make_batch(n, 20, 5), 0)  # producer timestamps ignored
            assert info.log_append_time == now and info.max_timestamp == now
            model += [(info.first_offset + i, now) for i in range(n)]
        stored = read_batches(log)
        for _, h in iter_headers(stored):
            assert h.timestamp_type is TimestampType.LOG_APPEND_TIME
        assert [(r.offset, r.timestamp) for r in iter_all_records(stored)] == model
        validate_batches(stored)  # the CRC was rewritten with the new timestamp
        targets = data.draw(st.lists(st.integers(9_000, 40_000), max_size=10), label="targets")
        for target in targets + [t for _, t in model]:
            assert log.offset_for_timestamp(target) == oracle_offset_for_timestamp(model, target), target


def oracle_offset_of_max_timestamp(records: list[tuple[int, int]]):
    """The first (offset, timestamp) with the largest timestamp, in offset order."""
    return min(records, key=lambda r: (-r[1], r[0]), default=None)


@SMALL
@given(configs,
       st.lists(st.lists(st.integers(0, 5000), min_size=1, max_size=5), min_size=1, max_size=20),
       st.data())
def test_offset_of_max_timestamp_counts_only_records_at_or_above_the_log_start(config, stamp_lists, data):
    """ListOffsets MAX_TIMESTAMP names a record a reader can fetch: records below the log
    start (moved by DeleteRecords, their segment not deleted yet, or the batch it falls in)
    do not count, though their bytes are still in the segment files."""
    with _tmpdir() as d:
        log, model = _stamped_log(d, config, stamp_lists)
        start = data.draw(st.integers(0, log.log_end_offset), label="log start")
        log.maybe_increment_log_start_offset(start)
        model = [(o, t) for o, t in model if o >= start]
        assert log.offset_of_max_timestamp() == oracle_offset_of_max_timestamp(model)


def test_offset_of_max_timestamp_after_delete_records_past_it(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=400, index_interval_bytes=0))
    for stamps in ([100, 9000, 200], [300, 400], [500, 450], [350]):
        log.append_as_leader(make_batch(len(stamps), 30, stamps), 0)
    log.update_high_watermark(log.log_end_offset)
    assert log.offset_of_max_timestamp() == (1, 9000)
    log.maybe_increment_log_start_offset(2)  # within the batch holding the largest
    assert log.offset_of_max_timestamp() == (5, 500)
    log.maybe_increment_log_start_offset(6)
    assert log.offset_of_max_timestamp() == (6, 450)
    log.maybe_increment_log_start_offset(log.log_end_offset)
    assert log.offset_of_max_timestamp() is None


def test_offset_for_timestamp_after_clean_reload(tmp_path):
    config = small_config(segment_bytes=400, index_interval_bytes=0)
    log = open_log(tmp_path, config)
    model = []
    for i, ts in enumerate([500, 100, 900, 300, 1200, 700, 1500, 50]):
        info = log.append_as_leader(make_batch(2, 30, [ts, ts + 5]), 0)
        model += [(info.first_offset, ts), (info.first_offset + 1, ts + 5)]
    log.close()
    log = open_log(tmp_path, config, had_clean_shutdown=True, recovery_point=log.log_end_offset)
    for target in range(0, 1600, 25):
        assert log.offset_for_timestamp(target) == oracle_offset_for_timestamp(model, target)


# -- truncation ---------------------------------------------------------------------------------


@SMALL
@given(configs, batch_specs, st.data())
def test_truncate_to(config, specs, data):
    with _tmpdir() as d:
        log = open_log(d, config)
        app = _fill(log, specs)
        leo = log.log_end_offset
        log.update_high_watermark(data.draw(st.integers(0, leo), label="hw"))
        log.flush(data.draw(st.integers(0, leo), label="flushed"))
        target = data.draw(st.integers(0, leo + 2), label="target")
        before = read_records(log)
        first_base = log.segments[0].base_offset
        changed = log.truncate_to(target)
        if target >= leo:
            assert not changed and log.log_end_offset == leo
            assert read_records(log) == before
            return
        assert changed
        # every batch reaching ``target`` is gone, whole; every batch below it stays
        kept = [b for b in app.batches if b[1] < target]
        new_leo = kept[-1][1] + 1 if kept else min(target, first_base)
        assert log.log_end_offset == new_leo
        assert read_records(log) == [r for r in before if r.offset < new_leo]
        assert log.high_watermark <= new_leo and log.recovery_point <= new_leo
        assert log.log_start_offset <= new_leo
        app.batches = kept
        assert read_batches(log) == app.expected()
        assert all(s.base_offset < new_leo or s is log.active_segment for s in log.segments)
        # appends continue at the new end, and a reload (clean or not) sees the same log
        more = make_batch(2, 10)
        assert log.append_as_leader(more, 1).first_offset == new_leo
        expected = read_batches(log)
        clean = data.draw(st.booleans(), label="clean")
        if clean:
            log.close()
        else:
            for seg in log.segments:
                os.close(seg._fd)
        log = open_log(d, config, had_clean_shutdown=clean, recovery_point=log.recovery_point,
                       log_start_offset=log.log_start_offset)
        assert read_batches(log) == expected
        log.close()


def test_truncate_to_at_batch_boundaries_and_mid_segment(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=10_000))
    for _ in range(5):
        log.append_as_leader(make_batch(3, 20), 0)  # batches [0-2] [3-5] [6-8] [9-11] [12-14]
    assert log.truncate_to(12)  # boundary
    assert log.log_end_offset == 12
    assert log.truncate_to(7)  # mid-batch: [6-8] goes whole
    assert log.log_end_offset == 6
    assert [h.base_offset for h in headers_of(read_batches(log))] == [0, 3]
    assert not log.truncate_to(6) and not log.truncate_to(100)
    assert len(log.segments) == 1


def test_truncate_to_across_segments_deletes_later_segment_files(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    for _ in range(10):
        log.append_as_leader(make_batch(2, 60), 0)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 4
    cut = bases[2] + 1
    log.truncate_to(cut)
    assert [s.base_offset for s in log.segments] == bases[:3]
    names = {n for n in os.listdir(tmp_path) if n.endswith(LOG_SUFFIX)}
    assert names == {f"{b:020d}.log" for b in bases[:3]}
    assert log.log_end_offset == bases[2]  # the batch at the base straddles the cut


def test_truncate_below_the_first_segment_restarts_the_log(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    for _ in range(10):
        log.append_as_leader(make_batch(2, 60), 0)
    log.update_high_watermark(20)
    log.delete_old_segments()  # nothing is old yet: only moves nothing
    log.maybe_increment_log_start_offset(8)
    log.delete_old_segments()
    first = log.segments[0].base_offset
    assert first > 0 and log.log_start_offset == 8
    assert log.truncate_to(first - 1)
    assert log.log_end_offset == first - 1 == log.log_start_offset
    assert len(log.segments) == 1 and log.segments[0].size == 0
    assert log.append_as_leader(make_batch(1), 3).first_offset == first - 1


def test_truncate_below_the_log_start_offset_keeps_start_at_most_the_end(tmp_path):
    """DeleteRecords moved the log start into the first segment; a follower truncation below
    it must not leave a log whose start is beyond its end."""
    log = open_log(tmp_path, small_config(segment_bytes=10_000))
    for _ in range(6):
        log.append_as_leader(make_batch(2, 20), 0)
    log.update_high_watermark(12)
    log.maybe_increment_log_start_offset(9)
    assert log.truncate_to(4)
    assert log.log_end_offset == 4
    assert log.log_start_offset <= log.log_end_offset
    assert log.log_start_offset <= log.high_watermark <= log.log_end_offset
    info = log.append_as_leader(make_batch(1), 1)
    assert info.first_offset == 4
    assert read_header(log.read(4, 100)).base_offset == 4


def test_truncate_fully_and_start_at(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    for e in range(6):
        log.append_as_leader(make_batch(2, 60), e)
    log.update_high_watermark(6)
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark, log.recovery_point) == (1000,) * 4
    assert [s.base_offset for s in log.segments] == [1000]
    assert log.epoch_cache.entries == []
    assert [n for n in os.listdir(tmp_path) if n.endswith(LOG_SUFFIX)] == [f"{1000:020d}.log"]
    assert log.append_as_leader(make_batch(3), 7).first_offset == 1000
    assert log.epoch_cache.entries == [(7, 1000)]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(999, 100)
    log.close()
    log = open_log(tmp_path, small_config(segment_bytes=300), log_start_offset=1000)
    assert (log.log_start_offset, log.log_end_offset) == (1000, 1003)
    assert log.epoch_cache.entries == [(7, 1000)]


# -- leader epochs ------------------------------------------------------------------------------


def test_leader_epoch_cache_follows_appends_and_truncation(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=400))
    for epoch in [0, 0, 2, 2, 2, 5]:
        log.append_as_leader(make_batch(2, 30), epoch)  # 2 records per batch
    assert log.epoch_cache.entries == [(0, 0), (2, 4), (5, 10)]
    assert log.latest_epoch == 5
    assert log.end_offset_for_epoch(0) == (0, 4)
    assert log.end_offset_for_epoch(1) == (0, 4)  # unknown epoch: the largest one below it
    assert log.end_offset_for_epoch(2) == (2, 10)
    assert log.end_offset_for_epoch(4) == (2, 10)
    assert log.end_offset_for_epoch(5) == (5, 12)
    assert log.end_offset_for_epoch(6) == (-1, -1)
    assert log.end_offset_for_epoch(-1) == (-1, -1)
    for _, h in iter_headers(read_batches(log)):
        assert h.leader_epoch == {0: 0, 2: 0, 4: 2, 6: 2, 8: 2, 10: 5}[h.base_offset]
    log.truncate_to(9)  # the epoch-2 batch [8, 9] straddles: gone
    assert log.log_end_offset == 8
    assert log.epoch_cache.entries == [(0, 0), (2, 4)]
    assert log.end_offset_for_epoch(2) == (2, 8)
    log.append_as_leader(make_batch(1), 7)
    assert log.epoch_cache.entries == [(0, 0), (2, 4), (7, 8)]
    log.close()
    reloaded = open_log(tmp_path, small_config(segment_bytes=400))
    assert reloaded.epoch_cache.entries == [(0, 0), (2, 4), (7, 8)]


def test_leader_epoch_cache_is_rebuilt_from_batch_headers(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    for epoch in [1, 1, 3, 4, 4, 4]:
        log.append_as_leader(make_batch(2, 60), epoch)
    log.close()
    os.unlink(tmp_path / "leader-epoch-checkpoint")
    log = open_log(tmp_path, small_config(segment_bytes=300))
    assert log.epoch_cache.entries == [(1, 0), (3, 4), (4, 6)]


def test_leader_epoch_going_backwards_is_rejected_and_nothing_is_written(tmp_path):
    """Recovery cuts a segment at a batch whose leader epoch goes backwards, so the log must
    not accept one in the first place: an acknowledged append may not vanish without damage."""
    config = small_config(segment_bytes=10_000)
    log = open_log(tmp_path, config)
    log.append_as_leader(make_batch(2), 5)
    sizes = segment_file_sizes(tmp_path)
    with pytest.raises(TidelogError) as e:
        log.append_as_leader(make_batch(2), 3)
    assert e.value.error is FENCED_LEADER_EPOCH
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(leader_batch(2, 1, 4))
    with pytest.raises(CorruptRecordError):  # backwards within one follower append
        log.append_as_follower(leader_batch(2, 1, 7) + leader_batch(3, 1, 6))
    assert segment_file_sizes(tmp_path) == sizes and log.log_end_offset == 2
    log.append_as_leader(make_batch(1), 5)  # the same epoch is fine
    log.append_as_follower(leader_batch(3, 1, 6) + leader_batch(4, 1, 6))
    assert log.epoch_cache.entries == [(5, 0), (6, 3)]
    for seg in log.segments:  # crash: every accepted append survives an unclean restart
        os.close(seg._fd)
    log = open_log(tmp_path, config, had_clean_shutdown=False, recovery_point=0)
    assert log.recovery_report == []
    assert log.log_end_offset == 5
    assert log.epoch_cache.entries == [(5, 0), (6, 3)]


# -- follower appends ---------------------------------------------------------------------------


def leader_batch(base: int, n: int, epoch: int, size: int = 10, ts: int = 1000) -> bytes:
    b = BatchBuilder()
    for i in range(n):
        b.append(ts, None, f"f{base + i}".encode().ljust(size, b"."))
    return b.build(base, epoch)


def test_append_as_follower_keeps_offsets_and_epochs(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    records = leader_batch(0, 3, 1) + leader_batch(3, 2, 1)
    info = log.append_as_follower(records)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, 4, 5)
    gap = leader_batch(10, 2, 4)  # compaction on the leader can leave gaps
    log.append_as_follower(gap)
    assert log.log_end_offset == 12
    assert read_batches(log) == records + gap  # byte for byte: followers never re-stamp
    assert log.epoch_cache.entries == [(1, 0), (4, 10)]
    assert read_header(log.read(6, 1)).base_offset == 10


@pytest.mark.parametrize("records", [
    leader_batch(3, 2, 1),  # overlaps the log end
    leader_batch(0, 1, 1),  # far behind
    leader_batch(5, 3, 1) + leader_batch(6, 1, 1),  # second batch goes backwards
])
def test_append_as_follower_rejects_offsets_going_backwards(tmp_path, records):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    log.append_as_follower(leader_batch(0, 5, 1))
    sizes = segment_file_sizes(tmp_path)
    with pytest.raises(CorruptRecordError):
        log.append_as_follower(records)
    assert log.log_end_offset == 5
    assert segment_file_sizes(tmp_path) == sizes


# -- validation: a bad batch writes nothing -------------------------------------------------------


def _corrupt(raw: bytes, at: int, value: bytes) -> bytes:
    b = bytearray(raw)
    b[at:at + len(value)] = value
    return bytes(b)


def _bad_crc(raw):
    return _corrupt(raw, len(raw) - 1, bytes([raw[-1] ^ 0xFF]))


def _bad_magic(raw):
    return _corrupt(raw, MAGIC_AT, b"\x01")


def _zero_records(raw):
    b = bytearray(raw)
    struct.pack_into(">i", b, 57, 0)
    struct.pack_into(">i", b, 23, -1)
    from crc32c import crc32c
    struct.pack_into(">I", b, CRC_AT, crc32c(bytes(b[CRC_START:])))
    return bytes(b)


def _truncated(raw):
    return raw[:-3]


def _short_length(raw):
    return _corrupt(raw, 8, struct.pack(">i", 10))


def _empty(raw):
    return b""  # alone: an empty record set; after a good batch: trailing garbage (below)


BAD_BATCHES = [(_bad_crc, CorruptRecordError), (_bad_magic, CorruptRecordError),
               (_zero_records, CorruptRecordError), (_truncated, CorruptRecordError),
               (_short_length, CorruptRecordError), (_empty, CorruptRecordError)]


@pytest.mark.parametrize("as_follower", [False, True])
@pytest.mark.parametrize("position", ["alone", "after a good batch"])
@pytest.mark.parametrize("damage,error", BAD_BATCHES)
def test_bad_batches_are_rejected_and_nothing_is_written(tmp_path, damage, error, position, as_follower):
    log = open_log(tmp_path, small_config(segment_bytes=10_000, max_message_bytes=2000))
    if as_follower:
        log.append_as_follower(leader_batch(0, 3, 1))
        good, bad = leader_batch(3, 2, 1), damage(leader_batch(5, 2, 1))
    else:
        log.append_as_leader(make_batch(3), 1)
        good, bad = make_batch(2), damage(make_batch(2))
    records = bad if position == "alone" else good + (bad or b"\x00" * 5)
    sizes, leo, epochs = segment_file_sizes(tmp_path), log.log_end_offset, log.epoch_cache.entries
    with pytest.raises(error):
        if as_follower:
            log.append_as_follower(records)
        else:
            log.append_as_leader(records, 2)
    assert log.log_end_offset == leo
    assert segment_file_sizes(tmp_path) == sizes
    assert log.epoch_cache.entries == epochs
    assert log.append_as_leader(make_batch(1), 2).first_offset == leo


def test_oversize_batch_is_rejected_with_record_too_large(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=10_000, max_message_bytes=300))
    fits = make_batch(1, 300 - 61 - 20)
    assert len(fits) <= 300
    log.append_as_leader(fits, 0)
    sizes = segment_file_sizes(tmp_path)
    for records in (make_batch(1, 400), make_batch(1, 10) + make_batch(1, 400)):
        with pytest.raises(RecordTooLargeError):
            log.append_as_leader(records, 0)
    assert segment_file_sizes(tmp_path) == sizes and log.log_end_offset == 1
    # the leader accepted what a follower copies: its size is not checked again (as in Kafka)
    big = bytearray(make_batch(1, 400))
    patch_batch(big, 0, 1, 0)
    log.append_as_follower(bytes(big))
    assert log.log_end_offset == 2


# -- retention ----------------------------------------------------------------------------------


def _segment_uppers(log):
    segs = log.segments
    return [(s, segs[i + 1].base_offset if i + 1 < len(segs) else log.log_end_offset)
            for i, s in enumerate(segs)]


@SMALL
@given(st.lists(st.integers(0, 100_000), min_size=1, max_size=25), st.integers(0, 50_000),
       st.integers(0, 200_000), st.data())
def test_retention_by_time_deletes_only_old_whole_segments_below_the_hw(stamps, retention_ms, now, data):
    clock = FakeClock(0)
    config = small_config(segment_bytes=200, retention_ms=retention_ms, segment_ms=2**62)
    with _tmpdir() as d:
        log = open_log(d, config, clock=clock)
        for ts in stamps:
            log.append_as_leader(make_batch(1, 60, ts), 0)
        hw = log.update_high_watermark(data.draw(st.integers(0, log.log_end_offset), label="hw"))
        clock.now_ms = now
        before = read_records(log)
        segs_before = _segment_uppers(log)
        deleted = log.delete_old_segments()
        assert deleted == [s.base_offset for s, _ in segs_before[:len(deleted)]], "a prefix"
        for s, upper in segs_before[:len(deleted)]:
            assert upper <= hw and now - s.max_timestamp > retention_ms
        if len(deleted) < len(segs_before):
            s, upper = segs_before[len(deleted)]
            assert s.size == 0 or upper > hw or now - s.max_timestamp <= retention_ms
        kept = segs_before[len(deleted):]
        first_kept = kept[0][0].base_offset if kept else log.log_end_offset
        assert log.log_start_offset == log.segments[0].base_offset == first_kept
        after = read_records(log)
        assert after == [r for r in before if r.offset >= log.log_start_offset]
        assert all(r.offset in {a.offset for a in after} for r in before if r.offset >= hw)
        assert log.log_end_offset == before[-1].offset + 1
        for base in deleted:
            assert not os.path.exists(os.path.join(d, f"{base:020d}.log"))


@pytest.mark.parametrize("segment_bytes", [1 << 20, 450])  # one segment (the active one); 3 records each
def test_records_without_timestamps_are_dated_by_their_segment_last_write(tmp_path, segment_bytes):
    # no record timestamp (-1): a segment is as old as its last write (Kafka's lastModified),
    # not its creation, else the records written just now into an old segment would go
    clock = FakeClock(1_000_000)
    config = small_config(segment_bytes=segment_bytes, retention_ms=10_000, segment_ms=2**62)
    log = open_log(tmp_path, config, clock=clock)
    written = {}
    for i in range(20):
        info = log.append_as_leader(make_batch(1, 60, NO_TIMESTAMP), 0)
        written[info.first_offset] = clock()
        log.update_high_watermark(log.log_end_offset)
        clock.advance(1_500)
    log.delete_old_segments()
    kept = {r.offset for r in read_records(log)}
    young = {o for o, t in written.items() if clock() - t <= config.retention_ms}
    assert young and young <= kept
    if segment_bytes == 450:
        assert log.log_start_offset > 0  # the older segments went


def test_a_reopened_segment_without_timestamps_is_dated_by_its_file_mtime(tmp_path):
    clock = FakeClock(1_000_000)
    log = open_log(tmp_path, small_config(), clock=clock)
    log.append_as_leader(make_batch(1, 60, NO_TIMESTAMP), 0)
    log.roll()
    log.close()
    path = os.path.join(tmp_path, f"{0:020d}.log")
    os.utime(path, ns=(5_000_000 * 1_000_000, 5_000_000 * 1_000_000))
    log = open_log(tmp_path, small_config(), clock=clock)
    assert Log.segment_timestamp(log.segments[0]) == 5_000_000
    log.close()


def test_retention_by_time_with_an_injected_clock(tmp_path):
    clock = FakeClock(1_000_000)
    config = small_config(segment_bytes=200, retention_ms=10_000, segment_ms=2**62)
    log = open_log(tmp_path, config, clock=clock)
    for i in range(6):
        log.append_as_leader(make_batch(1, 60, clock.now_ms), 0)  # one batch per segment
        clock.advance(5_000)
    # segments: ts 1_000_000, 1_005_000, ... 1_025_000; now 1_030_000
    assert len(log.segments) == 6
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments() == [0, 1, 2, 3]  # newest record older than 10 s
    assert log.log_start_offset == 4
    clock.advance(100_000)
    log.update_high_watermark(4)
    assert log.delete_old_segments() == []  # segment 4 holds offset 4, not below the HW
    log.update_high_watermark(5)
    assert log.delete_old_segments() == [4]
    assert log.log_start_offset == 5
    log.update_high_watermark(6)
    assert log.delete_old_segments() == [5]  # the active one too: the log rolls first
    assert (log.log_start_offset, log.log_end_offset) == (6, 6)
    assert [s.base_offset for s in log.segments] == [6]
    assert log.append_as_leader(make_batch(1, 10, clock.now_ms), 0).first_offset == 6


@SMALL
@given(st.lists(st.integers(20, 150), min_size=1, max_size=25), st.integers(0, 3000), st.data())
def test_retention_by_size(sizes, retention_bytes, data):
    config = small_config(segment_bytes=400, retention_bytes=retention_bytes, retention_ms=-1)
    with _tmpdir() as d:
        log = open_log(d, config)
        for size in sizes:
            log.append_as_leader(make_batch(1, size), 0)
        hw = log.update_high_watermark(data.draw(st.integers(0, log.log_end_offset), label="hw"))
        before = read_records(log)
        size_before = log.size
        deleted = log.delete_old_segments()
        removed = size_before - log.size
        assert size_before - removed >= retention_bytes or not deleted
        if deleted:
            assert log.log_start_offset == log.segments[0].base_offset
        first, upper = _segment_uppers(log)[0]
        if first.size:
            # the next candidate is kept because it would take the log under the limit,
            # or because it is not wholly below the HW
            assert log.size - first.size < retention_bytes or upper > hw
        assert read_records(log) == [r for r in before if r.offset >= log.log_start_offset]
        assert log.log_start_offset <= hw  # nothing at or above the HW is deleted


def test_log_start_offset_advances_and_deletes_whole_segments_below_it(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=300))
    for _ in range(10):
        log.append_as_leader(make_batch(2, 60), 0)
    bases = [s.base_offset for s in log.segments]
    log.update_high_watermark(10)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(11)
    assert log.maybe_increment_log_start_offset(bases[2] + 1)
    assert not log.maybe_increment_log_start_offset(bases[1])  # never moves back
    assert log.log_start_offset == bases[2] + 1
    assert log.delete_old_segments() == bases[:2]
    assert log.segments[0].base_offset == bases[2]
    assert log.log_start_offset == bases[2] + 1
    with pytest.raises(OffsetOutOfRangeError):
        log.read(bases[2], 100)


# -- durability, rolling, reloading ---------------------------------------------------------------


def test_flush_advances_the_recovery_point(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=10_000))
    for _ in range(3):
        log.append_as_leader(make_batch(2), 0)
    assert log.recovery_point == 0
    log.flush(4)
    assert log.recovery_point == 4
    log.flush(2)  # never backwards
    assert log.recovery_point == 4
    log.flush()
    assert log.recovery_point == 6 == log.log_end_offset
    log.flush(100)
    assert log.recovery_point == 6


def test_flush_messages_flushes_automatically(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=10_000, flush_messages=3))
    log.append_as_leader(make_batch(2), 0)
    assert log.recovery_point == 0
    log.append_as_leader(make_batch(1), 0)
    assert log.recovery_point == 3


def test_flush_rolled_segments_moves_the_recovery_point_past_closed_segments(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=10_000))
    log.append_as_leader(make_batch(4), 0)
    log.roll()
    assert [s.base_offset for s in log.segments] == [0, 4]
    log.roll()  # an empty active segment is not rolled again
    assert len(log.segments) == 2
    log.append_as_leader(make_batch(2), 0)
    assert log.recovery_point == 0  # a roll does not fsync
    log.flush_rolled_segments()
    assert log.recovery_point == 4  # the closed segment, not the active one


def test_a_flush_after_a_roll_also_makes_the_new_files_names_durable(tmp_path, monkeypatch):
    # a segment's data fsynced is not enough: its directory entry is durable only once the
    # directory is fsynced (Kafka's flushDir), or a power loss could drop the new file whole
    import tidelog.broker.log.log as log_module
    synced = []
    monkeypatch.setattr(log_module, "fsync_dir", synced.append)
    log = open_log(tmp_path, small_config(segment_bytes=10_000))
    log.append_as_leader(make_batch(4), 0)
    log.roll()
    log.append_as_leader(make_batch(2), 0)
    log.flush()
    assert synced == [log.directory]
    log.append_as_leader(make_batch(1), 0)
    log.flush()  # no file created since
    assert synced == [log.directory]


def test_roll_by_segment_ms_with_the_fake_clock(tmp_path):
    """Without record timestamps the segment's age comes from the clock."""
    clock = FakeClock()
    log = open_log(tmp_path, small_config(segment_bytes=10_000, segment_ms=60_000), clock=clock)
    log.append_as_leader(make_batch(1, 10, NO_TIMESTAMP), 0)
    clock.advance(60_000)
    log.append_as_leader(make_batch(1, 10, NO_TIMESTAMP), 0)
    assert len(log.segments) == 1
    clock.advance(1)
    log.append_as_leader(make_batch(1, 10, NO_TIMESTAMP), 0)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_by_segment_ms_uses_record_timestamps(tmp_path):
    clock = FakeClock()
    log = open_log(tmp_path, small_config(segment_bytes=10_000, segment_ms=60_000), clock=clock)
    log.append_as_leader(make_batch(1, 10, 1_000), 0)
    log.append_as_leader(make_batch(1, 10, 61_000), 0)
    assert len(log.segments) == 1
    log.append_as_leader(make_batch(1, 10, 61_001), 0)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_when_the_index_is_full(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=10_000, index_interval_bytes=0,
                                          segment_index_bytes=16))
    for _ in range(8):
        log.append_as_leader(make_batch(1, 10), 0)
    assert len(log.segments) > 1
    for seg in log.segments:
        assert len(seg.index) <= 2 and len(seg.time_index) <= 1
    assert [r.offset for r in read_records(log)] == list(range(8))


@SMALL
@given(configs, batch_specs, st.booleans())
def test_reload_gives_back_the_same_log(config, specs, clean):
    with _tmpdir() as d:
        log = open_log(d, config)
        _fill(log, specs)
        if config.segment_bytes > 1000:
            log.flush()
        expected = read_batches(log)
        state = (log.log_end_offset, [s.base_offset for s in log.segments],
                 [(s.max_timestamp, s.next_offset) for s in log.segments], log.epoch_cache.entries)
        indexes = [(s.index.entries(), s.time_index.entries()) for s in log.segments]
        rp = log.recovery_point
        if clean:
            log.close()
        else:
            for seg in log.segments:
                os.close(seg._fd)
        log = open_log(d, config, had_clean_shutdown=clean, recovery_point=rp)
        assert log.recovery_report == []
        assert read_batches(log) == expected
        assert (log.log_end_offset, [s.base_offset for s in log.segments],
                [(s.max_timestamp, s.next_offset) for s in log.segments], log.epoch_cache.entries) == state
        # rebuilt (or loaded) indexes equal the ones kept while appending, except that a
        # rolled segment's time index may be sealed with its final maximum
        for seg, (offsets, times) in zip(log.segments, indexes):
            assert seg.index.entries() == offsets
            assert seg.time_index.entries()[:len(times)] == times or seg.time_index.entries() == times[:-1]
        # and appending goes on where it stopped, after the data (not over it)
        more = make_batch(1)
        assert log.append_as_leader(more, 0).first_offset == state[0]
        assert read_batches(log) == expected + read_batches(log, state[0])
        assert read_records(log)[-1].value == next(iter_all_records(more)).value
        assert [r.offset for r in read_records(log)] == list(range(state[0] + 1))
        log.close()
        log = open_log(d, config, had_clean_shutdown=clean, recovery_point=0)
        assert [r.offset for r in read_records(log)] == list(range(state[0] + 1))
        log.close()


def test_stored_batch_sizes_add_up(tmp_path):
    log = open_log(tmp_path, small_config(segment_bytes=500))
    for n in range(1, 12):
        log.append_as_leader(make_batch(n % 4 + 1, 7 * n), 0)
    for seg in log.segments:
        assert seg.size == os.path.getsize(seg.log_path)
        assert sum(h.batch_length + LOG_OVERHEAD for h in headers_of(seg.read_all())) == seg.size


def test_a_read_inside_a_gap_returns_the_next_batch_below_max_offset_or_nothing(tmp_path):
    """What a consumer relies on for compacted topics (tidelog.aio.consumer: "gap"): a read
    with min_one_message from an offset in a gap returns the first batch after it when one
    starts below ``max_offset`` (the HW), across segments, and b"" only when none does."""
    log = open_log(tmp_path, small_config(segment_bytes=10_000))
    log.append_as_follower(build_batch([b"a", b"b"], base_offset=0, leader_epoch=0))  # offsets 0-1, then a gap 2-4
    log.roll(5)
    log.append_as_follower(build_batch([b"c"], base_offset=7, leader_epoch=0))  # a gap 5-6, then offset 7
    log.roll(8)  # the active segment starts at 8 and is empty
    log.update_high_watermark(8)
    assert read_header(log.read(2, 100, max_offset=8)).base_offset == 7
    assert read_header(log.read(5, 100, max_offset=8)).base_offset == 7
    assert log.read(5, 100, max_offset=7) == b""  # the next batch is not below the HW yet
    assert log.read(8, 100, max_offset=8) == b""


def test_the_last_leader_append_is_read_from_memory_as_the_segment_holds_it(tmp_path, monkeypatch):
    """A read at the first offset of the last leader append (the fetches waiting at the log
    end that its notify answers) gets its batches from memory: the bytes the segment holds,
    while nothing changed the log since, and only until ``release_appended``."""
    log = open_log(tmp_path, small_config(segment_bytes=1_000_000))
    log.append_as_leader(make_batch(2, 20), 0)
    log.append_as_leader(make_batch(1, 20) + make_batch(2, 20), 0)  # [2] [3-4]
    segment_read = LogSegment.read

    def no_segment_reads(*args, **kwargs):
        raise AssertionError("read from the segment")

    monkeypatch.setattr(LogSegment, "read", no_segment_reads)
    served = log.read(2, 1 << 20, max_offset=5)
    monkeypatch.setattr(LogSegment, "read", segment_read)
    assert served == log.active_segment.read(2, 1 << 20) and len(headers_of(served)) == 2
    # not all of it below max_offset, or more than max_bytes: the segment answers, as always
    assert [h.base_offset for h in headers_of(log.read(2, 1 << 20, max_offset=4))] == [2]
    assert [h.base_offset for h in headers_of(log.read(2, 1))] == [2]
    assert log.read(3, 1 << 20) == log.active_segment.read(3, 1 << 20)  # not its first offset
    # truncated and appended again to the same offsets, by a follower: the new bytes
    log.truncate_to(2)
    other = bytearray(make_batch(3, 30))
    patch_batch(other, 0, 2, 0)
    log.append_as_follower(bytes(other))
    assert log.log_end_offset == 5 and log.read(2, 1 << 20) == bytes(other)
    log.append_as_leader(make_batch(1, 20), 0)  # [5]
    log.release_appended()
    monkeypatch.setattr(LogSegment, "read", no_segment_reads)
    with pytest.raises(AssertionError, match="from the segment"):
        log.read(5, 1 << 20)


def test_reads_at_recently_appended_offsets_follow_truncation_and_new_appends(tmp_path):
    """A read at the base offset of a batch just appended (a reader at the log end) is
    served from the segment's memory of recent batch positions; truncation must not leave
    a position behind that now holds other bytes."""
    log = open_log(tmp_path, small_config(segment_bytes=1_000_000))
    for _ in range(6):
        log.append_as_leader(make_batch(2, 20), 0)  # [0-1] [2-3] [4-5] [6-7] [8-9] [10-11]
    assert headers_of(log.read(6, 1 << 20))[0].base_offset == 6
    log.truncate_to(4)
    for _ in range(3):
        log.append_as_leader(make_batch(3, 200), 0)  # [4-6] [7-9] [10-12], longer than before
    for offset, first in ((4, 4), (6, 4), (7, 7), (8, 7), (10, 10), (12, 10)):
        got = headers_of(log.read(offset, 1 << 20))
        assert got[0].base_offset == first and got[-1].base_offset == 10
        assert log.read(offset, 1 << 20) == read_batches(log, first)
    reopened = open_log(tmp_path, small_config(segment_bytes=1_000_000))
    assert read_batches(reopened) == read_batches(log)


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 300)), min_size=1, max_size=25),
       cap=st.sampled_from([60, 700, 1 << 20]))
def test_bytes_below_is_what_a_read_would_return(sizes, cap):
    """``bytes_below`` (a waiting fetch's estimate from positions) is the size of the batches
    a read of the segment holding the offset returns below the end, at most ``cap``; the cap
    itself when the end lies beyond that segment, as Kafka's DelayedFetch counts."""
    with tempfile.TemporaryDirectory() as d:
        log = open_log(d, LogConfig(segment_bytes=1500, index_interval_bytes=100))
        for n, size in sizes:
            log.append_as_leader(make_batch(n, size=size), 0)
        leo = log.log_end_offset
        for offset in range(leo + 1):
            for end in range(offset, leo + 1):
                estimate = log.bytes_below(offset, end, cap)
                seg = [s for s in log.segments if s.base_offset <= offset][-1]
                if end > seg.next_offset:
                    assert estimate == cap
                else:
                    whole = log.read(offset, 1 << 30, max_offset=end) if end > offset else b""
                    assert estimate == min(cap, len(whole))
        log.close()
