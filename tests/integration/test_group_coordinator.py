"""The group coordinator on a real 3-broker cluster with a real ZooKeeper, driven with the
raw protocol (one blocking connection per member): FindCoordinator (creating
__consumer_offsets), join/sync/heartbeat, commits and fetches, static membership,
DescribeGroups/ListGroups, DeleteGroups, consumer group lag scraped from the coordinator's
metrics endpoint, and a coordinator failover: the coordinator's broker is killed and the new
coordinator serves every committed offset and the group's generation.

The module shares one cluster; the failover test kills a broker and runs last.
"""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import shut_down, wait_topic_ready
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tidelog import Admin, NewTopic, Producer
from tidelog.broker.devcluster import DevCluster
from tidelog.broker.zookeeper.zkserver import find_free_port
from tidelog.protocol.apis import response_type
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_ID_NOT_FOUND,
    ILLEGAL_GENERATION,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
)
from tidelog.protocol.messages import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    OffsetFetchRequest,
    SyncGroupAssignment,
    SyncGroupRequest,
)

GROUP_CONFIG = {**FAST_FAILOVER, "offsets.topic.num.partitions": 3, "offsets.topic.replication.factor": 3,
                "group.initial.rebalance.delay.ms": 200, "group.min.session.timeout.ms": 1000}
RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS.code, COORDINATOR_NOT_AVAILABLE.code, NOT_COORDINATOR.code}
TOPIC = "orders"


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    """3 brokers, each with a metrics endpoint on a port of its own (``metrics_ports``)."""
    directory: Path = tmp_path_factory.mktemp("groups")
    c = DevCluster(directory, brokers=3, zk_port=0, base_port=0, extra_config=GROUP_CONFIG)
    c.metrics_ports = {}
    for i, b in c.brokers.items():
        c.metrics_ports[i] = find_free_port()
        with open(b.config_path, "a") as f:
            f.write(f"\"metrics.port\" = {c.metrics_ports[i]}\n")
    failed_before, started = request.session.testsfailed, False
    try:
        c.start(60.0)
        started = True
        with Admin(c.bootstrap, default_api_timeout_ms=30000) as admin:
            admin.create_topics([NewTopic(TOPIC, 2, 3)])
        wait_topic_ready(c, TOPIC, 2, 3)
        yield c
    finally:
        shut_down(c, failed=not started or request.session.testsfailed > failed_before)


def call(port: int, api_key: ApiKey, message, timeout: float = 30.0):
    with RawClient(port, timeout=timeout) as client:
        return response_type(api_key).from_body(client.request(api_key, message))


def coordinator_port(cluster, group: str) -> tuple[int, int]:
    """(node id, port) of the group's coordinator, once FindCoordinator names one."""
    def find():
        for b in cluster.brokers.values():
            if b.running:
                r = call(b.port, ApiKey.FIND_COORDINATOR, FindCoordinatorRequest(group))
                return (r.node_id, r.port) if r.error_code == NONE.code else None
    return wait_until(find, 60, f"a coordinator for {group}")


def until_served(cluster, group: str, api_key: ApiKey, message, code_of=lambda r: r.error_code):
    """Send to the group's coordinator, retrying while it is being found or loading."""
    def attempt():
        _, port = coordinator_port(cluster, group)
        r = call(port, api_key, message)
        return None if code_of(r) in RETRIABLE else r
    return wait_until(attempt, 60, f"{api_key.name} for {group} served")


def join(group: str, member_id: str = "", instance: str | None = None, session_ms: int = 6000):
    return JoinGroupRequest(group, session_ms, member_id, "consumer", [JoinGroupProtocol("range", b"orders")], 10000,
                            instance)


