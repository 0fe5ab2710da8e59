"""Per-log configuration: Kafka's topic-level settings, their broker-level defaults and units.

Every topic config is defined once in ``TOPIC_CONFIGS``: its Kafka name (``segment.bytes``),
the broker key that supplies the cluster default (``log.segment.bytes``), its type, default
and meaning. ``LogConfig`` is the frozen object the log reads; ``LogConfig.from_props``
builds one from string or typed properties and names the offending key on bad input.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tidelog.protocol.errors import INVALID_CONFIG, TidelogError
from tidelog.protocol.records import RecordRules
from tidelog.protocol.throttles import FOLLOWER_REPLICAS, LEADER_REPLICAS, normalize_throttled_replicas

MAX_LONG = 2**63 - 1
# A compressed batch may inflate to at most this many times max.message.bytes: a producer's
# batch.size bounds its uncompressed batches near max.message.bytes, so a real batch stays far
# below; a decompression bomb stops here (memory: about 13 bytes of Python objects per byte of
# the smallest msgpack records, so 8 MiB of records costs ~100 MB at worst).
MAX_INFLATION = 8


class InvalidConfigError(TidelogError):
    error = INVALID_CONFIG


@dataclass(frozen=True, slots=True)
class ConfigDef:
    name: str  # the topic-level name, as in Kafka
    attr: str  # the LogConfig field
    type: type
    default: Any
    broker_key: str | None  # the broker setting that provides the default
    doc: str
    minimum: int | None = None
    choices: tuple[str, ...] | None = None
    maximum: float | None = None
    # canonical form of a valid value; raises ValueError naming what is wrong
    normalize: Callable[[Any], Any] | None = None


CLEANUP_POLICIES = ("compact", "delete")


def normalize_cleanup_policy(value: str) -> str:
    """``cleanup.policy`` is a list, as in Kafka: ``delete``, ``compact`` or both in any order
    (``compact,delete``, ``delete, compact``); returned as ``delete``, ``compact`` or
    ``compact,delete``."""
    parts = {p.strip() for p in value.split(",")}
    unknown = sorted(parts - set(CLEANUP_POLICIES))
    if unknown:
        raise ValueError(f"expected a comma-separated list of {' and '.join(CLEANUP_POLICIES)}, "
                         f"not {', '.join(map(repr, unknown))}")
    return ",".join(p for p in CLEANUP_POLICIES if p in parts)


TOPIC_CONFIGS: tuple[ConfigDef, ...] = (
    ConfigDef("segment.bytes", "segment_bytes", int, 1024**3, "log.segment.bytes",
              "Size at which the active segment is rolled (bytes).", minimum=14),
    ConfigDef("segment.ms", "segment_ms", int, 7 * 24 * 3600 * 1000, "log.roll.ms",
              "Age after which the active segment is rolled even if not full (ms).", minimum=1),
    ConfigDef("segment.index.bytes", "segment_index_bytes", int, 10 * 1024**2, "log.index.size.max.bytes",
              "Maximum size of a segment's offset index; a full index rolls the segment (bytes).", minimum=8),
    ConfigDef("index.interval.bytes", "index_interval_bytes", int, 4096, "log.index.interval.bytes",
              "Bytes of log between two entries of the sparse offset and time indexes.", minimum=0),
    ConfigDef("max.message.bytes", "max_message_bytes", int, 1024 * 1024 + 12, "message.max.bytes",
              "Largest record batch the log accepts (bytes).", minimum=0),
    ConfigDef("retention.ms", "retention_ms", int, 7 * 24 * 3600 * 1000, "log.retention.ms",
              "Delete a closed segment once its newest record is older than this (ms); -1 keeps forever.",
              minimum=-1),
    ConfigDef("retention.bytes", "retention_bytes", int, -1, "log.retention.bytes",
              "Delete the oldest closed segments while the partition is larger than this (bytes); "
              "-1 means no size limit.", minimum=-1),
    ConfigDef("flush.messages", "flush_messages", int, MAX_LONG, "log.flush.interval.messages",
              "fsync after this many appended records; the default relies on replication.", minimum=1),
    ConfigDef("flush.ms", "flush_ms", int, MAX_LONG, "log.flush.interval.ms",
              "fsync when the last flush is older than this (ms); the default relies on replication.",
              minimum=0),
    ConfigDef("file.delete.delay.ms", "file_delete_delay_ms", int, 60000, "log.segment.delete.delay.ms",
              "Accepted for compatibility; has no effect (a deleted segment's files are removed at once).",
              minimum=0),
    ConfigDef("cleanup.policy", "cleanup_policy", str, "delete", "log.cleanup.policy",
              "delete (retention), compact (keep the last record per key) or compact,delete (both).",
              normalize=normalize_cleanup_policy),
    ConfigDef("delete.retention.ms", "delete_retention_ms", int, 24 * 3600 * 1000, "log.cleaner.delete.retention.ms",
              "How long the cleaner keeps tombstones after it first cleaned them, on compacted topics (ms).",
              minimum=0),
    ConfigDef("min.cleanable.dirty.ratio", "min_cleanable_dirty_ratio", float, 0.5,
              "log.cleaner.min.cleanable.ratio",
              "Fraction of a compacted log's bytes not yet cleaned that makes it eligible for cleaning "
              "(0 to 1).", minimum=0, maximum=1),
    ConfigDef("min.compaction.lag.ms", "min_compaction_lag_ms", int, 0, "log.cleaner.min.compaction.lag.ms",
              "A record stays uncompacted at least this long (a segment is cleaned once its newest "
              "record is this old) (ms).", minimum=0),
    ConfigDef("max.compaction.lag.ms", "max_compaction_lag_ms", int, MAX_LONG, "log.cleaner.max.compaction.lag.ms",
              "A record is compacted at most this long after it was written, whatever the dirty "
              "ratio (ms).", minimum=1),
    ConfigDef("message.timestamp.type", "message_timestamp_type", str, "CreateTime", "log.message.timestamp.type",
              "CreateTime keeps the producer's timestamps; LogAppendTime stamps the broker's clock.",
              choices=("CreateTime", "LogAppendTime")),
    ConfigDef("message.timestamp.difference.max.ms", "message_timestamp_difference_max_ms", int, MAX_LONG,
              "log.message.timestamp.difference.max.ms",
              "Deprecated by KIP-937: a CreateTime record may be at most this far from the broker's "
              "clock, either way (ms); the before/after bounds below apply as well.", minimum=0),
    ConfigDef("message.timestamp.before.max.ms", "message_timestamp_before_max_ms", int, MAX_LONG,
              "log.message.timestamp.before.max.ms",
              "Largest age of a CreateTime record's timestamp against the broker's clock when it is "
              "appended (ms); an older one is refused with INVALID_TIMESTAMP.", minimum=0),
    ConfigDef("message.timestamp.after.max.ms", "message_timestamp_after_max_ms", int, 3600 * 1000,
              "log.message.timestamp.after.max.ms",
              "How far in the future of the broker's clock a CreateTime record's timestamp may be "
              "(ms; Kafka 4's default, one hour); a later one is refused with INVALID_TIMESTAMP.",
              minimum=0),
    ConfigDef("min.insync.replicas", "min_insync_replicas", int, 1, "min.insync.replicas",
              "Fewest in-sync replicas for an acks=all write to succeed.", minimum=1),
    ConfigDef("unclean.leader.election.enable", "unclean_leader_election_enable", bool, False,
              "unclean.leader.election.enable",
              "Allow a replica outside the ISR to become leader (may lose acknowledged data)."),
    ConfigDef("compression.type", "compression_type", str, "producer", "compression.type",
              "Only 'producer' is supported: batches are stored as the producer compressed them.",
              choices=("producer",)),
    ConfigDef(LEADER_REPLICAS, "leader_replication_throttled_replicas", str, "", None,
              "Replicas (partition:broker, comma-separated, or *) whose leader side copies at no more "
              "than the leader's leader.replication.throttled.rate while they are not in sync.",
              normalize=normalize_throttled_replicas),
    ConfigDef(FOLLOWER_REPLICAS, "follower_replication_throttled_replicas", str, "", None,
              "Replicas (partition:broker, comma-separated, or *) that fetch at no more than their "
              "broker's follower.replication.throttled.rate while they are not in sync.",
              normalize=normalize_throttled_replicas),
)

_BY_NAME = {d.name: d for d in TOPIC_CONFIGS}


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1024**3
    segment_ms: int = 7 * 24 * 3600 * 1000
    segment_index_bytes: int = 10 * 1024**2
    index_interval_bytes: int = 4096
    max_message_bytes: int = 1024 * 1024 + 12
    retention_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    flush_messages: int = MAX_LONG
    flush_ms: int = MAX_LONG
    file_delete_delay_ms: int = 60000
    cleanup_policy: str = "delete"
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = MAX_LONG
    message_timestamp_type: str = "CreateTime"
    message_timestamp_difference_max_ms: int = MAX_LONG
    message_timestamp_before_max_ms: int = MAX_LONG
    message_timestamp_after_max_ms: int = 3600 * 1000
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    compression_type: str = "producer"
    leader_replication_throttled_replicas: str = ""
    follower_replication_throttled_replicas: str = ""
    # derived once (every leader append checks its records against them), not a setting
    record_rules: RecordRules = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "record_rules", RecordRules(
            self.timestamp_before_max_ms, self.timestamp_after_max_ms, not self.log_append_time,
            self.compacts, self.max_uncompressed_bytes))

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def timestamp_before_max_ms(self) -> int:
        """The KIP-937 bound in force: the stricter of ``before`` and the deprecated ``difference``."""
        return min(self.message_timestamp_before_max_ms, self.message_timestamp_difference_max_ms)

    @property
    def timestamp_after_max_ms(self) -> int:
        return min(self.message_timestamp_after_max_ms, self.message_timestamp_difference_max_ms)

    @property
    def max_uncompressed_bytes(self) -> int:
        """Hard bound on what one compressed batch may inflate to: ``MAX_INFLATION`` times
        ``max.message.bytes`` (at least 1 MiB). Inflation stops at the bound (CORRUPT_MESSAGE)."""
        return max(MAX_INFLATION * self.max_message_bytes, 1024 * 1024)

    @property
    def deletes(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compacts(self) -> bool:
        return "compact" in self.cleanup_policy

    def with_overrides(self, props: Mapping[str, Any]) -> "LogConfig":
        """A copy with topic-level overrides (Kafka names) applied and validated."""
        return dataclasses.replace(self, **{_def(k).attr: parse_value(k, v) for k, v in props.items()})

    @classmethod
    def from_props(cls, props: Mapping[str, Any]) -> "LogConfig":
        return cls().with_overrides(props)

    def to_props(self) -> dict[str, Any]:
        return {d.name: getattr(self, d.attr) for d in TOPIC_CONFIGS}


def _def(name: str) -> ConfigDef:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidConfigError(f"unknown topic config {name!r}") from None


def parse_value(name: str, raw: Any) -> Any:
    """The typed value of topic config ``name``, or InvalidConfigError naming the key and value."""
    d = _def(name)
    try:
        value = _coerce(d.type, raw)
    except (TypeError, ValueError):
        raise InvalidConfigError(f"invalid value {_shown(raw)} for {name}: expected {d.type.__name__}") from None
    if d.type is float and not math.isfinite(value):
        raise InvalidConfigError(f"invalid value {_shown(raw)} for {name}: expected a finite number")
    if d.minimum is not None and value < d.minimum:
        raise InvalidConfigError(f"invalid value {_shown(raw)} for {name}: must be at least {d.minimum}")
    if d.maximum is not None and value > d.maximum:
        raise InvalidConfigError(f"invalid value {_shown(raw)} for {name}: must be at most {d.maximum}")
    if d.type is int and value > (high := int_maximum(name)):
        raise InvalidConfigError(f"invalid value {_shown(raw)} for {name}: must be at most {high} "
                                 f"(Kafka's {'int' if high < MAX_LONG else 'long'})")
    if d.normalize is not None:
        try:
            value = d.normalize(value)
        except ValueError as e:
            raise InvalidConfigError(f"invalid value {_shown(raw)} for {name}: {e}") from None
    if d.choices is not None and value not in d.choices:
        raise InvalidConfigError(f"invalid value {_shown(raw)} for {name}: must be one of {', '.join(d.choices)}")
    return value


def _coerce(typ: type, raw: Any) -> Any:
    if typ is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise ValueError(raw)
    if typ is int:
        if isinstance(raw, bool):
            raise TypeError(raw)
        if isinstance(raw, int):
            return raw
        if isinstance(raw, str) and _INTEGER.fullmatch(raw.strip()):  # Java's parseLong: ASCII digits
            return int(raw.strip())
        raise TypeError(raw)
    if typ is float:
        if isinstance(raw, bool):
            raise TypeError(raw)
        return float(raw)
    if not isinstance(raw, str):
        raise TypeError(raw)
    return raw


_INTEGER = re.compile(r"[+-]?[0-9]{1,19}")

# Topic configs that are an ``int`` in Kafka (the others are ``long``): a value must fit in
# 32 bits (segment positions and sizes are 32-bit in the index files too).
INT_CONFIGS = frozenset({"segment.bytes", "segment.index.bytes", "index.interval.bytes", "max.message.bytes",
                         "min.insync.replicas"})
MAX_INT = 2**31 - 1


def int_maximum(name: str) -> int:
    """The largest value of integer topic config ``name``: Kafka's int or long."""
    return MAX_INT if name in INT_CONFIGS else MAX_LONG


