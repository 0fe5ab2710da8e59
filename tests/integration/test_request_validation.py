"""Every request is validated before the broker acts (issue 14, points 1 and 2), against a real
broker process: the cases the issue lists, sent raw.

One single-broker cluster for the module, with ``max.partitions.per.topic`` and
``max.partitions.per.request`` raised to 1,000,000 so that the ZooKeeper bound (what one
assignment znode can hold) is reachable, auto-creation on, and a one-partition offsets topic.
Each case asserts the error code and message, then that a well-behaved SDK producer and
consumer, connected since the start, still work and that every record produced so far is
intact. At the end no request made a handler fail (no UNKNOWN_SERVER_ERROR in the broker's
log) and ``dump-log --verify`` passes on every segment.
"""

from __future__ import annotations

import os
import re
import struct
import time

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, log_tail, wait_topic_ready
from tests.support.disk import log_dir
from tests.support.raw_client import RawClient, split_frames
from tests.support.waiting import wait_until
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.broker.log.dump import run as dump_run
from tidelog.protocol.codec import MAX_OBJECTS_FLOOR, ApiKey, decode_response
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    INVALID_CONFIG,
    INVALID_GROUP_ID,
    INVALID_PARTITIONS,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tidelog.protocol.messages import (
    AlterConfigsResponse,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    FindCoordinatorResponse,
    MetadataResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)

TOPIC = "intact"
TP = TopicPartition(TOPIC, 0)
MAX_PARTITIONS = 1_000_000
INT64_MAX = (1 << 63) - 1


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("request-validation"), 1, {
        **FAST_FAILOVER, "auto.create.topics.enable": True, "offsets.topic.num.partitions": 1,
        "offsets.topic.replication.factor": 1, "max.partitions.per.topic": MAX_PARTITIONS,
        "max.partitions.per.request": MAX_PARTITIONS})


