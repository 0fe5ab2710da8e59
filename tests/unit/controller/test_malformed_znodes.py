"""A znode that does not decode must not keep the cluster without a controller: a failover
that fails resigns, and the next broker's fails in turn, each bumping the controller epoch.
A topic whose znodes do not all decode is left alone (never elected, sent or deleted, and no
LeaderAndIsr is full while it is), as a topic with a malformed assignment already was; an
ISR change notification naming a partition whose state does not decode leaves the
controller's copy of that state. (A malformed notification is dropped by ZkClient:
tests/unit/broker/test_zk_client.py.)"""

from __future__ import annotations

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_topic_deletion import Brokers, elected
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerEvent
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.topics import TopicPartition

GOOD, BAD = "good", "bad"


def cluster() -> FakeZk:
    """Brokers 1 and 2; ``good``'s leader 3 is gone (a failover elects 2); ``bad`` has a
    partition state that does not decode."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11}
    for t in (GOOD, BAD):
        zk.assignments[t] = {0: [3, 2]}
        zk.configs[t] = {}
        zk.states[(t, 0)] = (LeaderAndIsr(3, 4, (3, 2), 0), 0)
    real_states, real_state = zk.get_partition_states, zk.get_partition_state

    async def get_partition_states(topic):
        if topic == BAD:  # as ZkClient decodes a malformed state znode
            raise ValueError(f"/tidelog/brokers/topics/{BAD}/partitions/0/state: malformed partition state "
                             "znode data: 'leader' is None")
        return await real_states(topic)

    async def get_partition_state(topic, partition):
        if topic == BAD:
            await get_partition_states(topic)
        return await real_state(topic, partition)
    zk.get_partition_states, zk.get_partition_state = get_partition_states, get_partition_state
    return zk


async def test_a_malformed_partition_state_leaves_its_topic_alone_not_the_controller(nursery):
    zk = cluster()
    c, brokers = await elected(zk, nursery)
    assert c.is_active and (zk.controller, zk.epoch) == (1, 1)
    assert BAD in c.ctx.unreadable and not c.ctx.complete
    assert BAD not in c.ctx.assignments and TopicPartition(BAD, 0) not in c.ctx.states
    assert zk.states[(BAD, 0)][0].leader == 3  # not elected on a guess
    assert zk.states[(GOOD, 0)][0].leader == 2
    assert not any(m.full for _, m in brokers.requests(ApiKey.LEADER_AND_ISR))


async def test_an_isr_change_of_a_partition_whose_state_does_not_decode_keeps_the_controllers_copy(nursery):
    """At a failover too: the notification is handled (deleted) there, and the controller elected."""
    zk = cluster()
    zk.assignments.pop(BAD)
    note = await zk.notify_isr_change([(GOOD, 0)])
    c = Controller(ControllerConfig(broker_id=1), zk)
    c._nursery = nursery
    await nursery.start(c.channels.run)
    Brokers(c)
    real = zk.get_partition_state

    async def good_state_goes_bad(topic, partition):
        if topic == GOOD and c.ctx is not None and TopicPartition(GOOD, 0) in c.ctx.states:
            raise ValueError(f"/tidelog/brokers/topics/{GOOD}/partitions/0/state: malformed partition state")
        return await real(topic, partition)
    zk.get_partition_state = good_state_goes_bad
    await c._on_controller_change()
    assert c.is_active and zk.epoch == 1
    assert c.ctx.states[TopicPartition(GOOD, 0)][0].leader == 2 and zk.deleted_notifications == [note]


async def test_an_isr_change_naming_no_known_topic_reads_nothing_of_it(nursery):
    """A notification naming a topic the controller does not manage (gone, being deleted, or
    a name no topic can have) is deleted without its state being read."""
    zk = cluster()
    c, _ = await elected(zk, nursery)
    reads = []
    real = zk.get_partition_state

    async def recorded(topic, partition):
        reads.append(topic)
        return await real(topic, partition)
    zk.get_partition_state = recorded
    note = await zk.notify_isr_change([(BAD, 0), ("x" * 300, 0), (GOOD, 0)])
    await c._handle((ControllerEvent.ISR_CHANGE, None))
    assert c.is_active and reads == [GOOD] and zk.deleted_notifications[-1] == note
