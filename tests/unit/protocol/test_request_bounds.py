"""What the sans-IO layer refuses before a broker acts (issue 14, point 1): the object bound
of a decoded frame, Kafka's integer types and the narrower ranges of requests' fields, the
partition numbers of a CreateTopics assignment, and topic names in the controller's requests.
Each refusal is an InvalidRequestError (INVALID_REQUEST) whose message names the field."""

from __future__ import annotations

import struct

import msgpack
import pytest

from tidelog.protocol import codec
from tidelog.protocol.codec import ApiKey, RequestHeader, decode_request, encode_request
from tidelog.protocol.errors import INVALID_REQUEST, INVALID_TOPIC_EXCEPTION, InvalidRequestError, TidelogError
from tidelog.protocol.messages import (
    CreatableTopic,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteRecordsRequest,
    DeleteTopicsRequest,
    ElectLeadersRequest,
    FetchRequest,
    LeaderAndIsrRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    PartitionProduceData,
    PartitionState,
    ProduceRequest,
    StopReplicaRequest,
    TopicProduceData,
    UpdateMetadataRequest,
)
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import (
    MAX_TOPIC_NAME_LENGTH,
    TopicPartition,
    collides,
    partition_problem,
    topic_name_problem,
    validate_topic_name,
)

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def array32(n: int) -> bytes:
    return b"\xdd" + struct.pack(">I", n)


def request_frame(body: bytes, correlation_id: int = 77) -> bytes:
    """A request envelope around raw msgpack ``body`` bytes (a map or anything else)."""
    return b"\x95" + msgpack.packb(ApiKey.METADATA) + b"\x00" + msgpack.packb(correlation_id) + b"\xc0" + body


# -- the object bound ----------------------------------------------------------------------------


def test_a_frame_up_to_the_floor_is_not_counted_at_all():
    # 900,000 empty maps in 900 kB: as many objects as bytes, which the floor allows
    frame = request_frame(b"\x81\xa1x" + array32(900_000) + b"\x80" * 900_000)
    header, body = decode_request(frame)
    assert header.correlation_id == 77 and len(body["x"]) == 900_000


@pytest.mark.parametrize("element", [b"\x80", b"\x90", b"\xa2ab", b"\x81\xa1a\xc0", b"\xcd\x12\x34", b"\xc0"],
                         ids=["empty-map", "empty-array", "short-str", "one-entry-map", "uint16", "nil"])
def test_a_large_frame_of_small_objects_is_refused_at_the_bound(element):
    """20 MiB of tiny objects (in arrays of 2^20, the container bound): an empty map is one byte
    and ~70 bytes of Python objects; decoding stops once the count passes the bound."""
    per_array = 1 << 20
    arrays = (20 << 20) // (len(element) * per_array)
    body = b"\x81\xa1x" + array32(arrays) + (array32(per_array) + element * per_array) * arrays
    frame = request_frame(body, correlation_id=4242)
    assert len(frame) // codec.BYTES_PER_OBJECT < codec.MAX_OBJECTS_FLOOR < arrays * per_array
    with pytest.raises(InvalidRequestError) as refused:
        decode_request(frame)
    assert refused.value.correlation_id == 4242  # so the client gets an answer
    assert refused.value.error is INVALID_REQUEST
    assert f"more than {codec.MAX_OBJECTS_FLOOR} objects" in str(refused.value)


