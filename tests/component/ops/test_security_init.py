"""deploy/init_security.py, run as docker-compose.yml's security-init service runs it (its
command line from the compose file, the volumes replaced by temporary directories, no
ZooKeeper: the user step is the integration test's, tests/integration/test_ops.py): the
broker configs of the compose file load with the files it makes, each broker's certificate
is signed by the CA and names every host the broker is reached at (checked by TLS
handshakes in memory, as a client and as another broker), the CA's key stays out of the
brokers' volume, and a second run changes nothing that is still right."""

from __future__ import annotations

import importlib.util
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from tests.component.ops.topology import (
    PKI_IN_CONTAINER,
    ROOT,
    broker_services,
    load_compose,
    one_shot_services,
    volumes_of,
)
from tidelog.broker.config import BrokerConfig
from tidelog.broker.security import tls
from tidelog.broker.security.inter_broker import inter_broker_security
from tidelog.security import SecurityConfig, read_properties

SCRIPT = ROOT / "deploy" / "init_security.py"
PASSWORD = "compose-test-password"


def _module():
    spec = importlib.util.spec_from_file_location("init_security", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


init_security = _module()


class Volumes:
    """The compose volumes of security-init and the brokers as temporary directories."""

    def __init__(self, base: Path, compose: dict):
        self.compose = compose
        self.init = one_shot_services(compose)[0]
        self.dirs = {v.target: base / v.source for v in volumes_of(self.init.service) if v.named}

    def path(self, value: str) -> str:
        for target, local in self.dirs.items():
            if value == target or value.startswith(target + "/"):
                return str(local) + value[len(target):]
        return value

    def argv(self, *, without: tuple[str, ...] = ("--zookeeper",)) -> list[str]:
        """security-init's command, paths localized, options in ``without`` left out."""
        command, out, skip = self.init.command, [], False
        for arg in command:
            if skip:
                skip = False
            elif arg in without:
                skip = True
            else:
                out.append(self.path(arg))
        return out

    @property
    def pki(self) -> Path:
        return self.dirs[PKI_IN_CONTAINER]

    def broker_env(self, broker) -> dict[str, str]:
        return {k: self.path(v) for k, v in broker.environment.items()}


@pytest.fixture
def volumes(tmp_path, monkeypatch) -> Volumes:
    monkeypatch.setenv("TIDELOG_ADMIN_PASSWORD", PASSWORD)
    return Volumes(tmp_path, load_compose())


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str) -> None:
    """A whole TLS handshake between two contexts through memory buffers."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    ends = [client.wrap_bio(c_in, c_out, server_hostname=server_hostname), server.wrap_bio(s_in, s_out,
                                                                                             server_side=True)]
    done = set()
    for _ in range(20):
        for end in ends:
            if id(end) not in done:
                try:
                    end.do_handshake()
                    done.add(id(end))
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if len(done) == 2:
            return
    raise AssertionError("the handshake did not finish")


def _client(cafile: Path) -> ssl.SSLContext:
    return SecurityConfig(security_protocol="SSL", ssl_cafile=str(cafile)).ssl_context()


def test_the_compose_brokers_load_and_serve_tls_with_what_security_init_makes(volumes):
    assert init_security.main(volumes.argv()) == 0
    ca_file = volumes.pki / "ca.pem"
    ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
    for broker in broker_services(volumes.compose):
        env = volumes.broker_env(broker)
        config = BrokerConfig.load(broker.config_file, env=env)
        assert Path(config.ssl_keystore_location) == volumes.pki / f"broker-{config.broker_id}.pem"
        assert Path(config.ssl_truststore_location) == ca_file
        cert = x509.load_pem_x509_certificate(Path(config.ssl_keystore_location).read_bytes())
        cert.verify_directly_issued_by(ca)
        names = init_security.certificate_names(cert)
        assert {broker.hostname, "localhost", "127.0.0.1"} <= names
        assert {listener.advertised.host for listener in config.listener_list} <= names
        server = tls.server_context(config.ssl_keystore_location, config.ssl_key_password,
                                    config.ssl_truststore_location, "requested")
        for name in (broker.hostname, "localhost", "127.0.0.1"):
            _handshake(server, _client(ca_file), name)  # a client on the network, on the host
        with pytest.raises(ssl.SSLCertVerificationError):
            _handshake(server, _client(ca_file), "broker-9")
        # another broker connecting, with its own certificate as the client certificate
        peer = next(b for b in broker_services(volumes.compose) if b.name != broker.name)
        peer_config = BrokerConfig.load(peer.config_file, env=volumes.broker_env(peer))
        client = inter_broker_security(peer_config).ssl_context()  # as the peer broker makes it
        assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
        _handshake(server, client, config.inter_broker_listener.advertised.host)


def test_the_ca_key_is_not_in_the_brokers_volume_and_keys_are_private(volumes):
    argv = volumes.argv()
    assert init_security.main(argv) == 0
    assert sorted(p.name for p in volumes.pki.iterdir()) == ["broker-1.pem", "broker-2.pem", "broker-3.pem",
                                                             "ca.pem", "client.properties"]
    ca_dir = Path(argv[argv.index("--ca-dir") + 1])
    assert (ca_dir / "ca-key.pem").exists() and ca_dir.parent != volumes.pki and ca_dir != volumes.pki
    for name in ("broker-1.pem", "client.properties"):
        assert stat.S_IMODE((volumes.pki / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((ca_dir / "ca-key.pem").stat().st_mode) == 0o600


def test_the_client_properties_connect_as_admin_over_sasl_ssl(volumes):
    assert init_security.main(volumes.argv()) == 0
    broker = broker_services(volumes.compose)[0]
    path = volumes.broker_env(broker)["TIDELOG_COMMAND_CONFIG"]
    security = SecurityConfig.from_properties(read_properties(path))
    config = BrokerConfig.load(broker.config_file, env=volumes.broker_env(broker))
    assert security.security_protocol == "SASL_SSL"
    assert security.sasl_mechanism in config.sasl_enabled_mechanisms.split(",")
    assert (security.sasl_plain_username, security.sasl_plain_password) == ("admin", PASSWORD)
    assert Path(security.ssl_cafile) == volumes.pki / "ca.pem"


def test_a_second_run_keeps_what_is_still_right(volumes, capsys):
    assert init_security.main(volumes.argv()) == 0
    before = {p.name: p.read_bytes() for p in volumes.pki.iterdir()}
    assert init_security.main(volumes.argv()) == 0
    assert {p.name: p.read_bytes() for p in volumes.pki.iterdir()} == before
    assert "made for brokers none" in capsys.readouterr().out


def test_a_new_name_remakes_only_the_certificates_that_lack_it(volumes):
    argv = volumes.argv()
    assert init_security.main(argv) == 0
    before = {p.name: p.read_bytes() for p in volumes.pki.iterdir()}
    i = argv.index("--broker") + 1
    argv[i] += ",tidelog.example.com"  # broker 1, e.g. with TIDELOG_ADVERTISED_HOST
    assert init_security.main(argv) == 0
    after = {p.name: p.read_bytes() for p in volumes.pki.iterdir()}
    assert after["broker-1.pem"] != before["broker-1.pem"]
    assert {k: v for k, v in after.items() if k != "broker-1.pem"} == \
           {k: v for k, v in before.items() if k != "broker-1.pem"}, "same CA, other brokers untouched"
    cert = x509.load_pem_x509_certificate(after["broker-1.pem"])
    assert "tidelog.example.com" in init_security.certificate_names(cert)


def test_a_certificate_of_another_ca_is_made_again(volumes, tmp_path):
    argv = volumes.argv()
    assert init_security.main(argv) == 0
    other = tmp_path / "other"
    init_security.make_certificates(other, {1: ["broker-1"]})
    ca_dir = Path(argv[argv.index("--ca-dir") + 1])
    (ca_dir / "broker-1.pem").write_bytes((other / "broker-1.pem").read_bytes())
    assert init_security.stale_brokers(ca_dir, {1: ["broker-1"], 2: ["broker-2"]}) == {1: ["broker-1"]}


@pytest.mark.parametrize("password", ["", "short", "has,comma-in-it", 'has"quote-in-it', "has space in it"])
def test_a_password_the_brokers_could_not_use_is_refused(volumes, monkeypatch, password):
    monkeypatch.setenv("TIDELOG_ADMIN_PASSWORD", password)
    with pytest.raises(SystemExit) as e:
        init_security.main(volumes.argv())
    assert e.value.code == 2
    assert not volumes.pki.exists(), "nothing made"


def test_the_script_runs_as_the_compose_entrypoint_runs_it(volumes):
    env = {**os.environ, "TIDELOG_ADMIN_PASSWORD": PASSWORD}
    r = subprocess.run([sys.executable, str(SCRIPT), *volumes.argv()], capture_output=True, text=True,
                       env=env, timeout=60, cwd=volumes.pki.parent)
    assert r.returncode == 0, r.stderr
    assert (volumes.pki / "broker-3.pem").exists()
