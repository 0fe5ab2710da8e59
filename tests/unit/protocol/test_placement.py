"""Replica placement: Kafka's AdminUtils.assignReplicasToBrokers, rack-unaware and
rack-aware, against the examples of Kafka's scaladoc and the properties it promises."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tidelog.protocol.errors import INVALID_REPLICATION_FACTOR
from tidelog.protocol.placement import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    assign_replicas,
    rack_alternated_broker_list,
    racks_when_complete,
)


def test_kafka_scaladoc_example_5_brokers_10_partitions_rf3():
    """AdminUtils.assignReplicasToBrokers' scaladoc table (and AdminTest.testReplicaAssignment)."""
    got = assign_replicas([0, 1, 2, 3, 4], 10, 3, start_index=0)
    assert got == {0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
                   5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2]}
    # The table read per broker: broker-0 leads p0 and p5, is 2nd replica of p4, p8 and 3rd of p3, p7.
    leads = {b: [p for p, r in got.items() if r[0] == b] for b in range(5)}
    second = {b: [p for p, r in got.items() if r[1] == b] for b in range(5)}
    third = {b: [p for p, r in got.items() if r[2] == b] for b in range(5)}
    assert leads[0] == [0, 5] and second[0] == [4, 8] and third[0] == [3, 7]
    assert leads[4] == [4, 9] and second[4] == [3, 7] and third[4] == [2, 6]


def test_start_partition_id_continues_an_existing_topic():
    whole = assign_replicas([0, 1, 2, 3, 4], 10, 3, start_index=0)
    tail = assign_replicas([0, 1, 2, 3, 4], 4, 3, start_index=0, start_partition_id=6)
    # As in Kafka, the leaders continue the round-robin; the follower shift restarts at the
    # fixed start index (it only grows when the partition id wraps inside one call).
    assert {p: r[0] for p, r in tail.items()} == {p: whole[p][0] for p in range(6, 10)}
    assert tail == {6: [1, 2, 3], 7: [2, 3, 4], 8: [3, 4, 0], 9: [4, 0, 1]}


def test_broker_ids_need_not_be_contiguous_or_sorted():
    got = assign_replicas([30, 10, 20], 3, 2, start_index=0)
    assert got == {0: [10, 20], 1: [20, 30], 2: [30, 10]}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("brokers,partitions,rf", [(5, 10, 3), (3, 7, 3), (6, 30, 2), (4, 4, 1), (7, 50, 4)])
def test_replicas_distinct_and_leaders_balanced(seed, brokers, partitions, rf):
    got = assign_replicas(list(range(brokers)), partitions, rf, rng=random.Random(seed))
    assert sorted(got) == list(range(partitions))
    assert all(len(r) == rf == len(set(r)) for r in got.values())
    leaders = Counter(r[0] for r in got.values())
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in range(brokers)) <= 1
    replicas = Counter(b for r in got.values() for b in r)
    assert max(replicas.values()) - min(replicas.get(b, 0) for b in range(brokers)) <= rf


def test_random_start_uses_the_rng():
    starts = {assign_replicas([0, 1, 2, 3], 1, 1, rng=random.Random(s))[0][0] for s in range(40)}
    assert starts == {0, 1, 2, 3}


@pytest.mark.parametrize("brokers,partitions,rf,error,match", [
    ([0, 1], 3, 3, InvalidReplicationFactorError, "Replication factor: 3 larger than available brokers: 2"),
    ([0, 1], 3, 0, InvalidReplicationFactorError, "must be larger than 0"),
    ([0, 1], 0, 1, InvalidPartitionsError, "partitions must be larger than 0"),
    ([], 1, 1, InvalidReplicationFactorError, "available brokers: 0"),
    ([1, 1], 1, 1, ValueError, "duplicate"),
])
def test_invalid_arguments(brokers, partitions, rf, error, match):
    with pytest.raises(error, match=match):
        assign_replicas(brokers, partitions, rf)


def test_errors_are_value_errors_that_carry_kafka_codes():
    with pytest.raises(ValueError) as info:
        assign_replicas([0], 1, 2)
    assert info.value.error is INVALID_REPLICATION_FACTOR


RACKS = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}


def test_rack_alternated_broker_list_kafka_example():
    assert rack_alternated_broker_list(RACKS) == [0, 3, 1, 5, 4, 2]


def test_rack_aware_kafka_scaladoc_example():
    got = assign_replicas(list(RACKS), 6, 3, start_index=0, racks=RACKS)
    assert got == {0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0], 5: [2, 0, 3]}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("racks", [
    RACKS,
    {0: "a", 1: "a", 2: "a", 3: "b"},                        # uneven racks
    {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c", 6: "a", 7: "b", 8: "c"},
])
def test_rack_aware_spreads_replicas_over_racks(seed, racks):
    num_racks = len(set(racks.values()))
    for rf in range(1, len(racks) + 1):
        got = assign_replicas(list(racks), 12, rf, racks=racks, rng=random.Random(seed))
        for replicas in got.values():
            assert len(replicas) == len(set(replicas)) == rf
            assert len({racks[b] for b in replicas}) == min(rf, num_racks)
        leaders = Counter(r[0] for r in got.values())
        assert max(leaders.values()) - min(leaders.get(b, 0) for b in racks) <= 1 + (12 % len(racks) > 0)


def test_racks_when_complete():
    """What every placement in the brokers passes as ``racks``: all racks or none."""
    assert racks_when_complete({1: "a", 2: "b"}) == {1: "a", 2: "b"}
    assert racks_when_complete({1: "a", 2: None}) is None
    assert racks_when_complete({1: None, 2: ""}) is None
    assert racks_when_complete({}) is None


def test_racks_all_or_nothing():
    assert assign_replicas([0, 1], 2, 2, start_index=0, racks={0: None, 1: None}) == \
        assign_replicas([0, 1], 2, 2, start_index=0)
    with pytest.raises(ValueError, match="Not all brokers have rack information"):
        assign_replicas([0, 1, 2], 2, 2, racks={0: "a", 1: "b"})
