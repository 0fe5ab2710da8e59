"""The clients' metrics: what the sender and the fetcher saw, kept in sampled windows as Kafka's
client metrics are; time is passed in (monotonic seconds), no clock is read here.

* ``Sampled`` is Kafka's SampledStat with ``samples`` windows of ``window_s`` seconds: a value
  goes into the current window (a new one opens when it is ``window_s`` old, the oldest is
  dropped); a measurement combines the windows opened within ``samples * window_s``. Its
  ``rate`` divides the windows' total by the time they cover, and at least by
  ``(samples - 1) * window_s`` (Kafka's Rate: a young client does not report a burst as a
  steady rate). ``avg`` and ``max`` are 0.0 with nothing recorded.
* ``ProducerStats`` holds the sender's: ``on_request`` for a produce request sent, with
  the time it was sent (records, batch sizes, queue time: once per request, a loop over
  its batches; for a request an application thread wrote, the loop thread calls it when it
  takes the request over),
  ``on_response`` with the request's latency, ``on_retry`` and ``on_error`` with the
  record counts of retried and failed batches. ``producer_metrics`` names them as
  kafka-python's ``KafkaProducer.metrics()`` does, under ``producer-metrics``.
* ``ConsumerStats`` holds the consumer's: ``on_fetch`` per fetch response (its latency and
  record bytes), ``on_consumed`` per poll that returned records; ``consumer_metrics`` names
  them as kafka-python's ``consumer-fetch-manager-metrics``. Both are on the path of every
  record to the application, so they only queue the values; ``settle`` records them (every
  poll calls it before it waits, ``consumer_metrics`` before it reads, and a queue of
  ``SETTLE_AT`` values does). A value keeps the time it was measured at.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Sampled", "ProducerStats", "ConsumerStats", "WINDOW_S", "SAMPLES"]

WINDOW_S = 30.0  # Kafka's metrics.sample.window.ms
SAMPLES = 2  # Kafka's metrics.num.samples
SETTLE_AT = 1024  # queued consumer values that are recorded at once, whoever reads them


@dataclass(slots=True)
class _Sample:
    start: float
    count: int = 0
    total: float = 0.0
    max: float = 0.0


class Sampled:
    """Count, total and maximum of recorded values over the recent windows."""

    __slots__ = ("window_s", "samples", "_windows", "cumulative")

    def __init__(self, window_s: float = WINDOW_S, samples: int = SAMPLES):
        self.window_s = window_s
        self.samples = samples
        self._windows: list[_Sample] = []
        self.cumulative = 0.0  # every value ever recorded, summed (Kafka's -total metrics)

    def record(self, value: float, now: float) -> None:
        windows = self._windows
        if not windows or now - windows[-1].start >= self.window_s:
            windows.append(_Sample(now))
            del windows[:-self.samples]
        w = windows[-1]
        if w.count == 0 or value > w.max:
            w.max = value
        w.count += 1
        w.total += value
        self.cumulative += value

    def _live(self, now: float) -> list[_Sample]:
        return [w for w in self._windows if now - w.start < self.samples * self.window_s]

    def avg(self, now: float) -> float:
        live = self._live(now)
        count = sum(w.count for w in live)
        return sum(w.total for w in live) / count if count else 0.0

    def max(self, now: float) -> float:
        return max((w.max for w in self._live(now) if w.count), default=0.0)

    def rate(self, now: float) -> float:
        """The windows' total per second."""
        live = self._live(now)
        if not live:
            return 0.0
        elapsed = max(now - live[0].start, (self.samples - 1) * self.window_s)
        return sum(w.total for w in live) / elapsed if elapsed > 0 else 0.0

    def count_rate(self, now: float) -> float:
        """Recorded values per second (Kafka's rate of a count, e.g. requests)."""
        live = self._live(now)
        if not live:
            return 0.0
        elapsed = max(now - live[0].start, (self.samples - 1) * self.window_s)
        return sum(w.count for w in live) / elapsed if elapsed > 0 else 0.0


