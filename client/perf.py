"""The measurements behind ``tidelog perf`` (kafka-producer-perf-test, kafka-consumer-perf-test
and Kafka's EndToEndLatency), as functions that return a ``PerfResult``; ``tidelog.commands.perf`` prints.

They take already-built blocking clients (``client.Producer`` / ``client.Consumer``, or
anything with the same methods), so they are testable with fakes, and import nothing but the
stdlib.

* ``produce``: ``num_records`` sends of one reused payload, throttled like Kafka's
  ThroughputThrottler, then a flush. A record's latency is the time from just before its
  ``send`` to the completion of its batch (what a per-record callback would see). The hot
  loop stores one float per record in a preallocated array and, when a record starts a new
  batch, registers one completion callback for that batch, so the per-record cost is the
  ``send`` itself plus a clock read. (The batch is ``RecordFuture.batch``, whose
  ``add_callback`` is the per-batch hook; futures without it get one ``add_done_callback``
  per record.) With ``bulk``, records go ``bulk`` at a time through ``Producer.send_many``,
  whose ``RecordFutures.batches()`` lists its runs of records per batch (else one callback
  for the whole call).
* ``consume``: poll until ``num_records`` arrived, or nothing arrived for ``idle_timeout_s``.
  A record's latency is the duration of the ``poll`` that returned it (how long the
  application waited for it).
* ``end_to_end``: one record at a time (each send waits for its acknowledgement) at the
  target rate, while a consumer thread receives them; a record's latency is from just before
  its send to its arrival at the consumer (same process, monotonic clock in the value).

Progress: every ``interval_s`` the optional ``progress`` callback gets a ``Window``
(records completed in the window, their bytes, the window's length, average and maximum
latency), from the calling thread.
"""

from __future__ import annotations

import math
import operator
import os
import random
import struct
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MB",
    "REPORT_INTERVAL_S",
    "Histogram",
    "Latency",
    "PerfResult",
    "Throttler",
    "Window",
    "consume",
    "end_to_end",
    "make_payload",
    "produce",
]

MB = 1024 * 1024  # Kafka's perf tools' MB
REPORT_INTERVAL_S = 5.0  # Kafka's reporting interval
MIN_SLEEP_S = 0.002  # Kafka's ThroughputThrottler.MIN_SLEEP_NS
MAX_SAMPLES = 500_000  # latencies sorted for the percentiles, at most

Clock = Callable[[], float]
Progress = Callable[["Window"], None] | None


