"""Each API's authorization check (broker/apis.py) through the broker's API layer, with
constructed request contexts: a real ReplicaManager and LogManager for the data APIs, fakes
for the controller, the group coordinator and ZooKeeper's ACL znodes.

The principal ``User:alice`` is given ACLs test by test; ``User:admin`` is a super user and
``User:broker`` the broker principal. Every refused request leaves the state as it was.
"""

from __future__ import annotations

import pytest

from tidelog.broker.apis import Apis
from tidelog.broker.config import BrokerConfig
from tidelog.broker.context import RequestContext
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.producer_ids import ProducerIdManager
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager
from tidelog.broker.security.authorizer import Authorizer, ZkAclStore
from tidelog.broker.security.entity_configs import EntityConfigStore
from tidelog.broker.zookeeper.layout import ZkPaths
from tidelog.protocol.acls import CLUSTER_NAME, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from tidelog.protocol.codec import ApiKey, RequestHeader
from tidelog.protocol.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_REQUEST,
    NONE,
    SECURITY_DISABLED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from tidelog.protocol.messages import (
    BROKER_RESOURCE,
    TOPIC_RESOURCE,
    AclCreation,
    AclFilter,
    AlterClientQuotasEntry,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    ClientQuotaEntityData,
    ClientQuotaOp,
    ControlledShutdownRequest,
    CreatableTopic,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
    CreateTopicsRequest,
    DeletableGroupResult,
    DeleteAclsRequest,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeClientQuotasResponse,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectLeadersRequest,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InitProducerIdRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaderAndIsrRequest,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    LiveBroker,
    MemberIdentity,
    MetadataRequest,
    OffsetCommitPartition,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetCommitTopicResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
    OffsetFetchTopicResponse,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
    OffsetsForLeaderEpochRequest,
    PartitionProduceData,
    PartitionState,
    ProduceRequest,
    ScramCredentialUpsertion,
    StopReplicaRequest,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicProduceData,
    TopicResult,
    UpdateMetadataRequest,
)
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import TopicPartition

ME = 1
ALICE, ADMIN, BROKER = "User:alice", "User:admin", "User:broker"
TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
OPS = AclOperation
TP, OTHER = TopicPartition("orders", 0), TopicPartition("secret", 0)


def ctx(principal: str = ALICE, *, protocol: str = "SASL_PLAINTEXT", inter_broker: bool = False,
        listener: str = "CLIENT") -> RequestContext:
    return RequestContext(RequestHeader(ApiKey.METADATA, 0, 1, "test"), "10.1.2.3:4000", listener, principal,
                          protocol, inter_broker)


class FakeAclZk:
    """ZooKeeper's ACL znodes as a dict, with ``ZkClient``'s ACL methods."""

    def __init__(self):
        self.paths = ZkPaths("/t")
        self.znodes: dict = {}

    async def update_acls(self, rtype, name, ptype, change, max_attempts=10):
        old = self.znodes.get((rtype, name, ptype), frozenset())
        new = frozenset(change(old))
        if new:
            self.znodes[(rtype, name, ptype)] = new
        else:
            self.znodes.pop((rtype, name, ptype), None)
        return old, new


class FakeController:
    is_active = True

    def __init__(self):
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.grown: list[str] = []

    async def call(self, fn):
        return fn()

    def create_topics(self, topics, validate_only):
        self.created += [t.name for t in topics]
        return [TopicResult(t.name, NONE.code) for t in topics], []

    def delete_topics(self, names):
        self.deleted += names
        return [TopicResult(n, NONE.code) for n in names], []

    def create_partitions_all(self, topics, validate_only):
        self.grown += [t.name for t in topics]
        return [TopicResult(t.name, NONE.code) for t in topics], []

    def elect_preferred(self, tps):
        return [], []

    def controlled_shutdown(self, broker_id, broker_epoch):
        return [], []


