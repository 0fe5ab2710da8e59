"""ACLs for real principals: two brokers on SASL_SSL (SCRAM), the authorizer on, the super
user ``admin`` (the brokers' own principal) and two users, ``alice`` and ``bob``, with
credentials made through the Admin API.

Requests are sent as the users through ``tidelog.security.open_stream`` (TLS, then SCRAM), so
each answer's error code is the broker's own; the SDK's Producer and Consumer are used once
the ACLs allow them. The only listener is the inter-broker one, so it also shows point 5 with
an authenticated principal: a user that is not a broker principal cannot send LeaderAndIsr
or fetch as a replica, while the broker principal passes that rule (and then the epoch
checks decide).
"""

from __future__ import annotations

import dataclasses
import time

import pytest
import trio

from tests.support.cluster import shut_down
from tests.support.waiting import wait_until
from tidelog import AclBinding, Admin, Consumer, NewTopic, Producer, TidelogError
from tidelog.aio.entity_configs import ScramCredentialInfo, UserScramCredentialUpsertion
from tidelog.broker.devcluster import DevCluster
from tidelog.protocol.apis import response_type
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    NONE,
    STALE_CONTROLLER_EPOCH,
    TOPIC_AUTHORIZATION_FAILED,
)
from tidelog.protocol.messages import (
    FetchPartition,
    FetchRequest,
    FetchTopic,
    FindCoordinatorRequest,
    LeaderAndIsrRequest,
    MetadataRequest,
    OffsetFetchRequest,
    PartitionProduceData,
    PartitionState,
    ProduceRequest,
    TopicProduceData,
)
from tidelog.protocol.records import build_batch
from tidelog.security import SecurityConfig, open_stream

PASSWORDS = {"alice": "alice-secret-1", "bob": "bob-secret-2"}
CONFIG = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "zookeeper.session.timeout.ms": 6000,
          "default.replication.factor": 2, "offsets.topic.replication.factor": 2, "offsets.topic.num.partitions": 3}


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    c = DevCluster(tmp_path_factory.mktemp("sasl-authz"), brokers=2, zk_port=0, base_port=0, extra_config=CONFIG,
                   security="SASL_SSL")
    failed_before, started = request.session.testsfailed, False
    try:
        c.start(90)
        started = True
        with Admin(c.bootstrap, **options(c)) as admin:
            admin.alter_user_scram_credentials([
                UserScramCredentialUpsertion(u, ScramCredentialInfo("SCRAM-SHA-256"), p) for u, p in PASSWORDS.items()])
        for user in PASSWORDS:  # the credentials reach every broker through their notifications
            for b in c.brokers.values():
                wait_until(lambda b=b, user=user: _authenticates(c, b.port, user), 30, f"{user} authenticates")
        yield c
    finally:
        shut_down(c, failed=not started or request.session.testsfailed > failed_before)


def security(cluster: DevCluster, user: str | None = None) -> SecurityConfig:
    sec = cluster.client_security()
    if user is None:
        return sec
    return dataclasses.replace(sec, sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=user,
                               sasl_plain_password=PASSWORDS[user])


def options(cluster: DevCluster, user: str | None = None) -> dict:
    return dataclasses.asdict(security(cluster, user))


def send(cluster: DevCluster, port: int, user: str | None, api_key: ApiKey, message: Message):
    """One request as ``user`` (the super user when None), over TLS and SCRAM."""
    sec = security(cluster, user)

    async def ask():
        conn = ClientConnection(client_id="authz-test")
        with trio.fail_after(15):
            stream = await open_stream("127.0.0.1", port, sec, conn, connect_timeout_s=10, describe=f"port {port}")
            async with stream:
                await stream.send_all(conn.send_request(api_key, 0, message)[1])
                while True:
                    data = await stream.receive_some(1 << 16)
                    if not data:
                        raise OSError("the broker closed the connection")
                    for _, body in conn.receive_data(data):
                        return response_type(api_key).from_body(body)
    return trio.run(ask)


def _authenticates(cluster: DevCluster, port: int, user: str) -> bool:
    try:
        send(cluster, port, user, ApiKey.METADATA, MetadataRequest([]))
    except (OSError, TidelogError):
        return False
    return True


def grant(cluster: DevCluster, *bindings: AclBinding) -> None:
    with Admin(cluster.bootstrap, **options(cluster)) as admin:
        admin.create_acls(bindings)


def acl(user: str, resource: str, name: str, op: str, pattern: str = "literal", permission: str = "allow"):
    return AclBinding(resource, name, pattern, f"User:{user}", "*", op, permission)


def leader_port(cluster: DevCluster, topic: str) -> tuple[int, int]:
    md = send(cluster, cluster.brokers[1].port, None, ApiKey.METADATA, MetadataRequest([topic]))
    partitions = md.topics[0].partitions if md.topics else []
    leader = partitions[0].leader_id if partitions else -1
    return leader, cluster.brokers[leader].port if leader in cluster.brokers else 0


def produce_code(cluster: DevCluster, port: int, user: str, topic: str) -> int:
    req = ProduceRequest(-1, 10000, [TopicProduceData(topic, [PartitionProduceData(0, build_batch([b"x"]))])])
    return send(cluster, port, user, ApiKey.PRODUCE, req).responses[0].partition_responses[0].error_code


def fetch(cluster: DevCluster, port: int, user: str, topic: str, replica_id: int = -1):
    req = FetchRequest([FetchTopic(topic, [FetchPartition(0, 0)])], replica_id=replica_id, max_wait_ms=0)
    return send(cluster, port, user, ApiKey.FETCH, req)


def until(condition, what: str) -> None:
    wait_until(condition, 30, what)


