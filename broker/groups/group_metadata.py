"""One consumer group's state machine (Kafka's GroupMetadata plus the decisions of its
GroupCoordinator), pure: requests and the time go in, replies and effects come out.

States (Kafka's, the names DescribeGroups reports)
--------------------------------------------------
``Empty``               no members; offsets may exist (a group whose members all left, or
                        one used only to commit offsets).
``PreparingRebalance``  a rebalance started: members must (re)join. The join phase ends
                        when every known member has rejoined, or when the rebalance timeout
                        (the largest of the members') passes; dynamic members that did not
                        rejoin are removed, static ones stay (until their session expires).
                        If no member rejoined, the phase waits another rebalance timeout.
                        An Empty group waits ``group.initial.rebalance.delay.ms`` first
                        (extended by that delay while new members keep arriving, up to the
                        rebalance timeout) so that a starting fleet joins one generation.
``CompletingRebalance`` the join phase ended: the generation was bumped, a protocol (assignor)
                        supported by every member chosen, the leader got the member list and
                        computes the assignment; members wait in SyncGroup for it.
``Stable``              the leader's assignment was written to ``__consumer_offsets`` and
                        handed to every member; members heartbeat.
``Dead``                the group was deleted or moved away; nothing is answered from it.

The SyncGroup deadline (Kafka's pending sync): when the join phase ends, every member must
send SyncGroup within the rebalance timeout, also once the leader's assignment has made the
group Stable (a follower may sync after that); at the deadline the members that never synced
are removed and the group rebalances. A new rebalance cancels the deadline.

``VALID_PREVIOUS_STATES`` is the table of allowed transitions; ``transition_to`` enforces it.

Events: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit validation, the timer
(``tick``: join deadline, session expiry, members that never sent SyncGroup), and the
completion of a group metadata write (``on_store_complete``).

Replies: a request either gets its answer at once (``JoinResult.immediate``) or waits for a
``Reply`` addressed to its member id; every method returns the list of effects to carry out,
in order: ``Reply`` (answer a waiting JoinGroup or SyncGroup) and ``StoreGroup`` (write the
group's metadata record, then call ``on_store_complete``). The coordinator owns the waiting
and the writing; this module reads no clock, does no I/O and never awaits. The time comes in
as a ``Now``, by two clocks: deadlines count on the monotonic one, stored timestamps are
wall time.

Membership rules that matter for clients (Kafka's):

* A new dynamic member (empty member id, no group instance id) gets MEMBER_ID_REQUIRED with
  the member id to rejoin with; until it rejoins (or its session timeout passes) the join
  phase waits for it.
* A static member (group instance id) keeps its identity across restarts: rejoining with an
  unknown member id replaces the old member id; in a Stable group whose selected protocol
  would stay the same this happens without a rebalance, whatever the member's new metadata
  (a restarted consumer's subscription carries generation -1), and the member gets its old
  assignment (Kafka's updateStaticMemberAndRebalance). Requests carrying the old member id
  are then FENCED_INSTANCE_ID. A static member that does not rejoin a rebalance stays in
  the group until its session expires (or it misses the SyncGroup deadline).
* Heartbeats answer REBALANCE_IN_PROGRESS while the group prepares a rebalance (the member
  must rejoin); a member that sends no heartbeat within its session timeout is removed and
  the group rebalances. LeaveGroup removes a member at once and rebalances.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import NamedTuple

from tidelog.broker.groups.offsets_records import GroupMetadataValue, MemberValue, OffsetValue
from tidelog.protocol.errors import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_MAX_SIZE_REACHED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    ErrorCode,
)
from tidelog.protocol.messages import (
    NO_GENERATION,
    UNKNOWN_MEMBER,
    DescribedGroup,
    DescribedGroupMember,
    JoinGroupMember,
    JoinGroupRequest,
    JoinGroupResponse,
    MemberIdentity,
    MemberResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from tidelog.protocol.topics import TopicPartition


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


S = GroupState
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.DEAD: frozenset({S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD}),
}
CAN_REBALANCE = frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY})


class Now(NamedTuple):
    """The time of an event by both clocks. Deadlines (sessions, the join and SyncGroup
    phases, pending members) count on the monotonic clock, which no step of the wall clock
    (NTP, an operator) moves; timestamps that are stored or sent (the state timestamp in the
    group's record, from which offset retention counts, as Kafka's does) are wall time."""

    ms: int  # monotonic
    wall_ms: int


def at(now: Now | int) -> Now:
    """``now`` as a Now; a plain number is one clock serving as both."""
    return now if isinstance(now, Now) else Now(now, now)


class IllegalStateTransition(RuntimeError):
    """A transition the table does not allow: a bug in the coordinator, never a client error."""


@dataclass(frozen=True, slots=True)
class GroupConfig:
    initial_rebalance_delay_ms: int = 3000
    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    max_size: int = 2**31 - 1


# -- effects -------------------------------------------------------------------------------------


class Waiting(StrEnum):
    """The request a member waits in for a Reply."""

    JOIN = "join"  # JoinGroup
    SYNC = "sync"  # SyncGroup


class StoreReason(StrEnum):
    """Why the group's metadata record is written (what ``on_store_complete`` then does)."""

    SYNC = "sync"  # the leader's assignment
    EMPTY = "empty"  # a generation without members
    STATIC = "static"  # a static member replaced without a rebalance


