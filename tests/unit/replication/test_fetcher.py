"""Follower reconciliation with no sockets (Kafka's AbstractFetcherThreadTest.testTruncation).

Every broker here is a ``MemoryBroker``: real logs in a temp dir, the real replica manager
and the real Fetch / OffsetsForLeaderEpoch handlers; only the network is missing. Histories
are made the way a cluster makes them: the controller elects a leader with a new epoch
(``Partition.make_leader`` starts the epoch at the leader's LEO), the leader appends producer
batches, followers copy some or all of them. A diverged follower then runs its fetcher
(``maybe_truncate`` + ``fetch_once``) until it equals the leader byte for byte.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.log.helpers import FakeClock, make_batch, open_log, read_batches
from tests.unit.replication.memory_leader import (
    CONTROLLER_EPOCH,
    TP,
    MemoryBroker,
    MemoryCluster,
    assert_same_log,
    log_bytes,
    scratch_dir,
)
from tidelog.broker.log.config import LogConfig
from tidelog.broker.replication.fetcher import truncation_target
from tidelog.protocol.errors import FENCED_LEADER_EPOCH, NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_LEADER_EPOCH, TidelogError
from tidelog.protocol.messages import FetchPartition, FetchRequest, FetchTopic, PartitionState
from tidelog.protocol.topics import TopicPartition

# Every async test runs on trio's autojump clock (the ``autojump_clock`` argument): fetcher
# backoffs pass in virtual time, so a fetcher that backs off forever fails fast.

BACKOFF_S = 1.0


def make_cluster(root: str, n: int = 2, config: LogConfig | None = None, **fetcher_config):
    clock = FakeClock()
    config = config or LogConfig(segment_bytes=1000, index_interval_bytes=100, retention_ms=-1)
    brokers = [MemoryBroker(i, f"{root}/broker-{i}", config, clock) for i in range(1, n + 1)]
    fetcher_config.setdefault("backoff_s", BACKOFF_S)
    return MemoryCluster(brokers, **fetcher_config), brokers


@pytest.fixture
def cluster(tmp_path):
    c, brokers = make_cluster(str(tmp_path), partition_max_bytes=1)  # one batch per fetch
    yield c
    for b in brokers:
        b.close()


def produce(broker: MemoryBroker, n_batches: int, records: int = 1) -> None:
    for _ in range(n_batches):
        r = broker.produce(make_batch(records))
        assert r["error_code"] == NONE.code, r


async def reconcile(cluster: MemoryCluster) -> None:
    await cluster.sync()
    for f in cluster.followers:
        assert_same_log(f.log(), cluster.leader.log())


# -- truncation_target, the pure rule --------------------------------------------------------


async def test_truncation_target_rules(cluster, autojump_clock):
    a = cluster.brokers[1]
    cluster.elect(1)  # epoch 0 on [0, 3)
    produce(a, 3)
    cluster.elect(1)  # epoch 1 on [3, 5)
    produce(a, 2)
    log = a.log()
    log.update_high_watermark(2)
    assert truncation_target(log, -1, -1) == (2, True)  # leader knows nothing: the HW
    assert truncation_target(log, 1, 4) == (4, True)  # same epoch, leader ends earlier
    assert truncation_target(log, 1, 9) == (5, True)  # same epoch, leader ends later: our end
    assert truncation_target(log, 0, 2) == (2, True)
    assert truncation_target(log, 0, 3) == (3, True)
    log.epoch_cache.assign(4, 5)  # an epoch we hold with no batch, and one we never had
    assert truncation_target(log, 3, 5) == (5, False)  # cut to our end of epoch <= 3, ask again


# -- testTruncation-style reconciliations ----------------------------------------------------


async def test_follower_ahead_in_an_old_epoch_truncates_to_the_divergence_not_the_hw(cluster, autojump_clock):
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(1)  # epoch 0: a leads
    produce(a, 3)
    await cluster.sync()
    produce(a, 2)  # [3, 5): b copies only offset 3
    await cluster.fetch_round(b)
    assert (a.log().log_end_offset, a.log().high_watermark) == (5, 3)
    assert (b.log().log_end_offset, b.log().high_watermark) == (4, 3)

    cluster.elect(2, isr=[2])  # epoch 1: b leads; a is ahead in epoch 0 at [4, 5)
    produce(b, 2, records=3)  # [4, 10) in epoch 1
    kept = read_batches(a.log(), 0, max_offset=4)
    f = cluster.fetcher(a)
    await f.maybe_truncate()
    assert a.log().log_end_offset == 4, "to where b's epoch 0 ends, keeping offset 3 above a's HW"
    assert not f.partitions[TP].truncating
    assert read_batches(a.log()) == kept
    await f.fetch_once()  # [4, 7), b's first epoch-1 batch
    assert a.log().log_end_offset == 7 and a.log().epoch_cache.entries == [(0, 0), (1, 4)]
    await reconcile(cluster)
    assert a.log().epoch_cache.entries == [(0, 0), (1, 4)]


async def test_follower_missing_an_epoch_the_leader_has(cluster, autojump_clock):
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(1)  # epoch 0: a writes [0, 2), b copies
    produce(a, 2)
    await cluster.sync()
    cluster.elect(2, isr=[2])  # epoch 1: b writes [2, 4); a never sees it
    produce(b, 2)
    cluster.elect(1, isr=[1])  # epoch 2: a (unclean) writes [2, 3); b never sees it
    produce(a, 1)
    cluster.elect(2, isr=[2])  # epoch 3: b writes [4, 5)
    produce(b, 1)
    assert b.log().epoch_cache.entries == [(0, 0), (1, 2), (3, 4)]
    assert a.log().epoch_cache.entries == [(0, 0), (2, 2)]
    f = cluster.fetcher(a)
    # a asks for epoch 2; b answers (1, 4): an epoch a never had, so a cuts to its own end of
    # epoch 0 and asks again; b answers (0, 2); a keeps [0, 2)
    await f.maybe_truncate()
    assert a.log().log_end_offset == 2 and f.partitions[TP].truncating
    await f.maybe_truncate()
    assert a.log().log_end_offset == 2 and not f.partitions[TP].truncating
    await reconcile(cluster)
    assert a.log().epoch_cache.entries == [(0, 0), (1, 2), (3, 4)]


async def test_epoch_led_without_batches_does_not_refuse_the_new_leaders_older_batches(cluster, autojump_clock):
    """A broker that led an epoch without writing keeps that epoch in its cache, starting at
    its LEO. Following a leader whose log holds an older epoch there, it must still take the
    leader's batches (found by Hypothesis: the follower looped on a refused append)."""
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(2, isr=[2])  # epoch 0: b writes offset 0
    produce(b, 1)
    cluster.elect(1, isr=[1])  # epoch 1: a leads (unclean) and writes nothing
    assert a.log().epoch_cache.entries == [(1, 0)]
    cluster.elect(2, isr=[2])  # epoch 2: b again
    await reconcile(cluster)
    assert a.log().epoch_cache.entries == [(0, 0)]


