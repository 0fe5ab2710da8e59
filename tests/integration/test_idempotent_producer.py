"""The idempotent producer against real brokers (RF 3, min ISR 2): I3 and I4 of docs/reliability.md.

* Lost responses: the client reaches each broker through an in-process TCP proxy that
  rewrites Metadata answers to point at the proxies, and for some Produce requests forwards
  the request, waits for the broker's answer (so the batch was appended) and then drops both
  connections instead of relaying it. The producer resends; the broker deduplicates.
* Leader failover: the leader of a partition is SIGKILLed while an acks=all producer runs.
* Broker restarts: a batch resent after its broker was killed (state rebuilt by replay) and
  after a clean restart (loaded from the shutdown snapshot) is still a duplicate.

The oracle: every value appears exactly once in the final log, and one producer's values of
a partition appear in the order they were sent.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import msgpack
import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import (
    broker_metadata,
    cluster_fixture,
    consume_range,
    end_offsets,
    partitions_of,
    running,
    wait_topic_ready,
)
from tests.support.raw_client import RawClient
from tests.support.waiting import wait_until
from tidelog import Admin, NewTopic, Producer, TopicPartition
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import InitProducerIdRequest, PartitionProduceData, ProduceRequest, TopicProduceData
from tidelog.protocol.records import build_batch


@pytest.fixture
def cluster(request, tmp_path_factory):
    """A 3-broker cluster of the test's own (the tests kill brokers)."""
    yield from cluster_fixture(request, tmp_path_factory.mktemp("idempotence"), 3, FAST_FAILOVER)


def create_topic(cluster, name: str, partitions: int, rf: int = 3) -> None:
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(name, partitions, rf, config={"min.insync.replicas": str(min(rf, 2))})])
    wait_topic_ready(cluster, name, partitions, rf)


