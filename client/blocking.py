"""The Tidelog SDK, blocking facade (applications import it as ``tidelog``).

    from tidelog import Producer, Consumer, Admin, Record, TopicPartition

Each object runs the Trio core (``tidelog.aio``) on its own background thread (see
``client._portal``). Every blocking call is bounded (its own timeout, or the client's
``max_block_ms`` / ``request_timeout_ms`` / ``default_api_timeout_ms``), raises
``RequestTimedOut`` instead of hanging when the cluster is down, and lets Ctrl-C through.
Use the objects as context managers, or call ``close()``.

``Producer.send`` appends straight to the shared accumulator from the calling thread (no
hop into the event loop per record); it returns a ``RecordFuture`` whose
``result(timeout)`` is the ``RecordMetadata``. ``Producer.send_many`` queues a list of
records under one lock, a batch-full at a time (the fastest way in), and returns their
futures as one ``RecordFutures``.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import trio

from tidelog._caller_fetch import CallerFetch, caller_can_fetch
from tidelog._portal import GRACE_S, Handoff, Portal
from tidelog.aio.accumulator import RecordFuture, RecordFutures
from tidelog.aio.admin import (
    AsyncAdmin,
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
from tidelog.aio.consumer import AsyncConsumer, Metrics, OffsetAndTimestamp
from tidelog.aio.group import ConsumerRebalanceListener
from tidelog.aio.producer import NEED_METADATA, AsyncProducer, ProducerMetrics, partly_queued
from tidelog.errors import (
    AuthenticationFailedError,
    BrokerConnectionError,
    CallbackNotRunError,
    ClientClosedError,
    CommitFailedError,
    NoBrokersAvailable,
    NoOffsetForPartitionError,
    RebalanceInProgressError,
    RecordDeserializationError,
    RequestTimedOut,
    SaslAuthenticationError,
    SslAuthenticationError,
    TidelogClientError,
    TidelogError,
    WakeupError,
)
from tidelog.protocol.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from tidelog.records import ConsumerRecords, OffsetAndMetadata, Record, RecordMetadata, TopicPartition

if TYPE_CHECKING:  # the options' names and types, for IDEs and type checkers (tidelog.options)
    from typing import Unpack

    from tidelog.options import AdminOptions, ConsumerOptions, ProducerOptions

__all__ = ["Producer", "Consumer", "Admin", "Record", "RecordMetadata", "RecordFuture", "RecordFutures",
           "TopicPartition", "NewTopic", "TopicDescription", "PartitionInfo", "ClusterDescription", "PartitionReassignment",
           "ConfigEntry", "OffsetAndTimestamp", "TidelogError", "TidelogClientError",
           "RequestTimedOut", "BrokerConnectionError", "NoBrokersAvailable", "ClientClosedError",
           "AuthenticationFailedError", "SaslAuthenticationError", "SslAuthenticationError",
           "NoOffsetForPartitionError", "CommitFailedError", "RebalanceInProgressError", "WakeupError",
           "ConsumerRebalanceListener", "ConsumerGroupDescription", "MemberDescription", "GroupOffsets",
           "ListedGroup", "AclBinding", "AclBindingFilter", "ResourceType", "ResourcePatternType", "AclOperation",
           "AclPermissionType", "OffsetAndMetadata", "RecordDeserializationError", "ConsumerRecords"]


log = logging.getLogger(__name__)

HANDOFF_WAIT_S = 0.001  # see Consumer._poll_waiting


def split_positional(args: Sequence[Any], bootstrap_servers: str | Sequence[str] | None
                     ) -> tuple[str | Sequence[str], list[str]]:
    """The consumer's positional arguments -> (bootstrap servers, topics). Topic names cannot
    hold ':' and a server is "host:port", so a first argument that is a list, or a string with
    a ':', is the servers (Tidelog's ``Consumer("host:9092")``); every other argument is a topic
    (kafka-python's ``KafkaConsumer("orders", bootstrap_servers=...)``). Servers given both
    ways, or a list among the topics, are a TypeError."""
    args = list(args)
    first_names_servers = bool(args) and (not isinstance(args[0], str) or ":" in args[0])
    if first_names_servers:
        if bootstrap_servers is not None:
            raise TypeError(f"bootstrap_servers given twice: {args[0]!r} and {bootstrap_servers!r}")
        bootstrap_servers = args.pop(0)
    for topic in args:
        if not isinstance(topic, str):
            raise TypeError(f"topics are strings, got {topic!r}")
    return ("localhost:9092" if bootstrap_servers is None else bootstrap_servers), args


class _Blocking:
    """Shared lifecycle: a portal thread running the async client's ``run``."""

    _aio: Any

    def _start(self, name: str) -> None:
        self._portal = Portal(name)
        try:
            self._portal.start(self._aio.run)
        except BaseException:
            self._portal.stop()
            raise
        self._closed = False

    def _call(self, afn: Any, *args: Any, timeout: float | None) -> Any:
        if self._closed:
            raise ClientClosedError(f"the {type(self).__name__.lower()} is closed")
        return self._portal.call(afn, *args, timeout=timeout)

    def _stop(self, afn: Any, *args: Any, timeout: float | None) -> None:
        self._refuse_loop_thread("closed")
        if self._closed:
            return
        self._closed = True
        try:
            self._portal.call(afn, *args, timeout=timeout)
        finally:
            self._portal.stop()

    def _refuse_loop_thread(self, what: str) -> None:
        """A blocking close on the client's own loop thread (in a callback) would wait for
        itself: refused before anything changes, so the client stays open."""
        if self._portal.in_portal_thread:
            raise RuntimeError(f"a {type(self).__name__.lower()} cannot be {what} from its own event loop "
                               f"thread (e.g. inside a callback)")

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed


class Producer(_Blocking):
    """A blocking producer; options as ``tidelog.aio.AsyncProducer`` (Kafka's names)."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", **options: Unpack[ProducerOptions]):
        self._aio = AsyncProducer(bootstrap_servers, **options)
        self._max_block_s = self._aio.config.max_block_ms / 1000
        self._delivery_s = self._aio.config.delivery_timeout_ms / 1000
        self._start("tidelog-producer")

    def send(self, topic: str, value: Any = None, key: Any = None,
             headers: Sequence[tuple[str, bytes | str | None]] | None = None,
             partition: int | None = None, timestamp_ms: int | None = None) -> RecordFuture:
        """Queue a record and return its future (``future.result(timeout)``). Blocks only
        for the topic's first metadata or for buffer memory, at most ``max_block_ms``."""
        # The per-record hot path: no clock read unless the record must wait.
        r = self._aio.try_send(topic, value, key, headers, partition, timestamp_ms)
        if type(r) is RecordFuture:
            return r
        return self._send_after_waiting(r, topic, value, key, headers, partition, timestamp_ms)

    def _send_after_waiting(self, r: Any, topic: str, value: Any, key: Any, headers: Any,
                            partition: int | None, timestamp_ms: int | None) -> RecordFuture:
        deadline = time.monotonic() + self._max_block_s
        aio = self._aio
        while True:
            if r is NEED_METADATA:
                self._call(aio.wait_for_topic, topic, deadline, partition,
                           timeout=max(0.0, deadline - time.monotonic()) + 1.0)
            else:
                aio.wait_for_memory(r, deadline)
            r = aio.try_send(topic, value, key, headers, partition, timestamp_ms)
            if type(r) is RecordFuture:
                return r

    def send_many(self, topic: str, values: Sequence[Any], keys: Sequence[Any] | None = None,
                  partition: int | None = None, timestamp_ms: int | None = None) -> RecordFutures:
        """Queue many records at once: one per value, ``keys[i]`` (if given) the key of
        ``values[i]``; no headers. Returns a ``RecordFutures``: a sequence of the records'
        futures in call order, with ``result(timeout)`` for all their RecordMetadata.

        The records are what ``send`` would make of them one by one, appended in order under
        one lock, a batch-full at a time: to ``partition`` if given, else by key (Kafka's
        default partitioner, or the configured one), and keyless records to the topic's
        sticky batches. They all get one timestamp: ``timestamp_ms``, or the time of the
        call. Blocks like ``send`` (the topic's first metadata, buffer memory), at most
        ``max_block_ms``. Nothing is queued if it raises for a bad argument or a record over
        ``max_request_size``; if it gives up waiting for buffer memory part-way, the records
        queued so far are delivered as usual and the error's ``futures`` holds theirs."""
        aio = self._aio
        bulk = aio.prepare_many(topic, values, keys, partition, timestamp_ms)
        r = aio.try_append_many(bulk, partition)
        if r is None:
            return bulk.futures
        deadline = time.monotonic() + self._max_block_s
        while True:
            try:
                if r is NEED_METADATA:
                    self._call(aio.wait_for_topic, topic, deadline, partition,
                               timeout=max(0.0, deadline - time.monotonic()) + 1.0)
                else:
                    aio.wait_for_memory(r, deadline)
            except TidelogError as e:
                raise partly_queued(e, bulk)
            r = aio.try_append_many(bulk, partition)
            if r is None:
                return bulk.futures

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every record sent so far is acknowledged or failed (bounded by the
        delivery timeout when ``timeout`` is None)."""
        limit = self._delivery_s + GRACE_S if timeout is None else timeout
        self._call(self._aio.flush, timeout, timeout=limit)

    def partitions_for(self, topic: str) -> list[int]:
        return self._call(self._aio.partitions_for, topic, timeout=self._max_block_s + 1.0)

    def close(self, timeout: float | None = None) -> None:
        """Deliver pending records within ``timeout`` seconds (None: the delivery timeout),
        fail the rest, and stop the background thread.

        From a record's callback (which runs on the producer's own thread), as Kafka's close
        from its I/O thread: the timeout is taken as 0 and nothing is waited for. Records are
        refused from then on and every pending one fails with ClientClosedError; the thread
        ends once that is done, and a later ``close`` from the application waits for it."""
        if self._portal.in_portal_thread:
            self._close_from_loop(timeout)
            return
        limit = (self._delivery_s if timeout is None else timeout) + GRACE_S
        if self._closed:  # perhaps begun on the loop thread (_close_from_loop): wait for its end
            self._portal.stop(limit)
            return
        self._stop(self._aio.close, timeout, timeout=limit)

    def _close_from_loop(self, timeout: float | None) -> None:
        if self._closed:
            return
        if timeout != 0:
            log.warning("Producer.close() called from the producer's own thread (a record callback): "
                        "closing without waiting, as with timeout 0; pending records fail")
        self._closed = True
        self._aio.close_without_waiting()
        self._portal.finish_soon(self._aio.close, 0)

    @property
    def metrics(self) -> ProducerMetrics:
        """As ``AsyncProducer.metrics``: the flat gauges, and ``metrics()`` kafka-python's."""
        return self._aio.metrics


class _Inbox:
    """The callbacks the loop hands to a serving call (``Consumer._serve``); ``None`` in
    ``items`` is the call's end. Once closed, ``offer`` refuses (the loop then runs the
    callback itself), and what was offered before is returned to run or fail: the loop waits
    for every callback it handed over, shielded, so none may be left behind."""

    def __init__(self) -> None:
        self.items: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False

    def offer(self, item: tuple) -> bool:
        with self._lock:
            if not self._closed:
                self.items.put(item)
            return not self._closed

    def close(self) -> list[tuple]:
        with self._lock:
            self._closed = True
        left = []
        while True:
            try:
                item = self.items.get_nowait()
            except queue.Empty:
                return left
            if item is not None:
                left.append(item)


def _not_called(fn: Callable, why: str) -> CallbackNotRunError:
    """The error of a listener or commit callback the loop handed over too late to run."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return CallbackNotRunError(f"{name} was not called: the consumer call that was to run it on the "
                             f"application's thread (poll, commit, unsubscribe or close) {why}")


class Consumer(_Blocking):
    """A blocking consumer; options as ``tidelog.aio.AsyncConsumer`` (``group_id`` and
    ``subscribe`` for a consumer group, or ``assign``), plus ``consumer_timeout_ms``
    (iteration stops after that long without records).

    Rebalance listener callbacks and ``commit_async`` callbacks run on the application's
    thread: inside the ``poll`` (or ``commit``, ``unsubscribe``, ``close``) call that runs the
    rebalance, as in Kafka. They may call this consumer (``commit``, ``seek``, ``position``).
    One reached after that call ended (Ctrl-C, a timeout) runs inside the consumer call
    under way then; with none, it is not called but fails with CallbackNotRunError (a
    ClientClosedError), which the next ``poll`` raises when a poll had reached it, except
    ``on_partitions_assigned``, which the next ``poll`` calls instead, as Kafka's does.
    Like Kafka's, the consumer is not meant to be used from several threads at once
    (``wakeup`` excepted)."""

    def __init__(self, *topics: str | Sequence[str], bootstrap_servers: str | Sequence[str] | None = None,
                 consumer_timeout_ms: float = float("inf"), **options: Unpack[ConsumerOptions]):
        """``Consumer("orders", "payments", bootstrap_servers=..., group_id=...)`` subscribes
        to those topics, as ``KafkaConsumer(*topics)`` (without a group_id: assigns all their
        partitions); ``Consumer("host:9092", ...)`` (a first argument that names servers) is
        the bootstrap servers (see ``split_positional``)."""
        bootstrap, names = split_positional(topics, bootstrap_servers)
        self._aio = AsyncConsumer(bootstrap, invoke_callback=self._callback_on_caller, **options)
        self._api_timeout_s = self._aio.config.default_api_timeout_ms / 1000
        self._request_timeout_s = self._aio.config.request_timeout_ms / 1000
        self.consumer_timeout_ms = consumer_timeout_ms
        self._inboxes: list[_Inbox] = []  # the serving calls' inboxes, innermost last
        # errors polls were about to raise when their caller left (Ctrl-C, a stuck loop): the
        # next polls raise these first (their records go back among the unreturned ones, a
        # partition's error back in the core, which drops it once the partition is revoked)
        self._unclaimed: deque[BaseException] = deque()
        self._start("tidelog-consumer")
        # without a group, on PLAINTEXT, poll fetches on the caller's thread (see the module)
        self._caller: CallerFetch | None = None
        if caller_can_fetch(self._aio):
            self._caller = CallerFetch(self._aio, self._portal)
            self._portal.run_sync(self._caller.attach)
        if names:
            try:
                if self._aio.config.group_id is not None:
                    self.subscribe(names)
                else:
                    self._call(self._aio.assign_topics, names, None, timeout=self._timeout(None))
            except BaseException:
                self.close(0)
                raise

    def _sync(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        return self._portal.run_sync(fn, *args)

    # -- callbacks on the caller's thread ---------------------------------------------------------

    async def _callback_on_caller(self, fn: Callable, *args: Any) -> Any:
        """On the Trio thread: hand ``fn(*args)`` to the application thread that is inside a
        serving call, and wait (shielded) for it to finish there.

        Callbacks come only from serving calls (poll, commit, unsubscribe, close), but a
        call's task can outlive it (interrupted, or it timed out) and reach one after: with
        no serving call to take it, it fails with ClientClosedError rather than run on this
        thread, where every consumer call it made would raise. The group goes on as when a
        listener raises (the assignment stands, the next poll carries on)."""
        done = trio.Event()
        outcome: list[Any] = []

        def complete(result: Any, error: BaseException | None) -> None:
            outcome[:] = [result, error]
            done.set()

        inbox = self._inboxes[-1] if self._inboxes else None
        if inbox is None or not inbox.offer((fn, args, complete)):
            raise _not_called(fn, "had ended (interrupted, or it timed out)")
        with trio.CancelScope(shield=True):
            await done.wait()
        result, error = outcome
        if error is not None:
            raise error
        return result

    def _serve(self, afn: Any, *args: Any, timeout: float) -> Any:
        """Call ``afn`` on the loop while running the callbacks it hands over on this thread.
        ``timeout`` bounds the wait, not counting the time the callbacks take."""
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        inbox = _Inbox()
        self._inboxes.append(inbox)
        interrupted = False
        try:
            call = self._portal.submit(afn, *args, timeout=None)
            call.future.add_done_callback(lambda _f: inbox.items.put(None))
            deadline = time.monotonic() + timeout
            while True:
                try:
                    item = inbox.items.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    self._portal.cancel(call)
                    raise RequestTimedOut(f"{getattr(afn, '__name__', 'call')} did not complete "
                                          f"within {timeout:g} s") from None
                except BaseException:  # Ctrl-C
                    interrupted = True
                    self._portal.cancel(call)
                    raise
                if item is None:
                    return call.future.result()
                started = time.monotonic()
                self._run_callback(*item)
                deadline += time.monotonic() - started
        finally:
            self._inboxes.remove(inbox)
            for fn, args, complete in inbox.close():  # handed over as the wait ended
                if interrupted:
                    self._portal.run_soon(complete, None, _not_called(fn, "was interrupted"))
                else:
                    self._run_callback(fn, args, complete)

    def _run_callback(self, fn: Callable, args: tuple, complete: Callable) -> None:
        try:
            result = fn(*args)
        except Exception as e:
            self._portal.run_soon(complete, None, e)
            return
        except BaseException:
            self._portal.run_soon(complete, None, ClientClosedError("the callback was interrupted"))
            raise
        self._portal.run_soon(complete, result, None)

    # -- groups ---------------------------------------------------------------------------------

    def subscribe(self, topics: Sequence[str] | None = None, pattern: str | None = None,
                  listener: ConsumerRebalanceListener | None = None) -> None:
        """Join ``group_id`` for these topics (or every topic matching ``pattern``); takes
        effect in the next ``poll``. ``listener``'s callbacks run in ``poll`` on this thread."""
        self._sync(self._aio.subscribe, None if topics is None else list(topics) if not isinstance(topics, str)
                   else [topics], pattern, listener)

    def subscription(self) -> set[str]:
        return self._sync(self._aio.subscription)

    def unsubscribe(self) -> None:
        self._serve(self._aio.unsubscribe, timeout=self._request_timeout_s * 2 + GRACE_S)

    def commit(self, offsets: dict[TopicPartition, int | OffsetAndMetadata] | None = None,
               timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` ({partition: next offset to read, or OffsetAndMetadata},
        default: the consumed positions) and wait for the coordinator. Raises
        CommitFailedError when the group rebalanced meanwhile (see its message)."""
        self._serve(self._aio.commit, None if offsets is None else dict(offsets), timeout_ms,
                    timeout=self._timeout(timeout_ms))

    def commit_async(self, offsets: dict[TopicPartition, int | OffsetAndMetadata] | None = None,
                     callback: Callable[[dict, BaseException | None], Any] | None = None) -> None:
        """Commit in the background; ``callback(offsets, error_or_None)`` runs on this thread
        in a later ``poll`` or ``commit``."""
        self._sync(self._aio.commit_async, None if offsets is None else dict(offsets), callback)

    def committed(self, partitions: Any, timeout_ms: int | None = None, *, metadata: bool = False) -> Any:
        """The group's committed offset of a partition (None: none), or a dict for a list;
        with ``metadata=True`` an OffsetAndMetadata in place of each offset."""
        arg = partitions if isinstance(partitions, tuple) else list(partitions)
        return self._call(functools.partial(self._aio.committed, metadata=metadata), arg, timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def topics(self, timeout_ms: int | None = None) -> set[str]:
        """The cluster's topics (see ``AsyncConsumer.topics``)."""
        return self._call(self._aio.topics, timeout_ms, timeout=self._timeout(timeout_ms))

    def partitions_for_topic(self, topic: str, timeout_ms: int | None = None) -> set[int] | None:
        """The partition ids of ``topic``, None if it does not exist."""
        return self._call(self._aio.partitions_for_topic, topic, timeout_ms, timeout=self._timeout(timeout_ms))

    @property
    def group_generation(self) -> tuple[int, str] | None:
        """(generation id, member id) while the consumer is a member of a generation."""
        return self._aio.group_generation

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._sync(self._aio.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._sync(self._aio.assignment)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._sync(self._aio.seek, partition, offset)

    def wakeup(self) -> None:
        """From any thread: the ``poll`` waiting now (or else the next one) raises
        WakeupError (Kafka's ``wakeup``), e.g. to leave a poll loop from a signal handler or
        another thread and then ``close``. The only method that may be called from another
        thread than the one using the consumer."""
        if not self._closed:
            self._aio.request_wakeup()  # seen at once by a poll with unreturned records
            self._portal.run_soon(self._aio.wakeup)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning records of these partitions until ``resume``
        (see ``AsyncConsumer.pause``)."""
        self._sync(self._aio.pause, *partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        return self._sync(self._aio.paused)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._sync(self._aio.seek_to_end, *partitions)

    def highwater(self, partition: TopicPartition) -> int | None:
        return self._sync(self._aio.highwater, partition)

    @property
    def metrics(self) -> Metrics:
        """As ``AsyncConsumer.metrics``: the flat gauges, and ``metrics()`` kafka-python's."""
        return self._sync(lambda: self._aio.metrics)

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        return self._call(self._aio.position, partition, timeout_ms, timeout=self._timeout(timeout_ms))

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> ConsumerRecords:
        """Up to ``max_records`` records, waiting at most ``timeout_ms`` for some. With a
        group, a poll also runs rebalances, within the same ``timeout_ms`` (what is not done
        by then, such as a slow commit before a rebalance, goes on in the background and the
        next poll continues it); the rebalance listener and commit callbacks run on this
        thread, and their time is not counted. The wait for the client's event loop is
        bounded by ``timeout_ms + request_timeout_ms`` plus a grace period: a margin over the
        poll's own bound, reached only when the loop is stuck."""
        if self._unclaimed and not self._closed:
            raise self._unclaimed.popleft()
        if self._aio.unreturned_first and not self._closed:  # an iterator's, not yielded yet
            return self._aio.take_unreturned(max_records or self._aio.config.max_poll_records)
        limit = max_records or self._aio.config.max_poll_records
        if self._caller is not None:
            if self._closed:
                raise ClientClosedError("the consumer is closed")
            records = self._caller.poll(timeout_ms / 1000, limit)
            return records if type(records) is ConsumerRecords else ConsumerRecords(records)
        handoff = Handoff(self._aio, self._unclaimed)
        try:
            if self._aio.polls_without_task:
                self._poll_waiting(handoff, timeout_ms, limit)
            else:
                self._serve(handoff.poll, timeout_ms, limit,
                            timeout=timeout_ms / 1000 + self._request_timeout_s + GRACE_S)
        except BaseException:  # Ctrl-C, or the loop did not answer in time
            handoff.leave()
            raise
        return handoff.records()

    def _poll_waiting(self, handoff: Handoff, timeout_ms: int, limit: int) -> None:
        """``poll`` without a group: a waiter on the loop (``AsyncConsumer.add_poll_waiter``)
        offers the outcome to ``handoff`` in the scheduler pass that received the records,
        and wakes this thread; at the deadline the waiter is removed and [] offered.

        The loop thread then waits (at most ``HANDOFF_WAIT_S``, the GIL released) until this
        thread has the outcome: woken threads take a while to run in a VM, and the loop
        thread, carrying on with its bookkeeping (the next fetch), would otherwise hold the
        GIL and keep this thread, and the application's records, waiting until the loop
        sleeps. The next fetch is sent as soon as this thread blocks or yields the GIL."""
        if self._closed:
            raise ClientClosedError("the consumer is closed")
        offered: queue.SimpleQueue = queue.SimpleQueue()
        picked_up = threading.Event()

        def deliver(outcome: Any) -> None:  # on the loop's thread
            if handoff.offer(outcome):
                offered.put(None)
                picked_up.wait(HANDOFF_WAIT_S)

        self._portal.call_soon(self._aio.add_poll_waiter, limit, deliver)
        try:
            try:
                offered.get(timeout=max(0, timeout_ms) / 1000)
            except queue.Empty:
                if self._portal.run_sync(self._aio.remove_poll_waiter, deliver):
                    handoff.offer(ConsumerRecords())
                else:
                    offered.get(timeout=GRACE_S)  # served just before it was removed
        except BaseException:  # Ctrl-C, or the loop did not answer
            self._portal.run_soon(self._aio.remove_poll_waiter, deliver)
            raise
        finally:
            picked_up.set()

    def beginning_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return self._call(self._aio.beginning_offsets, list(partitions), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def end_offsets(self, partitions: Iterable[TopicPartition],
                    timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return self._call(self._aio.end_offsets, list(partitions), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def offsets_for_times(self, timestamps: dict[TopicPartition, int], timeout_ms: int | None = None
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        return self._call(self._aio.offsets_for_times, dict(timestamps), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def _timeout(self, timeout_ms: int | None) -> float:
        return (self._api_timeout_s if timeout_ms is None else timeout_ms / 1000) + 1.0

    def __iter__(self) -> Iterator[Record]:
        """Records as they arrive; stops after ``consumer_timeout_ms`` without any, or when
        the consumer is closed. Polled in batches, yielded one by one: a record counts as
        consumed once yielded (``commit()`` and ``position`` count from the next one; ``seek``
        and ``pause`` drop what was not yielded), as kafka-python's iterator does."""
        idle_since = time.monotonic()
        aio_consumer = self._aio  # its unreturned records: see SubscriptionState
        while not self._closed:
            record = aio_consumer.next_unreturned()
            if record is None:
                records = self.poll(timeout_ms=500)
                if not records:
                    if (time.monotonic() - idle_since) * 1000 >= self.consumer_timeout_ms:
                        return
                    continue
                idle_since = time.monotonic()
                aio_consumer.put_back(records)
                continue
            yield record

    def close(self, timeout: float = 30.0) -> None:
        """Commit (with auto-commit), revoke through the listener and leave the group, within
        ``timeout`` seconds; then stop."""
        self._refuse_loop_thread("closed")
        if self._closed:
            return
        try:
            self._serve(self._aio.close, int(timeout * 1000), timeout=timeout + GRACE_S)
        finally:
            self._closed = True
            self._portal.stop()
            if self._caller is not None:
                self._caller.close()


class Admin(_Blocking):
    """A blocking admin client; options as ``tidelog.aio.AsyncAdmin``."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", **options: Unpack[AdminOptions]):
        self._aio = AsyncAdmin(bootstrap_servers, **options)
        self._api_timeout_s = self._aio.default_api_timeout_ms / 1000
        self._start("tidelog-admin")

    def _timeout(self, timeout_ms: int | None) -> float:
        return (self._api_timeout_s if timeout_ms is None else timeout_ms / 1000) + GRACE_S

    def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None,
                      validate_only: bool = False) -> dict[str, None]:
        return self._call(self._aio.create_topics, list(new_topics), timeout_ms, validate_only,
                          timeout=self._timeout(timeout_ms))

    def delete_topics(self, names: Iterable[str], timeout_ms: int | None = None) -> dict[str, None]:
        return self._call(self._aio.delete_topics, list(names), timeout_ms, timeout=self._timeout(timeout_ms))

    def create_partitions(self, new_counts: dict[str, int], timeout_ms: int | None = None,
                          validate_only: bool = False) -> dict[str, None]:
        return self._call(self._aio.create_partitions, dict(new_counts), timeout_ms, validate_only,
                          timeout=self._timeout(timeout_ms))

    def describe_topics(self, names: Iterable[str] | None = None,
                        timeout_ms: int | None = None) -> list[TopicDescription]:
        return self._call(self._aio.describe_topics, None if names is None else list(names), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def list_topics(self, include_internal: bool = False, timeout_ms: int | None = None) -> list[str]:
        return self._call(self._aio.list_topics, include_internal, timeout_ms, timeout=self._timeout(timeout_ms))

    def describe_cluster(self, timeout_ms: int | None = None) -> ClusterDescription:
        return self._call(self._aio.describe_cluster, timeout_ms, timeout=self._timeout(timeout_ms))

    def describe_log_dirs(self, brokers: Iterable[int] | None = None, timeout_ms: int | None = None
                      ) -> dict[int, dict[str, LogDirDescription]]:
        return self._call(self._aio.describe_log_dirs, brokers, timeout_ms, timeout=self._timeout(timeout_ms))

    def describe_configs(self, topic: str, keys: Sequence[str] | None = None,
                         timeout_ms: int | None = None) -> dict[str, ConfigEntry]:
        return self._call(self._aio.describe_configs, topic, keys, timeout_ms, timeout=self._timeout(timeout_ms))

    def alter_configs(self, topic: str, configs: dict[str, str | None], validate_only: bool = False,
                      timeout_ms: int | None = None) -> None:
        return self._call(self._aio.alter_configs, topic, dict(configs), validate_only, timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def alter_broker_configs(self, broker_id: int | None, configs: dict[str, str | None],
                             validate_only: bool = False, timeout_ms: int | None = None) -> None:
        """Set a broker's dynamic configs; see ``AsyncAdmin.alter_broker_configs``."""
        return self._call(self._aio.alter_broker_configs, broker_id, dict(configs), validate_only, timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def elect_leaders(self, partitions: Iterable[TopicPartition] | None = None,
                      timeout_ms: int | None = None, election_type: str = "preferred"
                      ) -> dict[TopicPartition, tuple[int, str | None]]:
        """Leader election, preferred or unclean; see ``AsyncAdmin.elect_leaders``."""
        return self._call(self._aio.elect_leaders, None if partitions is None else list(partitions),
                          timeout_ms, election_type, timeout=self._timeout(timeout_ms))

    def broker_versions(self, brokers: Iterable[int] | None = None,
                        timeout_ms: int | None = None) -> dict[int, str | None]:
        """Each broker's software version; see ``AsyncAdmin.broker_versions``."""
        return self._call(self._aio.broker_versions, None if brokers is None else list(brokers), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def alter_partition_reassignments(self, reassignments: dict[TopicPartition, Sequence[int] | None],
                                      timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, str | None]]:
        """Start or cancel partition moves; see ``AsyncAdmin.alter_partition_reassignments``."""
        return self._call(self._aio.alter_partition_reassignments, dict(reassignments), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def list_partition_reassignments(self, partitions: Iterable[TopicPartition] | None = None,
                                     timeout_ms: int | None = None) -> dict[TopicPartition, PartitionReassignment]:
        """The moves in progress; see ``AsyncAdmin.list_partition_reassignments``."""
        return self._call(self._aio.list_partition_reassignments, None if partitions is None else list(partitions),
                          timeout_ms, timeout=self._timeout(timeout_ms))

    def create_acls(self, bindings: Iterable[AclBinding], timeout_ms: int | None = None) -> dict[AclBinding, None]:
        """Create ACLs; see ``AsyncAdmin.create_acls``."""
        return self._call(self._aio.create_acls, list(bindings), timeout_ms, timeout=self._timeout(timeout_ms))

    def describe_acls(self, acl_filter: AclBindingFilter = AclBindingFilter(),
                      timeout_ms: int | None = None) -> list[AclBinding]:
        """The ACLs matching ``acl_filter``; see ``AsyncAdmin.describe_acls``."""
        return self._call(self._aio.describe_acls, acl_filter, timeout_ms, timeout=self._timeout(timeout_ms))

    def delete_acls(self, filters: Iterable[AclBindingFilter], timeout_ms: int | None = None
                    ) -> dict[AclBindingFilter, list[AclBinding]]:
        """Delete the ACLs each filter matches; see ``AsyncAdmin.delete_acls``."""
        return self._call(self._aio.delete_acls, list(filters), timeout_ms, timeout=self._timeout(timeout_ms))

    def list_groups(self, states: Iterable[str] | None = None, timeout_ms: int | None = None) -> list[ListedGroup]:
        return self._call(self._aio.list_groups, None if states is None else list(states), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def describe_groups(self, group_ids: Iterable[str],
                        timeout_ms: int | None = None) -> list[ConsumerGroupDescription]:
        return self._call(self._aio.describe_groups, list(group_ids), timeout_ms, timeout=self._timeout(timeout_ms))

    def delete_groups(self, group_ids: Iterable[str], timeout_ms: int | None = None) -> None:
        return self._call(self._aio.delete_groups, list(group_ids), timeout_ms, timeout=self._timeout(timeout_ms))

    def list_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None,
                           timeout_ms: int | None = None) -> list[GroupOffsets]:
        """Committed offset, log end offset and lag per partition of the group."""
        return self._call(self._aio.list_group_offsets, group_id, None if partitions is None else list(partitions),
                          timeout_ms, timeout=self._timeout(timeout_ms))

    def alter_group_offsets(self, group_id: str, offsets: dict[TopicPartition, int],
                            timeout_ms: int | None = None) -> None:
        """Reset the group's committed offsets; only while the group has no members."""
        return self._call(self._aio.alter_group_offsets, group_id, dict(offsets), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def delete_records(self, offsets: dict[TopicPartition, int], timeout_ms: int | None = None
                       ) -> dict[TopicPartition, int]:
        """Delete every record below ``offsets[tp]`` (-1: the high watermark); returns each
        partition's low watermark (see ``AsyncAdmin.delete_records``)."""
        return self._call(self._aio.delete_records, dict(offsets), timeout_ms, timeout=self._timeout(timeout_ms))

    def list_offsets(self, specs: dict[TopicPartition, int],
                     timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, int]]:
        """See ``AsyncAdmin.list_offsets``."""
        return self._call(self._aio.list_offsets, dict(specs), timeout_ms, timeout=self._timeout(timeout_ms))

    def log_end_offsets(self, partitions: Iterable[TopicPartition],
                        timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        """Each partition's log end offset on its leader (see ``AsyncAdmin.log_end_offsets``)."""
        return self._call(self._aio.log_end_offsets, list(partitions), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def alter_user_scram_credentials(self, alterations: Iterable[Any], timeout_ms: int | None = None
                                     ) -> dict[str, None]:
        """See ``AsyncAdmin.alter_user_scram_credentials``."""
        return self._call(self._aio.alter_user_scram_credentials, list(alterations), timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def describe_user_scram_credentials(self, users: Iterable[str] | None = None,
                                        timeout_ms: int | None = None) -> dict[str, Any]:
        """See ``AsyncAdmin.describe_user_scram_credentials``."""
        return self._call(self._aio.describe_user_scram_credentials, None if users is None else list(users),
                          timeout_ms, timeout=self._timeout(timeout_ms))

    def alter_client_quotas(self, alterations: Iterable[Any], validate_only: bool = False,
                            timeout_ms: int | None = None) -> dict[Any, None]:
        """See ``AsyncAdmin.alter_client_quotas``."""
        return self._call(self._aio.alter_client_quotas, list(alterations), validate_only, timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def describe_client_quotas(self, quota_filter: Any = None, timeout_ms: int | None = None
                               ) -> dict[Any, dict[str, float]]:
        """See ``AsyncAdmin.describe_client_quotas``."""
        return self._call(self._aio.describe_client_quotas, quota_filter, timeout_ms,
                          timeout=self._timeout(timeout_ms))

    def close(self, timeout: float = 10.0) -> None:
        self._stop(self._aio.close, timeout=timeout)
