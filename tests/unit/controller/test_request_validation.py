"""The controller's checks of CreateTopics, CreatePartitions and AlterConfigs (issue 14,
point 1): every refusal comes before anything is planned or written, with Kafka's error code
and a message naming the field and the limit. ``FakeZk`` (tests/support/controller_zk.py)
holds topics, assignments, configs and partition states in dicts and counts its writes."""

from __future__ import annotations

import pytest

from tests.support.controller_zk import FakeZk
from tidelog.broker.config import BrokerConfig
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerContext
from tidelog.broker.controller.validation import (
    JUTE_MAXBUFFER,
    ZNODE_DATA_LIMIT,
    PartitionLimits,
    max_partitions_in_znode,
    min_assignment_bytes,
)
from tidelog.broker.zookeeper.layout import BrokerInfo, encode_topic_assignment, encode_topic_config
from tidelog.protocol.errors import (
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
)
from tidelog.protocol.messages import CreatableTopic, CreatePartitionsTopic
from tidelog.protocol.topics import OFFSETS_TOPIC, TopicPartition

PLANNED_AT_MOST = 100_000  # partitions these tests' requests may legitimately plan


@pytest.fixture
def no_huge_plans(monkeypatch):
    """Refusing "at once" means refusing before planning: the replica placement of millions
    of partitions is what used to stall the controller, so planning more is a failure here."""
    from tidelog.protocol import placement

    plan = placement.assign_replicas

    def bounded(brokers, n, *args, **kwargs):
        assert n <= PLANNED_AT_MOST, f"planned {n} partitions before refusing"
        return plan(brokers, n, *args, **kwargs)

    monkeypatch.setattr(placement, "assign_replicas", bounded)


def controller(brokers=(1, 2, 3), limits: PartitionLimits | None = None, racks: dict[int, str] | None = None,
               **config) -> tuple[Controller, FakeZk]:
    zk = FakeZk()
    c = Controller(ControllerConfig(broker_id=brokers[0], partition_limits=limits or PartitionLimits(), **config), zk)
    c.ctx = ControllerContext(epoch=1, epoch_zk_version=0,
                              brokers={b: BrokerInfo(b, "127.0.0.1", 9000 + b, (racks or {}).get(b)) for b in brokers})
    return c, zk


async def create(c: Controller, *topics: CreatableTopic, validate_only: bool = False):
    results, _ = await c.create_topics(list(topics), validate_only)
    return results


def only(results):
    (r,) = results
    return r


# -- partition counts ------------------------------------------------------------------------------


@pytest.mark.parametrize("validate_only", [True, False])
@pytest.mark.parametrize("n", [2**31 - 1, 10**7, 10_001])
async def test_a_huge_partition_count_is_refused_at_once(n, validate_only, no_huge_plans):
    """2^31-1 partitions with validate_only used to plan (and allocate) until the controller
    died; 10^7 stalled it for seconds."""
    c, zk = controller()
    r = only(await create(c, CreatableTopic("big", n, 1), validate_only=validate_only))
    assert r.error_code == INVALID_PARTITIONS.code
    assert f"{n} partitions, more than max.partitions.per.topic=10000" in r.error_message
    assert zk.writes == 0 and not zk.assignments


async def test_the_per_topic_limit_is_inclusive():
    c, zk = controller(limits=PartitionLimits(per_topic=50, per_request=100))
    assert only(await create(c, CreatableTopic("fifty", 50, 3))).error_code == NONE.code
    assert len(zk.assignments["fifty"]) == 50
    assert only(await create(c, CreatableTopic("more", 51, 3))).error_code == INVALID_PARTITIONS.code


