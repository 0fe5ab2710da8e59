"""The broker's socket server: TCP connections in, requests to a handler, responses out.

Theory of operation. ``SocketServer.run`` binds the listener and accepts connections; each
connection is one ``_Connection`` driving a sans-IO ``protocol.connection.ServerConnection``
(which decides everything about framing, envelopes and response order). Per connection:

* **One reader.** The connection's own task reads with ``receive_some`` and feeds the bytes to
  ``ServerConnection.receive_data``. For each parsed request it calls the handler itself, in
  request order: ``handler(context, body)``, where the context (``broker.context``) carries
  the header, the peer's address and the listener. An ``async def`` handler returns a coroutine at
  once; a plain function may do its order-sensitive work (a log append, say) before it
  returns, so that work happens in the order the client sent the requests, and return the
  response or an awaitable of it. An awaitable is awaited in the request's own task in the
  connection's nursery, so requests are handled concurrently; a response returned at once
  (a produce with acks 0 or 1) is answered by the reader itself, with no handler task, and
  written at once, or, when the request woke tasks (a follower's long poll), on the next
  scheduler pass, after them. A handler may
  also return a ``broker.deferred.DeferredResponse`` (a consumer's long-poll fetch): it gets
  no task; the connection attaches a completion callback, and whoever satisfies the
  operation (the append that gives a waiting fetch its bytes, or the expiry timer) answers
  it synchronously, in that scheduler pass. When the connection closes first, the deferred
  operations are cancelled and a later completion is ignored. The reader
  reads with ``os.read`` and waits for the socket only when nothing is there (a Trio
  ``receive_some`` yields to the scheduler even when data is waiting; for small requests
  those round trips cost more than the request), yielding every ``YIELD_EVERY`` reads.
* **Responses in request order.** A handler's result goes to ``ServerConnection``, which parks
  a response until every older one is ready and hands out the bytes that may be written now
  (``send_response``; ``skip_response`` when the handler returns None, as for acks=0). Those
  bytes are appended to the connection's outbox.
* **One locked writer.** Whoever finishes a response and finds the write lock free becomes the
  writer: it sends the whole outbox in one ``send_all`` and repeats while responses keep
  arriving, so responses that become ready together leave in one syscall (notes/LIMITS.md).
  A task that finds the lock held leaves its bytes to the current writer. With no writer at
  work, the outbox is first offered to the kernel with one ``os.write`` (nothing awaits, so
  nothing can interleave); only what the kernel did not take waits for ``send_all``.
* **Back-pressure.** ``pending`` counts requests read and not yet written to the socket
  (handled, parked or queued in the outbox). The reader waits while ``pending`` is at
  ``max_in_flight_per_connection``, both before reading and before starting each request of a
  read, so a client that pipelines without reading its responses stalls its own connection
  instead of growing the broker's memory: at most one read's worth of parsed requests plus the
  bounded responses are held. Frames over ``max_frame_bytes`` are rejected from their length
  prefix, before any of the body is buffered.

Closing rules:

* End of stream from the client: stop reading, finish and write what is in flight, close.
* A frame that cannot be answered in order (over the size bound, or an envelope with no
  readable correlation id): same, then close. A bad envelope *with* an id is answered with
  INVALID_REQUEST and the connection carries on; an unknown api key or version gets
  UNSUPPORTED_VERSION without reaching the handler.
* A handler that raises gets an error body (``error_code`` from ``protocol.errors.code_of``,
  UNKNOWN_SERVER_ERROR and a logged traceback for unexpected exceptions); the connection and
  the server carry on. ``trio.Cancelled`` is never caught.
* No bytes moved in either direction and no handler running for ``idle_timeout_ms``: close
  at once. This also ends a client that stopped reading and left our writer blocked.
* Socket errors are logged at debug level and close only their connection.
* ``aclose(deadline_s)``: stop accepting, stop reading everywhere, let in-flight requests
  finish and be written until the deadline, then cancel whatever is left and close.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import trio

from tidelog.broker.context import DEFAULT_LISTENER, RequestContext
from tidelog.broker.deferred import DeferredResponse, is_deferred
from tidelog.protocol.apis import api_for
from tidelog.protocol.codec import Message, RequestHeader
from tidelog.protocol.connection import BadRequest, Request, ServerConnection
from tidelog.protocol.errors import UNKNOWN_SERVER_ERROR, TidelogError, code_of, error_body
from tidelog.protocol.frames import MAX_FRAME_BYTES_DEFAULT

if TYPE_CHECKING:
    from tidelog.broker.config import BrokerConfig

log = logging.getLogger(__name__)

Body = dict[str, Any]
Response = Body | Message | None  # None: no response (acks=0)
Result = Response | Awaitable[Response]
Handler = Callable[[RequestContext, Body], Result]

READ_BYTES = 64 * 1024
YIELD_EVERY = 16  # reads in a row without waiting before the reader yields anyway
MAX_IN_FLIGHT_DEFAULT = 100
IDLE_TIMEOUT_MS_DEFAULT = 600_000
_CONNECTION_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


@dataclass(frozen=True, slots=True)
class NetworkStats:
    connections_open: int
    connections_accepted: int
    requests_handled: Mapping[int, int]  # by api key (raw number for unknown keys)
    invalid_requests: int  # frames answered with INVALID_REQUEST or closing the connection
    handler_errors: int  # handler exceptions turned into error responses


class _Counters:
    def __init__(self) -> None:
        self.accepted = 0
        self.requests: Counter[int] = Counter()
        self.invalid = 0
        self.handler_errors = 0


class SocketServer:
    """Accepts connections on ``host:port`` and serves their requests with ``handler``."""

    def __init__(self, handler: Handler, *, host: str | None = "127.0.0.1", port: int = 0,
                 max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT,
                 max_in_flight_per_connection: int = MAX_IN_FLIGHT_DEFAULT,
                 idle_timeout_ms: int | None = IDLE_TIMEOUT_MS_DEFAULT, listener: str = DEFAULT_LISTENER):
        if max_in_flight_per_connection < 1:
            raise ValueError(f"max_in_flight_per_connection must be >= 1, got {max_in_flight_per_connection}")
        self.handler = handler
        self.listener = listener  # its name, as requests' contexts report it
        self.host = host or None  # "" or None: every interface
        self.port = port  # the bound port once run() has started
        self.max_frame_bytes = max_frame_bytes
        self.max_in_flight_per_connection = max_in_flight_per_connection
        self.idle_timeout_s = math.inf if idle_timeout_ms is None or idle_timeout_ms < 0 else idle_timeout_ms / 1000
        self.counters = _Counters()
        self._connections: set[_Connection] = set()
        self._accept_scope = trio.CancelScope()
        self._scope = trio.CancelScope()  # everything; its deadline is the shutdown deadline
        self._closing = False
        self._started = False
        self._stopped = trio.Event()

    @classmethod
    def from_config(cls, config: BrokerConfig, handler: Handler) -> SocketServer:
        host, port = config.listener
        return cls(handler, host=host, port=port, max_frame_bytes=config.socket_request_max_bytes,
                   max_in_flight_per_connection=config.queued_max_requests,
                   idle_timeout_ms=config.connections_max_idle_ms,
                   listener=config.listeners.partition("://")[0] or DEFAULT_LISTENER)

    @property
    def closing(self) -> bool:
        return self._closing

    def stats(self) -> NetworkStats:
        c = self.counters
        return NetworkStats(len(self._connections), c.accepted, MappingProxyType(dict(c.requests)),
                            c.invalid, c.handler_errors)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled or ``aclose``; ``task_status.started(port)`` once listening."""
        self._started = True
        try:
            listeners = await self._listen()
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._accept, listeners, nursery)
                    task_status.started(self.port)
        finally:
            self._stopped.set()

    async def aclose(self, deadline_s: float = 30.0) -> None:
        """Stop accepting and reading; give in-flight requests ``deadline_s`` to be answered."""
        self._closing = True
        if not self._started:
            return
        self._accept_scope.cancel()
        for connection in list(self._connections):
            connection.stop_reading()
        self._scope.deadline = min(self._scope.deadline, trio.current_time() + deadline_s)
        if not self._connections:
            self._scope.cancel()
        await self._stopped.wait()

    async def _listen(self) -> list[trio.SocketListener]:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        if self.port == 0:  # each address family got its own free port: keep the first
            for extra in listeners[1:]:
                await extra.aclose()
            listeners = listeners[:1]
        self.port = listeners[0].socket.getsockname()[1]
        log.info("listening on %s:%d", self.host or "*", self.port)
        return listeners

    async def _accept(self, listeners: list[trio.SocketListener], nursery: trio.Nursery) -> None:
        with self._accept_scope:  # serve_listeners closes the listeners when cancelled
            await trio.serve_listeners(self._serve_stream, listeners, handler_nursery=nursery)
        if self._closing and not self._connections:
            self._scope.cancel()

    async def _serve_stream(self, stream: trio.SocketStream) -> None:
        if self._closing:
            return
        self.counters.accepted += 1
        connection = _Connection(self, stream)
        self._connections.add(connection)
        try:
            await connection.run()
        finally:
            self._connections.discard(connection)
            if self._closing and not self._connections:
                self._scope.cancel()


