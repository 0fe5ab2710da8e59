"""ZooKeeper layout: paths, codecs and Kafka's replica placement (pure)."""

from __future__ import annotations

import json

import pytest

from tidelog.broker.zookeeper.layout import (
    BrokerInfo,
    LeaderAndIsr,
    ProducerIdBlock,
    ZkPaths,
    decode_broker_info,
    decode_cluster_id,
    decode_controller,
    decode_controller_epoch,
    decode_isr_change,
    decode_partition_state,
    decode_producer_id_block,
    decode_reassignment,
    decode_replica_damage,
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
    encode_replica_damage,
    encode_topic_assignment,
    encode_topic_config,
    next_producer_id_block,
    split_connect,
)

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
    assert decode_replica_damage(encode_replica_damage(2, 77, [("a", 1)])) == (2, 77, [("a", 1)], False)
    assert "offline" not in json.loads(encode_replica_damage(2, 77, [("a", 1)]))  # a damage report as before
    assert decode_replica_damage(encode_replica_damage(2, 77, [("a", 1)], offline=True)).offline
    with pytest.raises(ValueError, match="replica damage notification"):
        decode_replica_damage(b'{"version":1,"broker":"2","broker_epoch":1,"partitions":[]}')
    with pytest.raises(ValueError, match="'offline' is 1"):
        decode_replica_damage(b'{"version":1,"broker":2,"broker_epoch":1,"partitions":[],"offline":1}')
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
    (lambda d: decode_broker_info(1, d), b'{"host":"","port":1}', "broker 1"),
    (lambda d: decode_broker_info(1, d), b'{"host":"h","port":65536}', "broker 1"),
    (lambda d: decode_broker_info(1, d), b'{"host":"h","port":1,"endpoints":"PLAINTEXT://h:1"}', "broker 1"),
    (lambda d: decode_broker_info(1, d), b'{"host":"h","port":1,"endpoints":["h:1"]}', "broker 1"),
    (lambda d: decode_broker_info(1, d), b'{"host":"h","port":1,"endpoints":["PLAINTEXT://h:x"]}', "broker 1"),
    (lambda d: decode_broker_info(1, d), b'{"host":"h","port":1,"rack":7}', "broker 1"),
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
