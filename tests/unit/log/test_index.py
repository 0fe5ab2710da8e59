"""OffsetIndex and TimeIndex against sorted-list oracles (after apache/kafka
OffsetIndexTest.randomLookupTest), plus their file round trip and sanity checks."""

from __future__ import annotations

import bisect
import os
import struct
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.log.index import CorruptIndexError, OffsetIndex, TimeIndex

MAX_REL = 2**32 - 1
SETTINGS = settings(max_examples=150)


def _tmpdir() -> tempfile.TemporaryDirectory:
    # Hypothesis runs many examples per test function: a fresh directory each, not tmp_path.
    return tempfile.TemporaryDirectory(prefix="tidelog-index-")


@st.composite
def offset_entries(draw, max_entries: int = 60):
    """(base offset, [(absolute offset, position)]) with both columns strictly increasing."""
    base = draw(st.integers(0, 2**40))
    rels = sorted(draw(st.sets(st.integers(0, MAX_REL), max_size=max_entries)))
    gaps = draw(st.lists(st.integers(1, 5000), min_size=len(rels), max_size=len(rels)))
    positions, p = [], draw(st.integers(0, 100))
    for g in gaps:
        positions.append(p)
        p += g
    return base, [(base + r, pos) for r, pos in zip(rels, positions)]


def oracle_lookup(base: int, entries: list[tuple[int, int]], target: int) -> tuple[int, int]:
    """The largest entry with offset <= target, or (base, 0)."""
    i = bisect.bisect_right([o for o, _ in entries], target)
    return entries[i - 1] if i else (base, 0)


def targets_for(base: int, entries, extra: list[int]) -> list[int]:
    """Interesting lookup targets: every entry, its neighbours, below the base, random ones."""
    out = [base - 1, base, base + MAX_REL] + [base + x for x in extra]
    for o, _ in entries:
        out += [o - 1, o, o + 1]
    return out


def build_offset_index(path: str, base: int, entries, max_index_bytes: int = 10 * 1024 * 1024) -> OffsetIndex:
    idx = OffsetIndex(path, base, max_index_bytes)
    for o, p in entries:
        idx.append(o, p)
    return idx


# -- OffsetIndex ------------------------------------------------------------------------------


@SETTINGS
@given(offset_entries(), st.lists(st.integers(0, MAX_REL), max_size=30))
def test_offset_index_lookup_matches_oracle(data, extra):
    base, entries = data
    with _tmpdir() as d:
        idx = build_offset_index(os.path.join(d, "i.index"), base, entries)
        assert idx.entries() == entries
        assert len(idx) == len(entries)
        assert idx.last_entry == (entries[-1] if entries else (base, 0))
        for t in targets_for(base, entries, extra):
            assert idx.lookup(t) == oracle_lookup(base, entries, t), t


@SETTINGS
@given(offset_entries(), st.integers(-10, MAX_REL + 10), st.lists(st.integers(0, MAX_REL), max_size=20))
def test_offset_index_truncate_to_drops_entries_at_and_above(data, rel_cut, extra):
    base, entries = data
    cut = base + rel_cut
    with _tmpdir() as d:
        idx = build_offset_index(os.path.join(d, "i.index"), base, entries)
        idx.truncate_to(cut)
        kept = [e for e in entries if e[0] < cut]
        assert idx.entries() == kept
        for t in targets_for(base, entries, extra):
            assert idx.lookup(t) == oracle_lookup(base, kept, t)
        if kept or entries:
            # appending after a truncation continues from what is left
            nxt = (kept[-1][0] + 1, kept[-1][1] + 1) if kept else (base, 0)
            if nxt[0] - base <= MAX_REL:
                idx.append(*nxt)
                assert idx.entries() == kept + [nxt]


@st.composite
def index_ops(draw):
    """A random sequence of appends, truncations and flushes (with or without fsync)."""
    return draw(st.lists(st.one_of(
        st.tuples(st.just("append"), st.integers(1, 1000), st.integers(1, 5000)),
        st.tuples(st.just("truncate"), st.integers(0, 30_000)),
        st.tuples(st.just("flush"), st.booleans()),
    ), max_size=40))


@SETTINGS
@given(st.integers(0, 2**40), index_ops())
def test_offset_index_flush_load_round_trip(base, ops):
    """Whatever mix of appends, truncations and partial flushes: after a final flush, load
    gives back exactly the in-memory entries (and the file is exactly that long)."""
    with _tmpdir() as d:
        path = os.path.join(d, "i.index")
        idx = OffsetIndex(path, base)
        model: list[tuple[int, int]] = []
        for op in ops:
            if op[0] == "append":
                o = (model[-1][0] if model else base - 1) + op[1]
                p = (model[-1][1] if model else -1) + op[2]
                if o - base > MAX_REL:
                    continue
                idx.append(o, p)
                model.append((o, p))
            elif op[0] == "truncate":
                idx.truncate_to(base + op[1])
                model = [e for e in model if e[0] < base + op[1]]
            else:
                idx.flush(fsync=op[1])
            assert idx.entries() == model
        idx.flush()
        assert os.path.getsize(path) == 8 * len(model)
        loaded = OffsetIndex(path, base)
        loaded.load()
        assert loaded.entries() == model
        loaded.sanity_check(model[-1][1] + 1 if model else 0)
        # big-endian (uint32 relative offset, uint32 position) on disk
        with open(path, "rb") as f:
            raw = f.read()
        assert [(base + r, p) for r, p in struct.iter_unpack(">II", raw)] == model


