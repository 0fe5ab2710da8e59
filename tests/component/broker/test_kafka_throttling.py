"""Quota throttling on a Kafka listener, over loopback TCP with Trio's autojump clock (the
quota enforcer reads the same clock): a request of a version whose client waits out
``throttle_time_ms`` itself (KIP-219) is answered at once and its connection then reads
nothing for the throttle time; an older version's answer is delayed instead."""

from __future__ import annotations

import struct

import pytest
import trio

from tidelog.broker.network import SocketServer
from tidelog.broker.security.quotas import PRODUCER_BYTE_RATE, ClientQuotas, QuotaEnforcer
from tidelog.broker.zookeeper.layout import entity_path
from tidelog.protocol.kafka.schema import codec
from tidelog.protocol.messages import PartitionProduceResponse, ProduceResponse, TopicProduceResponse
from tidelog.protocol.records import build_batch, kafka_batch

CLIENT_ID = b"app"
QUOTA_WINDOW_MS = 2 * 1000  # two samples of one second: the longest throttle
BATCH = kafka_batch(build_batch([b"x" * 1000], timestamp_ms=0))  # ten times the quota's 100 bytes/s


class Producing:
    """The handler behind the enforcer: answers every produce, noting when it was called."""

    def __init__(self) -> None:
        self.called_at: list[float] = []

    def __call__(self, context, body: dict) -> ProduceResponse:
        self.called_at.append(trio.current_time())
        return ProduceResponse([TopicProduceResponse("t", [PartitionProduceResponse(0, 0, base_offset=0)])])


class ProducingLater(Producing):
    """Answers after an await (an acks=all produce, an administrative request)."""

    async def __call__(self, context, body: dict) -> ProduceResponse:
        response = super().__call__(context, body)
        await trio.sleep(0)
        return response


async def serve(nursery: trio.Nursery, handler: Producing | None = None, *,
                servers: list | None = None) -> tuple[Producing, int]:
    configs = {entity_path(None, CLIENT_ID.decode()): {PRODUCER_BYTE_RATE: "100"}}
    quotas = ClientQuotas(lambda: configs, lambda: 0, samples=2, sample_ms=1000)
    enforcer = QuotaEnforcer(quotas, clock=trio.current_time)
    await nursery.start(enforcer.run)
    handler = handler or Producing()
    server = SocketServer(enforcer.instrument(handler), host="127.0.0.1", port=0, wire="kafka")
    if servers is not None:
        servers.append(server)
    return handler, await nursery.start(server.run)


def produce(version: int, correlation_id: int) -> bytes:
    body = codec("ProduceRequest", version).encode({"acks": 1, "timeout_ms": 1000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": BATCH}]}]})
    head = struct.pack(">hhih", 0, version, correlation_id, len(CLIENT_ID)) + CLIENT_ID
    return struct.pack(">i", len(head) + len(body)) + head + bytes(body)


async def response(stream: trio.SocketStream, version: int) -> tuple[int, dict]:
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = await stream.receive_some(65536)
        assert chunk, "the connection closed"
        data += chunk
    correlation_id = struct.unpack_from(">i", data, 4)[0]
    return correlation_id, codec("ProduceResponse", version).decode_all(data[8:])


@pytest.mark.parametrize("handler", [Producing, ProducingLater])
async def test_a_kip_219_client_is_answered_at_once_then_its_connection_is_muted(nursery, autojump_clock, handler):
    handler, port = await serve(nursery, handler())
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        sent = trio.current_time()
        await stream.send_all(produce(7, 1))
        correlation_id, first = await response(stream, 7)
        answered = trio.current_time()
        throttle_s = first["throttle_time_ms"] / 1000
        assert correlation_id == 1 and throttle_s >= QUOTA_WINDOW_MS / 1000
        assert answered - sent < throttle_s  # not held back by the throttle time
        # the client would wait now; one that does not finds its next request unread until then
        await stream.send_all(produce(7, 2))
        correlation_id, _ = await response(stream, 7)
        assert correlation_id == 2 and len(handler.called_at) == 2
        assert handler.called_at[1] - handler.called_at[0] >= throttle_s


async def test_a_graceful_shutdown_answers_a_muted_connections_request_without_waiting_out_the_throttle(
        nursery, autojump_clock):
    servers: list[SocketServer] = []
    handler, port = await serve(nursery, servers=servers)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(produce(7, 1))
        _, first = await response(stream, 7)
        muted_at = trio.current_time()
        await stream.send_all(produce(7, 2))  # read, and waiting for the throttle to pass
        await trio.sleep(0.1)
        nursery.start_soon(servers[0].aclose)
        correlation_id, _ = await response(stream, 7)
        assert correlation_id == 2 and len(handler.called_at) == 2
        assert trio.current_time() - muted_at < first["throttle_time_ms"] / 1000


@pytest.mark.parametrize("version", [3, 5])
async def test_an_older_client_gets_its_answer_delayed_by_the_throttle_time(nursery, autojump_clock, version):
    _, port = await serve(nursery)
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        sent = trio.current_time()
        await stream.send_all(produce(version, 1))
        _, first = await response(stream, version)
        assert first["throttle_time_ms"] >= QUOTA_WINDOW_MS
        assert trio.current_time() - sent >= first["throttle_time_ms"] / 1000
