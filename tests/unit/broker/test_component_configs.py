"""Each component's config is built from the broker config one way (``from_broker_config``),
and the settings the reference documents reach the component that uses them."""

from __future__ import annotations

from tidelog.broker.config import BrokerConfig
from tidelog.broker.controller.controller import Controller, ControllerConfig
from tidelog.broker.zookeeper.zk import ZkClient

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
