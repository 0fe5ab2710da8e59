"""The broker's configuration: Kafka's setting names, one table, one frozen object.

Every setting is defined once, in ``SETTINGS``: its Kafka name (``log.segment.bytes``), type,
default, bounds and meaning. The attribute of ``BrokerConfig`` is the name with dots turned
into underscores (``config.log_segment_bytes``), so units stay in the name. The settings that
supply the defaults of topic configs are not repeated here: they are generated from
``broker.log.config.TOPIC_CONFIGS`` (each topic config names its ``broker_key``), so a new
topic config brings its broker-level default with it. ``settings_reference()`` renders the
table as Markdown for the docs.

Sources, later ones win:

1. the TOML file given to ``tidelog broker --config``. Keys are Kafka's names; TOML's dotted
   keys and nested tables flatten back with ".", so ``log.segment.bytes = 1048576``,
   ``"log.segment.bytes" = 1048576`` and ``[log.segment] bytes = 1048576`` are the same key;
2. environment variables ``TIDELOG_<NAME>``, where NAME is the setting's name upper-cased
   with dots as underscores (``TIDELOG_LOG_SEGMENT_BYTES``). ``TIDELOG_*`` variables that
   name no setting are ignored (other tools share the prefix, e.g. ``TIDELOG_BOOTSTRAP``);
3. ``--set key=value`` overrides.

An unknown key in the file or in the overrides is an error that names the key and suggests
the closest known one. A value of the wrong type or out of range is an error that names the
key, the value, where it came from and what was expected. String values (from the
environment or ``--set``) are parsed as the setting's type; TOML values must have the
setting's type or be a string that parses as it.

Kafka's unit variants are accepted as aliases: ``log.retention.minutes`` and
``log.retention.hours`` for ``log.retention.ms``, ``log.roll.hours`` for ``log.roll.ms``,
``log.dir`` for ``log.dirs``. Within one source Kafka's precedence applies (ms over minutes
over hours, ``log.dirs`` over ``log.dir``); across sources the later source wins whichever
variant it uses, so ``TIDELOG_LOG_RETENTION_HOURS=1`` overrides ``log.retention.ms`` from the
file. A negative retention in hours or minutes means "no time limit" (-1 ms), as in Kafka.

``queued.max.requests`` keeps Kafka's name but is a per-connection bound: Kafka queues the
requests of all connections for a pool of handler threads (default 500); Tidelog handles each
connection's requests in their own tasks, so it bounds how many requests one connection may
have read and not yet fully answered (default 100); reading from that connection pauses until
responses go out.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import socket
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tidelog.broker.log.config import TOPIC_CONFIGS, InvalidConfigError, LogConfig
from tidelog.broker.security.listeners import (
    DEFAULT_PROTOCOL_MAP,
    Listener,
    inter_broker,
    parse_endpoints,
    parse_protocol_map,
    resolve,
    resolve_kafka,
)
from tidelog.broker.security.sasl import SASL_MECHANISMS
from tidelog.broker.zookeeper.layout import DigestCredentials
from tidelog.protocol.acls import parse_principal
from tidelog.security import JaasCredentials, parse_jaas_config

MAX_LONG = 2**63 - 1
MIB = 1024 * 1024
ENV_PREFIX = "TIDELOG_"


class ConfigError(InvalidConfigError):
    """A broker setting is unknown, missing or invalid; the message names the key."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

Check = Callable[[Any], str | None]  # a problem with a parsed value, or None


@dataclass(frozen=True, slots=True)
class Setting:
    name: str  # Kafka's name; the BrokerConfig attribute is the name with "." -> "_"
    type: type  # int, float, bool, str or tuple (a list of strings)
    default: Any  # REQUIRED, a value, or None for "unset"
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    default_from: str | None = None  # when unset, take this other setting's value
    check: Check | None = None
    sensitive: bool = False  # a secret: DescribeConfigs shows no value (Kafka's PASSWORD type)

    @property
    def attr(self) -> str:
        return self.name.replace(".", "_")

    @property
    def optional(self) -> bool:
        return self.default is None and self.default_from is None


@dataclass(frozen=True, slots=True)
class Alias:
    """Another name for a setting, in another unit: value * factor is the target's value."""

    name: str
    target: str
    factor: int | None  # None: the same value
    doc: str
    minimum: int | None = None


# -- value checks -------------------------------------------------------------------------------


def parse_listener(value: str) -> tuple[str, str, int]:
    """The first listener of ``NAME://host:port[,...]`` -> (name, host, port); ValueError says
    what is wrong (the whole list is checked)."""
    first = parse_endpoints(value)[0]
    return first.name, first.host, first.port


def _check_listeners(value: str) -> str | None:
    try:
        parse_endpoints(value)
    except ValueError as e:
        return str(e)
    return None


def _check_protocol_map(value: str) -> str | None:
    try:
        return None if parse_protocol_map(value) else "expected NAME:PROTOCOL[,NAME:PROTOCOL...]"
    except ValueError as e:
        return str(e)


def _check_client_auth(value: str) -> str | None:
    return None if value in ("none", "requested", "required") else "expected none, requested or required"


def _check_mechanisms(value: str) -> str | None:
    names = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [m for m in names if m not in SASL_MECHANISMS]
    if unknown:
        return f"unknown SASL mechanism {unknown[0]!r} (known: {', '.join(SASL_MECHANISMS)})"
    return None if names else "expected at least one mechanism"


def _check_mechanism(value: str) -> str | None:
    return None if value in SASL_MECHANISMS else f"expected one of {', '.join(SASL_MECHANISMS)}"


def _check_chroot(value: str) -> str | None:
    if not value.startswith("/") or (value != "/" and value.endswith("/")):
        return "expected an absolute ZooKeeper path such as /tidelog (no trailing /)"
    return None