def test_offset_index_append_must_increase(tmp_path):
    idx = OffsetIndex(str(tmp_path / "i.index"), 100)
    idx.append(105, 0)
    with pytest.raises(ValueError):
        idx.append(105, 10)
    with pytest.raises(ValueError):
        idx.append(104, 10)
    assert idx.entries() == [(105, 0)]


def test_offset_index_empty_lookup_and_is_full(tmp_path):
    idx = OffsetIndex(str(tmp_path / "i.index"), 7, max_index_bytes=24)
    assert idx.lookup(0) == (7, 0)
    assert idx.lookup(10**9) == (7, 0)
    assert idx.max_entries == 3
    for i in range(3):
        assert not idx.is_full
        idx.append(7 + i, 10 * i)
    assert idx.is_full
    assert idx.size_bytes == 24


def _write_raw(path, fmt: str, rows) -> None:
    with open(path, "wb") as f:
        for r in rows:
            f.write(struct.pack(fmt, *r))


@pytest.mark.parametrize("extra", [1, 3, 7])
def test_offset_index_load_rejects_size_not_a_multiple_of_8(tmp_path, extra):
    path = tmp_path / "i.index"
    _write_raw(path, ">II", [(0, 0), (5, 100)])
    with open(path, "ab") as f:
        f.write(b"\x00" * extra)
    with pytest.raises(CorruptIndexError):
        OffsetIndex(str(path), 0).load()


@pytest.mark.parametrize("rows", [
    [(0, 0), (5, 100), (5, 200)],  # offset repeats
    [(0, 0), (5, 100), (4, 200)],  # offset decreases
    [(0, 0), (5, 100), (9, 100)],  # position repeats
    [(0, 0), (5, 100), (9, 50)],  # position decreases
])
def test_offset_index_sanity_check_rejects_non_increasing_entries(tmp_path, rows):
    path = tmp_path / "i.index"
    _write_raw(path, ">II", rows)
    idx = OffsetIndex(str(path), 1000)
    idx.load()
    assert len(idx) == 3
    with pytest.raises(CorruptIndexError):
        idx.sanity_check(10_000)


def test_offset_index_sanity_check_rejects_position_beyond_log(tmp_path):
    path = tmp_path / "i.index"
    _write_raw(path, ">II", [(0, 0), (5, 100), (9, 400)])
    idx = OffsetIndex(str(path), 0)
    idx.load()
    idx.sanity_check(401)
    for size in (400, 399, 0):
        with pytest.raises(CorruptIndexError):
            idx.sanity_check(size)


def test_an_offset_index_larger_than_segment_index_bytes_is_sized_from_its_file(tmp_path):
    # written under a larger segment.index.bytes: sound, and full (as Kafka's)
    path = tmp_path / "i.index"
    _write_raw(path, ">II", [(i, 10 * i) for i in range(5)])
    idx = OffsetIndex(str(path), 0, max_index_bytes=32)
    idx.load()
    idx.sanity_check(1000)
    assert idx.max_entries == 5 and idx.is_full
    assert idx.lookup(3) == (3, 30)


def test_offset_index_load_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        OffsetIndex(str(tmp_path / "nope.index"), 0).load()


# -- TimeIndex --------------------------------------------------------------------------------


@st.composite
def time_appends(draw, max_size: int = 60):
    """(base, [(timestamp, absolute offset)]): offsets non-decreasing, timestamps anything."""
    base = draw(st.integers(0, 2**40))
    steps = draw(st.lists(st.tuples(st.integers(-1, 10**13), st.integers(0, 3)), max_size=max_size))
    out, rel = [], 0
    for ts, step in steps:
        rel = min(rel + step, MAX_REL)
        out.append((ts, base + rel))
    return base, out


def time_oracle(appends) -> list[tuple[int, int]]:
    """What maybe_append keeps: only a strictly new maximum timestamp."""
    kept: list[tuple[int, int]] = []
    for ts, off in appends:
        if not kept or (ts > kept[-1][0] and off >= kept[-1][1]):
            kept.append((ts, off))
    return kept


def oracle_lookup_before(entries, timestamp: int) -> int | None:
    before = [o for t, o in entries if t < timestamp]
    return before[-1] if before else None


def build_time_index(path: str, base: int, appends, max_index_bytes: int = 10 * 1024 * 1024) -> TimeIndex:
    idx = TimeIndex(path, base, max_index_bytes)
    for ts, off in appends:
        idx.maybe_append(ts, off)
    return idx