@dataclass(frozen=True, slots=True)
class Latency:
    """Latency figures in milliseconds; percentiles as Kafka's perf test takes them (the
    sorted sample's element at index ``int(q * n)``)."""

    avg: float
    max: float
    p50: float
    p95: float
    p99: float
    p999: float

    @classmethod
    def of(cls, latencies_ms: Sequence[float]) -> Latency:
        """Average and maximum over all; percentiles over every k-th value, so that at most
        ``MAX_SAMPLES`` are sorted (kafka-producer-perf-test samples the same way)."""
        n = len(latencies_ms)
        if not n:
            return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        s = sorted(latencies_ms[::max(1, n // MAX_SAMPLES)])
        k = len(s)

        def at(q: float) -> float:
            return s[min(k - 1, int(q * k))]

        return cls(math.fsum(latencies_ms) / n, max(latencies_ms), at(0.5), at(0.95), at(0.99), at(0.999))


SUB_BUCKETS = 16  # linear sub-buckets per power of two: a bucket's width is at most 1/16 of its value
HISTOGRAM_FLOOR_MS = 0.001  # latencies below one microsecond share the first bucket


@dataclass(frozen=True, slots=True)
class Histogram:
    """Latencies in log-linear buckets, as HdrHistogram keeps them: each power of two of
    microseconds is cut into ``SUB_BUCKETS`` equal buckets, so every bucket's upper bound is
    within 1/16 (6.25 %) of the latencies it counts, whatever their scale. ``buckets`` lists
    the non-empty ones as ``(upper bound in ms, count)``, in order; every latency is counted
    (no sampling), so the tail shows as it is."""

    buckets: tuple[tuple[float, int], ...]

    @classmethod
    def of(cls, latencies_ms: Sequence[float]) -> Histogram:
        counts: dict[int, int] = {}
        for ms in latencies_ms:
            b = _bucket(ms)
            counts[b] = counts.get(b, 0) + 1
        return cls(tuple((_upper_ms(b), counts[b]) for b in sorted(counts)))

    @property
    def total(self) -> int:
        return sum(n for _, n in self.buckets)

    def lines(self) -> list[str]:
        """One line per non-empty bucket: its upper bound, count, share and cumulative share."""
        total, seen, out = self.total, 0, []
        for upper, n in self.buckets:
            seen += n
            out.append(f"  <= {upper:>10.4g} ms {n:>10} {100 * n / total:6.2f} % {100 * seen / total:7.3f} %")
        return out


def _bucket(ms: float) -> int:
    """The bucket of a latency: ``SUB_BUCKETS * power + sub-bucket``, over microseconds."""
    us = max(ms, HISTOGRAM_FLOOR_MS) * 1000
    power = max(0, math.frexp(us)[1] - 1)  # 2^power <= us < 2^(power + 1)
    sub = min(SUB_BUCKETS - 1, int((us / 2 ** power - 1) * SUB_BUCKETS))
    return power * SUB_BUCKETS + sub


def _upper_ms(bucket: int) -> float:
    power, sub = divmod(bucket, SUB_BUCKETS)
    return 2 ** power * (1 + (sub + 1) / SUB_BUCKETS) / 1000


@dataclass(slots=True)
class PerfResult:
    """What a run measured. ``records``/``bytes`` count the records that completed (were
    acknowledged, or received); ``latencies_ms`` has one entry per such record."""

    records: int
    bytes: int
    seconds: float
    latencies_ms: Sequence[float]
    expected: int  # records asked for
    failed: int = 0  # records whose send failed
    first_error: BaseException | None = None

    @property
    def records_per_sec(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_sec(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0

    @property
    def complete(self) -> bool:
        return self.records >= self.expected and not self.failed

    def latency(self) -> Latency:
        return Latency.of(self.latencies_ms)

    def histogram(self) -> Histogram:
        return Histogram.of(self.latencies_ms)


@dataclass(frozen=True, slots=True)
class Window:
    """One progress report: what completed since the previous one."""

    records: int
    bytes: int
    seconds: float
    avg_ms: float
    max_ms: float

    @property
    def records_per_sec(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_sec(self) -> float:
        return self.bytes / MB / self.seconds if self.seconds > 0 else 0.0


class _Windows:
    """The current progress window; ``report`` hands it to ``progress`` and starts the next."""

    __slots__ = ("bytes", "interval", "lat_max", "lat_sum", "next_at", "progress", "records", "start")

    def __init__(self, progress: Progress, interval: float, now: float):
        self.progress = progress
        self.interval = interval
        self.start = now
        self.next_at = now + interval if progress is not None else math.inf
        self.records = self.bytes = 0
        self.lat_sum = self.lat_max = 0.0

    def add(self, records: int, nbytes: int, lat_sum_ms: float, lat_max_ms: float) -> None:
        self.records += records
        self.bytes += nbytes
        self.lat_sum += lat_sum_ms
        self.lat_max = max(self.lat_max, lat_max_ms)

    def report(self, now: float) -> None:
        if self.progress is not None:
            avg = self.lat_sum / self.records if self.records else 0.0
            self.progress(Window(self.records, self.bytes, now - self.start, avg, self.lat_max))
            self.next_at = now + self.interval
        self.start = now
        self.records = self.bytes = 0
        self.lat_sum = self.lat_max = 0.0


class Throttler:
    """Kafka's ThroughputThrottler: ``should_throttle(n, now)`` is true while ``n`` records
    since ``start`` is above ``target`` per second; ``throttle`` then adds one record's worth
    of sleep to a deficit and sleeps it off once it reaches 2 ms. A negative target never
    throttles."""

    def __init__(self, target_per_sec: float, start: float, *, sleep: Callable[[float], Any] = time.sleep):
        if target_per_sec == 0:
            raise ValueError("throughput must be positive, or negative for no limit")
        self.target = target_per_sec
        self.start = start
        self.sleep_s = 1.0 / target_per_sec if target_per_sec > 0 else math.inf
        self.deficit = 0.0
        self._sleep = sleep

    @property
    def enabled(self) -> bool:
        return self.target > 0

    def should_throttle(self, amount_so_far: int, now: float) -> bool:
        if self.target < 0:
            return False
        elapsed = now - self.start
        return elapsed > 0 and amount_so_far / elapsed > self.target

    def throttle(self, amount: int = 1) -> None:
        self.deficit += self.sleep_s * amount
        if self.deficit >= MIN_SLEEP_S:
            self._sleep(self.deficit)
            self.deficit = 0.0


def make_payload(size: int, rng: random.Random | None = None) -> bytes:
    """Random uppercase letters, like kafka-producer-perf-test's payload."""
    rng = rng or random.Random()
    return bytes(rng.randrange(65, 91) for _ in range(size))


# ---------------------------------------------------------------------------------------------
# produce


def produce(producer: Any, topic: str, *, num_records: int, payload: bytes, throughput: float = -1,
            progress: Progress = None, interval_s: float = REPORT_INTERVAL_S,
            flush_timeout_s: float | None = None, bulk: int = 0, clock: Clock = time.perf_counter,
            sleep: Callable[[float], Any] = time.sleep) -> PerfResult:
    """Send ``num_records`` copies of ``payload`` to ``topic`` and wait for them all; with
    ``bulk`` > 0, ``bulk`` records per ``producer.send_many`` call (their send time is the
    call's).

    Failed records are counted in ``failed`` (the first error kept), not in the latencies.
    Raises TimeoutError if the final flush does not finish within ``flush_timeout_s``
    (None: the producer's own bound)."""
    if num_records < 0:
        raise ValueError("num_records must be >= 0")
    n = num_records
    sent = array("d", bytes(8 * n))  # send start per record
    starts: list[int] = []  # first record index of each group (a batch, or a single record)
    done_at: list[float] = []  # completion time of each group (nan: failed)
    finished: list[int] = []  # group indexes, in completion order
    errors: list[BaseException] = []

    def complete(g: int, error: BaseException | None) -> None:  # the client's thread
        done_at[g] = clock() if error is None else math.nan
        if error is not None and not errors:
            errors.append(error)
        finished.append(g)

    def on_batch(handle: Any, g: int) -> None:
        handle.add_callback(lambda: complete(g, handle.error))

    def on_record(future: Any, g: int) -> None:
        future.add_done_callback(lambda f: complete(g, f.exception(0)))

    start = clock()
    windows = _Windows(progress, interval_s, start)
    throttler = Throttler(throughput, start, sleep=sleep)
    throttled = throttler.enabled
    size = len(payload)
    reported = 0  # finished[:reported] are in a window already
    next_report = windows.next_at
    if bulk > 0:
        send_many = producer.send_many
        values = [payload] * bulk
        i = 0
        while i < n:
            count = min(bulk, n - i)
            now = clock()
            if throttled and throttler.should_throttle(i, now):
                throttler.throttle(count)
                now = clock()
            futures = send_many(topic, values if count == bulk else values[:count])
            sent[i:i + count] = array("d", (now,)) * count
            batches = getattr(futures, "batches", None)
            if batches is not None:  # one group per batch run
                for first, handle in batches():
                    starts.append(i + first)
                    done_at.append(0.0)
                    on_batch(handle, len(starts) - 1)
            else:  # one group for the call
                starts.append(i)
                done_at.append(0.0)
                on_record(futures, len(starts) - 1)
            i += count
            if now >= next_report:
                reported = _window_from_groups(windows, finished, reported, starts, done_at, sent, i, size)
                windows.report(now)
                next_report = windows.next_at
    else:
        send = producer.send
        batch_of = register = None
        last = None
        for i in range(n):
            now = clock()
            if throttled and throttler.should_throttle(i, now):
                throttler.throttle()
                now = clock()
            sent[i] = now
            future = send(topic, payload)
            if batch_of is None:  # the first record decides how completions are observed
                handle = getattr(future, "batch", None)
                if handle is not None and hasattr(handle, "add_callback"):
                    batch_of, register = operator.attrgetter("batch"), on_batch
                else:
                    batch_of, register = _identity, on_record
            handle = batch_of(future)
            if handle is not last:
                last = handle
                starts.append(i)
                done_at.append(0.0)
                register(handle, len(starts) - 1)
            if now >= next_report:
                reported = _window_from_groups(windows, finished, reported, starts, done_at, sent, i + 1, size)
                windows.report(now)
                next_report = windows.next_at

    def report(now: float) -> None:
        nonlocal reported
        reported = _window_from_groups(windows, finished, reported, starts, done_at, sent, n, size)
        windows.report(now)

    _flush(producer, flush_timeout_s, windows, report, clock)
    end = clock()
    latencies = array("d")
    failed = 0
    for g, first in enumerate(starts):
        last_i = starts[g + 1] if g + 1 < len(starts) else n
        t = done_at[g]
        if math.isnan(t):  # the batch failed
            failed += last_i - first
            continue
        latencies.extend((t - sent[i]) * 1000.0 for i in range(first, last_i))
    ok = n - failed
    return PerfResult(ok, ok * size, end - start, latencies, n, failed, errors[0] if errors else None)


def _identity(x: Any) -> Any:
    return x


def _window_from_groups(windows: _Windows, finished: list[int], reported: int, starts: list[int],
                        done_at: list[float], sent: array, sent_count: int, size: int) -> int:
    """Add the groups finished since ``reported`` to the window; returns the new cursor."""
    upto = len(finished)
    for k in range(reported, upto):
        g = finished[k]
        t = done_at[g]
        if math.isnan(t):
            continue
        first = starts[g]
        last = starts[g + 1] if g + 1 < len(starts) else sent_count
        count = last - first
        lat_sum = (t * count - math.fsum(sent[first:last])) * 1000.0
        windows.add(count, count * size, lat_sum, (t - sent[first]) * 1000.0)
    return upto


def _flush(producer: Any, timeout_s: float | None, windows: _Windows,
           report: Callable[[float], None], clock: Clock) -> None:
    """Flush, reporting progress windows while it waits (TimeoutError after ``timeout_s``)."""
    if windows.progress is None:
        producer.flush(timeout_s)
        return
    deadline = math.inf if timeout_s is None else clock() + timeout_s
    while True:
        now = clock()
        step = min(windows.next_at, deadline) - now
        try:
            producer.flush(max(0.001, step) if step < math.inf else None)
            return
        except TimeoutError:
            now = clock()
            if now >= deadline:
                raise
            if now >= windows.next_at:
                report(now)


# ---------------------------------------------------------------------------------------------
# consume


def consume(consumer: Any, *, num_records: int, idle_timeout_s: float = 10.0, progress: Progress = None,
            interval_s: float = REPORT_INTERVAL_S, clock: Clock = time.perf_counter) -> PerfResult:
    """Poll the consumer's assignment until ``num_records`` records arrived, or none arrived for
    ``idle_timeout_s``. Bytes count keys and values, as kafka-consumer-perf-test does."""
    polls: list[tuple[float, int]] = []  # (poll duration ms, records it returned)
    count = nbytes = 0
    start = last_data = clock()
    windows = _Windows(progress, interval_s, start)
    poll_ms = int(min(interval_s, 1.0) * 1000)
    while count < num_records:
        t0 = clock()
        if t0 - last_data >= idle_timeout_s:
            break
        records = consumer.poll(timeout_ms=max(1, min(poll_ms, int((idle_timeout_s - (t0 - last_data)) * 1000))),
                                max_records=num_records - count)
        t1 = clock()
        if records:
            records = records[:num_records - count]
            k = len(records)
            size = sum(len(r.value or b"") + len(r.key or b"") for r in records)
            wait_ms = (t1 - t0) * 1000.0
            polls.append((wait_ms, k))
            count += k
            nbytes += size
            windows.add(k, size, wait_ms * k, wait_ms)
            last_data = t1
        if t1 >= windows.next_at:
            windows.report(t1)
    end = last_data if count else clock()
    latencies = array("d")
    for wait_ms, k in polls:
        latencies.extend(wait_ms for _ in range(k))
    return PerfResult(count, nbytes, end - start, latencies, num_records)


# ---------------------------------------------------------------------------------------------
# end to end

_STAMP = struct.Struct(">8sd")  # run marker, send time (the clock, seconds)


def end_to_end(producer: Any, consumer: Any, topic: str, *, num_records: int, record_size: int = 100,
               throughput: float = -1, partition: int | None = None, ack_timeout_s: float = 30.0,
               in_flight: int = 1, idle_timeout_s: float = 10.0, progress: Progress = None,
               interval_s: float = REPORT_INTERVAL_S, clock: Clock = time.perf_counter,
               sleep: Callable[[float], Any] = time.sleep) -> PerfResult:
    """Send ``num_records`` records one at a time (each waits for its acknowledgement), at
    most ``throughput`` per second, while a thread polls ``consumer`` (already positioned at the
    end of the topic's partitions) for them. Values carry a marker of this run and the send
    time, so records of other producers are ignored. Stops receiving once all arrived, or
    nothing arrived for ``idle_timeout_s`` after the last send. A failed send raises.

    ``in_flight`` > 1: up to that many records await their acknowledgement (the oldest is
    waited for before another is sent), so the records flow at ``throughput`` (paced as
    Kafka's ThroughputThrottler does) rather than one round trip at a time."""
    if in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight}")
    if record_size < _STAMP.size:
        raise ValueError(f"record_size must be >= {_STAMP.size} bytes for end-to-end latency")
    marker = os.urandom(8)
    padding = make_payload(record_size - _STAMP.size)
    latencies = array("d")
    lock = threading.Lock()
    received = [0, 0]  # records, bytes
    last_arrival = [0.0]
    stop = threading.Event()
    failure: list[BaseException] = []
    start = clock()
    windows = _Windows(progress, interval_s, start)

    def receive() -> None:
        # per poll, not per record: the work here holds the GIL the client's threads need
        stamp, unpack_from = _STAMP.size, _STAMP.unpack_from
        try:
            while not stop.is_set() and received[0] < num_records:
                records = consumer.poll(timeout_ms=100)
                now = clock()
                values = [v for v in (r.value for r in records)
                          if v is not None and len(v) >= stamp and v[:8] == marker]
                if not values:
                    continue
                lats = [(now - unpack_from(v)[1]) * 1000.0 for v in values]
                nbytes = sum(map(len, values))
                with lock:
                    latencies.extend(lats)
                    received[0] += len(lats)
                    received[1] += nbytes
                    windows.add(len(lats), nbytes, sum(lats), max(lats))
                    last_arrival[0] = now
        except Exception as e:  # noqa: BLE001 - raised again by the sending thread
            failure.append(e)

    unacknowledged: deque = deque()
    receiver = threading.Thread(target=receive, name="tidelog-perf-e2e-consumer", daemon=True)
    throttler = Throttler(throughput, start, sleep=sleep)
    receiver.start()
    try:
        for i in range(num_records):
            now = clock()
            if throttler.should_throttle(i, now):
                throttler.throttle()
            if failure:
                raise failure[0]
            value = _STAMP.pack(marker, clock()) + padding
            unacknowledged.append(producer.send(topic, value, partition=partition))
            if len(unacknowledged) >= in_flight:
                unacknowledged.popleft().result(ack_timeout_s)
            now = clock()
            if now >= windows.next_at:
                with lock:
                    windows.report(now)
        while unacknowledged:
            unacknowledged.popleft().result(ack_timeout_s)
        last_sent = clock()
        while receiver.is_alive():
            receiver.join(min(0.1, interval_s))
            now = clock()
            with lock:
                if now >= windows.next_at:
                    windows.report(now)
                if now - max(last_sent, last_arrival[0]) >= idle_timeout_s:
                    break
    finally:
        stop.set()
        receiver.join(5.0)
    if failure:
        raise failure[0]
    with lock:
        count, nbytes = received
        end = last_arrival[0] if count else clock()
        return PerfResult(count, nbytes, end - start, array("d", latencies), num_records)