def _check_digest_username(value: str) -> str | None:
    if not value or not all(c.isascii() and (c.isalnum() or c in "._-") for c in value):
        return "expected a name of ASCII letters, digits, '.', '_' and '-'"
    return None


def _check_connect(value: str) -> str | None:
    if not value.strip() or any(not part.strip() for part in value.split("/")[0].split(",")):
        return "expected host:port[,host:port...]"
    return None


def parse_ip_overrides(value: str) -> dict[str, int]:
    """``max.connections.per.ip.overrides``: ``"host:n,host:n"`` -> {host: n}. Raises ValueError."""
    overrides = {}
    for item in (part.strip() for part in value.split(",")):
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.strip().isdigit():
            raise ValueError(f"{item!r} is not host:count")
        overrides[host.strip()] = int(count)
    return overrides


def _check_ip_overrides(value: str) -> str | None:
    try:
        parse_ip_overrides(value)
    except ValueError as e:
        return f"expected a comma-separated list of host:count ({e})"
    return None


# ``authorizer.class.name``: Kafka's ZooKeeper-era class names (so a Kafka config carries over)
# and Tidelog's own; all three are broker/security/authorizer.py. Empty: no authorizer.
AUTHORIZER_CLASS_NAMES = ("kafka.security.authorizer.AclAuthorizer", "kafka.security.auth.SimpleAclAuthorizer",
                          "tidelog.broker.security.authorizer.AclAuthorizer")


def parse_super_users(text: str | None) -> frozenset[str]:
    """``super.users``: Kafka's semicolon-separated principals, ``User:a;User:b``."""
    return frozenset(parse_principal(item.strip()) for item in (text or "").split(";") if item.strip())


def _check_super_users(value: str) -> str | None:
    try:
        parse_super_users(value)
    except ValueError as e:
        return f"expected Type:name principals separated by ';' ({e})"
    return None


def _check_dirs(value: tuple[str, ...]) -> str | None:
    """At least one directory, none empty, and no directory twice: compared by real path (a
    trailing slash, ``.``, a symlink), as Kafka compares canonical paths. A dir named twice
    would be loaded twice, and the broker could not start again once it held a partition."""
    if not value or not all(d.strip() for d in value):
        return "expected at least one directory, and no empty ones"
    seen: dict[str, str] = {}
    for d in value:
        if "\0" in d:
            return f"expected directory paths, and {d!r} holds a NUL character"
        real = os.path.realpath(d)
        if real in seen:
            return f"duplicate log directory found: {seen[real]!r} and {d!r} are both {real}"
        seen[real] = d
    return None


# -- the table --------------------------------------------------------------------------------

