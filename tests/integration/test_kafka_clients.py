"""Real Kafka clients against a 3-broker Tidelog cluster's Kafka listeners: confluent-kafka
(librdkafka), kafka-python and kcat produce, consume with groups, commit and resume, seek by
timestamp and administer topics; what they write the Tidelog SDK reads byte for byte, and
the reverse."""

from __future__ import annotations

import shutil
import socket
import struct
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, wait_topic_ready
from tests.support.waiting import wait_until
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.broker.devcluster import DevCluster

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402

with warnings.catch_warnings():  # kafka-python reads its own package data with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory) -> Iterator[DevCluster]:
    yield from cluster_fixture(request, tmp_path_factory.mktemp("kafka"), 3, FAST_FAILOVER, kafka=True)


def topic_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def make_topic(cluster: DevCluster, name: str, partitions: int = 3, rf: int = 3) -> str:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, rf, config={"min.insync.replicas": "2"})])
    wait_topic_ready(cluster, name, partitions, rf)
    return name


def sdk_records(cluster: DevCluster, topic: str, count: int) -> list:
    """Every record of ``topic`` (at least ``count``), read by the Tidelog SDK."""
    got = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(500).values():
                got.extend(records)
    return sorted(got, key=lambda r: (r.partition, r.offset))


def confluent_producer(cluster: DevCluster, **config):
    return confluent_kafka.Producer({"bootstrap.servers": cluster.kafka_bootstrap, "acks": "all",
                                     "enable.idempotence": True, "partitioner": "murmur2_random",
                                     "linger.ms": 5, **config})


def confluent_consumer(cluster: DevCluster, group: str, **config):
    return confluent_kafka.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                     "session.timeout.ms": 10000, **config})


def confluent_poll(consumer, count: int) -> list:
    got = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < count and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    return got


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_produces_idempotently_and_the_sdk_reads_the_same_records(cluster, codec):
    topic = make_topic(cluster, topic_name(f"ck-{codec}"))
    producer = confluent_producer(cluster, **{"compression.type": codec})
    acks = []
    for i in range(200):
        producer.produce(topic, key=b"key-%d" % i, value=b"value-%d " % i * 20, headers=[("i", b"%d" % i)],
                         timestamp=1_700_000_000_000 + i,
                         on_delivery=lambda err, m: acks.append((err, m.partition(), m.offset())))
    assert producer.flush(TIMEOUT_S) == 0
    assert all(err is None for err, _, _ in acks) and len(acks) == 200
    records = sdk_records(cluster, topic, 200)
    assert len(records) == 200
    by_key = {r.key: r for r in records}
    with Producer(cluster.bootstrap) as sdk:
        partitions = len(sdk.partitions_for(topic))
    from tidelog.aio.partitioner import default_partition
    for i in range(200):
        r = by_key[b"key-%d" % i]
        assert r.value == b"value-%d " % i * 20 and r.headers == [("i", b"%d" % i)]
        assert r.timestamp == 1_700_000_000_000 + i
        assert r.partition == default_partition(r.key, partitions)  # murmur2, as Kafka's Java client
    assert sorted((p, o) for _, p, o in acks) == sorted((r.partition, r.offset) for r in records)


def test_sdk_records_reach_a_confluent_kafka_group_which_commits_and_resumes(cluster):
    topic = make_topic(cluster, topic_name("sdk-to-ck"))
    with Producer(cluster.bootstrap, compression_type="lz4", acks="all") as producer:
        for i in range(100):
            producer.send(topic, b"v%d" % i, key=b"k%d" % i, headers=[("from", b"sdk")])
        producer.flush(TIMEOUT_S)
    group = topic_name("ck-group")
    consumer = confluent_consumer(cluster, group)
    consumer.subscribe([topic])
    first = confluent_poll(consumer, 60)
    assert len(first) >= 60
    for m in first:
        assert m.value() == b"v" + m.key()[1:] and m.headers() == [("from", b"sdk")]
    consumer.commit(asynchronous=False)
    committed = {(tp.partition, tp.offset) for tp in consumer.committed(
        [confluent_kafka.TopicPartition(topic, p) for p in range(3)], timeout=10)}
    consumer.close()
    # a new member of the group resumes after the committed offsets: nothing twice, nothing lost
    again = confluent_consumer(cluster, group)
    again.subscribe([topic])
    rest = confluent_poll(again, 100 - len(first))
    again.close()
    seen = [m.key() for m in first] + [m.key() for m in rest]
    assert sorted(seen) == sorted(b"k%d" % i for i in range(100))
    # and the SDK sees the group's commits
    with Admin(cluster.bootstrap) as admin:
        offsets = admin.list_group_offsets(group)
    assert {(g.partition.partition, g.committed) for g in offsets} >= {c for c in committed if c[1] >= 0}


