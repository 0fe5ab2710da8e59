"""Bad input against a real broker process (docs/reliability.md, "Bad input").

One single-broker cluster for the module, with ``socket.request.max.bytes`` at 1 MiB. Raw
sockets send random bytes, random and mutated frames, an oversize length prefix, unknown API
keys and versions, envelopes with fields of the wrong type, corrupt and oversize record
batches, acks=5 and fetches of a topic that does not exist. Each gets an error response or a
closed connection, and after each one a well-behaved client, connected since the start,
still works, the broker process is alive and every record produced so far is intact.
"""

from __future__ import annotations

import random
import socket
import struct
import threading

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, wait_topic_ready
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tidelog import Consumer, Producer, TopicPartition
from tidelog.protocol.codec import ApiKey, RequestHeader, decode_response, encode_request
from tidelog.protocol.errors import (
    CORRUPT_MESSAGE,
    INVALID_REQUEST,
    INVALID_REQUIRED_ACKS,
    MESSAGE_TOO_LARGE,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_VERSION,
)
from tidelog.protocol.messages import (
    LATEST_TIMESTAMP,
    ApiVersionsRequest,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataResponse,
    PartitionProduceData,
    ProduceRequest,
    ProduceResponse,
    TopicProduceData,
)
from tidelog.protocol.records import build_batch, iter_all_records

MAX_REQUEST = 1 << 20  # socket.request.max.bytes
MAX_MESSAGE = 20_000  # the topic's max.message.bytes
TOPIC = "intact"
TP = TopicPartition(TOPIC, 0)
FUZZ_TOPIC = "fuzz"


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("hostile"), 1,
                               {**FAST_FAILOVER, "socket.request.max.bytes": MAX_REQUEST,
                                "auto.create.topics.enable": False})