async def test_epoch_led_without_batches_above_a_common_prefix_ends_truncation(cluster, autojump_clock):
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(1)  # epoch 0: a writes [0, 2), b copies
    produce(a, 2)
    await cluster.sync()
    cluster.elect(2, isr=[2])  # epoch 1: b writes [2, 4)
    produce(b, 2)
    cluster.elect(1, isr=[1])  # epoch 2: a leads at its LEO 2 and writes nothing
    cluster.elect(2, isr=[2])  # epoch 3: b writes [4, 5)
    produce(b, 1)
    f = cluster.fetcher(a)
    for _ in range(3):
        await f.maybe_truncate()
    assert not f.partitions[TP].truncating, "a keeps asking about the epoch it led without writing"
    assert a.log().log_end_offset == 2
    await reconcile(cluster)


async def test_leader_without_epoch_information_follower_truncates_to_its_hw(cluster, autojump_clock):
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(1)
    produce(a, 4)
    await cluster.sync()  # both hold [0, 4), HW 4
    produce(a, 2)  # [4, 6) only on a
    cluster.elect(2)
    b.log().epoch_cache.clear()  # a leader that tracks no epochs (a pre-epoch log format)
    assert b.log().end_offset_for_epoch(0) == (-1, -1)
    f = cluster.fetcher(a)
    await f.maybe_truncate()
    assert a.log().log_end_offset == 4 == a.log().high_watermark  # the HW: all it can trust
    assert not f.partitions[TP].truncating
    produce(b, 2)
    await cluster.sync()
    assert log_bytes(a.log()) == log_bytes(b.log())
    assert (a.log().log_end_offset, a.log().high_watermark) == (b.log().log_end_offset, b.log().high_watermark)


