"""The leader epoch cache (broker.log.epoch): Kafka's LeaderEpochFileCache semantics.

``end_offset_for`` answers OffsetsForLeaderEpoch exactly like Kafka (the table below follows
Kafka's LeaderEpochFileCacheTest): the latest epoch ends at the log end offset; an older
epoch ends where the next higher epoch starts, paired with the largest epoch <= the one
requested; an epoch newer than all, or UNDEFINED, or an empty cache gives (-1, -1).
A Hypothesis model test checks every operation against a plain list oracle, and every
change is written through to the checkpoint file.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.broker.log.checkpoint import LeaderEpochCheckpoint
from tidelog.broker.log.epoch import UNDEFINED_EPOCH, UNDEFINED_OFFSET, LeaderEpochCache

LEO = 1000
UNDEF = (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


class CountingCheckpoint:
    def __init__(self):
        self.writes: list[list[tuple[int, int]]] = []

    def write(self, entries):
        self.writes.append(list(entries))


def _cache(*entries, checkpoint=None) -> LeaderEpochCache:
    c = LeaderEpochCache(checkpoint)
    for e, o in entries:
        assert c.assign(e, o)
    return c


# -- end_offset_for ---------------------------------------------------------------------------------

END_OFFSET_TABLE = [
    # (entries, requested epoch, expected)
    ([], 0, UNDEF),
    ([], UNDEFINED_EPOCH, UNDEF),
    ([(2, 5), (3, 6), (4, 7)], 4, (4, LEO)),                # latest epoch: the log end offset
    ([(2, 5), (3, 6), (4, 7)], UNDEFINED_EPOCH, UNDEF),     # undefined epoch requested
    ([(5, 11), (6, 12), (7, 13)], 4, (4, 11)),              # older than all: first start offset
    ([(5, 11), (6, 12), (7, 13)], 0, (0, 11)),
    ([(5, 11), (6, 12), (7, 13)], 5, (5, 12)),              # exact older epoch: next start
    ([(5, 11), (6, 12), (7, 13)], 6, (6, 13)),
    ([(5, 11), (6, 12), (7, 13)], 8, UNDEF),                # newer than all
    ([(0, 10), (2, 13), (4, 17)], 1, (0, 13)),              # gap: floor epoch, next start
    ([(0, 10), (2, 13), (4, 17)], 3, (2, 17)),
    ([(0, 10), (2, 13), (4, 17)], 0, (0, 13)),
    ([(0, 10), (2, 13), (4, 17)], 2, (2, 17)),
    ([(0, 10), (2, 13), (4, 17)], 4, (4, LEO)),
    ([(0, 10), (2, 13), (4, 17)], 5, UNDEF),
    ([(3, 0)], 3, (3, LEO)),
    ([(3, 0)], 2, (2, 0)),
    ([(3, 0)], 4, UNDEF),
]


@pytest.mark.parametrize("entries,requested,expected", END_OFFSET_TABLE)
def test_end_offset_for(entries, requested, expected):
    assert _cache(*entries).end_offset_for(requested, LEO) == expected


def test_latest_epoch_follows_the_log_end_offset():
    c = _cache((1, 0), (2, 10))
    assert c.end_offset_for(2, 10) == (2, 10)
    assert c.end_offset_for(2, 55) == (2, 55)
    assert c.end_offset_for(1, 55) == (1, 10)


# -- assign ---------------------------------------------------------------------------------------

ASSIGN_TABLE = [
    # (entries before, (epoch, start), changed, entries after)
    ([], (0, 0), True, [(0, 0)]),
    ([], (5, 100), True, [(5, 100)]),
    ([(1, 0)], (2, 10), True, [(1, 0), (2, 10)]),
    ([(1, 0), (2, 10)], (2, 10), False, [(1, 0), (2, 10)]),         # same epoch again: ignored
    ([(1, 0), (2, 10)], (2, 5), False, [(1, 0), (2, 10)]),          # not newer: ignored
    ([(1, 0), (2, 10)], (1, 20), False, [(1, 0), (2, 10)]),         # older: ignored
    ([(1, 0), (2, 10)], (-1, 20), False, [(1, 0), (2, 10)]),        # undefined: ignored
    ([(1, 0), (2, 10), (3, 20)], (5, 15), True, [(1, 0), (2, 10), (5, 15)]),  # contradicts (3, 20)
    ([(1, 0), (2, 10), (3, 20)], (5, 10), True, [(1, 0), (5, 10)]),  # same start as (2, 10)
    ([(1, 0), (2, 10), (3, 20)], (5, 0), True, [(5, 0)]),
    ([(1, 0), (2, 10)], (3, 10), True, [(1, 0), (3, 10)]),
]


@pytest.mark.parametrize("before,new,changed,after", ASSIGN_TABLE)
def test_assign(before, new, changed, after):
    cp = CountingCheckpoint()
    c = _cache(*before, checkpoint=cp)
    writes = len(cp.writes)
    assert c.assign(*new) is changed
    assert c.entries == after
    assert len(cp.writes) == writes + (1 if changed else 0)
    if changed:
        assert cp.writes[-1] == after
    assert c.latest_epoch == (after[-1][0] if after else UNDEFINED_EPOCH)


def test_start_offset_of():
    c = _cache((1, 0), (3, 10), (7, 40))
    assert [c.start_offset_of(e) for e in range(9)] == [None, 0, None, 10, None, None, None, 40, None]


def test_empty_cache():
    c = LeaderEpochCache()
    assert c.entries == [] and c.latest_epoch == UNDEFINED_EPOCH
    c.truncate_from_end(0)
    c.truncate_from_start(10)
    assert c.entries == []


# -- truncation -------------------------------------------------------------------------------------

BASE = [(1, 0), (2, 10), (3, 20)]

TRUNCATE_FROM_END_TABLE = [
    (25, BASE),
    (21, BASE),
    (20, [(1, 0), (2, 10)]),            # the epoch starting at the new end is gone
    (11, [(1, 0), (2, 10)]),
    (10, [(1, 0)]),
    (1, [(1, 0)]),
    (0, []),
]


@pytest.mark.parametrize("end,after", TRUNCATE_FROM_END_TABLE)
def test_truncate_from_end(end, after):
    cp = CountingCheckpoint()
    c = _cache(*BASE, checkpoint=cp)
    writes = len(cp.writes)
    c.truncate_from_end(end)
    assert c.entries == after
    assert len(cp.writes) == writes + (after != BASE)


TRUNCATE_FROM_START_TABLE = [
    (0, BASE),                          # nothing before the first entry
    (5, [(1, 5), (2, 10), (3, 20)]),    # the first epoch is clipped
    (10, [(2, 10), (3, 20)]),
    (15, [(2, 15), (3, 20)]),
    (20, [(3, 20)]),
    (25, [(3, 25)]),                    # the latest epoch survives, clipped
]


@pytest.mark.parametrize("start,after", TRUNCATE_FROM_START_TABLE)
def test_truncate_from_start(start, after):
    cp = CountingCheckpoint()
    c = _cache(*BASE, checkpoint=cp)
    writes = len(cp.writes)
    c.truncate_from_start(start)
    assert c.entries == after
    assert len(cp.writes) == writes + (after != BASE)


def test_truncate_from_start_before_the_first_epoch_changes_nothing():
    c = _cache((4, 100), (5, 200))
    c.truncate_from_start(50)
    assert c.entries == [(4, 100), (5, 200)]


def test_clear_is_persisted(tmp_path):
    cp = LeaderEpochCheckpoint(str(tmp_path / "leader-epoch-checkpoint"))
    c = _cache((1, 0), (2, 5), checkpoint=cp)
    c.clear()
    assert c.entries == [] and cp.read() == []
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n0\n"


# -- persistence ------------------------------------------------------------------------------------


def test_every_change_is_written_through_and_survives_a_restart(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    c = LeaderEpochCache(LeaderEpochCheckpoint(str(path)))
    c.assign(0, 0)
    c.assign(2, 100)
    c.assign(5, 250)
    assert path.read_text() == "0\n3\n0 0\n2 100\n5 250\n"
    c.truncate_from_end(250)
    c.truncate_from_start(40)
    assert path.read_text() == "0\n2\n0 40\n2 100\n"
    reloaded_cp = LeaderEpochCheckpoint(str(path))
    again = LeaderEpochCache(reloaded_cp, reloaded_cp.read())
    assert again.entries == c.entries == [(0, 40), (2, 100)]
    assert again.end_offset_for(0, 300) == (0, 100)
    assert again.end_offset_for(2, 300) == (2, 300)


# -- model test -------------------------------------------------------------------------------------


class Model:
    """A deliberately naive restatement of the docstring's semantics over a list."""

    def __init__(self):
        self.entries: list[tuple[int, int]] = []

    def assign(self, epoch, start):
        if epoch < 0 or (self.entries and epoch <= self.entries[-1][0]):
            return False
        self.entries = [(e, o) for e, o in self.entries if o < start] + [(epoch, start)]
        return True

    def end_offset_for(self, requested, leo):
        if requested == UNDEFINED_EPOCH or not self.entries:
            return UNDEF
        if requested == self.entries[-1][0]:
            return requested, leo
        higher = [(e, o) for e, o in self.entries if e > requested]
        if not higher:
            return UNDEF
        floor = [(e, o) for e, o in self.entries if e <= requested]
        return (floor[-1][0] if floor else requested), higher[0][1]

    def truncate_from_end(self, end):
        self.entries = [(e, o) for e, o in self.entries if o < end]

    def truncate_from_start(self, start):
        before = [(e, o) for e, o in self.entries if o <= start]
        if before:
            self.entries = [(before[-1][0], start)] + [(e, o) for e, o in self.entries if o > start]


