"""Consumer group membership: Kafka's ConsumerCoordinator (and AbstractCoordinator), on Trio.

The member is split by concern:

* ``tidelog.aio.membership``: the member's state machine (UNJOINED, PREPARING_REBALANCE,
  COMPLETING_REBALANCE, STABLE; ``VALID_PREVIOUS_STATES``), its generation, the error-code
  tables per request and the pure rebalance decisions (``prepare_join``, ``complete_join``);
* ``tidelog.aio.discovery``: finding the coordinator (``CoordinatorLink``) and requests to it;
* ``tidelog.aio.heartbeat``: the heartbeat task and its timer, independent of poll;
* ``tidelog.aio.commits``: commits (ordered, never backwards) and committed offsets;
* this module: ``ConsumerCoordinator``, which drives the rebalance from ``poll`` and wires
  the parts together through their constructors.

Theory of operation.

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
  added ones are passed to ``on_partitions_assigned``. New partitions start at the group's
  committed offset (OffsetFetch), else per ``auto_offset_reset``.
* A member that goes ``max_poll_interval_ms`` without a poll leaves the group (LeaveGroup,
  dynamic members only, as Kafka does; the heartbeat task notices) and forgets its
  generation, so the next poll reports the partitions lost and rejoins.
* Commits (``OffsetCommitter``) carry the member's generation; a commit refused because the
  group moved on resets or rejoins the member through the callbacks it was given.
* Static members (``group_instance_id``) do not send LeaveGroup when they close, so a
  restart within the session timeout gets the same member slot and assignment back without a
  rebalance (the coordinator answers its JoinGroup with the current generation).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import trio

from tidelog.aio.assignors import (
    COOPERATIVE,
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
from tidelog.aio.commits import OffsetCommitter, auto_commit_offsets
from tidelog.aio.discovery import CoordinatorLink, GroupRetry
from tidelog.aio.heartbeat import Heartbeat, HeartbeatTimer
from tidelog.aio.membership import (
    JOIN_ACTIONS,
    OK,
    REDISCOVER,
    REJOIN,
    RESET_MEMBER,
    RETRY,
    SYNC_ACTIONS,
    TAKE_MEMBER_ID,
    Effect,
    Generation,
    Membership,
    MemberState,
    action_for,
    complete_join,
    prepare_join,
)
from tidelog.aio.subscription import ConsumerConfig, SubscriptionState
from tidelog.errors import (
    CallbackNotRunError,
    TidelogError,
    broker_error,
)
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    FENCED_INSTANCE_ID,
    for_code,
)
from tidelog.protocol.messages import (
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberIdentity,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
)
from tidelog.protocol.topics import TopicPartition

__all__ = ["ConsumerRebalanceListener", "ConsumerCoordinator", "matching_topics", "call_maybe_async"]

log = logging.getLogger(__name__)

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




def matching_topics(pattern: re.Pattern[str], metadata: ClusterMetadata,
                    exclude_internal: bool = True) -> set[str]:
    """The topics a pattern subscription covers (fullmatch, as Java's Pattern.matches);
    internal topics (as the broker's metadata marks them) only with ``exclude_internal`` off."""
    return {name for name, t in metadata.topics.items()
            if pattern.fullmatch(name) and not (exclude_internal and t.is_internal)}




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
        self.member = Membership()
        self.subscribed_topics: set[str] = set()
        self.pattern: re.Pattern[str] | None = None
        self.listener: ConsumerRebalanceListener = ConsumerRebalanceListener()
        self.timer = HeartbeatTimer(config.session_timeout_ms / 1000, config.heartbeat_interval_ms / 1000,
                                    config.max_poll_interval_ms / 1000, time.monotonic())
        self._backoff_s = config.retry_backoff_ms / 1000
        self._backoff_max_s = config.retry_backoff_max_ms / 1000
        self._join_done: trio.Event | None = None
        self._prepare_commit: trio.Event | None = None  # set when the commit before a rebalance ended
        self._join_outcome: JoinResult | BaseException | None = None
        self._join_scope: trio.CancelScope | None = None
        self._assignment_snapshot: dict[str, int] | None = None  # leader: partition counts assigned
        # on_partitions_assigned of a completed join that has not run yet (its generation, the
        # partitions): set until it returns or raises its own error (_invoke_partitions_assigned)
        self._pending_assigned: tuple[Generation, frozenset[TopicPartition]] | None = None
        self._sync_in_flight = False  # no heartbeat then: its answer would wait behind the SyncGroup's
        self._nursery: trio.Nursery | None = None
        self._pattern_refreshed = -float("inf")
        self._left_for_poll_timeout = False
        self._running: set[str] = set()  # names of background tasks under way
        self.poll_interrupted = False  # the consumer's wakeup(): poll's waits end (interrupt_poll)
        self._poll_waits: set[trio.CancelScope] = set()
        self._fatal: TidelogError | None = None  # raised by the next poll
        self.link = CoordinatorLink(cluster, config.group_id, request_timeout_s=config.request_timeout_ms / 1000,
                                    backoff_s=self._backoff_s, backoff_max_s=self._backoff_max_s,
                                    spawn_once=self._spawn_once, poll_wait=self._poll_wait,
                                    on_found=self._coordinator_found)
        self.heartbeat = Heartbeat(config, self.link, self.member, self.timer,
                                   sync_in_flight=lambda: self._sync_in_flight, request_rejoin=self.request_rejoin,
                                   reset_generation=self.reset_generation, on_fatal=self._set_fatal,
                                   leave_for_poll_timeout=self._leave_for_poll_timeout)
        self.offsets = OffsetCommitter(config, self.link, self.member, subscriptions,
                                       is_managed=lambda: self.is_managed,
                                       left_for_poll_timeout=lambda: self._left_for_poll_timeout,
                                       reset_generation=self.reset_generation, request_rejoin=self.request_rejoin,
                                       invoke=invoke, wake_fetcher=wake_fetcher, on_fatal=self._set_fatal,
                                       start_soon=lambda fn: self._nursery.start_soon(fn))

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        nursery.start_soon(self.heartbeat.run)

    @property
    def state(self) -> MemberState:
        return self.member.state

    @property
    def generation(self) -> Generation:
        return self.member.generation

    @property
    def rejoin_needed(self) -> bool:
        return self.member.rejoin_needed

    @property
    def committed(self) -> dict[TopicPartition, int]:
        """The group's committed offsets as last seen."""
        return self.offsets.committed

    @property
    def coordinator_id(self) -> int | None:
        return self.link.coordinator_id

    def _coordinator_found(self) -> None:
        self.timer.coordinator_found(time.monotonic())
        self.heartbeat.wake()

    def _set_fatal(self, error: TidelogError) -> None:
        self._fatal = error

    def _apply(self, effects: Iterable[Effect]) -> None:
        """Carry out what the member's state machine asks."""
        for effect in effects:
            if effect is Effect.WAKE_POLL:
                self.wake_poll()
            elif effect is Effect.START_SESSION:
                self.timer.joined(time.monotonic())
                self.heartbeat.wake()
            elif effect is Effect.RENEW_SESSION:
                self.timer.reset_session(time.monotonic())
                self.heartbeat.wake()

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
        self._apply(self.member.request_rejoin(reason))

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
        await self.offsets.invoke_completed_commits()
        if self.is_managed:
            if self._pending_assigned is not None and not await self._invoke_missed_assigned():
                return  # it could not run now either: no records until it does
            self._maybe_refresh_pattern()
            if self.pattern is not None and self._pattern_refreshed == -float("inf"):
                return  # join once the pattern has been matched against the cluster's topics
            self._check_metadata_changes()
            if not await self.link.ensure(deadline, interruptible=True):
                return
            if self._join_done is None and self.member.wants_join():
                await self._prepare_and_start_join(deadline)
            if self._join_done is not None:
                with self._poll_wait(deadline):
                    await self._join_done.wait()
                if self._join_done.is_set():
                    await self._finish_join()
        if self.subscriptions.awaiting_committed():
            self._spawn_once("committed", self.offsets.refresh_committed_positions)
        self.offsets.maybe_auto_commit()

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
            self._apply(self.member.join_started())
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
        """Whether poll must not hand out records now: the commit before a rebalance is under
        way, or the assigned partitions' ``on_partitions_assigned`` has not run yet."""
        return (self._pending_assigned is not None
                or self._prepare_commit is not None and not self._prepare_commit.is_set())

    async def _commit_before_rebalance(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        if offsets is None:
            offsets = auto_commit_offsets(self.subscriptions.consumed_positions(), self.committed)
        if not offsets:
            return
        try:
            await self.offsets.commit(offsets, deadline=trio.current_time() + self.config.request_timeout_ms / 1000)
        except TidelogError as e:
            log.warning("group %r: automatic commit before the rebalance failed: %s", self.group_id, e)

    async def _finish_join(self) -> None:
        outcome, self._join_done, self._join_outcome = self._join_outcome, None, None
        if isinstance(outcome, BaseException):
            if not self.rejoin_needed:
                log.info("group %r: rejoining (the last join failed)", self.group_id)
            self._apply(self.member.join_failed())
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
        await self._invoke_partitions_assigned(done.added)

    async def _invoke_partitions_assigned(self, added: frozenset[TopicPartition]) -> None:
        """``on_partitions_assigned(added)``, once. The join's result is used up by then (the
        assignment is applied), so a call that does not run to its end stays pending and the
        next poll makes it (``_invoke_missed_assigned``), as Kafka's consumer calls
        onJoinComplete again when its listener was woken up or interrupted: the poll was
        cancelled (or interrupted by the facade's caller) meanwhile, or the facade could not
        run it (CallbackNotRunError: its caller had left). A listener's own error is raised
        by this poll and the call is not repeated."""
        self._pending_assigned = (self.generation, frozenset(added))
        try:
            await self._call_listener("on_partitions_assigned", added)
        except CallbackNotRunError as e:
            log.info("group %r: on_partitions_assigned did not run (%s); the next poll runs it", self.group_id, e)
            return
        except Exception:
            self._pending_assigned = None
            raise
        self._pending_assigned = None

    async def _invoke_missed_assigned(self) -> bool:
        """The next poll's part of ``_invoke_partitions_assigned``: run the pending call for
        the partitions still assigned, unless the member rejoined or was reset since (the
        partitions went with that generation). False if it did not run this time either."""
        generation, added = self._pending_assigned
        if generation != self.generation or self.state is not MemberState.STABLE:
            self._pending_assigned = None
            return True
        await self._invoke_partitions_assigned(added & set(self.subscriptions.partitions))
        return self._pending_assigned is None

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
            await self.link.ensure(None, raise_errors=False)
            self.member.transition_to(MemberState.PREPARING_REBALANCE)
            try:
                response = await self.link.request(self._join_request(), ApiKey.JOIN_GROUP,
                                                           self._join_timeout_s())
                result = await self._handle_join(response)
                if result is not None:
                    return result
                if not self.generation.valid and self.subscriptions.partitions:
                    # reset while owning partitions (UNKNOWN_MEMBER_ID, a heartbeat's reset):
                    # they are lost, not claimed by a member without a generation (another
                    # may own them already); the next poll's preparation loses and drops
                    # them before joining again (Kafka's onJoinPrepare)
                    return None
                self._apply(self.member.join_retrying())
                continue  # MEMBER_ID_REQUIRED / reset: rejoin at once
            except GroupRetry as r:
                if r.rediscover:
                    self.link.mark_unknown(str(r))
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
                                self.config.group_instance_id, self.member.rejoin_reason)

    async def _handle_join(self, r: JoinGroupResponse) -> JoinResult | None:
        action = action_for(JOIN_ACTIONS, r.error_code)
        if action == TAKE_MEMBER_ID:
            self._apply(self.member.take_member_id(r.member_id))
            return None
        if action == RESET_MEMBER:
            self.reset_generation(f"JoinGroup: {for_code(r.error_code).name}")
            return None
        self._raise_unless_ok(action, r.error_code, "JoinGroup", r.error_message)
        self._apply(self.member.joined(Generation(r.generation_id, r.member_id, r.protocol_name)))
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
            response: SyncGroupResponse = await self.link.request(sync, ApiKey.SYNC_GROUP,
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
        self._apply(self.member.synced())
        return JoinResult(self.generation, response.assignment, is_leader)

    def _raise_unless_ok(self, action: str, code: int, what: str, message: str | None) -> None:
        if action == OK:
            return
        where = f"group {self.group_id!r} ({what})"
        if action in (RETRY, REDISCOVER, REJOIN):
            raise GroupRetry(f"{where}: {for_code(code).name}", rediscover=action == REDISCOVER)
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

    def reset_generation(self, reason: str, *, keep_member_id: bool = False) -> None:
        """Forget the generation (the partitions count as lost), the member id too unless
        ``keep_member_id``, and rejoin."""
        log.info("group %r: resetting the member (%s)", self.group_id, reason)
        if not self.rejoin_needed:
            log.info("group %r: rejoining (%s)", self.group_id, reason)
        self._apply(self.member.reset(reason, keep_member_id=keep_member_id))

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
            self.link.close_connection()  # its JoinGroup would hold up the LeaveGroup
        generation = self.generation
        if generation.member_id and not self.is_static and self.coordinator_id is not None:
            request = LeaveGroupRequest(self.group_id, [MemberIdentity(generation.member_id, None, reason)])
            try:
                with trio.move_on_after(self.config.request_timeout_ms / 1000):
                    await self.link.request(request, ApiKey.LEAVE_GROUP,
                                                    self.config.request_timeout_ms / 1000)
            except (GroupRetry, TidelogError) as e:  # an error answer too: never the heartbeat task's end
                log.info("group %r: LeaveGroup failed (the session will expire instead): %s", self.group_id, e)
        self._apply(self.member.left(reason))

    # -- leaving (unsubscribe, close) -----------------------------------------------------------

    async def leave(self, reason: str, *, commit: bool) -> None:
        """Revoke (or lose) the assignment through the listener, then leave the group."""
        owned = frozenset(self.subscriptions.partitions)
        if self.is_managed:
            if commit and self.generation.valid:
                await self._commit_before_rebalance()
            method = "on_partitions_revoked" if self.generation.valid else "on_partitions_lost"
            self._pending_assigned = None  # the partitions go: whatever was not called is moot
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



def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps)) or "nothing"


async def call_maybe_async(fn: Callable, *args: Any) -> Any:
    """Call a listener or callback that may be plain or ``async def``."""
    result = fn(*args)
    if inspect.isawaitable(result):
        result = await result
    return result
