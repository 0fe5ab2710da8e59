"""Readiness (broker/health.py): the in-process checks, and `tidelog health` against a
scripted broker (the real socket server answering Metadata as a broker would before and
after it knows the cluster)."""

from __future__ import annotations

import io

import pytest
import trio

from tidelog.broker.cli import main
from tidelog.broker.config import BrokerConfig
from tidelog.broker.health import Readiness, address_from_config, broker_readiness, parse_address, probe, run
from tidelog.broker.network import SocketServer
from tidelog.broker.zookeeper.zkserver import find_free_port
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.messages import BrokerMetadata, MetadataResponse


def test_ready_only_when_every_check_passes():
    assert Readiness(True, True, True, True).ready
    r = Readiness(True, False, False, False)
    assert not r.ready
    assert r.problems() == ["not connected to ZooKeeper", "not registered in ZooKeeper",
                            "no cluster metadata from the controller yet"]


def test_broker_readiness_from_what_the_broker_knows():
    state = dict(logs_loaded=True, zookeeper_connected=True, broker_epoch=-1, has_metadata=False)
    assert broker_readiness(**state) == Readiness(True, True, False, False)
    state.update(broker_epoch=7, has_metadata=True)
    assert broker_readiness(**state).ready
    state.update(zookeeper_connected=False)  # a lost session: the registration is gone with it
    assert broker_readiness(**state) == Readiness(True, False, False, True)


@pytest.mark.parametrize("text,expected", [("h:1", ("h", 1)), ("h", ("h", 9092)), (":5", ("127.0.0.1", 5)),
                                           ("[::1]:7", ("::1", 7)), ("[::1]", ("::1", 9092))])
def test_parse_address(text, expected):
    assert parse_address(text) == expected


def test_address_from_config_probes_the_loopback_for_a_wildcard_listener():
    config = BrokerConfig.from_props({"broker.id": 1, "zookeeper.connect": "zk:2181",
                                      "listeners": "PLAINTEXT://0.0.0.0:9093",
                                      "advertised.listeners": "PLAINTEXT://broker-1:9093"})
    assert address_from_config(config) == ("127.0.0.1", 9093)


class FakeBroker:
    """A socket server answering Metadata with the brokers and controller it is told."""

    def __init__(self):
        self.brokers: list[int] = []
        self.controller_id = -1
        self.requests = 0

    def handle(self, context, body):
        assert context.header.api_key == ApiKey.METADATA and body["topics"] == []
        self.requests += 1
        return MetadataResponse([BrokerMetadata(i, "h", 1) for i in self.brokers], "c", self.controller_id, [])


@pytest.fixture
async def fake(nursery):
    broker = FakeBroker()
    server = SocketServer(broker.handle)
    broker.port = await nursery.start(server.run)
    broker.address = f"127.0.0.1:{broker.port}"
    return broker


async def _probe(*args, **kwargs):
    return await trio.to_thread.run_sync(lambda: probe(*args, **kwargs))


async def test_probe_follows_the_broker_through_start_up(fake):
    r = await _probe(fake.address)
    assert not r.ready and "no cluster metadata" in r.detail
    fake.brokers = [1, 2]
    r = await _probe(fake.address)
    assert not r.ready and "no controller" in r.detail
    fake.controller_id = 2
    assert (await _probe(fake.address)).ready
    r = await _probe(fake.address, broker_id=3)
    assert not r.ready and "broker 3 is not in its metadata" in r.detail
    fake.brokers = [1, 2, 3]
    r = await _probe(fake.address, broker_id=3)
    assert r.ready and r.controller_id == 2 and r.brokers == (1, 2, 3)


async def test_probe_of_nothing_listening_is_not_ready():
    r = await _probe(f"127.0.0.1:{find_free_port()}", 1.0)
    assert not r.ready and "cannot ask" in r.detail
    assert not (await _probe("not a port:x")).ready


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


async def test_cli_exit_status_is_the_readiness(fake):
    code, _, err = await trio.to_thread.run_sync(_cli, ["health", "--bootstrap", fake.address])
    assert code == 1 and "not ready" in err
    fake.brokers, fake.controller_id = [1], 1
    code, out, _ = await trio.to_thread.run_sync(_cli, ["health", "--bootstrap", fake.address])
    assert code == 0 and "ready" in out
    code, out, _ = await trio.to_thread.run_sync(_cli, ["health", "--bootstrap", fake.address, "--quiet"])
    assert code == 0 and out == ""
    dead = f"127.0.0.1:{find_free_port()}"
    code, _, err = await trio.to_thread.run_sync(_cli, ["health", "--bootstrap", f"{fake.address},{dead}",
                                                        "--timeout-ms", "500"])
    assert code == 1 and dead in err, "every listed broker must be ready"