class ProducerStats:
    """The sender's measurements (see the module docstring)."""

    def __init__(self, window_s: float = WINDOW_S, samples: int = SAMPLES):
        def new() -> Sampled:
            return Sampled(window_s, samples)

        self.records = new()  # records per request
        self.batch_bytes = new()  # encoded size per batch
        self.batch_records = new()  # records per batch
        self.queue_time_ms = new()  # batch creation to its (first or next) send
        self.latency_ms = new()  # request sent to response
        self.retries = new()  # records of retried batches
        self.errors = new()  # records of failed batches

    def on_request(self, now: float, batches: Sequence[Any]) -> None:
        """A produce request with ``batches`` (each ``len(b)`` records, ``b.payload`` bytes
        once encoded, opened at ``b.created``) is on its way."""
        count = 0
        for b in batches:
            n = len(b)
            count += n
            self.batch_records.record(n, now)
            self.batch_bytes.record(len(b.payload) if b.payload is not None else 0, now)
            self.queue_time_ms.record((now - b.created) * 1000, now)
        self.records.record(count, now)

    def on_response(self, now: float, latency_s: float) -> None:
        self.latency_ms.record(latency_s * 1000, now)

    def on_retry(self, now: float, records: int) -> None:
        self.retries.record(records, now)

    def on_error(self, now: float, records: int) -> None:
        self.errors.record(records, now)

    def producer_metrics(self, now: float, *, buffer_total: int, buffer_used: int) -> dict[str, float]:
        """kafka-python's ``producer-metrics`` names and meanings."""
        record_bytes = self.batch_bytes.avg(now)
        per_batch = self.batch_records.avg(now)
        return {
            "record-send-rate": self.records.rate(now),
            "record-send-total": self.records.cumulative,
            "records-per-request-avg": self.records.avg(now),
            "request-rate": self.records.count_rate(now),
            "batch-size-avg": record_bytes,
            "batch-size-max": self.batch_bytes.max(now),
            "record-size-avg": record_bytes / per_batch if per_batch else 0.0,
            "outgoing-byte-rate": self.batch_bytes.rate(now),
            "record-queue-time-avg": self.queue_time_ms.avg(now),
            "record-queue-time-max": self.queue_time_ms.max(now),
            "request-latency-avg": self.latency_ms.avg(now),
            "request-latency-max": self.latency_ms.max(now),
            "record-retry-rate": self.retries.rate(now),
            "record-error-rate": self.errors.rate(now),
            "record-error-total": self.errors.cumulative,
            "buffer-total-bytes": float(buffer_total),
            "buffer-available-bytes": float(buffer_total - buffer_used),
        }


class ConsumerStats:
    """The consumer's measurements (see the module docstring)."""

    def __init__(self, window_s: float = WINDOW_S, samples: int = SAMPLES):
        self.fetch_bytes = Sampled(window_s, samples)  # record bytes per fetch response
        self.fetch_latency_ms = Sampled(window_s, samples)
        self.records = Sampled(window_s, samples)  # records per poll that returned some
        # (time, fetch latency in seconds or None for a poll, bytes or records) not recorded
        # yet; any thread appends, ``settle`` takes them under the lock
        self._queued: deque[tuple[float, float | None, int]] = deque()
        self._settling = threading.Lock()

    def on_fetch(self, now: float, latency_s: float, size: int) -> None:
        self._queued.append((now, latency_s, size))
        if len(self._queued) >= SETTLE_AT:
            self.settle()

    def on_consumed(self, now: float, records: int) -> None:
        self._queued.append((now, None, records))
        if len(self._queued) >= SETTLE_AT:
            self.settle()

    def settle(self) -> None:
        """Record the queued values in their windows."""
        queued = self._queued
        if not queued:
            return
        with self._settling:
            while queued:
                now, latency_s, n = queued.popleft()
                if latency_s is None:
                    self.records.record(n, now)
                else:
                    self.fetch_latency_ms.record(latency_s * 1000, now)
                    self.fetch_bytes.record(n, now)

    def consumer_metrics(self, now: float) -> dict[str, float]:
        """kafka-python's ``consumer-fetch-manager-metrics`` names and meanings."""
        self.settle()
        return {
            "fetch-rate": self.fetch_latency_ms.count_rate(now),
            "fetch-latency-avg": self.fetch_latency_ms.avg(now),
            "fetch-latency-max": self.fetch_latency_ms.max(now),
            "fetch-size-avg": self.fetch_bytes.avg(now),
            "fetch-size-max": self.fetch_bytes.max(now),
            "bytes-consumed-rate": self.fetch_bytes.rate(now),
            "bytes-consumed-total": self.fetch_bytes.cumulative,
            "records-consumed-rate": self.records.rate(now),
            "records-consumed-total": self.records.cumulative,
        }