async def test_empty_follower_copies_every_epoch(cluster, autojump_clock):
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(1, isr=[1])
    produce(a, 3, records=2)
    cluster.elect(1, isr=[1])
    produce(a, 2, records=3)
    cluster.elect(1, isr=[1])  # an epoch with no batches yet
    assert b.log().log_end_offset == 0
    await reconcile(cluster)
    assert b.log().epoch_cache.entries == [(0, 0), (1, 6)]


async def test_empty_follower_of_an_empty_leader(cluster, autojump_clock):
    cluster.elect(1)
    await reconcile(cluster)
    assert cluster.brokers[2].log().log_end_offset == 0


@pytest.mark.parametrize("follower_has", [0, 2])
async def test_follower_behind_the_leader_log_start_restarts_there(tmp_path, follower_has, autojump_clock):
    config = LogConfig(segment_bytes=300, index_interval_bytes=50, retention_ms=-1)
    cluster, brokers = make_cluster(str(tmp_path), config=config)
    a, b = brokers
    cluster.elect(1)
    produce(a, follower_has)
    await cluster.sync()
    cluster.elect(1, isr=[1])  # b drops out; a alone moves the HW
    produce(a, 20, records=2)
    log = a.log()
    assert len(log.segments) > 3
    log.maybe_increment_log_start_offset(log.segments[2].base_offset)
    assert log.delete_old_segments()
    start = log.log_start_offset
    assert start > b.log().log_end_offset
    await cluster.fetch_round(b)  # OFFSET_OUT_OF_RANGE below the log start: restart the log there
    assert b.log().log_start_offset == start
    await reconcile(cluster)
    for x in brokers:
        x.close()


async def test_follower_log_start_inside_a_leader_batch_restarts_at_the_batch(cluster, autojump_clock):
    """A diverged follower whose own retention put its log start inside one of the leader's
    batches truncates fully to that start; the leader's batch then begins below the follower's
    LEO. Kafka restarts the empty log at the batch's base offset (Partition's
    UnexpectedAppendOffsetException handling); refusing it loops forever (found by Hypothesis)."""
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(1)  # epoch 0: a writes [0, 3) and [3, 6); b copies [0, 3)
    produce(a, 2, records=3)
    await cluster.fetch_round(b)
    assert b.log().log_end_offset == 3
    cluster.elect(2, isr=[2])  # epoch 1: b (unclean) writes [3, 4), [4, 5) in two segments
    produce(b, 1)
    b.log().roll()
    produce(b, 1)
    assert b.log().maybe_increment_log_start_offset(4) and b.log().delete_old_segments()
    cluster.elect(1)  # epoch 2: a again; b's epoch 1 data diverged, and b's log starts at 4
    produce(a, 1)
    await cluster.sync()
    assert b.log().log_start_offset == 3
    assert_same_log(b.log(), a.log(), same_start=False)


