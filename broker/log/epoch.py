"""The leader epoch cache: which leader epoch wrote which range of offsets.

Entries are ``(epoch, start_offset)``, strictly increasing in both. Epoch ``e`` covers
``[start(e), start(next epoch))``; the latest epoch covers up to the log end offset. The cache
is what lets a follower find, after a leadership change, the exact offset where its log
diverged from the new leader's (OffsetsForLeaderEpoch): it asks the leader for the end offset
of its own latest epoch, and truncates there, never blindly to its high watermark.

Every change is written through to ``leader-epoch-checkpoint`` (changes are rare: one per
leadership change), so the cache survives restarts; a missing or corrupt checkpoint is
rebuilt from the epochs stamped in the batch headers. A new epoch is recorded before its
first batch is appended (``Log._append``, as Kafka's UnifiedLog.append does): a crash between
the two leaves an entry at the log end, which loading drops (``truncate_from_end``), never
records of an epoch the checkpoint does not name (a checkpoint present is trusted: the epoch
would stay unknown, and OffsetsForLeaderEpoch would answer wrong).
"""

from __future__ import annotations

import bisect

from tidelog.broker.log.checkpoint import LeaderEpochCheckpoint

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, checkpoint: LeaderEpochCheckpoint | None = None,
                 entries: list[tuple[int, int]] | None = None):
        self._checkpoint = checkpoint
        self._epochs: list[int] = []
        self._offsets: list[int] = []
        for epoch, offset in entries or ():
            self._epochs.append(epoch)
            self._offsets.append(offset)

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._offsets))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def start_offset_of(self, epoch: int) -> int | None:
        i = bisect.bisect_left(self._epochs, epoch)
        if i < len(self._epochs) and self._epochs[i] == epoch:
            return self._offsets[i]
        return None

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns True if the cache changed.

        An epoch not newer than the latest is ignored. Entries that the new one contradicts
        (starting at or after ``start_offset``) are dropped first, as after a truncation.
        """
        if epoch < 0 or (self._epochs and epoch <= self._epochs[-1]):
            return False
        while self._offsets and self._offsets[-1] >= start_offset:
            self._epochs.pop()
            self._offsets.pop()
        self._epochs.append(epoch)
        self._offsets.append(start_offset)
        self.flush()
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetsForLeaderEpoch answer: ``(epoch, end_offset)``.

        For the latest epoch the end is the log end offset. For an older epoch it is the
        start offset of the first epoch after it, paired with the largest epoch <= requested.
        Unknown (newer than anything here, or undefined): ``(-1, -1)``.
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, requested_epoch)
        if higher == len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return requested_epoch, self._offsets[0]
        return self._epochs[higher - 1], self._offsets[higher]

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs that start at or after ``end_offset`` (the log was truncated there)."""
        i = bisect.bisect_left(self._offsets, end_offset)
        if i < len(self._offsets):
            del self._epochs[i:], self._offsets[i:]
            self.flush()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: drop wholly earlier epochs, clip the first."""
        i = bisect.bisect_right(self._offsets, start_offset)
        if i == 0:
            return
        changed = i > 1 or self._offsets[0] != start_offset
        del self._epochs[:i - 1], self._offsets[:i - 1]
        self._offsets[0] = start_offset
        if changed:
            self.flush()

    def clear(self) -> None:
        self._epochs.clear()
        self._offsets.clear()
        self.flush()

    def flush(self) -> None:
        if self._checkpoint is not None:
            self._checkpoint.write(self.entries)
