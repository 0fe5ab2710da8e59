"""The socket server over real loopback TCP: ordering, back-pressure, hostile input, closing.

Every test runs a ``SocketServer`` on 127.0.0.1 port 0 with a small scripted handler, and a
well-behaved "bystander" client connected the whole time: whatever the test does to its own
connection, the bystander must keep getting answers.
"""

from __future__ import annotations

import logging
import random
import struct

import msgpack
import pytest
import trio

from tidelog.broker.config import BrokerConfig
from tidelog.broker.context import RequestContext
from tidelog.broker.deferred import CLOSE_CONNECTION, DeferredResponse
from tidelog.broker.network import SocketServer
from tidelog.protocol.codec import ApiKey, RequestHeader, encode_request
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.errors import (
    INVALID_REQUEST,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_SERVER_ERROR,
    UNSUPPORTED_VERSION,
    TidelogError,
)
from tidelog.protocol.frames import encode_frame

TIMEOUT_S = 5


class Client:
    """A tiny raw client: ClientConnection pairs responses with requests, bytes go as given."""

    def __init__(self, stream: trio.SocketStream, conn: ClientConnection):
        self.stream = stream
        self.conn = conn

    @classmethod
    async def connect(cls, port: int, **options) -> Client:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        return cls(stream, ClientConnection(client_id="test", **options))

    def frame(self, body: dict, *, api_key: int = ApiKey.METADATA, version: int = 0,
              expect_response: bool = True) -> bytes:
        return self.conn.send_request(api_key, version, body, expect_response)[1]

    async def send(self, body: dict, **kwargs) -> None:
        await self.stream.send_all(self.frame(body, **kwargs))

    async def receive(self, n: int = 1) -> list[tuple[int, dict]]:
        got: list[tuple[int, dict]] = []
        with trio.fail_after(TIMEOUT_S):
            while len(got) < n:
                data = await self.stream.receive_some(65536)
                assert data, f"connection closed after {len(got)} of {n} responses"
                got += self.conn.receive_data(data)
        assert len(got) == n
        return got

    async def call(self, body: dict, **kwargs) -> dict:
        await self.send(body, **kwargs)
        [(_, response)] = await self.receive()
        return response

    async def closed_by_server(self) -> bool:
        """True once the server closes the connection (reading and dropping what comes)."""
        with trio.move_on_after(TIMEOUT_S):
            while True:
                try:
                    if not await self.stream.receive_some(65536):
                        return True
                except trio.BrokenResourceError:  # reset
                    return True
        return False


class Handler:
    """Scripted by the request body: sleep, wait for the gate, raise, return None or a blob."""

    def __init__(self) -> None:
        self.called: list = []
        self.finished: list = []
        self.gate = trio.Event()

    async def __call__(self, context: RequestContext, body: dict):
        header = context.header
        n = body.get("n")
        self.called.append(n)
        if "sleep" in body:
            await trio.sleep(body["sleep"])
        if body.get("wait"):
            await self.gate.wait()
        if "raise" in body:
            raise _ERRORS[body["raise"]]
        self.finished.append(n)
        if body.get("no_response"):
            return None
        if "blob" in body:
            return {"n": n, "blob": b"x" * body["blob"]}
        return {"n": n, "api_key": int(header.api_key), "client_id": header.client_id}


_ERRORS = {"runtime": RuntimeError("secret internals"),
           "not_leader": TidelogError("not the leader of t-0", error=NOT_LEADER_OR_FOLLOWER)}


class Harness:
    """Starts servers in the test's nursery and connects clients; closes the clients after."""

    def __init__(self, nursery: trio.Nursery):
        self.nursery = nursery
        self.clients: list[Client] = []

    async def start(self, handler=None, **options) -> tuple[SocketServer, Handler, Client]:
        """A server on a free port, its handler, and a connected bystander client."""
        handler = handler or Handler()
        server = SocketServer(handler, host="127.0.0.1", port=0, **options)
        port = await self.nursery.start(server.run)
        assert port == server.port != 0
        return server, handler, await self.connect(port)

    async def connect(self, port: int, **options) -> Client:
        client = await Client.connect(port, **options)
        self.clients.append(client)
        return client


@pytest.fixture
async def net(nursery):
    harness = Harness(nursery)
    yield harness
    for client in harness.clients:
        await trio.aclose_forcefully(client.stream)


async def assert_serves(client: Client) -> None:
    assert (await client.call({"n": "ping"}))["n"] == "ping"


# -- ordering ---------------------------------------------------------------------------------


