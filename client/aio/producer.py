"""The Trio producer: ``AsyncProducer`` (the API) and its ``Sender`` (the background task).

Theory of operation.

``send`` serializes the record, picks its partition from the cached metadata and appends it
to the accumulator; it only awaits when the topic's metadata is missing or buffer memory is
exhausted (both bounded by ``max_block_ms``). The per-record path is synchronous and
thread-safe (``try_send``): the blocking ``client.Producer`` calls it straight from the
application's thread, so there is no hop into Trio per record.

The ``Sender`` is one task that decides in pure code and awaits in one place (STYLE example 8):
each round it expires batches past ``delivery_timeout_ms`` (a request in flight is awaited
no longer than its earliest batch's deadline, as Kafka's KIP-91 does), asks the accumulator
which leader nodes are ready (a node throttled under KIP-219 is not, until its throttle
ends), drains one ProduceRequest per ready node (at most one batch per partition), starts
one task per request, and sleeps until woken (a batch opened or filled, a request
finished, metadata updated, a flush or close began) or until the next linger/backoff/expiry
deadline. Each request task turns its response into one ``Decision`` per batch with
``decide`` (pure), and ``_apply`` carries them out: complete, re-enqueue for retry (with a
metadata refresh for errors that invalidate metadata), or fail.

Ordering: a node's requests reach the wire in the order they were drained (a request its
task writes holds the node until it has its place on the connection: ``_queued``), and the
connection's reader applies every produce response in response order, so the futures and
callbacks of one partition complete in send order.

Guarantees: every future resolves, with RecordMetadata or an exception: batches are failed
when they expire, when retries are exhausted, on a non-retriable error, and on close (queued
and in-flight alike, including when the sender task is cancelled). Without idempotence, a
retry may duplicate a batch the broker appended but could not acknowledge (as in Kafka), and
with ``max_in_flight_requests_per_connection`` > 1 a retried batch may land after a newer
one that was already in flight; once a partition is retrying it sends one batch at a time.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import math
import operator
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from tidelog.aio._lifecycle import RunsInOwnNursery
from tidelog.aio.accumulator import BulkRecords, ProducerBatch, RecordAccumulator, RecordFuture, RecordFutures
from tidelog.aio.cluster import Backoff, Cluster, ClusterMetadata
from tidelog.aio.idempotence import IdempotenceState, SequenceVerdict
from tidelog.aio.partitioner import StickyPartitioner, murmur2, to_positive
from tidelog.aio.stats import ProducerStats
from tidelog.errors import (
    BrokerConnectionError,
    ClientClosedError,
    RequestTimedOut,
    TidelogClientError,
    TidelogError,
    broker_error,
)
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    MESSAGE_TOO_LARGE,
    NETWORK_EXCEPTION,
    NONE,
    RECORD_LIST_TOO_LARGE,
    REQUEST_TIMED_OUT,
    UNKNOWN_SERVER_ERROR,
    InvalidRequestError,
    RecordTooLargeError,
    for_code,
)
from tidelog.protocol.messages import InitProducerIdRequest, ProduceResponse
from tidelog.protocol.records import Codec
from tidelog.protocol.topics import TopicPartition, validate_topic_name
from tidelog.records import RecordMetadata
from tidelog.security import SecurityConfig

if TYPE_CHECKING:  # the options' names and types, for IDEs and type checkers
    from typing import Unpack

    from tidelog.options import ProducerConfigOptions

__all__ = ["AsyncProducer", "ProducerConfig", "Sender", "Decision", "decide",
           "build_produce_request", "partition_results", "parse_acks", "serialize", "ProducerMetrics"]

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes | str | None]] | None
Partitioner = Callable[[bytes | None, list[int], list[int]], int]

KEY_HASH_CACHE = 1 << 16  # distinct keys whose partition hash is remembered
MAX_IDEMPOTENT_IN_FLIGHT = 5  # the broker remembers each producer's last 5 batches
# An application thread writes its batch itself only while at most this share of the recent
# records were sent with another one waiting (Sender._send_from_caller): records that come in
# bursts go to the loop thread, whose wake-up gathers a burst into few requests
BURST_SHARE = 0.25
FOUND_BUSY_WEIGHT = 1 / 8  # of the latest record in that share (an exponential average)
# A request an application thread wrote is handed to the loop thread (its response's task:
# in-flight slot, timeout, failure) at the loop's next look, which comes within this long:
# waking the loop thread after every write cost the record path ~50 us at 1,000 records/s
# (the woken thread competes with the broker and the consumer for the two CPUs)
TRACK_WITHIN_S = 0.05

_ACKS = {"all": -1, "-1": -1, -1: -1, "1": 1, 1: 1, "0": 0, 0: 0}


def parse_acks(acks: Any) -> int:
    """Kafka's ``acks``: "all" or -1 (the ISR), 1 (the leader), 0 (no response)."""
    try:
        return _ACKS[acks]
    except (KeyError, TypeError):
        raise ValueError(f"acks must be 'all', -1, 1 or 0, got {acks!r}") from None


def serialize(value: Any) -> bytes | None:
    """The default serializer: bytes-like as is, str as UTF-8, None as null."""
    if value is None or type(value) is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"cannot send a {type(value).__name__}: give bytes or str, "
                    "or set key_serializer / value_serializer")


@dataclass(frozen=True, slots=True)
class ProducerConfig(SecurityConfig):
    """Every producer option, with Kafka's name and default; units in the names (the
    security options are ``SecurityConfig``'s)."""

    bootstrap_servers: str | Sequence[str] = "localhost:9092"
    client_id: str | None = None
    acks: int = -1
    linger_ms: int = 5
    batch_size: int = 16384
    buffer_memory: int = 32 << 20
    compression_type: str | None = None
    delivery_timeout_ms: int = 120000
    request_timeout_ms: int = 30000
    retries: int = 2147483647
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    max_in_flight_requests_per_connection: int = 5
    max_block_ms: int = 60000
    max_request_size: int = 1048576
    metadata_max_age_ms: int = 300000
    # None: on when the other options allow it (acks=all, at most 5 in flight, retries > 0),
    # as Kafka 3's default; True with options that contradict it is an error
    enable_idempotence: bool | None = None

    def __post_init__(self) -> None:
        SecurityConfig.__post_init__(self)
        object.__setattr__(self, "acks", parse_acks(self.acks))
        Codec.parse(self.compression_type)
        for name in ("linger_ms", "retries", "retry_backoff_ms", "max_block_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("batch_size", "buffer_memory", "request_timeout_ms", "max_request_size",
                     "max_in_flight_requests_per_connection", "delivery_timeout_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            raise ValueError("delivery_timeout_ms must be >= linger_ms + request_timeout_ms "
                             f"({self.delivery_timeout_ms} < {self.linger_ms} + {self.request_timeout_ms})")
        object.__setattr__(self, "enable_idempotence", self._idempotence())

    def _idempotence(self) -> bool:
        """Resolve ``enable_idempotence`` against acks, in-flight requests and retries."""
        conflicts = []
        if self.acks != -1:
            conflicts.append(f"acks={self.acks} (it needs acks='all')")
        if self.max_in_flight_requests_per_connection > MAX_IDEMPOTENT_IN_FLIGHT:
            conflicts.append(f"max_in_flight_requests_per_connection={self.max_in_flight_requests_per_connection} "
                             f"(the broker deduplicates the last {MAX_IDEMPOTENT_IN_FLIGHT} batches: at most "
                             f"{MAX_IDEMPOTENT_IN_FLIGHT})")
        if self.retries == 0:
            conflicts.append("retries=0 (a lost response could not be resent)")
        if self.enable_idempotence is None:
            return not conflicts
        if self.enable_idempotence and conflicts:
            raise ValueError("enable_idempotence=True cannot be combined with " + " and ".join(conflicts)
                             + "; change those options or set enable_idempotence=False")
        return bool(self.enable_idempotence)

    @property
    def codec(self) -> Codec:
        return Codec.parse(self.compression_type)


