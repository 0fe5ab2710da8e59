"""The socket server's budgets over real loopback TCP: the request memory budget
(``queued.max.request.bytes``), large frames decoded off the event loop in request order,
and the connection limits (``max.connections``, ``max.connections.per.ip``)."""

from __future__ import annotations

import struct

import pytest
import trio

from tests.component.broker.test_network import Client, DeferringHandler, Handler, Harness
from tidelog.broker.network import DECODE_INLINE_MAX_BYTES, RESERVE_ABOVE_BYTES
from tidelog.protocol.codec import ApiKey

BUDGET = 300_000


@pytest.fixture
async def net(nursery):
    harness = Harness(nursery)
    yield harness
    for client in harness.clients:
        await trio.aclose_forcefully(client.stream)


async def _until(predicate, timeout_s: float = 5.0) -> None:
    with trio.fail_after(timeout_s):
        while not predicate():
            await trio.sleep(0.01)


def _padded(client: Client, n: int, size: int) -> bytes:
    """A request frame of about ``size`` bytes."""
    return client.frame({"n": n, "pad": b"p" * size})


async def test_large_frames_reserve_the_budget_and_wait_for_it_while_small_ones_pass(net):
    server, handler, bystander = await net.start(queued_max_request_bytes=BUDGET)
    first, second = await net.connect(server.port), await net.connect(server.port)
    frame_a, frame_b = _padded(first, 1, 200_000), _padded(second, 2, 200_000)
    await first.stream.send_all(frame_a[:100_000])  # prefix and half of the body: then it stalls
    await _until(lambda: server.stats().request_bytes_reserved == len(frame_a) - 4)
    await second.stream.send_all(frame_b[:100_000])  # does not fit next to the first: waits
    for n in range(20):  # small requests reserve nothing and keep being served
        assert (await bystander.call({"n": 100 + n}))["n"] == 100 + n
    assert server.stats().request_bytes_reserved == len(frame_a) - 4
    assert handler.called.count(2) == 0
    await first.stream.send_all(frame_a[100_000:])
    assert (await first.receive())[0][1]["n"] == 1
    # the first response is written: its bytes are released and the second frame gets them
    await _until(lambda: server.stats().request_bytes_reserved == len(frame_b) - 4)
    await second.stream.send_all(frame_b[100_000:])
    assert (await second.receive())[0][1]["n"] == 2
    await _until(lambda: server.stats().request_bytes_reserved == 0)


async def test_a_deferred_request_gives_its_reservation_back_once_handed_to_its_handler(net):
    """A long poll (or an acks=all wait) holds its decoded request, not its frame: large
    waiting requests must not pin the budget that every connection's large frames share."""
    handler = DeferringHandler()
    server, _, _ = await net.start(handler, queued_max_request_bytes=BUDGET)
    poller, other = await net.connect(server.port), await net.connect(server.port)
    await poller.send({"n": 1, "deferred": True, "pad": b"p" * 200_000})
    await _until(lambda: handler.waiting and handler.waiting[0].complete)
    assert server.stats().request_bytes_reserved == 0
    await other.send({"n": 2, "pad": b"q" * 150_000})  # would not fit next to the first
    assert (await other.receive())[0][1] == {"n": 2}
    handler.waiting[0].complete({"n": 1})
    assert (await poller.receive())[0][1] == {"n": 1}
    assert server.stats().request_bytes_reserved == 0


async def test_a_request_whose_handler_task_hands_over_a_deferred_gives_its_reservation_back(net):
    """A large acks=all produce validated in a worker thread: its handler's task appends, then
    the wait for replication is a deferred response, which holds no frame."""
    from tests.component.broker.test_network import Deferred

    waiting: list = []

    def handler(context, body):
        async def validated_then_appended():
            await trio.sleep(0)
            waiting.append(Deferred(body["n"]))
            return waiting[-1]
        return validated_then_appended() if body.get("deferred") else {"n": body["n"]}

    server, _, _ = await net.start(handler, queued_max_request_bytes=BUDGET)
    producer, other = await net.connect(server.port), await net.connect(server.port)
    await producer.send({"n": 1, "deferred": True, "pad": b"p" * 200_000})
    await _until(lambda: waiting and waiting[0].complete)
    assert server.stats().request_bytes_reserved == 0
    await other.send({"n": 2, "pad": b"q" * 150_000})  # would not fit next to the first
    assert (await other.receive())[0][1] == {"n": 2}
    waiting[0].complete({"n": 1, "replicated": True})
    assert (await producer.receive())[0][1] == {"n": 1, "replicated": True}


async def test_a_muted_connection_reserves_for_a_large_frame_only_once_its_throttle_passed(net):
    """KIP-219: a connection muted after a throttled answer is not read meanwhile (Kafka mutes
    the channel), so a large frame it sends does not hold the shared budget for the throttle."""
    from tidelog.broker.deferred import Throttled

    def handler(context, body):
        return Throttled({"n": body["n"]}, 60_000) if body["n"] == 1 else {"n": body["n"]}

    server, _, _ = await net.start(handler, queued_max_request_bytes=BUDGET)
    muted, other = await net.connect(server.port), await net.connect(server.port)
    assert (await muted.call({"n": 1})) == {"n": 1}
    async with trio.open_nursery() as sending:  # its send waits: the server reads no more of it
        sending.start_soon(muted.stream.send_all, _padded(muted, 2, 200_000))
        await trio.sleep(0.2)  # the time to read its first part, and reserve, were it read
        assert server.stats().request_bytes_reserved == 0
        await other.send({"n": 3, "pad": b"q" * 150_000})  # would not fit next to the muted one's
        assert (await other.receive())[0][1] == {"n": 3}
        sending.cancel_scope.cancel()


