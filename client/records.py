"""The values the SDK hands to applications: consumed records and produce acknowledgements.

``Record`` is built once per consumed record, so it is a plain slotted dataclass (no frozen
``__setattr__`` detour); treat it as a value. ``TopicPartition`` is the protocol's NamedTuple.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.records import TimestampType
from protocol.topics import TopicPartition

__all__ = ["Record", "RecordMetadata", "TopicPartition", "TimestampType"]


@dataclass(slots=True)
class Record:
    """One consumed record. ``timestamp`` is in ms; ``timestamp_type`` says whether it is the
    producer's CreateTime (0) or the broker's LogAppendTime (1)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_type: int = TimestampType.CREATE_TIME

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
