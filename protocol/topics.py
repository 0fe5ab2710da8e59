"""Topic names and topic-partitions, shared by broker and client."""

from __future__ import annotations

import re
from typing import NamedTuple

from tidelog.protocol.errors import INVALID_TOPIC_EXCEPTION, TidelogError

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")

# Kafka's internal topics (``Topic.isInternal``): only the broker's own components (the group
# coordinator, a transaction coordinator) append to them, straight through the replica
# manager; a client's Produce to one is refused with INVALID_TOPIC_EXCEPTION. Reading them is
# allowed.
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


def is_internal_topic(name: str) -> bool:
    return name in INTERNAL_TOPICS


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def dir_name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def parse_dir_name(cls, name: str) -> "TopicPartition":
        """``"orders-3"`` -> TopicPartition("orders", 3). Raises ValueError for anything else."""
        topic, sep, part = name.rpartition("-")
        if not sep or not topic or not part.isdigit() or not _LEGAL.match(topic):
            raise ValueError(f"{name!r} is not a <topic>-<partition> directory name")
        return cls(topic, int(part))


def validate_topic_name(name: object) -> str:
    """Kafka's rules: 1-249 characters of [a-zA-Z0-9._-], and not "." or ".."."""
    if not isinstance(name, str) or not name:
        raise TidelogError("topic name must be a non-empty string", error=INVALID_TOPIC_EXCEPTION)
    if name in (".", ".."):
        raise TidelogError(f"topic name {name!r} is not allowed", error=INVALID_TOPIC_EXCEPTION)
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise TidelogError(f"topic name is {len(name)} characters, the maximum is {MAX_TOPIC_NAME_LENGTH}",
                           error=INVALID_TOPIC_EXCEPTION)
    if not _LEGAL.match(name):
        raise TidelogError(f"topic name {name!r} contains characters other than ASCII letters, "
                           "digits, '.', '_' and '-'", error=INVALID_TOPIC_EXCEPTION)
    return name
