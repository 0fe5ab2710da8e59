"""A replica whose stored batch fails its check on disk (a bit flipped in a closed segment):
it never serves the batch (KAFKA_STORAGE_ERROR, so a client goes to another leader), it is
marked damaged once, keeps its log while it is in the ISR, and once a follower outside the
ISR drops the damaged records and fetches them again, ending byte-identical to the leader.
The controller's side is in tests/unit/controller/test_replica_damage.py."""

from __future__ import annotations

import dataclasses
import os
import struct

import pytest
import trio

from tests.unit.log.helpers import make_batch, open_log, read_records
from tests.unit.replication.memory_leader import TP, MemoryBroker, assert_same_log
from tests.unit.replication.test_fetcher import make_cluster, produce
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.verifier import Pace, first_suspect_offset
from tidelog.broker.replication.partition import DAMAGE_REPORT_INTERVAL_MS, Partition
from tidelog.protocol.errors import (
    CORRUPT_MESSAGE,
    FENCED_LEADER_EPOCH,
    KAFKA_STORAGE_ERROR,
    NONE,
    CorruptRecordError,
)
from tidelog.protocol.messages import FetchPartition, FetchPartitionResponse, FetchRequest, FetchTopic, PartitionState
from tidelog.protocol.records import HEADER_SIZE, iter_headers


@pytest.fixture
def cluster(tmp_path):
    c, brokers = make_cluster(str(tmp_path), n=3)
    yield c
    for b in brokers:
        b.close()


def flip_a_byte_of_batch(log, segment: int, batch: int, at: int = HEADER_SIZE + 3) -> int:
    """Flip one byte of the ``batch``-th batch of the ``segment``-th segment (past its header by
    default, where only the CRC notices); returns that batch's base offset."""
    seg = log.segments[segment]
    with open(seg.log_path, "r+b") as f:
        data = f.read()
        pos, h = list(iter_headers(data))[batch]
        f.seek(pos + at)
        f.write(bytes([data[pos + at] ^ 0x10]))
    return h.base_offset


def small_log(tmp_path, batches: int):
    """A log of ``batches`` 3-record batches in 1,000-byte segments (about 8 batches each)."""
    log = open_log(tmp_path / "p", LogConfig(segment_bytes=1000, index_interval_bytes=100, retention_ms=-1))
    for _ in range(batches):
        log.append_as_leader(make_batch(3), 0)
    return log


async def consumer_fetch(broker: MemoryBroker, offset: int):
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, offset, 1 << 20)])],
                       replica_id=-1, max_wait_ms=0)
    return FetchPartitionResponse.from_body((await broker.replica_manager.fetch(req))[TP])


async def test_a_damaged_batch_is_never_served_and_the_replica_is_repaired_from_another(cluster, autojump_clock):
    cluster.elect(1)
    produce(cluster.leader, 60, records=3)
    await cluster.sync()
    old = cluster.leader
    assert len(old.log().segments) >= 3
    damaged = flip_a_byte_of_batch(old.log(), 1, 1)

    # a read that starts before it stops short of it; one that reaches it gets a retriable error
    before = await consumer_fetch(old, old.log().segments[1].base_offset)
    assert before.error_code == NONE.code and before.records
    r = await consumer_fetch(old, damaged)
    assert r.error_code == KAFKA_STORAGE_ERROR.code and not r.records
    assert f"damaged on disk at offset {damaged}" in r.error_message
    await consumer_fetch(old, damaged)
    assert old.partition().damaged_from == damaged and old.replica_manager.damaged_replicas_found == 1

    # the controller moves leadership off it and takes it out of the ISR; it drops the damaged
    # records and fetches them from the new leader
    leo = old.log().log_end_offset
    cluster.elect(2, isr=[2, 3])
    assert old.log().log_end_offset == damaged and old.partition().damaged_from is None
    produce(cluster.leader, 5)
    await cluster.sync()
    assert_same_log(old.log(), cluster.leader.log())
    assert old.log().log_end_offset == leo + 5
    assert (await consumer_fetch(cluster.leader, damaged)).error_code == NONE.code


async def test_a_damaged_replica_keeps_its_log_while_in_the_isr(cluster, autojump_clock):
    cluster.elect(1)
    produce(cluster.leader, 60, records=3)
    await cluster.sync()
    old = cluster.leader
    damaged = flip_a_byte_of_batch(old.log(), 1, 0)
    await consumer_fetch(old, damaged)
    leo = old.log().log_end_offset
    cluster.elect(2)  # still in the ISR (the controller could not take it out): nothing dropped
    assert old.log().log_end_offset == leo and old.partition().damaged_from == damaged


def damage_second_segments_framing(tmp_path):
    """A log whose second segment's second batch claims a length far beyond the segment: the
    header walk cannot pass it. Returns (log, that segment, that batch's header)."""
    log = small_log(tmp_path, 60)
    second = log.segments[1]
    with open(second.log_path, "r+b") as f:
        data = f.read()
        pos, h = list(iter_headers(data))[1]
        f.seek(pos + 8)
        f.write(struct.pack(">i", 1 << 30))
    return log, second, h


