"""Topic names and topic-partitions, shared by broker and client.

A topic name follows Kafka's rule (``Topic.validate``): 1 to 249 characters of ASCII letters,
digits, ``.``, ``_`` and ``-``, and not ``.`` or ``..``. So a valid name is always a plain file
name and a plain znode name: no separator, no NUL, no way up. Two names that differ only by
``.`` against ``_`` collide (``Topic.hasCollision``: Kafka's metric names replace ``.`` by
``_``), so a cluster holds at most one of them.

A partition number is a non-negative int32 (Kafka's type).

A partition's high watermark moves only while its ISR has at least the *effective* min ISR:
``min.insync.replicas`` capped at its replica count (``effective_min_isr``; the rule is in
``broker/replication/partition.py``). Broker and client both need it: the leader to gate the
HW, ``tidelog topics describe`` to flag a partition whose HW is held.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from tidelog.protocol.errors import INVALID_TOPIC_EXCEPTION, TidelogError

MAX_TOPIC_NAME_LENGTH = 249
MAX_PARTITION = (1 << 31) - 1
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")  # used with fullmatch: no trailing newline slips through

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
        """``"orders-3"`` -> TopicPartition("orders", 3), so that ``dir_name`` gives the name back.
        Raises ValueError for anything else (``orders-03`` too)."""
        topic, sep, part = name.rpartition("-")
        if (not sep or not part.isascii() or not part.isdigit() or part != str(int(part))
                or int(part) > MAX_PARTITION or topic_name_problem(topic) is not None):
            raise ValueError(f"{name!r} is not a <topic>-<partition> directory name")
        return cls(topic, int(part))


@functools.lru_cache(maxsize=16384)
def _problem_of(name: str) -> str | None:
    if not name:
        return "topic name is empty"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"topic name is {len(name)} characters, the maximum is {MAX_TOPIC_NAME_LENGTH}"
    if name in (".", ".."):
        return f"topic name {name!r} is not allowed"
    if not _LEGAL.fullmatch(name):
        return (f"topic name {name!r} contains characters other than ASCII letters, digits, "
                "'.', '_' and '-'")
    return None


def topic_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid topic name (Kafka's rule), or None if it is. Cached, so a
    request that names one topic in many partitions checks it once."""
    if type(name) is not str:
        return "topic name must be a string"
    if len(name) > MAX_TOPIC_NAME_LENGTH:  # not cached: a hostile name must not fill the cache
        return f"topic name is {len(name)} characters, the maximum is {MAX_TOPIC_NAME_LENGTH}"
    return _problem_of(name)


def validate_topic_name(name: object) -> str:
    """Kafka's rules: 1-249 characters of [a-zA-Z0-9._-], and not "." or "..". Raises
    TidelogError (INVALID_TOPIC_EXCEPTION) naming what is wrong."""
    problem = topic_name_problem(name)
    if problem is not None:
        raise TidelogError(problem, error=INVALID_TOPIC_EXCEPTION)
    return name  # type: ignore[return-value]


def partition_problem(partition: object) -> str | None:
    """Why ``partition`` is not a partition number (a non-negative int32), or None."""
    if type(partition) is not int:
        return f"partition must be an int, got {type(partition).__name__}"
    if not 0 <= partition <= MAX_PARTITION:
        return f"partition {partition} is out of range [0, {MAX_PARTITION}]"
    return None


def metric_name(topic: str) -> str:
    """The form of a topic name in Kafka's metric names: "." becomes "_"."""
    return topic.replace(".", "_")


def collides(a: str, b: str) -> bool:
    """True if two different topic names would share metric names (Kafka's ``hasCollision``)."""
    return a != b and metric_name(a) == metric_name(b)


def effective_min_isr(min_insync_replicas: int, replication_factor: int) -> int:
    """Kafka's ``effectiveMinIsr`` (KIP-966): ``min.insync.replicas`` capped at the replica
    count, so a partition with fewer replicas than that can still advance its HW (never
    below 1)."""
    return max(1, min(min_insync_replicas, replication_factor))
