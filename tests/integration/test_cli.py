"""The client commands of the ``tidelog`` CLI (topics, produce, consume, perf) against a real
cluster: one DevCluster (ZooKeeper + 3 broker processes on free ports) for the module.

Commands run in-process through ``tidelog.broker.cli.main`` (output captured with capsys); one
produce runs as a subprocess to feed the real entry point a stdin pipe. The test that stops a
broker runs last and starts it again.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from tidelog import Admin, Producer, TopicPartition
from tidelog.broker.cli import main
from tidelog.broker.devcluster import DevCluster, metadata
from tidelog.perf import Latency, Throttler, consume, produce

PARTITION_LINE = re.compile(
    r"^\tTopic: (?P<topic>[\w.-]+)\tPartition: (?P<partition>\d+)\tLeader: (?P<leader>\d+|none)\t"
    r"Replicas: (?P<replicas>[\d,]+)\tIsr: (?P<isr>[\d,-]*)\tEpoch: (?P<epoch>\d+)\t"
    r"LEO: (?P<leo>\d+|-)\tHW: (?P<hw>\d+|-)(?P<offline>\t\(offline\))?(?P<under>\t\(under-replicated\))?"
    r"(?P<under_min_isr>\t\(under-min-isr\))?(?P<held>\t\(HW held: [^)]*\))?$")
NUM = r"\d+\.\d{2}"
SUMMARY_LINE = re.compile(
    rf"^(?P<records>\d+) (?P<counted>records sent|records consumed|records received), {NUM} records/sec "
    rf"\({NUM} MB/sec\), {NUM} ms avg (?P<latency>latency|poll wait|end-to-end latency), "
    rf"{NUM} ms max (?P=latency), {NUM} ms 50th, {NUM} ms 95th, {NUM} ms 99th, {NUM} ms 99\.9th\.$")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three brokers; topics default to replication factor 3; a controlled shutdown gives up
    quickly on partitions it cannot move; a follower that stops fetching leaves the ISR after
    5 s (the leader's own check, whatever the controller does about a dead broker)."""
    extra = {"default.replication.factor": 3, "controlled.shutdown.retry.backoff.ms": 200,
             "replica.lag.time.max.ms": 5000}
    c = None
    try:
        for attempt in range(2):  # a cluster that does not come up is retried once from scratch
            c = DevCluster(tmp_path_factory.mktemp(f"cli{attempt}"), 3, zk_port=0, base_port=0,
                           extra_config=extra)
            try:
                c.start(timeout=30)
                break
            except (TimeoutError, RuntimeError):
                c.kill()
                if attempt:
                    raise
        yield c
    finally:
        if c is not None:
            c.stop()


@pytest.fixture
def tidelog(cluster, capsys):
    """Run ``tidelog ARGS... --bootstrap <cluster>`` in-process: (exit status, stdout, stderr)."""

    def run(*argv: str, bootstrap: str | None = None):
        capsys.readouterr()
        rc = main([*argv, "--bootstrap", bootstrap or cluster.bootstrap])
        out, err = capsys.readouterr()
        return SimpleNamespace(rc=rc, out=out, err=err, lines=out.splitlines())

    return run


def wait_for_topic(cluster: DevCluster, topic: str, partitions: int, timeout: float = 20.0) -> None:
    """Until every running broker's metadata has the topic with a leader for each partition."""
    deadline = time.monotonic() + timeout
    while True:
        ready = True
        for b in cluster.brokers.values():
            if not b.running:
                continue
            found = [t for t in metadata(b.port).topics if t.name == topic]
            ready &= bool(found) and len(found[0].partitions) == partitions and \
                all(p.leader_id >= 0 for p in found[0].partitions)
        if ready:
            return
        assert time.monotonic() < deadline, f"topic {topic} not ready in every broker's metadata"
        time.sleep(0.1)


def create(tidelog, cluster, topic: str, partitions: int = 1, *extra: str) -> None:
    r = tidelog("topics", "create", topic, "--partitions", str(partitions), "--replication-factor", "3", *extra)
    assert r.rc == 0, r.err
    assert r.out == f"Created topic {topic}.\n"
    wait_for_topic(cluster, topic, partitions)


def produce_stdin(tidelog, monkeypatch, topic: str, data: bytes, *argv: str):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    return tidelog("produce", topic, *argv)


