"""What the console's principal may do, so the page never offers an action its ACLs forbid.

The console asks the cluster for the ACLs once at start and at each refresh
(``Admin.describe_acls``) and decides with Kafka's rules, restricted to what it can know
from a client: the bindings of its principal and of ``User:*`` whose pattern covers the
resource (a LITERAL name or ``*``, or a PREFIXED prefix) apply; a matching Deny refuses; a
matching Allow of the operation, of ``All``, or of one that implies it (Read, Write, Delete
and Alter imply Describe; AlterConfigs implies DescribeConfigs) allows; creating a topic is
allowed by Create on the Cluster or on the topic.

Three modes:

=========  =====================================================================================
mode       when, and what is offered
=========  =====================================================================================
open       the cluster has no authorizer (SECURITY_DISABLED), or the principal may describe the
           ACLs while none names it (a super user): everything
acls       the principal's bindings are known: what they allow
read-only  the ACLs cannot be read (no Describe on the Cluster): no action that changes the
           cluster, since none can be shown to be allowed; reading is still tried, and a
           refusal shows the broker's text
=========  =====================================================================================
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from tidelog.protocol.acls import (
    CLUSTER_NAME,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

OPEN, ACLS, READ_ONLY = "open", "acls", "read-only"
_IMPLIES = {
    AclOperation.DESCRIBE: {AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER},
    AclOperation.DESCRIBE_CONFIGS: {AclOperation.ALTER_CONFIGS},
}
_READS = {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS}


@dataclass(frozen=True, slots=True)
class Permissions:
    mode: str
    principal: str
    bindings: tuple[AclBinding, ...] = field(default_factory=tuple)
    reason: str = ""

    @classmethod
    def from_bindings(cls, principal: str, bindings: Iterable[AclBinding]) -> Permissions:
        """``bindings``: every ACL the cluster holds (describe_acls answered)."""
        mine = tuple(b for b in bindings if b.principal in (principal, WILDCARD_PRINCIPAL))
        if not any(b.principal == principal for b in mine):
            return cls(OPEN, principal, reason=f"{principal} may describe the ACLs and none names it: "
                                               "treated as a super user")
        return cls(ACLS, principal, mine)

    def can(self, operation: str, resource_type: str, name: str) -> bool:
        op, rtype = AclOperation[operation], ResourceType[resource_type]
        if self.mode == OPEN:
            return True
        if self.mode == READ_ONLY:
            return op in _READS
        if op == AclOperation.CREATE and rtype == ResourceType.TOPIC and self._allowed(op, ResourceType.CLUSTER,
                                                                                      CLUSTER_NAME):
            return True
        return self._allowed(op, rtype, name)

    def can_create_topics(self) -> bool:
        """Whether some topic may be created (the Create button): Create on the cluster, or
        an Allow of it on some topics (the name typed is checked when it is sent)."""
        if self.mode != ACLS:
            return self.mode == OPEN
        if self.can("CREATE", "CLUSTER", CLUSTER_NAME):
            return True
        return any(b.restype == ResourceType.TOPIC and b.permission_type == AclPermissionType.ALLOW
                   and b.operation in (AclOperation.CREATE, AclOperation.ALL) and b.host == "*"
                   for b in self.bindings)

    def _allowed(self, op: AclOperation, rtype: ResourceType, name: str) -> bool:
        applying = [b for b in self.bindings if b.restype == rtype and _covers(b, name)]
        granting = {op, AclOperation.ALL} | _IMPLIES.get(op, set())
        if any(b.permission_type == AclPermissionType.DENY and b.operation in (op, AclOperation.ALL)
               for b in applying):
            return False  # a Deny for any host counts: the console cannot tell which host it is seen as
        return any(b.permission_type == AclPermissionType.ALLOW and b.operation in granting and b.host == "*"
                   for b in applying)

    def summary(self) -> dict:
        return {"mode": self.mode, "principal": self.principal, "reason": self.reason,
                "can_create_topics": self.can_create_topics()}


def _covers(b: AclBinding, name: str) -> bool:
    if b.resource_pattern_type == ResourcePatternType.LITERAL:
        return b.name in (name, WILDCARD_RESOURCE)
    if b.resource_pattern_type == ResourcePatternType.PREFIXED:
        return name.startswith(b.name)
    return False


def principal_of(security: dict) -> str:
    """The principal the brokers see the console as, as far as its settings tell."""
    user = security.get("sasl_plain_username")
    if user and str(security.get("security_protocol", "")).startswith("SASL"):
        return f"User:{user}"
    return "User:ANONYMOUS"
