"""Partition reassignment's pure rules (KIP-455): the replica set during a move, replacing and
cancelling a move, and the controller's next step from the ISR."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.controller.reassignment import ReplicaAssignment, Step, check_target, next_step
from tidelog.protocol.errors import INVALID_REPLICA_ASSIGNMENT, TidelogError


def test_a_move_lists_the_target_first_then_what_leaves():
    a = ReplicaAssignment.of([1, 2, 3]).reassign_to([4, 2, 5])
    assert a == ReplicaAssignment((4, 2, 5, 1, 3), adding=(4, 5), removing=(1, 3))
    assert a.original == (2, 1, 3)  # RS without what is added, in RS's order (as Kafka keeps it)
    assert a.target == (4, 2, 5) and a.is_reassigning
    assert a.completed() == ReplicaAssignment((4, 2, 5))


def test_a_move_to_the_same_replicas_is_no_move():
    assert ReplicaAssignment.of([1, 2]).reassign_to([1, 2]) == ReplicaAssignment((1, 2))
    assert not ReplicaAssignment.of([1, 2]).is_reassigning


def test_changing_the_replication_factor_is_a_move():
    up = ReplicaAssignment.of([1, 2]).reassign_to([1, 2, 3])
    assert (up.adding, up.removing, up.target) == ((3,), (), (1, 2, 3))
    down = ReplicaAssignment.of([1, 2, 3]).reassign_to([1, 2])
    assert (down.adding, down.removing, down.replicas) == ((), (3,), (1, 2, 3))


def test_a_new_target_replaces_a_move_in_progress_and_cancel_restores_the_original():
    moving = ReplicaAssignment.of([1, 2, 3]).reassign_to([4, 5, 6])
    again = moving.reassign_to([1, 2, 4])  # 5 and 6 were being added: no longer wanted
    assert set(again.adding) == {4} and set(again.removing) == {3} and set(again.target) == {1, 2, 4}
    assert set(moving.cancel().replicas) == {1, 2, 3} and not moving.cancel().is_reassigning


@given(st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True),
       st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True),
       st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True))
def test_any_sequence_of_moves_keeps_the_original_and_reaches_the_last_target(original, first, second):
    a = ReplicaAssignment.of(original).reassign_to(first).reassign_to(second)
    assert set(a.original) == set(original)
    assert list(a.target) == second
    assert set(a.replicas) == set(original) | set(second)
    assert not set(a.adding) & set(a.removing)
    assert set(a.cancel().replicas) == set(original) and not a.cancel().is_reassigning


def test_the_steps_of_a_move():
    a = ReplicaAssignment.of([1, 2, 3]).reassign_to([2, 3, 4])
    live = {1, 2, 3, 4}
    d = next_step(a, leader=1, isr=[1, 2, 3], live=live)
    assert d.step is Step.CATCH_UP and d.waiting_for == (4,)
    d = next_step(a, leader=1, isr=[1, 2, 3, 4], live=live)  # the leader is leaving: move it first
    assert d.step is Step.ELECT and d.leader == 2 and d.isr == (2, 3, 4)
    d = next_step(a, leader=2, isr=[1, 2, 3, 4], live=live)
    assert d.step is Step.COMPLETE and d.isr == (2, 3, 4)


def test_a_dead_target_replica_holds_the_move_even_if_still_in_the_isr():
    # a leader may take a broker into its ISR just before it dies: the move waits for it
    # (the offline election, not the move, finds the partition a live leader meanwhile)
    a = ReplicaAssignment.of([1, 2]).reassign_to([1, 2, 3])
    d = next_step(a, leader=1, isr=[1, 2, 3], live={2, 3})
    assert d.step is Step.CATCH_UP and d.waiting_for == (1,)
    d = next_step(a, leader=2, isr=[1, 2, 3], live={1, 2})
    assert d.step is Step.CATCH_UP and d.waiting_for == (3,)


def test_leadership_moves_onto_the_target_before_the_leader_leaves():
    a = ReplicaAssignment.of([1, 2, 3]).reassign_to([2, 3, 4])
    d = next_step(a, leader=1, isr=[1, 2, 3, 4], live={1, 2, 3, 4})
    assert d.step is Step.ELECT and d.leader == 2 and d.isr == (2, 3, 4)


@pytest.mark.parametrize("target,problem", [
    ([], "at least one"),
    ([1, 1], "more than once"),
    ([1, 9], r"not registered: \[9\]"),
    ([1, 4, 9, 8], r"not registered: \[8, 9\]"),
])
def test_bad_targets_are_refused_naming_the_problem(target, problem):
    with pytest.raises(TidelogError, match=problem) as info:
        check_target(target, original=(1, 4), registered={1, 2, 3})
    assert info.value.error is INVALID_REPLICA_ASSIGNMENT


def test_only_the_replicas_being_added_need_a_registered_broker():
    """Kafka's controller: a target may keep a replica on a broker that is down (the move waits
    for it to return and catch up, or a later target drops it)."""
    check_target([1, 2, 3, 4], original=(1, 2, 3), registered={1, 2, 4})
    check_target([1, 2], original=(1, 2, 3), registered={1, 2})
