"""The authorizer's ZooKeeper side (``ZkAclStore``, ``ZkClient``'s ACL methods) against a real
ZooKeeper: Kafka's znodes and JSON, two "brokers" that see each other's changes through the
change notifications, check-and-set under concurrent writers, and the purge of old
notifications."""

from __future__ import annotations

import json

import trio
from kazoo.client import KazooClient

from tests.support.zk_proxy import TcpProxy
from tidelog.broker.security.authorizer import Authorizer, ZkAclStore
from tidelog.broker.zookeeper.zk import ZkClient
from tidelog.protocol.acls import (
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
READ, WRITE = AclOperation.READ, AclOperation.WRITE


async def wait_until_async(condition, timeout: float, message: str) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.05)


def raw(zookeeper) -> KazooClient:
    kz = KazooClient(hosts=zookeeper.connect_string, timeout=5)
    kz.start(timeout=5)
    return kz


async def test_acls_round_trip_through_kafkas_znodes_and_reach_the_other_broker(zookeeper, chroot):
    async with ZkClient(zookeeper.connect_string, chroot=chroot) as zk1, \
            ZkClient(zookeeper.connect_string, chroot=chroot) as zk2, trio.open_nursery() as nursery:
        a1, a2 = Authorizer(), Authorizer()
        s1, s2 = ZkAclStore(zk1, a1), ZkAclStore(zk2, a2)
        await nursery.start(s1.run)
        await nursery.start(s2.run)
        bindings = [AclBinding(TOPIC, "orders", LIT, "User:alice", "*", READ, ALLOW),
                    AclBinding(TOPIC, "orders", LIT, "User:bob", "10.0.0.1", WRITE, DENY),
                    AclBinding(GROUP, "team-", PRE, "User:alice", "*", READ, ALLOW),
                    AclBinding(TOPIC, "bad/name", LIT, "User:alice", "*", READ, ALLOW)]
        results = await s1.create(bindings)
        assert results[:3] == [None, None, None] and isinstance(results[3], AclError)
        # written where and as Kafka writes them
        kz = raw(zookeeper)
        try:
            data, _ = kz.get(f"{chroot}/kafka-acl/Topic/orders")
            assert json.loads(data) == {"version": 1, "acls": [
                {"principal": "User:alice", "host": "*", "operation": "Read", "permissionType": "Allow"},
                {"principal": "User:bob", "host": "10.0.0.1", "operation": "Write", "permissionType": "Deny"}]}
            assert kz.exists(f"{chroot}/kafka-acl-extended/prefixed/Group/team-")
            assert len(kz.get_children(f"{chroot}/kafka-acl-changes")) == 1
            (change,) = kz.get_children(f"{chroot}/kafka-acl-extended-changes")
            assert change.startswith("acl_changes_")
            assert json.loads(kz.get(f"{chroot}/kafka-acl-extended-changes/{change}")[0]) == {
                "version": 1, "resourceType": "GROUP", "name": "team-", "patternType": "PREFIXED"}
            # a third party (kafka-acls, another Kafka tool) writes an ACL and its notification
            kz.create(f"{chroot}/kafka-acl/Topic/legacy", json.dumps({"version": 1, "acls": [
                {"principal": "User:carol", "host": "*", "operation": "All", "permissionType": "Allow"}]}).encode(),
                makepath=True)
            kz.create(f"{chroot}/kafka-acl-changes/acl_changes_", b"Topic:legacy", sequence=True)
        finally:
            kz.stop()
            kz.close()
        # the other broker applies both, from the notifications
        await wait_until_async(lambda: a2.authorize("User:carol", "h", WRITE, TOPIC, "legacy")
                               and a2.authorize("User:alice", "h", READ, GROUP, "team-a"), 10,
                               "the other broker has the ACLs")
        assert a2.authorize("User:alice", "h", READ, TOPIC, "orders")
        await wait_until_async(lambda: a1.authorize("User:carol", "h", WRITE, TOPIC, "legacy"), 10,
                               "the writing broker applies the third party's ACL too")
        assert sorted(map(str, a2.bindings())) == sorted(map(str, a1.bindings()))
        assert len(a2.bindings()) == 4
        # deletion, by filter, likewise
        deleted = await s2.delete([AclBindingFilter(TOPIC, "orders", LIT, "User:alice"),
                                   AclBindingFilter(GROUP, "team-x", "match")])
        assert [str(b) for b, e in deleted[0] if e is None] == [str(bindings[0])]
        assert [str(b) for b, e in deleted[1] if e is None] == [str(bindings[2])]
        await wait_until_async(lambda: not a1.authorize("User:alice", "h", READ, TOPIC, "orders")
                               and not a1.authorize("User:alice", "h", READ, GROUP, "team-a"), 10,
                               "the first broker saw the deletions")
        assert [str(b) for b in a1.bindings(AclBindingFilter(TOPIC, "orders"))] == [str(bindings[1])]
        # a broker that starts now loads everything
        a3 = Authorizer()
        async with ZkClient(zookeeper.connect_string, chroot=chroot) as zk3:
            s3 = ZkAclStore(zk3, a3)
            await s3.load_all()
        assert sorted(map(str, a3.bindings())) == sorted(map(str, a1.bindings()))
        nursery.cancel_scope.cancel()


