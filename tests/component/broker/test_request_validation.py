"""Requests refused before anything is done, through the broker's API layer (broker/apis.py)
over a real ReplicaManager, LogManager, MetadataCache and GroupCoordinator (one broker, no
sockets, no ZooKeeper) and a controller whose ZooKeeper is a dict (issue 14, point 1).

Each case goes in as a decoded body, as the network layer hands it over: a refusal by the
sans-IO layer is an InvalidRequestError raised by ``Apis.handle`` (which the network layer
answers with INVALID_REQUEST), and nothing was written, created or deleted; the others are
answered with Kafka's per-topic or per-partition error.
"""

from __future__ import annotations

import os
import struct

import pytest
import trio

from tests.unit.controller.test_request_validation import FakeZk
from tidelog.broker.apis import Apis
from tidelog.broker.context import RequestContext
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerContext
from tidelog.broker.groups.group_coordinator import OFFSETS_TOPIC, CoordinatorConfig, GroupCoordinator
from tidelog.broker.groups.group_metadata import GroupConfig
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.network import SocketServer
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager
from tidelog.broker.zookeeper.layout import BrokerInfo, ControllerMovedError
from tidelog.protocol.codec import ApiKey, RequestHeader
from tidelog.protocol.errors import (
    INVALID_CONFIG,
    INVALID_GROUP_ID,
    INVALID_PARTITIONS,
    INVALID_REPLICATION_FACTOR,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    NOT_CONTROLLER,
    UNKNOWN_TOPIC_OR_PARTITION,
    InvalidRequestError,
    TidelogError,
)
from tidelog.protocol.kafka.schema import codec
from tidelog.protocol.messages import (
    TOPIC_RESOURCE,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    FindCoordinatorResponse,
    LeaderAndIsrRequest,
    LiveBroker,
    MetadataResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    PartitionState,
    UpdateMetadataRequest,
)
from tidelog.protocol.records import build_batch, kafka_batch
from tidelog.protocol.topics import TopicPartition

OFFSETS_TP = TopicPartition(OFFSETS_TOPIC, 0)
DATA_TP = TopicPartition("orders", 0)
INT64_MAX = (1 << 63) - 1


def state(tp: TopicPartition) -> PartitionState:
    return PartitionState(tp.topic, tp.partition, 1, 1, 1, [1], 1, [1])


class InlineController(Controller):
    """The real controller's request methods, called inline (no event loop, no watches)."""

    async def call(self, fn):
        return await fn()


class BrokerStub:
    """What the handlers ask of the broker beyond its components; records auto-creations."""

    def __init__(self):
        self.auto_created: list[str] = []
        self.topic_overrides: dict = {}
        self.broker_epoch = 0

    async def auto_create_topics(self, names):
        self.auto_created += names


class Config:
    broker_id = 1
    auto_create_topics_enable = True
    delete_topic_enable = True


class Broker:
    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.log_manager = LogManager([log_dir], LogConfig(), broker_id=1)
        self.log_manager.startup()
        self.replica_manager = ReplicaManager(ReplicaConfig(1), self.log_manager, lambda t: LogConfig(),
                                              lambda leader: None)
        self.metadata = MetadataCache(1)
        self.metadata.update(UpdateMetadataRequest(1, 1, 0, [state(OFFSETS_TP), state(DATA_TP),
                                                              state(TopicPartition("coll.x", 0))],
                                                   [LiveBroker(1, "127.0.0.1", 9092)]))
        self.coordinator = GroupCoordinator(CoordinatorConfig(1, offsets_topic_num_partitions=1, group=GroupConfig(
            initial_rebalance_delay_ms=100, min_session_timeout_ms=10)), self.replica_manager, self.metadata)
        self.replica_manager.leadership_listeners[:] = [self.coordinator.on_leadership_change]
        self.zk = FakeZk()
        self.controller = InlineController(ControllerConfig(broker_id=1), self.zk)
        self.controller.ctx = ControllerContext(epoch=1, epoch_zk_version=0,
                                                brokers={1: BrokerInfo(1, "127.0.0.1", 9092)})
        self.broker = BrokerStub()
        self.apis = Apis(Config(), self.replica_manager, self.metadata, broker=self.broker,
                         controller=self.controller, group_coordinator=self.coordinator)

    async def call(self, api_key: ApiKey, body: dict):
        result = self.apis.handle(RequestContext(RequestHeader(api_key, 0, 1, "client"), "127.0.0.1:5000"), body)
        return await result if hasattr(result, "__await__") else result