async def test_cli_with_a_broker_config_checks_that_broker(fake, tmp_path, monkeypatch):
    config = tmp_path / "broker.toml"
    config.write_text(f'"broker.id" = 2\nlisteners = "PLAINTEXT://0.0.0.0:{fake.port}"\n'
                      f'"advertised.listeners" = "PLAINTEXT://broker-2:{fake.port}"\n'
                      f'"zookeeper.connect" = "zk:2181"\n')
    fake.brokers, fake.controller_id = [1, 3], 1
    code, _, err = await trio.to_thread.run_sync(_cli, ["health", "--config", str(config)])
    assert code == 1 and "broker 2 is not in its metadata" in err
    fake.brokers = [1, 2, 3]
    code, out, _ = await trio.to_thread.run_sync(_cli, ["health", "--config", str(config)])
    assert code == 0 and "broker 2 ready" in out
    # like the broker, the check takes TIDELOG_* overrides: here the listener moves away
    monkeypatch.setenv("TIDELOG_LISTENERS", f"PLAINTEXT://0.0.0.0:{find_free_port()}")
    code, _, _ = await trio.to_thread.run_sync(_cli, ["health", "--config", str(config), "--timeout-ms", "500"])
    assert code == 1


async def test_cli_reports_a_bad_config_as_a_usage_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('"broker.idd" = 1\n')
    code, _, err = await trio.to_thread.run_sync(_cli, ["health", "--config", str(bad)])
    assert code == 2 and "broker.id" in err


async def test_wait_retries_until_ready(fake):
    async def become_ready():
        await trio.sleep(0.6)
        fake.brokers, fake.controller_id = [1], 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(become_ready)
        out, err = io.StringIO(), io.StringIO()
        code = await trio.to_thread.run_sync(lambda: run(fake.address, None, None, 1000, 10.0, False, out, err))
    assert code == 0 and fake.requests >= 2


def test_a_secured_config_is_checked_the_way_its_broker_connects_to_its_peers(tmp_path):
    from tidelog.broker.health import security_from_config
    from tidelog.broker.security.certificates import make_cluster_pki

    ca = make_cluster_pki(tmp_path, {2: ["broker-2"]})
    plain = BrokerConfig.from_props({"broker.id": 2, "zookeeper.connect": "zk:2181"})
    assert security_from_config(plain) is None
    secured = BrokerConfig.from_props({
        "broker.id": 2, "zookeeper.connect": "zk:2181",
        "listeners": "INTERNAL://0.0.0.0:19092,EXTERNAL://0.0.0.0:9093",
        "advertised.listeners": "INTERNAL://broker-2:19092,EXTERNAL://localhost:9093",
        "listener.security.protocol.map": "INTERNAL:SASL_SSL,EXTERNAL:SASL_SSL",
        "inter.broker.listener.name": "INTERNAL", "ssl.keystore.location": str(tmp_path / "broker-2.pem"),
        "ssl.truststore.location": str(ca), "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="admin" password="admin-secret";'})
    security = security_from_config(secured)
    assert security.security_protocol == "SASL_SSL" and security.sasl_mechanism == "SCRAM-SHA-512"
    assert (security.sasl_plain_username, security.sasl_plain_password) == ("admin", "admin-secret")
    assert security.ssl_cafile == str(ca) and security.ssl_check_hostname
    assert secured.advertised == ("broker-2", 19092), "the name the certificate carries, not the loopback"


async def test_a_secured_probe_of_a_plain_listener_is_not_ready(fake, tmp_path):
    from tidelog.broker.security.certificates import make_cluster_pki
    from tidelog.security import SecurityConfig

    fake.brokers, fake.controller_id = [1], 1
    ca = make_cluster_pki(tmp_path, {})
    security = SecurityConfig(security_protocol="SSL", ssl_cafile=str(ca))
    r = await _probe(fake.address, 2.0, security=security)
    assert not r.ready and "cannot ask" in r.detail
