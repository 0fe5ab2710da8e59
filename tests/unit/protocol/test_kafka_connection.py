"""The Kafka listener's sans-IO connection: Kafka's headers in and out, the native request
handed on, the response encoded for the version asked, errors spread as Kafka clients expect."""

from __future__ import annotations

import random
import struct

import pytest

from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import BadRequest
from tidelog.protocol.errors import NOT_COORDINATOR
from tidelog.protocol.kafka.connection import KafkaRequest, KafkaServerConnection
from tidelog.protocol.kafka.schema import codec
from tidelog.protocol.messages import ApiVersionsResponse, MetadataResponse, OffsetFetchResponse


def frame(key: int, version: int, correlation_id: int, body: bytes, flexible: bool) -> bytes:
    head = struct.pack(">hhih", key, version, correlation_id, 3) + b"cli" + (b"\x00" if flexible else b"")
    return struct.pack(">i", len(head) + len(body)) + head + body


def response_of(data: bytes) -> tuple[int, bytes]:
    size, correlation_id = struct.unpack_from(">ii", data)
    assert len(data) == 4 + size
    return correlation_id, data[8:]


def test_a_flexible_request_becomes_the_native_one_and_its_answer_kafkas():
    conn = KafkaServerConnection()
    body = bytes(codec("MetadataRequest", 12).encode({"topics": [{"name": "t"}]}))
    [event] = conn.receive_data(frame(3, 12, 7, body, flexible=True))
    assert isinstance(event, KafkaRequest) and event.version == 12
    assert event.header.api_key == ApiKey.METADATA and event.header.api_version == 0
    assert event.header.client_id == "cli" and event.body["topics"] == ["t"]
    out = conn.send_response(7, MetadataResponse([], "c", 1, []))
    correlation_id, rest = response_of(out)
    assert correlation_id == 7 and rest[0] == 0  # response header v1: empty tagged fields
    assert codec("MetadataResponse", 12).decode_all(rest[1:])["cluster_id"] == "c"


def test_api_versions_answers_with_header_v0_and_the_kafka_table():
    conn = KafkaServerConnection()
    body = bytes(codec("ApiVersionsRequest", 3).encode({"client_software_name": "x"}))
    [event] = conn.receive_data(frame(18, 3, 1, body, flexible=True))
    # the broker's software version is Tidelog's own field: a Kafka client gets Kafka's body
    correlation_id, rest = response_of(conn.send_response(1, ApiVersionsResponse(0, [], software_version="9.9")))
    decoded = codec("ApiVersionsResponse", 3).decode_all(rest)  # no header tags before the body
    assert "software_version" not in decoded and b"9.9" not in rest
    keys = {k["api_key"]: (k["min_version"], k["max_version"]) for k in decoded["api_keys"]}
    assert keys[18] == (0, 3) and keys[1] == (4, 12) and 4 not in keys  # never LeaderAndIsr


def test_an_unsupported_api_versions_version_gets_kip_511s_v0_answer():
    conn = KafkaServerConnection()
    [event] = conn.receive_data(frame(18, 9, 3, b"garbage", flexible=True))
    assert event.refused
    _, rest = response_of(conn.send_response(3, ApiVersionsResponse(0, [])))
    decoded = codec("ApiVersionsResponse", 0).decode_all(rest)
    assert decoded["error_code"] == 35 and any(k["api_key"] == 0 for k in decoded["api_keys"])


def test_requests_that_cannot_be_answered_in_order_close_the_connection():
    for data in (frame(4, 0, 1, b"", flexible=False),  # LeaderAndIsr
                 frame(0, 99, 2, b"", flexible=False),  # a Produce version not served
                 frame(3, 1, 3, b"\x00\x00\x00\x09", flexible=False),  # 9 topics, no bytes
                 struct.pack(">i", 2) + b"ab"):
        [event] = KafkaServerConnection().receive_data(data)
        assert isinstance(event, BadRequest) and event.must_close, data


