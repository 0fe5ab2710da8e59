"""What the controller checks of a topic-administration request before it acts: pure
functions of the request, the configured limits and what the controller knows.

Each check refuses with the error Kafka uses (INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR,
INVALID_REPLICA_ASSIGNMENT, INVALID_TOPIC_EXCEPTION, INVALID_CONFIG) and a message naming the
field, the value and the limit. They run in an order that keeps refusals cheap: a partition
count is compared with the limits *before* any assignment is planned (a CreateTopics of
2^31-1 partitions is refused at once, with ``validate_only`` or not), and the exact size of
the assignment znode is measured only once the count is known to be reasonable.

Limits on a partition count:

* ``max.partitions.per.topic`` and ``max.partitions.per.request`` (broker settings);
* what ZooKeeper can store: a topic's assignment is one znode (``/brokers/topics/<topic>``,
  JSON: ``{"partitions":{"0":[1,2,3],...},"version":1}``), written in one transaction with the
  topic's config znode, and ZooKeeper refuses a packet larger than ``jute.maxbuffer`` (1 MiB - 1
  by default) by closing the session. ``ZNODE_DATA_LIMIT`` keeps 16 KiB of that for the
  transaction's paths and headers; ``min_assignment_bytes`` is a lower bound of the JSON's size
  from the count, the replication factor and the shortest broker id (exact for ids of one
  length), so the bound is computed before planning and the message can say how many
  partitions would fit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tidelog.broker.log.paths import MAX_FILE_NAME
from tidelog.broker.zookeeper.layout import encode_topic_assignment, encode_topic_config
from tidelog.protocol.errors import (
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    INVALID_TOPIC_EXCEPTION,
    TidelogError,
)
from tidelog.protocol.topics import collides, is_internal_topic, metric_name, validate_topic_name

JUTE_MAXBUFFER = 0xFFFFF  # ZooKeeper's default jute.maxbuffer: the largest packet it accepts
ZNODE_DATA_LIMIT = JUTE_MAXBUFFER - 16 * 1024  # the assignment and config data of one topic

_OUTER = len('{"partitions":{},"version":1}')
_PER_PARTITION = len('"":[]')  # plus the partition's digits, the replicas and the separators


@dataclass(frozen=True, slots=True)
class PartitionLimits:
    per_topic: int = 10_000  # max.partitions.per.topic
    per_request: int = 10_000  # max.partitions.per.request
    znode_bytes: int = ZNODE_DATA_LIMIT


def _digits_below(n: int) -> int:
    """The total number of decimal digits of 0, 1, ..., n-1."""
    total, width, start = 0, 1, 0
    while start < n:
        end = min(n, 10 ** width)
        total += (end - start) * width
        start, width = end, width + 1
    return total


def min_assignment_bytes(partitions: int, replication_factor: int, id_digits: int = 1) -> int:
    """A lower bound of the assignment znode's size (exact when every broker id has
    ``id_digits`` digits) for partitions 0..n-1 of ``replication_factor`` replicas."""
    if partitions <= 0:
        return _OUTER
    # '"p":[r,r,r]' and the comma after it: each replica comes with a comma but the last
    per_partition = _PER_PARTITION + replication_factor * (id_digits + 1)
    return _OUTER + _digits_below(partitions) + partitions * per_partition - 1


def max_partitions_in_znode(replication_factor: int, id_digits: int = 1, limit: int = ZNODE_DATA_LIMIT) -> int:
    """How many partitions of ``replication_factor`` replicas fit in ``limit`` bytes."""
    low, high = 0, limit
    while low < high:
        mid = (low + high + 1) // 2
        if min_assignment_bytes(mid, replication_factor, id_digits) <= limit:
            low = mid
        else:
            high = mid - 1
    return low


def check_topic_name(name: str, existing: Mapping[str, str]) -> None:
    """INVALID_TOPIC_EXCEPTION for a name Kafka refuses, an internal topic's name (the broker
    creates those itself), or a name that collides with an existing topic's in metric names
    (``coll.x`` and ``coll_x``, as Kafka's ``Topic.hasCollision``). ``existing`` maps the
    metric names of the existing topics (``by_metric_name``) to their names."""
    validate_topic_name(name)
    if is_internal_topic(name):
        raise TidelogError(f"{name} is an internal topic: the broker creates it", error=INVALID_TOPIC_EXCEPTION)
    other = existing.get(metric_name(name))
    if other is not None and collides(name, other):
        raise TidelogError(f"topic {name!r} collides with existing topic {other!r}: names that differ only "
                           "in '.' and '_' share metric names", error=INVALID_TOPIC_EXCEPTION)


def check_no_null_configs(configs: Mapping[str, str | None]) -> None:
    """INVALID_CONFIG for a CreateTopics entry with a config of null value, naming the keys in
    the request's order, in Kafka's words (its ``ZkAdminManager.createTopics``)."""
    nulls = [k for k, v in configs.items() if v is None]
    if nulls:
        raise TidelogError(f"Null value not supported for topic configs: {','.join(k[:100] for k in nulls[:10])}",
                           error=INVALID_CONFIG)


def by_metric_name(names: Iterable[str]) -> dict[str, str]:
    """Topic names keyed by their metric names, for ``check_topic_name``."""
    return {metric_name(n): n for n in names}


def check_partition_count(topic: str, count: int, limits: PartitionLimits) -> None:
    """INVALID_PARTITIONS for a count that is not positive or above max.partitions.per.topic."""
    if count <= 0:
        raise TidelogError(f"topic {topic!r}: the number of partitions must be positive, got {count}",
                           error=INVALID_PARTITIONS)
    if count > limits.per_topic:
        raise TidelogError(f"topic {topic!r}: {count} partitions, more than max.partitions.per.topic="
                           f"{limits.per_topic}", error=INVALID_PARTITIONS)
    if len(topic) + 1 + len(str(count - 1)) > MAX_FILE_NAME:  # <topic>-<partition> is a directory name
        raise TidelogError(f"topic {topic[:40]!r}... ({len(topic)} characters): with {count} partitions the "
                           f"directory of the last, {topic[:8]}...-{count - 1}, would have a name longer than "
                           f"{MAX_FILE_NAME} characters", error=INVALID_PARTITIONS)


def check_replication_factor(topic: str, rf: int, live: int) -> None:
    if rf <= 0:
        raise TidelogError(f"topic {topic!r}: the replication factor must be positive (or -1 for the "
                           f"default), got {rf}", error=INVALID_REPLICATION_FACTOR)
    if rf > live:
        raise TidelogError(f"topic {topic!r}: replication factor {rf} is larger than the {live} live brokers",
                           error=INVALID_REPLICATION_FACTOR)


def check_fits_zookeeper(topic: str, count: int, rf: int, broker_ids: Iterable[int], configs: Mapping[str, str],
                         limits: PartitionLimits) -> None:
    """INVALID_PARTITIONS, before planning, if no assignment of ``count`` partitions of ``rf``
    replicas on these brokers can fit in the topic's znodes (with its ``configs``)."""
    ids = [b for b in broker_ids if b >= 0]
    digits = min((len(str(b)) for b in ids), default=1)
    room = limits.znode_bytes - len(encode_topic_config(configs))
    need = min_assignment_bytes(count, rf, digits)
    if need > room:
        _too_big(topic, count, rf, need, max_partitions_in_znode(rf, digits, room), limits)


def check_assignment_size(topic: str, assignment: Mapping[int, list[int]], configs: Mapping[str, str],
                          limits: PartitionLimits, moving: Mapping[int, tuple] | None = None) -> None:
    """INVALID_PARTITIONS if the topic's znodes (assignment, with the ``moving`` partitions'
    adding and removing replicas, and config) exceed the bound."""
    room = limits.znode_bytes - len(encode_topic_config(configs))
    size = len(encode_topic_assignment(assignment, moving))
    if size > room:
        rf = max((len(r) for r in assignment.values()), default=1)
        digits = min((len(str(b)) for r in assignment.values() for b in r if b >= 0), default=1)
        _too_big(topic, len(assignment), rf, size, max_partitions_in_znode(rf, digits, room), limits)


def _too_big(topic: str, count: int, rf: int, size: int, fit: int, limits: PartitionLimits) -> None:
    raise TidelogError(
        f"topic {topic!r}: the assignment of {count} partitions of {rf} replicas takes {size} bytes in "
        f"ZooKeeper, more than fits in the {limits.znode_bytes}-byte limit of a topic's znodes (ZooKeeper's "
        f"jute.maxbuffer, {JUTE_MAXBUFFER} bytes, less headroom): at most {fit} such partitions fit",
        error=INVALID_PARTITIONS)


def check_request_total(total: int, limits: PartitionLimits) -> None:
    if total > limits.per_request:
        raise TidelogError(f"the request creates {total} partitions in all, more than max.partitions.per.request="
                           f"{limits.per_request}", error=INVALID_PARTITIONS)


def _few(items: list, shown: int = 10) -> str:
    """A list for a message, its first ``shown`` items (a request may name thousands)."""
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return f"{items[:shown]}{more}"


def check_assignment(assignment: Mapping[int, list[int]], known: set[int], start: int = 0,
                     replication_factor: int | None = None) -> None:
    """INVALID_REPLICA_ASSIGNMENT unless every partition from ``start`` on has the same,
    non-zero number of distinct, known replicas (``replication_factor`` if given) and the
    partitions are numbered ``start``..``start``+n-1."""
    sizes = {len(r) for r in assignment.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise TidelogError("every partition needs the same, non-zero number of replicas",
                           error=INVALID_REPLICA_ASSIGNMENT)
    if replication_factor is not None and sizes != {replication_factor}:
        raise TidelogError(f"the new partitions have {sizes.pop()} replicas, the topic's have {replication_factor}",
                           error=INVALID_REPLICA_ASSIGNMENT)
    for p, replicas in assignment.items():
        if len(set(replicas)) != len(replicas):
            twice = sorted(b for b, n in Counter(replicas).items() if n > 1)
            raise TidelogError(f"partition {p} lists broker{'s' if len(twice) > 1 else ''} {_few(twice)} more than "
                               f"once", error=INVALID_REPLICA_ASSIGNMENT)
        unknown = set(replicas) - known
        if unknown:
            raise TidelogError(f"partition {p} is assigned to unknown brokers {_few(sorted(unknown))}",
                               error=INVALID_REPLICA_ASSIGNMENT)
    if sorted(assignment) != list(range(start, start + len(assignment))):
        raise TidelogError(f"partitions must be numbered {start}..{start + len(assignment) - 1}",
                           error=INVALID_REPLICA_ASSIGNMENT)