def test_kafka_python_group_commit_and_seek_by_timestamp(cluster):
    topic = make_topic(cluster, topic_name("kp"), partitions=1)
    producer = kafka.KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, acks="all",
                                   enable_idempotence=True, compression_type="gzip")
    base = int(time.time() * 1000) - 3_600_000  # an hour ago, one record a second
    futures = [producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, timestamp_ms=base + 1000 * i)
               for i in range(50)]
    producer.flush(TIMEOUT_S)
    assert [f.get(TIMEOUT_S).offset for f in futures] == list(range(50))
    producer.close()
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=cluster.kafka_bootstrap, group_id="kp-group",
                                   auto_offset_reset="earliest", enable_auto_commit=False,
                                   consumer_timeout_ms=10000)
    got = []
    for message in consumer:
        got.append(message)
        if len(got) == 30:
            break
    consumer.commit()
    consumer.close()
    assert [m.offset for m in got] == list(range(30))
    consumer = kafka.KafkaConsumer(topic, bootstrap_servers=cluster.kafka_bootstrap, group_id="kp-group",
                                   auto_offset_reset="earliest", enable_auto_commit=False,
                                   consumer_timeout_ms=5000)
    assert [m.offset for m in consumer] == list(range(30, 50))  # resumed at the commit
    tp = kafka.TopicPartition(topic, 0)
    found = consumer.offsets_for_times({tp: base + 1000 * 42 - 1})
    assert found[tp].offset == 42 and found[tp].timestamp == base + 42_000
    assert consumer.beginning_offsets([tp])[tp] == 0 and consumer.end_offsets([tp])[tp] == 50
    consumer.close()


def test_admin_clients_create_describe_and_delete_topics(cluster):
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    name = topic_name("ck-admin")
    futures = admin.create_topics([NewTopic(name, 2, 3, config={"retention.ms": "3600000"})], request_timeout=30)
    futures[name].result(TIMEOUT_S)
    wait_topic_ready(cluster, name, 2, 3)
    metadata = admin.list_topics(timeout=10)
    assert name in metadata.topics and len(metadata.topics[name].partitions) == 2
    assert sorted(metadata.brokers) == [1, 2, 3]
    admin.create_partitions([NewPartitions(name, 4)])[name].result(TIMEOUT_S)
    wait_topic_ready(cluster, name, 4, 3)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    assert configs["retention.ms"].value == "3600000" and not configs["retention.ms"].is_default
    # AlterConfigs (not the incremental one) replaces the topic's whole set of overrides
    admin.alter_configs([ConfigResource(ConfigResource.Type.TOPIC, name, set_config={"segment.ms": "90000"})]
                        )[resource].result(TIMEOUT_S)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    assert configs["segment.ms"].value == "90000" and not configs["segment.ms"].is_default
    assert configs["retention.ms"].is_default
    admin.delete_topics([name], operation_timeout=30)[name].result(TIMEOUT_S)
    wait_until(lambda: name not in admin.list_topics(timeout=10).topics, TIMEOUT_S, "the topic is gone")
    # kafka-python's admin client too
    kp_admin = kafka.KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    other = topic_name("kp-admin")
    kp_admin.create_topics([kafka.admin.NewTopic(other, 1, 3)])
    assert other in kp_admin.list_topics()
    kp_admin.delete_topics([other])
    kp_admin.close()


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (./dev setup installs it)")
def test_kcat_and_the_sdk_read_each_others_records(cluster):
    topic = make_topic(cluster, topic_name("kcat"), partitions=1)
    lines = "".join(f"key{i}:value {i}\n" for i in range(20))
    subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, "-t", topic, "-P", "-K:", "-z", "snappy",
                    "-X", "acks=all"], input=lines.encode(), check=True, timeout=TIMEOUT_S)
    records = sdk_records(cluster, topic, 20)
    assert [(r.key, r.value) for r in records] == [(b"key%d" % i, b"value %d" % i) for i in range(20)]
    with Producer(cluster.bootstrap) as producer:
        producer.send(topic, b"from the sdk", key=b"sdk", headers=[("h", b"1")])
        producer.flush(TIMEOUT_S)
    out = subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, "-t", topic, "-C", "-e", "-o", "beginning",
                          "-f", "%k=%s|%o\\n"], capture_output=True, check=True, timeout=TIMEOUT_S).stdout
    assert out.decode().splitlines() == [f"key{i}=value {i}|{i}" for i in range(20)] + ["sdk=from the sdk|20"]


def _kafka_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    frame = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test" + body
    return struct.pack(">i", len(frame)) + frame


def test_a_malformed_kafka_request_closes_only_its_own_connection(cluster):
    host, port = cluster.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    healthy = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for garbage in (_kafka_frame(3, 1, 7, b"\x7f\xff\xff\xff"),  # 2^31-1 topics announced
                    _kafka_frame(0, 99, 8, b""),  # a Produce version nobody speaks
                    _kafka_frame(4, 0, 9, b""),  # LeaderAndIsr: never on a Kafka listener
                    struct.pack(">i", 3) + b"abc"):  # shorter than a header
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(garbage)
            s.settimeout(10)
            assert s.recv(100) == b""  # closed, no answer
        assert healthy.list_topics(timeout=10).brokers  # everyone else is still served