ops = st.lists(st.one_of(
    st.tuples(st.just("assign"), st.integers(-1, 12), st.integers(0, 60)),
    st.tuples(st.just("end"), st.integers(0, 60)),
    st.tuples(st.just("start"), st.integers(0, 60)),
    st.tuples(st.just("restart")),
), max_size=25)


@settings(max_examples=150)
@given(ops=ops)
def test_cache_matches_the_model_and_its_checkpoint(ops):
    store: list[list[tuple[int, int]]] = [[]]

    class MemoryCheckpoint:
        def write(self, entries):
            store[0] = list(entries)

    model = Model()
    cache = LeaderEpochCache(MemoryCheckpoint())
    for op in ops:
        if op[0] == "assign":
            assert cache.assign(op[1], op[2]) == model.assign(op[1], op[2])
        elif op[0] == "end":
            cache.truncate_from_end(op[1])
            model.truncate_from_end(op[1])
        elif op[0] == "start":
            cache.truncate_from_start(op[1])
            model.truncate_from_start(op[1])
        else:
            cache = LeaderEpochCache(MemoryCheckpoint(), store[0])
        assert cache.entries == model.entries
        assert store[0] == cache.entries  # written through, or unchanged
        epochs = [e for e, _ in cache.entries]
        offsets = [o for _, o in cache.entries]
        assert epochs == sorted(set(epochs)) and offsets == sorted(set(offsets))
        for requested in range(-1, 14):
            assert cache.end_offset_for(requested, 99) == model.end_offset_for(requested, 99)


