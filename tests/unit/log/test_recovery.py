"""Recovery of a partition log from damaged files (docs/reliability.md F8, F9, F10; invariant I5).

Every scenario builds a real log on disk with small segments (a few KiB) and a small
``index.interval.bytes`` so that it spans many segments and index entries, damages the
files the way a power loss, a bad disk or an operator would, reopens it through
``broker.log.loader.load_log`` and then checks the oracle of invariant I5:

* the recovered log is a prefix of what was appended: every record read back sits at the
  offset it was appended at, with its key, value and timestamp, and the log end offset is a
  batch boundary of the original log;
* every batch served validates (no bad CRC is ever served);
* the indexes agree with the log: for every batch ``translate_offset`` of its base and last
  offset returns its position, every offset index entry points at the start of the batch it
  names, every time index entry holds the running maximum timestamp up to the offset it
  names, the files on disk hold what is in memory, and timestamp lookups agree with a
  brute-force scan of the records.

A pristine log is built once per module and copied for each example, so Hypothesis can
afford to explore cut points, flipped bits and garbage.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import struct
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.index import OffsetIndex, TimeIndex
from tidelog.broker.log.loader import load_log
from tidelog.broker.log.log import Log
from tidelog.broker.log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, filename_prefix
from tidelog.protocol.errors import CorruptRecordError
from tidelog.protocol.records import (
    CRC_START,
    LOG_OVERHEAD,
    Codec,
    build_batch,
    iter_headers,
    iter_records,
    validate_batch,
)
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("events", 0)
CONFIG = LogConfig(segment_bytes=6 * 1024, index_interval_bytes=700)
N_BATCHES = 90
EXAMPLES = settings(max_examples=30,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class FakeClock:
    def __init__(self, now: int = 1_700_000_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


class Appended:
    """What went into the log: the oracle every recovered log is compared against.

    (Plain classes, not dataclasses: Hypothesis pretty-prints a dataclass field by field.)
    """

    def __init__(self):
        self.records: dict[int, tuple[int, bytes | None, bytes | None]] = {}
        self.batches: list[tuple[int, int]] = []  # (base offset, next offset)

    def __repr__(self) -> str:
        return f"Appended({len(self.records)} records in {len(self.batches)} batches)"

    @property
    def boundaries(self) -> set[int]:
        return {0} | {nxt for _, nxt in self.batches}


def fill(log: Log, appended: Appended, n_batches: int, seed: int, *, epochs=(0, 1, 1, 2, 5)) -> None:
    """Append ``n_batches`` batches of varied size, codec and (not monotonic) timestamps."""
    rnd = random.Random(seed)
    for i in range(n_batches):
        count = rnd.randint(1, 6)
        ts0 = 1_600_000_000_000 + 10 * (log.log_end_offset + i) + rnd.randint(-40, 40)
        recs = []
        for j in range(count):
            key = None if rnd.random() < 0.3 else b"key-%d" % rnd.randint(0, 50)
            value = None if rnd.random() < 0.05 else rnd.randbytes(rnd.randint(0, 160))
            recs.append((key, value, None, ts0 + rnd.randint(-30, 30)))
        buf = build_batch(recs, codec=rnd.choice([Codec.NONE, Codec.NONE, Codec.GZIP, Codec.ZSTD, Codec.LZ4]))
        epoch = epochs[min(len(epochs) - 1, i * len(epochs) // n_batches)]
        info = log.append_as_leader(buf, epoch)
        assert info.first_offset == log.log_end_offset - count
        for j, (key, value, _, ts) in enumerate(recs):
            appended.records[info.first_offset + j] = (ts, key, value)
        appended.batches.append((info.first_offset, info.last_offset + 1))


def crash(log: Log) -> None:
    """A SIGKILL: the file descriptors go away; nothing pending in memory reaches the disk."""
    for seg in log.segments:
        if seg._fd >= 0:
            os.close(seg._fd)
            seg._fd = -1


def reopen(directory: str, *, recovery_point: int = 0, clean: bool = False, **kw) -> Log:
    return load_log(directory, TP, CONFIG, recovery_point=recovery_point, had_clean_shutdown=clean,
                    clock=FakeClock(), **kw)


def seg_files(directory: str) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for name in sorted(os.listdir(directory)):
        stem, _, suffix = name.partition(".")
        if len(stem) == 20 and stem.isdigit() and suffix != "snapshot":  # producer state snapshots aside
            out.setdefault(int(stem), []).append("." + suffix)
    return out


def log_path(directory: str, base: int, suffix: str = LOG_SUFFIX) -> str:
    return os.path.join(directory, filename_prefix(base) + suffix)


def batches_on_disk(directory: str, base: int) -> list[tuple[int, object]]:
    with open(log_path(directory, base), "rb") as f:
        return list(iter_headers(f.read()))


def write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def flip_bit(path: str, position: int, bit: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        b = f.read(1)[0]
        f.seek(position)
        f.write(bytes([b ^ (1 << bit)]))


# -- the oracle -------------------------------------------------------------------------------------


def read_everything(log: Log) -> list[tuple[int, bytes]]:
    """All batches from the log start to the LEO through Log.read: (base offset, bytes)."""
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 3000)
        assert data, f"read at {offset} returned nothing below the LEO {log.log_end_offset}"
        served = 0
        for pos, h in iter_headers(data):
            validate_batch(data, pos)  # a bad batch is never served
            assert h.base_offset <= offset <= h.last_offset or pos > 0  # it starts with the batch asked for
            out.append((h.base_offset, data[pos:pos + h.size]))
            offset, served = h.next_offset, pos + h.size
        assert served == len(data)  # whole batches only
    return out


def check_prefix(log: Log, appended: Appended) -> None:
    leo = log.log_end_offset
    assert leo in appended.boundaries, f"log end offset {leo} is not a batch boundary"
    assert log.log_start_offset == 0
    got = {}
    for base, data in read_everything(log):
        for r in iter_records(data):
            got[r.offset] = (r.timestamp, r.key, r.value)
    assert sorted(got) == list(range(leo))
    for offset, rec in got.items():
        assert rec == appended.records[offset], f"record at offset {offset} differs"
    assert log.recovery_point == leo
    assert 0 <= log.high_watermark <= leo


def check_indexes(log: Log) -> None:
    prev_next = None
    for seg in log.segments:
        headers = list(seg.headers_from(0))
        end = headers[-1][0] + headers[-1][1].size if headers else 0
        assert end == seg.size == os.path.getsize(seg.log_path)
        if prev_next is not None:
            assert seg.base_offset == prev_next
        if headers:
            assert headers[0][1].base_offset == seg.base_offset
        assert seg.next_offset == (headers[-1][1].next_offset if headers else seg.base_offset)
        assert seg.max_timestamp == max((h.max_timestamp for _, h in headers), default=-1)
        prev_next = seg.next_offset
        position_of = {h.base_offset: pos for pos, h in headers}
        biggest = max((h.size for _, h in headers), default=0)
        for pos, h in headers:
            assert seg.translate_offset(h.base_offset) == (pos, h)
            assert seg.translate_offset(h.last_offset) == (pos, h)
            # a lookup lands at most one interval plus one batch before its target
            assert 0 <= pos - seg.index.lookup(h.base_offset)[1] <= CONFIG.index_interval_bytes + biggest
        assert seg.translate_offset(seg.next_offset) is None
        entries = seg.index.entries()
        assert [o for o, _ in entries] == sorted(set(o for o, _ in entries))
        for offset, pos in entries:
            assert position_of.get(offset) == pos, f"index entry ({offset}, {pos}) names no batch start"
        t_entries = seg.time_index.entries()
        for (t1, o1), (t2, o2) in zip(t_entries, t_entries[1:]):
            assert t1 < t2 and o1 <= o2
        for ts, offset in t_entries:
            assert seg.base_offset <= offset < seg.next_offset
            assert ts == max(h.max_timestamp for _, h in headers if h.base_offset <= offset)
        # the files hold what the segment holds in memory
        seg.index.flush(fsync=False)
        seg.time_index.flush(fsync=False)
        on_disk = OffsetIndex(seg.index.path, seg.base_offset)
        on_disk.load()
        assert on_disk.entries() == entries
        t_on_disk = TimeIndex(seg.time_index.path, seg.base_offset)
        t_on_disk.load()
        assert t_on_disk.entries() == t_entries


def check_time_lookups(log: Log, appended: Appended) -> None:
    records = sorted((o, appended.records[o][0]) for o in range(log.log_end_offset))
    probes = sorted({ts for _, ts in records} | {0, 2**62})
    for t in probes[:: max(1, len(probes) // 60)] + [probes[-1]]:
        expected = next(((o, ts) for o, ts in records if ts >= t), None)
        assert log.offset_for_timestamp(t) == expected, f"timestamp lookup for {t}"


def check_all(log: Log, appended: Appended) -> None:
    check_prefix(log, appended)
    check_indexes(log)
    check_time_lookups(log, appended)
    epochs = log.epoch_cache.entries
    assert all(o < log.log_end_offset for _, o in epochs)


# -- the pristine logs ------------------------------------------------------------------------------


class Pristine:
    def __init__(self, directory: str, appended: Appended, segment_bases: list[int],
                 recovery_point: int, index_entries: dict[int, tuple[list, list]]):
        self.directory = directory
        self.appended = appended
        self.segment_bases = segment_bases
        self.recovery_point = recovery_point  # what the checkpoint says at the crash
        self.index_entries = index_entries  # base -> (offset index entries, time index entries)

    def __repr__(self) -> str:
        return f"Pristine({self.directory!r}, segments={self.segment_bases})"


def _build(directory: str, seed: int, *, clean: bool) -> Pristine:
    log = load_log(directory, TP, CONFIG, clock=FakeClock())
    appended = Appended()
    fill(log, appended, N_BATCHES, seed)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 6, "the scenarios want many segments"
    assert all(len(s.index) >= 1 for s in log.segments[:-1]), "and index entries in each"
    log.flush_rolled_segments()  # what the log manager's periodic flush does after rolls
    rp = log.recovery_point
    assert rp == bases[-1]
    entries = {s.base_offset: (s.index.entries(), s.time_index.entries()) for s in log.segments}
    if clean:
        log.flush()
        log.close()
        rp = log.recovery_point
    else:
        crash(log)
    return Pristine(directory, appended, bases, rp, entries)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Pristine:
    """A log whose broker was killed (SIGKILL): active segment unflushed, its index stale."""
    return _build(str(tmp_path_factory.mktemp("pristine-crashed") / TP.dir_name), 11, clean=False)


@pytest.fixture(scope="module")
def pristine_clean(tmp_path_factory) -> Pristine:
    """A log that was flushed and closed: a clean shutdown."""
    return _build(str(tmp_path_factory.mktemp("pristine-clean") / TP.dir_name), 12, clean=True)


class Copy:
    def __init__(self, p: Pristine):
        self.root = tempfile.mkdtemp(prefix="tidelog-recovery-")
        self.directory = os.path.join(self.root, TP.dir_name)
        shutil.copytree(p.directory, self.directory)

    def __enter__(self) -> str:
        return self.directory

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def test_pristine_logs_recover_unchanged(pristine, pristine_clean):
    for p, clean in ((pristine, False), (pristine_clean, True)):
        with Copy(p) as d:
            log = reopen(d, recovery_point=p.recovery_point, clean=clean)
            assert log.log_end_offset == max(p.appended.boundaries)
            assert [s.base_offset for s in log.segments] == p.segment_bases
            assert log.recovery_report == []
            check_all(log, p.appended)
            log.close()


def test_a_crashed_log_recovers_from_zero_unchanged(pristine):
    with Copy(pristine) as d:
        log = reopen(d, recovery_point=0)
        assert log.log_end_offset == max(pristine.appended.boundaries)
        assert log.recovery_report == []
        check_all(log, pristine.appended)
        log.close()


# -- F8: power loss: the tail of the active segment torn or garbled ----------------------------------


@EXAMPLES
@given(data=st.data(), from_zero=st.booleans())
def test_torn_tail_of_the_active_segment(pristine, data, from_zero):
    active = pristine.segment_bases[-1]
    headers = batches_on_disk(pristine.directory, active)
    size = os.path.getsize(log_path(pristine.directory, active))
    # cut points anywhere, with extra weight on the inside of a header
    cut = data.draw(st.one_of(
        st.integers(0, size),
        st.sampled_from(headers).flatmap(lambda ph: st.integers(ph[0], ph[0] + 60)).map(lambda c: min(c, size)),
    ), label="cut")
    with Copy(pristine) as d:
        os.truncate(log_path(d, active), cut)
        log = reopen(d, recovery_point=0 if from_zero else pristine.recovery_point)
        whole = [h for pos, h in headers if pos + h.size <= cut]
        expected_leo = whole[-1].next_offset if whole else active
        assert log.log_end_offset == expected_leo
        assert log.active_segment.size == sum(h.size for h in whole)
        torn = cut != sum(h.size for h in whole)
        assert bool(log.recovery_report) == torn
        if torn:
            assert log_path(d, active) in log.recovery_report[0]
        check_all(log, pristine.appended)
        log.close()


@EXAMPLES
@given(garbage=st.binary(min_size=1, max_size=400), from_zero=st.booleans())
def test_garbage_after_the_tail_is_cut(pristine, garbage, from_zero):
    active = pristine.segment_bases[-1]
    with Copy(pristine) as d:
        path = log_path(d, active)
        size = os.path.getsize(path)
        with open(path, "ab") as f:
            f.write(garbage)
        log = reopen(d, recovery_point=0 if from_zero else pristine.recovery_point)
        assert log.log_end_offset == max(pristine.appended.boundaries)
        assert log.active_segment.size == size == os.path.getsize(path)
        assert len(log.recovery_report) == 1 and path in log.recovery_report[0]
        check_all(log, pristine.appended)
        log.close()


def _last_batch(directory: str, base: int) -> bytes:
    with open(log_path(directory, base), "rb") as f:
        raw = f.read()
    pos, h = list(iter_headers(raw))[-1]
    return raw[pos:pos + h.size]


def _tails(p: Pristine) -> dict[str, bytes]:
    last = _last_batch(p.directory, p.segment_bases[-1])
    leo = max(p.appended.boundaries)
    lower_epoch = bytearray(build_batch([b"x"], timestamp_ms=5))
    struct.pack_into(">q", lower_epoch, 0, leo)
    struct.pack_into(">i", lower_epoch, 12, 0)  # the log's latest epoch is 5
    huge_claim = bytearray(build_batch([b"y"], timestamp_ms=5))
    struct.pack_into(">q", huge_claim, 0, leo)
    struct.pack_into(">i", huge_claim, 8, 2**31 - 1)
    return {
        "zeros (preallocated blocks)": b"\x00" * 4096,
        "a copy of the last batch (valid CRC, repeated offsets)": last,
        "a valid batch with an older leader epoch": bytes(lower_epoch),
        "a header claiming 2 GiB": bytes(huge_claim),
        "half of a valid batch": last[: len(last) // 2],
    }


@pytest.mark.parametrize("kind", ["zeros (preallocated blocks)",
                                  "a copy of the last batch (valid CRC, repeated offsets)",
                                  "a valid batch with an older leader epoch",
                                  "a header claiming 2 GiB", "half of a valid batch"])
def test_plausible_garbage_after_the_tail_is_cut(pristine, kind, caplog):
    tail = _tails(pristine)[kind]
    active = pristine.segment_bases[-1]
    with Copy(pristine) as d:
        path = log_path(d, active)
        size = os.path.getsize(path)
        with open(path, "ab") as f:
            f.write(tail)
        with caplog.at_level(logging.ERROR, logger="tidelog.log.loader"):
            log = reopen(d, recovery_point=pristine.recovery_point)
        assert os.path.getsize(path) == size
        assert log.log_end_offset == max(pristine.appended.boundaries)
        assert any(r.levelno == logging.ERROR and path in r.getMessage() for r in caplog.records)
        check_all(log, pristine.appended)
        log.close()


# -- damage below the recovery point: flushed data, so a hole, not a cut -------------------------------


HOLE_CONFIG = LogConfig(segment_bytes=1 << 20, index_interval_bytes=700)


def _three_segments(d: str, appended: Appended) -> Log:
    """A log of three segments, epoch 0 in the first, epochs 1 then 3 in the middle one, 4 in
    the last, every segment flushed."""
    log = load_log(d, TP, HOLE_CONFIG, clock=FakeClock())
    for i, epochs in enumerate([(0,), (1, 3), (4,)]):
        if i:
            log.roll()
        fill(log, appended, 6, seed=40 + i, epochs=epochs)
    log.flush()
    return log


@pytest.mark.parametrize("index", ["removed", "corrupt"])
@pytest.mark.parametrize("clean", [True, False])
def test_damage_below_the_recovery_point_keeps_the_later_segments(tmp_path, index, clean, caplog):
    """Damage in a segment whose data was flushed (clean shutdown, or below the recovery point)
    is disk corruption, not a lost tail: the damaged segment is cut, the later ones stay, and
    the hole left is reported with the offsets lost. Reads across it go on from the next batch."""
    d = str(tmp_path / TP.dir_name)
    appended = Appended()
    log = _three_segments(d, appended)
    bases = [s.base_offset for s in log.segments]
    leo, epochs = log.log_end_offset, log.epoch_cache.entries
    if clean:
        log.close()
    else:
        crash(log)
    middle = bases[1]
    pos, h = batches_on_disk(d, middle)[2]
    flip_bit(log_path(d, middle), pos + CRC_START + 9, 2)
    if index == "removed":
        os.unlink(log_path(d, middle, INDEX_SUFFIX))
    else:
        _corrupt_index(log_path(d, middle, INDEX_SUFFIX), "entry beyond the log", 8)
    with caplog.at_level(logging.ERROR, logger="tidelog.log.loader"):
        log = load_log(d, TP, HOLE_CONFIG, recovery_point=leo, had_clean_shutdown=clean, clock=FakeClock())
    assert [s.base_offset for s in log.segments] == bases
    assert sorted(seg_files(d)) == bases
    assert log.log_end_offset == leo and log.segments[1].next_offset == h.base_offset
    lost = range(h.base_offset, bases[2])
    assert log.damaged_from == h.base_offset
    assert len(log.recovery_report) == 1
    report = log.recovery_report[0]
    assert log_path(d, middle) in report and f"offsets {lost[0]} to {lost[-1]} lost" in report
    assert any(r.levelno == logging.ERROR and report in r.getMessage() for r in caplog.records)
    # every record outside the hole is there, at its offset; a read in the hole gets the next batch
    got, offset = {}, 0
    while offset < leo:
        data = log.read(offset, 3000)
        first = validate_batch(data)
        assert first.base_offset <= offset or offset in lost  # only the hole is skipped
        for bpos, bh in iter_headers(data):
            validate_batch(data, bpos)
            got.update((r.offset, (r.timestamp, r.key, r.value)) for r in iter_records(data, bpos, bh))
            offset = bh.next_offset
    assert sorted(got) == [o for o in range(leo) if o not in lost]
    assert all(rec == appended.records[o] for o, rec in got.items())
    for offset in (lost[0], lost[-1]):
        assert validate_batch(log.read(offset, 1)).base_offset == bases[2]
    assert log.epoch_cache.entries == epochs
    assert log.producer_state.map_end_offset == leo
    assert log.append_as_leader(build_batch([b"after"], timestamp_ms=5), 4).first_offset == leo
    log.close()
    # the cut is durable: a restart sees the same log and nothing more to report, but still
    # the hole (the replica is repaired only once it is fetched again)
    again = load_log(d, TP, HOLE_CONFIG, recovery_point=leo + 1, had_clean_shutdown=True, clock=FakeClock())
    assert [s.base_offset for s in again.segments] == bases and again.log_end_offset == leo + 1
    assert again.recovery_report == [] and again.damaged_from == h.base_offset
    crash(again)
    # nor does a lost recovery-point checkpoint take the hole for a lost tail (which would
    # delete the segments after it)
    again = load_log(d, TP, HOLE_CONFIG, recovery_point=0, had_clean_shutdown=False, clock=FakeClock())
    assert [s.base_offset for s in again.segments] == bases and again.log_end_offset == leo + 1
    assert again.damaged_from == h.base_offset
    # fetched again from the hole on: the hole is gone, also after a restart
    again.truncate_damaged(h.base_offset)
    assert again.damaged_from is None
    again.append_as_leader(build_batch([b"refetched"], timestamp_ms=5), 4)
    again.close()
    again = load_log(d, TP, HOLE_CONFIG, recovery_point=0, had_clean_shutdown=True, clock=FakeClock())
    assert again.damaged_from is None and again.log_end_offset == h.base_offset + 1
    again.close()


# -- F9: a bit flip in the middle of a closed segment -------------------------------------------------


def _closed_batch(p: Pristine, rnd: random.Random) -> tuple[int, int, int, object]:
    """(segment index, segment base, position, header) of a batch in the middle of a closed segment."""
    k = rnd.randrange(1, len(p.segment_bases) - 2)
    base = p.segment_bases[k]
    headers = batches_on_disk(p.directory, base)
    pos, h = headers[rnd.randrange(1, len(headers) - 1)]
    return k, base, pos, h


def _assert_cut_at(log: Log, d: str, p: Pristine, k: int, seg_base: int, pos: int, h) -> None:
    assert log.log_end_offset == h.base_offset
    assert [s.base_offset for s in log.segments] == p.segment_bases[:k + 1]
    assert os.path.getsize(log_path(d, seg_base)) == pos
    # every later segment's files are gone from the disk
    assert sorted(seg_files(d)) == p.segment_bases[:k + 1]
    for later in p.segment_bases[k + 1:]:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            assert not os.path.exists(log_path(d, later, suffix))
    assert len(log.recovery_report) == 1
    report = log.recovery_report[0]
    assert log_path(d, seg_base) in report and f"position {pos}" in report
    assert all(log_path(d, later) in report for later in p.segment_bases[k + 1:])


@pytest.mark.parametrize("seed", range(6))
def test_bit_flip_in_a_closed_segment_truncates_there(pristine, seed, caplog):
    rnd = random.Random(seed)
    k, seg_base, pos, h = _closed_batch(pristine, rnd)
    where = pos + rnd.randrange(CRC_START, h.size)
    with Copy(pristine) as d:
        flip_bit(log_path(d, seg_base), where, rnd.randrange(8))
        with caplog.at_level(logging.INFO, logger="tidelog.log.loader"):
            log = reopen(d, recovery_point=0)
        _assert_cut_at(log, d, pristine, k, seg_base, pos, h)
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "tidelog.log.loader"]
        assert len(errors) == 1
        assert log_path(d, seg_base) in errors[0].getMessage()
        assert "CRC" in log.recovery_report[0] or "record" in log.recovery_report[0]
        check_all(log, pristine.appended)
        log.close()
        # the cut is durable: a clean restart sees the same log, and no new report
        again = reopen(d, recovery_point=log.log_end_offset, clean=True)
        assert again.log_end_offset == h.base_offset and again.recovery_report == []
        check_all(again, pristine.appended)
        again.close()


@EXAMPLES
@given(seed=st.integers(0, 10**6), data=st.data())
def test_any_framing_or_checksummed_bit_flip_in_a_closed_segment(pristine, seed, data):
    """Any flipped bit outside the base offset and leader epoch fields cuts the log exactly at
    the damaged batch (length, magic and CRC fields included)."""
    k, seg_base, pos, h = _closed_batch(pristine, random.Random(seed))
    byte = data.draw(st.one_of(st.integers(8, 11), st.integers(16, h.size - 1)), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    with Copy(pristine) as d:
        flip_bit(log_path(d, seg_base), pos + byte, bit)
        log = reopen(d, recovery_point=0)
        _assert_cut_at(log, d, pristine, k, seg_base, pos, h)
        check_all(log, pristine.appended)
        log.close()


@EXAMPLES
@given(seed=st.integers(0, 10**6), bit=st.integers(0, 63), which=st.integers(0, 10**6))
def test_bit_flip_in_a_base_offset_is_caught_by_the_offset_checks(pristine, seed, bit, which):
    """The base offset is outside the CRC: only the offset monotonicity checks can see a flip
    there. Whatever the bit, the damaged batch's records never survive at wrong offsets."""
    rnd = random.Random(seed)
    k = rnd.randrange(0, len(pristine.segment_bases))
    seg_base = pristine.segment_bases[k]
    headers = batches_on_disk(pristine.directory, seg_base)
    if k == len(pristine.segment_bases) - 1:
        headers = headers[:-1]  # the log's very last batch has nothing after it to contradict it
    pos, h = headers[which % len(headers)]
    with Copy(pristine) as d:
        flip_bit(log_path(d, seg_base), pos + 7 - bit // 8, bit % 8)
        log = reopen(d, recovery_point=0)
        assert log.log_end_offset == h.base_offset
        assert [s.base_offset for s in log.segments] == pristine.segment_bases[:k + 1]
        assert sorted(seg_files(d)) == pristine.segment_bases[:k + 1]
        assert len(log.recovery_report) == 1 and log_path(d, seg_base) in log.recovery_report[0]
        check_all(log, pristine.appended)
        log.close()


@EXAMPLES
@given(seed=st.integers(0, 10**6), bit=st.integers(0, 31))
def test_bit_flip_in_a_leader_epoch_keeps_a_prefix(pristine, seed, bit):
    """The leader epoch is outside the CRC too; within a segment a flip is caught where epochs
    go backwards (at the damaged batch, or at the first later one below it). Whatever is kept,
    the records that survive are a prefix."""
    rnd = random.Random(seed)
    k = rnd.randrange(0, len(pristine.segment_bases) - 1)
    seg_base = pristine.segment_bases[k]
    headers = batches_on_disk(pristine.directory, seg_base)
    i = rnd.randrange(len(headers))
    pos, h = headers[i]
    flipped = struct.unpack(">i", struct.pack(">I", (h.leader_epoch & 0xFFFFFFFF) ^ (1 << bit)))[0]
    if flipped < -1 or any(e.leader_epoch > flipped for _, e in headers[:i]):
        expected_leo = h.base_offset
    else:
        expected_leo = next((e.base_offset for _, e in headers[i + 1:] if e.leader_epoch < flipped),
                            max(pristine.appended.boundaries))
    with Copy(pristine) as d:
        flip_bit(log_path(d, seg_base), pos + 12 + 3 - bit // 8, bit % 8)
        log = reopen(d, recovery_point=0)
        assert log.log_end_offset == expected_leo
        check_all(log, pristine.appended)
        log.close()


@pytest.mark.parametrize("checkpoint", ["missing", "corrupt", "stale"])
def test_recovery_through_the_log_manager(pristine, checkpoint, caplog):
    """The same cut, reached the way a restarted broker reaches it: no clean-shutdown marker,
    and a recovery-point checkpoint that is missing, corrupt or older than the damage."""
    from tidelog.broker.log.manager import LogManager

    rnd = random.Random(99)
    k, seg_base, pos, h = _closed_batch(pristine, rnd)
    with Copy(pristine) as d:
        root = os.path.dirname(d)
        if checkpoint == "corrupt":
            write_file(os.path.join(root, "recovery-point-offset-checkpoint"), b"0\n1\nevents 0 x\n")
        elif checkpoint == "stale":
            write_file(os.path.join(root, "recovery-point-offset-checkpoint"),
                       f"0\n1\nevents 0 {seg_base}\n".encode())
        flip_bit(log_path(d, seg_base), pos + rnd.randrange(CRC_START, h.size), 6)
        m = LogManager([root], CONFIG, clock=FakeClock())
        with caplog.at_level(logging.WARNING):
            m.startup()
        log = m.get_log(TP)
        _assert_cut_at(log, d, pristine, k, seg_base, pos, h)
        assert any(r.levelno == logging.ERROR and log_path(d, seg_base) in r.getMessage()
                   for r in caplog.records)
        check_all(log, pristine.appended)
        m.shutdown()
        m2 = LogManager([root], CONFIG, clock=FakeClock())
        m2.startup()
        assert m2.get_log(TP).log_end_offset == h.base_offset
        assert m2.get_log(TP).recovery_report == []
        m2.shutdown()


# -- F10: indexes deleted or corrupted ----------------------------------------------------------------


@pytest.mark.parametrize("which", [INDEX_SUFFIX, TIME_INDEX_SUFFIX, "both"])
@pytest.mark.parametrize("scope", ["one closed", "active", "all"])
def test_deleted_indexes_after_a_clean_shutdown_are_rebuilt_identically(pristine_clean, which, scope, caplog):
    p = pristine_clean
    targets = {"one closed": [p.segment_bases[2]], "active": [p.segment_bases[-1]], "all": p.segment_bases}[scope]
    suffixes = [INDEX_SUFFIX, TIME_INDEX_SUFFIX] if which == "both" else [which]
    with Copy(p) as d:
        for base in targets:
            for suffix in suffixes:
                os.unlink(log_path(d, base, suffix))
        with caplog.at_level(logging.WARNING, logger="tidelog.log.loader"):
            log = reopen(d, recovery_point=p.recovery_point, clean=True)
        assert log.recovery_report == []
        assert log.log_end_offset == max(p.appended.boundaries)
        for seg in log.segments:
            assert (seg.index.entries(), seg.time_index.entries()) == p.index_entries[seg.base_offset], \
                f"segment {seg.base_offset}"
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                assert os.path.exists(log_path(d, seg.base_offset, suffix))
        assert {r.getMessage().split("rebuilding the indexes of ")[1].split(":")[0]
                for r in caplog.records if "rebuilding" in r.getMessage()} == {log_path(d, b) for b in targets}
        check_all(log, p.appended)
        log.close()


def _corrupt_index(path: str, how: str, entry_size: int) -> None:
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    n = len(raw) // entry_size
    rnd = random.Random(how)
    if how == "random bytes":
        raw = bytearray(rnd.randbytes(max(len(raw), 2 * entry_size)))
    elif how == "wrong size":
        raw = raw[:-3] if raw else bytearray(b"\x01\x02\x03")
    elif how == "entries decreasing":
        assert n >= 2
        raw[:entry_size], raw[entry_size:2 * entry_size] = raw[entry_size:2 * entry_size], raw[:entry_size]
    elif how == "entry beyond the log":
        raw += b"\xff" * entry_size
    elif how == "zeroed":
        raw = bytearray(len(raw) + entry_size * 2)
    write_file(path, raw)


CORRUPTIONS = ["random bytes", "wrong size", "entries decreasing", "entry beyond the log", "zeroed"]


@pytest.mark.parametrize("how", CORRUPTIONS)
@pytest.mark.parametrize("suffix", [INDEX_SUFFIX, TIME_INDEX_SUFFIX])
def test_corrupt_indexes_after_a_clean_shutdown_are_rebuilt(pristine_clean, how, suffix):
    p = pristine_clean
    entry_size = 8 if suffix == INDEX_SUFFIX else 12
    with Copy(p) as d:
        damaged = [b for b in p.segment_bases if len(p.index_entries[b][0 if suffix == INDEX_SUFFIX else 1]) >= 2]
        assert damaged
        for base in damaged:
            _corrupt_index(log_path(d, base, suffix), how, entry_size)
        log = reopen(d, recovery_point=p.recovery_point, clean=True)
        assert log.log_end_offset == max(p.appended.boundaries)
        for seg in log.segments:
            assert (seg.index.entries(), seg.time_index.entries()) == p.index_entries[seg.base_offset]
        check_all(log, p.appended)
        log.close()


@pytest.mark.parametrize("shift", [1, -1])
def test_a_plausible_but_wrong_index_never_makes_a_read_skip(pristine_clean, shift):
    """An index damaged after a clean shutdown can pass the sanity checks (entries increasing,
    positions inside the log, at real batch boundaries) and still name the wrong batches.
    Lookups must not trust it blindly: a read at any offset returns the batch holding it."""
    p = pristine_clean
    with Copy(p) as d:
        for base in p.segment_bases:
            entries = p.index_entries[base][0]
            if len(entries) < 2:
                continue
            offsets, positions = [o for o, _ in entries], [q for _, q in entries]
            if shift == 1:  # every offset paired with the next entry's (later) position
                pairs = list(zip(offsets[:-1], positions[1:]))
            else:  # every position paired with the next entry's (later) offset
                pairs = list(zip(offsets[1:], positions[:-1]))
            write_file(log_path(d, base, INDEX_SUFFIX),
                       b"".join(struct.pack(">II", o - base, q) for o, q in pairs))
        log = reopen(d, recovery_point=p.recovery_point, clean=True)
        check_prefix(log, p.appended)
        check_time_lookups(log, p.appended)
        for seg in log.segments:
            for pos, h in seg.headers_from(0):
                for offset in (h.base_offset, h.last_offset):
                    assert seg.translate_offset(offset) == (pos, h)
                    assert validate_batch(log.read(offset, 1)).base_offset == h.base_offset
        log.close()


def test_index_files_without_a_log_and_leftovers_are_removed(pristine_clean):
    p = pristine_clean
    with Copy(p) as d:
        orphan = log_path(d, 10**9, INDEX_SUFFIX)
        write_file(orphan, b"\x00" * 8)
        write_file(log_path(d, 10**9, TIME_INDEX_SUFFIX), b"\x00" * 12)
        for name in ("leader-epoch-checkpoint.tmp", filename_prefix(0) + ".log.deleted", "x.cleaned"):
            write_file(os.path.join(d, name), b"junk")
        log = reopen(d, recovery_point=p.recovery_point, clean=True)
        assert sorted(seg_files(d)) == p.segment_bases
        assert not any(n.endswith((".tmp", ".deleted", ".cleaned")) for n in os.listdir(d))
        check_all(log, p.appended)
        log.close()


# -- unclean shutdown with a stale recovery point -----------------------------------------------------


@pytest.mark.parametrize("stale_at", [0, 2, 4, "active"])
def test_unclean_shutdown_with_a_stale_recovery_point(pristine, stale_at):
    p = pristine
    rp = p.recovery_point if stale_at == "active" else p.segment_bases[stale_at]
    with Copy(p) as d:
        # what the killed broker left behind: the active segment's indexes are stale or missing
        active = p.segment_bases[-1]
        if os.path.exists(log_path(d, active, TIME_INDEX_SUFFIX)):
            os.unlink(log_path(d, active, TIME_INDEX_SUFFIX))
        with open(log_path(d, active, INDEX_SUFFIX), "wb") as f:
            f.write(struct.pack(">II", 1, 10**6))  # an entry the log cannot back
        log = reopen(d, recovery_point=rp)
        assert log.recovery_report == []
        assert log.log_end_offset == max(p.appended.boundaries)
        for seg in log.segments:
            assert (seg.index.entries(), seg.time_index.entries())[0] == p.index_entries[seg.base_offset][0]
        check_all(log, p.appended)
        log.close()


def test_unclean_shutdown_with_damage_above_a_stale_recovery_point(pristine):
    """Everything above the recovery point is re-validated, not only the active segment."""
    p = pristine
    rnd = random.Random(5)
    k = len(p.segment_bases) - 3
    seg_base = p.segment_bases[k]
    pos, h = batches_on_disk(p.directory, seg_base)[2]
    with Copy(p) as d:
        flip_bit(log_path(d, seg_base), pos + rnd.randrange(CRC_START, h.size), 3)
        log = reopen(d, recovery_point=p.segment_bases[k - 1])
        _assert_cut_at(log, d, p, k, seg_base, pos, h)
        check_all(log, p.appended)
        log.close()


def test_recovery_point_beyond_the_data_is_clamped(pristine):
    with Copy(pristine) as d:
        os.truncate(log_path(d, pristine.segment_bases[-1]), 0)
        log = reopen(d, recovery_point=10**9, high_watermark=10**9)
        assert log.log_end_offset == pristine.segment_bases[-1]
        assert log.high_watermark == log.log_end_offset
        check_all(log, pristine.appended)
        log.close()


def test_leader_epoch_checkpoint_lost_or_corrupt_is_rebuilt_from_headers(pristine):
    with Copy(pristine) as d:
        log = reopen(d, recovery_point=pristine.recovery_point)
        entries = log.epoch_cache.entries
        log.close()
        assert [e for e, _ in entries] == [0, 1, 2, 5]
    for damage in ("delete", "garbage"):
        with Copy(pristine) as d:
            path = os.path.join(d, "leader-epoch-checkpoint")
            if damage == "delete":
                os.unlink(path)
            else:
                write_file(path, b"0\n2\n5 0\n1 9\n")
            log = reopen(d, recovery_point=pristine.recovery_point)
            assert log.epoch_cache.entries == entries
            log.close()


def test_epoch_cache_follows_a_recovery_truncation(pristine):
    with Copy(pristine) as d:
        last_epoch_start = reopen(d, recovery_point=0)
        entries = last_epoch_start.epoch_cache.entries
        last_epoch_start.close()
    cut_at = entries[-1][1]  # where epoch 5 starts
    seg_base = max(b for b in pristine.segment_bases if b <= cut_at)
    with Copy(pristine) as d:
        pos = next(pos for pos, h in batches_on_disk(d, seg_base) if h.base_offset == cut_at)
        flip_bit(log_path(d, seg_base), pos + 40, 0)
        log = reopen(d, recovery_point=0)
        assert log.log_end_offset == cut_at
        assert log.epoch_cache.entries == entries[:-1]
        check_all(log, pristine.appended)
        log.close()


# -- reads after on-disk corruption while the log is open ----------------------------------------------


def _open_copy_with_damage(p: Pristine, d: str, seed: int):
    log = reopen(d, recovery_point=p.recovery_point)
    rnd = random.Random(seed)
    k, seg_base, pos, h = _closed_batch(p, rnd)
    return log, k, seg_base, pos, h, rnd


@pytest.mark.parametrize("seed", range(4))
def test_reads_never_serve_a_batch_damaged_on_disk(pristine, seed):
    p = pristine
    with Copy(p) as d:
        log, k, seg_base, pos, h, rnd = _open_copy_with_damage(p, d, seed)
        flip_bit(log_path(d, seg_base), pos + rnd.randrange(CRC_START, h.size), rnd.randrange(8))
        for offset in range(h.base_offset, h.next_offset):
            with pytest.raises(CorruptRecordError, match=r"CRC|corrupt|damaged"):
                log.read(offset, 100_000)
            with pytest.raises(CorruptRecordError):
                log.read(offset, 1)
        # a read that starts earlier in the segment returns only the valid prefix
        data = log.read(seg_base, 1_000_000)
        assert data
        last = None
        for bpos, bh in iter_headers(data):
            validate_batch(data, bpos)
            last = bh
        assert last.next_offset == h.base_offset
        assert sum(bh.size for _, bh in iter_headers(data)) == len(data)
        # reads after the damaged batch still work
        after = log.read(h.next_offset, 1_000_000)
        assert validate_batch(after).base_offset == h.next_offset
        log.close()


@EXAMPLES
@given(seed=st.integers(0, 10**6), data=st.data())
def test_reads_after_any_flip_in_a_closed_segment_never_skip_or_serve_bad_data(pristine, seed, data):
    """Whatever byte of a stored batch is damaged (framing included), a read either raises
    CorruptRecordError or returns valid batches holding exactly the records appended at those
    offsets, starting with the batch that holds the requested offset: never a silent skip."""
    p = pristine
    with Copy(p) as d:
        log, k, seg_base, pos, h, rnd = _open_copy_with_damage(p, d, seed)
        byte = data.draw(st.one_of(st.integers(8, 11), st.integers(16, h.size - 1)), label="byte")
        flip_bit(log_path(d, seg_base), pos + byte, data.draw(st.integers(0, 7), label="bit"))
        for offset in (seg_base, h.base_offset - 1, h.base_offset, h.last_offset):
            try:
                got = log.read(offset, data.draw(st.sampled_from([1, 500, 100_000]), label="max_bytes"))
            except CorruptRecordError:
                continue
            assert got, f"read at {offset} returned nothing"
            first = True
            for bpos, bh in iter_headers(got):
                validate_batch(got, bpos)
                if first:
                    assert bh.base_offset <= offset <= bh.last_offset, \
                        f"read at {offset} skipped to a batch at {bh.base_offset}"
                    first = False
                for r in iter_records(got, bpos, bh):
                    assert (r.timestamp, r.key, r.value) == p.appended.records[r.offset]
            assert sum(bh.size for _, bh in iter_headers(got)) == len(got)
        log.close()


def test_batch_size_helpers_are_consistent():
    buf = build_batch([b"v"], timestamp_ms=1)
    assert validate_batch(buf).size == len(buf) == validate_batch(buf).batch_length + LOG_OVERHEAD