# -- what a client may set ---------------------------------------------------------------------
#
# A topic config set through CreateTopics or AlterConfigs must also meet these minimums, which
# are stricter than the configs' own (the broker's settings and the configs ZooKeeper already
# holds, written by the broker itself or before an upgrade, keep the looser ones): each segment
# costs files and a descriptor while it is open, so a topic that rolls a segment per record
# (``segment.bytes`` 100, ``segment.ms`` 1, ``segment.index.bytes`` 8) lets one producer
# exhaust the broker's descriptors. The values are Kafka's KIP-1030 minimums (4.0 for
# ``segment.bytes``, 5.0 for the others); the broker settings ``log.segment.min.bytes`` and
# ``log.roll.min.ms`` replace the first two (``ControllerConfig.config_minimums``).

MAX_REQUESTED_VALUE_LENGTH = 1024  # a topic config value, as a client sends it (and ZooKeeper keeps it)

REQUEST_MINIMUMS: Mapping[str, int] = {
    "segment.bytes": 1024 * 1024,  # KIP-1030 (Kafka 4.0); Kafka's minimum was 14 bytes
    "segment.ms": 60_000,  # KIP-1030 (Kafka 5.0); was 1 ms
    "segment.index.bytes": 1024,  # KIP-1030 (Kafka 5.0); was 4 bytes (Tidelog's: 8)
}