async def test_follower_adopts_the_leader_log_start_over_its_diverged_prefix(tmp_path, autojump_clock):
    """A follower that keeps records the leader has already deleted keeps them only if they
    are the leader's. Here they are not: the leader's epoch-end answer for an epoch below its
    log start is its log start (Kafka's, knowingly inexact), so the follower keeps its own
    diverged records below it. Kafka's follower adopts the leader's log start offset from
    every fetch, so they are never served (found by Hypothesis)."""
    config = LogConfig(segment_bytes=250, index_interval_bytes=50, retention_ms=-1)
    cluster, (a, b) = make_cluster(str(tmp_path), config=config, partition_max_bytes=1)
    cluster.elect(1)  # epoch 0: a writes [0, 2), b copies; then a writes [2, 8) alone (acks=1)
    produce(a, 2)
    await cluster.sync()
    produce(a, 6)
    cluster.elect(2, isr=[2])  # epoch 1: b (in the ISR: clean) writes [2, 14); retention moves
    # its log start into [3, 8]: a's epoch 0 ends there, as far as b can tell
    produce(b, 12)
    log = b.log()
    start = max(s.base_offset for s in log.segments if s.base_offset <= 8)
    assert start > 2
    assert log.maybe_increment_log_start_offset(start) and log.delete_old_segments()
    await reconcile(cluster)  # same log start, bytes, LEO, HW and epochs
    for x in (a, b):
        x.close()


async def test_follower_beyond_a_shorter_leader_log_truncates_to_the_leader_hw(tmp_path, autojump_clock):
    """A follower whose log was restarted at a former leader's log start holds no epochs, so its
    truncation falls back to its HW, which is beyond the LEO of a new (unclean) leader with a
    shorter log. Its fetch is then out of range above the leader's log end: Kafka truncates to
    the leader's end; asking about epochs again loops forever (found by Hypothesis)."""
    cluster, (a, b, c) = make_cluster(str(tmp_path), 3, partition_max_bytes=1)
    cluster.elect(1, isr=[1])  # epoch 0: a writes [0, 1)
    produce(a, 1)
    cluster.elect(1, isr=[1])  # epoch 1: a writes [1, 4), a segment starting at 3
    produce(a, 2)
    a.log().roll()
    produce(a, 1)
    await cluster.fetch_round(b)  # b copies [0, 1)
    assert a.log().maybe_increment_log_start_offset(3) and a.log().delete_old_segments()
    cluster.elect(1, isr=[1])  # epoch 2: b is below a's log start: it restarts its log at 3
    await cluster.fetch_round(b)
    assert (b.log().log_start_offset, b.log().log_end_offset, b.log().latest_epoch) == (3, 3, -1)
    cluster.elect(3, isr=[3])  # epoch 3: c, with an empty log, leads (unclean)
    await reconcile(cluster)
    assert [x.log().log_end_offset for x in (a, b, c)] == [0, 0, 0]
    for x in (a, b, c):
        x.close()


# -- fencing ---------------------------------------------------------------------------------


def snapshot(broker: MemoryBroker):
    log = broker.log()
    return log.log_start_offset, log.log_end_offset, log.high_watermark, log_bytes(log), log.epoch_cache.entries


async def _diverged(cluster: MemoryCluster):
    """b leads epoch 0 and holds [2, 4), which a lacks: b following a would truncate there."""
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(2)  # epoch 0: b leads
    produce(b, 2)
    await cluster.sync()
    produce(b, 2)  # only on b
    return a, b