@SETTINGS
@given(time_appends(), st.lists(st.integers(-5, 10**13 + 5), max_size=30))
def test_time_index_maybe_append_and_lookup_before_match_oracle(data, targets):
    base, appends = data
    with _tmpdir() as d:
        idx = build_time_index(os.path.join(d, "t.timeindex"), base, appends)
        kept = time_oracle(appends)
        assert idx.entries() == kept
        assert idx.last_entry == (kept[-1] if kept else (-1, base))
        timestamps = [t for t, _ in kept]
        assert timestamps == sorted(set(timestamps)), "timestamps strictly increase"
        probes = targets + [t + d for t, _ in kept for d in (-1, 0, 1)]
        for t in probes:
            assert idx.lookup_before(t) == oracle_lookup_before(kept, t), t


@SETTINGS
@given(time_appends(), st.integers(-10, 300))
def test_time_index_truncate_to(data, rel_cut):
    base, appends = data
    cut = base + rel_cut
    with _tmpdir() as d:
        idx = build_time_index(os.path.join(d, "t.timeindex"), base, appends)
        kept = [e for e in time_oracle(appends) if e[1] < cut]
        idx.truncate_to(cut)
        assert idx.entries() == kept


@SETTINGS
@given(time_appends(), st.lists(st.integers(0, 200), max_size=4), st.integers(0, 60))
def test_time_index_flush_load_round_trip(data, cuts, flush_after):
    base, appends = data
    with _tmpdir() as d:
        path = os.path.join(d, "t.timeindex")
        idx = TimeIndex(path, base)
        for i, (ts, off) in enumerate(appends):
            idx.maybe_append(ts, off)
            if i == flush_after:
                idx.flush(fsync=False)
        for c in cuts:
            idx.flush(fsync=False)
            idx.truncate_to(base + c)
        idx.flush()
        expected = idx.entries()
        assert os.path.getsize(path) == 12 * len(expected)
        loaded = TimeIndex(path, base)
        loaded.load()
        assert loaded.entries() == expected
        loaded.sanity_check(expected[-1][1] + 1 if expected else base)


def test_time_index_maybe_append_needs_a_strictly_greater_timestamp(tmp_path):
    idx = TimeIndex(str(tmp_path / "t.timeindex"), 10)
    idx.maybe_append(100, 10)
    idx.maybe_append(100, 12)  # same timestamp: no new maximum
    idx.maybe_append(99, 13)  # older: ignored
    idx.maybe_append(150, 9)  # offset goes backwards: ignored
    idx.maybe_append(150, 14)
    assert idx.entries() == [(100, 10), (150, 14)]
    assert idx.lookup_before(100) is None
    assert idx.lookup_before(101) == 10
    assert idx.lookup_before(150) == 10
    assert idx.lookup_before(151) == 14


@pytest.mark.parametrize("extra", [1, 8, 11])
def test_time_index_load_rejects_size_not_a_multiple_of_12(tmp_path, extra):
    path = tmp_path / "t.timeindex"
    _write_raw(path, ">qI", [(5, 0)])
    with open(path, "ab") as f:
        f.write(b"\x01" * extra)
    with pytest.raises(CorruptIndexError):
        TimeIndex(str(path), 0).load()


@pytest.mark.parametrize("rows", [
    [(5, 0), (5, 3)],  # timestamp repeats
    [(5, 0), (4, 3)],  # timestamp decreases
    [(5, 3), (9, 2)],  # offset decreases
])
def test_time_index_sanity_check_rejects_non_increasing_entries(tmp_path, rows):
    path = tmp_path / "t.timeindex"
    _write_raw(path, ">qI", rows)
    idx = TimeIndex(str(path), 0)
    idx.load()
    with pytest.raises(CorruptIndexError):
        idx.sanity_check(100)


def test_time_index_sanity_check_rejects_offset_beyond_log_end(tmp_path):
    path = tmp_path / "t.timeindex"
    _write_raw(path, ">qI", [(5, 0), (9, 7)])
    idx = TimeIndex(str(path), 100)
    idx.load()
    idx.sanity_check(108)
    with pytest.raises(CorruptIndexError):
        idx.sanity_check(107)


def test_a_time_index_larger_than_segment_index_bytes_is_sized_from_its_file(tmp_path):
    path = tmp_path / "t.timeindex"
    _write_raw(path, ">qI", [(i, i) for i in range(4)])
    idx = TimeIndex(str(path), 0, max_index_bytes=36)
    idx.load()
    idx.sanity_check(100)
    assert idx.max_entries == 4 and idx.is_full
    assert idx.lookup_before(3) == 2


@settings(max_examples=50)
@given(offset_entries(max_entries=20))
def test_offset_index_rename_and_delete(data):
    base, entries = data
    with _tmpdir() as d:
        idx = build_offset_index(os.path.join(d, "a.index"), base, entries)
        idx.flush(fsync=False)
        idx.rename(os.path.join(d, "b.index"))
        assert os.listdir(d) == ["b.index"]
        loaded = OffsetIndex(idx.path, base)
        loaded.load()
        assert loaded.entries() == entries
        idx.delete()
        idx.delete()  # idempotent
        assert os.listdir(d) == []
