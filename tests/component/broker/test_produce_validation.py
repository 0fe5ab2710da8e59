"""Produce through the broker's API layer over a real ReplicaManager and LogManager: batches
whose records fail validation are refused with their error code and the record's index and
nothing is stored; produces validated in a worker thread (large or compressed) keep the
order in which the connection's requests, and each partition's produces, were read."""

from __future__ import annotations

import os

import msgpack
import pytest
import trio

from tests.component.broker.test_group_coordinator import DATA_TP, Broker
from tests.unit.protocol.test_record_validation import forge, rec
from tidelog.broker.context import RequestContext
from tidelog.broker.deferred import CLOSE_CONNECTION
from tidelog.broker.produce_order import ProduceOrder, needs_worker
from tidelog.protocol.codec import ApiKey, RequestHeader
from tidelog.protocol.errors import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    NONE,
    UNSUPPORTED_COMPRESSION_TYPE,
)
from tidelog.protocol.kafka.records import to_stored
from tidelog.protocol.messages import PartitionProduceData, ProduceRequest, TopicProduceData
from tidelog.protocol.records import Codec, build_batch, iter_all_records, kafka_batch


@pytest.fixture
def broker(tmp_path):
    b = Broker(str(tmp_path))
    b.lead()
    yield b
    b.log_manager.shutdown()


def request(records: bytes, acks: int = 1) -> ProduceRequest:
    return ProduceRequest(acks, 5000, [TopicProduceData(DATA_TP.topic, [PartitionProduceData(0, records)])])


def start(b: Broker, records: bytes, peer: str = "127.0.0.1:5000", acks: int = 1):
    """The handler's result as the network layer sees it, called now, in order."""
    return b.apis.handle(RequestContext(RequestHeader(ApiKey.PRODUCE, 7, 1, "c"), peer), request(records, acks).to_body())


async def settle(result):
    return await result if hasattr(result, "__await__") else result


def answer(response):
    return response.responses[0].partition_responses[0]


def stored_values(b: Broker) -> list[bytes]:
    log = b.replica_manager.partitions[DATA_TP].log
    return [r.value for r in iter_all_records(log.read(0, 1 << 30, max_offset=log.log_end_offset))]


def now(b: Broker) -> int:
    return b.clock()


@pytest.mark.parametrize("batch, error", [
    (lambda t: forge([rec(0)], n=2**31 - 1, first=t), CORRUPT_MESSAGE),
    (lambda t: forge([rec(0)], raw=b"\xc1\xc1 not msgpack", first=t), CORRUPT_MESSAGE),
    (lambda t: forge([rec(0)], first=-2**63), INVALID_TIMESTAMP),
    (lambda t: forge([rec(0)], first=2**63 - 1), INVALID_TIMESTAMP),
    (lambda t: forge([rec(0)], codec=Codec.ZSTD, raw=b"\x00" * (64 << 20), first=t), CORRUPT_MESSAGE),
])
async def test_a_poison_pill_is_refused_with_its_code_and_stores_nothing(broker, batch, error):
    r = answer(await settle(start(broker, batch(now(broker)))))
    assert r.error_code == error.code and r.base_offset == -1 and "batch 0" in r.error_message
    assert stored_values(broker) == []
    r = answer(await settle(start(broker, build_batch([b"good"], timestamp_ms=now(broker)))))
    assert r.error_code == NONE.code and stored_values(broker) == [b"good"]


def test_needs_worker_for_large_or_compressed_produces():
    small = build_batch([b"x" * 100] * 10, timestamp_ms=0)
    assert not needs_worker({DATA_TP: small})
    assert needs_worker({DATA_TP: build_batch([b"x" * 1000] * 300, timestamp_ms=0)})
    assert needs_worker({DATA_TP: build_batch([os.urandom(1000) for _ in range(10)], codec=Codec.LZ4, timestamp_ms=0)})
    assert needs_worker({DATA_TP: build_batch([b"x"], codec=Codec.LZ4, timestamp_ms=0)})  # may be a bomb
    # records in Kafka's encoding (a Kafka client's) decode ~5 times slower: fewer bytes go aside
    medium = [b"x" * 10] * 3000  # ~40 KiB
    assert not needs_worker({DATA_TP: build_batch(medium, timestamp_ms=0)})
    assert needs_worker({DATA_TP: to_stored(kafka_batch(build_batch(medium, timestamp_ms=0)))})
    assert not needs_worker({DATA_TP: to_stored(kafka_batch(small))})


def heavy(b: Broker, tag: bytes) -> bytes:
    """A compressed produce, validated in a worker thread."""
    values = [tag] + [os.urandom(100) for _ in range(100)]
    return build_batch(values, codec=Codec.ZSTD, timestamp_ms=now(b))


def light(b: Broker, tag: bytes) -> bytes:
    return build_batch([tag], timestamp_ms=now(b))


async def test_pipelined_produces_append_in_the_order_read(broker):
    """Heavy, light, heavy, light on one connection, and a light one to the same partition from
    another connection read in between: each waits for those read before it."""
    started = [start(broker, heavy(broker, b"1")), start(broker, light(broker, b"2")),
               start(broker, light(broker, b"3"), peer="127.0.0.1:6000"),
               start(broker, heavy(broker, b"4")), start(broker, light(broker, b"5"))]
    assert all(hasattr(s, "__await__") for s in started)  # the first made every later one wait
    answers = []
    async with trio.open_nursery() as n:
        for s in reversed(started):  # awaited in the worst order: the later ones first
            async def run(s=s):
                answers.append(answer(await s))
            n.start_soon(run)
            await trio.sleep(0.01)
    assert all(a.error_code == NONE.code for a in answers)
    assert [v for v in stored_values(broker) if len(v) == 1] == [b"1", b"2", b"3", b"4", b"5"]
    assert len(broker.apis.produce_order) == 0  # every key released
    r = start(broker, light(broker, b"6"))
    assert not hasattr(r, "__await__") and answer(r).error_code == NONE.code  # back to appending at once


