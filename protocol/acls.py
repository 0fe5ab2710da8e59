"""ACL bindings as Kafka models them: resource patterns, access control entries, filters.

Shared by the broker (the authorizer, the CreateAcls/DescribeAcls/DeleteAcls handlers) and
the SDK (``Admin.create_acls`` and friends, ``tidelog acls``), so it is sans-IO and depends on
nothing but the stdlib. Numbers are Kafka's wire codes; names are Kafka's (the text forms
ZooKeeper and kafka-acls use: ``Topic``, ``ClusterAction``, ``Allow``).

A binding says: *principal* from *host* is allowed (or denied) *operation* on the resources
*pattern* names. A pattern is a resource type, a name and a pattern type:

=============  ==========================================================================
pattern type   which resource names it covers
=============  ==========================================================================
LITERAL        exactly ``name``; the name ``*`` covers every resource of the type
PREFIXED       every name that starts with ``name``
=============  ==========================================================================

A *filter* (DescribeAcls, DeleteAcls) has the same fields, each of which may be left open:
``ANY`` for the enums, ``None`` for the strings. Its pattern type may also be ``MATCH``: the
bindings whose pattern covers the filter's name (the literal name, ``*``, and every prefix of
it), which is what "the ACLs that affect this resource" means. ``matches`` is Kafka's
``AclBindingFilter.matches``.

Principals are ``Type:name`` (``User:alice``); ``User:*`` is every principal, the host ``*``
every host. The Cluster resource has one name, ``kafka-cluster``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["ResourceType", "ResourcePatternType", "AclOperation", "AclPermissionType", "AclBinding",
           "AclBindingFilter", "AclError", "CLUSTER_NAME", "WILDCARD_RESOURCE", "WILDCARD_PRINCIPAL",
           "WILDCARD_HOST", "parse_enum", "parse_principal"]

CLUSTER_NAME = "kafka-cluster"
WILDCARD_RESOURCE = "*"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"


class AclError(ValueError):
    """A binding or filter that cannot be stored or matched; the message says which field."""


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5

    @property
    def kafka_name(self) -> str:
        """Kafka's text form: ``Topic``, ``Group``, ``Cluster``, ``TransactionalId`` (the
        ZooKeeper path element and kafka-acls' output)."""
        return _RESOURCE_NAMES[self]


class ResourcePatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4

    @property
    def kafka_name(self) -> str:
        return self.name


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12

    @property
    def kafka_name(self) -> str:
        """``Read``, ``ClusterAction``, ``IdempotentWrite``, ... (ZooKeeper's JSON)."""
        return _camel(self.name)


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3

    @property
    def kafka_name(self) -> str:
        return _camel(self.name)


_RESOURCE_NAMES = {ResourceType.UNKNOWN: "Unknown", ResourceType.ANY: "Any", ResourceType.TOPIC: "Topic",
                   ResourceType.GROUP: "Group", ResourceType.CLUSTER: "Cluster",
                   ResourceType.TRANSACTIONAL_ID: "TransactionalId"}
_SPECIFIC_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _squash(text: str) -> str:
    return text.replace("_", "").replace("-", "").lower()


def parse_enum(enum: type[IntEnum], value: object, what: str) -> IntEnum:
    """An enum member from itself, its wire code, or any spelling of its name (``Topic``,
    ``TOPIC``, ``cluster-action``, ``ClusterAction``); AclError naming ``what`` otherwise."""
    if isinstance(value, enum):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return enum(value)
        except ValueError:
            pass
    elif isinstance(value, str):
        wanted = _squash(value.strip())
        for member in enum:
            if _squash(member.name) == wanted:
                return member
    known = ", ".join(getattr(m, "kafka_name", m.name) for m in enum if m.name not in ("UNKNOWN",))
    raise AclError(f"{what} {value!r} is not one of {known}")


def parse_principal(text: str) -> str:
    """``Type:name`` with both parts non-empty (``User:alice``, ``User:*``); AclError otherwise."""
    if not isinstance(text, str):
        raise AclError(f"principal {text!r} is not a string")
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise AclError(f"principal {text!r} is not of the form Type:name (e.g. User:alice)")
    return text


