"""The group coordinator through the broker's API layer (broker/apis.py), over a real
ReplicaManager and LogManager (one broker, no sockets, no ZooKeeper) and a fake clock:
join/sync/heartbeat/leave, the acks=all commit path, OffsetFetch, DescribeGroups,
DeleteGroups, loading the groups back from the log, unloading, and lag."""

from __future__ import annotations

import struct

import pytest
import trio

from tidelog.broker.apis import Apis
from tidelog.broker.context import RequestContext
from tidelog.broker.groups.group_coordinator import OFFSETS_TOPIC, CoordinatorConfig, GroupCoordinator
from tidelog.broker.groups.group_metadata import GroupConfig
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.network import SocketServer
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager
from tidelog.protocol.codec import ApiKey, RequestHeader
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    GROUP_ID_NOT_FOUND,
    ILLEGAL_GENERATION,
    MEMBER_ID_REQUIRED,
    NON_EMPTY_GROUP,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)
from tidelog.protocol.kafka.schema import codec
from tidelog.protocol.messages import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    FindCoordinatorRequest,
    HeartbeatRequest,
    JoinGroupProtocol,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaderAndIsrRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    LiveBroker,
    MemberIdentity,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchTopic,
    PartitionState,
    SyncGroupAssignment,
    SyncGroupRequest,
    UpdateMetadataRequest,
)
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import TopicPartition

OFFSETS_TP = TopicPartition(OFFSETS_TOPIC, 0)
DATA_TP = TopicPartition("orders", 0)


class Clock:
    """The wall clock (called) and the monotonic one: moving ``now`` moves both, a step of
    the wall clock (``wall_step``, as NTP makes) moves only the wall clock."""

    def __init__(self) -> None:
        self.now = 1_000_000
        self.wall_step = 0

    def __call__(self) -> int:
        return self.now + self.wall_step

    def monotonic(self) -> int:
        return self.now - 900_000  # another origin, as the real clocks have


def state(tp: TopicPartition, epoch: int = 1, leader: int = 1) -> PartitionState:
    return PartitionState(tp.topic, tp.partition, 1, leader, epoch, [1], epoch, [1])


class Broker:
    """One broker's replica manager, metadata and coordinator, behind the real Apis."""

    def __init__(self, log_dir: str, offsets_partitions: int = 1):
        self.offsets_tps = [TopicPartition(OFFSETS_TOPIC, p) for p in range(offsets_partitions)]
        self.clock = Clock()
        self.log_manager = LogManager([log_dir], LogConfig(), broker_id=1)
        self.log_manager.startup()
        self.replica_manager = ReplicaManager(ReplicaConfig(1), self.log_manager, lambda t: LogConfig(),
                                              lambda leader, fetcher=0: None, clock=self.clock)
        self.metadata = MetadataCache(1)
        self.metadata.update(UpdateMetadataRequest(1, 1, 0, [*map(state, self.offsets_tps), state(DATA_TP)],
                                                   [LiveBroker(1, "127.0.0.1", 9092)]))
        self.config = CoordinatorConfig(1, offsets_topic_num_partitions=offsets_partitions, group=GroupConfig(
            initial_rebalance_delay_ms=100, min_session_timeout_ms=10))
        self.coordinator = self.new_coordinator()
        self.apis = Apis(None, self.replica_manager, self.metadata, group_coordinator=self.coordinator)

    def new_coordinator(self) -> GroupCoordinator:
        c = GroupCoordinator(self.config, self.replica_manager, self.metadata, clock=self.clock,
                             monotonic_clock=self.clock.monotonic)
        self.replica_manager.leadership_listeners[:] = [c.on_leadership_change]
        return c

    def lead(self, epoch: int = 1) -> None:
        self.replica_manager.become_leader_or_follower(
            LeaderAndIsrRequest(1, 1, 0, [*(state(tp, epoch) for tp in self.offsets_tps), state(DATA_TP, epoch)]))

    async def call(self, api_key: ApiKey, request, client_id: str = "client"):
        result = self.apis.handle(RequestContext(RequestHeader(api_key, 0, 1, client_id), "127.0.0.1:5000"),
                                  request.to_body())
        return await result if hasattr(result, "__await__") else result


@pytest.fixture
async def broker(tmp_path, nursery):
    b = Broker(str(tmp_path))
    b.lead()
    await nursery.start(b.coordinator.run)
    await wait_loaded(b.coordinator)
    yield b
    b.log_manager.shutdown()


async def wait_loaded(c: GroupCoordinator) -> None:
    with trio.fail_after(10):
        while c.loading:
            await trio.sleep(0.01)


def join(group="g", member_id="", instance=None, metadata=b"topics"):
    return JoinGroupRequest(group, 1000, member_id, "consumer", [JoinGroupProtocol("range", metadata)], 5000, instance)