async def test_fenced_epoch_in_offsets_for_leader_epoch_backs_off_without_truncating(cluster, autojump_clock):
    a, b = await _diverged(cluster)
    st = cluster.elect(1, to=[1])  # epoch 1 reaches a only
    cluster.elect(1, to=[1])  # and epoch 2 too: b will follow a at epoch 1, a is at 2
    cluster.send(b, st)  # b follows a at the stale epoch 1
    f = cluster.fetcher(b)
    before, requests, fetches = snapshot(b), a.epoch_requests, a.fetch_requests
    await cluster.fetch_round(b)
    assert a.epoch_requests == requests + 1
    assert snapshot(b) == before
    assert f.partitions[TP].truncating and f.partitions[TP].retry_at > trio.current_time()
    await cluster.fetch_round(b)  # backing off: no request at all
    assert (a.epoch_requests, a.fetch_requests) == (requests + 1, fetches)
    await trio.sleep(BACKOFF_S)
    await cluster.fetch_round(b)  # still fenced after the backoff: still untouched
    assert snapshot(b) == before and a.epoch_requests == requests + 2


async def test_unknown_leader_epoch_backs_off_then_reconciles(cluster, autojump_clock):
    a, b = await _diverged(cluster)
    cluster.elect(1, isr=[1])  # epoch 1: a leads, to b too
    st = cluster.elect(1, to=[2])  # epoch 2 reaches b first: a does not know it yet
    f = cluster.fetcher(b)
    before = snapshot(b)
    await cluster.fetch_round(b)
    assert snapshot(b) == before and f.partitions[TP].truncating
    assert f.partitions[TP].retry_at > trio.current_time()
    cluster.send(a, st)  # a catches up with the controller
    await trio.sleep(BACKOFF_S)
    await reconcile(cluster)
    assert b.log().log_end_offset == 2


async def test_fenced_epoch_in_fetch_backs_off_without_touching_log_or_leader_state(cluster, autojump_clock):
    a, b = cluster.brokers[1], cluster.brokers[2]
    cluster.elect(1)
    produce(a, 3)
    await cluster.sync()
    produce(a, 2)
    cluster.elect(1, to=[1])  # a moves to epoch 1; b still fetches at epoch 0
    f = cluster.fetcher(b)
    assert not f.partitions[TP].truncating
    before, remote = snapshot(b), a.partition().remote[2]
    await cluster.fetch_round(b)
    assert snapshot(b) == before
    assert a.partition().remote[2] == remote  # a fenced fetch is not a follower fetch
    st = f.partitions[TP]
    assert not st.truncating and st.retry_at > trio.current_time()
    fetches = a.fetch_requests
    await cluster.fetch_round(b)
    assert a.fetch_requests == fetches


async def test_fetch_beyond_the_leader_log_end_is_not_a_caught_up_follower(cluster, autojump_clock):
    """A follower fetching past the leader's LEO holds records the leader does not: Kafka
    records no fetch state for a read that failed, so it neither counts as caught up nor
    becomes eligible for the ISR."""
    a = cluster.brokers[1]
    cluster.elect(1, isr=[1])
    produce(a, 3)
    p = a.partition()
    remote = p.remote[2]
    req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, 7, current_leader_epoch=0)])],
                       replica_id=2, max_wait_ms=0, replica_epoch=cluster.brokers[2].broker_epoch)
    resp = await a.fetch(req)
    assert resp.responses[0].partitions[0].error_code == OFFSET_OUT_OF_RANGE.code
    assert p.remote[2] == remote
    assert p.isr_to_expand() is None


