"""Consumers' delayed fetches (Kafka's DelayedFetch): answered synchronously by the change
that satisfies them, or by the replica manager's timer at max_wait_ms; never by a task."""

from __future__ import annotations

import pytest
import trio

from tests.unit.log.helpers import make_batch
from tests.unit.replication.memory_leader import TP, MemoryBroker
from tests.unit.replication.test_fetcher import make_cluster
from tidelog.broker.deferred import DeferredResponse
from tidelog.broker.replication.replica_manager import DelayedFetch
from tidelog.protocol.errors import NONE, UNKNOWN_TOPIC_OR_PARTITION
from tidelog.protocol.messages import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    StopReplicaPartition,
    StopReplicaRequest,
)


@pytest.fixture
async def leader(tmp_path, nursery):
    cluster, brokers = make_cluster(str(tmp_path), n=1)
    cluster.elect(1, [1])
    broker = brokers[0]
    await nursery.start(broker.replica_manager.run)
    yield broker
    broker.replica_manager._nursery.cancel_scope.cancel()
    for b in brokers:
        b.close()


def consumer_fetch(broker: MemoryBroker, offset: int, max_wait_ms: int = 500, min_bytes: int = 1):
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, offset, 1 << 20, -1)])],
                       max_wait_ms=max_wait_ms, min_bytes=min_bytes)
    return broker.apis.fetch(req)


def attach(deferred: DeferredResponse) -> list:
    answers: list = []
    deferred.attach(answers.append)
    return answers


def partition_result(response: FetchResponse):
    [topic] = response.responses
    [p] = topic.partitions
    return p


async def test_a_fetch_with_records_there_is_answered_at_once(leader):
    leader.produce(make_batch(2))
    response = consumer_fetch(leader, 0)
    assert isinstance(response, FetchResponse)
    assert partition_result(response).records


async def test_the_append_that_satisfies_a_waiting_fetch_answers_it_synchronously(leader):
    deferred = consumer_fetch(leader, 0)
    assert isinstance(deferred, DelayedFetch)
    answers = attach(deferred)
    assert answers == [] and leader.partition().watchers
    leader.produce(make_batch(1))  # no checkpoint between the append and the answer
    [response] = answers
    p = partition_result(response)
    assert p.error_code == NONE.code and p.records and p.high_watermark == 1
    assert not leader.partition().watchers


async def test_an_append_below_min_bytes_leaves_it_waiting_until_max_wait(leader, autojump_clock):
    big = len(make_batch(1)) * 3
    deferred = consumer_fetch(leader, 0, max_wait_ms=300, min_bytes=big)
    answers = attach(deferred)
    leader.produce(make_batch(1))
    assert answers == []
    start = trio.current_time()
    while not answers:
        await trio.sleep(0.01)
    assert trio.current_time() - start == pytest.approx(0.3, abs=0.02)
    assert partition_result(answers[0]).records  # what there is at the deadline


async def test_the_timer_answers_an_empty_fetch_at_max_wait_ms_in_deadline_order(leader, autojump_clock):
    late = attach(consumer_fetch(leader, 0, max_wait_ms=800))
    early = attach(consumer_fetch(leader, 0, max_wait_ms=200))
    await trio.sleep(0.25)
    assert len(early) == 1 and late == []
    assert not partition_result(early[0]).records
    await trio.sleep(0.6)
    assert len(late) == 1


async def test_losing_the_partition_answers_with_an_error(leader):
    answers = attach(consumer_fetch(leader, 0))
    leader.replica_manager.stop_replicas(StopReplicaRequest(
        0, 99, 0, [StopReplicaPartition(TP.topic, TP.partition)]))
    [response] = answers  # NOT_LEADER_OR_FOLLOWER, which Apis reports as UNKNOWN_TOPIC_OR_PARTITION
    assert partition_result(response).error_code == UNKNOWN_TOPIC_OR_PARTITION.code  # (no metadata here)
    assert "not the leader" in partition_result(response).error_message


async def test_a_cancelled_fetch_is_never_answered_and_stops_watching(leader, autojump_clock):
    deferred = consumer_fetch(leader, 0, max_wait_ms=100)
    answers = attach(deferred)
    deferred.cancel()
    assert not leader.partition().watchers
    leader.produce(make_batch(1))
    await trio.sleep(0.5)
    assert answers == []


async def test_without_the_timer_running_a_fetch_waits_in_a_coroutine(tmp_path):
    cluster, brokers = make_cluster(str(tmp_path), n=1)
    try:
        cluster.elect(1, [1])
        waiting = consumer_fetch(brokers[0], 0, max_wait_ms=50)
        assert not isinstance(waiting, DelayedFetch)
        response = await waiting
        assert isinstance(response, FetchResponse)
    finally:
        for b in brokers:
            b.close()



async def test_answered_fetches_with_long_deadlines_are_purged_from_the_timer_heap(leader, autojump_clock):
    """Consumers answered at once every time while asking for a long max_wait_ms must not
    grow the purgatory until their deadlines pass (Kafka purges completed operations)."""
    from tidelog.broker.replication.replica_manager import PURGE_DELAYED_AT
    rm = leader.replica_manager
    answered = 0
    for offset in range(3 * PURGE_DELAYED_AT):
        answers = attach(consumer_fetch(leader, offset, max_wait_ms=3_600_000))
        leader.produce(make_batch(1))
        answered += len(answers)
    assert answered == 3 * PURGE_DELAYED_AT
    assert len(rm._delayed) <= 2 * PURGE_DELAYED_AT + 2
    assert 0 <= rm._delayed_done <= len(rm._delayed)
    waiting = attach(consumer_fetch(leader, 3 * PURGE_DELAYED_AT, max_wait_ms=200))
    await trio.sleep(0.3)  # the timer still answers what is left
    assert len(waiting) == 1
    await trio.sleep(3600)
    assert rm._delayed == [] and rm._delayed_done == 0