def test_damaged_framing_drops_the_whole_segment(tmp_path):
    log, second, h = damage_second_segments_framing(tmp_path)
    log.flush()
    log.update_high_watermark(log.log_end_offset)
    with pytest.raises(CorruptRecordError):
        log.truncate_to(h.base_offset + 1)
    # the later segments went: what depends on the log's end follows the end there is now
    leo = log.log_end_offset
    assert log.high_watermark <= leo and log.recovery_point <= leo and log.segments[-1] is second
    assert log.truncate_damaged(h.base_offset + 1) == second.base_offset
    assert [r.offset for r in read_records(log)] == list(range(second.base_offset))
    assert [s.base_offset for s in log.segments] == [0]
    log.close()


def test_a_follower_truncation_into_damaged_framing_cuts_more_instead_of_failing(tmp_path):
    # OffsetsForLeaderEpoch (or an out-of-range answer) sets a cut inside a segment whose
    # framing is damaged: the follower drops that segment whole and fetches it again, rather
    # than raising at every round and stalling every partition of its fetcher
    from tidelog.broker.replication.fetcher import truncate_follower
    log, second, h = damage_second_segments_framing(tmp_path)
    truncate_follower(TP, log, h.base_offset + 1)
    assert log.log_end_offset == second.base_offset
    assert [r.offset for r in read_records(log)] == list(range(second.base_offset))
    log.close()


# -- the background verification ------------------------------------------------------------------


def test_the_scan_names_the_offset_after_the_last_good_batch(tmp_path):
    log = small_log(tmp_path, 30)
    seg = log.segments[1]
    assert first_suspect_offset(seg.log_path, seg.base_offset, seg.size) is None
    damaged = flip_a_byte_of_batch(log, 1, 2)
    assert first_suspect_offset(seg.log_path, seg.base_offset, seg.size) == damaged
    stopped = Pace(None)
    stopped.stop()
    assert first_suspect_offset(seg.log_path, seg.base_offset, seg.size, stopped) is None
    assert first_suspect_offset(str(tmp_path / "gone.log"), 0, 100) is None
    log.close()


async def test_a_damaged_follower_is_found_by_the_verification_and_repaired(cluster, autojump_clock):
    cluster.elect(1)
    produce(cluster.leader, 60, records=3)
    await cluster.sync()
    follower = cluster.brokers[3]
    rm = follower.replica_manager
    rm.config = dataclasses.replace(rm.config, verify_interval_ms=1000)
    damaged = flip_a_byte_of_batch(follower.log(), 2, 1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rm._verify_segments)
        with trio.fail_after(10**6):  # virtual seconds: the scan's thread takes real ones
            while follower.partition().damaged_from is None:
                await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert follower.partition().damaged_from == damaged and rm.damaged_replicas_found == 1
    cluster.elect(1, isr=[1, 2])  # what the controller does on the report
    assert follower.log().log_end_offset == damaged
    await cluster.sync()
    assert_same_log(follower.log(), cluster.leader.log())


async def test_a_fetch_sent_before_the_replica_dropped_its_records_is_fenced(cluster, autojump_clock):
    """The controller always writes a new state for a damaged follower (a new leader epoch), so
    a fetch it sent at its old log end, answered after it truncated, cannot take it back into
    the ISR."""
    cluster.elect(1, isr=[1, 2])
    produce(cluster.leader, 60, records=3)
    await cluster.sync()
    follower, leader = cluster.brokers[3], cluster.leader
    damaged = flip_a_byte_of_batch(follower.log(), 1, 1)
    follower.replica_manager._check_suspect(TP, damaged)
    in_flight = follower_fetch_at(follower, cluster.leader_epoch)
    cluster.elect(1, isr=[1, 2])  # the report's new state: a new epoch
    assert follower.log().log_end_offset == damaged
    r = FetchPartitionResponse.from_body((await leader.replica_manager.fetch(in_flight))[TP])
    assert r.error_code == FENCED_LEADER_EPOCH.code
    assert leader.partition().isr_to_expand() is None
    await cluster.sync()
    assert leader.partition().isr_to_expand() == frozenset({1, 2, 3})
    assert_same_log(follower.log(), leader.log())


def follower_fetch_at(follower: MemoryBroker, leader_epoch: int) -> FetchRequest:
    return FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, follower.log().log_end_offset, 1 << 20,
                                                               current_leader_epoch=leader_epoch)])],
                        replica_id=follower.broker_id, max_wait_ms=0, replica_epoch=follower.broker_epoch)


def test_the_damage_is_reported_again_while_it_lasts_and_forgotten_once_cut(tmp_path):
    log = small_log(tmp_path, 30)
    p = Partition(TP, 1)
    p.make_leader(PartitionState(TP.topic, TP.partition, 1, 1, 0, [1, 2], 0, [1, 2]), log, 0)
    assert p.mark_damaged(40, now_ms=1000)
    assert not p.mark_damaged(30, now_ms=1000 + DAMAGE_REPORT_INTERVAL_MS - 1)
    assert p.damage == 30
    assert p.mark_damaged(50, now_ms=1000 + DAMAGE_REPORT_INTERVAL_MS)
    assert p.damage == 30
    log.truncate_to(20)  # e.g. to a new leader's log: the damaged records are gone
    assert p.damage is None
    assert p.mark_damaged(10, now_ms=1001 + DAMAGE_REPORT_INTERVAL_MS)
    log.close()


