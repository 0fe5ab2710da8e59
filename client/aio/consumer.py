"""The Trio consumer: manual assignment, positions, pipelined fetches, offset lookups.

Theory of operation.

* ``SubscriptionState`` (pure) holds, per assigned partition, the *position* (the offset of
  the next record ``poll`` returns), a pending *reset* (earliest/latest, from
  ``auto_offset_reset``, ``seek_to_beginning``/``seek_to_end`` or an out-of-range error), the
  *fetch offset* (where the next fetch starts: the position, or just past data already
  buffered), the buffered fetch results, and a *generation* that every seek bumps: a fetch or
  offset lookup answered for an older generation is discarded, so a seek is never undone by a
  response that was already on its way.
* One background task (``_fetch_loop``) resets positions that need it (ListOffsets to each
  leader) and keeps at most one Fetch in flight per leader node, for the partitions that have
  a position, nothing buffered and no backoff (``plan_fetches``, pure). Fetches long-poll
  (``fetch_max_wait_ms``, ``fetch_min_bytes``).
* ``poll`` hands out buffered records (decoding one batch at a time with
  ``protocol.records.record_columns``, checking CRCs when ``check_crcs``, skipping records
  below the position: a fetch returns whole batches starting with the one that holds the
  fetch offset). When it empties a partition's buffer it wakes the fetch loop, so the next
  fetch is in flight while the application works on the records just returned (Kafka's
  fetch pipelining).
* Partition errors (``handle_partition_response``, pure): OFFSET_OUT_OF_RANGE resets the
  position per ``auto_offset_reset``, or with "none" is raised from ``poll`` (the partition
  stays stopped until a seek); errors that invalidate metadata (NOT_LEADER_OR_FOLLOWER,
  UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, ...) refresh metadata and back off;
  other retriable errors back off; anything else is raised from ``poll``.

* Consumer groups (``group_id`` with ``subscribe``): ``tidelog.aio.group.ConsumerCoordinator``
  joins the group, heartbeats in its own task, and in ``poll`` runs rebalances (the listener's
  callbacks), the automatic commit and the lookup of committed offsets. A partition the group
  assigns starts *awaiting its committed offset* (``PartitionState.awaiting_committed``):
  neither fetched nor reset until the coordinator's OffsetFetch answers; with nothing
  committed it falls back to ``auto_offset_reset``. With ``assign`` and a ``group_id`` the
  consumer uses the group only to store offsets (``commit``/``committed``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import trio

from tidelog.aio._lifecycle import RunsInOwnNursery
from tidelog.aio.assignors import assignors_for
from tidelog.aio.cluster import Backoff, Cluster, ClusterMetadata, list_offsets
from tidelog.aio.group import ConsumerCoordinator, ConsumerRebalanceListener, call_maybe_async
from tidelog.errors import (
    BrokerConnectionError,
    ClientClosedError,
    NoOffsetForPartitionError,
    RequestTimedOut,
    TidelogError,
    WakeupError,
    broker_error,
)
from tidelog.protocol.errors import (
    NONE,
    OFFSET_OUT_OF_RANGE,
    CorruptRecordError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    for_code,
)
from tidelog.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    ApiKey,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopic,
)
from tidelog.protocol.records import BatchHeader, RecordColumns, iter_headers, record_columns, validate_batch
from tidelog.protocol.topics import TopicPartition
from tidelog.records import Record

__all__ = ["AsyncConsumer", "ConsumerConfig", "SubscriptionState", "PartitionState",
           "CompletedFetch", "plan_fetches", "handle_partition_response", "OffsetAndTimestamp"]

log = logging.getLogger(__name__)

RESET_STRATEGIES = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP, "none": None}


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ConsumerConfig:
    bootstrap_servers: str | Sequence[str] = "localhost:9092"
    client_id: str | None = None
    group_id: str | None = None
    group_instance_id: str | None = None  # static membership
    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    rebalance_timeout_ms: int | None = None  # None: max_poll_interval_ms, as in Kafka
    partition_assignment_strategy: tuple[str, ...] | str = ("range", "cooperative-sticky")
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    exclude_internal_topics: bool = True
    auto_offset_reset: str = "latest"
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 50 << 20
    max_partition_fetch_bytes: int = 1 << 20
    max_poll_records: int = 500
    request_timeout_ms: int = 30000
    default_api_timeout_ms: int = 60000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    metadata_max_age_ms: int = 300000
    check_crcs: bool = True
    allow_auto_create_topics: bool = False

    def __post_init__(self) -> None:
        if self.auto_offset_reset not in RESET_STRATEGIES:
            raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', "
                             f"got {self.auto_offset_reset!r}")
        self._check_group_options()
        for name in ("fetch_max_wait_ms", "fetch_min_bytes", "retry_backoff_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for name in ("fetch_max_bytes", "max_partition_fetch_bytes", "max_poll_records",
                     "request_timeout_ms", "default_api_timeout_ms", "session_timeout_ms",
                     "heartbeat_interval_ms", "max_poll_interval_ms", "auto_commit_interval_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")

    def _check_group_options(self) -> None:
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise ValueError(f"group_id must be a non-empty string, got {self.group_id!r}")
        if self.group_instance_id is not None and self.group_id is None:
            raise ValueError("group_instance_id (static membership) needs a group_id")
        if self.group_instance_id is not None and not self.group_instance_id:
            raise ValueError("group_instance_id must be a non-empty string")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be lower than "
                             f"session_timeout_ms ({self.session_timeout_ms}); a third of it is usual")
        if self.rebalance_timeout_ms is not None and self.rebalance_timeout_ms <= 0:
            raise ValueError("rebalance_timeout_ms must be > 0")
        assignors_for(self.partition_assignment_strategy)  # ValueError for an unknown name


# ---------------------------------------------------------------------------------------------
# fetched data


class CompletedFetch:
    """The record batches one fetch returned for one partition, decoded a batch at a time."""

    __slots__ = ("tp", "buf", "batches", "columns", "index", "header")

    def __init__(self, tp: TopicPartition, buf: bytes, batches: Iterable[tuple[int, BatchHeader]]):
        self.tp = tp
        self.buf = buf
        self.batches: deque[tuple[int, BatchHeader]] = deque(batches)
        self.columns: RecordColumns | None = None  # the current batch's records
        self.index = 0  # of the next record of the current batch to hand out
        self.header: BatchHeader | None = None  # the current batch

    @property
    def exhausted(self) -> bool:
        return not self.batches and (self.columns is None or self.index >= len(self.columns))

    def take(self, state: "PartitionState", max_records: int, check_crcs: bool) -> list[Record]:
        """Up to ``max_records`` records at or above ``state.position``, advancing it.
        Raises CorruptRecordError for a batch that fails its CRC (or does not decode)."""
        out: list[Record] = []
        while len(out) < max_records:
            columns = self.columns
            if columns is None or self.index >= len(columns):
                if self.header is not None:  # the current batch is done: skip any gap after it
                    state.position = max(state.position, self.header.next_offset)
                    self.header = self.columns = None
                if not self.batches:
                    break
                self._next_batch(state, check_crcs)
                continue
            # offsets within a batch are consecutive: records below the position are skipped
            # by starting further in
            start = max(self.index, state.position - columns.base_offset)
            end = min(len(columns), start + max_records - len(out))
            if start < end:
                out += self._records(columns, start, end)
                state.position = columns.base_offset + end
            self.index = max(start, end)
        return out

    def _records(self, c: RecordColumns, start: int, end: int) -> list[Record]:
        """Records ``[start, end)`` of the current batch. The per-record hot path of every
        consumer, written for speed: C-level iterators feed the Record constructor."""
        topic, partition = self.tp
        n = end - start
        headers = c.headers[start:end] if c.headers is not None else repeat(None, n)  # lazily []
        ts_type = 1 if self.header.attributes & 0x08 else 0
        return list(map(Record, repeat(topic, n), repeat(partition, n),
                        range(c.base_offset + start, c.base_offset + end), c.timestamps[start:end],
                        c.keys[start:end], c.values[start:end], headers, repeat(ts_type, n)))

    def _next_batch(self, state: "PartitionState", check_crcs: bool) -> None:
        pos, h = self.batches.popleft()
        if h.next_offset <= state.position:
            return  # wholly below the position: never decoded
        if check_crcs:
            validate_batch(self.buf, pos)
        self.header = h
        self.index = 0
        self.columns = _NO_RECORDS if h.is_control else record_columns(self.buf, pos, h)


_NO_RECORDS = RecordColumns(0, (), (), (), None)


# ---------------------------------------------------------------------------------------------
# subscription state (pure)


@dataclass(slots=True)
class PartitionState:
    position: int | None = None
    reset: int | None = None  # EARLIEST_TIMESTAMP / LATEST_TIMESTAMP pending
    fetch_offset: int | None = None
    generation: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    retry_at: float = 0.0
    stopped: bool = False  # an error was raised; waits for a seek
    awaiting_committed: bool = False  # assigned by the group: the committed offset is looked up first
    fetching: bool = False
    resetting: bool = False
    # its last answer was empty below the high watermark while it was not first in its
    # fetch request: the next request to its leader puts it first (see handle_partition_response)
    fetch_first: bool = False
    paused: bool = False  # pause(): not fetched, its buffered records not returned, until resume()
    buffered: deque[CompletedFetch] = field(default_factory=deque)

    @property
    def has_position(self) -> bool:
        return self.position is not None and self.reset is None

    def seek(self, offset: int) -> None:
        self.position = self.fetch_offset = offset
        self.reset = None
        self.stopped = False
        self.awaiting_committed = False
        self.generation += 1
        self.buffered.clear()
        self.retry_at = 0.0

    def request_reset(self, strategy: int) -> None:
        self.reset = strategy
        self.stopped = False
        self.awaiting_committed = False
        self.generation += 1
        self.buffered.clear()


class SubscriptionState:
    """The assigned partitions and their positions. Pure: no I/O, no clock."""

    def __init__(self, default_reset: int | None):
        self.default_reset = default_reset
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self._rotation = 0

    def assign(self, tps: Iterable[TopicPartition], need_committed: bool = False) -> None:
        """Replace the assignment; partitions kept keep their state, new ones need a position:
        from ``auto_offset_reset``, or (``need_committed``, a group's assignment) from the
        group's committed offset first."""
        wanted = list(dict.fromkeys(TopicPartition(*tp) for tp in tps))
        self.partitions = {tp: self.partitions.get(tp) or self._new_state(need_committed) for tp in wanted}

    def _new_state(self, need_committed: bool = False) -> PartitionState:
        state = PartitionState()
        if need_committed:
            state.awaiting_committed = True
        elif self.default_reset is not None:
            state.reset = self.default_reset
        return state

    def reset_to_default(self, tp: TopicPartition) -> None:
        """No committed offset: start per auto_offset_reset (or stay without a position)."""
        state = self.partitions[tp]
        state.awaiting_committed = False
        if self.default_reset is not None:
            state.request_reset(self.default_reset)

    def awaiting_committed(self) -> list[TopicPartition]:
        return [tp for tp, s in self.partitions.items() if s.awaiting_committed]

    def consumed_positions(self) -> dict[TopicPartition, int]:
        """The position of every partition that has one: what an automatic commit sends."""
        return {tp: s.position for tp, s in self.partitions.items() if s.has_position}

    def state(self, tp: TopicPartition) -> PartitionState:
        try:
            return self.partitions[tp]
        except KeyError:
            raise ValueError(f"partition {tp} is not assigned to this consumer") from None

    def needing_reset(self) -> list[TopicPartition]:
        return [tp for tp, s in self.partitions.items() if s.reset is not None and not s.resetting]

    def missing_position(self) -> list[TopicPartition]:
        """Partitions with neither a position nor a pending reset (auto_offset_reset none)."""
        return [tp for tp, s in self.partitions.items()
                if s.position is None and s.reset is None and not s.awaiting_committed]

    def fetchable(self, now: float) -> list[TopicPartition]:
        return [tp for tp, s in self.partitions.items()
                if s.has_position and not s.fetching and not s.buffered and not s.stopped
                and not s.paused and s.retry_at <= now]

    def rotation(self) -> list[TopicPartition]:
        """The assigned partitions, starting one further along each call (fair polling)."""
        tps = list(self.partitions)
        if not tps:
            return tps
        self._rotation = (self._rotation + 1) % len(tps)
        return tps[self._rotation:] + tps[:self._rotation]


class FetchPlan(NamedTuple):
    request: FetchRequest
    sent: dict[TopicPartition, tuple[int, int]]  # tp -> (generation, fetch offset)


def plan_fetches(subscriptions: SubscriptionState, metadata: ClusterMetadata, busy_nodes: Iterable[int],
                 now: float, config: ConsumerConfig) -> tuple[dict[int, FetchPlan], bool]:
    """One FetchRequest per leader node that has no fetch in flight, for its fetchable
    partitions, those marked ``fetch_first`` first. Returns ``(plans by node, some partition
    has no known leader)``."""
    busy = set(busy_nodes)
    by_node: dict[int, dict[str, list[FetchPartition]]] = {}
    sent: dict[int, dict[TopicPartition, tuple[int, int]]] = {}
    unknown = False
    states = subscriptions.partitions
    # a partition waiting to be first goes first (its topic first, and first in its topic)
    for tp in sorted(subscriptions.fetchable(now), key=lambda tp: not states[tp].fetch_first):
        leader = metadata.leader_for(tp)
        if leader is None:
            unknown = True
            continue
        if leader in busy:
            continue
        state = subscriptions.partitions[tp]
        info = metadata.partition(tp)
        epoch = info.leader_epoch if info is not None else -1
        by_node.setdefault(leader, {}).setdefault(tp.topic, []).append(
            FetchPartition(tp.partition, state.fetch_offset, config.max_partition_fetch_bytes,
                           current_leader_epoch=epoch))
        sent.setdefault(leader, {})[tp] = (state.generation, state.fetch_offset)
    plans = {}
    for node, topics in by_node.items():
        request = FetchRequest(topics=[FetchTopic(t, parts) for t, parts in topics.items()],
                               max_wait_ms=config.fetch_max_wait_ms, min_bytes=config.fetch_min_bytes,
                               max_bytes=config.fetch_max_bytes)
        plans[node] = FetchPlan(request, sent[node])
    return plans, unknown


class PartitionOutcome(NamedTuple):
    action: str  # "data" | "empty" | "gap" | "stale" | "reset" | "retry" | "refresh" | "error"
    error: TidelogError | None = None


def handle_partition_response(tp: TopicPartition, state: PartitionState | None, generation: int,
                              fetch_offset: int, p: FetchPartitionResponse, *, now: float,
                              backoff_s: float, first: bool = False) -> PartitionOutcome:
    """Apply one partition's fetch result to its state (pure); says what happened.

    ``first``: the partition came first in its fetch request, so the broker returned at
    least one batch if any lies between the fetch offset and the high watermark. Nothing
    returned then means those offsets hold no records (a compacted topic's cleaner removed
    them, at the end of a segment): the position moves to the high watermark ("gap"), where
    a consumer waiting for new records would jump anyway, so a reader of a range ending
    below the high watermark (the Spark source) is not left waiting for offsets that will
    never come. Nothing returned below the high watermark for a partition that was not
    first may be a gap too, or the response's bytes used up before it: it is marked
    ``fetch_first``, so its next fetch answers the question."""
    if state is None or state.generation != generation or state.fetch_offset != fetch_offset:
        return PartitionOutcome("stale")
    state.fetch_first = False
    if p.error_code == NONE.code:
        if p.high_watermark >= 0:
            state.high_watermark = p.high_watermark
        if p.log_start_offset >= 0:
            state.log_start_offset = p.log_start_offset
        if not p.records:
            if first and fetch_offset < p.high_watermark and not state.buffered:
                if state.position == fetch_offset:
                    state.position = p.high_watermark
                state.fetch_offset = p.high_watermark
                return PartitionOutcome("gap")
            state.fetch_first = not first and fetch_offset < p.high_watermark and not state.buffered
            return PartitionOutcome("empty")
        batches = list(iter_headers(p.records))
        if not batches:
            state.stopped = True
            return PartitionOutcome("error", RecordTooLargeError(
                f"partition {tp}: the batch at offset {fetch_offset} is larger than "
                f"max_partition_fetch_bytes and the broker returned only part of it"))
        state.buffered.append(CompletedFetch(tp, p.records, batches))
        state.fetch_offset = max(fetch_offset, batches[-1][1].next_offset)
        return PartitionOutcome("data")
    err = for_code(p.error_code)
    where = f"partition {tp} at offset {fetch_offset}"
    if p.error_code == OFFSET_OUT_OF_RANGE.code:
        if state.reset is not None or fetch_offset != state.position:
            return PartitionOutcome("stale")
        return PartitionOutcome("reset", OffsetOutOfRangeError(
            f"{where}: OFFSET_OUT_OF_RANGE: the offset is outside the partition's range "
            f"(log start {p.log_start_offset}, high watermark {p.high_watermark})"))
    if err.retriable:
        state.retry_at = now + backoff_s
        return PartitionOutcome("refresh" if err.invalid_metadata else "retry")
    state.stopped = True
    return PartitionOutcome("error", broker_error(p.error_code, where, p.error_message))


# ---------------------------------------------------------------------------------------------
# the consumer


class AsyncConsumer(RunsInOwnNursery):
    """A Trio consumer: manual assignment (``assign``), or a member of a consumer group
    (``group_id`` + ``subscribe``). Use ``async with AsyncConsumer(...) as c:`` or
    ``await nursery.start(consumer.run)`` ... ``await consumer.close()``.

    Rebalance listener methods and ``commit_async`` callbacks run inside ``poll`` (and
    ``close``/``unsubscribe``), on the Trio thread; they may be ``async def``."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", **options: Any):
        self.config = config = ConsumerConfig(bootstrap_servers=bootstrap_servers, **options)
        self._cluster = Cluster(config.bootstrap_servers, client_id=config.client_id,
                                request_timeout_ms=config.request_timeout_ms,
                                retry_backoff_ms=config.retry_backoff_ms,
                                retry_backoff_max_ms=config.retry_backoff_max_ms,
                                metadata_max_age_ms=config.metadata_max_age_ms,
                                allow_auto_topic_creation=config.allow_auto_create_topics)
        self._subscriptions = SubscriptionState(RESET_STRATEGIES[config.auto_offset_reset])
        self._fetching_nodes: set[int] = set()
        self._errors: deque[TidelogError] = deque()
        self._wakeup_pending = False  # wakeup() was called: the current or next poll raises
        self._iter_buffer: deque[Record] = deque()
        self._wake = trio.Event()  # the fetch loop's
        self._data = trio.Event()  # poll's: data or an error arrived
        self._poll_waiter: tuple[int, Callable[[Any], Any]] | None = None  # see add_poll_waiter
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._closed = False
        self._stopped = trio.Event()
        self._backoff_s = config.retry_backoff_ms / 1000
        self._cluster.add_listener(lambda _m: self._wake.set())
        self.invoke_callback = call_maybe_async  # the blocking facade runs them on its caller's thread
        self._coordinator: ConsumerCoordinator | None = None
        if config.group_id is not None:
            self._coordinator = ConsumerCoordinator(self._cluster, config, self._subscriptions,
                                                    lambda fn, *a: self.invoke_callback(fn, *a),
                                                    lambda: self._wake.set())
            self._coordinator.wake_poll = self._signal_data

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._started:
            raise RuntimeError("this consumer was already started")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._cluster.run)
                nursery.start_soon(self._fetch_loop)
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
        ``timeout_ms`` (default 30 s)."""
        if self._coordinator is not None and self._started and not self._closed and self._nursery is not None:
            with trio.move_on_after((30000 if timeout_ms is None else timeout_ms) / 1000):
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
        self._wake.set()

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

    async def commit(self, offsets: dict[TopicPartition, int] | None = None,
                     timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` ({partition: next offset to read}), or the consumed position of
        every assigned partition, and wait for the coordinator to store them. A commit the
        group refuses because it rebalanced raises CommitFailedError (RebalanceInProgressError
        while a rebalance is under way: poll, then commit again)."""
        self._require_running()
        group = self._group("commit()")
        await group._invoke_completed_commits()
        wanted = self._offsets_to_commit(offsets)
        await group.commit(wanted, trio.current_time() + self._deadline_s(timeout_ms))

    def commit_async(self, offsets: dict[TopicPartition, int] | None = None, callback: Any = None) -> None:
        """Commit in the background; ``callback(offsets, exception_or_None)`` runs in a later
        ``poll`` or ``commit``. Commits are applied in the order they were made."""
        self._require_running()
        self._group("commit_async()").commit_async(self._offsets_to_commit(offsets), callback)

    def _offsets_to_commit(self, offsets: dict[TopicPartition, int] | None) -> dict[TopicPartition, int]:
        if offsets is None:
            return self._subscriptions.consumed_positions()
        return {TopicPartition(*tp): offset for tp, offset in offsets.items()}

    async def committed(self, partitions: TopicPartition | Iterable[TopicPartition],
                        timeout_ms: int | None = None) -> Any:
        """The group's committed offset (next offset to read; None: nothing committed) of a
        partition, or ``{partition: offset}`` for an iterable of partitions."""
        self._require_running()
        group = self._group("committed()")
        single = isinstance(partitions, tuple) and len(partitions) == 2 and isinstance(partitions[0], str)
        tps = [TopicPartition(*partitions)] if single else [TopicPartition(*tp) for tp in partitions]
        found = await group.fetch_committed(tps, trio.current_time() + self._deadline_s(timeout_ms))
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
        self._subscriptions.assign(partitions)
        topics = {tp.topic for tp in self._subscriptions.partitions}
        self._cluster.set_topics(topics)
        if topics - set(self._cluster.metadata.topics):
            self._cluster.request_update()
        self._wake.set()

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscriptions.partitions)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next poll returns records from ``offset`` on (a lookup is not needed)."""
        if offset < 0:
            raise ValueError(f"offset must be >= 0, got {offset}")
        self._subscriptions.state(TopicPartition(*partition)).seek(offset)
        self._wake.set()

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching these assigned partitions, and keep ``poll`` from returning their
        records, until ``resume`` (Kafka's ``pause``: flow control, e.g. while downstream is
        busy). Records already fetched stay buffered and come back after ``resume``; the
        position does not move, and a group member keeps polling (and stays in the group).
        A partition that a rebalance revokes loses its pause."""
        for state in [self._subscriptions.state(TopicPartition(*tp)) for tp in partitions]:
            state.paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        """Fetch these paused partitions again; their buffered records are returned by the
        next ``poll`` (a ``poll`` waiting now gets them at once)."""
        for state in [self._subscriptions.state(TopicPartition(*tp)) for tp in partitions]:
            state.paused = False
        self._wake.set()
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
        for tp in tps:
            self._subscriptions.state(tp).request_reset(strategy)
        self._wake.set()

    async def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record poll returns for ``partition`` (looked up now if a
        reset is pending)."""
        tp = TopicPartition(*partition)
        state = self._subscriptions.state(tp)
        deadline = self._deadline(timeout_ms)
        while not state.has_position:
            if state.reset is None:
                raise NoOffsetForPartitionError(f"partition {tp} has no position and "
                                                "auto_offset_reset is 'none': seek first")
            generation = state.generation
            offsets = await self._list_offsets({tp: state.reset}, deadline)
            if state.generation == generation and state.reset is not None:
                state.seek(offsets[tp][0])
        return state.position

    def highwater(self, partition: TopicPartition) -> int | None:
        """The partition's high watermark as of the last fetch (None before one)."""
        hw = self._subscriptions.state(TopicPartition(*partition)).high_watermark
        return None if hw < 0 else hw

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

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        """Records from the assigned partitions, in offset order per partition: at most
        ``max_records`` (default ``max_poll_records``), waiting up to ``timeout_ms`` for some.
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
        limit = max_records or self.config.max_poll_records
        deadline = trio.current_time() + max(0, timeout_ms) / 1000
        if self._wakeup_pending:
            self._raise_pending()
        if self._coordinator is not None:
            await self._coordinator.poll(deadline)
        while True:
            self._raise_pending()
            holding = self._coordinator is not None and self._coordinator.holds_records()
            records = [] if holding else self._drain(limit)  # the commit before a rebalance is under way
            if records:
                return records
            if trio.current_time() >= deadline or self._closed:
                return []
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

    def wakeup(self) -> None:
        """Make the poll that is waiting, or else the next one, raise WakeupError (Kafka's
        ``wakeup``: how another task, or thread through the blocking ``Consumer``, ends a
        long poll to shut down)."""
        self._wakeup_pending = True
        if self._coordinator is not None:
            self._coordinator.interrupt_poll()  # a wait for the group's work ends too
        self._signal_data()

    def _raise_pending(self) -> None:
        if self._wakeup_pending:
            self._wakeup_pending = False
            if self._coordinator is not None:
                self._coordinator.poll_interrupted = False
            raise WakeupError("the poll was interrupted by wakeup()")
        if self._errors:
            raise self._errors.popleft()
        missing = self._subscriptions.missing_position()
        if missing:
            raise NoOffsetForPartitionError(
                f"no position for {', '.join(map(str, missing))} and auto_offset_reset is 'none': "
                "seek first")

    def _drain(self, limit: int) -> list[Record]:
        out: list[Record] = []
        check = self.config.check_crcs
        drained_one = False
        for tp in self._subscriptions.rotation():
            state = self._subscriptions.partitions[tp]
            while state.buffered and len(out) < limit and not state.paused:
                completed = state.buffered[0]
                try:
                    out.extend(completed.take(state, limit - len(out), check))
                except CorruptRecordError as e:
                    state.buffered.clear()
                    state.stopped = True
                    self._errors.append(CorruptRecordError(f"partition {tp}: {e}"))
                    break
                if completed.exhausted:
                    state.buffered.popleft()
                    drained_one |= not state.buffered
            if len(out) >= limit:
                break
        if drained_one:
            self._wake.set()  # pipelining: fetch again while the application works
        return out

    def __aiter__(self) -> "AsyncConsumer":
        """``async for record in consumer``: records as they arrive, until the consumer is
        closed. Records are polled in batches: a poll's records count as consumed (the
        position moves past them) even if the loop stops before reaching them all."""
        return self

    async def __anext__(self) -> Record:
        while not self._iter_buffer:
            if self._closed:
                raise StopAsyncIteration
            self._iter_buffer.extend(await self.poll(timeout_ms=max(self.config.fetch_max_wait_ms, 100)))
        return self._iter_buffer.popleft()

    def _require_running(self) -> None:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        if not self._started:
            raise RuntimeError("start the consumer first: `async with AsyncConsumer(...)` or "
                               "`await nursery.start(consumer.run)`")

    # -- the background fetch loop --------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        subs = self._subscriptions
        while True:
            self._wake = trio.Event()
            now = time.monotonic()
            for tp in subs.needing_reset():
                state = subs.partitions[tp]
                if state.retry_at <= now:
                    state.resetting = True
                    self._nursery.start_soon(self._reset_one, tp, state, state.generation, state.reset)
            plans, unknown = plan_fetches(subs, self._cluster.metadata, self._fetching_nodes, now, self.config)
            if unknown:
                self._cluster.request_update()
            for node, plan in plans.items():
                self._fetching_nodes.add(node)
                for tp in plan.sent:
                    subs.partitions[tp].fetching = True
                self._nursery.start_soon(self._fetch, node, plan)
            delay = self._next_retry(now) if not unknown else self._backoff_s
            with trio.move_on_after(delay):
                await self._wake.wait()

    def _next_retry(self, now: float) -> float:
        waits = [s.retry_at - now for s in self._subscriptions.partitions.values() if s.retry_at > now]
        return min(waits) if waits else math.inf

    async def _reset_one(self, tp: TopicPartition, state: PartitionState, generation: int,
                         strategy: int) -> None:
        try:
            deadline = time.monotonic() + self.config.request_timeout_ms / 1000
            found = await self._list_offsets({tp: strategy}, deadline)
            if state.generation == generation and state.reset == strategy:
                state.seek(found[tp][0])
        except (RequestTimedOut, BrokerConnectionError) as e:
            log.debug("offset reset for %s failed: %s", tp, e)
            state.retry_at = time.monotonic() + self._backoff_s
        except TidelogError as e:
            state.stopped = True
            self._errors.append(e)
            self._signal_data()
        finally:
            state.resetting = False
            self._wake.set()

    async def _fetch(self, node: int, plan: FetchPlan) -> None:
        subs = self._subscriptions
        absorbed = False

        def absorb_now(response: FetchResponse) -> None:
            # by the connection's reader, the pass the response arrived in: records reach a
            # waiting poll without waiting for this task to be scheduled
            nonlocal absorbed
            absorbed = True
            self._absorb_fetch(response, plan)

        try:
            timeout = (self.config.request_timeout_ms + self.config.fetch_max_wait_ms) / 1000
            response: FetchResponse = await self._cluster.request(node, plan.request, api_key=ApiKey.FETCH,
                                                                  timeout=timeout, early=absorb_now)
        except (BrokerConnectionError, RequestTimedOut, InvalidRequestError) as e:
            log.debug("fetch from node %s failed: %s", node, e)
            self._cluster.request_update()
            retry_at = time.monotonic() + self._backoff_s
            for tp in plan.sent:
                state = subs.partitions.get(tp)
                if state is not None:
                    state.retry_at = retry_at
            return
        finally:
            self._fetching_nodes.discard(node)
            for tp in plan.sent:
                state = subs.partitions.get(tp)
                if state is not None:
                    state.fetching = False
            self._wake.set()
        if not absorbed:
            self._absorb_fetch(response, plan)

    def _absorb_fetch(self, response: FetchResponse, plan: FetchPlan) -> None:
        subs, now = self._subscriptions, time.monotonic()
        got_data = refresh = False
        first_topic = plan.request.topics[0] if plan.request.topics else None
        first = TopicPartition(first_topic.topic, first_topic.partitions[0].partition) \
            if first_topic is not None and first_topic.partitions else None
        for t in response.responses:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition_index)
                if tp not in plan.sent:
                    continue
                if response.error_code != NONE.code and p.error_code == NONE.code:
                    p = FetchPartitionResponse(p.partition_index, response.error_code)
                generation, offset = plan.sent[tp]
                state = subs.partitions.get(tp)
                outcome = handle_partition_response(tp, state, generation, offset, p, now=now,
                                                    backoff_s=self._backoff_s, first=tp == first)
                if outcome.action == "data":
                    got_data = True
                elif outcome.action == "refresh":
                    refresh = True
                elif outcome.action == "reset":
                    if subs.default_reset is None:
                        state.stopped = True
                        self._errors.append(outcome.error)
                        got_data = True
                    else:
                        state.request_reset(subs.default_reset)
                elif outcome.action == "error":
                    self._errors.append(outcome.error)
                    got_data = True
        if refresh:
            self._cluster.request_update()
        if got_data:
            self._signal_data()

    def _signal_data(self) -> None:
        data, self._data = self._data, trio.Event()
        data.set()
        self._serve_poll_waiter()
