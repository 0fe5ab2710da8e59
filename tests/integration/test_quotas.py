"""User and client-id configs on a real cluster (ZooKeeper + one broker process): SCRAM
credentials written by ``tidelog configs --zookeeper`` are stored salted, ``tidelog configs``
adds, describes and deletes quotas of users, client ids and a user's client id, and a
producer with ``producer_byte_rate`` is throttled to its quota, told so in
``throttle_time_ms``.

The broker measures rates over 2 samples of 1 s (``quota.window.num``), so the test's
measurement (~20 s) spans many windows: over T seconds a throttled client gets at most
about quota x (T + the window) bytes through. bench/RESULTS.md has the measurement both ways.
"""

from __future__ import annotations

import time

import pytest
import trio

from tests.support.cluster import cluster_fixture
from tests.support.raw_client import RawClient
from tidelog import Admin, Producer
from tidelog.aio.entity_configs import ClientQuotaAlteration, ClientQuotaEntity, QuotaOp
from tidelog.broker.cli import main
from tidelog.broker.security.credentials import ScramCredential, password_matches
from tidelog.broker.zookeeper.zk import ZkClient
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.messages import PartitionProduceData, ProduceRequest, ProduceResponse, TopicProduceData
from tidelog.protocol.records import build_batch

pytestmark = pytest.mark.integration

QUOTA = 100_000  # bytes/s
RECORD = 1000
RECORDS = 2000  # 2 MB: ~20 s at the quota
WINDOW_S = 2 * 1.0  # quota.window.num x quota.window.size.seconds, as the cluster below sets them
IN_FLIGHT = 5  # the producer's max_in_flight_requests_per_connection (its default)


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("quotas"), 1,
                               {"quota.window.num": 2, "quota.window.size.seconds": 1})


def configs(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["configs", *args])
    out, err = capsys.readouterr()
    return code, out, err


def zk_config(cluster, entity: str) -> tuple[bytes | None, dict[str, str]]:
    async def read():
        async with ZkClient(cluster.zookeeper.connect_string) as zk:
            got = await zk._get(zk.paths.entity_config(entity))
            config, _ = await zk.get_entity_config(entity)
            return (got[0] if got else None), config
    return trio.run(read)


def test_scram_credentials_written_to_zookeeper_are_salted(cluster, capsys):
    code, out, err = configs(capsys, "--zookeeper", cluster.zookeeper.connect_string, "--alter",
                             "--entity-type", "users", "--entity-name", "alice", "--add-config",
                             "SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]")
    assert code == 0, err
    assert "Completed updating config for user-principal 'alice'." in out
    raw, config = zk_config(cluster, "users/alice")
    assert b"alice-secret" not in raw
    sha256 = ScramCredential.from_text(config["SCRAM-SHA-256"])
    assert sha256.iterations == 8192
    assert password_matches("SCRAM-SHA-256", sha256, "alice-secret")
    assert not password_matches("SCRAM-SHA-256", sha256, "alice-secreT")
    assert ScramCredential.from_text(config["SCRAM-SHA-512"]).iterations == 4096
    # a broker describes them (mechanisms and iterations, never the keys)
    code, out, err = configs(capsys, "--bootstrap", cluster.bootstrap, "--describe", "--entity-type", "users",
                             "--entity-name", "alice")
    assert code == 0, err
    assert out.strip() == ("SCRAM credential configs for user-principal 'alice' are "
                           "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096")
    assert "salt" not in out and "alice-secret" not in out
    # and deletes one of them
    code, out, err = configs(capsys, "--bootstrap", cluster.bootstrap, "--alter", "--entity-type", "users",
                             "--entity-name", "alice", "--delete-config", "SCRAM-SHA-512")
    assert code == 0, err
    assert set(zk_config(cluster, "users/alice")[1]) == {"SCRAM-SHA-256"}


def test_credentials_the_broker_refuses(cluster, capsys):
    code, _, err = configs(capsys, "--bootstrap", cluster.bootstrap, "--alter", "--entity-type", "users",
                           "--entity-name", "bob", "--add-config", "SCRAM-SHA-256=[iterations=1000,password=x]")
    assert code == 1 and "UNACCEPTABLE_CREDENTIAL" in err and "4096" in err
    code, _, err = configs(capsys, "--bootstrap", cluster.bootstrap, "--alter", "--entity-type", "users",
                           "--entity-name", "bob", "--delete-config", "SCRAM-SHA-256")
    assert code == 1 and "RESOURCE_NOT_FOUND" in err
    code, _, err = configs(capsys, "--bootstrap", cluster.bootstrap, "--describe", "--entity-type", "users",
                           "--entity-name", "bob")
    assert code == 0 and zk_config(cluster, "users/bob") == (None, {})