def test_the_verification_keeps_its_rate():
    now, slept = [0.0], []
    pace = Pace(1000, clock=lambda: now[0])
    pace.stopped.wait = lambda s: slept.append(s) or now.__setitem__(0, now[0] + s)
    for _ in range(4):
        assert pace(500)  # 2,000 bytes at 1,000 bytes/s
    assert sum(slept) == pytest.approx(2.0)
    pace.stop()
    assert not pace(1)


def test_damage_in_the_first_segment_restarts_the_log_at_its_base(tmp_path):
    log = small_log(tmp_path, 30)
    first = log.segments[0]
    with open(first.log_path, "r+b") as f:
        f.seek(8)
        f.write(struct.pack(">i", 1 << 30))  # the very first batch's length
    assert log.truncate_damaged(1) == 0
    assert log.log_end_offset == 0 and log.log_start_offset == 0 and len(log.segments) == 1
    log.close()


async def test_the_only_in_sync_copy_names_the_damage_for_good(cluster, autojump_clock):
    """Nobody to hand over to: CORRUPT_MESSAGE, not a retriable error a consumer would retry
    for ever (the SDK consumer turns it into an error naming the seek past the batch)."""
    cluster.elect(1, isr=[1])
    produce(cluster.leader, 60, records=3)
    damaged = flip_a_byte_of_batch(cluster.leader.log(), 1, 1)
    r = await consumer_fetch(cluster.leader, damaged)
    assert r.error_code == CORRUPT_MESSAGE.code and "fails its CRC check" in r.error_message
    assert cluster.leader.partition().damage == damaged


# -- damage found when the log is loaded ------------------------------------------------------------


def restart_with_a_hole(cluster, broker_id: int) -> tuple[MemoryBroker, range]:
    """Shut broker ``broker_id`` down cleanly, damage a batch of its second segment and remove
    that segment's index (so loading re-reads it), start it again; returns it and the offsets
    its log lost (the hole loading left: flushed data, so the later segments stay)."""
    old = cluster.brokers[broker_id]
    seg = old.log().segments[1]
    upper = old.log().segments[2].base_offset
    old.log_manager.shutdown()
    damaged = flip_a_byte_of_batch_file(seg.log_path, 1)
    os.unlink(seg.log_path[:-len(".log")] + ".index")
    new = MemoryBroker(broker_id, os.path.dirname(os.path.dirname(seg.log_path)), old.config, old.replica_manager.clock)
    new.apis.metadata.registry.broker_epochs = {b: cluster.brokers[b].broker_epoch for b in cluster.brokers}
    cluster.brokers[broker_id] = new
    for other in cluster.brokers.values():
        if other is not new:
            new.fetcher_for(other)
            other.replica_manager.fetchers.pop((broker_id, 0))  # it fetched from the old one
            other.fetcher_for(new)
    assert new.log().damaged_from == damaged
    return new, range(damaged, upper)


def flip_a_byte_of_batch_file(path: str, batch: int, at: int = HEADER_SIZE + 3) -> int:
    with open(path, "r+b") as f:
        data = f.read()
        pos, h = list(iter_headers(data))[batch]
        f.seek(pos + at)
        f.write(bytes([data[pos + at] ^ 0x10]))
    return h.base_offset


async def test_a_hole_left_by_loading_is_reported_and_fetched_again(cluster, autojump_clock):
    cluster.elect(1)
    produce(cluster.leader, 60, records=3)
    await cluster.sync()
    follower, lost = restart_with_a_hole(cluster, 3)
    leo = follower.log().log_end_offset
    cluster.elect(1)  # back in a leader epoch with it still in the ISR: it keeps its log, and reports
    assert follower.partition().damage == lost[0] and follower.replica_manager.damaged_replicas_found == 1
    assert follower.log().log_end_offset == leo
    cluster.elect(1, isr=[1, 2])  # what the controller does on the report
    assert follower.log().log_end_offset == lost[0] and follower.log().damaged_from is None
    await cluster.sync()
    assert_same_log(follower.log(), cluster.leader.log())


async def test_a_follower_fetches_across_a_hole_in_its_leaders_log(cluster, autojump_clock):
    """The only copy left has a hole: a follower fetching at an offset in it gets the next
    batch after it (as from a compacted log), and does not stall there."""
    cluster.elect(1, isr=[1])
    produce(cluster.leader, 60, records=3)
    for b in (2, 3):
        cluster.brokers[b].log().truncate_fully_and_start_at(0)
    leader, lost = restart_with_a_hole(cluster, 1)
    cluster.elect(1, isr=[1])
    assert leader.partition().damage == lost[0]  # reported; with nobody in sync it stays leader
    await cluster.sync()
    for f in cluster.followers:
        assert_same_log(f.log(), leader.log())
        assert f.log().read(lost[0], 1) == leader.log().read(lost[0], 1) != b""