async def form_group(b: Broker, n: int) -> tuple[list, int]:
    """``n`` members join together; returns their JoinGroup responses (leader first) and the
    generation, after the leader's SyncGroup."""
    ids = []
    for _ in range(n):
        r = await b.call(ApiKey.JOIN_GROUP, join())
        assert r.error_code == MEMBER_ID_REQUIRED.code
        ids.append(r.member_id)
    responses = {}

    async def rejoin(member_id):
        responses[member_id] = await b.call(ApiKey.JOIN_GROUP, join(member_id=member_id))

    async with trio.open_nursery() as n_:
        for member_id in ids:
            n_.start_soon(rejoin, member_id)
        await trio.sleep(0.05)
        for _ in range(20):  # the initial delay ends (extended while members arrived)
            b.clock.now += 100
            b.coordinator.tick()
            await trio.sleep(0.01)
            if len(responses) == n:
                break
    leader = next(r for r in responses.values() if r.members)
    assert {m.member_id for m in leader.members} == set(ids)
    ordered = [leader] + [r for r in responses.values() if r is not leader]
    sync = await b.call(ApiKey.SYNC_GROUP, SyncGroupRequest("g", leader.generation_id, leader.member_id, [
        SyncGroupAssignment(m, m.encode()) for m in ids]))
    assert sync.error_code == NONE.code and sync.assignment == leader.member_id.encode()
    return ordered, leader.generation_id


def commit(offset: int, generation: int = -1, member_id: str = "", group: str = "g", tp: TopicPartition = DATA_TP):
    return OffsetCommitRequest(group, [OffsetCommitTopic(tp.topic, [OffsetCommitPartition(tp.partition, offset)])],
                               generation, member_id)


def committed_code(resp) -> int:
    return resp.topics[0].partitions[0].error_code


async def fetched(b: Broker, group: str = "g") -> dict[TopicPartition, int]:
    r = await b.call(ApiKey.OFFSET_FETCH, OffsetFetchRequest(group, [OffsetFetchTopic(DATA_TP.topic, [0, 1])]))
    assert r.error_code == NONE.code
    return {TopicPartition(t.name, p.partition_index): p.committed_offset for t in r.topics for p in t.partitions}


async def test_find_coordinator_names_the_leader_of_the_groups_partition(broker):
    r = await broker.call(ApiKey.FIND_COORDINATOR, FindCoordinatorRequest("g"))
    assert (r.error_code, r.node_id, r.host, r.port) == (NONE.code, 1, "127.0.0.1", 9092)


async def test_join_sync_heartbeat_commit_fetch_leave_delete(broker):
    (leader, follower), generation = await form_group(broker, 2)
    r = await broker.call(ApiKey.SYNC_GROUP, SyncGroupRequest("g", generation, follower.member_id))
    assert r.error_code == NONE.code and r.assignment == follower.member_id.encode()
    hb = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, follower.member_id))
    assert hb.error_code == NONE.code

    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(42, generation, leader.member_id))) == 0
    assert await fetched(broker) == {DATA_TP: 42, TopicPartition("orders", 1): -1}
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(7, generation - 1, leader.member_id))) \
        == ILLEGAL_GENERATION.code
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(7))) == UNKNOWN_MEMBER_ID.code
    assert await fetched(broker) == {DATA_TP: 42, TopicPartition("orders", 1): -1}  # refused commits left no trace

    d = (await broker.call(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(["g", "nope"]))).groups
    assert (d[0].group_state, d[0].protocol_data, d[0].generation_id) == ("Stable", "range", generation)
    assert {m.member_id: m.member_assignment for m in d[0].members} == {
        leader.member_id: leader.member_id.encode(), follower.member_id: follower.member_id.encode()}
    assert {m.client_id for m in d[0].members} == {"client"} and d[1].group_state == "Dead"

    r = await broker.call(ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["g"]))
    assert r.results[0].error_code == NON_EMPTY_GROUP.code

    r = await broker.call(ApiKey.LEAVE_GROUP, LeaveGroupRequest("g", [MemberIdentity(follower.member_id)]))
    assert r.error_code == NONE.code
    hb = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))
    assert hb.error_code == REBALANCE_IN_PROGRESS.code
    await broker.call(ApiKey.LEAVE_GROUP, LeaveGroupRequest("g", [MemberIdentity(leader.member_id)]))
    listed = await broker.call(ApiKey.LIST_GROUPS, ListGroupsRequest())
    assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Empty")]

    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(50))) == NONE.code  # a reset, as Empty
    assert (await fetched(broker))[DATA_TP] == 50
    r = await broker.call(ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["g"]))
    assert r.results[0].error_code == NONE.code
    assert (await fetched(broker))[DATA_TP] == -1
    r = await broker.call(ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["g"]))
    assert r.results[0].error_code == GROUP_ID_NOT_FOUND.code