_S = Setting
_BROKER_SETTINGS: tuple[Setting, ...] = (
    # identity and endpoints
    _S("broker.id", int, REQUIRED, "This broker's id, unique in the cluster.", minimum=0),
    _S("broker.rack", str, None, "Rack of this broker, for rack-aware replica placement."),
    _S("listeners", str, "PLAINTEXT://127.0.0.1:9092",
       "Listeners, comma-separated NAME://host:port; a name is a security protocol or is mapped "
       "to one by listener.security.protocol.map. An empty host binds every interface; "
       "port 0 picks a free port.", check=_check_listeners),
    _S("advertised.listeners", str, None,
       "Addresses published in ZooKeeper for clients and other brokers, per listener name "
       "(default: listeners; an empty host advertises this machine's host name).",
       default_from="listeners", check=_check_listeners),
    _S("listener.security.protocol.map", str, DEFAULT_PROTOCOL_MAP,
       "Security protocol of each listener name, NAME:PROTOCOL,... (PLAINTEXT, SSL, "
       "SASL_PLAINTEXT, SASL_SSL).", check=_check_protocol_map),
    _S("kafka.listeners", str, None,
       "Listeners speaking Kafka's wire protocol (for Kafka clients: librdkafka, kafka-python, "
       "kcat, Java), comma-separated NAME://host:port like listeners, e.g. PLAINTEXT://127.0.0.1:9192. "
       "They serve the same logs, groups and security; docs/kafka-compatibility.md.",
       check=_check_listeners),
    _S("kafka.advertised.listeners", str, None,
       "Addresses published for the Kafka listeners, per name (default: kafka.listeners).",
       check=_check_listeners),
    _S("inter.broker.listener.name", str, None,
       "The listener brokers use between themselves (fetches, the controller's requests); the "
       "inter-broker APIs are accepted only on it. Default: the first listener."),
    # TLS (PEM files) and SASL
    _S("ssl.keystore.location", str, None,
       "PEM file with this broker's certificate chain and private key (SSL and SASL_SSL "
       "listeners, and its client certificate towards other brokers)."),
    _S("ssl.key.password", str, None, "Password of the private key in ssl.keystore.location, if encrypted.",
       sensitive=True),
    _S("ssl.truststore.location", str, None,
       "PEM file of the CA certificates this broker trusts: for client certificates, and for "
       "other brokers' certificates on a TLS inter-broker listener."),
    _S("ssl.client.auth", str, "none",
       "Client certificates on TLS listeners: none, requested or required. With a certificate "
       "the principal is User:<its subject> unless SASL authenticates the connection.",
       check=_check_client_auth),
    _S("ssl.endpoint.identification.algorithm", str, "https",
       "https: this broker checks that another broker's certificate names the host it connects "
       "to; empty: no host name check (the certificate must still be trusted)."),
    _S("sasl.enabled.mechanisms", str, "SCRAM-SHA-256,SCRAM-SHA-512",
       "SASL mechanisms offered on SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512.",
       check=_check_mechanisms),
    _S("sasl.mechanism.inter.broker.protocol", str, "SCRAM-SHA-256",
       "The SASL mechanism this broker uses towards other brokers on a SASL inter-broker listener; "
       "it must be one of sasl.enabled.mechanisms there, as in Kafka.",
       check=_check_mechanism),
    _S("sasl.jaas.config", str, None,
       "This broker's own SASL credentials, in Kafka's JAAS form: "
       "'org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" "
       "password=\"secret\";'. Required when the inter-broker listener uses SASL.", sensitive=True),
    _S("connection.failed.authentication.delay.ms", int, 100,
       "A failed authentication is answered this late, to slow password guessing (ms).", minimum=0),
    _S("log.dirs", tuple, ("/tmp/tidelog-logs",),
       "Directories holding the partitions' logs: a list, or a comma-separated string. Each "
       "directory once: two entries that are one directory (/data and /data/, or a symlink to "
       "another entry) are refused, as in Kafka.",
       check=_check_dirs),
    # ZooKeeper
    _S("zookeeper.connect", str, REQUIRED, "ZooKeeper connection string, host:port[,host:port...].",
       check=_check_connect),
    _S("zookeeper.chroot", str, "/tidelog", "ZooKeeper path under which the cluster keeps its znodes.",
       check=_check_chroot),
    _S("zookeeper.session.timeout.ms", int, 18000,
       "ZooKeeper session timeout: a broker silent this long loses its registration (ms).", minimum=1),
    _S("zookeeper.connection.timeout.ms", int, None,
       "How long to wait for a ZooKeeper connection (ms; default: zookeeper.session.timeout.ms).",
       minimum=1, default_from="zookeeper.session.timeout.ms"),
    _S("zookeeper.set.acl", bool, False,
       "Create every znode with an ACL: ALL for the brokers' ZooKeeper identity "
       "(zookeeper.digest.username), READ for anyone else but under /config/users (SCRAM "
       "credentials: no one else). At start the broker also secures the chroot and its "
       "containers where they are open; the znodes below them need `tidelog "
       "zookeeper-security-migration`. Needs zookeeper.digest.username and .password."),
    _S("zookeeper.digest.username", str, None,
       "The brokers' ZooKeeper identity (ZooKeeper's digest scheme), the same on every broker of "
       "a cluster; added to the session whether or not zookeeper.set.acl is on.",
       check=_check_digest_username),
    _S("zookeeper.digest.password", str, None,
       "Password of zookeeper.digest.username (DescribeConfigs never shows it).", sensitive=True),
    # topics
    _S("num.partitions", int, 1, "Partitions of an auto-created or defaulted topic.", minimum=1),
    _S("default.replication.factor", int, 1, "Replication factor of an auto-created or defaulted topic.",
       minimum=1),
    _S("auto.create.topics.enable", bool, True, "Create a topic when a client asks for metadata of it."),
    _S("delete.topic.enable", bool, True, "Allow topics to be deleted."),
    _S("max.partitions.per.topic", int, 10_000,
       "Most partitions a topic may have: a CreateTopics or CreatePartitions asking for more is "
       "refused with INVALID_PARTITIONS before anything is planned. Whatever this says, a "
       "topic's assignment must fit in one ZooKeeper znode (jute.maxbuffer, 1 MiB: about "
       "65,000 partitions of 3 replicas).", minimum=1, maximum=2**31 - 1),
    _S("max.partitions.per.request", int, 10_000,
       "Most partitions one CreateTopics or CreatePartitions request may create, all its topics "
       "together (INVALID_PARTITIONS for every topic of a request above it).",
       minimum=1, maximum=2**31 - 1),
    _S("log.segment.min.bytes", int, MIB,
       "Smallest segment.bytes a client may give a topic with CreateTopics or AlterConfigs "
       "(Kafka 4's minimum, KIP-1030): smaller segments roll so often that their files exhaust "
       "the broker's descriptors. log.segment.bytes and offsets.topic.segment.bytes are the "
       "operator's and not bound by it (bytes).", minimum=14, maximum=2**31 - 1),
    _S("log.roll.min.ms", int, 60_000,
       "Smallest segment.ms a client may give a topic with CreateTopics or AlterConfigs "
       "(KIP-1030's minimum); log.roll.ms itself is not bound by it (ms).", minimum=1),
    # controller and leadership
    _S("auto.leader.rebalance.enable", bool, True,
       "Move leadership back to the preferred replica when it is imbalanced."),
    _S("leader.imbalance.check.interval.seconds", int, 300,
       "How often the controller checks leader imbalance (s).", minimum=1),
    _S("controlled.shutdown.enable", bool, True,
       "On SIGTERM, move leadership away before stopping."),
    _S("controlled.shutdown.max.retries", int, 3, "Attempts at a controlled shutdown.", minimum=0),
    _S("controlled.shutdown.retry.backoff.ms", int, 5000,
       "Wait between controlled shutdown attempts (ms).", minimum=0),
    _S("controller.socket.timeout.ms", int, 30000,
       "Timeout of the controller's requests to brokers (ms).", minimum=1),
    # replication
    _S("replica.lag.time.max.ms", int, 30000,
       "A follower not caught up for this long leaves the ISR (ms).", minimum=1),
    _S("replica.fetch.max.bytes", int, MIB, "Bytes a follower asks for per partition per fetch.",
       minimum=1),
    _S("replica.fetch.response.max.bytes", int, 10 * MIB,
       "Largest answer to a follower's fetch: its bytes of records, whatever the fetch asks "
       "(at least one batch is always sent) (bytes).", minimum=0),
    _S("fetch.max.bytes", int, 55 * MIB,
       "Largest answer to a consumer's fetch: its bytes of records, whatever the fetch asks "
       "(at least one batch is always sent) (bytes).", minimum=0),
    _S("replica.fetch.wait.max.ms", int, 500,
       "Longest a follower's fetch waits at the leader for data (ms).", minimum=0),
    _S("replica.fetch.min.bytes", int, 1, "Bytes a follower's fetch waits for at the leader.", minimum=0),
    _S("replica.fetch.backoff.ms", int, 1000, "Wait after a failed follower fetch (ms).", minimum=0),
    _S("replica.socket.timeout.ms", int, 30000,
       "Timeout of a follower's requests to its leader (ms).", minimum=1),
    _S("num.replica.fetchers", int, 1, "Fetcher tasks per source broker.", minimum=1),
    _S("replica.high.watermark.checkpoint.interval.ms", int, 5000,
       "How often high watermarks are checkpointed to disk (ms).", minimum=1),
    # log manager
    _S("log.flush.offset.checkpoint.interval.ms", int, 60000,
       "How often recovery points are checkpointed to disk (ms).", minimum=1),
    _S("log.flush.scheduler.interval.ms", int, MAX_LONG,
       "How often logs are checked for a time-based flush (ms); the default never checks.", minimum=1),
    _S("log.retention.check.interval.ms", int, 300000,
       "How often logs are checked for segments to delete (ms).", minimum=1),
    _S("log.verify.interval.ms", int, 7 * 24 * 3600 * 1000,
       "How often every closed segment of every replica here is read through and its batches' "
       "CRCs checked, so that a replica damaged on disk is found and fetched again before a "
       "reader needs it (ms); 0 never verifies.", minimum=0),
    _S("log.verify.bytes.per.second", int, 8 * MIB,
       "Most bytes per second the background verification of closed segments reads; 0: no limit.",
       minimum=0),
    # log cleaner (compaction, broker/log/cleaner.py)
    _S("log.cleaner.enable", bool, True,
       "Run the log cleaner, which compacts topics with cleanup.policy compact."),
    _S("log.cleaner.threads", int, 1,
       "Logs cleaned at the same time, each in a worker thread off the event loop.", minimum=1),
    _S("log.cleaner.backoff.ms", int, 15000,
       "Wait before looking again when no log needs cleaning (ms).", minimum=0),
    _S("log.cleaner.dedupe.buffer.size", int, 128 * MIB,
       "Memory for the cleaners' key -> offset maps, shared by all cleaner threads; a key takes "
       "176 bytes (Kafka's map: 24) (bytes).", minimum=1024),
    _S("log.cleaner.io.buffer.load.factor", float, 0.9,
       "How full a cleaner's key -> offset map may get (0 to 1).", minimum=0, maximum=1),
    _S("log.max.open.segment.files", int, 256,
       "Closed (inactive) segment files kept open at once, least recently used closed first; "
       "active segments always stay open (Tidelog's; Kafka keeps every segment open).", minimum=1),
    # network
    _S("socket.request.max.bytes", int, 100 * MIB,
       "Largest request frame accepted; a larger one closes the connection (bytes).", minimum=1),
    _S("queued.max.requests", int, 100,
       "Per connection: requests read and not yet answered before reading pauses "
       "(Kafka's name; Kafka's bound is broker-wide, Tidelog's is per connection).", minimum=1),
    _S("queued.max.request.bytes", int, 200 * MIB,
       "Bytes of requests being received or queued, across all connections (Kafka's default, "
       "-1, is unbounded). A frame larger than 64 KiB reserves its size from this budget as soon "
       "as its length prefix arrives; at the bound, the connections waiting for memory are not "
       "read until responses free some. At least socket.request.max.bytes, as in Kafka; 0 or "
       "below: no bound (bytes)."),
    _S("max.connections", int, 2**31 - 1,
       "Client connections open at once; a newer one is closed at once. The broker also keeps "
       "a quarter of its file descriptor limit (RLIMIT_NOFILE, at least 64) for its own files.",
       minimum=0),
    _S("max.connections.per.ip", int, 2**31 - 1,
       "Connections open at once from one address; a newer one is closed at once.", minimum=0),
    _S("max.connections.per.ip.overrides", str, None,
       "Per-address exceptions to max.connections.per.ip: host:count,host:count.",
       check=_check_ip_overrides),
    _S("connections.max.idle.ms", int, 600000,
       "Close a connection with no traffic and no request in progress for this long (ms).",
       minimum=1),
    _S("request.timeout.ms", int, 30000, "Timeout of the broker's own requests (ms).", minimum=1),
    _S("metrics.port", int, -1, "Port of the metrics endpoint; -1 disables it.", minimum=-1,
       maximum=65535),
    # groups and producers
    _S("group.initial.rebalance.delay.ms", int, 3000,
       "Wait for more members before the first rebalance of an empty group (ms).", minimum=0),
    _S("group.min.session.timeout.ms", int, 6000, "Smallest session timeout a member may ask for (ms).",
       minimum=1),
    _S("group.max.session.timeout.ms", int, 1800000, "Largest session timeout a member may ask for (ms).",
       minimum=1),
    _S("offsets.topic.num.partitions", int, 50, "Partitions of the committed offsets topic.", minimum=1),
    _S("offsets.topic.replication.factor", int, 3, "Replication factor of the committed offsets topic.",
       minimum=1),
    _S("offsets.retention.minutes", int, 7 * 24 * 60,
       "Committed offsets of an empty group are kept this long (min).", minimum=1),
    _S("offsets.retention.check.interval.ms", int, 600000,
       "How often the group coordinator looks for expired offsets (ms).", minimum=1),
    _S("offsets.commit.timeout.ms", int, 5000,
       "An offset commit waits this long for the offsets topic's in-sync replicas (ms).", minimum=1),
    _S("offsets.topic.segment.bytes", int, 100 * MIB,
       "Segment size of the committed offsets topic (bytes).", minimum=1),
    _S("offset.metadata.max.bytes", int, 4096,
       "Largest metadata string a committed offset may carry (bytes).", minimum=0),
    _S("group.max.size", int, 2**31 - 1, "Most members a consumer group may have.", minimum=1),
    _S("producer.id.block.size", int, 1000,
       "Producer ids a broker claims from ZooKeeper at a time.", minimum=1),
    _S("producer.id.expiration.ms", int, 86400000,
       "A partition forgets an idempotent producer whose last batch is this old; its next batch "
       "then starts a new epoch (ms).", minimum=1),
    _S("producer.id.expiration.check.interval.ms", int, 600000,
       "How often partitions look for expired producer ids (ms).", minimum=1),
    # client quotas (broker/security/quotas.py): rates are measured over num samples of size s
    _S("quota.window.num", int, 11,
       "Samples a client quota's rate is measured over (producer_byte_rate, consumer_byte_rate, "
       "request_percentage); a throttle is at most the whole window.", minimum=1),
    _S("quota.window.size.seconds", int, 1, "Length of one client quota sample (s).", minimum=1),
    # authorization (broker/security/authorizer.py)
    _S("authorizer.class.name", str, None,
       "The ACL authorizer: kafka.security.authorizer.AclAuthorizer (Kafka's name, also "
       "kafka.security.auth.SimpleAclAuthorizer, or tidelog.broker.security.authorizer.AclAuthorizer; "
       "all three are Tidelog's ACL authorizer, ACLs in ZooKeeper as Kafka stores them). Unset or "
       "empty: no authorizer, every principal may do everything but the inter-broker APIs.",
       choices=AUTHORIZER_CLASS_NAMES),
    _S("super.users", str, None,
       "Principals allowed everything whatever the ACLs say, and accepted as brokers on the "
       "inter-broker listener: User:a;User:b (semicolon-separated, Kafka's form).",
       check=_check_super_users),
    _S("allow.everyone.if.no.acl.found", bool, False,
       "With the authorizer on, allow a resource that no ACL covers to every principal. False "
       "(Kafka's default): a resource without ACLs is refused to all but super users."),
)
del _S