async def test_concurrent_writers_keep_every_acl(zookeeper, chroot):
    async with ZkClient(zookeeper.connect_string, chroot=chroot) as zk1, \
            ZkClient(zookeeper.connect_string, chroot=chroot) as zk2:
        await zk1.ensure_acl_paths()

        async def add(zk, principal):
            await zk.update_acls(TOPIC, "hot", LIT, lambda old: old | {(principal, "*", READ, ALLOW)})

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(add, zk1 if i % 2 else zk2, f"User:u{i}")
        entries, version = await zk1.get_acls(TOPIC, "hot", LIT)
        assert {p for p, *_ in entries} == {f"User:u{i}" for i in range(20)}
        assert version == 19  # created once, then 19 check-and-set writes
        # removing the last entry removes the znode
        await zk2.update_acls(TOPIC, "hot", LIT, lambda old: frozenset())
        assert await zk1.get_acls(TOPIC, "hot", LIT) is None


async def test_old_change_notifications_are_purged(zookeeper, chroot):
    now = [0]  # the store's clock: nothing has expired yet
    async with ZkClient(zookeeper.connect_string, chroot=chroot) as zk, trio.open_nursery() as nursery:
        store = ZkAclStore(zk, Authorizer(), change_expiration_ms=60_000, clock_ms=lambda: now[0])
        await nursery.start(store.run)
        for name in ("a", "b", "c"):
            await store.create([AclBinding(TOPIC, name, LIT, "User:x", "*", READ, ALLOW)])

        async def notifications():
            return await zk._children(zk.paths.acl_changes(LIT)) or []

        await wait_until_async(lambda: len(store._created[LIT]) == 3, 10, "the notifications were seen")
        assert len(await notifications()) == 3
        now[0] = 10**14  # long after they were created
        await store.create([AclBinding(TOPIC, "d", LIT, "User:x", "*", READ, ALLOW)])
        await wait_until_async(lambda: not store._created[LIT], 10, "the old notifications were purged")
        assert await notifications() == []
        nursery.cancel_scope.cancel()


async def test_the_start_waits_out_an_unreachable_zookeeper(zookeeper, chroot):
    """The ACLs are loaded before any listener opens, and a ZooKeeper that does not answer
    for several op timeouts delays that start instead of ending the broker."""
    proxy = TcpProxy(zookeeper.port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.run)
        async with ZkClient(f"127.0.0.1:{proxy.port}", chroot=chroot, session_timeout_ms=2000,
                            op_timeout_s=0.5) as zk, ZkClient(zookeeper.connect_string, chroot=chroot) as writer:
            await ZkAclStore(writer, Authorizer()).create(
                [AclBinding(TOPIC, "orders", LIT, "User:alice", "*", READ, ALLOW)])
            authorizer = Authorizer()
            store = ZkAclStore(zk, authorizer)
            proxy.cut()
            started = trio.Event()

            async def start() -> None:
                await nursery.start(store.run)
                started.set()
            nursery.start_soon(start)
            await trio.sleep(3 * zk.op_timeout_s + 1)
            assert not started.is_set()
            proxy.restore()
            with trio.fail_after(20):
                await started.wait()
            assert len(authorizer.acls) == 1
            nursery.cancel_scope.cancel()
