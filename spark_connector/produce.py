"""The sink's work on an executor: send one task's rows with one producer (acks=all).

Every row is sent; the task then flushes and waits for every acknowledgement before it
returns, so when Spark commits the task every record it wrote is on all in-sync replicas.
The first failure (a broker error such as NOT_ENOUGH_REPLICAS, a delivery timeout) stops
sending and is raised from the task, naming the topic and partition, so the task fails
with the broker's error. The sink is at-least-once, as Spark's Kafka sink: a retried task
or a replayed micro-batch sends its rows again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, NamedTuple

from tidelog import Producer, RecordFuture, RequestTimedOut, TidelogError
from tidelog.spark.options import SinkOptions

__all__ = ["OutRow", "SinkWriteError", "send_rows"]

log = logging.getLogger("spark_connector")


class OutRow(NamedTuple):
    topic: str | None
    key: bytes | str | None
    value: bytes | str | None
    partition: int | None = None
    headers: list[tuple[str, bytes | str | None]] | None = None


class SinkWriteError(TidelogError):
    """A row could not be written; the message names the topic and the cause."""


class _FirstError:
    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.where: str = ""
        self._lock = threading.Lock()

    def __call__(self, future: RecordFuture) -> None:  # on the producer's thread
        err = future.exception(0)
        if err is not None and self.error is None:
            with self._lock:
                if self.error is None:
                    tp = future.topic_partition
                    self.where, self.error = f"topic {tp.topic!r} partition {tp.partition}", err


def send_rows(opts: SinkOptions, rows: Iterable[OutRow], *, flush_timeout_s: float | None = None,
              producer_factory: Any = Producer) -> int:
    """Send ``rows`` and wait for all acknowledgements; returns the number written."""
    options = {"client_id": "tidelog-spark-sink", **opts.producer_options}
    producer = producer_factory(opts.bootstrap_servers, acks="all", **options)
    failed = _FirstError()
    sent = 0
    ok = False
    try:
        for row in rows:
            topic = opts.topic or row.topic
            if not topic:
                raise SinkWriteError("a row has no topic: set the option topic, or a non-null topic column")
            future = producer.send(topic, row.value, key=row.key, headers=row.headers or None,
                                   partition=row.partition)
            future.add_done_callback(failed)
            sent += 1
            if failed.error is not None:
                break
        if failed.error is None:
            try:
                producer.flush(flush_timeout_s)
            except RequestTimedOut as e:
                raise SinkWriteError(f"writing {sent} records: not all were acknowledged: {e}") from e
        if failed.error is not None:
            raise SinkWriteError(f"writing to {failed.where} failed: {failed.error}") from failed.error
        ok = True
        return sent
    finally:
        try:
            producer.close(None if ok else 0)
        except Exception as e:  # the task's own outcome is what matters
            log.debug("closing the sink's producer: %s", e)
