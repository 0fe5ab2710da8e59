"""docker-compose.yml checked offline: Debian's docker-compose 1.29 validates it (no Docker
engine needed), and its topology is what the operations docs promise: a 3-node ZooKeeper
ensemble, 3 brokers whose config files and environment load into a cluster with RF 3 and
min.insync.replicas 2, secured (SASL_SSL listeners only: INTERNAL between brokers and on the
compose network, EXTERNAL published for the host; ACLs with admin the super user), a
one-shot security-init service that makes the certificates and the admin user before any
broker starts, healthchecks and depends_on conditions, and a `spark` profile. Nothing secret
is in the repository. (tests/component/ops/test_security_init.py runs security-init's script.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.component.ops.topology import (
    COMPOSE_FILE,
    CONFIG_IN_CONTAINER,
    PKI_IN_CONTAINER,
    ROOT,
    TOOL_VARIABLES,
    broker_services,
    environment_of,
    listener_addresses,
    load_compose,
    one_shot_services,
    ports_of,
    volumes_of,
    zookeeper_services,
)
from tidelog.broker.config import SETTINGS, BrokerConfig, parse_super_users
from tidelog.security import SecurityConfig, parse_jaas_config, read_properties

DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="docker-compose is not installed (`./dev setup` installs Debian's docker-compose 1.29 "
           "to validate docker-compose.yml offline)")
SETTING_VARIABLES = {"TIDELOG_" + s.name.upper().replace(".", "_") for s in SETTINGS}


def _compose(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIDELOG_", "COMPOSE_", "DOCKER_"))}
    return subprocess.run([DOCKER_COMPOSE, "-f", str(COMPOSE_FILE), *args], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose()


# -- offline validation --------------------------------------------------------------------------


@needs_compose
def test_docker_compose_validates_the_file_offline():
    r = _compose("config", "-q")
    assert r.returncode == 0, r.stderr
    r = _compose("--profile", "spark", "config", "-q")
    assert r.returncode == 0, r.stderr


@needs_compose
def test_docker_compose_rejects_a_broken_copy(tmp_path):
    """The validator really validates: the same file with a wrongly typed key fails."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace('ports: ["9092:9092", "9192:9192", "9401:9404"]',
                                                       'ports: "9092:9092"'))
    r = subprocess.run([DOCKER_COMPOSE, "-f", str(broken), "config", "-q"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0
    assert "ports" in r.stderr


@needs_compose
def test_our_reading_of_the_file_matches_docker_compose(compose):
    """Anchors, merge keys and ${VAR:-default} as docker-compose resolves them: the local run of
    the topology (tests/integration/test_ops.py) uses exactly what the containers would get."""
    r = _compose("config")
    assert r.returncode == 0, r.stderr
    resolved = yaml.safe_load(r.stdout)
    assert set(resolved["services"]) == set(compose["services"])
    for name, service in compose["services"].items():
        theirs = resolved["services"][name]
        assert environment_of(theirs) == environment_of(service), name
        assert ports_of(theirs) == ports_of(service), name
        assert [(v.target, v.read_only) for v in volumes_of(theirs)] == \
               [(v.target, v.read_only) for v in volumes_of(service)], name
        assert theirs.get("command") == service.get("command"), name
        assert _healthcheck(theirs) == _healthcheck(service), name


def _healthcheck(service: dict) -> list | None:
    hc = service.get("healthcheck") or {}
    return ["NONE"] if hc.get("disable") else hc.get("test")


def test_no_top_level_keys_that_docker_compose_1_rejects(compose):
    assert set(compose) <= {"version", "services", "networks", "volumes", "configs", "secrets"} | \
        {k for k in compose if k.startswith("x-")}


# -- the ZooKeeper ensemble ------------------------------------------------------------------------


def test_three_zookeeper_nodes_from_the_official_image_form_one_ensemble(compose):
    zks = zookeeper_services(compose)
    assert [z.myid for z in zks] == [1, 2, 3]
    for z in zks:
        service = compose["services"][z.name]
        assert service["image"].startswith("zookeeper:3.")
        servers = z.servers.split()
        assert servers == [f"server.{o.myid}={o.hostname}:2888:3888;{o.client_port}" for o in zks]
        assert service["healthcheck"]["test"]
        named = [v for v in volumes_of(service) if v.named]
        assert {v.target for v in named} == {"/data", "/datalog"}, "ZooKeeper data on named volumes"


# -- the brokers -----------------------------------------------------------------------------------


def test_three_brokers_with_their_own_config_file_and_named_volume(compose):
    brokers = broker_services(compose)
    assert [b.name for b in brokers] == ["broker-1", "broker-2", "broker-3"]
    data_volumes = set()
    for b in brokers:
        assert b.config_file.exists(), b.config_file
        assert b.config_file.parent == ROOT / "deploy" / "config"
        mount = next(v for v in b.volumes if v.target == CONFIG_IN_CONTAINER)
        assert mount.read_only
        data = [v for v in b.volumes if v.target == "/var/lib/tidelog"]
        assert len(data) == 1 and data[0].named and data[0].source in compose["volumes"]
        data_volumes.add(data[0].source)
    assert len(data_volumes) == 3, "each broker has its own data volume"


def test_every_broker_variable_is_a_real_setting(compose):
    """A misspelt TIDELOG_* variable would be ignored silently by the broker: catch it here."""
    for b in broker_services(compose):
        unknown = set(b.environment) - SETTING_VARIABLES - TOOL_VARIABLES
        assert not unknown, f"{b.name}: {sorted(unknown)} name no broker setting"


def test_config_files_and_environment_make_a_durable_cluster(compose):
    zks = zookeeper_services(compose)
    ensemble = {f"{z.hostname}:{z.client_port}" for z in zks}
    ids = set()
    for b in broker_services(compose):
        config = BrokerConfig.load(b.config_file, env=b.environment)
        ids.add(config.broker_id)
        assert b.name == f"broker-{config.broker_id}" and b.config_file.name == f"cluster-node-{config.broker_id}.toml"
        assert config.default_replication_factor == 3
        assert config.min_insync_replicas == 2
        assert config.unclean_leader_election_enable is False
        assert config.offsets_topic_replication_factor == 3
        assert config.controlled_shutdown_enable
        assert set(config.zookeeper_connect.split(",")) == ensemble
        assert config.log_dirs == ("/var/lib/tidelog/logs",)
        assert config.metrics_port >= 0
    assert ids == {1, 2, 3}


def test_every_listener_is_sasl_ssl_internal_between_brokers_external_for_the_host(compose):
    """INTERNAL (inter-broker; clients on the compose network) is advertised under the
    service name and not published; EXTERNAL is published on the host on the same port and
    advertised as localhost, so a client on the host reaches every broker through it; so is
    the Kafka listener, for Kafka clients."""
    published = set()
    for b in broker_services(compose):
        config = BrokerConfig.load(b.config_file, env=b.environment)
        assert {str(listener.protocol) for listener in config.listener_list} == {"SASL_SSL"}
        listeners = {name: (bind, adv) for name, bind, adv in listener_addresses(b)}
        assert set(listeners) == {"INTERNAL", "EXTERNAL", "KAFKA_EXTERNAL"}
        (_, kafka_port), kafka_adv = listeners["KAFKA_EXTERNAL"]  # Kafka clients: published likewise
        assert kafka_adv == ("localhost", kafka_port) and (kafka_port, kafka_port) in b.ports
        assert config.inter_broker_listener.name == "INTERNAL"
        assert config.listener[0] == "0.0.0.0", "listen on every interface of the container"
        (_, internal_port), internal_adv = listeners["INTERNAL"]
        assert internal_adv == (b.hostname, internal_port)
        assert all(target != internal_port for _, target in b.ports), "INTERNAL is not published"
        (_, external_port), external_adv = listeners["EXTERNAL"]
        assert external_adv == ("localhost", external_port)
        assert (external_port, external_port) in b.ports, f"{b.name}: EXTERNAL {external_port} published unchanged"
        assert external_port not in published
        published.add(external_port)
        metrics = [p for p, target in b.ports if target == config.metrics_port]
        assert len(metrics) == 1, f"{b.name}: metrics port published once"
        assert "EXTERNAL://${TIDELOG_ADVERTISED_HOST:-localhost}:" + str(external_port) in COMPOSE_FILE.read_text()
    internal = [f"{adv[0]}:{adv[1]}" for b in broker_services(compose)
                for name, _, adv in listener_addresses(b) if name == "INTERNAL"]
    for b in broker_services(compose):
        assert b.environment["TIDELOG_BOOTSTRAP"] == ",".join(internal), "tools in a container use INTERNAL"


def test_the_brokers_authenticate_each_other_as_the_super_user_and_enforce_acls(compose):
    for b in broker_services(compose):
        config = BrokerConfig.load(b.config_file, env=b.environment)
        assert config.authorizer_class_name and config.allow_everyone_if_no_acl_found is False
        assert parse_super_users(config.super_users) == {"User:admin"}
        assert config.inter_broker_principal == "User:admin"
        assert config.sasl_mechanism_inter_broker_protocol in config.sasl_enabled_mechanisms.split(",")
        assert config.ssl_endpoint_identification_algorithm == "https", "brokers check each other's names"
        assert config.ssl_keystore_location == f"{PKI_IN_CONTAINER}/broker-{config.broker_id}.pem"
        assert config.ssl_truststore_location == f"{PKI_IN_CONTAINER}/ca.pem"
        pki = [v for v in b.volumes if v.target == PKI_IN_CONTAINER]
        assert len(pki) == 1 and pki[0].named and pki[0].read_only, "the certificates from the pki volume, read-only"
        # the tools in the container connect as admin, with the file security-init writes
        assert b.environment["TIDELOG_COMMAND_CONFIG"].startswith(PKI_IN_CONTAINER + "/")


@pytest.fixture(scope="module")
def init(compose) -> dict:
    services = one_shot_services(compose)
    assert [s.name for s in services] == ["security-init"]
    return services[0].service


def _option(service: dict, name: str) -> list[str]:
    command = [str(a) for a in service["command"]]
    return [command[i + 1] for i, a in enumerate(command) if a == name]


def test_security_init_runs_the_deploy_script_once_from_the_broker_image(compose, init):
    assert init["build"] == compose["services"]["broker-1"]["build"] and init["image"] == "tidelog:latest"
    assert init["restart"] == "no" and init["healthcheck"] == {"disable": True}
    assert init["entrypoint"] == ["python", "deploy/init_security.py"]
    mounts = {v.target: v for v in volumes_of(init)}
    script = mounts[f"{init['working_dir']}/deploy/init_security.py"]
    assert script.source == "./deploy/init_security.py" and script.read_only
    assert (ROOT / script.source).exists()
    zk_names = {z.name for z in zookeeper_services(compose)}
    assert {n for n, d in init["depends_on"].items() if d["condition"] == "service_healthy"} == zk_names


def test_the_ca_key_stays_with_security_init_and_the_brokers_get_only_their_files(compose, init):
    mounts = {v.target: v for v in volumes_of(init)}
    assert mounts[PKI_IN_CONTAINER].named and not mounts[PKI_IN_CONTAINER].read_only
    assert _option(init, "--pki-dir") == [PKI_IN_CONTAINER]
    ca_dir = _option(init, "--ca-dir")[0]
    ca_volume = next(v for v in volumes_of(init) if ca_dir.startswith(v.target.rstrip("/") + "/"))
    assert ca_volume.named and ca_volume.source in compose["volumes"]
    for name, service in compose["services"].items():
        if name != "security-init":
            assert ca_volume.source not in {v.source for v in volumes_of(service)}, f"{name} mounts the CA's key"


def test_brokers_start_after_security_init_completed(compose):
    for b in broker_services(compose):
        assert b.service["depends_on"]["security-init"] == {"condition": "service_completed_successfully"}


def test_security_init_makes_what_the_brokers_and_their_tools_use(compose, init):
    """Certificates for every broker naming every host it is reached at, the admin user of
    super.users and sasl.jaas.config, in the ZooKeeper the brokers use, and the client
    settings file the containers' tools read."""
    wanted = dict(arg.split("=", 1) for arg in _option(init, "--broker"))
    brokers = broker_services(compose)
    for b in brokers:
        config = BrokerConfig.load(b.config_file, env=b.environment)
        names = set(wanted[str(config.broker_id)].split(","))
        advertised = {adv[0] for _, _, adv in listener_addresses(b)}
        assert advertised | {"localhost", "127.0.0.1"} <= names, f"{b.name}: certificate names {names}"
        assert _option(init, "--user") == [parse_jaas_config(config.sasl_jaas_config).username]
        assert _option(init, "--zookeeper") == [f"{config.zookeeper_connect}{config.zookeeper_chroot}"]
        assert _option(init, "--client-properties") == [b.environment["TIDELOG_COMMAND_CONFIG"]]
    assert set(wanted) == {str(BrokerConfig.load(b.config_file, env=b.environment).broker_id) for b in brokers}


def test_one_admin_password_from_the_environment_for_security_init_and_the_brokers():
    compose = load_compose(env={"TIDELOG_ADMIN_PASSWORD": "chosen-password"})
    assert environment_of(compose["services"]["security-init"])["TIDELOG_ADMIN_PASSWORD"] == "chosen-password"
    for b in broker_services(compose):
        assert parse_jaas_config(b.environment["TIDELOG_SASL_JAAS_CONFIG"]).password == "chosen-password"
    default = load_compose()
    password = environment_of(default["services"]["security-init"])["TIDELOG_ADMIN_PASSWORD"]
    assert password and all(parse_jaas_config(b.environment["TIDELOG_SASL_JAAS_CONFIG"]).password == password
                            for b in broker_services(default))
    assert "TIDELOG_ADMIN_PASSWORD=" in COMPOSE_FILE.read_text(), "the compose file says how to choose it"


def test_advertised_host_can_be_overridden_for_clients_elsewhere():
    compose = load_compose(env={"TIDELOG_ADVERTISED_HOST": "192.0.2.10"})
    for b in broker_services(compose):
        listeners = {name: adv for name, _, adv in listener_addresses(b)}
        assert listeners["EXTERNAL"][0] == "192.0.2.10"
        assert listeners["INTERNAL"][0] == b.hostname, "the brokers keep talking on the compose network"
    init = compose["services"]["security-init"]
    assert all("192.0.2.10" in arg.split("=", 1)[1].split(",") for arg in _option(init, "--broker"))


def test_brokers_wait_for_a_healthy_ensemble_and_check_their_own_readiness(compose):
    zk_names = {z.name for z in zookeeper_services(compose)}
    for b in broker_services(compose):
        depends = b.service["depends_on"]
        assert {n for n, d in depends.items() if d["condition"] == "service_healthy"} == zk_names
        assert set(depends) == zk_names | {s.name for s in one_shot_services(compose)}
        assert b.healthcheck[:3] == ["CMD", "tidelog", "health"]
        assert b.healthcheck[b.healthcheck.index("--config") + 1] == CONFIG_IN_CONTAINER
        assert b.command == ["--config", CONFIG_IN_CONTAINER]
        assert b.service["stop_signal"] == "SIGTERM"
        assert b.service["build"]["target"] == "broker"


def test_the_readme_shows_a_host_client_settings_file_that_works(compose, tmp_path):
    """The README's client settings for the host: SASL_SSL as admin, the CA copied out."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```properties\n(security\.protocol=.*?)```", readme, re.S)
    assert block, "README.md shows a client.properties for the compose cluster"
    path = tmp_path / "client.properties"
    path.write_text(block.group(1))
    security = SecurityConfig.from_properties(read_properties(str(path)))
    assert security.security_protocol == "SASL_SSL" and security.sasl_plain_username == "admin"
    assert security.sasl_mechanism in BrokerConfig.load(broker_services(compose)[0].config_file, env=broker_services(
        compose)[0].environment).sasl_enabled_mechanisms.split(",")
    assert "--command-config" in readme and "localhost:9092" in readme


# -- nothing secret in the repository -----------------------------------------------------------

_PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\s+[A-Za-z0-9+/=\s]{40,}")
_SECRET_SUFFIXES = (".pem", ".key", ".p12", ".pfx", ".jks", ".keystore", ".truststore", ".crt")


def _committed_files() -> list[str]:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60, check=True)
    return [f for f in r.stdout.decode().split("\0") if f]


def test_no_key_or_certificate_is_in_the_repository():
    files = _committed_files()
    assert not [f for f in files if f.lower().endswith(_SECRET_SUFFIXES) or Path(f).name == ".env"]
    holding_keys = []
    for name in files:
        path = ROOT / name
        if path.is_file() and path.stat().st_size < 4 << 20 and _PRIVATE_KEY.search(path.read_bytes()):
            holding_keys.append(name)
    assert not holding_keys, f"private key material committed: {holding_keys}"
    ignored = (ROOT / ".gitignore").read_text().split()
    assert {".env", "*.pem"} <= set(ignored), ".gitignore keeps compose's .env and copied certificates out"


def test_the_key_check_finds_a_key():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    assert _PRIVATE_KEY.search(b'KEY = """\n' + key + b'"""')
    assert not _PRIVATE_KEY.search(b"# a PEM file starts with -----BEGIN PRIVATE KEY----- and ends ...")


def test_spark_profile_runs_the_deploy_spark_example_after_the_brokers(compose):
    spark = {n: s for n, s in compose["services"].items() if "spark" in (s.get("profiles") or [])}
    assert set(spark) == {"spark-events", "spark-example"}
    brokers = {b.name for b in broker_services(compose)}
    for name, service in spark.items():
        assert any(v.source == "./deploy/spark" and v.read_only for v in volumes_of(service)), name
        assert {n for n, d in service["depends_on"].items() if d["condition"] == "service_healthy"} == brokers
        assert service["environment"]["TIDELOG_BOOTSTRAP"] == "broker-1:19092,broker-2:19092,broker-3:19092"
        assert service["environment"]["TIDELOG_COMMAND_CONFIG"].startswith(PKI_IN_CONTAINER + "/"), \
            "the example connects as admin, like the tools in the broker containers"
        assert any(v.target == PKI_IN_CONTAINER and v.read_only for v in volumes_of(service))
        # not brokers: the broker image's healthcheck does not apply (the spark image has none)
        assert service.get("healthcheck") == {"disable": True} or service["build"]["target"] == "spark"
    job = spark["spark-example"]["command"][0]
    assert spark["spark-example"]["build"]["target"] == "spark"
    feeder = spark["spark-events"]["entrypoint"][1]
    for script in (job, feeder):
        assert script.startswith("deploy/spark/")
        if (ROOT / "deploy" / "spark").is_dir():
            assert (ROOT / script).exists(), f"the spark profile runs {script}, which deploy/spark/ does not have"
    checkpoint = spark["spark-example"]["command"][spark["spark-example"]["command"].index("--checkpoint") + 1]
    assert any(checkpoint.startswith(v.target) and v.named for v in volumes_of(spark["spark-example"])), \
        "the job's checkpoint must be on a named volume (the image's work tree is not writable)"


def test_the_console_runs_as_admin_after_the_brokers_on_the_hosts_loopback_only(compose):
    console = compose["services"]["console"]
    assert console["entrypoint"] == ["tidelog", "console"] and console["build"]["target"] == "broker"
    assert console["ports"] == ["127.0.0.1:8080:8080"], "without TLS and a login it must not be reachable from elsewhere"
    assert console["environment"]["TIDELOG_BOOTSTRAP"] == "broker-1:19092,broker-2:19092,broker-3:19092"
    assert console["environment"]["TIDELOG_COMMAND_CONFIG"].startswith(PKI_IN_CONTAINER + "/")
    assert any(v.target == PKI_IN_CONTAINER and v.read_only for v in volumes_of(console))
    assert {n for n, d in console["depends_on"].items() if d["condition"] == "service_healthy"} == \
        {b.name for b in broker_services(compose)}
    assert console.get("healthcheck") == {"disable": True}