class FakeCoordinator:
    """Answers every group API with success, and records what reached it."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    async def find_coordinator(self, req, *listener):
        self.calls.append(("find", req.key))
        return FindCoordinatorResponse(NONE.code, 1, "h", 1)

    async def join_group(self, req, client_id, host, supports_skip_assignment=True):
        self.calls.append(("join", req.group_id))
        return JoinGroupResponse(NONE.code, member_id="m")

    async def sync_group(self, req):
        self.calls.append(("sync", req.group_id))
        return SyncGroupResponse(NONE.code)

    async def heartbeat(self, req):
        self.calls.append(("heartbeat", req.group_id))
        return HeartbeatResponse(NONE.code)

    async def leave_group(self, req):
        self.calls.append(("leave", req.group_id))
        return LeaveGroupResponse(NONE.code)

    async def offset_commit(self, req):
        self.calls.append(("commit", [t.name for t in req.topics]))
        return OffsetCommitResponse([OffsetCommitTopicResponse(t.name, [
            OffsetCommitPartitionResponse(p.partition_index, NONE.code) for p in t.partitions]) for t in req.topics])

    async def offset_fetch(self, req):
        self.calls.append(("fetch", None if req.topics is None else [t.name for t in req.topics]))
        topics = [("orders", [0]), ("secret", [0])] if req.topics is None else \
            [(t.name, t.partition_indexes) for t in req.topics]
        return OffsetFetchResponse(NONE.code, [OffsetFetchTopicResponse(n, [OffsetFetchPartitionResponse(p, 5)
                                                                           for p in ps]) for n, ps in topics])

    async def list_groups(self, req):
        return ListGroupsResponse(NONE.code, [ListedGroup("g1", "consumer"), ListedGroup("g2", "consumer")])

    async def describe_groups(self, req):
        self.calls.append(("describe", list(req.groups)))
        return DescribeGroupsResponse([DescribedGroup(NONE.code, g, "Stable") for g in req.groups])

    async def delete_groups(self, req):
        self.calls.append(("delete", list(req.groups_names)))
        return DeleteGroupsResponse([DeletableGroupResult(g, NONE.code) for g in req.groups_names])


class BrokerState:
    broker_epoch = 77

    def __init__(self):
        self.log_defaults = LogConfig()
        self.topic_overrides: dict = {}
        self.auto_created: list[str] = []
        self.entity_configs = EntityConfigStore(zk=None)  # no dynamic broker configs set

    def update_topic_overrides(self, configs):
        self.topic_overrides.update(configs)

    def metadata_updated(self, deleted=()):
        pass

    async def auto_create_topics(self, topics):
        self.auto_created += list(topics)


class Broker:
    def __init__(self, log_dir: str, *, authorizer: bool = True):
        self.log_manager = LogManager([log_dir], LogConfig(), broker_id=ME)
        self.log_manager.startup()
        self.replica_manager = ReplicaManager(ReplicaConfig(ME), self.log_manager, lambda t: LogConfig(),
                                              lambda leader, fetcher=0: None)
        self.metadata = MetadataCache(ME)
        self.state = BrokerState()
        self.controller = FakeController()
        self.coordinator = FakeCoordinator()
        self.authorizer = Authorizer({ADMIN, BROKER}) if authorizer else None
        self.zk = FakeAclZk()
        self.store = ZkAclStore(self.zk, self.authorizer) if authorizer else None
        self.apis = Apis(BrokerConfig(broker_id=ME, zookeeper_connect="127.0.0.1:1"), self.replica_manager,
                         self.metadata, broker=self.state, controller=self.controller,
                         group_coordinator=self.coordinator, producer_ids=ProducerIdManager(self.block),
                         authorizer=self.authorizer, acl_store=self.store,
                         broker_principals=frozenset({ADMIN, BROKER}))

    async def block(self):
        return 1000, 1999

    def allow(self, rtype, name, op, principal=ALICE, ptype=LIT, permission=ALLOW):
        entries = self.authorizer.acls.get(rtype, name, ptype) | {(principal, "*", op, permission)}
        self.authorizer.set_acls(rtype, name, ptype, entries)

    def deny(self, rtype, name, op, principal=ALICE, ptype=LIT):
        self.allow(rtype, name, op, principal, ptype, DENY)

    async def lead(self, *tps):
        states = [PartitionState(tp.topic, tp.partition, 1, ME, 0, [ME], 0, [ME]) for tp in tps]
        self.replica_manager.become_leader_or_follower(LeaderAndIsrRequest(ME, 1, 77, states))
        self.metadata.update(UpdateMetadataRequest(ME, 1, 77, states, [LiveBroker(ME, "h", 1)]))


@pytest.fixture
async def broker(tmp_path):
    b = Broker(str(tmp_path))
    await b.lead(TP, OTHER)
    yield b
    for log in b.log_manager.logs.values():
        log.close()


def produce(*topics: str) -> ProduceRequest:
    batch = build_batch([b"v"])
    return ProduceRequest(1, 1000, [TopicProduceData(t, [PartitionProduceData(0, batch)]) for t in topics])


def codes(resp) -> dict[str, int]:
    return {t.name: p.error_code for t in resp.responses for p in t.partition_responses}


# -- data ----------------------------------------------------------------------------------------


async def test_produce_needs_write_on_the_topic(broker):
    r = broker.apis.produce(produce("orders", "secret"), ctx())
    assert codes(r) == {"orders": TOPIC_AUTHORIZATION_FAILED.code, "secret": TOPIC_AUTHORIZATION_FAILED.code}
    assert broker.log_manager.get_log(TP).log_end_offset == 0
    broker.allow(TOPIC, "orders", OPS.WRITE)
    r = broker.apis.produce(produce("orders", "secret"), ctx())
    assert codes(r) == {"orders": NONE.code, "secret": TOPIC_AUTHORIZATION_FAILED.code}
    assert "User:alice is not authorized to Write topic 'secret'" in r.responses[-1].partition_responses[0].error_message
    assert broker.log_manager.get_log(TP).log_end_offset == 1
    # super users, and the broker calling itself, need no ACL
    assert codes(broker.apis.produce(produce("secret"), ctx(ADMIN))) == {"secret": NONE.code}
    assert codes(broker.apis.produce(produce("secret"), None)) == {"secret": NONE.code}


async def test_deny_beats_allow_and_prefixes_match(broker):
    broker.allow(TOPIC, "ord", OPS.ALL, ptype=PRE)
    assert codes(broker.apis.produce(produce("orders"), ctx())) == {"orders": NONE.code}
    broker.deny(TOPIC, "orders", OPS.WRITE)
    assert codes(broker.apis.produce(produce("orders"), ctx())) == {"orders": TOPIC_AUTHORIZATION_FAILED.code}


async def test_a_transactional_produce_needs_write_on_the_transactional_id(broker):
    broker.allow(TOPIC, "orders", OPS.WRITE)
    req = ProduceRequest(1, 1000, produce("orders").topic_data, transactional_id="tx")
    assert codes(broker.apis.produce(req, ctx())) == {"orders": TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code}


def fetch(*topics: str, replica_id: int = -1) -> FetchRequest:
    return FetchRequest([FetchTopic(t, [FetchPartition(0, 0)]) for t in topics], replica_id=replica_id, max_wait_ms=0)


def fetched(r) -> FetchResponse:
    """A fetch's answer as the typed message (the handler answers with its body)."""
    return FetchResponse.from_body(r) if isinstance(r, dict) else r


