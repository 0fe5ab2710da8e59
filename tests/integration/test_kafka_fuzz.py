"""The Kafka listener's fuzzer against a real broker process: ``tests.support.kafka_fuzz``
throws requests of every API of ``KAFKA_APIS`` at every served version, with values at
their extremes, mutated Kafka record batches, byte-mutated frames (lengths, counts, tagged
fields, versions, API keys, headers), and random byte streams at the Kafka listener.

One single-broker cluster with a Kafka listener for the module (``socket.request.max.bytes``
1 MiB, no topic auto-creation, groups that rebalance at once). The inputs name only the fuzz
topics and groups; a well-behaved Kafka client (confluent-kafka) produces to a topic of its
own.

Asserted: the broker never exits; every answer is a well-formed Kafka response to the
request awaiting one, in order; the broker closes a connection only after a frame its
decoder refuses, and always does then; nothing waits ``HANG_S`` unanswered; no answer says
UNKNOWN_SERVER_ERROR; the well-behaved client, every two seconds while the fuzzer's requests
are in flight, produces one record through the Kafka listener; at the end confluent-kafka
and the Tidelog SDK both read back every acknowledged record (and records the SDK produces),
the broker stops cleanly, and its log holds no traceback and no ERROR line.

Reported, not failed: the slowest answers, and the log cleaner's abandoned cleanings (a
compacted partition whose log start DeleteRecords moved into its active segment is retried
in a loop: ``_cleanings_abandoned``).

In CI: FIXED_SEED then a random seed (printed), SLICE_SECONDS in all. By hand, for hours::

    pytest -m integration tests/integration/test_kafka_fuzz.py --fuzz-seconds 3600 [--fuzz-seed 7] -s

A finding names its seed, lane and input number: ``tests.support.kafka_fuzz.replay``
rebuilds it (``replay(seed, lane, number, lane_kind)``).
"""

from __future__ import annotations

import re
import time

import pytest

from tests.support import fuzz_lanes
from tests.support.cluster import log_tail
from tests.support.fuzz_lanes import MAX_FRAME, consume_all, create_topics, fuzz_cluster, report_head
from tests.support.kafka_fuzz import Driver, Names, Stats, bombs
from tidelog import Producer

confluent_kafka = pytest.importorskip("confluent_kafka")

FIXED_SEED = 9092
SLICE_SECONDS = 30.0  # CI time: the native slice is 24 s; a longer run by hand finds more
HANG_S = 30.0
GOOD_TOPIC = "kafka-steady"
NAMES = Names()
# what a broker log must never hold: a traceback, an ERROR line, a failed handler
LOG_NEEDLES = ("Traceback", " ERROR ", "handler failed on", "does not encode", "unexpected error on the connection")


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from fuzz_cluster(request, tmp_path_factory.mktemp("kafka-fuzz"), kafka=True)


class GoodClient:
    """A well-behaved Kafka client (confluent-kafka, acks=all, idempotent) on connections of
    its own: each check produces one record to partition 0 and waits for its offset."""

    def __init__(self, cluster):
        self.producer = confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
                                                  "enable.idempotence": True, "linger.ms": 0,
                                                  "message.timeout.ms": 30000})
        self.values: list[bytes] = []

    def check(self) -> None:
        value = b"good-%d" % len(self.values)
        delivered: list = []
        self.producer.produce(GOOD_TOPIC, value, partition=0, on_delivery=lambda err, msg: delivered.append(
            (err, msg.offset() if err is None else None)))
        assert self.producer.flush(30) == 0, "the record was not delivered within 30 s"
        assert delivered == [(None, len(self.values))], delivered
        self.values.append(value)

    def close(self) -> None:
        """Let the producer go before the broker stops (librdkafka would retry it noisily)."""
        self.producer.flush(10)
        self.producer = None


@pytest.fixture(scope="module")
def good(cluster):
    create_topics(cluster, NAMES, GOOD_TOPIC)
    client = GoodClient(cluster)
    client.check()
    yield client


@pytest.fixture
def plan(request) -> list[tuple[int, float]]:
    return fuzz_lanes.plan(request.config, FIXED_SEED, SLICE_SECONDS)


