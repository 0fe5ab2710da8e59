"""DeleteRecords through the broker's API layer over a real ReplicaManager and LogManager
(``test_group_coordinator.Broker``, one broker leading its partitions alone): the log start
offset moves to the requested offset (-1: the high watermark), reads below it are out of
range, offsets above the high watermark, internal topics and unknown partitions are refused
with a reason, a topic that does not delete (compact only) is POLICY_VIOLATION, and an
in-sync follower on a live broker that does not follow makes it REQUEST_TIMED_OUT."""

from __future__ import annotations

import dataclasses

import pytest

from tests.component.broker.test_group_coordinator import DATA_TP, broker
from tests.component.broker.test_internal_topics import produce
from tidelog.broker.groups.group_coordinator import OFFSETS_TOPIC
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    INVALID_TOPIC_EXCEPTION,
    NONE,
    OFFSET_OUT_OF_RANGE,
    POLICY_VIOLATION,
    REQUEST_TIMED_OUT,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tidelog.protocol.messages import (
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    LeaderAndIsrRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    LiveBroker,
    PartitionState,
    UpdateMetadataRequest,
)

__all__ = ["broker"]  # the fixture, shared with test_group_coordinator


def delete(*specs, timeout_ms=1000) -> DeleteRecordsRequest:
    by_topic: dict[str, list[DeleteRecordsPartition]] = {}
    for topic, partition, offset in specs:
        by_topic.setdefault(topic, []).append(DeleteRecordsPartition(partition, offset))
    return DeleteRecordsRequest([DeleteRecordsTopic(t, ps) for t, ps in by_topic.items()], timeout_ms)


def results(r) -> dict:
    return {(t.name, p.partition_index): p for t in r.topics for p in t.partitions}


async def earliest(b) -> int:
    r = await b.call(ApiKey.LIST_OFFSETS, ListOffsetsRequest([ListOffsetsTopic(DATA_TP.topic, [
        ListOffsetsPartition(DATA_TP.partition, -2)])]))
    return r.topics[0].partitions[0].offset


async def test_records_below_the_offset_are_deleted_and_reads_below_it_are_out_of_range(broker):
    for _ in range(3):
        await broker.call(ApiKey.PRODUCE, produce(1, DATA_TP))  # 2 records each: offsets 0-5
    log = broker.replica_manager.partitions[DATA_TP].log
    assert log.high_watermark == 6
    r = results(await broker.call(ApiKey.DELETE_RECORDS, delete((DATA_TP.topic, 0, 3))))[(DATA_TP.topic, 0)]
    assert (r.error_code, r.low_watermark) == (NONE.code, 3)
    assert log.log_start_offset == 3 and await earliest(broker) == 3
    with pytest.raises(Exception, match="log start offset 3"):
        log.read(1, 1000)
    # a smaller offset changes nothing; -1 means the high watermark
    r = results(await broker.call(ApiKey.DELETE_RECORDS, delete((DATA_TP.topic, 0, 1))))[(DATA_TP.topic, 0)]
    assert (r.error_code, r.low_watermark) == (NONE.code, 3)
    r = results(await broker.call(ApiKey.DELETE_RECORDS, delete((DATA_TP.topic, 0, -1))))[(DATA_TP.topic, 0)]
    assert (r.error_code, r.low_watermark) == (NONE.code, 6) and await earliest(broker) == 6


async def test_a_compacted_topic_refuses_with_policy_violation(broker):
    await broker.call(ApiKey.PRODUCE, produce(1, DATA_TP))
    log = broker.replica_manager.partitions[DATA_TP].log
    log.config = dataclasses.replace(log.config, cleanup_policy="compact")
    r = results(await broker.call(ApiKey.DELETE_RECORDS, delete((DATA_TP.topic, 0, 1))))[(DATA_TP.topic, 0)]
    assert r.error_code == POLICY_VIOLATION.code and "cleanup.policy" in r.error_message
    assert log.log_start_offset == 0


