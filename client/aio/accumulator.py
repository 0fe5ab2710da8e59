"""The producer's record accumulator: records in, batches per partition, batches out per node.

Theory of operation (Kafka's RecordAccumulator, adapted to one lock and two kinds of thread).

* Records are appended to the open batch at the tail of their partition's deque; a record
  that does not fit opens a new batch. A batch is *ready* once it is full (or not the last
  one of its deque), its ``linger_ms`` has passed since it was opened, a flush or close is
  in progress, or someone is blocked waiting for buffer memory. The sender asks ``ready``
  which leader nodes have a ready batch, then ``drain``s those nodes: one ProduceRequest
  per node holding at most one batch per partition (aiokafka's ``drain_by_nodes``, Kafka's
  ``drainBatchesForOneNode``), up to ``max_request_size`` bytes.
* Callers may append from any thread. One ``threading.Lock`` guards every structure; the
  hot path takes it once per record and never hops threads. The sender (in the Trio thread)
  is woken through the ``wakeup`` callback only when a batch is opened or becomes full, at
  most once until it next looks (``_wake_pending``): the linger timer starts with a batch, so
  appends to an open batch need no wake-up.
* Every record gets a ``RecordFuture`` that points at its batch's ``ProduceResult`` and its
  index: offset = base offset + index, as in Kafka. Completion is per batch (one
  ``threading.Event`` and, for Trio waiters, one ``trio.Event``), never per record.
* ``buffer_memory``: appending reserves the record's estimated size and completion releases
  its batch's; ``append`` returns None when the reservation would exceed the limit, and the
  caller blocks (``wait_for_memory`` in a thread, ``wait_for_memory_async`` in Trio) until
  memory is released or ``max_block_ms`` passes.
* Splits: a batch of several records the broker refused as too large (MESSAGE_TOO_LARGE)
  is split (``split_and_reenqueue``) into pieces queued where it was, sent as retries; its
  ProduceResult hands its records over to the pieces' (``hand_over``, ``locate``) and
  completes with the last of them, so the records' futures keep working unchanged.
* Retries: ``reenqueue`` puts a failed batch back in front of the newer batches of its
  partition (ordered by creation sequence, so two failed batches keep their order). A
  partition whose head batch is a retry is sent only when nothing of it is in flight, one
  batch at a time (max in flight 1 per partition while retrying), after ``retry_backoff_ms``.
* Nothing is dropped silently: ``expire`` fails queued batches past ``delivery_timeout_ms``;
  ``abort`` fails everything still queued (close without a flush).

All methods but ``append``/``append_keyless``/``wait_for_memory`` are called from the Trio
thread, except ``ready`` and ``drain``, which an application thread of the blocking producer
also calls, under the sender's lock that the Trio thread's rounds take too
(``Sender._send_from_caller``). Time is passed in (``now``, monotonic seconds), so readiness is unit tested with a
fake clock.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import trio

from tidelog.aio.partitioner import StickyPartitioner
from tidelog.errors import ClientClosedError, RequestTimedOut, TidelogError
from tidelog.protocol.records import HEADER_SIZE, BatchBuilder, Codec
from tidelog.protocol.topics import TopicPartition
from tidelog.records import RecordMetadata

log = logging.getLogger(__name__)

__all__ = ["ProduceResult", "RecordFuture", "RecordFutures", "BulkRecords", "ProducerBatch",
           "RecordAccumulator", "ReadyCheck", "record_size"]

RECORD_OVERHEAD = 32  # BatchBuilder's per-record estimate
BATCH_OVERHEAD = HEADER_SIZE + 5


def record_size(key: bytes | None, value: bytes | None,
                headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """Estimated encoded size of a record (BatchBuilder's estimate)."""
    size = RECORD_OVERHEAD + (len(key) if key else 0) + (len(value) if value else 0)
    if headers:
        size += sum(len(k) + len(v or b"") + 8 for k, v in headers)
    return size


_WAITERS_LOCK = threading.Lock()  # the first waiters of a batch make one event between them


class ProduceResult:
    """The outcome of one batch (Kafka's ProduceRequestResult), shared by its records' futures.

    Completed once, on the Trio thread; waitable from any thread (``wait``) and from Trio
    (``wait_async``). Callbacks run on the Trio thread when the batch completes; one that
    raises is logged and the others still run.

    The thread-side event is made by the first waiter only: most batches are never waited
    on one by one, and a ``threading.Event`` (a lock and a condition) per batch is a cost on
    every send that opens one. ``complete`` sets ``_done`` and then looks for the event; a
    waiter publishes the event and then looks at ``_done``: one of them sees the other."""

    __slots__ = ("tp", "base_offset", "log_append_time", "error", "_done", "_event", "_trio_event",
                 "_callbacks", "_pieces")

    def __init__(self, tp: TopicPartition):
        self.tp = tp
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self._done = False
        self._event: threading.Event | None = None
        self._trio_event: trio.Event | None = None
        self._callbacks: list[Callable[[], None]] | None = None
        # once the batch was split (``hand_over``): where each piece starts in this batch, and
        # the pieces' results
        self._pieces: tuple[list[int], list[ProduceResult]] | None = None

    def done(self) -> bool:
        return self._done

    def complete(self, base_offset: int = -1, log_append_time: int = -1,
                 error: BaseException | None = None) -> None:
        if self._done or self._pieces is not None:  # a split batch completes with its pieces
            return
        self._settle(base_offset, log_append_time, error)

    def hand_over(self, starts: list[int], pieces: list[ProduceResult]) -> None:
        """The batch was split (the broker refused it as too large): record ``i`` now goes in
        the piece ``k`` whose start ``starts[k]`` is the last at or before ``i``, as record
        ``i - starts[k]`` there (``locate``). This result completes once every piece has,
        with the first failed piece's error, so a record's future and callbacks, which wait
        on this result, resolve once the whole batch has (Kafka chains each record's future
        to its piece's instead)."""
        self._pieces = (starts, pieces)
        pending = [len(pieces)]

        def piece_done() -> None:
            pending[0] -= 1
            if not pending[0]:
                self._settle(error=next((p.error for p in pieces if p.error is not None), None))

        for piece in pieces:
            piece.add_callback(piece_done)

    def locate(self, index: int) -> tuple[ProduceResult, int]:
        """The result that holds record ``index`` of this batch, and the record's index there:
        this one, or the piece's it went to when the batch was split (again and again)."""
        result = self
        while result._pieces is not None:
            starts, pieces = result._pieces
            k = bisect.bisect_right(starts, index) - 1
            result, index = pieces[k], index - starts[k]
        return result, index

    def error_of(self, index: int) -> BaseException | None:
        """The error that failed record ``index`` (None: it did not fail, or is pending)."""
        return self.error if self._pieces is None else self.locate(index)[0].error

    def _settle(self, base_offset: int = -1, log_append_time: int = -1,
                error: BaseException | None = None) -> None:
        if self._done:
            return
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.error = error
        self._done = True
        event = self._event
        if event is not None:
            event.set()
        if self._trio_event is not None:
            self._trio_event.set()
        callbacks, self._callbacks = self._callbacks, None
        for cb in callbacks or ():
            # an application's callback that raises must not keep the others (of this batch,
            # of the batches completed after it) from running, nor stop the sender: Kafka logs it
            try:
                cb()
            except Exception:
                log.exception("a callback of a record sent to %s raised", self.tp)

    def wait(self, timeout: float | None = None) -> bool:
        if self._done:
            return True
        with _WAITERS_LOCK:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if self._done:  # completed before the event was published: it may not be set
            return True
        return event.wait(timeout)

    async def wait_async(self) -> None:
        if self._done:
            await trio.lowlevel.checkpoint()
            return
        if self._trio_event is None:
            self._trio_event = trio.Event()
        await self._trio_event.wait()

    def add_callback(self, cb: Callable[[], None]) -> None:
        """Run ``cb()`` when done (now, if already done), on the client's Trio thread: keep
        it short, it delays the sender. The public per-batch completion hook (see
        ``RecordFuture.batch``)."""
        if self._done:
            cb()
        elif self._callbacks is None:
            self._callbacks = [cb]
        else:
            self._callbacks.append(cb)


class RecordFuture:
    """The future of one sent record: awaitable in Trio (``await fut``) and blocking
    (``fut.result(timeout)``) from any other thread. Resolves to RecordMetadata or raises the
    error that failed its batch."""

    __slots__ = ("_result", "_index", "_timestamp")

    def __init__(self, result: ProduceResult, index: int, timestamp: int):
        self._result = result
        self._index = index
        self._timestamp = timestamp

    @property
    def topic_partition(self) -> TopicPartition:
        return self._result.tp

    @property
    def batch(self) -> ProduceResult:
        """The completion of the batch this record went in (Kafka's ProduceRequestResult),
        shared by every record of that batch: ``batch.add_callback(fn)`` calls ``fn()`` once
        when the batch completes (on the client's Trio thread; ``batch.error`` then says
        whether it failed). One hook per batch instead of one ``add_done_callback`` per
        record: records whose ``batch`` is the same object (``is``) complete together."""
        return self._result

    def done(self) -> bool:
        return self._result.done()

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The RecordMetadata; raises the batch's error, or RequestTimedOut after ``timeout``
        seconds (do not call this from the client's own Trio thread: await the future)."""
        if not self._result.wait(timeout):
            raise RequestTimedOut(f"record for {self._result.tp} not acknowledged within {timeout:g} s")
        return self._metadata()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._result.wait(timeout):
            raise RequestTimedOut(f"record for {self._result.tp} not acknowledged within {timeout:g} s")
        return self._error

    @property
    def _error(self) -> BaseException | None:
        return self._result.error_of(self._index)

    def _metadata(self) -> RecordMetadata:
        r, index = self._result, self._index
        if r._pieces is not None:
            r, index = r.locate(index)
        if r.error is not None:
            raise r.error
        offset = -1 if r.base_offset < 0 else r.base_offset + index
        ts = r.log_append_time if r.log_append_time >= 0 else self._timestamp
        return RecordMetadata(r.tp.topic, r.tp.partition, offset, ts)

    def add_done_callback(self, fn: Callable[["RecordFuture"], Any]) -> None:
        """Call ``fn(future)`` once resolved: immediately if it already is, else on the
        client's Trio thread (keep it short: it delays the sender)."""
        self._result.add_callback(lambda: fn(self))

    # kafka-python's FutureRecordMetadata: ``get``, ``add_callback``, ``add_errback``,
    # ``is_done``, ``succeeded()``, ``failed()``, ``value`` (its ``exception`` is an attribute
    # there and a method here: ``exception(timeout)``)

    @property
    def is_done(self) -> bool:
        return self._result.done()

    def succeeded(self) -> bool:
        return self._result.done() and self._error is None

    def failed(self) -> bool:
        return self._result.done() and self._error is not None

    @property
    def value(self) -> RecordMetadata | None:
        """The RecordMetadata once acknowledged, else None (kafka-python's ``value``)."""
        return self._metadata() if self.succeeded() else None

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """kafka-python's name for ``result``: the RecordMetadata, or the batch's error, or
        RequestTimedOut after ``timeout`` seconds."""
        return self.result(timeout)

    def add_callback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "RecordFuture":
        """Call ``fn(*args, metadata, **kwargs)`` if the record is acknowledged (as
        kafka-python's ``add_callback``), when ``add_done_callback`` would; returns the future,
        so ``send(...).add_callback(ok).add_errback(failed)`` chains."""
        def done() -> None:
            if self._error is None:
                fn(*args, self._metadata(), **kwargs)
        self._result.add_callback(done)
        return self

    def add_errback(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> "RecordFuture":
        """Call ``fn(*args, error, **kwargs)`` if the record fails (as kafka-python's
        ``add_errback``); returns the future."""
        def done() -> None:
            error = self._error
            if error is not None:
                fn(*args, error, **kwargs)
        self._result.add_callback(done)
        return self

    async def _wait(self) -> RecordMetadata:
        await self._result.wait_async()
        return self._metadata()

    def __await__(self):
        return self._wait().__await__()

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error else "done")
        return f"<RecordFuture {self._result.tp} #{self._index} {state}>"


class RecordFutures(Sequence[RecordFuture]):
    """The futures of the records of one ``send_many`` call, in call order.

    A read-only sequence of RecordFuture, each built when accessed: the records of one call
    land in a few batches, so this keeps one entry per run of records sharing a batch (the
    call index where the run starts, the batch's ProduceResult, the offset delta of the run's
    first record in the batch), not an object per record. Whole-call helpers: ``done()``,
    ``result(timeout)`` (every RecordMetadata, or the first failed record's error),
    ``exception(timeout)``, ``add_done_callback`` and, in Trio, ``await futures``."""

    __slots__ = ("_starts", "_results", "_deltas", "_timestamp", "_count")

    def __init__(self, timestamp: int):
        self._starts: list[int] = []
        self._results: list[ProduceResult] = []
        self._deltas: list[int] = []
        self._timestamp = timestamp
        self._count = 0

    def _add_run(self, result: ProduceResult, delta: int, count: int) -> None:
        """The next ``count`` records of the call went to ``result``'s batch, from offset
        delta ``delta`` on (runs are added in call order)."""
        self._starts.append(self._count)
        self._results.append(result)
        self._deltas.append(delta)
        self._count += count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("record index out of range")
        k = bisect.bisect_right(self._starts, i) - 1
        return RecordFuture(self._results[k], self._deltas[k] + i - self._starts[k], self._timestamp)

    def __iter__(self) -> Iterator[RecordFuture]:
        ends = self._starts[1:] + [self._count]
        for start, end, result, delta in zip(self._starts, ends, self._results, self._deltas):
            for index in range(delta, delta + end - start):
                yield RecordFuture(result, index, self._timestamp)

    def batches(self) -> list[tuple[int, ProduceResult]]:
        """The call's runs of records sharing a batch, in call order: (index of the run's
        first record, the batch's ProduceResult); a completion hook per batch, as
        ``RecordFuture.batch``. A batch appears in more than one run when the call's records
        alternate between partitions."""
        return list(zip(self._starts, self._results))

    def done(self) -> bool:
        return all(r.done() for r in self._results)

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for r in self._results:
            if not r.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                raise RequestTimedOut(f"{self._count} record(s) not all acknowledged within {timeout:g} s")

    def result(self, timeout: float | None = None) -> list[RecordMetadata]:
        """Every record's RecordMetadata, in call order, once all batches completed; raises
        the first failed record's error, or RequestTimedOut after ``timeout`` seconds."""
        self._wait(timeout)
        return [f._metadata() for f in self]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error of the first failed record (in call order), or None if all succeeded."""
        self._wait(timeout)
        ends = self._starts[1:] + [self._count]
        for start, end, result, delta in zip(self._starts, ends, self._results, self._deltas):
            if result.error is not None:  # the first failed piece's, if the batch was split
                error = next(filter(None, map(result.error_of, range(delta, delta + end - start))), None)
                if error is not None:
                    return error
        return None

    def add_done_callback(self, fn: Callable[["RecordFutures"], Any]) -> None:
        """Call ``fn(futures)`` once every record is resolved (see RecordFuture's)."""
        pending = set(map(id, self._results))
        if not pending:
            fn(self)
            return

        def one_done(result: ProduceResult) -> None:
            pending.discard(id(result))
            if not pending:
                fn(self)

        for r in dict.fromkeys(self._results):
            r.add_callback(lambda r=r: one_done(r))

    async def _wait_async(self) -> list[RecordMetadata]:
        for r in self._results:
            await r.wait_async()
        return [f._metadata() for f in self]

    def __await__(self):
        return self._wait_async().__await__()

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<RecordFutures {self._count} records in {len(set(map(id, self._results)))} batch(es) {state}>"


class BulkRecords:
    """The serialized records of one ``send_many`` call, and how far appending them got.

    ``ends[i]`` is the estimated size of records ``[0, i)`` (``ends[0] == 0``), so any run's
    size is one subtraction and the records that fit in ``room`` bytes are one bisect.
    ``runs`` lists ``(end, partition)``: records up to call index ``end`` go to
    ``partition`` (None: the topic's sticky batch); None until the partitions are known."""

    __slots__ = ("topic", "values", "keys", "ends", "timestamp", "runs", "futures")

    def __init__(self, topic: str, values: list[bytes | None], keys: list[bytes | None] | None,
                 ends: list[int], timestamp: int):
        self.topic = topic
        self.values = values
        self.keys = keys
        self.ends = ends
        self.timestamp = timestamp
        self.runs: list[tuple[int, int | None]] | None = None
        self.futures = RecordFutures(timestamp)

    @property
    def appended(self) -> int:
        return len(self.futures)


_batch_seq = itertools.count()


class ProducerBatch:
    """Records of one partition on their way to its leader.

    ``room`` is how many more estimated bytes fit (``batch_size`` minus the batch overhead
    and ``memory``); a batch is *full* once ``room <= 0``, which ``mark_full`` forces (when
    the next record does not fit, or the batch is drained). A new batch takes its first
    record whatever its size."""

    __slots__ = ("tp", "builder", "result", "futures", "created", "deadline", "seq", "memory",
                 "room", "attempts", "retry_at", "payload", "last_error", "sent_in_line")

    def __init__(self, tp: TopicPartition, codec: Codec, created: float, deadline: float,
                 batch_size: int = 16384):
        self.tp = tp
        self.builder = BatchBuilder(codec)
        self.result = ProduceResult(tp)
        self.created = created
        self.deadline = deadline  # created + delivery_timeout
        # creation order, which keeps retried batches in order: the pieces of a split batch
        # extend its seq, and so sort after it and before every newer batch
        self.seq: tuple[int, ...] = (next(_batch_seq),)
        self.memory = 0  # bytes of buffer_memory this batch holds
        self.room = batch_size - BATCH_OVERHEAD
        self.attempts = 0  # sends so far
        self.retry_at = 0.0  # not before this time when retrying
        self.payload: bytes | None = None  # the encoded batch, built once at first send
        self.last_error: BaseException | None = None  # why the latest attempt failed
        self.sent_in_line = False  # idempotent: every earlier sequence was acknowledged when last sent

    def __len__(self) -> int:
        return len(self.builder)

    def __repr__(self) -> str:
        return f"<ProducerBatch {self.tp} {len(self)} records, attempt {self.attempts}>"

    @property
    def full(self) -> bool:
        return self.room <= 0

    def mark_full(self) -> None:
        """Take no more records (the sender may send it as soon as it is at the head)."""
        if self.room > 0:
            self.room = 0

    def append(self, timestamp: int, key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]] | None, size: int) -> RecordFuture:
        index = self.builder.append(timestamp, key, value, headers)
        self.memory += size
        self.room -= size
        return RecordFuture(self.result, index, timestamp)

    def encode(self) -> bytes:
        if self.payload is None:
            self.payload = self.builder.build()
        return self.payload

    def split(self, batch_size: int, now: float) -> list[ProducerBatch]:
        """The records of this batch, which the broker refused as too large, in order in
        smaller batches (Kafka's ``ProducerBatch.split``): each takes records while they fit in
        ``batch_size`` and in half this batch's records' size (so a batch too large for a
        topic whose max.message.bytes is below ``batch_size`` still shrinks, and a batch of
        two or more records gives two or more pieces). The pieces keep its deadline and
        attempts, and are retried at once, one at a time, in order (they are sorted by
        ``seq``); the caller moves the records' completion (``ProduceResult.hand_over``),
        memory and sequences over."""
        half = (self.builder.estimated_size - BATCH_OVERHEAD + 1) // 2
        limit = min(batch_size, half + BATCH_OVERHEAD)
        pieces: list[ProducerBatch] = []
        piece = None
        for timestamp, key, value, headers in self.builder.records():
            size = record_size(key, value, headers)
            if piece is None or size > piece.room:
                piece = ProducerBatch(self.tp, self.builder.codec, self.created, self.deadline, limit)
                piece.seq = self.seq + (len(pieces),)
                piece.attempts, piece.retry_at, piece.last_error = max(self.attempts, 1), now, self.last_error
                pieces.append(piece)
            piece.builder.append(timestamp, key, value, headers)
            piece.memory += size
            piece.room -= size
        for piece in pieces:
            piece.mark_full()
        return pieces

    # the idempotent producer's fields (-1 until the batch is first drained)
    @property
    def producer_id(self) -> int:
        return self.builder.producer_id

    @property
    def producer_epoch(self) -> int:
        return self.builder.producer_epoch

    @property
    def base_sequence(self) -> int:
        return self.builder.base_sequence

    def set_producer_state(self, producer_id: int, producer_epoch: int, base_sequence: int) -> None:
        """Stamp (or, with -1s, clear) id, epoch and sequence; the batch is encoded anew."""
        b = self.builder
        b.producer_id, b.producer_epoch, b.base_sequence = producer_id, producer_epoch, base_sequence
        self.payload = None

    @property
    def size(self) -> int:
        return len(self.payload) if self.payload is not None else self.builder.estimated_size


class LeaderView(Protocol):
    def leader_for(self, tp: TopicPartition) -> int | None: ...


class ReadyCheck(NamedTuple):
    nodes: set[int]  # leaders with at least one sendable batch
    next_delay: float  # seconds until something may become ready or expire (inf: nothing)
    unknown_leaders: bool  # some partition with queued batches has no known leader


class RecordAccumulator:
    """See the module docstring. ``wakeup`` is called (outside the lock, from whatever thread
    appended) when the sender should look again; the sender makes it thread-safe."""

    def __init__(self, *, batch_size: int = 16384, buffer_memory: int = 32 << 20,
                 linger_s: float = 0.005, codec: Codec = Codec.NONE,
                 delivery_timeout_s: float = 120.0, retry_backoff_s: float = 0.1,
                 partitioner: StickyPartitioner | None = None,
                 wakeup: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] | None = None):
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.linger_s = linger_s
        self.codec = Codec(codec)
        self.delivery_timeout_s = delivery_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.partitioner = partitioner or StickyPartitioner()
        self.wakeup = wakeup
        self.clock = clock or time.monotonic
        self.lock = threading.Lock()
        self._memory_freed = threading.Condition(self.lock)
        self._memory_event = trio.Event()  # Trio-side waiters; replaced on every release
        self._batches: dict[TopicPartition, deque[ProducerBatch]] = {}
        self._incomplete: set[ProducerBatch] = set()
        self._in_flight: dict[TopicPartition, int] = {}
        # max_in_flight_requests_per_connection 1 (set by the producer): at most one batch of a
        # partition in flight, even across a leader change (Kafka's muted partitions), so a
        # retried batch can never land after a newer one sent to the new leader meanwhile
        self.guarantee_order = False
        # the idempotent producer's sequences (tidelog.aio.idempotence.IdempotenceState, set by
        # the producer): a batch gets its sequence when first drained, and keeps it
        self.idempotence = None
        self._sticky: dict[str, ProducerBatch] = {}  # topic -> the open batch of keyless records
        self._used = 0
        self._memory_waiters = 0
        self._flushing = 0
        self._closed = False
        self._fatal: BaseException | None = None  # why records are refused, if not a close
        self.closed_for_retries = False  # set at the end of close: retries fail instead
        self._wake_pending = False

    # -- appending (any thread) -----------------------------------------------------------------

    def append(self, tp: TopicPartition, timestamp: int, key: bytes | None, value: bytes | None,
               headers: Sequence[tuple[str, bytes | None]] | None, size: int) -> RecordFuture | None:
        """Add a record to ``tp``'s open batch; None when buffer memory is exhausted."""
        # The per-record hot path (as is append_keyless), written for speed: one lock, the
        # common case (room in the open batch) inline, no wake-up unless the batch filled.
        with self.lock:
            if self._closed:
                raise self.closed_error()
            used = self._used + size
            if used > self.buffer_memory and self._used:
                return None
            dq = self._batches.get(tp)
            batch = dq[-1] if dq else None
            if batch is not None and size <= batch.room:
                index = batch.builder.append(timestamp, key, value, headers)
                batch.memory += size
                batch.room -= size
                self._used = used
                if batch.room > 0 or self._wake_pending:
                    return RecordFuture(batch.result, index, timestamp)
                self._wake_pending = True  # newly full: ready now
                future = RecordFuture(batch.result, index, timestamp)
            else:
                batch, opened = self._batch_with_room(tp, size)
                future = batch.append(timestamp, key, value, headers, size)
                self._used = used
                if not ((opened or batch.room <= 0) and self._take_wake()):
                    return future
        self.wakeup()
        return future

    def append_keyless(self, topic: str, num_partitions: int, available: Sequence[int],
                       timestamp: int, value: bytes | None,
                       headers: Sequence[tuple[str, bytes | None]] | None,
                       size: int) -> RecordFuture | None:
        """Add a record without key or partition. It goes to the topic's sticky batch while
        that is open and has room; otherwise the sticky partitioner moves the topic to another
        partition (KIP-480) and the record opens or joins that partition's batch."""
        with self.lock:
            if self._closed:
                raise self.closed_error()
            used = self._used + size
            if used > self.buffer_memory and self._used:
                return None
            batch = self._sticky.get(topic)
            if batch is not None and size <= batch.room:
                index = batch.builder.append(timestamp, None, value, headers)
                batch.memory += size
                batch.room -= size
                self._used = used
                if batch.room > 0 or self._wake_pending:
                    return RecordFuture(batch.result, index, timestamp)
                self._wake_pending = True  # newly full: ready now
                future = RecordFuture(batch.result, index, timestamp)
            else:
                batch, opened = self._sticky_batch(topic, num_partitions, available, batch, size)
                future = batch.append(timestamp, None, value, headers, size)
                self._used = used
                if not ((opened or batch.room <= 0) and self._take_wake()):
                    return future
        self.wakeup()
        return future

    def append_many(self, bulk: BulkRecords, num_partitions: int, available: Sequence[int]) -> int:
        """Append ``bulk``'s records, from the first not yet appended, in order and under one
        lock: each run of records to its partition, or to the topic's sticky batches as
        ``append_keyless`` does. Records are copied into batches a batch-full at a time (one
        bisect finds how many fit), and each run is one entry in ``bulk.futures``.

        Returns 0 once every record is queued, else the size of the next record, for which
        buffer memory is exhausted: wait for it (``wait_for_memory``) and call again."""
        ends, values, keys, runs = bulk.ends, bulk.values, bulk.keys, bulk.runs
        n = len(values)
        wake = False
        with self.lock:
            if self._closed:
                raise self.closed_error()
            i = bulk.appended
            r = bisect.bisect_right([end for end, _ in runs], i) if runs else 0  # the run holding i
            while i < n:
                run_end, partition = runs[r] if runs else (n, None)
                size = ends[i + 1] - ends[i]
                if self._used and self._used + size > self.buffer_memory:
                    break
                if partition is None:
                    batch = self._sticky.get(bulk.topic)
                    opened = False
                    if batch is None or size > batch.room:
                        batch, opened = self._sticky_batch(bulk.topic, num_partitions, available, batch, size)
                else:
                    batch, opened = self._batch_with_room(TopicPartition(bulk.topic, partition), size)
                # the records from i on that fit in the batch and in buffer memory (at least i)
                limit = ends[i] + max(size, min(batch.room, self.buffer_memory - self._used))
                j = bisect.bisect_right(ends, limit, i + 1, run_end + 1) - 1
                run_size = ends[j] - ends[i]
                delta = batch.builder.extend(bulk.timestamp, values[i:j],
                                             None if keys is None else keys[i:j], run_size)
                batch.memory += run_size
                batch.room -= run_size
                self._used += run_size
                bulk.futures._add_run(batch.result, delta, j - i)
                if (opened or batch.room <= 0) and self._take_wake():
                    wake = True
                i = j
                if i == run_end:
                    r += 1
            needed = ends[i + 1] - ends[i] if i < n else 0
        if wake:
            self.wakeup()
        return needed

    def _sticky_batch(self, topic: str, num_partitions: int, available: Sequence[int],
                      current: ProducerBatch | None, size: int) -> tuple[ProducerBatch, bool]:
        """Under the lock: the batch for the topic's next keyless record when the sticky one
        is missing or has no room for ``size`` bytes: the sticky partitioner picks another
        partition, whose open batch (or a new one) becomes the sticky batch."""
        if current is None:
            p = self.partitioner.partition(topic, num_partitions, available)
        else:
            current.mark_full()
            p = self.partitioner.on_new_batch(topic, num_partitions, available, current.tp.partition)
        tp = current.tp if current is not None and current.tp.partition == p else TopicPartition(topic, p)
        batch, opened = self._batch_with_room(tp, size)
        self._sticky[topic] = batch
        return batch, opened

    def _batch_with_room(self, tp: TopicPartition, size: int) -> tuple[ProducerBatch, bool]:
        """Under the lock: ``tp``'s open batch if ``size`` bytes fit, else a new batch (the
        old one is marked full). Returns ``(batch, opened)``; a new batch takes its first
        record whatever its size."""
        dq = self._batches.get(tp)
        if dq is None:
            dq = self._batches[tp] = deque()
        batch = dq[-1] if dq else None
        if batch is not None and size <= batch.room:
            return batch, False
        if batch is not None:
            batch.mark_full()
        now = self.clock()
        batch = ProducerBatch(tp, self.codec, now, now + self.delivery_timeout_s, self.batch_size)
        dq.append(batch)
        self._incomplete.add(batch)
        return batch, True

    def _take_wake(self) -> bool:
        """Under the lock: True if the caller should wake the sender (one pending wake-up
        at a time; ``ready`` clears it)."""
        if self._wake_pending:
            return False
        self._wake_pending = True
        return True

    # -- buffer memory --------------------------------------------------------------------------

    def wait_for_memory(self, size: int, deadline: float) -> None:
        """Block (a non-Trio thread) until ``size`` bytes fit or monotonic ``deadline`` passes
        (RequestTimedOut). The sender treats every batch as ready meanwhile."""
        with self.lock:
            self._memory_waiters += 1
        self.wakeup()
        try:
            with self.lock:
                while self._used + size > self.buffer_memory and self._used:
                    remaining = deadline - self.clock()
                    if remaining <= 0:
                        raise self._memory_timeout(size)
                    self._memory_freed.wait(min(remaining, 0.5))
        finally:
            with self.lock:
                self._memory_waiters -= 1

    async def wait_for_memory_async(self, size: int, deadline: float) -> None:
        """The Trio side of ``wait_for_memory`` (``deadline`` on the accumulator's clock)."""
        with self.lock:
            self._memory_waiters += 1
        self.wakeup()
        try:
            while True:
                with self.lock:
                    if self._used + size <= self.buffer_memory or not self._used:
                        return
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise self._memory_timeout(size)
                with trio.move_on_after(remaining):
                    await self._memory_event.wait()
        finally:
            with self.lock:
                self._memory_waiters -= 1

    def _memory_timeout(self, size: int) -> RequestTimedOut:
        return RequestTimedOut(
            f"buffer_memory ({self.buffer_memory} bytes) stayed exhausted for max_block_ms: "
            f"{self._used} bytes are waiting to be sent, this record needs {size}")

    @property
    def used_memory(self) -> int:
        return self._used

    # -- the sender's side (Trio thread) --------------------------------------------------------

    def ready(self, metadata: LeaderView, now: float, busy_nodes: Iterable[int] = ()) -> ReadyCheck:
        """Which leaders have a sendable batch, and how long until that may change."""
        busy = set(busy_nodes)
        nodes: set[int] = set()
        next_delay = math.inf
        unknown = False
        with self.lock:
            self._wake_pending = False
            urgent = self._urgent()
            for tp, dq in self._batches.items():
                if not dq:
                    continue
                batch = dq[0]
                next_delay = min(next_delay, batch.deadline - now)
                leader = metadata.leader_for(tp)
                if leader is None:
                    unknown = True
                    continue
                if leader in busy or leader in nodes:
                    continue
                wait = self._wait_before_send(tp, dq, batch, now, urgent)
                if wait <= 0:
                    nodes.add(leader)
                elif wait < math.inf:
                    next_delay = min(next_delay, wait)
        return ReadyCheck(nodes, max(0.0, next_delay), unknown)

    def sole_ready(self, metadata: LeaderView, now: float) -> int | None:
        """``ready`` for a producer that sends as it goes (linger_ms 0, from the caller's
        thread): when one partition alone holds queued batches and its head may be sent now,
        its leader. None when ``ready`` must decide (several partitions, nothing sendable, no
        leader known). Clears the pending wake-up, as ``ready`` does."""
        with self.lock:
            self._wake_pending = False
            if len(self._batches) != 1:
                return None
            [(tp, dq)] = self._batches.items()
            if dq and self._wait_before_send(tp, dq, dq[0], now, self._urgent()) <= 0:
                return metadata.leader_for(tp)
            return None

    def _urgent(self) -> bool:
        """Under the lock: every head batch goes now, lingering or not (a thread waits for
        buffer memory, a flush, the close)."""
        return self._memory_waiters > 0 or self._flushing > 0 or self._closed

    def _wait_before_send(self, tp: TopicPartition, dq: deque[ProducerBatch], batch: ProducerBatch,
                          now: float, urgent: bool) -> float:
        """Seconds until the head batch may be sent (<= 0: now; inf: when something else
        happens, e.g. the partition's in-flight retry completes)."""
        if self.guarantee_order and self._in_flight.get(tp):
            return math.inf
        if self.idempotence is not None and batch.base_sequence < 0 and not self.idempotence.may_assign(tp):
            return math.inf  # no producer id yet, or the partition waits to move to a new epoch
        if batch.attempts:  # a retry: alone, in order, after its backoff
            if self._in_flight.get(tp):
                return math.inf
            return batch.retry_at - now
        if batch.full or len(dq) > 1 or urgent:
            return 0.0
        return batch.created + self.linger_s - now

    def drain(self, metadata: LeaderView, nodes: Iterable[int], max_request_size: int,
              now: float) -> dict[int, list[ProducerBatch]]:
        """Take the sendable batches of the partitions led by each of ``nodes``, up to
        ``max_request_size`` bytes per node (always at least one batch): the head batch of
        each partition, and behind it the partition's other closed (full) batches, which go
        in the same request as one run of back-to-back batches (the broker appends them
        together, in order), so a partition that fills batches faster than requests return
        does not pay one request per batch. A retried batch goes alone. Drained batches are
        in flight until ``complete`` or ``reenqueue``."""
        wanted = set(nodes)
        out: dict[int, list[ProducerBatch]] = {}
        sizes: dict[int, int] = {}
        with self.lock:
            urgent = self._urgent()
            for tp in list(self._batches):
                dq = self._batches[tp]
                leader = metadata.leader_for(tp)
                if leader not in wanted or not dq:
                    continue
                batch = dq[0]
                if self.guarantee_order and self._in_flight.get(tp):
                    continue
                if batch.attempts and (self._in_flight.get(tp) or batch.retry_at > now):
                    continue
                seqs = self.idempotence
                if seqs is not None and batch.base_sequence < 0 and not seqs.may_assign(tp):
                    continue
                size = batch.size
                if leader in out and sizes[leader] + size > max_request_size:
                    continue
                taken = out.setdefault(leader, [])
                total, n = sizes.get(leader, 0), 0
                while True:
                    dq.popleft()
                    batch.mark_full()
                    if seqs is not None and batch.base_sequence < 0:
                        seqs.assign(batch)
                    taken.append(batch)
                    total += size
                    n += 1
                    if batch.attempts or not dq:
                        break
                    batch = dq[0]
                    size = batch.size
                    if (batch.attempts or not (batch.full or len(dq) > 1 or urgent)
                            or total + size > max_request_size):
                        break
                self._in_flight[tp] = self._in_flight.get(tp, 0) + n
                sizes[leader] = total
                if not dq:
                    del self._batches[tp]
        return out

    def reenqueue(self, batch: ProducerBatch, now: float) -> None:
        """Put an in-flight batch back for a retry after ``retry_backoff_ms``, in front of the
        newer batches of its partition."""
        with self.lock:
            self._release_in_flight(batch.tp)
            batch.retry_at = now + self.retry_backoff_s
            self._queue_back(batch, [batch])

    def split_and_reenqueue(self, batch: ProducerBatch, now: float) -> list[ProducerBatch]:
        """Split an in-flight batch the broker refused as too large (MESSAGE_TOO_LARGE) and
        queue the pieces for a retry where it would have been queued (Kafka's
        ``splitAndReenqueue``); its records' futures complete with the pieces. An idempotent
        batch's sequences go to the pieces in order, so the partition's sequence goes on
        without a gap (``IdempotenceState.split``). Returns the pieces."""
        pieces = batch.split(self.batch_size, now)
        starts = list(itertools.accumulate((len(p) for p in pieces[:-1]), initial=0))
        batch.result.hand_over(starts, [p.result for p in pieces])  # before any piece can be sent
        with self.lock:
            self._release_in_flight(batch.tp)
            self._incomplete.discard(batch)
            self._incomplete.update(pieces)
            freed = batch.memory - sum(p.memory for p in pieces)  # re-estimated per piece
            self._used -= freed
            batch.memory = 0
            if freed > 0:
                self._memory_freed.notify_all()
            if self.idempotence is not None and batch.base_sequence >= 0:
                self.idempotence.split(batch, pieces)
            self._queue_back(batch, pieces)
        return pieces

    def _queue_back(self, batch: ProducerBatch, replacements: list[ProducerBatch]) -> None:
        """Queue ``replacements`` (``batch`` itself, or its pieces) where ``batch`` was drained
        from: in front of its partition's newer batches. Under the lock."""
        dq = self._batches.get(batch.tp)
        if dq is None:
            dq = self._batches[batch.tp] = deque()
        index = 0
        while index < len(dq) and dq[index].seq < batch.seq:
            index += 1
        for piece in reversed(replacements):
            dq.insert(index, piece)

    def clear_queued_sequences(self, refused: ProducerBatch) -> None:
        """``refused`` is known not to be in the log and takes a sequence of a new epoch: so do
        the batches of its partition and producer epoch queued for a retry behind it (a broker
        takes a producer's sequences only in order, so none of them is in the log either).
        Kept, they would hold the partition on the old epoch while waiting behind ``refused``,
        which waits for the partition to move to the new one."""
        old = (refused.producer_id, refused.producer_epoch)
        with self.lock:
            for b in self._batches.get(refused.tp, ()):
                if b.seq > refused.seq and b.base_sequence >= 0 and (b.producer_id, b.producer_epoch) == old:
                    self.idempotence.clear_sequence(b)

    def complete(self, batch: ProducerBatch, base_offset: int = -1, log_append_time: int = -1,
                 error: BaseException | None = None, *, in_flight: bool = True) -> None:
        """Resolve an in-flight (or expired/aborted) batch and release its memory."""
        with self.lock:
            if in_flight:
                self._release_in_flight(batch.tp)
            self._incomplete.discard(batch)
            batch.mark_full()  # whatever path completed it, no record joins it now
            if self.idempotence is not None and batch.base_sequence >= 0:
                self.idempotence.on_complete(batch, base_offset, error is not None)
            self._used -= batch.memory
            batch.memory = 0
            self._memory_freed.notify_all()
        event, self._memory_event = self._memory_event, trio.Event()
        event.set()
        batch.result.complete(base_offset, log_append_time, error)

    def _release_in_flight(self, tp: TopicPartition) -> None:
        n = self._in_flight.get(tp, 0) - 1
        if n > 0:
            self._in_flight[tp] = n
        else:
            self._in_flight.pop(tp, None)

    def expire(self, now: float) -> list[ProducerBatch]:
        """Remove and return queued batches past their delivery timeout (the caller fails
        them). An in-flight batch fails at its deadline as well: the sender awaits its request
        no longer (``Sender._send``)."""
        expired = []
        with self.lock:
            for tp in list(self._batches):
                dq = self._batches[tp]
                while dq and dq[0].deadline <= now:
                    expired.append(dq.popleft())
                if not dq:
                    del self._batches[tp]
            self._retire(expired)
        return expired

    def abort(self) -> list[ProducerBatch]:
        """Remove and return every queued batch (the caller fails them)."""
        with self.lock:
            batches = [b for dq in self._batches.values() for b in dq]
            self._batches.clear()
            self._retire(batches)
        return batches

    def _retire(self, batches: list[ProducerBatch]) -> None:
        """Under the lock: ``batches`` left their deques to be failed; no record may join them
        (its future would fail at once and its memory never come back), so they are full
        and no longer any topic's sticky batch: the next keyless record opens a new one."""
        if not batches:
            return
        for batch in batches:
            batch.mark_full()
        gone = set(map(id, batches))
        for topic in [t for t, b in self._sticky.items() if id(b) in gone]:
            del self._sticky[topic]

    def close(self) -> None:
        """Refuse new records; queued ones become ready at once."""
        with self.lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def closed_error(self) -> BaseException:
        """What a record sent now is refused with: ClientClosedError, or a copy of the fatal
        error that stopped the producer (``fail_fatally``)."""
        if self._fatal is None:
            return ClientClosedError("the producer is closed")
        return copy.copy(self._fatal).with_traceback(None)

    def fail_fatally(self, error: BaseException) -> list[ProducerBatch]:
        """The producer can send nothing any more (its producer id was refused for good):
        refuse records from now on with ``error`` and remove and return every queued batch
        (the caller fails them with it)."""
        with self.lock:
            self._closed = True
            self._fatal = error
        return self.abort()

    def begin_flush(self) -> list[ProducerBatch]:
        """Make every queued batch ready; returns the batches the flush must wait for."""
        with self.lock:
            self._flushing += 1
            return list(self._incomplete)

    def end_flush(self) -> None:
        with self.lock:
            self._flushing -= 1

    def has_queued(self) -> bool:
        with self.lock:
            return any(self._batches.values())

    def has_incomplete(self) -> bool:
        with self.lock:
            return bool(self._incomplete)

    def queued_batches(self) -> int:
        with self.lock:
            return sum(len(dq) for dq in self._batches.values())


def fail_batches(accumulator: RecordAccumulator, batches: Iterable[ProducerBatch],
                 error_factory: Callable[[ProducerBatch], TidelogError], *, in_flight: bool) -> None:
    for batch in batches:
        accumulator.complete(batch, error=error_factory(batch), in_flight=in_flight)

