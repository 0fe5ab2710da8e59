"""Follower fetches from whoever sends them (issue 14): only a follower of the partition, with
its broker's current broker epoch, is served as a follower.

A follower fetch is read up to the leader's LEO, and the leader records the fetch offset as
that follower's LEO, from which it moves the HW and the ISR. Before these checks any client
could send one: with the real followers paused, fetches naming their replica ids moved the HW
over a record only the leader held (an acks=all produce acknowledged, then lost with the
leader), and a fetch as replica 99 read above the HW. Now the leader refuses a replica id that
is not one of its followers (Kafka's ``followerReplicaOrThrow``) and a broker epoch that is not
that broker's registration in ZooKeeper (KIP-903's check): NOT_LEADER_OR_FOLLOWER, nothing
read, nothing recorded. ``MemoryCluster`` plays ZooKeeper: every broker's registry knows every
broker's epoch, and the fetchers send their own.
"""

from __future__ import annotations

import inspect

import pytest

from tests.unit.log.helpers import FakeClock, make_batch
from tests.unit.replication.memory_leader import TP, MemoryBroker
from tests.unit.replication.test_fetcher import make_cluster, produce
from tidelog.broker.log.config import LogConfig
from tidelog.broker.metadata_cache import ZkRegistry
from tidelog.broker.replication.replica_manager import ReplicaManager, monotonic_ms, wall_ms
from tidelog.protocol.errors import NONE, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT
from tidelog.protocol.messages import (
    FetchPartition,
    FetchRequest,
    FetchTopic,
    LiveBroker,
    PartitionState,
    UpdateMetadataRequest,
)


@pytest.fixture
def cluster(tmp_path):
    c, brokers = make_cluster(str(tmp_path), n=3)
    st = PartitionState(TP.topic, TP.partition, 1, 1, 0, [1, 2, 3], 0, [1, 2, 3])
    for b in brokers:  # the partition is in every broker's metadata (so a refusal is not UNKNOWN_TOPIC)
        b.apis.metadata.update(UpdateMetadataRequest(1, 1, 0, [st], [LiveBroker(i, "127.0.0.1", 9090 + i)
                                                                     for i in (1, 2, 3)]))
    yield c
    for b in brokers:
        b.close()


def follower_fetch(replica_id: int, replica_epoch: int, offset: int, leader_epoch: int = 0) -> FetchRequest:
    return FetchRequest([FetchTopic(TP.topic, [FetchPartition(TP.partition, offset, 1 << 20,
                                                               current_leader_epoch=leader_epoch)])],
                        replica_id=replica_id, max_wait_ms=0, replica_epoch=replica_epoch)


async def fetch(leader: MemoryBroker, req: FetchRequest):
    return (await leader.fetch(req)).responses[0].partitions[0]


async def in_sync(cluster) -> MemoryBroker:
    """Leader 1 with followers 2 and 3 in its ISR, all three holding offset 0 (HW 1)."""
    leader = cluster.brokers[1]
    cluster.elect(1)
    produce(leader, 1)
    await cluster.sync()
    return leader


async def acks_all_answer(leader: MemoryBroker, waiting: dict) -> int:
    """What an acks=all produce waiting for ``waiting`` would be answered now (no waiting)."""
    results = {tp: {} for tp in waiting}
    await leader.replica_manager.await_replication(dict(waiting), 0, results)
    return results[TP].get("error_code", NONE.code)


async def test_a_replica_id_that_is_no_follower_is_refused_and_never_served_above_the_hw(cluster, autojump_clock):
    leader = await in_sync(cluster)
    produce(leader, 1)
    log, p = leader.log(), leader.partition()
    assert (log.high_watermark, log.log_end_offset) == (1, 2)
    remote = dict(p.remote)
    for replica_id in (99, 1):  # no replica at all; the leader's own id
        r = await fetch(leader, follower_fetch(replica_id, leader.broker_epoch, 0))
        assert r.error_code == NOT_LEADER_OR_FOLLOWER.code and not r.records
        assert f"replica {replica_id}" in r.error_message
    assert p.remote == remote and log.high_watermark == 1 and p.isr_to_expand() is None


@pytest.mark.parametrize("epoch", [-1, 0, "older", "newer"])
async def test_a_fetch_as_a_follower_without_its_broker_epoch_moves_nothing(cluster, autojump_clock, epoch):
    # the scenario: the real followers are paused (they do not fetch), a client sends
    # fetches at the leader's LEO naming their replica ids
    leader = await in_sync(cluster)
    _, waiting = leader.replica_manager.append_now(-1, {TP: make_batch(1)})  # acks=all
    log, p = leader.log(), leader.partition()
    hw, remote = log.high_watermark, dict(p.remote)
    for follower in (2, 3):
        real = cluster.brokers[follower].broker_epoch
        claimed = {"older": real - 1, "newer": real + 12345}.get(epoch, epoch)
        r = await fetch(leader, follower_fetch(follower, claimed, log.log_end_offset))
        assert r.error_code == NOT_LEADER_OR_FOLLOWER.code and not r.records
        assert f"broker {follower}" in r.error_message and str(real) not in r.error_message  # not revealed
    assert log.high_watermark == hw and p.remote == remote
    assert await acks_all_answer(leader, waiting) == REQUEST_TIMED_OUT.code


