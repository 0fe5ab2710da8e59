"""Consumer group membership: Kafka's ConsumerCoordinator (and AbstractCoordinator), on Trio.

Theory of operation.

* **Coordinator.** FindCoordinator (to any broker) names the broker that leads the group's
  ``__consumer_offsets`` partition. It gets a connection of its own (node id
  ``COORDINATOR_ID_BASE - broker id``) so that a JoinGroup that waits for a whole rebalance,
  or a heartbeat, never queues behind a long-polling fetch. COORDINATOR_NOT_AVAILABLE,
  NOT_COORDINATOR, a lost connection or a timeout mark it unknown; it is looked up again with
  backoff (COORDINATOR_LOAD_IN_PROGRESS is retried against the same broker). One background
  task looks it up, retrying with backoff up to ``retry_backoff_max_ms`` while anyone waits
  for it; a non-retriable answer (GROUP_AUTHORIZATION_FAILED, INVALID_GROUP_ID) is raised by
  every poll (and commit) while it is the latest answer, as Kafka's ensureCoordinatorReady
  does, and a join waiting for the coordinator goes on once it is found: never a silent stall.
* **Membership** is a small state machine (``MemberState``): UNJOINED -> PREPARING_REBALANCE
  (JoinGroup sent) -> COMPLETING_REBALANCE (SyncGroup sent) -> STABLE. What to do with each
  error code is a table per request (``JOIN_ACTIONS``, ``SYNC_ACTIONS``, ``HEARTBEAT_ACTIONS``,
  ``COMMIT_ACTIONS``): retry, rediscover the coordinator, reset the member id / generation and
  rejoin, take the member id the coordinator assigned (MEMBER_ID_REQUIRED: a dynamic
  member's first join), or fail.
* **Rebalances happen in poll**, as in Kafka, so the application's rebalance listener runs
  where the application expects it: ``poll`` first runs the *join prepare* step (auto-commit
  of the consumed positions while the generation is still valid: in the background, with
  ``request_timeout_ms`` of its own, while poll waits for it only until its own deadline and
  hands out no records, so a later poll continues the step, as Kafka's onJoinPrepare; then
  ``on_partitions_revoked``: every partition for the eager protocol, only the partitions no
  longer subscribed for the cooperative one; ``on_partitions_lost`` instead when the
  generation was lost), then starts the JoinGroup/SyncGroup exchange as a background task
  (it survives a ``poll`` that returns at its timeout) and waits for it within the poll's
  timeout. All group work ``poll`` does inline is thus bounded by its deadline, except the
  application's own rebalance listener and commit callbacks. When the exchange completes,
  the next step of ``poll`` applies the assignment (*join complete*): eager: everything
  assigned is new; cooperative: partitions no longer assigned are revoked (then the member
  rejoins at once, so the partitions can be handed over in a second rebalance) and only the
  added ones are passed to ``on_partitions_assigned``. New
  partitions start at the group's committed offset (OffsetFetch), else per
  ``auto_offset_reset``. Decisions of these steps are pure functions (``prepare_join``,
  ``complete_join``).
* **Heartbeats are independent of poll**: a background task heartbeats every
  ``heartbeat_interval_ms`` from the JoinGroup answer on: while COMPLETING_REBALANCE (the
  leader may refresh metadata for up to ``request_timeout_ms`` to compute the assignment,
  longer than a session; REBALANCE_IN_PROGRESS is then ignored, the SyncGroup's answer
  decides, as in Kafka), but not while the SyncGroup is in flight (the coordinator keeps a
  member awaiting it alive, and a heartbeat's answer would wait behind the SyncGroup's:
  responses come in request order), and while STABLE (including after a heartbeat said
  REBALANCE_IN_PROGRESS, until poll rejoins: the coordinator waits up to the rebalance
  timeout, ``max_poll_interval_ms`` by default). A handler slower than the session timeout
  therefore keeps its partitions; one slower than ``max_poll_interval_ms`` does not: the
  heartbeat task then leaves the group (LeaveGroup, dynamic members only, as Kafka does) and
  forgets its generation, so the next poll reports the partitions lost and rejoins. No
  successful heartbeat for ``session_timeout_ms`` marks the coordinator unknown. Timing
  decisions live in ``HeartbeatTimer`` (time passed in).
* **Commits** carry the generation and member id (generation -1 and no member id when the
  partitions were assigned by hand: the coordinator then accepts them only while the group
  has no members). They go through one lock in the order they were made, and a partition's
  offset from an older commit is never sent after a newer one's, so the group's committed
  offsets never go backwards because of reordering; the automatic commit also never commits a
  position below the last committed offset (only an explicit ``commit`` after a ``seek`` may
  move it back). A commit rejected because the group moved on raises ``CommitFailedError``
  saying so and what to do.
* Static members (``group_instance_id``) do not send LeaveGroup when they close, so a
  restart within the session timeout gets the same member slot and assignment back without a
  rebalance (the coordinator answers its JoinGroup with the current generation).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import trio

from tidelog.aio.assignors import (
    COOPERATIVE,
    EAGER,
    PROTOCOL_TYPE,
    Assignor,
    Subscription,
    assignors_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    rebalance_protocol,
)
from tidelog.aio.cluster import Backoff, Cluster, ClusterMetadata
from tidelog.aio.subscription import ConsumerConfig, SubscriptionState
from tidelog.errors import (
    BrokerConnectionError,
    CommitFailedError,
    RebalanceInProgressError,
    RequestTimedOut,
    TidelogError,
    broker_error,
)
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    ILLEGAL_GENERATION,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    REQUEST_TIMED_OUT,
    UNKNOWN_MEMBER_ID,
    UNSTABLE_OFFSET_COMMIT,
    for_code,
)
from tidelog.protocol.messages import (
    NO_GENERATION,
    NO_OFFSET,
    UNKNOWN_MEMBER,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
)
from tidelog.protocol.topics import TopicPartition

__all__ = ["ConsumerRebalanceListener", "MemberState", "Generation", "HeartbeatTimer",
           "ConsumerCoordinator", "prepare_join", "complete_join", "auto_commit_offsets",
           "matching_topics", "not_superseded", "heartbeats_due", "JOIN_ACTIONS", "SYNC_ACTIONS",
           "HEARTBEAT_ACTIONS", "COMMIT_ACTIONS", "COORDINATOR_ID_BASE", "commit_failed_message"]

log = logging.getLogger(__name__)

COORDINATOR_ID_BASE = 2**31 - 1
JOIN_TIMEOUT_SLACK_S = 5.0  # Kafka's JOIN_GROUP_TIMEOUT_LAPSE


class ConsumerRebalanceListener:
    """Override what you need; methods may be plain or ``async def`` (AsyncConsumer).

    ``on_partitions_revoked`` runs before a rebalance takes partitions away, while the
    member still owns them (commit what was processed here); ``on_partitions_assigned`` after
    a rebalance, with the partitions this member gained (positions start at the committed
    offsets; ``seek`` here to start elsewhere); ``on_partitions_lost`` when the member lost
    its partitions without a chance to revoke them (its session or poll interval expired;
    another member may already own them: do not commit). Its default calls
    ``on_partitions_revoked``, as Kafka's does."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> Any:
        pass

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> Any:
        pass

    def on_partitions_lost(self, lost: set[TopicPartition]) -> Any:
        return self.on_partitions_revoked(lost)