def _check_resource(resource_type: ResourceType, name: str, pattern_type: ResourcePatternType) -> None:
    if resource_type not in _SPECIFIC_TYPES:
        raise AclError(f"resource type {resource_type.kafka_name} cannot be stored: use Topic, Group, "
                       "Cluster or TransactionalId")
    if pattern_type not in (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED):
        raise AclError(f"pattern type {pattern_type.name} cannot be stored: use LITERAL or PREFIXED")
    if not isinstance(name, str) or not name:
        raise AclError("the resource name is empty")
    if "/" in name:
        raise AclError(f"resource name {name[:100]!r} has a '/'")
    if resource_type is ResourceType.CLUSTER and name != CLUSTER_NAME:
        raise AclError(f"the only name of the Cluster resource is {CLUSTER_NAME}, not {name[:100]!r}")


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: ``principal`` from ``host`` is ``permission_type`` ``operation`` on the resources
    that (``restype``, ``name``, ``resource_pattern_type``) covers. The fields and their order
    are confluent-kafka's; enums may be given by code or name, and are stored as members."""

    restype: ResourceType
    name: str
    resource_pattern_type: ResourcePatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def __post_init__(self) -> None:
        _parse_enums(self)

    def validate(self) -> AclBinding:
        """Self, if it can be stored (specific enums, a valid pattern, ``Type:name`` principal,
        a host); AclError naming the field otherwise."""
        _check_resource(self.restype, self.name, self.resource_pattern_type)
        parse_principal(self.principal)
        if not isinstance(self.host, str) or not self.host:
            raise AclError("the host is empty (use * for every host)")
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise AclError(f"operation {self.operation.name} cannot be stored")
        if self.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise AclError(f"permission type {self.permission_type.name} cannot be stored: use Allow or Deny")
        return self

    @property
    def pattern(self) -> tuple[ResourceType, str, ResourcePatternType]:
        return self.restype, self.name, self.resource_pattern_type

    @property
    def entry(self) -> tuple[str, str, AclOperation, AclPermissionType]:
        return self.principal, self.host, self.operation, self.permission_type

    def __str__(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, operation={self.operation.kafka_name}, "
                f"permissionType={self.permission_type.kafka_name}) on "
                f"{self.restype.kafka_name}:{self.resource_pattern_type.name}:{self.name}")


_ENUM_FIELDS = (("restype", ResourceType, "resource type"), ("resource_pattern_type", ResourcePatternType, "pattern type"),
                ("operation", AclOperation, "operation"), ("permission_type", AclPermissionType, "permission type"))


def _parse_enums(acl: AclBinding | AclBindingFilter) -> None:
    """The four enum fields of a binding or filter as members (given by code, name or member)."""
    for field_name, kind, what in _ENUM_FIELDS:
        object.__setattr__(acl, field_name, parse_enum(kind, getattr(acl, field_name), what))


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which bindings to describe or delete: ``ANY`` (enums) and ``None`` (strings) match
    anything; ``resource_pattern_type`` MATCH selects the patterns that cover ``name``."""

    restype: ResourceType = ResourceType.ANY
    name: str | None = None
    resource_pattern_type: ResourcePatternType = ResourcePatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def __post_init__(self) -> None:
        _parse_enums(self)

    def validate(self) -> AclBindingFilter:
        for value, what in ((self.restype, "resource type"), (self.resource_pattern_type, "pattern type"),
                            (self.operation, "operation"), (self.permission_type, "permission type")):
            if value == 0:
                raise AclError(f"the filter's {what} is UNKNOWN")
        if self.principal is not None:
            parse_principal(self.principal)
        return self

    def matches_pattern(self, restype: ResourceType, name: str, pattern_type: ResourcePatternType) -> bool:
        """Kafka's ``ResourcePatternFilter.matches`` for a stored pattern."""
        if self.restype is not ResourceType.ANY and self.restype is not restype:
            return False
        wanted = self.resource_pattern_type
        if wanted not in (ResourcePatternType.ANY, ResourcePatternType.MATCH) and wanted is not pattern_type:
            return False
        if self.name is None:
            return True
        if wanted in (ResourcePatternType.ANY, pattern_type):
            return self.name == name
        if pattern_type is ResourcePatternType.LITERAL:  # MATCH
            return name == self.name or name == WILDCARD_RESOURCE
        return self.name.startswith(name)

    def matches_entry(self, principal: str, host: str, operation: AclOperation,
                      permission_type: AclPermissionType) -> bool:
        return ((self.principal is None or self.principal == principal)
                and (self.host is None or self.host == host)
                and (self.operation is AclOperation.ANY or self.operation is operation)
                and (self.permission_type is AclPermissionType.ANY or self.permission_type is permission_type))

    def matches(self, binding: AclBinding) -> bool:
        return self.matches_pattern(*binding.pattern) and self.matches_entry(*binding.entry)

    @property
    def matches_at_most_one(self) -> bool:
        """Every field given: the filter names one binding (kafka-acls --remove without --force
        still asks first, whatever this says)."""
        return (self.restype not in (ResourceType.ANY, ResourceType.UNKNOWN) and self.name is not None
                and self.resource_pattern_type in (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED)
                and self.principal is not None and self.host is not None
                and self.operation not in (AclOperation.ANY, AclOperation.UNKNOWN)
                and self.permission_type not in (AclPermissionType.ANY, AclPermissionType.UNKNOWN))

    @classmethod
    def of(cls, binding: AclBinding) -> AclBindingFilter:
        """The filter that matches exactly ``binding``."""
        return cls(*binding.pattern, *binding.entry)
