"""Leader election rules by table (Kafka's PartitionLeaderElectionAlgorithms; docs/architecture.md, "Replication and leadership"):
the first live replica in assignment order that is in the ISR; outside the ISR only when
unclean election is allowed; controlled shutdown moves leadership off shutting-down brokers;
the preferred replica leads only if live and in the ISR."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.controller.election import (
    Election,
    controlled_shutdown_leader,
    offline_partition_leader,
    preferred_replica_leader,
    remove_from_isr,
)


@pytest.mark.parametrize("assignment, isr, live, unclean, expected", [
    # the first replica of the assignment that is live and in the ISR, not the ISR's order
    ([1, 2, 3], [3, 2, 1], {1, 2, 3}, False, Election(1, [3, 2, 1])),
    ([1, 2, 3], [3, 2], {1, 2, 3}, False, Election(2, [3, 2])),
    ([3, 1, 2], [1, 2, 3], {1, 2, 3}, False, Election(3, [1, 2, 3])),
    # dead ISR members are dropped from the new ISR, in ISR order
    ([1, 2, 3], [1, 2, 3], {2, 3}, False, Election(2, [2, 3])),
    ([1, 2, 3], [3, 1, 2], {2, 3}, False, Election(2, [3, 2])),
    ([1, 2, 3], [1, 3], {2, 3}, False, Election(3, [3])),
    # live replicas outside the ISR are never chosen cleanly, even when first
    ([1, 2, 3], [2], {1, 2, 3}, False, Election(2, [2])),
    ([1, 2, 3], [2], {1, 3}, False, None),
    ([1, 2, 3], [], {1, 2, 3}, False, None),
    ([1, 2, 3], [1, 2, 3], set(), False, None),
    ([], [1], {1}, False, None),  # an ISR member outside the assignment does not lead
    # a clean choice wins over an unclean one when both exist
    ([1, 2, 3], [3], {1, 2, 3}, True, Election(3, [3])),
    # unclean: the first live replica in assignment order, alone in the ISR, flagged
    ([1, 2, 3], [2], {1, 3}, True, Election(1, [1], unclean=True)),
    ([1, 2, 3], [1], {2, 3}, True, Election(2, [2], unclean=True)),
    ([3, 2, 1], [], {1, 2}, True, Election(2, [2], unclean=True)),
    ([1, 2, 3], [1], set(), True, None),
    ([1, 2, 3], [1], {4}, True, None),  # a live broker that holds no replica cannot lead
])
def test_offline_partition_leader(assignment, isr, live, unclean, expected):
    assert offline_partition_leader(assignment, isr, live, unclean) == expected


def test_offline_partition_leader_accepts_any_isr_iterable():
    assert offline_partition_leader([1, 2], (x for x in [2, 1]), {1, 2}, False) == Election(1, [2, 1])
    assert offline_partition_leader([1, 2], frozenset({2}), {1, 2}, False) == Election(2, [2])


@pytest.mark.parametrize("assignment, isr, live, shutting_down, expected", [
    ([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1}, Election(2, [2, 3])),
    ([1, 2, 3], [3, 1, 2], {1, 2, 3}, {1}, Election(2, [3, 2])),
    ([1, 2, 3], [1, 3], {1, 2, 3}, {1}, Election(3, [3])),  # 2 is live but not in the ISR
    ([1, 2, 3], [1, 2, 3], {1, 3}, {1}, Election(3, [2, 3])),  # a dead ISR member stays in the ISR
    ([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1, 2}, Election(3, [3])),
    ([1, 2, 3], [1], {1, 2, 3}, {1}, None),  # nobody else in sync: the leader stays
    ([1, 2, 3], [1, 2], {1, 3}, {1}, None),
    ([1, 2, 3], [1, 2, 3], {1, 2, 3}, {1, 2, 3}, None),
    ([1, 2, 3], [2, 3], {1, 2, 3}, set(), Election(2, [2, 3])),
])
def test_controlled_shutdown_leader(assignment, isr, live, shutting_down, expected):
    assert controlled_shutdown_leader(assignment, isr, live, shutting_down) == expected


@pytest.mark.parametrize("assignment, isr, live, expected", [
    ([1, 2, 3], [2, 1, 3], {1, 2, 3}, Election(1, [2, 1, 3])),  # the ISR is kept as it is
    ([1, 2, 3], [2, 3], {1, 2, 3}, None),  # preferred not in the ISR
    ([1, 2, 3], [1, 2, 3], {2, 3}, None),  # preferred not live
    ([2, 1, 3], [1, 2], {1, 2, 3}, Election(2, [1, 2])),
    ([], [1], {1}, None),
])
def test_preferred_replica_leader(assignment, isr, live, expected):
    assert preferred_replica_leader(assignment, isr, live) == expected


@pytest.mark.parametrize("leader, isr, gone, expected", [
    (1, [1, 2, 3], {3}, (1, [1, 2])),
    (1, [3, 1, 2], {2}, (1, [3, 1])),  # order kept
    (1, [1, 2, 3], {1}, (-1, [2, 3])),  # a gone leader: no leader
    (1, [1, 2, 3], {2, 3}, (1, [1])),
    (1, [1, 2, 3], {4}, (1, [1, 2, 3])),
    (1, [1], {1}, (-1, [])),
    (-1, [2, 3], {2}, (-1, [3])),
])
def test_remove_from_isr(leader, isr, gone, expected):
    assert remove_from_isr(leader, isr, gone) == expected


@given(assignment=st.permutations([1, 2, 3, 4]), isr=st.sets(st.sampled_from([1, 2, 3, 4])),
       live=st.sets(st.sampled_from([1, 2, 3, 4, 5])), unclean=st.booleans())
def test_offline_election_properties(assignment, isr, live, unclean):
    isr = [r for r in assignment if r in isr]
    e = offline_partition_leader(assignment, isr, live, unclean)
    clean = [r for r in assignment if r in live and r in isr]
    if clean:
        assert e == Election(clean[0], [r for r in isr if r in live])
        assert e.leader in e.isr and set(e.isr) <= live
    elif unclean and any(r in live for r in assignment):
        assert e.unclean and e.isr == [e.leader] and e.leader in live and e.leader in assignment
        assert e.leader == next(r for r in assignment if r in live)
    else:
        assert e is None