def fetch_codes(r) -> dict[str, int]:
    return {t.topic: p.error_code for t in fetched(r).responses for p in t.partitions}


async def test_fetch_needs_read(broker):
    broker.apis.produce(produce("orders", "secret"), None)
    r = broker.apis.fetch(fetch("orders", "secret"), ctx())
    assert fetch_codes(r) == {"orders": TOPIC_AUTHORIZATION_FAILED.code, "secret": TOPIC_AUTHORIZATION_FAILED.code}
    broker.allow(TOPIC, "orders", OPS.READ)
    r = broker.apis.fetch(fetch("orders", "secret"), ctx())
    assert fetch_codes(r) == {"orders": NONE.code, "secret": TOPIC_AUTHORIZATION_FAILED.code}
    assert fetched(r).responses[0].partitions[0].records


async def test_a_replica_fetch_is_a_cluster_action(broker):
    # from a client listener: refused whatever the principal, and nothing is read or recorded
    for c in (ctx(), ctx(BROKER), ctx("User:ANONYMOUS", protocol="PLAINTEXT")):
        r = broker.apis.fetch(fetch("orders", replica_id=2), c)
        assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
        assert fetch_codes(r) == {"orders": CLUSTER_AUTHORIZATION_FAILED.code}
        assert "CLIENT" in r.responses[0].partitions[0].error_message
    # on an authenticating inter-broker listener, only a broker principal (or ClusterAction)
    r = broker.apis.fetch(fetch("orders", replica_id=2), ctx(inter_broker=True, listener="BROKER"))
    assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code and ALICE in r.responses[0].partitions[0].error_message
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.CLUSTER_ACTION)
    served = fetched(broker.apis.fetch(fetch("orders", replica_id=2), ctx(inter_broker=True, listener="BROKER")))
    # served: the replica manager answers (broker 2 is no replica of the partition here)
    assert served.error_code == NONE.code
    assert "not one of the followers" in served.responses[0].partitions[0].error_message


