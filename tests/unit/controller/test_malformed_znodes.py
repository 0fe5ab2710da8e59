"""A znode that does not decode must not keep the cluster without a controller: a failover
that fails resigns, and the next broker's fails in turn, each bumping the controller epoch.
A topic whose znodes do not all decode is left alone (never elected, sent or deleted, and no
LeaderAndIsr is full while it is), as a topic with a malformed assignment already was; an
ISR change notification naming a partition whose state does not decode leaves the
controller's copy of that state. (A malformed notification is dropped by ZkClient:
tests/unit/broker/test_zk_client.py.)"""

from __future__ import annotations

import logging

import trio
import trio.testing

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_topic_deletion import Brokers, elected
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerEvent
from tidelog.broker.zookeeper.layout import LeaderAndIsr, ZkError
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


BROKER_3_PROBLEM = "malformed broker 3 znode data: 'port' is None"


async def handle_queued(c: Controller) -> None:
    """Handle the events queued so far (a watch's reports among them)."""
    await trio.testing.wait_all_tasks_blocked()
    while True:
        try:
            event = c._events.receive_nowait()
        except trio.WouldBlock:
            return
        await c._handle(event)


async def test_a_broker_whose_registration_does_not_decode_is_not_live_and_the_failover_completes(nursery, caplog):
    """Broker 3 leads ``good`` and is registered with data that does not decode: the new
    controller takes over without it, as if it were down, and says why."""
    zk = cluster()
    zk.assignments.pop(BAD)
    zk.live[3] = 12
    zk.unreadable[3] = BROKER_3_PROBLEM
    with caplog.at_level(logging.WARNING, logger="tidelog.controller"):
        c, brokers = await elected(zk, nursery)
    assert c.is_active and set(c.ctx.brokers) == {1, 2} and c.ctx.unreadable_brokers == {
        3: (f"{zk.paths.broker(3)}: {BROKER_3_PROBLEM}", 12)}
    assert zk.states[(GOOD, 0)][0].leader == 2 and tuple(zk.states[(GOOD, 0)][0].isr) == (2,)
    assert {b for b, _ in brokers.sent} == {1, 2}
    assert all([lb.broker_id for lb in m.live_brokers] == [1, 2] for _, m in brokers.requests(ApiKey.UPDATE_METADATA))
    assert f"broker 3 (broker epoch 12) is registered, but its registration does not decode: " \
           f"{zk.paths.broker(3)}: {BROKER_3_PROBLEM}" in caplog.text


async def test_a_broker_registering_unreadable_data_later_is_handled_when_its_znode_changes(nursery, caplog):
    """A broker-change event reads every registration: one that does not decode keeps
    neither the others from joining nor itself from joining once its znode (watched) is
    rewritten; a broker known before whose registration turns unreadable is gone."""
    zk = cluster()
    zk.assignments.pop(BAD)
    c, brokers = await elected(zk, nursery)
    zk.live.update({3: 12, 4: 13})
    zk.unreadable[3] = BROKER_3_PROBLEM
    with caplog.at_level(logging.WARNING, logger="tidelog.controller"):
        await c._handle((ControllerEvent.BROKER_CHANGE, ["1", "2", "3", "4"]))
        await c._handle((ControllerEvent.BROKER_CHANGE, ["1", "2", "3", "4"]))  # nothing new: said once
    assert c.is_active and set(c.ctx.brokers) == {1, 2, 4} and 3 in c.ctx.unreadable_brokers
    assert caplog.text.count("broker 3 (broker epoch 12) is registered, but") == 1
    await trio.testing.wait_all_tasks_blocked()
    watch = zk.data_watches[zk.paths.broker(3)]

    # broker 3 rewrites its registration in place: no child of /brokers/ids changed
    brokers.sent.clear()
    del zk.unreadable[3]
    watch.send_nowait((b"{}", 1))
    await handle_queued(c)
    assert set(c.ctx.brokers) == {1, 2, 3, 4} and not c.ctx.unreadable_brokers
    assert any(b == 3 and m.full for b, m in brokers.requests(ApiKey.LEADER_AND_ISR))
    assert set(c._registration_watches) == {1, 2, 3, 4}  # every registration is watched

    # broker 3 caught up; then broker 2 registers again, its data unreadable: gone, its
    # leadership moves to 3
    zk.leader_changes_isr(GOOD, 0, [2, 3])
    await zk.notify_isr_change([(GOOD, 0)])
    await c._handle((ControllerEvent.ISR_CHANGE, None))
    zk.live[2] = 14
    zk.unreadable[2] = "malformed broker 2 znode data: not a JSON object"
    await c._handle((ControllerEvent.BROKER_CHANGE, ["1", "2", "3", "4"]))
    assert set(c.ctx.brokers) == {1, 3, 4} and zk.states[(GOOD, 0)][0].leader == 3


async def test_a_registration_watch_that_cannot_start_leaves_the_controller_running(nursery, caplog):
    zk = cluster()
    zk.assignments.pop(BAD)
    zk.live[3] = 12
    zk.unreadable[3] = BROKER_3_PROBLEM

    async def watch_fails(path):
        raise ZkError(f"{path}: cannot watch")
    zk.watch_data = watch_fails
    with caplog.at_level(logging.WARNING, logger="tidelog.controller"):
        c, _ = await elected(zk, nursery)
        await trio.testing.wait_all_tasks_blocked()
    assert c.is_active and "cannot watch the registration of broker 3" in caplog.text