@dataclass(frozen=True, slots=True)
class Reply:
    """Answer the JoinGroup or SyncGroup (``kind``) that ``member_id`` waits in."""
    member_id: str
    kind: Waiting
    response: JoinGroupResponse | SyncGroupResponse


@dataclass(frozen=True, slots=True)
class StoreGroup:
    """Write the group's metadata record (``value``), then call ``on_store_complete(self, ..)``."""
    reason: StoreReason
    generation: int
    value: GroupMetadataValue
    member_id: str = ""
    old_member_id: str = ""
    # a static replacement's member as it was (``MemberMetadata.joined_with``): put back if
    # the write fails, with its old id
    old_join: tuple = ()
    supports_skip_assignment: bool = True  # of the static replacement's JoinGroup


Effect = Reply | StoreGroup


@dataclass(frozen=True, slots=True)
class JoinResult:
    """``immediate``: the response now; else wait for a Reply to ``wait_for``."""
    effects: list[Effect]
    immediate: JoinGroupResponse | None = None
    wait_for: str = ""


@dataclass(frozen=True, slots=True)
class SyncResult:
    effects: list[Effect]
    immediate: SyncGroupResponse | None = None


def join_error(error: ErrorCode, member_id: str = UNKNOWN_MEMBER, message: str | None = None) -> JoinGroupResponse:
    return JoinGroupResponse(error.code, member_id=member_id, error_message=message or error.message)


def sync_error(error: ErrorCode, message: str | None = None) -> SyncGroupResponse:
    return SyncGroupResponse(error.code, error_message=message or error.message)


# -- members -------------------------------------------------------------------------------------


