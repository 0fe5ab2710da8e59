"""Verifying closed segments in the background: a bit flipped on disk found before a reader
finds it.

Every read checks the CRC of each batch it returns (``LogSegment.read``), and a replica found
damaged that way is re-fetched from a replica in sync (the rules in
``broker/replication/partition.py``). But a batch nobody reads -- a follower's whole log, a
leader's old segments -- can sit damaged for months, and its first reader would be a new
leader's consumer after a failover, with the good copies perhaps gone by then. So every
``log.verify.interval.ms`` each closed segment of every replica on this broker is read through
once, at most ``log.verify.bytes.per.second``, every batch's framing, magic and CRC checked
(as ``dump-log --verify`` does). The active segment is not: its tail may be torn by a crash,
which recovery at startup handles.

The scan (``first_suspect_offset``, run by the replica manager's ``_verify_segments``) runs
in a worker thread on a file descriptor of its own: the log opens and closes
segment files (its LRU of open files) and retention, compaction and truncation delete or
shorten them at any moment. What the scan finds is therefore only a *suspect* offset; the
replica manager confirms it on the event loop with an ordinary read of that offset, which
raises for real damage, and a segment that changed under the scan is simply read again at the
next pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from tidelog.broker.log.dump import Damage, FileWindow, iter_batches
from tidelog.protocol.topics import TopicPartition


class ClosedSegment(NamedTuple):
    tp: TopicPartition
    path: str
    base_offset: int
    size: int


class Pace:
    """Sleeps the scanning thread so that it reads at most ``bytes_per_s`` (None: no limit);
    ``stop`` ends a scan at its next chunk."""

    def __init__(self, bytes_per_s: int | None, clock: Callable[[], float] = time.monotonic):
        self.bytes_per_s = bytes_per_s
        self.stopped = threading.Event()
        self._clock = clock
        self._start = clock()
        self._bytes = 0

    def __call__(self, n: int) -> bool:
        """Account ``n`` bytes read; False once the scan should stop."""
        if self.bytes_per_s:
            self._bytes += n
            ahead = self._bytes / self.bytes_per_s - (self._clock() - self._start)
            if ahead > 0:
                self.stopped.wait(ahead)
        return not self.stopped.is_set()

    def stop(self) -> None:
        self.stopped.set()


def first_suspect_offset(path: str, base_offset: int, size: int, pace: Callable[[int], bool] | None = None) -> int | None:
    """The first offset of the segment file ``path`` (its first ``size`` bytes) not held by a
    batch that verifies: the offset after the last good batch. None if every batch verifies,
    or the file is gone, or ``pace`` stopped the scan."""
    try:
        with open(path, "rb") as f:
            offset = base_offset
            for item in iter_batches(FileWindow(f), size):
                if isinstance(item, Damage) or item.fault is not None:
                    return offset
                offset = item.header.base_offset + item.header.last_offset_delta + 1
                if pace is not None and not pace(item.header.size):
                    return None
    except FileNotFoundError:
        return None
    return None