async def test_partitions_are_bounded_by_what_zookeeper_can_store(no_huge_plans):
    """10^6 partitions: the assignment znode would pass jute.maxbuffer (1 MiB), which fails in
    ZooKeeper itself; the controller computes the bound and says how many would fit."""
    c, zk = controller(limits=PartitionLimits(per_topic=10**7, per_request=10**7))
    r = only(await create(c, CreatableTopic("huge", 10**6, 3), validate_only=True))
    assert r.error_code == INVALID_PARTITIONS.code
    fit = max_partitions_in_znode(3, 1, ZNODE_DATA_LIMIT - len(encode_topic_config({})))
    assert f"at most {fit} such partitions fit" in r.error_message
    assert f"jute.maxbuffer, {JUTE_MAXBUFFER} bytes" in r.error_message
    # exactly the bound fits (and is written), one more does not
    assert only(await create(c, CreatableTopic("edge", fit, 3), validate_only=True)).error_code == NONE.code
    assert only(await create(c, CreatableTopic("over", fit + 1, 3), validate_only=True)).error_code == \
        INVALID_PARTITIONS.code
    assert zk.writes == 0


async def test_the_zookeeper_bound_counts_the_broker_ids_width():
    c, _ = controller(brokers=(1000, 1001, 1002), limits=PartitionLimits(per_topic=10**7, per_request=10**7))
    fit = max_partitions_in_znode(3, 4, ZNODE_DATA_LIMIT - len(encode_topic_config({})))
    assert fit < max_partitions_in_znode(3, 1)
    r = only(await create(c, CreatableTopic("wide", fit + 1, 3), validate_only=True))
    assert r.error_code == INVALID_PARTITIONS.code and f"at most {fit} " in r.error_message


async def test_an_explicit_assignment_is_bounded_too():
    c, zk = controller(limits=PartitionLimits(per_topic=4, per_request=100))
    r = only(await create(c, CreatableTopic("t", assignments={str(p): [1] for p in range(5)})))
    assert r.error_code == INVALID_PARTITIONS.code and "max.partitions.per.topic=4" in r.error_message


async def test_the_per_request_limit_refuses_every_topic_of_the_request():
    c, zk = controller(limits=PartitionLimits(per_topic=100, per_request=150))
    results = await create(c, CreatableTopic("a", 100, 1), CreatableTopic("b", 60, 1))
    assert [r.error_code for r in results] == [INVALID_PARTITIONS.code] * 2
    assert "160 partitions in all, more than max.partitions.per.request=150" in results[0].error_message
    assert zk.writes == 0
    # the defaults (-1) count as num.partitions
    c, zk = controller(limits=PartitionLimits(per_topic=100, per_request=2), default_partitions=1)
    results = await create(c, *(CreatableTopic(f"t{i}") for i in range(3)))
    assert {r.error_code for r in results} == {INVALID_PARTITIONS.code}


@pytest.mark.parametrize("n", [0, -2, -(2**31)])
async def test_a_partition_count_must_be_positive_or_minus_one(n):
    c, _ = controller()
    r = only(await create(c, CreatableTopic("t", n, 1)))
    assert r.error_code == INVALID_PARTITIONS.code and f"got {n}" in r.error_message


@pytest.mark.parametrize("rf, words", [(0, "must be positive"), (-2, "must be positive"), (4, "larger than the 3 live"),
                                       (2**15 - 1, "larger than the 3 live")])
async def test_replication_factors(rf, words):
    c, _ = controller()
    r = only(await create(c, CreatableTopic("t", 1, rf), validate_only=True))
    assert r.error_code == INVALID_REPLICATION_FACTOR.code and words in r.error_message


async def test_defaults_apply_to_minus_one():
    c, zk = controller(default_partitions=3, default_replication_factor=2)
    r = only(await create(c, CreatableTopic("t")))
    assert (r.error_code, r.num_partitions, r.replication_factor) == (NONE.code, 3, 2)


# -- names -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["../victim", "a b", "", "x" * 250, "..", "a\x00b"])
async def test_invalid_names_are_refused(name):
    c, zk = controller()
    r = only(await create(c, CreatableTopic(name, 1, 1)))
    assert r.error_code == INVALID_TOPIC_EXCEPTION.code and "topic name" in r.error_message
    assert zk.writes == 0