def _from_topic_config(d: Any) -> Setting:
    return Setting(d.broker_key, d.type, d.default, d.doc, minimum=d.minimum, maximum=d.maximum,
                   choices=d.choices, check=_normalize_check(d.normalize) if d.normalize else None)


def _normalize_check(normalize: Callable[[Any], Any]) -> Check:
    def check(value: Any) -> str | None:
        try:
            normalize(value)
        except ValueError as e:
            return str(e)
        return None
    return check


_LOG_SETTINGS: tuple[Setting, ...] = tuple(
    _from_topic_config(d) for d in TOPIC_CONFIGS
    if d.broker_key and d.broker_key not in {s.name for s in _BROKER_SETTINGS})

SETTINGS: tuple[Setting, ...] = _BROKER_SETTINGS + _LOG_SETTINGS

ALIASES: tuple[Alias, ...] = (  # in Kafka's precedence order per target
    Alias("log.dir", "log.dirs", None, "A single log directory (log.dirs wins when both are set)."),
    Alias("log.retention.minutes", "log.retention.ms", 60_000, "log.retention.ms in minutes."),
    Alias("log.retention.hours", "log.retention.ms", 3_600_000, "log.retention.ms in hours."),
    Alias("log.roll.hours", "log.roll.ms", 3_600_000, "log.roll.ms in hours.", minimum=1),
)

