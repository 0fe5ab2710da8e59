"""DescribeLogDirs (Kafka's key 35) as a pure answer: this broker's replicas, log dir by log dir.

Each local replica is described by what this broker holds: its size on disk, its log start
offset, its log end offset (LEO) and its high watermark (a follower's is the one the leader
last sent it, capped at its own LEO). ``offset_lag`` is Kafka's: the HW minus the LEO, never
negative, so 0 for every current (non-future) replica; a tool that wants a follower's lag
behind its leader compares the two replicas' LEOs, which is why the offsets are here.

The caller gathers the logs and the disks' figures (the only I/O); ``describe_log_dirs``
only selects and shapes them.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from tidelog.protocol.errors import KAFKA_STORAGE_ERROR, NONE
from tidelog.protocol.messages import (
    DescribableLogDirTopic,
    DescribeLogDirsPartition,
    DescribeLogDirsResult,
    DescribeLogDirsTopic,
)
from tidelog.protocol.topics import TopicPartition


@dataclass(frozen=True, slots=True)
class LocalReplica:
    """One replica's figures as this broker's log holds them."""

    log_dir: str
    size: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


def wanted_partitions(topics: list[DescribableLogDirTopic] | None) -> set[TopicPartition] | None:
    """The partitions a request names; None: every one."""
    if topics is None:
        return None
    return {TopicPartition(t.topic, p) for t in topics for p in t.partitions}


def describe_log_dirs(log_dirs: list[str], replicas: Mapping[TopicPartition, LocalReplica],
                      wanted: set[TopicPartition] | None,
                      disk: Mapping[str, tuple[int, int]],
                      offline: Collection[str] = ()) -> list[DescribeLogDirsResult]:
    """One result per log dir (even an empty one, as Kafka lists every dir), its topics and
    partitions sorted; ``disk`` maps a dir to (total bytes, usable bytes). A dir in
    ``offline`` (it failed) answers KAFKA_STORAGE_ERROR with no topics, as Kafka's."""
    by_dir: dict[str, dict[str, list[DescribeLogDirsPartition]]] = {d: {} for d in log_dirs}
    for tp in sorted(replicas):
        if wanted is not None and tp not in wanted:
            continue
        r = replicas[tp]
        by_dir.setdefault(r.log_dir, {}).setdefault(tp.topic, []).append(DescribeLogDirsPartition(
            tp.partition, r.size, max(0, r.high_watermark - r.log_end_offset), False,
            r.log_start_offset, r.log_end_offset, r.high_watermark))
    return [DescribeLogDirsResult(KAFKA_STORAGE_ERROR.code, d, [], -1, -1) if d in offline else
            DescribeLogDirsResult(NONE.code, d, [DescribeLogDirsTopic(t, ps) for t, ps in topics.items()],
                                  *disk.get(d, (-1, -1)))
            for d, topics in by_dir.items()]


def log_dir_of(log_directory: str) -> str:
    """The log dir that holds a partition's directory."""
    return os.path.dirname(os.path.abspath(log_directory))
