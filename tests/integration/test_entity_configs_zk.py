"""Entity configs against a real ZooKeeper: the store follows the change notifications,
concurrent writers both take effect, and old notifications are purged."""

from __future__ import annotations

import pytest
import trio

from tidelog.broker.security.credentials import make_credential
from tidelog.broker.security.entity_configs import EntityConfigStore
from tidelog.broker.zookeeper.zk import ZkClient

pytestmark = pytest.mark.integration


async def wait_for(predicate, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


async def test_the_store_follows_changes_and_concurrent_writers_both_win(zookeeper, chroot):
    connect = zookeeper.connect_string
    async with ZkClient(connect, chroot=chroot) as zk, ZkClient(connect, chroot=chroot) as writer:
        credential = make_credential("SCRAM-SHA-256", "alice-secret")
        await writer.change_entity_config("users/alice", lambda c: {**c, "SCRAM-SHA-256": credential.to_text()})
        store = EntityConfigStore(zk)
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            assert store.scram_credential("alice", "SCRAM-SHA-256") == credential  # read at start
            assert store.scram_credential("alice", "SCRAM-SHA-512") is None

            async def add(key: str) -> None:
                await writer.change_entity_config("clients/app", lambda c: {**c, key: "1024"})
            async with trio.open_nursery() as writers:
                for key in ("producer_byte_rate", "consumer_byte_rate"):
                    writers.start_soon(add, key)
            await wait_for(lambda: len(store.entity_config(None, "app")) == 2)
            assert (await writer.get_entity_config("clients/app"))[0] == \
                {"producer_byte_rate": "1024", "consumer_byte_rate": "1024"}

            await writer.change_entity_config("users/alice", lambda c: {})
            await wait_for(lambda: store.scram_credential("alice", "SCRAM-SHA-256") is None)
            nursery.cancel_scope.cancel()


async def test_notifications_older_than_the_expiry_are_deleted(zookeeper, chroot):
    async with ZkClient(zookeeper.connect_string, chroot=chroot) as zk:
        await zk.change_entity_config("clients/a", lambda c: {"producer_byte_rate": "1"})
        store = EntityConfigStore(zk, change_expiry_ms=0)  # every notification is old
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            await zk.change_entity_config("clients/b", lambda c: {"producer_byte_rate": "2"})
            await wait_for(lambda: "clients/b" in store.configs)
            await wait_for(lambda: not store._created_ms)
            assert await zk._children(zk.paths.config_changes) == []
            nursery.cancel_scope.cancel()