@dataclass
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    last_heartbeat_ms: int = 0  # monotonic (``Now.ms``)
    awaiting_join: bool = False
    awaiting_sync: bool = False
    is_new: bool = False

    def metadata_for(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def joined_with(self) -> tuple:
        """What a JoinGroup sets, as ``rejoin`` takes it."""
        return (self.protocols, self.rebalance_timeout_ms, self.session_timeout_ms, self.client_id, self.client_host)

    def rejoin(self, protocols, rebalance_timeout_ms, session_timeout_ms, client_id, client_host) -> None:
        self.protocols, self.rebalance_timeout_ms = protocols, rebalance_timeout_ms
        self.session_timeout_ms, self.client_id, self.client_host = session_timeout_ms, client_id, client_host

    def session_expired(self, now_ms: int) -> bool:
        return now_ms >= self.last_heartbeat_ms + self.session_timeout_ms

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among ``candidates``."""
        return next(name for name in self.protocol_names() if name in candidates)


def _protocols(req: JoinGroupRequest) -> list[tuple[str, bytes]]:
    return [(p.name, p.metadata) for p in req.protocols]


# -- the group -----------------------------------------------------------------------------------


@dataclass
class GroupMetadata:
    group_id: str
    state: GroupState = S.EMPTY
    state_timestamp_ms: int = 0  # wall clock: written in the group's record; offset retention counts from it
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # group instance id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> expiry (monotonic ms)
    offsets: dict[TopicPartition, OffsetValue] = field(default_factory=dict)
    # commits written but not yet acknowledged (Kafka's pendingOffsetCommits): their group is
    # not removed and their partitions' offsets are not expired meanwhile, so the tombstone
    # of an expiry never lands after a commit that is then acknowledged
    pending_offset_commits: Counter[TopicPartition] = field(default_factory=Counter)
    # partitions whose offsets were dropped (their topic deleted) while commits of them were
    # pending -> the log position then: a pending commit's record below it is not cached
    dropped_before: dict[TopicPartition, int] = field(default_factory=dict)
    # partitions whose offset record was appended since the group was loaded or created and
    # not tombstoned since: a commit that failed (its replication timed out) is not cached, yet
    # its record may be committed; the group's deletion tombstones these too
    appended_offsets: set[TopicPartition] = field(default_factory=set)
    join_deadline_ms: int | None = None  # while PreparingRebalance (monotonic, as every deadline here)
    initial_delay_remaining_ms: int | None = None  # not None: the initial (Empty group) delay
    initial_delay_ms: int = 0
    new_member_added: bool = False
    # from the end of a join phase until every member sent SyncGroup (CompletingRebalance, Stable)
    sync_deadline_ms: int | None = None
    pending_sync: set[str] = field(default_factory=set)  # members that have not sent SyncGroup

    # -- state ---------------------------------------------------------------------------------

    def transition_to(self, target: GroupState, wall_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalStateTransition(f"group {self.group_id}: {self.state} -> {target} is not allowed")
        self.state = target
        self.state_timestamp_ms = wall_ms

    def is_(self, state: GroupState) -> bool:
        return self.state is state

    @property
    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return all(m.awaiting_join for m in self.members.values()) and not self.pending_members

    def candidate_protocols(self) -> set[str]:
        """Protocols every member supports."""
        sets = [set(m.protocol_names()) for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def supports_protocols(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        names = {name for name, _ in protocols}
        if self.is_(S.EMPTY) or not self.members:
            return bool(protocol_type) and bool(names)
        return protocol_type == self.protocol_type and bool(names & self.candidate_protocols())

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol among those every member
        supports; the most votes wins, ties going to the earlier member's preference."""
        candidates = self.candidate_protocols()
        votes = Counter(m.vote(candidates) for m in self.members.values())
        order = [m.vote(candidates) for m in self.members.values()]
        return max(votes, key=lambda name: (votes[name], -order.index(name)))

    def is_static_member_fenced(self, instance_id: str | None, member_id: str) -> bool:
        return instance_id is not None and self.static_members.get(instance_id, member_id) != member_id

    # -- JoinGroup -----------------------------------------------------------------------------

    def join(self, req: JoinGroupRequest, client_id: str, client_host: str, new_member_id: str,
             now: Now | int, config: GroupConfig, *, supports_skip_assignment: bool = True) -> JoinResult:
        """A JoinGroup. ``new_member_id`` is the id a member joining without one gets;
        ``supports_skip_assignment``: its client reads skip_assignment (the native protocol,
        Kafka's JoinGroup v9 on), which matters to a static leader's rejoin (``_on_static_stored``)."""
        now = at(now)
        if not config.min_session_timeout_ms <= req.session_timeout_ms <= config.max_session_timeout_ms:
            return JoinResult([], join_error(INVALID_SESSION_TIMEOUT, req.member_id, (
                f"session timeout {req.session_timeout_ms} ms is outside the broker's bounds "
                f"[{config.min_session_timeout_ms}, {config.max_session_timeout_ms}] "
                "(group.min.session.timeout.ms, group.max.session.timeout.ms)")))
        if self.is_(S.DEAD):
            return JoinResult([], join_error(COORDINATOR_NOT_AVAILABLE, req.member_id,
                                             f"group {self.group_id} is being removed; find its coordinator again"))
        if not self.supports_protocols(req.protocol_type, _protocols(req)):
            return JoinResult([], join_error(INCONSISTENT_GROUP_PROTOCOL, req.member_id, (
                f"protocol type {req.protocol_type!r} with protocols {[p.name for p in req.protocols]} "
                f"is not compatible with group {self.group_id} (type {self.protocol_type!r}, "
                f"protocols all members support: {sorted(self.candidate_protocols())})")))
        if req.member_id == UNKNOWN_MEMBER:
            return self._join_unknown(req, client_id, client_host, new_member_id, now, config, supports_skip_assignment)
        return self._join_known(req, client_id, client_host, now, config)

    def _join_unknown(self, req, client_id, client_host, new_member_id, now, config, supports_skip) -> JoinResult:
        known_static = req.group_instance_id is not None and req.group_instance_id in self.static_members
        if not known_static and len(self.members) + len(self.pending_members) >= config.max_size:
            return JoinResult([], join_error(GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER, (
                f"group {self.group_id} has reached group.max.size={config.max_size} members")))
        if known_static:
            return self._replace_static_member(req, client_id, client_host, new_member_id, now, config, supports_skip)
        if req.group_instance_id is None:  # a new dynamic member first learns its id
            self.pending_members[new_member_id] = now.ms + req.session_timeout_ms
            return JoinResult([], JoinGroupResponse(
                MEMBER_ID_REQUIRED.code, member_id=new_member_id,
                error_message="rejoin with the member id given (Kafka's MEMBER_ID_REQUIRED handshake)"))
        return self._add_member_and_rebalance(req, client_id, client_host, new_member_id, now, config)

    def _join_known(self, req, client_id, client_host, now, config) -> JoinResult:
        member_id = req.member_id
        if member_id in self.pending_members:
            del self.pending_members[member_id]
            return self._add_member_and_rebalance(req, client_id, client_host, member_id, now, config)
        if self.is_static_member_fenced(req.group_instance_id, member_id):
            return JoinResult([], join_error(FENCED_INSTANCE_ID, member_id, (
                f"member {member_id} was replaced by a newer member with group instance id "
                f"{req.group_instance_id!r}")))
        member = self.members.get(member_id)
        if member is None:
            return JoinResult([], join_error(UNKNOWN_MEMBER_ID, member_id, (
                f"group {self.group_id} has no member {member_id}: it was removed (session timeout or "
                "rebalance timeout); rejoin with an empty member id")))
        same = member.protocols == _protocols(req)
        if self.is_(S.PREPARING_REBALANCE):
            return self._update_member_and_rebalance(member, req, client_id, client_host, now, config)
        if self.is_(S.COMPLETING_REBALANCE) and same:
            return JoinResult([], self._join_response(member))
        if self.is_(S.STABLE) and same and member_id != self.leader_id:
            return JoinResult([], self._join_response(member))
        return self._update_member_and_rebalance(member, req, client_id, client_host, now, config)

    def _add_member_and_rebalance(self, req, client_id, client_host, member_id, now, config) -> JoinResult:
        member = MemberMetadata(member_id, req.group_instance_id, client_id, client_host,
                                _rebalance_timeout(req), req.session_timeout_ms, req.protocol_type,
                                _protocols(req), last_heartbeat_ms=now.ms, awaiting_join=True, is_new=True)
        self.add(member)
        if self.is_(S.PREPARING_REBALANCE) and self.generation_id == 0:
            self.new_member_added = True
        return JoinResult(self._after_join(now, config), wait_for=member_id)

    def _update_member_and_rebalance(self, member, req, client_id, client_host, now, config) -> JoinResult:
        member.rejoin(_protocols(req), _rebalance_timeout(req), req.session_timeout_ms, client_id, client_host)
        member.awaiting_join = True
        member.last_heartbeat_ms = now.ms
        return JoinResult(self._after_join(now, config), wait_for=member.member_id)

    def _after_join(self, now: Now, config: GroupConfig) -> list[Effect]:
        effects = self.maybe_prepare_rebalance(now, config)
        return effects + self.maybe_complete_join(now)

    def _replace_static_member(self, req, client_id, client_host, new_member_id, now, config,
                               supports_skip: bool) -> JoinResult:
        old_id = self.static_members[req.group_instance_id]
        old = self.members[old_id]
        effects = self._fence(old)
        old_join = old.joined_with()
        member = self._rename(old, new_member_id)
        member.rejoin(_protocols(req), _rebalance_timeout(req), req.session_timeout_ms, client_id, client_host)
        member.last_heartbeat_ms = now.ms
        if self.is_(S.PREPARING_REBALANCE):
            member.awaiting_join = True
            return JoinResult(effects + self.maybe_complete_join(now), wait_for=new_member_id)
        # CompletingRebalance: the leader may be assigning to the old member id, which would
        # leave the new one without partitions (Kafka's updateStaticMemberAndRebalance). In
        # Stable only a change of the selected protocol rebalances, not other metadata
        if self.is_(S.COMPLETING_REBALANCE) or self.select_protocol() != self.protocol_name:
            member.awaiting_join = True
            effects += self.prepare_rebalance(now, config)
            return JoinResult(effects + self.maybe_complete_join(now), wait_for=new_member_id)
        store = StoreGroup(StoreReason.STATIC, self.generation_id, self.snapshot(), new_member_id, old_id, old_join,
                           supports_skip)
        return JoinResult(effects + [store], wait_for=new_member_id)

    def _fence(self, old: MemberMetadata) -> list[Effect]:
        """Answer what the replaced member of a static identity still waits in."""
        msg = f"member {old.member_id} was replaced by a newer member with its group instance id"
        effects: list[Effect] = []
        if old.awaiting_join:
            effects.append(Reply(old.member_id, Waiting.JOIN, join_error(FENCED_INSTANCE_ID, old.member_id, msg)))
        if old.awaiting_sync:
            effects.append(Reply(old.member_id, Waiting.SYNC, sync_error(FENCED_INSTANCE_ID, msg)))
        old.awaiting_join = old.awaiting_sync = False
        return effects

    def _rename(self, member: MemberMetadata, new_id: str) -> MemberMetadata:
        """Move a member to a new id, keeping its place (order, leadership, pending sync)."""
        old_id = member.member_id
        self.members = {(new_id if k == old_id else k): v for k, v in self.members.items()}
        member.member_id = new_id
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def _join_response(self, member: MemberMetadata, skip_assignment: bool = False,
                       leader: str | None = None) -> JoinGroupResponse:
        """The member's JoinGroup answer; the members go to the leader (``leader``: the one
        named as the leader, the group's by default)."""
        leader = (self.leader_id or "") if leader is None else leader
        members = [JoinGroupMember(m.member_id, m.metadata_for(self.protocol_name), m.group_instance_id)
                   for m in self.members.values()] if member.member_id == leader else []
        return JoinGroupResponse(NONE.code, self.generation_id, self.protocol_type, self.protocol_name,
                                 leader, member.member_id, members, skip_assignment)

    # -- membership ----------------------------------------------------------------------------

    def add(self, member: MemberMetadata) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> MemberMetadata | None:
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
            del self.static_members[member.group_instance_id]
        self._synced(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def remove_member_and_update(self, member_id: str, now: Now, config: GroupConfig) -> list[Effect]:
        """A member leaves (LeaveGroup) or expires: answer what it waits in, then rebalance.
        A pending member (never joined) only stops the join phase from waiting for it."""
        if self.pending_members.pop(member_id, None) is not None:
            return self.maybe_complete_join(now)
        member = self.members.get(member_id)
        if member is None:
            return []
        effects: list[Effect] = []
        if member.awaiting_join:
            effects.append(Reply(member_id, Waiting.JOIN, join_error(UNKNOWN_MEMBER_ID, member_id, "the member left the group")))
        if member.awaiting_sync:
            effects.append(Reply(member_id, Waiting.SYNC, sync_error(UNKNOWN_MEMBER_ID, "the member left the group")))
        self.remove(member_id)
        if self.state in (S.STABLE, S.COMPLETING_REBALANCE):
            effects += self.maybe_prepare_rebalance(now, config)
        return effects + self.maybe_complete_join(now)

    # -- rebalance -----------------------------------------------------------------------------

    def maybe_prepare_rebalance(self, now: Now, config: GroupConfig) -> list[Effect]:
        return self.prepare_rebalance(now, config) if self.state in CAN_REBALANCE else []

    def prepare_rebalance(self, now: Now, config: GroupConfig) -> list[Effect]:
        effects = self._reset_assignment(REBALANCE_IN_PROGRESS) if self.is_(S.COMPLETING_REBALANCE) else []
        if self.is_(S.EMPTY):
            delay = self.initial_delay_ms = config.initial_rebalance_delay_ms
            self.join_deadline_ms = now.ms + delay
            self.initial_delay_remaining_ms = max(self.rebalance_timeout_ms - delay, 0)
        else:
            self.join_deadline_ms = now.ms + self.rebalance_timeout_ms
            self.initial_delay_remaining_ms = None
        self.sync_deadline_ms, self.pending_sync = None, set()
        self.transition_to(S.PREPARING_REBALANCE, now.wall_ms)
        return effects

    def _reset_assignment(self, error: ErrorCode) -> list[Effect]:
        effects: list[Effect] = []
        for m in self.members.values():
            m.assignment = b""
            if m.awaiting_sync:
                m.awaiting_sync = False
                effects.append(Reply(m.member_id, Waiting.SYNC, sync_error(error)))
        return effects

    def maybe_complete_join(self, now: Now) -> list[Effect]:
        """End the join phase when it may end: every member rejoined (except during the
        initial delay, which always runs out), or the deadline passed."""
        if not self.is_(S.PREPARING_REBALANCE):
            return []
        if self.join_deadline_ms is not None and now.ms >= self.join_deadline_ms:
            if self.initial_delay_remaining_ms and self.new_member_added:
                return self._extend_initial_delay(now)
            return self.complete_join(now)
        if self.initial_delay_remaining_ms is None and self.has_all_members_joined():
            return self.complete_join(now)
        return []

    def _extend_initial_delay(self, now: Now) -> list[Effect]:
        remaining = self.initial_delay_remaining_ms or 0
        delay = min(remaining, self.initial_delay_ms)
        self.new_member_added = False
        self.join_deadline_ms = now.ms + delay
        self.initial_delay_remaining_ms = max(remaining - delay, 0)
        return []

    def complete_join(self, now: Now) -> list[Effect]:
        """Remove the dynamic members that did not rejoin (static ones stay: a restarting
        process comes back under its instance id; their session expiry removes them); bump
        the generation with a leader among the members that rejoined; answer those. If none
        rejoined but members remain, wait another rebalance timeout (Kafka's onCompleteJoin)."""
        for m in [m for m in self.members.values() if not m.awaiting_join and m.group_instance_id is None]:
            self.remove(m.member_id)
        self.initial_delay_remaining_ms, self.new_member_added = None, False
        joined = [m for m in self.members.values() if m.awaiting_join]
        if self.members and not joined:
            self.join_deadline_ms = now.ms + self.rebalance_timeout_ms
            return []
        self.join_deadline_ms = None
        self.generation_id += 1
        if not self.members:
            self.protocol_name = None
            self.transition_to(S.EMPTY, now.wall_ms)
            return [StoreGroup(StoreReason.EMPTY, self.generation_id, self.snapshot())]
        if self.leader_id not in self.members or not self.members[self.leader_id].awaiting_join:
            self.leader_id = joined[0].member_id
        self.protocol_name = self.select_protocol()
        self.transition_to(S.COMPLETING_REBALANCE, now.wall_ms)
        self.sync_deadline_ms = now.ms + self.rebalance_timeout_ms
        self.pending_sync = set(self.members)
        effects: list[Effect] = []
        for m in self.members.values():
            if m.awaiting_join:
                effects.append(Reply(m.member_id, Waiting.JOIN, self._join_response(m)))
            m.awaiting_join, m.is_new, m.last_heartbeat_ms = False, False, now.ms
        return effects

    # -- SyncGroup -----------------------------------------------------------------------------

    def sync(self, req: SyncGroupRequest, now: Now | int) -> SyncResult:
        now = at(now)
        error = self._check_member(req.member_id, req.group_instance_id, req.generation_id)
        if error is not None:
            return SyncResult([], sync_error(*error))
        if (req.protocol_type is not None and req.protocol_type != self.protocol_type) or (
                req.protocol_name is not None and req.protocol_name != self.protocol_name):
            return SyncResult([], sync_error(INCONSISTENT_GROUP_PROTOCOL, (
                f"protocol {req.protocol_type}/{req.protocol_name} differs from the group's "
                f"{self.protocol_type}/{self.protocol_name}")))
        member = self.members[req.member_id]
        member.last_heartbeat_ms = now.ms
        if self.is_(S.EMPTY):
            return SyncResult([], sync_error(UNKNOWN_MEMBER_ID))
        if self.is_(S.PREPARING_REBALANCE):
            return SyncResult([], sync_error(REBALANCE_IN_PROGRESS, "the group is rebalancing: rejoin it"))
        self._synced(member.member_id)
        if self.is_(S.STABLE):
            return SyncResult([], self._sync_response(member))
        member.awaiting_sync = True
        if member.member_id != self.leader_id:
            return SyncResult([])
        assignment = {a.member_id: a.assignment for a in req.assignments}
        value = self.snapshot({m: assignment.get(m, b"") for m in self.members})
        return SyncResult([StoreGroup(StoreReason.SYNC, self.generation_id, value)])

    def _synced(self, member_id: str) -> None:
        """The member met the SyncGroup deadline; the last one to do so ends it."""
        self.pending_sync.discard(member_id)
        if not self.pending_sync:
            self.sync_deadline_ms = None

    def _sync_response(self, member: MemberMetadata) -> SyncGroupResponse:
        return SyncGroupResponse(NONE.code, member.assignment, self.protocol_type, self.protocol_name)

    def _check_member(self, member_id: str, instance_id: str | None, generation_id: int) -> tuple | None:
        """The error of a SyncGroup or Heartbeat from this member, if any (Kafka's order)."""
        if self.is_(S.DEAD):
            return COORDINATOR_NOT_AVAILABLE, f"group {self.group_id} is being removed; find its coordinator again"
        if self.is_static_member_fenced(instance_id, member_id):
            return FENCED_INSTANCE_ID, f"member {member_id} was replaced by a newer member with its group instance id"
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID, f"group {self.group_id} has no member {member_id}; rejoin with an empty member id"
        if generation_id != self.generation_id:
            return ILLEGAL_GENERATION, (f"generation {generation_id} is not the group's current generation "
                                        f"{self.generation_id}; rejoin the group")
        return None

    def on_store_complete(self, store: StoreGroup, error: ErrorCode, now: Now | int, config: GroupConfig) -> list[Effect]:
        """The metadata write of ``store`` finished with ``error`` (NONE when committed)."""
        now = at(now)
        if store.reason is StoreReason.SYNC:
            return self._on_sync_stored(store, error, now, config)
        if store.reason is StoreReason.STATIC:
            return self._on_static_stored(store, error)
        return []

    def _on_sync_stored(self, store: StoreGroup, error: ErrorCode, now: Now, config: GroupConfig) -> list[Effect]:
        if not self.is_(S.COMPLETING_REBALANCE) or self.generation_id != store.generation:
            return []
        if error is not NONE:
            return self._reset_assignment(error) + self.maybe_prepare_rebalance(now, config)
        assignment = {m.member_id: m.assignment for m in store.value.members}
        effects: list[Effect] = []
        for m in self.members.values():
            m.assignment = assignment.get(m.member_id, b"")
            if m.awaiting_sync:
                m.awaiting_sync = False
                effects.append(Reply(m.member_id, Waiting.SYNC, self._sync_response(m)))
        self.transition_to(S.STABLE, now.wall_ms)  # the SyncGroup deadline goes on for those not synced
        return effects

    def _on_static_stored(self, store: StoreGroup, error: ErrorCode) -> list[Effect]:
        member = self.members.get(store.member_id)
        if member is None:
            return []
        if error is not NONE:  # undo the replacement: the old member stays, as it joined
            self._rename(member, store.old_member_id).rejoin(*store.old_join)
            return [Reply(store.member_id, Waiting.JOIN, join_error(error, store.member_id))]
        if member.member_id != self.leader_id:
            return [Reply(member.member_id, Waiting.JOIN, self._join_response(member))]
        # Kafka's answer to a static leader rejoining a Stable group: it must not assign (a
        # Stable group ignores a new assignment). With skip_assignment it learns that it
        # leads and keeps the current assignment; a client without it is told the old member
        # id leads, and no members, so that it takes itself for a follower
        if store.supports_skip_assignment:
            return [Reply(member.member_id, Waiting.JOIN, self._join_response(member, skip_assignment=True))]
        return [Reply(member.member_id, Waiting.JOIN, self._join_response(member, leader=store.old_member_id))]

    # -- Heartbeat, LeaveGroup -------------------------------------------------------------------

    def heartbeat(self, member_id: str, instance_id: str | None, generation_id: int, now: Now | int) -> tuple:
        """(error, message) of a heartbeat; a known member's session is renewed."""
        now = at(now)
        error = self._check_member(member_id, instance_id, generation_id)
        if error is not None:
            return error
        if self.is_(S.EMPTY):
            return UNKNOWN_MEMBER_ID, None
        self.members[member_id].last_heartbeat_ms = now.ms
        if self.is_(S.PREPARING_REBALANCE):
            return REBALANCE_IN_PROGRESS, "the group is rebalancing: rejoin it"
        return NONE, None

    def leave(self, identities: list[MemberIdentity], now: Now | int, config: GroupConfig
              ) -> tuple[list[MemberResponse], list[Effect]]:
        now = at(now)
        responses, effects = [], []
        for ident in identities:
            member_id, error = self._leaving_member(ident)
            if error is NONE:
                effects += self.remove_member_and_update(member_id, now, config)
            responses.append(MemberResponse(ident.member_id, error.code, ident.group_instance_id))
        return responses, effects

    def _leaving_member(self, ident: MemberIdentity) -> tuple[str, ErrorCode]:
        if ident.group_instance_id is not None:
            member_id = self.static_members.get(ident.group_instance_id)
            if member_id is None:
                return ident.member_id, UNKNOWN_MEMBER_ID
            if ident.member_id not in (UNKNOWN_MEMBER, member_id):
                return ident.member_id, FENCED_INSTANCE_ID
            return member_id, NONE
        if ident.member_id in self.pending_members:  # removed by the caller (remove_member_and_update)
            return ident.member_id, NONE
        return ident.member_id, NONE if ident.member_id in self.members else UNKNOWN_MEMBER_ID

    # -- OffsetCommit --------------------------------------------------------------------------

    def commit_error(self, generation_id: int, member_id: str, instance_id: str | None,
                     now: Now | int) -> tuple[ErrorCode, str] | None:
        """Why an OffsetCommit must be refused (None: accept it). A commit from a member
        counts as its heartbeat. Outside group management (generation -1, no member id) a
        commit is accepted only while the group is Empty."""
        now = at(now)
        if self.is_(S.DEAD):
            return COORDINATOR_NOT_AVAILABLE, f"group {self.group_id} is being removed; find its coordinator again"
        if self.is_static_member_fenced(instance_id, member_id):
            return FENCED_INSTANCE_ID, f"member {member_id} was replaced by a newer member with its group instance id"
        if generation_id < 0 and self.is_(S.EMPTY):
            return None
        if member_id not in self.members:
            if generation_id < 0:
                return UNKNOWN_MEMBER_ID, (f"group {self.group_id} has active members ({self.state}); "
                                           "offsets can be committed without a member id only while it is empty")
            return UNKNOWN_MEMBER_ID, (f"group {self.group_id} has no member {member_id}: it was removed from "
                                       "the group (rebalanced); rejoin before committing")
        if generation_id != self.generation_id:
            return ILLEGAL_GENERATION, (f"generation {generation_id} is not the group's current generation "
                                        f"{self.generation_id}: a rebalance happened; rejoin before committing")
        if self.is_(S.COMPLETING_REBALANCE):  # after the member checks, as Kafka's order
            return REBALANCE_IN_PROGRESS, ("the group is completing a rebalance: the commit is refused; "
                                           "rejoin, then commit the offsets of the partitions assigned to you")
        self.members[member_id].last_heartbeat_ms = now.ms
        return None

    def has_offsets(self) -> bool:
        return bool(self.offsets) or bool(+self.pending_offset_commits)

    def begin_offset_commit(self, tps: list[TopicPartition]) -> None:
        self.pending_offset_commits.update(tps)
        self.appended_offsets.update(tps)

    def offset_keys(self) -> set[TopicPartition]:
        """Every partition that may have an offset record in the log: cached, pending, or
        appended by a commit that failed. What the group's deletion tombstones."""
        return set(self.offsets) | set(+self.pending_offset_commits) | self.appended_offsets

    def end_offset_commit(self, tps: list[TopicPartition]) -> None:
        self.pending_offset_commits.subtract(tps)
        self.pending_offset_commits = +self.pending_offset_commits
        for tp in [tp for tp in self.dropped_before if tp not in self.pending_offset_commits]:
            del self.dropped_before[tp]

    def apply_offset(self, tp: TopicPartition, value: OffsetValue) -> None:
        """Take a committed offset into the cache unless a later record is there already (an
        offset, or the tombstone of its deleted topic)."""
        if value.record_offset < self.dropped_before.get(tp, -1):
            return
        current = self.offsets.get(tp)
        if current is None or value.record_offset >= current.record_offset:
            self.offsets[tp] = value

    def remove_topics(self, topics: set[str], log_end: int) -> tuple[list[TopicPartition], int]:
        """Drop the offsets of deleted ``topics``: (the partitions to tombstone, the number of
        offsets dropped). Partitions with a commit pending, or a failed one, are tombstoned
        too; a pending commit's record, below ``log_end``, is not cached when it completes."""
        removed = [tp for tp in self.offsets if tp.topic in topics]
        for tp in removed:
            del self.offsets[tp]
        pending = [tp for tp in self.pending_offset_commits if tp.topic in topics]
        for tp in pending:
            self.dropped_before[tp] = log_end
        gone = set(removed) | {tp for tp in self.offset_keys() if tp.topic in topics}
        self.appended_offsets -= gone
        return sorted(gone), len(removed)

    def expire_offsets(self, wall_ms: int, retention_ms: int) -> list[TopicPartition]:
        """Drop and return the offsets past retention, Kafka's rule: only while the group is
        Empty, an offset committed with an explicit expire time (a retention time asked for)
        at that time, the others ``retention_ms`` after the group became Empty, or, in a group
        that only commits (no protocol), after their own commit."""
        if not self.is_(S.EMPTY):
            return []
        grouped = self.protocol_type is not None
        expired = [tp for tp, v in self.offsets.items() if tp not in self.pending_offset_commits
                   and _offset_expired(v, wall_ms, retention_ms,
                                       self.state_timestamp_ms if grouped else v.commit_timestamp_ms)]
        for tp in expired:
            del self.offsets[tp]
        self.appended_offsets.difference_update(expired)
        return expired

    # -- the timer -----------------------------------------------------------------------------

    def next_deadline_ms(self) -> int | None:
        """When (monotonic ms) ``tick`` next has something to do (None: nothing scheduled)."""
        deadlines = [m.last_heartbeat_ms + m.session_timeout_ms for m in self.members.values()
                     if not m.awaiting_join and not m.awaiting_sync]
        deadlines += self.pending_members.values()
        if self.join_deadline_ms is not None:
            deadlines.append(self.join_deadline_ms)
        if self.sync_deadline_ms is not None and self.pending_sync:
            deadlines.append(self.sync_deadline_ms)
        return min(deadlines, default=None)

    def tick(self, now: Now | int, config: GroupConfig) -> list[Effect]:
        """Everything time decides: expired sessions and pending members, members that did not
        send SyncGroup in time, the end of the join phase."""
        now = at(now)
        if self.is_(S.DEAD):
            return []
        effects: list[Effect] = []
        for member_id, expiry in list(self.pending_members.items()):
            if now.ms >= expiry:
                del self.pending_members[member_id]
        for m in list(self.members.values()):
            if not m.awaiting_join and not m.awaiting_sync and m.session_expired(now.ms):
                effects += self.remove_member_and_update(m.member_id, now, config)
        if self.sync_deadline_ms is not None and now.ms >= self.sync_deadline_ms and self.state in (
                S.COMPLETING_REBALANCE, S.STABLE):
            for member_id in list(self.pending_sync):
                effects += self.remove_member_and_update(member_id, now, config)
        return effects + self.maybe_complete_join(now)

    # -- views and persistence -----------------------------------------------------------------

    def snapshot(self, assignment: dict[str, bytes] | None = None) -> GroupMetadataValue:
        """The group metadata record's value (``assignment`` overrides the members')."""
        members = tuple(MemberValue(
            m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
            m.session_timeout_ms, m.metadata_for(self.protocol_name),
            m.assignment if assignment is None else assignment.get(m.member_id, b""))
            for m in self.members.values())
        return GroupMetadataValue(self.protocol_type, self.generation_id, self.protocol_name, self.leader_id,
                                  self.state_timestamp_ms, members)

    @classmethod
    def restore(cls, group_id: str, value: GroupMetadataValue | None,
                offsets: dict[TopicPartition, OffsetValue], now: Now | int) -> "GroupMetadata":
        """A group as loaded from ``__consumer_offsets``: Stable with its members (their
        sessions start now) or Empty; a group with only offsets is Empty at generation 0."""
        now = at(now)
        group = cls(group_id, state_timestamp_ms=now.wall_ms, offsets=dict(offsets))
        if value is None:
            return group
        group.generation_id, group.protocol_type = value.generation, value.protocol_type
        group.protocol_name = value.protocol
        group.state_timestamp_ms = value.current_state_timestamp_ms if value.current_state_timestamp_ms >= 0 else now.wall_ms
        for mv in value.members:
            group.add(MemberMetadata(mv.member_id, mv.group_instance_id, mv.client_id, mv.client_host,
                                     mv.rebalance_timeout_ms, mv.session_timeout_ms, value.protocol_type or "",
                                     [(value.protocol or "", mv.subscription)], mv.assignment, now.ms))
        if group.members:
            group.leader_id = value.leader if value.leader in group.members else next(iter(group.members))
            group.state, group.state_timestamp_ms = S.STABLE, now.wall_ms
        return group

    def describe(self) -> DescribedGroup:
        """Kafka's summary: member metadata and assignments only while Stable."""
        stable = self.is_(S.STABLE)
        members = [DescribedGroupMember(m.member_id, m.client_id, m.client_host,
                                        m.metadata_for(self.protocol_name) if stable else b"",
                                        m.assignment if stable else b"", m.group_instance_id)
                   for m in self.members.values()]
        return DescribedGroup(NONE.code, self.group_id, str(self.state), self.protocol_type or "",
                              (self.protocol_name or "") if stable else "", members,
                              self.generation_id, self.leader_id or "")


def _rebalance_timeout(req: JoinGroupRequest) -> int:
    return req.rebalance_timeout_ms if req.rebalance_timeout_ms >= 0 else req.session_timeout_ms


def _offset_expired(v: OffsetValue, wall_ms: int, retention_ms: int, since_ms: int) -> bool:
    if v.expire_timestamp_ms >= 0:
        return wall_ms >= v.expire_timestamp_ms
    return wall_ms - since_ms >= retention_ms


__all__ = ["GroupState", "VALID_PREVIOUS_STATES", "GroupMetadata", "MemberMetadata", "GroupConfig", "Now", "at",
           "Reply", "StoreGroup", "JoinResult", "SyncResult", "NO_GENERATION"]