async def test_a_new_coordinator_loads_groups_and_offsets_from_the_log(broker, nursery):
    (leader,), generation = await form_group(broker, 1)
    await broker.call(ApiKey.OFFSET_COMMIT, commit(10, generation, leader.member_id))
    await broker.call(ApiKey.OFFSET_COMMIT, commit(11, generation, leader.member_id))
    await broker.call(ApiKey.OFFSET_COMMIT, commit(3, group="other"))
    await broker.call(ApiKey.OFFSET_COMMIT, commit(4, group="deleted"))
    await broker.call(ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["deleted"]))

    broker.coordinator.on_leadership_change(OFFSETS_TP, False, 1)  # leadership moves away ...
    r = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))
    assert r.error_code == NOT_COORDINATOR.code

    new = broker.new_coordinator()  # ... and to a coordinator that knows nothing
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    assert new.coordinator_error("g") is COORDINATOR_LOAD_IN_PROGRESS
    await nursery.start(new.run)
    await wait_loaded(new)
    assert await fetched(broker) == {DATA_TP: 11, TopicPartition("orders", 1): -1}
    assert (await fetched(broker, "other"))[DATA_TP] == 3
    assert (await fetched(broker, "deleted"))[DATA_TP] == -1
    d = (await broker.call(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(["g"]))).groups[0]
    assert (d.group_state, d.generation_id, [m.member_id for m in d.members]) == ("Stable", generation,
                                                                                   [leader.member_id])
    hb = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))
    assert hb.error_code == NONE.code  # the member carries on with the new coordinator


async def test_unloading_answers_waiting_joins_not_coordinator(broker, nursery):
    (leader,), generation = await form_group(broker, 1)
    r = await broker.call(ApiKey.JOIN_GROUP, join())
    responses = []

    async def second_join():
        responses.append(await broker.call(ApiKey.JOIN_GROUP, join(member_id=r.member_id)))

    nursery.start_soon(second_join)
    await trio.sleep(0.05)
    broker.coordinator.on_leadership_change(OFFSETS_TP, False, 1)
    with trio.fail_after(5):
        while not responses:
            await trio.sleep(0.01)
    assert responses[0].error_code == NOT_COORDINATOR.code


async def test_session_expiry_then_lag(broker):
    (leader,), generation = await form_group(broker, 1)
    broker.replica_manager.append_now(1, {DATA_TP: build_batch([b"a", b"b", b"c", b"d"])})
    await broker.call(ApiKey.OFFSET_COMMIT, commit(1, generation, leader.member_id))
    assert broker.coordinator.lag() == [("g", DATA_TP, 1, 3)]
    broker.clock.now += 1000  # the session timeout
    broker.coordinator.tick()
    d = (await broker.call(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(["g"]))).groups[0]
    assert d.group_state == "Empty" and d.members == []
    assert broker.coordinator.state_counts()["Empty"] == 1


async def test_a_step_of_the_wall_clock_neither_expires_nor_prolongs_a_session(broker):
    """Sessions count on the monotonic clock; what is stored (a commit's timestamp) is wall
    time."""
    hour = 3_600_000
    (leader,), generation = await form_group(broker, 1)
    broker.clock.wall_step += hour
    broker.coordinator.tick()
    r = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))
    assert r.error_code == NONE.code
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(1, generation, leader.member_id))) == 0
    assert broker.coordinator.groups["g"].offsets[DATA_TP].commit_timestamp_ms == broker.clock()
    broker.clock.wall_step -= 2 * hour
    broker.clock.now += 999
    broker.coordinator.tick()
    assert (await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))).error_code == 0
    broker.clock.now += 1000  # the session timeout, by the monotonic clock
    broker.coordinator.tick()
    d = (await broker.call(ApiKey.DESCRIBE_GROUPS, DescribeGroupsRequest(["g"]))).groups[0]
    assert d.group_state == "Empty" and d.members == []


async def form_static_group(b: Broker, instance: str) -> JoinGroupResponse:
    """A Stable group of one static member, its JoinGroup answer."""
    answers = []

    async def first_join():
        answers.append(await b.call(ApiKey.JOIN_GROUP, join(instance=instance)))

    async with trio.open_nursery() as n:
        n.start_soon(first_join)
        for _ in range(20):  # the initial delay
            await trio.sleep(0.01)
            b.clock.now += 100
            b.coordinator.tick()
            if answers:
                break
    (joined,) = answers
    sync = await b.call(ApiKey.SYNC_GROUP, SyncGroupRequest("g", joined.generation_id, joined.member_id, [
        SyncGroupAssignment(joined.member_id, b"assigned")], group_instance_id=instance))
    assert sync.error_code == NONE.code
    return joined