async def test_the_followers_own_fetches_carry_their_epoch_and_move_the_hw(cluster, autojump_clock):
    leader = await in_sync(cluster)
    _, waiting = leader.replica_manager.append_now(-1, {TP: make_batch(1)})
    assert await acks_all_answer(leader, waiting) == REQUEST_TIMED_OUT.code
    await cluster.sync()
    assert leader.log().high_watermark == leader.log().log_end_offset == 2
    assert await acks_all_answer(leader, waiting) == NONE.code


async def test_a_follower_registered_again_is_served_once_zookeeper_says_so(cluster, autojump_clock):
    # broker 2 restarted (a new registration, a new epoch) and fetches before the leader's
    # watch of /brokers/ids reported it: the leader reads ZooKeeper again, then serves it
    leader = await in_sync(cluster)
    follower = cluster.brokers[2]
    known = dict(leader.apis.metadata.registry.broker_epochs)
    zookeeper = {**known, 2: known[2] + 100}
    reads = []

    async def read_epochs():
        reads.append(1)
        return zookeeper
    registry = leader.apis.metadata.registry = ZkRegistry(read_broker_epochs=read_epochs)
    registry.broker_epochs = known
    follower.broker_epoch = zookeeper[2]
    r = await fetch(leader, follower_fetch(2, follower.broker_epoch, 0))
    assert r.error_code == NONE.code and len(reads) == 1
    assert registry.broker_epochs[2] == zookeeper[2]
    # its previous incarnation (the old epoch) is refused now, without asking ZooKeeper again
    r = await fetch(leader, follower_fetch(2, known[2], 0))
    assert r.error_code == NOT_LEADER_OR_FOLLOWER.code and len(reads) == 1


async def test_a_claim_ahead_of_zookeeper_is_refused_after_one_read(cluster, autojump_clock):
    leader = await in_sync(cluster)
    reads = []

    async def read_epochs():
        reads.append(1)
        return dict(cluster.brokers[1].apis.metadata.registry.broker_epochs)
    registry = ZkRegistry(read_broker_epochs=read_epochs)
    registry.broker_epochs = dict(leader.apis.metadata.registry.broker_epochs)
    leader.apis.metadata.registry = registry
    r = await fetch(leader, follower_fetch(2, cluster.brokers[2].broker_epoch + 1, 0))
    assert r.error_code == NOT_LEADER_OR_FOLLOWER.code and len(reads) == 1
    # a fetch naming no follower of the partition costs ZooKeeper nothing
    r = await fetch(leader, follower_fetch(99, 10**12, 0))
    assert r.error_code == NOT_LEADER_OR_FOLLOWER.code and len(reads) == 1


async def test_the_isr_counts_on_the_replica_managers_clock_not_the_wall_clock(cluster, autojump_clock):
    """A broker runs its replica manager on a monotonic clock (the default) for the followers'
    lag, and checks records against the wall clock: a step of the wall clock (NTP) neither
    drops a follower that fetched just now from the ISR nor keeps one that stopped in it."""
    assert inspect.signature(ReplicaManager).parameters["clock"].default is monotonic_ms
    assert inspect.signature(ReplicaManager).parameters["wall_clock"].default is wall_ms
    rm = cluster.brokers[1].replica_manager
    lag = rm.config.replica_lag_time_max_ms
    wall, mono = FakeClock(), FakeClock(5_000)
    rm.wall_clock, rm.clock = wall, mono
    leader = await in_sync(cluster)
    for f in cluster.followers:  # fetches at the log end: caught up now
        await cluster.fetch_round(f)
    produce(leader, 1)  # not fetched yet: behind by it, caught up as of their last fetch
    wall.advance(3_600_000)  # an hour ahead
    assert leader.partition().isr_to_shrink(rm.clock(), lag) is None
    wall.advance(-7_200_000)  # an hour behind
    mono.advance(lag + 1)  # and the followers silent for longer than the lag allows
    assert leader.partition().isr_to_shrink(rm.clock(), lag) == frozenset({1})
    # produced records are checked against the wall clock's time
    rm.topic_config = lambda topic: LogConfig(message_timestamp_difference_max_ms=1000)
    good, refused = await rm.check_in_worker({TP: make_batch(1, ts=wall())})
    assert TP in good and not refused