async def test_an_isr_expansion_is_decided_again_when_its_write_runs(tmp_path, autojump_clock):
    """Follower 3's fetch qualifies it for the ISR at the HW then; before the write runs,
    follower 2's fetch moves the HW past 3's log end: 3 must not join (an ISR member holds
    everything below the HW)."""
    c, brokers = make_cluster(str(tmp_path), n=3)
    try:
        a = brokers[0]
        c.elect(1, isr=[1, 2])
        produce(a, 5)

        async def fetch_as(replica: int, offset: int) -> None:
            req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, offset, current_leader_epoch=0)])],
                               replica_id=replica, max_wait_ms=0, replica_epoch=brokers[replica - 1].broker_epoch)
            await a.fetch(req)

        await fetch_as(2, 2)
        await fetch_as(3, 2)
        p = a.partition()
        decided = p.isr_to_expand()
        assert decided == {1, 2, 3} and p.log.high_watermark == 2
        await fetch_as(2, 5)  # the HW moves to 5; 3 is still at 2
        written = []

        async def writer(tp, isr, epoch, controller_epoch, version):
            written.append(isr)
            return version + 1

        a.replica_manager.isr_writer = writer
        await a.replica_manager._write_isr(p, decided, "expand", p.leader_epoch, p.zk_version)
        assert written == [] and p.isr == {1, 2}
        await fetch_as(3, 5)  # caught up now: it joins
        await a.replica_manager._write_isr(p, p.isr_to_expand(), "expand", p.leader_epoch, p.zk_version)
        assert written == [[1, 2, 3]] and p.isr == {1, 2, 3}
    finally:
        for b in brokers:
            b.close()


async def test_a_stale_isr_write_failing_late_leaves_a_newer_write_pending(tmp_path, autojump_clock):
    """W1 (epoch 0) is in flight when the controller moves the partition to epoch 1; W2,
    decided at epoch 1, starts; W1's conflict then comes back. It must not clear W2's
    pending ISR (the HW would pass follower 3 while W2 writes 3 into the ISR), and W2's
    success must be applied: the leader's ISR is ZooKeeper's."""
    c, brokers = make_cluster(str(tmp_path), n=3)
    a = brokers[0]
    try:
        c.elect(1, isr=[1, 2])  # epoch 0, version 0
        produce(a, 5)

        async def fetch_as(replica, offset, epoch):
            req = FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, offset, current_leader_epoch=epoch)])],
                               replica_id=replica, max_wait_ms=0, replica_epoch=brokers[replica - 1].broker_epoch)
            return await a.fetch(req)

        await fetch_as(2, 5, 0)
        await fetch_as(3, 5, 0)
        p = a.partition()
        zk = {"isr": [1, 2], "version": 0}
        release = {0: trio.Event(), 1: trio.Event()}

        async def writer(tp, isr, epoch, controller_epoch, version):
            await release[epoch].wait()
            if version != zk["version"]:
                raise TidelogError("version conflict")
            zk.update(isr=isr, version=version + 1)
            return version + 1

        a.replica_manager.isr_writer = writer
        async with trio.open_nursery() as n:
            n.start_soon(a.replica_manager._write_isr, p, frozenset({1, 2, 3}), "expand", 0, 0)
            await trio.testing.wait_all_tasks_blocked()
            c.elect(1, isr=[1, 2])  # epoch 1; the controller wrote version 1
            zk.update(isr=[1, 2], version=1)
            await fetch_as(2, 5, 1)
            await fetch_as(3, 5, 1)
            n.start_soon(a.replica_manager._write_isr, p, frozenset({1, 2, 3}), "expand", 1, 1)
            await trio.testing.wait_all_tasks_blocked()
            release[0].set()  # W1 fails
            await trio.testing.wait_all_tasks_blocked()
            assert p.pending_isr == {1, 2, 3}
            produce(a, 5)
            await fetch_as(2, 10, 1)
            assert p.log.high_watermark == 5  # follower 3, maybe in the ISR, holds 5
            release[1].set()
        assert sorted(p.isr) == zk["isr"] == [1, 2, 3] and p.zk_version == zk["version"] == 2
    finally:
        for b in brokers:
            b.close()