class MemberState(Enum):
    UNJOINED = "unjoined"
    PREPARING_REBALANCE = "preparing-rebalance"
    COMPLETING_REBALANCE = "completing-rebalance"
    STABLE = "stable"


@dataclass(frozen=True, slots=True)
class Generation:
    generation_id: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER
    protocol_name: str | None = None

    @property
    def valid(self) -> bool:
        return self.generation_id != NO_GENERATION


NO_GENERATION_INFO = Generation()


# ---------------------------------------------------------------------------------------------
# pure decisions


class HeartbeatTimer:
    """Kafka's Heartbeat: when to send the next heartbeat, whether the session or the poll
    interval expired. Times are monotonic seconds passed in."""

    def __init__(self, session_timeout_s: float, heartbeat_interval_s: float, max_poll_interval_s: float,
                 now: float):
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.max_poll_interval_s = max_poll_interval_s
        self.last_sent = -float("inf")
        self.last_received = now
        self.last_poll = now
        self.in_flight = False

    def polled(self, now: float) -> None:
        self.last_poll = now

    def sent(self, now: float) -> None:
        self.last_sent = now
        self.in_flight = True

    def received(self, now: float) -> None:
        self.last_received = now
        self.in_flight = False

    def failed(self) -> None:
        self.in_flight = False

    def reset_session(self, now: float) -> None:
        """A rebalance completed: the session starts now; the first heartbeat follows an interval."""
        self.last_received = self.last_sent = now
        self.in_flight = False

    def joined(self, now: float) -> None:
        """JoinGroup answered (Kafka's resetTimeouts when the heartbeat thread is enabled):
        session and poll interval start now; the first heartbeat follows an interval."""
        self.reset_session(now)
        self.last_poll = now

    def coordinator_found(self, now: float) -> None:
        """Kafka's resetSessionTimeout when FindCoordinator answers: the session is judged
        from now, so a member whose coordinator was away longer than the session timeout
        heartbeats the new one (due at once) instead of finding the session expired again and
        dropping the coordinator it just found, which would never let it hear of a rebalance."""
        self.last_received = now

    def time_to_next_heartbeat(self, now: float) -> float:
        if self.in_flight:
            return self.heartbeat_interval_s
        return max(0.0, self.last_sent + self.heartbeat_interval_s - now)

    def session_expired(self, now: float) -> bool:
        return now - self.last_received > self.session_timeout_s

    def poll_timeout_expired(self, now: float) -> bool:
        return now - self.last_poll > self.max_poll_interval_s

    def time_to_poll_timeout(self, now: float) -> float:
        return max(0.0, self.last_poll + self.max_poll_interval_s - now)


def heartbeats_due(state: MemberState, generation_valid: bool, sync_in_flight: bool) -> bool:
    """Whether the heartbeat task heartbeats: from the JoinGroup answer on (STABLE and
    COMPLETING_REBALANCE, as Kafka's heartbeat thread: the leader computing the assignment may
    take longer than the session timeout), except while the SyncGroup is in flight (the
    coordinator keeps a member awaiting its SyncGroup answer alive, and with responses in
    request order a heartbeat's answer would wait behind the SyncGroup's)."""
    if not generation_valid:
        return False
    if state is MemberState.COMPLETING_REBALANCE:
        return not sync_in_flight
    return state is MemberState.STABLE


# Actions for error codes, per request type (anything not listed: FATAL).
OK, RETRY, REDISCOVER, RESET_MEMBER, REJOIN, TAKE_MEMBER_ID, FATAL = (
    "ok", "retry", "rediscover", "reset-member", "rejoin", "take-member-id", "fatal")
_COORDINATOR_MOVED = {COORDINATOR_NOT_AVAILABLE.code: REDISCOVER, NOT_COORDINATOR.code: REDISCOVER,
                      REQUEST_TIMED_OUT.code: REDISCOVER, COORDINATOR_LOAD_IN_PROGRESS.code: RETRY}
JOIN_ACTIONS = {NONE.code: OK, **_COORDINATOR_MOVED, UNKNOWN_MEMBER_ID.code: RESET_MEMBER,
                MEMBER_ID_REQUIRED.code: TAKE_MEMBER_ID, REBALANCE_IN_PROGRESS.code: RETRY,
                ILLEGAL_GENERATION.code: RESET_MEMBER}
SYNC_ACTIONS = {NONE.code: OK, **_COORDINATOR_MOVED, REBALANCE_IN_PROGRESS.code: REJOIN,
                UNKNOWN_MEMBER_ID.code: RESET_MEMBER, ILLEGAL_GENERATION.code: RESET_MEMBER}
HEARTBEAT_ACTIONS = {NONE.code: OK, **_COORDINATOR_MOVED, REBALANCE_IN_PROGRESS.code: REJOIN,
                     UNKNOWN_MEMBER_ID.code: RESET_MEMBER, ILLEGAL_GENERATION.code: RESET_MEMBER}
COMMIT_ACTIONS = {NONE.code: OK, **_COORDINATOR_MOVED, UNSTABLE_OFFSET_COMMIT.code: RETRY,
                  REBALANCE_IN_PROGRESS.code: REJOIN, UNKNOWN_MEMBER_ID.code: RESET_MEMBER,
                  ILLEGAL_GENERATION.code: RESET_MEMBER}


def action_for(table: Mapping[int, str], code: int) -> str:
    return table.get(code, FATAL)


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