# ---------------------------------------------------------------------------------------------
# pure decisions


class Decision(NamedTuple):
    """What to do with one batch after an attempt."""

    action: str  # "done" | "retry" | "split" | "fail"
    base_offset: int = -1
    log_append_time: int = -1
    error: BaseException | None = None
    refresh_metadata: bool = False
    error_code: int = 0  # the broker's code behind a retry or a failure (0: none / client-side)


def decide(batch: ProducerBatch, error_code: int, *, now: float, retries: int,
           base_offset: int = -1, log_append_time: int = -1, message: str | None = None) -> Decision:
    """The fate of a batch given the error code of its latest attempt (``batch.attempts``
    already counts it). Retriable errors are retried while attempts remain and the delivery
    timeout has not passed; errors that invalidate metadata also ask for a refresh. A batch
    of several records refused as too large (MESSAGE_TOO_LARGE: larger than the topic's
    max.message.bytes) is split into smaller ones that are sent again, as Kafka's Sender does;
    only a record too large alone fails with it."""
    if error_code == NONE.code:
        return Decision("done", base_offset, log_append_time)
    err = for_code(error_code)
    where = f"topic {batch.tp.topic!r} partition {batch.tp.partition}"
    if error_code == MESSAGE_TOO_LARGE.code and len(batch) > 1 and now < batch.deadline:
        return Decision("split", error=broker_error(error_code, where, message), error_code=error_code)
    if not err.retriable:
        return Decision("fail", error=broker_error(error_code, where, message),
                        refresh_metadata=err.invalid_metadata, error_code=error_code)
    return _retry_or_give_up(batch, error_code, now=now, retries=retries, message=message)


def _retry_or_give_up(batch: ProducerBatch, error_code: int, *, now: float, retries: int,
                      message: str | None) -> Decision:
    err = for_code(error_code)
    where = f"topic {batch.tp.topic!r} partition {batch.tp.partition}"
    if now >= batch.deadline:
        return Decision("fail", error=RequestTimedOut(
            f"{where}: {len(batch)} record(s) not delivered within delivery_timeout_ms "
            f"after {batch.attempts} attempt(s); last error {err.name}: {message or err.message}"),
            refresh_metadata=err.invalid_metadata, error_code=error_code)
    if batch.attempts > retries:
        return Decision("fail", error=broker_error(error_code, f"{where} (retries exhausted)", message),
                        refresh_metadata=err.invalid_metadata, error_code=error_code)
    return Decision("retry", error=broker_error(error_code, where, message),
                    refresh_metadata=err.invalid_metadata, error_code=error_code)


def decide_sequenced(batch: ProducerBatch, d: Decision, verdict: SequenceVerdict, *, now: float,
                     retries: int, message: str | None = None) -> Decision:
    """An idempotent batch's decision once its sequence is taken into account (``verdict``
    from ``IdempotenceState.decide``): a duplicate is done (with the original offsets when the
    broker sent them), a batch behind a failed one is retried after it, a fatal sequence or
    epoch error fails the batch with an error that explains it."""
    if verdict.action == "keep" or d.action == "done":
        return d
    if verdict.action == "done":
        return Decision("done", d.base_offset, d.log_append_time)
    if verdict.action == "fatal":
        where = f"topic {batch.tp.topic!r} partition {batch.tp.partition}"
        return Decision("fail", error=broker_error(d.error_code, where, verdict.why), error_code=d.error_code)
    return _retry_or_give_up(batch, d.error_code, now=now, retries=retries, message=message)


# A produce request's body as it goes on the wire (``ProduceRequest.to_body()``'s map).
ProduceBody = dict[str, Any]


def record_timestamp(timestamp_ms: Any) -> int:
    """A record's own ``timestamp_ms`` as an int: any integer type (numpy's too), else a
    TypeError naming it. The batch encoding takes only ints, and whether a send fails must
    not depend on how many records its batch gathered."""
    try:
        return operator.index(timestamp_ms)
    except TypeError:
        raise TypeError(f"timestamp_ms must be an integer (milliseconds since the epoch), "
                        f"got {type(timestamp_ms).__name__} {timestamp_ms!r:.40}") from None


def build_produce_request(batches: Sequence[ProducerBatch], *, acks: int, timeout_ms: int) -> ProduceBody:
    """One ProduceRequest for batches bound for one node, as its wire map: built directly,
    since the typed message and its encoding cost ~10 us a request on the path of a record at
    a low rate, when the caches are cold (bench/RESULTS.md); the unit tests hold it equal to
    the typed message's ``to_body()``. Several batches of one partition (in their order)
    become one run of back-to-back batches, which the broker appends together or not at all."""
    by_tp: dict[TopicPartition, list[bytes]] = {}
    for batch in batches:
        by_tp.setdefault(batch.tp, []).append(batch.encode())
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for tp, payloads in by_tp.items():
        by_topic.setdefault(tp.topic, []).append(
            {"index": tp.partition, "records": payloads[0] if len(payloads) == 1 else b"".join(payloads)})
    return {"acks": acks, "timeout_ms": timeout_ms,
            "topic_data": [{"name": t, "partition_data": parts} for t, parts in by_topic.items()],
            "transactional_id": None}


def partition_results(response: ProduceResponse) -> dict[TopicPartition, tuple[int, int, int, str | None]]:
    """``tp -> (error_code, base_offset, log_append_time_ms, error_message)``."""
    return {TopicPartition(t.name, p.index): (p.error_code, p.base_offset, p.log_append_time_ms,
                                              p.error_message)
            for t in response.responses for p in t.partition_responses}


# Errors about one batch's records: the broker refuses a partition's whole run of batches for
# one bad batch, so a run refused with one of them is sent again one batch per request
BATCH_ERRORS = frozenset(e.code for e in (MESSAGE_TOO_LARGE, INVALID_RECORD, INVALID_TIMESTAMP,
                                          CORRUPT_MESSAGE, RECORD_LIST_TOO_LARGE))