def test_a_user_without_acls_can_do_nothing_and_with_them_everything_granted(cluster):
    with Admin(cluster.bootstrap, **options(cluster)) as admin:
        admin.create_topics([NewTopic("orders", 1, 2)])
    until(lambda: leader_port(cluster, "orders")[0] > 0, "the topic has a leader")
    _, port = leader_port(cluster, "orders")
    with Admin(cluster.bootstrap, **options(cluster, "alice"), default_api_timeout_ms=15000) as alice:
        with pytest.raises(TidelogError) as e:
            alice.create_topics([NewTopic("alice-new", 1, 2)])
        assert e.value.code == TOPIC_AUTHORIZATION_FAILED.code
        with pytest.raises(TidelogError) as e:
            alice.delete_topics(["orders"])
        assert e.value.code == TOPIC_AUTHORIZATION_FAILED.code
    assert produce_code(cluster, port, "alice", "orders") == TOPIC_AUTHORIZATION_FAILED.code
    assert fetch(cluster, port, "alice", "orders").responses[0].partitions[0].error_code == \
        TOPIC_AUTHORIZATION_FAILED.code
    r = send(cluster, port, "alice", ApiKey.FIND_COORDINATOR, FindCoordinatorRequest("alice-group"))
    assert r.error_code == GROUP_AUTHORIZATION_FAILED.code
    md = send(cluster, port, "alice", ApiKey.METADATA, MetadataRequest(None))
    assert "orders" not in [t.name for t in md.topics]  # hidden

    grant(cluster, acl("alice", "topic", "orders", "write"), acl("alice", "topic", "orders", "read"),
          acl("alice", "group", "alice-group", "read"), acl("alice", "topic", "alice-", "create", "prefixed"),
          acl("bob", "group", "bob-group", "read"))
    until(lambda: all(produce_code(cluster, b.port, "alice", "orders") in (NONE.code, 6)  # 6: not the leader
                      for b in cluster.brokers.values()), "alice may produce, on every broker")
    # the SDK's producer and a consumer group, as alice
    with Producer(cluster.bootstrap, acks="all", **options(cluster, "alice")) as producer:
        for i in range(5):
            producer.send("orders", f"v{i}".encode())
        producer.flush(30)
    seen = []
    with Consumer(cluster.bootstrap, group_id="alice-group", auto_offset_reset="earliest",
                  **options(cluster, "alice")) as consumer:
        consumer.subscribe(["orders"])
        deadline = time.monotonic() + 60
        while len(seen) < 5 and time.monotonic() < deadline:
            seen += [r.value for r in consumer.poll(timeout_ms=500)]
        consumer.commit()
    assert set(seen) >= {f"v{i}".encode() for i in range(5)}
    # a PREFIXED Create lets alice create what starts with the prefix, and only that
    with Admin(cluster.bootstrap, **options(cluster, "alice"), default_api_timeout_ms=15000) as alice:
        alice.create_topics([NewTopic("alice-new", 1, 2)])
        with pytest.raises(TidelogError) as e:
            alice.create_topics([NewTopic("bob-new", 1, 2)])
        assert e.value.code == TOPIC_AUTHORIZATION_FAILED.code
    # another group's offsets: bob may not read alice's, and alice may not read bob's
    coordinator = send(cluster, port, "alice", ApiKey.FIND_COORDINATOR, FindCoordinatorRequest("alice-group"))
    cport = cluster.brokers[coordinator.node_id].port
    assert send(cluster, cport, "bob", ApiKey.OFFSET_FETCH, OffsetFetchRequest("alice-group")).error_code == \
        GROUP_AUTHORIZATION_FAILED.code
    r = send(cluster, cport, "alice", ApiKey.OFFSET_FETCH, OffsetFetchRequest("alice-group"))
    assert r.error_code == NONE.code and r.topics and r.topics[0].partitions[0].committed_offset >= 5

    # Deny beats Allow
    grant(cluster, acl("alice", "topic", "orders", "write", permission="deny"))
    until(lambda: produce_code(cluster, port, "alice", "orders") == TOPIC_AUTHORIZATION_FAILED.code, "the deny wins")
    assert fetch(cluster, port, "alice", "orders").responses[0].partitions[0].error_code == NONE.code


def test_an_authenticated_user_is_no_broker(cluster):
    with Admin(cluster.bootstrap, **options(cluster)) as admin:
        admin.create_topics([NewTopic("replicated", 1, 2)])
    until(lambda: leader_port(cluster, "replicated")[0] > 0, "the topic has a leader")
    leader, port = leader_port(cluster, "replicated")
    follower = 3 - leader
    state = PartitionState("replicated", 0, 99, follower, 99, [follower], 0, [1, 2])
    request = LeaderAndIsrRequest(1, 99, 0, [state])
    assert send(cluster, port, "alice", ApiKey.LEADER_AND_ISR, request).error_code == CLUSTER_AUTHORIZATION_FAILED.code
    r = fetch(cluster, port, "alice", "replicated", replica_id=follower)
    assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
    message = r.responses[0].partitions[0].error_message
    assert "User:alice" in message and "listener SASL_SSL" in message
    # the broker principal passes the rule; the epoch checks then refuse a made-up controller
    assert send(cluster, port, None, ApiKey.LEADER_AND_ISR, request).error_code == STALE_CONTROLLER_EPOCH.code
    # ClusterAction on the Cluster makes a user a broker for this rule
    grant(cluster, acl("bob", "cluster", "kafka-cluster", "cluster_action"))
    until(lambda: send(cluster, port, "bob", ApiKey.LEADER_AND_ISR, request).error_code == STALE_CONTROLLER_EPOCH.code,
          "bob passes the rule")