async def kafka_join_group(port: int, version: int, instance: str) -> dict:
    """A JoinGroup of Kafka ``version`` with an empty member id, on the Kafka wire."""
    flexible = version >= 6
    body = codec("JoinGroupRequest", version).encode({
        "group_id": "g", "session_timeout_ms": 1000, "rebalance_timeout_ms": 5000, "member_id": "",
        "group_instance_id": instance, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"topics"}]})
    head = struct.pack(">hhih", int(ApiKey.JOIN_GROUP), version, 7, 3) + b"app" + (b"\0" if flexible else b"")
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(struct.pack(">i", len(head) + len(body)) + head + bytes(body))
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = await stream.receive_some(65536)
            assert chunk, "the connection closed"
            data += chunk
    return codec("JoinGroupResponse", version).decode_all(data[9 if flexible else 8:])


@pytest.mark.parametrize("version", [5, 6, 7])  # group_instance_id from v5 on
async def test_a_restarted_static_leader_on_the_kafka_listener_is_told_the_old_leader(broker, nursery, version):
    """Kafka's answer to a static leader rejoining a Stable group with JoinGroup below v9 (no
    skip_assignment): no members, and the old member id as the leader, so that the client
    takes itself for a follower and does not compute an assignment the group would ignore."""
    old = await form_static_group(broker, "host-a")
    port = await nursery.start(SocketServer(broker.apis.handle, port=0, wire="kafka").run)
    r = await kafka_join_group(port, version, "host-a")
    assert r["error_code"] == NONE.code and r["member_id"] != old.member_id
    assert (r["generation_id"], r["leader"], r["members"]) == (old.generation_id, old.member_id, [])
    sync = await broker.call(ApiKey.SYNC_GROUP, SyncGroupRequest("g", r["generation_id"], r["member_id"],
                                                                 group_instance_id="host-a"))
    assert (sync.error_code, sync.assignment) == (NONE.code, b"assigned")


async def test_a_restarted_static_leader_on_the_native_listener_leads_without_assigning(broker):
    old = await form_static_group(broker, "host-a")
    r = await broker.call(ApiKey.JOIN_GROUP, join(instance="host-a"))
    assert r.error_code == NONE.code and r.leader == r.member_id != old.member_id
    assert [m.member_id for m in r.members] == [r.member_id] and r.skip_assignment


async def test_the_metrics_endpoint_exports_lag_and_group_counts(broker, tmp_path):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from tests.component.ops.test_metrics import FakeServer
    from tidelog.broker.metrics import RequestMetrics, build_registry

    (leader,), generation = await form_group(broker, 1)
    broker.replica_manager.append_now(1, {DATA_TP: build_batch([b"a", b"b", b"c"])})
    await broker.call(ApiKey.OFFSET_COMMIT, commit(1, generation, leader.member_id))
    server = FakeServer(broker.replica_manager, broker.log_manager)
    server.group_coordinator = broker.coordinator
    text = generate_latest(build_registry(server, RequestMetrics(), process=False)).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    labels = (("group", "g"), ("partition", "0"), ("topic", "orders"))
    assert samples[("tidelog_group_lag", labels)] == 2
    assert samples[("tidelog_group_committed_offset", labels)] == 1
    assert samples[("tidelog_group_count", (("state", "Stable"),))] == 1


async def test_a_refused_first_join_leaves_no_group_behind(broker):
    bad = JoinGroupRequest("typo", 1, "", "consumer", [JoinGroupProtocol("range", b"")])  # session 1 ms
    r = await broker.call(ApiKey.JOIN_GROUP, bad)
    assert r.error_code == 26 and "group.min.session.timeout.ms" in r.error_message  # INVALID_SESSION_TIMEOUT
    assert (await broker.call(ApiKey.LIST_GROUPS, ListGroupsRequest())).groups == []


async def test_offsets_of_an_empty_group_expire_with_tombstones(broker, nursery):
    await broker.call(ApiKey.OFFSET_COMMIT, commit(9, group="idle"))
    assert await broker.coordinator.expire_offsets() == 0  # not yet
    broker.clock.now += broker.config.offsets_retention_ms
    assert await broker.coordinator.expire_offsets() == 2  # the offset and the group
    assert (await fetched(broker, "idle"))[DATA_TP] == -1
    assert (await broker.call(ApiKey.LIST_GROUPS, ListGroupsRequest())).groups == []
    new = broker.new_coordinator()  # the tombstones are in the log: a reload finds nothing
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    await wait_loaded(new)
    assert (await fetched(broker, "idle"))[DATA_TP] == -1