def test_an_unsupported_api_versions_version_gets_the_v0_answer(cluster):
    host, port = cluster.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_kafka_frame(18, 99, 5, b"\x00\x00"))
        size = struct.unpack(">i", s.recv(4))[0]
        data = b""
        while len(data) < size:
            data += s.recv(size - len(data))
    correlation_id, error_code, count = struct.unpack_from(">ihi", data)
    assert correlation_id == 5 and error_code == 35 and count > 10
    keys = {struct.unpack_from(">hhh", data, 10 + 6 * i) for i in range(count)}
    assert (18, 0, 3) in keys and (0, 3, 10) in keys


def test_a_group_mixing_the_sdk_and_confluent_kafka_splits_partitions_and_shares_commits(cluster):
    import threading

    topic = make_topic(cluster, topic_name("mixed"), partitions=4)
    with Producer(cluster.bootstrap) as producer:
        for i in range(200):
            producer.send(topic, b"v%d" % i, key=b"k%d" % i)
        producer.flush(TIMEOUT_S)
    group = topic_name("mixed-group")
    kafka_member = confluent_consumer(cluster, group, **{"partition.assignment.strategy": "range"})
    kafka_member.subscribe([topic])
    sdk_seen: list = []
    kafka_seen: list = []
    stop = threading.Event()

    def run_sdk_member() -> None:
        with Consumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, auto_offset_reset="earliest",
                      enable_auto_commit=False, partition_assignment_strategy="range") as consumer:
            deadline = time.monotonic() + TIMEOUT_S
            while not stop.is_set() and time.monotonic() < deadline:
                for records in consumer.poll(200).values():
                    sdk_seen.extend(records)
                consumer.commit()
            sdk_seen.append(("assignment", sorted(tp.partition for tp in consumer.assignment())))

    member = threading.Thread(target=run_sdk_member)
    member.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline and len(kafka_seen) + len(sdk_seen) < 200:
            m = kafka_member.poll(0.2)
            if m is not None and m.error() is None:
                kafka_seen.append(m)
                kafka_member.commit(m, asynchronous=False)
        kafka_partitions = sorted(tp.partition for tp in kafka_member.assignment())
    finally:
        stop.set()
        member.join(TIMEOUT_S)
        kafka_member.close()
    sdk_assignment = sdk_seen.pop()[1]
    # each member got two of the four partitions, and between them every record once
    assert sorted(kafka_partitions + sdk_assignment) == [0, 1, 2, 3] and len(kafka_partitions) == 2
    keys = [m.key() for m in kafka_seen] + [r.key for r in sdk_seen]
    assert sorted(keys) == sorted(b"k%d" % i for i in range(200))
    # the commits of both are the group's, seen by either kind of client
    with Admin(cluster.bootstrap) as admin:
        committed = {g.partition.partition: g.committed for g in admin.list_group_offsets(group)}
    ends = {p: 0 for p in range(4)}
    for m in kafka_seen:
        ends[m.partition()] = max(ends[m.partition()], m.offset() + 1)
    for r in sdk_seen:
        ends[r.partition] = max(ends[r.partition], r.offset + 1)
    assert committed == ends
    checker = confluent_consumer(cluster, group)
    got = checker.committed([confluent_kafka.TopicPartition(topic, p) for p in range(4)], timeout=10)
    checker.close()
    assert {tp.partition: tp.offset for tp in got} == ends


def test_an_old_message_format_is_refused_for_its_partition_only(cluster):
    """A v1 message set (magic 1) in a Produce v3: that partition is answered CORRUPT_MESSAGE,
    the connection carries on."""
    from tidelog.protocol.kafka.schema import codec

    topic = make_topic(cluster, topic_name("magic1"), partitions=1, rf=1)
    leader = wait_topic_ready(cluster, topic, 1, 1)[0].leader_id
    port = int(cluster.kafka_bootstrap.split(",")[leader - 1].rsplit(":", 1)[1])
    message = struct.pack(">qi", 0, 22) + struct.pack(">Ibbqii", 0, 1, 0, 0, -1, 1) + b"x"
    body = bytes(codec("ProduceRequest", 3).encode({"acks": 1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": message}]}]}))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for correlation_id in (1, 2):  # answered twice: the connection stays open
            s.sendall(_kafka_frame(0, 3, correlation_id, body))
            size = struct.unpack(">i", s.recv(4))[0]
            data = b""
            while len(data) < size:
                data += s.recv(size - len(data))
            response = codec("ProduceResponse", 3).decode_all(data[4:])
            assert struct.unpack(">i", data[:4])[0] == correlation_id
            partition = response["responses"][0]["partition_responses"][0]
            assert partition["error_code"] == 2  # CORRUPT_MESSAGE
