"""The controller's request queue to each broker is bounded, and a full one never fails the
controller's work: its requests are dropped (their waiters released) and replaced by what
the controller restates of the whole cluster for that broker (``on_overflow``), which
supersedes them; the request being sent is queued after it. A broker registered but
unreachable (here: nothing listens on port 1) must not stop every controller event halfway,
after its ZooKeeper writes, with new leaders never told."""

from __future__ import annotations

import pytest

from tests.support.controller_zk import FakeZk
from tidelog.broker.controller.channels import ChannelManager
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerEvent
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.messages import UpdateMetadataRequest

UNREACHABLE = 1  # a port nothing listens on: every delivery fails and is tried again


def metadata(n: int) -> UpdateMetadataRequest:
    return UpdateMetadataRequest(1, 1, n, [], [], [], "c")


async def test_a_full_queue_is_replaced_by_what_the_overflow_restates(nursery):
    overflows = []
    cm = ChannelManager(1, max_queued=4)
    cm.on_overflow = lambda b: overflows.append(b) or cm.send(b, ApiKey.UPDATE_METADATA, metadata(-1))
    await nursery.start(cm.run)
    cm.add_broker(2, "127.0.0.1", UNREACHABLE)
    first = [cm.send(2, ApiKey.UPDATE_METADATA, metadata(i)) for i in range(4)]
    assert overflows == [] and not any(out.done.is_set() for out in first)
    fifth = cm.send(2, ApiKey.UPDATE_METADATA, metadata(4))  # the queue is full: no WouldBlock
    assert overflows == [2]
    assert all(out.done.is_set() and out.response is None for out in first)  # dropped, waiters released
    assert [out.message.broker_epoch for out in cm._queues[2].pending()] == [-1, 4]
    assert not fifth.done.is_set()
    cm.close_all()


def test_a_bound_below_a_restatement_is_refused():
    with pytest.raises(ValueError, match="max_queued"):
        ChannelManager(1, max_queued=2)


async def test_an_unreachable_broker_with_a_full_queue_does_not_stop_an_event(nursery):
    """Broker 3 is registered, unreachable, its queue full; the leader 2 of orders-0 dies. The
    event elects 4 and tells it, and broker 3's queue holds its full state instead of the
    requests it could not take."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12, 4: 13}
    zk.assignments["orders"] = {0: [2, 4, 3]}
    zk.configs["orders"] = {}
    zk.states[("orders", 0)] = (LeaderAndIsr(2, 4, (2, 4, 3), 0), 0)

    async def unreachable_brokers():
        return {b: (BrokerInfo(b, "127.0.0.1", UNREACHABLE), e) for b, e in zk.live.items()}
    zk.live_brokers_and_epochs = unreachable_brokers
    c = Controller(ControllerConfig(broker_id=1), zk)
    c.channels.max_queued = 8
    c._nursery = nursery
    await nursery.start(c.channels.run)
    await c._on_controller_change()
    sent, real = [], c.channels.send

    def recorded(b, key, msg):
        out = real(b, key, msg)
        sent.append((b, key, msg))
        return out
    c.channels.send = recorded
    while len(c.channels._queues[3].pending()) < 8:  # earlier events' requests, never delivered
        real(3, ApiKey.UPDATE_METADATA, metadata(12))

    del zk.live[2]
    await c._handle((ControllerEvent.BROKER_CHANGE, ["1", "3", "4"]))
    assert zk.states[("orders", 0)][0].leader == 4
    assert any(b == 4 and key is ApiKey.LEADER_AND_ISR for b, key, _ in sent)
    queued = [(out.api_key, out.message) for out in c.channels._queues[3].pending()]
    assert any(key is ApiKey.LEADER_AND_ISR and m.full and m.partition_states[0].leader == 4 for key, m in queued)
    assert any(key is ApiKey.UPDATE_METADATA and m.partition_states for key, m in queued)
    c.channels.close_all()


async def test_a_restated_broker_gets_the_partitions_a_joining_one_does(nursery):
    """Both a broker joining and one whose queue overflowed get a full LeaderAndIsr of every
    partition with a replica on it (``ControllerContext.partitions_on``), one being moved
    onto it included, and of no other."""
    from tests.unit.controller.test_topic_deletion import Brokers

    zk = FakeZk()
    zk.live = {1: 10, 2: 11}
    zk.assignments.update({"a": {0: [1, 3], 1: [1, 2]}, "b": {0: [2, 1, 3]}})
    zk.moves["b"] = {0: ((3,), ())}
    for t, parts in zk.assignments.items():
        zk.configs[t] = {}
        for p, replicas in parts.items():
            zk.states[(t, p)] = (LeaderAndIsr(replicas[0], 0, tuple(r for r in replicas if r != 3), 0), 0)
    c = Controller(ControllerConfig(broker_id=1), zk)
    c._nursery = nursery
    await nursery.start(c.channels.run)
    brokers = Brokers(c)
    await c._on_controller_change()
    assert [str(tp) for tp in c.ctx.partitions_on(3)] == ["a-0", "b-0"]

    def full_to_3() -> list[list[tuple[str, int]]]:
        return [[(p.topic_name, p.partition_index) for p in m.partition_states]
                for b, m in brokers.requests(ApiKey.LEADER_AND_ISR) if b == 3 and m.full]
    zk.live[3] = 12
    await c._handle((ControllerEvent.BROKER_CHANGE, ["1", "2", "3"]))
    c._restate_to(3)
    assert full_to_3() == [[("a", 0), ("b", 0)]] * 2