async def test_a_partition_behind_a_busy_one_is_not_starved(tmp_path, autojump_clock):
    """Only the first partition of a fetch that returns data may exceed its max bytes: one
    whose next batch is larger than that, behind a partition that has data every time, gets
    its turn (the fetched partitions go to the end of the next request, as in Kafka)."""
    busy = TopicPartition("a-topic", 0)
    config = LogConfig(segment_bytes=1 << 22, retention_ms=-1, max_message_bytes=4 << 20)
    brokers = [MemoryBroker(i, f"{tmp_path}/b{i}", config, FakeClock()) for i in (1, 2)]
    c = MemoryCluster(brokers, partition_max_bytes=1000)
    leader, follower = brokers
    try:
        for tp in (busy, TP):  # the busy partition first in the fetcher's order
            st = PartitionState(tp.topic, tp.partition, CONTROLLER_EPOCH, 1, 0, [1, 2], 0, [1, 2])
            for b in brokers:
                c.send(b, st)
        c.leader_id = 1
        f = c.fetcher(follower)
        leader.produce(make_batch(1, size=5000), tp=TP)  # larger than partition_max_bytes
        for _ in range(5):
            leader.produce(make_batch(1), tp=busy)
            await f.maybe_truncate()
            await f.fetch_once()
        assert follower.log(TP).log_end_offset == leader.log(TP).log_end_offset == 1
    finally:
        for b in brokers:
            b.close()


async def test_a_follower_copies_a_batch_larger_than_its_max_message_bytes_and_fetch_size(tmp_path, autojump_clock):
    """The leader accepted the batch: a follower whose max.message.bytes is lower (lowered
    since, or grown by the cleaner's delete horizon) and whose replica.fetch.max.bytes is
    smaller still copies it whole, as Kafka's does."""
    leader_config = LogConfig(segment_bytes=1 << 20, retention_ms=-1)
    follower_config = LogConfig(segment_bytes=1 << 20, retention_ms=-1, max_message_bytes=2000)
    leader = MemoryBroker(1, f"{tmp_path}/b1", leader_config, FakeClock())
    follower = MemoryBroker(2, f"{tmp_path}/b2", follower_config, FakeClock())
    c = MemoryCluster([leader, follower], partition_max_bytes=1000)
    try:
        st = PartitionState(TP.topic, TP.partition, CONTROLLER_EPOCH, 1, 0, [1, 2], 0, [1, 2])
        for b in (leader, follower):
            c.send(b, st)
        c.leader_id = 1
        assert leader.produce(make_batch(1, size=3000))["error_code"] == NONE.code
        f = c.fetcher(follower)
        await f.maybe_truncate()
        await f.fetch_once()
        assert_same_log(follower.log(), leader.log())
    finally:
        for b in (leader, follower):
            b.close()


async def test_fencing_error_codes_from_the_leader(cluster, autojump_clock):
    a = cluster.brokers[1]
    cluster.elect(1)
    cluster.elect(1)  # epoch 1

    async def epoch_answer(current: int) -> int:
        from tidelog.protocol.messages import (
            OffsetForLeaderPartition,
            OffsetForLeaderTopic,
            OffsetsForLeaderEpochRequest,
        )
        r = await a.offsets_for_leader_epoch(OffsetsForLeaderEpochRequest(
            [OffsetForLeaderTopic(TP.topic, [OffsetForLeaderPartition(TP.partition, 0, current)])], replica_id=2))
        return r.topics[0].partitions[0].error_code
    assert await epoch_answer(0) == FENCED_LEADER_EPOCH.code
    assert await epoch_answer(2) == UNKNOWN_LEADER_EPOCH.code
    assert await epoch_answer(1) == NONE.code
    assert await epoch_answer(-1) == NONE.code


# -- random histories ------------------------------------------------------------------------

terms = st.lists(st.tuples(
    st.integers(0, 2),  # the leader of this epoch (index into the brokers)
    st.booleans(),  # elected with every replica in the ISR (else alone: an unclean election)
    st.lists(st.integers(1, 3), max_size=8),  # its batches (records in each)
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 4)), max_size=3),  # (follower, fetch rounds)
    st.integers(0, 2),  # segments the leader then deletes below its HW (retention)
), min_size=1, max_size=8)


