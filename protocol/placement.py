"""Replica placement: Kafka's rule for which brokers hold a topic's partitions.

Topic creation and CreatePartitions (on the controller) and ``tidelog reassign --generate``
(in the CLI) place replicas with the same rule, so a generated reassignment looks like a
topic created on the brokers it names; the brokers use racks whenever every broker has one. Pure: the random start is drawn from ``rng``.
"""

from __future__ import annotations

import random
from typing import Any, Mapping

from tidelog.protocol.errors import INVALID_PARTITIONS, INVALID_REPLICATION_FACTOR, TidelogError


class InvalidReplicationFactorError(TidelogError, ValueError):
    error = INVALID_REPLICATION_FACTOR


class InvalidPartitionsError(TidelogError, ValueError):
    error = INVALID_PARTITIONS


def assign_replicas(broker_ids: list[int], num_partitions: int, replication_factor: int, *,
                    start_index: int | None = None, start_partition_id: int = 0,
                    racks: Mapping[int, str | None] | None = None,
                    rng: Any = random) -> dict[int, list[int]]:
    """Kafka's ``AdminUtils.assignReplicasToBrokers``: partition -> replica list.

    Rack-unaware (the brokers sorted by id):

    1. the first replica of each partition goes round-robin over the brokers, starting at a
       random index (so that topics do not all start on broker 0);
    2. the other replicas follow the first at a shift that starts random and increases by
       one each time the partition id wraps around the broker list, so that the followers
       of one broker's leaders are spread over all others.

    With ``start_index`` (tests, Kafka's ``fixedStartIndex``) both the start index and the
    initial shift are fixed to it. ``start_partition_id`` continues an existing topic
    (CreatePartitions). For 5 brokers, 10 partitions, RF 3, start index 0 (Kafka's scaladoc)::

        broker-0  broker-1  broker-2  broker-3  broker-4
        p0        p1        p2        p3        p4       (1st replica)
        p5        p6        p7        p8        p9       (1st replica)
        p4        p0        p1        p2        p3       (2nd replica)
        p8        p9        p5        p6        p7       (2nd replica)
        p3        p4        p0        p1        p2       (3rd replica)
        p7        p8        p9        p5        p6       (3rd replica)

    Rack-aware (``racks`` maps every broker to a rack): the same walk over the
    rack-alternated broker list, skipping a broker when its rack already holds a replica
    while some rack holds none, or when it holds one while some broker holds none. Either
    every broker has a rack or none has (else ValueError, as Kafka).
    """
    brokers = sorted(broker_ids)
    _check_assignment_args(brokers, num_partitions, replication_factor)
    rack_of = _racks_or_none(brokers, racks)
    arranged = brokers if rack_of is None else rack_alternated_broker_list(rack_of)
    n = len(arranged)
    first_start = start_index if start_index is not None else rng.randrange(n)
    shift = start_index if start_index is not None else rng.randrange(n)
    out: dict[int, list[int]] = {}
    for partition in range(max(0, start_partition_id), max(0, start_partition_id) + num_partitions):
        if partition > 0 and partition % n == 0:
            shift += 1
        first = (partition + first_start) % n
        if rack_of is None:
            out[partition] = [arranged[first]] + [
                arranged[_replica_index(first, shift, j, n)] for j in range(replication_factor - 1)]
        else:
            out[partition] = _rack_aware_replicas(arranged, rack_of, first, shift, replication_factor)
    return out


def racks_when_complete(rack_of: Mapping[int, str | None]) -> dict[int, str] | None:
    """The ``racks`` argument for placing replicas on the brokers of ``rack_of``: their racks
    when every one has a rack, else None (rack-unaware). Topic creation, CreatePartitions and
    the brokers' own topics (auto-created, ``__consumer_offsets``) all place with it, so a
    cluster with racks spreads every partition over them."""
    racks = {b: r for b, r in rack_of.items() if r}
    return racks if racks and len(racks) == len(rack_of) else None


def partition_zero_start(broker_ids: list[int], partition_zero: list[int]) -> int:
    """Kafka's start index for partitions added to a topic: the first broker (by id) not
    below partition 0's first replica, so the new partitions continue its round-robin."""
    brokers = sorted(broker_ids)
    first = partition_zero[0] if partition_zero else brokers[0]
    return next((i for i, b in enumerate(brokers) if b >= first), 0)


def _check_assignment_args(brokers: list[int], num_partitions: int, replication_factor: int) -> None:
    if len(set(brokers)) != len(brokers):
        raise ValueError(f"duplicate broker ids in {brokers}")
    if num_partitions <= 0:
        raise InvalidPartitionsError(f"Number of partitions must be larger than 0, got {num_partitions}.")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError(
            f"Replication factor must be larger than 0, got {replication_factor}.")
    if replication_factor > len(brokers):
        raise InvalidReplicationFactorError(
            f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}.")


def _racks_or_none(brokers: list[int], racks: Mapping[int, str | None] | None) -> dict[int, str] | None:
    known = {b: racks[b] for b in brokers if racks and racks.get(b)}
    if not known:
        return None
    if len(known) != len(brokers):
        missing = sorted(set(brokers) - set(known))
        raise ValueError(f"Not all brokers have rack information (missing for {missing}): "
                         "give every broker a rack, or none")
    return known


def _replica_index(first_replica_index: int, shift: int, j: int, n: int) -> int:
    """Index of the (j+2)-th replica: never the first one's, since 1 <= offset <= n-1."""
    return (first_replica_index + 1 + (shift + j) % (n - 1)) % n


def _rack_aware_replicas(arranged: list[int], rack_of: Mapping[int, str], first: int, shift: int,
                         replication_factor: int) -> list[int]:
    n, num_racks = len(arranged), len(set(rack_of.values()))
    leader = arranged[first]
    replicas, racks_used, brokers_used = [leader], {rack_of[leader]}, {leader}
    k = 0
    while len(replicas) < replication_factor:
        broker = arranged[_replica_index(first, shift * num_racks, k, n)]
        rack = rack_of[broker]
        k += 1
        if rack in racks_used and len(racks_used) < num_racks:
            continue    # another rack still has no replica
        if broker in brokers_used and len(brokers_used) < n:
            continue    # another broker still has no replica
        replicas.append(broker)
        racks_used.add(rack)
        brokers_used.add(broker)
    return replicas


def rack_alternated_broker_list(rack_of: Mapping[int, str]) -> list[int]:
    """Brokers interleaved by rack: racks in name order, brokers in id order within a rack.

    ``{0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}`` ->
    ``[0, 3, 1, 5, 4, 2]`` (Kafka's ``getRackAlternatedBrokerList``).
    """
    by_rack: dict[str, list[int]] = {}
    for broker, rack in sorted(rack_of.items()):
        by_rack.setdefault(rack, []).append(broker)
    columns = [by_rack[r] for r in sorted(by_rack)]
    depth = max(len(c) for c in columns)
    return [c[i] for i in range(depth) for c in columns if i < len(c)]