async def test_list_offsets_needs_describe_and_delete_records_needs_delete(broker):
    req = ListOffsetsRequest([ListOffsetsTopic("orders", [ListOffsetsPartition(0, -1)])])
    r = await broker.apis.list_offsets(req, ctx())
    assert r.topics[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED.code
    broker.allow(TOPIC, "orders", OPS.READ)  # Read implies Describe
    assert (await broker.apis.list_offsets(req, ctx())).topics[0].partitions[0].error_code == NONE.code
    req = DeleteRecordsRequest([DeleteRecordsTopic("orders", [DeleteRecordsPartition(0, -1)])], 1000)
    r = await broker.apis.delete_records(req, ctx())
    assert r.topics[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED.code


async def test_offsets_for_leader_epoch(broker):
    req = OffsetsForLeaderEpochRequest([OffsetForLeaderTopic("orders", [OffsetForLeaderPartition(0, 0)])])
    r = await broker.apis.offsets_for_leader_epoch(req, ctx())
    assert r.topics[0].partitions[0].error_code == TOPIC_AUTHORIZATION_FAILED.code
    broker.allow(TOPIC, "orders", OPS.DESCRIBE)
    assert (await broker.apis.offsets_for_leader_epoch(req, ctx())).topics[0].partitions[0].error_code == NONE.code
    as_replica = OffsetsForLeaderEpochRequest(req.topics, replica_id=2)
    r = await broker.apis.offsets_for_leader_epoch(as_replica, ctx())
    assert r.topics[0].partitions[0].error_code == CLUSTER_AUTHORIZATION_FAILED.code
    r = await broker.apis.offsets_for_leader_epoch(as_replica, ctx(BROKER, inter_broker=True))
    assert r.topics[0].partitions[0].error_code == NONE.code


# -- metadata and administration ---------------------------------------------------------------------


async def test_metadata_hides_what_may_not_be_described(broker):
    r = await broker.apis.metadata_(MetadataRequest(None), ctx())
    assert r.topics == []
    broker.allow(TOPIC, "orders", OPS.WRITE)  # Write implies Describe
    r = await broker.apis.metadata_(MetadataRequest(None), ctx())
    assert [t.name for t in r.topics] == ["orders"]
    r = await broker.apis.metadata_(MetadataRequest(["orders", "secret", "nosuch"]), ctx())
    assert {t.name: t.error_code for t in r.topics} == {
        "orders": NONE.code, "secret": TOPIC_AUTHORIZATION_FAILED.code, "nosuch": TOPIC_AUTHORIZATION_FAILED.code}


async def test_auto_creation_needs_create_on_the_cluster_or_the_topic(broker):
    req = MetadataRequest(["new-a", "new-b"], allow_auto_topic_creation=True)
    broker.allow(TOPIC, "new-", OPS.DESCRIBE, ptype=PRE)
    r = await broker.apis.metadata_(req, ctx())
    assert {t.name: t.error_code for t in r.topics} == {"new-a": TOPIC_AUTHORIZATION_FAILED.code,
                                                        "new-b": TOPIC_AUTHORIZATION_FAILED.code}
    assert "not authorized to Create topic 'new-a'" in r.topics[0].error_message
    assert broker.state.auto_created == []
    broker.allow(TOPIC, "new-a", OPS.CREATE)
    await broker.apis.metadata_(req, ctx())
    assert broker.state.auto_created == ["new-a"]
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.CREATE)
    await broker.apis.metadata_(req, ctx())
    assert broker.state.auto_created == ["new-a", "new-a", "new-b"]


async def test_create_delete_and_grow_topics(broker):
    c = broker.controller
    r = await broker.apis.create_topics(CreateTopicsRequest([CreatableTopic("a"), CreatableTopic("b")]), ctx())
    assert {t.name: t.error_code for t in r.topics} == {"a": TOPIC_AUTHORIZATION_FAILED.code,
                                                        "b": TOPIC_AUTHORIZATION_FAILED.code}
    broker.allow(TOPIC, "a", OPS.CREATE)
    r = await broker.apis.create_topics(CreateTopicsRequest([CreatableTopic("a"), CreatableTopic("b")]), ctx())
    assert {t.name: t.error_code for t in r.topics} == {"a": NONE.code, "b": TOPIC_AUTHORIZATION_FAILED.code}
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.CREATE)
    await broker.apis.create_topics(CreateTopicsRequest([CreatableTopic("b")]), ctx())
    assert c.created == ["a", "b"]
    r = await broker.apis.delete_topics(DeleteTopicsRequest(["a", "b"]), ctx())
    assert {t.name: t.error_code for t in r.responses} == {"a": TOPIC_AUTHORIZATION_FAILED.code,
                                                           "b": TOPIC_AUTHORIZATION_FAILED.code}
    broker.allow(TOPIC, "a", OPS.DELETE)
    await broker.apis.delete_topics(DeleteTopicsRequest(["a", "b"]), ctx())
    assert c.deleted == ["a"]
    r = await broker.apis.create_partitions(CreatePartitionsRequest([CreatePartitionsTopic("a", 3)]), ctx())
    assert r.results[0].error_code == TOPIC_AUTHORIZATION_FAILED.code and c.grown == []
    broker.allow(TOPIC, "a", OPS.ALTER)
    await broker.apis.create_partitions(CreatePartitionsRequest([CreatePartitionsTopic("a", 3)]), ctx())
    assert c.grown == ["a"]


async def test_configs_elections_and_producer_ids(broker):
    req = DescribeConfigsRequest([DescribeConfigsResource(TOPIC_RESOURCE, "orders"),
                                  DescribeConfigsResource(BROKER_RESOURCE, "1")])
    r = await broker.apis.describe_configs(req, ctx())
    assert [x.error_code for x in r.results] == [TOPIC_AUTHORIZATION_FAILED.code, CLUSTER_AUTHORIZATION_FAILED.code]
    broker.allow(TOPIC, "orders", OPS.ALTER_CONFIGS)  # implies DescribeConfigs
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.DESCRIBE_CONFIGS)
    r = await broker.apis.describe_configs(req, ctx())
    assert [x.error_code for x in r.results] == [NONE.code, NONE.code]
    r = await broker.apis.elect_leaders(ElectLeadersRequest(None), ctx())
    assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
    r = await broker.apis.init_producer_id(InitProducerIdRequest(), ctx("User:bob"))
    assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
    r = await broker.apis.init_producer_id(InitProducerIdRequest("tx"), ctx())
    assert r.error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code


