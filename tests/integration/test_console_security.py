"""The web console against a secured cluster (SASL_SSL, SCRAM, the ACL authorizer on): it
connects with the credentials of its ``--command-config``, offers only what the principal's
ACLs allow (and refuses the rest with 403), and its own login works over HTTPS only.

Users: the super user ``admin`` (the dev cluster's) and ``alice``, who may describe the
cluster and read and describe topic ``orders`` and nothing else. Checked over the console's
JSON, which is what the page draws from (tests/integration/test_console.py drives the page).
"""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator

import pytest
import trustme

from tests.support.cluster import shut_down
from tests.support.console import ConsoleProcess
from tests.support.waiting import wait_until
from tidelog import AclBinding, Admin, NewTopic
from tidelog.aio.entity_configs import ScramCredentialInfo, UserScramCredentialUpsertion
from tidelog.broker.devcluster import DevCluster

ALICE_PASSWORD = "alice-secret-1"
CONFIG = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "zookeeper.session.timeout.ms": 6000,
          "default.replication.factor": 2, "offsets.topic.replication.factor": 2, "offsets.topic.num.partitions": 3}


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory) -> Iterator[DevCluster]:
    c = DevCluster(tmp_path_factory.mktemp("console-secure"), brokers=2, zk_port=0, base_port=0, extra_config=CONFIG,
                   security="SASL_SSL")
    failed_before, started = request.session.testsfailed, False
    try:
        c.start(90)
        started = True
        with Admin(c.bootstrap, **c.client_security().options()) as admin:
            admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
                "alice", ScramCredentialInfo("SCRAM-SHA-256"), ALICE_PASSWORD)])
            admin.create_topics([NewTopic("orders", 1, 2)])
            admin.create_acls([AclBinding("CLUSTER", "kafka-cluster", "LITERAL", "User:alice", "*", "DESCRIBE", "ALLOW"),
                               AclBinding("TOPIC", "orders", "LITERAL", "User:alice", "*", "READ", "ALLOW")])
        yield c
    finally:
        shut_down(c, failed=not started or request.session.testsfailed > failed_before)


def alice_properties(cluster: DevCluster, path) -> str:
    ca = cluster.client_security().ssl_cafile
    path.write_text(f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=alice\n"
                    f"sasl.password={ALICE_PASSWORD}\nssl.ca.location={ca}\n")
    return str(path)


@pytest.fixture
def console_as(cluster, tmp_path):
    started: list[ConsoleProcess] = []

    def start(properties: str, extra_args: list[str] | None = None, **kwargs) -> ConsoleProcess:
        c = ConsoleProcess(cluster.bootstrap, tmp_path / f"console-{len(started)}.log",
                           extra_args=["--command-config", properties, *(extra_args or [])], **kwargs)
        started.append(c)
        c.start()
        return c
    try:
        yield start
    finally:
        for c in started:
            c.stop()


def test_the_super_user_gets_every_action_and_the_console_speaks_sasl_ssl(cluster, console_as):
    console = console_as(str(cluster.client_properties))
    overview = console.get("/api/overview")
    assert overview["permissions"]["mode"] == "open" and overview["permissions"]["principal"] == "User:admin"
    assert len(overview["brokers"]) == 2
    status, answer = console.request("POST", "/api/topics", {"name": "made-by-admin", "partitions": 1,
                                                             "replication_factor": 2})
    assert status == 200, answer
    with Admin(cluster.bootstrap, **cluster.client_security().options()) as admin:
        assert "made-by-admin" in admin.list_topics()


def test_a_principal_is_offered_only_what_its_acls_allow(cluster, console_as, tmp_path):
    console = console_as(alice_properties(cluster, tmp_path / "alice.properties"))
    wait_until(lambda: console.get("/api/overview").get("permissions", {}).get("mode") == "acls", 30,
               "the console read alice's ACLs")
    topics = console.get("/api/topics")
    assert topics["can_create"] is False
    assert [(t["name"], t["can_delete"]) for t in topics["items"]] == [("orders", False)]
    topic = console.get("/api/topics/orders")
    assert topic["can_read"] and not topic["can_produce"] and not topic["can_alter_configs"]
    for method, path, body in [("POST", "/api/topics", {"name": "alices"}), ("DELETE", "/api/topics/orders", None),
                               ("POST", "/api/topics/orders/records", {"value": "v"})]:
        status, answer = console.request(method, path, body)
        assert status == 403 and "may not" in answer["error"], answer


def test_the_login_needs_tls_and_guards_the_console(cluster, console_as, tmp_path):
    refused = ConsoleProcess(cluster.bootstrap, tmp_path / "refused.log", extra_args=["--login-user", "ops"],
                             env={"TIDELOG_CONSOLE_PASSWORD": "a-password"})
    r = subprocess.run(refused.args, env=refused.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs TLS" in r.stderr
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "console.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "console.key"))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    console = console_as(str(cluster.client_properties),
                         ["--login-user", "ops", "--certfile", str(tmp_path / "console.pem"),
                          "--keyfile", str(tmp_path / "console.key")],
                         env={"TIDELOG_CONSOLE_PASSWORD": "a-password"}, ssl_context=context,
                         auth=("ops", "a-password"))
    assert console.url.startswith("https://")
    assert console.request("GET", "/api/overview", auth=("ops", "wrong"))[0] == 401
    status, overview = console.request("GET", "/api/overview")
    assert status == 200 and len(overview["brokers"]) == 2
