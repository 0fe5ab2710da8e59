"""A group member's state machine, pure: answers and decisions go in, effects come out.

States (Kafka's consumer MemberState)
-------------------------------------
``UNJOINED``              no generation: never joined, reset by the coordinator
                          (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION), left, or the last join
                          failed. The next poll joins.
``PREPARING_REBALANCE``   the JoinGroup is sent (or about to be, after the listener revoked
                          what the rebalance takes); retried with backoff until answered.
``COMPLETING_REBALANCE``  JoinGroup answered: the member has its generation and member id;
                          the leader computes the assignment; SyncGroup is sent.
``STABLE``                SyncGroup answered with the assignment; the member heartbeats.

``VALID_PREVIOUS_STATES`` is the table of allowed transitions; ``transition_to`` enforces it.
Any state may fall back to UNJOINED. A member that is STABLE or COMPLETING_REBALANCE (a
SyncGroup refused with REBALANCE_IN_PROGRESS, the coordinator gone) joins again from there.
COMPLETING_REBALANCE may also follow UNJOINED: a heartbeat or commit answered
UNKNOWN_MEMBER_ID for the old generation while the new JoinGroup was in flight, whose answer
still names the member's new generation.

Besides the state the member keeps its ``Generation`` (id, member id, protocol) and whether
a rejoin is wanted, with the reason sent in JoinGroup. Methods return the effects for the
coordinator to carry out (``WAKE_POLL``: a poll waiting for records has group work to do;
``START_SESSION``: the session and poll interval start now, JoinGroup answered;
``RENEW_SESSION``: the session starts now, SyncGroup answered).

What to do with each error code is a table per request (``JOIN_ACTIONS``, ``SYNC_ACTIONS``,
``HEARTBEAT_ACTIONS``, ``COMMIT_ACTIONS``): retry, rediscover the coordinator, reset the
member id / generation and rejoin, take the member id the coordinator assigned
(MEMBER_ID_REQUIRED: a dynamic member's first join), or fail (a heartbeat fails only for a
fenced static member or a group it may not read; any other code is a failed heartbeat,
retried: ``heartbeat_action``). ``prepare_join`` and
``complete_join`` decide which partitions a rebalance revokes, loses and adds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from tidelog.aio.assignors import EAGER
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_AUTHORIZATION_FAILED,
    ILLEGAL_GENERATION,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    REQUEST_TIMED_OUT,
    UNKNOWN_MEMBER_ID,
    UNSTABLE_OFFSET_COMMIT,
)
from tidelog.protocol.messages import NO_GENERATION, UNKNOWN_MEMBER
from tidelog.protocol.topics import TopicPartition

__all__ = ["MemberState", "VALID_PREVIOUS_STATES", "IllegalMemberTransition", "Effect", "Membership",
           "Generation", "NO_GENERATION_INFO", "JOIN_ACTIONS", "SYNC_ACTIONS", "HEARTBEAT_ACTIONS",
           "COMMIT_ACTIONS", "action_for", "heartbeat_action", "prepare_join", "complete_join", "JoinPreparation",
           "JoinCompletion"]


class MemberState(Enum):
    UNJOINED = "unjoined"
    PREPARING_REBALANCE = "preparing-rebalance"
    COMPLETING_REBALANCE = "completing-rebalance"
    STABLE = "stable"


_ANY = frozenset(MemberState)
VALID_PREVIOUS_STATES: dict[MemberState, frozenset[MemberState]] = {
    MemberState.UNJOINED: _ANY,
    MemberState.PREPARING_REBALANCE: _ANY,
    MemberState.COMPLETING_REBALANCE: frozenset({MemberState.PREPARING_REBALANCE, MemberState.UNJOINED}),
    MemberState.STABLE: frozenset({MemberState.COMPLETING_REBALANCE}),
}


class IllegalMemberTransition(RuntimeError):
    pass


class Effect(Enum):
    WAKE_POLL = "wake-poll"
    START_SESSION = "start-session"
    RENEW_SESSION = "renew-session"


@dataclass(frozen=True, slots=True)
class Generation:
    generation_id: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER
    protocol_name: str | None = None

    @property
    def valid(self) -> bool:
        return self.generation_id != NO_GENERATION


NO_GENERATION_INFO = Generation()



class Membership:
    """The member's state, generation and rejoin wish (see the module's docstring)."""

    def __init__(self) -> None:
        self.state = MemberState.UNJOINED
        self.generation = NO_GENERATION_INFO
        self.rejoin_needed = True
        self.rejoin_reason = "initial join"

    def transition_to(self, target: MemberState) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalMemberTransition(f"member state {self.state.name} -> {target.name}")
        self.state = target

    def request_rejoin(self, reason: str) -> list[Effect]:
        self.rejoin_needed = True
        self.rejoin_reason = reason
        return [Effect.WAKE_POLL]

    def wants_join(self) -> bool:
        """A poll with no join under way starts one."""
        return self.rejoin_needed or self.state is MemberState.UNJOINED

    def join_started(self) -> list[Effect]:
        """JoinGroup is (about to be) sent; it covers any rejoin wished so far."""
        self.transition_to(MemberState.PREPARING_REBALANCE)
        self.rejoin_needed = False
        return []

    def join_retrying(self) -> list[Effect]:
        """The JoinGroup is sent again (MEMBER_ID_REQUIRED, a reset): it covers any rejoin wished."""
        self.rejoin_needed = False
        return []

    def take_member_id(self, member_id: str) -> list[Effect]:
        """MEMBER_ID_REQUIRED: join again at once with the member id the coordinator chose."""
        self.generation = Generation(NO_GENERATION, member_id)
        return []

    def joined(self, generation: Generation) -> list[Effect]:
        self.generation = generation
        self.transition_to(MemberState.COMPLETING_REBALANCE)
        return [Effect.START_SESSION]

    def synced(self) -> list[Effect]:
        self.transition_to(MemberState.STABLE)
        return [Effect.RENEW_SESSION]

    def join_failed(self) -> list[Effect]:
        self.transition_to(MemberState.UNJOINED)
        return self.request_rejoin("the last join failed")

    def reset(self, reason: str, *, keep_member_id: bool = False) -> list[Effect]:
        """Forget the generation (the partitions count as lost) and rejoin; the member id too
        unless ``keep_member_id`` (a heartbeat's ILLEGAL_GENERATION: the coordinator still
        knows the member, as Kafka's resetStateAndGeneration keeps it then)."""
        member_id = self.generation.member_id if keep_member_id else UNKNOWN_MEMBER
        self.generation = Generation(member_id=member_id) if keep_member_id else NO_GENERATION_INFO
        self.transition_to(MemberState.UNJOINED)
        return self.request_rejoin(reason)

    def left(self, reason: str) -> list[Effect]:
        """LeaveGroup sent (or the session left to expire): a later poll joins afresh."""
        self.generation = NO_GENERATION_INFO
        self.transition_to(MemberState.UNJOINED)
        self.rejoin_needed, self.rejoin_reason = True, reason
        return []

    @property
    def rebalancing(self) -> bool:
        return self.state in (MemberState.PREPARING_REBALANCE, MemberState.COMPLETING_REBALANCE)


# ---------------------------------------------------------------------------------------------
# pure decisions


# Actions for error codes, per request type (anything not listed: FATAL; for a heartbeat,
# RETRY: ``heartbeat_action``).
OK, RETRY, REDISCOVER, RESET_MEMBER, REJOIN, TAKE_MEMBER_ID, FATAL = (
    "ok", "retry", "rediscover", "reset-member", "rejoin", "take-member-id", "fatal")
_COORDINATOR_MOVED = {COORDINATOR_NOT_AVAILABLE.code: REDISCOVER, NOT_COORDINATOR.code: REDISCOVER,
                      REQUEST_TIMED_OUT.code: REDISCOVER, COORDINATOR_LOAD_IN_PROGRESS.code: RETRY}
JOIN_ACTIONS = {NONE.code: OK, **_COORDINATOR_MOVED, UNKNOWN_MEMBER_ID.code: RESET_MEMBER,
                MEMBER_ID_REQUIRED.code: TAKE_MEMBER_ID, REBALANCE_IN_PROGRESS.code: RETRY,
                ILLEGAL_GENERATION.code: RESET_MEMBER}
SYNC_ACTIONS = {NONE.code: OK, **_COORDINATOR_MOVED, REBALANCE_IN_PROGRESS.code: REJOIN,
                UNKNOWN_MEMBER_ID.code: RESET_MEMBER, ILLEGAL_GENERATION.code: RESET_MEMBER}
# Kafka's HeartbeatResponseHandler with its heartbeat thread: only a fenced static member and
# a group it may not read are fatal; any code not listed (REQUEST_TIMED_OUT, UNKNOWN_SERVER_ERROR
# from a failing handler, a code this client does not know) is a failed heartbeat, retried
# after the backoff (``heartbeat_action``)
HEARTBEAT_ACTIONS = {NONE.code: OK, COORDINATOR_NOT_AVAILABLE.code: REDISCOVER, NOT_COORDINATOR.code: REDISCOVER,
                     REBALANCE_IN_PROGRESS.code: REJOIN, UNKNOWN_MEMBER_ID.code: RESET_MEMBER,
                     ILLEGAL_GENERATION.code: RESET_MEMBER, FENCED_INSTANCE_ID.code: FATAL,
                     GROUP_AUTHORIZATION_FAILED.code: FATAL}
COMMIT_ACTIONS = {NONE.code: OK, **_COORDINATOR_MOVED, UNSTABLE_OFFSET_COMMIT.code: RETRY,
                  REBALANCE_IN_PROGRESS.code: REJOIN, UNKNOWN_MEMBER_ID.code: RESET_MEMBER,
                  ILLEGAL_GENERATION.code: RESET_MEMBER}


def action_for(table: Mapping[int, str], code: int) -> str:
    return table.get(code, FATAL)


def heartbeat_action(code: int) -> str:
    """What a heartbeat answered ``code`` asks for: ``HEARTBEAT_ACTIONS``, else RETRY."""
    return HEARTBEAT_ACTIONS.get(code, RETRY)



@dataclass(frozen=True, slots=True)
class JoinPreparation:
    revoke: frozenset[TopicPartition] = frozenset()
    lose: frozenset[TopicPartition] = frozenset()


def prepare_join(protocol: str, owned: Iterable[TopicPartition], generation_valid: bool,
                 subscribed_topics: Iterable[str]) -> JoinPreparation:
    """What leaves the member before it (re)joins: everything is *lost* when its generation
    is gone; the eager protocol revokes everything; the cooperative one only the partitions
    of topics no longer subscribed."""
    owned = frozenset(owned)
    if not generation_valid:
        return JoinPreparation(lose=owned)
    if protocol == EAGER:
        return JoinPreparation(revoke=owned)
    topics = set(subscribed_topics)
    return JoinPreparation(revoke=frozenset(tp for tp in owned if tp.topic not in topics))


@dataclass(frozen=True, slots=True)
class JoinCompletion:
    assignment: frozenset[TopicPartition]
    added: frozenset[TopicPartition]
    revoked: frozenset[TopicPartition]
    rejoin: bool


def complete_join(protocol: str, owned: Iterable[TopicPartition],
                  assigned: Iterable[TopicPartition]) -> JoinCompletion:
    """The member's new assignment against what it owns. Cooperative: owned partitions no
    longer assigned are revoked now and the member rejoins so they can be handed over."""
    owned, assigned = frozenset(owned), frozenset(assigned)
    if protocol == EAGER:
        return JoinCompletion(assigned, assigned, frozenset(), False)
    revoked = owned - assigned
    return JoinCompletion(assigned, assigned - owned, revoked, bool(revoked))

