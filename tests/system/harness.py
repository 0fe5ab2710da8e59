"""The fault-matrix harness: a real 3-broker cluster under steady load, fault injection, and
the oracle of RELIABILITY.md.

A ``Scenario`` (a context manager) starts ZooKeeper and three broker processes in a temporary
directory with small timeouts (``SYSTEM_CONFIG``), creates a topic (3 partitions, replication
factor 3, min.insync.replicas 2, unclean leader election off unless the test says otherwise)
and runs the workload in background threads:

* one acks=all ``Producer`` (``max_in_flight_requests_per_connection`` 1, so its records keep
  their send order per partition) sends unique, sequence-numbered values
  (``b"<partition>:<seq>"``, round-robin over the partitions) at a bounded rate and records
  every acknowledged ``(partition, offset, value)`` and every failure with its error;
* one or two live ``Consumer`` threads are assigned every partition from offset 0 and record
  every ``(partition, offset, value)`` they receive. As a real application would, they seek
  back to the beginning on OFFSET_OUT_OF_RANGE (auto_offset_reset "none", so every such reset
  is seen and recorded) and re-seek a partition after any other error.

Faults are injected with ``stop`` (SIGTERM: controlled shutdown), ``kill`` (SIGKILL),
``pause``/``resume`` (SIGSTOP/SIGCONT) and ``start``; each is written to a timeline that is
printed with the report. Network faults need ``Scenario(..., network=True)``: every broker
then runs in its own network namespace with its own address on a bridge, ZooKeeper and the
test's clients on two addresses of the bridge (``netlab``, which explains the mechanism), and
``cut(a, b)`` drops every packet between two brokers, ``isolate(b)`` every packet between a
broker and ZooKeeper or another broker, while clients still reach every broker; ``heal``
removes the cuts. ``IsrSampler`` checks I8 while a fault lasts: every replica in the ISR that
ZooKeeper holds has a log end offset (asked of that replica) at or past the leader's high
watermark. ``produce_to``, ``read_from``, ``high_watermark_of`` and ``log_end_offset_of`` ask
one broker directly (no metadata, no retries), to see what a zombie leader does. Who leads a
partition and who is the controller is read from the
metadata of every running broker, and only a view they all agree on counts (a broker's cache
lags the controller by one UpdateMetadata). Every wait polls a condition under a deadline.

``heal`` restarts what was stopped and waits until every replica is back in its ISR;
``stop_workload`` stops producing, settles every produce future and lets the consumers catch
up to the high watermarks; ``check`` is the oracle, which also stops every broker cleanly to
read their segment files:

* I1  every acknowledged (partition, offset, value) is at that offset when each partition is
      read by a fresh consumer from its start to its high watermark;
* I3  offsets strictly increase (and are contiguous); per partition, the producer's values
      appear in send order (re-sent duplicates, possible without idempotence, are counted);
* I6  every record a live consumer received is in the final log at the same offset with the
      same value, and no consumer skipped an offset without having been told (an
      out-of-range error) -- I10's "never a silent skip";
* I2  after a clean stop of every broker, every replica's segment files, read from disk,
      agree record by record (with each other and with what the consumer read) up to the
      smallest high watermark in the replicas' replication-offset-checkpoint files;
* I5  ``dump-log --verify`` finds no problem in any segment of any replica;
* I8  (when an ``IsrSampler`` ran) no sample found an ISR member below the high watermark.

The ``Report`` carries the counts (acked, consumed, lost, diverged, ...) and the first few
examples of each violation; ``Report.assert_ok`` fails with the whole report.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

from tests.support import waiting
from tests.support.cluster import dump_logs, dump_zookeeper
from tests.support.disk import checkpointed_high_watermarks, log_dir, replica_records
from tests.support.waiting import NotYet
from tests.system.netlab import NetworkLab
from tidelog import Admin, Consumer, NewTopic, Producer, TidelogError, TopicPartition
from tidelog.broker import health
from tidelog.broker.devcluster import DevCluster, metadata
from tidelog.broker.log import dump
from tidelog.errors import OffsetOutOfRangeError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.messages import (
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
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
    the partitions, every outcome recorded by its future's callback."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int, **config: Any):
        self.topic, self.partitions, self.rate = topic, partitions, rate
        config = {"acks": "all", "max_in_flight_requests_per_connection": 1, "linger_ms": 5,
                  "request_timeout_ms": 10000, "delivery_timeout_ms": 60000, "retry_backoff_ms": 100,
                  "max_block_ms": 20000, "client_id": "system-producer", **config}
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
            self.acked.append(Ack(p, md.offset, value, seq, time.monotonic()))

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
        self.producer = _ConfluentProducer(confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "request.timeout.ms": 10000, "delivery.timeout.ms": 60000, "retry.backoff.ms": 100,
            "client.id": "system-kafka-producer", **config}))
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
                    self.acked.append(Ack(p, message.offset(), value, seq, time.monotonic()))

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


_PARTITION_IN_MESSAGE = re.compile(r"partition (\S+)-(\d+)\b")


class ConsumerWorker:
    """A live consumer (a thread) reading every partition from offset 0, recording each
    (partition, offset, value) and every error; it resets to the beginning on
    OFFSET_OUT_OF_RANGE and re-seeks a partition at its position after other errors."""

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
        self.events: list[ConsumerEvent] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.consumer.assign(self.tps)
        for tp in self.tps:
            self.consumer.seek(tp, 0)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
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
        """What a consumer with auto.offset.reset=earliest does, made visible."""
        p = self._partition_of(e)
        self._event(p, e)
        for tp in self.tps if p is None else [self.tps[p]]:
            self.consumer.seek_to_beginning(tp)
            with self._lock:
                self.next_offset[tp.partition] = self._earliest(tp)

    def _earliest(self, tp: TopicPartition) -> int:
        # the position the consumer resets to; offsets before it were not skipped silently
        try:
            return self.consumer.beginning_offsets([tp], timeout_ms=5000)[tp]
        except TidelogError:
            return 0

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
    duplicates: int = 0          # producer values in the final log more than once (retries)
    out_of_range_resets: int = 0
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
    isr_samples: int = 0         # I8 samples of ZooKeeper's ISR and the replicas' LEOs (IsrSampler)
    replicas_compared: int = 0
    segments_verified: int = 0
    lost_records: list[Ack] = field(default_factory=list)  # the acks behind ``lost``
    phantom_records: list[tuple[str, int, int]] = field(default_factory=list)  # (consumer, partition, offset)
    timeline: list[str] = field(default_factory=list)

    COUNTS = ("lost", "misordered", "phantom", "silent_skips", "not_consumed", "diverged", "corrupt",
              "isr_behind")

    def count(self, what: str) -> int:
        return len(getattr(self, what))

    def violations(self, ignore: Iterable[str] = ()) -> dict[str, int]:
        return {k: self.count(k) for k in self.COUNTS if k not in ignore and self.count(k)}

    def summary(self) -> str:
        lines = [(f"== {self.name}: sent {self.sent}, acked {self.acked}, failed {self.failed} "
                  f"{dict(self.failures_by_error)}, consumed {self.consumed} ({self.consumed_distinct} distinct), "
                  f"final log {self.final_records} records, HWs {self.high_watermarks}, "
                  f"duplicates {self.duplicates}, out-of-range resets {self.out_of_range_resets}, "
                  f"consumer errors {dict(self.consumer_errors)}, replicas compared {self.replicas_compared}, "
                  f"segments verified {self.segments_verified}, ISR samples {self.isr_samples}"),
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
                 network: bool = False, producer_config: dict[str, Any] | None = None,
                 kafka_producer: bool = False):
        """``network``: run every broker in its own network namespace (``netlab``), so that
        ``cut`` and ``isolate`` can partition the network. ``producer_config``: options of the
        steady producer that differ from ``ProducerWorker``'s. ``kafka_producer``: the steady
        producer is confluent-kafka on the brokers' Kafka listeners (``KafkaProducerWorker``)."""
        self.kafka_producer = kafka_producer
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
                self.lab.create()
                self.note(f"network lab: {self.lab.describe()}")
            self.note("starting ZooKeeper and 3 brokers")
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

    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     config: dict[str, str] | None = None, timeout: float = ELECTION_TIMEOUT_S) -> None:
        with self.admin() as admin:
            admin.create_topics([NewTopic(name, partitions, replication_factor, config=dict(config or {}))])
        self.wait_isr_full(topic=name, partitions=partitions, timeout=timeout)
        self.note(f"topic {name!r} created: {partitions} partitions, RF {replication_factor}, {config}")

    def start_workload(self) -> None:
        if self.kafka_producer:
            self.producer = KafkaProducerWorker(self.cluster.kafka_bootstrap, self.topic, self.partitions,
                                                self.rate, **self.producer_config)
        else:
            self.producer = ProducerWorker(self.bootstrap, self.topic, self.partitions, self.rate,
                                           **self.producer_config)
        self.consumers = [ConsumerWorker(self.bootstrap, self.topic, self.partitions, f"system-consumer-{i}")
                          for i in range(self.n_consumers)]
        self.producer.start()
        for c in self.consumers:
            c.start()
        self.note(f"workload started: {self.rate} records/s, {self.n_consumers} consumers")

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
        topic = topic or self.topic
        with Consumer(self.bootstrap, default_api_timeout_ms=timeout_ms) as c:
            ends = c.end_offsets([TopicPartition(topic, p) for p in range(self.partitions)], timeout_ms=timeout_ms)
        return {tp.partition: off for tp, off in ends.items()}

    # -- faults --------------------------------------------------------------------------------

    def stop(self, broker_id: int) -> None:
        self.note(f"SIGTERM broker {broker_id} (controlled shutdown)")
        status = self.cluster.brokers[broker_id].stop(60.0)
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
            self.note("network: every cut and slow link removed")
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

    def _latest_from(self, broker_id: int, partition: int, replica_id: int, topic: str | None) -> int | None:
        req = ListOffsetsRequest([ListOffsetsTopic(topic or self.topic,
                                                   [ListOffsetsPartition(partition, LATEST_TIMESTAMP)])],
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
        report.sent, report.acked, report.failed = prod.sent, len(prod.acked), len(prod.failed)
        report.failures_by_error = dict(Counter(f.error for f in prod.failed))
        final = self.read_final_log(timeout)
        report.high_watermarks = {p: len(recs) for p, recs in final.items()}
        report.final_records = sum(len(recs) for recs in final.values())
        by_offset = check_final_log(final, report)
        self.final_log = by_offset
        check_acked(prod.acked, by_offset, report)
        check_consumers(self.consumers, by_offset, prod.acked, report)
        self.note("stopping every broker cleanly to read their segment files")
        for i in self.cluster.brokers:
            self.stop(i)
        check_replicas(self.cluster, self.topic, self.partitions, by_offset, report)
        verify_segments(self.cluster, self.topic, self.partitions, report)
        return report

    def read_final_log(self, timeout: float) -> dict[int, list[tuple[int, bytes | None]]]:
        """Every partition from its log start to its HW, through a fresh consumer."""
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        out: dict[int, list[tuple[int, bytes | None]]] = {p: [] for p in range(self.partitions)}
        deadline = time.monotonic() + timeout
        with Consumer(self.bootstrap, auto_offset_reset="none", fetch_max_wait_ms=100,
                      default_api_timeout_ms=30000, client_id="system-oracle") as c:
            ends = {tp.partition: off for tp, off in c.end_offsets(tps).items()}
            starts = {tp.partition: off for tp, off in c.beginning_offsets(tps).items()}
            c.assign(tps)
            for tp in tps:
                c.seek(tp, starts[tp.partition])
            next_offset = dict(starts)
            while any(next_offset[p] < ends[p] for p in ends):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the final log not read within {timeout} s: at {next_offset}, ends {ends}")
                for r in c.poll(timeout_ms=500):
                    if r.offset < ends[r.partition]:
                        out[r.partition].append((r.offset, r.value))
                        next_offset[r.partition] = r.offset + 1
        self.note(f"final log read: log starts {starts}, HWs {ends}")
        return out


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


class IsrSampler:
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

    def __init__(self, scenario: Scenario, interval: float = 0.2):
        self.s, self.interval = scenario, interval
        self.samples = 0
        self.behind: list[str] = []
        self.isrs: Counter = Counter()   # (partition, isr) -> samples
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="system-isr-sampler", daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        self.s.isr_samples += self.samples
        self.s.isr_behind += self.behind
        self.s.note(f"I8: {self.samples} samples of ZooKeeper's ISR and the replicas' LEOs, "
                    f"{len(self.behind)} violations; ISRs seen {dict(sorted(self.isrs.items()))}")
        if self.error is not None and exc[0] is None:
            raise AssertionError(f"the ISR sampler failed: {self.error!r}") from self.error

    def _run(self) -> None:
        try:
            with self.s.zookeeper() as zk:
                while not self._stop.wait(self.interval):
                    for p in range(self.s.partitions):
                        with contextlib.suppress(OSError, TidelogError):
                            self._sample(zk, p)
        except BaseException as e:  # noqa: BLE001 -- reported on exit
            self.error = e

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


# -- the oracle's checks -------------------------------------------------------------------------


def check_final_log(final: dict[int, list[tuple[int, bytes | None]]], report: Report) -> dict[int, dict[int, bytes | None]]:
    """I3 on the final log: offsets strictly increase without gaps; the producer's values are
    in their partition and in send order (an earlier value reappearing is a re-sent duplicate)."""
    by_offset: dict[int, dict[int, bytes | None]] = {}
    for p, records in final.items():
        by_offset[p] = dict(records)
        prev_offset, max_seq, seen = None, -1, set()
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
            elif seq < max_seq:
                report.misordered.append(f"partition {p} offset {offset}: seq {seq} after seq {max_seq}")
            seen.add(seq)
            max_seq = max(max_seq, seq)
    return by_offset


def check_acked(acked: list[Ack], by_offset: dict[int, dict[int, bytes | None]], report: Report) -> None:
    """I1: every acknowledged record is at its offset."""
    for a in acked:
        found = by_offset.get(a.partition, {}).get(a.offset, b"<missing>")
        if found != a.value:
            report.lost.append(f"partition {a.partition} offset {a.offset}: acked {a.value!r}, found {found!r}")
            report.lost_records.append(a)


def check_consumers(consumers: list[ConsumerWorker], by_offset: dict[int, dict[int, bytes | None]],
                    acked: list[Ack], report: Report) -> None:
    """I6 (everything consumed is in the final log), no silent skips, and every acked record
    was consumed by every live consumer."""
    errors: Counter = Counter()
    distinct: set = set()
    for c in consumers:
        report.consumed += c.received
        distinct |= c.seen
        for ev in c.events:
            errors[ev.error] += 1
        report.out_of_range_resets += sum(1 for ev in c.events if ev.error == "OFFSET_OUT_OF_RANGE")
        for p, offset, value in sorted(c.seen, key=lambda x: (x[0], x[1])):
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
        missing = [a for a in acked if (a.partition, a.offset) not in seen_keys]
        for a in missing:
            report.not_consumed.append(f"{c.name}: partition {a.partition} offset {a.offset} ({a.value!r})")
    report.consumed_distinct = len(distinct)
    report.consumer_errors = dict(errors)


def check_replicas(cluster: DevCluster, topic: str, partitions: int,
                   by_offset: dict[int, dict[int, bytes | None]], report: Report) -> None:
    """I2: below the smallest checkpointed HW, every replica's segments hold the same records,
    which are also what the consumer read."""
    hws = {b: checkpointed_high_watermarks(cluster, b) for b in cluster.brokers}
    for p in range(partitions):
        holders = [b for b in cluster.brokers if (log_dir(cluster, b) / f"{topic}-{p}").is_dir()]
        limits = [hws[b].get((topic, p)) for b in holders]
        if not holders or None in limits:
            report.diverged.append(f"partition {p}: replicas on {holders}, checkpointed HWs {limits}")
            continue
        limit = min(limits)
        reference = [(o, by_offset[p].get(o, b"<missing>")) for o in range(limit)]
        for b in holders:
            records = [(o, v) for o, v in replica_records(cluster, b, topic, p) if o < limit]
            report.replicas_compared += 1
            if records != reference:
                first = next((i for i, (x, y) in enumerate(zip(records, reference)) if x != y),
                             min(len(records), len(reference)))
                report.diverged.append(
                    f"partition {p} broker {b}: below HW {limit} it holds {len(records)} records, the log "
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

