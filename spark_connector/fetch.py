"""Reading one planned range on an executor: exactly the records ``[start, end)`` of one partition.

``read_range`` is written against the few consumer calls it needs (``RangeConsumer``), so
its data-loss and stall handling is tested with a scripted consumer and no cluster; the
Spark task gives it a short-lived blocking ``client.Consumer`` (``open_consumer``), with an
``Admin`` opened only if the read stalls, to ask the leader's log end offset.

* The consumer is assigned the one partition, seeked to ``start`` and polled until the
  position reaches ``end``; records at or above ``end`` (the rest of the last batch a fetch
  returned) are dropped. Only offsets below the high watermark are ever fetched (the
  broker's rule for consumers), and ``end`` was planned below it.
* OFFSET_OUT_OF_RANGE (``auto_offset_reset`` is "none") means the planned offsets are gone:
  below the log start (retention, deleted segments) or above the log end (truncation). With
  ``fail_on_data_loss`` that raises ``DataLossError`` naming topic, partition and offsets;
  otherwise a warning names them and reading goes on from the first offset still there.
* A batch that cannot be read (CorruptRecordError: damaged on disk, or written before the
  broker validated records) is data loss too: with ``fail_on_data_loss`` the read fails
  naming topic, partition and the batch's offsets; otherwise a warning names them and reading
  goes on after the batch (the error's ``skip_offset``).
* No progress for ``poll_timeout_ms`` at ``pos``: if the metadata no longer lists the
  partition, its topic was deleted and the rest of the range is lost (data loss as above: the
  consumer would retry UNKNOWN_TOPIC_OR_PARTITION, and the offset lookups time out, for ever).
  If the leader's log now ends at or below ``pos``, the rest of the range was truncated away
  (data loss as above). Otherwise the records are still there and the read fails with
  ``RangeReadTimeout``, which Spark retries as any failed task: that includes a high
  watermark held below ``pos`` by a new leader whose ISR is below min.insync.replicas (its
  log holds the records, and they become readable once its replicas catch up). As in Spark's
  Kafka source, only offsets outside the broker's log are data loss; a slow read is not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tidelog import Admin, Consumer, NoOffsetForPartitionError, Record, TopicPartition
from tidelog.errors import CorruptRecordError, OffsetOutOfRangeError, TidelogError
from tidelog.spark.options import SourceOptions
from tidelog.spark.planning import OffsetRange, data_loss_message

__all__ = ["DataLossError", "RangeReadTimeout", "RangeConsumer", "TaskConsumer", "read_range", "open_consumer"]

log = logging.getLogger("spark_connector")

STALL_WARNING_S = 10.0
HINT = ("Set the option failOnDataLoss=false to skip lost offsets with a warning and go on "
        "(Spark's Kafka source does the same).")


class DataLossError(TidelogError):
    """Planned records are no longer available and failOnDataLoss is true."""


class RangeReadTimeout(TidelogError, TimeoutError):
    """A range made no progress for pollTimeoutMs although its records should be there."""


class RangeConsumer(Protocol):
    def assign(self, partitions: list[TopicPartition]) -> None: ...
    def seek(self, partition: TopicPartition, offset: int) -> None: ...
    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]: ...
    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int: ...
    def beginning_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...
    def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...
    def log_end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]: ...
    def partitions_for_topic(self, topic: str) -> set[int] | None: ...


class TaskConsumer:
    """A task's consumer and, opened on first use, an Admin for the leader's log end offset
    (a consumer only sees the high watermark)."""

    def __init__(self, opts: SourceOptions, consumer: Consumer, client_id: str):
        self._opts, self._consumer, self._client_id = opts, consumer, client_id
        self._admin: Admin | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def log_end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        if self._admin is None:
            self._admin = Admin(self._opts.bootstrap_servers,
                                **{"client_id": self._client_id, **self._opts.admin_options})
        return self._admin.log_end_offsets(partitions)

    def close(self) -> None:
        try:
            if self._admin is not None:
                self._admin.close()
        finally:
            self._consumer.close()


def open_consumer(opts: SourceOptions, r: OffsetRange) -> TaskConsumer:
    client_id = f"tidelog-spark-{r.topic}-{r.partition}"
    options: dict[str, Any] = {"client_id": client_id, "max_poll_records": 8192, **opts.consumer_options}
    return TaskConsumer(opts, Consumer(opts.bootstrap_servers, auto_offset_reset="none", **options), client_id)


def read_range(consumer: RangeConsumer, r: OffsetRange, *, fail_on_data_loss: bool = True,
               poll_timeout_ms: int = 120_000, chunk: int = 8192, poll_ms: int = 500,
               clock: Callable[[], float] = time.monotonic,
               warn: Callable[[str], None] = log.warning) -> Iterator[list[Record]]:
    """The records of ``r`` in offset order, in lists of up to ``chunk`` records."""
    if r.end <= r.start:
        return
    tp = TopicPartition(r.topic, r.partition)
    consumer.assign([tp])
    consumer.seek(tp, r.start)
    pos = r.start
    buf: list[Record] = []
    progress_at = clock()
    warned = 0
    while pos < r.end:
        try:
            records = consumer.poll(timeout_ms=poll_ms, max_records=chunk)
        except (OffsetOutOfRangeError, NoOffsetForPartitionError) as e:
            pos = _out_of_range(consumer, tp, r, pos, e, fail_on_data_loss, warn)
            progress_at = clock()
            continue
        except CorruptRecordError as e:
            pos = _corrupt(consumer, tp, r, pos, e, fail_on_data_loss, warn)
            progress_at = clock()
            continue
        if records:
            for rec in records:
                if rec.offset >= r.end:
                    pos = r.end
                    break
                if rec.offset >= pos:
                    buf.append(rec)
                    pos = rec.offset + 1
            progress_at, warned = clock(), 0
            if len(buf) >= chunk:
                yield buf
                buf = []
            continue
        # nothing returned: the position may still have moved past a gap (compaction,
        # control batches), the range may have been truncated away, or the cluster is slow
        moved = consumer.position(tp)
        idle = clock() - progress_at
        if moved > pos:
            pos = min(moved, r.end)
            progress_at, warned = clock(), 0
        elif idle * 1000 >= poll_timeout_ms:
            pos = _stalled(consumer, tp, r, pos, fail_on_data_loss, warn, poll_timeout_ms)
            progress_at = clock()
        elif idle >= STALL_WARNING_S * (warned + 1):
            warned += 1
            log.warning("topic %r partition %d: no records for %.0f s at offset %d of the planned range "
                        "[%d, %d); still trying (pollTimeoutMs %d)", r.topic, r.partition, idle, pos,
                        r.start, r.end, poll_timeout_ms)
    if buf:
        yield buf


def _lost(r: OffsetRange, lost_from: int, lost_to: int, why: str, fail: bool,
          warn: Callable[[str], None]) -> None:
    message = data_loss_message(r, lost_from, lost_to, why)
    if fail:
        raise DataLossError(f"{message}. {HINT}")
    warn(f"{message}; skipping them (failOnDataLoss=false)")


def _out_of_range(consumer: RangeConsumer, tp: TopicPartition, r: OffsetRange, pos: int,
                  error: Exception, fail: bool, warn: Callable[[str], None]) -> int:
    """Where to go on after OFFSET_OUT_OF_RANGE at ``pos``."""
    earliest = consumer.beginning_offsets([tp])[tp]
    hw = consumer.end_offsets([tp])[tp]
    if pos < earliest:
        lost_to = min(earliest, r.end)
        _lost(r, pos, lost_to, f"the log now starts at offset {earliest}: deleted by retention "
              "or truncated", fail, warn)
        pos = lost_to
    elif pos > hw:
        _lost(r, pos, r.end, f"the log now ends at offset {hw}: truncated, e.g. after an unclean "
              "leader election", fail, warn)
        pos = r.end
    else:
        log.info("%s; offsets are back in range [%d, %d), retrying at %d", error, earliest, hw, pos)
    if pos < r.end:
        consumer.seek(tp, pos)
    return pos


def _corrupt(consumer: RangeConsumer, tp: TopicPartition, r: OffsetRange, pos: int,
             error: CorruptRecordError, fail: bool, warn: Callable[[str], None]) -> int:
    """Where to go on after a batch at or after ``pos`` could not be read: after it."""
    lost_from = max(pos, getattr(error, "offset", pos))
    skip = max(getattr(error, "skip_offset", lost_from + 1), lost_from + 1)
    lost_to = min(skip, r.end)
    _lost(r, lost_from, lost_to, f"a record batch that cannot be read: {error}", fail, warn)
    if lost_to < r.end:
        consumer.seek(tp, lost_to)
    return lost_to


def _stalled(consumer: RangeConsumer, tp: TopicPartition, r: OffsetRange, pos: int, fail: bool,
             warn: Callable[[str], None], poll_timeout_ms: int) -> int:
    """No progress for pollTimeoutMs at ``pos`` (see the module's rules): data loss only when
    the leader's log now ends at or below ``pos`` or the partition is gone; otherwise
    RangeReadTimeout."""
    if r.partition not in (consumer.partitions_for_topic(r.topic) or ()):
        _lost(r, pos, r.end, "the topic or partition no longer exists: deleted", fail, warn)
        return r.end
    hw = consumer.end_offsets([tp])[tp]
    log_end = hw if hw > pos else consumer.log_end_offsets([tp])[tp]
    if log_end <= pos:
        _lost(r, pos, r.end, f"the log now ends at offset {log_end}, below the planned end: the log was "
              "truncated, e.g. after an unclean leader election", fail, warn)
        return r.end
    held = "" if hw > pos else (f"; the high watermark {hw} is held below the log end offset {log_end}: the "
                                "leader is waiting for its in-sync replicas (fewer than min.insync.replicas?)")
    raise RangeReadTimeout(f"topic {r.topic!r} partition {r.partition}: no records read for "
                           f"{poll_timeout_ms} ms at offset {pos} of the planned range [{r.start}, {r.end}) "
                           f"(high watermark {hw}){held}; raise the option pollTimeoutMs if the cluster is slow")