async def test_pipelined_responses_come_back_in_request_order(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    sleeps = [0.08, 0.0, 0.04, 0.0, 0.02, 0.0]
    await client.stream.send_all(b"".join(client.frame({"n": i, "sleep": s}) for i, s in enumerate(sleeps)))
    responses = await client.receive(len(sleeps))
    assert [cid for cid, _ in responses] == list(range(len(sleeps)))
    assert [body["n"] for _, body in responses] == list(range(len(sleeps)))
    assert handler.finished != list(range(len(sleeps)))  # they did finish out of order
    await assert_serves(bystander)


async def test_none_responses_are_skipped_without_holding_back_later_ones(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    frames = [client.frame({"n": 0, "sleep": 0.05, "no_response": True}, expect_response=False),
              client.frame({"n": 1}),
              client.frame({"n": 2, "no_response": True}, expect_response=False),
              client.frame({"n": 3, "sleep": 0.02})]
    await client.stream.send_all(b"".join(frames))
    responses = await client.receive(2)
    assert [body["n"] for _, body in responses] == [1, 3]
    assert client.conn.in_flight == 0
    assert (await client.call({"n": 4}))["n"] == 4
    await assert_serves(bystander)


async def test_many_requests_in_one_segment_are_answered_in_order_with_few_writes(net, monkeypatch):
    server, handler, bystander = await net.start(max_in_flight_per_connection=1000)
    client = await net.connect(server.port)
    writes = 0
    original = trio.SocketStream.send_all

    async def counting_send_all(self, data):
        nonlocal writes
        writes += 1
        await original(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counting_send_all)
    await client.stream.send_all(b"".join(client.frame({"n": i}) for i in range(500)))
    responses = await client.receive(500)
    assert [body["n"] for _, body in responses] == list(range(500))
    assert writes < 50, f"{writes} writes for 500 responses: they are not coalesced"
    assert server.stats().requests_handled[ApiKey.METADATA] == 500
    await assert_serves(bystander)


async def test_the_handler_is_called_in_request_order(net):
    order = []

    def handler(context, body):  # the synchronous part runs in request order
        order.append(body["n"])
        return _later(body)

    async def _later(body):
        await trio.sleep(random.random() / 100)
        return {"n": body["n"]}

    server, _, bystander = await net.start(handler)
    client = await net.connect(server.port)
    await client.stream.send_all(b"".join(client.frame({"n": i}) for i in range(300)))
    responses = await client.receive(300)
    assert order[:300] == list(range(300))
    assert [body["n"] for _, body in responses] == list(range(300))
    await assert_serves(bystander)


async def test_a_handler_may_return_the_response_directly(net):
    server, _, bystander = await net.start(lambda header, body: {"direct": body["n"]})
    assert await bystander.call({"n": 7}) == {"direct": 7}


# -- back-pressure ------------------------------------------------------------------------------


async def test_requests_in_flight_per_connection_are_bounded(net):
    server, handler, bystander = await net.start(max_in_flight_per_connection=4)
    client = await net.connect(server.port)
    await client.stream.send_all(b"".join(client.frame({"n": i, "wait": True}) for i in range(20)))
    await trio.sleep(0.2)
    assert sorted(handler.called) == [0, 1, 2, 3]  # the others wait, read or not
    assert server.stats().request_queue_time_s == 0  # none has waited for room yet
    handler.gate.set()
    responses = await client.receive(20)
    assert [body["n"] for _, body in responses] == list(range(20))
    assert server.stats().request_queue_time_s > 0  # read ones waited for room: counted as queue time
    await assert_serves(bystander)


async def test_a_client_that_never_reads_cannot_make_the_server_buffer_without_bound(net):
    server, handler, bystander = await net.start(max_in_flight_per_connection=4)
    slow = await net.connect(server.port)
    blob = 256 * 1024
    await slow.stream.send_all(b"".join(slow.frame({"n": i, "blob": blob}) for i in range(400)))
    await trio.sleep(0.5)
    called = len(handler.called)
    # What the kernel's socket buffers hold (a few MiB) plus the in-flight bound; not 400.
    assert called < 100, f"{called} responses of {blob} bytes produced for a client that does not read"
    await assert_serves(bystander)
    await trio.sleep(0.2)
    assert len(handler.called) == called + 1  # only the bystander's request since
    await slow.stream.aclose()
    await assert_serves(bystander)


# -- hostile input ------------------------------------------------------------------------------


async def test_random_bytes_never_affect_other_connections(net):
    server, handler, bystander = await net.start(max_frame_bytes=4096)
    rng = random.Random(1234)
    for _ in range(30):
        hostile = await trio.open_tcp_stream("127.0.0.1", server.port)
        try:
            await hostile.send_all(rng.randbytes(rng.randrange(1, 3000)))
            with trio.move_on_after(0.05):
                await hostile.receive_some(65536)
        except trio.BrokenResourceError:
            pass
        await hostile.aclose()
        await assert_serves(bystander)
    assert handler.called == ["ping"] * 30  # random bytes never made a valid request here


async def test_an_oversize_length_prefix_closes_the_connection_at_once(net):
    server, handler, bystander = await net.start(max_frame_bytes=1024)
    client = await net.connect(server.port)
    # A valid request first: it is answered. Then a prefix announcing 2 GiB, and no body: the
    # server must not wait for (or buffer) the body before closing.
    await client.stream.send_all(client.frame({"n": 1}) + struct.pack(">I", 2**31) + b"\x92" * 16)
    [(_, body)] = await client.receive(1)
    assert body["n"] == 1
    assert await client.closed_by_server()
    assert server.stats().invalid_requests == 1
    await assert_serves(bystander)


async def test_a_frame_just_over_the_bound_closes_the_connection(net):
    server, handler, bystander = await net.start(max_frame_bytes=1024)
    client = await net.connect(server.port)
    await client.send({"n": 1, "pad": "x" * 1024})
    assert await client.closed_by_server()
    assert handler.called == []
    await assert_serves(bystander)


async def test_a_malformed_envelope_with_an_id_is_answered_and_the_connection_goes_on(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port, first_correlation_id=77)
    client.frame({})  # the client now expects a response to id 77; send a broken one instead
    await client.stream.send_all(encode_frame(msgpack.packb([int(ApiKey.METADATA), 0, 77, "c", "not a map"])))
    [(cid, body)] = await client.receive(1)
    assert cid == 77 and body["error_code"] == INVALID_REQUEST.code
    assert "body" in body["error_message"]
    assert (await client.call({"n": 78}))["n"] == 78
    assert handler.called == [78]
    await assert_serves(bystander)


async def test_an_envelope_without_a_readable_id_closes_the_connection(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    await client.stream.send_all(encode_frame(b"\xc1 not msgpack"))
    assert await client.closed_by_server()
    assert handler.called == []
    await assert_serves(bystander)


async def test_unknown_api_keys_and_versions_get_unsupported_version(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    unknown_key = await client.call({"n": 1}, api_key=999)
    unknown_version = await client.call({"n": 2}, api_key=ApiKey.METADATA, version=99)
    not_served = await client.call({"n": 3}, api_key=ApiKey.SASL_HANDSHAKE, version=9)  # a served key
    assert unknown_key["error_code"] == unknown_version["error_code"] == not_served["error_code"] \
        == UNSUPPORTED_VERSION.code
    assert "999" in unknown_key["error_message"] and "99" in unknown_version["error_message"]
    assert "SASL_HANDSHAKE" in not_served["error_message"]
    assert handler.called == []
    assert server.stats().requests_handled[999] == 1
    await assert_serves(bystander)


async def test_a_failing_handler_gets_an_error_response_and_the_connection_goes_on(net, caplog):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    with caplog.at_level(logging.ERROR, logger="tidelog.broker.network"):
        unexpected = await client.call({"n": 1, "raise": "runtime"})
    assert unexpected == {"error_code": UNKNOWN_SERVER_ERROR.code,
                          "error_message": UNKNOWN_SERVER_ERROR.message}  # internals not leaked
    assert "secret internals" in caplog.text and "Traceback" in caplog.text
    expected = await client.call({"n": 2, "raise": "not_leader"})
    assert expected == {"error_code": NOT_LEADER_OR_FOLLOWER.code,
                        "error_message": "not the leader of t-0"}
    assert (await client.call({"n": 3}))["n"] == 3
    assert server.stats().handler_errors == 1
    await assert_serves(bystander)


async def test_a_handler_failing_before_its_first_await_or_returning_garbage_is_contained(net):
    def handler(context, body):
        if body["n"] == "sync-raise":
            raise ValueError("broken")
        if body["n"] == "garbage":
            return {"value": object()}  # does not encode
        return {"n": body["n"]}

    server, _, bystander = await net.start(handler)
    client = await net.connect(server.port)
    await client.stream.send_all(client.frame({"n": "sync-raise"}) + client.frame({"n": "garbage"})
                                 + client.frame({"n": "fine"}))
    bodies = [body for _, body in await client.receive(3)]
    assert [b.get("error_code") for b in bodies] == [UNKNOWN_SERVER_ERROR.code] * 2 + [None]
    assert bodies[2] == {"n": "fine"}
    await assert_serves(bystander)


# -- closing ------------------------------------------------------------------------------------


async def test_idle_connections_are_closed_but_busy_ones_are_not(net):
    server, handler, bystander = await net.start(idle_timeout_ms=400)
    idle = await net.connect(server.port)
    busy = await net.connect(server.port)
    await busy.send({"n": "long poll", "sleep": 0.8})  # longer than the idle timeout
    start_time = trio.current_time()
    for _ in range(12):  # the bystander stays active meanwhile
        await trio.sleep(0.1)
        await assert_serves(bystander)
    assert await idle.closed_by_server()
    [(_, body)] = await busy.receive(1)
    assert body["n"] == "long poll"
    assert await busy.closed_by_server()  # idle from then on
    assert trio.current_time() - start_time < 3
    await assert_serves(bystander)


async def test_an_idle_connection_closes_one_to_one_and_an_eighth_timeouts_after_its_activity(
        net, autojump_clock):
    server, _, _ = await net.start(idle_timeout_ms=800)
    client = await net.connect(server.port)
    await trio.sleep(0.35)
    assert (await client.call({"n": 1}))["n"] == 1
    last_activity = trio.current_time()
    assert await client.closed_by_server()
    assert 0.8 <= trio.current_time() - last_activity <= 0.9


async def test_a_client_that_stopped_reading_is_closed_as_idle_during_a_graceful_shutdown(net):
    server, _, _ = await net.start(idle_timeout_ms=400, max_in_flight_per_connection=4)
    slow = await net.connect(server.port)
    await slow.stream.send_all(b"".join(slow.frame({"n": i, "blob": 256 * 1024}) for i in range(200)))
    await trio.sleep(0.3)  # the writer blocks: the client reads nothing
    with trio.fail_after(TIMEOUT_S):  # not the shutdown deadline's 60 s
        await server.aclose(60)
    assert server.stats().connections_open == 0


async def test_requests_read_are_answered_when_shutdown_comes_while_they_wait_for_room(net):
    """``stop_reading`` ends a wait to read, never the start of requests already read."""
    server, handler, _ = await net.start(max_in_flight_per_connection=2)
    client = await net.connect(server.port)
    await client.stream.send_all(b"".join(client.frame({"n": i, "wait": True}) for i in range(5)))
    await until(lambda: len(handler.called) == 2)
    async with trio.open_nursery() as inner:
        inner.start_soon(server.aclose, 10)
        await trio.sleep(0.05)
        handler.gate.set()
        responses = await client.receive(5)
    assert [body["n"] for _, body in responses] == list(range(5))
    assert await client.closed_by_server()


async def test_a_client_that_stops_sending_still_gets_its_responses(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    await client.stream.send_all(client.frame({"n": 1, "sleep": 0.05}) + client.frame({"n": 2}))
    await client.stream.send_eof()
    assert [body["n"] for _, body in await client.receive(2)] == [1, 2]
    assert await client.closed_by_server()
    await assert_serves(bystander)


async def test_graceful_shutdown_finishes_in_flight_requests(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    await client.send({"n": 1, "sleep": 0.2})
    await trio.sleep(0.05)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as inner:
            inner.start_soon(server.aclose, 10)
            [(_, body)] = await client.receive(1)
    assert body["n"] == 1
    assert await client.closed_by_server() and await bystander.closed_by_server()
    with pytest.raises(OSError):
        await trio.open_tcp_stream("127.0.0.1", server.port)


async def test_shutdown_deadline_cuts_off_requests_that_take_too_long(net):
    server, handler, bystander = await net.start()
    client = await net.connect(server.port)
    await client.send({"n": 1, "sleep": 60})
    await trio.sleep(0.05)
    with trio.fail_after(2):
        await server.aclose(0.2)
    assert await client.closed_by_server()
    assert server.stats().connections_open == 0


async def test_cancelling_run_closes_everything(net):
    handler = Handler()
    server = SocketServer(handler, port=0)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:
            await inner.start(server.run)
            client = await net.connect(server.port)
            await client.send({"n": 1, "sleep": 60})
            await trio.sleep(0.05)
            scope.cancel()
    assert await client.closed_by_server()


async def test_a_port_in_use_is_named_in_the_error(net):
    """The system says only "Address already in use": the broker's one-line start failure
    (broker/main.py) must say which listener and address."""
    taken = SocketServer(Handler(), host="127.0.0.1", port=0)
    port = await net.nursery.start(taken.run)
    with pytest.raises(OSError, match=rf"listener \S+ cannot listen on 127.0.0.1:{port}: .*in use"):
        await SocketServer(Handler(), host="127.0.0.1", port=port).run()


# -- configuration and stats --------------------------------------------------------------------


async def test_from_config_and_stats(net):
    config = BrokerConfig.from_props({"broker.id": 1, "zookeeper.connect": "zk:2181",
                                      "listeners": "PLAINTEXT://127.0.0.1:0",
                                      "queued.max.requests": 7, "socket.request.max.bytes": 2048,
                                      "connections.max.idle.ms": 5000})
    server = SocketServer.from_config(config, Handler())
    assert (server.max_in_flight_per_connection, server.max_frame_bytes, server.idle_timeout_s) == (7, 2048, 5)
    await net.nursery.start(server.run)
    clients = [await net.connect(server.port) for _ in range(3)]
    for c in clients:
        await assert_serves(c)
    stats = server.stats()
    assert stats.connections_open == stats.connections_accepted == 3
    assert stats.requests_handled == {ApiKey.METADATA: 3}
    await clients[0].stream.aclose()
    with trio.fail_after(TIMEOUT_S):
        while server.stats().connections_open != 2:
            await trio.sleep(0.01)


def test_request_frames_are_what_the_server_expects():
    # guards the raw frames above: the envelope as protocol.messages encodes it
    frame = encode_request(RequestHeader(ApiKey.METADATA, 0, 77, "c"), {})
    assert msgpack.unpackb(frame) == [int(ApiKey.METADATA), 0, 77, "c", {}]


# -- deferred responses (answered by a callback, no task) -------------------------------------


class Deferred(DeferredResponse):
    def __init__(self, n) -> None:
        self.n = n
        self.complete = None
        self.cancelled = False

    def attach(self, complete) -> None:
        self.complete = complete

    def cancel(self) -> None:
        self.cancelled = True


class DeferringHandler:
    """Synchronous: ``{"deferred": True}`` gets a Deferred (kept in ``waiting``), others an answer."""

    def __init__(self) -> None:
        self.waiting: list[Deferred] = []

    def __call__(self, context: RequestContext, body: dict):
        if body.get("deferred"):
            d = Deferred(body["n"])
            self.waiting.append(d)
            return d
        return {"n": body["n"]}


async def until(predicate) -> None:
    with trio.fail_after(TIMEOUT_S):
        while not predicate():
            await trio.sleep(0.005)


async def test_a_deferred_response_is_written_when_completed_and_keeps_request_order(net):
    handler = DeferringHandler()
    server, _, bystander = await net.start(handler)
    client = await net.connect(server.port)
    await client.stream.send_all(client.frame({"n": 0, "deferred": True}) + client.frame({"n": 1}))
    await until(lambda: handler.waiting and handler.waiting[0].complete)
    await assert_serves(bystander)
    with trio.move_on_after(0.1):
        await client.receive(1)
        raise AssertionError("the answer to request 1 overtook the deferred request 0")
    handler.waiting[0].complete({"n": 0, "late": True})  # synchronously, as an append would
    responses = await client.receive(2)
    assert [body for _, body in responses] == [{"n": 0, "late": True}, {"n": 1}]


async def one_deferred_request(net, n: int):
    """A server with a DeferringHandler, and a client whose request ``n`` waits, deferred."""
    handler = DeferringHandler()
    server, _, bystander = await net.start(handler)
    client = await net.connect(server.port)
    await client.send({"n": n, "deferred": True})
    await until(lambda: handler.waiting and handler.waiting[0].complete)
    return server, handler.waiting[0], client, bystander


async def test_a_stop_that_comes_while_the_readers_wake_up_is_on_its_way_starts_nothing_more(net):
    """The reader waits for room (one request in flight) with two more requests unread; the
    deferred answer wakes it, and shutdown comes before it runs: it reads nothing more, so
    no request is started that the closing connection would leave unanswered."""
    handler = DeferringHandler()
    server, _, _ = await net.start(handler, max_in_flight_per_connection=1)
    client = await net.connect(server.port)
    await client.send({"n": 0, "deferred": True})
    await until(lambda: handler.waiting and handler.waiting[0].complete)
    await client.stream.send_all(client.frame({"n": 1, "deferred": True}) + client.frame({"n": 2, "deferred": True}))
    await trio.sleep(0.05)  # the reader waits for room, 1 and 2 unread
    [connection] = [c for c in server._connections if c._pending]
    handler.waiting[0].complete({"n": 0})  # wakes the reader...
    connection.stop_reading()  # ...and the stop comes before it runs
    [(_, body)] = await client.receive(1)
    assert body == {"n": 0}
    assert await client.closed_by_server()
    assert [d.n for d in handler.waiting] == [0]


async def test_graceful_shutdown_waits_for_deferred_responses(net):
    server, waiting, client, _ = await one_deferred_request(net, 7)
    async with trio.open_nursery() as inner:
        inner.start_soon(server.aclose, 10)
        await trio.sleep(0.1)
        assert not waiting.cancelled
        waiting.complete({"n": 7})
        [(_, body)] = await client.receive(1)
    assert body == {"n": 7}
    assert await client.closed_by_server()


async def test_a_client_gone_with_a_deferred_request_is_contained(net):
    server, waiting, client, bystander = await one_deferred_request(net, 1)
    await trio.aclose_forcefully(client.stream)
    await trio.sleep(0.05)
    waiting.complete({"n": 1})  # written into a closed connection: contained
    await assert_serves(bystander)
    await until(lambda: len(server._connections) == 1)


async def test_the_shutdown_deadline_cancels_deferred_requests_and_late_answers_are_ignored(net):
    server, waiting, client, _ = await one_deferred_request(net, 1)
    with trio.fail_after(TIMEOUT_S):
        await server.aclose(0.2)
    assert waiting.cancelled
    waiting.complete({"n": 1})  # nothing raised, nothing written
    assert await client.closed_by_server()


async def test_a_deferred_answer_that_fails_to_write_still_ends_its_request(net):
    """Whatever raises while a deferred answer is queued and written (the completer logs it),
    the request no longer counts as running: the connection can go idle and close."""
    server, waiting, client, bystander = await one_deferred_request(net, 3)
    [connection] = [c for c in server._connections if c._deferred]

    def broken() -> bool:
        raise RuntimeError("the write broke")

    connection._write_now = broken
    with pytest.raises(RuntimeError, match="the write broke"):
        waiting.complete({"n": 3})
    assert connection._running == 0 and not connection._deferred
    assert connection._deferred_done.is_set()
    await assert_serves(bystander)


async def test_a_request_answered_by_closing_ends_its_connection_after_the_answers_before_it(net):
    # an acks=0 produce that failed has no response: the connection ends instead
    def handler(context, body):
        return CLOSE_CONNECTION if body.get("close") else {"n": body["n"]}

    server, _, bystander = await net.start(handler)
    client = await net.connect(server.port)
    await client.stream.send_all(client.frame({"n": 1}) + client.frame({"n": 2, "close": True}))
    [(_, body)] = await client.receive(1)
    assert body == {"n": 1}
    assert await client.closed_by_server()
    await assert_serves(bystander)


async def test_a_direct_response_that_woke_a_task_is_written_after_that_tasks_response(net, monkeypatch):
    """A produce acknowledgement waits for the long polls its append woke (their responses are
    written first); one that woke nothing is written by the reader itself."""
    gate = trio.Event()

    def handler(context, body):
        if body.get("wait"):
            return _woken(body)
        if body.get("open"):
            gate.set()
        return {"n": body["n"]}

    async def _woken(body):
        await gate.wait()
        return {"n": body["n"]}

    import tidelog.broker.network as network
    written: list[bytes] = []
    original = network.os.write

    def recording_write(fd, data):
        written.append(bytes(data))
        return original(fd, data)

    server, _, bystander = await net.start(handler)
    waiter = await net.connect(server.port)
    waker = await net.connect(server.port)
    await waiter.send({"n": "woken", "wait": True})
    await until(lambda: gate.statistics().tasks_waiting == 1)
    monkeypatch.setattr(network.os, "write", recording_write)
    await waker.send({"n": "waker", "open": True})
    assert [body["n"] for _, body in await waiter.receive()] == ["woken"]
    assert [body["n"] for _, body in await waker.receive()] == ["waker"]
    order = [name for w in written for name in (b"woken", b"waker") if name in w]
    assert order == [b"woken", b"waker"], order
    written.clear()
    assert (await waker.call({"n": "alone"}))["n"] == "alone"
    assert any(b"alone" in w for w in written)
    await assert_serves(bystander)
