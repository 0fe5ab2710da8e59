"""The Trio consumer: the facade over subscription state, the fetcher and the group member.

Theory of operation.

* ``tidelog.aio.subscription`` holds the configuration and the assignment with each
  partition's position (pure); ``tidelog.aio.fetcher`` fetches for it in a background task
  and buffers what comes back; ``tidelog.aio.group`` joins a group and commits offsets.
  This module wires them together and adds what applications call: ``assign``/``subscribe``,
  ``seek``, ``pause``, ``poll``, the offset lookups and commits.
* ``poll`` hands out buffered records (``Fetcher.drain``) and raises, once, an error a fetch
  ran into; with nothing buffered it waits until the fetcher signals data or its deadline.
* Consumer groups (``group_id`` with ``subscribe``): ``ConsumerCoordinator`` joins the group,
  heartbeats in its own task, and in ``poll`` runs rebalances (the listener's callbacks), the
  automatic commit and the lookup of committed offsets. A partition the group assigns starts
  *awaiting its committed offset* (``PartitionState.awaiting_committed``), and so does one
  given to ``assign`` with a ``group_id`` (the consumer then uses the group to store and read
  offsets, without joining it), as in Kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from tidelog.aio._lifecycle import RunsInOwnNursery
from tidelog.aio.cluster import Backoff, Cluster, list_offsets
from tidelog.aio.fetcher import (
    CompletedFetch,
    Fetcher,
    FetchPlan,
    PartitionOutcome,
    handle_partition_response,
    plan_fetches,
)
from tidelog.aio.group import ConsumerCoordinator, ConsumerRebalanceListener, call_maybe_async
from tidelog.aio.subscription import (
    RESET_STRATEGIES,
    ConsumerConfig,
    PartitionState,
    SubscriptionState,
    rewind_offsets,
)
from tidelog.errors import (
    ClientClosedError,
    NoOffsetForPartitionError,
    RecordDeserializationError,
    TidelogError,
    WakeupError,
    broker_error,
)
from tidelog.protocol.errors import UNKNOWN_TOPIC_OR_PARTITION
from tidelog.protocol.messages import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from tidelog.protocol.topics import TopicPartition
from tidelog.records import ConsumerRecords, OffsetAndMetadata, Record

if TYPE_CHECKING:
    from typing import Unpack

    from tidelog.options import ConsumerConfigOptions

# ConsumerConfig, SubscriptionState, PartitionState and the fetch decisions are re-exported
# from here, where applications and tools import them.
__all__ = ["AsyncConsumer", "ConsumerConfig", "SubscriptionState", "PartitionState",
           "CompletedFetch", "FetchPlan", "PartitionOutcome", "plan_fetches",
           "handle_partition_response", "OffsetAndTimestamp", "Metrics", "split_commit", "rewind_offsets"]

log = logging.getLogger(__name__)


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


class Metrics(dict):
    """The consumer's gauges, flat (``metrics["records_lag_max"]``, as before), and callable
    for kafka-python's shape: ``metrics()`` is ``{group: {name: value}}`` with Kafka's
    names (``consumer-fetch-manager-metrics``: ``records-lag-max``, ``fetch-rate``,
    ``records-consumed-rate``, ...; ``fetch`` holds those of ``ConsumerStats``)."""

    fetch: dict[str, float]

    def __call__(self, raw: bool = False) -> dict[str, dict[str, float]]:
        return {"consumer-metrics": {"assigned-partitions": self["assigned_partitions"]},
                "consumer-fetch-manager-metrics": {
                    **getattr(self, "fetch", {}),
                    "records-lag-max": self["records_lag_max"],
                    "partitions-high-watermark-held": self["partitions_high_watermark_held"]}}


def split_commit(offsets: dict[Any, Any]) -> tuple[dict[TopicPartition, int], dict[TopicPartition, str | None]]:
    """``{partition: offset or OffsetAndMetadata}`` -> (offsets, metadata strings); a plain
    int commits no metadata."""
    plain: dict[TopicPartition, int] = {}
    metadata: dict[TopicPartition, str | None] = {}
    for tp, value in offsets.items():
        tp = TopicPartition(*tp)
        if isinstance(value, tuple):  # OffsetAndMetadata, or kafka-python's own
            plain[tp] = value[0]
            metadata[tp] = value[1] if len(value) > 1 else None
        else:
            plain[tp] = value
    return plain, metadata


# ---------------------------------------------------------------------------------------------
# the consumer


class AsyncConsumer(RunsInOwnNursery):
    """A Trio consumer: manual assignment (``assign``), or a member of a consumer group
    (``group_id`` + ``subscribe``). Use ``async with AsyncConsumer(...) as c:`` or
    ``await nursery.start(consumer.run)`` ... ``await consumer.close()``.

    Rebalance listener methods and ``commit_async`` callbacks run inside ``poll`` (and
    ``close``/``unsubscribe``), on the Trio thread; they may be ``async def``."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", *,
                 key_deserializer: Callable[[Any], Any] | None = None,
                 value_deserializer: Callable[[Any], Any] | None = None,
                 invoke_callback: Callable[..., Awaitable[Any]] | None = None,
                 **options: Unpack[ConsumerConfigOptions]):
        """``options``: ``ConsumerConfig``'s. ``key_deserializer`` / ``value_deserializer``
        turn each record's key / value bytes (or None) into what ``poll`` hands out, as
        kafka-python's; without them records carry bytes and nothing is called.
        ``invoke_callback(fn, *args)`` runs a rebalance listener method or commit callback
        (default: on the Trio thread, awaited if async)."""
        self.config = config = ConsumerConfig(bootstrap_servers=bootstrap_servers, **options)
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._deserializing = key_deserializer is not None or value_deserializer is not None
        self._cluster = Cluster(config.bootstrap_servers, client_id=config.client_id,
                                request_timeout_ms=config.request_timeout_ms,
                                retry_backoff_ms=config.retry_backoff_ms,
                                retry_backoff_max_ms=config.retry_backoff_max_ms,
                                metadata_max_age_ms=config.metadata_max_age_ms,
                                allow_auto_topic_creation=config.allow_auto_create_topics, security=config)
        self._subscriptions = SubscriptionState(RESET_STRATEGIES[config.auto_offset_reset])
        self._fetcher = Fetcher(self._cluster, config, self._subscriptions,
                                list_offsets=self._list_offsets, on_data=self._signal_data)
        self._wakeup_pending = False  # wakeup() was called: the current or next poll raises
        self._data = trio.Event()  # poll's: data or an error arrived
        self._poll_waiter: tuple[int, Callable[[Any], Any]] | None = None  # see add_poll_waiter
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._closed = False
        self._stopped = trio.Event()
        self._backoff_s = config.retry_backoff_ms / 1000
        self._cluster.add_listener(lambda _m: self._fetcher.wake())
        # how listener and commit callbacks run: the blocking facade runs them on its caller's thread
        self.invoke_callback = invoke_callback or call_maybe_async
        self._coordinator: ConsumerCoordinator | None = None
        if config.group_id is not None:
            self._coordinator = ConsumerCoordinator(self._cluster, config, self._subscriptions,
                                                    invoke=self.invoke_callback, wake_fetcher=self._fetcher.wake,
                                                    wake_poll=self._signal_data)

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._started:
            raise RuntimeError("this consumer was already started")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._cluster.run)
                await nursery.start(self._fetcher.run)
                if self._coordinator is not None:
                    self._coordinator.start(nursery)
                task_status.started()
        finally:
            self._closed = True
            self._data.set()
            self._serve_poll_waiter()
            self._stopped.set()

    async def close(self, timeout_ms: int | None = None) -> None:
        """Close: with a group, first commit the consumed positions (when auto-commit is on),
        run ``on_partitions_revoked`` and leave the group (static members do not leave: a
        restart within the session timeout keeps their assignment), all within
        ``timeout_ms`` (default 30 s). Before that, as Kafka's close, it waits (within the same
        time) for the ``commit_async`` commits in flight and runs their callbacks: those not
        done by then get ClientClosedError. An exception a callback raises is raised once
        the consumer is closed."""
        callback_error: Exception | None = None
        if self._coordinator is not None and self._started and not self._closed and self._nursery is not None:
            deadline = trio.current_time() + (30000 if timeout_ms is None else timeout_ms) / 1000
            callback_error = await self._coordinator.offsets.settle_async_commits(deadline)
            with trio.move_on_at(deadline):
                try:
                    await self._coordinator.leave("the consumer is closing",
                                                  commit=self.config.enable_auto_commit)
                except TidelogError as e:
                    log.warning("leaving group %r on close: %s", self.config.group_id, e)
        self._closed = True
        self._data.set()
        self._serve_poll_waiter()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        if self._started:
            with trio.CancelScope(shield=True):
                await self._stopped.wait()
        if callback_error is not None:
            raise callback_error

    @property
    def closed(self) -> bool:
        return self._closed

    # -- assignment and positions ---------------------------------------------------------------

    # -- consumer groups ------------------------------------------------------------------------

    def _group(self, what: str) -> ConsumerCoordinator:
        if self._coordinator is None:
            raise ValueError(f"{what} needs a consumer group: create the consumer with group_id=...")
        return self._coordinator

    def subscribe(self, topics: Sequence[str] | None = None, pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join the group for ``topics`` (a list) or every topic matching ``pattern`` (a regular
        expression, matched against the cluster's topics on each metadata refresh,
        ``metadata_max_age_ms``). Replaces an earlier subscription; takes effect in the next
        poll. ``listener`` gets the rebalance callbacks."""
        group = self._group("subscribe()")
        if self._subscriptions.partitions and not group.is_managed:
            raise ValueError("subscribe() and assign() are mutually exclusive: call unsubscribe() first")
        group.subscribe(topics, pattern, listener)
        self._fetcher.wake()

    def subscription(self) -> set[str]:
        return set(self._coordinator.subscribed_topics) if self._coordinator is not None else set()

    async def unsubscribe(self) -> None:
        """Give up the subscription: revoke the partitions (listener), leave the group and
        clear the assignment. Also clears a manual assignment."""
        self._require_running()
        if self._coordinator is not None and self._coordinator.is_managed:
            await self._coordinator.leave("the consumer unsubscribed", commit=self.config.enable_auto_commit)
            self._coordinator.unsubscribe_state()
        self._subscriptions.assign([])
        self._cluster.set_topics(())

    async def commit(self, offsets: dict[TopicPartition, int | OffsetAndMetadata] | None = None,
                     timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` ({partition: next offset to read, or an OffsetAndMetadata whose
        metadata string the coordinator stores with it}), or the consumed position of every
        assigned partition, and wait for the coordinator to store them. A commit the group
        refuses because it rebalanced raises CommitFailedError (RebalanceInProgressError
        while a rebalance is under way: poll, then commit again); metadata over the broker's
        ``offset.metadata.max.bytes`` is refused (OFFSET_METADATA_TOO_LARGE)."""
        self._require_running()
        group = self._group("commit()")
        await group.offsets.invoke_completed_commits()
        wanted, metadata = self._offsets_to_commit(offsets)
        await group.offsets.commit(wanted, trio.current_time() + self._deadline_s(timeout_ms), metadata)

    def commit_async(self, offsets: dict[TopicPartition, int | OffsetAndMetadata] | None = None,
                     callback: Any = None) -> None:
        """Commit in the background; ``callback(offsets, exception_or_None)`` runs in a later
        ``poll`` or ``commit``. Commits are applied in the order they were made."""
        self._require_running()
        wanted, metadata = self._offsets_to_commit(offsets)
        self._group("commit_async()").offsets.commit_async(wanted, callback, metadata,
                                                           None if offsets is None else offsets)

    def _offsets_to_commit(self, offsets: dict[TopicPartition, Any] | None
                           ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, str | None]]:
        if offsets is None:
            return self._subscriptions.consumed_positions(), {}
        return split_commit(offsets)

    async def committed(self, partitions: TopicPartition | Iterable[TopicPartition],
                        timeout_ms: int | None = None, *, metadata: bool = False) -> Any:
        """The group's committed offset (next offset to read; None: nothing committed) of a
        partition, or ``{partition: offset}`` for an iterable of partitions. With
        ``metadata=True`` (kafka-python's), an OffsetAndMetadata (offset and the metadata
        string committed with it) in place of each offset."""
        self._require_running()
        group = self._group("committed()")
        single = isinstance(partitions, tuple) and len(partitions) == 2 and isinstance(partitions[0], str)
        tps = [TopicPartition(*partitions)] if single else [TopicPartition(*tp) for tp in partitions]
        deadline = trio.current_time() + self._deadline_s(timeout_ms)
        if metadata:
            found: dict[TopicPartition, Any] = await group.offsets.fetch_committed_metadata(tps, deadline)
        else:
            found = await group.offsets.fetch_committed(tps, deadline)
        return found[tps[0]] if single else found

    def _deadline_s(self, timeout_ms: int | None) -> float:
        return (self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000

    @property
    def group_generation(self) -> tuple[int, str] | None:
        """(generation id, member id) while the consumer is a member of a generation."""
        g = self._coordinator.generation if self._coordinator is not None else None
        return (g.generation_id, g.member_id) if g is not None and g.valid else None

    # -- assignment and positions ---------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Consume exactly these partitions (replacing any earlier assignment)."""
        if self._coordinator is not None and self._coordinator.is_managed:
            raise ValueError("assign() and subscribe() are mutually exclusive: call unsubscribe() first")
        # with a group_id, a new partition starts at the group's committed offset (Kafka's)
        self._subscriptions.assign(partitions, need_committed=self._coordinator is not None)
        topics = {tp.topic for tp in self._subscriptions.partitions}
        self._cluster.set_topics(topics)
        if topics - set(self._cluster.metadata.topics):
            self._cluster.request_update()
        self._fetcher.wake()

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscriptions.partitions)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next poll returns records from ``offset`` on (a lookup is not needed)."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        tp = TopicPartition(*partition)
        state = self._subscriptions.state(tp)
        self._give_back([tp], rewind=False)
        state.seek(offset)
        self._fetcher.wake()

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these assigned partitions, and keep ``poll`` from returning their
        records, until ``resume`` (Kafka's ``pause``: flow control, e.g. while downstream is
        busy). Records already fetched stay buffered and come back after ``resume``; the
        position does not move, and a group member keeps polling (and stays in the group).
        A partition that a rebalance revokes loses its pause."""
        tps = [TopicPartition(*tp) for tp in partitions]
        for state in [self._subscriptions.state(tp) for tp in tps]:
            state.paused = True
        self._give_back(tps)  # an iterator's records not yielded yet come back after resume

    def resume(self, *partitions: TopicPartition) -> None:
        """Fetch these paused partitions again; their buffered records are returned by the
        next ``poll`` (a ``poll`` waiting now gets them at once)."""
        for state in [self._subscriptions.state(TopicPartition(*tp)) for tp in partitions]:
            state.paused = False
        self._fetcher.wake()
        self._signal_data()

    def paused(self) -> set[TopicPartition]:
        """The assigned partitions that are paused."""
        return {tp for tp, s in self._subscriptions.partitions.items() if s.paused}

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_reset(partitions, EARLIEST_TIMESTAMP)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_reset(partitions, LATEST_TIMESTAMP)

    def _seek_reset(self, partitions: Sequence[TopicPartition], strategy: int) -> None:
        tps = [TopicPartition(*tp) for tp in partitions] or list(self._subscriptions.partitions)
        states = [self._subscriptions.state(tp) for tp in tps]
        self._give_back(tps, rewind=False)
        for state in states:
            state.request_reset(strategy)
        self._fetcher.wake()

    async def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record poll returns for ``partition`` (an iterator's record
        not yielded yet counts as not consumed), looked up now if it has none yet: the group's
        committed offset for a partition awaiting it, else per its reset strategy."""
        tp = TopicPartition(*partition)
        state = self._subscriptions.state(tp)
        if (unreturned := self._subscriptions.consumed_position(tp)) is not None:
            return unreturned
        deadline = self._deadline(timeout_ms)
        while not state.has_position:
            if state.awaiting_committed and self._coordinator is not None:
                offsets = self._coordinator.offsets
                found = await offsets.fetch_committed([tp], trio.current_time() + max(0.0, deadline - time.monotonic()))
                offsets.start_at_committed(tp, state, found[tp])
                self._fetcher.wake()  # it may wait for a position
                continue
            if state.reset is None:
                raise NoOffsetForPartitionError(f"partition {tp} has no position and "
                                                "auto_offset_reset is 'none': seek first")
            generation = state.generation
            offsets = await self._list_offsets({tp: state.reset}, deadline)
            if state.generation == generation and state.reset is not None:
                state.seek(offsets[tp][0])
                self._fetcher.wake()
        return state.position

    def highwater(self, partition: TopicPartition) -> int | None:
        """The partition's high watermark as of the last fetch (None before one)."""
        hw = self._subscriptions.state(TopicPartition(*partition)).high_watermark
        return None if hw < 0 else hw

    @property
    def metrics(self) -> Metrics:
        """Gauges of the assigned partitions (``SubscriptionState.metrics``):
        ``assigned_partitions``, ``records_lag_max`` and ``partitions_high_watermark_held``;
        call it (``metrics()``) for kafka-python's ``{group: {name: value}}`` (``Metrics``)."""
        m = Metrics(self._subscriptions.metrics())
        m.fetch = self._fetcher.stats.consumer_metrics(time.monotonic())
        return m

    # -- cluster metadata -----------------------------------------------------------------------

    async def topics(self, timeout_ms: int | None = None) -> set[str]:
        """The cluster's topics (kafka-python's ``topics()``), without the internal ones
        while ``exclude_internal_topics``; fetched now."""
        self._require_running()
        response = await self._cluster.fetch_metadata(None, timeout=self._deadline_s(timeout_ms),
                                                      allow_auto_topic_creation=False)
        return {t.name for t in response.topics
                if t.error_code == 0 and not (t.is_internal and self.config.exclude_internal_topics)}

    async def partitions_for_topic(self, topic: str, timeout_ms: int | None = None) -> set[int] | None:
        """The partition ids of ``topic`` (None: no such topic), fetched now."""
        self._require_running()
        await self._cluster.fetch_metadata([topic], timeout=self._deadline_s(timeout_ms),
                                           allow_auto_topic_creation=False)
        partitions = self._cluster.metadata.partitions_for(topic)
        return None if not partitions else set(partitions)

    async def assign_topics(self, topics: Sequence[str], timeout_ms: int | None = None) -> None:
        """Assign every partition of ``topics`` (kafka-python's ``KafkaConsumer(*topics)``
        without a group_id); raises UNKNOWN_TOPIC_OR_PARTITION for a topic that does not exist."""
        wanted = []
        for topic in topics:
            partitions = await self.partitions_for_topic(topic, timeout_ms)
            if partitions is None:
                raise broker_error(UNKNOWN_TOPIC_OR_PARTITION.code, f"topic {topic!r}")
            wanted += [TopicPartition(topic, p) for p in sorted(partitions)]
        self.assign(wanted)

    # -- offsets --------------------------------------------------------------------------------

    async def beginning_offsets(self, partitions: Iterable[TopicPartition],
                                timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        found = await self._list_offsets({TopicPartition(*tp): EARLIEST_TIMESTAMP for tp in partitions},
                                         self._deadline(timeout_ms))
        return {tp: r[0] for tp, r in found.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """The high watermark of each partition (the offset the next committed record gets)."""
        found = await self._list_offsets({TopicPartition(*tp): LATEST_TIMESTAMP for tp in partitions},
                                         self._deadline(timeout_ms))
        return {tp: r[0] for tp, r in found.items()}

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int], timeout_ms: int | None = None
                                ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose timestamp is >= the given one (ms),
        with that record's timestamp; None when no such record exists."""
        for ts in timestamps.values():
            if ts < 0:
                raise ValueError(f"timestamps must be >= 0 ms, got {ts}")
        found = await self._list_offsets({TopicPartition(*tp): ts for tp, ts in timestamps.items()},
                                         self._deadline(timeout_ms))
        return {tp: None if r[0] < 0 else OffsetAndTimestamp(r[0], r[1]) for tp, r in found.items()}

    def _deadline(self, timeout_ms: int | None) -> float:
        ms = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
        return time.monotonic() + ms / 1000

    async def _list_offsets(self, wanted: dict[TopicPartition, int], deadline: float
                            ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets to each partition's leader, retrying retriable errors (with a metadata
        refresh when they invalidate it) until monotonic ``deadline``."""
        self._require_running()
        return await list_offsets(self._cluster, wanted, deadline,
                                  backoff=Backoff(self._backoff_s, self.config.retry_backoff_max_ms / 1000))

    # -- polling --------------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> ConsumerRecords:
        """Records from the assigned partitions, in offset order per partition: at most
        ``max_records`` (default ``max_poll_records``), waiting up to ``timeout_ms`` for some
        (a ``ConsumerRecords``: a list, with kafka-python's ``items()`` by partition).
        Raises an error a fetch ran into (e.g. OffsetOutOfRangeError with
        auto_offset_reset "none", CorruptRecordError) once, then carries on.

        With a group, poll also does the group's work (finding the coordinator, the commit
        before a rebalance, the JoinGroup/SyncGroup exchange) within the same ``timeout_ms``:
        what is not done by then goes on in the background and the next poll continues it.
        Only the rebalance listener and commit callbacks, which run inside poll, can make it
        take longer. A non-retriable error of the group (e.g. GROUP_AUTHORIZATION_FAILED
        from FindCoordinator) is raised by every poll until it is resolved."""
        self._require_running()
        await trio.lowlevel.checkpoint_if_cancelled()
        self._fetcher.stats.settle()  # the last poll's, off the path of its records
        limit = max_records or self.config.max_poll_records
        deadline = trio.current_time() + max(0, timeout_ms) / 1000
        if self._wakeup_pending:
            self._raise_pending()
        if self._subscriptions.has_unreturned:
            return self.take_unreturned(limit)
        if self._coordinator is not None:
            await self._coordinator.poll(deadline)
        while True:
            self._raise_pending()
            holding = self._coordinator is not None and self._coordinator.holds_records()
            records = ConsumerRecords() if holding else self._drain(limit)  # the commit before a rebalance
            if records:
                return records
            if trio.current_time() >= deadline or self._closed:
                return records
            if self._coordinator is not None and self._coordinator.poll_step_due():
                await self._coordinator.poll(deadline)  # a rebalance to run or to finish
                continue
            data = self._data
            wait_until = deadline
            if self._coordinator is not None:
                wait_until = min(deadline, trio.current_time() + self._coordinator.waiting_in_poll())
            with trio.move_on_at(wait_until):
                await data.wait()

    # A poll without a task, for the blocking facade (manual assignment only: a group's poll
    # runs the group's work, which needs poll's task). The application thread registers a
    # waiter (through the portal, on the Trio thread) and blocks on its own queue; records
    # are handed over in the same scheduler pass that absorbed the fetch response, instead
    # of waking poll's task, which returns through the portal's call machinery two passes
    # later. Every pass polls the event loop, and the application thread, once woken, waits
    # for the GIL until the loop thread sleeps or polls: fewer passes, less waiting.

    @property
    def polls_without_task(self) -> bool:
        """True when ``add_poll_waiter`` may serve ``poll`` (no group)."""
        return self._coordinator is None

    def add_poll_waiter(self, limit: int, deliver: Callable[[Any], Any]) -> None:
        """On the Trio thread: ``deliver`` gets poll's outcome once there is one: a
        non-empty list of at most ``limit`` records, an exception poll would raise, or []
        when the consumer closes. Replaces any earlier waiter (which gets [])."""
        self._fetcher.stats.settle()  # the last poll's, off the path of its records
        previous, self._poll_waiter = self._poll_waiter, (limit, deliver)
        if previous is not None:
            previous[1]([])
        self._serve_poll_waiter()

    def remove_poll_waiter(self, deliver: Callable[[Any], Any]) -> bool:
        """On the Trio thread: forget ``deliver``'s waiter; False if it was served already."""
        if self._poll_waiter is not None and self._poll_waiter[1] is deliver:
            self._poll_waiter = None
            return True
        return False

    def _serve_poll_waiter(self) -> None:
        waiter = self._poll_waiter
        if waiter is None:
            return
        limit, deliver = waiter
        if self._closed:
            outcome: Any = []
        elif self.unreturned_first:  # as poll
            outcome = self.take_unreturned(limit)
        else:
            try:
                self._raise_pending()
                outcome = self._drain(limit)
            except Exception as e:  # what poll would raise
                outcome = e
            if not outcome and not isinstance(outcome, Exception):
                return  # keep waiting
        self._poll_waiter = None
        deliver(outcome)

    def _drain(self, limit: int, wake: bool = True) -> ConsumerRecords:
        return self._deserialized(self._fetcher.drain(limit, wake))

    def _deserialized(self, drained: list[Record]) -> ConsumerRecords:
        """Drained records as poll returns them: deserialized, counted."""
        records = ConsumerRecords(drained)
        if not records:
            return records
        if self._deserializing:
            out = self._deserialize(records)
            records = out if type(out) is ConsumerRecords else ConsumerRecords(out)
        self._fetcher.stats.on_consumed(time.monotonic(), len(records))
        return records

    def _deserialize(self, records: list[Record]) -> list[Record]:
        """Apply the deserializers to each record. When one raises, the records before it are
        returned and every partition of the rest goes back to its first one (refetched); with
        nothing before it, RecordDeserializationError is raised and the failed record's
        partition stays at it (Kafka's rule: the next poll fails again until a ``seek``)."""
        kd, vd = self._key_deserializer, self._value_deserializer
        for i, r in enumerate(records):
            try:
                if kd is not None:
                    r.key = kd(r.key)
                if vd is not None:
                    r.value = vd(r.value)
            except BaseException as e:
                if not isinstance(e, Exception):  # Ctrl-C: none is returned, all come again
                    self._rewind(records)
                    raise
                self._rewind(records[i:])
                if i:
                    return records[:i]
                raise RecordDeserializationError(
                    f"deserializing the record at offset {r.offset} of {r.topic}-{r.partition} failed: "
                    f"{type(e).__name__}: {e}; seek past it to skip it", TopicPartition(r.topic, r.partition),
                    r.offset) from e
        return records

    @property
    def unreturned_first(self) -> bool:
        """Whether a poll returns unreturned records before anything else: there are some,
        and no wakeup is pending (a poll raises that first)."""
        return self._subscriptions.has_unreturned and not self._wakeup_pending

    def next_unreturned(self) -> Record | None:
        """An iterator's next record: the oldest unreturned one, taken; None when there is
        none or a wakeup is pending (the poll that follows raises it)."""
        return None if self._wakeup_pending else self._subscriptions.next_unreturned()

    def put_back(self, records: Sequence[Record]) -> None:
        """``records``, taken before every unreturned record (a poll's an iterator had yet to
        yield, or one whose caller left), are unreturned again, ahead of those; any thread."""
        self._subscriptions.put_back(records)

    def take_unreturned(self, limit: int) -> ConsumerRecords:
        """What a poll returns first: records taken from the fetcher earlier and not handed
        out yet (``SubscriptionState``'s unreturned records), up to ``limit``."""
        return ConsumerRecords(self._subscriptions.take_unreturned(limit))

    def reclaim_error(self, error: BaseException) -> bool:
        """An error ``poll`` raised whose caller left before getting it (a facade's poll,
        interrupted or timed out), from any thread. A fetch's error goes back among the
        pending ones, raised by the next poll unless its partition is no longer assigned or
        was sought by then (``PendingErrors.restore``); a missing position is raised again by
        the next poll while it is missing. False: another error, for the caller to keep."""
        if isinstance(error, NoOffsetForPartitionError):
            return True
        return self._fetcher.errors.restore(error)

    def _give_back(self, tps: Sequence[TopicPartition] | None, rewind: bool = True) -> None:
        """Drop the unreturned records of ``tps`` (None: all); with ``rewind`` they are
        fetched again (``SubscriptionState.give_back``)."""
        if self._subscriptions.has_unreturned:
            with self._fetcher.state_lock:
                moved = self._subscriptions.give_back(tps, rewind)
            if moved:
                self._fetcher.replan()

    def _rewind(self, records: list[Record]) -> None:
        """Positions back to the first of ``records`` in each of their partitions (they are
        fetched again): records drained but not returned."""
        if not records:
            return
        with self._fetcher.state_lock:  # the poll may run on an application's thread
            for tp, offset in rewind_offsets(records).items():
                self._subscriptions.state(tp).seek(offset)
        self._fetcher.replan()

    def wakeup(self) -> None:
        """Make the poll that is waiting, or else the next one, raise WakeupError (Kafka's
        ``wakeup``: how another task, or thread through the blocking ``Consumer``, ends a
        long poll to shut down)."""
        self.request_wakeup()
        if self._coordinator is not None:
            self._coordinator.interrupt_poll()  # a wait for the group's work ends too
        self._signal_data()
        self._fetcher.wake()  # a poll fetching on an application's thread (client._caller_fetch)

    def request_wakeup(self) -> None:
        """The part of ``wakeup`` that is safe from any thread (a single attribute write):
        mark a wakeup pending, so that a poll served on the caller's thread (unreturned
        records, ``unreturned_first``) raises WakeupError at once. The facades call it, then
        ``wakeup`` on the Trio thread for the waits to end."""
        self._wakeup_pending = True

    def _raise_pending(self) -> None:
        if self._wakeup_pending:
            self._wakeup_pending = False
            if self._coordinator is not None:
                self._coordinator.poll_interrupted = False
            raise WakeupError("the poll was interrupted by wakeup()")
        if self._fetcher.errors and (error := self._fetcher.errors.take(self._subscriptions.partitions)) is not None:
            raise error
        missing = self._subscriptions.missing_position()
        if missing:
            raise NoOffsetForPartitionError(
                f"no position for {', '.join(map(str, missing))} and auto_offset_reset is 'none': "
                "seek first")

    def __aiter__(self) -> "AsyncConsumer":
        """``async for record in consumer``: records as they arrive, until the consumer is
        closed. Records are polled in batches and yielded one by one: a record counts as
        consumed once yielded (commits and ``position`` count from the next one), as in
        kafka-python."""
        return self

    async def __anext__(self) -> Record:
        while (record := self.next_unreturned()) is None:
            if self._closed:
                raise StopAsyncIteration
            self.put_back(await self.poll(timeout_ms=max(self.config.fetch_max_wait_ms, 100)))
        return record

    def _require_running(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        if not self._started:
            raise RuntimeError("start the consumer first: `async with AsyncConsumer(...)` or "
                               "`await nursery.start(consumer.run)`")

    def _signal_data(self) -> None:
        data, self._data = self._data, trio.Event()
        data.set()
        self._serve_poll_waiter()