def test_a_whole_request_error_is_spread_over_what_the_request_named():
    conn = KafkaServerConnection()
    body = bytes(codec("ProduceRequest", 9).encode({"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": None}, {"index": 1, "records": None}]}]}))
    conn.receive_data(frame(0, 9, 5, body, flexible=True))
    _, rest = response_of(conn.send_response(5, {"error_code": 58, "error_message": "who are you"}))
    decoded = codec("ProduceResponse", 9).decode_all(rest[1:])
    [topic] = decoded["responses"]
    assert [(p["index"], p["error_code"], p["error_message"]) for p in topic["partition_responses"]] == [
        (0, 58, "who are you"), (1, 58, "who are you")]


def test_a_whole_request_error_to_a_throttled_client_keeps_its_partitions_and_the_throttle():
    # the quota adds throttle_time_ms to whatever the broker answers, an error body included
    conn = KafkaServerConnection()
    body = bytes(codec("ProduceRequest", 9).encode({"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": None}, {"index": 1, "records": None}]}]}))
    conn.receive_data(frame(0, 9, 5, body, flexible=True))
    error = {"error_code": 29, "error_message": "not allowed", "throttle_time_ms": 250}
    decoded = codec("ProduceResponse", 9).decode_all(response_of(conn.send_response(5, error))[1][1:])
    assert decoded["throttle_time_ms"] == 250
    [topic] = decoded["responses"]
    assert [(p["index"], p["error_code"], p["error_message"]) for p in topic["partition_responses"]] == [
        (0, 29, "not allowed"), (1, 29, "not allowed")]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_an_offset_fetch_refused_whole_reaches_an_old_client_on_every_partition(version):
    # v0 and v1 have no top-level error: an answer with no partitions would read as a group
    # without committed offsets (the consumer would reset its positions); from v2 the error
    # is the top-level one
    conn = KafkaServerConnection()
    body = bytes(codec("OffsetFetchRequest", version).encode(
        {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0, 1]}]}))
    conn.receive_data(frame(9, version, 4, body, flexible=False))
    _, rest = response_of(conn.send_response(4, OffsetFetchResponse(NOT_COORDINATOR.code)))
    decoded = codec("OffsetFetchResponse", version).decode_all(rest)
    if version >= 2:  # as Kafka answers: the top-level error, no partitions
        assert decoded["error_code"] == NOT_COORDINATOR.code and decoded["topics"] == []
        return
    [topic] = decoded["topics"]
    assert [(p["partition_index"], p["error_code"], p["committed_offset"]) for p in topic["partitions"]] == [
        (0, NOT_COORDINATOR.code, -1), (1, NOT_COORDINATOR.code, -1)]


def test_large_frames_decode_off_the_connection_like_native_ones():
    conn = KafkaServerConnection(decode_inline_max_bytes=10)
    body = bytes(codec("MetadataRequest", 1).encode({"topics": [{"name": "a" * 50}]}))
    [large] = conn.receive_data(frame(3, 1, 9, body, flexible=False))
    event = conn.admit(conn.decode(large.data))
    assert isinstance(event, KafkaRequest) and event.body["topics"] == ["a" * 50]
    assert response_of(conn.send_response(9, MetadataResponse([], None, -1, [])))[0] == 9


@pytest.mark.parametrize("as_body", [False, True], ids=["typed", "body"])
def test_a_fetch_answer_with_many_records_to_translate_is_encoded_aside(as_body):
    # the broker's fetch handler answers with the response's body (Apis._fetch_response)
    from tidelog.protocol.kafka.records import to_stored
    from tidelog.protocol.messages import FetchPartitionResponse, FetchResponse, FetchTopicResponse
    from tidelog.protocol.records import build_batch, iter_all_records

    def fetch_answer(n: int):
        batch = build_batch([b"v%d" % i for i in range(n)], timestamp_ms=1)
        typed = FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0, n, 0, batch)])])
        return typed.to_body() if as_body else typed

    body = bytes(codec("FetchRequest", 12).encode({"topics": [{"topic": "t", "partitions": [{"partition": 0}]}]}))
    conn = KafkaServerConnection()
    conn.receive_data(frame(1, 12, 1, body, flexible=True) + frame(1, 12, 2, body, flexible=True))
    assert conn.slow_encoder(1, fetch_answer(100)) is None  # cheap: encoded in place
    answer = fetch_answer(100)
    native = answer.to_body() if not as_body else {**answer, "responses": [
        {**t, "partitions": [dict(p) for p in t["partitions"]]} for t in answer["responses"]]}
    assert conn.send_response(1, answer)
    # the answer is translated, not changed: the broker's metrics read it after the write
    assert (answer.to_body() if not as_body else answer) == native
    encode = conn.slow_encoder(2, fetch_answer(5000))
    assert encode is not None
    out = conn.send_frame(2, encode())  # in a worker thread, then back in the response order
    _, rest = response_of(out)
    records = codec("FetchResponse", 12).decode_all(rest[1:])["responses"][0]["partitions"][0]["records"]
    assert records[16] == 2 and len(list(iter_all_records(to_stored(records)))) == 5000  # Kafka's encoding