async def test_a_group_deleted_with_a_commit_in_flight_stays_deleted_after_a_reload(broker, nursery):
    """DeleteGroups of an Empty group whose first commit still waits for replication: that
    commit is in the log before the delete's tombstones, which cover its partition too."""
    release, calls = trio.Event(), []
    replicate = broker.replica_manager.await_replication

    async def held(*args):
        calls.append(args)
        if len(calls) == 1:  # the commit waits
            await release.wait()
        await replicate(*args)

    broker.replica_manager.await_replication = held
    responses = []

    async def commit_in_background():
        responses.append(await broker.call(ApiKey.OFFSET_COMMIT, commit(11, group="brief")))

    nursery.start_soon(commit_in_background)
    with trio.fail_after(5):
        while not calls:
            await trio.sleep(0.01)
    [deleted] = (await broker.call(ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["brief"]))).results
    assert deleted.error_code == NONE.code
    release.set()
    with trio.fail_after(5):
        while not responses:
            await trio.sleep(0.01)
    new = broker.new_coordinator()  # what the log says
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    await wait_loaded(new)
    assert (await fetched(broker, "brief"))[DATA_TP] == -1


async def test_a_groups_metadata_records_are_appended_in_the_order_decided(broker):
    """Two states decided in one step (a generation synced, then emptied) are in the log in
    that order as soon as they are decided: the last one is what a reload believes."""
    from tidelog.broker.groups.group_metadata import GroupMetadata, StoreGroup, StoreReason
    from tidelog.broker.groups.offsets_records import GroupMetadataValue, decode_group_value, group_key
    from tidelog.protocol.records import iter_all_records
    group = GroupMetadata("ordered", state_timestamp_ms=broker.clock())
    broker.coordinator.groups["ordered"] = group
    synced = GroupMetadataValue("consumer", 3, "range", "member-1", broker.clock())
    emptied = GroupMetadataValue("consumer", 4, None, None, broker.clock())
    log = broker.replica_manager.partitions[OFFSETS_TP].log
    before = log.log_end_offset
    broker.coordinator._apply(group, [StoreGroup(StoreReason.SYNC, 3, synced), StoreGroup(StoreReason.EMPTY, 4, emptied)])
    records = [r for r in iter_all_records(log.read(before, 1 << 20, max_offset=log.log_end_offset))
               if r.key == group_key("ordered")]
    assert [decode_group_value(r.value).generation for r in records] == [3, 4]


async def test_a_load_that_fails_is_tried_again_until_it_loads(broker, nursery, monkeypatch):
    """A failed read of the offsets partition (the log changing under it, a disk error) leaves
    its groups loading, answered COORDINATOR_LOAD_IN_PROGRESS, and is tried again: once it
    reads, the offsets are served. Never served half loaded."""
    import tidelog.broker.groups.group_coordinator as gc
    await broker.call(ApiKey.OFFSET_COMMIT, commit(7, group="kept"))
    monkeypatch.setattr(gc, "LOAD_RETRY_S", 0.01)
    new = broker.new_coordinator()
    read, failures = new._read_partition, []

    async def flaky(log):
        if len(failures) < 2:
            failures.append(1)
            raise FileNotFoundError("the segment was swapped out under the read")
        return await read(log)

    new._read_partition = flaky
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    r = await broker.call(ApiKey.OFFSET_FETCH, OffsetFetchRequest("kept", [OffsetFetchTopic(DATA_TP.topic, [0])]))
    assert r.error_code in (COORDINATOR_LOAD_IN_PROGRESS.code, NONE.code)
    await wait_loaded(new)
    assert len(failures) == 2 and (await fetched(broker, "kept"))[DATA_TP] == 7