def decide_response(response: ProduceResponse, batches: Sequence[ProducerBatch], *, now: float,
                    retries: int) -> list[tuple[ProducerBatch, Decision]]:
    """One decision per batch. A partition's batches sent as one run share its result: a run
    refused for a batch error (``BATCH_ERRORS``) is retried, each batch alone (a retried
    batch is drained alone, in order), so that only the bad batch fails (or, too large, is
    split), as in Kafka, which sends one batch per partition per request."""
    results = partition_results(response)
    out = []
    skip: dict[TopicPartition, int] = {}  # records of earlier batches of the partition's run
    runs: collections.Counter[TopicPartition] | None = None  # batches per partition, on error
    for batch in batches:
        r = results.get(batch.tp)
        if r is None:
            out.append((batch, Decision("fail", error=broker_error(
                UNKNOWN_SERVER_ERROR.code, f"topic {batch.tp.topic!r} partition {batch.tp.partition}",
                "the produce response has no result for this partition"))))
            continue
        code, base_offset, append_time, message = r
        before = skip.get(batch.tp, 0)
        skip[batch.tp] = before + len(batch)
        if base_offset >= 0:
            base_offset += before
        d = decide(batch, code, now=now, retries=retries, base_offset=base_offset,
                   log_append_time=append_time, message=message)
        if d.action in ("fail", "split") and code in BATCH_ERRORS and now < batch.deadline:
            if runs is None:
                runs = collections.Counter(b.tp for b in batches)
            if runs[batch.tp] > 1:
                d = d._replace(action="retry")
        out.append((batch, d))
    return out


def decide_refusal(batches: Sequence[ProducerBatch], error: TidelogError, *, now: float,
                   retries: int) -> list[tuple[ProducerBatch, Decision]]:
    """Decisions when the broker refused the request as a whole (an error body, no partition
    results): each batch as if its partition had answered the code, so a retriable one
    (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS) is retried while retries
    and the delivery timeout allow, with a metadata refresh when it invalidates metadata, as
    Kafka's Sender retries a retriable error whatever answered it."""
    return [(b, decide(b, error.code, now=now, retries=retries, message=str(error))) for b in batches]


def decide_failure(batches: Sequence[ProducerBatch], error: BaseException, *, now: float,
                   retries: int) -> list[tuple[ProducerBatch, Decision]]:
    """Decisions when the request itself failed (connection lost, timed out). Either way the
    node may no longer lead these partitions (a paused or partitioned leader accepts
    connections and never answers), so metadata is refreshed, as Kafka's NetworkClient does on
    a disconnection or a request timeout; otherwise retries go to the stale leader forever."""
    code = REQUEST_TIMED_OUT.code if isinstance(error, RequestTimedOut) else NETWORK_EXCEPTION.code
    return [(b, decide(b, code, now=now, retries=retries, message=str(error))._replace(refresh_metadata=True))
            for b in batches]


# ---------------------------------------------------------------------------------------------
# the sender