def assert_exactly_once_in_order(cluster, topic: str, partitions: int, sent: int, acked) -> None:
    """I4: each of the ``sent`` values ``v-<n>`` once; I3: per partition in send order; and
    every acknowledged offset holds its value."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records = consume_range(cluster.bootstrap, end_offsets(cluster.bootstrap, tps), timeout=90)
    seen: dict[int, tuple[int, int]] = {}
    for tp, rs in records.items():
        numbers = [int(r.value.split(b"-")[1]) for r in rs]
        assert numbers == sorted(numbers), f"{tp}: values out of send order"
        for r, n in zip(rs, numbers):
            assert n not in seen, f"value v-{n} appears twice: {seen[n]} and {(tp.partition, r.offset)}"
            seen[n] = (tp.partition, r.offset)
    assert sorted(seen) == list(range(sent)), f"{sent - len(seen)} values missing"
    for n, md in acked:
        assert seen[n] == (md.partition, md.offset), f"v-{n} acknowledged at {md} but stored at {seen[n]}"


# -- a proxy that loses produce responses ---------------------------------------------------------


class FrameReader:
    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        out = []
        while len(self.buf) >= 4:
            (n,) = struct.unpack_from(">I", self.buf)
            if len(self.buf) < 4 + n:
                break
            out.append(self.buf[4:4 + n])
            self.buf = self.buf[4 + n:]
        return out


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


class LossyProxy:
    """One listener per broker. ``drop_every``: every n-th Produce request has its response
    swallowed and both connections closed (at most ``max_drops`` times)."""

    def __init__(self, brokers: dict[int, int], drop_every: int, max_drops: int):
        self.brokers = brokers  # broker id -> real port
        self.drop_every, self.max_drops = drop_every, max_drops
        self.produces = self.drops = 0
        self.lock = threading.Lock()
        self.listeners: dict[int, socket.socket] = {}
        self.ports: dict[int, int] = {}
        self.closed = threading.Event()
        for broker_id in brokers:
            s = socket.create_server(("127.0.0.1", 0))
            s.settimeout(0.2)
            self.listeners[broker_id] = s
            self.ports[broker_id] = s.getsockname()[1]
            threading.Thread(target=self._accept, args=(broker_id,), daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports.values())

    def close(self) -> None:
        self.closed.set()
        for s in self.listeners.values():
            s.close()

    def _accept(self, broker_id: int) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listeners[broker_id].accept()
            except (socket.timeout, OSError):
                continue
            upstream = socket.create_connection(("127.0.0.1", self.brokers[broker_id]))
            pending: dict[int, str] = {}  # correlation id -> "metadata" | "drop"
            threading.Thread(target=self._requests, args=(client, upstream, pending), daemon=True).start()
            threading.Thread(target=self._responses, args=(client, upstream, pending), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, pending: dict) -> None:
        reader = FrameReader()
        try:
            while data := client.recv(1 << 16):
                for payload in reader.feed(data):
                    api_key, _, cid, _, _ = msgpack.unpackb(payload)
                    if api_key == ApiKey.METADATA:
                        pending[cid] = "metadata"
                    elif api_key == ApiKey.PRODUCE:
                        with self.lock:
                            self.produces += 1
                            if self.produces % self.drop_every == 0 and self.drops < self.max_drops:
                                self.drops += 1
                                pending[cid] = "drop"
                    upstream.sendall(frame(payload))
        except OSError:
            pass
        finally:
            _close(client, upstream)

    def _responses(self, client: socket.socket, upstream: socket.socket, pending: dict) -> None:
        reader = FrameReader()
        try:
            while data := upstream.recv(1 << 16):
                for payload in reader.feed(data):
                    cid, body = msgpack.unpackb(payload)
                    what = pending.pop(cid, None)
                    if what == "drop":  # the broker appended and answered: lose the answer
                        return
                    if what == "metadata":
                        for b in body["brokers"]:
                            b["port"] = self.ports.get(b["node_id"], b["port"])
                        payload = msgpack.packb([cid, body], use_bin_type=True)
                    client.sendall(frame(payload))
        except OSError:
            pass
        finally:
            _close(client, upstream)


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def wait_session_expired(cluster, broker_id: int) -> None:
    """A SIGKILLed broker may start again once its ZooKeeper registration is gone."""
    other = next(i for i in running(cluster) if i != broker_id)
    wait_until(lambda: broker_id not in {b.node_id for b in broker_metadata(cluster, other).brokers}, 60,
               f"broker {broker_id}'s ZooKeeper session to expire")


def produce_numbers(producer: Producer, topic: str, count: int, pause_every: int = 100):
    futures = []
    for n in range(count):
        futures.append(producer.send(topic, b"v-%d" % n))
        if n % pause_every == pause_every - 1:
            time.sleep(0.005)
    return futures


def test_lost_produce_responses_are_deduplicated(cluster):
    create_topic(cluster, "lossy", 3)
    proxy = LossyProxy({i: b.port for i, b in cluster.brokers.items()}, drop_every=5, max_drops=10)
    try:
        with Producer(proxy.bootstrap, acks="all", linger_ms=5, batch_size=1024, retry_backoff_ms=50,
                      request_timeout_ms=10000, delivery_timeout_ms=90000) as producer:
            futures = produce_numbers(producer, "lossy", 6000)
            producer.flush(timeout=90)
            acked = [(n, f.result(0)) for n, f in enumerate(futures)]
    finally:
        proxy.close()
    assert proxy.drops >= 5  # responses were really lost (and the batches resent)
    assert_exactly_once_in_order(cluster, "lossy", 3, 6000, acked)


def test_leader_failover_while_producing(cluster):
    create_topic(cluster, "failover", 2)
    leader = partitions_of(broker_metadata(cluster, next(iter(cluster.brokers))), "failover")[0].leader_id
    stop = threading.Event()
    futures: list = []

    def run() -> None:
        n = 0
        while not stop.is_set() and n < 200000:
            futures.append(producer.send("failover", b"v-%d" % n))
            n += 1
            if n % 50 == 0:
                time.sleep(0.01)

    with Producer(cluster.bootstrap, acks="all", linger_ms=2, retry_backoff_ms=50, request_timeout_ms=15000,
                  delivery_timeout_ms=120000, max_block_ms=60000) as producer:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: sum(f.done() for f in list(futures)) > 2000, 60, "records acknowledged")
            cluster.brokers[leader].kill()
            count = len(futures)
            wait_until(lambda: sum(f.done() for f in list(futures)[count:]) > 2000, 90,
                       "records acknowledged after the failover")
            wait_session_expired(cluster, leader)
            cluster.brokers[leader].start()
            cluster.wait_ready(60)
            wait_topic_ready(cluster, "failover", 2, 3, timeout=60)
        finally:
            stop.set()
            thread.join(30)
        producer.flush(timeout=120)
        acked = [(n, f.result(0)) for n, f in enumerate(futures)]
    assert_exactly_once_in_order(cluster, "failover", 2, len(futures), acked)


# -- deduplication across broker restarts ----------------------------------------------------------


def produce_raw(port: int, topic: str, records: bytes) -> dict:
    request = ProduceRequest(acks=-1, timeout_ms=10000, topic_data=[
        TopicProduceData(topic, [PartitionProduceData(0, records)])])
    with RawClient(port) as raw:
        [t] = raw.request(ApiKey.PRODUCE, request.to_body())["responses"]
        [p] = t["partition_responses"]
        return p


def test_deduplication_survives_broker_restarts(cluster):
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic("restarts", 1, 1)])
    [broker_id] = {p.leader_id for p in wait_topic_ready(cluster, "restarts", 1, 1).values()}
    other = next(i for i in cluster.brokers if i != broker_id)
    with RawClient(cluster.brokers[other].port) as raw:  # any broker answers
        answer = raw.request(ApiKey.INIT_PRODUCER_ID, InitProducerIdRequest().to_body())
    assert answer["error_code"] == NONE.code and answer["producer_epoch"] == 0
    pid = answer["producer_id"]
    batches = [build_batch([b"v-%d" % (i * 2), b"v-%d" % (i * 2 + 1)], timestamp_ms=1000, producer_id=pid,
                           producer_epoch=0, base_sequence=i * 2) for i in range(3)]
    offsets = [produce_raw(cluster.brokers[broker_id].port, "restarts", b)["base_offset"] for b in batches]
    assert offsets == [0, 2, 4]

    def restart(how: str) -> None:
        getattr(cluster.brokers[broker_id], how)()
        wait_session_expired(cluster, broker_id)
        cluster.brokers[broker_id].start()
        cluster.wait_ready(60)
        wait_topic_ready(cluster, "restarts", 1, 1, timeout=60)

    for how in ("kill", "stop"):  # replay of the log, then the clean-shutdown snapshot
        restart(how)
        for batch, offset in zip(batches[1:], offsets[1:]):
            answer = produce_raw(cluster.brokers[broker_id].port, "restarts", batch)
            assert (answer["error_code"], answer["base_offset"]) == (NONE.code, offset), how
    gap = build_batch([b"x"], producer_id=pid, producer_epoch=0, base_sequence=9)
    assert produce_raw(cluster.brokers[broker_id].port, "restarts", gap)["error_code"] != NONE.code
    tp = TopicPartition("restarts", 0)
    values = [r.value for r in consume_range(cluster.bootstrap, end_offsets(cluster.bootstrap, [tp]))[tp]]
    assert values == [b"v-%d" % n for n in range(6)]
