"""A broker's registration rewritten in place (the same ``/brokers/ids/<id>`` znode, the same
broker epoch, new endpoints or rack): no child of ``/brokers/ids`` changes, so only the data
watch the controller keeps on each registration sees it. As Kafka's controller handles
BrokerModifications (``onBrokerUpdate``): every broker is sent UpdateMetadata with the new
addresses, the controller's own requests go to the new address, and nothing else changes
(the broker did not restart: no leader moves, no replica leaves an ISR)."""

from __future__ import annotations

import trio.testing

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_malformed_znodes import handle_queued
from tests.unit.controller.test_topic_deletion import elected
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr, encode_broker_info
from tidelog.protocol.codec import ApiKey

T = "t"
MOVED = BrokerInfo(2, "10.0.0.2", 9302, "rack-b", ("PLAINTEXT://10.0.0.2:9302",))


def cluster() -> FakeZk:
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[T] = {0: [2, 3]}
    zk.configs[T] = {}
    zk.states[(T, 0)] = (LeaderAndIsr(2, 5, (2, 3), 0), 0)
    return zk


async def rewrite(zk: FakeZk, c, broker: int, data: bytes, version: int = 1) -> None:
    """``broker``'s registration becomes ``data`` in place; its watch reports it."""
    await trio.testing.wait_all_tasks_blocked()  # the watches started
    zk.data_watches[zk.paths.broker(broker)].send_nowait((data, version))
    await handle_queued(c)


async def test_a_registration_rewritten_in_place_is_advertised_to_every_broker(nursery):
    zk = cluster()
    c, brokers = await elected(zk, nursery)
    retargeted = []
    add_broker = c.channels.add_broker

    def recorded(b, host, port):
        retargeted.append((b, host, port))
        add_broker(b, host, port)
    c.channels.add_broker = recorded
    brokers.sent.clear()

    zk.infos[2] = MOVED
    await rewrite(zk, c, 2, encode_broker_info(MOVED))
    assert c.ctx.brokers[2] == MOVED and c.ctx.broker_epochs[2] == 11
    updates = brokers.requests(ApiKey.UPDATE_METADATA)
    assert sorted(b for b, _ in updates) == [1, 2, 3]
    for _, m in updates:
        (two,) = [lb for lb in m.live_brokers if lb.broker_id == 2]
        assert (two.host, two.port, two.rack) == ("10.0.0.2", 9302, "rack-b")
        assert [(e.host, e.port) for e in two.endpoints] == [("10.0.0.2", 9302)]
    assert retargeted == [(2, "10.0.0.2", 9302)]
    # not a restart: no state changes, no LeaderAndIsr
    assert zk.states[(T, 0)][0].leader_epoch == 5 and brokers.requests(ApiKey.LEADER_AND_ISR) == []


async def test_a_report_of_the_registration_as_known_sends_nothing(nursery):
    """A watch's first report is the registration as it was read: nothing to do."""
    zk = cluster()
    c, brokers = await elected(zk, nursery)
    brokers.sent.clear()
    await rewrite(zk, c, 2, encode_broker_info(BrokerInfo(2, "127.0.0.1", 9002)), version=0)
    assert brokers.sent == []


async def test_a_registration_rewritten_unreadable_in_place_makes_its_broker_not_live(nursery):
    zk = cluster()
    c, brokers = await elected(zk, nursery)
    zk.unreadable[2] = "malformed broker 2 znode data: 'port' is None"
    await rewrite(zk, c, 2, b'{"host": "10.0.0.2"}')
    assert set(c.ctx.brokers) == {1, 3} and 2 in c.ctx.unreadable_brokers
    st = zk.states[(T, 0)][0]
    assert (st.leader, tuple(st.isr)) == (3, (3,))
