"""A partition whose leader is in controlled shutdown is online: the broker still serves it,
and the controller sends it no LeaderAndIsr while it shuts down. Only a partition whose
leader is gone from ZooKeeper (or that never had one) is elected, as Kafka's controller
elects only Offline and New partitions; a new leader elected anyway would lead next to the
old one, which nobody told."""

from __future__ import annotations

import trio

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_topic_deletion import Brokers
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerEvent
from tidelog.broker.zookeeper.layout import LeaderAndIsr, ZkTimeoutError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.topics import TopicPartition

T = "orders"


async def shutting_down_leader(nursery, unclean: bool = True) -> tuple[Controller, FakeZk, Brokers]:
    """Broker 2 leads orders-0 alone in its ISR (3 lags behind) and asked for a controlled
    shutdown: the partition cannot move (3 is not in sync), so 2 keeps leading it."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[T] = {0: [2, 3]}
    zk.configs[T] = {"unclean.leader.election.enable": "true"} if unclean else {}
    zk.states[(T, 0)] = (LeaderAndIsr(2, 5, (2,), 0), 0)
    c = Controller(ControllerConfig(broker_id=1), zk)
    c._nursery = nursery
    await nursery.start(c.channels.run)
    brokers = Brokers(c)
    await c._on_controller_change()
    remaining, _ = await c.controlled_shutdown(2, broker_epoch=11)
    assert remaining == [TopicPartition(T, 0)] and c.ctx.shutting_down == {2}
    brokers.sent.clear()
    return c, zk, brokers


async def test_a_broker_joining_does_not_elect_a_partition_led_by_a_broker_shutting_down(nursery):
    c, zk, brokers = await shutting_down_leader(nursery)
    zk.live[4] = 13
    await c._on_brokers(["1", "2", "3", "4"])
    assert zk.states[(T, 0)] == (LeaderAndIsr(2, 5, (2,), 0), 0)
    assert c.ctx.states[TopicPartition(T, 0)][0].leader == 2
    # broker 3 gets its full LeaderAndIsr, unchanged: it still follows 2
    assert all(s.leader == 2 for _, m in brokers.requests(ApiKey.LEADER_AND_ISR) for s in m.partition_states)


async def test_a_reload_keeps_a_partition_led_by_a_broker_shutting_down(nursery):
    """An event meets a ZooKeeper timeout: the controller reads everything again, the broker
    shutting down still is, and its partition is not elected away from it."""
    c, zk, brokers = await shutting_down_leader(nursery)
    zk.failures["get_topics"] = [ZkTimeoutError("ZooKeeper get children: no answer")]
    await c._handle((ControllerEvent.CALL, (c.zk.get_topics, {}, trio.Event())))
    assert c.is_active and c.ctx.shutting_down == {2}
    assert zk.states[(T, 0)] == (LeaderAndIsr(2, 5, (2,), 0), 0)
    assert 2 not in {b for b, _ in brokers.requests(ApiKey.LEADER_AND_ISR)}


async def test_the_partition_of_a_broker_shutting_down_is_elected_once_it_is_gone(nursery):
    c, zk, brokers = await shutting_down_leader(nursery)
    del zk.live[2]
    await c._on_brokers(["1", "3"])
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (3, 6, (3,))  # unclean: the topic allows it


async def test_an_offline_partition_elects_no_broker_shutting_down(nursery):
    """orders-1 is offline (its leader 4 died); its ISR holds 2, shutting down, and 3: 3 leads."""
    c, zk, brokers = await shutting_down_leader(nursery, unclean=False)
    zk.assignments[T][1] = [4, 2, 3]
    zk.states[(T, 1)] = (LeaderAndIsr(-1, 2, (2, 3), 0), 0)
    c.ctx.assignments[T][1] = [4, 2, 3]
    c.ctx.states[TopicPartition(T, 1)] = zk.states[(T, 1)]
    zk.live[4] = 13
    await c._on_brokers(["1", "2", "3", "4"])
    assert zk.states[(T, 0)][0].leader == 2
    st, _ = zk.states[(T, 1)]
    assert (st.leader, st.isr) == (3, (3,))
