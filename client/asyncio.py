"""The Tidelog SDK for asyncio applications.

    from tidelog.asyncio import AsyncProducer, AsyncConsumer, AsyncAdmin

The same clients as ``tidelog.aio`` (the Trio core), with the same options and semantics,
for code running under asyncio. Each object runs the Trio core on a background thread of
its own through a ``Portal`` (``client._portal``), as the blocking facade does; its methods
are coroutines that hand the call to that thread and await an asyncio future, completed
from the Trio thread with ``loop.call_soon_threadsafe``: the asyncio event loop never
blocks on the network. A few methods that only read or change local state (``assign``,
``seek``, ``pause``, ``subscribe``, ...) stay synchronous, as in ``tidelog.aio`` and aiokafka:
they take one short hop to the client's thread.

Use the objects as async context managers, or ``await obj.start()`` ... ``await obj.close()``.

* ``await producer.send(...)`` queues a record and returns its ``RecordFuture``: ``await
  future`` gives the RecordMetadata. Like the blocking ``Producer.send``, the common case
  appends to the accumulator from the asyncio thread without a hop; only the topic's first
  metadata and exhausted buffer memory are waited for (in the Trio thread, awaited here).
  ``send_and_wait``, ``send_many`` and ``flush`` as in ``tidelog.aio``.
* ``await consumer.poll(timeout_ms)``, ``getone()``, ``getmany()`` and ``async for record in
  consumer``. Rebalance listener methods and commit callbacks run on the application's
  asyncio loop, and may be ``async def``.
* Cancellation: a coroutine cancelled while it waits (``asyncio.wait_for(consumer.poll(...),
  1)``, a task's ``cancel()``) cancels the call in the Trio thread, and the client stays
  usable. Records a cancelled poll had already taken from the fetcher are not lost: once the
  cancelled task has finished (``wait_for`` returns, or ``await`` of the task), they count as
  not consumed (``position``, commits) and the next poll returns them first, unless a
  ``seek`` or ``pause`` since drops them (the same holds for an error that poll was about to
  raise).
* Every wait is bounded like the blocking facade's: a call's own timeout plus a grace
  period, then RequestTimedOut, even if the client's event loop is stuck.

Under Trio these classes refuse to start, naming ``tidelog.aio``; ``tidelog.aio``'s classes
refuse asyncio the same way.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import sniffio
import trio

from tidelog import aio
from tidelog._portal import GRACE_S, Handoff, Portal
from tidelog.aio.accumulator import ProduceResult
from tidelog.aio.admin import (
    ClusterDescription,
    ConfigEntry,
    ConsumerGroupDescription,
    GroupOffsets,
    ListedGroup,
    LogDirDescription,
    MemberDescription,
    NewTopic,
    PartitionInfo,
    PartitionReassignment,
    TopicDescription,
)
from tidelog.aio.consumer import OffsetAndTimestamp
from tidelog.aio.group import ConsumerRebalanceListener
from tidelog.aio.producer import NEED_METADATA, partly_queued
from tidelog.blocking import HANDOFF_WAIT_S
from tidelog.errors import CallbackNotRunError, ClientClosedError, RequestTimedOut, TidelogError
from tidelog.protocol.acls import AclBinding, AclBindingFilter
from tidelog.records import ConsumerRecords, Record, RecordMetadata, TopicPartition

if TYPE_CHECKING:  # the options' names and types, for IDEs and type checkers (tidelog.options)
    from typing import Unpack

    from tidelog.options import AdminOptions, ConsumerOptions, ProducerOptions

# the names tidelog.aio exports, so that switching event loops changes one import
__all__ = ["AsyncProducer", "AsyncConsumer", "AsyncAdmin", "RecordFuture", "RecordFutures", "Record",
           "RecordMetadata", "TopicPartition", "NewTopic", "TopicDescription", "PartitionInfo",
           "ClusterDescription", "PartitionReassignment", "ConfigEntry", "OffsetAndTimestamp", "ConsumerRebalanceListener",
           "ConsumerGroupDescription", "MemberDescription", "GroupOffsets", "ListedGroup", "require_asyncio"]


def require_asyncio(what: str) -> None:
    """Raise a RuntimeError naming the right import unless this runs under asyncio."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library == "asyncio":
        return
    hint = (f"under Trio use `from tidelog.aio import {what}`" if library == "trio"
            else "start it from a coroutine running under asyncio (asyncio.run)")
    raise RuntimeError(f"tidelog.asyncio.{what} runs under asyncio, but this is "
                       f"{library or 'no async event loop'}: {hint}")