class GoodClient:
    """A well-behaved raw client, connected for the whole module: it produces one record per
    check and verifies that the partition holds exactly what it produced, in order."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.raw = RawClient(cluster.brokers[1].port, timeout=15)
        self.values: list[bytes] = []

    def produce(self, value: bytes) -> None:
        response = ProduceResponse.from_body(self.raw.request(ApiKey.PRODUCE, produce_request(build_batch([value]))))
        p = response.responses[0].partition_responses[0]
        assert (p.error_code, p.base_offset) == (NONE.code, len(self.values)), p
        self.values.append(value)

    def stored(self) -> list[bytes]:
        response = FetchResponse.from_body(self.raw.request(ApiKey.FETCH, FetchRequest(
            [FetchTopic(TOPIC, [FetchPartition(0, 0, 1 << 20)])], max_wait_ms=0)))
        p = response.responses[0].partitions[0]
        assert p.error_code == NONE.code, p
        return [r.value for r in iter_all_records(p.records or b"")]

    def check(self) -> None:
        """The broker is alive, this connection works, and nothing stored was lost."""
        assert self.cluster.brokers[1].running, "the broker process died"
        md = MetadataResponse.from_body(self.raw.request(ApiKey.METADATA, MetadataRequest(topics=[TOPIC])))
        assert md.topics[0].error_code == NONE.code
        self.produce(b"good-%d" % len(self.values))
        assert self.stored() == self.values
        assert latest_offset(self.raw) == len(self.values)


@pytest.fixture(scope="module")
def good(cluster):
    admin_topics(cluster)
    client = GoodClient(cluster)
    for i in range(20):
        client.produce(b"before-%d" % i)
    client.check()
    yield client
    client.check()
    client.raw.close()
    # the data is intact for an ordinary consumer too
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        got: list[bytes] = []
        wait_until(lambda: got.extend(r.value for r in consumer.poll(timeout_ms=500)) or len(got) >= len(client.values),
                   30, "the partition consumed")
    assert got == client.values


def admin_topics(cluster) -> None:
    from tidelog import Admin, NewTopic
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={"max.message.bytes": str(MAX_MESSAGE)}),
                             NewTopic(FUZZ_TOPIC, 1, 1)])
    wait_topic_ready(cluster, TOPIC, 1, 1)
    wait_topic_ready(cluster, FUZZ_TOPIC, 1, 1)


def produce_request(records: bytes, acks: int = 1, topic: str = TOPIC) -> ProduceRequest:
    return ProduceRequest(acks=acks, timeout_ms=5000,
                          topic_data=[TopicProduceData(topic, [PartitionProduceData(0, records)])])


def latest_offset(raw: RawClient) -> int:
    response = ListOffsetsResponse.from_body(raw.request(ApiKey.LIST_OFFSETS, ListOffsetsRequest(
        [ListOffsetsTopic(TOPIC, [ListOffsetsPartition(0, LATEST_TIMESTAMP)])])))
    p = response.topics[0].partitions[0]
    assert p.error_code == NONE.code, p
    return p.offset


PROBE_ID = 424242
PROBE = encode_request(RequestHeader(ApiKey.API_VERSIONS, 0, PROBE_ID, "probe"), ApiVersionsRequest())


def answers_after(raw: RawClient) -> tuple[list[dict], bool]:
    """Send a probe (ApiVersions) behind whatever hostile frames were sent, and read until its
    answer or a closed connection. Returns the bodies of the responses before the probe's,
    and whether the connection was closed; fails if the broker does neither in time."""
    raw.send_raw(struct.pack(">I", len(PROBE)) + PROBE)

    def probe_answered(frames):
        return any(decode_response(f)[0] == PROBE_ID for f in frames)

    frames, closed = raw.read_raw_until(probe_answered)
    decoded = [decode_response(f) for f in frames]
    assert closed or probe_answered(frames), "neither answered nor closed the connection in time"
    return [body for cid, body in decoded if cid != PROBE_ID], closed


def error_or_closed(raw: RawClient) -> None:
    """What the broker did with hostile frames: error responses only, or a closed connection."""
    bodies, _ = answers_after(raw)
    for body in bodies:
        assert body.get("error_code", NONE.code) != NONE.code, body


def partition_error(body: dict) -> int:
    return ProduceResponse.from_body(body).responses[0].partition_responses[0].error_code


# -- framing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_random_bytes_then_end_of_stream(cluster, good, seed):
    rng = random.Random(seed)
    with RawClient(cluster.brokers[1].port, timeout=10) as raw:
        raw.send_raw(rng.randbytes(rng.randint(1, 4096)))
        raw.sock.shutdown(socket.SHUT_WR)
        frames, closed = raw.read_raw_until_closed()
        assert closed, "the broker kept the connection open after end of stream"
        for frame in frames:
            assert decode_response(frame)[1].get("error_code") != NONE.code
    good.check()


@pytest.mark.parametrize("seed", range(8))
def test_random_frame_bodies(cluster, good, seed):
    rng = random.Random(1000 + seed)
    with RawClient(cluster.brokers[1].port, timeout=5) as raw:
        for _ in range(5):
            body = rng.randbytes(rng.randint(0, 2048))
            if rng.random() < 0.5:  # a plausible msgpack array header in front
                body = bytes([0x95]) + body
            if not raw.send_raw(struct.pack(">I", len(body)) + body):
                break  # closed after an earlier frame
        error_or_closed(raw)
    good.check()


@pytest.mark.parametrize("body", [
    b"\x91" * 100_000 + b"\xc0",  # arrays nested 100,000 deep
    b"\xdd\xff\xff\xff\xff" + b"\xc0" * 16,  # an array claiming 4 billion elements
    b"\x95\x00\x00\x01\xdb\xff\xff\xff\xff" + b"a" * 16,  # a client_id claiming 4 GiB
    b"\x95\x00\x00\x02\xc0\xc7\x05\x01" + b"x" * 5,  # an ext type as the body
    b"\x95\x00\x00\x03\xc0\x81\x01\x02",  # a body map with an int key
    b"\x95\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00\x00\x04\xc0\x80",  # api key NaN
    b"\x95\x00\x00\xd3\x7f\xff\xff\xff\xff\xff\xff\xff\xc0\x80",  # correlation id beyond int32
    b"\x93\x00\x00\x05",  # three elements, not five
    b"",  # an empty frame
], ids=["deep", "huge-array", "huge-str", "ext", "int-key", "nan-key", "big-correlation", "short", "empty"])
def test_structured_garbage_frames(cluster, good, body):
    with RawClient(cluster.brokers[1].port, timeout=10) as raw:
        raw.send_raw(struct.pack(">I", len(body)) + body)
        error_or_closed(raw)
    good.check()


def test_mutated_produce_frames_while_a_good_client_works(cluster, good):
    """Valid Produce frames (to another topic) with random bytes changed: whatever the broker
    answers, it answers or closes. Meanwhile the well-behaved client produces and reads
    back on its own connection, undisturbed."""
    rng = random.Random(7)
    batch = build_batch([(b"k%d" % i, b"v" * 50) for i in range(5)])
    valid = encode_request(RequestHeader(ApiKey.PRODUCE, 0, 1, "fuzzer"), produce_request(batch, topic=FUZZ_TOPIC))
    stop, failures, rounds = threading.Event(), [], []

    def steady():
        try:
            while not stop.is_set():
                good.produce(b"concurrent-%d" % len(rounds))
                rounds.append(1)
                if len(rounds) % 10 == 0:
                    assert good.stored() == good.values
        except BaseException as e:
            failures.append(e)

    thread = threading.Thread(target=steady, daemon=True)
    thread.start()
    try:
        for _ in range(150):
            frame = bytearray(valid)
            for _ in range(rng.randint(1, 4)):
                frame[rng.randrange(len(frame))] = rng.randrange(256)
            with RawClient(cluster.brokers[1].port, timeout=10) as raw:
                raw.send_raw(struct.pack(">I", len(frame)) + bytes(frame))
                answers_after(raw)  # answered (whatever it says; acks=0 gets nothing) or closed
    finally:
        stop.set()
        thread.join(20)
    assert not failures, failures
    assert len(rounds) >= 10
    good.check()


def test_oversize_length_prefix_closes_the_connection(cluster, good):
    with RawClient(cluster.brokers[1].port, timeout=10) as raw:
        raw.send_raw(struct.pack(">I", MAX_REQUEST + 1))
        raw.send_raw(b"\0" * (256 << 10))  # the broker may close before taking all of it
        frames, closed = raw.read_raw_until_closed()
        assert closed, "a frame over socket.request.max.bytes did not close the connection"
        for frame in frames:
            assert decode_response(frame)[1].get("error_code") != NONE.code
    good.check()


def test_frame_just_under_the_limit_is_served(cluster, good):
    """The bound is exact: a frame of socket.request.max.bytes bytes is read and answered
    (here with MESSAGE_TOO_LARGE for the topic's 20 kB max.message.bytes)."""
    with RawClient(cluster.brokers[1].port, timeout=15) as raw:
        big = build_batch([b"x" * (MAX_REQUEST - 500)])
        body = raw.request(ApiKey.PRODUCE, produce_request(big))
        assert partition_error(body) == MESSAGE_TOO_LARGE.code
    good.check()


# -- envelopes -----------------------------------------------------------------------------------------


def test_unknown_api_key_and_version(cluster, good):
    with RawClient(cluster.brokers[1].port) as raw:
        assert raw.request(999, {})["error_code"] == UNSUPPORTED_VERSION.code
        assert raw.request(ApiKey.METADATA, {"topics": None}, api_version=7)["error_code"] == UNSUPPORTED_VERSION.code
        assert raw.request(ApiKey.JOIN_GROUP, {})["error_code"] != NONE.code  # known, not served here
        # the connection carries on
        assert raw.request(ApiKey.API_VERSIONS, ApiVersionsRequest())["error_code"] == NONE.code
    good.check()


BATCH = build_batch([b"typed"])


@pytest.mark.parametrize("body", [
    {"acks": 1, "timeout_ms": 1000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": "x", "records": BATCH}]}]},
    {"acks": "all", "timeout_ms": 1000, "topic_data": []},
    {"acks": 1, "timeout_ms": 1000, "topic_data": {"name": TOPIC}},
    {"acks": 1, "timeout_ms": 1000, "topic_data": [{"name": 5, "partition_data": []}]},
    {"acks": 1, "timeout_ms": 1000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": "text"}]}]},
    {"acks": 1, "timeout_ms": 1000, "topic_data": [{"name": TOPIC, "partition_data": [{"index": 1 << 40, "records": BATCH}]}]},
    {"acks": 1 << 20, "timeout_ms": 1000, "topic_data": []},
    {"acks": True, "timeout_ms": 1000, "topic_data": []},
    {"timeout_ms": 1000, "topic_data": []},
    {},
], ids=["partition-str", "acks-str", "topic-data-map", "name-int", "records-str", "partition-int64",
        "acks-over-int16", "acks-bool", "acks-missing", "empty"])
def test_produce_with_fields_of_the_wrong_type(cluster, good, body):
    with RawClient(cluster.brokers[1].port) as raw:
        response = raw.request(ApiKey.PRODUCE, body)
        assert response["error_code"] == INVALID_REQUEST.code, response
        assert response["error_message"]
        assert latest_offset(raw) == len(good.values)  # same connection, still served
    good.check()


@pytest.mark.parametrize("body", [
    {"topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "fetch_offset": "0"}]}]},
    {"topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": -5}]}],
     "max_wait_ms": "soon"},
    {"topics": "all"},
    {"topics": [[TOPIC, 0]]},
], ids=["offset-str", "max-wait-str", "topics-str", "topics-arrays"])
def test_fetch_with_fields_of_the_wrong_type(cluster, good, body):
    with RawClient(cluster.brokers[1].port) as raw:
        response = raw.request(ApiKey.FETCH, body)
        assert response["error_code"] == INVALID_REQUEST.code, response
    good.check()