_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
SENSITIVE: frozenset[str] = frozenset(s.name for s in SETTINGS if s.sensitive)  # DescribeConfigs hides them
ZOOKEEPER_AUTH_KEYS = ("zookeeper.digest.username", "zookeeper.digest.password")
_ALIAS_BY_NAME: dict[str, Alias] = {a.name: a for a in ALIASES}
_KNOWN = sorted([*_BY_NAME, *_ALIAS_BY_NAME])


def _env_key(name: str) -> str:
    return name.upper().replace(".", "_").replace("-", "_")


_ENV_NAMES: dict[str, str] = {_env_key(n): n for n in _KNOWN}


def _check_table() -> None:
    """Import-time sanity: names unique, env names unambiguous, TOML dotted keys writable."""
    assert len(_BY_NAME) == len(SETTINGS) and not _BY_NAME.keys() & _ALIAS_BY_NAME.keys()
    assert len(_ENV_NAMES) == len(_KNOWN), "two settings share an environment variable"
    assert all(a.target in _BY_NAME for a in ALIASES)
    for name in _KNOWN:  # a leaf key may not also be a table in TOML, unless written quoted
        assert name in _QUOTED or not any(other.startswith(name + ".") for other in _KNOWN), name


# Kafka's names where one is a prefix of another: as TOML dotted keys, "max.connections" would
# have to be a value and a table at once, so these are written as quoted keys
# ("max.connections" = 1000), which is what to_toml does.
_QUOTED = frozenset(n for n in _KNOWN if any(o != n and (o.startswith(n + ".") or n.startswith(o + "."))
                                             for o in _KNOWN))


_check_table()


# -- parsing ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Value:
    value: Any
    key: str  # as given (may be an alias)
    source: str  # "in FILE", "from env VAR", "from --set"


def _expected(s: Setting | Alias) -> str:
    if isinstance(s, Alias):
        return _bounded("an integer", s.minimum, None)
    if s.choices:
        return "one of " + ", ".join(s.choices)
    if s.type is float:
        return _bounded("a number", s.minimum, s.maximum)
    return {bool: "true or false",
            tuple: "a list of strings or a comma-separated string",
            str: "a string"}.get(s.type) or _bounded("an integer", s.minimum, s.maximum)


