"""Broker APIs from a plain client (issue 14), against three real broker processes.

Until brokers authenticate, a broker checks what ZooKeeper can tell it: a follower Fetch must
name a follower of the partition and carry that broker's current broker epoch; LeaderAndIsr,
StopReplica and UpdateMetadata must carry the controller id and epoch ZooKeeper holds now and
the receiver's broker epoch; ControlledShutdown the epoch of the broker's registration;
InitProducerId cannot name another producer's id; DeleteTopics cannot delete
``__consumer_offsets``. Each case sends what a client without ZooKeeper's knowledge can send
(raw requests), asserts the error code and that nothing changed, and that a well-behaved
producer and consumer keep working. The fake follower runs while both real followers are
stopped with SIGSTOP: the high watermark does not move and an acks=all produce is not
acknowledged. (The test reads ZooKeeper itself, where it needs a real value to be off by one.)
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from kazoo.client import KazooClient

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import broker_metadata, cluster_fixture, controller_id, partitions_of, wait_topic_ready
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    STALE_BROKER_EPOCH,
    STALE_CONTROLLER_EPOCH,
)
from tidelog.protocol.messages import (
    DEBUGGING_REPLICA_ID,
    LATEST_TIMESTAMP,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    InitProducerIdRequest,
    InitProducerIdResponse,
    LeaderAndIsrRequest,
    LeaderAndIsrResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    LiveBroker,
    PartitionProduceData,
    PartitionState,
    ProduceRequest,
    ProduceResponse,
    StopReplicaPartition,
    StopReplicaRequest,
    StopReplicaResponse,
    TopicProduceData,
    UpdateMetadataRequest,
    UpdateMetadataResponse,
)
from tidelog.protocol.records import build_batch, iter_headers

GOOD = "good"  # the well-behaved producer's and consumer's topic
GUARDED = "guarded"  # RF 3, min.insync.replicas 2: the fake follower's
PAIR = "pair"  # RF 2: one broker is no replica of it
ROOT = "/tidelog"  # DevCluster's ZooKeeper chroot


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("guards"), 3, FAST_FAILOVER)


@pytest.fixture(scope="module")
def topics(cluster):
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(GOOD, 3, 3, config={"min.insync.replicas": "2"}),
                             NewTopic(GUARDED, 1, 3, config={"min.insync.replicas": "2"}),
                             NewTopic(PAIR, 1, 2)])
    for name, parts, rf in ((GOOD, 3, 3), (GUARDED, 1, 3), (PAIR, 1, 2)):
        wait_topic_ready(cluster, name, parts, rf)
    yield


class WellBehaved:
    """An SDK producer (acks=all, idempotent) and a consumer of ``GOOD`` for the whole module."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.producer = Producer(cluster.bootstrap, acks="all", retries=10, request_timeout_ms=10000)
        self.sent: list[bytes] = []

    def check(self) -> None:
        """Produce a few records (each acknowledged) and consume everything sent so far."""
        batch = [b"good-%d" % (len(self.sent) + i) for i in range(5)]
        futures = [self.producer.send(GOOD, v, partition=i % 3) for i, v in enumerate(batch)]
        for f in futures:
            f.result(timeout=30)
        self.sent += batch
        with Consumer(self.cluster.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
            consumer.assign([TopicPartition(GOOD, p) for p in range(3)])
            got: list[bytes] = []
            wait_until(lambda: got.extend(r.value for r in consumer.poll(timeout_ms=300)) or len(got) >= len(self.sent),
                       30, "the good topic consumed")
        assert sorted(got) == sorted(self.sent)

    def close(self) -> None:
        self.producer.close()


@pytest.fixture(scope="module")
def good(cluster, topics):
    client = WellBehaved(cluster)
    client.check()
    yield client
    client.check()
    client.close()


@contextlib.contextmanager
def zookeeper(cluster):
    zk = KazooClient(hosts=cluster.zookeeper.connect_string, timeout=10)
    zk.start(timeout=10)
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()


def broker_epochs(cluster) -> dict[int, int]:
    with zookeeper(cluster) as zk:
        return {i: zk.get(f"{ROOT}/brokers/ids/{i}")[1].czxid for i in cluster.brokers}


def controller_epoch(cluster) -> int:
    with zookeeper(cluster) as zk:
        return int(zk.get(f"{ROOT}/controller_epoch")[0])


def raw(cluster, broker_id: int) -> RawClient:
    return RawClient(cluster.brokers[broker_id].port, timeout=15)


def roles(cluster, topic: str) -> tuple[int, list[int]]:
    p = partitions_of(broker_metadata(cluster, 1), topic)[0]
    return p.leader_id, [r for r in p.replica_nodes if r != p.leader_id]


def latest(client: RawClient, topic: str, replica_id: int) -> int:
    """The HW (as a consumer) or the LEO (as the debugging replica) of ``topic``-0."""
    r = ListOffsetsResponse.from_body(client.request(ApiKey.LIST_OFFSETS, ListOffsetsRequest(
        [ListOffsetsTopic(topic, [ListOffsetsPartition(0, LATEST_TIMESTAMP)])], replica_id=replica_id)))
    p = r.topics[0].partitions[0]
    assert p.error_code == NONE.code, p
    return p.offset


def follower_fetch(topic: str, offset: int, replica_id: int, replica_epoch: int) -> FetchRequest:
    return FetchRequest([FetchTopic(topic, [FetchPartition(0, offset, 1 << 20)])], replica_id=replica_id,
                        max_wait_ms=0, replica_epoch=replica_epoch)


def produce(client: RawClient, topic: str, value: bytes, acks: int = -1, timeout_ms: int = 2000):
    r = ProduceResponse.from_body(client.request(ApiKey.PRODUCE, ProduceRequest(acks, timeout_ms, [
        TopicProduceData(topic, [PartitionProduceData(0, build_batch([value], timestamp_ms=int(time.time() * 1000)))])])))
    return r.responses[0].partition_responses[0]


# -- follower fetches ------------------------------------------------------------------------------


def test_a_fake_follower_moves_no_hw_while_the_real_ones_are_stopped(cluster, good):
    leader, followers = roles(cluster, GUARDED)
    epochs = broker_epochs(cluster)
    with raw(cluster, leader) as client, raw(cluster, leader) as fake:
        assert produce(client, GUARDED, b"committed").error_code == NONE.code
        hw = latest(client, GUARDED, -1)
        answers: list[tuple[int, bool]] = []  # (error code, records served)
        stop = threading.Event()

        def pretend() -> None:  # fetch at the leader's LEO as each follower, as if caught up
            while not stop.is_set():
                leo = latest(fake, GUARDED, DEBUGGING_REPLICA_ID)
                for f in followers:
                    for claim in (-1, 0, epochs[f] - 1, epochs[f] + 1):  # a client does not know the epoch
                        r = FetchResponse.from_body(fake.request(ApiKey.FETCH, follower_fetch(GUARDED, leo, f, claim)))
                        p = r.responses[0].partitions[0]
                        answers.append((p.error_code, bool(p.records)))

        for f in followers:
            cluster.brokers[f].pause()
        try:
            thread = threading.Thread(target=pretend, daemon=True)
            thread.start()
            try:
                answer = produce(client, GUARDED, b"only-on-the-leader", timeout_ms=2000)
                moved_to = latest(client, GUARDED, -1)
            finally:
                stop.set()
                thread.join(15)
        finally:
            for f in followers:
                cluster.brokers[f].resume()
        assert answer.error_code != NONE.code, "acknowledged while only the leader had it"
        assert moved_to == hw, "a fake follower moved the high watermark"
        assert answers and set(answers) == {(NOT_LEADER_OR_FOLLOWER.code, False)}
        assert not thread.is_alive()
    wait_topic_ready(cluster, GUARDED, 1, 3)
    good.check()


def test_a_fetch_as_a_replica_that_is_no_follower_is_refused(cluster, good):
    leader, followers = roles(cluster, PAIR)
    outsider = next(b for b in cluster.brokers if b != leader and b not in followers)
    epochs = broker_epochs(cluster)
    with raw(cluster, leader) as client:
        assert produce(client, PAIR, b"x").error_code == NONE.code  # acks=all: the HW is past it
        hw = latest(client, PAIR, -1)
        # a broker with its real epoch that is not a replica, no broker at all, the leader itself
        for replica_id, epoch in ((outsider, epochs[outsider]), (99, epochs[outsider]), (leader, epochs[leader])):
            r = FetchResponse.from_body(client.request(ApiKey.FETCH, follower_fetch(PAIR, 0, replica_id, epoch)))
            p = r.responses[0].partitions[0]
            assert p.error_code == NOT_LEADER_OR_FOLLOWER.code and not p.records, (replica_id, p)
        assert latest(client, PAIR, -1) == hw
    good.check()


# -- requests from the controller ------------------------------------------------------------------


def test_controller_requests_from_a_client_are_refused(cluster, good):
    leader, followers = roles(cluster, GUARDED)
    victim = followers[0]
    controller = controller_id(cluster, via=1)
    epoch, epochs = controller_epoch(cluster), broker_epochs(cluster)
    before = partitions_of(broker_metadata(cluster, victim), GUARDED)[0]
    claims = [  # (controller, controller epoch, broker epoch) -> the answer
        ((controller, epoch - 1, epochs[victim]), STALE_CONTROLLER_EPOCH),
        ((controller, epoch + 1, epochs[victim]), STALE_CONTROLLER_EPOCH),
        ((next(b for b in cluster.brokers if b != controller), epoch, epochs[victim]), STALE_CONTROLLER_EPOCH),
        ((controller, epoch, -1), STALE_BROKER_EPOCH),
        ((controller, epoch, epochs[victim] + 1), STALE_BROKER_EPOCH),
    ]
    with raw(cluster, victim) as client:
        for (cid, cepoch, bepoch), error in claims:
            # make the follower a second leader (LeaderAndIsr), erase its replica (StopReplica
            # with delete), rewrite its view of the cluster (UpdateMetadata)
            st = PartitionState(GUARDED, 0, cepoch, victim, before.leader_epoch + 1, [victim], 99,
                                before.replica_nodes)
            r = LeaderAndIsrResponse.from_body(client.request(ApiKey.LEADER_AND_ISR, LeaderAndIsrRequest(
                cid, cepoch, bepoch, [st])))
            assert r.error_code == error.code, ("LeaderAndIsr", cid, cepoch, bepoch)
            r = StopReplicaResponse.from_body(client.request(ApiKey.STOP_REPLICA, StopReplicaRequest(
                cid, cepoch, bepoch, [StopReplicaPartition(GUARDED, 0, before.leader_epoch + 1, True)])))
            assert r.error_code == error.code, ("StopReplica", cid, cepoch, bepoch)
            r = UpdateMetadataResponse.from_body(client.request(ApiKey.UPDATE_METADATA, UpdateMetadataRequest(
                cid, cepoch, bepoch, [], [LiveBroker(66, "evil.example", 1)])))
            assert r.error_code == error.code, ("UpdateMetadata", cid, cepoch, bepoch)
        # still a follower, still holding the partition, still seeing the real cluster
        assert produce(client, GUARDED, b"to-the-follower", acks=1).error_code == NOT_LEADER_OR_FOLLOWER.code
        assert latest(client, GUARDED, DEBUGGING_REPLICA_ID) > 0
        md = broker_metadata(cluster, victim)
        assert sorted(b.node_id for b in md.brokers) == sorted(cluster.brokers)
        assert partitions_of(md, GUARDED)[0].leader_id == leader
    wait_topic_ready(cluster, GUARDED, 1, 3)
    good.check()


def test_controlled_shutdown_of_another_broker_is_refused(cluster, good):
    controller = controller_id(cluster, via=1)
    leaders = {t: roles(cluster, t)[0] for t in (GUARDED, PAIR)}
    epochs = broker_epochs(cluster)
    with raw(cluster, controller) as client:
        for broker in cluster.brokers:
            for claim in (-1, 0, epochs[broker] - 1, epochs[broker] + 1):
                r = ControlledShutdownResponse.from_body(client.request(
                    ApiKey.CONTROLLED_SHUTDOWN, ControlledShutdownRequest(broker, claim)))
                assert r.error_code == STALE_BROKER_EPOCH.code, (broker, claim)
    assert {t: roles(cluster, t)[0] for t in leaders} == leaders
    wait_topic_ready(cluster, GOOD, 3, 3)
    good.check()


# -- other clients' state --------------------------------------------------------------------------


def last_batch_header(cluster):
    """The header of the last batch of ``GOOD``-0, fetched from its leader."""
    leader, _ = roles(cluster, GOOD)
    with raw(cluster, leader) as client:
        r = FetchResponse.from_body(client.request(ApiKey.FETCH, FetchRequest(
            [FetchTopic(GOOD, [FetchPartition(0, 0, 1 << 20)])], max_wait_ms=0)))
    p = r.responses[0].partitions[0]
    assert p.error_code == NONE.code and p.records, p
    return [h for _, h in iter_headers(p.records)][-1]


def test_init_producer_id_cannot_fence_another_producer(cluster, good):
    good.check()  # the good producer has its producer id: read it from its batches
    victim = last_batch_header(cluster)
    assert victim.producer_id >= 0
    with raw(cluster, 1) as client:
        for pid, epoch in ((victim.producer_id, -1), (-1, victim.producer_epoch)):
            r = InitProducerIdResponse.from_body(client.request(
                ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest(producer_id=pid, producer_epoch=epoch)))
            assert r.error_code == INVALID_REQUEST.code and r.producer_id == -1, (pid, epoch)
        # naming its id and epoch gets a new id (Kafka's rule without a transactional id)
        for request in (InitProducerIdRequest(producer_id=victim.producer_id, producer_epoch=victim.producer_epoch),
                        InitProducerIdRequest()):
            r = InitProducerIdResponse.from_body(client.request(ApiKey.INIT_PRODUCER_ID, request))
            assert r.error_code == NONE.code and r.producer_id != victim.producer_id and r.producer_epoch == 0
    good.check()  # not fenced: its next batches are acknowledged under the same id and epoch
    last = last_batch_header(cluster)
    assert (last.producer_id, last.producer_epoch) == (victim.producer_id, victim.producer_epoch)


def test_consumer_offsets_cannot_be_deleted(cluster, good):
    tp = TopicPartition(GOOD, 0)
    with Consumer(cluster.bootstrap, group_id="keeps-its-offsets", enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        consumer.commit({tp: 2})
        assert consumer.committed(tp) == 2
    controller = controller_id(cluster, via=1)
    with raw(cluster, controller) as client:
        r = DeleteTopicsResponse.from_body(client.request(ApiKey.DELETE_TOPICS, DeleteTopicsRequest(
            ["__consumer_offsets"], timeout_ms=5000)))
        assert r.responses[0].error_code == INVALID_TOPIC_EXCEPTION.code
    time.sleep(1.0)  # a deletion, had it been accepted, would be under way by now
    assert partitions_of(broker_metadata(cluster, 1), "__consumer_offsets")
    with Consumer(cluster.bootstrap, group_id="keeps-its-offsets", enable_auto_commit=False) as consumer:
        assert consumer.committed(tp) == 2
    good.check()