class Good:
    """A well-behaved SDK producer and consumer, open for the whole module: ``check`` produces
    one record with acks=all and reads the partition back up to it."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.producer = Producer(cluster.bootstrap, acks="all", linger_ms=0)
        self.consumer = Consumer(cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100)
        self.consumer.assign([TP])
        self.values: list[bytes] = []
        self.consumed: list[bytes] = []

    def check(self) -> None:
        assert self.cluster.brokers[1].running, "the broker process died"
        value = b"good-%d" % len(self.values)
        meta = self.producer.send(TOPIC, value).result(timeout=30)
        assert meta.offset == len(self.values)
        self.values.append(value)
        wait_until(lambda: self.consumed.extend(r.value for r in self.consumer.poll(timeout_ms=200))
                   or len(self.consumed) >= len(self.values), 30, "the consumer to read the new record")
        assert self.consumed == self.values

    def close(self) -> None:
        self.producer.close()
        self.consumer.close()


@pytest.fixture(scope="module")
def good(cluster):
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1), NewTopic("coll.x", 1, 1)])
    wait_topic_ready(cluster, TOPIC, 1, 1)
    client = Good(cluster)
    client.check()
    yield client
    client.check()
    client.close()
    broker_log = cluster.brokers[1].log_path.read_text(errors="replace")
    assert "handler failed on" not in broker_log, log_tail(cluster.brokers[1].log_path, 60)
    segments = [str(p) for p in log_dir(cluster, 1).glob("*/*.log")]
    assert segments
    with open(os.devnull, "w") as out:
        assert dump_run(segments, verify=True, out=out) == 0, "dump-log --verify failed"


def raw(cluster) -> RawClient:
    return RawClient(cluster.brokers[1].port, timeout=30)


def topics_in_cluster(cluster) -> set[str]:
    with raw(cluster) as r:
        return {t.name for t in MetadataResponse.from_body(r.request(ApiKey.METADATA, {"topics": None})).topics}


def invalid_request(response: dict, *words: str) -> None:
    assert response["error_code"] == INVALID_REQUEST.code, response
    for w in words:
        assert w in response["error_message"], (w, response)


def create_topics(cluster, topics: list[dict], **kw) -> CreateTopicsResponse:
    with raw(cluster) as r:
        started = time.monotonic()
        response = CreateTopicsResponse.from_body(r.request(ApiKey.CREATE_TOPICS, {"topics": topics, **kw}))
        assert time.monotonic() - started < 5, "a refusal must come at once"
        return response


# -- partition counts (the controller was killed by one CreateTopics) --------------------------------


@pytest.mark.parametrize("validate_only", [True, False])
@pytest.mark.parametrize("n", [2**31 - 1, 10**7])
def test_a_huge_partition_count_is_refused_at_once(cluster, good, n, validate_only):
    response = create_topics(cluster, [{"name": "huge", "num_partitions": n, "replication_factor": 1}],
                             validate_only=validate_only)
    (r,) = response.topics
    assert r.error_code == INVALID_PARTITIONS.code, r
    assert f"{n} partitions, more than max.partitions.per.topic={MAX_PARTITIONS}" in r.error_message
    assert "huge" not in topics_in_cluster(cluster)
    good.check()


def test_partitions_beyond_what_zookeeper_stores_are_refused(cluster, good):
    """10^6 partitions: the assignment znode would pass ZooKeeper's jute.maxbuffer (1 MiB);
    refused with the limit and how many partitions would fit, before anything is planned."""
    (r,) = create_topics(cluster, [{"name": "million", "num_partitions": 10**6, "replication_factor": 1}]).topics
    assert r.error_code == INVALID_PARTITIONS.code, r
    assert "jute.maxbuffer" in r.error_message
    fit = int(re.search(r"at most (\d+) such partitions fit", r.error_message).group(1))
    assert 80_000 < fit < 90_000
    assert "million" not in topics_in_cluster(cluster)
    good.check()


def test_the_partitions_of_a_whole_request_are_bounded(cluster, good):
    topics = [{"name": f"part-{i}", "num_partitions": 400_000, "replication_factor": 1} for i in range(3)]
    response = create_topics(cluster, topics, validate_only=True)
    assert [t.error_code for t in response.topics] == [INVALID_PARTITIONS.code] * 3
    assert f"1200000 partitions in all, more than max.partitions.per.request={MAX_PARTITIONS}" in \
        response.topics[0].error_message
    good.check()


# -- refused before the change is made (they were answered with an error after it) -----------------------


def test_negative_timeouts_are_refused_before_anything_is_done(cluster, good):
    with raw(cluster) as r:
        invalid_request(r.request(ApiKey.CREATE_TOPICS, {"topics": [
            {"name": "timeout-topic", "num_partitions": 1, "replication_factor": 1}], "timeout_ms": -1}),
            "timeout_ms: -1 is out of range")
        invalid_request(r.request(ApiKey.CREATE_PARTITIONS, {"topics": [{"name": TOPIC, "count": 2}],
                                                             "timeout_ms": -1000}), "timeout_ms")
        invalid_request(r.request(ApiKey.ELECT_LEADERS, {"topic_partitions": None, "timeout_ms": -1}), "timeout_ms")
        invalid_request(r.request(ApiKey.DELETE_TOPICS, {"topic_names": ["coll.x"], "timeout_ms": -1}), "timeout_ms")
        invalid_request(r.request(ApiKey.PRODUCE, {"acks": -1, "timeout_ms": -1, "topic_data": []}), "timeout_ms")
        invalid_request(r.request(ApiKey.FETCH, {"topics": [], "max_wait_ms": -1}), "max_wait_ms")
    time.sleep(0.5)  # what the controller would have propagated by now
    topics = topics_in_cluster(cluster)
    assert "timeout-topic" not in topics and "coll.x" in topics
    with raw(cluster) as r:
        md = MetadataResponse.from_body(r.request(ApiKey.METADATA, {"topics": [TOPIC]}))
    assert len(md.topics[0].partitions) == 1
    good.check()


def test_an_assignment_keyed_by_something_else_than_a_partition(cluster, good):
    with raw(cluster) as r:
        for key in ("x", "-1", "01", "1e3"):
            invalid_request(r.request(ApiKey.CREATE_TOPICS, {"topics": [
                {"name": "keyed", "assignments": {key: [1]}}], "validate_only": True}),
                f"topics[0]: assignments: key {key!r} is not a partition number")
    good.check()


# -- the controller's requests: topic names become paths ---------------------------------------------------


def controller_body(**kw) -> dict:
    return {"controller_id": 1, "controller_epoch": 1, "broker_epoch": 0, **kw}


def partition_state(topic: str, partition: int = 0) -> dict:
    return {"topic_name": topic, "partition_index": partition, "controller_epoch": 1, "leader": 1,
            "leader_epoch": 100, "isr": [1], "zk_version": 0, "replicas": [1], "is_new": True}


def test_paths_outside_the_log_dir_are_refused(cluster, good):
    """LeaderAndIsr with ``../victim`` created a partition directory outside log.dirs, and
    StopReplica with delete removed one; a name too long for a file name was an
    UNKNOWN_SERVER_ERROR. All are INVALID_REQUEST now, and nothing on disk changes."""
    logs = log_dir(cluster, 1)
    victim = logs.parent / "victim-0"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    before = sorted(os.listdir(logs)), sorted(os.listdir(logs.parent))
    with raw(cluster) as r:
        for name in ("../victim", "../../victim", "/tmp/victim", "v" * 300, "a\x00b", "a b", "..", "x/y"):
            invalid_request(r.request(ApiKey.LEADER_AND_ISR, controller_body(partition_states=[partition_state(name)])),
                            "partition_states[0]: topic_name: topic name")
            invalid_request(r.request(ApiKey.STOP_REPLICA, controller_body(partitions=[
                {"topic_name": name, "partition_index": 0, "delete_partition": True}])), "partitions[0]: topic_name")
            invalid_request(r.request(ApiKey.UPDATE_METADATA, controller_body(
                partition_states=[], live_brokers=[], deleted_topics=[name])), "deleted_topics: topic name")
        invalid_request(r.request(ApiKey.LEADER_AND_ISR, controller_body(
            partition_states=[partition_state(TOPIC, -1)])), "partition_index: -1 is out of range")
        invalid_request(r.request(ApiKey.LEADER_AND_ISR, controller_body(
            partition_states=[], topic_configs={"../victim": {"segment.bytes": "100"}})), "topic_configs")
    assert (sorted(os.listdir(logs)), sorted(os.listdir(logs.parent))) == before
    assert (victim / "precious").read_text() == "keep me"
    good.check()


# -- OffsetCommit --------------------------------------------------------------------------------------------


def coordinator_ready(cluster, group: str) -> None:
    def found():
        with raw(cluster) as r:
            response = FindCoordinatorResponse.from_body(r.request(ApiKey.FIND_COORDINATOR, {"key": group}))
        assert response.error_code in (NONE.code, COORDINATOR_NOT_AVAILABLE.code, COORDINATOR_LOAD_IN_PROGRESS.code)
        return response.error_code == NONE.code
    wait_until(found, 60, f"a coordinator for group {group}")


def commit_body(group: str, entries: list[tuple[str, int]], **kw) -> dict:
    return {"group_id": group, "topics": [{"name": t, "partitions": [{"partition_index": p, "committed_offset": 5}]}
                                          for t, p in entries], **kw}


def test_offset_commit_is_refused_for_partitions_that_do_not_exist(cluster, good):
    coordinator_ready(cluster, "validators")
    hostile = [("../../etc/passwd", -1), ("../../etc/passwd", 0), (TOPIC, -1), (TOPIC, 7), ("nope", 0)]
    with raw(cluster) as r:
        response = OffsetCommitResponse.from_body(r.request(ApiKey.OFFSET_COMMIT, commit_body(
            "validators", [*hostile, (TOPIC, 0)], retention_time_ms=INT64_MAX)))
        codes = {(t.name, p.partition_index): (p.error_code, p.error_message)
                 for t in response.topics for p in t.partitions}
        for key in hostile:
            assert codes[key][0] == UNKNOWN_TOPIC_OR_PARTITION.code, (key, codes[key])
            assert "offsets are committed for existing partitions only" in codes[key][1]
        assert codes[(TOPIC, 0)][0] == NONE.code  # the longest retention is fine: no overflow
        fetched = OffsetFetchResponse.from_body(r.request(ApiKey.OFFSET_FETCH, {"group_id": "validators"}))
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions]) for t in fetched.topics] \
            == [(TOPIC, [(0, 5)])]
        invalid_request(r.request(ApiKey.OFFSET_COMMIT, commit_body("validators", [(TOPIC, 0)],
                                                                    retention_time_ms=(1 << 64) - 1)),
                        "retention_time_ms: 18446744073709551615 is out of range [-1, 9223372036854775807]")
        long_id = FindCoordinatorResponse.from_body(r.request(ApiKey.FIND_COORDINATOR, {"key": "g" * 40_000}))
        assert long_id.error_code == INVALID_GROUP_ID.code
    good.check()


# -- topic names ----------------------------------------------------------------------------------------------


def test_names_that_collide_in_metric_names_are_refused(cluster, good):
    (r,) = create_topics(cluster, [{"name": "coll_x", "num_partitions": 1, "replication_factor": 1}]).topics
    assert r.error_code == INVALID_TOPIC_EXCEPTION.code, r
    assert "'coll_x' collides with existing topic 'coll.x'" in r.error_message
    with raw(cluster) as raw_client:
        md = MetadataResponse.from_body(raw_client.request(ApiKey.METADATA, {"topics": ["coll_x"],
                                                                             "allow_auto_topic_creation": True}))
    assert md.topics[0].error_code == INVALID_TOPIC_EXCEPTION.code
    time.sleep(0.5)
    assert "coll_x" not in topics_in_cluster(cluster)
    good.check()


def test_metadata_refuses_invalid_names_and_creates_none(cluster, good):
    names = ["../x", "a b", "", "x" * 250, "tab\tname", "ok-auto"]
    with raw(cluster) as r:
        md = MetadataResponse.from_body(r.request(ApiKey.METADATA, {"topics": names, "allow_auto_topic_creation": True}))
    by_name = {t.name: t for t in md.topics}
    for bad in names[:-1]:
        assert by_name[bad].error_code == INVALID_TOPIC_EXCEPTION.code, by_name[bad]
        assert "topic name" in by_name[bad].error_message
    wait_until(lambda: "ok-auto" in topics_in_cluster(cluster), 30, "the valid name auto-created")
    assert not set(names[:-1]) & topics_in_cluster(cluster)
    (r,) = create_topics(cluster, [{"name": n, "num_partitions": 1, "replication_factor": 1} for n in ["../y"]]).topics
    assert r.error_code == INVALID_TOPIC_EXCEPTION.code
    good.check()


# -- topic configs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, words", [
    ("segment.bytes", "100", "invalid value '100' for segment.bytes: must be at least 1048576 (log.segment.min.bytes)"),
    ("segment.ms", "1", "invalid value '1' for segment.ms: must be at least 60000 (log.roll.min.ms)"),
    ("segment.index.bytes", "8", "invalid value '8' for segment.index.bytes: must be at least 1024"),
    ("retention.ms", str(2**63), "must be at most 9223372036854775807"),
    ("min.cleanable.dirty.ratio", "NaN", "expected a finite number"),
])
def test_topic_configs_below_their_minimums_are_refused(cluster, good, key, value, words):
    (r,) = create_topics(cluster, [{"name": "configured", "num_partitions": 1, "replication_factor": 1,
                                    "configs": {key: value}}]).topics
    assert r.error_code == INVALID_CONFIG.code, r
    assert words in r.error_message
    with raw(cluster) as raw_client:
        response = AlterConfigsResponse.from_body(raw_client.request(ApiKey.ALTER_CONFIGS, {"resources": [
            {"resource_type": 2, "resource_name": TOPIC, "configs": {key: value}}]}))
    (a,) = response.responses
    assert a.error_code == INVALID_CONFIG.code and words in a.error_message, a
    assert "configured" not in topics_in_cluster(cluster)
    good.check()


def test_a_topic_at_the_minimums_is_created_and_works(cluster, good):
    (r,) = create_topics(cluster, [{"name": "at-minimum", "num_partitions": 2, "replication_factor": 1, "configs": {
        "segment.bytes": "1048576", "segment.ms": "60000", "segment.index.bytes": "1024"}}]).topics
    assert r.error_code == NONE.code, r
    wait_topic_ready(cluster, "at-minimum", 2, 1)
    with raw(cluster) as raw_client:
        response = CreatePartitionsResponse.from_body(raw_client.request(ApiKey.CREATE_PARTITIONS, {"topics": [
            {"name": "at-minimum", "count": 2 * 10**6}, {"name": "at-minimum", "count": 3}]}))
    assert [t.error_code for t in response.results] == [INVALID_REQUEST.code] * 2  # named twice
    with raw(cluster) as raw_client:
        response = CreatePartitionsResponse.from_body(raw_client.request(ApiKey.CREATE_PARTITIONS, {"topics": [
            {"name": "at-minimum", "count": 2 * 10**6}]}))
    assert response.results[0].error_code == INVALID_PARTITIONS.code
    good.check()


# -- a frame's decoded size ------------------------------------------------------------------------------------


def broker_memory_kib(cluster, key: str) -> int:
    with open(f"/proc/{cluster.brokers[1].proc.pid}/status") as f:
        status = f.read()
    return int(re.search(key + r":\s+(\d+)", status).group(1))


def test_a_frame_of_tiny_objects_is_refused_within_the_object_bound(cluster, good):
    """24 MiB of empty msgpack maps decoded into ~1.7 GB before (20 MiB cost 1.5 GB); now the
    decoding stops at the object bound: INVALID_REQUEST, and the broker's peak memory grows by
    the frame and ~100 MB of objects at most."""
    n = 24 << 20
    body = (b"\x95\x03\x00\xce\x00\x01\x00\x00\xc0\x81\xa6topics" + b"\xdd" + struct.pack(">I", 24)
            + (b"\xdd" + struct.pack(">I", n // 24) + b"\x80" * (n // 24)) * 24)
    with open(f"/proc/{cluster.brokers[1].proc.pid}/clear_refs", "w") as f:
        f.write("5")  # the broker's peak RSS starts again from its RSS now
    rss_before = broker_memory_kib(cluster, "VmRSS")
    with raw(cluster) as r:
        started = time.monotonic()
        r.send_raw(struct.pack(">I", len(body)) + body)
        buf = b""
        while not split_frames(buf):
            data = r.sock.recv(1 << 16)
            assert data, "the broker closed the connection instead of answering"
            buf += data
        elapsed = time.monotonic() - started
    correlation_id, response = decode_response(split_frames(buf)[0])
    assert correlation_id == 0x10000
    invalid_request(response, f"decodes into more than {MAX_OBJECTS_FLOOR} objects")
    grown_mb = (broker_memory_kib(cluster, "VmHWM") - rss_before) / 1024
    assert grown_mb < 400, f"the broker's peak memory grew by {grown_mb:.0f} MB"
    assert elapsed < 10
    good.check()
