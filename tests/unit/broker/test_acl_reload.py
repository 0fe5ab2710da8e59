"""An ACL znode that does not parse fails closed: everything on its pattern is denied to all
but the super users until it parses (read as no ACLs, it would drop a Deny, and with
allow.everyone.if.no.acl.found open the resource to everyone)."""

from __future__ import annotations

from tidelog.broker.security.authorizer import Authorizer, ZkAclStore
from tidelog.protocol.acls import AclOperation, AclPermissionType, ResourcePatternType, ResourceType

ORDERS = (ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL)


class Zk:
    def __init__(self) -> None:
        self.acls: dict = {}

    async def get_acls(self, resource_type, name, pattern_type):
        got = self.acls[(resource_type, name, pattern_type)]
        if isinstance(got, Exception):
            raise got
        return got, 0


async def test_an_unreadable_acl_znode_denies_everything_on_its_pattern_until_it_parses():
    zk = Zk()
    authorizer = Authorizer(["User:admin"], allow_everyone_if_no_acl_found=True)
    store = ZkAclStore(zk, authorizer)

    def may_read(principal: str) -> bool:
        return authorizer.authorize(principal, "10.0.0.1", AclOperation.READ, ResourceType.TOPIC, "orders")

    assert may_read("User:mallory")  # no ACLs at all: everyone (allow.everyone.if.no.acl.found)
    zk.acls[ORDERS] = ValueError("unknown operation 'Teleport'")  # written by a newer tool
    await store.reload(ORDERS)
    assert not may_read("User:mallory") and not may_read("User:alice")
    assert may_read("User:admin")  # a super user still may
    zk.acls[ORDERS] = frozenset({("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW)})
    await store.reload(ORDERS)
    assert may_read("User:alice") and not may_read("User:mallory")
