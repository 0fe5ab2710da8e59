"""Closed segments do not keep their files open: a bounded LRU of descriptors
(broker.log.segment.OPEN_SEGMENT_FILES, ``log.max.open.segment.files``)."""

from __future__ import annotations

import os

import pytest

from tests.unit.log.helpers import make_batch, open_log, read_records
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.segment import OPEN_SEGMENT_FILES, SegmentFileCache, set_max_open_segment_files

LRU_SIZE = 32
SEGMENTS = 2000


@pytest.fixture
def small_lru():
    before = OPEN_SEGMENT_FILES.max_open
    set_max_open_segment_files(LRU_SIZE)
    yield
    set_max_open_segment_files(before)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _segment_fds(directory: str) -> int:
    """Descriptors of this process open on a file in ``directory``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += target.startswith(directory + os.sep)
    return count


def test_a_log_of_2000_segments_holds_at_most_the_lru_and_reads_every_segment(tmp_path, small_lru):
    directory = str(tmp_path / "events-0")
    os.makedirs(directory)
    config = LogConfig(segment_bytes=1024, retention_ms=-1)  # each ~670-byte batch rolls a segment
    log = open_log(directory, config)
    values = [f"record {i}:".encode().ljust(600, b".") for i in range(SEGMENTS)]
    for value in values:
        log.append_as_leader(make_batch(values=[value]), 0)
    assert len(log.segments) >= SEGMENTS
    # the active segment plus at most the LRU, with a margin for nothing else
    assert _segment_fds(directory) <= LRU_SIZE + 1
    assert [r.value for r in read_records(log)] == values
    for offset in range(0, SEGMENTS, 97):  # random access reopens evicted segments
        data = log.read(offset, 1 << 20)
        assert values[offset] in data
    assert _segment_fds(directory) <= LRU_SIZE + 1
    log.close()
    assert _segment_fds(directory) == 0

    log = open_log(directory, config, had_clean_shutdown=False, recovery_point=0)  # recovers all
    assert _segment_fds(directory) <= LRU_SIZE + 1
    assert [r.value for r in read_records(log)] == values
    log.append_as_leader(make_batch(values=[b"after the restart"]), 0)
    assert [r.value for r in read_records(log)][-1] == b"after the restart"
    assert _segment_fds(directory) <= LRU_SIZE + 1
    log.close()
    assert _segment_fds(directory) == 0


def test_the_lru_closes_the_least_recently_used_and_never_a_pinned_one(tmp_path):
    cache = SegmentFileCache(2)

    class Seg:  # what the cache uses of a LogSegment
        def __init__(self, name: str):
            self.log_path = str(tmp_path / name)
            open(self.log_path, "wb").close()
            self._fd, self._pins, self._keep_open, self._close_when_released = -1, 0, False, False
            self._closed = False

    a, b, c = Seg("a"), Seg("b"), Seg("c")
    before = _open_fds()
    cache.acquire(a)  # pinned
    cache.acquire(b)
    cache.release(b)
    cache.acquire(c)
    cache.release(c)
    assert (a._fd >= 0, b._fd >= 0, c._fd >= 0) == (True, False, True)  # b was least recent unpinned
    cache.acquire(b)
    cache.release(b)
    assert (a._fd >= 0, b._fd >= 0, c._fd >= 0) == (True, True, False)
    cache.release(a)
    assert _open_fds() - before == 2
    for s in (a, b, c):
        cache.close(s)
    assert _open_fds() == before


def test_a_segment_closed_while_a_worker_reads_it_keeps_its_descriptor_until_the_read_ends(tmp_path):
    # the group coordinator's load and a search by timestamp read in worker threads while the
    # event loop swaps in cleaned segments and deletes old ones: the reader's descriptor must
    # stay its file's until it lets go (closed under it, a pread fails, or reads the file
    # that took the number meanwhile)
    log = open_log(tmp_path / "p", LogConfig(segment_bytes=1024))
    for i in range(30):
        log.append_as_leader(make_batch(values=[b"v%d" % i + b"." * 100]), 0)
    seg = log.segments[0]
    fd = OPEN_SEGMENT_FILES.acquire(seg)  # a reader holds it
    expected = os.pread(fd, 64, 0)
    seg.delete()  # the event loop drops it (retention, a swap)
    assert os.pread(fd, 64, 0) == expected  # still the reader's file
    OPEN_SEGMENT_FILES.release(seg)
    with pytest.raises(OSError):
        os.fstat(fd)  # closed by the last release
    log.close()
