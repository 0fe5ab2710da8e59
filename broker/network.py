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
  written at once, or, when the request woke tasks (a produce waiting with acks=all), on the
  next scheduler pass, after them. A handler may
  also return a ``broker.deferred.DeferredResponse`` (a long-poll fetch, a consumer's or a
  follower's): it gets
  no task; the connection attaches a completion callback, and whoever satisfies the
  operation (the append that gives a waiting fetch its bytes, or the expiry timer) answers
  it synchronously, in that scheduler pass. When the connection closes first, the deferred
  operations are cancelled and a later completion is ignored. The reader
  reads with ``os.read`` and waits for the socket only when nothing is there (a Trio
  ``receive_some`` yields to the scheduler even when data is waiting; for small requests
  those round trips cost more than the request), yielding every ``YIELD_EVERY`` reads.
  The whole read loop runs in one cancel scope, which ``stop_reading`` cancels only while
  the reader waits to read (for bytes, for room or for the memory budget), and the reader
  starts nothing read after a wait once ``stop_reading`` was called (the wait may have ended
  before the cancellation came; on TLS the bytes are decrypted and dropped): so a request
  read is always started and answered, never cancelled half-way, and a wait costs no cancel
  scope of its own.
* **Responses in request order.** A handler's result goes to ``ServerConnection``, which parks
  a response until every older one is ready and hands out the bytes that may be written now
  (``send_response``; ``skip_response`` when the handler returns None, as for acks=0). Those
  bytes are appended to the connection's outbox.
* **Throttled clients** (KIP-219). A handler's answer may be a ``deferred.Throttled``: the
  response is sent as any other, then the reader starts no further request of that
  connection until the throttle time has passed (Kafka mutes the channel), for a client that
  waits out ``throttle_time_ms`` itself (``broker/security/quotas.py``).
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
* **Memory budget** (``queued.max.request.bytes``, Kafka's MemoryPool). One
  ``RequestMemoryPool`` per server bounds the bytes of request frames being received or
  waiting for their response, across all connections. After each read, a frame whose length
  prefix has arrived and whose body has not, and which announces more than
  ``RESERVE_ABOVE_BYTES``, reserves its size from the pool before the reader reads again; when
  the pool is short, that connection is not read (Kafka mutes the channel) until enough is
  released. A reservation is released when the request is handed to its handler (a handler
  running as a task: when it returns, as Kafka's ``releaseBuffer``), or when the connection
  closes: a deferred request (a long poll, an acks=all wait) then holds its decoded request,
  and such waits are bounded per connection by ``max_in_flight_per_connection``, never by
  the budget, which they would pin. A muted connection (KIP-219) reserves for the rest of a
  large frame only once its throttle has passed. So at most one read (``READ_BYTES``) of a
  body is buffered before its reservation. Smaller frames reserve nothing: they are bounded
  by ``max_in_flight_per_connection`` per connection and by the connection limits, and they
  keep being served while large frames wait (Kafka's pool mutes everyone when exhausted;
  here a client sending Metadata or a small produce is never blocked by others' large
  frames). A frame larger than the whole budget can never fit: ``max_frame_bytes`` is capped
  at the budget, so it is refused from its prefix like any frame over the size bound (the
  broker's config refuses such a budget, as Kafka's does). A budget of 0 or below is none.
* **Large frames are decoded off the event loop.** ``ServerConnection`` hands back a frame
  over ``DECODE_INLINE_MAX_BYTES`` undecoded; the reader decodes it in a worker thread and
  waits for it before it starts anything else of that connection, so handlers (produce,
  ORDERED) are still called in request order, and other connections are served meanwhile.
  The decode holds the GIL while msgpack builds the objects, so its cost is bounded by the
  codec's bounds on a request, not removed.
* **Connection limits.** A new connection beyond ``max.connections``, beyond
  ``max.connections.per.ip`` (or its override) for its address, or beyond the descriptor
  budget (RLIMIT_NOFILE less a headroom kept for the broker's own files: a quarter of the
  limit, at least ``DESCRIPTOR_HEADROOM_MIN``) is closed at once. When accept still fails for
  lack of descriptors (EMFILE, ENFILE) or memory, the server gives up its reserve of
  placeholder descriptors (/dev/null, held from the start, so the broker's own file opens
  succeed meanwhile), closes its ``SHED_ON_EMFILE`` newest connections, waits
  ``ACCEPT_RETRY_S`` and accepts again; the reserve is taken back as descriptors free.

* **Security.** Each listener has its own server, with its security protocol
  (``broker.security.listeners.ListenerSecurity``). On SSL and SASL_SSL listeners the
  stream is a ``trio.SSLStream``: the handshake must finish within
  ``tls.HANDSHAKE_TIMEOUT_S``, and the bytes pass through the TLS layer, so the reader uses
  ``receive_some`` and every write ``send_all`` (the ``os.read``/``os.write`` fast paths are
  for plain sockets). A verified client certificate gives the principal. On SASL listeners
  the connection owns a ``ServerAuthenticator`` and, until it completes, serves only
  ApiVersions, SaslHandshake and SaslAuthenticate, with frames bounded by
  ``SASL_MAX_FRAME_BYTES``; any other request is answered SASL_AUTHENTICATION_FAILED (saying
  that the listener wants SASL first) and closes the connection, and so does a failed
  authentication, answered after ``connection.failed.authentication.delay.ms``. A client
  that sends plain bytes to a TLS listener gets one plain error response saying the
  listener speaks TLS, and the connection closes. Authentication rounds run in a worker thread (PLAIN hashes the password).
  Every request's context carries the principal, the listener, its protocol, and whether
  it is the inter-broker listener.

Closing rules:

* End of stream from the client: stop reading, finish and write what is in flight, close.
* A frame that cannot be answered in order (over the size bound, or an envelope with no
  readable correlation id): same, then close. A bad envelope *with* an id is answered with
  INVALID_REQUEST and the connection carries on; an unknown api key or version gets
  UNSUPPORTED_VERSION without reaching the handler.
* A handler that raises gets an error body (``error_code`` from ``protocol.errors.code_of``,
  UNKNOWN_SERVER_ERROR and a logged traceback for unexpected exceptions); the connection and
  the server carry on. ``trio.Cancelled`` is never caught.
* No bytes moved in either direction and no handler running for ``idle_timeout_ms``: close.
  This also ends a client that stopped reading and left our writer blocked, during a
  graceful shutdown too. One task per server checks every connection each ``IDLE_TICKS``-th
  of the timeout (at most every ``IDLE_TICK_MIN_S``; as Kafka's selector does in its poll),
  against a count of the connection's activity: a connection closes 1 to 1.125 idle
  timeouts after its last activity, and a request costs a counter's increment instead of a
  clock read and a Trio deadline moved.
* Socket errors are logged at debug level and close only their connection.
* ``aclose(deadline_s)``: stop accepting, stop reading everywhere, let in-flight requests
  finish and be written until the deadline, then cancel whatever is left and close.
"""

from __future__ import annotations

import errno
import functools
import logging
import math
import os
import resource
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import trio

from tidelog.broker.config import parse_ip_overrides
from tidelog.broker.context import ANONYMOUS, RequestContext, host_of
from tidelog.broker.deferred import CLOSE_CONNECTION, DeferredResponse, Throttled, is_awaitable, is_deferred
from tidelog.broker.security.listeners import ListenerSecurity
from tidelog.broker.security.sasl import SaslState, ServerAuthenticator, Step
from tidelog.broker.security.tls import HANDSHAKE_TIMEOUT_S, peer_principal
from tidelog.protocol.apis import api_for
from tidelog.protocol.codec import ApiKey, Message, RequestHeader
from tidelog.protocol.connection import BadRequest, LargeFrame, Request, ServerConnection
from tidelog.protocol.errors import (
    SASL_AUTHENTICATION_FAILED,
    SSL_HANDSHAKE_FAILED,
    UNKNOWN_SERVER_ERROR,
    TidelogError,
    code_of,
    error_body,
)
from tidelog.protocol.frames import MAX_FRAME_BYTES_DEFAULT
from tidelog.protocol.kafka.connection import KafkaServerConnection
from tidelog.protocol.messages import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

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
IDLE_TICKS = 8  # the idle check runs every idle timeout / IDLE_TICKS...
IDLE_TICK_MIN_S = 0.01  # ...but at most a hundred times a second
QUEUED_MAX_REQUEST_BYTES_DEFAULT = 200 * 1024 * 1024
RESERVE_ABOVE_BYTES = READ_BYTES  # frames up to this size reserve nothing from the budget
DECODE_INLINE_MAX_BYTES = 256 * 1024  # larger frames are decoded in a worker thread
DESCRIPTOR_HEADROOM_MIN = 64  # descriptors never given to client connections (see above)
RESERVED_DESCRIPTORS = 8  # /dev/null placeholders given up when accept hits EMFILE
SHED_ON_EMFILE = 8  # newest connections closed when accept hits EMFILE
ACCEPT_RETRY_S = 0.1
TLS_HANDSHAKE_RECORD = 0x16  # the first byte a TLS client sends
SASL_THREADS = 2  # worker threads for authentication rounds, per listener
LINGER_S = 1.0  # how long a refused connection's last bytes are drained before it closes
SASL_MAX_FRAME_BYTES = 512 * 1024  # Kafka's sasl.server.max.receive.size: frames before authentication
# requests a connection may send before SASL authentication completes: ApiVersions (again at
# v0 after UNSUPPORTED_VERSION), SaslHandshake and SCRAM's two rounds need 5; an
# unauthenticated peer repeating ApiVersions of half a megabyte is not served for ever
PRE_AUTH_MAX_REQUESTS = 8
_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_CONNECTION_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)
# The protocol of each wire and the largest frame it decodes on the event loop: Kafka's
# decoder is Python, several times msgpack's C decoder's cost per byte (about 0.7 us a byte
# for dense arrays, so 32 KiB is some 20 ms)
_WIRES: Mapping[str, tuple[type[ServerConnection], int]] = MappingProxyType({
    "tidelog": (ServerConnection, DECODE_INLINE_MAX_BYTES),
    "kafka": (KafkaServerConnection, 32 * 1024)})


@dataclass(frozen=True, slots=True)
class NetworkStats:
    connections_open: int
    connections_accepted: int
    requests_handled: Mapping[int, int]  # by api key (raw number for unknown keys)
    invalid_requests: int  # frames answered with INVALID_REQUEST or closing the connection
    handler_errors: int  # handler exceptions turned into error responses
    connections_refused: int = 0  # closed at once: over a connection limit, or shed at EMFILE
    request_bytes_reserved: int = 0  # from queued.max.request.bytes, now
    request_queue_time_s: float = 0.0  # summed over requests: from fully read to the handler's start

    @classmethod
    def sum(cls, stats: Iterable[NetworkStats]) -> NetworkStats:
        """Several servers' counters (one per listener) as one."""
        stats = list(stats)
        requests: Counter[int] = Counter()
        for one in stats:
            requests.update(one.requests_handled)
        return cls(sum(s.connections_open for s in stats), sum(s.connections_accepted for s in stats),
                   MappingProxyType(dict(requests)), sum(s.invalid_requests for s in stats),
                   sum(s.handler_errors for s in stats), sum(s.connections_refused for s in stats),
                   sum(s.request_bytes_reserved for s in stats), sum(s.request_queue_time_s for s in stats))


class RequestMemoryPool:
    """Bytes of large requests in progress, shared by every connection of a server
    (``queued.max.request.bytes``; None: unbounded). Trio thread only."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.reserved = 0
        self._freed = trio.Event()

    @property
    def bounded(self) -> bool:
        return self.capacity is not None

    def try_reserve(self, size: int) -> bool:
        if self.capacity is not None and self.reserved + size > self.capacity:
            return False
        self.reserved += size
        return True

    async def reserve(self, size: int) -> None:
        """Wait until ``size`` bytes fit, then reserve them."""
        while not self.try_reserve(size):
            await self._freed.wait()

    def release(self, size: int) -> None:
        self.reserved -= size
        freed, self._freed = self._freed, trio.Event()
        freed.set()


class _Counters:
    def __init__(self) -> None:
        self.accepted = 0
        self.requests: Counter[int] = Counter()
        self.invalid = 0
        self.handler_errors = 0
        self.refused = 0
        self.queue_time_s = 0.0  # requests' waits between read and handler (decode thread, room)


class SocketServer:
    """Accepts connections on ``host:port`` and serves their requests with ``handler``."""

    def __init__(self, handler: Handler, *, host: str | None = "127.0.0.1", port: int = 0,
                 max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT,
                 max_in_flight_per_connection: int = MAX_IN_FLIGHT_DEFAULT,
                 idle_timeout_ms: int | None = IDLE_TIMEOUT_MS_DEFAULT,
                 security: ListenerSecurity | None = None,
                 queued_max_request_bytes: int = QUEUED_MAX_REQUEST_BYTES_DEFAULT,
                 max_connections: int | None = None, max_connections_per_ip: int | None = None,
                 max_connections_per_ip_overrides: Mapping[str, int] | None = None,
                 wire: str = "tidelog"):
        if max_in_flight_per_connection < 1:
            raise ValueError(f"max_in_flight_per_connection must be >= 1, got {max_in_flight_per_connection}")
        self.handler = handler
        if wire not in _WIRES:
            raise ValueError(f"wire must be one of {', '.join(_WIRES)}, got {wire!r}")
        self.wire = wire  # the protocol its clients speak: Tidelog's, or Kafka's (protocol/kafka)
        self.security = security or ListenerSecurity.plaintext()
        # SASL rounds (PLAIN hashes a password) get threads of their own, so unauthenticated
        # clients cannot take the worker threads produce validation and decoding use
        self.sasl_limiter = trio.CapacityLimiter(SASL_THREADS)
        self.listener = self.security.name  # its name, as requests' contexts report it
        self.host = host or None  # "" or None: every interface
        self.port = port  # the bound port once run() has started
        # <= 0: no bound, as Kafka's queued.max.request.bytes
        self.pool = RequestMemoryPool(None if queued_max_request_bytes <= 0 else queued_max_request_bytes)
        if self.pool.capacity is not None:  # a frame larger than the budget could never fit
            max_frame_bytes = min(max_frame_bytes, self.pool.capacity)
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections or math.inf  # and the descriptor budget, at accept
        self.max_connections_per_ip = max_connections_per_ip or math.inf
        self.ip_overrides = dict(max_connections_per_ip_overrides or {})
        self._per_ip: Counter[str] = Counter()
        self._reserve: list[int] = []  # placeholder descriptors (see the module docstring)
        self.max_in_flight_per_connection = max_in_flight_per_connection
        self.idle_timeout_s = math.inf if idle_timeout_ms is None or idle_timeout_ms < 0 else idle_timeout_ms / 1000
        self.counters = _Counters()
        self._connections: dict[_Connection, None] = {}  # oldest first
        self._accept_scope = trio.CancelScope()
        self._scope = trio.CancelScope()  # everything; its deadline is the shutdown deadline
        self._closing = False
        self._started = False
        self._stopped = trio.Event()

    @classmethod
    def from_config(cls, config: BrokerConfig, handler: Handler, security: ListenerSecurity | None = None,
                    address: tuple[str, int] | None = None, wire: str = "tidelog") -> SocketServer:
        """The server of one listener (default: the inter-broker listener, as plain TCP)."""
        host, port = address or config.listener
        return cls(handler, host=host, port=port, max_frame_bytes=config.socket_request_max_bytes,
                   max_in_flight_per_connection=config.queued_max_requests,
                   idle_timeout_ms=config.connections_max_idle_ms,
                   security=security or ListenerSecurity.plaintext(config.inter_broker_listener.name),
                   queued_max_request_bytes=config.queued_max_request_bytes,
                   max_connections=config.max_connections,
                   max_connections_per_ip=config.max_connections_per_ip,
                   max_connections_per_ip_overrides=_ip_overrides(config.max_connections_per_ip_overrides),
                   wire=wire)

    @property
    def closing(self) -> bool:
        return self._closing

    def stats(self) -> NetworkStats:
        c = self.counters
        return NetworkStats(len(self._connections), c.accepted, MappingProxyType(dict(c.requests)),
                            c.invalid, c.handler_errors, c.refused, self.pool.reserved, c.queue_time_s)

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled or ``aclose``; ``task_status.started(port)`` once listening."""
        self._started = True
        self._refill_reserve()
        try:
            listeners = await self._listen()
            with self._scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._accept, listeners, nursery)
                    nursery.start_soon(self._close_idle)  # until the last connection is gone
                    task_status.started(self.port)
        finally:
            for fd in self._reserve:
                os.close(fd)
            self._reserve.clear()
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
        try:
            listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        except OSError as e:  # the system's message names no address ("Address already in use")
            raise OSError(e.errno, f"listener {self.listener} cannot listen on {self.host or '*'}:"
                                   f"{self.port}: {e.strerror or e}") from e
        if self.port == 0:  # each address family got its own free port: keep the first
            for extra in listeners[1:]:
                await extra.aclose()
            listeners = listeners[:1]
        self.port = listeners[0].socket.getsockname()[1]
        log.info("listener %s (%s) on %s:%d", self.listener, self.security.protocol, self.host or "*", self.port)
        return listeners

    async def _accept(self, listeners: list[trio.SocketListener], nursery: trio.Nursery) -> None:
        with self._accept_scope:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(self._accept_from, listener, nursery)
        if self._closing and not self._connections:
            self._scope.cancel()

    async def _close_idle(self) -> None:
        """Close the connections idle for the idle timeout, until the server stops (a
        graceful shutdown included: a client that stopped reading holds no writer for long)."""
        while self.idle_timeout_s < math.inf:
            await trio.sleep(max(self.idle_timeout_s / IDLE_TICKS, IDLE_TICK_MIN_S))
            for connection in list(self._connections):
                connection.idle_tick()

    async def _accept_from(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        """Accept until cancelled (closing the listener); never fails on a full process."""
        async with listener:
            while True:
                try:
                    stream = await listener.accept()
                except OSError as exc:
                    self._accept_failed(exc)
                    await trio.sleep(ACCEPT_RETRY_S)
                    continue
                host = _peer_host(stream)
                refusal = self._refusal(host)
                if refusal is not None:
                    self.counters.refused += 1
                    log.debug("closed a new connection from %s: %s", host, refusal)
                    stream.socket.close()
                    continue
                self._per_ip[host] += 1
                if len(self._reserve) < RESERVED_DESCRIPTORS:
                    self._refill_reserve()
                nursery.start_soon(self._serve_stream, stream, host)

    def _refusal(self, host: str) -> str | None:
        """Why a new connection from ``host`` is closed at once, or None to serve it."""
        open_now = sum(self._per_ip.values())
        if open_now >= self.max_connections:
            return f"{open_now} connections open, max.connections is {self.max_connections}"
        if open_now >= (budget := _descriptor_budget()):  # RLIMIT_NOFILE, read now: it may change
            return f"{open_now} connections open, the most the descriptor limit allows while keeping " \
                   f"descriptors for the broker's own files is {budget}"
        limit = self.ip_overrides.get(host, self.max_connections_per_ip)
        if self._per_ip[host] >= limit:
            return f"{self._per_ip[host]} connections open from {host}, max.connections.per.ip is {limit}"
        return None

    def _accept_failed(self, exc: OSError) -> None:
        """Accept failed: out of descriptors (or memory), give up the reserve and shed the
        newest connections; anything else is logged, and accepting carries on."""
        if exc.errno not in _CAPACITY_ERRNOS:
            log.error("accepting a connection failed: %s; retrying in %.1f s", exc, ACCEPT_RETRY_S)
            return
        for fd in self._reserve:
            os.close(fd)
        self._reserve.clear()
        newest = list(self._connections)[-SHED_ON_EMFILE:]
        for connection in newest:
            connection.abort()
        self.counters.refused += len(newest)
        log.warning("accept failed: %s; closed the %d newest of %d connections and released the "
                    "reserved descriptors", os.strerror(exc.errno or 0), len(newest), len(self._connections))

    def _refill_reserve(self) -> None:
        try:
            while len(self._reserve) < RESERVED_DESCRIPTORS:
                self._reserve.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            pass  # still short of descriptors: taken back after a later accept

    async def _serve_stream(self, stream: trio.SocketStream, host: str) -> None:
        try:
            if self._closing:
                await trio.aclose_forcefully(stream)
                return
            self.counters.accepted += 1
            context = self.security.ssl_context
            secured = stream if context is None else trio.SSLStream(stream, context, server_side=True)
            connection = _Connection(self, secured)  # its run() closes the stream
            self._connections[connection] = None
            try:
                await connection.run()
            finally:
                self._connections.pop(connection, None)
        finally:
            self._per_ip[host] -= 1
            if not self._per_ip[host]:
                del self._per_ip[host]
            if self._closing and not self._connections:
                self._scope.cancel()


class _Connection:
    """One client connection: the reader loop, request tasks and the locked writer."""

    def __init__(self, server: SocketServer, stream: trio.SocketStream | trio.SSLStream):
        self._server = server
        self._stream = stream
        self._tls = isinstance(stream, trio.SSLStream)
        self._socket = stream.transport_stream.socket if self._tls else stream.socket
        self._fd = self._socket.fileno()  # -1 before the socket closes (its number is reused)
        self._peer = _peer_name(self._socket)
        wire, inline_max = _WIRES[server.wire]
        self._kafka = server.wire == "kafka"  # its requests' contexts carry their Kafka version
        self._conn = wire(server.max_frame_bytes, server.max_in_flight_per_connection, inline_max)
        security = server.security
        self._principal = ANONYMOUS
        self._linger = False  # refused: drain what the peer still sends before closing (_drain)
        self._requests_before_auth = 0  # while SASL authentication is under way (_unauthenticated)
        self._auth: ServerAuthenticator | None = None  # None: nothing to authenticate (or done)
        if security.protocol.uses_sasl:
            self._auth = ServerAuthenticator(security.sasl_mechanisms, security.credentials,
                                             security.usual_iterations)
            self._conn.max_frame_bytes = min(server.max_frame_bytes, SASL_MAX_FRAME_BYTES)
        self._context = functools.partial(RequestContext, peer=self._peer, host=host_of(self._peer),
                                          listener=server.listener,
                                          security_protocol=str(security.protocol),
                                          inter_broker=security.inter_broker,
                                          client_certificates=security.asks_client_certificates,
                                          # Tidelog's clients wait out throttle_time_ms from the
                                          # request's send (KIP-219); a Kafka request says per version
                                          client_throttles=not self._kafka)
        self._pool = server.pool
        self._reservation = 0  # reserved for the frame still arriving, until handed to its handler
        # one request at a time until authenticated (Kafka mutes the channel): SASL rounds are
        # a sequence, and pipelined guesses must not all run before the first one fails
        self._max_pending = 1 if self._auth is not None else server.max_in_flight_per_connection
        self._scope = trio.CancelScope()  # the whole connection (closed when idle, or shed)
        self._read_scope = trio.CancelScope()  # the read loop (cancelled by stop_reading)
        self._reading = True
        self._read_waiting = False  # in a wait that stop_reading may cancel
        self._activity = 0  # bytes moved or handlers finished (see the idle check)
        self._activity_seen = -1  # the count at the last idle check
        self._idle_ticks = 0  # idle checks in a row that found no activity and no handler
        self._write_lock = trio.Lock()
        self._outbox = bytearray()
        self._outbox_count = 0  # requests completed by the bytes in the outbox
        self._pending = 0  # requests started and not yet written (see the module docstring)
        self._running = 0  # handlers in progress
        self._idled = False  # closed by the idle check
        self._changed = trio.Event()  # set (and replaced) when pending drops and someone waits
        self._room_wanted = False  # the reader waits on _changed for pending to drop
        self._muted_until = 0.0  # Trio time until which no request starts (KIP-219); 0: not muted
        self._unmuted: trio.Event | None = None  # set by stop_reading to end a throttle's wait
        self._unyielding = 0  # reads in a row that found data without waiting
        self._requests: trio.Nursery | None = None  # the request tasks' nursery, while open
        self._deferred: set[DeferredResponse] = set()  # requests answered by a callback later
        self._deferred_done = trio.Event()  # set when the last of them was answered

    def stop_reading(self) -> None:
        """Read nothing more: a wait to read ends now; requests already read are answered."""
        self._reading = False
        if self._read_waiting:
            self._read_scope.cancel()
        if self._unmuted is not None:
            self._unmuted.set()

    def idle_tick(self) -> None:
        """The server's idle check: close the connection when ``IDLE_TICKS`` checks in a row
        found no activity and no handler running."""
        if self._running or self._activity != self._activity_seen:
            self._activity_seen = self._activity
            self._idle_ticks = 0
            return
        self._idle_ticks += 1
        if self._idle_ticks >= IDLE_TICKS:
            self._idled = True
            self._scope.cancel()

    def abort(self) -> None:
        """Close now, dropping whatever is in flight (shed at EMFILE)."""
        self._scope.cancel()

    async def run(self) -> None:
        try:
            with self._scope:
                async with self._stream:
                    try:
                        async with trio.open_nursery() as requests:
                            self._requests = requests
                            try:
                                if self._tls and not await self._handshake():
                                    return
                                with self._read_scope:
                                    await self._read_loop(requests)
                                while self._deferred:  # answer what was read (a graceful shutdown)
                                    self._deferred_done = trio.Event()
                                    await self._deferred_done.wait()
                            finally:
                                self._cancel_deferred()
                    finally:
                        self._fd = -1  # the socket closes below; its number may be reused after
                    if self._linger:
                        await _drain(self._stream)
            if self._idled:
                log.debug("closed the connection from %s: idle for %.1f s", self._peer,
                          self._server.idle_timeout_s)
        except* _CONNECTION_ERRORS as group:
            log.debug("connection from %s closed: %r", self._peer, group.exceptions[0])
        except* Exception:
            log.exception("unexpected error on the connection from %s; closing it", self._peer)
        finally:
            self._release_all()

    async def _handshake(self) -> bool:
        """The TLS handshake, bounded in time; the client certificate's principal, if any.
        A client speaking plain frames (its first byte is not a TLS handshake record's) gets
        one plain error response instead."""
        with trio.move_on_after(HANDSHAKE_TIMEOUT_S):
            try:
                if not await self._starts_with_tls():
                    await self._refuse_plain_client()
                    return False
                await self._stream.do_handshake()
            except trio.BrokenResourceError as e:
                log.info("TLS handshake with %s on listener %s failed: %s", self._peer, self._server.listener,
                         e.__cause__ or e)
                return False
            self._principal = peer_principal(self._stream)
            return True
        log.info("TLS handshake with %s on listener %s timed out", self._peer, self._server.listener)
        return False

    async def _starts_with_tls(self) -> bool:
        try:
            first = await self._socket.recv(1, socket.MSG_PEEK)
        except OSError:
            return True  # the handshake reports it
        return not first or first[0] == TLS_HANDSHAKE_RECORD

    async def _refuse_plain_client(self) -> None:
        """Answer the plain client's first request with SSL_HANDSHAKE_FAILED, in plain bytes."""
        conn = ServerConnection(SASL_MAX_FRAME_BYTES, 1)
        transport = self._stream.transport_stream
        events: list = []
        while not events:
            data = await transport.receive_some(READ_BYTES)
            if not data:
                return
            events = conn.receive_data(data)
        first = events[0]
        self._server.counters.invalid += 1
        log.info("closing the connection from %s on listener %s: plain bytes on a TLS listener",
                 self._peer, self._server.listener)
        correlation_id = first.header.correlation_id if isinstance(first, Request) else first.correlation_id
        if correlation_id is not None:
            await transport.send_all(conn.send_response(correlation_id, error_body(
                SSL_HANDSHAKE_FAILED, f"listener {self._server.listener} speaks TLS "
                f"({self._server.security.protocol}): connect with security_protocol="
                f"{self._server.security.protocol} and the CA that signs the broker's certificate")))
            await _drain(transport)
        await trio.aclose_forcefully(transport)  # no TLS session to close: its aclose would wait for one

    # -- reading ----------------------------------------------------------------------------

    async def _read_loop(self, requests: trio.Nursery) -> None:
        """Read and start requests until end of stream, a fatal frame or ``stop_reading``.
        Only a wait to read (and a TLS read) can be cancelled by ``stop_reading``, never the
        starting of requests already read: each of them must be answered."""
        while data := await self._receive():
            self._activity += 1
            events = self._conn.receive_data(data)
            while events:
                if await self._start_requests(requests, events):
                    return
                # a LargeFrame ends its list: the frames behind it are still in the decoder
                events = self._conn.receive_data(b"") if type(events[-1]) is LargeFrame else None
            if self._pool.bounded and not self._reservation and (
                    size := self._conn.partial_frame_size) is not None and size > RESERVE_ABOVE_BYTES:
                if self._muted_until:  # muted: read the rest of a large frame once unmuted, as Kafka
                    await self._wait_out_throttle()
                await self._reserve(size)

    async def _start_requests(self, requests: trio.Nursery, events: list) -> bool:
        """Start each request of ``events`` in order; True when the connection must close."""
        for event in events:
            if self._linger:  # refused (no authentication): closed once answered, nothing more
                return True  # served, nor refused and logged again for each frame read with it
            queued_at = None  # the queue time is read only on the paths that wait
            if type(event) is LargeFrame:
                queued_at = trio.current_time()
                event = self._conn.admit(await trio.to_thread.run_sync(self._conn.decode, event.data))
            if isinstance(event, BadRequest) and event.must_close:
                self._server.counters.invalid += 1
                log.debug("closing the connection from %s: %s", self._peer, event.error)
                return True
            if self._muted_until:
                await self._wait_out_throttle()
            if self._pending >= self._max_pending:
                if queued_at is None:
                    queued_at = trio.current_time()
                await self._wait_for_room()
            if queued_at is not None:
                self._server.counters.queue_time_s += trio.current_time() - queued_at
            self._pending += 1
            self._running += 1
            started = self._begin(event)
            reserved = 0
            if self._reservation:  # this frame's (the first read after it was reserved)
                reserved, self._reservation = self._reservation, 0
                if not is_awaitable(started):  # handed over: what waits now is the decoded request
                    self._pool.release(reserved)
                    reserved = 0
            if is_awaitable(started):
                requests.start_soon(self._finish, event, started, reserved)
            elif is_deferred(started):
                # answered by whoever completes it (a consumer's long poll: the append
                # that satisfies it), in that scheduler pass, without a task of its own
                self._deferred.add(started)
                started.attach(functools.partial(self._complete_deferred, started, _correlation_id(event)))
            else:
                # answered already (a produce, say): respond from the reader, no handler
                # task. The long polls this append satisfied (DelayedFetch: consumers' and
                # followers') were answered and written in the append itself. If it woke
                # tasks (a produce waiting with acks=all, say), the write waits until they
                # have run: they run
                # in the next scheduler pass, and the write in the pass after it (a task
                # started now would run in the same pass as they do, first half of the
                # time: Trio reverses the order of half its batches), so the woken
                # responses are not starved by the producer this acknowledgement wakes
                # (bench/RESULTS.md, "a produce answered by the reader"). With no task
                # woken, it is written now.
                self._handler_done()
                self._respond(_correlation_id(event), started)
                if trio.lowlevel.current_statistics().tasks_runnable or not self._write_now():
                    requests.start_soon(self._flush_after_woken)
        return False

    async def _receive(self) -> bytes:
        """The next bytes from the client; b"" at end of stream or after ``stop_reading``.

        Reads with ``os.read`` on the non-blocking socket and waits (``wait_readable``, in
        the read scope that ``stop_reading`` cancels) only when nothing is there: a Trio
        ``receive_some`` yields to the scheduler even when data is waiting, and for small
        requests those round trips cost more than the request. A reader that keeps finding
        data yields every ``YIELD_EVERY`` reads, so other connections are not starved."""
        if not self._reading or self._server.closing:
            return b""
        if self._tls:
            self._read_waiting = True
            await self._wait_for_room()
            data = await self._stream.receive_some(READ_BYTES)
            self._read_waiting = False
            return data if self._reading else b""
        fd = self._fd
        empty = False  # a read just found nothing: wait before reading again
        if self._pending < self._max_pending and self._unyielding < YIELD_EVERY:
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                empty = True
            else:
                self._unyielding += 1
                return data
        yield_now = self._unyielding >= YIELD_EVERY
        self._unyielding = 0
        self._read_waiting = True
        if self._pending >= self._max_pending:
            await self._wait_for_room()
        if yield_now:
            await trio.lowlevel.checkpoint()
        while True:
            if empty:
                await trio.lowlevel.wait_readable(self._socket)
            if not self._reading:  # stopped while this wait's wake-up was on its way
                return b""
            try:
                data = os.read(fd, READ_BYTES)
            except BlockingIOError:
                empty = True
            else:
                self._read_waiting = False
                return data

    async def _reserve(self, size: int) -> None:
        """Reserve the frame still arriving from the memory budget before reading on; wait
        (not reading) while the budget is short. ``stop_reading`` cancels the wait."""
        if self._pool.try_reserve(size):
            self._reservation = size
            return
        log.debug("the connection from %s waits for %d bytes of the request memory budget (%d of %d held)",
                  self._peer, size, self._pool.reserved, self._pool.capacity)
        if self._reading and not self._server.closing:
            self._read_waiting = True
            await self._pool.reserve(size)
            self._read_waiting = False
            self._reservation = size

    def _release_all(self) -> None:
        if self._reservation:
            self._pool.release(self._reservation)
            self._reservation = 0

    def _mute(self, throttle_ms: int) -> None:
        self._muted_until = max(self._muted_until, trio.current_time() + throttle_ms / 1000)

    async def _wait_out_throttle(self) -> None:
        """Start nothing more until the throttle time of a client that waits it out itself
        has passed (``Throttled``), as Kafka mutes the channel: one that sends anyway finds
        its requests unread meanwhile. Requests already started go on. ``stop_reading`` ends
        the wait (a graceful shutdown answers what was read without waiting out the throttle)."""
        while self._reading and (until := self._muted_until) > trio.current_time():
            self._unmuted = trio.Event()
            with trio.move_on_at(until):
                await self._unmuted.wait()
        self._unmuted = None
        self._muted_until = 0.0

    async def _wait_for_room(self) -> None:
        while self._pending >= self._max_pending:
            self._room_wanted = True
            await self._changed.wait()

    # -- authentication ---------------------------------------------------------------------

    def _unauthenticated(self, event: Request | BadRequest) -> Body | None:
        """The answer to a request read before SASL completed that may not be served then
        (and the connection closes after it), or None to serve it."""
        name = getattr(event.header.api_key, "name", "") if isinstance(event, Request) else ""
        self._requests_before_auth += 1
        too_many = self._requests_before_auth > PRE_AUTH_MAX_REQUESTS
        if ServerAuthenticator.allows(name) and not too_many:
            return None
        self._server.counters.invalid += 1
        self.stop_reading()
        self._linger = True
        log.info("closing the connection from %s on listener %s: %s before SASL authentication",
                 self._peer, self._server.listener,
                 f"more than {PRE_AUTH_MAX_REQUESTS} requests" if too_many else name or "a malformed request")
        if too_many:  # each decoded on the event loop, and any frame up to SASL_MAX_FRAME_BYTES
            return error_body(SASL_AUTHENTICATION_FAILED, (
                f"listener {self._server.listener} serves at most {PRE_AUTH_MAX_REQUESTS} requests before "
                "SASL authentication completes"))
        return error_body(SASL_AUTHENTICATION_FAILED, (
            f"listener {self._server.listener} ({self._server.security.protocol}) requires SASL authentication "
            f"before {name or 'any request'}: connect with security_protocol={self._server.security.protocol} "
            f"and a sasl_mechanism of {', '.join(self._server.security.sasl_mechanisms)}"))

    def _sasl(self, event: Request) -> Result | None:
        """A SaslHandshake or SaslAuthenticate while authenticating (None: not one of them)."""
        auth = self._auth
        if auth is None or auth.complete:
            return None
        key = event.header.api_key
        if key == ApiKey.SASL_HANDSHAKE:
            step = auth.handshake(SaslHandshakeRequest.from_body(event.body).mechanism)
            if auth.state is SaslState.FAILED:
                self.stop_reading()
            return SaslHandshakeResponse(step.error.code, list(step.mechanisms), step.message)
        if key == ApiKey.SASL_AUTHENTICATE:
            return self._authenticate(SaslAuthenticateRequest.from_body(event.body).auth_bytes)
        return None

    async def _authenticate(self, auth_bytes: bytes) -> SaslAuthenticateResponse:
        auth = self._auth
        step: Step = await trio.to_thread.run_sync(auth.authenticate, auth_bytes, limiter=self._server.sasl_limiter)
        if auth.complete:
            self._principal = auth.principal
            self._conn.max_frame_bytes = self._server.max_frame_bytes
            self._max_pending = self._server.max_in_flight_per_connection
            self._auth = None
            log.debug("%s authenticated as %s with %s", self._peer, self._principal, auth.mechanism)
        elif step.failed:
            log.info("SASL authentication from %s on listener %s failed: %s", self._peer,
                     self._server.listener, step.message)
            self.stop_reading()  # answer, then close
            self._linger = True
            await trio.sleep(self._server.security.failed_authentication_delay_s)
        return SaslAuthenticateResponse(step.error.code, step.message, step.auth_bytes)

    # -- handling ---------------------------------------------------------------------------

    def _begin(self, event: Request | BadRequest) -> Result:
        """Called by the reader, in request order: the handler's result, an awaitable of it,
        or the error body when the request cannot or did not get that far."""
        counters = self._server.counters
        if self._auth is not None and (refusal := self._unauthenticated(event)) is not None:
            return refusal
        if isinstance(event, BadRequest):
            counters.invalid += 1
            return error_body(event.error.error, str(event.error))
        counters.requests[int(event.header.api_key)] += 1
        try:
            api_for(event.header)
            if self._auth is not None and (answer := self._sasl(event)) is not None:
                return answer
            context = (self._context(event.header, principal=self._principal, kafka_version=event.version,
                                     client_throttles=event.client_throttles) if self._kafka
                       else self._context(event.header, principal=self._principal))
            return self._server.handler(context, event.body)
        except Exception as exc:
            return self._handler_error(event.header, exc)

    async def _finish(self, event: Request | BadRequest, started: Result, reserved: int = 0) -> None:
        """The request's own task: await the handler, then respond and write. ``reserved``:
        the frame's reservation, given back when the handler is done (always: a connection
        closing cancels this task, never skips it). A handler done with its part may leave a
        deferred response (an acks=all produce validated in a worker thread, appended, then
        waiting for replication): it is awaited here holding neither the frame's reservation
        nor the request."""
        correlation_id = _correlation_id(event)
        try:
            body = await self._settle(event, started)
        finally:
            if reserved:
                self._pool.release(reserved)
            del event, started
            self._handler_done()
        if is_deferred(body):
            self._running += 1  # the connection is not idle meanwhile
            try:
                body = await _answer_of(body)
            finally:
                self._handler_done()
        self._respond(correlation_id, body)
        if not self._write_now():
            await self._flush()

    def _complete_deferred(self, deferred: DeferredResponse, correlation_id: int | None,
                           body: Body | Message | None) -> None:
        """A deferred request's answer (called by whoever completed it, on the Trio thread)."""
        if deferred not in self._deferred:
            return  # the connection closed (cancelled) or answered already
        self._deferred.discard(deferred)
        try:
            self._respond(correlation_id, body)
            if not self._write_now() and self._requests is not None:
                self._requests.start_soon(self._flush)
        finally:  # after the write (a consumer's answer waits for nothing else), and always
            self._handler_done()
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
        self._activity += 1
        if self._room_wanted:
            self._notify()

    async def _settle(self, event: Request | BadRequest, started: Result) -> Body | Message | None:
        if not is_awaitable(started):
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
        if type(body) is Throttled:  # KIP-219: answered now, the connection muted after it
            self._mute(body.throttle_ms)
            body = body.response
        if body is CLOSE_CONNECTION:  # no response; the requests read already are answered
            log.debug("closing the connection from %s: request %d failed with no response to tell it",
                      self._peer, correlation_id)
            self._to_outbox(functools.partial(self._conn.skip_response, correlation_id))
            self.stop_reading()
            return
        if body is not None and self._requests is not None and (
                encode := self._conn.slow_encoder(correlation_id, body)) is not None:
            self._requests.start_soon(self._respond_encoded_aside, correlation_id, encode)
            return
        if body is None:
            self._to_outbox(functools.partial(self._conn.skip_response, correlation_id))
        else:
            self._to_outbox(functools.partial(self._encode, correlation_id, body))

    def _to_outbox(self, answer: Callable[[], bytes]) -> None:
        """Queue what ``answer`` releases for writing (it completes one request, and maybe
        the parked ones behind it), counting the requests it completed."""
        before = self._conn.in_flight
        self._outbox += answer()
        self._outbox_count += before - self._conn.in_flight

    async def _respond_encoded_aside(self, correlation_id: int, encode: Callable[[], bytes]) -> None:
        """A response too costly to encode on the event loop (see ``slow_encoder``): encoded in
        a worker thread, then answered in its place in the response order."""
        self._running += 1  # the connection is not idle meanwhile
        frame = None
        try:
            frame = await trio.to_thread.run_sync(encode)
        except Exception:
            self._to_outbox(functools.partial(self._unencodable, correlation_id))  # logs what was caught
        finally:
            self._running -= 1
            self._activity += 1
        if frame is not None:
            self._to_outbox(functools.partial(self._conn.send_frame, correlation_id, frame))
        if not self._write_now():
            await self._flush()

    def _encode(self, correlation_id: int, body: Body | Message) -> bytes:
        try:
            return self._conn.send_response(correlation_id, body)
        except Exception:  # the handler returned something that does not encode
            return self._unencodable(correlation_id)

    def _unencodable(self, correlation_id: int) -> bytes:
        """Answer UNKNOWN_SERVER_ERROR for a response that did not encode (logged, counted);
        called in the ``except`` that caught why."""
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
            if self._tls:
                return False  # through the TLS layer: _flush's send_all
            try:
                sent = os.write(self._fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:
                return False  # _flush's send_all raises it and closes the connection
            if sent < len(data):
                del data[:sent]
                return False
            self._outbox = bytearray()
            self._activity += 1
        self._outbox_count = 0
        self._pending -= count
        if self._room_wanted:
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
                    self._activity += 1
                self._pending -= count
                self._notify()

    def _notify(self) -> None:
        """Wake the reader if it waits for room (callers on the hot path check first)."""
        if self._room_wanted:
            self._room_wanted = False
            self._changed.set()
            self._changed = trio.Event()


async def _answer_of(deferred: DeferredResponse) -> Body | Message | None:
    """Wait for a deferred response's answer; cancelled, it is cancelled too."""
    answers: list = []
    answered = trio.Event()

    def complete(body: Body | Message | None) -> None:
        answers.append(body)
        answered.set()

    deferred.attach(complete)
    try:
        await answered.wait()
    except trio.Cancelled:
        if not answers:
            deferred.cancel()
        raise
    return answers[0]


async def _drain(stream: trio.abc.ReceiveStream) -> None:
    """Before closing a refused connection, read and drop what the client still sends, until
    it closes or ``LINGER_S`` pass: closing a socket with unread bytes sends a reset, which
    can destroy the refusal in the client's receive buffer before it is read (the client
    would see a broken connection instead of the reason)."""
    with trio.move_on_after(LINGER_S):
        try:
            while await stream.receive_some(READ_BYTES):
                pass
        except _CONNECTION_ERRORS:
            pass


def _correlation_id(event: Request | BadRequest) -> int:
    return event.header.correlation_id if isinstance(event, Request) else event.correlation_id


def _ip_overrides(value: str | None) -> dict[str, int]:
    return parse_ip_overrides(value) if value else {}


def _peer_host(stream: trio.SocketStream) -> str:
    try:
        return str(stream.socket.getpeername()[0])
    except (OSError, ValueError, IndexError):
        return "?"


def _descriptor_budget() -> float:
    """Client connections the descriptor limit allows, keeping a headroom for the broker's
    own files (segments, indexes, ZooKeeper, other brokers)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return math.inf
    return max(1, soft - max(DESCRIPTOR_HEADROOM_MIN, soft // 4))


def _peer_name(sock: trio.socket.SocketType) -> str:
    try:
        host, port, *_ = sock.getpeername()
    except (OSError, ValueError):
        return "?"
    return f"{host}:{port}"


def _api_name(api_key: int) -> str:
    return getattr(api_key, "name", f"api key {api_key}")
