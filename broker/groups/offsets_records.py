"""The records of ``__consumer_offsets``: key/value codec, and the fold that rebuilds a
partition's groups and offsets from its records.

Every record is keyed, so log compaction keeps the last record per key (a committed offset
per group and partition, a group's metadata per group); a tombstone (value nil) deletes the
key. Keys and values are msgpack, versioned the way Kafka versions them::

    offset commit key   := [1, group:str, topic:str, partition:int]
    group metadata key  := [2, group:str]
    offset commit value := {"version": 0, "offset": int, "leader_epoch": int,
                            "metadata": str|nil, "commit_timestamp_ms": int,
                            "expire_timestamp_ms": int}
    group metadata value:= {"version": 0, "protocol_type": str|nil, "generation": int,
                            "protocol": str|nil, "leader": str|nil,
                            "current_state_timestamp_ms": int,
                            "members": [{"member_id", "group_instance_id", "client_id",
                                         "client_host", "rebalance_timeout_ms",
                                         "session_timeout_ms", "subscription": bin,
                                         "assignment": bin}, ...]}

The key's first element is its version and says which kind of key it is (Kafka's numbering:
0 and 1 are offset commit keys, 2 the group metadata key). A value's ``version`` is the
schema of its map; unknown keys in a map are ignored (a newer broker may add fields), a
higher version than this broker knows is read as far as its known fields go.

This module is pure: bytes in, typed values out, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from tidelog.protocol.topics import TopicPartition

OFFSET_COMMIT_KEY_VERSIONS = (0, 1)
OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 0
GROUP_VALUE_VERSION = 0
MAX_RECORD_BYTES = 64 << 20  # bound on one key or value while decoding


class OffsetsRecordError(ValueError):
    """A key or value of ``__consumer_offsets`` that does not follow the grammar above."""


@dataclass(frozen=True, slots=True)
class OffsetKey:
    group: str
    topic: str
    partition: int

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class GroupKey:
    group: str


@dataclass(frozen=True, slots=True)
class OffsetValue:
    """A committed offset. ``record_offset`` is where its record sits in __consumer_offsets
    (not encoded): of two commits for one partition the later record wins."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = None
    commit_timestamp_ms: int = -1
    expire_timestamp_ms: int = -1
    record_offset: int = -1


@dataclass(frozen=True, slots=True)
class MemberValue:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str | None
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberValue, ...] = ()


# -- encoding -------------------------------------------------------------------------------------


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def offset_key(group: str, tp: TopicPartition) -> bytes:
    return _pack([OFFSET_COMMIT_KEY_VERSION, group, tp.topic, tp.partition])


def group_key(group: str) -> bytes:
    return _pack([GROUP_METADATA_KEY_VERSION, group])


def offset_value(v: OffsetValue) -> bytes:
    return _pack({"version": OFFSET_VALUE_VERSION, "offset": v.offset, "leader_epoch": v.leader_epoch,
                  "metadata": v.metadata, "commit_timestamp_ms": v.commit_timestamp_ms,
                  "expire_timestamp_ms": v.expire_timestamp_ms})


def group_value(v: GroupMetadataValue) -> bytes:
    return _pack({"version": GROUP_VALUE_VERSION, "protocol_type": v.protocol_type, "generation": v.generation,
                  "protocol": v.protocol, "leader": v.leader,
                  "current_state_timestamp_ms": v.current_state_timestamp_ms,
                  "members": [_member_map(m) for m in v.members]})


def _member_map(m: MemberValue) -> dict[str, Any]:
    return {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
            "client_host": m.client_host, "rebalance_timeout_ms": m.rebalance_timeout_ms,
            "session_timeout_ms": m.session_timeout_ms, "subscription": m.subscription,
            "assignment": m.assignment}


# -- decoding -------------------------------------------------------------------------------------


def _unpack(data: bytes, what: str) -> Any:
    n = len(data)
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, max_bin_len=n, max_str_len=n,
                               max_array_len=n, max_map_len=n, max_ext_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise OffsetsRecordError(f"{what} is not valid msgpack: {e}") from None


def decode_key(data: bytes) -> OffsetKey | GroupKey:
    if len(data) > MAX_RECORD_BYTES:
        raise OffsetsRecordError(f"key of {len(data)} bytes is too large")
    items = _unpack(data, "key")
    if type(items) is not list or not items or type(items[0]) is not int:
        raise OffsetsRecordError(f"key must be an array starting with its version, got {items!r:.80}")
    version = items[0]
    if version in OFFSET_COMMIT_KEY_VERSIONS and len(items) == 4:
        _, group, topic, partition = items
        if type(group) is str and type(topic) is str and type(partition) is int:
            return OffsetKey(group, topic, partition)
    elif version == GROUP_METADATA_KEY_VERSION and len(items) == 2 and type(items[1]) is str:
        return GroupKey(items[1])
    raise OffsetsRecordError(f"unknown or malformed key (version {version}): {items!r:.80}")


