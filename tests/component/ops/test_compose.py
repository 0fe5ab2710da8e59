"""docker-compose.yml checked offline: Debian's docker-compose 1.29 validates it (no Docker
engine needed), and its topology is what the operations docs promise: a 3-node ZooKeeper
ensemble, 3 brokers whose config files and environment load into a cluster with RF 3 and
min.insync.replicas 2, one listener per broker advertised on the same port inside and
outside the network, healthchecks and depends_on conditions, and a `spark` profile.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from tests.component.ops.topology import (
    COMPOSE_FILE,
    CONFIG_IN_CONTAINER,
    ROOT,
    TOOL_VARIABLES,
    broker_services,
    environment_of,
    load_compose,
    ports_of,
    volumes_of,
    zookeeper_services,
)
from tidelog.broker.config import SETTINGS, BrokerConfig

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
    broken.write_text(COMPOSE_FILE.read_text().replace('ports: ["9092:9092", "9401:9404"]', 'ports: "9092:9092"'))
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


def test_each_broker_advertises_its_service_name_on_a_port_published_unchanged(compose):
    """One listener per broker: the advertised address must work inside the network (the
    service name) and from the host (the same port published 1:1, the name in /etc/hosts or
    TIDELOG_ADVERTISED_HOST)."""
    seen_ports = set()
    for b in broker_services(compose):
        config = BrokerConfig.load(b.config_file, env=b.environment)
        host, port = config.listener
        adv_host, adv_port = config.advertised
        assert host == "0.0.0.0", "listen on every interface of the container"
        assert (adv_host, adv_port) == (b.hostname, port)
        assert (port, port) in b.ports, f"{b.name}: listener port {port} must be published as {port}"
        assert port not in seen_ports
        seen_ports.add(port)
        metrics = [published for published, target in b.ports if target == config.metrics_port]
        assert len(metrics) == 1, f"{b.name}: metrics port published once"
        assert "${TIDELOG_ADVERTISED_HOST:-" + b.hostname + "}" in COMPOSE_FILE.read_text()


def test_advertised_host_can_be_overridden_for_host_clients():
    compose = load_compose(env={"TIDELOG_ADVERTISED_HOST": "192.0.2.10"})
    for b in broker_services(compose):
        config = BrokerConfig.load(b.config_file, env=b.environment)
        assert config.advertised == ("192.0.2.10", config.listener[1])


def test_brokers_wait_for_a_healthy_ensemble_and_check_their_own_readiness(compose):
    zk_names = {z.name for z in zookeeper_services(compose)}
    for b in broker_services(compose):
        depends = b.service["depends_on"]
        assert set(depends) == zk_names
        assert all(d["condition"] == "service_healthy" for d in depends.values())
        assert b.healthcheck[:3] == ["CMD", "tidelog", "health"]
        assert b.healthcheck[b.healthcheck.index("--config") + 1] == CONFIG_IN_CONTAINER
        assert b.command == ["--config", CONFIG_IN_CONTAINER]
        assert b.service["stop_signal"] == "SIGTERM"
        assert b.service["build"]["target"] == "broker"


def test_spark_profile_runs_the_deploy_spark_example_after_the_brokers(compose):
    spark = {n: s for n, s in compose["services"].items() if "spark" in (s.get("profiles") or [])}
    assert set(spark) == {"spark-events", "spark-example"}
    brokers = {b.name for b in broker_services(compose)}
    for name, service in spark.items():
        assert any(v.source == "./deploy/spark" and v.read_only for v in volumes_of(service)), name
        assert {n for n, d in service["depends_on"].items() if d["condition"] == "service_healthy"} == brokers
        assert service["environment"]["TIDELOG_BOOTSTRAP"] == "broker-1:9092,broker-2:9093,broker-3:9094"
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