async def test_bad_requests_are_refused_with_a_reason_and_change_nothing(broker):
    await broker.call(ApiKey.PRODUCE, produce(1, DATA_TP))
    r = results(await broker.call(ApiKey.DELETE_RECORDS, delete(
        (DATA_TP.topic, 0, 3), (DATA_TP.topic, 7, 0), ("nosuch", 0, 0), (OFFSETS_TOPIC, 0, 0))))
    above = r[(DATA_TP.topic, 0)]
    assert above.error_code == OFFSET_OUT_OF_RANGE.code and "high watermark 2" in above.error_message
    assert r[(DATA_TP.topic, 7)].error_code == UNKNOWN_TOPIC_OR_PARTITION.code
    assert r[("nosuch", 0)].error_code == UNKNOWN_TOPIC_OR_PARTITION.code
    internal = r[(OFFSETS_TOPIC, 0)]
    assert internal.error_code == INVALID_TOPIC_EXCEPTION.code and OFFSETS_TOPIC in internal.error_message
    assert broker.replica_manager.partitions[DATA_TP].log.log_start_offset == 0


async def test_an_in_sync_follower_that_does_not_follow_times_the_request_out(broker):
    # broker 2 is in the ISR but never fetches: it never reports a log start offset
    broker.replica_manager.become_leader_or_follower(LeaderAndIsrRequest(1, 1, 0, [
        PartitionState(DATA_TP.topic, DATA_TP.partition, 1, 1, 2, [1, 2], 2, [1, 2])]))
    # while broker 2 is not alive (not in the metadata), it is not waited for, as in Kafka
    r = results(await broker.call(ApiKey.DELETE_RECORDS, delete((DATA_TP.topic, 0, 0), timeout_ms=5000)))
    assert (r[(DATA_TP.topic, 0)].error_code, r[(DATA_TP.topic, 0)].low_watermark) == (NONE.code, 0)
    broker.metadata.update(UpdateMetadataRequest(1, 1, 0, [], [LiveBroker(1, "127.0.0.1", 9092),
                                                               LiveBroker(2, "127.0.0.1", 9093)]))
    r = results(await broker.call(ApiKey.DELETE_RECORDS, delete((DATA_TP.topic, 0, 0), timeout_ms=100)))
    timed_out = r[(DATA_TP.topic, 0)]
    assert timed_out.error_code == REQUEST_TIMED_OUT.code and timed_out.low_watermark == -1
    assert "did not all follow within 100 ms" in timed_out.error_message


async def test_list_offsets_by_timestamp_answers_and_refuses_a_partition_named_twice(broker):
    """Found by the fuzzer: one ListOffsets naming a partition 14,592 times, each a search
    by timestamp (a segment scan), held the broker for half a minute. Kafka answers a
    partition named twice INVALID_REQUEST; so does Tidelog, and searches run off the loop."""
    from tidelog.protocol.errors import INVALID_REQUEST

    await broker.call(ApiKey.PRODUCE, produce(1, DATA_TP))  # records without a timestamp
    once = await broker.call(ApiKey.LIST_OFFSETS, ListOffsetsRequest([ListOffsetsTopic(DATA_TP.topic, [
        ListOffsetsPartition(DATA_TP.partition, 0)])]))
    assert once.topics[0].partitions[0].error_code == NONE.code and once.topics[0].partitions[0].offset == -1
    twice = await broker.call(ApiKey.LIST_OFFSETS, ListOffsetsRequest([ListOffsetsTopic(DATA_TP.topic, [
        ListOffsetsPartition(DATA_TP.partition, 0)] * 10_000)]))
    codes = {p.error_code for p in twice.topics[0].partitions}
    assert codes == {INVALID_REQUEST.code} and len(twice.topics[0].partitions) == 10_000
    assert "named 10000 times" in twice.topics[0].partitions[0].error_message