async def test_a_commit_during_the_expiry_is_not_undone_by_its_tombstones(tmp_path, nursery):
    """Expiry decides the tombstones of every offsets partition at once; they are appended in
    that same step, so a commit that comes while one partition's tombstones wait for
    replication (re-creating a group just dropped) lands after its own group's tombstones,
    and a reload from the log finds it."""
    b = Broker(str(tmp_path), offsets_partitions=2)
    b.lead()
    await nursery.start(b.coordinator.run)
    await wait_loaded(b.coordinator)
    groups = {}
    for name in (f"group-{i}" for i in range(20)):
        groups.setdefault(b.coordinator.partition_of(name), name)
    first, second = groups[0], groups[1]  # one group in each offsets partition
    await b.call(ApiKey.OFFSET_COMMIT, commit(3, group=first))
    await b.call(ApiKey.OFFSET_COMMIT, commit(4, group=second))
    b.clock.now += b.config.offsets_retention_ms
    release, calls = trio.Event(), []
    replicate = b.replica_manager.await_replication

    async def held(*args):
        calls.append(args)
        if len(calls) == 1:  # the first partition's tombstones wait
            await release.wait()
        await replicate(*args)

    b.replica_manager.await_replication = held
    expired = []

    async def expire():
        expired.append(await b.coordinator.expire_offsets())

    nursery.start_soon(expire)
    with trio.fail_after(5):
        while not calls:
            await trio.sleep(0.01)
    # meanwhile the dropped group of the other partition commits again
    assert committed_code(await b.call(ApiKey.OFFSET_COMMIT, commit(500, group=second))) == NONE.code
    release.set()
    with trio.fail_after(5):
        while not expired:
            await trio.sleep(0.01)
    assert expired == [4]  # both groups' offset and group tombstones
    assert (await fetched(b, second))[DATA_TP] == 500
    new = b.new_coordinator()  # what the log says
    b.apis.coordinator = new
    b.lead(epoch=2)
    await nursery.start(new.run)
    await wait_loaded(new)
    assert (await fetched(b, second))[DATA_TP] == 500 and (await fetched(b, first))[DATA_TP] == -1
    b.log_manager.shutdown()


async def test_a_commit_waiting_for_replication_keeps_its_group_and_partition_from_cleanup(broker, nursery):
    """An acknowledged commit must be fetchable: while it waits for acks=all, neither the
    retention check nor a refused first JoinGroup may drop its (new, still empty) group, and
    an expired offset of the same partition is not tombstoned after it (Kafka's
    pendingOffsetCommits)."""
    release, calls = trio.Event(), []
    replicate = broker.replica_manager.await_replication

    async def held(*args):
        calls.append(args)
        if len(calls) <= 2:  # only the two commits under test wait
            await release.wait()
        await replicate(*args)

    await broker.call(ApiKey.OFFSET_COMMIT, commit(3, group="old"))
    broker.clock.now += broker.config.offsets_retention_ms
    broker.replica_manager.await_replication = held
    responses = []

    async def commit_in_background(request):
        responses.append(await broker.call(ApiKey.OFFSET_COMMIT, request))

    nursery.start_soon(commit_in_background, commit(9, group="fresh"))
    nursery.start_soon(commit_in_background, commit(4, group="old"))
    with trio.fail_after(5):
        while len(calls) < 2:
            await trio.sleep(0.01)
    bad = JoinGroupRequest("fresh", 1, "", "consumer", [JoinGroupProtocol("range", b"")])  # refused: 1 ms
    assert (await broker.call(ApiKey.JOIN_GROUP, bad)).error_code == 26
    await broker.coordinator.expire_offsets()
    release.set()
    with trio.fail_after(5):
        while len(responses) < 2:
            await trio.sleep(0.01)
    assert [committed_code(r) for r in responses] == [NONE.code, NONE.code]
    assert (await fetched(broker, "fresh"))[DATA_TP] == 9
    assert (await fetched(broker, "old"))[DATA_TP] == 4
    new = broker.new_coordinator()  # the log agrees with what was fetched
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    await wait_loaded(new)
    assert (await fetched(broker, "fresh"))[DATA_TP] == 9
    assert (await fetched(broker, "old"))[DATA_TP] == 4


async def test_a_new_leader_epoch_without_a_new_leader_keeps_the_groups(broker, nursery):
    """The controller bumps an offsets partition's leader epoch whenever its ISR shrinks (a
    follower died or shut down) while the leader stays: the coordinator keeps its groups
    loaded, a JoinGroup waiting in a rebalance keeps waiting and completes it (Kafka keeps a
    partition it already owns)."""
    (leader,), generation = await form_group(broker, 1)
    newcomer = await broker.call(ApiKey.JOIN_GROUP, join())
    responses = []

    async def second_join():
        responses.append(await broker.call(ApiKey.JOIN_GROUP, join(member_id=newcomer.member_id)))

    nursery.start_soon(second_join)
    with trio.fail_after(5):
        while broker.coordinator.groups["g"].state.value != "PreparingRebalance":
            await trio.sleep(0.01)
    broker.lead(epoch=2)  # same leader, next epoch
    assert broker.coordinator.coordinator_error("g") is None
    hb = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))
    assert hb.error_code == REBALANCE_IN_PROGRESS.code  # the rebalance goes on
    rejoined = await broker.call(ApiKey.JOIN_GROUP, join(member_id=leader.member_id))
    with trio.fail_after(5):
        while not responses:
            await trio.sleep(0.01)
    assert (rejoined.error_code, responses[0].error_code) == (NONE.code, NONE.code)
    assert rejoined.generation_id == responses[0].generation_id == generation + 1