LOOP_CLOSED_CHECK_S = 1.0  # see _Client._callback_on_loop


def _post(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """From any thread: run ``fn(*args)`` on ``loop`` (dropped if the loop is closed)."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the application's loop is closed: nobody waits any more
        pass


class _Client:
    """Shared lifecycle: a portal thread running the Trio client's ``run``, and calls into it
    awaited on asyncio futures."""

    _aio: Any
    _thread_name = "tidelog-client"

    def _init_client(self) -> None:
        self._portal: Portal | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = False
        self._closed = False
        self._closing: asyncio.Future | None = None  # done once a close has stopped the thread

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the client's thread and connect (bootstrap); returns once it runs."""
        require_asyncio(type(self).__name__)
        if self._started:
            raise RuntimeError(f"this {self._what} was already started")
        self._started = True
        self._loop = loop = asyncio.get_running_loop()
        starting = loop.run_in_executor(None, self._start_portal)
        try:
            self._portal = await asyncio.shield(starting)
        except asyncio.CancelledError:
            starting.add_done_callback(self._stop_abandoned)
            self._closed = True
            raise

    def _start_portal(self) -> Portal:  # on an executor thread: the start blocks
        portal = Portal(self._thread_name)
        try:
            portal.start(self._aio.run)
        except BaseException:
            portal.stop()
            raise
        return portal

    def _stop_abandoned(self, starting: asyncio.Future) -> None:
        if not starting.cancelled() and starting.exception() is None:
            self._loop.run_in_executor(None, starting.result().stop)

    async def _shut_down(self, afn: Any, *args: Any, wait: float) -> None:
        """Run the Trio client's ``close`` (bounded by ``wait`` seconds), then stop the thread.
        A close while another is under way (a task a record's callback started, say) waits
        for that one to end: running the Trio client's ``close`` again, it would be cut
        short, and fail, when the first one stops the thread."""
        if self._closing is not None:
            await asyncio.shield(self._closing)
            return
        if self._closed or self._portal is None:
            self._closed = True
            return
        loop = asyncio.get_running_loop()
        closing = self._closing = loop.create_future()
        try:
            await self._call(afn, *args, timeout=None, wait=wait)
        finally:
            self._closed = True
            stopping = loop.run_in_executor(None, self._portal.stop)
            stopping.add_done_callback(lambda _f: closing.done() or closing.set_result(None))
            await asyncio.shield(stopping)

    async def __aenter__(self) -> Any:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def _what(self) -> str:
        return type(self).__name__.removeprefix("Async").lower()

    def _running_portal(self) -> Portal:
        if self._closed:
            raise ClientClosedError(f"the {self._what} is closed")
        if self._portal is None:
            raise RuntimeError(f"start the {self._what} first: `async with {type(self).__name__}(...)` "
                               f"or `await {self._what}.start()`")
        return self._portal

    # -- calls into the Trio thread -------------------------------------------------------------

    async def _call(self, afn: Any, *args: Any, timeout: float | None, wait: float | None = None) -> Any:
        """``await afn(*args)`` on the Trio thread. ``timeout`` seconds bound the call there
        (RequestTimedOut); this coroutine waits at most ``wait`` seconds (default: ``timeout``
        plus a grace period) and then cancels it. Cancelling this coroutine cancels the call;
        what it returns after its caller left is dropped (a poll hands its records over
        through a ``Handoff`` instead)."""
        portal = self._running_portal()
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call = portal.submit(afn, *args, timeout=timeout)

        def settle(done: Any) -> None:  # on the asyncio thread
            if not future.done():
                error = done.exception()
                if error is None:
                    future.set_result(done.result())
                else:
                    future.set_exception(error)

        call.future.add_done_callback(lambda done: _post(loop, settle, done))
        if wait is None and timeout is not None:
            wait = timeout + GRACE_S
        timer = None if wait is None else loop.call_later(wait, self._give_up, future, call, afn, wait)
        try:
            return await future
        except asyncio.CancelledError:
            portal.cancel(call)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _give_up(self, future: asyncio.Future, call: Any, afn: Any, wait: float) -> None:
        if not future.done():
            self._portal.cancel(call)
            future.set_exception(RequestTimedOut(
                f"{getattr(afn, '__name__', 'call')}: the client's event loop did not answer within {wait:g} s"))

    def _sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the Trio thread and return its result (a short hop, for
        methods that only touch the client's state)."""
        return self._running_portal().run_sync(fn, *args)


# ---------------------------------------------------------------------------------------------
# the producer


class RecordFuture:
    """The future of one sent record, for asyncio: ``await future`` gives its RecordMetadata
    or raises the error that failed its batch. ``done()``, ``result()`` and ``exception()``
    do not wait (InvalidStateError while pending, as ``asyncio.Future``'s)."""

    __slots__ = ("_future", "_producer")

    def __init__(self, future: aio.RecordFuture, producer: AsyncProducer):
        self._future = future
        self._producer = producer

    @property
    def topic_partition(self) -> TopicPartition:
        return self._future.topic_partition

    @property
    def batch(self) -> ProduceResult:
        """The completion of the record's batch (see ``tidelog.aio.RecordFuture.batch``)."""
        return self._future.batch

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> RecordMetadata:
        self._require_done()
        return self._future.result(0)

    def exception(self) -> BaseException | None:
        self._require_done()
        return self._future.exception(0)

    def _require_done(self) -> None:
        if not self._future.done():
            raise asyncio.InvalidStateError("the record is not acknowledged yet: await the future")

    def add_done_callback(self, fn: Callable[[RecordFuture], Any]) -> None:
        """Call ``fn(future)`` on the asyncio loop once the record is acknowledged or failed."""
        if self._future.done():
            self._producer._loop.call_soon(fn, self)
        else:
            self._producer._batch_waiter(self._future.batch).add_done_callback(lambda _f: fn(self))

    async def _wait(self) -> RecordMetadata:
        if not self._future.done():
            await asyncio.shield(self._producer._batch_waiter(self._future.batch))
        return self.result()

    def __await__(self):
        return self._wait().__await__()

    def __repr__(self) -> str:
        return repr(self._future).replace("<RecordFuture", "<asyncio RecordFuture", 1)


class RecordFutures(Sequence[RecordFuture]):
    """The futures of one ``send_many`` call, in call order: ``await futures`` gives every
    RecordMetadata (or raises the first failed record's error)."""

    __slots__ = ("_futures", "_producer")

    def __init__(self, futures: aio.RecordFutures, producer: AsyncProducer):
        self._futures = futures
        self._producer = producer

    def __len__(self) -> int:
        return len(self._futures)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [RecordFuture(f, self._producer) for f in self._futures[i]]
        return RecordFuture(self._futures[i], self._producer)

    def __iter__(self) -> Iterator[RecordFuture]:
        return (RecordFuture(f, self._producer) for f in self._futures)

    def done(self) -> bool:
        return self._futures.done()

    def result(self) -> list[RecordMetadata]:
        if not self._futures.done():
            raise asyncio.InvalidStateError("the records are not all acknowledged yet: await the futures")
        return self._futures.result(0)

    async def _wait(self) -> list[RecordMetadata]:
        for _start, batch in self._futures.batches():
            if not batch.done():
                await asyncio.shield(self._producer._batch_waiter(batch))
        return self.result()

    def __await__(self):
        return self._wait().__await__()


class AsyncProducer(_Client):
    """An asyncio producer; options as ``tidelog.aio.AsyncProducer`` (Kafka's names)."""

    _thread_name = "tidelog-producer"

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092",
                 **options: Unpack[ProducerOptions]):
        self._init_client()
        self._aio = aio.AsyncProducer(bootstrap_servers, **options)
        self.config = self._aio.config
        self._max_block_s = self.config.max_block_ms / 1000
        self._delivery_s = self.config.delivery_timeout_ms / 1000
        self._sends = 0
        self._batch_waiters: dict[ProduceResult, asyncio.Future] = {}

    async def send(self, topic: str, value: Any = None, key: Any = None,
                   headers: Sequence[tuple[str, bytes | str | None]] | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None) -> RecordFuture:
        """Queue a record; returns its future (``await future`` -> RecordMetadata). Waits only
        for the topic's first metadata or for buffer memory, at most ``max_block_ms``."""
        # As in tidelog.aio: cancellation is honoured before the record is queued, never after,
        # and a tight send loop lets the loop's other tasks run every 64 records.
        self._sends += 1
        if not self._sends & 63:
            await asyncio.sleep(0)
        r = self._aio.try_send(topic, value, key, headers, partition, timestamp_ms)
        if type(r) is aio.RecordFuture:
            return RecordFuture(r, self)
        deadline = time.monotonic() + self._max_block_s
        while True:
            await self._wait_for(r, topic, deadline, partition)
            r = self._aio.try_send(topic, value, key, headers, partition, timestamp_ms)
            if type(r) is aio.RecordFuture:
                return RecordFuture(r, self)

    async def _wait_for(self, r: Any, topic: str, deadline: float, partition: int | None = None) -> None:
        """Wait for what ``try_send`` asked for: the topic's metadata or buffer memory, until
        monotonic ``deadline``."""
        remaining = max(0.0, deadline - time.monotonic())
        if r is NEED_METADATA:
            await self._call(self._aio.wait_for_topic, topic, deadline, partition, timeout=remaining + 1.0)
        else:
            await self._call(self._aio.wait_for_memory_async, r, deadline, timeout=remaining + 1.0)

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None,
                            headers: Sequence[tuple[str, bytes | str | None]] | None = None,
                            partition: int | None = None, timestamp_ms: int | None = None) -> RecordMetadata:
        """``send``, then wait for the acknowledgement."""
        return await (await self.send(topic, value, key, headers, partition, timestamp_ms))

    async def send_many(self, topic: str, values: Sequence[Any], keys: Sequence[Any] | None = None,
                        partition: int | None = None, timestamp_ms: int | None = None) -> RecordFutures:
        """Queue many records at once (see ``tidelog.Producer.send_many``); returns their
        futures, in call order."""
        bulk = self._aio.prepare_many(topic, values, keys, partition, timestamp_ms)
        r = self._aio.try_append_many(bulk, partition)
        deadline = time.monotonic() + self._max_block_s
        while r is not None:
            try:
                await self._wait_for(r, topic, deadline, partition)
            except TidelogError as e:
                raise partly_queued(e, bulk)
            r = self._aio.try_append_many(bulk, partition)
        return RecordFutures(bulk.futures, self)

    def _batch_waiter(self, batch: ProduceResult) -> asyncio.Future:
        """An asyncio future completed when ``batch`` completes; one per batch, however many
        of its records are awaited. The hook is added on the Trio thread, which completes
        batches, so a completion cannot slip between a check and the hook."""
        waiter = self._batch_waiters.get(batch)
        if waiter is None:
            loop = self._loop
            waiter = self._batch_waiters[batch] = loop.create_future()
            try:
                self._running_portal().call_soon(
                    batch.add_callback, lambda: _post(loop, self._batch_completed, batch))
            except ClientClosedError:
                self._batch_completed(batch)
        return waiter

    def _batch_completed(self, batch: ProduceResult) -> None:
        waiter = self._batch_waiters.pop(batch, None)
        if waiter is not None and not waiter.done():
            if batch.done():
                waiter.set_result(None)
            else:  # the client's loop is gone without completing it
                waiter.set_exception(ClientClosedError("the producer closed before the record was sent"))

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is acknowledged or failed (bounded by the
        delivery timeout when ``timeout`` is None)."""
        limit = self._delivery_s + GRACE_S if timeout is None else timeout
        await self._call(self._aio.flush, timeout, timeout=limit)

    async def partitions_for(self, topic: str) -> list[int]:
        return await self._call(self._aio.partitions_for, topic, timeout=self._max_block_s + 1.0)

    async def close(self, timeout: float | None = None) -> None:
        """Deliver pending records within ``timeout`` seconds (None: the delivery timeout),
        fail the rest, and stop the client's thread."""
        limit = (self._delivery_s if timeout is None else timeout) + GRACE_S
        await self._shut_down(self._aio.close, timeout, wait=limit)
        for batch in list(self._batch_waiters):
            self._batch_completed(batch)

    @property
    def metrics(self) -> Any:
        return self._aio.metrics