def test_a_refused_metadata_request_names_every_topic_it_asked_for():
    conn = KafkaServerConnection()
    body = bytes(codec("MetadataRequest", 1).encode({"topics": [{"name": "a"}, {"name": "b"}]}))
    conn.receive_data(frame(3, 1, 4, body, flexible=False))
    _, rest = response_of(conn.send_response(4, {"error_code": 29, "error_message": "no"}))
    topics = codec("MetadataResponse", 1).decode_all(rest)["topics"]
    assert [(t["name"], t["error_code"]) for t in topics] == [("a", 29), ("b", 29)]


def test_a_create_topics_config_without_a_value_reaches_the_broker_as_null():
    # the broker refuses that topic alone (INVALID_CONFIG): dropping the entry would create
    # it with the default the client did not ask for
    from tidelog.protocol.messages import CreateTopicsRequest

    conn = KafkaServerConnection()
    body = bytes(codec("CreateTopicsRequest", 5).encode({"timeout_ms": 1000, "topics": [
        {"name": "t", "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": [{"name": "retention.ms", "value": None}, {"name": "segment.ms", "value": "10"}]}]}))
    [event] = conn.receive_data(frame(19, 5, 1, body, flexible=True))
    [topic] = CreateTopicsRequest.from_body(event.body).topics
    assert topic.configs == {"retention.ms": None, "segment.ms": "10"}


@pytest.mark.parametrize("version", [9, 10])
def test_a_fetch_before_v10_gets_unsupported_compression_for_a_partition_holding_zstd(version):
    # KIP-110: clients before Fetch v10 cannot read zstd; the other partitions are served
    from tidelog.protocol.kafka.records import to_stored
    from tidelog.protocol.messages import FetchPartitionResponse, FetchResponse, FetchTopicResponse
    from tidelog.protocol.records import Codec, build_batch, kafka_batch

    plain = build_batch([b"p"], timestamp_ms=1)
    zstd = build_batch([b"z"], codec=Codec.ZSTD, base_offset=1, timestamp_ms=1)
    answer = FetchResponse([FetchTopicResponse("t", [
        FetchPartitionResponse(0, 0, 5, 0, plain + zstd),  # Tidelog-encoded: translated
        FetchPartitionResponse(1, 0, 5, 0, to_stored(kafka_batch(zstd))),  # a Kafka client's, as stored
        FetchPartitionResponse(2, 0, 5, 0, plain)])])
    body = bytes(codec("FetchRequest", version).encode({"topics": [{"topic": "t", "partitions": [
        {"partition": p} for p in range(3)]}]}))
    conn = KafkaServerConnection()
    conn.receive_data(frame(1, version, 1, body, flexible=False))
    _, rest = response_of(conn.send_response(1, answer))
    parts = codec("FetchResponse", version).decode_all(rest)["responses"][0]["partitions"]
    if version < 10:
        assert [p["error_code"] for p in parts] == [76, 76, 0]
        assert [p["high_watermark"] for p in parts] == [-1, -1, 5]
        assert not parts[0]["records"] and not parts[1]["records"] and parts[2]["records"]
    else:
        assert [p["error_code"] for p in parts] == [0, 0, 0] and all(p["records"] for p in parts)


@pytest.mark.parametrize("client_id, decoded", [(b"caf\xe9", "caf\ufffd"), (b"\xff\xfe-ok", "\ufffd\ufffd-ok"),
                                                (b"ok", "ok")])
