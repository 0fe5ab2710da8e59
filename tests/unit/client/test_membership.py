"""The group member's state machine (tidelog.aio.membership): the transition table, and the
effects each step asks the coordinator to carry out."""

from __future__ import annotations

import pytest

from tidelog.aio.membership import (
    VALID_PREVIOUS_STATES,
    Effect,
    Generation,
    IllegalMemberTransition,
    Membership,
    MemberState,
)

U, P, C, S = (MemberState.UNJOINED, MemberState.PREPARING_REBALANCE, MemberState.COMPLETING_REBALANCE,
              MemberState.STABLE)
G1 = Generation(1, "m-1", "range")


def stable() -> Membership:
    member = Membership()
    member.join_started()
    member.joined(G1)
    member.synced()
    return member


def test_the_table_names_every_state():
    assert set(VALID_PREVIOUS_STATES) == set(MemberState)


@pytest.mark.parametrize("source", list(MemberState))
@pytest.mark.parametrize("target", list(MemberState))
def test_transition_to_follows_the_table(source, target):
    member = Membership()
    member.state = source
    if source in VALID_PREVIOUS_STATES[target]:
        member.transition_to(target)
        assert member.state is target
    else:
        with pytest.raises(IllegalMemberTransition):
            member.transition_to(target)
        assert member.state is source


def test_only_a_completing_member_becomes_stable():
    assert VALID_PREVIOUS_STATES[S] == {C}
    assert VALID_PREVIOUS_STATES[C] == {P, U}  # U: reset while the JoinGroup was in flight


def test_a_rebalance_from_the_first_join_to_stable():
    member = Membership()
    assert member.wants_join() and member.rejoin_reason == "initial join"
    assert member.join_started() == [] and member.state is P and not member.rejoin_needed
    assert member.rebalancing
    assert member.joined(G1) == [Effect.START_SESSION] and member.state is C and member.generation == G1
    assert member.synced() == [Effect.RENEW_SESSION] and member.state is S
    assert not member.wants_join() and not member.rebalancing


def test_member_id_required_keeps_the_member_preparing_with_its_new_id():
    member = Membership()
    member.join_started()
    member.take_member_id("m-7")
    assert member.state is P and member.generation.member_id == "m-7" and not member.generation.valid


def test_a_rejoin_wish_wakes_poll_and_keeps_the_state():
    member = stable()
    assert member.request_rejoin("a new member") == [Effect.WAKE_POLL]
    assert member.state is S and member.wants_join() and member.rejoin_reason == "a new member"


@pytest.mark.parametrize("step", ["reset", "left", "join_failed"])
def test_losing_the_generation_goes_back_to_unjoined(step):
    member = stable()
    effects = member.join_failed() if step == "join_failed" else getattr(member, step)("gone")
    assert member.state is U and member.wants_join()
    assert effects == ([] if step == "left" else [Effect.WAKE_POLL])
    if step != "join_failed":
        assert not member.generation.valid and member.rejoin_reason == "gone"


def test_a_join_answered_after_a_reset_still_completes():
    member = Membership()
    member.join_started()
    member.reset("a heartbeat said UNKNOWN_MEMBER_ID")
    member.joined(G1)
    assert member.state is C
