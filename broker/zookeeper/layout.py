"""Tidelog's ZooKeeper layout as pure data: znode paths, JSON codecs, replica placement.

Nothing here talks to ZooKeeper (that is ``broker.zookeeper.zk``, the only module that
imports kazoo); everything here is testable without a server. The layout (docs/architecture.md,
section 9) is under a chroot (``zookeeper.chroot``, default ``/tidelog``)::

    /cluster/id                                   {"version":"1","id":...}
    /brokers/ids/<id>                 ephemeral   {"version":1,"host","port","rack","endpoints"}
    /brokers/topics/<topic>                       {"version":1,"partitions":{"0":[1,2,3]}}
    /brokers/topics/<topic>/partitions/<p>/state  {"version":1,"leader","leader_epoch","isr","controller_epoch"}
    /controller                       ephemeral   {"version":1,"brokerid"}
    /controller_epoch                             "<int>"
    /config/topics/<topic>                        {"version":1,"config":{...}}
    /config/users/<user>                          {"version":1,"config":{...}}  SCRAM credentials, quotas
    /config/users/<user>/clients/<client id>      {"version":1,"config":{...}}  quotas
    /config/clients/<client id>                   {"version":1,"config":{...}}  quotas
    /config/changes/config_change_<seq>           {"version":2,"entity_path":"users/alice"}
    /admin/delete_topics/<topic>
    /admin/reassign_partitions                    {"version":1,"partitions":[{"topic","partition","replicas"}]}
    /isr_change_notification/isr_change_<seq>     {"version":1,"partitions":[{"topic","partition"}]}
    /replica_damage_notification/replica_damage_<seq>  {"version":1,"broker","broker_epoch","partitions":[{"topic","partition"}],"offline"?}
    /latest_producer_id_block                     {"version":1,"broker","block_start","block_end"}
    /kafka-acl/<ResourceType>/<name>              {"version":1,"acls":[{"principal","permissionType","operation","host"}]}
    /kafka-acl-extended/prefixed/<ResourceType>/<name>   the same, for PREFIXED patterns
    /kafka-acl-changes/acl_changes_<seq>          "<RESOURCE_TYPE>:<name>" (a LITERAL pattern changed)
    /kafka-acl-extended-changes/acl_changes_<seq> {"version":1,"resourceType","name","patternType"}

User and client-id entities (``users``, ``clients``) are named as Kafka names them: the
name sanitized (``sanitize``: URL-encoded, so any user name is one znode name) or the
literal ``<default>`` (``DEFAULT_ENTITY``), the entity every user or client id without one
of its own falls back to. A name that reads ``<default>`` is a name like any other, stored
sanitized (%3Cdefault%3E): as a name, ``DEFAULT_ENTITY`` is told apart by identity. An
entity's path relative to ``/config`` (``users/alice``, ``users/<default>/clients/app-1``) is
its *entity path*: the change notifications carry it.

The JSON shapes are Kafka's, so Kafka's documentation of them applies. Decoders accept and
ignore keys they do not know (a newer writer may add some) and raise ``ValueError`` naming
the znode kind for anything malformed: a corrupt znode is reported, never half-read.

Znode ACLs are decided here too (``ZkPaths.znode_acl``, Kafka's ``ZkData.defaultAcls``): open
to all by default; with ``zookeeper.set.acl``, ALL for the brokers' digest identity
(``DigestCredentials``) and READ for anyone else, except under ``/config/users``, which
holds credentials and is the brokers' alone.

The errors of the coordination layer live here too, so that code which only *handles* them
(the controller, fakes in tests) need not import the kazoo module.
"""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, NamedTuple

from tidelog.broker.security.listeners import parse_endpoints
from tidelog.protocol.acls import (
    AclError,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    parse_enum,
    parse_principal,
)
from tidelog.protocol.address import MAX_PORT
from tidelog.protocol.errors import (
    NOT_CONTROLLER,
    REQUEST_TIMED_OUT,
    TOPIC_ALREADY_EXISTS,
    TidelogError,
)
from tidelog.protocol.topics import MAX_TOPIC_NAME_LENGTH

DEFAULT_CHROOT = "/tidelog"
NO_LEADER = -1          # Kafka's LeaderAndIsr.NoLeader
INITIAL_CONTROLLER_EPOCH = 0
INITIAL_LEADER_EPOCH = 0
USERS, CLIENTS = "users", "clients"  # the entity types of user and client-id configs
BROKERS = "brokers"  # dynamic broker configs: brokers/<id>, brokers/<default> (the cluster's)


class _DefaultName(str):
    """``DEFAULT_ENTITY``'s type: it reads ``<default>`` in a path, and as a name (the default
    user or client id, Kafka's null name) it is compared by identity (``is``), so that a user
    or client id that is the string ``<default>`` stays a name of its own."""

    __slots__ = ()


DEFAULT_ENTITY = _DefaultName("<default>")  # Kafka's ConfigEntityName.Default
CONFIG_CHANGE_PREFIX = "config_change_"


# --------------------------------------------------------------------------- errors