def check_requested(props: Mapping[str, Any], minimums: Mapping[str, int] = REQUEST_MINIMUMS) -> None:
    """InvalidConfigError naming the key, the value and the minimum if one of ``props`` (topic
    configs a client asked for; a None value removes an override) is longer than
    ``MAX_REQUESTED_VALUE_LENGTH`` characters, or valid but below its
    ``minimums`` entry (a subset of ``REQUEST_MINIMUMS``' keys)."""
    for name, raw in props.items():
        if isinstance(raw, str) and len(raw) > MAX_REQUESTED_VALUE_LENGTH:  # ZooKeeper stores it as given
            raise InvalidConfigError(f"invalid value for {name}: {len(raw)} characters, more than "
                                     f"{MAX_REQUESTED_VALUE_LENGTH}")
        floor = minimums.get(name)
        if floor is None or raw is None:
            continue
        value = parse_value(name, raw)
        if value < floor:
            raise InvalidConfigError(
                f"invalid value {_shown(raw)} for {name}: must be at least {floor} ({_MINIMUM_SOURCES[name]}) when set "
                "through CreateTopics or AlterConfigs: smaller segments roll so often that their files "
                "exhaust the broker's descriptors")


_MINIMUM_SOURCES = {"segment.bytes": "log.segment.min.bytes", "segment.ms": "log.roll.min.ms",
                    "segment.index.bytes": "Kafka's minimum, KIP-1030"}


def _shown(raw: Any) -> str:
    """A value as an error message quotes it: its repr, cut at 100 characters."""
    text = repr(raw)
    return text if len(text) <= 100 else f"{text[:100]}... ({len(text)} characters)"
