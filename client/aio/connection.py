"""One TCP connection to one broker: pipelined requests, responses paired in order.

Theory of operation. The sans-IO ``protocol.connection.ClientConnection`` numbers requests and
checks that every response carries the id of the oldest request still awaiting one (docs/architecture.md,
section 3: responses come back in request order). This module only moves bytes:

* ``request`` frames a request, appends a ``_Pending`` to a FIFO that runs in lockstep with the
  ClientConnection's FIFO of correlation ids (both are appended with no checkpoint between),
  writes the frame, and waits for its pending entry to be completed.
* ONE reader task (``run``) reads the stream, feeds the ClientConnection, and completes the
  pending entries in order. Responses are decoded into their typed message by the caller,
  so a body that does not match its schema fails that request only.
* Writes go through one lock. A frame is put in an outbox before the lock is taken, and the
  holder of the lock writes everything in the outbox with one ``send_all``: requests issued
  while a write is in progress are coalesced into the next write (never a syscall per record;
  a produce request already carries whole batches). The write is shielded from cancellation
  (with its own deadline): a half-written frame would corrupt the stream for everybody.
  When no write is in progress and the kernel takes the whole outbox at once (the usual
  case), the frame is written straight away with ``os.write``, without the lock, the shield
  or any trip through Trio's scheduler; the reader likewise reads with ``os.read`` and waits
  only when nothing is there (each Trio socket call yields once even when it need not wait,
  and those round trips cost more than a small request's own work).
* One other thread may write: the blocking producer's application thread frames and writes
  a request itself (``start_request_from_thread``) while the loop thread reads. Framing,
  the pending FIFO, the outbox and the fast write are under ``thread_lock`` (loop thread
  included), and a pending entry goes into the FIFO before its frame is written, so the
  reader always finds the entry of the response it reads.
* At most ``max_in_flight`` requests await a response (a semaphore); acks=0 produce requests
  (``send_no_response``) expect none and do not count.
* Security: on a TLS listener the stream is a ``trio.SSLStream`` (the bytes pass through
  the TLS layer, so the ``os.write``/``os.read`` fast paths are skipped: every write takes
  the locked path and the reader uses ``receive_some``); SASL is done before ``started``
  (``tidelog.security.open_stream``), so no request is sent unauthenticated.
* Quotas (KIP-219): a response with ``throttle_time_ms`` > 0 sets ``throttled_until`` (the
  request's send time plus the throttle); nothing more is sent on the connection before it.
  A broker that delays its throttled responses has served the throttle by then.
* Any I/O error, protocol violation or request timeout fails the connection for good: every
  pending request gets a ``BrokerConnectionError`` (retriable, invalidates metadata), the
  socket is closed and the reader ends. A timed-out request closes the connection as Kafka's
  NetworkClient does, because its response may still arrive and the broker is evidently stuck.
  A caller cancelled while waiting only abandons its entry: the response is read and dropped.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from tidelog.errors import (
    AuthenticationFailedError,
    BrokerConnectionError,
    RequestTimedOut,
    SslAuthenticationError,
    decode_response,
)
from tidelog.protocol.apis import response_type
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.errors import InvalidRequestError
from tidelog.protocol.frames import MAX_FRAME_BYTES_DEFAULT
from tidelog.security import SecurityConfig, open_stream

__all__ = ["BrokerConnection"]

READ_SIZE = 256 * 1024


class _Pending:
    """A request awaiting its response: completed by the reader (body) or by a failure.
    With ``early`` (see ``BrokerConnection.request``), the reader also decodes the body
    and calls ``early(response)`` before waking the waiting task. Its Trio event is made by
    the first ``wait`` (on the loop thread, as is ``settle``): a request an application
    thread wrote may be answered before any task waits for it, and then none does."""

    __slots__ = ("done", "event", "body", "error", "early", "api_key", "response", "early_error", "sent_at")

    def __init__(self, early: Callable[[Any], None] | None = None, api_key: int = -1,
                 sent_at: float | None = None) -> None:
        self.done = False
        self.event: trio.Event | None = None
        self.body: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.early = early
        self.api_key = api_key
        self.response: Any = None
        self.early_error: BaseException | None = None
        self.sent_at = trio.current_time() if sent_at is None else sent_at

    async def wait(self) -> None:
        if self.done:
            await trio.lowlevel.checkpoint()  # as a set event's wait: a checkpoint all the same
            return
        if self.event is None:
            self.event = trio.Event()
        await self.event.wait()

    def settle(self) -> None:
        """Answered or failed: wake the task waiting, if any."""
        self.done = True
        if self.event is not None:
            self.event.set()

    def run_early(self) -> None:
        try:
            self.response = decode_response(response_type(self.api_key), self.body)
            self.early(self.response)
        except Exception as e:  # raised by ``request`` in the waiting task
            self.early_error = e


class BrokerConnection:
    """A connection to ``host:port`` (broker ``node_id``; bootstrap connections use negative
    ids). Start it with ``await nursery.start(conn.run)``: connecting happens before
    ``started``, so a connect failure is raised by ``nursery.start`` as BrokerConnectionError."""

    def __init__(self, host: str, port: int, *, node_id: int = -1, client_id: str | None = None,
                 max_in_flight: int = 5, request_timeout_s: float = 30.0,
                 connect_timeout_s: float = 10.0, max_frame_bytes: int = MAX_FRAME_BYTES_DEFAULT,
                 security: SecurityConfig | None = None):
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.host = host
        self.port = port
        self.node_id = node_id
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._proto = ClientConnection(max_frame_bytes, client_id)
        self._slots = trio.Semaphore(max_in_flight)
        self._send_lock = trio.Lock()
        # taken around framing, the pending FIFO and the fast write, by the loop thread and
        # by an application thread writing a request itself (start_request_from_thread)
        self._thread_lock = threading.RLock()  # _fail may run inside it (from _write_now)
        self._clock: trio.abc.Clock | None = None
        self._outbox: list[bytes] = []
        self._pending: deque[_Pending] = deque()
        self.security = security
        self._tls = security is not None and security.uses_tls
        self._stream: trio.abc.Stream | None = None
        self._socket: trio.socket.SocketType | None = None  # under the TLS layer, if any
        self._scope: trio.CancelScope | None = None
        self._failure: BrokerConnectionError | AuthenticationFailedError | None = None
        self.closed_event = trio.Event()
        self.throttled_until = 0.0  # Trio time: a quota throttle's end (KIP-219)

    def __repr__(self) -> str:
        return f"<BrokerConnection node {self.node_id} {self.host}:{self.port}>"

    @property
    def closed(self) -> bool:
        return self._failure is not None

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def thread_lock(self) -> threading.RLock:
        """Held around framing, the pending FIFO and writes; an application thread holds it
        from ``idle`` to ``start_request_from_thread`` so that nothing is written between."""
        return self._thread_lock

    @property
    def writes_from_thread(self) -> bool:
        """Whether ``start_request_from_thread`` can write here (not through a TLS layer,
        running)."""
        return not self._tls and self._clock is not None

    def idle(self, now: float) -> bool:
        """Open, unthrottled at Trio time ``now``, nothing in flight, queued or being
        written. Any thread (under ``thread_lock`` for the answer to hold)."""
        return (self._failure is None and self.throttled_until <= now and not self._pending
                and not self._outbox and not self._send_lock.locked())

    @property
    def unwritten(self) -> bool:
        """Bytes wait in the outbox for a ``finish_request`` (or the writer at work) to write
        them: the kernel did not take a thread's whole request. Under ``thread_lock``."""
        return bool(self._outbox)

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, report started, then read responses until closed or failed."""
        with trio.CancelScope() as self._scope:
            self._clock = trio.lowlevel.current_clock()
            self._stream = await self._connect()
            task_status.started()
            try:
                await self._read_loop()
            finally:
                self._fail(BrokerConnectionError(f"{self} closed"))

    async def _connect(self) -> trio.abc.Stream:
        stream = await open_stream(self.host, self.port, self.security, self._proto,
                                   connect_timeout_s=self.connect_timeout_s,
                                   describe=f"node {self.node_id} at {self.host}:{self.port}")
        self._socket = stream.transport_stream.socket if isinstance(stream, trio.SSLStream) else stream.socket
        return stream

    async def close(self) -> None:
        """Fail everything in flight (BrokerConnectionError) and close the socket."""
        self._fail(BrokerConnectionError(f"{self} closed"))
        await trio.lowlevel.checkpoint()

    def abort(self, reason: str) -> None:
        """``close`` from synchronous code: pending requests fail at once with
        BrokerConnectionError(``"<this connection>: <reason>"``)."""
        self._fail(BrokerConnectionError(f"{self}: {reason}"))

    # -- requests -------------------------------------------------------------------------------

    async def request(self, message: Message, *, api_key: ApiKey, timeout: float | None = None,
                      api_version: int = 0, early: Callable[[Any], None] | None = None,
                      queued: Callable[[], None] | None = None) -> Any:
        """Send ``message`` and return the typed response (``protocol.apis.response_type(api_key)``).

        Raises RequestTimedOut after ``timeout`` seconds (default: the connection's request
        timeout; the connection is then closed), BrokerConnectionError if the connection
        fails, InvalidRequestError if the response body does not match its schema.

        ``early(response)``, if given, is called by the reader with the typed response as
        soon as it is read, in the same scheduler pass (this task wakes a pass later): the
        consumer hands fetched records to a waiting application thread that way. What it
        raises (and a body that does not decode) is raised here instead of the response.

        ``queued()``, if given, is called once the request's frame has its place in the
        connection's order (behind every frame queued before it, ahead of every later one),
        before this task next yields; not at all if it never gets there (timeout, failure):
        a caller whose requests must reach the wire in its order issues the next one after."""
        timeout = self.request_timeout_s if timeout is None else timeout
        if self.throttled_until > trio.current_time():  # not part of the request's timeout
            await trio.sleep_until(self.throttled_until)
        with trio.move_on_after(timeout) as scope:
            # a free slot is taken without a trip through the scheduler (acquire always yields)
            try:
                self._slots.acquire_nowait()
            except trio.WouldBlock:
                await self._slots.acquire()
            try:
                pending = await self._write(api_key, api_version, message, expect_response=True,
                                            early=early, queued=queued)
                await pending.wait()
            finally:
                self._slots.release()
        return self._outcome(pending, scope, api_key, timeout)

    def start_request(self, message: Message, *, api_key: ApiKey, api_version: int = 0,
                      early: Callable[[Any], None] | None = None) -> _Pending | None:
        """The first half of ``request``, synchronous: when a slot is free and no write is in
        progress, frame ``message`` and hand it to the kernel right now, and return its
        pending entry (the caller then MUST ``await finish_request(pending, ...)``, which
        holds the slot until the response). None: nothing was done, use ``request``.

        A caller woken by another thread (the blocking producer's sender) writes its request
        in the same scheduler pass instead of two passes later in a task of its own: every
        pass costs a poll of the event loop, in which another thread can take the GIL.``early``: as for ``request``.
        """
        self._raise_if_failed()
        if self._send_lock.locked() or self.throttled_until > trio.current_time():
            return None
        with self._thread_lock:
            try:
                self._slots.acquire_nowait()
            except trio.WouldBlock:
                return None
            try:
                _, frame = self._proto.send_request(api_key, api_version, message, True)
            except BaseException:
                self._slots.release()
                raise
            pending = _Pending(early, api_key)
            self._pending.append(pending)  # lockstep with the ClientConnection's FIFO
            self._outbox.append(frame)
            self._write_now()  # what the kernel does not take now, finish_request writes
        return pending

    def start_request_from_thread(self, message: Message, *, api_key: ApiKey, api_version: int = 0,
                                  early: Callable[[Any], None] | None = None,
                                  now: float | None = None) -> _Pending | None:
        """``start_request`` from a thread other than the loop's: frame the request and write
        it now, or, when a write is in progress or queued, queue it behind (the frames keep
        the order of the calls); what the kernel does not take at once waits in the outbox
        for ``finish_request``. None, with nothing done, when the connection failed or is
        throttled. It takes no in-flight slot (a Trio object the loop
        thread owns): the caller MUST then, on the loop thread, ``await
        finish_request(pending, ..., take_slot=True)``. The blocking producer's application
        thread writes its sender's requests this way, sparing the wake-up of the loop thread
        before the request is on the wire. ``now``: the loop's clock, read by a caller that
        holds ``thread_lock`` already (as for its ``idle``)."""
        if self._tls or self._clock is None:
            return None
        with self._thread_lock:
            if now is None:
                now = self._clock.current_time()
            if self._failure is not None or self.throttled_until > now:
                return None
            _, frame = self._proto.send_request(api_key, api_version, message, True)
            pending = _Pending(early, api_key, now)
            self._pending.append(pending)  # lockstep with the ClientConnection's FIFO; before
            if self._outbox or self._send_lock.locked():  # the write: the answer may come at once
                self._outbox.append(frame)  # behind the frames before it: finish_request writes it
                return pending
            try:
                sent = os.write(self._socket.fileno(), frame)
            except OSError:  # full (or failed: the loop's write finds out and fails the request)
                sent = 0
            if sent < len(frame):
                self._outbox.append(memoryview(frame)[sent:])  # finish_request writes the rest
        return pending

    async def finish_request(self, pending: _Pending, *, api_key: ApiKey, timeout: float | None = None,
                             take_slot: bool = False) -> Any:
        """The second half of a ``start_request``: the typed response, or the errors of
        ``request``. Releases the slot ``start_request`` took (``take_slot``: takes it
        first, after a ``start_request_from_thread``)."""
        timeout = self.request_timeout_s if timeout is None else timeout
        if take_slot:
            await self._slots.acquire()
        try:
            with trio.move_on_after(timeout) as scope:
                if self._outbox and self._failure is None:  # the kernel did not take it all
                    await self._flush_shielded()
                await pending.wait()
        finally:
            self._slots.release()
        return self._outcome(pending, scope, api_key, timeout)

    def _outcome(self, pending: _Pending, scope: trio.CancelScope, api_key: ApiKey, timeout: float) -> Any:
        if scope.cancelled_caught:
            self._fail(BrokerConnectionError(f"{self}: a request timed out, connection closed"))
            raise RequestTimedOut(f"{ApiKey(api_key).name} request to node {self.node_id} "
                                  f"({self.host}:{self.port}) timed out after {timeout:g} s")
        if pending.error is not None:
            raise _copy(pending.error)
        if pending.early is not None:
            if pending.early_error is not None:
                raise pending.early_error
            return pending.response
        try:
            return decode_response(response_type(api_key), pending.body)
        except AuthenticationFailedError as e:  # the broker refused us and closes: nothing more here
            self._fail(e)
            raise

    async def send_no_response(self, message: Message, *, api_key: ApiKey, api_version: int = 0,
                               queued: Callable[[], None] | None = None) -> None:
        """Write a request the broker will not answer (an acks=0 produce). Returns once the
        bytes are handed to the kernel; raises BrokerConnectionError if that failed.
        ``queued``: as for ``request``."""
        if self.throttled_until > trio.current_time():
            await trio.sleep_until(self.throttled_until)
        await self._write(api_key, api_version, message, expect_response=False, queued=queued)

    async def _write(self, api_key: int, api_version: int, message: Message,
                     expect_response: bool, early: Callable[[Any], None] | None = None,
                     queued: Callable[[], None] | None = None) -> _Pending:
        self._raise_if_failed()
        with self._thread_lock:
            _, frame = self._proto.send_request(api_key, api_version, message, expect_response)
            pending = _Pending(early, api_key)
            if expect_response:
                self._pending.append(pending)  # lockstep with the ClientConnection's FIFO
            self._outbox.append(frame)
            written = self._write_now()
        if queued is not None:  # in order now: whatever is queued later goes behind it
            queued()
        if not written:
            await self._flush_shielded()
        if not expect_response:
            self._raise_if_failed()
        return pending

    async def _flush_shielded(self) -> None:
        """Write the outbox under the lock, shielded from cancellation (a half-written frame
        would corrupt the stream) but with its own deadline."""
        with trio.CancelScope(shield=True, deadline=trio.current_time() + self.request_timeout_s) as scope:
            async with self._send_lock:
                await self._flush_outbox()
        if scope.cancelled_caught:
            self._fail(BrokerConnectionError(f"{self}: writing a request timed out, connection closed"))

    def _write_now(self) -> bool:
        """The fast path of a write: with no writer in progress, hand the outbox to the
        kernel right now (nothing awaits, so nothing can interrupt the frame). Returns False
        if the caller must take the locked, awaiting path for what is left (at the front of
        the outbox, so frames stay in order)."""
        if self._send_lock.locked():
            return False
        if not self._outbox or self._failure is not None:
            return True
        if self._tls:
            return False  # the bytes go through the TLS layer: send_all
        data = self._outbox[0] if len(self._outbox) == 1 else b"".join(self._outbox)
        try:
            sent = os.write(self._socket.fileno(), data)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            self._fail(BrokerConnectionError(f"{self}: write failed: {e or type(e).__name__}"))
            return True
        if sent == len(data):
            self._outbox.clear()
            return True
        self._outbox[:] = [memoryview(data)[sent:]]
        return False

    async def _flush_outbox(self) -> None:
        with self._thread_lock:
            if not self._outbox or self._failure is not None:
                return  # an earlier holder of the lock wrote our frame (or the connection failed)
            data = self._outbox[0] if len(self._outbox) == 1 else b"".join(self._outbox)
            self._outbox.clear()
        try:
            if self._tls:
                await self._stream.send_all(data)
            else:
                await send_all(self._stream, data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            self._fail(BrokerConnectionError(f"{self}: write failed: {e or type(e).__name__}"))

    # -- reading --------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        try:
            reader = self._stream if self._tls else Reader(self._stream, READ_SIZE)
            while True:
                data = await reader.receive_some(READ_SIZE)
                if not data:
                    raise BrokerConnectionError(f"{self}: the broker closed the connection")
                for _, body in self._proto.receive_data(data):
                    # failed meanwhile (a refusal decoded by a request, or an early callback):
                    # every request it had pending was answered with the failure
                    if self._failure is not None:
                        return
                    if not self._pending:
                        raise BrokerConnectionError(f"{self}: a response to no request in flight")
                    pending = self._pending.popleft()
                    pending.body = body
                    throttle = body.get("throttle_time_ms")
                    if type(throttle) is int and throttle > 0:  # KIP-219: wait before the next request
                        self.throttled_until = max(self.throttled_until, pending.sent_at + throttle / 1000)
                    if pending.early is not None:
                        pending.run_early()
                    pending.settle()
        except BrokerConnectionError as e:
            self._fail(e)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            if isinstance(e.__cause__, ssl.SSLError):  # TLS 1.3: a refused client certificate shows here
                self._fail(SslAuthenticationError(
                    f"{self}: the broker ended the TLS session: {e.__cause__.reason or e.__cause__} "
                    "(does the listener require a client certificate this client does not present?)"))
            else:
                self._fail(BrokerConnectionError(f"{self}: read failed: {e or type(e).__name__}"))
        except InvalidRequestError as e:
            self._fail(BrokerConnectionError(f"{self}: protocol violation, connection closed: {e}"))

    # -- failure --------------------------------------------------------------------------------

    def _fail(self, error: BrokerConnectionError | AuthenticationFailedError) -> None:
        """Fail the connection for good (idempotent): pending requests get ``error``."""
        with self._thread_lock:
            if self._failure is not None:
                return
            self._failure = error
            pending, self._pending = self._pending, deque()
        for p in pending:
            p.error = error
            p.settle()
        self._outbox.clear()
        if self._socket is not None:
            self._socket.close()  # trio notifies any task blocked on the socket
        if self._scope is not None:
            self._scope.cancel()
        self.closed_event.set()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise _copy(self._failure)


async def send_all(stream: trio.SocketStream, data: bytes) -> None:
    """``stream.send_all(data)``, except that when the kernel takes all of ``data`` at once
    (the usual case) it is one ``os.write``, with no trip through Trio's scheduler: every
    Trio socket operation yields to the scheduler once even when it need not wait, and in
    this VM a request/response spent more time in those round trips than in its own work.
    Whatever the kernel did not take goes through ``send_all``. The caller serializes
    writers (as ``send_all`` requires)."""
    try:
        sent = os.write(stream.socket.fileno(), data)
    except BlockingIOError:
        sent = 0
    if sent < len(data):
        await stream.send_all(memoryview(data)[sent:])


class Reader:
    """``receive_some`` for one reader of a socket, by ``os.read`` on the non-blocking socket:
    it waits (``wait_readable``, a checkpoint) only when nothing is there, and otherwise
    checkpoints every ``YIELD_EVERY`` reads so a busy socket cannot starve other tasks."""

    YIELD_EVERY = 16

    def __init__(self, stream: trio.SocketStream, max_bytes: int):
        self._socket = stream.socket
        self._max_bytes = max_bytes
        self._unyielding = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """The next bytes (b"" at end of stream; at most the constructor's ``max_bytes``,
        the argument is there for ``trio.abc.ReceiveStream``'s signature); raises OSError or
        trio.ClosedResourceError."""
        while True:
            try:
                data = os.read(self._socket.fileno(), self._max_bytes)
            except BlockingIOError:
                self._unyielding = 0
                await trio.lowlevel.wait_readable(self._socket)
                continue
            self._unyielding += 1
            if self._unyielding >= self.YIELD_EVERY:
                self._unyielding = 0
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data


def _copy(error: BaseException) -> BaseException:
    """A fresh instance per raise: one exception object raised in many tasks would collect
    every task's traceback."""
    return type(error)(str(error))