async def test_init_producer_id_with_write_on_some_topic_or_idempotent_write(broker):
    assert (await broker.apis.init_producer_id(InitProducerIdRequest(), ctx("User:bob"))).error_code == \
        CLUSTER_AUTHORIZATION_FAILED.code
    broker.allow(TOPIC, "logs-", OPS.WRITE, "User:bob", PRE)
    assert (await broker.apis.init_producer_id(InitProducerIdRequest(), ctx("User:bob"))).error_code == NONE.code
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.IDEMPOTENT_WRITE, "User:carol")
    assert (await broker.apis.init_producer_id(InitProducerIdRequest(), ctx("User:carol"))).error_code == NONE.code


async def test_controller_requests_are_cluster_actions(broker):
    refused = [await broker.apis.leader_and_isr(LeaderAndIsrRequest(ME, 1, 77, []), ctx(BROKER)),
               await broker.apis.update_metadata(UpdateMetadataRequest(ME, 1, 77, [], []), ctx(BROKER)),
               await broker.apis.stop_replica(StopReplicaRequest(ME, 1, 77, []), ctx(BROKER)),
               await broker.apis.controlled_shutdown(ControlledShutdownRequest(2, 5), ctx(BROKER)),
               await broker.apis.leader_and_isr(LeaderAndIsrRequest(ME, 1, 77, []), ctx(inter_broker=True))]
    assert {r.error_code for r in refused} == {CLUSTER_AUTHORIZATION_FAILED.code}
    assert broker.metadata.brokers  # UpdateMetadata changed nothing
    ok = await broker.apis.controlled_shutdown(ControlledShutdownRequest(2, 5), ctx(BROKER, inter_broker=True))
    assert ok.error_code == NONE.code
    # a PLAINTEXT inter-broker listener is open to anyone who reaches it
    anon = ctx("User:ANONYMOUS", protocol="PLAINTEXT", inter_broker=True, listener="PLAINTEXT")
    assert (await broker.apis.controlled_shutdown(ControlledShutdownRequest(2, 5), anon)).error_code == NONE.code


# -- groups ----------------------------------------------------------------------------------------


async def test_group_membership_needs_read_on_the_group(broker):
    a, calls = broker.apis, broker.coordinator.calls
    join = JoinGroupRequest("g", 10000, "", "consumer", [JoinGroupProtocol("range", b"")])
    requests = [a.join_group(join, ctx()), a.sync_group(SyncGroupRequest("g", 1, "m"), ctx()),
                a.heartbeat(HeartbeatRequest("g", 1, "m"), ctx()),
                a.leave_group(LeaveGroupRequest("g", [MemberIdentity("m")]), ctx())]
    for request in requests:
        assert (await request).error_code == GROUP_AUTHORIZATION_FAILED.code
    assert calls == []
    broker.allow(GROUP, "g", OPS.READ)
    assert (await a.join_group(join, ctx())).error_code == NONE.code
    assert calls == [("join", "g")]
    r = await a.find_coordinator(FindCoordinatorRequest("h"), ctx())
    assert r.error_code == GROUP_AUTHORIZATION_FAILED.code
    assert (await a.find_coordinator(FindCoordinatorRequest("g"), ctx())).error_code == NONE.code


async def test_offset_commit_needs_read_on_group_and_topic(broker):
    req = OffsetCommitRequest("g", [OffsetCommitTopic("orders", [OffsetCommitPartition(0, 5)]),
                                    OffsetCommitTopic("secret", [OffsetCommitPartition(0, 5)])])
    r = await broker.apis.offset_commit(req, ctx())
    assert {t.name: t.partitions[0].error_code for t in r.topics} == {
        "orders": GROUP_AUTHORIZATION_FAILED.code, "secret": GROUP_AUTHORIZATION_FAILED.code}
    broker.allow(GROUP, "g", OPS.READ)
    broker.allow(TOPIC, "orders", OPS.READ)
    r = await broker.apis.offset_commit(req, ctx())
    assert {t.name: t.partitions[0].error_code for t in r.topics} == {
        "orders": NONE.code, "secret": TOPIC_AUTHORIZATION_FAILED.code}
    assert broker.coordinator.calls == [("commit", ["orders"])]


async def test_offset_fetch_of_another_group_and_its_topics(broker):
    r = await broker.apis.offset_fetch(OffsetFetchRequest("other"), ctx())
    assert r.error_code == GROUP_AUTHORIZATION_FAILED.code and broker.coordinator.calls == []
    broker.allow(GROUP, "other", OPS.DESCRIBE)
    broker.allow(TOPIC, "orders", OPS.DESCRIBE)
    r = await broker.apis.offset_fetch(OffsetFetchRequest("other"), ctx())
    assert [t.name for t in r.topics] == ["orders"]  # every topic: the undescribable left out
    req = OffsetFetchRequest("other", [OffsetFetchTopic("orders", [0]), OffsetFetchTopic("secret", [0])])
    r = await broker.apis.offset_fetch(req, ctx())
    assert {t.name: t.partitions[0].error_code for t in r.topics} == {
        "orders": NONE.code, "secret": TOPIC_AUTHORIZATION_FAILED.code}


