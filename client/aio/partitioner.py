"""Choosing a partition for a record, the way Kafka's Java producer does.

* A record with a key goes to ``to_positive(murmur2(key)) % num_partitions``: bit for bit
  Kafka's ``Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions``, so a key lands on
  the same partition whether a Java, librdkafka (murmur2 mode) or Tidelog producer sent it.
* A record without a key sticks to one partition (Kafka's sticky partitioner, KIP-480): all
  keyless records of a topic go to the same partition until the batch they fill is closed
  (full, or taken by the sender), then the partitioner switches to another partition, chosen
  at random among those with a leader. This fills batches instead of spreading single records
  over every partition, which is what makes linger_ms worth anything with many partitions.

Pure code: no clock, no I/O. ``StickyPartitioner`` is called by the accumulator under its lock.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence

__all__ = ["murmur2", "to_positive", "default_partition", "StickyPartitioner"]

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's 32-bit murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed
    int32 like Java's. Java's ``int`` arithmetic wraps at 32 bits, so every product is masked."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    words = length >> 2
    if words:
        for k in struct.unpack_from(f"<{words}I", data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            k = (k * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    tail = length & 3
    if tail:
        base = length & ~3
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h ^= data[base]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``: abs(MIN_INT) overflows)."""
    return n & 0x7FFFFFFF


def default_partition(key: bytes, num_partitions: int) -> int:
    """The partition of a keyed record: ``toPositive(murmur2(key)) % numPartitions``."""
    return to_positive(murmur2(key)) % num_partitions


class StickyPartitioner:
    """The current sticky partition per topic for keyless records.

    ``partition(topic, n, available)`` returns the sticky choice (choosing one the first time);
    ``on_new_batch(topic, n, available, previous)`` is called by the accumulator when a keyless
    record would open a new batch on ``previous`` (its batch was closed) and moves the topic to
    another partition. ``available``: partitions that currently have a leader (may be empty).
    """

    __slots__ = ("_sticky", "_rng")

    def __init__(self, rng: Callable[[int], int] | None = None):
        self._sticky: dict[str, int] = {}
        self._rng = rng or random.Random().randrange

    def partition(self, topic: str, num_partitions: int, available: Sequence[int] = ()) -> int:
        p = self._sticky.get(topic)
        if p is None or p >= num_partitions:
            p = self._choose(num_partitions, available, previous=None)
            self._sticky[topic] = p
        return p

    def on_new_batch(self, topic: str, num_partitions: int, available: Sequence[int],
                     previous: int) -> int:
        """Switch ``topic`` away from ``previous`` (unless another record already did)."""
        p = self._sticky.get(topic)
        if p is None or p == previous:
            # a topic of one partition stays on it without the candidates being listed (the
            # usual low-rate producer: every record closes its batch)
            p = 0 if num_partitions == 1 else self._choose(num_partitions, available, previous)
            self._sticky[topic] = p
        return p

    def _choose(self, num_partitions: int, available: Sequence[int], previous: int | None) -> int:
        candidates = [p for p in available if p < num_partitions] or range(num_partitions)
        if len(candidates) == 1:
            return candidates[0]
        while True:  # a different partition than before, when there is one
            p = candidates[self._rng(len(candidates))]
            if p != previous:
                return p