def test_the_bound_grows_with_the_frame(monkeypatch):
    monkeypatch.setattr(codec, "MAX_OBJECTS_FLOOR", 1000)
    assert codec.max_objects(10_000) == 1000
    assert codec.max_objects(640_000) == 10_000
    pad = b"\xa3pad" + b"\xdb" + struct.pack(">I", 640_000) + b"p" * 640_000

    def maps(n: int) -> bytes:  # n empty maps in two arrays
        return b"\x82\xa1x" + array32(2) + (array32(n // 2) + b"\x80" * (n // 2)) * 2 + pad

    # ~640 kB of frame: ~10,000 objects, containers counting twice (as an element, and as one)
    decode_request(request_frame(maps(4800)))
    with pytest.raises(InvalidRequestError, match=r"decodes into more than 10\d\d\d objects"):
        decode_request(request_frame(maps(5400)))


def test_a_real_large_produce_frame_decodes():
    batch = build_batch([b"v" * 1000] * 3000)  # 3 MB of records: a few objects, one bin
    frame = encode_request(RequestHeader(ApiKey.PRODUCE, 0, 5, "p"), ProduceRequest(
        -1, 1000, [TopicProduceData("t", [PartitionProduceData(p, batch) for p in range(4)])]))
    assert len(frame) > codec.MAX_OBJECTS_FLOOR
    header, body = decode_request(frame)
    assert body["topic_data"][0]["partition_data"][3]["records"] == batch


def test_deeply_nested_small_containers_are_counted_too(monkeypatch):
    monkeypatch.setattr(codec, "MAX_OBJECTS_FLOOR", 100)
    # 3 x 1,500 arrays nested 10 deep, each holding one nil: ~50,000 objects in ~150 kB
    item = b"\x91" * 10 + b"\xc0"
    body = (b"\x82\xa1x" + array32(3) + (array32(1500) + item * 1500) * 3
            + b"\xa3pad" + b"\xdb" + struct.pack(">I", 100_000) + b"p" * 100_000)
    frame = request_frame(body)
    assert codec.max_objects(len(frame)) < 45_000
    with pytest.raises(InvalidRequestError, match="objects"):
        decode_request(frame)


# -- field ranges ----------------------------------------------------------------------------------


def topic(**kw):
    return {"name": "t", "num_partitions": 1, "replication_factor": 1, **kw}


def state(**kw):
    return {"topic_name": "t", "partition_index": 0, "controller_epoch": 1, "leader": 1, "leader_epoch": 0,
            "isr": [1], "zk_version": 0, "replicas": [1], **kw}


def controller_request(**kw):
    return {"controller_id": 1, "controller_epoch": 1, "broker_epoch": 5, **kw}


REFUSED = [
    # CreateTopics
    (CreateTopicsRequest, {"topics": [topic()], "timeout_ms": -1}, "timeout_ms: -1 is out of range"),
    (CreateTopicsRequest, {"topics": [topic(num_partitions=1 << 31)]}, "topics[0].num_partitions: 2147483648 is out of range"),
    (CreateTopicsRequest, {"topics": [topic(replication_factor=1 << 15)]}, "replication_factor: 32768 is out of range"),
    (CreateTopicsRequest, {"topics": [topic(assignments={"x": [1]})]}, "topics[0]: assignments: key 'x' is not a partition number"),
    (CreateTopicsRequest, {"topics": [topic(assignments={"-1": [1]})]}, "key '-1' is not a partition number"),
    (CreateTopicsRequest, {"topics": [topic(assignments={"01": [1]})]}, "key '01' is not a partition number"),
    (CreateTopicsRequest, {"topics": [topic(assignments={"2147483648": [1]})]}, "key '2147483648' is not a partition number"),
    (CreateTopicsRequest, {"topics": [topic(assignments={"٣": [1]})]}, "is not a partition number"),
    (CreateTopicsRequest, {"topics": [topic(assignments={"0": [1 << 40]})]}, "assignments['0'][0]: 1099511627776 is out of range"),
    # CreatePartitions, DeleteTopics, ElectLeaders, DeleteRecords: a negative timeout is refused before any work
    (CreatePartitionsRequest, {"topics": [{"name": "t", "count": 3}], "timeout_ms": -5}, "timeout_ms: -5 is out of range"),
    (CreatePartitionsRequest, {"topics": [{"name": "t", "count": 1 << 31}]}, "topics[0].count"),
    (DeleteTopicsRequest, {"topic_names": ["t"], "timeout_ms": -1}, "timeout_ms"),
    (ElectLeadersRequest, {"topic_partitions": None, "timeout_ms": -1}, "timeout_ms: -1 is out of range"),
    (ElectLeadersRequest, {"topic_partitions": [{"topic_name": "t", "partition_index": 1 << 31}]},
     "topic_partitions[0].partition_index"),
    (DeleteRecordsRequest, {"topics": [], "timeout_ms": -1}, "timeout_ms"),
    # OffsetCommit: retention is -1 or an int64
    (OffsetCommitRequest, {"group_id": "g", "topics": [], "retention_time_ms": (1 << 64) - 1},
     "retention_time_ms: 18446744073709551615 is out of range [-1, 9223372036854775807]"),
    (OffsetCommitRequest, {"group_id": "g", "topics": [], "retention_time_ms": -2}, "retention_time_ms: -2"),
    # data APIs
    (ProduceRequest, {"acks": 1, "timeout_ms": -1, "topic_data": []}, "timeout_ms: -1 is out of range"),
    (FetchRequest, {"topics": [], "max_wait_ms": -1}, "max_wait_ms"),
    (FetchRequest, {"topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0,
                                                              "partition_max_bytes": -5}]}]}, "partition_max_bytes"),
    (FetchRequest, {"topics": [], "replica_epoch": 1 << 63}, "replica_epoch"),
    (ListOffsetsRequest, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "timestamp": 1 << 63}]}]},
     "topics[0].partitions[0].timestamp"),
    # the controller's requests: topic names become directory names
    (LeaderAndIsrRequest, controller_request(partition_states=[state(topic_name="../victim")]),
     "partition_states[0]: topic_name: topic name '../victim' contains characters other than"),
    (LeaderAndIsrRequest, controller_request(partition_states=[state(topic_name="v" * 300)]),
     "partition_states[0]: topic_name: topic name is 300 characters, the maximum is 249"),
    (LeaderAndIsrRequest, controller_request(partition_states=[state(topic_name="a\x00b")]), "topic_name"),
    (LeaderAndIsrRequest, controller_request(partition_states=[state(topic_name="..")]), "'..' is not allowed"),
    (LeaderAndIsrRequest, controller_request(partition_states=[state(topic_name="/etc")]), "topic_name"),
    (LeaderAndIsrRequest, controller_request(partition_states=[state(partition_index=-1)]),
     "partition_states[0].partition_index: -1 is out of range"),
    (LeaderAndIsrRequest, controller_request(partition_states=[], topic_configs={"../x": {}}), "topic_configs"),
    (LeaderAndIsrRequest, controller_request(partition_states=[], broker_epoch=1 << 63), "broker_epoch"),
    (LeaderAndIsrRequest, controller_request(partition_states=[], live_leaders=[
        {"broker_id": 1, "host": "h", "port": 70000}]), "live_leaders[0].port: 70000 is out of range"),
    (StopReplicaRequest, controller_request(partitions=[{"topic_name": "../victim", "partition_index": 0,
                                                         "delete_partition": True}]), "partitions[0]: topic_name"),
    (StopReplicaRequest, controller_request(partitions=[{"topic_name": "t", "partition_index": -1}]),
     "partitions[0].partition_index"),
    (UpdateMetadataRequest, controller_request(partition_states=[], live_brokers=[], deleted_topics=["a/b"]),
     "deleted_topics: topic name 'a/b'"),
    (UpdateMetadataRequest, controller_request(partition_states=[state(topic_name="a b")], live_brokers=[]),
     "partition_states[0]: topic_name"),
]


