"""ZooKeeper layout: paths, codecs and Kafka's replica placement (pure)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from tidelog.broker.zookeeper.layout import (
    BrokerInfo,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    LeaderAndIsr,
    ProducerIdBlock,
    ZkPaths,
    assign_replicas,
    decode_broker_info,
    decode_cluster_id,
    decode_controller,
    decode_controller_epoch,
    decode_isr_change,
    decode_partition_state,
    decode_producer_id_block,
    decode_reassignment,
    decode_topic_assignment,
    decode_topic_config,
    encode_broker_info,
    encode_cluster_id,
    encode_controller,
    encode_controller_epoch,
    encode_isr_change,
    encode_partition_state,
    encode_producer_id_block,
    encode_reassignment,
    encode_topic_assignment,
    encode_topic_config,
    next_producer_id_block,
    rack_alternated_broker_list,
    split_connect,
)
from tidelog.protocol.errors import INVALID_REPLICATION_FACTOR

# ----------------------------------------------------------------------------- paths

def test_paths_under_the_default_chroot():
    p = ZkPaths()
    assert p.cluster_id == "/tidelog/cluster/id"
    assert p.broker(3) == "/tidelog/brokers/ids/3"
    assert p.topic("orders") == "/tidelog/brokers/topics/orders"
    assert p.partition_state("orders", 2) == "/tidelog/brokers/topics/orders/partitions/2/state"
    assert p.controller == "/tidelog/controller"
    assert p.controller_epoch == "/tidelog/controller_epoch"
    assert p.topic_config("orders") == "/tidelog/config/topics/orders"
    assert p.delete_topic_marker("orders") == "/tidelog/admin/delete_topics/orders"
    assert p.reassign_partitions == "/tidelog/admin/reassign_partitions"
    assert p.isr_change_prefix == "/tidelog/isr_change_notification/isr_change_"
    assert p.latest_producer_id_block == "/tidelog/latest_producer_id_block"
    assert p.broker_ids in p.persistent_paths()


@pytest.mark.parametrize("chroot,expected", [("/", "/brokers/ids"), ("", "/brokers/ids"),
                                             ("/a/b/", "/a/b/brokers/ids")])
def test_chroot_normalisation(chroot, expected):
    assert ZkPaths(chroot).broker_ids == expected


@pytest.mark.parametrize("chroot", ["tidelog", "/a//b"])
def test_bad_chroot(chroot):
    with pytest.raises(ValueError, match="chroot"):
        ZkPaths(chroot)


@pytest.mark.parametrize("name", ["a/b", "", "..", "."])
def test_topic_names_cannot_escape_their_znode(name):
    with pytest.raises(ValueError):
        ZkPaths().topic(name)


def test_split_connect():
    assert split_connect("h1:2181,h2:2181") == ("h1:2181,h2:2181", None)
    assert split_connect("h1:2181,h2:2181/kafka/") == ("h1:2181,h2:2181", "/kafka")
    with pytest.raises(ValueError):
        split_connect("/kafka")


# ----------------------------------------------------------------------------- codecs

def test_broker_info_round_trip_and_kafka_shape():
    info = BrokerInfo(1, "127.0.0.1", 9092, rack="r1")
    data = encode_broker_info(info)
    assert json.loads(data) == {"version": 1, "host": "127.0.0.1", "port": 9092, "rack": "r1",
                                "endpoints": ["PLAINTEXT://127.0.0.1:9092"]}
    assert decode_broker_info(1, data) == info


def test_decoders_ignore_unknown_keys():
    data = b'{"version":4,"host":"h","port":1,"jmx_port":-1,"timestamp":"1","endpoints":["PLAINTEXT://h:1"]}'
    assert decode_broker_info(7, data) == BrokerInfo(7, "h", 1, None, ("PLAINTEXT://h:1",))


def test_topic_assignment_round_trip():
    assignment = {1: [2, 3, 1], 0: [1, 2, 3]}
    data = encode_topic_assignment(assignment)
    assert json.loads(data) == {"version": 1, "partitions": {"0": [1, 2, 3], "1": [2, 3, 1]}}
    assert decode_topic_assignment(data) == {0: [1, 2, 3], 1: [2, 3, 1]}
    assert list(decode_topic_assignment(data)) == [0, 1]


def test_partition_state_round_trip_and_helpers():
    state = LeaderAndIsr.initial(1, [1, 2, 3], controller_epoch=4)
    assert decode_partition_state(encode_partition_state(state)) == state
    assert json.loads(encode_partition_state(state)) == {
        "version": 1, "leader": 1, "leader_epoch": 0, "isr": [1, 2, 3], "controller_epoch": 4}
    moved = state.new_leader_and_isr(2, [2, 3], controller_epoch=5)
    assert (moved.leader, moved.leader_epoch, moved.isr, moved.controller_epoch) == (2, 1, (2, 3), 5)
    shrunk = moved.with_isr([2])
    assert (shrunk.leader_epoch, shrunk.isr) == (1, (2,))
    assert not LeaderAndIsr(-1, 3, [], 1).has_leader


def test_small_codecs_round_trip():
    assert decode_cluster_id(encode_cluster_id("abc")) == "abc"
    assert decode_controller(encode_controller(3)) == 3
    assert decode_controller_epoch(encode_controller_epoch(12)) == 12
    assert decode_topic_config(encode_topic_config({"retention.ms": 10})) == {"retention.ms": "10"}
    assert decode_isr_change(encode_isr_change([("a", 0), ("b", 2)])) == [("a", 0), ("b", 2)]
    assert decode_reassignment(encode_reassignment({("a", 1): [3, 2]})) == {("a", 1): [3, 2]}
    block = ProducerIdBlock(2, 1000, 1999)
    assert json.loads(encode_producer_id_block(block))["block_start"] == "1000"   # Kafka's strings
    assert decode_producer_id_block(encode_producer_id_block(block)) == block


def test_producer_id_blocks_follow_each_other():
    first = next_producer_id_block(None, 1, 1000)
    assert (first.first, first.last) == (0, 999)
    second = next_producer_id_block(first, 2, 10)
    assert (second.broker_id, second.first, second.last) == (2, 1000, 1009)
    with pytest.raises(ValueError, match="exhausted"):
        next_producer_id_block(ProducerIdBlock(1, 0, 2**63 - 5), 1, 10)


@pytest.mark.parametrize("decode,data,what", [
    (lambda d: decode_broker_info(1, d), b"not json", "broker 1"),
    (lambda d: decode_broker_info(1, d), b'{"host":"h"}', "broker 1"),
    (lambda d: decode_broker_info(1, d), b'{"host":"h","port":true}', "broker 1"),
    (decode_topic_assignment, b'{"partitions":{"x":[1]}}', "topic"),
    (decode_topic_assignment, b'{"partitions":{"0":[1,"2"]}}', "topic"),
    (decode_topic_assignment, b"[1,2]", "topic"),
    (decode_partition_state, b'{"leader":1,"leader_epoch":0,"controller_epoch":1}', "partition state"),
    (decode_partition_state, b"", "partition state"),
    (decode_partition_state, b"\xff\xfe", "partition state"),
    (decode_controller, b'{"brokerid":"1"}', "controller"),
    (decode_controller_epoch, b"one", "controller epoch"),
    (decode_topic_config, b'{"config":{"a":1}}', "topic config"),
])
def test_malformed_data_raises_a_clear_value_error(decode, data, what):
    with pytest.raises(ValueError, match=f"malformed {what} znode data"):
        decode(data)


# ----------------------------------------------------------------------------- replica placement

def test_kafka_scaladoc_example_5_brokers_10_partitions_rf3():
    """AdminUtils.assignReplicasToBrokers' scaladoc table (and AdminTest.testReplicaAssignment)."""
    got = assign_replicas([0, 1, 2, 3, 4], 10, 3, start_index=0)
    assert got == {0: [0, 1, 2], 1: [1, 2, 3], 2: [2, 3, 4], 3: [3, 4, 0], 4: [4, 0, 1],
                   5: [0, 2, 3], 6: [1, 3, 4], 7: [2, 4, 0], 8: [3, 0, 1], 9: [4, 1, 2]}
    # The table read per broker: broker-0 leads p0 and p5, is 2nd replica of p4, p8 and 3rd of p3, p7.
    leads = {b: [p for p, r in got.items() if r[0] == b] for b in range(5)}
    second = {b: [p for p, r in got.items() if r[1] == b] for b in range(5)}
    third = {b: [p for p, r in got.items() if r[2] == b] for b in range(5)}
    assert leads[0] == [0, 5] and second[0] == [4, 8] and third[0] == [3, 7]
    assert leads[4] == [4, 9] and second[4] == [3, 7] and third[4] == [2, 6]


