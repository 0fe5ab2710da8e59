"""Record validation on append against a real broker process (issue 14, points 3, 4 and 8).

One single-broker cluster for the module. Each poison pill of the issue (a header claiming
2^31-1 records over one, a records block that is not msgpack, timestamps of -2^63 and
2^63-1, a record after its batch's max timestamp, a decompression bomb, a record without a
key in a compacted topic) is sent with a raw client and refused with its error code; nothing
of it is appended, an SDK producer and consumer keep working, and ``tidelog dump-log
--verify`` finds nothing wrong in the partition's segments. A batch damaged on disk (a bit
flip) stops an SDK consumer with an error that names topic, partition and offsets, and the
seek it names gets past it.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import msgpack
import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, wait_topic_ready
from tests.support.disk import log_dir
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tests.unit.protocol.test_record_validation import forge, rec
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.errors import CorruptRecordError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP, NONE
from tidelog.protocol.messages import (
    LATEST_TIMESTAMP,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
)
from tidelog.protocol.records import Codec, build_batch, iter_headers

TOPIC, COMPACT, DAMAGED = "validated", "validated-compact", "damaged"


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("validation"), 1,
                               {**FAST_FAILOVER, "auto.create.topics.enable": False})


@pytest.fixture(scope="module")
def topics(cluster):
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1), NewTopic(COMPACT, 1, 1, config={"cleanup.policy": "compact"}),
                             NewTopic(DAMAGED, 1, 1)])
    for t in (TOPIC, COMPACT, DAMAGED):
        wait_topic_ready(cluster, t, 1, 1)
    return cluster


@pytest.fixture(scope="module")
def raw(topics):
    client = RawClient(topics.brokers[1].port, timeout=30)
    yield client
    client.close()


def now_ms() -> int:
    import time
    return int(time.time() * 1000)


def produce(raw: RawClient, records: bytes, topic: str = TOPIC):
    body = raw.request(ApiKey.PRODUCE, ProduceRequest(acks=1, timeout_ms=5000, topic_data=[
        TopicProduceData(topic, [PartitionProduceData(0, records)])]))
    return ProduceResponse.from_body(body).responses[0].partition_responses[0]


def log_end(raw: RawClient, topic: str) -> int:
    response = ListOffsetsResponse.from_body(raw.request(ApiKey.LIST_OFFSETS, ListOffsetsRequest(
        [ListOffsetsTopic(topic, [ListOffsetsPartition(0, LATEST_TIMESTAMP)])])))
    p = response.topics[0].partitions[0]
    assert p.error_code == NONE.code, p
    return p.offset


def consume_all(bootstrap: str, topic: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        wait_until(lambda: got.extend(r.value for r in consumer.poll(timeout_ms=500)) or len(got) >= count,
                   30, f"{count} records of {topic} consumed")
    return got


def segments(cluster, topic: str) -> list[str]:
    return sorted(glob.glob(os.path.join(log_dir(cluster, 1), f"{topic}-0", "*.log")))


def dump_log_verify(cluster, topic: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidelog.broker.cli", "dump-log", "--verify",
                           *segments(cluster, topic)], capture_output=True, text=True, timeout=120)


POISON = {
    "count 2^31-1 over one record": (lambda t: forge([rec(0)], n=2**31 - 1, first=t), TOPIC, CORRUPT_MESSAGE),
    "records block not msgpack": (lambda t: forge([rec(0)], raw=b"\xc1 this is not msgpack", first=t), TOPIC,
                                  CORRUPT_MESSAGE),
    "timestamp -2^63": (lambda t: forge([rec(0)], first=-2**63), TOPIC, INVALID_TIMESTAMP),
    "timestamp 2^63-1": (lambda t: forge([rec(0)], first=2**63 - 1), TOPIC, INVALID_TIMESTAMP),
    "record after max timestamp": (lambda t: forge([rec(0), rec(1, ts_delta=5)], first=t), TOPIC, INVALID_RECORD),
    "offset deltas out of order": (lambda t: forge([rec(1), rec(0)], first=t), TOPIC, CORRUPT_MESSAGE),
    "zstd bomb": (lambda t: forge([rec(0)], codec=Codec.ZSTD, raw=b"\x00" * (256 << 20), first=t), TOPIC,
                  CORRUPT_MESSAGE),
    "gzip bomb": (lambda t: forge([rec(0)], codec=Codec.GZIP, raw=b"\x00" * (64 << 20), first=t), TOPIC,
                  CORRUPT_MESSAGE),
    "no key in a compacted topic": (lambda t: forge([rec(0, key=b"k"), rec(1)], first=t), COMPACT, INVALID_RECORD),
}


@pytest.fixture(scope="module")
def good(topics):
    """A well-behaved SDK producer, whose records every check reads back."""
    sent = {TOPIC: [], COMPACT: []}
    with Producer(topics.bootstrap, acks="all") as producer:
        def send(topic: str) -> None:
            value = b"good-%d" % len(sent[topic])
            producer.send(topic, value, key=b"k%d" % len(sent[topic]), partition=0).result(30)
            sent[topic].append(value)
        yield send, sent


@pytest.mark.parametrize("name", list(POISON))
def test_a_poison_pill_is_refused_and_the_partition_stays_readable(topics, raw, good, name):
    send, sent = good
    make, topic, error = POISON[name]
    send(topic)
    before = log_end(raw, topic)
    p = produce(raw, make(now_ms()), topic)
    assert (p.error_code, p.base_offset) == (error.code, -1), p
    assert "batch 0" in p.error_message and "record" in p.error_message
    assert log_end(raw, topic) == before  # nothing appended
    send(topic)
    assert consume_all(topics.bootstrap, topic, len(sent[topic])) == sent[topic]
    verdict = dump_log_verify(topics, topic)
    assert verdict.returncode == 0 and "no problems found" in verdict.stdout, verdict.stdout[-2000:]


def test_a_produce_after_the_poison_pills_on_the_same_connection_is_appended(topics, raw):
    before = log_end(raw, TOPIC)
    p = produce(raw, build_batch([b"raw-1", b"raw-2"], timestamp_ms=now_ms()))
    assert (p.error_code, p.base_offset) == (NONE.code, before)


def test_a_batch_damaged_on_disk_names_the_seek_that_gets_past_it(topics, raw):
    values = [[b"a0", b"a1"], [b"b0", b"b1", b"b2"], [b"c0"]]
    for batch in values:
        assert produce(raw, build_batch(batch, timestamp_ms=now_ms()), DAMAGED).error_code == NONE.code
    (path,) = segments(topics, DAMAGED)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    (_, _), (pos, h), _ = list(iter_headers(data))
    data[pos + h.size - 3] ^= 0x20  # a bit flip in the second batch's records
    with open(path, "r+b") as f:
        f.seek(pos + h.size - 3)
        f.write(data[pos + h.size - 3:pos + h.size - 2])
    tp = TopicPartition(DAMAGED, 0)
    with Consumer(topics.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        got: list[bytes] = []
        errors: list[CorruptRecordError] = []

        def poll() -> bool:
            try:
                got.extend(r.value for r in consumer.poll(timeout_ms=500))
            except CorruptRecordError as e:
                errors.append(e)
                return True
            return len(got) >= 3

        # the broker refuses to serve the damaged batch (CORRUPT_MESSAGE); each error names
        # the offset and the seek past it, and the consumer is never left retrying forever
        for _ in range(4):
            wait_until(poll, 30, "the damaged batch reported or the records after it")
            if not errors:
                break
            e = errors.pop()
            assert f"topic {DAMAGED} partition 0" in str(e) and f"offset {e.offset}" in str(e), str(e)
            assert 2 <= e.offset <= 4 and e.skip_offset == e.offset + 1
            assert f"consumer.seek(TopicPartition('{DAMAGED}', 0), {e.skip_offset})" in str(e)
            consumer.seek(tp, e.skip_offset)
        assert got == [b"a0", b"a1", b"c0"]
    verdict = dump_log_verify(topics, DAMAGED)
    assert verdict.returncode != 0  # the damage is on disk, and dump-log says so


def test_records_blocks_are_msgpack_as_documented():
    assert msgpack.unpackb(build_batch([b"x"], timestamp_ms=0)[61:]) == [[0, 0, None, b"x", None]]


def test_a_batch_above_max_message_bytes_is_split_by_the_producer_and_delivered_in_order(topics):
    # each record fits the topic's max.message.bytes, a lingering batch of them does not: the
    # broker refuses the batch (MESSAGE_TOO_LARGE) and the idempotent producer splits it
    topic = "small-messages"
    with Admin(topics.bootstrap) as admin:
        admin.create_topics([NewTopic(topic, 1, 1, config={"max.message.bytes": "300"})])
    wait_topic_ready(topics, topic, 1, 1)
    values = [b"split-%03d" % i for i in range(60)]
    with Producer(topics.bootstrap, acks="all", enable_idempotence=True, linger_ms=60_000) as producer:
        futures = [producer.send(topic, v, key=b"k", partition=0) for v in values]
        producer.flush(60)
        assert [f.result(0).offset for f in futures] == list(range(60))
    assert consume_all(topics.bootstrap, topic, 60) == values