def report(seed: int, stats: Stats) -> str:
    lines = [report_head("kafka fuzz", seed, stats),
             f"  inputs: {dict(stats.inputs)}",
             f"  requests that decode, by API and version: {len(stats.apis)} of them, "
             f"{dict(sorted(stats.apis.items()))}",
             f"  mutations: {dict(sorted(stats.mutations.items()))}",
             f"  error codes: {dict(stats.errors.most_common())}",
             f"  refusals (connection closed): {dict(stats.refusals.most_common(12))}",
             f"  requests unanswered before a close: {stats.unanswered_before_close}, valid requests over the "
             f"decoder's object bound (closed, counted): {stats.dense}",
             f"  reproduce: --fuzz-seed {seed} --fuzz-seconds {stats.seconds:.0f}"]
    lines += [f"  slowest answer: {t:.1f} s to {what}" for t, what in stats.slowest]
    lines += [f"  FINDING {f}" for f in stats.findings]
    return "\n".join(lines)


def test_kafka_fuzzing_never_kills_poisons_or_starves_the_broker(cluster, good, plan, capsys):
    broker = cluster.brokers[1]
    host, port = cluster.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    assert host in ("127.0.0.1", "localhost"), cluster.kafka_bootstrap
    bombs()  # made once, before the clock runs
    drivers = []
    for seed, seconds in plan:
        with capsys.disabled():
            print(f"\nfuzzing the Kafka listener with seed {seed} for {seconds:g} s")
        driver = Driver(int(port), seed, seconds=seconds, names=NAMES, max_frame_bytes=MAX_FRAME, hang_s=HANG_S,
                        check=good.check, alive=lambda: broker.running)
        drivers.append(driver)
        stats = driver.run()
        with capsys.disabled():
            print(report(seed, stats))
            print(f"  log cleaner cleanings abandoned so far (counted, not failed): {_cleanings_abandoned(broker.log_path)}")
        logged = _log_findings(broker.log_path, drivers)
        assert stats.total > 0 and stats.checks > 0
        assert not stats.findings and not logged, "\n".join(stats.findings) + "\nbroker log:\n" + logged
    assert broker.running, "the broker process exited"
    good.check()

    # the Tidelog SDK produces beside it, and both clients read back every acknowledged record
    sdk_values = [b"sdk-%d" % i for i in range(3)]
    with Producer(cluster.bootstrap, acks="all") as producer:
        for v in sdk_values:
            producer.send(GOOD_TOPIC, v, partition=0)
        producer.flush(60)
    expected = good.values + sdk_values
    assert _confluent_read(cluster, len(expected)) == expected
    assert consume_all(cluster, GOOD_TOPIC, len(expected), "every acknowledged record consumed by the SDK") == expected
    good.close()

    # a clean stop, and nothing in the log
    assert broker.stop(60) == 0, log_tail(broker.log_path, 60)
    findings = _log_findings(broker.log_path, drivers)
    assert not findings, findings


def _confluent_read(cluster, count: int) -> list[bytes]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "kfuzz-reader",
                                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([confluent_kafka.TopicPartition(GOOD_TOPIC, 0, confluent_kafka.OFFSET_BEGINNING)])
        got: list[bytes] = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.value())
        return got
    finally:
        consumer.close()


def _cleanings_abandoned(log_path) -> dict[str, int]:
    """How many cleanings of each partition the log cleaner abandoned. Counted, not failed: a
    partition whose log start a DeleteRecords moved into its active segment, compacted
    afterwards, is picked and abandoned again and again (the active segment counts as
    cleanable, and the swap refuses it), which starves every connection for seconds."""
    counts: dict[str, int] = {}
    for m in _ABANDONED.finditer(log_path.read_text(errors="replace")):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


_ABANDONED = re.compile(r"cleaning of (\S+) abandoned")
_PEER = re.compile(r"127\.0\.0\.1(?::|', )(\d+)")  # the broker logs a peer as host:port
_REQUEST = re.compile(r"(?:request|response) (\d+) (?:from|for)")


def _log_findings(log_path, drivers: list[Driver]) -> str:
    """The broker log's tracebacks and ERROR lines, each with the lane and input that
    preceded it (a log line names the peer's port, and a failed handler the correlation id,
    which is the input's number)."""
    text = log_path.read_text(errors="replace")
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if not any(n in line for n in LOG_NEEDLES) or "Traceback" in line and i and any(
                n in lines[i - 1] for n in LOG_NEEDLES):
            continue
        context = "\n".join(lines[max(0, i - 2):i + 25])
        who = []
        for d in drivers:
            for m in _PEER.finditer(line):
                who.append(f"seed {d.seed}: {d.inputs_on(int(m.group(1)))}")
        if (m := _REQUEST.search(line)) is not None:
            who.append(f"input number {m.group(1)} of that lane (correlation id = input number)")
        out.append(context + "\n  " + ("\n  ".join(who) or "no lane named"))
        if len(out) >= 5:
            break
    return "\n\n".join(out)