class Sender:
    """The background task moving batches from the accumulator to the leaders."""

    def __init__(self, cluster: Cluster, accumulator: RecordAccumulator, config: ProducerConfig,
                 idempotence: IdempotenceState | None = None):
        self.cluster = cluster
        self.accumulator = accumulator
        self.config = config
        self.idempotence = idempotence
        self.stats = ProducerStats()  # what metrics() reports (tidelog.aio.stats)
        self._initializing = False  # an InitProducerId task is running
        self._fatal = False  # a producer id was refused for good: none is asked for again
        self._event = trio.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: int | None = None
        self._in_flight: dict[int, int] = {}  # node -> requests awaiting a response
        # node -> requests a task writes (not written when dispatched: connecting, no
        # free slot, another write in progress) or an application thread handed to the loop
        # thread unwritten; nothing more is drained for the node until they are queued on its
        # connection, so requests reach the wire in drain order. Under _caller_lock
        self._unwritten: dict[int, int] = {}
        self._nursery: trio.Nursery | None = None
        self._stopping = False
        # held by the loop thread's step and by an application thread sending (_send_from_caller)
        self._caller_lock = threading.Lock()
        self._found_busy = 0.0  # the recent share of sends that found a request in flight
        # requests application threads wrote, for the loop thread to track (_track_written);
        # under _caller_lock: how many since the loop's last round, and whether the loop
        # thread looks again within TRACK_WITHIN_S
        self._written: collections.deque[tuple] = collections.deque()
        self._writes_since_round = 0
        self._tracking_due = False
        self._clock: trio.abc.Clock | None = None
        cluster.add_listener(lambda _metadata: self.wakeup())

    def wakeup(self) -> None:
        """Make the sender look again; callable from any thread."""
        if self._thread is None or threading.get_ident() == self._thread:
            self._event.set()
        elif not self._send_from_caller():
            try:
                self._token.run_sync_soon(self._kick)
            except trio.RunFinishedError:
                pass

    def _send_from_caller(self) -> bool:
        """On an application thread that just made a batch ready, with linger_ms 0, when
        the leader's connection is idle and the loop thread is not sending (its step holds
        the same lock): drain and write the request from this thread. Waking the loop thread
        to do it costs the wake-up of an idle thread (~70 us in this VM) before the request
        is on the wire. The connection's reader applies the response; the loop thread takes
        the request's task over (``_track_written``) at the response or its next round,
        within ``TRACK_WITHIN_S``, and is woken for it only when not due to look by then.
        False: nothing was sent, the loop thread must look. Only for linger_ms 0 (a producer
        that lingers trades latency for batching: its requests are written by the loop
        thread, in parallel with the application); not with acks=0, nor at most one request
        in flight (until the loop counts this one, it could start another).

        Nor for records that come in bursts (more than ``BURST_SHARE`` of the recent ones
        found a request in flight or joined another in its batch): the first of a burst,
        written at once, would leave the rest for a second request, and the consumer, busy
        with the first, would take them a whole fetch later; the loop thread's wake-up
        gathers them instead (at 10,000 records/s in bursts, end-to-end p50 0.8 -> 0.5 ms).

        An idempotent producer's batch gets its sequence in the drain, as on the loop thread:
        everything that changes the sequences (the drain, an epoch bump or a new id, a
        response's verdict) happens under this lock, and only while the producer has an id
        and no bump pending does this thread drain at all."""
        config, seqs = self.config, self.idempotence
        if (config.linger_ms or config.acks == 0
                or config.max_in_flight_requests_per_connection < 2
                or self._stopping or self._nursery is None or self.accumulator.closed
                or not self._caller_lock.acquire(blocking=False)):
            return False
        try:
            if self._nursery is None:  # the sender ended while this thread took the lock
                return False
            if seqs is not None and not seqs.ready:
                return False  # the loop thread asks for an id or bumps the epoch first
            return self._drain_from_caller()
        except Exception:  # the loop thread's step tries again and reports it
            log.debug("sending from the caller's thread failed; the loop thread sends", exc_info=True)
            return False
        finally:
            self._caller_lock.release()

    def _drain_from_caller(self) -> bool:
        acc, config, cluster = self.accumulator, self.config, self.cluster
        now = acc.clock()
        metadata = cluster.metadata
        node = acc.sole_ready(metadata, now)
        if node is None:
            check = acc.ready(metadata, now)
            if check.unknown_leaders or len(check.nodes) != 1:
                return False
            node = next(iter(check.nodes))
        conn = cluster.open_connection(node)
        if conn is None or not conn.writes_from_thread:
            return False
        with conn.thread_lock:  # the connection stays idle until this request is written
            clock_now = self._clock.current_time()
            idle = conn.idle(clock_now)
            # a request answered but not yet counted out by the loop thread is not a burst
            self._found_busy += ((0.0 if idle else 1.0) - self._found_busy) * FOUND_BUSY_WEIGHT
            if not idle or self._in_flight.get(node, 0) or self._found_busy > BURST_SHARE or self._unwritten:
                return False  # the loop's requests go first; bursts are the loop's to gather
            drained = acc.drain(metadata, (node,), config.max_request_size, now).get(node)
            if not drained:
                return False
            if self.idempotence is not None:
                self.idempotence.mark_sent(drained)
            try:
                request = build_produce_request(drained, acks=config.acks, timeout_ms=config.request_timeout_ms)
                counted: list[bool] = []
                on_response, applied = self._response_applier(node, drained, now, counted)
                pending = conn.start_request_from_thread(request, api_key=ApiKey.PRODUCE, early=on_response,
                                                         now=clock_now)
            except BaseException as e:
                # drained (and given sequences): never dropped, the loop thread sends them
                # (or fails them: a codec library missing, say)
                self._hand_to_loop(node, drained, now)
                if isinstance(e, Exception):
                    return True
                raise
            finally:
                self._count_followers(drained)  # after the write: the request is on the wire sooner
            if pending is None:  # failed or throttled since idle() said otherwise
                self._hand_to_loop(node, drained, now)
                return True
            self._count_in(node, drained)  # now, under this lock: the loop's next round sees it
            counted.append(True)
            unwritten = conn.unwritten
        # its statistics are the loop thread's (_track): on a CPU this thread shares with the
        # broker it just woke, the broker runs only once this thread sleeps
        self._written.append((node, drained, request, (conn, pending, applied), now))
        self._writes_since_round += 1
        if unwritten:  # the kernel did not take it all: the response's task writes the rest, now
            self._token.run_sync_soon(self._track_written)
        elif not self._tracking_due:  # the loop thread sleeps for longer: wake it, once
            self._tracking_due = True
            self._token.run_sync_soon(self._set_event)
        return True

    def _hand_to_loop(self, node: int, batches: list[ProducerBatch], now: float) -> None:
        """Under ``_caller_lock``: batches an application thread drained but did not write: the
        loop thread dispatches them (``_track``), and the node is drained no more until then.
        Once the producer's run has ended, its end failed them already."""
        self._unwritten[node] = self._unwritten.get(node, 0) + 1
        try:
            self._token.run_sync_soon(self._track, node, batches, None, None, now)
        except trio.RunFinishedError:
            pass

    def _count_followers(self, batches: list[ProducerBatch]) -> None:
        """Under ``_caller_lock``, for a request of ``batches`` about to be written: every
        record after its first was sent while another waited, as busy as a send that finds a
        request in flight (see ``BURST_SHARE``)."""
        followers = min(sum(map(len, batches)) - 1, 16)
        if followers > 0:
            self._found_busy = 1.0 - (1.0 - self._found_busy) * (1.0 - FOUND_BUSY_WEIGHT) ** followers

    def _response_applier(self, node: int, batches: list[ProducerBatch], sent: float, counted: list[bool]
                          ) -> tuple[Callable[[ProduceResponse], None], list[bool]]:
        """The connection reader's callback for a produce response (in response order, the
        pass it arrived in), and the list it marks once it applied it. The request is counted
        out of flight before its futures complete (an application thread woken by one and
        sending again finds the sender idle), if ``counted`` says it was counted in: an
        application thread interrupted in its write hands the batches to the loop uncounted."""
        applied: list[bool] = []

        def on_response(response: ProduceResponse) -> None:
            applied.append(True)
            self._count_out(node, counted)
            now = self.accumulator.clock()
            self.stats.on_response(now, now - sent)
            try:
                self._track_written()  # first: its statistics are of the batches as sent
            finally:
                self._apply(decide_response(response, batches, now=now, retries=self.config.retries))

        return on_response, applied

    def _track_written(self) -> None:
        """On the loop thread: ``_track`` the requests application threads wrote since the
        last look (at the loop's next round, or at a produce response, whichever comes
        first). Each has its request: ``_track`` takes no lock for those (a round calls this
        under ``_caller_lock``)."""
        written = self._written
        while written:
            self._track(*written.popleft())

    def _track(self, node: int, batches: list[ProducerBatch], request: ProduceBody | None,
               written: tuple[Any, Any, list[bool]] | None, sent: float) -> None:
        """On the loop thread: await the response of a request an application thread wrote
        and counted in flight (``_send_from_caller``) in a task, unless the connection's
        reader applied it already (the usual case at a response), and record its statistics;
        with no ``request``, send the batches that thread drained but did not write."""
        if request is None:
            with self._caller_lock:  # as _step's: the sequences change under it
                self._release(node)  # the hand-over's hold (_dispatch holds it again if need be)
                if self._nursery is not None:
                    self._dispatch(node, batches, counted=True)
                    return
            self._fail_unanswered(batches)  # the sender stopped: nothing else would complete them
            return
        self.stats.on_request(sent, batches)
        if written is not None and written[2]:
            return  # the connection's reader applied the response: no task need wait for it
        if self._nursery is None:  # the sender stopped: nothing else would complete them
            self._fail_unanswered(batches)
            return
        try:
            self._nursery.start_soon(self._send, node, batches, request, written, sent, True)
        except RuntimeError:  # the nursery is closing (the sender's end has not run yet)
            self._fail_unanswered(batches)

    def _fail_unanswered(self, batches: list[ProducerBatch]) -> None:
        for batch in batches:
            self.accumulator.complete(batch, error=ClientClosedError(
                f"the producer closed before {batch.tp} was acknowledged"))

    def _kick(self) -> None:
        """A wake-up from another thread (a blocking ``send``), on the Trio thread: send what
        is ready right now, in this scheduler pass, rather than waking the loop task to do it
        in the next one (each pass polls the event loop, giving the application's threads a
        chance to take the GIL before the request is on the wire)."""
        if self._stopping or self._nursery is None:
            self._event.set()
            return
        try:
            if self._step() < math.inf:  # something waits (linger, backoff): the loop's timer
                self._event.set()
        except Exception:  # never out of a run_sync_soon callback: the loop's step reports it
            log.debug("the sender's step failed on a wake-up; the loop retries it", exc_info=True)
            self._event.set()

    def _set_event(self) -> None:
        self._event.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._clock = trio.lowlevel.current_clock()
        self._thread = threading.get_ident()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await self._loop()
        finally:
            with self._caller_lock:  # no application thread writes from now on
                self._nursery = None
                self._track_written()  # what is not answered yet fails

    async def _loop(self) -> None:
        while True:
            self._event = trio.Event()  # any wake-up from here on is seen
            delay = self._step()
            with trio.move_on_after(delay):
                await self._event.wait()

    def _step(self) -> float:
        """Expire, drain and send what is ready (synchronous); seconds until the next look.
        Under the lock an application thread sends under, so that batches are written in
        the order they are drained."""
        with self._caller_lock:
            return self._step_locked()

    def _step_locked(self) -> float:
        acc, config = self.accumulator, self.config
        # while application threads write, look again within TRACK_WITHIN_S (they wake this
        # thread only when it is not due to look)
        self._track_written()
        self._tracking_due, self._writes_since_round = self._writes_since_round > 0, 0
        if (self.idempotence is not None and not self.idempotence.ready and not self._initializing
                and not self._fatal):
            self._bump_or_init_producer_id()
        now = acc.clock()
        for batch in acc.expire(now):
            self.stats.on_error(now, len(batch))
            acc.complete(batch, error=self._expired(batch, now), in_flight=False)
        metadata = self.cluster.metadata
        busy = [n for n, k in self._in_flight.items() if k >= config.max_in_flight_requests_per_connection]
        if self._unwritten:
            busy += self._unwritten
        throttled = self.cluster.throttled()  # not ready until the throttle ends (KIP-219)
        if throttled:
            busy += throttled
        check = acc.ready(metadata, now, busy)
        delay = min(check.next_delay, *throttled.values()) if throttled else check.next_delay
        if check.unknown_leaders:
            self.cluster.request_update()
            delay = min(delay, config.retry_backoff_ms / 1000)
        if check.nodes:
            drained = acc.drain(metadata, check.nodes, config.max_request_size, now)
            for node, batches in drained.items():
                self._dispatch(node, batches)
        return min(delay, TRACK_WITHIN_S) if self._tracking_due else delay

    def _dispatch(self, node: int, batches: list[ProducerBatch], counted: bool = False) -> None:
        """Under ``_caller_lock``: send ``batches`` to ``node``. The request is built and, when
        the connection is open with a free slot, written right now; a task awaits the response
        (or, when the request could not be written here, connects and sends it first).
        ``counted``: an application thread drained them and counted them in ``_found_busy``."""
        config = self.config
        self._count_in(node, batches)
        if self.idempotence is not None:
            self.idempotence.mark_sent(batches)
        written = None
        sent = self.accumulator.clock()
        try:
            request: ProduceBody | Exception = build_produce_request(
                batches, acks=config.acks, timeout_ms=config.request_timeout_ms)
        except Exception as e:  # e.g. a codec library missing: _send fails these records
            request = e
        else:
            conn = self.cluster.open_connection(node) if config.acks != 0 else None
            if conn is not None:
                on_response, applied = self._response_applier(node, batches, sent, [True])
                try:
                    pending = conn.start_request(request, api_key=ApiKey.PRODUCE, early=on_response)
                except (BrokerConnectionError, InvalidRequestError):
                    pending = None  # the connection failed: _send reconnects or reports it
                except Exception as e:  # the request does not frame: _send fails these records
                    request, pending = e, None
                if pending is not None:
                    written = (conn, pending, applied)
            # the bookkeeping after the write: the request is on the wire sooner
            self.stats.on_request(sent, batches)
        if not config.linger_ms and not counted:
            self._count_followers(batches)
        if written is None:  # the task writes it: the node gets nothing more until it has
            self._unwritten[node] = self._unwritten.get(node, 0) + 1
        self._nursery.start_soon(self._send, node, batches, request, written, sent)

    def _queued(self, node: int, done: list[bool]) -> None:
        """A request a task writes has its place on ``node``'s connection (or never will):
        the node may be drained again. Once per request (``done``)."""
        if done:
            return
        done.append(True)
        with self._caller_lock:  # an application thread's hand-over holds nodes too
            self._release(node)

    def _release(self, node: int) -> None:
        """Under ``_caller_lock``: one request fewer holds ``node`` (``_unwritten``)."""
        left = self._unwritten[node] - 1
        if left:
            self._unwritten[node] = left
        else:
            del self._unwritten[node]
        if self.accumulator.has_queued():
            self._event.set()

    def _bump_or_init_producer_id(self) -> None:
        """A bump of the epoch is made here (KIP-360: the producer's own); a producer with no
        id, or whose epoch is used up, asks a broker for a new id."""
        seqs = self.idempotence
        before = seqs.producer
        if seqs.bump_epoch():
            log.info("producer id %d: epoch %d (was %d)", seqs.producer.producer_id, seqs.producer.epoch, before.epoch)
            return
        self._initializing = True
        self._nursery.start_soon(self._init_producer_id)

    async def _init_producer_id(self) -> None:
        """Get a new producer id from any broker; retried with backoff until it succeeds or
        the producer closes. Batches wait for it (and expire meanwhile like any other). An
        error a retry cannot mend (CLUSTER_AUTHORIZATION_FAILED, any non-retriable code) is
        fatal, as in Kafka's InitProducerIdHandler: ``_fail_fatally``."""
        seqs, config = self.idempotence, self.config
        backoff = Backoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000)
        try:
            while True:
                request = InitProducerIdRequest()
                try:
                    response = await self.cluster.request_any(request, api_key=ApiKey.INIT_PRODUCER_ID)
                    if response.error_code == NONE.code:
                        log.info("producer id %d epoch %d", response.producer_id, response.producer_epoch)
                        with self._caller_lock:  # an application thread drains under it
                            seqs.set_producer(response.producer_id, response.producer_epoch)
                        return
                    error: BaseException = broker_error(response.error_code, "InitProducerId",
                                                        response.error_message)
                    if not for_code(response.error_code).retriable:
                        self._fail_fatally(error)
                        return
                except TidelogError as e:
                    error = e
                log.warning("cannot get a producer id: %s; retrying", error)
                await trio.sleep(backoff.next_delay())
        finally:
            self._initializing = False
            self._event.set()

    def _fail_fatally(self, error: BaseException) -> None:
        """The idempotent producer cannot get a producer id: nothing can be sent. Queued
        records fail with ``error`` now, and the producer refuses new ones with it."""
        log.error("the producer cannot send: %s", error)
        self._fatal = True
        acc = self.accumulator
        with self._caller_lock:  # an application thread drains under it
            batches = acc.fail_fatally(error)
        for batch in batches:
            self.stats.on_error(acc.clock(), len(batch))
            acc.complete(batch, error=error, in_flight=False)

    def _expired(self, batch: ProducerBatch, now: float) -> RequestTimedOut:
        last = f"; {batch.attempts} attempt(s), last error: {batch.last_error}" if batch.last_error else ""
        return RequestTimedOut(
            f"topic {batch.tp.topic!r} partition {batch.tp.partition}: expiring {len(batch)} record(s): "
            f"{(now - batch.created) * 1000:.0f} ms have passed since the batch was created "
            f"(delivery_timeout_ms {self.config.delivery_timeout_ms}){last}")

    async def _send(self, node: int, batches: list[ProducerBatch], request: ProduceBody | Exception,
                    written: tuple[Any, Any, list[bool]] | None, sent: float = 0.0,
                    from_thread: bool = False) -> None:
        decisions: list[tuple[ProducerBatch, Decision]] | None = None
        config, acc = self.config, self.accumulator
        # the connection's reader applied the response (in response order, as any other)
        applied: list[bool] = written[2] if written is not None else []
        done: list[bool] = []  # the task's own write is queued on the connection (_queued)
        # Kafka (KIP-91): a batch in flight expires at its delivery timeout too; the request
        # then fails as a timed-out one, and decide() fails the batches past their deadline
        timeout = min(config.request_timeout_ms / 1000 + 1.0,
                      max(0.0, min(b.deadline for b in batches) - acc.clock()))
        try:
            if isinstance(request, Exception):
                raise request
            try:
                if written is not None:
                    conn, pending, applied = written
                    response = await conn.finish_request(pending, api_key=ApiKey.PRODUCE, timeout=timeout,
                                                         take_slot=from_thread)
                    if not applied:
                        self.stats.on_response(acc.clock(), acc.clock() - sent)
                    decisions = [] if applied else decide_response(response, batches, now=acc.clock(),
                                                                   retries=config.retries)
                else:
                    conn = await self.cluster.connection(node)
                    queued = functools.partial(self._queued, node, done)
                    if config.acks == 0:
                        await conn.send_no_response(request, api_key=ApiKey.PRODUCE, queued=queued)
                        decisions = [(b, Decision("done")) for b in batches]
                    else:
                        on_response, applied = self._response_applier(node, batches, sent, [True])
                        await conn.request(request, api_key=ApiKey.PRODUCE, timeout=timeout,
                                           early=on_response, queued=queued)
                        decisions = []
            except (BrokerConnectionError, RequestTimedOut, InvalidRequestError) as e:
                log.debug("produce request to node %s failed: %s", node, e)
                decisions = decide_failure(batches, e, now=acc.clock(), retries=config.retries)
            except TidelogError as e:
                if isinstance(e, TidelogClientError):  # not the broker's answer (authentication)
                    raise
                log.debug("node %s refused a produce request: %s", node, e)
                decisions = decide_refusal(batches, e, now=acc.clock(), retries=config.retries)
        except Exception as e:  # e.g. a codec library missing: fail these records, keep running
            log.exception("cannot send %d batch(es) to node %s", len(batches), node)
            decisions = [(b, Decision("fail", error=e)) for b in batches]
        finally:
            if written is None:
                self._queued(node, done)  # if it never was: the node is not held
            if applied:
                decisions = []  # the connection's reader applied the response (and counted it out)
            else:
                self._count_out(node)
            if decisions is None:  # cancelled (close) or a bug: never drop records silently
                for batch in batches:
                    acc.complete(batch, error=ClientClosedError(
                        f"the producer closed before {batch.tp} was acknowledged"))
        self._apply(decisions)

    def _count_in(self, node: int, batches: list[ProducerBatch]) -> None:
        """Under ``_caller_lock``: a request of ``batches`` to ``node`` goes out (``_count_out``
        when it ends), and each batch has one attempt more."""
        self._in_flight[node] = self._in_flight.get(node, 0) + 1
        for batch in batches:
            batch.attempts += 1

    def _count_out(self, node: int, counted: list[bool] | None = None) -> None:
        """A request to ``node`` ended: out of flight (under the lock an application thread
        counts its requests in under, and checked under it: ``counted`` empty, it never was);
        the loop looks again if it was at the limit or batches wait."""
        with self._caller_lock:
            if counted is not None and not counted:
                return
            was_busy = self._in_flight[node] >= self.config.max_in_flight_requests_per_connection
            self._in_flight[node] -= 1
        if was_busy or self.accumulator.has_queued():  # else nothing waits for this request to end
            self._event.set()

    def _apply(self, decisions: list[tuple[ProducerBatch, Decision]]) -> None:
        if self.idempotence is None:
            self._apply_decisions(decisions)
            return
        # an application thread drains (and so assigns sequences) under this lock: a batch
        # given back its sequence must be queued again before any drain can look
        with self._caller_lock:
            self._apply_decisions(decisions)

    def _apply_decisions(self, decisions: list[tuple[ProducerBatch, Decision]]) -> None:
        acc = self.accumulator
        refresh = False
        seqs = self.idempotence
        for batch, d in decisions:
            if seqs is not None and batch.base_sequence >= 0 and d.action != "done":
                verdict = seqs.decide(batch, d.error_code)
                d = decide_sequenced(batch, d, verdict, now=acc.clock(), retries=self.config.retries)
                if verdict.action in ("resequence", "reset") and d.action == "retry":
                    acc.clear_queued_sequences(batch)
                if verdict.action == "resequence" and d.action == "retry":
                    seqs.clear_sequence(batch)  # refused after an epoch bump: not in the log
                elif verdict.action == "reset" and d.action == "retry":
                    seqs.reset_sequence(batch)  # the broker forgot the producer: a new epoch
            refresh |= d.refresh_metadata
            if d.action in ("retry", "fail"):
                (self.stats.on_retry if d.action == "retry" else self.stats.on_error)(acc.clock(), len(batch))
            if d.action == "retry" and not acc.closed_for_retries:
                batch.last_error = d.error
                acc.reenqueue(batch, acc.clock())
                self._event.set()
            elif d.action == "split" and not acc.closed_for_retries:
                batch.last_error = d.error
                pieces = acc.split_and_reenqueue(batch, acc.clock())
                log.warning("%s: a batch of %d records is larger than the topic's max.message.bytes; "
                            "sending it again as %d smaller batches", batch.tp, len(batch), len(pieces))
                self._event.set()
            elif d.action in ("retry", "split"):
                acc.complete(batch, error=ClientClosedError(
                    f"the producer closed while {batch.tp} was being retried"))
            else:
                acc.complete(batch, d.base_offset, d.log_append_time, d.error)
        if refresh:
            self.cluster.request_update()