async def test_names_that_collide_in_metric_names_are_refused():
    c, zk = controller()
    assert only(await create(c, CreatableTopic("coll.x", 1, 1))).error_code == NONE.code
    r = only(await create(c, CreatableTopic("coll_x", 1, 1)))
    assert r.error_code == INVALID_TOPIC_EXCEPTION.code
    assert "'coll_x' collides with existing topic 'coll.x'" in r.error_message
    # within one request too, validate_only or not
    for validate_only in (True, False):
        results = await create(c, CreatableTopic("a.b", 1, 1), CreatableTopic("a_b", 1, 1), validate_only=validate_only)
        assert [r.error_code for r in results][1] == INVALID_TOPIC_EXCEPTION.code
    assert set(zk.assignments) == {"coll.x", "a.b"}


async def test_the_same_name_twice_in_one_request_is_invalid():
    c, zk = controller()
    results = await create(c, CreatableTopic("t", 1, 1), CreatableTopic("u", 1, 1), CreatableTopic("t", 2, 1))
    assert [r.error_code for r in results] == [INVALID_REQUEST.code, NONE.code, INVALID_REQUEST.code]
    assert set(zk.assignments) == {"u"}


async def test_an_existing_topic_is_refused_before_its_other_problems():
    c, _ = controller()
    await create(c, CreatableTopic("t", 1, 1))
    assert only(await create(c, CreatableTopic("t", 10**9, 1))).error_code == TOPIC_ALREADY_EXISTS.code


async def test_internal_topics_are_the_brokers_to_create():
    c, zk = controller()
    r = only(await create(c, CreatableTopic(OFFSETS_TOPIC, 1, 1)))
    assert r.error_code == INVALID_TOPIC_EXCEPTION.code and "internal topic" in r.error_message
    assert zk.writes == 0


async def test_a_topic_with_an_invalid_name_in_zookeeper_is_ignored():
    c, zk = controller()
    zk.assignments["../victim"] = {0: [1]}
    await c._load_topic("../victim")
    assert "../victim" not in c.ctx.assignments


# -- assignments ------------------------------------------------------------------------------------


@pytest.mark.parametrize("assignments, words", [
    ({"0": [1], "2": [1]}, "numbered 0..1"),
    ({"0": [1, 1]}, "lists broker [1] more than once"),
    ({"0": [9]}, "unknown brokers [9]"),
    ({"0": [1], "1": [1, 2]}, "same, non-zero number"),
    ({"0": []}, "same, non-zero number"),
])
async def test_invalid_assignments(assignments, words):
    c, zk = controller()
    r = only(await create(c, CreatableTopic("t", assignments=assignments), validate_only=True))
    assert r.error_code == INVALID_REPLICA_ASSIGNMENT.code and words in r.error_message



@pytest.mark.parametrize("counts", [{"num_partitions": 2}, {"replication_factor": 1},
                                    {"num_partitions": 1, "replication_factor": 1}])
async def test_an_assignment_with_counts_beside_it_is_refused(counts):
    """Kafka refuses both at once (INVALID_REQUEST) rather than silently ignoring the counts."""
    c, zk = controller()
    r = only(await create(c, CreatableTopic("t", assignments={"0": [1]}, **counts), validate_only=True))
    assert r.error_code == INVALID_REQUEST.code
    assert "assignments" in r.error_message and "cannot be used at the same time" in r.error_message

# -- topic configs ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key, value, words", [
    ("segment.bytes", "100", "invalid value '100' for segment.bytes: must be at least 1048576 (log.segment.min.bytes)"),
    ("segment.bytes", "4096", "must be at least 1048576"),
    ("segment.bytes", str(2**31), "must be at most 2147483647 (Kafka's int)"),
    ("segment.ms", "1", "invalid value '1' for segment.ms: must be at least 60000 (log.roll.min.ms)"),
    ("segment.index.bytes", "8", "must be at least 1024"),
    ("retention.ms", str(2**63), "must be at most 9223372036854775807"),
    ("min.cleanable.dirty.ratio", "nan", "expected a finite number"),
    ("retention.ms", "1_000", "expected int"),
    ("no.such.config", "1", "unknown topic config 'no.such.config'"),
])
async def test_topic_configs_below_their_minimums_are_refused(key, value, words):
    c, zk = controller()
    r = only(await create(c, CreatableTopic("t", 1, 1, configs={key: value}), validate_only=True))
    assert r.error_code == INVALID_CONFIG.code and words in r.error_message
    await create(c, CreatableTopic("t", 1, 1))
    with pytest.raises(TidelogError) as refused:
        await c.alter_topic_config("t", {key: value}, validate_only=False)
    assert refused.value.error is INVALID_CONFIG and words in str(refused.value)
    assert zk.configs["t"] == {}