# -- record batches ------------------------------------------------------------------------------------


def corrupted(kind: str) -> bytes:
    batch = bytearray(build_batch([(b"k", b"corrupt-me-%d" % i) for i in range(10)], timestamp_ms=1))
    if kind == "crc":
        batch[-5] ^= 0xFF  # a byte of the records: the CRC no longer matches
    elif kind == "stored-crc":
        batch[17] ^= 0x01
    elif kind == "magic":
        batch[16] = 1
    elif kind == "truncated":
        batch = batch[:-7]
    elif kind == "length-too-long":
        struct.pack_into(">i", batch, 8, len(batch) + 100)
    elif kind == "length-negative":
        struct.pack_into(">i", batch, 8, -1)
    elif kind == "count-zero":
        struct.pack_into(">i", batch, 57, 0)
    elif kind == "good-then-garbage":
        batch = batch + b"\x00" * 30
    elif kind == "good-then-bad":
        bad = bytearray(build_batch([b"second"]))
        bad[-1] ^= 0xFF
        batch = batch + bad
    elif kind == "empty":
        batch = bytearray()
    return bytes(batch)


@pytest.mark.parametrize("kind", ["crc", "stored-crc", "magic", "truncated", "length-too-long", "length-negative",
                                  "count-zero", "good-then-garbage", "good-then-bad", "empty"])