@pytest.mark.parametrize("cls, body, message", REFUSED, ids=[f"{c.__name__}-{i}" for i, (c, _, _) in enumerate(REFUSED)])
def test_out_of_range_fields_are_refused_naming_the_field(cls, body, message):
    with pytest.raises(InvalidRequestError) as refused:
        cls.from_body(body)
    assert refused.value.error is INVALID_REQUEST
    assert message in str(refused.value)


ACCEPTED = [
    (CreateTopicsRequest, {"topics": [topic(assignments={"0": [1], "1": [2], "10": [3], "2147483647": [1]})],
                           "timeout_ms": 0}),
    (CreateTopicsRequest, {"topics": [topic(num_partitions=-1, replication_factor=-1)]}),
    (OffsetCommitRequest, {"group_id": "g", "topics": [], "retention_time_ms": INT64_MAX}),
    (OffsetCommitRequest, {"group_id": "g", "topics": [], "retention_time_ms": -1}),
    (ElectLeadersRequest, {"topic_partitions": None, "timeout_ms": 0}),
    (LeaderAndIsrRequest, controller_request(partition_states=[state(topic_name="a.b_c-D9", partition_index=INT32_MAX)],
                                             topic_configs={"a.b_c-D9": {"retention.ms": "1"}})),
    (FetchRequest, {"topics": [], "replica_id": -1, "max_wait_ms": 0, "min_bytes": -1}),
]