async def commit_held_in_replication(broker, nursery, offset: int):
    """A commit of ``offset`` started in the background and held in its wait for replication:
    (the event that releases it, the list its response goes to)."""
    release, calls = trio.Event(), []
    replicate = broker.replica_manager.await_replication

    async def held(*args):
        calls.append(args)
        await release.wait()
        await replicate(*args)

    broker.replica_manager.await_replication = held
    responses = []

    async def commit_in_background():
        responses.append(await broker.call(ApiKey.OFFSET_COMMIT, commit(offset)))

    nursery.start_soon(commit_in_background)
    with trio.fail_after(5):
        while not calls:
            await trio.sleep(0.01)
    return release, responses


async def test_a_commit_in_flight_across_a_new_leader_epoch_is_acknowledged(broker, nursery):
    """A commit appended before the epoch bump of a leader that stays is committed like any
    other: it is acknowledged and fetched, not refused as if the coordinator had moved."""
    release, responses = await commit_held_in_replication(broker, nursery, 42)
    broker.lead(epoch=2)  # the ISR shrank: same leader, next epoch
    release.set()
    with trio.fail_after(5):
        while not responses:
            await trio.sleep(0.01)
    assert committed_code(responses[0]) == NONE.code
    assert (await fetched(broker))[DATA_TP] == 42


async def test_leadership_lost_and_regained_reloads_and_fences_what_was_in_flight(broker, nursery):
    """Losing the partition and leading it again is a new ownership: the groups are loaded
    again from the log, and a commit appended under the earlier ownership is answered
    NOT_COORDINATOR (its client retries against the coordinator it finds)."""
    from tidelog.protocol.messages import StopReplicaPartition, StopReplicaRequest
    await broker.call(ApiKey.OFFSET_COMMIT, commit(7))
    release, responses = await commit_held_in_replication(broker, nursery, 8)
    broker.replica_manager.stop_replicas(StopReplicaRequest(1, 1, 0, [StopReplicaPartition(OFFSETS_TOPIC, 0)]))
    assert broker.coordinator.coordinator_error("g") is NOT_COORDINATOR
    broker.lead(epoch=3)  # led by another broker at epoch 2, then here again
    assert broker.coordinator.coordinator_error("g") is COORDINATOR_LOAD_IN_PROGRESS
    release.set()
    with trio.fail_after(5):
        while not responses:
            await trio.sleep(0.01)
    assert committed_code(responses[0]) == NOT_COORDINATOR.code
    await wait_loaded(broker.coordinator)
    assert (await fetched(broker))[DATA_TP] == 8  # the reload read both records


async def coordinator_loading_until_released(broker, nursery):
    """A new coordinator for the broker, leading the offsets partition at epoch 2, whose load
    of it waits for the returned event."""
    new = broker.new_coordinator()
    read, release = new._read_partition, trio.Event()

    async def slow(log):
        await release.wait()
        return await read(log)

    new._read_partition = slow
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    return new, release


async def test_sync_and_heartbeat_while_the_partition_loads_answer_as_kafka(broker, nursery):
    """While the group's partition loads, SyncGroup is answered REBALANCE_IN_PROGRESS (the
    member rejoins; clients do not expect COORDINATOR_LOAD_IN_PROGRESS there: a Java consumer
    fails on it) and a heartbeat NONE, as Kafka's coordinator answers."""
    (leader,), generation = await form_group(broker, 1)
    new, release = await coordinator_loading_until_released(broker, nursery)
    sync = await broker.call(ApiKey.SYNC_GROUP, SyncGroupRequest("g", generation, leader.member_id))
    hb = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))
    joined = await broker.call(ApiKey.JOIN_GROUP, join(member_id=leader.member_id))
    assert (sync.error_code, hb.error_code) == (REBALANCE_IN_PROGRESS.code, NONE.code)
    assert joined.error_code == COORDINATOR_LOAD_IN_PROGRESS.code  # JoinGroup is retried as it is
    release.set()
    await wait_loaded(new)
    hb = await broker.call(ApiKey.HEARTBEAT, HeartbeatRequest("g", generation, leader.member_id))
    assert hb.error_code == NONE.code


OTHER_TP = TopicPartition("payments", 0)