def test_a_client_id_that_is_not_utf_8_is_served_with_replacement_characters(client_id, decoded):
    # as Java's Kafka decodes it: the request is served, not the connection closed
    body = bytes(codec("MetadataRequest", 1).encode({"topics": [{"name": "t"}]}))
    head = struct.pack(">hhih", 3, 1, 5, len(client_id)) + client_id
    [event] = KafkaServerConnection().receive_data(struct.pack(">i", len(head) + len(body)) + head + body)
    assert isinstance(event, KafkaRequest) and event.header.client_id == decoded and event.body["topics"] == ["t"]


@pytest.mark.parametrize("key, spec, version, throttles", [
    (0, "ProduceRequest", 5, False), (0, "ProduceRequest", 6, True), (1, "FetchRequest", 7, False),
    (1, "FetchRequest", 8, True), (3, "MetadataRequest", 5, False), (3, "MetadataRequest", 6, True),
    (23, "OffsetForLeaderEpochRequest", 4, False), (60, "DescribeClusterRequest", 1, False)])
def test_a_request_says_whether_its_client_waits_out_a_throttle_itself(key, spec, version, throttles):
    # Kafka's shouldClientThrottle per response (KIP-219): the broker then answers at once
    body = bytes(codec(spec, version).encode({}))
    flexible = {23: 4, 60: 0, 3: 9, 1: 12, 0: 9}[key] <= version
    [event] = KafkaServerConnection().receive_data(frame(key, version, 1, body, flexible=flexible))
    assert isinstance(event, KafkaRequest) and event.client_throttles is throttles


def test_a_waiting_produce_holds_the_names_it_may_answer_never_its_records():
    # a waiting request holds its decoded request, never its records (docs/architecture.md):
    # an error answer only needs the topic names and partition indexes
    from tidelog.protocol.records import build_batch

    batch = bytearray(build_batch([b"x" * 100] * 10))
    batch[16] = 2  # a Kafka client's magic
    body = bytes(codec("ProduceRequest", 9).encode({"acks": -1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": bytes(batch)}, {"index": 1, "records": None}]}]}))
    conn = KafkaServerConnection()
    [event] = conn.receive_data(frame(0, 9, 5, body, flexible=True))
    assert isinstance(event, KafkaRequest) and event.body["topic_data"][0]["partition_data"][0]["records"]
    held = repr(conn._unanswered(5).meta)
    assert "records" not in held and "xxxx" not in held
    _, rest = response_of(conn.send_response(5, {"error_code": 29, "error_message": "no"}))
    [topic] = codec("ProduceResponse", 9).decode_all(rest[1:])["responses"]
    assert topic["name"] == "t" and [(p["index"], p["error_code"]) for p in topic["partition_responses"]] == [
        (0, 29), (1, 29)]


def test_a_fetch_answer_of_few_large_records_to_translate_is_encoded_aside():
    # translation costs by the byte too: a few records of large values, or a compressed
    # batch (whose recompression dominates), are as slow as thousands of small ones
    from tidelog.protocol.messages import FetchPartitionResponse, FetchResponse, FetchTopicResponse
    from tidelog.protocol.records import Codec, build_batch

    def fetch_answer(values, codec=Codec.NONE):
        batch = build_batch(values, timestamp_ms=1, codec=codec)
        return FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0, 10, 0, batch)])])

    body = bytes(codec("FetchRequest", 12).encode({"topics": [{"topic": "t", "partitions": [{"partition": 0}]}]}))
    conn = KafkaServerConnection()
    conn.receive_data(b"".join(frame(1, 12, i, body, flexible=True) for i in (1, 2, 3, 4)))
    assert conn.slow_encoder(1, fetch_answer([b"v" * 1000] * 10)) is None  # small: encoded in place
    assert conn.slow_encoder(2, fetch_answer([b"v" * 1_000_000] * 3)) is not None
    assert conn.slow_encoder(3, fetch_answer([b"v" * 1000] * 10, Codec.GZIP)) is None
    noise = random.Random(1).randbytes(40_000)  # stored as large as it is: recompressed slowly
    assert conn.slow_encoder(4, fetch_answer([noise] * 10, Codec.GZIP)) is not None