async def test_the_minimums_come_from_the_broker_settings():
    config = BrokerConfig.from_props({"broker.id": 1, "zookeeper.connect": "zk:2181", "log.segment.min.bytes": 4096,
                                      "log.roll.min.ms": 1000, "max.partitions.per.topic": 7,
                                      "max.partitions.per.request": 9})
    cc = ControllerConfig.from_broker_config(config)
    assert cc.partition_limits == PartitionLimits(7, 9)
    assert (cc.config_minimums["segment.bytes"], cc.config_minimums["segment.ms"]) == (4096, 1000)
    c, zk = controller(config_minimums=cc.config_minimums)
    r = only(await create(c, CreatableTopic("t", 1, 1, configs={"segment.bytes": "4096", "segment.ms": "1500"})))
    assert r.error_code == NONE.code and zk.configs["t"] == {"segment.bytes": "4096", "segment.ms": "1500"}


async def test_an_old_small_value_does_not_block_other_changes():
    """A config below today's minimum that ZooKeeper already holds (written before an upgrade)
    stays; only the values a request sets must meet the minimums."""
    c, zk = controller()
    await create(c, CreatableTopic("t", 1, 1))
    zk.configs["t"] = c.ctx.topic_configs["t"] = {"segment.bytes": "4096"}
    await c.alter_topic_config("t", {"retention.ms": "1000"}, validate_only=False)
    assert zk.configs["t"] == {"segment.bytes": "4096", "retention.ms": "1000"}


async def test_a_replacing_alter_leaves_exactly_the_configs_given():
    # Kafka's legacy AlterConfigs: the overrides become exactly the request's; an incremental
    # alter (the native default) keeps the others
    c, zk = controller()
    await create(c, CreatableTopic("t", 1, 1, configs={"retention.ms": "1000", "cleanup.policy": "compact"}))
    await c.alter_topic_config("t", {"segment.ms": "90000"}, validate_only=False)
    assert zk.configs["t"] == {"retention.ms": "1000", "cleanup.policy": "compact", "segment.ms": "90000"}
    await c.alter_topic_config("t", {"retention.ms": "2000"}, validate_only=True, replace=True)
    assert zk.configs["t"]["cleanup.policy"] == "compact"  # validate only: nothing written
    await c.alter_topic_config("t", {"retention.ms": "2000"}, validate_only=False, replace=True)
    assert zk.configs["t"] == c.ctx.topic_configs["t"] == {"retention.ms": "2000"}


async def test_altering_a_topic_that_does_not_exist_or_has_an_invalid_name():
    c, _ = controller()
    with pytest.raises(TidelogError) as refused:
        await c.alter_topic_config("../x", {"retention.ms": "1"}, validate_only=True)
    assert refused.value.error is INVALID_TOPIC_EXCEPTION
    with pytest.raises(TidelogError) as refused:
        await c.alter_topic_config("nope", {"retention.ms": "1"}, validate_only=True)
    assert refused.value.error is UNKNOWN_TOPIC_OR_PARTITION


# -- CreatePartitions ---------------------------------------------------------------------------------


async def add(c: Controller, *topics: CreatePartitionsTopic, validate_only: bool = False):
    results, _ = await c.create_partitions_all(list(topics), validate_only)
    return results