@settings(max_examples=60)
@given(n_brokers=st.integers(2, 3), history=terms, final_leader=st.integers(0, 2),
       partition_max_bytes=st.sampled_from([1, 150, 1 << 20]), segment_bytes=st.sampled_from([250, 600, 1 << 20]))
def test_random_leader_changes_then_reconcile(n_brokers, history, final_leader, partition_max_bytes, segment_bytes):
    """Any history of leader epochs (clean or unclean elections, each leader appending under
    its own epoch, followers copying some of it between appends, retention on the leader):
    after the followers reconcile, each is the leader's log byte for byte."""
    config = LogConfig(segment_bytes=segment_bytes, index_interval_bytes=64, retention_ms=-1)

    async def main(root: str) -> None:
        cluster, brokers = make_cluster(root, n_brokers, config, partition_max_bytes=partition_max_bytes)
        try:
            for term in history:
                await _term(cluster, brokers, *term)
            cluster.elect(brokers[final_leader % n_brokers].broker_id)
            await cluster.sync(max_rounds=400)
            for f in cluster.followers:
                assert_same_log(f.log(), cluster.leader.log(), same_start=False)
        finally:
            for b in brokers:
                b.close()

    with scratch_dir("tidelog-repl-") as root:
        trio.run(main, root, clock=trio.testing.MockClock(autojump_threshold=0))


async def _term(cluster: MemoryCluster, brokers: list[MemoryBroker], leader_index: int, whole_isr: bool,
                batches: list[int], fetches: list[tuple[int, int]], retained_segments: int) -> None:
    leader = brokers[leader_index % len(brokers)].broker_id
    cluster.elect(leader, isr=None if whole_isr else [leader])
    half = len(batches) // 2
    for i, records in enumerate(batches):
        produce(cluster.leader, 1, records=records)
        if i + 1 == half:
            await _fetch_some(cluster, fetches[:1])
    await _fetch_some(cluster, fetches[1:])
    if retained_segments:
        log = cluster.leader.log()
        below_hw = [s.base_offset for s in log.segments if s.base_offset <= log.high_watermark]
        if log.maybe_increment_log_start_offset(below_hw[-min(retained_segments, len(below_hw))]):
            log.delete_old_segments()


async def _fetch_some(cluster: MemoryCluster, fetches: list[tuple[int, int]]) -> None:
    followers = cluster.followers
    for index, rounds in fetches:
        for _ in range(rounds):
            await cluster.fetch_round(followers[index % len(followers)])


async def test_a_truncation_answer_for_a_partition_added_again_meanwhile_is_not_applied(tmp_path):
    """OffsetsForLeaderEpoch asked for the partition under epoch 1; before the answer it was
    removed and added again (epoch 2): the answer, about the old question, is dropped, and
    the new state asks again."""
    from tidelog.broker.replication.fetcher import FetcherConfig, ReplicaFetcher
    from tidelog.protocol.messages import (
        EpochEndOffsetResult,
        OffsetForLeaderTopicResult,
        OffsetsForLeaderEpochResponse,
    )
    log = open_log(tmp_path / "f")
    log.append_as_leader(make_batch(5), 0)
    answer, asked = trio.Event(), []

    class Endpoint:
        async def offsets_for_leader_epoch(self, request):
            asked.append(request)
            await answer.wait()
            return OffsetsForLeaderEpochResponse([OffsetForLeaderTopicResult(TP.topic, [
                EpochEndOffsetResult(TP.partition, NONE.code, 0, 2)])])

    f = ReplicaFetcher(1, Endpoint(), lambda tp: log, FetcherConfig(2))
    f.add_partitions({TP: 1})
    async with trio.open_nursery() as nursery:
        nursery.start_soon(f.maybe_truncate)
        await trio.testing.wait_all_tasks_blocked()
        f.remove_partitions([TP])
        f.add_partitions({TP: 2})
        answer.set()
    assert log.log_end_offset == 5 and f.partitions[TP].truncating
    log.close()