async def test_the_offsets_of_a_deleted_topic_are_dropped_and_tombstoned(broker, nursery):
    """Kafka's handleDeletedPartitions: a topic's deletion drops its offsets from every group
    coordinated here, with tombstones (so no reload brings them back), and a group left Empty
    without offsets goes; a topic created again under the name starts without offsets."""
    live = [LiveBroker(1, "127.0.0.1", 9092)]
    broker.metadata.update(UpdateMetadataRequest(1, 1, 0, [state(OTHER_TP)], live))
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(42))) == NONE.code
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(7, group="both"))) == NONE.code
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(5, group="both", tp=OTHER_TP))) == NONE.code

    broker.metadata.update(UpdateMetadataRequest(1, 1, 0, [], live, deleted_topics=[DATA_TP.topic]))
    broker.coordinator.handle_deleted_topics([DATA_TP.topic])
    broker.metadata.update(UpdateMetadataRequest(1, 1, 0, [state(DATA_TP)], live))  # created again

    async def offsets(group):
        r = await broker.call(ApiKey.OFFSET_FETCH, OffsetFetchRequest(group))
        return {TopicPartition(t.name, p.partition_index): p.committed_offset for t in r.topics for p in t.partitions}

    assert await offsets("g") == {} and await offsets("both") == {OTHER_TP: 5}
    assert [g.group_id for g in (await broker.call(ApiKey.LIST_GROUPS, ListGroupsRequest())).groups] == ["both"]
    new = broker.new_coordinator()  # what the log says
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    await wait_loaded(new)
    assert await offsets("g") == {} and await offsets("both") == {OTHER_TP: 5}


async def test_a_commit_in_flight_for_a_topic_being_deleted_is_not_kept(broker, nursery):
    """A commit appended before the deletion and acknowledged after it is followed in the log
    by the deletion's tombstone: neither the cache nor a reload keeps its offset."""
    release, calls = trio.Event(), []
    replicate = broker.replica_manager.await_replication

    async def held(*args):
        calls.append(args)
        if len(calls) == 1:
            await release.wait()
        await replicate(*args)

    broker.replica_manager.await_replication = held
    responses = []

    async def commit_in_background():
        responses.append(await broker.call(ApiKey.OFFSET_COMMIT, commit(42)))

    nursery.start_soon(commit_in_background)
    with trio.fail_after(5):
        while not calls:
            await trio.sleep(0.01)
    live = [LiveBroker(1, "127.0.0.1", 9092)]
    broker.metadata.update(UpdateMetadataRequest(1, 1, 0, [], live, deleted_topics=[DATA_TP.topic]))
    broker.coordinator.handle_deleted_topics([DATA_TP.topic])
    broker.metadata.update(UpdateMetadataRequest(1, 1, 0, [state(DATA_TP)], live))  # created again
    release.set()
    with trio.fail_after(5):
        while not responses:
            await trio.sleep(0.01)
    assert committed_code(responses[0]) == NONE.code  # it was written: the deletion came after
    assert (await fetched(broker))[DATA_TP] == -1
    new = broker.new_coordinator()
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    await wait_loaded(new)
    assert (await fetched(broker))[DATA_TP] == -1


async def test_a_topic_deleted_while_the_groups_partition_loads_loses_its_offsets_once_loaded(broker, nursery):
    await broker.call(ApiKey.OFFSET_COMMIT, commit(42))
    new, release = await coordinator_loading_until_released(broker, nursery)
    new.handle_deleted_topics([DATA_TP.topic])
    release.set()
    await wait_loaded(new)
    assert (await fetched(broker))[DATA_TP] == -1


@pytest.mark.parametrize("removal", ["DeleteGroups", "expiry"])
async def test_a_removed_group_stays_removed_though_a_commit_of_it_timed_out(broker, nursery, removal):
    """A commit whose replication timed out is not cached, but its record is in the log and
    may be committed later: removing the group (DeleteGroups, or the retention check of an
    Empty group without offsets) tombstones its partition too, so no coordinator loads that
    offset back into a group that is gone."""
    async def timed_out(waiting, timeout_ms, results):  # the follower did not fetch in time
        broker.replica_manager.time_out_replication(waiting, timeout_ms, results)

    broker.replica_manager.await_replication = timed_out
    assert committed_code(await broker.call(ApiKey.OFFSET_COMMIT, commit(42))) != NONE.code  # timed out
    assert (await fetched(broker))[DATA_TP] == -1
    if removal == "DeleteGroups":
        [deleted] = (await broker.call(ApiKey.DELETE_GROUPS, DeleteGroupsRequest(["g"]))).results
        assert deleted.error_code != NONE.code  # its tombstones time out too: written, not acknowledged
    else:
        await broker.coordinator.expire_offsets()
    assert (await broker.call(ApiKey.LIST_GROUPS, ListGroupsRequest())).groups == []
    del broker.replica_manager.await_replication
    new = broker.new_coordinator()  # the records were committed after all: what the log says
    broker.apis.coordinator = new
    broker.lead(epoch=2)
    await nursery.start(new.run)
    await wait_loaded(new)
    assert (await fetched(broker))[DATA_TP] == -1
    assert (await broker.call(ApiKey.LIST_GROUPS, ListGroupsRequest())).groups == []