async def test_create_partitions_limits(no_huge_plans):
    c, zk = controller(limits=PartitionLimits(per_topic=100, per_request=30))
    await create(c, CreatableTopic("t", 10, 3), CreatableTopic("u", 10, 3))
    r = only(await add(c, CreatePartitionsTopic("t", 2**31 - 1), validate_only=True))
    assert r.error_code == INVALID_PARTITIONS.code and "more than max.partitions.per.topic=100" in r.error_message
    # 20 + 20 new partitions in one request: over 30
    results = await add(c, CreatePartitionsTopic("t", 30), CreatePartitionsTopic("u", 30))
    assert [r.error_code for r in results] == [INVALID_PARTITIONS.code] * 2
    assert "40 partitions in all" in results[0].error_message
    assert [r.error_code for r in await add(c, CreatePartitionsTopic("t", 30))] == [NONE.code]
    assert len(zk.assignments["t"]) == 30


async def test_create_partitions_is_bounded_by_zookeeper():
    c, zk = controller(limits=PartitionLimits(per_topic=10**7, per_request=10**7))
    await create(c, CreatableTopic("t", 10, 3))
    r = only(await add(c, CreatePartitionsTopic("t", 10**6), validate_only=True))
    assert r.error_code == INVALID_PARTITIONS.code and "jute.maxbuffer" in r.error_message


async def test_create_partitions_checks():
    c, zk = controller()
    await create(c, CreatableTopic("t", 2, 3))
    cases = [
        (CreatePartitionsTopic("t", 2), INVALID_PARTITIONS, "must be larger"),
        (CreatePartitionsTopic("nope", 5), UNKNOWN_TOPIC_OR_PARTITION, "does not exist"),
        (CreatePartitionsTopic("../x", 5), INVALID_TOPIC_EXCEPTION, "topic name"),
        (CreatePartitionsTopic("t", 4, [[1, 2, 3]]), INVALID_REPLICA_ASSIGNMENT, "1 assignments given for 2"),
        (CreatePartitionsTopic("t", 3, [[1, 2]]), INVALID_REPLICA_ASSIGNMENT, "the topic's have 3"),
        (CreatePartitionsTopic("t", 3, [[1, 2, 9]]), INVALID_REPLICA_ASSIGNMENT, "unknown brokers [9]"),
        (CreatePartitionsTopic(OFFSETS_TOPIC, 60), INVALID_TOPIC_EXCEPTION, "internal topic"),
    ]
    for topic, error, words in cases:
        r = only(await add(c, topic))
        assert (r.error_code, words in r.error_message) == (error.code, True), (topic, r)
    assert len(zk.assignments["t"]) == 2
    results = await add(c, CreatePartitionsTopic("t", 3), CreatePartitionsTopic("t", 4))
    assert {r.error_code for r in results} == {INVALID_REQUEST.code}
    assert only(await add(c, CreatePartitionsTopic("t", 3, [[3, 1, 2]]))).error_code == NONE.code
    assert zk.assignments["t"][2] == [3, 1, 2]
    assert c.ctx.states[TopicPartition("t", 2)][0].leader == 3


async def test_added_partitions_spread_over_racks_like_the_first_ones():
    """Kafka's createNewPartitionsAssignment: rack-aware, continuing from partition 0's leader."""
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    c, zk = controller((1, 2, 3, 4), racks=racks)
    await create(c, CreatableTopic("t", assignments={"0": [1, 3]}))
    assert only(await add(c, CreatePartitionsTopic("t", 40))).error_code == NONE.code
    one_rack = {p: r for p, r in zk.assignments["t"].items() if len({racks[b] for b in r}) < 2}
    assert one_rack == {}
    # the rack-alternated list is [1, 3, 2, 4]; partition 0's first replica (1) is its index 0
    assert [zk.assignments["t"][p][0] for p in range(1, 5)] == [3, 2, 4, 1]


# -- the ZooKeeper size arithmetic ----------------------------------------------------------------------


@pytest.mark.parametrize("n, rf, ids", [(0, 1, [1]), (1, 1, [1]), (9, 2, [1, 2]), (10, 3, [7, 8, 9]), (101, 3, [1, 2, 3]),
                                        (1000, 2, [10, 11]), (12_345, 1, [123])])
