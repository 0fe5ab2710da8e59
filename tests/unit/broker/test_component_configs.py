"""Each component's config is built from the broker config one way (``from_broker_config``),
and the settings the reference documents reach the component that uses them."""

from __future__ import annotations

from tidelog.broker.config import BrokerConfig
from tidelog.broker.controller.controller import Controller, ControllerConfig
from tidelog.broker.replication.replica_manager import ReplicaConfig, fetcher_id
from tidelog.broker.zookeeper.zk import ZkClient
from tidelog.protocol.topics import TopicPartition

MINIMAL = {"broker.id": 3, "zookeeper.connect": "127.0.0.1:2181"}


def test_the_controller_config_comes_from_the_broker_config():
    config = BrokerConfig.from_props({**MINIMAL, "controller.socket.timeout.ms": 1234, "num.partitions": 4,
                                      "default.replication.factor": 2, "unclean.leader.election.enable": True})
    c = ControllerConfig.from_broker_config(config)
    assert (c.broker_id, c.default_partitions, c.default_replication_factor, c.unclean_leader_election) == \
        (3, 4, 2, True)
    assert c.request_timeout_s == 1.234
    assert Controller(c, zk=None).channels.request_timeout_s == 1.234


def test_zookeeper_connection_timeout_bounds_the_first_connection():
    assert ZkClient("127.0.0.1:1", connection_timeout_ms=2500).connect_timeout_s == 2.5
    assert ZkClient("127.0.0.1:1", op_timeout_s=7.0).connect_timeout_s == 7.0  # unset: the op timeout


def test_the_replica_config_comes_from_the_broker_config():
    config = BrokerConfig.from_props({**MINIMAL, "num.replica.fetchers": 3, "replica.lag.time.max.ms": 5000,
                                      "replica.fetch.max.bytes": 2 << 20})
    c = ReplicaConfig.from_broker_config(config)
    assert (c.broker_id, c.replica_lag_time_max_ms, c.num_replica_fetchers) == (3, 5000, 3)
    assert c.fetcher.partition_max_bytes == 2 << 20
    assert c.fetcher.max_bytes == c.replica_fetch_response_max_bytes == 10 << 20  # Kafka's defaults
    assert c.fetch_max_bytes == 55 << 20


def test_partitions_spread_over_the_fetchers_as_in_kafka():
    # Kafka: abs(31 * "orders".hashCode() + partition) % 3, with "orders".hashCode() == -1008770331
    assert [fetcher_id(TopicPartition("orders", p), 3) for p in range(6)] == \
        [abs(_int32(31 * -1008770331 + p)) % 3 for p in range(6)]
    assert {fetcher_id(TopicPartition("t", p), 1) for p in range(50)} == {0}
    assert {fetcher_id(TopicPartition("events", p), 4) for p in range(50)} == {0, 1, 2, 3}


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x >= 1 << 31 else x
