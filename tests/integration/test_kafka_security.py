"""The Kafka listener secured like the native one: SASL_SSL (SCRAM over TLS) with the same
credentials, the same authorizer and ACLs. Driven by confluent-kafka (librdkafka), which a
Kafka operator would point at such a listener with the usual properties."""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import cluster_fixture
from tests.support.waiting import wait_until
from tidelog import AclBinding, Admin, NewTopic
from tidelog.aio.entity_configs import ScramCredentialInfo, UserScramCredentialUpsertion
from tidelog.security import read_properties

confluent_kafka = pytest.importorskip("confluent_kafka")
import confluent_kafka.admin  # noqa: E402

CONFIG = {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer", "zookeeper.session.timeout.ms": 6000}
ALICE = "alice-secret-1"


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("kafka-secured"), 1, CONFIG, security="SASL_SSL",
                               kafka=True)


def kafka_config(cluster, **override) -> dict:
    """The cluster's client.properties are librdkafka's own property names."""
    props = {k: v for k, v in read_properties(str(cluster.client_properties)).items()}
    return {"bootstrap.servers": cluster.kafka_bootstrap, **props, **override}


def admin_of(cluster) -> Admin:
    return Admin(cluster.bootstrap, **cluster.client_security().options())


def produce(config: dict, topic: str, n: int = 5, timeout: float = 30.0) -> list:
    producer = confluent_kafka.Producer({**config, "acks": "all", "message.timeout.ms": int(timeout * 1000)})
    outcomes = []
    for i in range(n):
        producer.produce(topic, b"v%d" % i, on_delivery=lambda err, m: outcomes.append(err))
    producer.flush(timeout + 5)
    return outcomes


def test_the_super_user_produces_and_consumes_over_sasl_ssl(cluster):
    with admin_of(cluster) as admin:
        admin.create_topics([NewTopic("secured", 1, 1)])
    assert produce(kafka_config(cluster), "secured") == [None] * 5
    consumer = confluent_kafka.Consumer({**kafka_config(cluster), "group.id": "secured-group",
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["secured"])
    got, deadline = [], time.monotonic() + 60
    while len(got) < 5 and time.monotonic() < deadline:
        m = consumer.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    consumer.close()
    assert got == [b"v%d" % i for i in range(5)]


def test_a_wrong_password_fails_authentication(cluster):
    errors = []
    admin = confluent_kafka.admin.AdminClient({**kafka_config(cluster, **{"sasl.password": "wrong"}),
                                               "error_cb": lambda e: errors.append(e)})
    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=5)
    for _ in range(20):  # error callbacks are served by poll
        if errors:
            break
        admin.poll(0.5)
    assert any(e.code() == confluent_kafka.KafkaError._AUTHENTICATION for e in errors), errors


def test_a_client_without_tls_gets_nothing(cluster):
    admin = confluent_kafka.admin.AdminClient({"bootstrap.servers": cluster.kafka_bootstrap,
                                               "socket.connection.setup.timeout.ms": 3000})
    with pytest.raises(confluent_kafka.KafkaException):
        admin.list_topics(timeout=5)


def test_acls_decide_for_a_kafka_client_as_for_a_tidelog_one(cluster):
    with admin_of(cluster) as admin:
        admin.create_topics([NewTopic("acl-topic", 1, 1)])
        admin.alter_user_scram_credentials([UserScramCredentialUpsertion("alice", ScramCredentialInfo("SCRAM-SHA-512"),
                                                                          ALICE)])
    alice = kafka_config(cluster, **{"sasl.username": "alice", "sasl.password": ALICE})
    wait_until(lambda: _lists(alice), 30, "alice authenticates")
    refused = produce(alice, "acl-topic", n=1, timeout=5)
    assert refused[0] is not None and refused[0].code() == confluent_kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED
    with admin_of(cluster) as admin:
        admin.create_acls([AclBinding("topic", "acl-topic", "literal", "User:alice", "*", "write", "allow")])
    wait_until(lambda: produce(alice, "acl-topic", n=1, timeout=5) == [None], 30, "alice may write")


def _lists(config: dict) -> bool:
    try:
        confluent_kafka.admin.AdminClient(config).list_topics(timeout=3)
    except confluent_kafka.KafkaException:
        return False
    return True