def test_start_partition_id_continues_an_existing_topic():
    whole = assign_replicas([0, 1, 2, 3, 4], 10, 3, start_index=0)
    tail = assign_replicas([0, 1, 2, 3, 4], 4, 3, start_index=0, start_partition_id=6)
    # As in Kafka, the leaders continue the round-robin; the follower shift restarts at the
    # fixed start index (it only grows when the partition id wraps inside one call).
    assert {p: r[0] for p, r in tail.items()} == {p: whole[p][0] for p in range(6, 10)}
    assert tail == {6: [1, 2, 3], 7: [2, 3, 4], 8: [3, 4, 0], 9: [4, 0, 1]}


def test_broker_ids_need_not_be_contiguous_or_sorted():
    got = assign_replicas([30, 10, 20], 3, 2, start_index=0)
    assert got == {0: [10, 20], 1: [20, 30], 2: [30, 10]}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("brokers,partitions,rf", [(5, 10, 3), (3, 7, 3), (6, 30, 2), (4, 4, 1), (7, 50, 4)])
def test_replicas_distinct_and_leaders_balanced(seed, brokers, partitions, rf):
    got = assign_replicas(list(range(brokers)), partitions, rf, rng=random.Random(seed))
    assert sorted(got) == list(range(partitions))
    assert all(len(r) == rf == len(set(r)) for r in got.values())
    leaders = Counter(r[0] for r in got.values())
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in range(brokers)) <= 1
    replicas = Counter(b for r in got.values() for b in r)
    assert max(replicas.values()) - min(replicas.get(b, 0) for b in range(brokers)) <= rf


