"""The values the SDK hands to applications: consumed records and produce acknowledgements.

``Record`` is built once per consumed record, so it is a plain slotted dataclass (no frozen
``__setattr__`` detour, its empty headers list made only when asked for); treat it as a value.
``TopicPartition`` is the protocol's NamedTuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tidelog.protocol.records import TimestampType
from tidelog.protocol.topics import TopicPartition

__all__ = ["Record", "RecordMetadata", "OffsetAndMetadata", "ConsumerRecords", "TopicPartition", "TimestampType"]


@dataclass(slots=True, init=False)
class Record:
    """One consumed record. ``timestamp`` is in ms; ``timestamp_type`` says whether it is the
    producer's CreateTime (0) or the broker's LogAppendTime (1).

    ``headers`` is a list of ``(key, value)``. A record built without headers gets its empty
    list on first access (the consumer builds hundreds of thousands of records a second, and
    an empty list per record was a quarter of that cost)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: Any  # bytes or None, unless the consumer has a key_deserializer
    value: Any  # likewise (value_deserializer)
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_type: int = TimestampType.CREATE_TIME

    def __init__(self, topic: str, partition: int, offset: int, timestamp: int, key: Any,
                 value: Any, headers: list[tuple[str, bytes | None]] | None = None,
                 timestamp_type: int = TimestampType.CREATE_TIME):
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        if headers is not None:
            self.headers = headers
        self.timestamp_type = timestamp_type

    def __getattr__(self, name: str):
        # only reached when the headers slot was never set: create the empty list now
        if name == "headers":
            headers: list[tuple[str, bytes | None]] = []
            self.headers = headers
            return headers
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record landed. ``offset`` is -1 with acks=0 (nobody told us);
    ``timestamp`` is the broker's append time under LogAppendTime, else the record's own."""

    topic: str
    partition: int
    offset: int
    timestamp: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class OffsetAndMetadata(NamedTuple):
    """An offset to commit (the next offset to read) with a metadata string the group
    coordinator stores beside it and ``committed(..., metadata=True)`` returns (Kafka's
    OffsetAndMetadata; the broker refuses more than ``offset.metadata.max.bytes``, 4096 bytes
    of UTF-8 by default, with OFFSET_METADATA_TOO_LARGE). ``leader_epoch`` is accepted for
    kafka-python's three-field form and not sent."""

    offset: int
    metadata: str | None = ""
    leader_epoch: int = -1


class ConsumerRecords(list):
    """What ``poll`` returns: its records in order, a list (as always), which also answers
    kafka-python's dict of ``{TopicPartition: [records]}``: ``items()``, ``keys()``,
    ``values()`` and ``get(tp)`` group the records by partition (indexing and ``in`` stay
    the list's: use ``get(tp)`` for one partition's records)."""

    __slots__ = ()

    def by_partition(self) -> dict[TopicPartition, list[Record]]:
        out: dict[TopicPartition, list[Record]] = {}
        for r in self:
            out.setdefault(TopicPartition(r.topic, r.partition), []).append(r)
        return out

    def items(self):  # type: ignore[no-untyped-def]
        return self.by_partition().items()

    def keys(self):  # type: ignore[no-untyped-def]
        return self.by_partition().keys()

    def values(self):  # type: ignore[no-untyped-def]
        return self.by_partition().values()

    def get(self, partition: TopicPartition, default: Any = None) -> Any:
        return self.by_partition().get(TopicPartition(*partition), default)
