"""The consumer's fetcher: which partitions to fetch from which leader, and what a fetch
response does to their state.

Theory of operation.

* One background task (``Fetcher.run``) resets positions that need it (ListOffsets to each
  leader) and keeps at most one Fetch in flight per leader node, for the partitions that have
  a position, nothing buffered and no backoff (``plan_fetches``, pure). Fetches long-poll
  (``fetch_max_wait_ms``, ``fetch_min_bytes``).
* A partition marked ``fetch_first`` goes first in its leader's request: its last answer
  was empty below the high watermark while it was not first, which means either a gap (a
  compacted topic's cleaner removed those offsets) or a response whose bytes were used up
  before it; coming first answers the question (``handle_partition_response``).
* ``handle_partition_response`` (pure) applies one partition's result: data is buffered;
  an empty answer for the first partition below the high watermark moves the position to
  the high watermark (the gap rule); OFFSET_OUT_OF_RANGE asks for a reset per
  ``auto_offset_reset``, or with "none" is raised from ``poll`` (the partition stays
  stopped until a seek); errors that invalidate metadata (NOT_LEADER_OR_FOLLOWER,
  UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, ...) refresh metadata and back off; other
  retriable errors back off; anything else is raised from ``poll`` and the partition is
  fetched again after a backoff (an ACL granted later resumes it; UNKNOWN_SERVER_ERROR is only
  logged), as Kafka's fetcher does: only what needs the application (a batch that cannot be
  read, OFFSET_OUT_OF_RANGE with "none") stops a partition until a seek. An answer for an
  older generation (a seek happened meanwhile) is discarded.
* ``drain`` hands out buffered records (decoding one batch at a time with
  ``protocol.records.record_columns``, checking CRCs when ``check_crcs``, skipping records
  below the position: a fetch returns whole batches starting with the one that holds the
  fetch offset). When it empties a partition's buffer it wakes the fetch loop, so the next
  fetch is in flight while the application works on the records just returned (Kafka's
  fetch pipelining). A batch that fails its CRC or does not decode (damaged on disk, or
  written before the broker validated records) stops its partition: ``poll`` raises a
  CorruptRecordError naming topic, partition, the offset and the batch's offsets, and how to
  skip it (``seek`` to the offset after the batch, ``skip_offset`` on the error), as Kafka's
  consumer does; the records before it were handed out.

Errors for ``poll`` to raise collect in ``Fetcher.errors`` (``PendingErrors``: at most one
per partition); ``on_data`` (given to the constructor) is called whenever records or errors
arrive. A failed offset reset is retried after ``retry_backoff_ms`` (Kafka's requestFailed),
and a non-retriable failure is raised by ``poll`` as well.

The blocking consumer may fetch on its application's thread instead (``client._caller_fetch``):
it sets ``fetch_in_loop`` False, so the loop only resets positions, and ``thread_waker``,
called whenever the loop changed what can be fetched. What the loop then does to partition
states on its own (a reset's outcome) is done under ``state_lock``, as is the other thread's
poll.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from itertools import repeat
from typing import NamedTuple

import trio

from tidelog.aio.cluster import Cluster, ClusterMetadata
from tidelog.aio.stats import ConsumerStats
from tidelog.aio.subscription import ConsumerConfig, PartitionState, SubscriptionState
from tidelog.errors import BrokerConnectionError, ClientClosedError, RequestTimedOut, TidelogError, broker_error
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    CORRUPT_MESSAGE,
    NONE,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_SERVER_ERROR,
    CorruptRecordError,
    InvalidRequestError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    for_code,
)
from tidelog.protocol.messages import (
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopic,
)
from tidelog.protocol.records import BatchHeader, RecordColumns, iter_headers, record_columns, validate_batch
from tidelog.protocol.topics import TopicPartition
from tidelog.records import Record

__all__ = ["Fetcher", "CompletedFetch", "FetchPlan", "plan_fetches", "PartitionOutcome",
           "handle_partition_response"]

log = logging.getLogger(__name__)

ListOffsets = Callable[[dict[TopicPartition, int], float], Awaitable[dict[TopicPartition, tuple[int, int]]]]


class CompletedFetch:
    """The record batches one fetch returned for one partition, decoded a batch at a time."""

    __slots__ = ("tp", "buf", "batches", "columns", "index", "header", "failed")

    def __init__(self, tp: TopicPartition, buf: bytes, batches: Iterable[tuple[int, BatchHeader]]):
        self.tp = tp
        self.buf = buf
        self.batches: deque[tuple[int, BatchHeader]] = deque(batches)
        self.columns: RecordColumns | None = None  # the current batch's records
        self.index = 0  # of the next record of the current batch to hand out
        self.header: BatchHeader | None = None  # the current batch
        self.failed: BatchHeader | None = None  # the batch being decoded, while it is

    @property
    def exhausted(self) -> bool:
        return not self.batches and (self.columns is None or self.index >= len(self.columns))

    def take(self, state: PartitionState, max_records: int, check_crcs: bool) -> list[Record]:
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
                try:
                    self._next_batch(state, check_crcs)
                except CorruptRecordError:
                    if out:  # hand out the records before it; the next take meets it again
                        break
                    raise
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
        ts_type = 1 if self.header.attributes & 0x08 else 0
        if n == 1:  # a low rate's batch: one constructor call costs less than the iterators
            return [Record(topic, partition, c.base_offset + start, c.timestamps[start], c.keys[start],
                           c.values[start], c.headers[start] if c.headers is not None else None, ts_type)]
        headers = c.headers[start:end] if c.headers is not None else repeat(None, n)  # lazily []
        return list(map(Record, repeat(topic, n), repeat(partition, n),
                        range(c.base_offset + start, c.base_offset + end), c.timestamps[start:end],
                        c.keys[start:end], c.values[start:end], headers, repeat(ts_type, n)))

    def _next_batch(self, state: PartitionState, check_crcs: bool) -> None:
        """Decode the next batch; it leaves the queue only once it decoded, so a batch that
        fails stays first (``failed``) and no record before it is lost."""
        pos, h = self.batches[0]
        if h.next_offset <= state.position:
            self.batches.popleft()
            return  # wholly below the position: never decoded
        self.failed = h  # until it decodes: the batch a CorruptRecordError is about
        if check_crcs:
            validate_batch(self.buf, pos)
        columns = _NO_RECORDS if h.is_control else record_columns(self.buf, pos, h)
        self.batches.popleft()
        self.header, self.index, self.columns, self.failed = h, 0, columns, None


_NO_RECORDS = RecordColumns(0, (), (), (), None)


def corrupt_batch_error(tp: TopicPartition, position: int, h: BatchHeader | None,
                        cause: Exception | str) -> CorruptRecordError:
    """The error ``poll`` raises for a batch that cannot be read at ``position``: names topic,
    partition and offsets and says how to skip it. The offset to seek to is the one after the
    batch when its header is plausible (it holds the position), else the next offset: the
    broker answers a fetch with the whole batch that holds the offset asked for, so seeking
    inside the batch would meet it again. When the broker itself refused to serve the batch
    (CORRUPT_MESSAGE), its extent is unknown: the seek names the next offset, and a batch of
    n records takes up to n such seeks."""
    skip = position + 1
    span = ""
    if h is not None and h.record_count > 0 and position < h.next_offset and h.base_offset >= 0:
        position = max(position, h.base_offset)  # a compacted log may have a gap before it
        skip, span = h.next_offset, f" (the batch holding offsets {h.base_offset} to {h.last_offset})"
    e = CorruptRecordError(
        f"topic {tp.topic} partition {tp.partition}: the record batch at offset {position}{span} cannot be "
        f"read: {cause}. The partition is stopped; to skip the batch (its records are lost to this consumer), "
        f"seek past it: consumer.seek(TopicPartition({tp.topic!r}, {tp.partition}), {skip})")
    e.topic_partition, e.offset, e.skip_offset = tp, position, skip
    return e


class FetchPlan(NamedTuple):
    request: FetchRequest
    # tp -> (generation, fetch offset), in the request's order: the first key is the partition
    # that came first in it (see ``handle_partition_response``)
    sent: dict[TopicPartition, tuple[int, int]]


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


def raised_by_poll(error: TidelogError) -> bool:
    """Whether a failure of a background request is for the application to see (``poll``
    raises it) rather than only retried: not for retriable errors, nor UNKNOWN_SERVER_ERROR
    (the broker failed unexpectedly; Kafka's consumer logs and retries it)."""
    return not error.retriable and error.error is not UNKNOWN_SERVER_ERROR


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
        state.high_watermark_held = p.high_watermark_held
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
    if p.error_code == CORRUPT_MESSAGE.code:
        # the broker found the batch damaged on disk: retrying would meet it forever (Kafka's
        # consumer raises too); the error names the seek that skips the offset
        state.stopped = True
        return PartitionOutcome("error", corrupt_batch_error(
            tp, fetch_offset, None, f"the broker answered CORRUPT_MESSAGE: {p.error_message or err.message}"))
    state.retry_at = now + backoff_s
    if err.retriable:
        return PartitionOutcome("refresh" if err.invalid_metadata else "retry")
    error = broker_error(p.error_code, where, p.error_message)
    # fetched again after the backoff, as Kafka's fetcher: an ACL granted later resumes it;
    # UNKNOWN_SERVER_ERROR is only logged (the error is for the log), anything else raised
    return PartitionOutcome("error" if raised_by_poll(error) else "retry", error)



class PendingErrors(dict):
    """The errors for ``poll`` to raise, oldest first: at most one per partition (a newer one
    replaces it: a failure retried every ``retry_backoff_ms`` while nobody polls keeps one,
    as Kafka's consumer caches one), and one for the whole consumer (key None: a refused
    request). A partition's error is dropped when the partition is no longer assigned, or was
    sought (or reset) since: as Kafka drops the fetches of partitions no longer assigned.
    A dict, so that ``poll``'s check for one is C-level; adding and taking hold a lock, since
    the loop adds while an application thread that fetches takes."""

    __slots__ = ("_lock", "_taken")

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._taken: tuple[TopicPartition | None, tuple] | None = None  # what take returned last

    def add(self, error: TidelogError, tp: TopicPartition | None = None, state: PartitionState | None = None,
            generation: int | None = None) -> None:
        """``error`` for ``tp`` as of its ``state`` at ``generation`` (default: the current one)."""
        if state is not None and generation is None:
            generation = state.generation
        with self._lock:
            self.pop(tp, None)
            self[tp] = (error, state, generation)

    def take(self, partitions: Mapping[TopicPartition, PartitionState]) -> TidelogError | None:
        """The oldest error still about the assignment ``partitions``, removed (older ones that
        are not, dropped); None when there is none."""
        with self._lock:
            while self:
                tp = next(iter(self))
                entry = self.pop(tp)
                error, state, generation = entry
                if tp is None or (partitions.get(tp) is state and state.generation == generation):
                    self._taken = (tp, entry)
                    return error
            return None

    def restore(self, error: BaseException) -> bool:
        """Put back ``error``, the last one ``take`` returned, first (``poll`` raised it and
        its caller left before getting it: a facade's interrupted poll), with its partition,
        so the next ``take`` drops it as any other once the partition is no longer assigned
        or was sought; a newer error of the partition, come meanwhile, stays instead. False
        when ``error`` is not that one."""
        with self._lock:
            taken, self._taken = self._taken, None
            if taken is None or taken[1][0] is not error:
                return False
            tp, entry = taken
            if tp not in self:
                rest = list(self.items())
                self.clear()
                self[tp] = entry
                self.update(rest)
            return True


# ---------------------------------------------------------------------------------------------
# the fetch loop


class Fetcher:
    """The consumer's background fetching for ``subscriptions``. ``list_offsets(wanted,
    deadline)`` resets positions; ``on_data()`` is called when records or errors arrive."""

    def __init__(self, cluster: Cluster, config: ConsumerConfig, subscriptions: SubscriptionState, *,
                 list_offsets: ListOffsets, on_data: Callable[[], None]):
        self._cluster = cluster
        self._config = config
        self._subscriptions = subscriptions
        self._list_offsets = list_offsets
        self._on_data = on_data
        self._backoff_s = config.retry_backoff_ms / 1000
        self._fetching_nodes: set[int] = set()
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.errors = PendingErrors()  # for poll to raise
        self.stats = ConsumerStats()  # fetch latency and bytes, for the consumer's metrics()
        self.fetch_in_loop = True  # False: an application thread fetches (see the module doc)
        self.thread_waker: Callable[[], None] | None = None
        self.state_lock = threading.RLock()

    def wake(self) -> None:
        """Something changed (assignment, position, metadata, a drained buffer): plan again."""
        self._wake.set()
        if self.thread_waker is not None:
            self.thread_waker()

    def replan(self) -> None:
        """From the thread that fetches, which moved positions: plan again. An application
        thread that fetches plans at every pass of its own, so only the loop is woken."""
        if self.fetch_in_loop:
            self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._loop()

    async def _loop(self) -> None:
        subs = self._subscriptions
        while True:
            self._wake = trio.Event()
            now = time.monotonic()
            # a throttled node (KIP-219) gets no fetch planned before its throttle ends
            throttled = self._cluster.throttled()
            with self.state_lock:
                self._start_resets(now)
                if not self.fetch_in_loop:
                    plans, unknown = {}, False
                else:
                    plans, unknown = plan_fetches(subs, self._cluster.metadata,
                                                  self._fetching_nodes.union(throttled), now, self._config)
            if unknown:
                self._cluster.request_update()
            for node, plan in plans.items():
                self._fetching_nodes.add(node)
                self.hold(plan)
                self._nursery.start_soon(self._fetch, node, plan)
            delay = self._next_retry(now) if not unknown else self._backoff_s
            if throttled:
                delay = min(delay, *throttled.values())
            with trio.move_on_after(delay):
                await self._wake.wait()

    def _start_resets(self, now: float) -> None:
        subs = self._subscriptions
        for tp in subs.needing_reset():
            state = subs.partitions[tp]
            if state.retry_at <= now:
                state.resetting = True
                self._nursery.start_soon(self._reset_one, tp, state, state.generation, state.reset)

    def _next_retry(self, now: float) -> float:
        waits = [s.retry_at - now for s in self._subscriptions.partitions.values() if s.retry_at > now]
        return min(waits) if waits else math.inf

    async def _reset_one(self, tp: TopicPartition, state: PartitionState, generation: int,
                         strategy: int) -> None:
        try:
            deadline = time.monotonic() + self._config.request_timeout_ms / 1000
            found = await self._list_offsets({tp: strategy}, deadline)
            with self.state_lock:
                if state.generation == generation and state.reset == strategy:
                    state.seek(found[tp][0])
        except (RequestTimedOut, BrokerConnectionError, ClientClosedError) as e:
            log.debug("offset reset for %s failed: %s", tp, e)
            with self.state_lock:
                state.retry_at = time.monotonic() + self._backoff_s
        except TidelogError as e:
            # retried after a backoff, as Kafka's requestFailed; poll raises a non-retriable error
            # (one kept per partition, however many retries fail before it polls)
            log.log(logging.DEBUG if raised_by_poll(e) else logging.WARNING, "offset reset for %s failed: %s", tp, e)
            with self.state_lock:
                state.retry_at = time.monotonic() + self._backoff_s
            if raised_by_poll(e):
                self.errors.add(e, tp, state, generation)
                self._on_data()
        finally:
            with self.state_lock:
                state.resetting = False
            self.wake()

    async def _fetch(self, node: int, plan: FetchPlan) -> None:
        absorbed = False
        sent = time.monotonic()

        def absorb_now(response: FetchResponse) -> None:
            # by the connection's reader, the pass the response arrived in: records reach a
            # waiting poll without waiting for this task to be scheduled
            nonlocal absorbed
            absorbed = True
            self._absorb(response, plan, sent)

        retry_at = None
        try:
            timeout = (self._config.request_timeout_ms + self._config.fetch_max_wait_ms) / 1000
            response: FetchResponse = await self._cluster.request(node, plan.request, api_key=ApiKey.FETCH,
                                                                  timeout=timeout, early=absorb_now)
        except (BrokerConnectionError, RequestTimedOut, InvalidRequestError, ClientClosedError) as e:
            log.debug("fetch from node %s failed: %s", node, e)
            self._cluster.request_update()
            retry_at = time.monotonic() + self._backoff_s
            return
        except TidelogError as e:
            # the broker refused the whole request (an error body) or we could not authenticate:
            # never the end of the consumer; back off, and poll raises what the application must see
            log.warning("fetch from node %s failed: %s", node, e)
            self._cluster.request_update()
            retry_at = time.monotonic() + self._backoff_s
            if raised_by_poll(e):
                self.errors.add(e)
                self._on_data()
            return
        finally:
            self._fetching_nodes.discard(node)
            self.release(plan, retry_at)
            self._wake.set()
        if not absorbed:
            self._absorb(response, plan, sent)

    def hold(self, plan: FetchPlan) -> None:
        """The fetch ``plan`` is being sent: its partitions are in flight until ``release``."""
        partitions = self._subscriptions.partitions
        for tp in plan.sent:
            partitions[tp].fetching = True

    def release(self, plan: FetchPlan, retry_at: float | None = None) -> None:
        """The fetch ``plan`` was answered, failed or never sent: its partitions may be
        fetched again (not before ``retry_at``, if given)."""
        for tp in plan.sent:
            state = self._subscriptions.partitions.get(tp)
            if state is not None:
                state.fetching = False
                if retry_at is not None:
                    state.retry_at = retry_at

    def _absorb(self, response: FetchResponse, plan: FetchPlan, sent: float) -> None:
        got_data, refresh, _ = self.absorb(response, plan, sent, time.monotonic())  # resets: _fetch wakes
        if refresh:
            self._cluster.request_update()
        if got_data:
            self._on_data()

    def absorb(self, response: FetchResponse, plan: FetchPlan, sent: float, now: float
               ) -> tuple[bool, bool, bool]:
        """Apply a fetch response to the partitions' states: ``(poll has something new, the
        metadata needs a refresh, a position reset was asked for)``. Touches no Trio object:
        the thread that fetches calls it (under ``state_lock`` when that is an application
        thread)."""
        subs = self._subscriptions
        got_data = refresh = reset = False
        first = next(iter(plan.sent), None)
        size = 0
        for t in response.responses:
            for p in t.partitions:
                if p.records:
                    size += len(p.records)
                tp = TopicPartition(t.topic, p.partition_index)
                if tp not in plan.sent:
                    continue
                if response.error_code != NONE.code and p.error_code == NONE.code:
                    p = FetchPartitionResponse(p.partition_index, response.error_code)
                generation, offset = plan.sent[tp]
                state = subs.partitions.get(tp)
                outcome = handle_partition_response(tp, state, generation, offset, p, now=now,
                                                    backoff_s=self._backoff_s, first=tp == first)
                got_data |= self._apply(tp, outcome, state)
                refresh |= outcome.action == "refresh"
                reset |= outcome.action == "reset"
        self.stats.on_fetch(now, now - sent, size)
        return got_data, refresh, reset

    def _apply(self, tp: TopicPartition, outcome: PartitionOutcome, state: PartitionState | None) -> bool:
        """Carry out what one partition's outcome asks; True when poll has something new."""
        if outcome.action == "data":
            return True
        if outcome.action == "reset":
            default = self._subscriptions.default_reset
            if default is not None:
                state.request_reset(default)
                return False
            state.stopped = True
            self.errors.add(outcome.error, tp, state)
            return True
        if outcome.action == "error":
            self.errors.add(outcome.error, tp, state)
            return True
        if outcome.error is not None:  # retried without raising
            log.warning("fetch failed, retrying: %s", outcome.error)
        return False

    # -- handing out records --------------------------------------------------------------------

    def drain(self, limit: int, wake: bool = True) -> list[Record]:
        """Up to ``limit`` buffered records, the partitions taken in rotation. A batch that fails
        its CRC stops its partition and is reported through ``errors``. ``wake``: a partition
        drained empty wakes the fetch loop (False on an application thread that fetches)."""
        out: list[Record] = []
        check = self._config.check_crcs
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
                    self.errors.add(corrupt_batch_error(tp, state.position, completed.failed, e), tp, state)
                    break
                if completed.exhausted:
                    state.buffered.popleft()
                    drained_one |= not state.buffered
            if len(out) >= limit:
                break
        if drained_one and wake:
            self._wake.set()  # pipelining: fetch again while the application works
        return out