class _Connection:
    """One client connection: the reader loop, request tasks and the locked writer."""

    def __init__(self, server: SocketServer, stream: trio.SocketStream):
        self._server = server
        self._stream = stream
        self._peer = _peer_name(stream)
        self._conn = ServerConnection(server.max_frame_bytes, server.max_in_flight_per_connection)
        self._max_pending = server.max_in_flight_per_connection
        self._scope = trio.CancelScope()  # the whole connection; its deadline is the idle timeout
        self._read_scope = trio.CancelScope()  # the current read (graceful shutdown cancels it)
        self._reading = True
        self._write_lock = trio.Lock()
        self._outbox = bytearray()
        self._outbox_count = 0  # requests completed by the bytes in the outbox
        self._pending = 0  # requests started and not yet written (see the module docstring)
        self._running = 0  # handlers in progress
        self._changed = trio.Event()  # set (and replaced) when pending drops and someone waits
        self._room_wanted = False  # the reader waits on _changed for pending to drop
        self._unyielding = 0  # reads in a row that found data without waiting
        self._requests: trio.Nursery | None = None  # the request tasks' nursery, while open
        self._deferred: set[DeferredResponse] = set()  # requests answered by a callback later
        self._deferred_done = trio.Event()  # set when the last of them was answered
        self._touch()

    def stop_reading(self) -> None:
        self._reading = False
        self._read_scope.cancel()

    async def run(self) -> None:
        try:
            with self._scope:
                async with self._stream, trio.open_nursery() as requests:
                    self._requests = requests
                    try:
                        await self._read_loop(requests)
                        while self._deferred:  # answer what was read (a graceful shutdown)
                            self._deferred_done = trio.Event()
                            await self._deferred_done.wait()
                    finally:
                        self._cancel_deferred()
            if self._scope.cancelled_caught:
                log.debug("closed the connection from %s: idle for %.1f s", self._peer,
                          self._server.idle_timeout_s)
        except* _CONNECTION_ERRORS as group:
            log.debug("connection from %s closed: %r", self._peer, group.exceptions[0])
        except* Exception:
            log.exception("unexpected error on the connection from %s; closing it", self._peer)

    # -- reading ----------------------------------------------------------------------------

    async def _read_loop(self, requests: trio.Nursery) -> None:
        """Read and start requests until end of stream, a fatal frame or ``stop_reading``.
        Only the waiting and the read itself can be cancelled by ``stop_reading``, never
        the starting of requests already read: each of them must be answered."""
        while data := await self._receive():
            self._touch()
            for event in self._conn.receive_data(data):
                if isinstance(event, BadRequest) and event.must_close:
                    self._server.counters.invalid += 1
                    log.debug("closing the connection from %s: %s", self._peer, event.error)
                    return
                await self._wait_for_room()
                self._pending += 1
                self._running += 1
                started = self._begin(event)
                if inspect.isawaitable(started):
                    self._scope.deadline = math.inf  # not idle while a handler works (a long poll)
                    requests.start_soon(self._finish, event, started)
                elif is_deferred(started):
                    # answered by whoever completes it (a consumer's long poll: the append
                    # that satisfies it), in that scheduler pass, without a task of its own
                    self._scope.deadline = math.inf
                    self._deferred.add(started)
                    started.attach(functools.partial(self._complete_deferred, started, _correlation_id(event)))
                else:
                    # answered already (a produce, say): respond from the reader, no handler
                    # task. The consumers' long polls this append satisfied (DelayedFetch)
                    # were answered and written in the append itself. If it woke tasks (a
                    # follower's fetch, say), the write waits until they have run: they run
                    # in the next scheduler pass, and the write in the pass after it (a task
                    # started now would run in the same pass as they do, first half of the
                    # time: Trio reverses the order of half its batches). Written first, the
                    # acknowledgement woke the producer, which on a busy machine then held
                    # the CPU the woken responses were waiting for (end-to-end p99 150 ms
                    # instead of 14 ms with a CPU hog running). With no task woken, it is
                    # written now.
                    self._handler_done()
                    self._respond(_correlation_id(event), started)
                    if trio.lowlevel.current_statistics().tasks_runnable or not self._write_now():
                        requests.start_soon(self._flush_after_woken)

    async def _receive(self) -> bytes:
        """The next bytes from the client; b"" at end of stream or after ``stop_reading``.

        Reads with ``os.read`` on the non-blocking socket and waits (``wait_readable``, in
        the read scope that ``stop_reading`` cancels) only when nothing is there: a Trio
        ``receive_some`` yields to the scheduler even when data is waiting, and for small
        requests those round trips cost more than the request. A reader that keeps finding
        data yields every ``YIELD_EVERY`` reads, so other connections are not starved."""
        if not self._reading or self._server.closing:
            return b""
        fd = self._stream.socket.fileno()
        if self._pending < self._max_pending and self._unyielding < YIELD_EVERY:
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                pass
            else:
                self._unyielding += 1
                return data
        yield_now = self._unyielding >= YIELD_EVERY
        self._unyielding = 0
        with trio.CancelScope() as self._read_scope:
            await self._wait_for_room()
            if yield_now:
                await trio.lowlevel.checkpoint()
            while True:
                try:
                    return os.read(fd, READ_BYTES)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(self._stream.socket)
        return b""

    async def _wait_for_room(self) -> None:
        while self._pending >= self._max_pending:
            self._room_wanted = True
            await self._changed.wait()

    # -- handling ---------------------------------------------------------------------------

    def _begin(self, event: Request | BadRequest) -> Result:
        """Called by the reader, in request order: the handler's result, an awaitable of it,
        or the error body when the request cannot or did not get that far."""
        counters = self._server.counters
        if isinstance(event, BadRequest):
            counters.invalid += 1
            return error_body(event.error.error, str(event.error))
        counters.requests[int(event.header.api_key)] += 1
        try:
            api_for(event.header)
            context = RequestContext(event.header, self._peer, self._server.listener)
            return self._server.handler(context, event.body)
        except Exception as exc:
            return self._handler_error(event.header, exc)

    async def _finish(self, event: Request | BadRequest, started: Result) -> None:
        """The request's own task: await the handler, then respond and write."""
        try:
            body = await self._settle(event, started)
        finally:
            self._handler_done()
        self._respond(_correlation_id(event), body)
        if not self._write_now():
            await self._flush()

    def _complete_deferred(self, deferred: DeferredResponse, correlation_id: int | None,
                           body: Body | Message | None) -> None:
        """A deferred request's answer (called by whoever completed it, on the Trio thread)."""
        if deferred not in self._deferred:
            return  # the connection closed (cancelled) or answered already
        self._deferred.discard(deferred)
        self._handler_done()
        self._respond(correlation_id, body)
        if not self._write_now() and self._requests is not None:
            self._requests.start_soon(self._flush)
        if not self._deferred:
            self._deferred_done.set()

    def _cancel_deferred(self) -> None:
        self._requests = None
        deferred, self._deferred = self._deferred, set()
        for d in deferred:
            try:
                d.cancel()
            except Exception:
                log.exception("cancelling a deferred request of %s failed", self._peer)
        self._deferred_done.set()

    def _handler_done(self) -> None:
        self._running -= 1
        self._touch()
        self._notify()

    async def _settle(self, event: Request | BadRequest, started: Result) -> Body | Message | None:
        if not inspect.isawaitable(started):
            return started
        try:
            return await started
        except Exception as exc:
            assert isinstance(event, Request)
            return self._handler_error(event.header, exc)

    def _handler_error(self, header: RequestHeader, exc: Exception) -> Body:
        if isinstance(exc, TidelogError):
            return error_body(exc.error, str(exc))
        self._server.counters.handler_errors += 1
        log.error("handler failed on %s request %d from %s (api key %s)", _api_name(header.api_key),
                  header.correlation_id, self._peer, header.api_key, exc_info=exc)
        return error_body(code_of(exc))

    def _respond(self, correlation_id: int, body: Body | Message | None) -> None:
        before = self._conn.in_flight
        if body is None:
            data = self._conn.skip_response(correlation_id)
        else:
            data = self._encode(correlation_id, body)
        self._outbox += data
        self._outbox_count += before - self._conn.in_flight

    def _encode(self, correlation_id: int, body: Body | Message) -> bytes:
        try:
            return self._conn.send_response(correlation_id, body)
        except Exception:  # the handler returned something that does not encode
            self._server.counters.handler_errors += 1
            log.exception("response %d for %s does not encode", correlation_id, self._peer)
            return self._conn.send_response(correlation_id, error_body(UNKNOWN_SERVER_ERROR))

    # -- writing ----------------------------------------------------------------------------

    def _write_now(self) -> bool:
        """Hand the whole outbox to the kernel right now if no writer is at work and the
        kernel takes it all (the usual case: nothing awaits, so the bytes cannot be
        interleaved or interrupted). False: what is left stays in the outbox for ``_flush``."""
        if self._write_lock.locked():
            return False
        data, count = self._outbox, self._outbox_count
        if data:
            try:
                sent = os.write(self._stream.socket.fileno(), data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return False  # _flush's send_all raises it and closes the connection
            if sent < len(data):
                del data[:sent]
                return False
            self._outbox = bytearray()
            self._touch()
        self._outbox_count = 0
        self._pending -= count
        self._notify()
        return True

    async def _flush_after_woken(self) -> None:
        """``_flush`` one scheduler pass later: after the tasks woken with this one ran."""
        await trio.lowlevel.cancel_shielded_checkpoint()
        if not self._write_now():
            await self._flush()

    async def _flush(self) -> None:
        """Write the outbox, coalesced, unless another task is already writing it."""
        if self._write_lock.locked():
            return  # the writer loops until the outbox is empty, our bytes included
        async with self._write_lock:
            while self._outbox_count:
                data, count = self._outbox, self._outbox_count
                self._outbox, self._outbox_count = bytearray(), 0
                if data:
                    await self._stream.send_all(data)
                    self._touch()
                self._pending -= count
                self._notify()

    def _touch(self) -> None:
        """Bytes moved or a handler finished: restart the idle clock unless a handler runs.
        The deadline moves only once it is less than the idle timeout away, and then an
        eighth of it further (moving a Trio deadline on every request costs more than a
        small request): an idle connection closes 1 to 1.125 idle timeouts after its last
        activity."""
        if self._running == 0:
            idle = self._server.idle_timeout_s
            now = trio.current_time()
            if not now + idle <= self._scope.deadline <= now + idle * 1.125:  # too soon, or inf
                self._scope.deadline = now + idle * 1.125

    def _notify(self) -> None:
        if self._room_wanted:
            self._room_wanted = False
            self._changed.set()
            self._changed = trio.Event()


def _correlation_id(event: Request | BadRequest) -> int:
    return event.header.correlation_id if isinstance(event, Request) else event.correlation_id


def _peer_name(stream: trio.SocketStream) -> str:
    try:
        host, port, *_ = stream.socket.getpeername()
    except (OSError, ValueError):
        return "?"
    return f"{host}:{port}"


def _api_name(api_key: int) -> str:
    return getattr(api_key, "name", f"api key {api_key}")