def _bounded(what: str, low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"{what} from {low} to {high}"
    return f"{what} >= {low}" if low is not None else what


def _coerce(typ: type, raw: Any) -> Any:
    """``raw`` as ``typ``; strings are parsed. Raises ValueError/TypeError when it is not."""
    if typ is bool:
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        if type(raw) is not bool:
            raise TypeError(raw)
        return raw
    if typ is int:
        return int(raw.strip()) if isinstance(raw, str) else _exact(raw, int)
    if typ is float:
        if isinstance(raw, str):
            return float(raw.strip())
        return float(raw) if type(raw) in (int, float) else _exact(raw, float)
    if typ is tuple:
        items = raw.split(",") if isinstance(raw, str) else raw
        if type(items) not in (list, tuple) or not all(isinstance(i, str) for i in items):
            raise TypeError(raw)
        return tuple(i.strip() for i in items if i.strip())
    return _exact(raw, str)


def _exact(raw: Any, typ: type) -> Any:
    if type(raw) is not typ:
        raise TypeError(raw)
    return raw


def _problem(s: Setting, value: Any) -> str | None:
    if s.minimum is not None and value < s.minimum or s.maximum is not None and value > s.maximum:
        return f"expected {_expected(s)}"
    if s.choices is not None and value not in s.choices:
        return f"expected {_expected(s)}"
    return s.check(value) if s.check else None


def _error(key: str, raw: Any, source: str, problem: str) -> ConfigError:
    """The error naming the setting and its value; a secret's value is shown as ***."""
    setting = _BY_NAME.get(key)
    shown = "***" if setting is not None and setting.sensitive else repr(raw)
    return ConfigError(f"{key} = {shown} ({source}): {problem}")


def _parse(s: Setting, key: str, raw: Any, source: str) -> Any:
    if s.optional and raw == "":
        return None
    try:
        value = _coerce(s.type, raw)
    except (TypeError, ValueError):
        raise _error(key, raw, source, f"expected {_expected(s)}") from None
    if (problem := _problem(s, value)) is not None:
        raise _error(key, raw, source, problem)
    return value


def _parse_alias(a: Alias, raw: Any, source: str) -> Any:
    target = _BY_NAME[a.target]
    if a.factor is None:
        return _parse(target, a.name, raw, source)
    try:
        value = _coerce(int, raw)
    except (TypeError, ValueError):
        raise _error(a.name, raw, source, f"expected {_expected(a)}") from None
    if a.minimum is not None and value < a.minimum:
        raise _error(a.name, raw, source, f"expected {_expected(a)}")
    return _parse(target, a.name, -1 if value < 0 else min(value * a.factor, MAX_LONG), source)


def _unknown(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, _KNOWN, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown setting {key!r} ({source}){hint}")


def _layer(items: Iterable[tuple[str, Any, str]]) -> dict[str, _Value]:
    """One source's ``(key, raw, source)`` items by setting name; aliases resolved with
    Kafka's precedence (the setting itself, then its aliases in ALIASES order)."""
    chosen: dict[str, tuple[int, _Value]] = {}
    for key, raw, source in items:
        if key in _BY_NAME:
            name, rank, value = key, 0, _parse(_BY_NAME[key], key, raw, source)
        elif key in _ALIAS_BY_NAME:
            a = _ALIAS_BY_NAME[key]
            name, rank, value = a.target, 1 + ALIASES.index(a), _parse_alias(a, raw, source)
        else:
            raise _unknown(key, source)
        if name not in chosen or rank < chosen[name][0]:
            chosen[name] = (rank, _Value(value, key, source))
    return {name: v for name, (_, v) in chosen.items()}


def _flatten(table: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield prefix + key, value


def _file_items(path: str) -> list[tuple[str, Any, str]]:
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    items = list(_flatten(table))
    seen: set[str] = set()
    for key, _ in items:
        if key in seen:
            raise ConfigError(f"{key} is set twice in {path} (as a quoted and as a dotted key)")
        seen.add(key)
    return [(key, raw, f"in {path}") for key, raw in items]


def _env_items(env: Mapping[str, str]) -> list[tuple[str, Any, str]]:
    """TIDELOG_<NAME> variables that name a setting or alias; any other TIDELOG_ variable is
    left alone (the prefix is shared with the client tools' TIDELOG_BOOTSTRAP and the like)."""
    items = []
    for var, raw in sorted(env.items()):
        if var.startswith(ENV_PREFIX) and (name := _ENV_NAMES.get(_env_key(var[len(ENV_PREFIX):]))):
            items.append((name, raw, f"from env {var}"))
    return items


def read_zookeeper_credentials(path: str | os.PathLike[str] | None,
                               env: Mapping[str, str] = os.environ) -> DigestCredentials | None:
    """The ZooKeeper identity of a tool that writes ZooKeeper (``--zk-auth-file``):
    zookeeper.digest.username and zookeeper.digest.password from a TOML file with the
    broker's setting names (a broker's config file will do: its other settings are ignored,
    as Kafka's tools ignore all but the ZooKeeper client settings of such a file), then the
    TIDELOG_ZOOKEEPER_DIGEST_* variables, as a broker reads them. None when neither names one;
    ConfigError for a file without them, or a username without a password."""
    wanted = set(ZOOKEEPER_AUTH_KEYS)
    file_items = [] if path is None else [i for i in _file_items(os.fspath(path)) if i[0] in wanted]
    merged = {**_layer(file_items), **_layer(i for i in _env_items(env) if i[0] in wanted)}
    if not merged and path is None:
        return None
    missing = [k for k in ZOOKEEPER_AUTH_KEYS if k not in merged]
    if missing:
        where = f"{os.fspath(path)} or " if path is not None else ""
        raise ConfigError(f"{' and '.join(missing)} not found in {where}the environment "
                          f"({ENV_PREFIX}{_env_key(missing[0])})")
    return DigestCredentials(*(merged[k].value for k in ZOOKEEPER_AUTH_KEYS))


# -- the config object ------------------------------------------------------------------------


class _BrokerConfigBase:
    """Methods of BrokerConfig (its fields are generated from SETTINGS below)."""

    __slots__ = ()

    def __post_init__(self) -> None:
        for s in SETTINGS:  # unset "default: other setting" fields take the other's value
            if s.default_from and getattr(self, s.attr) is None:
                object.__setattr__(self, s.attr, getattr(self, _BY_NAME[s.default_from].attr))

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None,
             overrides: Mapping[str, Any] = MappingProxyType({}),
             env: Mapping[str, str] = os.environ) -> "BrokerConfig":
        """The TOML file (if any), then TIDELOG_* variables, then ``--set`` overrides."""
        layers = [] if path is None else [_layer(_file_items(os.fspath(path)))]
        layers.append(_layer(_env_items(env)))
        layers.append(_layer((key, raw, "from --set") for key, raw in overrides.items()))
        return cls._from_layers(layers)

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "BrokerConfig":
        """A config from Kafka-named properties (typed values or strings), defaults for the rest."""
        return cls._from_layers([_layer((k, v, "in the given properties") for k, v in props.items())])

    @classmethod
    def _from_layers(cls, layers: list[dict[str, _Value]]) -> "BrokerConfig":
        merged: dict[str, _Value] = {}
        for layer in layers:
            merged.update(layer)
        for s in SETTINGS:
            if s.default is REQUIRED and s.name not in merged:
                raise ConfigError(f"missing required setting {s.name} (set it in the config file, "
                                  f"as {ENV_PREFIX}{_env_key(s.name)} or with --set {s.name}=...)")
        config = cls(**{_BY_NAME[n].attr: v.value for n, v in merged.items()})
        config._check_listeners(merged)
        config._check_zookeeper_auth(merged)
        config._check_request_memory(merged)
        return config

    def _check_request_memory(self, merged: Mapping[str, _Value]) -> None:
        """A request memory budget holds at least one frame of the largest size, as Kafka
        requires: a smaller one would refuse every frame between the two (at 0, all)."""
        budget = self.queued_max_request_bytes
        if 0 < budget < self.socket_request_max_bytes:
            given = merged.get("queued.max.request.bytes")
            raise _error("queued.max.request.bytes", budget, given.source if given else "default",
                         f"must be at least socket.request.max.bytes ({self.socket_request_max_bytes}), "
                         "or 0 or below for no bound: a larger request could never be received")

    def _check_zookeeper_auth(self, merged: Mapping[str, _Value]) -> None:
        """The digest username and password go together; zookeeper.set.acl needs them."""
        given = {k: merged[k] for k in ZOOKEEPER_AUTH_KEYS if k in merged}
        if len(given) == 1:
            (key, value), = given.items()
            other = next(k for k in ZOOKEEPER_AUTH_KEYS if k != key)
            raise _error(key, value.value, value.source, f"set {other} too (the two go together)")
        if self.zookeeper_set_acl and not given:
            source = merged["zookeeper.set.acl"].source if "zookeeper.set.acl" in merged else "default"
            raise _error("zookeeper.set.acl", True, source, "needs zookeeper.digest.username and "
                         "zookeeper.digest.password: the ZooKeeper identity that owns the znodes")

    @property
    def zookeeper_credentials(self) -> DigestCredentials | None:
        """The brokers' ZooKeeper identity (zookeeper.digest.*), if set."""
        if self.zookeeper_digest_username is None or self.zookeeper_digest_password is None:
            return None
        return DigestCredentials(self.zookeeper_digest_username, self.zookeeper_digest_password)

    def _check_listeners(self, merged: Mapping[str, _Value]) -> None:
        """The listener settings against each other, and what their protocols need."""
        def fail(key: str, why: str) -> ConfigError:
            given = merged.get(key)
            return _error(key, getattr(self, _BY_NAME[key].attr), given.source if given else "default", why)

        try:
            listeners = self.listener_list
        except ValueError as e:
            text = str(e)
            key = ("kafka.advertised.listeners" if text.startswith("Kafka advertised")
                   or text.startswith("kafka.advertised") else "kafka.listeners" if "Kafka listener" in text
                   else "inter.broker.listener.name" if "inter.broker.listener.name" in text
                   else "advertised.listeners" if text.startswith("advertised")
                   else "listener.security.protocol.map" if "no security protocol" in text
                   and "listener.security.protocol.map" in merged else "listeners")
            raise fail(key, text) from None
        for listener in listeners:
            host = listener.advertised.host
            if _is_ip(host) and ipaddress.ip_address(host).is_unspecified:
                key = "advertised.listeners" if "advertised.listeners" in merged else "listeners"
                raise fail(key, f"{host} cannot be advertised to clients; set advertised.listeners "
                                "to an address they can reach")
        protocols = {listener.protocol for listener in listeners}
        if any(p.uses_tls for p in protocols) and not self.ssl_keystore_location:
            raise fail("ssl.keystore.location", "an SSL or SASL_SSL listener needs a PEM file with the "
                                                "broker's certificate and key")
        if self.ssl_client_auth != "none" and any(p.uses_tls for p in protocols) and not self.ssl_truststore_location:
            raise fail("ssl.truststore.location", f"ssl.client.auth={self.ssl_client_auth} needs the CA "
                                                  "certificates that sign client certificates")
        inter = inter_broker(listeners)
        if inter.protocol.uses_sasl:
            if self.sasl_jaas_config is None:
                raise fail("sasl.jaas.config", f"the inter-broker listener {inter.name} uses {inter.protocol}: "
                                               "set this broker's username and password")
            try:
                parse_jaas_config(self.sasl_jaas_config)
            except ValueError as e:
                raise fail("sasl.jaas.config", str(e)) from None
            # the other brokers offer only the enabled mechanisms: any other fails every handshake
            if self.sasl_mechanism_inter_broker_protocol not in self.sasl_mechanisms:
                raise fail("sasl.mechanism.inter.broker.protocol",
                           f"must be included in sasl.enabled.mechanisms ({self.sasl_enabled_mechanisms!r}) "
                           f"when SASL is used for inter-broker communication (listener {inter.name})")
        if inter.protocol.uses_tls and not self.ssl_truststore_location:
            raise fail("ssl.truststore.location", f"the inter-broker listener {inter.name} uses {inter.protocol}: "
                                                  "brokers need the CA that signs their certificates")

    @property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        """The SASL mechanisms the SASL listeners offer (sasl.enabled.mechanisms)."""
        return tuple(m.strip() for m in self.sasl_enabled_mechanisms.split(",") if m.strip())

    @property
    def listener_list(self) -> tuple[Listener, ...]:
        """Every listener, checked (ValueError otherwise); the inter-broker one is marked."""
        native = resolve(self.listeners, self.advertised_listeners, self.listener_security_protocol_map,
                         self.inter_broker_listener_name)
        return native + resolve_kafka(self.kafka_listeners, self.kafka_advertised_listeners,
                                      self.listener_security_protocol_map, native)

    @property
    def inter_broker_listener(self) -> Listener:
        return inter_broker(self.listener_list)

    @property
    def listener(self) -> tuple[str, int]:
        """(host, port) the inter-broker listener binds; host "" means every interface."""
        bind = self.inter_broker_listener.bind
        return bind.host, bind.port

    @property
    def advertised(self) -> tuple[str, int]:
        """(host, port) the inter-broker listener publishes; an empty host becomes this machine's name."""
        published = self.inter_broker_listener.advertised
        return published.host or socket.gethostname(), published.port

    @property
    def inter_broker_credentials(self) -> JaasCredentials | None:
        """This broker's own SASL username and password (sasl.jaas.config), if set."""
        return parse_jaas_config(self.sasl_jaas_config) if self.sasl_jaas_config else None

    @property
    def inter_broker_principal(self) -> str | None:
        """The principal this broker authenticates as towards other brokers: User:<username>
        on a SASL inter-broker listener; None when it does not authenticate by SASL (a TLS
        client certificate's subject is read from the certificate, broker/security/tls.py)."""
        credentials = self.inter_broker_credentials
        if credentials is None or not self.inter_broker_listener.protocol.uses_sasl:
            return None
        return f"User:{credentials.username}"

    def log_config(self) -> LogConfig:
        """Topic config defaults: each topic config from its broker_key setting."""
        return LogConfig.from_props({d.name: getattr(self, _BY_NAME[d.broker_key].attr)
                                     for d in TOPIC_CONFIGS if d.broker_key})

    def to_props(self) -> dict[str, Any]:
        """Every setting by Kafka name (None for unset optional ones)."""
        return {s.name: getattr(self, s.attr) for s in SETTINGS}

    def static_names(self) -> frozenset[str]:
        """The settings set to other than their default (what ``to_toml`` writes): Kafka's
        STATIC_BROKER_CONFIG, the others its DEFAULT_CONFIG."""
        return frozenset(s.name for s in SETTINGS
                         if (value := getattr(self, s.attr)) is not None and value != _default_of(self, s))

    def to_toml(self, *, include_defaults: bool = False) -> str:
        """A TOML file that ``load`` turns back into an equal config. Without
        ``include_defaults`` only the settings that differ from their default are written."""
        lines = ["# Tidelog broker configuration: Kafka's setting names (see broker/config.py)."]
        for s in SETTINGS:
            value = getattr(self, s.attr)
            if value is not None and (include_defaults or value != _default_of(self, s)):
                key = f'"{s.name}"' if s.name in _QUOTED else s.name
                lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _default_of(config: Any, s: Setting) -> Any:
    if s.default_from:
        return getattr(config, _BY_NAME[s.default_from].attr)
    return s.default


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_string(v) for v in value) + "]"
    return _toml_string(value)


def _toml_string(s: str) -> str:
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _annotation(s: Setting) -> Any:
    base = tuple[str, ...] if s.type is tuple else s.type
    return base | None if s.default is None else base


def _field(s: Setting) -> tuple[str, Any, Any]:
    if s.default is REQUIRED:
        return s.attr, _annotation(s), dataclasses.field()
    return s.attr, _annotation(s), dataclasses.field(default=s.default, repr=not s.sensitive)


def settings_reference() -> str:
    """The settings table as Markdown, for the docs."""
    rows = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        default = ("(required)" if s.default is REQUIRED else f"= {s.default_from}" if s.default_from
                   else "(unset)" if s.default is None else _toml_value(s.default))
        kind = "list" if s.type is tuple else s.type.__name__
        rows.append(f"| `{s.name}` | {kind} | `{default}` | {s.doc} |")
    rows += [f"| `{a.name}` | alias | | {a.doc} |" for a in ALIASES]
    return "\n".join(rows) + "\n"


BrokerConfig = dataclasses.make_dataclass(
    "BrokerConfig", [_field(s) for s in SETTINGS], bases=(_BrokerConfigBase,),
    frozen=True, slots=True, kw_only=True)
BrokerConfig.__module__ = __name__
BrokerConfig.__doc__ = (
    "The broker's settings; one attribute per entry of SETTINGS (Kafka's name with '.' -> '_').\n"
    "Build it with BrokerConfig.load(path, overrides, env) or BrokerConfig.from_props(props).")