class ZkError(TidelogError):
    """A ZooKeeper operation failed. ``op_index`` is set when it was one op of a transaction."""

    op_index: int | None = None


class ZkTimeoutError(ZkError):
    """The operation did not complete within the client's op timeout (ZooKeeper unreachable?)."""

    error = REQUEST_TIMED_OUT


class ZkConnectionError(ZkError):
    """The connection was lost (or the session expired / the client was closed) mid-operation.

    The operation may or may not have been applied: callers re-read before retrying."""

    error = REQUEST_TIMED_OUT


class ZkNoNodeError(ZkError):
    pass


class ZkNodeExistsError(ZkError):
    pass


class ZkVersionConflict(ZkError):
    """A check-and-set write carried a stale znode version (ZooKeeper's BADVERSION)."""


class ZkNoAuthError(ZkError):
    """ZooKeeper refused the operation (NOAUTH): the znode's ACL does not grant this client's
    ZooKeeper identity the permission (see "ZooKeeper security" in docs/operations.md)."""


class ControllerMovedError(ZkError):
    """A write fenced by ``/controller_epoch`` failed: another controller was elected since."""

    error = NOT_CONTROLLER


class TopicExistsError(ZkNodeExistsError):
    error = TOPIC_ALREADY_EXISTS


class BrokerIdInUseError(ZkError):
    """Another live ZooKeeper session holds ``/brokers/ids/<id>``."""


# --------------------------------------------------------------------------- paths

def _check_name(name: str, what: str) -> str:
    """Reject names that would escape their parent znode (defence; real validation is elsewhere)."""
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") \
            or len(name) > MAX_TOPIC_NAME_LENGTH:
        raise ValueError(f"{what} {name!r} cannot be a znode name")
    return name


def split_connect(connect: str) -> tuple[str, str | None]:
    """``"h1:2181,h2:2181/kafka"`` -> ``("h1:2181,h2:2181", "/kafka")``; no suffix -> None."""
    hosts, slash, chroot = connect.partition("/")
    if not hosts:
        raise ValueError(f"zookeeper connect string {connect!r} names no host")
    return hosts, (normalize_chroot("/" + chroot) if slash else None)


def normalize_chroot(chroot: str) -> str:
    """``"/tidelog/"`` -> ``"/tidelog"``; ``"/"`` or ``""`` -> ``""`` (the ZooKeeper root)."""
    chroot = chroot.rstrip("/")
    if chroot and not chroot.startswith("/"):
        raise ValueError(f"zookeeper chroot {chroot!r} must start with '/'")
    if "//" in chroot:
        raise ValueError(f"zookeeper chroot {chroot!r} has an empty path element")
    return chroot