def auto_commit_offsets(positions: Mapping[TopicPartition, int],
                        committed: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The consumed positions an automatic commit sends: only those past the last committed
    offset (an automatic commit never moves a committed offset back)."""
    return {tp: pos for tp, pos in positions.items() if pos > committed.get(tp, -1)}


def not_superseded(offsets: Mapping[TopicPartition, int], seq: int,
                   sent_seq: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
    """The offsets of commit number ``seq`` still worth sending: a partition whose offset from
    a later commit (higher seq) was already stored is left out, so commits that reach the lock
    out of order never move a committed offset back."""
    return {tp: o for tp, o in offsets.items() if sent_seq.get(tp, 0) < seq}


def coalesce_commit(fresh: Mapping[TopicPartition, int], seq: int, generation: "Generation",
                    requested: Mapping[TopicPartition, tuple[int, int, "Generation"]]
                    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """What commit number ``seq`` sends: for each of its partitions the offset of the latest
    commit requested so far for it (``requested``: partition -> (seq, offset, generation)),
    if that commit is of the same generation, else its own. Returns (offsets, seq per
    partition). Commits queued behind one in flight are thus sent together: the later one
    finds its offsets already stored (``not_superseded``) and returns at once; the stored
    offset is the one the latest commit asked for, so nothing moves back."""
    offsets, seqs = {}, {}
    for tp, offset in fresh.items():
        latest = requested.get(tp)
        if latest is not None and latest[0] > seq and latest[2] == generation:
            offsets[tp], seqs[tp] = latest[1], latest[0]
        else:
            offsets[tp], seqs[tp] = offset, seq
    return offsets, seqs


def matching_topics(pattern: re.Pattern[str], metadata: ClusterMetadata,
                    exclude_internal: bool = True) -> set[str]:
    """The topics a pattern subscription covers (fullmatch, as Java's Pattern.matches);
    internal topics (as the broker's metadata marks them) only with ``exclude_internal`` off."""
    return {name for name, t in metadata.topics.items()
            if pattern.fullmatch(name) and not (exclude_internal and t.is_internal)}


def commit_failed_message(group_id: str, detail: str) -> str:
    return (f"commit of group {group_id!r} failed: the group has rebalanced and the partitions "
            f"were reassigned to other members ({detail}). This happens when the time between "
            "polls is longer than max_poll_interval_ms (processing a batch took too long), or the "
            "member missed its session timeout. Increase max_poll_interval_ms or reduce the work "
            "per poll (max_poll_records); the records after the last successful commit will be "
            "delivered again to the partitions' new owners.")


@dataclass(frozen=True, slots=True)
class JoinResult:
    generation: Generation
    assignment: bytes
    is_leader: bool


# ---------------------------------------------------------------------------------------------
# the coordinator client


class ConsumerCoordinator:
    """The member's side of the group protocol. Driven by the consumer's ``poll`` (rebalances,
    automatic commits, committed offsets) plus one heartbeat task of its own."""

    def __init__(self, cluster: Cluster, config: ConsumerConfig, subscriptions: SubscriptionState,
                 invoke: Callable[..., Awaitable[Any]], wake_fetcher: Callable[[], None], *,
                 wake_poll: Callable[[], None] = lambda: None):
        """``invoke(fn, *args)`` runs the listener's methods and commit callbacks;
        ``wake_fetcher()`` says the assignment or positions changed; ``wake_poll()`` wakes a
        poll waiting for records (group work to do)."""
        self.cluster = cluster
        self.config = config
        self.group_id = config.group_id
        self.subscriptions = subscriptions
        self.assignors: list[Assignor] = assignors_for(config.partition_assignment_strategy)
        self.protocol = rebalance_protocol(self.assignors)
        self._invoke = invoke
        self._wake_fetcher = wake_fetcher
        self.wake_poll = wake_poll
        self.generation = NO_GENERATION_INFO
        self.state = MemberState.UNJOINED
        self.coordinator_id: int | None = None
        self.rejoin_needed = True
        self.rejoin_reason = "initial join"
        self.subscribed_topics: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.listener: ConsumerRebalanceListener = ConsumerRebalanceListener()
        self.committed: dict[TopicPartition, int] = {}  # the group's committed offsets as last seen
        self.timer = HeartbeatTimer(config.session_timeout_ms / 1000, config.heartbeat_interval_ms / 1000,
                                    config.max_poll_interval_ms / 1000, time.monotonic())
        self._backoff_s = config.retry_backoff_ms / 1000
        self._backoff_max_s = config.retry_backoff_max_ms / 1000
        self._join_done: trio.Event | None = None
        self._prepare_commit: trio.Event | None = None  # set when the commit before a rebalance ended
        self._join_outcome: JoinResult | BaseException | None = None
        self._join_scope: trio.CancelScope | None = None
        self._assignment_snapshot: dict[str, int] | None = None  # leader: partition counts assigned
        self._commit_lock = trio.Lock()
        self._commit_seq = 0
        self._sent_seq: dict[TopicPartition, int] = {}
        self._requested: dict[TopicPartition, tuple[int, int, Generation]] = {}  # latest commit asked
        self._completed_commits: list[tuple[Callable, dict, BaseException | None]] = []
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        self._wake_heartbeat = trio.Event()
        self._lookup_done = trio.Event()  # set when a FindCoordinator attempt ends (then renewed)
        self._lookup_error: TidelogError | None = None  # the last attempt's non-retriable error
        self._coordinator_waiters = 0
        self._sync_in_flight = False  # no heartbeat then: its answer would wait behind the SyncGroup's
        self._nursery: trio.Nursery | None = None
        self._pattern_refreshed = -float("inf")
        self._left_for_poll_timeout = False
        self._running: set[str] = set()  # names of background tasks under way
        self.poll_interrupted = False  # the consumer's wakeup(): poll's waits end (interrupt_poll)
        self._poll_waits: set[trio.CancelScope] = set()
        self._fatal: TidelogError | None = None  # raised by the next poll

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self._heartbeat_loop)

    @property
    def is_managed(self) -> bool:
        """Partitions come from the group (subscribe), not from assign()."""
        return bool(self.subscribed_topics) or self.pattern is not None

    @property
    def is_static(self) -> bool:
        return self.config.group_instance_id is not None

    # -- subscription ---------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | None, pattern: str | re.Pattern[str] | None,
                  listener: ConsumerRebalanceListener | None) -> None:
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe to a list of topics or a pattern (exactly one of them)")
        if listener is not None:
            self.listener = listener
        if pattern is not None:
            self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
            self._pattern_refreshed = -float("inf")
            self._set_topics(matching_topics(self.pattern, self.cluster.metadata,
                                             self.config.exclude_internal_topics))
        else:
            topics = [topics] if isinstance(topics, str) else list(topics)
            if not topics or not all(isinstance(t, str) and t for t in topics):
                raise ValueError(f"subscribe needs topic names, got {topics!r}")
            self.pattern = None
            self._set_topics(set(topics))

    def _set_topics(self, topics: set[str]) -> None:
        if topics != self.subscribed_topics or self.state is MemberState.UNJOINED:
            self.subscribed_topics = topics
            self.cluster.set_topics(topics | {tp.topic for tp in self.subscriptions.partitions})
            self.cluster.request_update()
            self.request_rejoin("the subscription changed")

    def request_rejoin(self, reason: str) -> None:
        if not self.rejoin_needed:
            log.info("group %r: rejoining (%s)", self.group_id, reason)
        self.rejoin_needed = True
        self.rejoin_reason = reason
        self.wake_poll()

    def waiting_in_poll(self) -> float:
        """The application is inside ``poll``, waiting for records: that is polling (Kafka
        refreshes its poll timer in its poll loop), so a ``poll(timeout_ms)`` longer than
        ``max_poll_interval_ms`` does not make the member leave. Returns how long the wait may
        last before this must be called again (seconds)."""
        self.timer.polled(time.monotonic())
        return self.timer.max_poll_interval_s / 2

    def poll_step_due(self) -> bool:
        """Whether a poll waiting for records should run the group step again now: a join
        finished, or a rejoin is wanted and can start (the coordinator is known)."""
        if self._join_done is not None:
            return self._join_done.is_set()
        if self._prepare_commit is not None:
            return self._prepare_commit.is_set()
        return self.is_managed and self.rejoin_needed and self.coordinator_id is not None and (
            self.pattern is None or self._pattern_refreshed != -float("inf"))

    # -- the poll step --------------------------------------------------------------------------

    async def poll(self, deadline: float) -> None:
        """Group work due in ``poll``, within monotonic-Trio ``deadline`` (trio.current_time):
        completed async-commit callbacks, pattern updates, rebalances, committed offsets for
        new partitions and the automatic commit."""
        self.timer.polled(time.monotonic())
        self._raise_fatal()
        await self.invoke_completed_commits()
        if self.is_managed:
            self._maybe_refresh_pattern()
            if self.pattern is not None and self._pattern_refreshed == -float("inf"):
                return  # join once the pattern has been matched against the cluster's topics
            self._check_metadata_changes()
            if not await self.ensure_coordinator(deadline, interruptible=True):
                return
            if self._join_done is None and (self.rejoin_needed or self.state is MemberState.UNJOINED):
                await self._prepare_and_start_join(deadline)
            if self._join_done is not None:
                with self._poll_wait(deadline):
                    await self._join_done.wait()
                if self._join_done.is_set():
                    await self._finish_join()
        if self.subscriptions.awaiting_committed():
            self._spawn_once("committed", self._refresh_committed_positions)
        self._maybe_auto_commit()

    def interrupt_poll(self) -> None:
        """The consumer's ``wakeup``: the waits of the poll under way (or of the next one, until
        the consumer clears ``poll_interrupted``) end now, as at the poll's deadline."""
        self.poll_interrupted = True
        for scope in list(self._poll_waits):
            scope.cancel()

    @contextlib.contextmanager
    def _poll_wait(self, deadline: float) -> Iterator[None]:
        """One of poll's waits: it ends at ``deadline`` or at ``interrupt_poll``."""
        with trio.move_on_at(deadline) as scope:
            if self.poll_interrupted:
                scope.cancel()
            self._poll_waits.add(scope)
            try:
                yield
            finally:
                self._poll_waits.discard(scope)

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            error, self._fatal = self._fatal, None
            raise error

    def _spawn_once(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` in the background unless a task of that name is running."""
        if name in self._running or self._nursery is None:
            return
        self._running.add(name)

        async def run() -> None:
            try:
                await fn()
            finally:
                self._running.discard(name)

        self._nursery.start_soon(run)

    def _maybe_refresh_pattern(self) -> None:
        if self.pattern is not None and (time.monotonic() - self._pattern_refreshed
                                         >= self.config.metadata_max_age_ms / 1000):
            self._spawn_once("pattern", self._refresh_pattern)

    async def _refresh_pattern(self) -> None:
        now = time.monotonic()
        try:
            await self.cluster.fetch_metadata(None, timeout=self.config.request_timeout_ms / 1000)
        except TidelogError as e:
            log.debug("group %r: metadata for the pattern subscription failed: %s", self.group_id, e)
            return
        self._pattern_refreshed = now
        if self.pattern is None:
            return
        matched = matching_topics(self.pattern, self.cluster.metadata, self.config.exclude_internal_topics)
        if matched != self.subscribed_topics:
            self._set_topics(matched)

    def _check_metadata_changes(self) -> None:
        """The leader rejoins when a topic it assigned changed its number of partitions."""
        snapshot = self._assignment_snapshot
        if snapshot is None or self.rejoin_needed:
            return
        for topic, count in snapshot.items():
            now = self.cluster.metadata.partitions_for(topic)
            if now is not None and len(now) != count:
                self.request_rejoin(f"topic {topic!r} now has {len(now)} partitions (was {count})")
                return

    # -- rebalance: prepare, join + sync, complete ----------------------------------------------

    async def _prepare_and_start_join(self, deadline: float) -> None:
        if not await self._committed_before_rebalance(deadline):
            return  # the commit goes on; a later poll revokes and joins
        owned = set(self.subscriptions.partitions)
        prep = prepare_join(self.protocol, owned, self.generation.valid, self.subscribed_topics)
        try:
            if prep.lose:
                log.info("group %r: partitions lost: %s", self.group_id, _names(prep.lose))
                await self._call_listener("on_partitions_lost", prep.lose)
            elif prep.revoke:
                await self._call_listener("on_partitions_revoked", prep.revoke)
        finally:
            left = prep.lose | prep.revoke
            if left:
                self._drop_partitions(left)
            self.rejoin_needed = False
            self.state = MemberState.PREPARING_REBALANCE
            self._join_done = trio.Event()
            self._join_outcome = None
            self._nursery.start_soon(self._join_task, self._join_done)

    async def _committed_before_rebalance(self, deadline: float) -> bool:
        """Kafka's onJoinPrepare commit, within the poll's ``deadline``: with auto-commit, the
        consumed positions are committed before any partition is revoked. The commit runs in
        the background with its own deadline (``request_timeout_ms``); this poll waits for it
        until ``deadline`` and True means it is over (done, failed or not needed). Meanwhile
        ``holds_records``: poll returns no records, so the positions committed are the ones
        the partitions are revoked at."""
        if self._prepare_commit is None:
            if not (self.generation.valid and self.config.enable_auto_commit):
                return True
            offsets = auto_commit_offsets(self.subscriptions.consumed_positions(), self.committed)
            if not offsets:
                return True
            self._prepare_commit = done = trio.Event()

            async def run() -> None:
                try:
                    await self._commit_before_rebalance(offsets)
                finally:
                    done.set()
                    self.wake_poll()

            self._nursery.start_soon(run)
        done = self._prepare_commit
        with self._poll_wait(deadline):
            await done.wait()
        if not done.is_set():
            return False
        self._prepare_commit = None
        return True

    def holds_records(self) -> bool:
        """Whether poll must not hand out records now: the commit before a rebalance is under way."""
        return self._prepare_commit is not None and not self._prepare_commit.is_set()

    async def _commit_before_rebalance(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        if offsets is None:
            offsets = auto_commit_offsets(self.subscriptions.consumed_positions(), self.committed)
        if not offsets:
            return
        try:
            await self.commit(offsets, deadline=trio.current_time() + self.config.request_timeout_ms / 1000)
        except TidelogError as e:
            log.warning("group %r: automatic commit before the rebalance failed: %s", self.group_id, e)

    async def _finish_join(self) -> None:
        outcome, self._join_done, self._join_outcome = self._join_outcome, None, None
        if isinstance(outcome, BaseException):
            self.state = MemberState.UNJOINED
            self.request_rejoin("the last join failed")
            raise outcome
        if outcome is None or self.state is not MemberState.STABLE:
            return  # cancelled (unsubscribe, leave) or the member was reset meanwhile
        assigned = [tp for tp in decode_assignment(outcome.assignment).partitions]
        done = complete_join(self.protocol, self.subscriptions.partitions, assigned)
        log.info("group %r: generation %d, member %s%s: assigned %s", self.group_id,
                 outcome.generation.generation_id, outcome.generation.member_id,
                 " (leader)" if outcome.is_leader else "", _names(done.assignment))
        try:
            if done.revoked:
                await self._call_listener("on_partitions_revoked", done.revoked)
        finally:
            self.subscriptions.assign(done.assignment, need_committed=True)
            watched = set(self._assignment_snapshot or ())  # the leader watches every member's topics
            self.cluster.set_topics(self.subscribed_topics | watched | {tp.topic for tp in done.assignment})
            self._wake_fetcher()
            if done.rejoin:
                self.request_rejoin("partitions were revoked for the cooperative handover")
        await self._call_listener("on_partitions_assigned", done.added)

    def _drop_partitions(self, tps: Iterable[TopicPartition]) -> None:
        gone = set(tps)
        self.subscriptions.assign([tp for tp in self.subscriptions.partitions if tp not in gone])
        for tp in gone:
            self.committed.pop(tp, None)

    async def _call_listener(self, method: str, tps: frozenset[TopicPartition]) -> None:
        if method == "on_partitions_assigned" or tps:
            await self._invoke(getattr(self.listener, method), set(tps))

    async def _join_task(self, done: trio.Event) -> None:
        try:
            with trio.CancelScope() as scope:
                self._join_scope = scope
                self._join_outcome = await self._join_and_sync()
        except TidelogError as e:
            self._join_outcome = e
        finally:
            self._join_scope = None
            done.set()
            self.wake_poll()

    async def _join_and_sync(self) -> JoinResult:
        """JoinGroup then SyncGroup until the member has an assignment; retriable failures
        retry with backoff, fatal ones raise (and surface from poll)."""
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        while True:
            await self._wait_for_coordinator()
            self.state = MemberState.PREPARING_REBALANCE
            try:
                response = await self._coordinator_request(self._join_request(), ApiKey.JOIN_GROUP,
                                                           self._join_timeout_s())
                result = await self._handle_join(response)
                if result is not None:
                    return result
                if self.rejoin_needed:
                    self.rejoin_needed = False  # a retry of the join covers it
                continue  # MEMBER_ID_REQUIRED / reset: rejoin at once
            except _Retry as r:
                if r.rediscover:
                    self.mark_coordinator_unknown(str(r))
                await trio.sleep(backoff.next_delay())

    def _join_timeout_s(self) -> float:
        return max(self.config.request_timeout_ms / 1000, self._rebalance_timeout_ms() / 1000 + JOIN_TIMEOUT_SLACK_S)

    def _rebalance_timeout_ms(self) -> int:
        c = self.config
        return c.rebalance_timeout_ms if c.rebalance_timeout_ms is not None else c.max_poll_interval_ms

    def _join_request(self) -> JoinGroupRequest:
        owned = tuple(self.subscriptions.partitions) if self.protocol == COOPERATIVE else ()
        sub = Subscription(tuple(sorted(self.subscribed_topics)), None, owned, self.generation.generation_id)
        protocols = [JoinGroupProtocol(a.name, encode_subscription(sub)) for a in self.assignors]
        return JoinGroupRequest(self.group_id, self.config.session_timeout_ms, self.generation.member_id,
                                PROTOCOL_TYPE, protocols, self._rebalance_timeout_ms(),
                                self.config.group_instance_id, self.rejoin_reason)

    async def _handle_join(self, r: JoinGroupResponse) -> JoinResult | None:
        action = action_for(JOIN_ACTIONS, r.error_code)
        if action == TAKE_MEMBER_ID:
            self.generation = Generation(NO_GENERATION, r.member_id)
            return None
        if action == RESET_MEMBER:
            self.reset_generation(f"JoinGroup: {for_code(r.error_code).name}")
            return None
        self._raise_unless_ok(action, r.error_code, "JoinGroup", r.error_message)
        self.generation = Generation(r.generation_id, r.member_id, r.protocol_name)
        self.state = MemberState.COMPLETING_REBALANCE
        self.timer.joined(time.monotonic())
        self._wake_heartbeat.set()
        generation = self.generation
        is_leader = r.leader == r.member_id
        assignments = []
        if is_leader and not r.skip_assignment:
            assignments = await self._leader_assign(r)
        elif not is_leader:
            self._assignment_snapshot = None
        sync = SyncGroupRequest(self.group_id, r.generation_id, r.member_id, assignments,
                                self.config.group_instance_id, PROTOCOL_TYPE, r.protocol_name)
        self._sync_in_flight = True
        try:
            response: SyncGroupResponse = await self._coordinator_request(sync, ApiKey.SYNC_GROUP,
                                                                          self._join_timeout_s())
        finally:
            self._sync_in_flight = False
        if self.generation != generation:
            return None  # reset meanwhile (a heartbeat's UNKNOWN_MEMBER_ID, say): join again
        action = action_for(SYNC_ACTIONS, response.error_code)
        if action in (RESET_MEMBER, REJOIN):
            if action == RESET_MEMBER:
                self.reset_generation(f"SyncGroup: {for_code(response.error_code).name}")
            return None
        self._raise_unless_ok(action, response.error_code, "SyncGroup", response.error_message)
        self.state = MemberState.STABLE
        self.timer.reset_session(time.monotonic())
        self._wake_heartbeat.set()
        return JoinResult(self.generation, response.assignment, is_leader)

    def _raise_unless_ok(self, action: str, code: int, what: str, message: str | None) -> None:
        if action == OK:
            return
        where = f"group {self.group_id!r} ({what})"
        if action in (RETRY, REDISCOVER, REJOIN):
            raise _Retry(f"{where}: {for_code(code).name}", rediscover=action == REDISCOVER)
        err = broker_error(code, where, message)
        if code == FENCED_INSTANCE_ID.code:
            err = broker_error(code, where, f"another consumer with group_instance_id "
                                            f"{self.config.group_instance_id!r} joined the group: "
                                            "each static member needs a unique group_instance_id")
        raise err

    async def _leader_assign(self, r: JoinGroupResponse) -> list[SyncGroupAssignment]:
        assignor = next((a for a in self.assignors if a.name == r.protocol_name), None)
        if assignor is None:
            raise TidelogError(f"group {self.group_id!r}: the coordinator chose assignor {r.protocol_name!r}, "
                               "which this consumer does not have")
        subscriptions = {m.member_id: decode_subscription(m.metadata, m.group_instance_id) for m in r.members}
        topics = {t for s in subscriptions.values() for t in s.topics}
        self.cluster.add_topics(topics)
        try:
            await self.cluster.refresh(timeout=self.config.request_timeout_ms / 1000)
        except TidelogError as e:
            log.warning("group %r: metadata refresh before assigning failed: %s", self.group_id, e)
        md = self.cluster.metadata
        counts = {t: len(md.partitions_for(t)) for t in topics if md.partitions_for(t) is not None}
        self._assignment_snapshot = counts
        assignment = assignor.assign(counts, subscriptions)
        log.info("group %r: leader of generation %d assigns with %s to %d members", self.group_id,
                 r.generation_id, assignor.name, len(subscriptions))
        return [SyncGroupAssignment(m, encode_assignment(a)) for m, a in assignment.items()]

    def reset_generation(self, reason: str) -> None:
        """Forget the member id and generation (the partitions count as lost) and rejoin."""
        log.info("group %r: resetting the member (%s)", self.group_id, reason)
        self.generation = NO_GENERATION_INFO
        self.state = MemberState.UNJOINED
        self.request_rejoin(reason)

    # -- coordinator discovery ------------------------------------------------------------------

    def mark_coordinator_unknown(self, reason: str) -> None:
        if self.coordinator_id is not None:
            log.info("group %r: coordinator %d unknown (%s)", self.group_id,
                     COORDINATOR_ID_BASE - self.coordinator_id, reason)
            self.cluster.close_connection(self.coordinator_id)
        self.coordinator_id = None

    async def ensure_coordinator(self, deadline: float | None, *, raise_errors: bool = True,
                                 interruptible: bool = False) -> bool:
        """Wait (until ``deadline``, trio time; None: no limit) for the coordinator, which a
        background task looks up with backoff. True once it is known. A lookup refused with a
        non-retriable error (GROUP_AUTHORIZATION_FAILED, INVALID_GROUP_ID) is raised to every
        caller while it is the latest answer (``raise_errors``; the join task and the heartbeat
        task leave that to poll and go on waiting while the lookup retries). ``interruptible``:
        poll's wait, which ``interrupt_poll`` ends too."""
        self._coordinator_waiters += 1
        try:
            while self.coordinator_id is None:
                self._spawn_once("lookup", self._lookup_coordinator)
                attempt = self._lookup_done
                limit = math.inf if deadline is None else deadline
                with self._poll_wait(limit) if interruptible else trio.move_on_at(limit):
                    await attempt.wait()
                if self.coordinator_id is None and raise_errors and self._lookup_error is not None:
                    raise self._lookup_error
                if not attempt.is_set():
                    break
            return self.coordinator_id is not None
        finally:
            self._coordinator_waiters -= 1

    async def _wait_for_coordinator(self) -> None:
        await self.ensure_coordinator(None, raise_errors=False)

    async def _lookup_coordinator(self) -> None:
        """FindCoordinator until it answers, with backoff (``retry_backoff_ms`` doubling up to
        ``retry_backoff_max_ms``), as Kafka's ensureCoordinatorReady. After a non-retriable
        answer it stops when nobody waits (the next ``ensure_coordinator`` starts it again),
        so a member whose lookup is refused neither stalls nor keeps asking unasked."""
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        while self.coordinator_id is None:
            try:
                await self._find_coordinator(self.config.request_timeout_ms / 1000)
                self._lookup_error = None
            except (BrokerConnectionError, RequestTimedOut) as e:
                self._lookup_error = None
                log.debug("group %r: no coordinator yet: %s", self.group_id, e)
            except TidelogError as e:
                self._lookup_error = None if e.retriable else e
                log.log(logging.DEBUG if e.retriable else logging.WARNING,
                        "group %r: no coordinator yet: %s", self.group_id, e)
            self._end_lookup_attempt()
            if self.coordinator_id is not None:
                return
            await trio.sleep(backoff.next_delay())
            if self._lookup_error is not None and not self._coordinator_waiters:
                return

    def _end_lookup_attempt(self) -> None:
        done, self._lookup_done = self._lookup_done, trio.Event()
        done.set()

    async def _find_coordinator(self, timeout: float) -> None:
        response: FindCoordinatorResponse = await self.cluster.request_any(
            FindCoordinatorRequest(self.group_id), api_key=ApiKey.FIND_COORDINATOR,
            timeout=min(timeout, self.config.request_timeout_ms / 1000))
        if response.error_code != NONE.code:
            raise broker_error(response.error_code, f"group {self.group_id!r} (FindCoordinator)",
                               response.error_message)
        node = COORDINATOR_ID_BASE - response.node_id
        self.cluster.add_node(node, response.host, response.port)
        self.coordinator_id = node
        self.timer.coordinator_found(time.monotonic())
        self._wake_heartbeat.set()
        log.debug("group %r: coordinator is broker %d", self.group_id, response.node_id)

    async def _coordinator_request(self, message: Message, api_key: ApiKey, timeout: float) -> Any:
        node = self.coordinator_id
        if node is None:
            raise _Retry("the coordinator is not known", rediscover=True)
        try:
            return await self.cluster.request(node, message, api_key=api_key, timeout=timeout)
        except (BrokerConnectionError, RequestTimedOut) as e:
            if self.coordinator_id == node:
                self.mark_coordinator_unknown(str(e))
            raise _Retry(f"{api_key.name} to the coordinator failed: {e}", rediscover=False) from None

    # -- heartbeats -----------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            self._wake_heartbeat = trio.Event()
            delay = await self._heartbeat_step(time.monotonic())
            with trio.move_on_after(delay):
                await self._wake_heartbeat.wait()

    async def _heartbeat_step(self, now: float) -> float:
        """One round of the heartbeat task; returns how long to sleep."""
        idle = self.config.heartbeat_interval_ms / 1000
        if not heartbeats_due(self.state, self.generation.valid, self._sync_in_flight):
            return idle
        if self.timer.poll_timeout_expired(now):
            await self._leave_for_poll_timeout()
            return idle
        if self.coordinator_id is None:
            await self.ensure_coordinator(trio.current_time() + idle, raise_errors=False)
            return 0.0 if self.coordinator_id is not None else self._backoff_s
        if self.timer.session_expired(now):
            self.mark_coordinator_unknown("no heartbeat answered within the session timeout")
            return self._backoff_s
        wait = self.timer.time_to_next_heartbeat(now)
        if wait > 0:
            return min(wait, self.timer.time_to_poll_timeout(now) + 0.001)
        await self._send_heartbeat()
        return min(idle, self.timer.time_to_poll_timeout(time.monotonic()) + 0.001)

    async def _send_heartbeat(self) -> None:
        generation = self.generation
        self.timer.sent(time.monotonic())
        try:
            r = await self._coordinator_request(
                HeartbeatRequest(self.group_id, generation.generation_id, generation.member_id,
                                 self.config.group_instance_id),
                ApiKey.HEARTBEAT, self.config.request_timeout_ms / 1000)
        except _Retry as e:
            self.timer.failed()
            log.debug("group %r: heartbeat failed: %s", self.group_id, e)
            return
        action = action_for(HEARTBEAT_ACTIONS, r.error_code)
        if action in (OK, REJOIN):
            self.timer.received(time.monotonic())  # the session is alive either way
        else:
            self.timer.failed()
        if generation != self.generation:
            return  # the member rejoined meanwhile: this answer is about the old generation
        if action == REJOIN and self.state is not MemberState.STABLE:
            log.debug("group %r: heartbeat answered REBALANCE_IN_PROGRESS while completing the "
                      "rebalance: the SyncGroup's answer decides", self.group_id)
        elif action == REJOIN:
            self.request_rejoin("the coordinator started a rebalance")
        elif action == REDISCOVER:
            self.mark_coordinator_unknown(f"heartbeat: {for_code(r.error_code).name}")
        elif action == RESET_MEMBER:
            self.reset_generation(f"heartbeat: {for_code(r.error_code).name}")
        elif action == FATAL:
            error = broker_error(r.error_code, f"group {self.group_id!r} (Heartbeat)", r.error_message)
            log.error("group %r: heartbeat failed: %s", self.group_id, error)
            self.reset_generation(f"heartbeat: {for_code(r.error_code).name}")
            self._fatal = error  # raised by the next poll (e.g. FENCED_INSTANCE_ID)

    async def _leave_for_poll_timeout(self) -> None:
        log.warning("group %r: consumer poll timeout has expired: the time between calls to poll() "
                    "exceeded max_poll_interval_ms (%d ms), probably because processing records takes "
                    "too long; leaving the group. Increase max_poll_interval_ms or reduce "
                    "max_poll_records.", self.group_id, self.config.max_poll_interval_ms)
        await self.maybe_leave_group("consumer poll timeout has expired")
        self._left_for_poll_timeout = True

    async def maybe_leave_group(self, reason: str) -> None:
        """Send LeaveGroup (dynamic members only, as Kafka) and forget the generation."""
        if self._join_scope is not None:
            self._join_scope.cancel()
            if self.coordinator_id is not None:  # its JoinGroup would hold up the LeaveGroup
                self.cluster.close_connection(self.coordinator_id)
        generation = self.generation
        if generation.member_id and not self.is_static and self.coordinator_id is not None:
            request = LeaveGroupRequest(self.group_id, [MemberIdentity(generation.member_id, None, reason)])
            try:
                with trio.move_on_after(self.config.request_timeout_ms / 1000):
                    await self._coordinator_request(request, ApiKey.LEAVE_GROUP,
                                                    self.config.request_timeout_ms / 1000)
            except _Retry as e:
                log.info("group %r: LeaveGroup failed (the session will expire instead): %s", self.group_id, e)
        self.generation = NO_GENERATION_INFO
        self.state = MemberState.UNJOINED
        self.rejoin_needed, self.rejoin_reason = True, reason

    # -- leaving (unsubscribe, close) -----------------------------------------------------------

    async def leave(self, reason: str, *, commit: bool) -> None:
        """Revoke (or lose) the assignment through the listener, then leave the group."""
        owned = frozenset(self.subscriptions.partitions)
        if self.is_managed:
            if commit and self.generation.valid:
                await self._commit_before_rebalance()
            method = "on_partitions_revoked" if self.generation.valid else "on_partitions_lost"
            try:
                await self._call_listener(method, owned)
            finally:
                self._drop_partitions(owned)
                await self.maybe_leave_group(reason)
                self._join_done = self._prepare_commit = None
        elif commit:
            await self._commit_before_rebalance()

    def unsubscribe_state(self) -> None:
        self.subscribed_topics = set()
        self.pattern = None
        self._assignment_snapshot = None

    # -- commits --------------------------------------------------------------------------------

    def _commit_generation(self) -> Generation:
        if not self.is_managed:
            return NO_GENERATION_INFO  # manual assignment: allowed while the group is empty
        if self.state in (MemberState.PREPARING_REBALANCE, MemberState.COMPLETING_REBALANCE):
            raise RebalanceInProgressError(
                f"commit of group {self.group_id!r} not done: the group is rebalancing. Call poll() "
                "to complete the rebalance (on_partitions_revoked is the place to commit before "
                "partitions move), then commit again.")
        if not self.generation.valid:
            raise CommitFailedError(commit_failed_message(
                self.group_id, "this member is no longer part of an active generation"
                + (": it left after max_poll_interval_ms without a poll" if self._left_for_poll_timeout else "")))
        return self.generation

    async def commit(self, offsets: Mapping[TopicPartition, int], deadline: float) -> None:
        """Commit ``offsets`` (the next offset to read, per partition) and wait for the
        coordinator's answer, retrying coordinator moves until ``deadline`` (trio time)."""
        if not offsets:
            return
        for tp, offset in offsets.items():
            if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
                raise ValueError(f"offset to commit for {tp} must be an int >= 0, got {offset!r}")
        self._commit_seq += 1
        seq = self._commit_seq
        generation = self._commit_generation()
        for tp, offset in offsets.items():
            self._requested[tp] = (seq, offset, generation)
        with trio.move_on_at(deadline) as waiting:  # an earlier commit may hold the lock: wait only this long
            await self._commit_lock.acquire()
        if waiting.cancelled_caught:
            raise RequestTimedOut(f"commit of group {self.group_id!r} did not start in time: an earlier "
                                  "commit of this consumer was still waiting for the coordinator")
        try:
            fresh = not_superseded(offsets, seq, self._sent_seq)
            if not fresh:
                return
            sending, seqs = coalesce_commit(fresh, seq, generation, self._requested)
            await self._commit_with_retries(sending, generation, deadline)
            for tp, offset in sending.items():
                self._sent_seq[tp] = max(self._sent_seq.get(tp, 0), seqs[tp])
                self.committed[tp] = offset
        finally:
            self._commit_lock.release()

    async def _commit_with_retries(self, offsets: dict[TopicPartition, int], generation: Generation,
                                   deadline: float) -> None:
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        last: BaseException | None = None
        while True:
            if generation != NO_GENERATION_INFO and generation != self.generation:
                raise CommitFailedError(commit_failed_message(self.group_id, "the member's generation changed"))
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise RequestTimedOut(f"commit of group {self.group_id!r} did not complete in time "
                                      f"(last error: {last or 'none'})")
            try:
                with trio.fail_after(remaining):
                    await self.ensure_coordinator(deadline)
                    r = await self._coordinator_request(_commit_request(self.group_id, offsets, generation,
                                                                        self.config.group_instance_id),
                                                        ApiKey.OFFSET_COMMIT,
                                                        min(remaining, self.config.request_timeout_ms / 1000))
                self._absorb_commit(r, generation)
                return
            except trio.TooSlowError:
                last = RequestTimedOut("the coordinator did not answer")
            except _Retry as e:
                last = e
                if e.rediscover:
                    self.mark_coordinator_unknown(str(e))
            with trio.move_on_at(deadline):
                await trio.sleep(backoff.next_delay())

    def _absorb_commit(self, r: OffsetCommitResponse, generation: Generation) -> None:
        for t in r.topics:
            for p in t.partitions:
                action = action_for(COMMIT_ACTIONS, p.error_code)
                if action == OK:
                    continue
                name = for_code(p.error_code).name
                if action in (RETRY, REDISCOVER):
                    raise _Retry(f"OffsetCommit {t.name}-{p.partition_index}: {name}", rediscover=action == REDISCOVER)
                if action == RESET_MEMBER and generation.valid:
                    if generation == self.generation:
                        self.reset_generation(f"OffsetCommit: {name}")
                    raise CommitFailedError(commit_failed_message(self.group_id, f"the coordinator answered {name}"),
                                            error=for_code(p.error_code))
                if action == RESET_MEMBER:
                    raise CommitFailedError(
                        f"commit of group {self.group_id!r} refused ({name}): the group has active members, "
                        "and a consumer with assign() (no group membership) can commit offsets to a group "
                        "only while it has none. Use another group_id, or subscribe() to join the group.",
                        error=for_code(p.error_code))
                if action == REJOIN and generation.valid:
                    self.request_rejoin("the coordinator is rebalancing the group")
                    raise RebalanceInProgressError(
                        f"commit of group {self.group_id!r} not done: the group started rebalancing. "
                        "Call poll() to complete the rebalance, then commit again (or commit in "
                        "on_partitions_revoked).")
                raise broker_error(p.error_code, f"group {self.group_id!r} commit for {t.name}-{p.partition_index}",
                                   p.error_message)

    def commit_async(self, offsets: Mapping[TopicPartition, int], callback: Callable | None) -> None:
        """Send a commit in the background; ``callback(offsets, error_or_None)`` runs in a
        later poll (or commit), like Kafka's OffsetCommitCallback."""
        offsets = dict(offsets)

        async def run() -> None:
            error: BaseException | None = None
            try:
                await self.commit(offsets, trio.current_time() + self.config.request_timeout_ms / 1000)
            except TidelogError as e:
                error = e
                log.warning("group %r: asynchronous commit failed: %s", self.group_id, e)
            if callback is not None:
                self._completed_commits.append((callback, offsets, error))

        self._nursery.start_soon(run)

    async def invoke_completed_commits(self) -> None:
        while self._completed_commits:
            callback, offsets, error = self._completed_commits.pop(0)
            await self._invoke(callback, offsets, error)

    def _maybe_auto_commit(self) -> None:
        if not self.config.enable_auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        if self.is_managed and (self.state is not MemberState.STABLE or not self.generation.valid):
            return
        offsets = auto_commit_offsets(self.subscriptions.consumed_positions(), self.committed)
        if offsets:
            self.commit_async(offsets, None)

    # -- committed offsets ----------------------------------------------------------------------

    async def fetch_committed(self, partitions: Iterable[TopicPartition], deadline: float
                              ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None: nothing committed)."""
        wanted = list(dict.fromkeys(partitions))
        if not wanted:
            return {}
        by_topic: dict[str, list[int]] = {}
        for tp in wanted:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        request = OffsetFetchRequest(self.group_id, [OffsetFetchTopic(t, ps) for t, ps in by_topic.items()])
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        last: BaseException | None = None
        while True:
            if not await self.ensure_coordinator(deadline):
                raise RequestTimedOut(f"no coordinator for group {self.group_id!r} found in time "
                                      f"(last error: {last or 'none'})")
            try:
                r: OffsetFetchResponse = await self._coordinator_request(
                    request, ApiKey.OFFSET_FETCH,
                    max(0.001, min(deadline - trio.current_time(), self.config.request_timeout_ms / 1000)))
                return self._absorb_offset_fetch(r, set(wanted))
            except _Retry as e:
                last = e
                if e.rediscover:
                    self.mark_coordinator_unknown(str(e))
            if trio.current_time() + backoff.initial_s >= deadline:
                raise RequestTimedOut(f"committed offsets of group {self.group_id!r} not fetched in time "
                                      f"(last error: {last})")
            with trio.move_on_at(deadline):
                await trio.sleep(backoff.next_delay())

    def _absorb_offset_fetch(self, r: OffsetFetchResponse, wanted: set[TopicPartition]
                             ) -> dict[TopicPartition, int | None]:
        errors = [r.error_code] + [p.error_code for t in r.topics for p in t.partitions]
        for code in errors:
            if code == NONE.code:
                continue
            action = action_for(COMMIT_ACTIONS, code)
            if action in (RETRY, REDISCOVER):
                raise _Retry(f"OffsetFetch: {for_code(code).name}", rediscover=action == REDISCOVER)
            raise broker_error(code, f"group {self.group_id!r} (OffsetFetch)")
        out: dict[TopicPartition, int | None] = {tp: None for tp in wanted}
        for t in r.topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                if tp in wanted:
                    out[tp] = None if p.committed_offset == NO_OFFSET else p.committed_offset
        return out

    async def _refresh_committed_positions(self) -> None:
        """New partitions start at the committed offset, else per auto_offset_reset."""
        waiting = self.subscriptions.awaiting_committed()
        asked = {tp: self.subscriptions.partitions[tp] for tp in waiting}
        try:
            found = await self.fetch_committed(waiting, trio.current_time() + self.config.request_timeout_ms / 1000)
        except (RequestTimedOut, BrokerConnectionError) as e:
            log.debug("group %r: committed offsets not fetched yet: %s", self.group_id, e)
            return
        except TidelogError as e:
            self._fatal = e
            return
        for tp, offset in found.items():
            state = self.subscriptions.partitions.get(tp)
            if state is not asked[tp] or not state.awaiting_committed:
                continue  # revoked (maybe assigned again: ask again), or the application seeked meanwhile
            if offset is not None:
                self.committed[tp] = offset
                state.seek(offset)
            else:
                self.subscriptions.reset_to_default(tp)
        self._wake_fetcher()


class _Retry(Exception):
    """A retriable failure inside the group protocol (never escapes this module)."""

    def __init__(self, message: str, *, rediscover: bool):
        super().__init__(message)
        self.rediscover = rediscover


def _commit_request(group_id: str, offsets: Mapping[TopicPartition, int], generation: Generation,
                    group_instance_id: str | None) -> OffsetCommitRequest:
    by_topic: dict[str, list[OffsetCommitPartition]] = {}
    for tp, offset in sorted(offsets.items()):
        by_topic.setdefault(tp.topic, []).append(OffsetCommitPartition(tp.partition, offset))
    return OffsetCommitRequest(group_id, [OffsetCommitTopic(t, ps) for t, ps in by_topic.items()],
                               generation.generation_id, generation.member_id,
                               group_instance_id if generation.valid else None)


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps)) or "nothing"


async def call_maybe_async(fn: Callable, *args: Any) -> Any:
    """Call a listener or callback that may be plain or ``async def``."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