async def test_list_describe_and_delete_groups(broker):
    a = broker.apis
    assert (await a.list_groups(ListGroupsRequest(), ctx())).groups == []
    broker.allow(GROUP, "g1", OPS.DESCRIBE)
    assert [g.group_id for g in (await a.list_groups(ListGroupsRequest(), ctx())).groups] == ["g1"]
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.DESCRIBE)
    assert [g.group_id for g in (await a.list_groups(ListGroupsRequest(), ctx())).groups] == ["g1", "g2"]
    r = await a.describe_groups(DescribeGroupsRequest(["g1", "g2"]), ctx())
    assert {g.group_id: g.error_code for g in r.groups} == {"g1": NONE.code, "g2": GROUP_AUTHORIZATION_FAILED.code}
    r = await a.delete_groups(DeleteGroupsRequest(["g1"]), ctx())
    assert r.results[0].error_code == GROUP_AUTHORIZATION_FAILED.code
    broker.allow(GROUP, "g", OPS.DELETE, ptype=PRE)
    assert (await a.delete_groups(DeleteGroupsRequest(["g1"]), ctx())).results[0].error_code == NONE.code


# -- the ACL APIs ----------------------------------------------------------------------------------


def creation(name="orders", principal=ALICE, op=OPS.READ, ptype=LIT, permission=ALLOW) -> AclCreation:
    return AclCreation(int(TOPIC), name, principal, "*", int(op), int(permission), int(ptype))


def any_filter(**kw) -> AclFilter:
    fields = dict(resource_type_filter=1, operation=1, permission_type=1, pattern_type_filter=1)
    fields.update(kw)
    return AclFilter(**fields)


async def test_acl_apis_need_alter_and_describe_on_the_cluster(broker):
    a = broker.apis
    r = await a.create_acls(CreateAclsRequest([creation()]), ctx())
    assert r.results[0].error_code == CLUSTER_AUTHORIZATION_FAILED.code and broker.zk.znodes == {}
    assert (await a.describe_acls(DescribeAclsRequest(1, 1, 1, pattern_type_filter=1), ctx())).error_code == \
        CLUSTER_AUTHORIZATION_FAILED.code
    r = await a.create_acls(CreateAclsRequest([creation(), creation("logs-", ptype=PRE, op=OPS.WRITE),
                                               creation("a/b"), AclCreation(4, "x", ALICE, "*", 3, 3)]), ctx(ADMIN))
    assert [x.error_code for x in r.results] == [NONE.code, NONE.code, INVALID_REQUEST.code, INVALID_REQUEST.code]
    assert "kafka-cluster" in r.results[3].error_message
    assert broker.zk.znodes[(TOPIC, "orders", LIT)] == {(ALICE, "*", OPS.READ, ALLOW)}
    # the authorizer applies them at once on this broker
    broker.apis.produce(produce("logs-x"), ctx())
    assert broker.authorizer.authorize(ALICE, "10.1.2.3", OPS.WRITE, TOPIC, "logs-x")
    r = await a.describe_acls(DescribeAclsRequest(int(TOPIC), 1, 1, "logs-abc", pattern_type_filter=2), ctx(ADMIN))
    assert [(x.resource_name, x.pattern_type) for x in r.resources] == [("logs-", int(PRE))]
    r = await a.delete_acls(DeleteAclsRequest([any_filter(resource_name_filter="orders"), any_filter(operation=0)]),
                            ctx(ADMIN))
    assert r.filter_results[0].error_code == NONE.code
    assert [(m.resource_name, m.principal) for m in r.filter_results[0].matching_acls] == [("orders", ALICE)]
    assert r.filter_results[1].error_code == INVALID_REQUEST.code
    assert (TOPIC, "orders", LIT) not in broker.zk.znodes
    assert not broker.authorizer.authorize(ALICE, "10.1.2.3", OPS.READ, TOPIC, "orders")


async def test_without_an_authorizer_the_acl_apis_are_disabled_and_everything_but_cluster_actions_allowed(tmp_path):
    b = Broker(str(tmp_path), authorizer=False)
    await b.lead(TP)
    try:
        assert (await b.apis.create_acls(CreateAclsRequest([creation()]), ctx())).results[0].error_code == \
            SECURITY_DISABLED.code
        assert (await b.apis.describe_acls(DescribeAclsRequest(1, 1, 1), ctx())).error_code == SECURITY_DISABLED.code
        assert (await b.apis.delete_acls(DeleteAclsRequest([any_filter()]), ctx())).filter_results[0].error_code == \
            SECURITY_DISABLED.code
        assert codes(b.apis.produce(produce("orders"), ctx())) == {"orders": NONE.code}
        assert (await b.apis.metadata_(MetadataRequest(["nosuch"]), ctx())).topics[0].error_code == \
            UNKNOWN_TOPIC_OR_PARTITION.code
        r = await b.apis.leader_and_isr(LeaderAndIsrRequest(ME, 1, 77, []), ctx())
        assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
    finally:
        for log in b.log_manager.logs.values():
            log.close()