def test_the_size_bound_is_exact_for_ids_of_one_width(n, rf, ids):
    assignment = {p: ids[:rf] for p in range(n)}
    assert min_assignment_bytes(n, rf, len(str(ids[0]))) == len(encode_topic_assignment(assignment))


def test_how_many_partitions_fit():
    for rf in (1, 3, 5):
        fit = max_partitions_in_znode(rf)
        assert min_assignment_bytes(fit, rf) <= ZNODE_DATA_LIMIT < min_assignment_bytes(fit + 1, rf)
    assert 65_000 < max_partitions_in_znode(3) < 66_000  # what docs/operations.md says


async def test_a_long_name_leaves_room_for_the_partition_numbers_in_directory_names():
    # (with ZooKeeper's default jute.maxbuffer the znode bound comes first: ~87,000 partitions)
    c, _ = controller(limits=PartitionLimits(per_topic=10**6, per_request=10**6, znode_bytes=10**8))
    assert only(await create(c, CreatableTopic("x" * 249, 100_000, 1), validate_only=True)).error_code == NONE.code
    r = only(await create(c, CreatableTopic("x" * 249, 100_001, 1), validate_only=True))
    assert r.error_code == INVALID_PARTITIONS.code and "longer than 255 characters" in r.error_message


async def test_a_config_value_is_bounded_in_length():
    """A value is stored in ZooKeeper as given: "compact" repeated, or an int padded with
    spaces, could fill the znode; 1,024 characters is far above any real value."""
    c, zk = controller()
    for value in ("compact," * 200, " " * 2000 + "1000"):
        key = "cleanup.policy" if value.startswith("compact") else "retention.ms"
        r = only(await create(c, CreatableTopic("t", 1, 1, configs={key: value}), validate_only=True))
        assert r.error_code == INVALID_CONFIG.code and "more than 1024" in r.error_message
    assert zk.writes == 0


async def test_a_topic_named_twice_in_delete_topics_is_refused_before_anything_is_written():
    """Found by the fuzzer: DeleteTopics naming one topic 400,000 times had the controller
    delete it 400,000 times (a ZooKeeper write and an UpdateMetadata each), stalling every
    other controller event for half an hour."""
    c, zk = controller()
    assert only(await create(c, CreatableTopic("gone", 1, 1))).error_code == NONE.code
    writes = zk.writes
    results, _ = await c.delete_topics(["gone"] * 100_000 + ["ghost"])
    assert [r.error_code for r in results] == [INVALID_REQUEST.code] * 100_000 + [UNKNOWN_TOPIC_OR_PARTITION.code]
    assert "appears more than once" in results[0].error_message
    assert zk.writes == writes and "gone" in c.ctx.assignments


def test_a_huge_assignment_gets_a_short_message():
    """Found by the Kafka listener's fuzzer: 20,000 copies of one broker made a 60 KB message."""
    from tidelog.broker.controller.validation import check_assignment

    with pytest.raises(TidelogError) as info:
        check_assignment({0: [1] * 20_000}, {1})
    assert str(info.value) == "partition 0 lists broker [1] more than once"
    with pytest.raises(TidelogError) as info:
        check_assignment({0: list(range(100, 20_100))}, {1})
    assert len(str(info.value)) < 200 and "and 19990 more" in str(info.value)


# -- configs -----------------------------------------------------------------------------------------


async def test_a_null_config_value_refuses_its_topic_only():
    # as Kafka: INVALID_CONFIG naming the keys, the request's other topics created
    c, zk = controller()
    results = await create(c, CreatableTopic("t", 1, 1, configs={"retention.ms": None, "cleanup.policy": "delete",
                                                                 "segment.ms": None}),
                           CreatableTopic("u", 1, 1, configs={"retention.ms": "1000"}))
    assert [r.error_code for r in results] == [INVALID_CONFIG.code, NONE.code]
    assert results[0].error_message == "Null value not supported for topic configs: retention.ms,segment.ms"
    assert set(zk.assignments) == {"u"}
