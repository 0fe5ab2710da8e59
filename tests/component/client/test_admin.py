"""AsyncAdmin against the fake cluster: controller routing, per-topic errors, configs."""

from __future__ import annotations

import pytest
import trio

from tests.component.client.fake_broker import Fault
from tidelog.aio import AsyncAdmin, NewTopic
from tidelog.errors import RequestTimedOut
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    ELECTION_NOT_NEEDED,
    GROUP_AUTHORIZATION_FAILED,
    INVALID_PARTITIONS,
    NOT_CONTROLLER,
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
)
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import TopicPartition

FAST = dict(retry_backoff_ms=10)


async def test_topic_administration_goes_to_the_controller(fake):
    fake.controller = 1  # bootstrap lists node 0 first; only node 1 may create topics
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        assert await admin.create_topics([NewTopic("a", 3), NewTopic("b", replica_assignment={0: [1], 1: [0]})]) \
            == {"a": None, "b": None}
        await admin.create_partitions({"a": 5})
        await admin.delete_topics(["b"])
    assert len(fake.topics["a"].partitions) == 5 and "b" not in fake.topics
    assert fake.topics["a"].leaders[:3] == [0, 1, 0]
    admin_keys = {ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_TOPICS}
    assert {node for node, key, _ in fake.requests if key in admin_keys} == {1}


async def test_not_controller_refreshes_metadata_and_retries(fake):
    fake.inject(ApiKey.CREATE_TOPICS, error_code=NOT_CONTROLLER.code, count=2)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        await admin.create_topics([NewTopic("a", 1)])
    assert "a" in fake.topics and len(fake.sent(ApiKey.CREATE_TOPICS)) == 3


async def test_a_whole_request_not_controller_answer_is_retried(fake):
    """A controller that resigned while the request was queued answers NOT_CONTROLLER for the
    request as a whole: like a per-topic NOT_CONTROLLER, the client finds the new controller."""
    fake.create_topic("old", 1)
    for key in (ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_TOPICS):
        fake.inject(key, error_code=NOT_CONTROLLER.code, whole_request=True)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        assert await admin.create_topics([NewTopic("a", 1)]) == {"a": None}
        assert await admin.create_partitions({"a": 2}) == {"a": None}
        assert await admin.delete_topics(["old"]) == {"old": None}
    assert len(fake.topics["a"].partitions) == 2 and "old" not in fake.topics
    assert len(fake.sent(ApiKey.CREATE_TOPICS)) == len(fake.sent(ApiKey.DELETE_TOPICS)) == 2


async def test_an_election_answered_not_controller_per_partition_is_retried(fake):
    """Kafka's broker answers ElectLeaders NOT_CONTROLLER per partition (and a failing
    handler for the request as a whole): the client finds the controller again and resends
    the partitions so answered, of a named list or of all partitions."""
    fake.create_topic("t", 2)
    tp = TopicPartition("t", 0)
    fake.inject(ApiKey.ELECT_LEADERS, error_code=NOT_CONTROLLER.code, count=2)
    fake.inject(ApiKey.ELECT_LEADERS, error_code=NOT_CONTROLLER.code, whole_request=True)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        assert await admin.elect_leaders([tp]) == {tp: (ELECTION_NOT_NEEDED.code, None)}
        assert len(fake.sent(ApiKey.ELECT_LEADERS)) == 4
        fake.inject(ApiKey.ELECT_LEADERS, error_code=NOT_CONTROLLER.code)
        assert await admin.elect_leaders() == {}
    assert [r.topic_partitions for r in fake.sent(ApiKey.ELECT_LEADERS)[4:]] == [None, None]


async def test_errors_name_the_topic_and_the_cause_and_keep_the_other_results(fake):
    fake.create_topic("exists", 1)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        with pytest.raises(TidelogError, match="cannot create topic 'exists': TOPIC_ALREADY_EXISTS") as info:
            await admin.create_topics([NewTopic("new", 1), NewTopic("exists", 1)])
        assert info.value.error is TOPIC_ALREADY_EXISTS
        assert info.value.results["new"] is None
        with pytest.raises(TidelogError, match="'ghost'.*UNKNOWN_TOPIC_OR_PARTITION"):
            await admin.delete_topics(["ghost"])
        with pytest.raises(TidelogError) as info:
            await admin.create_partitions({"exists": 1})
        assert info.value.error is INVALID_PARTITIONS
        with pytest.raises(TidelogError, match="topic name"):
            await admin.create_topics([NewTopic("bad name!")])
    assert "new" in fake.topics


async def test_validate_only_creates_nothing(fake):
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        await admin.create_topics([NewTopic("a", 2)], validate_only=True)
    assert "a" not in fake.topics