# -- topics ------------------------------------------------------------------------------------


def test_topics_create_list_describe(tidelog, cluster):
    create(tidelog, cluster, "orders", 3, "--config", "retention.ms=3600000", "--config", "segment.bytes=1048576")

    r = tidelog("topics", "create", "orders", "--partitions", "3")
    assert r.rc == 1 and "TOPIC_ALREADY_EXISTS" in r.err and "orders" in r.err
    assert tidelog("topics", "create", "orders", "--if-not-exists").rc == 0

    r = tidelog("topics", "list")
    assert r.rc == 0 and "orders" in r.lines

    r = tidelog("topics", "describe", "orders")
    assert r.rc == 0, r.err
    assert r.lines[0] == ("Topic: orders\tPartitionCount: 3\tReplicationFactor: 3\t"
                          "Configs: retention.ms=3600000,segment.bytes=1048576")
    parts = [PARTITION_LINE.match(line) for line in r.lines[1:]]
    assert all(parts), r.lines
    assert [int(m["partition"]) for m in parts] == [0, 1, 2]
    for m in parts:
        replicas = m["replicas"].split(",")
        assert len(replicas) == 3 and sorted(m["isr"].split(",")) == sorted(replicas)
        assert m["leader"] in replicas
        assert (m["leo"], m["hw"]) == ("0", "0") and not m["offline"] and not m["under"]

    r = tidelog("topics", "describe", "no-such-topic")
    assert r.rc == 1 and "no-such-topic" in r.err and "UNKNOWN_TOPIC_OR_PARTITION" in r.err


def test_topics_alter_and_delete(tidelog, cluster):
    create(tidelog, cluster, "grow", 1)
    r = tidelog("topics", "alter", "grow", "--partitions", "4")
    assert r.rc == 0, r.err
    wait_for_topic(cluster, "grow", 4)
    r = tidelog("topics", "alter", "grow", "--config", "retention.ms=60000")
    assert r.rc == 0, r.err
    header = tidelog("topics", "describe", "grow").lines[0]
    assert header == "Topic: grow\tPartitionCount: 4\tReplicationFactor: 3\tConfigs: retention.ms=60000"

    assert tidelog("topics", "alter", "grow", "--delete-config", "retention.ms").rc == 0
    assert tidelog("topics", "describe", "grow").lines[0].endswith("\tConfigs: ")
    r = tidelog("topics", "alter", "grow", "--partitions", "2")
    assert r.rc == 1 and "grow" in r.err
    assert tidelog("topics", "alter", "grow").rc == 2  # nothing to alter

    r = tidelog("topics", "delete", "grow")
    assert r.rc == 0 and r.out == "Deleted topic grow.\n"
    deadline = time.monotonic() + 20
    while "grow" in tidelog("topics", "list").lines:
        assert time.monotonic() < deadline, "the deleted topic is still listed"
        time.sleep(0.2)
    # kafka-topics' --if-exists: a missing topic is no error
    r = tidelog("topics", "delete", "grow", "--if-exists")
    assert (r.rc, r.out) == (0, ""), r.err
    assert tidelog("topics", "alter", "grow", "--partitions", "5", "--if-exists").rc == 0
    assert tidelog("topics", "delete", "grow").rc == 1


# -- produce and consume -----------------------------------------------------------------------