# -- the cache and the log through a crash in an append ---------------------------------------------


class Crash(Exception):
    """The process dies here."""


def _epochs_in_headers(log) -> list[tuple[int, int]]:
    """(epoch, first offset) of each epoch as the stored batches carry them."""
    out: list[tuple[int, int]] = []
    for seg in log.segments:
        for _, h in seg.headers_from(0):
            if not out or h.leader_epoch > out[-1][0]:
                out.append((h.leader_epoch, h.base_offset))
    return out


@pytest.mark.parametrize("dies_in", ["checkpoint write", "segment append"])
@pytest.mark.parametrize("role", ["leader", "follower"])
def test_a_crash_while_appending_a_new_epochs_first_batch_leaves_cache_and_log_agreeing(tmp_path, role, dies_in):
    """A crash between writing the first batch of a new leader epoch and recording the epoch:
    the epoch is recorded first (Kafka's order), so the log never holds records of an epoch
    its checkpoint does not know, and an entry recorded for records that never reached the
    disk starts at the log end, where loading drops it."""
    from tests.unit.log.helpers import make_batch, open_log
    from tidelog.broker.log.segment import LogSegment
    from tidelog.protocol.records import patch_batch

    d = tmp_path / "p"
    log = open_log(d)
    for _ in range(3):
        log.append_as_leader(make_batch(2), 0)
    leo = log.log_end_offset
    batch = make_batch(2)
    if role == "follower":
        batch = bytearray(batch)
        patch_batch(batch, 0, leo, 1)

    def crash(*_):
        raise Crash

    target = (LeaderEpochCheckpoint, "write") if dies_in == "checkpoint write" else (LogSegment, "append")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(*target, crash)
        with pytest.raises(Crash):
            if role == "leader":
                log.append_as_leader(batch, 1)
            else:
                log.append_as_follower(bytes(batch))
    for seg in log.segments:  # what a killed process leaves: the files as written so far
        seg.close()
    again = open_log(d, recovery_point=0)
    assert again.epoch_cache.entries == _epochs_in_headers(again)
    assert again.log_end_offset == leo and again.epoch_cache.entries == [(0, 0)]  # the crash came first
    again.close()