async def test_describe_and_list(fake):
    fake.create_topic("b", 2, leaders=[1, 0])
    fake.create_topic("a", 1)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        assert await admin.list_topics() == ["a", "b"]
        [b] = await admin.describe_topics(["b"])
        assert [(p.partition, p.leader, p.replicas, p.isr) for p in b.partitions] == [(0, 1, (1,), (1,)), (1, 0, (0,), (0,))]
        assert [d.name for d in await admin.describe_topics()] == ["a", "b"]
        with pytest.raises(TidelogError, match="'nope'") as info:
            await admin.describe_topics(["nope"])
        assert info.value.error is UNKNOWN_TOPIC_OR_PARTITION
        cluster = await admin.describe_cluster()
        assert (cluster.cluster_id, cluster.controller_id, [b.node_id for b in cluster.brokers]) == ("fake-cluster", 0, [0, 1])


async def test_configs(fake):
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        await admin.create_topics([NewTopic("a", 1, config={"cleanup.policy": "compact"})])
        configs = await admin.describe_configs("a")
        assert configs["cleanup.policy"].value == "compact" and not configs["cleanup.policy"].is_default
        assert configs["retention.ms"].is_default
        await admin.alter_configs("a", {"retention.ms": 1000, "cleanup.policy": None})
        configs = await admin.describe_configs("a", keys=["retention.ms", "cleanup.policy"])
        assert configs["retention.ms"].value == "1000" and "cleanup.policy" not in configs
        with pytest.raises(TidelogError, match="'ghost'"):
            await admin.alter_configs("ghost", {"x": "1"})


async def test_an_unreachable_cluster_is_a_bounded_error():
    async with AsyncAdmin("127.0.0.1:1", **FAST) as admin:
        with trio.fail_after(5):
            with pytest.raises(RequestTimedOut, match="127.0.0.1:1"):
                await admin.create_topics([NewTopic("a")], timeout_ms=300)
            with pytest.raises(TidelogError, match="127.0.0.1:1"):
                await admin.list_topics(timeout_ms=300)


async def test_describe_log_dirs_asks_every_broker_and_keeps_the_others_results_on_a_failure(fake):
    fake.create_topic("orders", 2)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        await admin.create_topics([NewTopic("x", 1)])
        dirs = await admin.describe_log_dirs()
        assert sorted(dirs) == [0, 1]
        replicas = {tp: (b, r) for b, by_dir in dirs.items() for d in by_dir.values() for tp, r in d.replicas.items()}
        leader, info = replicas[TopicPartition("orders", 0)]
        assert leader == fake.topics["orders"].leaders[0] and info.log_end_offset == 0
        assert dirs[0]["/fake/0"].total_bytes == 1000
        fake.faults.append(Fault(ApiKey.DESCRIBE_LOG_DIRS, node=1, error_code=CLUSTER_AUTHORIZATION_FAILED.code))
        with pytest.raises(TidelogError, match="broker 1") as e:
            await admin.describe_log_dirs([0, 1])
        assert e.value.code == CLUSTER_AUTHORIZATION_FAILED.code and "/fake/0" in e.value.results[0]


async def test_brokers_named_before_the_first_metadata_answer_are_waited_for(fake):
    """A fresh client knows no broker yet: the calls wait for the metadata, and a broker
    that cannot be reached for a moment is asked again until the call's timeout."""
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        assert await admin.broker_versions() == {0: "fake-0", 1: "fake-1"}
    fake.inject(ApiKey.DESCRIBE_LOG_DIRS, node=1, drop_connection=True)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        dirs = await admin.describe_log_dirs([1])
    assert list(dirs) == [1] and list(dirs[1]) == ["/fake/1"]
    assert len(fake.sent(ApiKey.DESCRIBE_LOG_DIRS)) == 2


async def test_a_broker_failing_list_groups_is_one_clear_error_not_a_group_of_them(fake):
    fake.inject(ApiKey.LIST_GROUPS, node=1, drop_connection=True, count=1000)
    async with AsyncAdmin(fake.bootstrap, request_timeout_ms=2000, default_api_timeout_ms=2000, **FAST) as admin:
        with pytest.raises(TidelogError, match="ListGroups to broker 1|broker 1"):
            await admin.list_groups()


async def test_group_lag_keeps_the_answered_partitions_when_one_has_no_leader(fake):
    """A leaderless partition's log end offset and lag are unknown; the others are still
    given, without waiting the call's whole timeout for the missing leader."""
    fake.create_topic("t", 3, leaders=[0, 1, -1])
    for p, count in ((0, 3), (1, 5)):
        fake.log("t", p).append(build_batch([(None, b"v", None, 1000 + i) for i in range(count)]))
    fake.group_offsets["g"] = {("t", 0): 1, ("t", 1): 5, ("t", 2): 0}
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        with trio.fail_after(30):  # far below the call's timeout
            offsets = await admin.list_group_offsets("g", timeout_ms=600_000)
    assert [(o.partition.partition, o.committed, o.log_end_offset, o.lag) for o in offsets] == [
        (0, 1, 3, 2), (1, 5, 5, 0), (2, 0, None, None)]


