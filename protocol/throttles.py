"""The replication throttle configs (Kafka's KIP-73), as the broker, the controller and
``tidelog reassign`` read and write them: the broker rates and the topics' throttled-replica
lists (broker/replication/throttle.py has the rules of the throttle itself)."""

from __future__ import annotations

from functools import lru_cache

ALL_REPLICAS = "*"
LEADER_RATE, FOLLOWER_RATE = "leader.replication.throttled.rate", "follower.replication.throttled.rate"
LEADER_REPLICAS, FOLLOWER_REPLICAS = "leader.replication.throttled.replicas", "follower.replication.throttled.replicas"
DYNAMIC_BROKER_CONFIGS = (LEADER_RATE, FOLLOWER_RATE)
MAX_RATE = (1 << 63) - 1


def normalize_throttled_replicas(value: str) -> str:
    """A throttled-replicas list in canonical form ("" for none, "*", or sorted
    ``partition:broker`` entries); ValueError naming the first bad entry."""
    text = str(value).strip()
    if text in ("", ALL_REPLICAS):
        return text
    entries = set()
    for raw in text.split(","):
        part, sep, broker = raw.strip().partition(":")
        if not sep or not part.strip().isdigit() or not broker.strip().isdigit():
            raise ValueError(f"expected '*' or partition:broker entries separated by commas, not {raw.strip()!r}")
        entries.add((int(part), int(broker)))
    return ",".join(f"{p}:{b}" for p, b in sorted(entries))


@lru_cache(maxsize=1024)
def throttled_replicas(value: str) -> frozenset[tuple[int, int]] | str:
    """The (partition, broker) pairs of a normalized list, or ``ALL_REPLICAS``."""
    if value == ALL_REPLICAS:
        return ALL_REPLICAS
    if not value:
        return frozenset()
    return frozenset((int(p), int(b)) for p, b in (e.split(":") for e in value.split(",")))


def is_throttled(value: str, partition: int, broker: int) -> bool:
    """Whether ``value`` (a topic's throttled-replicas config) lists the replica."""
    pairs = throttled_replicas(value)
    return pairs == ALL_REPLICAS or (partition, broker) in pairs


def check_rate(key: str, value: str | None) -> None:
    """ValueError unless ``value`` is a positive number of bytes per second (None: unset)."""
    if value is None:
        return
    try:
        rate = int(str(value).strip())
    except ValueError:
        raise ValueError(f"{key} must be a whole number of bytes per second, got {value!r}") from None
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"{key} must be between 1 and {MAX_RATE} bytes per second (Kafka's long), got {rate}")
