"""ListOffsets "latest" on a leader and a follower: consumers get the leader's HW, the debugging
replica id (-2, Kafka's DEBUGGING_REPLICA_ID) gets the log end offset of whichever replica it
asks, leader or follower (the fault matrix samples every ISR member's LEO this way)."""

from __future__ import annotations

from tests.unit.log.helpers import make_batch, merge_first_two
from tests.unit.replication.memory_leader import TP
from tests.unit.replication.test_fetcher import make_cluster, produce
from tidelog.broker.log.segment import LogSegment
from tidelog.protocol.errors import FENCED_LEADER_EPOCH, NONE, NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION
from tidelog.protocol.messages import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)


async def latest(broker, replica_id: int, current_leader_epoch: int = -1):
    req = ListOffsetsRequest([ListOffsetsTopic(TP.topic, [ListOffsetsPartition(
        TP.partition, LATEST_TIMESTAMP, current_leader_epoch)])], replica_id=replica_id)
    return (await broker.apis.list_offsets(req)).topics[0].partitions[0]


async def test_debugging_replica_id_reads_any_replica(tmp_path, autojump_clock):
    cluster, brokers = make_cluster(str(tmp_path))
    try:
        leader, follower = brokers
        cluster.elect(1)
        produce(leader, 3)
        await cluster.sync()
        produce(leader, 2)  # on the leader only: its LEO 5, the follower's 3, the HW 3
        assert (await latest(leader, CONSUMER_REPLICA_ID)).offset == 3
        assert (await latest(leader, DEBUGGING_REPLICA_ID)).offset == 5
        r = await latest(follower, DEBUGGING_REPLICA_ID)
        assert (r.error_code, r.offset, r.leader_epoch) == (NONE.code, 3, 0)
        # consumers and brokers are answered by the leader only (NOT_LEADER_OR_FOLLOWER; these
        # brokers have no metadata, so the handler reports the partition as unknown)
        for replica_id in (CONSUMER_REPLICA_ID, leader.broker_id):
            r = await latest(follower, replica_id)
            assert r.error_code in (NOT_LEADER_OR_FOLLOWER.code, UNKNOWN_TOPIC_OR_PARTITION.code), r
            assert "not the leader" in r.error_message
        # a stale view of the epoch is fenced on a follower too
        cluster.elect(1)
        assert (await latest(follower, DEBUGGING_REPLICA_ID, 0)).error_code == FENCED_LEADER_EPOCH.code
    finally:
        for b in brokers:
            b.close()


async def test_the_latest_timestamp_above_the_high_watermark_is_no_consumers_answer(tmp_path, autojump_clock):
    # MAX_TIMESTAMP (ListOffsets v7): a consumer is told only of offsets it can fetch
    cluster, brokers = make_cluster(str(tmp_path))
    try:
        leader, _ = brokers
        cluster.elect(1)
        leader.produce(make_batch(1, ts=1_000))
        await cluster.sync()  # the HW is 1
        leader.produce(make_batch(1, ts=5_000))  # the latest timestamp, at offset 1: not committed
        async def latest_timestamp(replica_id: int):
            req = ListOffsetsRequest([ListOffsetsTopic(TP.topic, [ListOffsetsPartition(
                TP.partition, MAX_TIMESTAMP)])], replica_id=replica_id)
            r = (await leader.apis.list_offsets(req)).topics[0].partitions[0]
            return r.error_code, r.offset, r.timestamp

        assert await latest_timestamp(CONSUMER_REPLICA_ID) == (NONE.code, -1, -1)
        assert await latest_timestamp(DEBUGGING_REPLICA_ID) == (NONE.code, 1, 5_000)
        await cluster.sync()  # committed now
        assert await latest_timestamp(CONSUMER_REPLICA_ID) == (NONE.code, 1, 5_000)
    finally:
        for b in brokers:
            b.close()


async def test_the_latest_timestamp_is_found_across_a_segment_swap_during_the_search(tmp_path, monkeypatch):
    # MAX_TIMESTAMP runs in a worker thread while the owner may swap segments (a cleaning,
    # retention): the search starts again on the log's new segments, as other searches by
    # timestamp do, instead of failing with KAFKA_STORAGE_ERROR
    cluster, brokers = make_cluster(str(tmp_path), n=1)
    try:
        leader = brokers[0]
        cluster.elect(1, [1])
        leader.produce(make_batch(1, ts=9_000))  # the latest timestamp, in the first segment
        for n in range(1, 25):
            if n % 10 == 0:
                leader.log().roll()
            leader.produce(make_batch(1, ts=1_000 + n))
        log = leader.log()
        assert len(log.segments) == 3 and log.high_watermark == 25
        swapped = []

        def swap_once(search):
            def interleaved(seg, *args, **kwargs):
                if not swapped:
                    swapped.append(seg)
                    merge_first_two(log)  # the cleaner's swap of the segment being searched
                return search(seg, *args, **kwargs)
            return interleaved
        monkeypatch.setattr(LogSegment, "find_offset_by_timestamp", swap_once(LogSegment.find_offset_by_timestamp))
        req = ListOffsetsRequest([ListOffsetsTopic(TP.topic, [ListOffsetsPartition(TP.partition, MAX_TIMESTAMP)])])
        r = (await leader.apis.list_offsets(req)).topics[0].partitions[0]
        assert swapped and swapped[0] not in log.segments
        assert (r.error_code, r.offset, r.timestamp) == (NONE.code, 0, 9_000)
    finally:
        for b in brokers:
            b.close()