async def test_a_refused_heavy_produce_releases_its_followers(broker):
    bomb = forge([rec(0)], codec=Codec.GZIP, raw=b"\x00" * (64 << 20), first=now(broker))
    first, second = start(broker, bomb), start(broker, light(broker, b"after"))
    answers = {}
    async with trio.open_nursery() as n:  # as the network layer does: every awaitable runs
        for name, s in (("second", second), ("first", first)):
            async def run(name=name, s=s):
                answers[name] = answer(await s)
            n.start_soon(run)
    assert answers["first"].error_code == CORRUPT_MESSAGE.code and "batch 0" in answers["first"].error_message
    assert answers["second"].error_code == NONE.code
    assert stored_values(broker) == [b"after"]


async def test_acks_0_heavy_produce_is_appended_without_an_answer(broker):
    assert await start(broker, heavy(broker, b"z"), acks=0) is None
    assert stored_values(broker)[0] == b"z"


async def test_acks_0_that_fails_ends_its_connection_instead_of_an_answer(broker):
    # Kafka's rule: a client that reads no response learns of the failure by the connection's
    # end (and refreshes its metadata), not by sending to a former leader for minutes
    bad = forge([rec(0)], raw=b"\xc1 not msgpack", first=now(broker))
    assert await settle(start(broker, bad, acks=0)) is CLOSE_CONNECTION
    compressed = forge([rec(0)], raw=b"\xc1 not msgpack", first=now(broker), codec=Codec.ZSTD)  # a worker's
    assert await settle(start(broker, compressed, acks=0)) is CLOSE_CONNECTION
    assert await settle(start(broker, light(broker, b"z"), acks=0)) is None  # no error: no answer at all
    assert stored_values(broker) == [b"z"]


async def test_other_connections_are_served_while_a_heavy_batch_is_validated(broker):
    """A large batch of tiny records is unpacked in slices in a worker thread: the event loop
    keeps running (a checkpoint is reached) while it is validated."""
    records = msgpack.packb([rec(i, value=None) for i in range(400_000)])
    big = forge([None] * 400_000, raw=records, first=now(broker), codec=Codec.ZSTD)
    result = start(broker, big)
    ticks = 0
    async with trio.open_nursery() as n:
        async def tick():
            nonlocal ticks
            while True:
                await trio.sleep(0)
                ticks += 1
        n.start_soon(tick)
        r = answer(await result)
        n.cancel_scope.cancel()
    assert r.error_code == NONE.code and ticks > 1


def test_produce_order_chains_per_key():
    order = ProduceOrder()
    assert order.predecessors(["a"]) == []
    first = order.enter(["a", "b"])
    second = order.enter(["b"])
    assert order.predecessors(["a"]) == [first] and order.predecessors(["b", "c"]) == [second]
    order.leave(["a", "b"], first)
    assert first.is_set() and order.predecessors(["a", "b"]) == [second]
    order.leave(["b"], second)
    assert len(order) == 0


@pytest.mark.parametrize("codec, version, error", [
    (Codec.ZSTD, 6, UNSUPPORTED_COMPRESSION_TYPE), (Codec.ZSTD, 7, NONE), (Codec.GZIP, 3, NONE), (Codec.ZSTD, None, NONE)])
async def test_zstd_needs_produce_v7_from_a_kafka_client(broker, codec, version, error):
    # KIP-110: a Kafka client writes zstd from Produce v7 on; a native request (None) has no such bound
    records = to_stored(kafka_batch(build_batch([b"z"], codec=codec, timestamp_ms=now(broker))))
    ctx = RequestContext(RequestHeader(ApiKey.PRODUCE, 0, 1, "c"), "127.0.0.1:5000", kafka_version=version)
    r = answer(await settle(broker.apis.handle(ctx, request(records).to_body())))
    assert r.error_code == error.code
    assert stored_values(broker) == ([] if error is not NONE else [b"z"])
    if error is not NONE:
        assert f"version {version}" in r.error_message and "ZStandard" in r.error_message


@pytest.mark.parametrize("version, count, error", [
    (3, 2, INVALID_RECORD), (10, 3, INVALID_RECORD), (10, 1, NONE), (None, 2, NONE)])
async def test_a_kafka_client_sends_one_batch_per_partition(broker, version, count, error):
    # Kafka's ProduceRequest.validateRecords (v3+: the Kafka listener's only versions); a
    # native request (None) may carry a run of batches
    batches = [build_batch([b"b%d" % i], timestamp_ms=now(broker)) for i in range(count)]
    records = to_stored(b"".join(kafka_batch(b) for b in batches))
    ctx = RequestContext(RequestHeader(ApiKey.PRODUCE, 0, 1, "c"), "127.0.0.1:5000", kafka_version=version)
    r = answer(await settle(broker.apis.handle(ctx, request(records).to_body())))
    assert r.error_code == error.code
    assert stored_values(broker) == ([] if error is not NONE else [b"b%d" % i for i in range(count)])
    if error is not NONE:
        assert f"version {version}" in r.error_message and "exactly one record batch" in r.error_message