@pytest.mark.parametrize("entity,label", [
    (["--entity-type", "users", "--entity-name", "carol"], "user-principal 'carol'"),
    (["--entity-type", "users", "--entity-default"], "the default user-principal"),
    (["--entity-type", "clients", "--entity-name", "app-1"], "client-id 'app-1'"),
    (["--entity-type", "clients", "--entity-default"], "the default client-id"),
    (["--entity-type", "users", "--entity-name", "carol", "--entity-type", "clients", "--entity-name", "app-1"],
     "user-principal 'carol', client-id 'app-1'"),
])
def test_quotas_are_added_described_and_deleted(cluster, capsys, entity, label):
    bootstrap = ["--bootstrap", cluster.bootstrap]
    code, out, err = configs(capsys, *bootstrap, "--alter", *entity, "--add-config",
                             "producer_byte_rate=1048576,consumer_byte_rate=2097152,request_percentage=12.5")
    assert code == 0, err
    assert out.strip() == f"Completed updating config for {label}."
    code, out, err = configs(capsys, *bootstrap, "--describe", *entity)
    assert code == 0, err
    assert out.strip() == (f"Quota configs for {label} are consumer_byte_rate=2097152,producer_byte_rate=1048576,"
                           "request_percentage=12.5")
    code, out, err = configs(capsys, *bootstrap, "--alter", *entity, "--delete-config",
                             "producer_byte_rate,request_percentage")
    assert code == 0, err
    code, out, err = configs(capsys, *bootstrap, "--describe", *entity)
    assert out.strip() == f"Quota configs for {label} are consumer_byte_rate=2097152"
    configs(capsys, *bootstrap, "--alter", *entity, "--delete-config", "consumer_byte_rate")
    code, out, err = configs(capsys, *bootstrap, "--describe", *entity)
    assert code == 0 and out.strip() == ""


def test_bad_quotas_are_refused(cluster, capsys):
    bootstrap = ["--bootstrap", cluster.bootstrap, "--alter", "--entity-type", "clients", "--entity-name", "x"]
    code, _, err = configs(capsys, *bootstrap, "--add-config", "producer_byte_rate=-5")
    assert code == 1 and "INVALID_REQUEST" in err
    code, _, err = configs(capsys, *bootstrap, "--add-config", "producer_byte_rate=10.5")
    assert code == 1 and "whole number" in err
    code, _, err = configs(capsys, *bootstrap, "--add-config", "segment.bytes=10")
    assert code == 2 and "unknown config" in err


def produce_request(size: int, topic: str = "throttled") -> ProduceRequest:
    batch = build_batch([b"x" * size])
    return ProduceRequest(1, 30000, [TopicProduceData(topic, [PartitionProduceData(0, batch)])])


def test_a_producer_is_throttled_to_its_byte_rate(cluster):
    client_id = "throttled-producer"
    with Admin(cluster.bootstrap) as admin:
        from tidelog import NewTopic

        admin.create_topics([NewTopic("throttled", 1, 1)])
        admin.alter_client_quotas([ClientQuotaAlteration(ClientQuotaEntity({"client-id": client_id}),
                                                         (QuotaOp("producer_byte_rate", QUOTA),))])
    time.sleep(1.0)  # the broker's watch picks the change up
    # requests of at most 64 KiB: each needs a throttle well under the 2 s window that caps one
    with Producer(cluster.bootstrap, client_id=client_id, linger_ms=5, batch_size=16384,
                  max_request_size=65536) as producer:
        producer.send("throttled", b"warm-up").result(30)  # metadata and connection first
        start = time.monotonic()
        futures = [producer.send("throttled", b"v" * RECORD) for _ in range(RECORDS)]
        producer.flush(120)
        elapsed = time.monotonic() - start
    for f in futures:
        f.result(0)
    rate = RECORDS * RECORD / elapsed
    print(f"throttled producer: {rate:.0f} B/s through a quota of {QUOTA} B/s ({elapsed:.1f} s)")
    # throttling only lowers the rate (a loaded machine lowers it further): an upper bound. A
    # request is measured when it arrives and throttled by its response's delay, so over T s
    # at most quota x (T + the 2 s window) get through, plus the requests the producer has in
    # flight before a delayed response holds it back (5 of at most 64 KiB)
    allowed = QUOTA * (elapsed + WINDOW_S) + IN_FLIGHT * 65536
    assert RECORDS * RECORD <= allowed, (
        f"{RECORDS * RECORD} B in {elapsed:.1f} s ({rate:.0f} B/s) through a quota of {QUOTA} B/s: "
        f"more than the {allowed:.0f} B the quota allows")
    # the client is still at its quota: one more request is throttled, and told so
    port = next(iter(cluster.brokers.values())).port
    with RawClient(port, timeout=30) as raw:
        raw.conn = ClientConnection(client_id=client_id)
        body = raw.request(ApiKey.PRODUCE, produce_request(200_000).to_body())
    response = ProduceResponse.from_body(body)
    assert response.throttle_time_ms > 0
    # another client id is not throttled
    with RawClient(port, timeout=30) as raw:
        raw.conn = ClientConnection(client_id="free")
        assert ProduceResponse.from_body(raw.request(ApiKey.PRODUCE, produce_request(200_000).to_body())
                                         ).throttle_time_ms == 0
