"""A log dir that fails under the replica manager (an OSError on it: a full disk, an I/O error,
no descriptors left) takes its partitions offline on the broker, and only them: a produce
answers KAFKA_STORAGE_ERROR for the partitions in that dir alone (the others of the request
are appended), reads and acks=all waits answer the same, a follower stops fetching such a
partition without failing (its fetcher goes on), nothing is written to the dir again, and
a LeaderAndIsr or StopReplica for such a replica answers KAFKA_STORAGE_ERROR until the broker
restarts; the controller is told. The log layer's side is tests/unit/log/test_log_dir_failure.py,
the controller's tests/unit/controller/test_replica_damage.py."""

from __future__ import annotations

import errno
import os

import pytest
import trio
import trio.testing

from tests.unit.log.helpers import FailingDir, FakeClock, make_batch
from tests.unit.replication.memory_leader import CONTROLLER_EPOCH, TP, MemoryBroker
from tests.unit.replication.test_fetcher import make_cluster, produce
from tidelog.broker.log.config import LogConfig
from tidelog.protocol.errors import KAFKA_STORAGE_ERROR, NONE
from tidelog.protocol.messages import (
    LATEST_TIMESTAMP,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchTopic,
    LeaderAndIsrRequest,
    PartitionState,
    StopReplicaPartition,
    StopReplicaRequest,
)
from tidelog.protocol.topics import TopicPartition

A, B = TopicPartition("a", 0), TopicPartition("b", 0)
CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=100, retention_ms=-1)


@pytest.fixture
def broker(tmp_path):
    """Broker 1 with two log dirs, leading A (in the first) and B (in the second)."""
    b = MemoryBroker(1, [str(tmp_path / "d1"), str(tmp_path / "d2")], CONFIG, FakeClock())
    lead(b, A, B)
    assert [os.path.dirname(b.log(tp).directory) for tp in (A, B)] == b.log_manager.log_dirs
    yield b
    b.close()


def lead(broker: MemoryBroker, *tps: TopicPartition, replicas=(1,), epoch: int = 0):
    states = [PartitionState(tp.topic, tp.partition, CONTROLLER_EPOCH, broker.broker_id, epoch, list(replicas), 0,
                             list(replicas)) for tp in tps]
    return broker.replica_manager.become_leader_or_follower(LeaderAndIsrRequest(0, CONTROLLER_EPOCH, 0, states))


async def consumer_fetch(broker: MemoryBroker, *tps: TopicPartition) -> dict[TopicPartition, FetchPartitionResponse]:
    req = FetchRequest([FetchTopic(tp.topic, [FetchPartition(tp.partition, 0, 1 << 20)]) for tp in tps],
                       replica_id=-1, max_wait_ms=0)
    return {tp: FetchPartitionResponse.from_body(r) for tp, r in (await broker.replica_manager.fetch(req)).items()}


async def test_a_produce_fails_only_for_the_partition_whose_log_dir_failed(broker, monkeypatch):
    d1, d2 = broker.log_manager.log_dirs
    failing = FailingDir(monkeypatch, d1)
    results, _ = broker.replica_manager.append_now(1, {A: make_batch(2), B: make_batch(2)})
    assert results[A]["error_code"] == KAFKA_STORAGE_ERROR.code
    assert d1 in results[A]["error_message"] and "No space left on device" in results[A]["error_message"]
    assert results[B]["error_code"] == NONE.code and results[B]["base_offset"] == 0

    # the dir is offline: its partitions answer at once, and nothing more is written to it
    assert list(broker.log_manager.offline_dirs) == [d1] and broker.log_manager.get_log(A) is None
    tried = failing.calls
    again, _ = broker.replica_manager.append_now(1, {A: make_batch(1), B: make_batch(1)})
    assert again[A]["error_code"] == KAFKA_STORAGE_ERROR.code and "offline" in again[A]["error_message"]
    assert again[B]["error_code"] == NONE.code and again[B]["base_offset"] == 2
    assert failing.calls == tried


async def test_reads_of_a_replica_in_a_failed_log_dir_answer_storage_error(broker, monkeypatch):
    for tp in (A, B):
        assert broker.produce(make_batch(3), tp=tp)["error_code"] == NONE.code
    FailingDir(monkeypatch, broker.log_manager.log_dirs[0], "pread", errno.EIO)
    got = await consumer_fetch(broker, A, B)
    assert got[A].error_code == KAFKA_STORAGE_ERROR.code and not got[A].records
    assert "Input/output error" in got[A].error_message
    assert got[B].error_code == NONE.code and got[B].records
    again = await consumer_fetch(broker, A)
    assert again[A].error_code == KAFKA_STORAGE_ERROR.code and "offline" in again[A].error_message
    listed = broker.replica_manager.list_offset(A, LATEST_TIMESTAMP, -1, True)
    assert listed.error_code == KAFKA_STORAGE_ERROR.code


