"""A client's Produce to ``__consumer_offsets`` is refused with INVALID_TOPIC_EXCEPTION (as
Kafka refuses appends to internal topics from clients), nothing of it is written, and the
group coordinator's own appends (commits, group metadata) keep working. Through the broker's
API layer over a real ReplicaManager and LogManager (``test_group_coordinator.Broker``)."""

from __future__ import annotations

import pytest

from tests.component.broker.test_group_coordinator import (
    DATA_TP,
    OFFSETS_TP,
    broker,
    commit,
    committed_code,
    fetched,
    form_group,
)
from tidelog.broker.deferred import CLOSE_CONNECTION
from tidelog.broker.groups.group_coordinator import OFFSETS_TOPIC
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import INVALID_TOPIC_EXCEPTION, NONE
from tidelog.protocol.messages import PartitionProduceData, ProduceRequest, TopicProduceData
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import INTERNAL_TOPICS, is_internal_topic

__all__ = ["broker"]  # the fixture, shared with test_group_coordinator


def produce(acks: int, *tps) -> ProduceRequest:
    by_topic: dict[str, list[PartitionProduceData]] = {}
    for tp in tps:
        by_topic.setdefault(tp.topic, []).append(PartitionProduceData(tp.partition, build_batch([b"x", b"y"])))
    return ProduceRequest(acks, 5000, [TopicProduceData(t, ps) for t, ps in by_topic.items()])


def log_end(b, tp) -> int:
    return b.replica_manager.partitions[tp].log.log_end_offset


def responses(r) -> dict:
    return {(t.name, p.index): p for t in r.responses for p in t.partition_responses}


def test_the_internal_topics_are_kafkas():
    assert OFFSETS_TOPIC in INTERNAL_TOPICS and is_internal_topic("__transaction_state")
    assert not is_internal_topic("orders") and not is_internal_topic("__my_topic")


@pytest.mark.parametrize("acks", [-1, 1])
async def test_a_clients_produce_to_consumer_offsets_is_refused_and_writes_nothing(broker, acks):
    before = log_end(broker, OFFSETS_TP)
    r = responses(await broker.call(ApiKey.PRODUCE, produce(acks, OFFSETS_TP, DATA_TP)))
    refused = r[(OFFSETS_TOPIC, 0)]
    assert refused.error_code == INVALID_TOPIC_EXCEPTION.code and refused.base_offset == -1
    assert "internal topic __consumer_offsets" in refused.error_message and "OffsetCommit" in refused.error_message
    assert log_end(broker, OFFSETS_TP) == before
    # the other partition of the same request is appended as usual
    assert r[(DATA_TP.topic, 0)].error_code == NONE.code and log_end(broker, DATA_TP) == 2


async def test_acks_0_to_consumer_offsets_ends_the_connection_and_writes_nothing(broker):
    # no response to carry the refusal: the connection ends instead (Kafka's rule for acks=0)
    before = log_end(broker, OFFSETS_TP)
    assert await broker.call(ApiKey.PRODUCE, produce(0, OFFSETS_TP)) is CLOSE_CONNECTION
    assert log_end(broker, OFFSETS_TP) == before


async def test_the_coordinators_own_appends_still_work(broker):
    await broker.call(ApiKey.PRODUCE, produce(-1, OFFSETS_TP))
    before = log_end(broker, OFFSETS_TP)
    (leader,), generation = await form_group(broker, 1)
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(17, generation, leader.member_id))) == 0
    assert (await fetched(broker))[DATA_TP] == 17
    assert log_end(broker, OFFSETS_TP) > before  # group metadata and the commit, written by the coordinator
