"""The fault-matrix harness: a real 3-broker cluster under steady load, fault injection, and
the oracle of docs/reliability.md.

A ``Scenario`` (a context manager) starts ZooKeeper and three broker processes in a temporary
directory with small timeouts (``SYSTEM_CONFIG``), creates a topic (3 partitions, replication
factor 3, min.insync.replicas 2, unclean leader election off unless the test says otherwise)
and runs the workload in background threads:

* one acks=all ``Producer`` (``max_in_flight_requests_per_connection`` 1, so its records keep
  their send order per partition) sends unique, sequence-numbered values
  (``b"<partition>:<seq>"``, round-robin over the partitions) at a bounded rate and records
  every acknowledged ``(partition, offset, value)`` with the record's timestamp, and every
  failure with its error. It is idempotent with ``Scenario(..., idempotent=True)`` (the SDK's
  ``enable_idempotence``; confluent-kafka's ``enable.idempotence``), and not otherwise, so
  that a retry after a failover may append a value twice;
* one or two live ``Consumer`` threads are assigned every partition from offset 0 and record
  every ``(partition, offset, value)`` they receive. As a real application would, on
  OFFSET_OUT_OF_RANGE (auto_offset_reset "none", so every such error is seen and recorded)
  they go on from the log start they are told (the offsets jumped are recorded: retention
  deleted them, or an unclean election lost them), and they re-seek a partition after any
  other error. ``ConsumerWorker.pause`` holds one back, to make it fall behind retention.

Faults are injected with ``stop`` (SIGTERM: controlled shutdown), ``kill`` (SIGKILL),
``pause``/``resume`` (SIGSTOP/SIGCONT) and ``start``; each is written to a timeline that is
printed with the report. Network faults need ``Scenario(..., network=True)``: every broker
then runs in its own network namespace with its own address on a bridge, ZooKeeper and the
test's clients on two addresses of the bridge (``netlab``, which explains the mechanism), and
``cut(a, b)`` drops every packet between two brokers, ``isolate(b)`` every packet between a
broker and ZooKeeper or another broker, while clients still reach every broker; ``heal``
removes the cuts. With ``latency=True`` instead, the brokers' connections to each other run
through delaying relays, and ``delay(a, b, ms)`` adds a one-way latency between two brokers.
``IsrSampler`` checks I8 while a fault lasts: every replica in the ISR that ZooKeeper holds
has a log end offset (asked of that replica) at or past the leader's high watermark.
``LogStartSampler`` keeps, while a fault lasts, each replica's log start offset with the time
it was first seen, for I11. ``produce_to``, ``read_from``, ``high_watermark_of``,
``log_end_offset_of`` and ``log_start_offset_of`` ask one broker directly (no metadata, no
retries), to see what a zombie leader does. Who leads a partition and who is the controller
is read from the metadata of every running broker, and only a view they all agree on counts
(a broker's cache lags the controller by one UpdateMetadata). Every wait polls a condition
under a deadline.

``heal`` restarts what was stopped and waits until every replica is back in its ISR;
``stop_workload`` stops producing, settles every produce future and lets the consumers catch
up to the high watermarks; ``check`` is the oracle, which also stops every broker cleanly to
read their segment files:

* I1  every acknowledged (partition, offset, value) at or above the partition's log start is
      at that offset when each partition is read by a fresh consumer from its log start to
      its high watermark (the *final log*); an acknowledged record below the log start was
      deleted by retention, and I11 (b) checks that it had expired (``Report.expired``);
* I3  offsets strictly increase (and are contiguous); per partition, the producer's values
      appear in send order (re-sent duplicates, possible without idempotence, are counted);
* I4  (with ``idempotent=True``) no value appears twice in the final log: every duplicate is
      a violation (``duplicated``), where without idempotence it is only counted;
* I6  every record a live consumer received at or above the log start is in the final log at
      the same offset with the same value; no consumer skipped an offset without having been
      told (an out-of-range error) -- I10's "never a silent skip"; and every live consumer
      received every acknowledged record but those it jumped when told;
* I2  after a clean stop of every broker, every replica's segment files, read from disk,
      agree record by record (with each other and with what the consumer read) from the
      later of the final log's start and the replica's own log start up to the smallest high
      watermark in the replicas' replication-offset-checkpoint files;
* I5  ``dump-log --verify`` finds no problem in any segment of any replica;
* I8  (when an ``IsrSampler`` ran) no sample found an ISR member below the high watermark;
* I11 retention deletes only whole, expired segments, by the topic's retention.ms (its own
      setting, else the brokers'), on every replica as its broker left it on disk:
      (a) its log start offset (log-start-offset-checkpoint) lies within its segments and is
          a segment boundary: the base offset of its first segment (or of a later one while
          those wholly below it wait for the next retention run), or -- for a follower, which
          follows its leader's log start, where their segments do not line up -- a boundary
          of another replica (on disk, or where a broker logged cutting its log);
      (b) nothing was deleted before it expired: for every log start L seen at a time t (by
          a ``LogStartSampler``, a live consumer's reset, the final read, or the replica's
          checkpoint when its broker stopped), every acknowledged record below L has a
          timestamp at least retention.ms older than t;
      (c) liveness: every segment below the replica's high watermark is gone if, when its
          broker stopped, its newest record had been expired, and the broker had been up
          since its last start, for more than ``RETENTION_SLACK_MS`` plus
          log.retention.check.interval.ms.
      With the default retention (7 days) (b) means nothing acknowledged is deleted at all
      and (c) asks nothing; short retention is the I11 scenario of ``test_fault_matrix``.

The ``Report`` carries the counts (acked, consumed, lost, diverged, ...) and the first few
examples of each violation; ``Report.assert_ok`` fails with the whole report.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import io
import itertools
import os
import re
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from tests.support import waiting
from tests.support.cluster import dump_logs, dump_zookeeper
from tests.support.disk import (
    SegmentFile,
    checkpointed_high_watermarks,
    checkpointed_log_starts,
    log_dir,
    replica_records,
    replica_segments,
)
from tests.support.waiting import NotYet
from tests.system.netlab import NetworkLab
from tidelog import Admin, Consumer, NewTopic, Producer, TidelogError, TopicPartition
from tidelog.broker import health
from tidelog.broker.config import SETTINGS as BROKER_SETTINGS
from tidelog.broker.devcluster import DevCluster, metadata
from tidelog.broker.log import dump
from tidelog.broker.security.listeners import parse_endpoints
from tidelog.errors import OffsetOutOfRangeError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.messages import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    MetadataResponse,
    PartitionProduceData,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
)
from tidelog.protocol.records import build_batch, iter_all_records

T = TypeVar("T")

# Small timeouts so that faults are noticed quickly: a killed or paused broker's ZooKeeper
# session expires after 6 s, a follower that stopped fetching leaves the ISR after 4 s, a
# controlled shutdown that cannot move everything gives up after 3 x 0.3 s.
SYSTEM_CONFIG: dict[str, object] = {
    "zookeeper.session.timeout.ms": 6000,
    "replica.lag.time.max.ms": 4000,
    "controlled.shutdown.max.retries": 3,
    "controlled.shutdown.retry.backoff.ms": 300,
    "replica.fetch.backoff.ms": 200,
    "replica.high.watermark.checkpoint.interval.ms": 1000,
}
SESSION_S = int(SYSTEM_CONFIG["zookeeper.session.timeout.ms"]) / 1000

# Bounds on waits. Generous: two cores are shared with other people's test runs.
ELECTION_TIMEOUT_S = 60.0   # a new leader or controller after a failure (includes session expiry)
HEAL_TIMEOUT_S = 120.0      # every broker back and every replica back in its ISR
SETTLE_TIMEOUT_S = 120.0    # produce futures resolved, consumers caught up

# The system tests poll their brokers every 100 ms, half as often as the integration tests.
wait_until = functools.partial(waiting.wait_until, interval=0.1)


def value_of(partition: int, seq: int) -> bytes:
    return b"%d:%09d" % (partition, seq)


def parse_value(value: bytes | None) -> tuple[int, int] | None:
    try:
        p, seq = value.split(b":")
        return int(p), int(seq)
    except (AttributeError, ValueError):
        return None


# -- the workload --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    partition: int
    offset: int
    value: bytes
    seq: int
    at: float  # time.monotonic() when the acknowledgement arrived
    timestamp: int = -1  # the record's own timestamp (CreateTime, ms), what retention ages it by


@dataclass(frozen=True, slots=True)
class Failure:
    partition: int
    value: bytes
    seq: int
    error: str  # the error code's name (or the exception type)
    message: str
    at: float


def error_name(e: BaseException) -> str:
    err = getattr(e, "error", None)
    return getattr(err, "name", None) or type(e).__name__


class ProducerWorker:
    """The steady acks=all producer (a thread): ``rate`` records a second, round-robin over
    the partitions, every outcome recorded by its future's callback. Idempotence is off
    unless ``enable_idempotence=True`` is passed (the SDK would turn it on by itself with
    these options): ``idempotent`` says which, for the oracle's I4."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int, **config: Any):
        self.topic, self.partitions, self.rate = topic, partitions, rate
        config = {"acks": "all", "max_in_flight_requests_per_connection": 1, "linger_ms": 5,
                  "request_timeout_ms": 10000, "delivery_timeout_ms": 60000, "retry_backoff_ms": 100,
                  "max_block_ms": 20000, "client_id": "system-producer", "enable_idempotence": False, **config}
        self.idempotent = bool(config["enable_idempotence"])
        self.producer = Producer(bootstrap, **config)
        self.acked: list[Ack] = []
        self.failed: list[Failure] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="system-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def pause(self) -> None:
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    def _run(self) -> None:
        chunk = max(1, self.rate // 50)
        interval = chunk / self.rate
        next_at = time.monotonic()
        seq = 0
        try:
            while not self._stop.is_set():
                if not self._resume.is_set():
                    self._resume.wait(0.2)
                    next_at = time.monotonic()
                    continue
                for _ in range(chunk):
                    self._send_one(seq)
                    seq += 1
                self.sent = seq
                next_at += interval
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._stop.wait(delay)
                elif delay < -1.0:
                    next_at = time.monotonic()  # fell behind (send blocked): no catch-up burst
        except BaseException as e:  # noqa: BLE001 -- reported by stop()
            self.error = e

    def _send_one(self, seq: int) -> None:
        p = seq % self.partitions
        value = value_of(p, seq)
        try:
            fut = self.producer.send(self.topic, value, partition=p)
        except TidelogError as e:  # max_block_ms passed without metadata or memory
            self._record_failure(p, value, seq, e)
            return
        fut.add_done_callback(lambda f: self._done(f, p, value, seq))

    def _done(self, fut, p: int, value: bytes, seq: int) -> None:
        e = fut.exception(0)
        if e is not None:
            self._record_failure(p, value, seq, e)
            return
        md = fut.result(0)
        with self._lock:
            self.acked.append(Ack(p, md.offset, value, seq, time.monotonic(), md.timestamp))

    def _record_failure(self, p: int, value: bytes, seq: int, e: BaseException) -> None:
        with self._lock:
            self.failed.append(Failure(p, value, seq, error_name(e), str(e), time.monotonic()))

    def acks(self) -> list[Ack]:
        with self._lock:
            return list(self.acked)

    def acked_count(self, partition: int | None = None, since: float = 0.0) -> int:
        return sum(1 for a in self.acks() if a.at >= since and (partition is None or a.partition == partition))

    def stop(self, timeout: float = SETTLE_TIMEOUT_S) -> None:
        """Stop sending and settle every future: delivered, or failed by the producer's close."""
        self._stop.set()
        self._resume.set()
        self._thread.join(30)
        self.producer.close(timeout=timeout)
        if self.error is not None:
            raise AssertionError(f"the producer thread failed: {self.error!r}") from self.error


class KafkaProducerWorker(ProducerWorker):
    """The same workload driven by a third-party Kafka client (confluent-kafka, librdkafka)
    on the brokers' Kafka listeners: acks=all and idempotence, every outcome recorded by its
    delivery report (served by a polling thread of its own)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int, **config: Any):
        import confluent_kafka

        self.topic, self.partitions, self.rate = topic, partitions, rate
        config = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
                  "request.timeout.ms": 10000, "delivery.timeout.ms": 60000, "retry.backoff.ms": 100,
                  "client.id": "system-kafka-producer", **config}
        self.idempotent = bool(config["enable.idempotence"])
        self.producer = _ConfluentProducer(confluent_kafka.Producer(config))
        self.acked, self.failed, self.sent = [], [], 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self.error = None
        self._thread = threading.Thread(target=self._run, name="system-kafka-producer", daemon=True)

    def _send_one(self, seq: int) -> None:
        p = seq % self.partitions
        value = value_of(p, seq)

        def delivered(err, message) -> None:
            if err is not None:
                with self._lock:
                    self.failed.append(Failure(p, value, seq, err.name(), err.str(), time.monotonic()))
            else:
                with self._lock:
                    self.acked.append(Ack(p, message.offset(), value, seq, time.monotonic(),
                                          message.timestamp()[1]))

        while True:
            try:
                self.producer.kafka.produce(self.topic, value, partition=p, on_delivery=delivered)
                return
            except BufferError:  # the local queue is full: wait for delivery reports
                self.producer.kafka.poll(0.1)


class _ConfluentProducer:
    """confluent-kafka's producer with a thread serving its delivery reports, closed like
    the SDK's (``close(timeout)`` flushes, then stops the thread)."""

    def __init__(self, kafka: Any):
        self.kafka = kafka
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="system-kafka-reports", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.kafka.poll(0.1)

    def close(self, timeout: float = SETTLE_TIMEOUT_S) -> None:
        self.kafka.flush(timeout)
        self._stop.set()
        self._thread.join(10)
        self.kafka.poll(0)


@dataclass(frozen=True, slots=True)
class ConsumerEvent:
    at: float
    partition: int | None
    error: str
    message: str
    position: int | None  # the consumer's next offset for the partition when it happened


@dataclass(frozen=True, slots=True)
class LogStart:
    """A log start offset of the topic's ``partition`` seen at ``at_ms`` (wall clock, taken
    after the answer arrived): every offset below ``offset`` had been deleted by then."""

    at_ms: float
    partition: int
    offset: int
    source: str  # who saw it: a broker's replica, a consumer's reset, the final read, a checkpoint


def wall_ms() -> float:
    """The wall clock in ms: what record timestamps and the brokers' retention use."""
    return time.time() * 1000


_PARTITION_IN_MESSAGE = re.compile(r"partition (\S+)-(\d+)\b")


class ConsumerWorker:
    """A live consumer (a thread) reading every partition from offset 0, recording each
    (partition, offset, value) and every error; on OFFSET_OUT_OF_RANGE it asks for the log
    start and goes on from there (the offsets it jumped are recorded in ``told``), and it
    re-seeks a partition at its position after other errors. ``pause`` holds it back (it
    stops polling) until ``resume``, to make it fall behind retention."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, name: str):
        self.topic, self.partitions, self.name = topic, partitions, name
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer = Consumer(bootstrap, auto_offset_reset="none", fetch_max_wait_ms=200,
                                 request_timeout_ms=10000, default_api_timeout_ms=15000,
                                 client_id=name)
        self.seen: set[tuple[int, int, bytes | None]] = set()  # every (partition, offset, value)
        self.received = 0
        self.next_offset: dict[int, int] = {p: 0 for p in range(partitions)}
        self.skips: list[tuple[int, int, int]] = []  # (partition, expected offset, got) without a reset
        self.told: list[tuple[int, int, int]] = []   # (partition, from, to): jumped after OFFSET_OUT_OF_RANGE
        self.log_starts: list[LogStart] = []         # the log starts it reset to
        self.events: list[ConsumerEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.consumer.assign(self.tps)
        for tp in self.tps:
            self.consumer.seek(tp, 0)
        self._thread.start()

    def pause(self) -> None:
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._resume.wait(0.2):
                    continue
                try:
                    records = self.consumer.poll(timeout_ms=200)
                except OffsetOutOfRangeError as e:
                    self._reset(e)
                    continue
                except TidelogError as e:
                    self._reseek(e)
                    continue
                with self._lock:
                    for r in records:
                        self._absorb(r.partition, r.offset, r.value)
        except BaseException as e:  # noqa: BLE001 -- reported by stop()
            self.error = e

    def _absorb(self, p: int, offset: int, value: bytes | None) -> None:
        expected = self.next_offset[p]
        if offset != expected:
            self.skips.append((p, expected, offset))
        self.next_offset[p] = offset + 1
        self.seen.add((p, offset, value))
        self.received += 1

    def _partition_of(self, e: BaseException) -> int | None:
        m = _PARTITION_IN_MESSAGE.search(str(e))
        return int(m.group(2)) if m and m.group(1) == self.topic else None

    def _event(self, p: int | None, e: BaseException) -> None:
        with self._lock:
            self.events.append(ConsumerEvent(time.monotonic(), p, error_name(e), str(e),
                                             None if p is None else self.next_offset[p]))

    def _reset(self, e: OffsetOutOfRangeError) -> None:
        """What a consumer with auto.offset.reset=earliest does, made visible: it seeks to the
        log start it was told (one answer for both, so that retention moving the start in
        between cannot pass for a silent skip); the offsets from its position up to that start
        were skipped with notice. The partition fetches nothing until that seek, so a failed
        question is asked again."""
        p = self._partition_of(e)
        self._event(p, e)
        tps = self.tps if p is None else [self.tps[p]]
        while True:
            try:
                starts = self.consumer.beginning_offsets(tps, timeout_ms=5000)
                break
            except TidelogError:
                if self._stop.wait(0.2):
                    return
        at = wall_ms()
        with self._lock:
            for tp, start in starts.items():
                if start > self.next_offset[tp.partition]:
                    self.told.append((tp.partition, self.next_offset[tp.partition], start))
                self.next_offset[tp.partition] = start
                self.log_starts.append(LogStart(at, tp.partition, start, f"{self.name}'s reset"))
        for tp, start in starts.items():
            self.consumer.seek(tp, start)

    def _reseek(self, e: TidelogError) -> None:
        p = self._partition_of(e)
        self._event(p, e)
        for tp in self.tps if p is None else [self.tps[p]]:
            self.consumer.seek(tp, self.next_offset[tp.partition])
        self._stop.wait(0.1)

    def caught_up(self, ends: dict[int, int]) -> bool:
        with self._lock:
            return all(self.next_offset[p] >= end for p, end in ends.items())

    def events_for(self, partition: int, error: str | None = None) -> list[ConsumerEvent]:
        with self._lock:
            return [ev for ev in self.events if ev.partition == partition and (error is None or ev.error == error)]

    def stop(self) -> None:
        self._stop.set()
        self._resume.set()
        self._thread.join(30)
        self.consumer.close()
        if self.error is not None:
            raise AssertionError(f"consumer {self.name} failed: {self.error!r}") from self.error


# -- the report ----------------------------------------------------------------------------------


@dataclass
class Report:
    """What the oracle found. Counts, plus up to ``EXAMPLES`` examples of each violation."""

    EXAMPLES = 5

    name: str
    sent: int = 0
    acked: int = 0
    failed: int = 0
    failures_by_error: dict[str, int] = field(default_factory=dict)
    consumed: int = 0            # records the live consumers received (re-reads included)
    consumed_distinct: int = 0   # distinct (partition, offset, value) received
    final_records: int = 0       # records in the final log (sum of the HWs)
    high_watermarks: dict[int, int] = field(default_factory=dict)
    idempotent: bool = False     # the producer was idempotent: every duplicate is an I4 violation
    duplicates: int = 0          # producer values in the final log more than once (retries)
    out_of_range_resets: int = 0
    retention_ms: int = -1       # the topic's retention.ms, which I11 holds deletions to
    log_starts: dict[int, dict[int, int | None]] = field(default_factory=dict)  # partition -> broker -> checkpointed
    expired: int = 0             # acked records below the final log start: I11 (b), not I1, checks them
    log_start_samples: int = 0   # log starts seen while the scenario ran (LogStartSampler, consumer resets)
    consumer_errors: dict[str, int] = field(default_factory=dict)
    # violations
    lost: list = field(default_factory=list)          # I1: acked, not at its offset
    misordered: list = field(default_factory=list)    # I3: offsets or send order broken
    phantom: list = field(default_factory=list)       # I6: consumed, not in the final log
    silent_skips: list = field(default_factory=list)  # I6/I10: a consumer skipped offsets unannounced
    not_consumed: list = field(default_factory=list)  # acked, never received by a live consumer
    diverged: list = field(default_factory=list)      # I2: replicas differ below the HW
    corrupt: list = field(default_factory=list)       # I5: dump-log --verify problems
    isr_behind: list = field(default_factory=list)    # I8: an ISR member in ZooKeeper below the HW
    duplicated: list = field(default_factory=list)    # I4: a value twice in the log of an idempotent producer
    cut_inside: list = field(default_factory=list)    # I11 (a): a log start that is no segment boundary
    deleted_early: list = field(default_factory=list)  # I11 (b): an acked record deleted before it expired
    kept_expired: list = field(default_factory=list)  # I11 (c): an expired segment retention left in place
    isr_samples: int = 0         # I8 samples of ZooKeeper's ISR and the replicas' LEOs (IsrSampler)
    replicas_compared: int = 0
    segments_verified: int = 0
    lost_records: list[Ack] = field(default_factory=list)  # the acks behind ``lost``
    phantom_records: list[tuple[str, int, int]] = field(default_factory=list)  # (consumer, partition, offset)
    timeline: list[str] = field(default_factory=list)

    COUNTS = ("lost", "misordered", "phantom", "silent_skips", "not_consumed", "diverged", "corrupt",
              "isr_behind", "duplicated", "cut_inside", "deleted_early", "kept_expired")

    def count(self, what: str) -> int:
        return len(getattr(self, what))

    def violations(self, ignore: Iterable[str] = ()) -> dict[str, int]:
        return {k: self.count(k) for k in self.COUNTS if k not in ignore and self.count(k)}

    def summary(self) -> str:
        lines = [(f"== {self.name}: sent {self.sent}, acked {self.acked}, failed {self.failed} "
                  f"{dict(self.failures_by_error)}, consumed {self.consumed} ({self.consumed_distinct} distinct), "
                  f"final log {self.final_records} records, HWs {self.high_watermarks}, "
                  f"duplicates {self.duplicates} ({'idempotent' if self.idempotent else 'not idempotent'}), "
                  f"out-of-range resets {self.out_of_range_resets}, "
                  f"consumer errors {dict(self.consumer_errors)}, replicas compared {self.replicas_compared}, "
                  f"segments verified {self.segments_verified}, ISR samples {self.isr_samples}, "
                  f"retention.ms {self.retention_ms}: log starts {self.log_starts}, {self.expired} acked "
                  f"records expired, {self.log_start_samples} log starts seen while running"),
                 "   " + ", ".join(f"{k} {self.count(k)}" for k in self.COUNTS)]
        for k in self.COUNTS:
            for example in getattr(self, k)[:self.EXAMPLES]:
                lines.append(f"   {k}: {example}")
        lines += ["   timeline:"] + [f"     {t}" for t in self.timeline]
        return "\n".join(lines)

    def assert_ok(self, ignore: Iterable[str] = ()) -> None:
        print(self.summary())
        bad = self.violations(ignore)
        assert not bad, f"invariants violated: {bad}\n{self.summary()}"
        assert self.acked > 0, f"nothing was acknowledged\n{self.summary()}"


# -- the scenario --------------------------------------------------------------------------------


INTER_BROKER_SECURITY = os.environ.get("TIDELOG_FAULT_INTER_BROKER", "SASL_SSL")  # or PLAINTEXT


class Scenario:
    """A cluster, a topic and a steady workload; fault injection; heal; the oracle."""

    def __init__(self, directory: Path, name: str, *, topic: str = "chaos", partitions: int = 3,
                 replication_factor: int = 3, topic_config: dict[str, str] | None = None,
                 extra_config: dict[str, object] | None = None, rate: int = 600, consumers: int = 2,
                 network: bool = False, latency: bool = False, producer_config: dict[str, Any] | None = None,
                 kafka_producer: bool = False, idempotent: bool = False):
        """``network``: run every broker in its own network namespace (``netlab``), so that
        ``cut`` and ``isolate`` can partition the network. ``latency`` (with ``network``):
        route the brokers' connections to each other through delay relays, so that ``delay``
        can slow them down (``cut`` does not work on relayed traffic). ``producer_config``: options of the
        steady producer that differ from ``ProducerWorker``'s. ``kafka_producer``: the steady
        producer is confluent-kafka on the brokers' Kafka listeners (``KafkaProducerWorker``).
        ``idempotent``: the steady producer runs with idempotence enabled, and the oracle holds
        it to I4 (no value twice in the log); off, a retry may append a value again."""
        self.kafka_producer, self.idempotent = kafka_producer, idempotent
        self.latency = latency
        self.name = name
        self.topic, self.partitions, self.replication_factor = topic, partitions, replication_factor
        self.topic_config = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false",
                             **(topic_config or {})}
        self.rate, self.n_consumers = rate, consumers
        self.producer_config = dict(producer_config or {})
        self.lab = NetworkLab([1, 2, 3]) if network else None
        where = {} if self.lab is None else {"zk_host": self.lab.zookeeper_host, "hosts": self.lab.hosts,
                                             "netns": self.lab.netns}
        # brokers replicate over SASL_SSL (SCRAM, TLS), as a secured production cluster does;
        # the workload's clients use a PLAINTEXT listener
        self.cluster = DevCluster(directory, brokers=3, zk_port=0, base_port=0,
                                  extra_config={**SYSTEM_CONFIG, **(extra_config or {})},
                                  inter_broker_security=INTER_BROKER_SECURITY, kafka=kafka_producer, **where)
        self.final_log: dict[int, dict[int, bytes | None]] = {}  # partition -> offset -> value (check)
        self.isr_samples = 0              # I8 samples taken (``IsrSampler``)
        self.isr_behind: list[str] = []   # I8 violations
        self.log_starts: list[LogStart] = []  # seen while running (LogStartSampler) and by the final read
        self.started_ms: dict[int, float] = {}  # broker -> wall clock of its last start (I11's liveness)
        self.stopped_ms: dict[int, float] = {}  # broker -> wall clock once its last clean stop was over
        self.producer: ProducerWorker | None = None
        self.consumers: list[ConsumerWorker] = []
        self.paused: set[int] = set()
        self.timeline: list[str] = []
        self._t0 = time.monotonic()
        self._workload_stopped = False

    # -- lifecycle -------------------------------------------------------------------------------

    def __enter__(self) -> Self:
        try:
            if self.lab is not None:
                self.lab.create(delayed_port=self._inter_broker_port() if self.latency else None)
                self.note(f"network lab: {self.lab.describe()}")
            self.note("starting ZooKeeper and 3 brokers")
            self.started_ms = dict.fromkeys(self.cluster.brokers, wall_ms())
            self.cluster.start(60.0)
            self.create_topic(self.topic, self.partitions, self.replication_factor, self.topic_config)
            self.start_workload()
        except BaseException:
            self._abort()
            raise
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self._abort()
            return
        self._close_workload()
        self.cluster.kill()  # the oracle stopped the brokers cleanly; ZooKeeper and leftovers
        if self.lab is not None:
            self.lab.close()

    def _abort(self) -> None:
        print("\n".join(["timeline:"] + self.timeline))
        for b in list(self.paused):
            self.cluster.brokers[b].resume()
        self._close_workload()
        dump_zookeeper(self.cluster)
        dump_logs(self.cluster, leave_out="request FETCH to broker")
        self.cluster.kill()
        if self.lab is not None:
            self.lab.close()

    def _close_workload(self) -> None:
        if self.producer is not None and not self._workload_stopped:
            self.producer._stop.set()
            self.producer._resume.set()
            with contextlib.suppress(Exception):
                self.producer.producer.close(timeout=0)
        for c in self.consumers:
            c._stop.set()
            with contextlib.suppress(Exception):
                c.consumer.close(timeout=5)
        self._workload_stopped = True

    def note(self, what: str) -> None:
        line = f"{time.monotonic() - self._t0:7.2f}s {what}"
        self.timeline.append(line)
        print(line, flush=True)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def admin(self) -> Admin:
        return Admin(self.bootstrap, default_api_timeout_ms=30000, request_timeout_ms=10000)

    def broker_setting(self, name: str) -> Any:
        """A setting of the brokers: as this scenario configured them, else the default."""
        if name in self.cluster.extra_config:
            return self.cluster.extra_config[name]
        return next(x.default for x in BROKER_SETTINGS if x.name == name)

    @property
    def retention_ms(self) -> int:
        """The topic's retention.ms: its own setting, else the brokers' log.retention.ms."""
        return int(self.topic_config.get("retention.ms", self.broker_setting("log.retention.ms")))

    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     config: dict[str, str] | None = None, timeout: float = ELECTION_TIMEOUT_S) -> None:
        with self.admin() as admin:
            admin.create_topics([NewTopic(name, partitions, replication_factor, config=dict(config or {}))])
        self.wait_isr_full(topic=name, partitions=partitions, timeout=timeout)
        self.note(f"topic {name!r} created: {partitions} partitions, RF {replication_factor}, {config}")

    def start_workload(self) -> None:
        if self.kafka_producer:
            self.producer = KafkaProducerWorker(self.cluster.kafka_bootstrap, self.topic, self.partitions,
                                                self.rate, **{"enable.idempotence": self.idempotent,
                                                              **self.producer_config})
        else:
            self.producer = ProducerWorker(self.bootstrap, self.topic, self.partitions, self.rate,
                                           **{"enable_idempotence": self.idempotent, **self.producer_config})
        self.consumers = [ConsumerWorker(self.bootstrap, self.topic, self.partitions, f"system-consumer-{i}")
                          for i in range(self.n_consumers)]
        self.producer.start()
        for c in self.consumers:
            c.start()
        self.note(f"workload started: {self.rate} records/s ({'' if self.producer.idempotent else 'not '}"
                  f"idempotent), {self.n_consumers} consumers")

    # -- the cluster as the brokers see it -----------------------------------------------------

    @property
    def running(self) -> list[int]:
        return [i for i, b in self.cluster.brokers.items() if b.running and i not in self.paused]

    def metadata_of(self, broker_id: int) -> MetadataResponse:
        b = self.cluster.brokers[broker_id]
        return metadata(b.port, b.host, timeout=5.0)

    def views(self) -> dict[int, MetadataResponse]:
        """The metadata of every running (not paused) broker."""
        return {b: self.metadata_of(b) for b in self.running}

    def agreed(self, fn: Callable[[MetadataResponse], T]) -> T | None:
        """``fn`` of every running broker's metadata when they all agree, else None."""
        values = [fn(md) for md in self.views().values()]
        if values and all(v == values[0] for v in values):
            return values[0]
        return None

    def partition_state(self, partition: int, topic: str | None = None) -> tuple[int, int, tuple[int, ...]] | None:
        """``(leader, leader epoch, isr)`` of a partition as every running broker sees it."""
        topic = topic or self.topic

        def state(md: MetadataResponse):
            for t in md.topics:
                if t.name == topic:
                    for p in t.partitions:
                        if p.partition_index == partition:
                            return p.leader_id, p.leader_epoch, tuple(sorted(p.isr_nodes))
            return None
        return self.agreed(state)

    def replicas_of(self, partition: int, topic: str | None = None) -> list[int]:
        topic = topic or self.topic
        for md in self.views().values():
            for t in md.topics:
                if t.name == topic:
                    for p in t.partitions:
                        if p.partition_index == partition:
                            return list(p.replica_nodes)
        raise AssertionError(f"no running broker knows {topic}-{partition}")

    def leader_of(self, partition: int, timeout: float = ELECTION_TIMEOUT_S, not_in: Iterable[int] = ()) -> int:
        """The leader of ``partition`` once every running broker agrees it is a running broker
        (and not one of ``not_in``)."""
        excluded = set(not_in)

        def leader():
            st = self.partition_state(partition)
            return st is not None and st[0] in self.running and st[0] not in excluded and st[0]
        return wait_until(leader, timeout, f"a running leader of partition {partition} (not {sorted(excluded)})")

    def controller(self, timeout: float = ELECTION_TIMEOUT_S, not_in: Iterable[int] = ()) -> int:
        excluded = set(not_in)

        def controller():
            c = self.agreed(lambda md: md.controller_id)
            return c is not None and c in self.running and c not in excluded and c
        return wait_until(controller, timeout, f"a running controller (not {sorted(excluded)})")

    def wait_isr(self, partition: int, isr: Iterable[int], timeout: float = ELECTION_TIMEOUT_S,
                 topic: str | None = None) -> None:
        want = tuple(sorted(isr))
        wait_until(lambda: (st := self.partition_state(partition, topic)) is not None and st[2] == want,
                   timeout, f"ISR of partition {partition} to be {list(want)}")

    def wait_isr_full(self, topic: str | None = None, partitions: int | None = None,
                      timeout: float = HEAL_TIMEOUT_S) -> None:
        """Every partition has a running leader and all its replicas in the ISR, as every
        running broker sees it, and every running broker is registered."""
        topic = topic or self.topic
        n = partitions or self.partitions

        def full():
            running = set(self.running)
            for b, md in self.views().items():
                if not running <= {x.node_id for x in md.brokers}:
                    return NotYet(f"broker {b} lists brokers {sorted(x.node_id for x in md.brokers)}")
                parts = {p.partition_index: p for t in md.topics if t.name == topic for p in t.partitions}
                if len(parts) != n:
                    return NotYet(f"broker {b} knows partitions {sorted(parts)}")
                for p in parts.values():
                    if p.leader_id not in running or set(p.isr_nodes) != set(p.replica_nodes):
                        return NotYet(f"broker {b} sees partition {p.partition_index} led by {p.leader_id} "
                                      f"(epoch {p.leader_epoch}), ISR {sorted(p.isr_nodes)}")
            return True
        wait_until(full, timeout, f"every replica of {topic!r} in its ISR")

    def wait_gone(self, broker_id: int, timeout: float = ELECTION_TIMEOUT_S) -> None:
        """Until no running broker lists ``broker_id`` (its ZooKeeper session expired)."""
        wait_until(lambda: self.running and all(broker_id not in {b.node_id for b in md.brokers}
                                                for md in self.views().values()),
                   timeout, f"broker {broker_id} gone from the cluster metadata")
        self.note(f"broker {broker_id} is gone from the metadata")

    def wait_acked(self, n: int, partition: int | None = None, since: float | None = None,
                   timeout: float = ELECTION_TIMEOUT_S) -> None:
        """Until ``n`` more records (of ``partition``) were acknowledged after ``since``."""
        since = time.monotonic() if since is None else since
        wait_until(lambda: self.producer.acked_count(partition, since) >= n, timeout,
                   f"{n} records acknowledged" + ("" if partition is None else f" on partition {partition}"))

    def wait_consumed(self, ends: dict[int, int], timeout: float = SETTLE_TIMEOUT_S) -> None:
        wait_until(lambda: all(c.caught_up(ends) for c in self.consumers), timeout,
                   f"the live consumers to reach {ends}")

    def end_offsets(self, topic: str | None = None, timeout_ms: int = 30000) -> dict[int, int]:
        """Every partition's high watermark (as its leader answers a consumer)."""
        return self._offsets(Consumer.end_offsets, topic, timeout_ms)

    def beginning_offsets(self, topic: str | None = None, timeout_ms: int = 30000) -> dict[int, int]:
        """Every partition's log start offset (as its leader answers a consumer)."""
        return self._offsets(Consumer.beginning_offsets, topic, timeout_ms)

    def _offsets(self, ask: Callable[..., dict[TopicPartition, int]], topic: str | None,
                 timeout_ms: int) -> dict[int, int]:
        topic = topic or self.topic
        with Consumer(self.bootstrap, default_api_timeout_ms=timeout_ms) as c:
            found = ask(c, [TopicPartition(topic, p) for p in range(self.partitions)], timeout_ms=timeout_ms)
        return {tp.partition: off for tp, off in found.items()}

    # -- faults --------------------------------------------------------------------------------

    def stop(self, broker_id: int) -> None:
        self.note(f"SIGTERM broker {broker_id} (controlled shutdown)")
        status = self.cluster.brokers[broker_id].stop(60.0)
        self.stopped_ms[broker_id] = wall_ms()
        self.note(f"broker {broker_id} exited with status {status}")

    def kill(self, broker_id: int) -> None:
        self.note(f"SIGKILL broker {broker_id}")
        self.cluster.brokers[broker_id].kill()
        self.paused.discard(broker_id)

    def pause(self, broker_id: int) -> None:
        self.note(f"SIGSTOP broker {broker_id}")
        self.cluster.brokers[broker_id].pause()
        self.paused.add(broker_id)

    def resume(self, broker_id: int) -> None:
        self.note(f"SIGCONT broker {broker_id}")
        self.cluster.brokers[broker_id].resume()
        self.paused.discard(broker_id)

    def start(self, broker_id: int, wait: bool = True) -> None:
        self.note(f"starting broker {broker_id}")
        self.started_ms[broker_id] = wall_ms()
        self.cluster.brokers[broker_id].start()
        if wait:
            self.cluster.wait_ready(ELECTION_TIMEOUT_S, brokers=set(self.running))
            self.note(f"broker {broker_id} is registered")

    def cut(self, a: int, b: int) -> None:
        """A network partition between brokers ``a`` and ``b`` (every packet dropped, both ways)."""
        self.note(f"network: cut broker {a} <-> broker {b}")
        self.lab.cut(a, b)

    def slow(self, broker_id: int, rate_kbit: int) -> None:
        """A slow link into ``broker_id``: a rate limit (``netlab.NetworkLab.slow``)."""
        self.note(f"network: link into broker {broker_id} limited to {rate_kbit} kbit/s")
        self.lab.slow(broker_id, rate_kbit)

    def delay(self, a: int, b: int, delay_ms: float) -> None:
        """Latency between brokers ``a`` and ``b``: ``delay_ms`` one way, both ways
        (``netlab.NetworkLab.delay``; needs ``latency=True``)."""
        self.note(f"network: {delay_ms:g} ms one-way delay between broker {a} and broker {b} (the relays "
                  f"between them carried {self.lab.relayed_bytes(a, b)} bytes so far)")
        self.lab.delay(a, b, delay_ms)

    def relayed_bytes(self, a: int, b: int) -> int:
        """Bytes the delay relays carried between brokers ``a`` and ``b`` so far."""
        return self.lab.relayed_bytes(a, b)

    def _inter_broker_port(self) -> int:
        """The port of the listener the brokers connect to each other on (the same for every
        broker: each has its own namespace and address)."""
        config = tomllib.loads(self.cluster.brokers[1].config_path.read_text())
        name = config.get("inter.broker.listener.name")
        return next(e.port for e in parse_endpoints(config["listeners"]) if name in (None, e.name))

    def isolate(self, broker_id: int) -> None:
        """Cut ``broker_id`` off from ZooKeeper and from every other broker; clients still reach it."""
        self.note(f"network: isolate broker {broker_id} from ZooKeeper and the other brokers")
        self.lab.isolate_from_zookeeper(broker_id)
        for other in self.cluster.brokers:
            if other != broker_id:
                self.lab.cut(broker_id, other)

    def heal(self, timeout: float = HEAL_TIMEOUT_S) -> None:
        """Remove network cuts, resume what is paused, start what is stopped, wait until every
        replica is in its ISR."""
        self.note("healing")
        if self.lab is not None and self.lab.is_cut():
            self.lab.heal()
            self.note("network: every cut, slow link and delay removed")
        for b in sorted(self.paused):
            self.resume(b)
        for i, b in self.cluster.brokers.items():
            if not b.running:
                self.start(i, wait=False)
        self.cluster.wait_ready(timeout, brokers=set(self.cluster.brokers))
        self.wait_isr_full(timeout=timeout)
        self.note("healed: every replica is in its ISR")

    def ask(self, broker_id: int, api_key: ApiKey, request: Any, timeout: float = 5.0) -> dict:
        """One request straight to ``broker_id`` (no metadata, no retries): the response body."""
        b = self.cluster.brokers[broker_id]
        return health.request(b.host, b.port, api_key, request, timeout=timeout, client_id="system-probe")

    def fetch_from(self, broker_id: int, partition: int, offset: int = 0, max_bytes: int = 1024,
                   topic: str | None = None) -> FetchPartitionResponse:
        """A consumer fetch of ``partition`` from ``offset`` (no wait) straight to ``broker_id``."""
        topic = topic or self.topic
        req = FetchRequest([FetchTopic(topic, [FetchPartition(partition, offset, max_bytes)])], max_wait_ms=0,
                           min_bytes=0, max_bytes=max_bytes)
        return FetchResponse.from_body(self.ask(broker_id, ApiKey.FETCH, req)).responses[0].partitions[0]

    def fetch_error_from(self, broker_id: int, partition: int, topic: str | None = None) -> int:
        """The error code a consumer fetch of ``partition`` (offset 0, no wait) gets from
        ``broker_id`` directly (0: it serves the partition, i.e. it thinks it leads it)."""
        return self.fetch_from(broker_id, partition, topic=topic).error_code

    def read_from(self, broker_id: int, partition: int, max_fetches: int = 1000,
                  topic: str | None = None) -> tuple[int, list[tuple[int, bytes | None]]]:
        """Everything ``broker_id`` serves a consumer of ``partition``, fetched from offset 0
        straight from it: ``(error code of the last fetch, [(offset, value), ...])``."""
        out: list[tuple[int, bytes | None]] = []
        offset = 0
        for _ in range(max_fetches):
            r = self.fetch_from(broker_id, partition, offset, 1 << 16, topic)
            records = [(x.offset, x.value) for x in iter_all_records(r.records or b"") if x.offset >= offset]
            if r.error_code != 0 or not records:
                return r.error_code, out
            out += records
            offset = records[-1][0] + 1
        raise AssertionError(f"broker {broker_id} kept serving partition {partition} past offset {offset}")

    def produce_to(self, broker_id: int, partition: int, value: bytes, timeout_ms: int = 4000,
                   topic: str | None = None) -> PartitionProduceResponse:
        """One acks=all Produce of ``value`` straight to ``broker_id`` (whoever it thinks leads)."""
        req = ProduceRequest(-1, timeout_ms, [TopicProduceData(topic or self.topic, [
            PartitionProduceData(partition, build_batch([value], timestamp_ms=int(time.time() * 1000)))])])
        body = self.ask(broker_id, ApiKey.PRODUCE, req, timeout=timeout_ms / 1000 + 10)
        return ProduceResponse.from_body(body).responses[0].partition_responses[0]

    def log_end_offset_of(self, broker_id: int, partition: int, topic: str | None = None) -> int | None:
        """``broker_id``'s own log end offset of ``partition`` (ListOffsets "latest" as the
        debugging replica, which any replica answers), or None when it has none."""
        return self._latest_from(broker_id, partition, DEBUGGING_REPLICA_ID, topic)

    def high_watermark_of(self, broker_id: int, partition: int, topic: str | None = None) -> int | None:
        """``broker_id``'s high watermark of ``partition`` (ListOffsets "latest" as a consumer)."""
        return self._latest_from(broker_id, partition, CONSUMER_REPLICA_ID, topic)

    def log_start_offset_of(self, broker_id: int, partition: int, topic: str | None = None) -> int | None:
        """``broker_id``'s own log start offset of ``partition`` (ListOffsets "earliest" as the
        debugging replica, which any replica answers), or None when it has none."""
        return self._latest_from(broker_id, partition, DEBUGGING_REPLICA_ID, topic, EARLIEST_TIMESTAMP)

    def _latest_from(self, broker_id: int, partition: int, replica_id: int, topic: str | None,
                     timestamp: int = LATEST_TIMESTAMP) -> int | None:
        req = ListOffsetsRequest([ListOffsetsTopic(topic or self.topic,
                                                   [ListOffsetsPartition(partition, timestamp)])],
                                 replica_id=replica_id)
        r = ListOffsetsResponse.from_body(self.ask(broker_id, ApiKey.LIST_OFFSETS, req)).topics[0].partitions[0]
        return r.offset if r.error_code == 0 else None

    def zookeeper(self) -> ZooKeeperView:
        """A client of the cluster's ZooKeeper (a context manager) for reading partition states."""
        return ZooKeeperView(self.cluster.zookeeper.connect_string)

    # -- the end -------------------------------------------------------------------------------

    def stop_workload(self, timeout: float = SETTLE_TIMEOUT_S) -> dict[int, int]:
        """Stop producing, settle every produce future, let the live consumers catch up to the
        high watermarks, stop them. Returns the high watermarks."""
        self.note("stopping the workload")
        self.producer.stop(timeout)
        self.note(f"producer stopped: {len(self.producer.acked)} acked, {len(self.producer.failed)} failed")
        ends = wait_until(lambda: self.end_offsets(), timeout, "the high watermarks")
        self.wait_consumed(ends, timeout)
        for c in self.consumers:
            c.stop()
        self._workload_stopped = True
        self.note(f"consumers caught up to {ends} and stopped")
        return ends

    def check(self, timeout: float = SETTLE_TIMEOUT_S) -> Report:
        """The oracle (after ``heal`` and ``stop_workload``). Stops every broker cleanly."""
        report = Report(self.name, timeline=self.timeline)
        report.isr_samples, report.isr_behind = self.isr_samples, list(self.isr_behind)
        prod = self.producer
        report.idempotent, report.retention_ms = prod.idempotent, self.retention_ms
        report.sent, report.acked, report.failed = prod.sent, len(prod.acked), len(prod.failed)
        report.failures_by_error = dict(Counter(f.error for f in prod.failed))
        final, starts = self.read_final_log(timeout)
        report.high_watermarks = {p: starts[p] + len(recs) for p, recs in final.items()}
        report.final_records = sum(len(recs) for recs in final.values())
        by_offset = check_final_log(final, report)
        self.final_log = by_offset
        check_acked(prod.acked, by_offset, starts, report)
        check_consumers(self.consumers, by_offset, starts, prod.acked, report)
        self.note("stopping every broker cleanly to read their segment files")
        for i in self.cluster.brokers:
            self.stop(i)
        replicas = read_replicas(self.cluster, self.topic, self.partitions, self.started_ms, self.stopped_ms)
        check_replicas(self.cluster, self.topic, replicas, by_offset, starts, report)
        verify_segments(self.cluster, self.topic, self.partitions, report)
        seen = [*self.log_starts, *(x for c in self.consumers for x in c.log_starts)]
        report.log_start_samples = len(seen)
        slack_ms = int(self.broker_setting("log.retention.check.interval.ms")) + RETENTION_SLACK_MS
        check_retention(replicas, seen, prod.acked, self.retention_ms, slack_ms,
                        logged_cut_points(self.cluster, self.topic), report)
        return report

    def read_final_log(self, timeout: float) -> tuple[dict[int, list[tuple[int, bytes | None]]], dict[int, int]]:
        """Every partition from its log start to its HW, through a fresh consumer: the records
        and the log starts they begin at (each also kept as a ``LogStart`` seen now). Retention
        deleting the head of a partition while it is read makes its read start again at the
        new log start."""
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        out: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(self.partitions)}
        deadline = time.monotonic() + timeout
        with Consumer(self.bootstrap, auto_offset_reset="none", fetch_max_wait_ms=100,
                      default_api_timeout_ms=30000, client_id="system-oracle") as c:
            ends = {tp.partition: off for tp, off in c.end_offsets(tps).items()}
            starts = self._log_starts_for(c, tps)
            c.assign(tps)
            for tp in tps:
                c.seek(tp, starts[tp.partition])
            next_offset = dict(starts)
            while any(next_offset[p] < ends[p] for p in ends):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the final log not read within {timeout} s: at {next_offset}, ends {ends}")
                try:
                    records = c.poll(timeout_ms=500)
                except OffsetOutOfRangeError:
                    for tp, start in self._log_starts_for(c, tps).items():
                        if start > next_offset[tp.partition]:
                            out[tp.partition], starts[tp.partition], next_offset[tp.partition] = [], start, start
                            c.seek(tp, start)
                    continue
                for r in records:
                    if r.offset < ends[r.partition]:
                        out[r.partition].append((r.offset, r.value))
                        next_offset[r.partition] = r.offset + 1
        self.note(f"final log read: log starts {starts}, HWs {ends}")
        return out, starts

    def _log_starts_for(self, c: Consumer, tps: list[TopicPartition]) -> dict[int, int]:
        starts = {tp.partition: off for tp, off in c.beginning_offsets(tps).items()}
        at = wall_ms()
        self.log_starts += [LogStart(at, p, off, "the final read") for p, off in starts.items()]
        return starts


