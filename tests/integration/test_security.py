"""A SASL_SSL cluster of real broker processes: TLS and SCRAM for clients and between brokers.

One cluster for the module, started as ``tidelog dev up --security SASL_SSL`` starts it: a CA
and broker certificates made at start, SCRAM-SHA-512 between brokers as the super user
``admin``, whose settings are in ``client.properties``. What must hold: the super user
produces with acks=all and consumes in a group; a client without credentials, with a wrong
password or with an untrusted certificate fails at once with an error that says which (not
a retry until a timeout); a user made with ``tidelog configs`` can connect; the CLI connects
with ``--command-config``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.cluster import cluster_fixture, wait_topic_ready
from tidelog import Admin, Consumer, NewTopic, Producer
from tidelog.errors import SaslAuthenticationError, SslAuthenticationError
from tidelog.security import SecurityConfig

pytestmark = pytest.mark.integration

TOPIC = "secured"


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("secured"), 3, security="SASL_SSL")


@pytest.fixture(scope="module")
def admin_options(cluster) -> dict:
    return cluster.client_security().options()


def cli(cluster, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tidelog.broker.cli", *args, "--bootstrap", cluster.bootstrap,
                           "--command-config", str(cluster.client_properties)],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_the_super_user_produces_with_acks_all_and_consumes_in_a_group(cluster, admin_options):
    with Admin(cluster.bootstrap, **admin_options) as admin:
        admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=3)])
    wait_topic_ready(cluster, TOPIC, 3, 3)
    with Producer(cluster.bootstrap, acks="all", **admin_options) as producer:
        futures = [producer.send(TOPIC, f"v{i}".encode(), key=f"k{i}".encode()) for i in range(200)]
        producer.flush()
    assert all(f.result(30).offset >= 0 for f in futures)
    with Consumer(cluster.bootstrap, group_id="secured-group", auto_offset_reset="earliest",
                  consumer_timeout_ms=20_000, **admin_options) as consumer:
        consumer.subscribe([TOPIC])
        seen = set()
        for record in consumer:
            seen.add(record.value)
            if len(seen) == 200:
                break
        consumer.commit()
    assert seen == {f"v{i}".encode() for i in range(200)}


def _describe(cluster, **options) -> None:
    with Admin(cluster.bootstrap, request_timeout_ms=20_000, default_api_timeout_ms=20_000, **options) as admin:
        admin.describe_cluster()


def test_a_client_without_tls_is_told_the_listener_speaks_tls(cluster):
    with pytest.raises(SslAuthenticationError, match="speaks TLS"):
        _describe(cluster)


def test_a_client_without_credentials_is_told_the_listener_wants_sasl(cluster, admin_options):
    with pytest.raises(SaslAuthenticationError, match="requires SASL authentication"):
        _describe(cluster, security_protocol="SSL", ssl_cafile=admin_options["ssl_cafile"])


def test_a_wrong_password_is_named_as_such(cluster, admin_options):
    with pytest.raises(SaslAuthenticationError, match="invalid credentials"):
        _describe(cluster, **{**admin_options, "sasl_plain_password": "not-the-password"})


def test_an_untrusted_broker_certificate_is_named_as_such(cluster, admin_options, tmp_path):
    import trustme

    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    with pytest.raises(SslAuthenticationError, match="not trusted"):
        _describe(cluster, **{**admin_options, "ssl_cafile": str(other)})


def test_a_user_made_with_tidelog_configs_connects_with_scram(cluster, admin_options):
    made = cli(cluster, "configs", "--alter", "--entity-type", "users", "--entity-name", "bob",
               "--add-config", "SCRAM-SHA-256=[iterations=8192,password=bob-secret]")
    assert made.returncode == 0, made.stderr
    described = cli(cluster, "configs", "--describe", "--entity-type", "users", "--entity-name", "bob")
    assert described.returncode == 0, described.stderr
    assert "SCRAM-SHA-256" in described.stdout and "bob-secret" not in described.stdout
    bob = SecurityConfig(security_protocol="SASL_SSL", ssl_cafile=admin_options["ssl_cafile"],
                         sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob",
                         sasl_plain_password="bob-secret")
    _describe(cluster, **bob.options())  # every broker learns of the new user from ZooKeeper
    with pytest.raises(SaslAuthenticationError, match="SCRAM-SHA-512"):  # only -256 was made for bob
        _describe(cluster, **{**bob.options(), "sasl_mechanism": "SCRAM-SHA-512"})


def test_the_cli_connects_with_a_command_config_file(cluster):
    created = cli(cluster, "topics", "create", "from-cli", "--partitions", "1", "--replication-factor", "3")
    assert created.returncode == 0, created.stderr
    listed = cli(cluster, "topics", "list")
    assert listed.returncode == 0 and "from-cli" in listed.stdout.split(), listed.stderr


def test_health_checks_a_secured_cluster_with_a_command_config(cluster):
    checked = cli(cluster, "health")
    assert checked.returncode == 0, checked.stderr
    plain = subprocess.run([sys.executable, "-m", "tidelog.broker.cli", "health", "--bootstrap", cluster.bootstrap],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                           env={k: v for k, v in os.environ.items() if k != "TIDELOG_COMMAND_CONFIG"})
    assert plain.returncode == 1 and "TLS" in plain.stderr, plain.stderr