# ---------------------------------------------------------------------------------------------
# the consumer


class AsyncConsumer(_Client):
    """An asyncio consumer; options as ``tidelog.aio.AsyncConsumer`` (``group_id`` and
    ``subscribe`` for a consumer group, or ``assign``).

    Rebalance listener methods and ``commit_async`` callbacks run on the application's asyncio
    loop (``async def`` ones are awaited) while the Trio core waits for them, inside the
    ``poll`` (or ``commit``, ``unsubscribe``, ``close``) that runs them, as in Kafka; they may
    call this consumer. ``wakeup()`` may be called from any thread."""

    _thread_name = "tidelog-consumer"

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092",
                 **options: Unpack[ConsumerOptions]):
        self._init_client()
        self._aio = aio.AsyncConsumer(bootstrap_servers, invoke_callback=self._callback_on_loop, **options)
        self.config = self._aio.config
        self._api_timeout_s = self.config.default_api_timeout_ms / 1000
        self._request_timeout_s = self.config.request_timeout_ms / 1000
        # errors polls were about to raise when their caller was cancelled or timed out: the
        # next polls raise these first (their records go back among the unreturned ones, a
        # partition's error back in the core, which drops it once the partition is revoked)
        self._unclaimed: deque[BaseException] = deque()
        self._callback_tasks: set[asyncio.Task] = set()

    # -- callbacks on the asyncio loop ----------------------------------------------------------

    async def _callback_on_loop(self, fn: Callable, *args: Any) -> Any:
        """On the Trio thread: run ``fn(*args)`` (awaited if async) as a task on the
        application's loop, and wait (shielded) for it, as the blocking facade waits for its
        caller's thread."""
        loop = self._loop
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        outcome: list[Any] = [None, None]

        def complete(result: Any, error: BaseException | None) -> None:
            outcome[:] = [result, error]
            done.set()

        def report(result: Any, error: BaseException | None) -> None:
            try:
                token.run_sync_soon(complete, result, error)
            except trio.RunFinishedError:
                pass

        async def run() -> None:
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as e:
                report(None, e)
            except BaseException:
                report(None, CallbackNotRunError("the callback was interrupted"))
                raise
            else:
                report(result, None)

        def start() -> None:
            task = loop.create_task(run())
            self._callback_tasks.add(task)
            task.add_done_callback(self._callback_tasks.discard)

        closed = CallbackNotRunError("the application's asyncio event loop is closed")
        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:
            raise closed from None
        with trio.CancelScope(shield=True):
            while not done.is_set():
                # A loop closed before it ran the task never will (asyncio.run ended without
                # closing this client); one merely stopped may still be run again.
                with trio.move_on_after(LOOP_CLOSED_CHECK_S):
                    await done.wait()
                if not done.is_set() and loop.is_closed():
                    raise closed
        result, error = outcome
        if error is not None:
            raise error
        return result

    # -- groups ---------------------------------------------------------------------------------

    def subscribe(self, topics: Sequence[str] | None = None, pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join ``group_id`` for these topics (or every topic matching ``pattern``); takes
        effect in the next ``poll``. ``listener``'s methods run on this loop."""
        if isinstance(topics, str):
            topics = [topics]
        self._sync(self._aio.subscribe, None if topics is None else list(topics), pattern, listener)

    def subscription(self) -> set[str]:
        return self._sync(self._aio.subscription)

    async def unsubscribe(self) -> None:
        await self._call(self._aio.unsubscribe, timeout=None, wait=self._request_timeout_s * 2 + GRACE_S)

    async def commit(self, offsets: dict[TopicPartition, Any] | None = None, timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` ({partition: next offset to read}, default: the consumed
        positions) and wait for the coordinator (CommitFailedError if the group rebalanced)."""
        await self._call(self._aio.commit, None if offsets is None else dict(offsets), timeout_ms,
                         timeout=None, wait=self._timeout(timeout_ms))

    def commit_async(self, offsets: dict[TopicPartition, Any] | None = None,
                     callback: Callable[[dict, BaseException | None], Any] | None = None) -> None:
        """Commit in the background; ``callback(offsets, error_or_None)`` runs on this loop in
        a later ``poll`` or ``commit``."""
        self._sync(self._aio.commit_async, None if offsets is None else dict(offsets), callback)

    async def committed(self, partitions: Any, timeout_ms: int | None = None, *, metadata: bool = False) -> Any:
        """The group's committed offset of a partition (None: none), or a dict for a list;
        with ``metadata=True`` an OffsetAndMetadata in place of each offset."""
        arg = partitions if isinstance(partitions, tuple) else list(partitions)
        return await self._call(functools.partial(self._aio.committed, metadata=metadata), arg, timeout_ms,
                                timeout=self._timeout(timeout_ms))

    @property
    def group_generation(self) -> tuple[int, str] | None:
        return self._aio.group_generation

    # -- assignment and positions ---------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._sync(self._aio.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._sync(self._aio.assignment)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._sync(self._aio.seek, partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.seek_to_end, *partitions)

    def pause(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.pause, *partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        return self._sync(self._aio.paused)

    def highwater(self, partition: TopicPartition) -> int | None:
        return self._sync(self._aio.highwater, partition)

    @property
    def metrics(self) -> Any:
        return self._sync(lambda: self._aio.metrics)

    def wakeup(self) -> None:
        """From any thread: the ``poll`` waiting now (or else the next one) raises WakeupError."""
        if not self._closed and self._portal is not None:
            self._aio.request_wakeup()  # seen at once by a poll with unreturned records
            self._portal.run_soon(self._aio.wakeup)

    async def topics(self, timeout_ms: int | None = None) -> set[str]:
        """The cluster's topics (see ``tidelog.aio.AsyncConsumer.topics``)."""
        return await self._call(self._aio.topics, timeout_ms, timeout=self._timeout(timeout_ms))

    async def partitions_for_topic(self, topic: str, timeout_ms: int | None = None) -> set[int] | None:
        """The partition ids of ``topic`` (None: no such topic), fetched now."""
        return await self._call(self._aio.partitions_for_topic, topic, timeout_ms, timeout=self._timeout(timeout_ms))

    async def assign_topics(self, topics: Sequence[str], timeout_ms: int | None = None) -> None:
        """Assign every partition of ``topics`` (see ``tidelog.aio.AsyncConsumer.assign_topics``)."""
        await self._call(self._aio.assign_topics, list(topics), timeout_ms, timeout=self._timeout(timeout_ms) * 2)

    async def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        return await self._call(self._aio.position, partition, timeout_ms, timeout=self._timeout(timeout_ms))

    async def beginning_offsets(self, partitions: Iterable[TopicPartition],
                                timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return await self._call(self._aio.beginning_offsets, list(partitions), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def end_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return await self._call(self._aio.end_offsets, list(partitions), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int], timeout_ms: int | None = None
                                ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return await self._call(self._aio.offsets_for_times, dict(timestamps), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    def _timeout(self, timeout_ms: int | None) -> float:
        return (self._api_timeout_s if timeout_ms is None else timeout_ms / 1000) + 1.0

    # -- polling --------------------------------------------------------------------------------

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> ConsumerRecords:
        """Up to ``max_records`` records, waiting at most ``timeout_ms`` for some (with a
        group, rebalances run within the same time, their listener on this loop). As
        ``tidelog.aio.AsyncConsumer.poll``; cancelling it leaves the consumer usable, and
        the records it had taken come first in the next poll (``Handoff``)."""
        portal = self._running_portal()
        limit = max_records or self.config.max_poll_records
        if self._unclaimed:
            raise self._unclaimed.popleft()
        if self._aio.unreturned_first:  # getone's, or a cancelled poll's
            return self._aio.take_unreturned(limit)
        handoff = Handoff(self._aio, self._unclaimed)
        try:
            if self._aio.polls_without_task:
                await self._poll_waiting(portal, handoff, timeout_ms, limit)
            else:
                await self._call(handoff.poll, timeout_ms, limit, timeout=None,
                                 wait=timeout_ms / 1000 + self._request_timeout_s + GRACE_S)
        except BaseException:
            handoff.leave()
            raise
        return handoff.records()

    async def _poll_waiting(self, portal: Portal, handoff: Handoff, timeout_ms: int, limit: int) -> None:
        """``poll`` without a group: a waiter on the Trio thread (``add_poll_waiter``) offers
        the outcome to ``handoff`` in the scheduler pass that received the records, and wakes
        this task, as the blocking facade's ``poll`` does (and waits up to ``HANDOFF_WAIT_S``
        for this loop to pick the wake-up up, for the same reason). At the deadline or on
        cancellation the waiter is removed on the Trio thread, which then offers [] itself."""
        loop = self._loop
        future = loop.create_future()
        aio_consumer = self._aio

        def wake(picked_up: Any) -> None:  # on the asyncio thread
            picked_up.set()
            if not future.done():
                future.set_result(None)

        def deliver(outcome: Any) -> None:  # on the Trio thread
            if handoff.offer(outcome):
                picked_up = _Flag()
                _post(loop, wake, picked_up)
                picked_up.wait(HANDOFF_WAIT_S)

        def expire() -> None:  # on the Trio thread
            if aio_consumer.remove_poll_waiter(deliver):
                deliver(ConsumerRecords())

        def give_up() -> None:  # the Trio thread did not answer: stuck, or its loop is gone
            if not future.done():
                future.set_exception(RequestTimedOut(
                    f"poll: the client's event loop did not answer within {wait_s:g} s"))

        portal.call_soon(aio_consumer.add_poll_waiter, limit, deliver)
        wait_s = max(0, timeout_ms) / 1000
        timer = loop.call_later(wait_s, portal.run_soon, expire)
        wait_s += self._request_timeout_s + GRACE_S  # the blocking poll's bound
        guard = loop.call_later(wait_s, give_up)
        try:
            await future
        except BaseException:  # cancelled, or the loop did not answer
            portal.run_soon(expire)
            raise
        finally:
            timer.cancel()
            guard.cancel()

    async def getone(self) -> Record:
        """The next record, waiting as long as it takes (aiokafka's ``getone``)."""
        while (record := self._aio.next_unreturned()) is None:
            # the others are not consumed until returned (SubscriptionState)
            self._aio.put_back(await self.poll(timeout_ms=max(self.config.fetch_max_wait_ms, 100)))
        return record

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None
                      ) -> dict[TopicPartition, list[Record]]:
        """A poll's records by partition (aiokafka's ``getmany``)."""
        return (await self.poll(timeout_ms, max_records)).by_partition()

    def __aiter__(self) -> AsyncConsumer:
        """``async for record in consumer``: records as they arrive, until the consumer is closed."""
        return self

    async def __anext__(self) -> Record:
        if self._closed:
            raise StopAsyncIteration
        try:
            return await self.getone()
        except ClientClosedError:
            raise StopAsyncIteration from None

    async def close(self, timeout: float = 30.0) -> None:
        """Commit (with auto-commit), revoke through the listener and leave the group, within
        ``timeout`` seconds; then stop the client's thread."""
        await self._shut_down(self._aio.close, int(timeout * 1000), wait=timeout + GRACE_S)


class _Flag:
    """A one-shot flag the Trio thread waits on briefly (a lock: cheaper than threading.Event)."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:
            pass

    def wait(self, timeout: float) -> None:
        if self._lock.acquire(timeout=timeout):
            self._lock.release()


# ---------------------------------------------------------------------------------------------
# the admin client


class AsyncAdmin(_Client):
    """An asyncio admin client; options and methods as ``tidelog.aio.AsyncAdmin`` (and the
    blocking ``tidelog.Admin``), every call a coroutine."""

    _thread_name = "tidelog-admin"

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092",
                 **options: Unpack[AdminOptions]):
        self._init_client()
        self._aio = aio.AsyncAdmin(bootstrap_servers, **options)
        self._api_timeout_s = self._aio.default_api_timeout_ms / 1000

    def _timeout(self, timeout_ms: int | None) -> float:
        return (self._api_timeout_s if timeout_ms is None else timeout_ms / 1000) + GRACE_S

    async def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None,
                            validate_only: bool = False) -> dict[str, None]:
        return await self._call(self._aio.create_topics, list(new_topics), timeout_ms, validate_only,
                                timeout=self._timeout(timeout_ms))

    async def delete_topics(self, names: Iterable[str], timeout_ms: int | None = None) -> dict[str, None]:
        return await self._call(self._aio.delete_topics, list(names), timeout_ms, timeout=self._timeout(timeout_ms))

    async def create_partitions(self, new_counts: dict[str, int], timeout_ms: int | None = None,
                                validate_only: bool = False) -> dict[str, None]:
        return await self._call(self._aio.create_partitions, dict(new_counts), timeout_ms, validate_only,
                                timeout=self._timeout(timeout_ms))

    async def describe_topics(self, names: Iterable[str] | None = None,
                              timeout_ms: int | None = None) -> list[TopicDescription]:
        return await self._call(self._aio.describe_topics, None if names is None else list(names), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def list_topics(self, include_internal: bool = False, timeout_ms: int | None = None) -> list[str]:
        return await self._call(self._aio.list_topics, include_internal, timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def describe_cluster(self, timeout_ms: int | None = None) -> ClusterDescription:
        return await self._call(self._aio.describe_cluster, timeout_ms, timeout=self._timeout(timeout_ms))

    async def describe_log_dirs(self, brokers: Iterable[int] | None = None, timeout_ms: int | None = None
                      ) -> dict[int, dict[str, LogDirDescription]]:
        return await self._call(self._aio.describe_log_dirs, brokers, timeout_ms, timeout=self._timeout(timeout_ms))

    async def describe_configs(self, topic: str, keys: Sequence[str] | None = None,
                               timeout_ms: int | None = None) -> dict[str, ConfigEntry]:
        return await self._call(self._aio.describe_configs, topic, keys, timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def alter_configs(self, topic: str, configs: dict[str, str | None], validate_only: bool = False,
                            timeout_ms: int | None = None) -> None:
        return await self._call(self._aio.alter_configs, topic, dict(configs), validate_only, timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def alter_broker_configs(self, broker_id: int | None, configs: dict[str, str | None],
                                   validate_only: bool = False, timeout_ms: int | None = None) -> None:
        return await self._call(self._aio.alter_broker_configs, broker_id, dict(configs), validate_only, timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def elect_leaders(self, partitions: Iterable[TopicPartition] | None = None,
                            timeout_ms: int | None = None, election_type: str = "preferred"
                            ) -> dict[TopicPartition, tuple[int, str | None]]:
        return await self._call(self._aio.elect_leaders, None if partitions is None else list(partitions),
                                timeout_ms, election_type, timeout=self._timeout(timeout_ms))

    async def broker_versions(self, brokers: Iterable[int] | None = None,
                              timeout_ms: int | None = None) -> dict[int, str | None]:
        return await self._call(self._aio.broker_versions, None if brokers is None else list(brokers), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def alter_partition_reassignments(self, reassignments: dict[TopicPartition, Sequence[int] | None],
                                            timeout_ms: int | None = None
                                            ) -> dict[TopicPartition, tuple[int, str | None]]:
        return await self._call(self._aio.alter_partition_reassignments, dict(reassignments), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def list_partition_reassignments(self, partitions: Iterable[TopicPartition] | None = None,
                                           timeout_ms: int | None = None
                                           ) -> dict[TopicPartition, PartitionReassignment]:
        return await self._call(self._aio.list_partition_reassignments,
                                None if partitions is None else list(partitions), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def create_acls(self, bindings: Iterable[AclBinding], timeout_ms: int | None = None
                          ) -> dict[AclBinding, None]:
        return await self._call(self._aio.create_acls, list(bindings), timeout_ms, timeout=self._timeout(timeout_ms))

    async def describe_acls(self, acl_filter: AclBindingFilter = AclBindingFilter(),
                            timeout_ms: int | None = None) -> list[AclBinding]:
        return await self._call(self._aio.describe_acls, acl_filter, timeout_ms, timeout=self._timeout(timeout_ms))

    async def delete_acls(self, filters: Iterable[AclBindingFilter], timeout_ms: int | None = None
                          ) -> dict[AclBindingFilter, list[AclBinding]]:
        return await self._call(self._aio.delete_acls, list(filters), timeout_ms, timeout=self._timeout(timeout_ms))

    async def list_groups(self, states: Iterable[str] | None = None,
                          timeout_ms: int | None = None) -> list[ListedGroup]:
        return await self._call(self._aio.list_groups, None if states is None else list(states), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def describe_groups(self, group_ids: Iterable[str],
                              timeout_ms: int | None = None) -> list[ConsumerGroupDescription]:
        return await self._call(self._aio.describe_groups, list(group_ids), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def delete_groups(self, group_ids: Iterable[str], timeout_ms: int | None = None) -> None:
        return await self._call(self._aio.delete_groups, list(group_ids), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def list_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None,
                                 timeout_ms: int | None = None) -> list[GroupOffsets]:
        return await self._call(self._aio.list_group_offsets, group_id,
                                None if partitions is None else list(partitions), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def alter_group_offsets(self, group_id: str, offsets: dict[TopicPartition, int],
                                  timeout_ms: int | None = None) -> None:
        return await self._call(self._aio.alter_group_offsets, group_id, dict(offsets), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def delete_records(self, offsets: dict[TopicPartition, int], timeout_ms: int | None = None
                             ) -> dict[TopicPartition, int]:
        return await self._call(self._aio.delete_records, dict(offsets), timeout_ms, timeout=self._timeout(timeout_ms))

    async def list_offsets(self, specs: dict[TopicPartition, int],
                           timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, int]]:
        return await self._call(self._aio.list_offsets, dict(specs), timeout_ms, timeout=self._timeout(timeout_ms))

    async def log_end_offsets(self, partitions: Iterable[TopicPartition],
                              timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return await self._call(self._aio.log_end_offsets, list(partitions), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def alter_user_scram_credentials(self, alterations: Iterable[Any],
                                           timeout_ms: int | None = None) -> dict[str, None]:
        return await self._call(self._aio.alter_user_scram_credentials, list(alterations), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def describe_user_scram_credentials(self, users: Iterable[str] | None = None,
                                              timeout_ms: int | None = None) -> dict[str, Any]:
        return await self._call(self._aio.describe_user_scram_credentials,
                                None if users is None else list(users), timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def alter_client_quotas(self, alterations: Iterable[Any], validate_only: bool = False,
                                  timeout_ms: int | None = None) -> dict[Any, None]:
        return await self._call(self._aio.alter_client_quotas, list(alterations), validate_only, timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def describe_client_quotas(self, quota_filter: Any = None,
                                     timeout_ms: int | None = None) -> dict[Any, dict[str, float]]:
        return await self._call(self._aio.describe_client_quotas, quota_filter, timeout_ms,
                                timeout=self._timeout(timeout_ms))

    async def close(self, timeout: float = 10.0) -> None:
        await self._shut_down(self._aio.close, wait=timeout)