# -- ZooKeeper's view and I8 ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition's state znode: ``{"leader", "leader_epoch", "isr", ...}`` and its version."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    version: int


class ZooKeeperView:
    """A plain kazoo client of the cluster's ZooKeeper (a context manager), read-only."""

    ROOT = "/tidelog"

    def __init__(self, connect_string: str):
        import logging

        from kazoo.client import KazooClient

        logging.getLogger("kazoo.client").setLevel(logging.ERROR)
        self.zk = KazooClient(hosts=connect_string, timeout=5)

    def __enter__(self) -> Self:
        self.zk.start(timeout=15)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            self.zk.stop()
            self.zk.close()

    def partition_state(self, topic: str, partition: int) -> PartitionState | None:
        import json

        from kazoo.exceptions import NoNodeError
        try:
            data, stat = self.zk.get(f"{self.ROOT}/brokers/topics/{topic}/partitions/{partition}/state")
        except NoNodeError:
            return None
        st = json.loads(data)
        return PartitionState(st["leader"], st["leader_epoch"], tuple(sorted(st["isr"])), stat.version)


class Sampler:
    """A thread (a context manager) that samples the cluster every ``interval`` seconds while
    a fault lasts: ``sample_round`` each time, inside ``session`` (opened once for the whole
    run), then ``record`` once it has stopped. An error that stopped the thread fails the exit
    (unless the block itself failed)."""

    what = "sampler"  # in the thread's name and the error

    def __init__(self, scenario: Scenario, interval: float):
        self.s, self.interval = scenario, interval
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"system-{self.what.replace(' ', '-')}", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self.record()
        if self.error is not None and exc[0] is None:
            raise AssertionError(f"the {self.what} failed: {self.error!r}") from self.error

    def session(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def sample_round(self, session: Any) -> None:
        raise NotImplementedError

    def record(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            with self.session() as session:
                while not self._stop.wait(self.interval):
                    self.sample_round(session)
        except BaseException as e:  # noqa: BLE001 -- reported on exit
            self.error = e


class IsrSampler(Sampler):
    """I8 while a fault lasts (a thread; a context manager): the ISR in ZooKeeper only holds
    replicas that have the committed prefix.

    One sample of a partition: its state znode (leader, epoch), the leader's high watermark
    HW, the state znode again (the ISR, skipped if the leader or epoch changed), then the log
    end offset of every ISR member, asked of that replica itself. Every member must have
    LEO >= HW. The order makes this exact, not a race: a replica in the ISR at the second read
    either was in the leader's ISR when HW was read (so HW <= its LEO then, and a LEO only
    grows while the replica stays in sync) or joined after, which takes LEO >= the HW of that
    later moment. The samples that saw each ISR are counted (``isrs``), so a test can show
    that the shrunk ISR was sampled too."""

    what = "ISR sampler"

    def __init__(self, scenario: Scenario, interval: float = 0.2):
        super().__init__(scenario, interval)
        self.behind: list[str] = []
        self.isrs: Counter = Counter()   # (partition, isr) -> samples

    def session(self) -> ZooKeeperView:
        return self.s.zookeeper()

    def sample_round(self, zk: ZooKeeperView) -> None:
        for p in range(self.s.partitions):
            with contextlib.suppress(OSError, TidelogError):
                self._sample(zk, p)

    def record(self) -> None:
        self.s.isr_samples += self.samples
        self.s.isr_behind += self.behind
        self.s.note(f"I8: {self.samples} samples of ZooKeeper's ISR and the replicas' LEOs, "
                    f"{len(self.behind)} violations; ISRs seen {dict(sorted(self.isrs.items()))}")

    def _sample(self, zk: ZooKeeperView, p: int) -> None:
        topic = self.s.topic
        before = zk.partition_state(topic, p)
        if before is None or before.leader < 0:
            return
        hw = self.s.high_watermark_of(before.leader, p)
        state = zk.partition_state(topic, p)
        if hw is None or state is None or (state.leader, state.leader_epoch) != (before.leader, before.leader_epoch):
            return
        leos = {r: self.s.log_end_offset_of(r, p) for r in state.isr}
        self.samples += 1
        self.isrs[(p, state.isr)] += 1
        behind = {r: leo for r, leo in leos.items() if leo is None or leo < hw}
        if behind:
            self.behind.append(f"partition {p}: ZooKeeper's ISR {list(state.isr)} (leader {state.leader}, epoch "
                               f"{state.leader_epoch}, znode version {state.version}) holds {behind} "
                               f"below the HW {hw}; LEOs {leos}")


class LogStartSampler(Sampler):
    """I11 (b) while a fault lasts (a thread; a context manager): every ``interval`` seconds,
    each running broker's own log start offset of every partition (ListOffsets "earliest" as
    the debugging replica), stamped with the wall clock once the answer arrived. Each value
    is kept when first seen: the oracle then checks that no acknowledged record below it was
    younger than retention.ms at that time, which bounds when a deletion happened to within
    an interval (the oracle's other sightings of log starts come later: consumer resets, the
    final read, the checkpoints once the brokers stopped)."""

    what = "log start sampler"

    def __init__(self, scenario: Scenario, interval: float = 0.5):
        super().__init__(scenario, interval)
        self.seen: list[LogStart] = []
        self._last: dict[tuple[int, int], int] = {}  # (broker, partition) -> the log start it had

    def sample_round(self, _: None) -> None:
        for b in self.s.running:
            for p in range(self.s.partitions):
                with contextlib.suppress(OSError, TidelogError):
                    offset = self.s.log_start_offset_of(b, p)
                    self.samples += 1
                    if offset is not None and self._last.get((b, p)) != offset:
                        self._last[b, p] = offset
                        self.seen.append(LogStart(wall_ms(), p, offset, f"broker {b}"))

    def record(self) -> None:
        self.s.log_starts += self.seen
        self.s.note(f"I11: {self.samples} samples of the replicas' log starts, {len(self.seen)} values seen")


# -- the oracle's checks -------------------------------------------------------------------------


def check_final_log(final: dict[int, list[tuple[int, bytes | None]]], report: Report) -> dict[int, dict[int, bytes | None]]:
    """I3 on the final log: offsets strictly increase without gaps; the producer's values are
    in their partition and in send order (an earlier value reappearing is a re-sent duplicate).
    I4: with an idempotent producer (``report.idempotent``) every duplicate is a violation."""
    by_offset: dict[int, dict[int, bytes | None]] = {}
    for p, records in final.items():
        by_offset[p] = dict(records)
        prev_offset, max_seq, seen = None, -1, {}
        for offset, value in records:
            if prev_offset is not None and offset != prev_offset + 1:
                report.misordered.append(f"partition {p}: offset {offset} follows {prev_offset}")
            prev_offset = offset
            parsed = parse_value(value)
            if parsed is None or parsed[0] != p:
                report.misordered.append(f"partition {p} offset {offset}: value {value!r} does not belong here")
                continue
            seq = parsed[1]
            if seq in seen:
                report.duplicates += 1
                if report.idempotent:
                    report.duplicated.append(f"partition {p}: {value!r} at offset {offset}, "
                                             f"first at offset {seen[seq]}")
            elif seq < max_seq:
                report.misordered.append(f"partition {p} offset {offset}: seq {seq} after seq {max_seq}")
            seen.setdefault(seq, offset)
            max_seq = max(max_seq, seq)
    return by_offset


def check_acked(acked: list[Ack], by_offset: dict[int, dict[int, bytes | None]], starts: dict[int, int],
                report: Report) -> None:
    """I1: every acknowledged record at or above its partition's final log start is at its
    offset. One below it was deleted by retention: I11 (b) checks it had expired."""
    for a in acked:
        if a.offset < starts.get(a.partition, 0):
            report.expired += 1
            continue
        found = by_offset.get(a.partition, {}).get(a.offset, b"<missing>")
        if found != a.value:
            report.lost.append(f"partition {a.partition} offset {a.offset}: acked {a.value!r}, found {found!r}")
            report.lost_records.append(a)


def check_consumers(consumers: list[ConsumerWorker], by_offset: dict[int, dict[int, bytes | None]],
                    starts: dict[int, int], acked: list[Ack], report: Report) -> None:
    """I6 (everything consumed at or above the final log start is in the final log; below it
    retention deleted what was read), no silent skips, and every acked record was consumed by
    every live consumer, but for those it jumped over when told OFFSET_OUT_OF_RANGE (I10)."""
    errors: Counter = Counter()
    distinct: set = set()
    for c in consumers:
        report.consumed += c.received
        distinct |= c.seen
        for ev in c.events:
            errors[ev.error] += 1
        report.out_of_range_resets += sum(1 for ev in c.events if ev.error == "OFFSET_OUT_OF_RANGE")
        for p, offset, value in sorted(c.seen, key=lambda x: (x[0], x[1])):
            if offset < starts.get(p, 0):
                continue
            found = by_offset.get(p, {}).get(offset, b"<missing>")
            if found != value:
                report.phantom.append(f"{c.name}: partition {p} offset {offset}: consumed {value!r}, "
                                      f"final log has {found!r}")
                report.phantom_records.append((c.name, p, offset))
        for p, expected, got in c.skips:
            if got > expected:
                report.silent_skips.append(f"{c.name}: partition {p}: expected offset {expected}, got {got}")
            else:
                report.misordered.append(f"{c.name}: partition {p}: expected offset {expected}, got {got} (went back)")
        seen_keys = {(p, o) for p, o, _ in c.seen}
        missing = [a for a in acked if (a.partition, a.offset) not in seen_keys
                   and not any(p == a.partition and lo <= a.offset < hi for p, lo, hi in c.told)]
        for a in missing:
            report.not_consumed.append(f"{c.name}: partition {a.partition} offset {a.offset} ({a.value!r})")
    report.consumed_distinct = len(distinct)
    report.consumer_errors = dict(errors)


@dataclass(frozen=True, slots=True)
class ReplicaOnDisk:
    """One replica as its broker left it on disk after a clean stop."""

    broker: int
    partition: int
    log_start: int | None        # its log-start-offset-checkpoint (None: not checkpointed)
    high_watermark: int | None   # its replication-offset-checkpoint
    segments: list[SegmentFile]
    started_ms: float            # wall clock: its broker's last start
    stopped_ms: float            # wall clock: its broker's clean stop was over

    @property
    def where(self) -> str:
        return f"partition {self.partition} broker {self.broker}"


def read_replicas(cluster: DevCluster, topic: str, partitions: int, started_ms: dict[int, float],
                  stopped_ms: dict[int, float]) -> list[ReplicaOnDisk]:
    """Every replica of ``topic`` that a broker's log dir holds, with its checkpoints."""
    out = []
    for b in cluster.brokers:
        starts, hws = checkpointed_log_starts(cluster, b), checkpointed_high_watermarks(cluster, b)
        stopped = stopped_ms.get(b, wall_ms())
        for p in range(partitions):
            if (log_dir(cluster, b) / f"{topic}-{p}").is_dir():
                out.append(ReplicaOnDisk(b, p, starts.get((topic, p)), hws.get((topic, p)),
                                         replica_segments(cluster, b, topic, p), started_ms.get(b, stopped), stopped))
    return out


def check_replicas(cluster: DevCluster, topic: str, replicas: list[ReplicaOnDisk],
                   by_offset: dict[int, dict[int, bytes | None]], starts: dict[int, int], report: Report) -> None:
    """I2: below the smallest checkpointed HW, every replica's segments hold the same records,
    which are also what the consumer read: from the later of the final log's start and the
    replica's own log start (retention deleted below them; I11 checks that)."""
    for p in sorted(starts):
        holders = [r for r in replicas if r.partition == p]
        limits = [r.high_watermark for r in holders]
        if not holders or None in limits:
            report.diverged.append(f"partition {p}: replicas on {[r.broker for r in holders]}, "
                                   f"checkpointed HWs {limits}")
            continue
        limit = min(limits)
        for r in holders:
            lo = max(starts[p], r.log_start or 0)
            reference = [(o, by_offset[p].get(o, b"<missing>")) for o in range(lo, limit)]
            records = [(o, v) for o, v in replica_records(cluster, r.broker, topic, p) if lo <= o < limit]
            b = r.broker
            report.replicas_compared += 1
            if records != reference:
                first = next((i for i, (x, y) in enumerate(zip(records, reference)) if x != y),
                             min(len(records), len(reference)))
                report.diverged.append(
                    f"partition {p} broker {b}: in [{lo}, HW {limit}) it holds {len(records)} records, the log "
                    f"{len(reference)}; first difference at #{first}: "
                    f"{records[first] if first < len(records) else None} vs "
                    f"{reference[first] if first < len(reference) else None}")


def verify_segments(cluster: DevCluster, topic: str, partitions: int, report: Report) -> None:
    """I5: ``dump-log --verify`` on every segment (and its indexes) of every replica."""
    for b in cluster.brokers:
        for p in range(partitions):
            d = log_dir(cluster, b) / f"{topic}-{p}"
            logs = sorted(str(x) for x in d.glob("*.log"))
            if not logs:
                continue
            out = io.StringIO()
            status = dump.run(logs, verify=True, out=out, err=out)
            report.segments_verified += len(logs)
            if status != dump.EXIT_OK:
                problems = [line for line in out.getvalue().splitlines() if "ERROR" in line or "error" in line]
                report.corrupt.append(f"broker {b} {topic}-{p}: {problems[:5]}")



# -- I11: retention deletes only whole, expired segments ------------------------------------------

# What I11's liveness (c) allows beyond retention.ms and log.retention.check.interval.ms: a
# broker's start-up (its retention runs an interval after it is up) and a loaded machine.
RETENTION_SLACK_MS = 10_000


def check_retention(replicas: list[ReplicaOnDisk], seen: list[LogStart], acked: list[Ack], retention_ms: int,
                    slack_ms: int, logged_cuts: dict[int, set[int]], report: Report) -> None:
    """I11 over every replica on disk, the log starts seen while the scenario ran and every
    acknowledged record's timestamp: (a) each log start is a segment boundary, (b) nothing
    was deleted before it expired, (c) whatever expired was deleted."""
    report.log_starts = {}
    for r in replicas:
        report.log_starts.setdefault(r.partition, {})[r.broker] = r.log_start
    check_log_starts_at_boundaries(replicas, logged_cuts, report)
    checkpointed = [LogStart(r.stopped_ms, r.partition, r.log_start, f"broker {r.broker}'s checkpoint")
                    for r in replicas if r.log_start is not None]
    check_nothing_deleted_early([*seen, *checkpointed], acked, retention_ms, report)
    check_expired_segments_deleted(replicas, retention_ms, slack_ms, report)


def check_log_starts_at_boundaries(replicas: list[ReplicaOnDisk], logged_cuts: dict[int, set[int]],
                                   report: Report) -> None:
    """I11 (a): a replica's checkpointed log start lies within its segments (nothing between
    it and the first segment's base offset is missing) and is a segment boundary: the base
    offset of one of its segments (the first, or a later one while those below it wait for
    the next retention run), or its log end. A follower follows its leader's log start, which
    may fall inside a segment of its own where their segments do not line up: that is allowed
    at a boundary of another replica, on disk or where a broker logged cutting its log."""
    cuts: dict[int, set[int]] = {}
    for r in replicas:
        cuts.setdefault(r.partition, set(logged_cuts.get(r.partition, ()))).update(segment_boundaries(r))
    for r in replicas:
        if not r.segments or r.log_start is None:
            report.cut_inside.append(f"{r.where}: {len(r.segments)} segments, log start {r.log_start} checkpointed")
            continue
        first, end = r.segments[0].base_offset, r.segments[-1].next_offset
        if not first <= r.log_start <= end:
            report.cut_inside.append(f"{r.where}: log start {r.log_start} outside its segments [{first}, {end})")
        elif r.log_start not in cuts[r.partition]:
            seg = next(x for x in r.segments if x.base_offset <= r.log_start < x.next_offset)
            report.cut_inside.append(f"{r.where}: log start {r.log_start} inside its segment [{seg.base_offset}, "
                                     f"{seg.next_offset}), at no segment boundary of any replica")


def segment_boundaries(r: ReplicaOnDisk) -> set[int]:
    return {s.base_offset for s in r.segments} | {s.next_offset for s in r.segments}


def check_nothing_deleted_early(seen: list[LogStart], acked: list[Ack], retention_ms: int, report: Report) -> None:
    """I11 (b): a log start L seen at time t means every offset below L was deleted by then,
    so every acknowledged record below L must have been older than retention.ms at t (its
    timestamp at most t - retention.ms); with retention.ms -1 nothing may be deleted."""
    ordered: dict[int, list[Ack]] = {}
    for a in sorted(acked, key=lambda a: (a.partition, a.offset)):
        ordered.setdefault(a.partition, []).append(a)
    offsets = {p: [a.offset for a in acks] for p, acks in ordered.items()}
    newest: dict[int, list[Ack]] = {}  # per partition, the newest ack among the first i + 1
    for p, acks in ordered.items():
        newest[p] = list(itertools.accumulate(acks, lambda x, y: y if y.timestamp > x.timestamp else x))
    reported: set[tuple[int, int]] = set()
    for ls in sorted(seen, key=lambda x: x.at_ms):
        i = bisect.bisect_left(offsets.get(ls.partition, []), ls.offset)
        if i == 0:
            continue
        a = newest[ls.partition][i - 1]
        if (retention_ms >= 0 and a.timestamp <= ls.at_ms - retention_ms) or (a.partition, a.offset) in reported:
            continue
        reported.add((a.partition, a.offset))
        report.deleted_early.append(
            f"partition {ls.partition}: log start {ls.offset} ({ls.source}) at {ls.at_ms:.0f}: acked offset "
            f"{a.offset} ({a.value!r}) below it was {ls.at_ms - a.timestamp:.0f} ms old, retention.ms {retention_ms}")


def check_expired_segments_deleted(replicas: list[ReplicaOnDisk], retention_ms: int, slack_ms: int,
                                   report: Report) -> None:
    """I11 (c), liveness: a segment below the replica's high watermark (retention deletes
    nothing above it) whose newest record expired (retention.ms) at least ``slack_ms`` before
    its broker stopped, and after that broker had been up for ``slack_ms``, is gone."""
    if retention_ms < 0:
        return
    for r in replicas:
        kept = [s for s in r.segments if 0 <= s.max_timestamp and r.high_watermark is not None
                and s.next_offset <= r.high_watermark
                and max(s.max_timestamp + retention_ms, r.started_ms) + slack_ms < r.stopped_ms]
        if kept:
            s = kept[0]
            report.kept_expired.append(
                f"{r.where}: {len(kept)} expired segments kept, the first [{s.base_offset}, {s.next_offset}) with "
                f"its newest record {r.stopped_ms - s.max_timestamp:.0f} ms old when the broker stopped "
                f"(retention.ms {retention_ms}, slack {slack_ms} ms, up for {r.stopped_ms - r.started_ms:.0f} ms)")


def logged_cut_points(cluster: DevCluster, topic: str) -> dict[int, set[int]]:
    """Per partition, every offset at which a broker logged cutting the log's head: the
    offset after a segment it deleted, or the offset a follower restarted its log at."""
    pattern = re.compile(rf"\b{re.escape(topic)}-(\d+): (?:deleting segment \d+ \(\d+ bytes, offsets below (\d+)\)"
                         rf"|truncated fully, restarting at offset (\d+))")
    cuts: dict[int, set[int]] = {}
    for b in cluster.brokers.values():
        with contextlib.suppress(FileNotFoundError):
            for m in pattern.finditer(Path(b.log_path).read_text(errors="replace")):
                cuts.setdefault(int(m.group(1)), set()).add(int(m.group(2) or m.group(3)))
    return cuts