@dataclass(frozen=True)
class ZkPaths:
    """Every znode path Tidelog uses, absolute (chroot included)."""

    chroot: str = DEFAULT_CHROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "chroot", normalize_chroot(self.chroot))

    def _p(self, *parts: str | int) -> str:
        return self.chroot + "/" + "/".join(str(p) for p in parts)

    @property
    def root(self) -> str:
        return self.chroot or "/"

    @property
    def cluster_id(self) -> str:
        return self._p("cluster", "id")

    @property
    def broker_ids(self) -> str:
        return self._p("brokers", "ids")

    def broker(self, broker_id: int) -> str:
        return self._p("brokers", "ids", int(broker_id))

    @property
    def topics(self) -> str:
        return self._p("brokers", "topics")

    def topic(self, topic: str) -> str:
        return self._p("brokers", "topics", _check_name(topic, "topic"))

    def partitions(self, topic: str) -> str:
        return self.topic(topic) + "/partitions"

    def partition(self, topic: str, partition: int) -> str:
        return f"{self.partitions(topic)}/{int(partition)}"

    def partition_state(self, topic: str, partition: int) -> str:
        return self.partition(topic, partition) + "/state"

    @property
    def controller(self) -> str:
        return self._p("controller")

    @property
    def controller_epoch(self) -> str:
        return self._p("controller_epoch")

    @property
    def config_topics(self) -> str:
        return self._p("config", "topics")

    def topic_config(self, topic: str) -> str:
        return self._p("config", "topics", _check_name(topic, "topic"))

    def entity_type(self, entity_type: str) -> str:
        """``/config/users`` or ``/config/clients``: the entities of a type are its children."""
        if entity_type not in (USERS, CLIENTS, BROKERS):
            raise ValueError(f"unknown config entity type {entity_type!r}")
        return self._p("config", entity_type)

    def user_clients(self, sanitized_user: str) -> str:
        """``/config/users/<user>/clients``: the user's client-id entities."""
        parse_entity_path(f"{USERS}/{sanitized_user}")
        return self._p("config", USERS, sanitized_user, CLIENTS)

    def entity_config(self, entity_path: str) -> str:
        """The znode of an entity config: ``users/alice`` -> ``/config/users/alice``."""
        if entity_path.startswith(BROKERS + "/"):
            parse_broker_entity_path(entity_path)
        else:
            parse_entity_path(entity_path)  # only the four shapes of user and client-id entities
        return self._p("config", entity_path)

    @property
    def config_changes(self) -> str:
        return self._p("config", "changes")

    @property
    def config_change_prefix(self) -> str:
        """Prefix of the sequential change notifications (ZooKeeper appends 10 digits)."""
        return self._p("config", "changes", CONFIG_CHANGE_PREFIX)

    @property
    def delete_topics(self) -> str:
        return self._p("admin", "delete_topics")

    def delete_topic_marker(self, topic: str) -> str:
        return self._p("admin", "delete_topics", _check_name(topic, "topic"))

    @property
    def reassign_partitions(self) -> str:
        return self._p("admin", "reassign_partitions")

    @property
    def isr_change_notification(self) -> str:
        return self._p("isr_change_notification")

    @property
    def isr_change_prefix(self) -> str:
        """Prefix of the sequential notification znodes (ZooKeeper appends 10 digits)."""
        return self._p("isr_change_notification", "isr_change_")

    @property
    def replica_damage_notification(self) -> str:
        """A broker's report of replicas it lost on disk: found damaged, or, with ``"offline":
        true``, in a log directory that failed (Tidelog's; Kafka reports the latter as a
        ``/log_dir_event_notification`` naming the broker, and learns the replicas from its
        answers to LeaderAndIsr)."""
        return self._p("replica_damage_notification")

    @property
    def replica_damage_prefix(self) -> str:
        return self._p("replica_damage_notification", "replica_damage_")

    @property
    def latest_producer_id_block(self) -> str:
        return self._p("latest_producer_id_block")

    # ACLs: Kafka's AclAuthorizer layout (LITERAL and PREFIXED patterns in two trees, each with
    # its change notifications)

    def acl_root(self, pattern_type: ResourcePatternType) -> str:
        if pattern_type is ResourcePatternType.LITERAL:
            return self._p("kafka-acl")
        if pattern_type is ResourcePatternType.PREFIXED:
            return self._p("kafka-acl-extended", "prefixed")
        raise ValueError(f"ACLs of pattern type {pattern_type.name} are not stored")

    def acl_type(self, pattern_type: ResourcePatternType, resource_type: ResourceType) -> str:
        return f"{self.acl_root(pattern_type)}/{resource_type.kafka_name}"

    def acl(self, resource_type: ResourceType, name: str, pattern_type: ResourcePatternType) -> str:
        return f"{self.acl_type(pattern_type, resource_type)}/{check_acl_name(name)}"

    def acl_changes(self, pattern_type: ResourcePatternType) -> str:
        """The change notifications of one pattern tree (LITERAL: Kafka's legacy form)."""
        if pattern_type is ResourcePatternType.LITERAL:
            return self._p("kafka-acl-changes")
        return self._p("kafka-acl-extended-changes")

    def acl_change_prefix(self, pattern_type: ResourcePatternType) -> str:
        return self.acl_changes(pattern_type) + "/" + ACL_CHANGE_PREFIX

    def acl_paths(self) -> tuple[str, ...]:
        """The ACL containers (created by the authorizer and by an ACL write, not at start)."""
        stored = (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED)
        return tuple(self.acl_root(t) for t in stored) + tuple(self.acl_changes(t) for t in stored)

    def persistent_paths(self) -> tuple[str, ...]:
        """The container znodes created at client start (Kafka's top-level paths)."""
        return (self.broker_ids, self.topics, self.config_topics, self.entity_type(USERS),
                self.entity_type(CLIENTS), self.config_changes, self.delete_topics,
                self.isr_change_notification, self.replica_damage_notification)

    # znode ACLs (zookeeper.set.acl): which znodes are secret, which ones a broker secures

    def sensitive(self, path: str) -> bool:
        """Whether ``path`` holds secrets: ``/config/users`` and everything below it (SCRAM
        credentials), as Kafka's ``ZkData.sensitivePath``. Their ACL grants no one else READ."""
        root = self.entity_type(USERS)
        return path == root or path.startswith(root + "/")

    def znode_acl(self, path: str, owner: str | None) -> tuple["ZkAcl", ...]:
        """The ACL ``path`` is created with (Kafka's ``ZkData.defaultAcls``). ``owner`` is the
        digest identity of the brokers (``DigestCredentials.identity``) when
        ``zookeeper.set.acl`` is on, else None: then anyone may do anything (ZooKeeper's
        OPEN_ACL_UNSAFE). With an owner: ALL to the owner, and READ to anyone unless the path
        is sensitive, so that tools and clients can still read brokers, topics, partition
        states and the controller, and only the brokers can change them."""
        if owner is None:
            return (WORLD_ALL,)
        mine = ZkAcl(ALL, DIGEST, owner)
        return (mine,) if self.sensitive(path) else (mine, WORLD_READ)

    def secure_root_paths(self) -> tuple[str, ...]:
        """Every top-level znode of the cluster (Kafka's ``ZkData.SecureRootPaths``): the
        security migration sets the ACL of these, everything below them, and the chroot."""
        names = ("admin", "brokers", "cluster", "config", "controller", "controller_epoch",
                 "isr_change_notification", "replica_damage_notification", "latest_producer_id_block",
                 "kafka-acl", "kafka-acl-changes",
                 "kafka-acl-extended", "kafka-acl-extended-changes")
        return tuple(self._p(n) for n in names)

    def container_paths(self) -> tuple[str, ...]:
        """The chroot and the containers every broker ensures (``persistent_paths``, their
        parents, ``/controller_epoch``, the ACL trees), top-down: those that exist with an ACL
        more open than ``znode_acl`` are secured by a broker with ``zookeeper.set.acl`` at
        start. The znodes below them are the security migration's."""
        inside = [p for path in (*self.persistent_paths(), self.controller_epoch, *self.acl_paths())
                  for p in lineage(path) if p.startswith(self.chroot + "/")]
        return tuple(dict.fromkeys(([self.chroot] if self.chroot else []) + inside))