def test_produce_stdin_then_consume_from_beginning(tidelog, cluster):
    create(tidelog, cluster, "lines", 1)
    lines = [f"line {i} ünïcode" for i in range(50)] + ["", "last"]
    proc = subprocess.run([sys.executable, "-m", "tidelog.broker.cli", "produce", "lines", "--acks", "all",
                           "--bootstrap", cluster.bootstrap],
                          input="\n".join(lines).encode() + b"\n", capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()

    r = tidelog("consume", "lines", "--from-beginning", "--max-messages", str(len(lines)))
    assert r.rc == 0, r.err
    assert r.lines == lines
    assert f"Processed a total of {len(lines)} messages" in r.err

    r = tidelog("consume", "lines", "--partition", "0", "--offset", "3", "--max-messages", "2", "--print-offset")
    assert r.lines == ["Offset:3\tline 3 ünïcode", "Offset:4\tline 4 ünïcode"]

    started = time.monotonic()
    r = tidelog("consume", "lines", "--from-beginning", "--timeout-ms", "1500")
    assert r.rc == 0 and r.lines == lines
    assert time.monotonic() - started < 15

    r = tidelog("consume", "lines", "--offset", "3")
    assert r.rc == 2 and "--offset needs --partition" in r.err
    # a group member commits what it printed: a second run of the group goes on from there
    group = ("--group", "g1", "--from-beginning", "--timeout-ms", "30000")
    r = tidelog("consume", "lines", *group, "--max-messages", "2")
    assert r.rc == 0 and r.lines == lines[:2], r.err
    r = tidelog("consume", "lines", *group, "--max-messages", "2")
    assert r.rc == 0 and r.lines == lines[2:4], r.err


def test_a_topic_with_fewer_replicas_than_min_isr_is_readable_and_says_acks_all_fails(tidelog, cluster, monkeypatch):
    """Replication factor 1 under min.insync.replicas 2: creation warns that acks=all will
    fail; acks=1 records are readable at once (the HW follows the one replica, as in Kafka);
    describe flags the partition under min ISR but not held; an acks=all produce fails with
    NOT_ENOUGH_REPLICAS naming both numbers."""
    r = tidelog("topics", "create", "lonely", "--partitions", "1", "--replication-factor", "1",
                "--config", "min.insync.replicas=2")
    assert r.rc == 0, r.err
    assert "replication factor 1, below its min.insync.replicas 2" in r.err
    assert "tidelog topics alter lonely --config min.insync.replicas=1" in r.err
    wait_for_topic(cluster, "lonely", 1)
    r = produce_stdin(tidelog, monkeypatch, "lonely", b"a\nb\n", "--acks", "1")
    assert r.rc == 0, r.err
    (line,) = tidelog("topics", "describe", "lonely").lines[1:]
    m = PARTITION_LINE.match(line)
    assert m and (m["leo"], m["hw"]) == ("2", "2") and m["under_min_isr"] and not m["held"], line
    assert tidelog("topics", "describe", "--under-min-isr-partitions").lines == [line]
    r = tidelog("consume", "lonely", "--from-beginning", "--max-messages", "2")
    assert r.rc == 0 and r.lines == ["a", "b"], r.err
    with Producer(cluster.bootstrap, acks="all", delivery_timeout_ms=3000, request_timeout_ms=2000,
                  linger_ms=0) as producer:
        with pytest.raises(Exception) as e:
            producer.send("lonely", b"c").result(timeout=30)
    assert "NOT_ENOUGH_REPLICAS" in str(e.value) and "below min.insync.replicas 2" in str(e.value)
    r = tidelog("topics", "alter", "lonely", "--config", "min.insync.replicas=3")
    assert r.rc == 0 and "below its min.insync.replicas 3" in r.err


def test_produce_with_keys_and_options(tidelog, cluster, monkeypatch):
    create(tidelog, cluster, "keyed", 3)
    data = b"k1:v1\nk2:v2:with:colons\nk3:\n"
    r = produce_stdin(tidelog, monkeypatch, "keyed", data, "--key-separator", ":", "--acks", "1",
                      "--compression", "gzip", "--linger-ms", "0", "--producer-property", "batch.size=1024")
    assert r.rc == 0, r.err
    r = tidelog("consume", "keyed", "--from-beginning", "--max-messages", "3", "--print-key")
    assert r.rc == 0, r.err
    assert sorted(r.lines) == ["k1\tv1", "k2\tv2:with:colons", "k3\t"]

    r = produce_stdin(tidelog, monkeypatch, "keyed", b"a\nb\n", "--partition", "2")
    assert r.rc == 0, r.err
    r = tidelog("consume", "keyed", "--partition", "2", "--offset", "earliest", "--timeout-ms", "1000",
                "--print-partition", "--print-key")
    assert r.lines[-2:] == ["Partition:2\tnull\ta", "Partition:2\tnull\tb"]
    r = tidelog("consume", "keyed", "--partition", "2", "--offset", "earliest", "--max-messages", "1",
                "--print-timestamp", "--print-headers", "--print-offset")
    timestamp, rest = r.lines[0].split("\t", 1)
    assert timestamp.startswith("CreateTime:") and abs(int(timestamp[11:]) / 1000 - time.time()) < 600
    assert rest.split("\t")[1] == "NO_HEADERS"

    r = produce_stdin(tidelog, monkeypatch, "keyed", b"no separator here\n", "--key-separator", "|")
    assert r.rc == 1 and "line 1 has no key separator" in r.err
    r = produce_stdin(tidelog, monkeypatch, "keyed", b"x\n", "--partition", "7")
    assert r.rc == 1 and "partition 7" in r.err
    r = produce_stdin(tidelog, monkeypatch, "keyed", b"x\n", "--producer-property", "no.such=1")
    assert r.rc == 2 and "unknown producer property 'no.such'" in r.err


def test_down_cluster_fails_fast(tidelog, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    started = time.monotonic()
    r = tidelog("topics", "list", bootstrap=closed)
    elapsed = time.monotonic() - started
    assert r.rc == 1 and f"cannot reach the cluster at {closed}" in r.err, r.err
    assert elapsed < 10

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n")))
    for argv in (["produce", "t"], ["consume", "t"], ["topics", "describe"],
                 ["perf", "produce", "--topic", "t", "--num-records", "1", "--record-size", "1", "--throughput", "-1"],
                 ["perf", "e2e", "--topic", "t", "--num-records", "1"]):
        started = time.monotonic()
        r = tidelog(*argv, "--connect-timeout-ms", "1000", bootstrap=closed)
        assert r.rc == 1 and "cannot reach the cluster" in r.err, (argv, r.err)
        assert time.monotonic() - started < 6, argv
    assert tidelog("topics", "list", bootstrap="no-port").rc == 2


# -- perf --------------------------------------------------------------------------------------


def test_perf_produce_consume_summary_and_json(tidelog, cluster):
    create(tidelog, cluster, "perf", 3)
    r = tidelog("perf", "produce", "--topic", "perf", "--num-records", "3000", "--record-size", "100",
                "--throughput", "-1", "--producer-props", "acks=1", "linger.ms=2", "batch.size=8192")
    assert r.rc == 0, r.err
    assert len(r.lines) == 1 and SUMMARY_LINE.match(r.lines[0]), r.out
    assert SUMMARY_LINE.match(r.lines[0])["records"] == "3000"
    assert SUMMARY_LINE.match(r.lines[0])["counted"] == "records sent"
    r = tidelog("perf", "produce", "--topic", "perf-histogram", "--num-records", "300", "--record-size", "100",
                "--throughput", "-1", "--histogram")
    assert r.rc == 0, r.err
    assert SUMMARY_LINE.match(r.lines[0]) and r.lines[1].startswith("latency histogram")
    assert r.lines[-1].rstrip().endswith("100.000 %") and all(line.startswith("  <= ") for line in r.lines[2:])

    started = time.monotonic()
    r = tidelog("perf", "produce", "--topic", "perf", "--num-records", "400", "--record-size", "10",
                "--throughput", "1000", "--json")
    assert r.rc == 0, r.err
    assert time.monotonic() - started >= 0.35  # throttled to 1000 records/sec
    result = json.loads(r.out)
    assert set(result) == {"records", "records_per_sec", "mb_per_sec", "latency_ms", "latency_histogram_ms"}
    histogram = result["latency_histogram_ms"]
    assert sum(b["count"] for b in histogram) == 400
    assert [b["le"] for b in histogram] == sorted(b["le"] for b in histogram)
    assert histogram[-1]["le"] >= result["latency_ms"]["max"]
    assert result["records"] == 400 and 0 < result["records_per_sec"] <= 1100
    lat = result["latency_ms"]
    assert set(lat) == {"avg", "max", "p50", "p95", "p99", "p999"}
    assert 0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p999"] <= lat["max"]

    r = tidelog("perf", "produce", "--topic", "perf-bulk", "--num-records", "500", "--record-size", "100",
                "--throughput", "-1", "--bulk", "100")
    if hasattr(Producer, "send_many"):
        assert r.rc == 0, r.err
        assert SUMMARY_LINE.match(r.lines[0])["records"] == "500"
    else:  # the flag needs the SDK's bulk API
        assert r.rc == 2 and "--bulk" in r.err

    r = tidelog("perf", "consume", "--topic", "perf", "--num-records", "3400")
    assert r.rc == 0, r.err
    assert len(r.lines) == 1 and SUMMARY_LINE.match(r.lines[0])["records"] == "3400"
    # it says what it measured: records consumed and the poll wait, not records sent
    assert SUMMARY_LINE.match(r.lines[0])["counted"] == "records consumed"
    assert SUMMARY_LINE.match(r.lines[0])["latency"] == "poll wait"
    r = tidelog("perf", "consume", "--topic", "perf", "--num-records", "100", "--json")
    assert r.rc == 0 and json.loads(r.out)["records"] == 100

    r = tidelog("perf", "consume", "--topic", "perf", "--num-records", "3500", "--timeout-ms", "1000")
    assert r.rc == 1 and "only 3400 of 3500 records" in r.err
    assert SUMMARY_LINE.match(r.lines[0])["records"] == "3400"
    r = tidelog("perf", "produce", "--topic", "perf", "--num-records", "1", "--record-size", "1",
                "--throughput", "0")
    assert r.rc == 2


def test_perf_e2e(tidelog, cluster):
    r = tidelog("perf", "e2e", "--topic", "e2e", "--num-records", "60", "--throughput", "200")
    assert r.rc == 0, r.err
    assert SUMMARY_LINE.match(r.lines[0])["records"] == "60"
    assert SUMMARY_LINE.match(r.lines[0])["latency"] == "end-to-end latency"
    r = tidelog("perf", "e2e", "--topic", "e2e", "--num-records", "30", "--record-size", "64", "--json")
    assert r.rc == 0, r.err
    result = json.loads(r.out)
    assert result["records"] == 30 and result["latency_ms"]["max"] > 0
    # records in flight (a latency at a rate): all arrive, each with its own latency
    r = tidelog("perf", "e2e", "--topic", "e2e", "--num-records", "3000", "--throughput", "3000",
                "--in-flight", "500", "--json")
    assert r.rc == 0, r.err
    result = json.loads(r.out)
    assert result["records"] == 3000 and len(set(result["latency_ms"].values())) > 1
    r = tidelog("perf", "e2e", "--topic", "e2e", "--num-records", "3", "--in-flight", "0")
    assert r.rc == 2 and "--in-flight must be positive" in r.err


def test_perf_functions_report_progress(cluster):
    """client.perf directly: progress windows while sending and flushing, per-batch latencies."""
    windows = []
    with Producer(cluster.bootstrap, acks=1, linger_ms=20) as producer:
        result = produce(producer, "progress", num_records=2000, payload=b"x" * 50, throughput=4000,
                         progress=windows.append, interval_s=0.1)
    assert result.records == 2000 and result.failed == 0 and len(result.latencies_ms) == 2000
    assert result.bytes == 100_000 and result.complete
    assert len(windows) >= 3 and sum(w.records for w in windows) <= 2000
    assert all(w.max_ms >= w.avg_ms >= 0 for w in windows if w.records)
    assert min(result.latencies_ms) >= 0


def test_perf_measurements_with_fakes():
    """Throttling, percentiles and the per-record fallback, with a fake clock and clients."""
    now = [0.0]
    slept = []

    def sleep(s):
        slept.append(s)
        now[0] += s

    throttler = Throttler(100, 0.0, sleep=sleep)
    for i in range(50):
        now[0] += 0.0001
        if throttler.should_throttle(i, now[0]):
            throttler.throttle()
    assert 0.4 <= now[0] <= 0.6 and all(s >= 0.002 for s in slept)
    assert not Throttler(-1, 0.0).should_throttle(10**9, 1.0)
    with pytest.raises(ValueError):
        Throttler(0, 0.0)

    lat = Latency.of([float(i) for i in range(1, 1001)])
    assert (lat.p50, lat.p95, lat.p99, lat.p999, lat.max) == (501.0, 951.0, 991.0, 1000.0, 1000.0)
    assert lat.avg == pytest.approx(500.5)

    class Future:  # no ``batch``: one callback per record
        def __init__(self):
            self.callbacks = []

        def add_done_callback(self, fn):
            self.callbacks.append(fn)

        def exception(self, timeout=None):
            return RuntimeError("boom") if self.fail else None

    class FakeProducer:
        def __init__(self):
            self.futures = []

        def send(self, topic, value):
            f = Future()
            f.fail = len(self.futures) % 4 == 3
            self.futures.append(f)
            now[0] += 0.001
            return f

        def flush(self, timeout=None):
            now[0] += 0.010
            for f in self.futures:
                for cb in f.callbacks:
                    cb(f)

    result = produce(FakeProducer(), "t", num_records=8, payload=b"abc", clock=lambda: now[0])
    assert (result.records, result.failed, result.bytes) == (6, 2, 18)
    assert str(result.first_error) == "boom" and not result.complete
    assert sorted(round(x, 6) for x in result.latencies_ms) == [12.0, 13.0, 14.0, 16.0, 17.0, 18.0]

    class FakeBulkProducer(FakeProducer):  # send_many's futures without batch runs
        def send_many(self, topic, values):
            f = Future()
            f.fail = False
            self.futures.append(f)
            now[0] += 0.001
            return f

    result = produce(FakeBulkProducer(), "t", num_records=10, payload=b"ab", bulk=4, clock=lambda: now[0])
    assert (result.records, result.bytes, result.failed) == (10, 20, 0)
    assert sorted(round(x, 6) for x in result.latencies_ms) == [11.0] * 2 + [12.0] * 4 + [13.0] * 4

    class FakeConsumer:
        def __init__(self, batches):
            self.batches = list(batches)

        def poll(self, timeout_ms=0, max_records=None):
            now[0] += 0.002
            return self.batches.pop(0)[:max_records] if self.batches else []

    rec = SimpleNamespace(key=b"k", value=b"vvvv")
    result = consume(FakeConsumer([[rec] * 3, [], [rec] * 5]), num_records=6, clock=lambda: now[0])
    assert (result.records, result.bytes) == (6, 30)
    assert [round(x, 6) for x in result.latencies_ms] == [2.0] * 6
    result = consume(FakeConsumer([[rec] * 2]), num_records=6, idle_timeout_s=0.05, clock=lambda: now[0])
    assert result.records == 2 and not result.complete


# -- last: stop a broker -----------------------------------------------------------------------


def test_describe_flags_under_replicated_and_offline(tidelog, cluster):
    create(tidelog, cluster, "replicated", 3)
    r = tidelog("topics", "create", "single", "--partitions", "3", "--replication-factor", "1")
    assert r.rc == 0, r.err
    wait_for_topic(cluster, "single", 3)
    controller = metadata(cluster.brokers[1].port).controller_id
    stopped = 3 if controller != 3 else 2  # not the controller
    cluster.brokers[stopped].stop()
    try:
        deadline = time.monotonic() + 30
        while True:
            r = tidelog("topics", "describe", "--under-replicated-partitions", "--unavailable-partitions")
            assert r.rc == 0, r.err
            matches = [PARTITION_LINE.match(line) for line in r.lines]
            assert all(matches), r.lines
            replicated = [m for m in matches if m["topic"] == "replicated"]
            single = [m for m in matches if m["topic"] == "single"]
            if len(replicated) == 3 and all(m["under"] for m in replicated) and single:
                break
            assert time.monotonic() < deadline, r.out
            time.sleep(0.3)
        for m in replicated:
            assert str(stopped) not in m["isr"].split(",") and m["leader"] != str(stopped)
            assert m["leo"] != "-" and m["hw"] != "-"
        (offline,) = single  # rf 1: the partition on the stopped broker has no leader left
        assert offline["leader"] == "none" and offline["offline"] and offline["replicas"] == str(stopped)
        assert (offline["leo"], offline["hw"]) == ("-", "-")

        r = tidelog("topics", "describe", "replicated", "--under-replicated-partitions")
        assert len(r.lines) == 3 and all(PARTITION_LINE.match(line)["under"] for line in r.lines)
        r = tidelog("topics", "describe", "replicated")
        assert r.lines[0].startswith("Topic: replicated\tPartitionCount: 3\t")
    finally:
        cluster.brokers[stopped].start()
        cluster.wait_ready(30)


def test_elect_leaders_moves_leadership_back_to_the_preferred_replica(tidelog, cluster):
    create(tidelog, cluster, "preferred", 3)
    controller = metadata(cluster.brokers[1].port).controller_id
    bounced = 3 if controller != 3 else 2  # not the controller
    cluster.brokers[bounced].stop()  # controlled shutdown: its leaderships move away
    cluster.brokers[bounced].start()
    cluster.wait_ready(30)

    def partitions():
        r = tidelog("topics", "describe", "preferred")
        return [m for m in map(PARTITION_LINE.match, r.lines[1:]) if m]

    deadline = time.monotonic() + 30
    while not all(str(bounced) in m["isr"].split(",") for m in partitions()):
        assert time.monotonic() < deadline, "the bounced broker did not rejoin the ISRs"
        time.sleep(0.3)
    assert any(m["replicas"].split(",")[0] != m["leader"] for m in partitions())  # leadership moved away

    r = tidelog("topics", "elect-leaders", "preferred")
    assert r.rc == 0, r.err
    assert any(line.startswith("Successfully elected the preferred replica") for line in r.lines), r.out
    deadline = time.monotonic() + 20
    while not all(m["replicas"].split(",")[0] == m["leader"] for m in partitions()):
        assert time.monotonic() < deadline, "leadership did not return to the preferred replicas"
        time.sleep(0.3)
    r = tidelog("topics", "elect-leaders", "preferred", "--partition", "0")
    assert r.rc == 0 and r.lines == ["Valid replica already elected for preferred-0."], r.out



def test_an_unclean_election_of_partitions_that_have_a_leader_is_not_needed(tidelog, cluster):
    create(tidelog, cluster, "unclean", 2)
    r = tidelog("topics", "elect-leaders", "unclean", "--election-type", "UNCLEAN")
    assert r.rc == 0, r.err
    assert r.lines == ["Valid replica already elected for unclean-0.", "Valid replica already elected for unclean-1."]

def test_delete_records_moves_the_log_start_on_every_replica(tidelog, cluster, monkeypatch):
    create(tidelog, cluster, "purge", 2)
    r = produce_stdin(tidelog, monkeypatch, "purge", b"".join(b"r%d\n" % i for i in range(20)), "--partition", "0")
    assert r.rc == 0, r.err
    r = produce_stdin(tidelog, monkeypatch, "purge", b"".join(b"s%d\n" % i for i in range(10)), "--partition", "1")
    assert r.rc == 0, r.err

    r = tidelog("topics", "delete-records", "purge", "--partition", "0", "--offset", "5")
    assert r.rc == 0 and r.lines == ["partition: purge-0\tlow_watermark: 5"], r.out + r.err
    # the low watermark says every in-sync replica moved its log start: the next leader has too
    leader = next(p.leader_id for t in metadata(cluster.brokers[1].port).topics if t.name == "purge"
                  for p in t.partitions if p.partition_index == 0)
    cluster.brokers[leader].stop()  # controlled shutdown: leadership moves to a follower
    try:
        r = tidelog("consume", "purge", "--partition", "0", "--offset", "earliest", "--max-messages", "1",
                    "--print-offset", bootstrap=",".join(f"{b.host}:{b.port}" for i, b in cluster.brokers.items()
                                                          if i != leader))
        assert r.rc == 0 and r.lines == ["Offset:5\tr5"], r.out + r.err
    finally:
        cluster.brokers[leader].start()
        cluster.wait_ready(30)

    # partition 1 cannot go to 15 (its high watermark is 10), partition 0 can: both are tried
    r = tidelog("topics", "delete-records", "purge", "--offset", "15")
    assert r.rc == 1 and "OFFSET_OUT_OF_RANGE" in r.err and "high watermark 10" in r.err, r.err
    assert "purge-1" in r.err and "done: purge-0 (low watermark 15)" in r.err, r.err
    r = tidelog("topics", "delete-records", "purge", "--offset", "-1")
    assert r.rc == 0 and r.lines == ["partition: purge-0\tlow_watermark: 20",
                                     "partition: purge-1\tlow_watermark: 10"], r.out + r.err
    with Admin(cluster.bootstrap) as admin:  # an offset below the log start changes nothing
        assert admin.delete_records({TopicPartition("purge", 0): 3}) == {TopicPartition("purge", 0): 20}
        with pytest.raises(ValueError, match="-1"):
            admin.delete_records({TopicPartition("purge", 0): -5})
