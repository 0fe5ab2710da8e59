"""Replicas on disk, read with the broker's own readers (best after the brokers stopped).

DevCluster's layout: broker ``i`` keeps its logs in ``<cluster dir>/broker-<i>/logs``, one
``<topic>-<partition>`` directory per replica, the checkpoints beside them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tidelog.broker.devcluster import DevCluster
from tidelog.broker.log.checkpoint import LOG_START_OFFSET_CHECKPOINT, REPLICATION_CHECKPOINT, OffsetCheckpoint
from tidelog.protocol.records import iter_all_records, iter_headers


def log_dir(cluster: DevCluster, broker_id: int) -> Path:
    return cluster.dir / f"broker-{broker_id}" / "logs"


def log_dirs(cluster: DevCluster) -> dict[int, Path]:
    """Each broker's log directory."""
    return {i: log_dir(cluster, i) for i in cluster.brokers}


def partition_dirs(cluster: DevCluster, topic: str) -> dict[int, list[str]]:
    """Per broker, the directories under its log dir that belong to ``topic``."""
    out = {}
    for i, d in log_dirs(cluster).items():
        names = os.listdir(d) if d.is_dir() else []
        out[i] = sorted(n for n in names if n.startswith(topic + "-"))
    return out


def replica_records(cluster: DevCluster, broker_id: int, topic: str, partition: int) -> list[tuple[int, bytes | None]]:
    """``(offset, value)`` of every record in one replica's segment files, in log order."""
    d = log_dir(cluster, broker_id) / f"{topic}-{partition}"
    out: list[tuple[int, bytes | None]] = []
    for seg in sorted(d.glob("*.log")):
        out += [(r.offset, r.value) for r in iter_all_records(seg.read_bytes())]
    return out


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One segment of a replica as its ``.log`` file holds it: its base offset (the file's
    name), the offset after its last batch (the base offset when it is empty) and the largest
    timestamp of its batches (-1 when it is empty), which retention ages it by."""

    base_offset: int
    next_offset: int
    max_timestamp: int


def replica_segments(cluster: DevCluster, broker_id: int, topic: str, partition: int) -> list[SegmentFile]:
    """Every segment of one replica in base-offset order, read from the batch headers."""
    d = log_dir(cluster, broker_id) / f"{topic}-{partition}"
    out = []
    for seg in sorted(d.glob("*.log"), key=lambda f: int(f.stem)):
        headers = [h for _, h in iter_headers(seg.read_bytes())]
        base = int(seg.stem)
        out.append(SegmentFile(base, headers[-1].next_offset if headers else base,
                               max((h.max_timestamp for h in headers), default=-1)))
    return out


def checkpointed_high_watermarks(cluster: DevCluster, broker_id: int) -> dict[tuple[str, int], int]:
    """A broker's replication-offset-checkpoint: (topic, partition) -> high watermark ({} when absent)."""
    return dict(OffsetCheckpoint(str(log_dir(cluster, broker_id) / REPLICATION_CHECKPOINT)).read())


def checkpointed_log_starts(cluster: DevCluster, broker_id: int) -> dict[tuple[str, int], int]:
    """A broker's log-start-offset-checkpoint: (topic, partition) -> log start offset ({} when absent)."""
    return dict(OffsetCheckpoint(str(log_dir(cluster, broker_id) / LOG_START_OFFSET_CHECKPOINT)).read())


def replica_high_watermark(cluster: DevCluster, broker_id: int, topic: str, partition: int) -> int | None:
    """The high watermark a broker checkpointed for one partition (None when absent)."""
    return checkpointed_high_watermarks(cluster, broker_id).get((topic, partition))
