"""What a refused produce answers besides its error: the log start offset of the partition
when this broker leads it (Kafka's ``processFailedRecord``), -1 when it does not. A Kafka
producer (2.5+) reads it to tell a producer whose records were deleted from a lost
acknowledged write; with -1 it retries the same sequence until its delivery timeout."""

from __future__ import annotations

from tests.unit.replication.memory_leader import TP
from tests.unit.replication.test_fetcher import make_cluster, produce
from tidelog.protocol.errors import (
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    REQUEST_TIMED_OUT,
)
from tidelog.protocol.records import BatchBuilder, build_batch
from tidelog.protocol.topics import TopicPartition


def idempotent(epoch: int, seq: int) -> bytes:
    return build_batch([b"v"], timestamp_ms=1000, producer_id=7, producer_epoch=epoch, base_sequence=seq)


def transactional() -> bytes:
    b = BatchBuilder(producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True)
    b.append(1000, None, b"v")
    return b.build()


async def test_a_refused_produce_carries_the_log_start_offset_of_a_partition_led_here(tmp_path, autojump_clock):
    cluster, brokers = make_cluster(str(tmp_path), n=1)
    try:
        broker = brokers[0]
        cluster.elect(1)
        produce(broker, 5)
        log = broker.log()
        assert log.high_watermark == 5
        log.maybe_increment_log_start_offset(3)
        assert broker.produce(idempotent(2, 0))["error_code"] == NONE.code
        r = broker.produce(idempotent(1, 1))  # an older epoch
        assert (r["error_code"], r["log_start_offset"]) == (INVALID_PRODUCER_EPOCH.code, 3)
        # refused by the records check in a worker thread
        _, refused = await broker.replica_manager.check_in_worker({TP: transactional()})
        assert (refused[TP]["error_code"], refused[TP]["log_start_offset"]) == (INVALID_RECORD.code, 3)
        # appended, then not replicated in time: the log start of the append stays
        results = {TP: broker.produce(idempotent(2, 1))}
        broker.replica_manager.time_out_replication({TP: 5}, 100, results)
        assert (results[TP]["error_code"], results[TP]["log_start_offset"]) == (REQUEST_TIMED_OUT.code, 3)
        # not hosted here: no log start to tell
        r = broker.produce(idempotent(2, 2), tp=TopicPartition("elsewhere", 0))
        assert (r["error_code"], r["log_start_offset"]) == (NOT_LEADER_OR_FOLLOWER.code, -1)
    finally:
        for b in brokers:
            b.close()