def form_group(cluster, group: str, n: int, session_ms: int = 6000):
    """``n`` dynamic members join (MEMBER_ID_REQUIRED, then in parallel); the leader syncs an
    assignment of one byte string per member. Returns (responses leader first, coordinator port)."""
    ids = [until_served(cluster, group, ApiKey.JOIN_GROUP, join(group, session_ms=session_ms)) for _ in range(n)]
    assert all(r.error_code == MEMBER_ID_REQUIRED.code for r in ids)
    _, port = coordinator_port(cluster, group)
    with ThreadPoolExecutor(n) as pool:
        responses = list(pool.map(lambda r: call(port, ApiKey.JOIN_GROUP, join(group, r.member_id, session_ms=session_ms)), ids))
    assert all(r.error_code == NONE.code for r in responses), responses
    leader = next(r for r in responses if r.members)
    assert len(leader.members) == n and len({r.generation_id for r in responses}) == 1
    sync = call(port, ApiKey.SYNC_GROUP, SyncGroupRequest(group, leader.generation_id, leader.member_id, [
        SyncGroupAssignment(r.member_id, r.member_id.encode()) for r in responses]))
    assert sync.error_code == NONE.code and sync.assignment == leader.member_id.encode()
    return [leader] + [r for r in responses if r is not leader], port


def commit(group: str, offsets: dict[int, int], generation: int = -1, member_id: str = ""):
    return OffsetCommitRequest(group, [OffsetCommitTopic(TOPIC, [
        OffsetCommitPartition(p, o) for p, o in offsets.items()])], generation, member_id)


def commit_codes(r) -> set[int]:
    return {p.error_code for t in r.topics for p in t.partitions}


def fetched(port: int, group: str) -> dict[int, int]:
    r = call(port, ApiKey.OFFSET_FETCH, OffsetFetchRequest(group))
    assert r.error_code == NONE.code
    return {p.partition_index: p.committed_offset for t in r.topics for p in t.partitions}


def test_a_group_forms_commits_and_fetches(cluster):
    (leader, follower), port = form_group(cluster, "g1", 2)
    gen = leader.generation_id
    r = call(port, ApiKey.SYNC_GROUP, SyncGroupRequest("g1", gen, follower.member_id))
    assert r.error_code == NONE.code and r.assignment == follower.member_id.encode()
    assert call(port, ApiKey.HEARTBEAT, HeartbeatRequest("g1", gen, follower.member_id)).error_code == NONE.code

    assert commit_codes(call(port, ApiKey.OFFSET_COMMIT, commit("g1", {0: 5, 1: 7}, gen, leader.member_id))) == {0}
    assert fetched(port, "g1") == {0: 5, 1: 7}
    stale = call(port, ApiKey.OFFSET_COMMIT, commit("g1", {0: 1}, gen - 1, leader.member_id))
    assert commit_codes(stale) == {ILLEGAL_GENERATION.code} and fetched(port, "g1")[0] == 5

    d = call(port, ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(["g1"])).groups[0]
    assert (d.group_state, d.protocol_type, d.protocol_data, d.generation_id) == ("Stable", "consumer", "range", gen)
    assert {m.member_id for m in d.members} == {leader.member_id, follower.member_id}
    assert all(m.client_host == "127.0.0.1" for m in d.members)
    listed = call(port, ApiKey.LIST_GROUPS, ListGroupsRequest())
    assert ("g1", "Stable") in {(g.group_id, g.group_state) for g in listed.groups}

    r = call(port, ApiKey.LEAVE_GROUP, LeaveGroupRequest("g1", [MemberIdentity(follower.member_id)]))
    assert r.error_code == NONE.code