@pytest.mark.parametrize("cls, body", ACCEPTED, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(ACCEPTED)])
def test_values_at_the_edges_are_accepted_and_round_trip(cls, body):
    message = cls.from_body(body)
    assert cls.from_body(message.to_body()) == message


def test_a_client_cannot_build_an_assignment_keyed_by_anything_but_partitions():
    with pytest.raises(ValueError, match="not a partition number"):
        CreatableTopic("t", assignments={"zero": [1]})


def test_the_controller_cannot_build_a_state_for_an_invalid_topic():
    with pytest.raises(ValueError, match="topic_name"):
        PartitionState("../victim", 0, 1, 1, 0, [1], 0, [1])


# -- topic names ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", ".", "..", "a\n", "\na", "a/b", "a\\b", "../x", "/abs", "a\x00b", "a b", "é",
                                  "x" * (MAX_TOPIC_NAME_LENGTH + 1), "x" * 100_000])
def test_invalid_topic_names(name):
    assert topic_name_problem(name) is not None
    with pytest.raises(TidelogError) as refused:
        validate_topic_name(name)
    assert refused.value.error is INVALID_TOPIC_EXCEPTION


@pytest.mark.parametrize("name", ["a", "A-z.0_9", "...", "x" * MAX_TOPIC_NAME_LENGTH, "__consumer_offsets"])
def test_valid_topic_names(name):
    assert topic_name_problem(name) is None


def test_a_non_string_is_not_a_topic_name():
    assert topic_name_problem(5) == "topic name must be a string"


def test_names_that_differ_in_dots_and_underscores_collide():
    assert collides("coll.x", "coll_x") and collides("a_b.c", "a.b_c")
    assert not collides("coll.x", "coll.x") and not collides("coll.x", "coll-x")


@pytest.mark.parametrize("partition, ok", [(0, True), (INT32_MAX, True), (-1, False), (INT32_MAX + 1, False),
                                           (True, False), ("1", False)])
def test_partition_numbers(partition, ok):
    assert (partition_problem(partition) is None) == ok


@pytest.mark.parametrize("name", ["a\n-1", "-1", "a-", "a-01x", "a-01", "a-00", "a b-0", "a-2147483648", "..-0",
                                  "a-٣"])
def test_directory_names_that_are_not_partitions(name):
    with pytest.raises(ValueError):
        TopicPartition.parse_dir_name(name)


def test_directory_names_of_partitions():
    assert TopicPartition.parse_dir_name("my-topic-12") == TopicPartition("my-topic", 12)
    assert TopicPartition.parse_dir_name(f"t-{INT32_MAX}") == TopicPartition("t", INT32_MAX)