# -- user and client-id configs ---------------------------------------------------------------


class FakeEntityConfigs:
    """Records what reaches the entity-config admin (the ZooKeeper writes)."""

    def __init__(self):
        self.calls: list[str] = []

    async def alter_user_scram_credentials(self, req):
        self.calls.append("alter scram")
        return AlterUserScramCredentialsResponse([AlterUserScramCredentialsResult(u.name, NONE.code)
                                                  for u in req.upsertions])

    async def describe_user_scram_credentials(self, req):
        self.calls.append("describe scram")
        return DescribeUserScramCredentialsResponse(NONE.code)

    async def alter_client_quotas(self, req):
        self.calls.append("alter quotas")
        return AlterClientQuotasResponse([])

    async def describe_client_quotas(self, req):
        self.calls.append("describe quotas")
        return DescribeClientQuotasResponse(NONE.code)


def set_admin_password() -> AlterUserScramCredentialsRequest:
    return AlterUserScramCredentialsRequest(upsertions=[ScramCredentialUpsertion("admin", 1, 4096, b"s" * 16, b"p" * 32)])


@pytest.fixture
def entity_configs(monkeypatch) -> FakeEntityConfigs:
    fake = FakeEntityConfigs()
    monkeypatch.setattr(Apis, "_entity_configs", property(lambda self: fake))
    return fake


async def test_scram_credentials_and_quotas_need_cluster_acls(broker, entity_configs):
    r = await broker.apis.alter_user_scram_credentials(set_admin_password(), ctx())
    assert [x.error_code for x in r.results] == [CLUSTER_AUTHORIZATION_FAILED.code]
    quotas = AlterClientQuotasRequest([AlterClientQuotasEntry([ClientQuotaEntityData("user", "alice")],
                                                              [ClientQuotaOp("producer_byte_rate", 1e9)])])
    r = await broker.apis.alter_client_quotas(quotas, ctx())
    assert [x.error_code for x in r.entries] == [CLUSTER_AUTHORIZATION_FAILED.code]
    r = await broker.apis.describe_user_scram_credentials(DescribeUserScramCredentialsRequest(), ctx())
    assert r.error_code == CLUSTER_AUTHORIZATION_FAILED.code
    assert entity_configs.calls == []
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.ALTER)
    broker.allow(CLUSTER, CLUSTER_NAME, OPS.ALTER_CONFIGS)
    await broker.apis.alter_user_scram_credentials(set_admin_password(), ctx())
    await broker.apis.alter_client_quotas(quotas, ctx())
    assert entity_configs.calls == ["alter scram", "alter quotas"]


async def test_without_an_authorizer_only_broker_principals_alter_credentials(tmp_path, entity_configs):
    b = Broker(str(tmp_path), authorizer=False)
    r = await b.apis.alter_user_scram_credentials(set_admin_password(), ctx())
    assert [x.error_code for x in r.results] == [CLUSTER_AUTHORIZATION_FAILED.code]
    assert "only super users" in r.results[0].error_message
    await b.apis.alter_user_scram_credentials(set_admin_password(), ctx(ADMIN))
    await b.apis.describe_user_scram_credentials(DescribeUserScramCredentialsRequest(), ctx())
    # nor an unauthenticated client (a PLAINTEXT listener beside the brokers' SASL one): it
    # could set a broker's credential and act as that broker
    r = await b.apis.alter_user_scram_credentials(set_admin_password(), ctx("User:ANONYMOUS", protocol="PLAINTEXT"))
    assert [x.error_code for x in r.results] == [CLUSTER_AUTHORIZATION_FAILED.code]
    assert "not authenticated" in r.results[0].error_message
    assert entity_configs.calls == ["alter scram", "describe scram"]
    for log in b.log_manager.logs.values():
        log.close()
    # a cluster where nobody authenticates (no broker principals) is open (docs/operations.md)
    open_broker = Broker(str(tmp_path / "open"), authorizer=False)
    open_broker.apis.broker_principals = frozenset()
    await open_broker.apis.alter_user_scram_credentials(set_admin_password(), ctx("User:ANONYMOUS", protocol="PLAINTEXT"))
    assert entity_configs.calls == ["alter scram", "describe scram", "alter scram"]
    for log in open_broker.log_manager.logs.values():
        log.close()


