"""The ACL authorizer and the inter-broker rule on real brokers (two broker processes and
ZooKeeper).

Each broker has two PLAINTEXT listeners: CLIENT, where the tests connect, and BROKER, the
inter-broker listener. The authorizer is on (Kafka's class name) and no ACL allows anything
at first; the tests' principal is ``User:ANONYMOUS`` (PLAINTEXT does not authenticate). It is
given Alter and Describe on the Cluster by writing ZooKeeper directly (as kafka-acls
--authorizer-properties zookeeper.connect=... does), and everything else through
``Admin.create_acls`` and ``tidelog acls``, so each grant travels to the other broker through
the change notifications.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import trio

from tests.support.cluster import shut_down
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tidelog import AclBinding, AclBindingFilter, Admin, NewTopic
from tidelog.broker.devcluster import DevCluster
from tidelog.broker.security.authorizer import Authorizer, ZkAclStore
from tidelog.broker.zookeeper.zk import ZkClient
from tidelog.broker.zookeeper.zkserver import find_free_port
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    TidelogError,
)
from tidelog.protocol.messages import (
    DescribeAclsRequest,
    DescribeAclsResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaderAndIsrRequest,
    LeaderAndIsrResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionProduceData,
    PartitionState,
    ProduceRequest,
    ProduceResponse,
    StopReplicaRequest,
    StopReplicaResponse,
    TopicProduceData,
    UpdateMetadataRequest,
    UpdateMetadataResponse,
)
from tidelog.protocol.records import build_batch

ANON = "User:ANONYMOUS"
AUTHORIZED_CONFIG = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
                     "zookeeper.session.timeout.ms": 6000, "default.replication.factor": 2,
                     "offsets.topic.replication.factor": 2, "offsets.topic.num.partitions": 3}


def _split_listeners(cluster: DevCluster) -> None:
    """Give each broker a CLIENT listener (its port as DevCluster chose it) and a BROKER
    listener, the inter-broker one, on another port."""
    for b in cluster.brokers.values():
        text = b.config_path.read_text().splitlines()
        text = [line for line in text if not line.startswith("listeners")]
        text += [f'listeners = "CLIENT://127.0.0.1:{b.port},BROKER://127.0.0.1:{find_free_port()}"',
                 '"listener.security.protocol.map" = "CLIENT:PLAINTEXT,BROKER:PLAINTEXT"',
                 '"inter.broker.listener.name" = "BROKER"']
        b.config_path.write_text("\n".join(text) + "\n")


def grant_in_zookeeper(cluster: DevCluster, *bindings: AclBinding) -> None:
    async def write() -> None:
        async with ZkClient(cluster.zookeeper.connect_string, chroot="/tidelog") as zk:
            errors = await ZkAclStore(zk, Authorizer()).create(list(bindings))
            assert errors == [None] * len(bindings)
    trio.run(write)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    cluster = DevCluster(tmp_path_factory.mktemp("authz"), brokers=2, zk_port=0, base_port=0,
                         extra_config=AUTHORIZED_CONFIG)
    _split_listeners(cluster)
    failed_before, started = request.session.testsfailed, False
    try:
        cluster.zookeeper.start()
        cluster.zookeeper.wait_serving(30)
        grant_in_zookeeper(cluster, AclBinding("cluster", "kafka-cluster", "literal", ANON, "*", "alter", "allow"),
                           AclBinding("cluster", "kafka-cluster", "literal", ANON, "*", "describe", "allow"))
        for b in cluster.brokers.values():
            b.start()
        cluster.wait_ready(60)
        started = True
        yield cluster
    finally:
        shut_down(cluster, failed=not started or request.session.testsfailed > failed_before)


@pytest.fixture
def admin(cluster):
    with Admin(cluster.bootstrap, request_timeout_ms=10000, default_api_timeout_ms=20000) as a:
        yield a


def allow(resource: str, name: str, *operations: str, pattern: str = "literal", permission: str = "allow"):
    return [AclBinding(resource, name, pattern, ANON, "*", op, permission) for op in operations]


def raw(cluster: DevCluster, broker_id: int) -> RawClient:
    return RawClient(cluster.brokers[broker_id].port, timeout=15)


def code_of(exc: BaseException) -> int:
    return exc.code if isinstance(exc, TidelogError) else -1


def eventually(action, expected_code: int, what: str, timeout: float = 20.0):
    """``action()`` until its error code is ``expected_code`` (an ACL change reaches the other
    broker through its notification a moment later)."""
    last = []

    def attempt():
        try:
            result = action()
            code = result if isinstance(result, int) else NONE.code
        except TidelogError as e:
            code = e.code
        except AssertionError as e:  # leader_of: not describable yet, or no leader yet
            code = -1
            last[:] = [str(e)[:200]]
            return False
        last[:] = [code]
        return code == expected_code

    wait_until(attempt, timeout, f"{what} (last code {last})")


def leader_of(cluster: DevCluster, topic: str) -> int:
    with raw(cluster, 1) as c:
        md = MetadataResponse.from_body(c.request(ApiKey.METADATA, MetadataRequest([topic])))
    (t,) = md.topics
    assert t.error_code == NONE.code, t
    return t.partitions[0].leader_id


def produce(cluster: DevCluster, broker_id: int, topic: str) -> int:
    req = ProduceRequest(-1, 10000, [TopicProduceData(topic, [PartitionProduceData(0, build_batch([b"v"]))])])
    with raw(cluster, broker_id) as c:
        r = ProduceResponse.from_body(c.request(ApiKey.PRODUCE, req))
    return r.responses[0].partition_responses[0].error_code


def fetch(cluster: DevCluster, broker_id: int, topic: str, replica_id: int = -1) -> FetchResponse:
    req = FetchRequest([FetchTopic(topic, [FetchPartition(0, 0)])], replica_id=replica_id, max_wait_ms=0)
    with raw(cluster, broker_id) as c:
        return FetchResponse.from_body(c.request(ApiKey.FETCH, req))


# -- acceptance ----------------------------------------------------------------------------------


def test_without_acls_nothing_is_allowed_and_with_them_it_is(cluster, admin):
    topic, group = "acl-orders", "acl-group"
    with pytest.raises(TidelogError) as e:
        admin.create_topics([NewTopic(topic, 1, 2)])
    assert e.value.code == TOPIC_AUTHORIZATION_FAILED.code
    admin.create_acls(allow("topic", topic, "create"))
    eventually(lambda: admin.create_topics([NewTopic(topic, 1, 2)]), NONE.code, "create the topic")
    admin.create_acls(allow("topic", topic, "describe"))
    eventually(lambda: leader_of(cluster, topic) and 0, NONE.code, "describe the topic")
    leader = leader_of(cluster, topic)
    # produce and consume
    assert produce(cluster, leader, topic) == TOPIC_AUTHORIZATION_FAILED.code
    assert fetch(cluster, leader, topic).responses[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED.code
    admin.create_acls(allow("topic", topic, "write", "read"))
    eventually(lambda: produce(cluster, leader, topic), NONE.code, "produce")
    p = fetch(cluster, leader, topic).responses[0].partitions[0]
    assert p.error_code == NONE.code and p.records
    # join a group
    with raw(cluster, 1) as c:
        r = FindCoordinatorResponse.from_body(c.request(ApiKey.FIND_COORDINATOR, FindCoordinatorRequest(group)))
    assert r.error_code == GROUP_AUTHORIZATION_FAILED.code
    admin.create_acls(allow("group", group, "read"))

    def coordinator() -> int:
        with raw(cluster, 1) as c:
            r = FindCoordinatorResponse.from_body(c.request(ApiKey.FIND_COORDINATOR, FindCoordinatorRequest(group)))
        return r.error_code if r.error_code else -r.node_id
    eventually(lambda: coordinator() if coordinator() >= 0 else NONE.code, NONE.code, "find the coordinator")
    node = -coordinator()
    join = JoinGroupRequest(group, 10000, "", "consumer", [JoinGroupProtocol("range", b"")])

    def join_code() -> int:
        with raw(cluster, node) as c:
            return JoinGroupResponse.from_body(c.request(ApiKey.JOIN_GROUP, join)).error_code
    eventually(lambda: 0 if join_code() != GROUP_AUTHORIZATION_FAILED.code else -1, 0, "join the group")
    # another group's offsets stay out of reach
    with raw(cluster, node) as c:
        r = OffsetFetchResponse.from_body(c.request(ApiKey.OFFSET_FETCH, OffsetFetchRequest("someone-elses")))
    assert r.error_code == GROUP_AUTHORIZATION_FAILED.code
    # delete the topic
    with pytest.raises(TidelogError) as e:
        admin.delete_topics([topic])
    assert e.value.code == TOPIC_AUTHORIZATION_FAILED.code
    admin.create_acls(allow("topic", topic, "delete"))
    eventually(lambda: admin.delete_topics([topic]), NONE.code, "delete the topic")


def test_deny_beats_allow_and_prefixed_patterns_match(cluster, admin):
    admin.create_acls(allow("topic", "pre-", "all", pattern="prefixed"))
    eventually(lambda: admin.create_topics([NewTopic("pre-x", 1, 2)]), NONE.code, "create under the prefix")
    eventually(lambda: leader_of(cluster, "pre-x") and 0, NONE.code, "describe under the prefix")
    leader = leader_of(cluster, "pre-x")
    eventually(lambda: produce(cluster, leader, "pre-x"), NONE.code, "produce under the prefix")
    with pytest.raises(TidelogError) as e:  # outside the prefix
        admin.create_topics([NewTopic("other-x", 1, 2)])
    assert e.value.code == TOPIC_AUTHORIZATION_FAILED.code
    admin.create_acls(allow("topic", "pre-x", "write", permission="deny"))
    eventually(lambda: produce(cluster, leader, "pre-x"), TOPIC_AUTHORIZATION_FAILED.code, "the deny wins")
    assert fetch(cluster, leader, "pre-x").responses[0].partitions[0].error_code == NONE.code  # Read still allowed
    deleted = admin.delete_acls([AclBindingFilter("topic", "pre-x", "literal", ANON)])
    assert len(next(iter(deleted.values()))) == 1
    eventually(lambda: produce(cluster, leader, "pre-x"), NONE.code, "the deny is gone")


def test_metadata_hides_topics_that_may_not_be_described(cluster, admin):
    grant_in_zookeeper(cluster, *allow("topic", "hidden-", "all", pattern="prefixed"))
    eventually(lambda: admin.create_topics([NewTopic("hidden-1", 1, 2)]), NONE.code, "create a topic")
    admin.delete_acls([AclBindingFilter("topic", "hidden-", "prefixed")])

    def listed() -> list[str]:
        with raw(cluster, 1) as c:
            return [t.name for t in MetadataResponse.from_body(c.request(ApiKey.METADATA, MetadataRequest(None))).topics]
    wait_until(lambda: "hidden-1" not in listed(), 20, "the topic is hidden")

    def named(broker_id: int) -> int:
        with raw(cluster, broker_id) as c:
            md = MetadataResponse.from_body(c.request(ApiKey.METADATA, MetadataRequest(["hidden-1"])))
        return md.topics[0].error_code
    for broker_id in (1, 2):  # asked for by name: refused, as for a topic that does not exist
        wait_until(lambda: named(broker_id) == TOPIC_AUTHORIZATION_FAILED.code, 20, f"broker {broker_id} refuses it")
    assert named(1) == named(2) == TOPIC_AUTHORIZATION_FAILED.code


def test_a_plain_client_cannot_act_as_the_controller_or_as_a_replica(cluster, admin):
    admin.create_acls(allow("topic", "guarded", "all"))
    eventually(lambda: admin.create_topics([NewTopic("guarded", 1, 2)]), NONE.code, "create the topic")
    eventually(lambda: leader_of(cluster, "guarded") and 0, NONE.code, "describe the topic")
    leader = leader_of(cluster, "guarded")
    follower = 3 - leader
    state = PartitionState("guarded", 0, 99, follower, 99, [follower], 0, [1, 2])
    with raw(cluster, leader) as c:
        r = LeaderAndIsrResponse.from_body(c.request(ApiKey.LEADER_AND_ISR, LeaderAndIsrRequest(1, 99, 0, [state])))
        assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
        r = UpdateMetadataResponse.from_body(c.request(ApiKey.UPDATE_METADATA, UpdateMetadataRequest(1, 99, 0, [], [])))
        assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
        r = StopReplicaResponse.from_body(c.request(ApiKey.STOP_REPLICA, StopReplicaRequest(1, 99, 0, [])))
        assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
    r = fetch(cluster, leader, "guarded", replica_id=follower)
    assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
    assert "CLIENT" in r.responses[0].partitions[0].error_message
    # even with every ACL a client can have: cluster actions need the inter-broker listener
    grant_in_zookeeper(cluster, *allow("cluster", "kafka-cluster", "cluster_action"))

    def leader_knows() -> bool:
        with raw(cluster, leader) as c:
            r = DescribeAclsResponse.from_body(c.request(ApiKey.DESCRIBE_ACLS, DescribeAclsRequest(4, 9, 3)))
        return bool(r.resources)
    wait_until(leader_knows, 20, "the leader has the ClusterAction ACL")
    assert fetch(cluster, leader, "guarded", replica_id=follower).error_code == CLUSTER_AUTHORIZATION_FAILED.code
    # and the brokers, on their own listener, still replicate: an acks=all produce succeeds
    assert produce(cluster, leader, "guarded") == NONE.code
    with raw(cluster, 1) as c:
        md = MetadataResponse.from_body(c.request(ApiKey.METADATA, MetadataRequest(["guarded"])))
    assert sorted(md.topics[0].partitions[0].isr_nodes) == [1, 2]


def test_the_acls_command(cluster):
    def tidelog(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tidelog.broker.cli", "acls", "--bootstrap", cluster.bootstrap,
                               *args], capture_output=True, text=True, timeout=60)

    r = tidelog("--add", "--allow-principal", "User:alice", "--producer", "--topic", "cli-", "--resource-pattern-type",
                "prefixed")
    assert r.returncode == 0, r.stderr
    assert "patternType=PREFIXED" in r.stdout and "operation=Write" in r.stdout
    r = tidelog("--list", "--topic", "cli-logs", "--resource-pattern-type", "match")
    assert r.returncode == 0, r.stderr
    assert "(principal=User:alice, host=*, operation=Create, permissionType=Allow)" in r.stdout
    r = tidelog("--add", "--allow-principal", "User:alice", "--operation", "Read", "--cluster")
    assert r.returncode == 2 and "does not apply to a Cluster" in r.stderr
    r = tidelog("--remove", "--topic", "cli-", "--resource-pattern-type", "prefixed", "--force")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("principal=User:alice") == 3
    r = tidelog("--list", "--principal", "User:alice")
    assert r.returncode == 0 and "User:alice" not in r.stdout
