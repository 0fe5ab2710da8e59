"""Latency on a link without tc's netem: TCP relays that hold every chunk for a set delay.

A ``DelayRelay`` listens on one address and port and connects each connection it accepts to
one target. Each direction of a relayed connection is a delay line: a reader task stamps
every chunk it receives with a due time (``DelayLine``: the moment it was read plus the
relay's current one-way delay, never before the chunk read ahead of it), puts it on a bounded
queue, and a writer task sends each chunk once it is due. Chunks are neither merged nor
reordered, and the reader keeps reading while earlier chunks wait: the delay adds latency to
every byte without limiting throughput (as a long cable would), up to the queue's bound,
past which the reader waits and TCP's own flow control pushes back on the sender.

A delay changed while chunks are queued applies to the chunks read from then on; the ones
already queued keep their due times, so lowering the delay drains the queue in order instead
of letting new bytes overtake old ones.

An end of stream is passed on once every chunk before it was sent (a half close, as TCP
has); a reset or error on either side closes both sides of that connection. Every relay of a
``RelayGroup`` runs on one Trio loop in one thread of the test process; ``set_delay`` and the
byte counters are read and written from the test's threads (a float or an int at a time).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterable

import trio

CHUNK_BYTES = 65536
QUEUED_CHUNKS = 1024      # per direction of one connection: at most 64 MiB held by a delay line
CONNECT_TIMEOUT_S = 5.0   # to the target; on failure the accepted connection is closed


class DelayLine:
    """Due times for the chunks of one direction of a connection (pure; time passed in)."""

    def __init__(self) -> None:
        self.last_due = float("-inf")

    def due(self, now: float, delay_s: float) -> float:
        """A chunk read at ``now`` is due ``delay_s`` later, and never before the chunk read
        ahead of it (a delay lowered meanwhile must not reorder the stream)."""
        self.last_due = max(now + delay_s, self.last_due)
        return self.last_due


class DelayRelay:
    """One listening socket, one target; every connection it carries gets ``delay_s``."""

    def __init__(self, name: str, listen_host: str, target_host: str, target_port: int):
        self.name = name
        self.target = (target_host, target_port)
        self.delay_s = 0.0
        self.connections = 0     # accepted since the start
        self.bytes_relayed = 0   # both directions, counted when sent on
        self._sock = socket.create_server((listen_host, 0), backlog=64)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]

    def set_delay(self, delay_ms: float) -> None:
        self.delay_s = delay_ms / 1000

    async def serve(self) -> None:
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self._sock))
        await trio.serve_listeners(self._relay, [listener])

    async def _relay(self, inbound: trio.SocketStream) -> None:
        self.connections += 1
        async with inbound:
            outbound = None
            with trio.move_on_after(CONNECT_TIMEOUT_S), contextlib.suppress(OSError):
                outbound = await trio.open_tcp_stream(*self.target)
            if outbound is None:
                return  # the target is down or cut off: its client sees the connection close
            async with outbound, trio.open_nursery() as nursery:
                nursery.start_soon(self._direction, inbound, outbound, nursery.cancel_scope)
                nursery.start_soon(self._direction, outbound, inbound, nursery.cancel_scope)

    async def _direction(self, source: trio.SocketStream, sink: trio.SocketStream,
                         connection: trio.CancelScope) -> None:
        send, receive = trio.open_memory_channel[tuple[float, bytes]](QUEUED_CHUNKS)
        line = DelayLine()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._deliver, receive, sink)
                async with send:
                    while chunk := await source.receive_some(CHUNK_BYTES):
                        await send.send((line.due(trio.current_time(), self.delay_s), chunk))
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            connection.cancel()  # a reset on one side ends both: nothing more can be relayed

    async def _deliver(self, receive: trio.MemoryReceiveChannel[tuple[float, bytes]],
                       sink: trio.SocketStream) -> None:
        async with receive:
            async for due, chunk in receive:
                await trio.sleep_until(due)
                await sink.send_all(chunk)
                self.bytes_relayed += len(chunk)
        await sink.send_eof()

    def close(self) -> None:
        self._sock.close()


class RelayGroup:
    """Relays served on one Trio loop in a thread of their own, from ``start`` to ``close``."""

    def __init__(self, relays: Iterable[DelayRelay]):
        self.relays = list(relays)
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self.error: BaseException | None = None  # what stopped the loop, if not ``close``
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delay-relays", daemon=True)

    def start(self, timeout: float = 10.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout):
            raise RuntimeError(f"the delay relays did not start within {timeout:g} s")

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # noqa: BLE001 -- reported by ``close``
            self.error = e

    async def _main(self) -> None:
        with trio.CancelScope() as scope:
            self._token, self._scope = trio.lowlevel.current_trio_token(), scope
            async with trio.open_nursery() as nursery:
                for relay in self.relays:
                    nursery.start_soon(relay.serve)
                self._started.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop serving and close every relayed connection. Idempotent."""
        if self._token is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
            self._thread.join(timeout)
        for relay in self.relays:
            relay.close()
        if self.error is not None:
            print(f"the delay relays stopped on an error: {self.error!r}", flush=True)