def test_a_batch_that_fails_translation_fails_only_its_partition():
    from tidelog.protocol.errors import UNKNOWN_SERVER_ERROR
    from tidelog.protocol.messages import FetchPartitionResponse, FetchResponse, FetchTopicResponse
    from tidelog.protocol.records import HEADER_SIZE, build_batch

    good = build_batch([b"a", b"b"], timestamp_ms=1)
    bad = bytearray(build_batch([b"c"], timestamp_ms=1))
    bad[HEADER_SIZE:] = b"\xc1" * (len(bad) - HEADER_SIZE)  # not msgpack
    answer = FetchResponse([FetchTopicResponse("t", [FetchPartitionResponse(0, 0, 2, 0, good),
                                                     FetchPartitionResponse(1, 0, 1, 0, bytes(bad))])])
    body = bytes(codec("FetchRequest", 12).encode({"topics": [{"topic": "t", "partitions": [
        {"partition": 0}, {"partition": 1}]}]}))
    conn = KafkaServerConnection()
    conn.receive_data(frame(1, 12, 1, body, flexible=True))
    _, rest = response_of(conn.send_response(1, answer))
    decoded = codec("FetchResponse", 12).decode_all(rest[1:])
    assert decoded["error_code"] == 0
    first, second = decoded["responses"][0]["partitions"]
    assert (first["error_code"], first["records"][16]) == (0, 2)
    assert (second["partition_index"], second["error_code"], second["records"]) == (1, UNKNOWN_SERVER_ERROR.code, None)


def test_describe_configs_gives_each_value_the_source_the_broker_names():
    # kafka-configs keeps only DYNAMIC_BROKER_CONFIG entries of a broker (--delete-config too)
    from tidelog.protocol.messages import ConfigEntry, DescribeConfigsResponse, DescribeConfigsResult

    entries = [ConfigEntry("leader.replication.throttled.rate", "200", is_default=False, source=2),
               ConfigEntry("follower.replication.throttled.rate", "100", is_default=False, source=3),
               ConfigEntry("zookeeper.connect", "zk:2181", read_only=True, is_default=False, source=4),
               ConfigEntry("num.partitions", "1", read_only=True, source=5),
               ConfigEntry("log.dirs", "/data", read_only=True, is_default=False)]  # a broker not saying
    body = bytes(codec("DescribeConfigsRequest", 4).encode({"resources": [
        {"resource_type": 4, "resource_name": "1", "configuration_keys": None}]}))
    conn = KafkaServerConnection()
    conn.receive_data(frame(32, 4, 3, body, flexible=True))
    answer = DescribeConfigsResponse([DescribeConfigsResult(0, 4, "1", entries)])
    decoded = codec("DescribeConfigsResponse", 4).decode_all(response_of(conn.send_response(3, answer))[1][1:])
    [result] = decoded["results"]
    assert [(c["name"], c["config_source"]) for c in result["configs"]] == [
        ("leader.replication.throttled.rate", 2), ("follower.replication.throttled.rate", 3),
        ("zookeeper.connect", 4), ("num.partitions", 5), ("log.dirs", 4)]


def test_a_fetched_batch_is_decompressed_within_the_bound_its_topic_gives():
    from tidelog.protocol.errors import UNKNOWN_SERVER_ERROR
    from tidelog.protocol.kafka.apis import INFLATION_BOUND
    from tidelog.protocol.records import Codec, build_batch

    batch = build_batch([b"v" * 10_000], timestamp_ms=1, codec=Codec.GZIP)  # inflates to 10 KB and more
    body = bytes(codec("FetchRequest", 12).encode({"topics": [{"topic": "t", "partitions": [
        {"partition": 0}, {"partition": 1}]}]}))
    conn = KafkaServerConnection()
    conn.receive_data(frame(1, 12, 1, body, flexible=True))
    answer = {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "error_code": 0, "high_watermark": 1, "records": batch, INFLATION_BOUND: 1000},
        {"partition_index": 1, "error_code": 0, "high_watermark": 1, "records": batch, INFLATION_BOUND: 1 << 20}]}]}
    decoded = codec("FetchResponse", 12).decode_all(response_of(conn.send_response(1, answer))[1][1:])
    small, large = decoded["responses"][0]["partitions"]
    assert (small["error_code"], small["records"]) == (UNKNOWN_SERVER_ERROR.code, None)
    assert large["error_code"] == 0 and large["records"][16] == 2
