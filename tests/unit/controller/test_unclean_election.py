"""Unclean leader election asked for: turning ``unclean.leader.election.enable`` on for a
topic elects its offline partitions at once (Kafka 2.7+), and ElectLeaders with the UNCLEAN
type elects each partition that has no leader, from its in-sync replicas if one is live,
else from any live replica (acknowledged records it lacks are lost), whatever the setting
(the rule: ``election.offline_partition_leader`` with unclean election allowed)."""

from __future__ import annotations

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_topic_deletion import Brokers
from tidelog.broker.controller.controller import Controller, ControllerConfig
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    ELECTION_NOT_NEEDED,
    ELIGIBLE_LEADERS_NOT_AVAILABLE,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tidelog.protocol.topics import TopicPartition

T = "orders"
OFFLINE, ONLINE, DEAD = TopicPartition(T, 0), TopicPartition(T, 1), TopicPartition(T, 2)
UNCLEAN = "unclean.leader.election.enable"


async def offline_partition(nursery) -> tuple[Controller, FakeZk, Brokers]:
    """orders-0's last in-sync replica, broker 2, is gone; 3 is live but out of sync.
    orders-1 is led by 1; orders-2's replicas are all gone."""
    zk = FakeZk()
    zk.live = {1: 10, 3: 12}
    zk.assignments[T] = {0: [2, 3], 1: [1, 3], 2: [4, 5]}
    zk.configs[T] = {}
    zk.states[(T, 0)] = (LeaderAndIsr(-1, 7, (2,), 0), 3)
    zk.states[(T, 1)] = (LeaderAndIsr(1, 2, (1, 3), 0), 0)
    zk.states[(T, 2)] = (LeaderAndIsr(-1, 1, (4,), 0), 0)
    c = Controller(ControllerConfig(broker_id=1), zk)
    c._nursery = nursery
    await nursery.start(c.channels.run)
    brokers = Brokers(c)
    await c._on_controller_change()
    assert zk.states[(T, 0)][0].leader == -1
    brokers.sent.clear()
    return c, zk, brokers


async def test_turning_unclean_election_on_elects_the_topics_offline_partitions(nursery):
    c, zk, brokers = await offline_partition(nursery)
    waits = await c.alter_topic_config(T, {UNCLEAN: "true"}, validate_only=False)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (3, 8, (3,))
    assert zk.states[(T, 1)][0] == LeaderAndIsr(1, 2, (1, 3), 0)  # online: untouched
    assert any(out is not None and out.api_key is ApiKey.LEADER_AND_ISR for out in waits)
    assert 3 in {b for b, _ in brokers.requests(ApiKey.LEADER_AND_ISR)}


async def test_turning_it_off_or_another_config_change_elects_nothing(nursery):
    c, zk, _ = await offline_partition(nursery)
    await c.alter_topic_config(T, {UNCLEAN: "false"}, validate_only=False)
    await c.alter_topic_config(T, {"retention.ms": "1000"}, validate_only=False)
    assert zk.states[(T, 0)][0].leader == -1


async def test_an_unclean_election_asked_for_elects_each_partition_without_a_leader(nursery):
    c, zk, brokers = await offline_partition(nursery)
    results, waits = await c.elect_unclean([OFFLINE, ONLINE, DEAD, TopicPartition(T, 9)])
    codes = {tp: code for tp, code, _ in results}
    assert codes == {OFFLINE: NONE.code, ONLINE: ELECTION_NOT_NEEDED.code,
                     DEAD: ELIGIBLE_LEADERS_NOT_AVAILABLE.code,
                     TopicPartition(T, 9): UNKNOWN_TOPIC_OR_PARTITION.code}
    assert zk.configs[T] == {}  # the setting is not needed, nor changed
    assert zk.states[(T, 0)][0].leader == 3 and zk.states[(T, 2)][0].leader == -1
    assert waits and 3 in {b for b, _ in brokers.requests(ApiKey.LEADER_AND_ISR)}

