"""The controller across a ZooKeeper disconnect that its session survives: a broker that
registered again meanwhile (the same id, a new broker epoch) is seen, though /brokers/ids
kept its names, so the controller's requests carry the new broker epoch (the broker refuses
an older one, STALE_BROKER_EPOCH, forever). Its watches are ZkClient's, over an in-memory
kazoo (tests/support/stub_kazoo.py); the rest of ZooKeeper is FakeZk."""

from __future__ import annotations

import trio
import trio.testing

from tests.support.controller_zk import FakeZk
from tests.support.stub_kazoo import StubKazoo
from tests.unit.controller.test_topic_deletion import Brokers, elected
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerEvent
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.broker.zookeeper.zk import ZkClient
from tidelog.protocol.codec import ApiKey

T = "orders"


async def test_a_broker_registered_again_during_a_disconnect_gets_requests_of_its_new_epoch(nursery):
    stub = StubKazoo()
    watcher = ZkClient("127.0.0.1:1")
    watcher._zk = stub
    for path in watcher.paths.persistent_paths():
        await watcher._ensure_path(path)
    zk = FakeZk()
    zk.paths, zk.watch_children, zk.watch_data = watcher.paths, watcher.watch_children, watcher.watch_data
    zk.live = {1: 10, 2: 11, 3: 12}
    for b in zk.live:
        stub.create(watcher.paths.broker(b), b"{}")
    zk.assignments[T] = {0: [2, 3]}
    zk.states[(T, 0)] = (LeaderAndIsr(2, 5, (2, 3), 0), 0)
    c = Controller(ControllerConfig(broker_id=1, auto_leader_rebalance_enable=False), zk)
    brokers = Brokers(c)
    await nursery.start(c.run)
    await trio.testing.wait_all_tasks_blocked()
    assert c.is_active and c.ctx.broker_epochs == {1: 10, 2: 11, 3: 12}

    stub.disconnect()  # the session lives on
    stub.delete(watcher.paths.broker(3))  # broker 3 restarts: a new registration, epoch 13
    stub.create(watcher.paths.broker(3), b"{}")
    zk.live[3] = 13
    brokers.sent.clear()
    stub.reconnect()
    await trio.testing.wait_all_tasks_blocked()
    assert c.ctx.broker_epochs[3] == 13
    to_3 = [m for b, m in brokers.requests(ApiKey.LEADER_AND_ISR) + brokers.requests(ApiKey.UPDATE_METADATA)
            if b == 3]
    assert to_3 and all(m.broker_epoch == 13 for m in to_3)
    c.channels.close_all()


async def test_a_report_of_deletion_markers_read_before_a_topic_was_created_again_deletes_nothing(nursery):
    """The markers a watch reported can be stale by the time the event is handled (a report
    after a reconnect, or one read while another deletion completed): ``orders`` was deleted
    and created again since. The controller reads the markers when it handles the event."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11}
    zk.assignments[T] = {0: [1, 2]}
    zk.states[(T, 0)] = (LeaderAndIsr(1, 0, (1, 2), 0), 0)
    c, brokers = await elected(zk, nursery)
    await c._handle((ControllerEvent.TOPIC_DELETION, [T]))
    assert T in c.ctx.assignments and T not in c.ctx.deleting and zk.marked == set()
    assert brokers.requests(ApiKey.STOP_REPLICA) == []
    zk.marked.add(T)  # marked now (by DeleteTopics on another broker, say)
    await c._handle((ControllerEvent.TOPIC_DELETION, []))
    assert T in c.ctx.deleting