async def test_a_produce_waiting_for_its_followers_fails_when_its_log_dir_goes_offline(broker, monkeypatch):
    lead(broker, A, B, replicas=(1, 2), epoch=1)  # broker 2 never fetches: acks=all waits
    rm = broker.replica_manager
    results, waiting = rm.append_now(-1, {A: make_batch(1), B: make_batch(1)})
    assert set(waiting) == {A, B}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rm.await_replication, {A: waiting[A]}, 60_000, results)
        await trio.testing.wait_all_tasks_blocked()
        FailingDir(monkeypatch, broker.log_manager.log_dirs[0])
        assert broker.produce(make_batch(1), tp=A)["error_code"] == KAFKA_STORAGE_ERROR.code
    assert results[A]["error_code"] == KAFKA_STORAGE_ERROR.code and "offline" in results[A]["error_message"]
    assert rm._replication_done(B, waiting[B]) == (False, NONE.code)  # still waiting, unharmed


@pytest.mark.parametrize("call", ["pwrite", "open"])  # an append, or a roll's new segment
async def test_a_follower_whose_log_dir_fails_stops_fetching_it_and_its_fetcher_goes_on(
        tmp_path, monkeypatch, autojump_clock, call):
    cluster, (a, b) = make_cluster(str(tmp_path))
    cluster.elect(1)
    produce(a, 30)  # more than a segment of the follower's: its first fetch rolls
    f = cluster.fetcher(b)
    FailingDir(monkeypatch, b.log_manager.log_dirs[0], call)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(f.run)
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert TP not in f.partitions and a.fetch_requests == 1  # stopped, and no loop of fetches
    assert b.log_manager.offline_dirs and b.partition().offline is not None
    assert (await consumer_fetch(b, TP))[TP].error_code == KAFKA_STORAGE_ERROR.code
    assert a.produce(make_batch(1))["error_code"] == NONE.code  # the leader carries on


def test_an_offline_replica_takes_no_new_state_and_is_not_deleted(broker, monkeypatch):
    d1, d2 = broker.log_manager.log_dirs
    FailingDir(monkeypatch, d1)
    assert broker.produce(make_batch(1), tp=A)["error_code"] == KAFKA_STORAGE_ERROR.code
    monkeypatch.undo()  # the disk answers again: the dir stays offline until the broker restarts
    resp = lead(broker, A, B, epoch=1)
    assert {e.topic_name: e.error_code for e in resp.partition_errors} == {"a": KAFKA_STORAGE_ERROR.code,
                                                                          "b": NONE.code}
    assert broker.log_manager.get_log(A) is None and not os.path.exists(os.path.join(d2, "a-0"))
    assert broker.produce(make_batch(1), tp=A)["error_code"] == KAFKA_STORAGE_ERROR.code
    stop = broker.replica_manager.stop_replicas(StopReplicaRequest(0, CONTROLLER_EPOCH, 0, [
        StopReplicaPartition("a", 0, -2, True), StopReplicaPartition("b", 0, -2, True)]))
    assert [e.error_code for e in stop.partition_errors] == [KAFKA_STORAGE_ERROR.code, NONE.code]
    assert os.path.isdir(os.path.join(d1, "a-0"))  # left for the broker's next start


async def test_a_failure_found_by_periodic_work_takes_the_dir_offline(broker, monkeypatch):
    d1, d2 = broker.log_manager.log_dirs
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.replica_manager.run)
        FailingDir(monkeypatch, d1, "fsync", errno.EIO)
        broker.log_manager.checkpoint_all()  # the periodic checkpoints: d1's fail, d2's are written
        await trio.testing.wait_all_tasks_blocked()
        assert list(broker.log_manager.offline_dirs) == [d1] and broker.partition(A).offline is not None
        assert broker.produce(make_batch(1), tp=A)["error_code"] == KAFKA_STORAGE_ERROR.code
        assert broker.produce(make_batch(1), tp=B)["error_code"] == NONE.code
        nursery.cancel_scope.cancel()


