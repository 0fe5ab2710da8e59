"""Replicas on disk, read with the broker's own readers (best after the brokers stopped).

DevCluster's layout: broker ``i`` keeps its logs in ``<cluster dir>/broker-<i>/logs``, one
``<topic>-<partition>`` directory per replica, the checkpoints beside them.
"""

from __future__ import annotations

import os
from pathlib import Path

from tidelog.broker.devcluster import DevCluster
from tidelog.broker.log.checkpoint import REPLICATION_CHECKPOINT, OffsetCheckpoint
from tidelog.protocol.records import iter_all_records


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


def checkpointed_high_watermarks(cluster: DevCluster, broker_id: int) -> dict[tuple[str, int], int]:
    """A broker's replication-offset-checkpoint: (topic, partition) -> high watermark ({} when absent)."""
    return dict(OffsetCheckpoint(str(log_dir(cluster, broker_id) / REPLICATION_CHECKPOINT)).read())


def replica_high_watermark(cluster: DevCluster, broker_id: int, topic: str, partition: int) -> int | None:
    """The high watermark a broker checkpointed for one partition (None when absent)."""
    return checkpointed_high_watermarks(cluster, broker_id).get((topic, partition))