def test_a_static_member_rejoins_without_a_rebalance(cluster):
    group = "static-g"
    first = until_served(cluster, group, ApiKey.JOIN_GROUP, join(group, instance="host-a"))
    _, port = coordinator_port(cluster, group)
    assert first.error_code == NONE.code and first.generation_id == 1
    call(port, ApiKey.SYNC_GROUP, SyncGroupRequest(group, 1, first.member_id, [
        SyncGroupAssignment(first.member_id, b"partitions 0 and 1")]))
    again = call(port, ApiKey.JOIN_GROUP, join(group, instance="host-a"))  # a restart: no member id
    assert again.error_code == NONE.code and again.generation_id == 1 and again.member_id != first.member_id
    r = call(port, ApiKey.SYNC_GROUP, SyncGroupRequest(group, 1, again.member_id, group_instance_id="host-a"))
    assert r.assignment == b"partitions 0 and 1"
    old = call(port, ApiKey.HEARTBEAT, HeartbeatRequest(group, 1, first.member_id, "host-a"))
    assert old.error_code == FENCED_INSTANCE_ID.code


def test_group_lag_is_scraped_from_the_coordinators_metrics_endpoint(cluster):
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(10):
            producer.send(TOPIC, b"v%d" % i, partition=i % 2)
        producer.flush(30)
    r = until_served(cluster, "lagging", ApiKey.OFFSET_COMMIT, commit("lagging", {0: 1, 1: 2}),
                     code_of=lambda r: next(iter(commit_codes(r))))
    assert commit_codes(r) == {NONE.code}
    node, _ = coordinator_port(cluster, "lagging")

    def lag():
        url = f"http://127.0.0.1:{cluster.metrics_ports[node]}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
        samples = {s.labels["partition"]: s.value for f in text_string_to_metric_families(text)
                   for s in f.samples if s.name == "tidelog_group_lag" and s.labels["group"] == "lagging"}
        return samples if len(samples) == 2 and samples == {"0": 4.0, "1": 3.0} else None

    # 5 records per partition, committed 1 and 2; a partition led by another broker is
    # refreshed through ListOffsets every few seconds
    assert wait_until(lag, 30, "tidelog_group_lag of group 'lagging'") == {"0": 4.0, "1": 3.0}


def test_only_an_empty_group_is_deleted(cluster):
    (leader,), port = form_group(cluster, "doomed", 1)
    call(port, ApiKey.OFFSET_COMMIT, commit("doomed", {0: 3}, leader.generation_id, leader.member_id))
    r = call(port, ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["doomed"]))
    assert r.results[0].error_code == 68  # NON_EMPTY_GROUP
    call(port, ApiKey.LEAVE_GROUP, LeaveGroupRequest("doomed", [MemberIdentity(leader.member_id)]))
    assert call(port, ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["doomed"])).results[0].error_code == NONE.code
    assert fetched(port, "doomed") == {}
    r = call(port, ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["doomed"]))
    assert r.results[0].error_code == GROUP_ID_NOT_FOUND.code


def test_after_the_coordinator_is_killed_the_new_one_serves_every_committed_offset(cluster):
    groups = [f"failover-{i}" for i in range(6)]
    members = {}
    for g in groups:
        (leader,), port = form_group(cluster, g, 1, session_ms=60000)  # outlives the failover
        members[g] = leader
        for n in range(3):  # several commits: the last one counts
            r = call(port, ApiKey.OFFSET_COMMIT, commit(g, {0: 10 * n, 1: 10 * n + 1}, leader.generation_id,
                                                        leader.member_id))
            assert commit_codes(r) == {NONE.code}
    victim, _ = coordinator_port(cluster, groups[0])
    cluster.brokers[victim].kill()

    for g in groups:
        r = until_served(cluster, g, ApiKey.OFFSET_FETCH, OffsetFetchRequest(g))
        assert {p.partition_index: p.committed_offset for t in r.topics for p in t.partitions} == {0: 20, 1: 21}, g
    node, port = coordinator_port(cluster, groups[0])
    assert node != victim
    d = call(port, ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest([groups[0]])).groups[0]
    assert d.generation_id == members[groups[0]].generation_id  # the group's metadata survived too
    late = call(port, ApiKey.OFFSET_COMMIT, commit(groups[0], {0: 1}, d.generation_id - 1,
                                                   members[groups[0]].member_id))
    assert commit_codes(late) == {ILLEGAL_GENERATION.code}  # a stale generation is still fenced