async def test_a_frame_larger_than_the_budget_is_refused_from_its_prefix(net):
    server, _, bystander = await net.start(queued_max_request_bytes=BUDGET)
    hostile = await net.connect(server.port)
    await hostile.stream.send_all(struct.pack(">I", BUDGET + 1) + b"x" * 1000)
    assert await hostile.closed_by_server()
    assert server.stats().request_bytes_reserved == 0
    assert (await bystander.call({"n": 1}))["n"] == 1


async def test_a_connection_closed_mid_frame_gives_its_reservation_back(net):
    server, _, bystander = await net.start(queued_max_request_bytes=BUDGET)
    quitter = await net.connect(server.port)
    await quitter.stream.send_all(_padded(quitter, 1, 200_000)[:150_000])
    await _until(lambda: server.stats().request_bytes_reserved > RESERVE_ABOVE_BYTES)
    await quitter.stream.aclose()
    await _until(lambda: server.stats().request_bytes_reserved == 0)
    assert (await bystander.call({"n": 2}))["n"] == 2


class OrderedHandler:
    """Like produce: a plain function that does its work (records the call) before returning."""

    def __init__(self) -> None:
        self.called: list[int] = []

    def __call__(self, context, body: dict):
        self.called.append(body["n"])
        return {"n": body["n"], "size": len(body.get("pad", b""))}


async def test_a_large_frame_decoded_off_the_loop_keeps_handler_and_response_order(net):
    handler = OrderedHandler()
    server, _, _ = await net.start(handler)
    client = await net.connect(server.port)
    big = 4 * DECODE_INLINE_MAX_BYTES
    order = [0, 1, 2, 6, 3, 4, 5]  # 0 and 6 large, the others small
    frames = [_padded(client, n, big) if n in (0, 6) else client.frame({"n": n}, api_key=ApiKey.PRODUCE)
              for n in order]
    await client.stream.send_all(b"".join(frames))  # all pipelined in one write
    responses = await client.receive(len(frames))
    assert [body["n"] for _, body in responses] == order
    assert handler.called == order
    assert responses[0][1]["size"] == big


async def test_max_connections_closes_the_newest_at_once(net):
    server, _, bystander = await net.start(max_connections=3)
    others = [await net.connect(server.port) for _ in range(2)]
    for i, client in enumerate(others):
        assert (await client.call({"n": i}))["n"] == i
    extra = await net.connect(server.port)
    assert await extra.closed_by_server()
    assert server.stats().connections_refused == 1
    await others[0].stream.aclose()
    await _until(lambda: server.stats().connections_open == 2)
    late = await net.connect(server.port)
    assert (await late.call({"n": 7}))["n"] == 7
    assert (await bystander.call({"n": 8}))["n"] == 8


async def test_max_connections_per_ip_and_its_overrides(net):
    server, _, bystander = await net.start(max_connections_per_ip=2)
    second = await net.connect(server.port)
    assert (await second.call({"n": 1}))["n"] == 1
    assert await (await net.connect(server.port)).closed_by_server()
    roomy, _, _ = await net.start(max_connections_per_ip=1,
                                  max_connections_per_ip_overrides={"127.0.0.1": 3})
    clients = [await net.connect(roomy.port) for _ in range(2)]  # 3 with the bystander
    for i, client in enumerate(clients):
        assert (await client.call({"n": i}))["n"] == i
    assert await (await net.connect(roomy.port)).closed_by_server()
    assert (await bystander.call({"n": 9}))["n"] == 9


def test_the_budget_caps_the_frame_size():
    from tidelog.broker.network import SocketServer
    assert SocketServer(Handler(), max_frame_bytes=10_000, queued_max_request_bytes=5_000).max_frame_bytes == 5_000
    assert SocketServer(Handler(), max_frame_bytes=10_000, queued_max_request_bytes=-1).max_frame_bytes == 10_000


def test_a_budget_of_zero_or_below_is_no_bound():
    """Kafka's queued.max.request.bytes: <= 0 is unbounded (at 0 every frame used to be too large)."""
    from tidelog.broker.config import BrokerConfig
    from tidelog.broker.network import SocketServer
    for budget in (0, -1, -7):
        config = BrokerConfig.from_props({"broker.id": 1, "zookeeper.connect": "zk:2181",
                                          "queued.max.request.bytes": budget})
        server = SocketServer.from_config(config, Handler())
        assert server.max_frame_bytes == config.socket_request_max_bytes and not server.pool.bounded


async def test_out_of_descriptors_at_accept_sheds_the_newest_connections(net):
    import errno

    from tidelog.broker.network import RESERVED_DESCRIPTORS, SHED_ON_EMFILE
    server, _, bystander = await net.start()
    clients = [await net.connect(server.port) for _ in range(SHED_ON_EMFILE + 2)]
    for i, client in enumerate(clients):
        assert (await client.call({"n": i}))["n"] == i
    assert len(server._reserve) == RESERVED_DESCRIPTORS
    server._accept_failed(OSError(errno.EMFILE, "Too many open files"))
    assert server._reserve == []  # given up for the broker's own files
    for client in clients[-SHED_ON_EMFILE:]:
        assert await client.closed_by_server()
    for i, client in enumerate([bystander, *clients[:-SHED_ON_EMFILE]]):  # the oldest are kept
        assert (await client.call({"n": 10 + i}))["n"] == 10 + i
    newcomer = await net.connect(server.port)  # accepting goes on, and takes the reserve back
    assert (await newcomer.call({"n": 99}))["n"] == 99
    assert len(server._reserve) == RESERVED_DESCRIPTORS