def lineage(path: str) -> tuple[str, ...]:
    """``"/a/b/c"`` -> ``("/a", "/a/b", "/a/b/c")``: the znodes that must exist, top-down,
    for ``path`` to exist (each created with its own ACL, never its child's)."""
    parts = [p for p in path.split("/") if p]
    return tuple("/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1))


ACL_CHANGE_PREFIX = "acl_changes_"
MAX_ACL_NAME_LENGTH = 1024  # longer names (group ids may be 32,767 bytes) take a PREFIXED ACL


def check_acl_name(name: str) -> str:
    """A resource name as a znode name: not empty, no '/', not '.' or '..', at most
    MAX_ACL_NAME_LENGTH characters, none of the characters ZooKeeper refuses in a path
    (controls, surrogates, U+F000-U+F8FF, U+FFF0-U+FFFF). AclError otherwise."""
    if not isinstance(name, str) or not name or name in (".", ".."):
        raise AclError(f"resource name {name!r} cannot be stored")
    if len(name) > MAX_ACL_NAME_LENGTH:
        raise AclError(f"resource name of {len(name)} characters is longer than {MAX_ACL_NAME_LENGTH}: "
                       "use a PREFIXED ACL")
    for ch in name:
        o = ord(ch)
        if ch == "/" or o < 0x20 or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xF8FF or o >= 0xFFF0:
            raise AclError(f"resource name {name[:100]!r} has a character ZooKeeper cannot store ({o:#06x})")
    return name


# --------------------------------------------------------------------------- znode ACLs

READ, WRITE, CREATE, DELETE, ADMIN = 1, 2, 4, 8, 16  # ZooKeeper's permission bits (ZooDefs.Perms)
ALL = READ | WRITE | CREATE | DELETE | ADMIN
DIGEST, WORLD, ANYONE = "digest", "world", "anyone"


@dataclass(frozen=True, slots=True)
class ZkAcl:
    """One entry of a znode's ACL: ``perms`` (the bits above) granted to ``scheme:id``."""

    perms: int
    scheme: str
    id: str


WORLD_ALL = ZkAcl(ALL, WORLD, ANYONE)  # ZooKeeper's OPEN_ACL_UNSAFE
WORLD_READ = ZkAcl(READ, WORLD, ANYONE)  # ZooKeeper's READ_ACL_UNSAFE


@dataclass(frozen=True, slots=True)
class DigestCredentials:
    """The brokers' ZooKeeper identity (``zookeeper.digest.username`` and ``.password``),
    for ZooKeeper's digest scheme: a session adds ``auth`` ("digest", "user:password") and
    is then known as ``identity`` ("user:" + base64 of the SHA-1 of "user:password"), the id
    that ACLs name. The password is never part of the repr."""

    username: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.username or ":" in self.username:
            raise ValueError(f"ZooKeeper digest username {self.username!r} must be non-empty and without ':'")
        if not self.password:
            raise ValueError(f"ZooKeeper digest password of {self.username!r} is empty")

    @property
    def auth(self) -> tuple[str, str]:
        return DIGEST, f"{self.username}:{self.password}"

    @property
    def identity(self) -> str:
        """ZooKeeper's ``DigestAuthenticationProvider.generateDigest``: SHA-1, base64."""
        digest = hashlib.sha1(f"{self.username}:{self.password}".encode()).digest()
        return f"{self.username}:{base64.b64encode(digest).decode()}"


def world_perms(acl: Iterable[ZkAcl]) -> int:
    """The permissions ``acl`` grants to anyone (the world scheme)."""
    perms = 0
    for entry in acl:
        if entry.scheme == WORLD and entry.id == ANYONE:
            perms |= entry.perms
    return perms


def more_open_than(current: Iterable[ZkAcl], wanted: Iterable[ZkAcl]) -> bool:
    """Whether ``current`` lets anyone do something ``wanted`` does not: a znode created
    before ``zookeeper.set.acl`` was turned on (open to all) is, a znode already secured is
    not, and neither is one an operator gave extra identities."""
    return bool(world_perms(current) & ~world_perms(wanted))


# --------------------------------------------------------------------------- codec helpers

def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _loads(data: bytes | None, what: str) -> dict:
    """JSON object from znode bytes, or ValueError naming the znode kind."""
    if data is None or not data:
        raise ValueError(f"malformed {what} znode data: empty")
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"malformed {what} znode data {data[:100]!r}: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"malformed {what} znode data {data[:100]!r}: not a JSON object")
    return obj


def _field(obj: Mapping, key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ValueError(f"malformed {what} znode data: {key!r} is {value!r}")
    return value


def _int_list(value: Any, what: str, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"malformed {what} znode data: {key!r} is {value!r}, not a list of integers")
    return tuple(value)


def _int_field(obj: Mapping, key: str, what: str) -> int:
    """An integer that Kafka sometimes writes as a string ("block_start": "1000")."""
    value = obj.get(key)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return _field(obj, key, int, what)


# --------------------------------------------------------------------------- cluster id

def encode_cluster_id(cluster_id: str) -> bytes:
    return _dumps({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    return _field(_loads(data, "cluster id"), "id", str, "cluster id")


# --------------------------------------------------------------------------- brokers

@dataclass(frozen=True)
class BrokerInfo:
    """What a live broker registers under ``/brokers/ids/<id>``."""

    broker_id: int
    host: str
    port: int
    rack: str | None = None
    endpoints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.endpoints:
            object.__setattr__(self, "endpoints", (f"PLAINTEXT://{self.host}:{self.port}",))
        object.__setattr__(self, "endpoints", tuple(self.endpoints))


def encode_broker_info(info: BrokerInfo) -> bytes:
    return _dumps({"version": 1, "host": info.host, "port": info.port, "rack": info.rack,
                   "endpoints": list(info.endpoints)})


def decode_broker_info(broker_id: int, data: bytes) -> BrokerInfo:
    """A registration, or ValueError: everything the controller connects to and advertises
    (host, port, each endpoint ``NAME://host:port``) must be usable, as Kafka's
    ``BrokerIdZNode.decode`` refuses an endpoint it cannot parse."""
    what = f"broker {broker_id}"
    obj = _loads(data, what)
    host, port = _field(obj, "host", str, what), _field(obj, "port", int, what)
    if not host:
        raise ValueError(f"malformed {what} znode data: 'host' is empty")
    if not 0 < port <= MAX_PORT:
        raise ValueError(f"malformed {what} znode data: 'port' is {port}, not from 1 to {MAX_PORT}")
    endpoints = obj.get("endpoints", [])
    if not isinstance(endpoints, list) or not all(isinstance(e, str) for e in endpoints):
        raise ValueError(f"malformed {what} znode data: 'endpoints' is {endpoints!r}")
    if endpoints:
        try:
            parse_endpoints(",".join(endpoints))
        except ValueError as e:
            raise ValueError(f"malformed {what} znode data: 'endpoints' {endpoints!r}: {e}") from None
    return BrokerInfo(broker_id, host, port, _field(obj, "rack", (str, type(None)), what), tuple(endpoints))


# --------------------------------------------------------------------------- topics

def encode_topic_assignment(assignment: Mapping[int, Iterable[int]],
                            moving: Mapping[int, tuple[Iterable[int], Iterable[int]]] | None = None) -> bytes:
    """A topic's znode; ``moving``: partition -> (replicas being added, being removed) of the
    partitions under reassignment, which Kafka's version 2 keeps beside the replica sets
    (``adding_replicas``, ``removing_replicas``), so a new controller resumes the moves."""
    obj: dict[str, Any] = {"version": 1, "partitions": {str(p): list(r) for p, r in sorted(assignment.items())}}
    if moving:
        obj["version"] = 2
        obj["adding_replicas"] = {str(p): list(a) for p, (a, _) in sorted(moving.items()) if a}
        obj["removing_replicas"] = {str(p): list(r) for p, (_, r) in sorted(moving.items()) if r}
    return _dumps(obj)


def decode_topic_moves(data: bytes) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """Partition -> (replicas being added, being removed), for the partitions of a topic's
    znode under reassignment (none in a version 1 znode)."""
    what = "topic"
    obj = _loads(data, what)
    out: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for key, index in (("adding_replicas", 0), ("removing_replicas", 1)):
        for p, replicas in (obj.get(key) or {}).items():
            if not isinstance(p, str) or not p.isdigit():
                raise ValueError(f"malformed {what} znode data: {key} partition {p!r}")
            pair = list(out.get(int(p), ((), ())))
            pair[index] = _int_list(replicas, what, f"{key}.{p}")
            out[int(p)] = (pair[0], pair[1])
    return dict(sorted(out.items()))


def decode_topic_assignment(data: bytes) -> dict[int, list[int]]:
    """Partition -> replica list (assignment order: the first is the preferred leader)."""
    what = "topic"
    parts = _field(_loads(data, what), "partitions", dict, what)
    out = {}
    for key, replicas in parts.items():
        if not key.isdigit():
            raise ValueError(f"malformed {what} znode data: partition {key!r}")
        out[int(key)] = list(_int_list(replicas, what, key))
    return dict(sorted(out.items()))


def encode_topic_config(config: Mapping[str, str]) -> bytes:
    """A topic's config znode; user and client-id configs have the same shape."""
    return _dumps({"version": 1, "config": {str(k): str(v) for k, v in config.items()}})


def decode_topic_config(data: bytes, what: str = "topic config") -> dict[str, str]:
    config = _field(_loads(data, what), "config", dict, what)
    if not all(isinstance(v, str) for v in config.values()):
        raise ValueError(f"malformed {what} znode data: {config!r}")
    return config


encode_entity_config = encode_topic_config


def decode_entity_config(data: bytes, entity_path: str) -> dict[str, str]:
    return decode_topic_config(data, f"{entity_path} config")


# --------------------------------------------------------------------------- user and client-id entities

def sanitize(name: str) -> str:
    """Kafka's ``Sanitizer.sanitize``: Java's URL encoding of the UTF-8 name, with "*" as %2A
    and " " as %20, so any user or client id is one znode name and a name cannot be
    ``<default>``. Letters, digits and ``._-`` stay as they are, except that the names ``.``
    and ``..``, which ZooKeeper refuses as znode names, are encoded as %2E."""
    if not isinstance(name, str) or not name:
        raise ValueError("a user or client id in an entity config must be a non-empty string")
    if name in (".", ".."):  # not a znode name ZooKeeper takes
        return name.replace(".", "%2E")
    return urllib.parse.quote(name, safe="").replace("~", "%7E")


def desanitize(name: str) -> str:
    return urllib.parse.unquote(name)


def entity_path(user: str | None, client_id: str | None) -> str:
    """The entity path of a user, a client id, or a user's client id (each a name, or
    ``DEFAULT_ENTITY`` itself): ``entity_path("alice", None) == "users/alice"``;
    ``entity_path("<default>", None) == "users/%3Cdefault%3E"``."""
    def component(name: str) -> str:
        return DEFAULT_ENTITY if name is DEFAULT_ENTITY else sanitize(name)
    if user is None and client_id is None:
        raise ValueError("an entity names a user, a client id or both")
    if user is None:
        return f"{CLIENTS}/{component(client_id)}"
    path = f"{USERS}/{component(user)}"
    return path if client_id is None else f"{path}/{CLIENTS}/{component(client_id)}"


def parse_entity_path(path: str) -> tuple[str | None, str | None]:
    """``entity_path``'s inverse: (user, client id), names desanitized, a ``<default>``
    component as ``DEFAULT_ENTITY`` itself (``is``).
    ValueError for anything but ``users/U``, ``clients/C`` and ``users/U/clients/C``."""
    parts = path.split("/") if isinstance(path, str) else []

    def name(component: str) -> str:
        if not component or component in (".", "..") or len(component) > 4 * MAX_TOPIC_NAME_LENGTH:
            raise ValueError(f"entity path {path!r} has an invalid name {component!r}")
        return DEFAULT_ENTITY if component == DEFAULT_ENTITY else desanitize(component)
    if len(parts) == 2 and parts[0] in (USERS, CLIENTS):
        return (name(parts[1]), None) if parts[0] == USERS else (None, name(parts[1]))
    if len(parts) == 4 and parts[0] == USERS and parts[2] == CLIENTS:
        return name(parts[1]), name(parts[3])
    raise ValueError(f"{path!r} is not a user or client-id entity path "
                     "(users/<user>, clients/<client id> or users/<user>/clients/<client id>)")


def broker_entity_path(broker_id: int | None) -> str:
    """``brokers/<id>``, or ``brokers/<default>`` (the cluster-wide default) for None."""
    return f"{BROKERS}/{DEFAULT_ENTITY if broker_id is None else int(broker_id)}"


def parse_broker_entity_path(path: str) -> int | None:
    """``broker_entity_path``'s inverse (None for the default); ValueError for anything else."""
    parts = path.split("/") if isinstance(path, str) else []
    if len(parts) == 2 and parts[0] == BROKERS:
        if parts[1] == DEFAULT_ENTITY:
            return None
        if parts[1].isascii() and parts[1].isdigit() and len(parts[1]) <= 10:
            return int(parts[1])
    raise ValueError(f"{path!r} is not a broker entity path (brokers/<id> or brokers/{DEFAULT_ENTITY})")


def encode_config_change(entity_path_: str) -> bytes:
    return _dumps({"version": 2, "entity_path": entity_path_})


def decode_config_change(data: bytes) -> str:
    """The entity path a change notification names (Kafka's version 2 notification)."""
    what = "config change notification"
    obj = _loads(data, what)
    if obj.get("version") != 2:
        raise ValueError(f"malformed {what} znode data {data[:100]!r}: only version 2 is understood")
    return _field(obj, "entity_path", str, what)


def config_change_sequence(name: str) -> int | None:
    """The sequence number of a ``config_change_<seq>`` znode name (None for another name)."""
    digits = name[len(CONFIG_CHANGE_PREFIX):] if name.startswith(CONFIG_CHANGE_PREFIX) else ""
    return int(digits) if digits.isdigit() else None


# --------------------------------------------------------------------------- partition state

@dataclass(frozen=True)
class LeaderAndIsr:
    """One partition's leadership, as stored in ``.../partitions/<p>/state``.

    ``leader_epoch`` increases with every change of leader (a follower truncates by it and a
    zombie leader is fenced by it); an ISR change made by the current leader keeps it.
    ``controller_epoch`` is the epoch of the controller that wrote the leader.
    """

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "isr", tuple(self.isr))

    @classmethod
    def initial(cls, leader: int, isr: Iterable[int], controller_epoch: int) -> "LeaderAndIsr":
        return cls(leader, INITIAL_LEADER_EPOCH, tuple(isr), controller_epoch)

    def new_leader_and_isr(self, leader: int, isr: Iterable[int], *,
                           controller_epoch: int | None = None) -> "LeaderAndIsr":
        """A leader election result: the leader epoch goes up by one."""
        epoch = self.controller_epoch if controller_epoch is None else controller_epoch
        return LeaderAndIsr(leader, self.leader_epoch + 1, tuple(isr), epoch)

    def with_isr(self, isr: Iterable[int]) -> "LeaderAndIsr":
        """An ISR shrink/expand by the current leader: same leader, same leader epoch."""
        return LeaderAndIsr(self.leader, self.leader_epoch, tuple(isr), self.controller_epoch)

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER


def encode_partition_state(state: LeaderAndIsr) -> bytes:
    return _dumps({"version": 1, "leader": state.leader, "leader_epoch": state.leader_epoch,
                   "isr": list(state.isr), "controller_epoch": state.controller_epoch})


def decode_partition_state(data: bytes) -> LeaderAndIsr:
    what = "partition state"
    obj = _loads(data, what)
    return LeaderAndIsr(_field(obj, "leader", int, what), _field(obj, "leader_epoch", int, what),
                        _int_list(obj.get("isr"), what, "isr"),
                        _field(obj, "controller_epoch", int, what))


# --------------------------------------------------------------------------- controller

def encode_controller(broker_id: int) -> bytes:
    return _dumps({"version": 1, "brokerid": broker_id})


def decode_controller(data: bytes) -> int:
    return _field(_loads(data, "controller"), "brokerid", int, "controller")


def encode_controller_epoch(epoch: int) -> bytes:
    return str(int(epoch)).encode()


def decode_controller_epoch(data: bytes) -> int:
    try:
        return int(data.decode().strip())
    except (AttributeError, UnicodeDecodeError, ValueError):
        raise ValueError(f"malformed controller epoch znode data {data!r}") from None


# --------------------------------------------------------------------------- admin

def encode_reassignment(reassignment: Mapping[tuple[str, int], Iterable[int]]) -> bytes:
    return _dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": list(r)} for (t, p), r in sorted(reassignment.items())]})


def decode_reassignment(data: bytes) -> dict[tuple[str, int], list[int]]:
    what = "partition reassignment"
    out = {}
    for entry in _field(_loads(data, what), "partitions", list, what):
        if not isinstance(entry, dict):
            raise ValueError(f"malformed {what} znode data: {entry!r}")
        key = (_field(entry, "topic", str, what), _field(entry, "partition", int, what))
        out[key] = list(_int_list(entry.get("replicas"), what, "replicas"))
    return out


def encode_isr_change(partitions: Iterable[tuple[str, int]]) -> bytes:
    return _dumps({"version": 1, "partitions": [{"topic": t, "partition": p} for t, p in partitions]})


def decode_isr_change(data: bytes) -> list[tuple[str, int]]:
    what = "isr change notification"
    out = []
    for entry in _field(_loads(data, what), "partitions", list, what):
        if not isinstance(entry, dict):
            raise ValueError(f"malformed {what} znode data: {entry!r}")
        out.append((_field(entry, "topic", str, what), _field(entry, "partition", int, what)))
    return out


class ReplicaReport(NamedTuple):
    """A replica damage notification: replicas of ``broker`` (registered at ``broker_epoch``)
    lost on disk, found damaged or, with ``offline``, in a log directory that failed."""

    broker: int
    broker_epoch: int
    partitions: list[tuple[str, int]]
    offline: bool = False


def encode_replica_damage(broker_id: int, broker_epoch: int, partitions: Iterable[tuple[str, int]],
                          offline: bool = False) -> bytes:
    """``offline`` is written only when true: a controller that does not know the key takes the
    report for damage, which moves leadership off the replicas and out of the ISR too."""
    body = {"version": 1, "broker": broker_id, "broker_epoch": broker_epoch,
            "partitions": [{"topic": t, "partition": p} for t, p in partitions]}
    if offline:
        body["offline"] = True
    return _dumps(body)


def decode_replica_damage(data: bytes) -> ReplicaReport:
    what = "replica damage notification"
    body = _loads(data, what)
    out = []
    for entry in _field(body, "partitions", list, what):
        if not isinstance(entry, dict):
            raise ValueError(f"malformed {what} znode data: {entry!r}")
        out.append((_field(entry, "topic", str, what), _field(entry, "partition", int, what)))
    offline = body.get("offline", False)
    if not isinstance(offline, bool):
        raise ValueError(f"malformed {what} znode data: 'offline' is {offline!r}")
    return ReplicaReport(_field(body, "broker", int, what), _field(body, "broker_epoch", int, what), out, offline)


@dataclass(frozen=True)
class ProducerIdBlock:
    """Producer ids ``first..last`` (inclusive) handed to ``broker_id``."""

    broker_id: int
    first: int
    last: int


PRODUCER_ID_MAX = 2**63 - 1


def next_producer_id_block(previous: ProducerIdBlock | None, broker_id: int, size: int) -> ProducerIdBlock:
    if size <= 0:
        raise ValueError(f"producer id block size must be positive, got {size}")
    first = 0 if previous is None else previous.last + 1
    if first + size - 1 > PRODUCER_ID_MAX:
        raise ValueError("producer ids are exhausted")
    return ProducerIdBlock(broker_id, first, first + size - 1)


def encode_producer_id_block(block: ProducerIdBlock) -> bytes:
    # Kafka writes the bounds as strings (they may exceed a JSON double's exact range).
    return _dumps({"version": 1, "broker": block.broker_id,
                   "block_start": str(block.first), "block_end": str(block.last)})


def decode_producer_id_block(data: bytes) -> ProducerIdBlock:
    what = "producer id block"
    obj = _loads(data, what)
    return ProducerIdBlock(_field(obj, "broker", int, what), _int_field(obj, "block_start", what),
                           _int_field(obj, "block_end", what))


# --------------------------------------------------------------------------- ACLs

# one stored entry: (principal, host, operation, permission type)
AclEntry = tuple[str, str, AclOperation, AclPermissionType]


def encode_acls(entries: Iterable[AclEntry]) -> bytes:
    """Kafka's ACL znode: ``{"version":1,"acls":[{"principal","permissionType","operation","host"}]}``,
    in a stable order (so equal sets write equal bytes)."""
    return _dumps({"version": 1, "acls": [
        {"principal": p, "host": h, "operation": op.kafka_name, "permissionType": perm.kafka_name}
        for p, h, op, perm in sorted(entries)]})


def decode_acls(data: bytes, what: str = "ACL") -> frozenset[AclEntry]:
    """The entries of an ACL znode; ValueError naming the znode for anything malformed (an
    unknown operation included: a half-read ACL set could allow what a Deny forbids)."""
    out = set()
    for entry in _field(_loads(data, what), "acls", list, what):
        if not isinstance(entry, dict):
            raise ValueError(f"malformed {what} znode data: {entry!r}")
        try:
            principal = parse_principal(_field(entry, "principal", str, what))
            host = _field(entry, "host", str, what)
            op = parse_enum(AclOperation, _field(entry, "operation", str, what), "operation")
            perm = parse_enum(AclPermissionType, _field(entry, "permissionType", str, what), "permission type")
        except AclError as e:
            raise ValueError(f"malformed {what} znode data: {e}") from None
        if op in (AclOperation.UNKNOWN, AclOperation.ANY) or perm not in (AclPermissionType.ALLOW,
                                                                            AclPermissionType.DENY):
            raise ValueError(f"malformed {what} znode data: {entry!r}")
        out.add((principal, host, op, perm))
    return frozenset(out)


def encode_acl_change(resource_type: ResourceType, name: str, pattern_type: ResourcePatternType) -> bytes:
    """A change notification's data: LITERAL ``TOPIC:name`` (Kafka's legacy text), PREFIXED
    ``{"version":1,"resourceType":"TOPIC","name":...,"patternType":"PREFIXED"}``."""
    if pattern_type is ResourcePatternType.LITERAL:
        return f"{resource_type.name}:{name}".encode()
    return _dumps({"version": 1, "resourceType": resource_type.name, "name": name,
                   "patternType": pattern_type.name})


def decode_acl_change(data: bytes, pattern_type: ResourcePatternType
                      ) -> tuple[ResourceType, str, ResourcePatternType]:
    """The pattern a notification names (its tree's pattern type for the legacy text form);
    type names in any case, as Kafka reads them. ValueError for anything else."""
    what = "ACL change notification"
    try:
        if pattern_type is ResourcePatternType.LITERAL:
            text = data.decode()
            kind, sep, name = text.partition(":")
            if not sep:
                raise ValueError(f"malformed {what} znode data {data[:100]!r}: expected ResourceType:name")
            rtype = parse_enum(ResourceType, kind, "resource type")
            ptype = ResourcePatternType.LITERAL
        else:
            obj = _loads(data, what)
            rtype = parse_enum(ResourceType, _field(obj, "resourceType", str, what), "resource type")
            name = _field(obj, "name", str, what)
            ptype = parse_enum(ResourcePatternType, _field(obj, "patternType", str, what), "pattern type")
    except (AclError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed {what} znode data {data[:100]!r}: {e}") from None
    if ptype not in (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED) or rtype.value < 2:
        raise ValueError(f"malformed {what} znode data {data[:100]!r}")
    return rtype, name, ptype