async def test_a_full_reload_forgets_patterns_gone_from_zookeeper():
    """After a lost session the broker reads every ACL again: a pattern deleted meanwhile
    (its notification may have expired) must not stay in force."""
    pattern = (TOPIC, "orders", LIT)

    class HeldAcls:
        def __init__(self):
            self.held = {pattern: (frozenset({(ALICE, "*", OPS.WRITE, ALLOW)}), 0)}

        async def acl_resources(self):
            return list(self.held)

        async def get_acls(self, *p):
            return self.held.get(p)

    authorizer = Authorizer({ADMIN})
    zk = HeldAcls()
    store = ZkAclStore(zk, authorizer)
    await store.load_all()
    assert authorizer.authorize(ALICE, "10.1.2.3", OPS.WRITE, TOPIC, "orders")
    zk.held.clear()
    await store.load_all()
    assert not authorizer.authorize(ALICE, "10.1.2.3", OPS.WRITE, TOPIC, "orders")
    assert authorizer.bindings() == []


async def test_describe_configs_of_a_broker_says_where_each_value_comes_from(tmp_path):
    # Kafka's ConfigSource: kafka-configs shows (and deletes) a broker's dynamic configs only
    # when they are said to be DYNAMIC_BROKER_CONFIG, the default entity's DYNAMIC_DEFAULT_...
    from tidelog.broker.zookeeper.layout import broker_entity_path
    from tidelog.protocol.throttles import FOLLOWER_RATE, LEADER_RATE

    b = Broker(str(tmp_path), authorizer=False)
    b.state.entity_configs.configs = {broker_entity_path(None): {FOLLOWER_RATE: "100", LEADER_RATE: "50"},
                                      broker_entity_path(ME): {LEADER_RATE: "200"}}
    req = DescribeConfigsRequest([DescribeConfigsResource(BROKER_RESOURCE, str(ME)),
                                  DescribeConfigsResource(BROKER_RESOURCE, "")])
    own, default = (await b.apis.describe_configs(req)).results
    sources = {e.name: (e.value, e.source, e.is_default) for e in own.configs}
    assert sources[LEADER_RATE] == ("200", 2, False)  # DYNAMIC_BROKER_CONFIG
    assert sources[FOLLOWER_RATE] == ("100", 3, False)  # DYNAMIC_DEFAULT_BROKER_CONFIG
    assert sources["zookeeper.connect"] == ("127.0.0.1:1", 4, False)  # STATIC_BROKER_CONFIG
    assert sources["num.partitions"] == ("1", 5, True)  # DEFAULT_CONFIG
    sources = {e.name: (e.value, e.source) for e in default.configs}
    assert sources[LEADER_RATE] == ("50", 3) and sources[FOLLOWER_RATE] == ("100", 3)
    for log in b.log_manager.logs.values():
        log.close()



async def test_describe_configs_of_another_broker_or_the_default_entity_is_kafkas(tmp_path):
    # Kafka's ConfigHelper: "" is the cluster-wide default entity and shows its dynamic values
    # alone; another broker's id is refused (a client asks that broker), not answered with
    # this broker's values under its name
    from tidelog.broker.zookeeper.layout import broker_entity_path
    from tidelog.protocol.throttles import FOLLOWER_RATE

    b = Broker(str(tmp_path), authorizer=False)
    b.state.entity_configs.configs = {broker_entity_path(None): {FOLLOWER_RATE: "100"}}
    req = DescribeConfigsRequest([DescribeConfigsResource(BROKER_RESOURCE, ""),
                                  DescribeConfigsResource(BROKER_RESOURCE, str(ME + 1)),
                                  DescribeConfigsResource(BROKER_RESOURCE, "one")])
    default, other, garbage = (await b.apis.describe_configs(req)).results
    assert [(e.name, e.value, e.source) for e in default.configs] == [(FOLLOWER_RATE, "100", 3)]
    for r in (other, garbage):
        assert r.error_code == INVALID_REQUEST.code and not r.configs
        assert f"expected {ME} or empty string" in r.error_message
    for log in b.log_manager.logs.values():
        log.close()

async def test_a_kafka_clients_fetch_carries_the_bound_its_topic_inflates_batches_to(broker):
    # the Kafka listener decompresses a batch to translate it: within the bound the topic
    # accepted it under (8 x max.message.bytes), not a fixed one
    from tidelog.protocol.kafka.apis import INFLATION_BOUND

    broker.allow(TOPIC, "orders", OPS.ALL)
    assert codes(broker.apis.produce(produce("orders"), ctx())) == {"orders": NONE.code}
    bound = broker.log_manager.get_log(TP).config.max_uncompressed_bytes
    native = broker.apis.fetch(fetch("orders"), ctx())
    kafka = broker.apis.fetch(fetch("orders"), ctx()._replace(kafka_version=12))
    assert [p.get(INFLATION_BOUND) for t in native["responses"] for p in t["partitions"]] == [None]
    assert [p[INFLATION_BOUND] for t in kafka["responses"] for p in t["partitions"]] == [bound]