def decode_offset_value(data: bytes, record_offset: int = -1) -> OffsetValue:
    m = _value_map(data, "offset commit value")
    return OffsetValue(_field(m, "offset", int), _field(m, "leader_epoch", int, -1),
                       _field(m, "metadata", (str, type(None)), None),
                       _field(m, "commit_timestamp_ms", int, -1), _field(m, "expire_timestamp_ms", int, -1),
                       record_offset)


def decode_group_value(data: bytes) -> GroupMetadataValue:
    m = _value_map(data, "group metadata value")
    members = _field(m, "members", list, [])
    return GroupMetadataValue(
        _field(m, "protocol_type", (str, type(None)), None), _field(m, "generation", int),
        _field(m, "protocol", (str, type(None)), None), _field(m, "leader", (str, type(None)), None),
        _field(m, "current_state_timestamp_ms", int, -1), tuple(_member(x) for x in members))


def _member(m: Any) -> MemberValue:
    if type(m) is not dict:
        raise OffsetsRecordError(f"group member must be a map, got {type(m).__name__}")
    opt_str = (str, type(None))
    return MemberValue(_field(m, "member_id", str), _field(m, "group_instance_id", opt_str, None),
                       _field(m, "client_id", str, ""), _field(m, "client_host", str, ""),
                       _field(m, "rebalance_timeout_ms", int), _field(m, "session_timeout_ms", int),
                       _field(m, "subscription", bytes, b""), _field(m, "assignment", bytes, b""))


_MISSING = object()


def _value_map(data: bytes, what: str) -> dict:
    if len(data) > MAX_RECORD_BYTES:
        raise OffsetsRecordError(f"{what} of {len(data)} bytes is too large")
    m = _unpack(data, what)
    if type(m) is not dict or type(m.get("version")) is not int:
        raise OffsetsRecordError(f"{what} must be a map with an int version")
    return m


def _field(m: dict, name: str, types: type | tuple, default: Any = _MISSING) -> Any:
    value = m.get(name, default)
    if value is _MISSING:
        raise OffsetsRecordError(f"missing field {name!r}")
    if not isinstance(value, types) or (type(value) is bool and types is int):
        raise OffsetsRecordError(f"field {name!r}: unexpected {type(value).__name__}")
    return value


# -- loading -------------------------------------------------------------------------------------


@dataclass
class LoadedPartition:
    """What a partition of ``__consumer_offsets`` holds once its records are folded: the last
    group metadata of each group, and each group's last committed offsets (tombstones
    applied). ``skipped`` counts records that could not be decoded (logged by the caller)."""

    groups: dict[str, GroupMetadataValue] = field(default_factory=dict)
    offsets: dict[str, dict[TopicPartition, OffsetValue]] = field(default_factory=dict)
    skipped: list[tuple[int, str]] = field(default_factory=list)

    def apply(self, record_offset: int, key: bytes | None, value: bytes | None) -> None:
        """Fold one record in (records must be applied in log order)."""
        try:
            if key is None:
                raise OffsetsRecordError("record without a key")
            k = decode_key(key)
            if isinstance(k, OffsetKey):
                self._apply_offset(k, value, record_offset)
            else:
                self._apply_group(k, value)
        except OffsetsRecordError as e:
            self.skipped.append((record_offset, str(e)))

    def _apply_offset(self, k: OffsetKey, value: bytes | None, record_offset: int) -> None:
        if value is None:
            group = self.offsets.get(k.group)
            if group is not None:
                group.pop(k.tp, None)
                if not group:
                    del self.offsets[k.group]
            return
        self.offsets.setdefault(k.group, {})[k.tp] = decode_offset_value(value, record_offset)

    def _apply_group(self, k: GroupKey, value: bytes | None) -> None:
        if value is None:
            self.groups.pop(k.group, None)
        else:
            self.groups[k.group] = decode_group_value(value)

    def group_ids(self) -> set[str]:
        return set(self.groups) | set(self.offsets)


def load(records: Iterable[tuple[int, bytes | None, bytes | None]]) -> LoadedPartition:
    """Fold ``(offset, key, value)`` records, in log order, into a LoadedPartition."""
    out = LoadedPartition()
    for record_offset, key, value in records:
        out.apply(record_offset, key, value)
    return out
