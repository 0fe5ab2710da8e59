"""StopReplica with deletion (topic deletion, a reassignment moving a replica away), on one
in-process broker: the event loop's share of deleting many partitions is one rename each and
one write of each checkpoint; the files go in a worker thread."""

from __future__ import annotations

import collections
import os
import shutil
import threading

import trio

from tests.unit.log.helpers import FakeClock, make_batch
from tests.unit.replication.memory_leader import CONTROLLER_EPOCH, MemoryBroker
from tidelog.broker.log.checkpoint import OffsetCheckpoint
from tidelog.broker.log.config import LogConfig
from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import LeaderAndIsrRequest, PartitionState, StopReplicaPartition, StopReplicaRequest
from tidelog.protocol.topics import TopicPartition

CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=100, retention_ms=-1)
DOOMED = [TopicPartition("doomed", i) for i in range(20)]
KEPT = TopicPartition("kept", 0)


def lead(broker: MemoryBroker, tps) -> None:
    states = [PartitionState(tp.topic, tp.partition, CONTROLLER_EPOCH, broker.broker_id, 0, [broker.broker_id], 0,
                             [broker.broker_id]) for tp in tps]
    resp = broker.replica_manager.become_leader_or_follower(LeaderAndIsrRequest(0, CONTROLLER_EPOCH, 0, states))
    assert all(e.error_code == NONE.code for e in resp.partition_errors), resp


async def test_deleting_many_partitions_checkpoints_once_and_removes_files_off_the_event_loop(
        tmp_path, nursery, monkeypatch):
    broker = MemoryBroker(1, str(tmp_path), CONFIG, FakeClock())
    await nursery.start(broker.replica_manager.run)
    lead(broker, DOOMED + [KEPT])
    for tp in DOOMED + [KEPT]:
        assert broker.produce(make_batch(3), tp=tp)["error_code"] == NONE.code

    writes: collections.Counter[str] = collections.Counter()
    real_write, real_rmtree = OffsetCheckpoint.write, shutil.rmtree
    removed_on: list[threading.Thread] = []

    def counted_write(self, offsets):
        writes[os.path.basename(self.path)] += 1
        return real_write(self, offsets)

    def spied_rmtree(path, *args, **kwargs):
        removed_on.append(threading.current_thread())
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(OffsetCheckpoint, "write", counted_write)
    monkeypatch.setattr(shutil, "rmtree", spied_rmtree)
    resp = broker.replica_manager.stop_replicas(StopReplicaRequest(
        0, CONTROLLER_EPOCH, 0, [StopReplicaPartition(tp.topic, tp.partition, 0, True) for tp in DOOMED]))
    assert resp.error_code == NONE.code and all(e.error_code == NONE.code for e in resp.partition_errors)

    # each partition directory is renamed away at once, and each checkpoint written once
    names = os.listdir(tmp_path)
    assert not {tp.dir_name for tp in DOOMED} & set(names)
    assert KEPT.dir_name in names
    assert writes and set(writes.values()) == {1}, writes
    for name in writes:
        assert set(OffsetCheckpoint(str(tmp_path / name)).read()) <= {KEPT}
    # a topic created again at once never meets the old files
    lead(broker, DOOMED[:1])
    assert broker.log(DOOMED[0]).log_end_offset == 0

    with trio.fail_after(30):  # (a hang guard only)
        while any(n.endswith("-delete") for n in os.listdir(tmp_path)):
            await trio.sleep(0.01)
    assert removed_on and threading.main_thread() not in removed_on
    assert broker.log(KEPT).log_end_offset == 3