@pytest.fixture
async def broker(tmp_path, nursery):
    b = Broker(str(tmp_path / "logs"))
    b.replica_manager.become_leader_or_follower(LeaderAndIsrRequest(1, 1, 0, [state(OFFSETS_TP), state(DATA_TP)]))
    await nursery.start(b.coordinator.run)
    with trio.fail_after(10):
        while b.coordinator.loading:
            await trio.sleep(0.01)
    yield b
    b.log_manager.shutdown()


def topic(name="t", n=1, **kw):
    return {"name": name, "num_partitions": n, "replication_factor": 1, **kw}


# -- refused before anything is done ---------------------------------------------------------------


@pytest.mark.parametrize("api_key, body, field", [
    (ApiKey.CREATE_TOPICS, {"topics": [topic()], "timeout_ms": -1}, "timeout_ms"),
    (ApiKey.CREATE_TOPICS, {"topics": [topic(assignments={"p0": [1]})], "validate_only": True}, "assignments"),
    (ApiKey.CREATE_PARTITIONS, {"topics": [{"name": "orders", "count": 5}], "timeout_ms": -1}, "timeout_ms"),
    (ApiKey.ELECT_LEADERS, {"topic_partitions": None, "timeout_ms": -1}, "timeout_ms"),
    (ApiKey.DELETE_TOPICS, {"topic_names": ["orders"], "timeout_ms": -1}, "timeout_ms"),
    (ApiKey.OFFSET_COMMIT, {"group_id": "g", "retention_time_ms": (1 << 64) - 1, "topics": [
        {"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 5}]}]}, "retention_time_ms"),
    (ApiKey.LEADER_AND_ISR, {"controller_id": 1, "controller_epoch": 1, "broker_epoch": 0, "partition_states": [
        {**state(DATA_TP).to_body(), "topic_name": "../victim"}]}, "topic_name"),
    (ApiKey.LEADER_AND_ISR, {"controller_id": 1, "controller_epoch": 1, "broker_epoch": 0, "partition_states": [
        {**state(DATA_TP).to_body(), "topic_name": "v" * 300}]}, "topic_name"),
    (ApiKey.STOP_REPLICA, {"controller_id": 1, "controller_epoch": 1, "broker_epoch": 0, "partitions": [
        {"topic_name": "../orders-0", "partition_index": 0, "delete_partition": True}]}, "topic_name"),
    (ApiKey.UPDATE_METADATA, {"controller_id": 1, "controller_epoch": 1, "broker_epoch": 0, "partition_states": [],
                              "live_brokers": [], "deleted_topics": ["orders/../../x"]}, "deleted_topics"),
], ids=["create-topics-timeout", "create-topics-assignment-key", "create-partitions-timeout",
        "elect-leaders-timeout", "delete-topics-timeout", "offset-commit-retention", "leader-and-isr-path",
        "leader-and-isr-long-name", "stop-replica-path", "update-metadata-path"])
async def test_refused_before_anything_is_done(broker, tmp_path, api_key, body, field):
    files_before = sorted(os.walk(tmp_path))
    with pytest.raises(InvalidRequestError) as refused:
        await broker.call(api_key, body)
    assert field in str(refused.value)
    assert broker.zk.writes == 0 and not broker.zk.assignments
    assert sorted(broker.metadata.topics) == sorted([OFFSETS_TOPIC, "orders", "coll.x"])
    assert sorted(os.walk(tmp_path)) == files_before  # no directory created, deleted or renamed


# -- answered per topic ---------------------------------------------------------------------------------


async def test_a_huge_create_topics_is_answered_invalid_partitions(broker):
    for validate_only in (True, False):
        response = CreateTopicsResponse.from_body((await broker.call(ApiKey.CREATE_TOPICS, {
            "topics": [topic("big", 2**31 - 1)], "validate_only": validate_only})).to_body())
        (r,) = response.topics
        assert r.error_code == INVALID_PARTITIONS.code and "max.partitions.per.topic" in r.error_message
    response = CreatePartitionsResponse.from_body((await broker.call(ApiKey.CREATE_PARTITIONS, {
        "topics": [{"name": "nope", "count": 3}, {"name": "../x", "count": 3}]})).to_body())
    assert [r.error_code for r in response.results] == [UNKNOWN_TOPIC_OR_PARTITION.code, INVALID_TOPIC_EXCEPTION.code]
    assert broker.zk.writes == 0


async def test_counts_no_client_would_send_are_answered_per_topic(broker):
    """A raw CreateTopics with a count that is neither positive nor -1 (the default): Kafka's
    INVALID_PARTITIONS / INVALID_REPLICATION_FACTOR, naming the value; nothing is written."""
    response = await broker.call(ApiKey.CREATE_TOPICS, {"topics": [
        topic("p0", 0), topic("p-2", -2), {**topic("rf0"), "replication_factor": 0},
        {**topic("rf-2"), "replication_factor": -2}]})
    codes = {r.name: (r.error_code, r.error_message) for r in response.topics}
    assert codes["p0"][0] == codes["p-2"][0] == INVALID_PARTITIONS.code
    assert codes["rf0"][0] == codes["rf-2"][0] == INVALID_REPLICATION_FACTOR.code
    assert codes["p-2"][1].endswith("got -2") and codes["rf0"][1].endswith("got 0")
    assert broker.zk.writes == 0


async def test_create_topics_answers_per_topic(broker):
    response = await broker.call(ApiKey.CREATE_TOPICS, {"topics": [
        topic("fine"), topic("a b"), topic("small-segments", configs={"segment.bytes": "100"}), topic("fine.2")]})
    codes = {r.name: (r.error_code, r.error_message) for r in response.topics}
    assert codes["fine"][0] == NONE.code and codes["fine.2"][0] == NONE.code
    assert codes["a b"][0] == INVALID_TOPIC_EXCEPTION.code
    assert codes["small-segments"][0] == INVALID_CONFIG.code
    assert "invalid value '100' for segment.bytes: must be at least 1048576" in codes["small-segments"][1]
    assert sorted(broker.zk.assignments) == ["fine", "fine.2"]


async def test_a_controller_that_resigned_while_the_call_was_queued_answers_not_controller_per_topic(broker):
    """Kafka's handlers answer each topic NOT_CONTROLLER when the broker is not the
    controller; so does a call refused because the controller moved while it waited."""
    async def moved(fn):
        raise ControllerMovedError("broker 1 is no longer the controller")
    broker.controller.call = moved
    created = await broker.call(ApiKey.CREATE_TOPICS, {"topics": [topic("a"), topic("b")]})
    grown = await broker.call(ApiKey.CREATE_PARTITIONS, {"topics": [{"name": "orders", "count": 3}]})
    deleted = await broker.call(ApiKey.DELETE_TOPICS, {"topic_names": ["orders"]})
    assert [(r.name, r.error_code) for r in created.topics] == [("a", NOT_CONTROLLER.code), ("b", NOT_CONTROLLER.code)]
    assert [(r.name, r.error_code) for r in grown.results] == [("orders", NOT_CONTROLLER.code)]
    assert [(r.name, r.error_code) for r in deleted.responses] == [("orders", NOT_CONTROLLER.code)]
    assert "no longer the controller" in created.topics[0].error_message


def resign_while_queued(broker):
    async def moved(fn):
        raise ControllerMovedError("broker 1 is no longer the controller")
    broker.controller.call = moved


def not_the_controller(broker):
    broker.controller.ctx = None


@pytest.mark.parametrize("refuse", [resign_while_queued, not_the_controller])
async def test_elections_and_config_changes_off_the_controller_answer_not_controller_per_item(broker, refuse):
    """Kafka answers ElectLeaders NOT_CONTROLLER per partition (of a null list, each partition
    the broker knows) and AlterConfigs per resource, under a top-level NONE, whether the
    broker is not the controller or resigned while the call was queued."""
    refuse(broker)
    named = await broker.call(ApiKey.ELECT_LEADERS, {"topic_partitions": [
        {"topic_name": "orders", "partition_index": 0}, {"topic_name": "nope", "partition_index": 3}]})
    assert named.error_code == NONE.code
    assert [(r.topic_name, r.partition_index, r.error_code) for r in named.results] == [
        ("orders", 0, NOT_CONTROLLER.code), ("nope", 3, NOT_CONTROLLER.code)]
    assert "is not the controller" in named.results[0].error_message \
        or "no longer the controller" in named.results[0].error_message
    every = await broker.call(ApiKey.ELECT_LEADERS, {"topic_partitions": None, "election_type": 1})
    assert every.error_code == NONE.code
    assert sorted((r.topic_name, r.partition_index) for r in every.results) == [
        (OFFSETS_TOPIC, 0), ("coll.x", 0), ("orders", 0)]
    assert {r.error_code for r in every.results} == {NOT_CONTROLLER.code}
    altered = await broker.call(ApiKey.ALTER_CONFIGS, {"resources": [
        {"resource_type": TOPIC_RESOURCE, "resource_name": "orders", "configs": {"retention.ms": "1000"}}]})
    assert [(r.resource_name, r.error_code) for r in altered.responses] == [("orders", NOT_CONTROLLER.code)]


async def test_an_election_of_every_partition_by_a_broker_that_knows_none_is_refused_as_a_whole(broker):
    """Nothing to answer NOT_CONTROLLER for: the request is (the client must not read "no
    partition needed an election")."""
    not_the_controller(broker)
    broker.metadata = broker.apis.metadata = MetadataCache(1)
    with pytest.raises(TidelogError) as refused:  # the network layer's error body
        await broker.call(ApiKey.ELECT_LEADERS, {"topic_partitions": None})
    assert refused.value.error is NOT_CONTROLLER


@pytest.mark.parametrize("refuse", [resign_while_queued, not_the_controller])
async def test_reassignments_off_the_controller_are_refused_as_a_whole(broker, refuse):
    """As Kafka's controller answers them: a top-level NOT_CONTROLLER (the network layer's
    error body), which the admin client retries on the new controller."""
    refuse(broker)
    for api_key, body in ((ApiKey.ALTER_PARTITION_REASSIGNMENTS, {"topics": [
                               {"name": "orders", "partitions": [{"partition_index": 0, "replicas": [1]}]}]}),
                          (ApiKey.LIST_PARTITION_REASSIGNMENTS, {"topics": None})):
        with pytest.raises(TidelogError) as refused:
            await broker.call(api_key, body)
        assert refused.value.error is NOT_CONTROLLER


async def test_metadata_answers_invalid_names_and_creates_none_of_them(broker):
    names = ["../x", "a b", "", "x" * 250, "coll_x", OFFSETS_TOPIC, "new-one", "new-one"]
    response: MetadataResponse = await broker.call(ApiKey.METADATA, {"topics": names, "allow_auto_topic_creation": True})
    by_name = {t.name: t for t in response.topics}
    for bad in names[:4]:
        assert by_name[bad].error_code == INVALID_TOPIC_EXCEPTION.code and "topic name" in by_name[bad].error_message
    assert by_name["coll_x"].error_code == INVALID_TOPIC_EXCEPTION.code
    assert "collides with existing topic 'coll.x'" in by_name["coll_x"].error_message
    assert by_name[OFFSETS_TOPIC].error_code == NONE.code
    # only the valid, new, non-colliding name was auto-created, once; never an internal topic
    assert broker.broker.auto_created == ["new-one"]


# -- OffsetCommit --------------------------------------------------------------------------------------


def commit(topics, **kw):
    return {"group_id": "g", "topics": [{"name": n, "partitions": [{"partition_index": p, "committed_offset": 7}]}
                                        for n, p in topics], **kw}


async def test_offsets_are_committed_for_existing_partitions_only(broker):
    """Kafka refuses unknown partitions (UNKNOWN_TOPIC_OR_PARTITION), whatever the group's state;
    the valid ones of the same request are committed."""
    hostile = [("../../etc/passwd", -1), ("../../etc/passwd", 0), ("orders", -1), ("orders", 1), ("nope", 0),
               ("a\x00b", 0)]
    response: OffsetCommitResponse = await broker.call(ApiKey.OFFSET_COMMIT, commit([*hostile, ("orders", 0)]))
    codes = {(t.name, p.partition_index): (p.error_code, p.error_message) for t in response.topics for p in t.partitions}
    for key in hostile:
        assert codes[key][0] == UNKNOWN_TOPIC_OR_PARTITION.code, key
        assert "offsets are committed for existing partitions only" in codes[key][1]
    assert codes[("orders", 0)][0] == NONE.code
    fetched: OffsetFetchResponse = await broker.call(ApiKey.OFFSET_FETCH, {"group_id": "g", "topics": None})
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in fetched.topics] == [("orders", [0])]


async def test_unknown_partitions_do_not_create_a_group(broker):
    await broker.call(ApiKey.OFFSET_COMMIT, commit([("nope", 0)], group_id="ghost"))
    assert "ghost" not in broker.coordinator.groups


async def test_the_longest_retention_is_stored_without_overflow(broker):
    response = await broker.call(ApiKey.OFFSET_COMMIT, commit([("orders", 0)], retention_time_ms=INT64_MAX))
    assert response.topics[0].partitions[0].error_code == NONE.code
    stored = broker.coordinator.groups["g"].offsets[DATA_TP]
    assert stored.expire_timestamp_ms == INT64_MAX


async def test_group_ids_longer_than_a_protocol_string_are_invalid(broker):
    long_id = "g" * 32768
    response: FindCoordinatorResponse = await broker.call(ApiKey.FIND_COORDINATOR, {"key": long_id})
    assert response.error_code == INVALID_GROUP_ID.code
    response = await broker.call(ApiKey.OFFSET_COMMIT, commit([("orders", 0)], group_id="é" * 16384))
    assert response.topics[0].partitions[0].error_code == INVALID_GROUP_ID.code
    response = await broker.call(ApiKey.OFFSET_COMMIT, commit([("orders", 0)], group_id="g" * 32767))
    assert response.topics[0].partitions[0].error_code == NONE.code


# -- names that are not UTF-8, from a Kafka client ------------------------------------------------------


def _kafka_frame(key: int, version: int, correlation_id: int, spec: str, body: dict,
                 replace: tuple[bytes, bytes] = (b"", b"")) -> bytes:
    """A request of a non-flexible version; ``replace`` swaps bytes of the encoded body for
    others of the same length (a name that is not UTF-8, which the codec cannot encode)."""
    data = bytes(codec(spec, version).encode(body))
    old, new = replace
    assert len(old) == len(new) and (not old or data.count(old) == 1)
    data = data.replace(old, new)
    head = struct.pack(">hhih", key, version, correlation_id, 3) + b"app"
    return struct.pack(">i", len(head) + len(data)) + head + data


async def _kafka_answer(stream: trio.SocketStream, spec: str, version: int) -> tuple[int, dict]:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = await stream.receive_some(65536)
        assert chunk, "the connection closed"
        data += chunk
    return struct.unpack_from(">i", data, 4)[0], codec(spec, version).decode_all(data[8:])


async def test_names_that_are_not_utf_8_are_refused_per_topic_and_the_connection_goes_on(broker, tmp_path, nursery):
    # Java's Kafka reads them with replacement characters, then refuses the name as invalid
    port = await nursery.start(SocketServer(broker.apis.handle, wire="kafka").run)
    bad, placeholder = b"caf\xe9-\xff", b"cafe-X"
    files_before = sorted(os.walk(tmp_path))
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(_kafka_frame(19, 4, 1, "CreateTopicsRequest", {"timeout_ms": 1000, "topics": [
            {"name": placeholder.decode(), "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": []}]}, (placeholder, bad)))
        correlation_id, created = await _kafka_answer(stream, "CreateTopicsResponse", 4)
        [t] = created["topics"]
        assert correlation_id == 1 and t["name"] == "caf\ufffd-\ufffd"
        assert t["error_code"] == INVALID_TOPIC_EXCEPTION.code and "topic name" in t["error_message"]

        batch = kafka_batch(build_batch([b"x"], timestamp_ms=0))
        await stream.send_all(_kafka_frame(0, 8, 2, "ProduceRequest", {"acks": 1, "timeout_ms": 1000, "topic_data": [
            {"name": placeholder.decode(), "partition_data": [{"index": 0, "records": batch}]}]}, (placeholder, bad)))
        correlation_id, produced = await _kafka_answer(stream, "ProduceResponse", 8)
        [t] = produced["responses"]
        assert correlation_id == 2 and t["name"] == "caf\ufffd-\ufffd"
        assert [p["error_code"] for p in t["partition_responses"]] == [UNKNOWN_TOPIC_OR_PARTITION.code]

        await stream.send_all(_kafka_frame(3, 4, 3, "MetadataRequest", {
            "topics": [{"name": placeholder.decode()}, {"name": "orders"}], "allow_auto_topic_creation": True},
            (placeholder, bad)))
        correlation_id, metadata = await _kafka_answer(stream, "MetadataResponse", 4)
        assert correlation_id == 3
        assert [(t["name"], t["error_code"]) for t in metadata["topics"]] == [
            ("caf\ufffd-\ufffd", INVALID_TOPIC_EXCEPTION.code), ("orders", NONE.code)]
    assert broker.zk.writes == 0 and not broker.zk.assignments and broker.broker.auto_created == []
    assert sorted(os.walk(tmp_path)) == files_before  # no directory created
