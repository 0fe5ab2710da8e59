"""BrokerConnection over loopback against a scripted server speaking the real framing."""

from __future__ import annotations

import pytest
import trio

from tidelog.aio.connection import BrokerConnection
from tidelog.errors import BrokerConnectionError, RequestTimedOut
from tidelog.protocol.apis import api_versions
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import ServerConnection
from tidelog.protocol.messages import ApiVersionsRequest, ApiVersionsResponse


class Server:
    """Answers ApiVersions after ``delay_s``; records the most requests seen at once in flight."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.answer = True
        self.max_in_flight = 0
        self.received = 0
        self.streams: list[trio.SocketStream] = []
        self.port = 0

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listener.socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self.serve, [listener])

    async def serve(self, stream: trio.SocketStream) -> None:
        self.streams.append(stream)
        conn = ServerConnection(max_in_flight=100)
        lock = trio.Lock()
        async with trio.open_nursery() as nursery:
            try:
                while data := await stream.receive_some(1 << 16):
                    for request in conn.receive_data(data):
                        self.received += 1
                        self.max_in_flight = max(self.max_in_flight, conn.in_flight)
                        nursery.start_soon(self.answer_one, conn, stream, lock, request.header.correlation_id)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass
            nursery.cancel_scope.cancel()

    async def answer_one(self, conn, stream, lock, correlation_id) -> None:
        await trio.sleep(self.delay_s)
        if not self.answer:
            return
        out = conn.send_response(correlation_id, ApiVersionsResponse(0, api_versions()))
        async with lock:
            await stream.send_all(out)


@pytest.fixture
async def server(nursery):
    s = Server()
    await nursery.start(s.run)
    return s


async def connect(nursery, server, **kw) -> BrokerConnection:
    conn = BrokerConnection("127.0.0.1", server.port, node_id=7, **kw)
    await nursery.start(conn.run)
    return conn


async def test_pipelined_requests_get_their_own_responses(nursery, server):
    conn = await connect(nursery, server)
    results = []

    async def one():
        results.append(await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS))

    async with trio.open_nursery() as inner:
        for _ in range(20):
            inner.start_soon(one)
    assert len(results) == 20 and all(isinstance(r, ApiVersionsResponse) for r in results)
    assert server.max_in_flight <= 5  # the default bound
    await conn.close()


async def test_in_flight_requests_are_bounded(nursery, server):
    server.delay_s = 0.05
    conn = await connect(nursery, server, max_in_flight=2)
    async with trio.open_nursery() as inner:
        for _ in range(6):
            inner.start_soon(lambda: conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS))
    assert server.received == 6 and server.max_in_flight == 2


async def test_a_lost_connection_fails_every_request_in_flight(nursery, server):
    server.answer = False
    conn = await connect(nursery, server)
    errors = []

    async def one():
        try:
            await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS)
        except BrokerConnectionError as e:
            errors.append(e)

    async with trio.open_nursery() as inner:
        for _ in range(3):
            inner.start_soon(one)
        await trio.sleep(0.05)
        server.streams[0].socket.close()
    assert len(errors) == 3 and all(e.retriable and e.invalid_metadata for e in errors)
    assert conn.closed
    with pytest.raises(BrokerConnectionError):
        await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS)


async def test_a_timed_out_request_closes_the_connection(nursery, server):
    server.answer = False
    conn = await connect(nursery, server)
    with pytest.raises(RequestTimedOut, match="API_VERSIONS request to node 7"):
        await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS, timeout=0.05)
    assert conn.closed


async def test_a_cancelled_caller_abandons_only_its_own_request(nursery, server):
    server.delay_s = 0.05
    conn = await connect(nursery, server)
    with trio.move_on_after(0.01):
        await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS, timeout=5)
    response = await conn.request(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS)
    assert isinstance(response, ApiVersionsResponse) and not conn.closed


async def test_send_no_response_does_not_wait(nursery, server):
    server.answer = False
    conn = await connect(nursery, server)
    await conn.send_no_response(ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS)
    assert conn.in_flight == 0
    with trio.fail_after(2):
        while server.received < 1:
            await trio.sleep(0.01)


async def test_connect_failures_are_connection_errors(nursery):
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens there now
    conn = BrokerConnection("127.0.0.1", port, node_id=3)
    with pytest.raises(BrokerConnectionError, match="node 3"):
        await nursery.start(conn.run)