def test_corrupt_batch_is_rejected_and_nothing_appended(cluster, good, kind):
    with RawClient(cluster.brokers[1].port) as raw:
        before = latest_offset(raw)
        body = raw.request(ApiKey.PRODUCE, produce_request(corrupted(kind)))
        assert partition_error(body) == CORRUPT_MESSAGE.code, body
        assert latest_offset(raw) == before
    good.check()


def test_batch_over_max_message_bytes(cluster, good):
    with RawClient(cluster.brokers[1].port) as raw:
        before = latest_offset(raw)
        body = raw.request(ApiKey.PRODUCE, produce_request(build_batch([b"y" * (MAX_MESSAGE + 1000)])))
        assert partition_error(body) == MESSAGE_TOO_LARGE.code, body
        assert latest_offset(raw) == before
        # just under the limit is fine (and counts as produced data from now on)
        value = b"z" * (MAX_MESSAGE - 200)
        body = raw.request(ApiKey.PRODUCE, produce_request(build_batch([value])))
        assert partition_error(body) == NONE.code, body
        good.values.append(value)
        assert latest_offset(raw) == before + 1
    good.check()


@pytest.mark.parametrize("acks", [5, -2, 2])
def test_invalid_acks(cluster, good, acks):
    with RawClient(cluster.brokers[1].port) as raw:
        before = latest_offset(raw)
        body = raw.request(ApiKey.PRODUCE, produce_request(build_batch([b"acks"]), acks=acks))
        assert partition_error(body) == INVALID_REQUIRED_ACKS.code, body
        assert latest_offset(raw) == before
    good.check()


def test_fetch_and_produce_to_a_topic_that_does_not_exist(cluster, good):
    with RawClient(cluster.brokers[1].port) as raw:
        fetch = FetchResponse.from_body(raw.request(ApiKey.FETCH, FetchRequest(
            [FetchTopic("no-such-topic", [FetchPartition(0, 0)]), FetchTopic(TOPIC, [FetchPartition(7, 0)])],
            max_wait_ms=100)))
        codes = [p.error_code for t in fetch.responses for p in t.partitions]
        assert codes == [UNKNOWN_TOPIC_OR_PARTITION.code] * 2, fetch
        body = raw.request(ApiKey.PRODUCE, produce_request(build_batch([b"nowhere"]), topic="no-such-topic"))
        assert partition_error(body) == UNKNOWN_TOPIC_OR_PARTITION.code, body
        offsets = ListOffsetsResponse.from_body(raw.request(ApiKey.LIST_OFFSETS, ListOffsetsRequest(
            [ListOffsetsTopic("no-such-topic", [ListOffsetsPartition(0, LATEST_TIMESTAMP)])])))
        assert offsets.topics[0].partitions[0].error_code == UNKNOWN_TOPIC_OR_PARTITION.code
    good.check()


def test_fetch_out_of_range_offsets(cluster, good):
    from tidelog.protocol.errors import OFFSET_OUT_OF_RANGE
    with RawClient(cluster.brokers[1].port) as raw:
        for offset in (-1, len(good.values) + 10, (1 << 63) - 1):
            fetch = FetchResponse.from_body(raw.request(ApiKey.FETCH, FetchRequest(
                [FetchTopic(TOPIC, [FetchPartition(0, offset)])], max_wait_ms=0)))
            assert fetch.responses[0].partitions[0].error_code == OFFSET_OUT_OF_RANGE.code, (offset, fetch)
    good.check()


def test_the_sdk_still_works_alongside(cluster, good):
    with Producer(cluster.bootstrap, acks="all") as producer:
        meta = producer.send(TOPIC, b"from-the-sdk").result(timeout=30)
    assert meta.offset == len(good.values)
    good.values.append(b"from-the-sdk")
    good.check()