# ---------------------------------------------------------------------------------------------
# the producer


NEED_METADATA = object()  # try_send's answer: wait for the topic's metadata (wait_for_topic)
_time = time.time
_BYTES_OR_NONE = frozenset({bytes, type(None)})


def partly_queued(error: TidelogError, bulk: BulkRecords) -> TidelogError:
    """``error`` (a ``send_many`` that gave up waiting) with ``error.futures``: the futures of
    the records it had queued before, which are delivered like any other."""
    error.futures = bulk.futures
    return error


class AsyncProducer(RunsInOwnNursery):
    """A Trio producer. Use ``async with AsyncProducer(...) as producer:`` or start it in a
    nursery of your own: ``await nursery.start(producer.run)`` ... ``await producer.close()``.

    ``await producer.send(topic, value, key=None, headers=None, partition=None,
    timestamp_ms=None)`` returns a RecordFuture (``await fut`` -> RecordMetadata)."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", *,
                 key_serializer: Callable[[Any], bytes | None] | None = None,
                 value_serializer: Callable[[Any], bytes | None] | None = None,
                 partitioner: Partitioner | None = None, **options: Unpack[ProducerConfigOptions]):
        self.config = config = ProducerConfig(bootstrap_servers=bootstrap_servers, **options)
        self._key_serializer = key_serializer or serialize
        self._value_serializer = value_serializer or serialize
        self._plain_keys = key_serializer is None  # None keys and bytes values skip the call
        self._plain_values = value_serializer is None
        self._fast_keyless = key_serializer is None and value_serializer is None and partitioner is None
        self._max_record_size = min(config.max_request_size, config.buffer_memory)
        self._key_hashes: dict[bytes, int] = {}  # key -> toPositive(murmur2(key)), bounded
        self._tps: dict[str, list[TopicPartition]] = {}
        self._sends = 0
        self._partitioner = partitioner
        self._cluster = Cluster(config.bootstrap_servers, client_id=config.client_id,
                                request_timeout_ms=config.request_timeout_ms,
                                max_in_flight_requests_per_connection=config.max_in_flight_requests_per_connection,
                                retry_backoff_ms=config.retry_backoff_ms,
                                retry_backoff_max_ms=config.retry_backoff_max_ms,
                                metadata_max_age_ms=config.metadata_max_age_ms,
                                allow_auto_topic_creation=True, security=config)
        self._accumulator = RecordAccumulator(
            batch_size=config.batch_size, buffer_memory=config.buffer_memory,
            linger_s=config.linger_ms / 1000, codec=config.codec,
            delivery_timeout_s=config.delivery_timeout_ms / 1000,
            retry_backoff_s=config.retry_backoff_ms / 1000, partitioner=StickyPartitioner())
        idempotence = IdempotenceState() if config.enable_idempotence else None
        self._accumulator.idempotence = idempotence
        self._sender = Sender(self._cluster, self._accumulator, config, idempotence)
        self._accumulator.wakeup = self._sender.wakeup
        self._accumulator.guarantee_order = config.max_in_flight_requests_per_connection == 1
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._stopped = trio.Event()
        self._max_block_s = config.max_block_ms / 1000

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the cluster and the sender until ``close``."""
        if self._started:
            raise RuntimeError("this producer was already started")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._cluster.run)
                await nursery.start(self._sender.run)
                task_status.started()
        finally:
            self._fail_everything(ClientClosedError("the producer closed before the record was sent"))
            self._stopped.set()

    async def close(self, timeout: float | None = None) -> None:
        """Stop accepting records, deliver what is pending within ``timeout`` seconds (None:
        up to the delivery timeout), then fail whatever is left with ClientClosedError and
        stop. ``timeout=0`` fails pending records at once."""
        self._accumulator.close()
        try:
            if self._started and not self._stopped.is_set() and timeout != 0:
                limit = math.inf if timeout is None else timeout
                with trio.move_on_after(limit):
                    await self.flush()
        finally:
            with trio.CancelScope(shield=True):
                self._fail_everything(ClientClosedError("the producer closed before the record was sent"))
                if self._nursery is not None:
                    self._nursery.cancel_scope.cancel()
                if self._started:
                    await self._stopped.wait()

    def close_without_waiting(self) -> None:
        """On the Trio thread, for a caller that must not wait (a record's callback): what
        ``close(0)`` does at once. Records are refused from now on and the queued ones fail
        with ClientClosedError; ``close`` must still run, to fail those in flight and stop."""
        self._fail_everything(ClientClosedError(
            "the producer was closed from its own thread (a record callback) before the record was sent"))

    def _fail_everything(self, error: ClientClosedError) -> None:
        acc = self._accumulator
        acc.close()
        acc.closed_for_retries = True
        for batch in acc.abort():
            acc.complete(batch, error=ClientClosedError(str(error)), in_flight=False)

    @property
    def closed(self) -> bool:
        return self._accumulator.closed

    # -- sending --------------------------------------------------------------------------------

    async def send(self, topic: str, value: Any = None, key: Any = None, headers: Headers = None,
                   partition: int | None = None, timestamp_ms: int | None = None) -> RecordFuture:
        """Queue a record; returns its future. Waits only for the topic's metadata or for
        buffer memory, at most ``max_block_ms`` (then RequestTimedOut)."""
        deadline = time.monotonic() + self._max_block_s
        # Cancellation is honoured only before the record is queued: once send has queued it,
        # it returns the future. A full checkpoint costs more than the append, so a tight
        # send loop yields to the other tasks (the sender!) every 64 records.
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            r = self.try_send(topic, value, key, headers, partition, timestamp_ms)
            if type(r) is RecordFuture:
                self._sends += 1
                if not self._sends & 63:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return r
            if r is NEED_METADATA:
                await self.wait_for_topic(topic, deadline, partition)
            else:
                await self._accumulator.wait_for_memory_async(r, deadline)

    async def send_and_wait(self, topic: str, value: Any = None, key: Any = None,
                            headers: Headers = None, partition: int | None = None,
                            timestamp_ms: int | None = None) -> RecordMetadata:
        future = await self.send(topic, value, key, headers, partition, timestamp_ms)
        return await future

    def wait_for_memory(self, size: int, deadline: float) -> None:
        """From a thread other than the Trio one: block until ``size`` bytes of buffer memory
        are free, or raise RequestTimedOut at monotonic ``deadline`` (what ``try_send``
        answered with a size asks for)."""
        self._accumulator.wait_for_memory(size, deadline)

    async def wait_for_memory_async(self, size: int, deadline: float) -> None:
        """``wait_for_memory`` as a Trio task (the asyncio facade calls it through its portal),
        cancellable."""
        await self._accumulator.wait_for_memory_async(size, deadline)

    def try_send(self, topic: str, value: Any = None, key: Any = None, headers: Headers = None,
                 partition: int | None = None, timestamp_ms: int | None = None) -> Any:
        """The synchronous, thread-safe hot path. Returns the RecordFuture, or tells the
        caller what to wait for: ``NEED_METADATA`` (call ``wait_for_topic``) or the record's
        size in bytes (buffer memory is exhausted: wait for that much)."""
        # Written for speed (it runs once per record): the common record (bytes value, no
        # key, headers, partition or timestamp, default serializers and partitioner) goes
        # straight to the topic's sticky batch; everything else takes the general path.
        if (key is None and headers is None and partition is None and timestamp_ms is None
                and type(value) is bytes and self._fast_keyless):
            info = self._cluster.metadata.topics.get(topic)
            size = 32 + len(value)
            if info is not None and size <= self._max_record_size:
                return self._accumulator.append_keyless(
                    topic, len(info.partition_ids), info.available, int(_time() * 1000), value,
                    None, size) or size
        return self._try_send(topic, value, key, headers, partition, timestamp_ms)

    def _try_send(self, topic: str, value: Any, key: Any, headers: Headers, partition: int | None,
                  timestamp_ms: int | None) -> Any:
        acc = self._accumulator
        if acc.closed:
            raise acc.closed_error()
        key_bytes = key if key is None and self._plain_keys else self._key_serializer(key)
        value_bytes = value if type(value) is bytes and self._plain_values else self._value_serializer(value)
        size = 32 + (len(key_bytes) if key_bytes else 0) + (len(value_bytes) if value_bytes else 0)
        if headers:
            headers = [(k, serialize(v)) for k, v in headers]
            size += sum(len(k) + len(v or b"") + 8 for k, v in headers)
        if size > self._max_record_size:
            raise RecordTooLargeError(
                f"a record of ~{size} bytes is larger than max_request_size "
                f"({self.config.max_request_size}) or buffer_memory ({self.config.buffer_memory})")
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        elif type(timestamp_ms) is not int:
            timestamp_ms = record_timestamp(timestamp_ms)
        info = self._cluster.metadata.topics.get(topic)
        if info is None:
            return NEED_METADATA
        n = len(info.partition_ids)
        if partition is None:
            if self._partitioner is not None:
                partition = self._partitioner(key_bytes, list(info.partition_ids), list(info.available))
            elif key_bytes is None:
                return acc.append_keyless(topic, n, info.available, timestamp_ms, value_bytes,
                                          headers, size) or size
            else:
                partition = self._key_partition(key_bytes, n)
        elif partition >= n:  # added since the metadata was fetched, maybe (Kafka's waitOnMetadata)
            return NEED_METADATA
        elif partition < 0:
            raise ValueError(f"partition {partition} of topic {topic!r} is negative")
        tps = self._tps.get(topic)
        if tps is None or len(tps) < n:
            tps = self._tps[topic] = [TopicPartition(topic, p) for p in range(n)]
        return acc.append(tps[partition], timestamp_ms, key_bytes, value_bytes, headers, size) or size

    def _key_partition(self, key_bytes: bytes, num_partitions: int) -> int:
        """Kafka's default partition for a key: toPositive(murmur2(key)) % partitions."""
        h = self._key_hashes.get(key_bytes)
        if h is None:
            h = to_positive(murmur2(key_bytes))
            if len(self._key_hashes) < KEY_HASH_CACHE:
                self._key_hashes[key_bytes] = h
        return h % num_partitions

    # -- sending many ---------------------------------------------------------------------------

    async def send_many(self, topic: str, values: Sequence[Any], keys: Sequence[Any] | None = None,
                        partition: int | None = None, timestamp_ms: int | None = None) -> RecordFutures:
        """Queue many records (one per value, with ``keys[i]`` as the key of ``values[i]``)
        and return their futures, in call order (see ``client.Producer.send_many``). Waits
        only for the topic's metadata or buffer memory, at most ``max_block_ms``."""
        bulk = self.prepare_many(topic, values, keys, partition, timestamp_ms)
        await trio.lowlevel.checkpoint_if_cancelled()
        deadline = time.monotonic() + self._max_block_s
        while True:
            r = self.try_append_many(bulk, partition)
            if r is None:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return bulk.futures
            try:
                if r is NEED_METADATA:
                    await self.wait_for_topic(topic, deadline, partition)
                else:
                    await self._accumulator.wait_for_memory_async(r, deadline)
            except TidelogError as e:
                raise partly_queued(e, bulk)

    def prepare_many(self, topic: str, values: Sequence[Any], keys: Sequence[Any] | None,
                     partition: int | None, timestamp_ms: int | None) -> BulkRecords:
        """Serialize and size the records of a ``send_many`` call (nothing is queued yet).
        Raises RecordTooLargeError if any record is too large, ValueError for mismatched
        keys."""
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"send_many got {len(values)} values but {len(keys)} keys")
        if partition is not None and partition < 0:
            raise ValueError(f"partition {partition} of topic {topic!r} is negative")
        if self._plain_values and set(map(type, values)) <= _BYTES_OR_NONE:
            values = list(values)
        else:
            values = [v if type(v) is bytes and self._plain_values else self._value_serializer(v)
                      for v in values]
        if keys is not None:
            keys = [k if k is None and self._plain_keys else self._key_serializer(k) for k in keys]
        if None in values or keys is not None:  # tombstones or keys: size record by record
            sizes = [32 + (len(v) if v is not None else 0) for v in values]
            if keys is not None:
                sizes = [s + (len(k) if k is not None else 0) for s, k in zip(sizes, keys)]
        else:
            sizes = [32 + n for n in map(len, values)]
        if sizes and max(sizes) > self._max_record_size:
            i = max(range(len(sizes)), key=sizes.__getitem__)
            raise RecordTooLargeError(
                f"record {i} of ~{sizes[i]} bytes is larger than max_request_size "
                f"({self.config.max_request_size}) or buffer_memory ({self.config.buffer_memory}); "
                "nothing was queued")
        ends = list(itertools.accumulate(sizes, initial=0))
        timestamp = int(_time() * 1000) if timestamp_ms is None else record_timestamp(timestamp_ms)
        return BulkRecords(topic, values, keys, ends, timestamp)

    def try_append_many(self, bulk: BulkRecords, partition: int | None) -> Any:
        """The synchronous, thread-safe part of ``send_many``: append what is left of
        ``bulk``. Returns None once every record is queued, else what to wait for, as
        ``try_send`` does (``NEED_METADATA`` or a size in bytes of buffer memory)."""
        info = self._cluster.metadata.topics.get(bulk.topic)
        if info is None:
            if self._accumulator.closed:
                raise self._accumulator.closed_error()
            return NEED_METADATA
        n = len(info.partition_ids)
        if bulk.runs is None:
            if partition is not None and partition >= n:  # as try_send: added since, maybe
                return NEED_METADATA
            bulk.runs = self._runs(bulk, partition, info)
        return self._accumulator.append_many(bulk, n, info.available) or None

    def _runs(self, bulk: BulkRecords, partition: int | None, info: Any) -> list[tuple[int, int | None]]:
        """Which partition each record goes to, as runs ``(end, partition)``; an empty list
        means "all to the topic's sticky batches"."""
        n, count = len(info.partition_ids), len(bulk.values)
        if partition is not None:
            return [(count, partition)]
        keys = bulk.keys
        if self._partitioner is not None:
            ids, available = list(info.partition_ids), list(info.available)
            parts = [self._partitioner(k, ids, available)
                     for k in (keys if keys is not None else itertools.repeat(None, count))]
        elif keys is None:
            return []
        else:
            parts = [None if k is None else self._key_partition(k, n) for k in keys]
        runs, end = [], 0
        for p, group in itertools.groupby(parts):
            end += sum(1 for _ in group)
            runs.append((end, p))
        return runs

    async def wait_for_topic(self, topic: str, deadline: float, partition: int | None = None) -> ClusterMetadata:
        """Fetch ``topic``'s metadata until it has partitions (more than ``partition``: one
        created since the metadata was fetched, as Kafka's ``waitOnMetadata``) or monotonic
        ``deadline``."""
        validate_topic_name(topic)
        backoff = Backoff(self.config.retry_backoff_ms / 1000, self.config.retry_backoff_max_ms / 1000)
        last: BaseException | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                info = self._cluster.metadata.topics.get(topic)
                if partition is not None and info is not None and info.partition_ids:
                    raise RequestTimedOut(
                        f"partition {partition} of topic {topic!r} with partition count "
                        f"{len(info.partition_ids)} not present in metadata after {self.config.max_block_ms} ms")
                raise RequestTimedOut(f"topic {topic!r} not present in metadata after "
                                      f"{self.config.max_block_ms} ms (last error: {last or 'none'})")
            try:
                metadata = await self._cluster.refresh([topic], timeout=remaining)
            except TidelogError as e:
                last = e
                metadata = self._cluster.metadata
            info = metadata.topics.get(topic)
            if info is not None and info.partition_ids and (partition is None or partition < len(info.partition_ids)):
                return metadata
            code = metadata.topic_errors.get(topic)
            if code is not None:
                last = broker_error(code, f"topic {topic!r}")
                if not for_code(code).retriable:
                    raise last
            await trio.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until each of those records is acknowledged
        or failed (failures go to the records' futures, not here). Raises RequestTimedOut
        after ``timeout`` seconds."""
        batches = self._accumulator.begin_flush()
        self._sender.wakeup()
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                for batch in batches:
                    await batch.result.wait_async()
        except trio.TooSlowError:
            raise RequestTimedOut(f"flush did not complete within {timeout:g} s") from None
        finally:
            self._accumulator.end_flush()

    async def partitions_for(self, topic: str) -> list[int]:
        metadata = await self.wait_for_topic(topic, time.monotonic() + self._max_block_s)
        return list(metadata.partitions_for(topic))

    @property
    def metrics(self) -> ProducerMetrics:
        """``buffer_used_bytes`` and ``queued_batches``; call it (``metrics()``) for
        kafka-python's ``{"producer-metrics": {name: value}}`` (``tidelog.aio.stats``)."""
        acc = self._accumulator
        m = ProducerMetrics(buffer_used_bytes=acc.used_memory, queued_batches=acc.queued_batches())
        m.kafka = self._sender.stats.producer_metrics(acc.clock(), buffer_total=self.config.buffer_memory,
                                                       buffer_used=m["buffer_used_bytes"])
        return m


class ProducerMetrics(dict):
    """The producer's gauges, flat (``metrics["buffer_used_bytes"]``, as before), and callable
    for kafka-python's shape: ``metrics()`` is ``{"producer-metrics": {name: value}}``."""

    kafka: dict[str, float]

    def __call__(self, raw: bool = False) -> dict[str, dict[str, float]]:
        return {"producer-metrics": dict(self.kafka)}