@pytest.mark.parametrize("unreachable", [dict(drop_connection=True), dict(delay_s=3600)], ids=["dropped", "silent"])
async def test_group_lag_keeps_the_answered_partitions_when_a_known_leader_is_unreachable(fake, unreachable):
    """A partition whose leader is known but does not answer until the call's timeout has an
    unknown log end offset and lag ("-" in groups describe, as kafka-consumer-groups); the
    partitions whose leaders answered keep theirs."""
    fake.create_topic("t", 2, leaders=[0, 1])
    for p, count in ((0, 3), (1, 5)):
        fake.log("t", p).append(build_batch([(None, b"v", None, 1000 + i) for i in range(count)]))
    fake.group_offsets["g"] = {("t", 0): 1, ("t", 1): 2}
    fake.inject(ApiKey.LIST_OFFSETS, node=1, count=10**9, **unreachable)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        with trio.fail_after(30):
            offsets = await admin.list_group_offsets("g", timeout_ms=1000)
    assert [(o.partition.partition, o.committed, o.log_end_offset, o.lag) for o in offsets] == [
        (0, 1, 3, 2), (1, 2, None, None)]


async def test_a_partition_the_topic_does_not_have_fails_at_once_naming_it(fake):
    fake.create_topic("t", 3)
    missing = TopicPartition("t", 7)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        with trio.fail_after(30):  # far below the calls' timeout
            for call in (lambda: admin.list_offsets({missing: -1}, timeout_ms=600_000),
                         lambda: admin.log_end_offsets([missing], timeout_ms=600_000),
                         lambda: admin.delete_records({missing: 0}, timeout_ms=600_000)):
                with pytest.raises(TidelogError, match="t-7.*topic 't' has no partition 7 [(]it has 3: 0-2[)]") as info:
                    await call()
                assert info.value.error is UNKNOWN_TOPIC_OR_PARTITION
            assert await admin.list_offsets({TopicPartition("t", 2): -1}) == {TopicPartition("t", 2): (0, -1)}


async def test_topic_configs_are_described_by_any_broker_without_a_controller(fake):
    """DescribeConfigs of a topic is read-only: as Kafka's admin client, any broker answers it."""
    fake.create_topic("a", 1)
    fake.topics["a"].configs["cleanup.policy"] = "compact"
    fake.controller = 7  # no such broker: the controller is unknown (a failover)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        configs = await admin.describe_configs("a", timeout_ms=5000)
        assert configs["cleanup.policy"].value == "compact"
        with pytest.raises(TidelogError, match="cannot describe the configuration of topic 'ghost'") as info:
            await admin.describe_configs("ghost", timeout_ms=5000)
        assert info.value.error is UNKNOWN_TOPIC_OR_PARTITION


async def test_a_find_coordinator_refusal_is_raised_not_sent_to_an_unknown_node(fake):
    fake.group_offsets["g"] = {("t", 0): 1}
    fake.inject(ApiKey.FIND_COORDINATOR, error_code=GROUP_AUTHORIZATION_FAILED.code)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        with pytest.raises(TidelogError, match="group 'g'.*GROUP_AUTHORIZATION_FAILED") as info:
            await admin.list_group_offsets("g")
        assert info.value.error is GROUP_AUTHORIZATION_FAILED
        assert [o.committed for o in await admin.list_group_offsets("g")] == [1]  # not remembered
    assert len(fake.sent(ApiKey.OFFSET_FETCH)) == 1


async def test_a_refused_election_or_reassignment_names_no_topic(fake):
    """These requests fail as a whole (no topic to name): the error says what was refused."""
    for key in (ApiKey.ELECT_LEADERS, ApiKey.ALTER_PARTITION_REASSIGNMENTS, ApiKey.LIST_PARTITION_REASSIGNMENTS):
        fake.inject(key, error_code=CLUSTER_AUTHORIZATION_FAILED.code)
    tp = TopicPartition("t", 0)
    async with AsyncAdmin(fake.bootstrap, **FAST) as admin:
        for call, what in ((lambda: admin.elect_leaders([tp]), "cannot elect leaders"),
                           (lambda: admin.alter_partition_reassignments({tp: [1]}), "cannot reassign partitions"),
                           (lambda: admin.list_partition_reassignments(), "cannot list the partition reassignments")):
            with pytest.raises(TidelogError, match=f"^{what}: CLUSTER_AUTHORIZATION_FAILED") as info:
                await call()
            assert "topic" not in str(info.value) and info.value.error is CLUSTER_AUTHORIZATION_FAILED
        assert await admin.elect_leaders([tp]) == {tp: (ELECTION_NOT_NEEDED.code, None)}
