"""ZkClient over an in-memory kazoo (tests/support/stub_kazoo.py): what it makes of the
znodes it reads and of its connection's ups and downs, with no ZooKeeper. The same calls
against a real ZooKeeper: tests/integration/test_zk.py."""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing
from kazoo.protocol.states import KazooState

from tests.support.stub_kazoo import StubKazoo
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr, encode_broker_info, encode_partition_state
from tidelog.broker.zookeeper.zk import ZkClient


async def client() -> tuple[ZkClient, StubKazoo]:
    stub = StubKazoo()
    zk = ZkClient("127.0.0.1:1")
    zk._zk = stub
    for path in zk.paths.persistent_paths():
        await zk._ensure_path(path)
    return zk, stub


async def test_a_malformed_isr_change_notification_is_logged_deleted_and_skipped(caplog):
    """Left in place, it would fail the read of every controller, each failover in turn."""
    zk, stub = await client()
    first = await zk.notify_isr_change([("orders", 0)])
    bad = stub.create(zk.paths.isr_change_prefix, b'{"version":1}', sequence=True)
    last = await zk.notify_isr_change([("orders", 1)])
    with caplog.at_level(logging.ERROR):
        assert await zk.isr_change_notifications() == [(first, [("orders", 0)]), (last, [("orders", 1)])]
    assert bad not in stub.nodes and first in stub.nodes
    assert f"{bad}: malformed isr change notification znode data" in caplog.text


async def test_a_malformed_partition_state_is_a_value_error_naming_its_znode():
    zk, stub = await client()
    stub.create(zk.paths.topic("orders"), b"{}")
    for p, data in ((0, encode_partition_state(LeaderAndIsr(1, 0, (1,), 1))), (1, b'{"leader":1}')):
        zk._ensure_path_sync(zk.paths.partition(("orders"), p))
        stub.create(zk.paths.partition_state("orders", p), data)
    with pytest.raises(ValueError, match=f"{zk.paths.partition_state('orders', 1)}: malformed partition state"):
        await zk.get_partition_states("orders")
    with pytest.raises(ValueError, match=f"{zk.paths.partition_state('orders', 1)}: malformed partition state"):
        await zk.get_partition_state("orders", 1)
    assert (await zk.get_partition_state("orders", 0))[0] == LeaderAndIsr(1, 0, (1,), 1)


async def test_a_broker_registration_that_does_not_decode_is_told_apart_naming_its_znode(caplog):
    """One unreadable registration must not hide the others (nor fail a controller's failover)."""
    zk, stub = await client()
    for b, data in ((1, encode_broker_info(BrokerInfo(1, "127.0.0.1", 9091))), (2, b"not json"), (3, b"[1]"),
                    (4, b'{"host":"h","port":"9092"}'), (5, b'{"port":9092}'),
                    (6, b'{"host":"h","port":9092,"endpoints":["PLAINTEXT:/h:9092"]}'),
                    (7, b'{"host":"h","port":0}')):
        stub.create(zk.paths.broker(b), data)
    readable, unreadable = await zk.broker_registrations()
    assert list(readable) == [1] and readable[1][0] == BrokerInfo(1, "127.0.0.1", 9091)
    assert sorted(unreadable) == [2, 3, 4, 5, 6, 7]
    for b, (problem, epoch) in unreadable.items():
        assert problem.startswith(f"{zk.paths.broker(b)}: malformed broker {b} znode data") and epoch > 0
    with caplog.at_level(logging.WARNING):
        assert await zk.live_brokers() == {1: BrokerInfo(1, "127.0.0.1", 9091)}
    assert f"broker 6 is registered but its registration does not decode, ignored: {zk.paths.broker(6)}: " \
           "malformed broker 6 znode data: 'endpoints'" in caplog.text
    with pytest.raises(ValueError, match=f"{zk.paths.broker(2)}: malformed broker 2 znode data"):
        await zk.get_broker(2)


async def next_children(changes) -> list[str] | None:
    """What the watch reported since the last call (None: nothing)."""
    await trio.testing.wait_all_tasks_blocked()
    try:
        return changes.receive_nowait()
    except trio.WouldBlock:
        return None


@pytest.mark.parametrize("drop", [KazooState.SUSPENDED, KazooState.LOST])
async def test_a_children_watch_reports_its_read_after_every_reconnect(drop):
    """While the connection was down broker 3 registered again (the same name, a new znode):
    kazoo's ChildrenWatch reads the children again on reconnect but reports them only when
    their names changed. Reported anyway, the owner reads what they hold again."""
    zk, stub = await client()
    for b in (1, 2, 3):
        stub.create(zk.paths.broker(b), b"{}")
    changes = await zk.watch_children(zk.paths.broker_ids)
    assert await next_children(changes) == ["1", "2", "3"]
    stub.disconnect(drop)
    stub.delete(zk.paths.broker(3))
    stub.create(zk.paths.broker(3), b"{}")
    assert await next_children(changes) is None  # no watch fires while disconnected
    stub.reconnect()
    assert await next_children(changes) == ["1", "2", "3"]
    # and the watch is set again: a change after the reconnect is reported once
    stub.create(zk.paths.broker(4), b"{}")
    assert await next_children(changes) == ["1", "2", "3", "4"]
    assert await next_children(changes) is None
