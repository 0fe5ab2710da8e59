"""The group state machine (broker/groups/group_metadata.py): transitions as a table,
membership scenarios with time passed in, and a Hypothesis state machine driving random
joins, syncs, heartbeats, leaves, commits and time against the invariants."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tidelog.broker.groups.group_metadata import (
    VALID_PREVIOUS_STATES,
    GroupConfig,
    GroupMetadata,
    GroupState,
    IllegalStateTransition,
    Now,
    Reply,
    StoreGroup,
)
from tidelog.broker.groups.offsets_records import decode_group_value, group_value
from tidelog.protocol.errors import (
    FENCED_INSTANCE_ID,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)
from tidelog.protocol.messages import (
    JoinGroupProtocol,
    JoinGroupRequest,
    MemberIdentity,
    SyncGroupAssignment,
    SyncGroupRequest,
)

S = GroupState
CONFIG = GroupConfig(initial_rebalance_delay_ms=100, min_session_timeout_ms=10, max_session_timeout_ms=60000)
SESSION = 1000
REBALANCE = 5000


def join_req(member_id="", instance=None, protocols=(("range", b"m"),), session=SESSION, rebalance=REBALANCE,
             group="g"):
    return JoinGroupRequest(group, session, member_id, "consumer",
                            [JoinGroupProtocol(n, m) for n, m in protocols], rebalance, instance)


def replies(effects, kind=None):
    return {e.member_id: e.response for e in effects if isinstance(e, Reply) and (kind is None or e.kind == kind)}


def stores(effects):
    return [e for e in effects if isinstance(e, StoreGroup)]


class Ids:
    def __init__(self):
        self.n = itertools.count(1)

    def __call__(self) -> str:
        return f"m{next(self.n)}"


def stable_group(n: int, now: int = 0) -> tuple[GroupMetadata, list[str], int]:
    """A Stable group of ``n`` dynamic members (generation 1), and the time it got there."""
    g, ids = GroupMetadata("g"), Ids()
    members = []
    for _ in range(n):
        r = g.join(join_req(), "client", "host", ids(), now, CONFIG)
        assert r.immediate.error_code == MEMBER_ID_REQUIRED.code
        r = g.join(join_req(r.immediate.member_id), "client", "host", "unused", now, CONFIG)
        members.append(r.wait_for)
    effects = []
    for _ in range(10):  # the initial delay, extended while members arrived
        now += CONFIG.initial_rebalance_delay_ms
        effects = g.tick(now, CONFIG)
        if effects:
            break
    assert set(replies(effects, "join")) == set(members) and g.is_(S.COMPLETING_REBALANCE)
    leader = g.leader_id
    sync = g.sync(SyncGroupRequest("g", g.generation_id, leader, [
        SyncGroupAssignment(m, m.encode()) for m in members]), now)
    (store,) = stores(sync.effects)
    effects = g.on_store_complete(store, NONE, now, CONFIG)
    assert g.is_(S.STABLE) and replies(effects, "sync")[leader].assignment == leader.encode()
    return g, members, now


# -- the transition table ----------------------------------------------------------------------


@pytest.mark.parametrize("source,target", list(itertools.product(GroupState, GroupState)))
def test_transitions_follow_the_table(source, target):
    g = GroupMetadata("g", state=source)
    if source in VALID_PREVIOUS_STATES[target]:
        g.transition_to(target, 5)
        assert g.state is target and g.state_timestamp_ms == 5
    else:
        with pytest.raises(IllegalStateTransition):
            g.transition_to(target, 5)


# -- joining -----------------------------------------------------------------------------------


def test_a_new_dynamic_member_is_given_a_member_id_first():
    g = GroupMetadata("g")
    r = g.join(join_req(), "c", "h", "c-1", 0, CONFIG)
    assert r.immediate.error_code == MEMBER_ID_REQUIRED.code and r.immediate.member_id == "c-1"
    assert g.is_(S.EMPTY) and not g.members
    r = g.join(join_req("c-1"), "c", "h", "c-2", 0, CONFIG)
    assert r.immediate is None and r.wait_for == "c-1"
    assert g.is_(S.PREPARING_REBALANCE) and g.members["c-1"].awaiting_join


def test_the_initial_delay_waits_for_more_members_then_one_generation_forms():
    g, ids = GroupMetadata("g"), Ids()
    first = g.join(join_req(), "c", "h", ids(), 0, CONFIG).immediate.member_id
    g.join(join_req(first), "c", "h", ids(), 0, CONFIG)
    assert g.tick(50, CONFIG) == [] and g.is_(S.PREPARING_REBALANCE)  # within the delay
    second = g.join(join_req(), "c", "h", ids(), 60, CONFIG).immediate.member_id
    g.join(join_req(second), "c", "h", ids(), 60, CONFIG)
    assert g.tick(100, CONFIG) == []  # a member arrived during the delay: extended once
    effects = g.tick(200, CONFIG)
    joined = replies(effects, "join")
    assert set(joined) == {first, second} and g.generation_id == 1 and g.is_(S.COMPLETING_REBALANCE)
    assert [m.member_id for m in joined[g.leader_id].members] == [first, second]
    follower = second if g.leader_id == first else first
    assert joined[follower].members == [] and joined[follower].leader == g.leader_id
    assert joined[first].protocol_name == "range"


def test_session_timeout_bounds_are_enforced():
    r = GroupMetadata("g").join(join_req(session=5), "c", "h", "x", 0, CONFIG)
    assert r.immediate.error_code == INVALID_SESSION_TIMEOUT.code
    assert "group.min.session.timeout.ms" in r.immediate.error_message


def test_a_member_without_a_common_protocol_is_refused():
    g, members, now = stable_group(1)
    r = g.join(join_req(protocols=(("roundrobin", b""),)), "c", "h", "x", now, CONFIG)
    assert r.immediate.error_code == INCONSISTENT_GROUP_PROTOCOL.code


def test_the_protocol_every_member_supports_and_most_prefer_is_chosen():
    g, ids = GroupMetadata("g"), Ids()
    prefs = [(("sticky", b""), ("range", b"")), (("range", b""), ("sticky", b"")), (("range", b""),)]
    for p in prefs:
        mid = g.join(join_req(protocols=p), "c", "h", ids(), 0, CONFIG).immediate.member_id
        g.join(join_req(mid, protocols=p), "c", "h", ids(), 0, CONFIG)
    g.tick(CONFIG.initial_rebalance_delay_ms, CONFIG)  # members kept arriving: extended once
    g.tick(3 * CONFIG.initial_rebalance_delay_ms, CONFIG)
    assert g.protocol_name == "range"


def test_a_new_member_makes_a_stable_group_rebalance_and_heartbeats_say_so():
    g, (m1,), now = stable_group(1)
    m2 = g.join(join_req(), "c", "h", "m2", now, CONFIG).immediate.member_id
    g.join(join_req(m2), "c", "h", "x", now, CONFIG)
    assert g.is_(S.PREPARING_REBALANCE)
    assert g.heartbeat(m1, None, 1, now)[0] is REBALANCE_IN_PROGRESS
    effects = g.join(join_req(m1), "c", "h", "x", now + 10, CONFIG).effects  # everyone rejoined: done
    assert set(replies(effects, "join")) == {m1, m2} and g.generation_id == 2
    assert g.heartbeat(m1, None, 1, now)[0] is ILLEGAL_GENERATION
    assert g.heartbeat(m1, None, 2, now)[0] is NONE


def test_heartbeats_in_completing_rebalance_keep_a_leader_that_is_still_assigning():
    """Kafka's handleHeartbeat in CompletingRebalance: NONE for a member of the current
    generation, its session renewed (a leader refreshing metadata to assign may take longer
    than the session timeout); the follower awaiting its SyncGroup answer is kept alive
    without heartbeats; a leader that neither heartbeats nor syncs is removed."""
    g, ids = GroupMetadata("g"), Ids()
    for _ in range(2):
        r = g.join(join_req(), "c", "h", ids(), 0, CONFIG)
        g.join(join_req(r.immediate.member_id), "c", "h", "unused", 0, CONFIG)
    now = 0
    for _ in range(10):
        now += CONFIG.initial_rebalance_delay_ms
        if g.tick(now, CONFIG):
            break
    assert g.is_(S.COMPLETING_REBALANCE) and g.generation_id == 1
    leader = g.leader_id
    (follower,) = set(g.members) - {leader}
    g.sync(SyncGroupRequest("g", 1, follower, []), now)  # waits for the leader's assignment
    assert g.heartbeat(leader, None, 0, now)[0] is ILLEGAL_GENERATION
    for t in range(now, now + 3 * SESSION, SESSION // 2):
        assert g.heartbeat(leader, None, 1, t)[0] is NONE
        g.tick(t, CONFIG)
    assert g.is_(S.COMPLETING_REBALANCE) and set(g.members) == {leader, follower}
    g.tick(t + SESSION, CONFIG)
    assert leader not in g.members and not g.is_(S.COMPLETING_REBALANCE)


def test_a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_removed():
    g, (m1, m2), now = stable_group(2)
    g.join(join_req(m1, protocols=(("range", b"changed"),)), "c", "h", "x", now, CONFIG)
    assert g.is_(S.PREPARING_REBALANCE)
    g.heartbeat(m2, None, 1, now + REBALANCE - 1)  # alive, but never rejoins
    effects = g.tick(now + REBALANCE, CONFIG)
    assert set(replies(effects, "join")) == {m1} and list(g.members) == [m1] and g.generation_id == 2


def test_session_expiry_removes_the_member_and_rebalances():
    g, (m1, m2), now = stable_group(2)
    g.heartbeat(m1, None, 1, now + SESSION - 1)
    effects = g.tick(now + SESSION, CONFIG)  # m2 sent nothing
    assert effects == [] and m2 not in g.members and g.is_(S.PREPARING_REBALANCE)
    effects = g.join(join_req(m1), "c", "h", "x", now + SESSION + 1, CONFIG).effects
    assert set(replies(effects, "join")) == {m1} and g.leader_id == m1


def test_leave_rebalances_at_once_and_the_last_leave_empties_the_group():
    g, (m1, m2), now = stable_group(2)
    responses, effects = g.leave([MemberIdentity(m2)], now, CONFIG)
    assert responses[0].error_code == NONE.code and g.is_(S.PREPARING_REBALANCE)
    responses, effects = g.leave([MemberIdentity(m1), MemberIdentity("nobody")], now, CONFIG)
    assert [r.error_code for r in responses] == [NONE.code, UNKNOWN_MEMBER_ID.code]
    assert g.is_(S.EMPTY) and g.generation_id == 2
    (store,) = stores(effects)
    assert store.reason == "empty" and store.value.members == ()


def test_sync_before_the_leader_waits_and_a_rebalance_answers_it():
    g, (m1, m2), now = stable_group(2)
    g.join(join_req(m1, protocols=(("range", b"x"),)), "c", "h", "x", now, CONFIG)
    g.join(join_req(m2), "c", "h", "x", now, CONFIG)
    follower = m2 if g.leader_id == m1 else m1
    r = g.sync(SyncGroupRequest("g", 2, follower), now)
    assert r.immediate is None and r.effects == []
    effects = g.leave([MemberIdentity(g.leader_id)], now, CONFIG)[1]  # leader leaves: rebalance
    assert replies(effects, "sync")[follower].error_code == REBALANCE_IN_PROGRESS.code


def test_a_failed_assignment_write_answers_the_error_and_rebalances():
    g, (m1,), now = stable_group(1)
    g.join(join_req(m1, protocols=(("range", b"x"),)), "c", "h", "x", now, CONFIG)
    (store,) = stores(g.sync(SyncGroupRequest("g", 2, m1, [SyncGroupAssignment(m1, b"a")]), now).effects)
    from tidelog.protocol.errors import NOT_COORDINATOR
    effects = g.on_store_complete(store, NOT_COORDINATOR, now, CONFIG)
    assert replies(effects, "sync")[m1].error_code == NOT_COORDINATOR.code and g.is_(S.PREPARING_REBALANCE)


def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout():
    g, (m1, m2), now = stable_group(2)
    g.join(join_req(m1, protocols=(("range", b"x"),)), "c", "h", "x", now, CONFIG)
    g.join(join_req(m2), "c", "h", "x", now, CONFIG)
    g.sync(SyncGroupRequest("g", 2, g.leader_id, []), now)  # only the leader syncs... not stored yet
    g.tick(now + REBALANCE, CONFIG)
    assert len(g.members) == 1 and g.is_(S.PREPARING_REBALANCE)


def test_a_member_that_never_syncs_is_removed_after_the_rebalance_timeout_in_a_stable_group_too():
    """Kafka's pending sync (schedulePendingSync, onExpirePendingSync): each member must send
    SyncGroup within the rebalance timeout of the join phase's end, also after the leader's
    assignment made the group Stable. Heartbeats do not count; at the deadline the members
    that never synced are removed and the group rebalances."""
    g, (m1, m2), now = stable_group(2)  # the leader synced, the follower never does
    follower = m2 if g.leader_id == m1 else m1
    for t in range(now, now + REBALANCE, SESSION // 2):
        assert g.heartbeat(m1, None, 1, t)[0] is NONE and g.heartbeat(m2, None, 1, t)[0] is NONE
        assert g.tick(t, CONFIG) == [] and g.is_(S.STABLE)
    assert g.next_deadline_ms() <= now + REBALANCE
    g.heartbeat(m1, None, 1, now + REBALANCE)
    g.heartbeat(m2, None, 1, now + REBALANCE)
    g.tick(now + REBALANCE, CONFIG)
    assert follower not in g.members and g.is_(S.PREPARING_REBALANCE)


def test_a_member_that_syncs_once_the_group_is_stable_meets_the_deadline():
    g, (m1, m2), now = stable_group(2)
    follower = m2 if g.leader_id == m1 else m1
    assert g.sync(SyncGroupRequest("g", 1, follower), now + 1).immediate.assignment == follower.encode()
    for t in range(now, now + 2 * REBALANCE, SESSION // 2):
        g.heartbeat(m1, None, 1, t)
        g.heartbeat(m2, None, 1, t)
        g.tick(t, CONFIG)
    assert g.is_(S.STABLE) and set(g.members) == {m1, m2}


# -- static membership ---------------------------------------------------------------------------


def static_group(now=0, protocols=(("range", b"m"),)):
    g = GroupMetadata("g")
    r = g.join(join_req(instance="i1", protocols=protocols), "c", "h", "old", now, CONFIG)
    assert r.wait_for == "old"  # no MEMBER_ID_REQUIRED round for static members
    g.tick(now + CONFIG.initial_rebalance_delay_ms, CONFIG)
    (store,) = stores(g.sync(SyncGroupRequest("g", 1, "old", [SyncGroupAssignment("old", b"A")]), now).effects)
    g.on_store_complete(store, NONE, now, CONFIG)
    return g


def test_a_static_member_rejoins_a_stable_group_without_a_rebalance_and_keeps_its_assignment():
    g = static_group()
    r = g.join(join_req(instance="i1"), "c", "h", "new", 200, CONFIG)
    (store,) = stores(r.effects)
    assert store.reason == "static" and r.wait_for == "new" and g.is_(S.STABLE) and g.generation_id == 1
    (join,) = replies(g.on_store_complete(store, NONE, 200, CONFIG), "join").values()
    assert join.member_id == "new" and join.generation_id == 1 and join.skip_assignment
    assert g.sync(SyncGroupRequest("g", 1, "new", group_instance_id="i1"), 200).immediate.assignment == b"A"
    assert g.heartbeat("old", "i1", 1, 200)[0] is FENCED_INSTANCE_ID
    assert g.commit_error(1, "old", "i1", 200)[0] is FENCED_INSTANCE_ID
    assert g.commit_error(1, "new", "i1", 200) is None


@pytest.mark.parametrize("supports_skip", [True, False])
def test_a_restarted_static_leader_is_not_asked_to_assign(supports_skip):
    """Kafka's answer to a static leader rejoining a Stable group (updateStaticMemberAndRebalance),
    which must not assign (a Stable group ignores a new assignment): a client that reads
    skip_assignment (the native protocol, Kafka's JoinGroup v9 on) is told that it leads, with
    the members and skip_assignment; an older one gets no members and the old member id as the
    leader, so it takes itself for a follower. Both then sync for the current assignment."""
    g = static_group()
    r = g.join(join_req(instance="i1"), "c", "h", "new", 200, CONFIG, supports_skip_assignment=supports_skip)
    (store,) = stores(r.effects)
    (join,) = replies(g.on_store_complete(store, NONE, 200, CONFIG), "join").values()
    if supports_skip:
        assert (join.leader, [m.member_id for m in join.members], join.skip_assignment) == ("new", ["new"], True)
    else:
        assert (join.leader, join.members, join.skip_assignment) == ("old", [], False)
    assert join.member_id == "new" and join.generation_id == 1 and g.leader_id == "new"
    assert g.sync(SyncGroupRequest("g", 1, "new", group_instance_id="i1"), 200).immediate.assignment == b"A"


def test_a_restarted_static_follower_gets_no_members_whatever_its_version():
    g = GroupMetadata("g")
    for instance, member_id in (("i1", "a"), ("i2", "b")):
        g.join(join_req(instance=instance), "c", "h", member_id, 0, CONFIG)
    now = 0
    for _ in range(10):  # the initial delay, extended once the second joined
        now += CONFIG.initial_rebalance_delay_ms
        if g.tick(now, CONFIG):
            break
    (store,) = stores(g.sync(SyncGroupRequest("g", 1, g.leader_id, [SyncGroupAssignment("a", b"A"),
                                                                       SyncGroupAssignment("b", b"B")]), now).effects)
    g.on_store_complete(store, NONE, now, CONFIG)
    (follower, instance) = ("b", "i2") if g.leader_id == "a" else ("a", "i1")
    for n, supports_skip in enumerate((True, False)):
        r = g.join(join_req(instance=instance), "c", "h", f"new{n}", 200, CONFIG, supports_skip_assignment=supports_skip)
        (join,) = replies(g.on_store_complete(stores(r.effects)[0], NONE, 200, CONFIG), "join").values()
        assert (join.member_id, join.leader, join.members, join.skip_assignment) == (f"new{n}", g.leader_id, [], False)


def test_a_static_replacement_whose_write_fails_is_undone():
    g = static_group()
    (store,) = stores(g.join(join_req(instance="i1"), "c", "h", "new", 200, CONFIG).effects)
    from tidelog.protocol.errors import COORDINATOR_NOT_AVAILABLE
    effects = g.on_store_complete(store, COORDINATOR_NOT_AVAILABLE, 200, CONFIG)
    assert replies(effects)["new"].error_code == COORDINATOR_NOT_AVAILABLE.code
    assert list(g.members) == ["old"] and g.static_members == {"i1": "old"}


def test_a_failed_static_replacement_restores_the_members_protocols_and_timeouts():
    """Kafka's revert: the old member id comes back with what it joined with, not what its
    replacement asked for (a later rebalance would offer protocols nobody stored)."""
    g = static_group()
    old = g.members["old"]
    before = (list(old.protocols), old.session_timeout_ms, old.rebalance_timeout_ms)
    req = join_req(instance="i1", protocols=(("range", b"m"), ("sticky", b"s")), session=SESSION * 2,
                   rebalance=REBALANCE * 2)
    (store,) = stores(g.join(req, "c", "h", "new", 200, CONFIG).effects)
    from tidelog.protocol.errors import COORDINATOR_NOT_AVAILABLE
    g.on_store_complete(store, COORDINATOR_NOT_AVAILABLE, 200, CONFIG)
    member = g.members["old"]
    assert (list(member.protocols), member.session_timeout_ms, member.rebalance_timeout_ms) == before


def test_a_restarted_static_member_with_other_metadata_rejoins_a_stable_group_without_a_rebalance():
    """Kafka's updateStaticMemberAndRebalance in Stable: only a change of the protocol the
    group would select rebalances. A restarted consumer's subscription differs from the one
    stored (it carries the member's generation, -1 after a restart): the member gets the
    current generation and assignment, and its new metadata is stored."""
    g = static_group()
    r = g.join(join_req(instance="i1", protocols=(("range", b"restarted"),)), "c", "h", "new", 200, CONFIG)
    (store,) = stores(r.effects)
    assert store.reason == "static" and g.is_(S.STABLE) and g.generation_id == 1
    assert [m.subscription for m in store.value.members] == [b"restarted"]
    (join,) = replies(g.on_store_complete(store, NONE, 200, CONFIG), "join").values()
    assert join.error_code == NONE.code and join.generation_id == 1
    assert g.sync(SyncGroupRequest("g", 1, "new", group_instance_id="i1"), 200).immediate.assignment == b"A"


def test_a_static_member_whose_rejoin_changes_the_selected_protocol_triggers_a_rebalance():
    g = static_group(protocols=(("range", b"m"), ("roundrobin", b"m")))
    assert g.protocol_name == "range"
    r = g.join(join_req(instance="i1", protocols=(("roundrobin", b"m"), ("range", b"m"))), "c", "h", "new", 200,
               CONFIG)
    assert not stores(r.effects)  # a rebalance, which the only member completes at once
    joined = replies(r.effects, "join")["new"]
    assert (joined.generation_id, joined.protocol_name) == (2, "roundrobin") and g.is_(S.COMPLETING_REBALANCE)


def test_a_static_member_replaced_while_the_group_completes_a_rebalance_rebalances_again():
    """The leader may already be assigning to the old member id (Kafka's
    updateStaticMemberAndRebalance): answering the new id with the current generation would
    leave it without partitions, so the group rebalances."""
    g = GroupMetadata("g")
    g.join(join_req(instance="i1"), "c", "h", "a1", 0, CONFIG)
    g.join(join_req(instance="i2"), "c", "h", "b1", 0, CONFIG)
    now = 0
    for _ in range(10):
        now += CONFIG.initial_rebalance_delay_ms
        if replies(g.tick(now, CONFIG), "join"):
            break
    assert g.is_(S.COMPLETING_REBALANCE) and g.leader_id == "a1"
    r = g.join(join_req(instance="i2"), "c", "h", "b2", now, CONFIG)  # i2 restarted
    assert r.immediate is None and r.wait_for == "b2" and g.is_(S.PREPARING_REBALANCE)
    sync = g.sync(SyncGroupRequest("g", 1, "a1", [SyncGroupAssignment("a1", b"A"), SyncGroupAssignment("b1", b"B")],
                                   group_instance_id="i1"), now)
    assert sync.immediate.error_code == REBALANCE_IN_PROGRESS.code and not stores(sync.effects)
    effects = g.join(join_req("a1", instance="i1"), "c", "h", "x", now, CONFIG).effects
    joined = replies(effects, "join")
    assert set(joined) == {"a1", "b2"} and {j.generation_id for j in joined.values()} == {2}
    assert {m.member_id for m in joined["a1"].members} == {"a1", "b2"}  # the leader assigns to the new id


def stable_mixed_group(long_session=10 * SESSION):
    """A Stable group (generation 1) of static members a (the leader) and b and dynamic member
    c, all with sessions longer than the rebalance timeout; returns it and the time."""
    g, now = GroupMetadata("g"), 0
    g.join(join_req(instance="a", session=long_session), "c", "h", "a1", now, CONFIG)
    g.join(join_req(instance="b", session=long_session), "c", "h", "b1", now, CONFIG)
    c = g.join(join_req(session=long_session), "c", "h", "c1", now, CONFIG).immediate.member_id
    g.join(join_req(c, session=long_session), "c", "h", "x", now, CONFIG)
    for _ in range(10):
        now += CONFIG.initial_rebalance_delay_ms
        if replies(g.tick(now, CONFIG), "join"):
            break
    assert g.leader_id == "a1" and set(g.members) == {"a1", "b1", "c1"}
    (store,) = stores(g.sync(SyncGroupRequest("g", 1, "a1", [SyncGroupAssignment(m, m.encode()) for m in g.members]),
                             now).effects)
    g.on_store_complete(store, NONE, now, CONFIG)
    for m in ("b1", "c1"):
        g.sync(SyncGroupRequest("g", 1, m), now)
    assert g.is_(S.STABLE) and g.generation_id == 1
    return g, now


def test_a_join_phase_removes_the_dynamic_members_that_did_not_rejoin_but_keeps_the_static_ones():
    """Kafka's onCompleteJoin: a static member that did not rejoin (its process restarting,
    within its session) stays a member of the next generation, and the leader assigns to it;
    only its session expiry removes it."""
    g, now = stable_mixed_group()
    r = g.join(join_req("a1", instance="a", session=10 * SESSION), "c", "h", "x", now, CONFIG)  # the leader rejoins
    assert g.is_(S.PREPARING_REBALANCE) and not replies(r.effects, "join")
    now += REBALANCE  # the join phase ends; b's and c's sessions have not expired
    effects = g.tick(now, CONFIG)
    assert set(g.members) == {"a1", "b1"} and g.static_members == {"a": "a1", "b": "b1"}
    assert list(replies(effects, "join")) == ["a1"]  # only what waits is answered
    leader = replies(effects, "join")["a1"]
    assert leader.generation_id == 2 and {m.member_id for m in leader.members} == {"a1", "b1"}
    r = g.join(join_req(instance="b", session=10 * SESSION), "c", "h", "b2", now, CONFIG)  # b is back
    assert r.wait_for == "b2" and "b1" not in g.members and g.static_members["b"] == "b2"


def test_a_join_phase_no_member_rejoined_waits_for_the_static_members_sessions():
    """Nobody rejoined but static members remain: the join phase is extended by the
    rebalance timeout (Kafka's maybeElectNewJoinedLeader fails, another DelayedJoin); the
    members' session expiry then empties the group."""
    g, now = stable_mixed_group()
    g.leave([MemberIdentity("c1")], now, CONFIG)  # a rebalance; a and b are down
    assert g.is_(S.PREPARING_REBALANCE)
    now += REBALANCE
    assert not replies(g.tick(now, CONFIG)) and g.is_(S.PREPARING_REBALANCE) and g.generation_id == 1
    assert set(g.members) == {"a1", "b1"} and g.join_deadline_ms == now + REBALANCE
    now = g.members["a1"].last_heartbeat_ms + 10 * SESSION  # their sessions expire
    effects = g.tick(now, CONFIG)
    assert not g.members and g.is_(S.EMPTY) and g.generation_id == 2 and len(stores(effects)) == 1


def test_a_pending_member_that_leaves_lets_the_join_phase_end_at_once():
    g, (m1,), now = stable_group(1)
    pending = g.join(join_req(), "c", "h", "p", now, CONFIG).immediate.member_id  # MEMBER_ID_REQUIRED
    r = g.join(join_req(m1, protocols=(("range", b"x"),)), "c", "h", "x", now, CONFIG)
    assert g.is_(S.PREPARING_REBALANCE) and not replies(r.effects, "join")  # waits for the pending member
    responses, effects = g.leave([MemberIdentity(pending)], now, CONFIG)
    assert responses[0].error_code == NONE.code
    assert replies(effects, "join")[m1].generation_id == 2 and g.is_(S.COMPLETING_REBALANCE)


# -- offset commits --------------------------------------------------------------------------------


@pytest.mark.parametrize("setup,generation,member,expected", [
    ("empty", -1, "", None),
    ("stable", -1, "", UNKNOWN_MEMBER_ID),
    ("stable", 1, "m1", None),
    ("stable", 0, "m1", ILLEGAL_GENERATION),
    ("stable", 1, "ghost", UNKNOWN_MEMBER_ID),
    ("completing", 2, "m1", REBALANCE_IN_PROGRESS),
    ("completing", 1, "m1", ILLEGAL_GENERATION),  # a stale generation is told so, as in Kafka
    ("completing", 2, "ghost", UNKNOWN_MEMBER_ID),
    ("completing", -1, "", UNKNOWN_MEMBER_ID),
    ("preparing", 1, "m1", None),  # the current generation may still commit while others rejoin
])
def test_commit_rules(setup, generation, member, expected):
    if setup == "empty":
        g = GroupMetadata("g")
    elif setup == "preparing":  # another member rejoined; m1 has not yet
        g, (m1, other), now = stable_group(2)
        g._rename(g.members[m1], "m1")
        g.join(join_req(other, protocols=(("range", b"x"),)), "c", "h", "x", now, CONFIG)
        assert g.is_(S.PREPARING_REBALANCE)
    else:
        g, (m1,), now = stable_group(1)
        g._rename(g.members[m1], "m1")
        if setup == "completing":
            g.join(join_req("m1", protocols=(("range", b"x"),)), "c", "h", "x", now, CONFIG)
            assert g.is_(S.COMPLETING_REBALANCE)
    refusal = g.commit_error(generation, member, None, 0)
    assert (refusal[0] if refusal else None) is expected


def test_expiry_of_an_empty_groups_offsets():
    from tidelog.broker.groups.offsets_records import OffsetValue
    from tidelog.protocol.topics import TopicPartition
    g = GroupMetadata("g", protocol_type="consumer", state_timestamp_ms=0)
    g.offsets[TopicPartition("t", 0)] = OffsetValue(5, commit_timestamp_ms=0)
    assert g.expire_offsets(99, 100) == [] and g.expire_offsets(100, 100) == [TopicPartition("t", 0)]
    simple = GroupMetadata("s")  # commits only: each offset by its own commit time
    simple.offsets = {TopicPartition("t", 0): OffsetValue(1, commit_timestamp_ms=0),
                      TopicPartition("t", 1): OffsetValue(1, commit_timestamp_ms=50)}
    assert simple.expire_offsets(120, 100) == [TopicPartition("t", 0)]


def test_an_explicit_expire_time_wins_in_an_empty_consumer_group_too():
    """Kafka's rule: an offset committed with a retention time (OffsetCommit v2-v4) expires at
    its own time, whatever the group's protocol; the others by the group's Empty time."""
    from tidelog.broker.groups.offsets_records import OffsetValue
    from tidelog.protocol.topics import TopicPartition
    g = GroupMetadata("g", protocol_type="consumer", state_timestamp_ms=0)
    g.offsets = {TopicPartition("t", 0): OffsetValue(5, commit_timestamp_ms=0, expire_timestamp_ms=30),
                 TopicPartition("t", 1): OffsetValue(5, commit_timestamp_ms=0, expire_timestamp_ms=500),
                 TopicPartition("t", 2): OffsetValue(5, commit_timestamp_ms=0)}
    assert g.expire_offsets(30, 100) == [TopicPartition("t", 0)]
    assert g.expire_offsets(100, 100) == [TopicPartition("t", 2)]
    assert g.expire_offsets(499, 100) == [] and g.expire_offsets(500, 100) == [TopicPartition("t", 1)]


def test_a_deleted_topics_offsets_go_and_its_pending_commits_are_not_cached():
    """The pending commits' records precede the deletion's tombstones (all below the log end
    then): acknowledged later, they are not cached; a commit appended after is."""
    from tidelog.broker.groups.offsets_records import OffsetValue
    from tidelog.protocol.topics import TopicPartition
    orders0, orders1, other = TopicPartition("orders", 0), TopicPartition("orders", 1), TopicPartition("other", 0)
    g = GroupMetadata("g")
    g.offsets = {orders0: OffsetValue(5, record_offset=10), other: OffsetValue(6, record_offset=11)}
    g.begin_offset_commit([orders1])  # appended at 12, waiting for replication
    assert g.remove_topics({"orders"}, 13) == ([orders0, orders1], 1)
    assert g.offsets == {other: OffsetValue(6, record_offset=11)}
    g.begin_offset_commit([orders1])  # the topic was created again: appended at 14
    g.apply_offset(orders1, OffsetValue(7, record_offset=12))
    assert orders1 not in g.offsets
    g.end_offset_commit([orders1])
    g.apply_offset(orders1, OffsetValue(8, record_offset=14))
    g.end_offset_commit([orders1])
    assert g.offsets[orders1].offset == 8 and g.dropped_before == {}


def test_a_failed_commits_partition_stays_among_the_groups_offset_keys_until_tombstoned():
    from tidelog.broker.groups.offsets_records import OffsetValue
    from tidelog.protocol.topics import TopicPartition
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    g = GroupMetadata("g", protocol_type="consumer", state_timestamp_ms=0)
    g.begin_offset_commit([t0, t1])
    g.apply_offset(t1, OffsetValue(5, commit_timestamp_ms=0, record_offset=3))
    g.end_offset_commit([t0, t1])  # t0's replication timed out: its record is in the log, not cached
    assert g.offsets.keys() == {t1} and g.offset_keys() == {t0, t1}
    assert g.expire_offsets(100, 100) == [t1] and g.offset_keys() == {t0}


# -- persistence -----------------------------------------------------------------------------------


def test_snapshot_and_restore_keep_generation_members_and_assignments():
    g, members, now = stable_group(2)
    value = decode_group_value(group_value(g.snapshot()))
    restored = GroupMetadata.restore("g", value, {}, 10_000)
    assert restored.is_(S.STABLE) and restored.generation_id == g.generation_id == 1
    assert restored.leader_id == g.leader_id and restored.protocol_name == "range"
    assert {m: restored.members[m].assignment for m in members} == {m: m.encode() for m in members}
    assert restored.heartbeat(members[0], None, 1, 10_000)[0] is NONE
    assert restored.commit_error(0, members[0], None, 10_000)[0] is ILLEGAL_GENERATION


# -- two clocks ------------------------------------------------------------------------------------

HOUR = 3_600_000


def test_a_step_of_the_wall_clock_neither_expires_nor_prolongs_a_session():
    """Sessions count on the monotonic clock (``Now.ms``): the wall clock jumping an hour
    ahead expires nobody, jumping back keeps nobody; state timestamps are wall time."""
    g, (m1, m2), now = stable_group(2)
    g.sync(SyncGroupRequest("g", 1, m2 if g.leader_id == m1 else m1), now)
    g.heartbeat(m1, None, 1, Now(now, now + HOUR))
    assert g.tick(Now(now + SESSION - 1, now + HOUR), CONFIG) == [] and set(g.members) == {m1, m2}
    g.heartbeat(m1, None, 1, Now(now + SESSION - 1, now - HOUR))  # m2 sends nothing more
    g.tick(Now(now + SESSION, now - HOUR), CONFIG)
    assert list(g.members) == [m1] and g.is_(S.PREPARING_REBALANCE)
    assert g.state_timestamp_ms == now - HOUR


def test_a_step_of_the_wall_clock_does_not_end_a_join_phase_or_the_syncgroup_deadline():
    g, (m1, m2), now = stable_group(2)
    g.join(join_req(m1, protocols=(("range", b"x"),)), "c", "h", "x", Now(now, now), CONFIG)
    assert g.tick(Now(now + 1, now + HOUR), CONFIG) == [] and g.is_(S.PREPARING_REBALANCE)
    g.join(join_req(m2), "c", "h", "x", Now(now + 2, now + HOUR), CONFIG)
    assert g.is_(S.COMPLETING_REBALANCE) and g.state_timestamp_ms == now + HOUR
    for member in (m1, m2):
        g.heartbeat(member, None, 2, Now(now + 3, now + 2 * HOUR))
    assert g.tick(Now(now + 3, now + 2 * HOUR), CONFIG) == [] and set(g.pending_sync) == {m1, m2}
    assert g.sync_deadline_ms == now + 2 + REBALANCE


def test_a_restored_group_keeps_its_wall_state_timestamp_and_starts_sessions_on_the_monotonic_clock():
    g, members, now = stable_group(2)
    value = decode_group_value(group_value(g.snapshot()))
    restored = GroupMetadata.restore("g", value, {}, Now(50, now + HOUR))
    assert restored.state_timestamp_ms == now + HOUR  # Stable from now on, by the wall clock
    assert {m.last_heartbeat_ms for m in restored.members.values()} == {50}


# -- random histories ------------------------------------------------------------------------------


class GroupMachine(RuleBasedStateMachine):
    """Random joins, syncs, heartbeats, leaves and time; the group must stay coherent."""

    def __init__(self):
        super().__init__()
        self.g = GroupMetadata("g")
        self.now = 0
        self.ids = Ids()
        self.known: list[str] = []
        self.generations = [0]
        self.pending_stores: list[StoreGroup] = []

    def _effects(self, effects):
        self.pending_stores += stores(effects)
        for member_id, response in replies(effects, "join").items():
            if response.error_code == NONE.code:
                assert response.generation_id == self.g.generation_id

    @rule(instance=st.sampled_from([None, None, "i1", "i2"]), metadata=st.sampled_from([b"a", b"b"]))
    def join_new(self, instance, metadata):
        r = self.g.join(join_req(instance=instance, protocols=(("range", metadata),)), "c", "h", self.ids(),
                        self.now, CONFIG)
        if r.immediate is not None and r.immediate.error_code == MEMBER_ID_REQUIRED.code:
            self.known.append(r.immediate.member_id)
        elif r.wait_for:
            self.known.append(r.wait_for)
        self._effects(r.effects)

    @rule(data=st.data(), metadata=st.sampled_from([b"a", b"b"]))
    def rejoin(self, data, metadata):
        if self.known:
            mid = data.draw(st.sampled_from(self.known))
            m = self.g.members.get(mid)
            r = self.g.join(join_req(mid, instance=m.group_instance_id if m else None,
                                     protocols=(("range", metadata),)), "c", "h", self.ids(), self.now, CONFIG)
            self._effects(r.effects)

    @rule(data=st.data())
    def sync(self, data):
        if self.known:
            mid = data.draw(st.sampled_from(self.known))
            r = self.g.sync(SyncGroupRequest("g", self.g.generation_id, mid,
                                             [SyncGroupAssignment(m, b"x") for m in self.g.members]), self.now)
            self._effects(r.effects)

    @rule(ok=st.booleans())
    def store_completes(self, ok):
        if self.pending_stores:
            from tidelog.protocol.errors import NOT_COORDINATOR
            store = self.pending_stores.pop(0)
            self._effects(self.g.on_store_complete(store, NONE if ok else NOT_COORDINATOR, self.now, CONFIG))

    @rule(data=st.data())
    def heartbeat(self, data):
        if self.known:
            mid = data.draw(st.sampled_from(self.known))
            self.g.heartbeat(mid, None, self.g.generation_id, self.now)

    @rule(data=st.data())
    def leave(self, data):
        if self.known:
            mid = data.draw(st.sampled_from(self.known))
            self._effects(self.g.leave([MemberIdentity(mid)], self.now, CONFIG)[1])

    @rule(ms=st.integers(1, 3 * REBALANCE))
    def time_passes(self, ms):
        self.now += ms
        self._effects(self.g.tick(self.now, CONFIG))

    @invariant()
    def coherent(self):
        g = self.g
        assert g.generation_id >= self.generations[-1]
        self.generations.append(g.generation_id)
        assert (g.leader_id in g.members) if g.members else g.leader_id is None
        assert all(g.members[mid].group_instance_id == iid for iid, mid in g.static_members.items())
        if g.is_(S.EMPTY):
            assert not g.members
        if g.state in (S.STABLE, S.COMPLETING_REBALANCE):
            assert g.members and not any(m.awaiting_join for m in g.members.values())
            assert g.protocol_name in g.candidate_protocols()
        if g.is_(S.PREPARING_REBALANCE):
            assert g.join_deadline_ms is not None
        if not g.is_(S.COMPLETING_REBALANCE):
            assert not any(m.awaiting_sync for m in g.members.values())
        if g.pending_sync:  # the SyncGroup deadline: after a join phase, for its members
            assert g.state in (S.COMPLETING_REBALANCE, S.STABLE) and g.sync_deadline_ms is not None
            assert g.pending_sync <= set(g.members)


TestGroupMachine = GroupMachine.TestCase
TestGroupMachine.settings = settings(max_examples=150, stateful_step_count=40)