def test_random_start_uses_the_rng():
    starts = {assign_replicas([0, 1, 2, 3], 1, 1, rng=random.Random(s))[0][0] for s in range(40)}
    assert starts == {0, 1, 2, 3}


@pytest.mark.parametrize("brokers,partitions,rf,error,match", [
    ([0, 1], 3, 3, InvalidReplicationFactorError, "Replication factor: 3 larger than available brokers: 2"),
    ([0, 1], 3, 0, InvalidReplicationFactorError, "must be larger than 0"),
    ([0, 1], 0, 1, InvalidPartitionsError, "partitions must be larger than 0"),
    ([], 1, 1, InvalidReplicationFactorError, "available brokers: 0"),
    ([1, 1], 1, 1, ValueError, "duplicate"),
])
def test_invalid_arguments(brokers, partitions, rf, error, match):
    with pytest.raises(error, match=match):
        assign_replicas(brokers, partitions, rf)


def test_errors_are_value_errors_that_carry_kafka_codes():
    with pytest.raises(ValueError) as info:
        assign_replicas([0], 1, 2)
    assert info.value.error is INVALID_REPLICATION_FACTOR


RACKS = {0: "rack1", 1: "rack3", 2: "rack3", 3: "rack2", 4: "rack2", 5: "rack1"}


def test_rack_alternated_broker_list_kafka_example():
    assert rack_alternated_broker_list(RACKS) == [0, 3, 1, 5, 4, 2]


def test_rack_aware_kafka_scaladoc_example():
    got = assign_replicas(list(RACKS), 6, 3, start_index=0, racks=RACKS)
    assert got == {0: [0, 3, 1], 1: [3, 1, 5], 2: [1, 5, 4], 3: [5, 4, 2], 4: [4, 2, 0], 5: [2, 0, 3]}


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("racks", [
    RACKS,
    {0: "a", 1: "a", 2: "a", 3: "b"},                        # uneven racks
    {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c", 6: "a", 7: "b", 8: "c"},
])
def test_rack_aware_spreads_replicas_over_racks(seed, racks):
    num_racks = len(set(racks.values()))
    for rf in range(1, len(racks) + 1):
        got = assign_replicas(list(racks), 12, rf, racks=racks, rng=random.Random(seed))
        for replicas in got.values():
            assert len(replicas) == len(set(replicas)) == rf
            assert len({racks[b] for b in replicas}) == min(rf, num_racks)
        leaders = Counter(r[0] for r in got.values())
        assert max(leaders.values()) - min(leaders.get(b, 0) for b in racks) <= 1 + (12 % len(racks) > 0)


def test_racks_all_or_nothing():
    assert assign_replicas([0, 1], 2, 2, start_index=0, racks={0: None, 1: None}) == \
        assign_replicas([0, 1], 2, 2, start_index=0)
    with pytest.raises(ValueError, match="Not all brokers have rack information"):
        assign_replicas([0, 1, 2], 2, 2, racks={0: "a", 1: "b"})


def test_a_topic_under_reassignment_keeps_its_moves_as_kafka_does():
    from tidelog.broker.zookeeper.layout import decode_topic_moves

    data = encode_topic_assignment({0: [4, 2, 1], 1: [1, 2]}, moving={0: ((4,), (1,))})
    assert json.loads(data) == {"version": 2, "partitions": {"0": [4, 2, 1], "1": [1, 2]},
                                "adding_replicas": {"0": [4]}, "removing_replicas": {"0": [1]}}
    assert decode_topic_assignment(data) == {0: [4, 2, 1], 1: [1, 2]}
    assert decode_topic_moves(data) == {0: ((4,), (1,))}
    assert decode_topic_moves(encode_topic_assignment({0: [1]})) == {}
    # Kafka's own version 2 znode, with an empty move list for a partition not moving
    kafka = b'{"version":2,"partitions":{"0":[3,1]},"adding_replicas":{"0":[3]},"removing_replicas":{}}'
    assert decode_topic_moves(kafka) == {0: ((3,), ())}
    with pytest.raises(ValueError, match="adding_replicas"):
        decode_topic_moves(b'{"version":2,"partitions":{},"adding_replicas":{"x":[1]}}')
