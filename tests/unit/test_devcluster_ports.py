"""A dev cluster never hands the same port to two of its listeners, even when the kernel
offers a just-released port again before the brokers bind them."""
from itertools import chain, cycle

import pytest

from tidelog.broker import devcluster
from tidelog.broker.devcluster import DevCluster


def test_every_listener_of_a_cluster_gets_its_own_port(tmp_path, monkeypatch):
    offered = cycle([41000, 41000, 41001, 41000, 41002, 41001, 41003, 41004, 41005, 41006, 41007])
    monkeypatch.setattr(devcluster, "find_free_port", lambda host="127.0.0.1": next(offered))
    cluster = DevCluster(tmp_path, brokers=3, zk_port=0, base_port=0, inter_broker_security="SASL_SSL")
    listeners = [(tmp_path / f"broker-{i}.toml").read_text().split("listeners = ")[1].split("\n")[0]
                 for i in cluster.brokers]
    ports = [int(endpoint.rsplit(":", 1)[1]) for endpoint in
             chain.from_iterable(line.strip('"').split(",") for line in listeners)]
    ports.append(cluster.zookeeper.port)
    assert len(ports) == 7 and len(set(ports)) == 7


def test_a_port_picker_that_keeps_offering_taken_ports_gives_up_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr(devcluster, "find_free_port", lambda host="127.0.0.1": 41000)
    with pytest.raises(RuntimeError, match="no free port"):
        DevCluster(tmp_path, brokers=1, zk_port=0, base_port=0)