def send_state(broker: MemoryBroker, tp: TopicPartition, leader: int, isr: list[int], epoch: int):
    st = PartitionState(tp.topic, tp.partition, CONTROLLER_EPOCH, leader, epoch, isr, epoch, [1, 2])
    (e,) = broker.replica_manager.become_leader_or_follower(LeaderAndIsrRequest(0, CONTROLLER_EPOCH, 0, [st])
                                                            ).partition_errors
    return e.error_code


async def test_the_controller_is_told_and_told_again_while_a_state_counts_on_an_offline_replica(
        broker, monkeypatch):
    reports = []

    async def reporter(tps, offline=False):
        reports.append((sorted(tps), offline))
    broker.replica_manager.damage_reporter = reporter
    a1 = TopicPartition("a", 1)
    lead(broker, a1)  # in d1 too, with A
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.replica_manager.run)
        FailingDir(monkeypatch, broker.log_manager.log_dirs[0])
        assert broker.produce(make_batch(1), tp=A)["error_code"] == KAFKA_STORAGE_ERROR.code
        await trio.testing.wait_all_tasks_blocked()
        assert reports == [([A, a1], True)]  # the whole dir, once
        # a state that has it lead, or follow in the ISR, is a controller that does not know yet
        assert send_state(broker, A, 1, [1, 2], 1) == KAFKA_STORAGE_ERROR.code
        assert send_state(broker, a1, 2, [2, 1], 1) == KAFKA_STORAGE_ERROR.code
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(reports[1:]) == [([A], True), ([a1], True)]  # (each in a task of its own)
        # one without it in the ISR, or without a leader (the ISR it was the last of), is known
        assert send_state(broker, A, 2, [2], 2) == KAFKA_STORAGE_ERROR.code
        assert send_state(broker, a1, -1, [1], 2) == KAFKA_STORAGE_ERROR.code
        await trio.testing.wait_all_tasks_blocked()
        assert len(reports) == 3
        nursery.cancel_scope.cancel()


def test_the_broker_is_stopped_once_its_last_log_dir_fails(broker, monkeypatch):
    stopped = []
    broker.replica_manager.on_all_dirs_offline = lambda: stopped.append(sorted(broker.log_manager.offline_dirs))
    d1, d2 = broker.log_manager.log_dirs
    FailingDir(monkeypatch, d1)
    assert broker.produce(make_batch(1), tp=A)["error_code"] == KAFKA_STORAGE_ERROR.code
    assert stopped == []  # d2 serves B still
    FailingDir(monkeypatch, d2, "pwrite", errno.EIO)
    assert broker.produce(make_batch(1), tp=B)["error_code"] == KAFKA_STORAGE_ERROR.code
    assert stopped == [[d1, d2]]


async def test_a_replica_without_a_log_while_a_dir_failed_to_load_is_offline_unless_new(tmp_path):
    """A dir that failed while the broker loaded its logs may hold any partition: a replica
    with no log in the dirs left is taken for one of it (KAFKA_STORAGE_ERROR, the controller
    told), unless LeaderAndIsr calls it new (a topic just created, a reassignment's)."""
    (tmp_path / "d1").write_text("")  # no directory: it fails while the logs load
    b = MemoryBroker(1, [str(tmp_path / "d1"), str(tmp_path / "d2")], CONFIG, FakeClock(), start=False)
    reports = []

    async def reporter(tps, offline=False):
        reports.append((sorted(tps), offline))
    b.replica_manager.damage_reporter = reporter
    b.log_manager.startup()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(b.replica_manager.run)
            assert list(b.log_manager.offline_dirs) == [str(tmp_path / "d1")]
            (e,) = lead(b, A).partition_errors
            assert e.error_code == KAFKA_STORAGE_ERROR.code and b.log_manager.get_log(A) is None
            new = PartitionState("b", 0, CONTROLLER_EPOCH, 1, 0, [1], 0, [1], is_new=True)
            (e,) = b.replica_manager.become_leader_or_follower(
                LeaderAndIsrRequest(0, CONTROLLER_EPOCH, 0, [new])).partition_errors
            assert e.error_code == NONE.code and b.log(B).log_dir == str(tmp_path / "d2")
            await trio.testing.wait_all_tasks_blocked()
            assert reports == [([A], True)]
            assert b.produce(make_batch(1), tp=A)["error_code"] == KAFKA_STORAGE_ERROR.code
            assert b.produce(make_batch(1), tp=B)["error_code"] == NONE.code
            nursery.cancel_scope.cancel()
    finally:
        b.close()
