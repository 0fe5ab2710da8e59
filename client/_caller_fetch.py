"""The blocking consumer's fetching on its application's thread.

A blocking ``Consumer`` without a group, on a PLAINTEXT listener, fetches from the thread
that calls ``poll``: over sockets of its own (one per leader), it writes each fetch request,
waits for the response in ``poll(2)``, reads and decodes it, and hands the records out, all
in that thread. The other path (the client's event loop fetching, and handing the records
over to the polling thread) costs two wake-ups of idle threads per response where this one
has one, and the loop's next fetch request waits for both: at a low rate, a record written
meanwhile found no fetch waiting at the broker. Here the next fetch goes out before the
records are returned (Kafka's pipelining, as its ``poll`` does), except when nothing is
left to fetch and the application comes straight back (below).

Rules.

* The event loop still owns everything else: metadata (a stale leader asks it for a refresh),
  position resets (ListOffsets), ``seek``, ``assign``, ``position``, and opening the sockets
  (``_open``: name lookup and connect never block ``poll``; a node that failed is tried again
  after the reconnect backoff, and a failure asks for new metadata). Its fetcher does not
  fetch (``Fetcher.fetch_in_loop`` is False); it calls ``notify`` whenever it changed what
  can be fetched (a reset done, new metadata, an assignment, a socket opened), which ends the
  wait.
* What the loop does on its own while a poll runs (a reset's outcome) and what the poll does
  to the partitions' states (plan, absorb, drain) happen under ``Fetcher.state_lock``; the
  calls the application makes between polls (seek, assign, pause) never overlap a poll, as
  the consumer is used from one thread. The plan, the absorption of a response and the
  hand-out of records are the loop's own pure functions (``plan_fetches``,
  ``Fetcher.absorb``, ``Fetcher.drain``); deserializers run outside the lock.
* One fetch in flight per node, bounded by ``request_timeout_ms + fetch_max_wait_ms`` without
  a byte of its response; a response that does not come by then, a connection that fails or
  a frame that does not decode closes that node's socket, backs its partitions off
  ``retry_backoff_ms`` and asks for new metadata, as the loop's fetcher does. A response
  whose partitions were sought meanwhile is discarded by its generation
  (``handle_partition_response``). A throttled response (KIP-219) holds the node's next
  fetch until the throttle ends. A whole-request refusal that is not retriable is raised by
  ``poll``. Whatever interrupts ``poll`` (Ctrl-C), the partitions it planned are released.
* ``poll`` reads what has arrived at least once, even with ``timeout_ms`` 0.
* A caught-up consumer (every partition to fetch was fetched up to its high watermark and
  holds nothing buffered) whose application called ``poll`` again within
  ``DEFER_WITHIN_S`` of the last return of records does not write the next fetch before returning
  records: the next ``poll`` writes it first thing. Writing it costs tens of microseconds
  (plan, encode, ``send``) that a record waiting at a low rate would otherwise spend before
  ``poll`` returns it; what an application that comes straight back gives up is small (a
  record written during its short absence waits for the next fetch's round trip). One that
  is behind, or that was away longer (working on its records), has its next fetch answered
  meanwhile.
* ``wakeup`` (any thread) ends the wait: the loop sets the consumer's flag and notifies.
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import trio

from tidelog.aio.cluster import Backoff
from tidelog.aio.fetcher import FetchPlan, plan_fetches, raised_by_poll
from tidelog.errors import BrokerConnectionError, ClientClosedError, TidelogError, decode_response
from tidelog.protocol.apis import response_type
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import ClientConnection
from tidelog.protocol.errors import InvalidRequestError
from tidelog.records import Record

if TYPE_CHECKING:
    from tidelog._portal import Portal
    from tidelog.aio.consumer import AsyncConsumer

__all__ = ["CallerFetch", "caller_can_fetch"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
MAX_WAIT_MS = 2**31 - 1  # poll(2)'s bound; a longer wait is several
DEFER_WITHIN_S = 0.0005  # see the rules: an application back within this defers a caught-up fetch


def caller_can_fetch(consumer: AsyncConsumer) -> bool:
    """Whether the blocking facade may fetch on its caller's thread: no group (its poll does
    the group's work on the loop) and a PLAINTEXT listener (TLS and SASL live in the loop's
    connections)."""
    return consumer.polls_without_task and consumer.config.security_protocol == "PLAINTEXT"


class _Link:
    """The socket to one node and its fetch in flight. Its descriptor is read and written
    directly: the socket's timeout (which bounds ``sendall``) makes each of its own ``recv``
    and ``send`` call poll(2) first, a system call more on the path of every response. The
    descriptor is asked of the socket each time (-1 once closed), never kept: a number
    kept could name another file by then."""

    __slots__ = ("node", "sock", "proto", "plan", "sent", "expires", "throttled_until")

    def __init__(self, node: int, sock: socket.socket, proto: ClientConnection):
        self.node, self.sock, self.proto = node, sock, proto
        self.plan: FetchPlan | None = None
        self.sent = self.expires = self.throttled_until = 0.0


class CallerFetch:
    """Fetching for ``consumer`` (an AsyncConsumer run by ``portal``) on the thread that
    calls ``poll``. ``close`` releases the sockets."""

    def __init__(self, consumer: AsyncConsumer, portal: Portal):
        self._aio = consumer
        self._portal = portal
        self._fetcher = consumer._fetcher
        self._cluster = consumer._cluster
        self._config = consumer.config
        self._links: dict[int, _Link] = {}
        self._opening: set[int] = set()  # nodes the loop is connecting to
        self._opened: deque[tuple[int, socket.socket | BaseException]] = deque()  # from the loop
        self._backoffs: dict[int, Backoff] = {}
        self._not_before: dict[int, float] = {}  # node -> no connect before (monotonic)
        self._backoff_s = self._config.retry_backoff_ms / 1000
        self._timeout_s = (self._config.request_timeout_ms + self._config.fetch_max_wait_ms) / 1000
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._rtype = response_type(ApiKey.FETCH)
        self._closed = False
        self._returned = -math.inf  # when poll last returned records (monotonic)

    def attach(self) -> None:
        """On the loop's thread: the loop stops fetching and notifies this thread instead."""
        self._fetcher.thread_waker = self.notify
        self._fetcher.fetch_in_loop = False

    def notify(self) -> None:
        """Any thread: end the current (or the next) wait of ``poll``."""
        try:
            self._wake_w.send(b"\0")
        except OSError:  # full (a wake-up is pending anyway) or closed
            pass

    def close(self) -> None:
        """After the loop stopped (nothing opens sockets any more): close every socket."""
        self._closed = True
        self.notify()
        for link in list(self._links.values()):
            self._drop(link, None)
        while self._opened:
            _, sock = self._opened.popleft()
            if isinstance(sock, socket.socket):
                sock.close()
        self._wake_r.close()
        self._wake_w.close()

    # -- poll -----------------------------------------------------------------------------------

    def poll(self, timeout_s: float, limit: int) -> list[Record]:
        """Records (at most ``limit``), waiting up to ``timeout_s`` for some; raises what the
        consumer's ``poll`` raises."""
        start = time.monotonic()
        deadline = start + max(0.0, timeout_s)
        # an application that came back at once from its records is likely to again: a
        # caught-up fetch can wait
        quick = start - self._returned < DEFER_WITHIN_S
        aio, lock = self._aio, self._fetcher.state_lock
        self._fetcher.stats.settle()  # the last poll's, off the path of its records
        last = False
        while True:
            if self._closed or aio.closed:
                raise ClientClosedError(f"the consumer is closed{self._portal._crash_note()}")
            if self._opened:
                self._take_opened()
            with lock:
                aio._raise_pending()
                taken = self._fetcher.drain(limit, wake=False)
                plans = {} if taken and quick and self._caught_up() else self._plan()
            if plans:
                try:
                    self._send(plans)
                except BaseException:  # interrupted: the records taken are fetched again
                    aio._rewind(taken)
                    raise
            records = aio._deserialized(taken)  # outside the lock: user code
            if records:
                self._returned = time.monotonic()
            if records or last:
                return records
            now = time.monotonic()
            # at the deadline (or with timeout 0) still read what has arrived, once: a loop of
            # poll(0) gets its records
            last = now >= deadline
            self._wait(0.0 if last else min(deadline, self._next_event(now)) - now)

    def _next_event(self, now: float) -> float:
        """When the wait must end even if nothing arrives: an expiring fetch, the end of a
        backoff or a throttle (the other changes notify)."""
        links = self._links.values()
        times = [link.expires for link in links if link.plan is not None]
        times += [link.throttled_until for link in links if link.throttled_until > now]
        times += [t for t in self._not_before.values() if t > now]
        times.append(now + self._fetcher._next_retry(now))  # the partitions' backoffs, as the loop waits
        return min(times)

    def _wait(self, timeout: float) -> None:
        waiting = {link.sock.fileno(): link for link in self._links.values() if link.plan is not None}
        poller = select.poll()  # not select(): descriptors above 1023 are common in servers
        poller.register(self._wake_r, select.POLLIN)
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        for fd, _ in poller.poll(min(max(0.0, timeout) * 1000, MAX_WAIT_MS)):
            link = waiting.get(fd)
            if link is None:
                try:
                    while self._wake_r.recv(512):
                        pass
                except OSError:  # drained (or closed by close())
                    pass
            elif link.plan is not None and self._links.get(link.node) is link:
                self._read(link)
        now = time.monotonic()
        for link in list(self._links.values()):
            if link.plan is not None and now >= link.expires:
                self._drop(link, f"no fetch response within {self._timeout_s:g} s")

    # -- fetch requests -------------------------------------------------------------------------

    def _caught_up(self) -> bool:
        """Under the state lock: every partition that will be fetched holds nothing buffered and
        was fetched up to its high watermark, as its last response said."""
        for state in self._aio._subscriptions.partitions.values():
            if not state.has_position or state.stopped or state.paused:
                continue
            if state.buffered or not 0 <= state.high_watermark <= state.fetch_offset:
                return False
        return True

    def _plan(self) -> dict[int, FetchPlan]:
        """Under the state lock: a fetch to every leader with a socket and nothing in flight,
        for its fetchable partitions (the loop's own plan), which are marked as fetching.
        Leaders without a socket are asked of the loop."""
        now = time.monotonic()
        busy = [n for n, link in self._links.items() if link.plan is not None or link.throttled_until > now]
        subs = self._aio._subscriptions
        plans, unknown = plan_fetches(subs, self._cluster.metadata, busy, now, self._config)
        if unknown:
            self._portal.run_soon(self._cluster.request_update)
        for node in [n for n in plans if n not in self._links]:
            del plans[node]  # not marked: fetchable again once the socket is open
            if node not in self._opening and self._not_before.get(node, 0.0) <= now and not self._closed:
                self._opening.add(node)
                self._portal.run_soon(self._start_open, node)
        for plan in plans.values():
            self._fetcher.hold(plan)
        return plans

    def _send(self, plans: dict[int, FetchPlan]) -> None:
        """Write the planned fetches. Whatever interrupts this (Ctrl-C) drops the socket it
        was writing (the stream's state is unknown) and releases every plan not sent."""
        items = list(plans.items())
        for i, (node, plan) in enumerate(items):
            link = self._links[node]
            try:
                _, frame = link.proto.send_request(ApiKey.FETCH, 0, plan.request, True)
                link.plan, link.sent = plan, time.monotonic()
                link.expires = link.sent + self._timeout_s
                try:
                    written = os.write(link.sock.fileno(), frame)
                except BlockingIOError:
                    written = 0
                if written < len(frame):  # the rest when the kernel takes it, within the timeout
                    link.sock.sendall(memoryview(frame)[written:])
            except OSError as e:
                self._drop(link, f"write failed: {e}", plan)
            except BaseException:
                self._drop(link, None, plan)
                for _, rest in items[i + 1:]:
                    self._unplan(rest, backoff=False)
                raise

    # -- sockets, opened by the loop ------------------------------------------------------------

    def _start_open(self, node: int) -> None:
        """On the loop's thread."""
        nursery = self._aio._nursery
        try:
            if nursery is None:
                raise RuntimeError("the consumer is not running")
            nursery.start_soon(self._open, node)
        except RuntimeError:  # closing: poll raises ClientClosedError
            self._opening.discard(node)

    async def _open(self, node: int) -> None:
        """On the loop: connect to ``node`` (name lookup in a worker thread, bounded) and hand
        the socket to the polling thread."""
        outcome: socket.socket | BaseException
        try:
            host, port = self._cluster.address_of(node)
            with trio.fail_after(self._cluster.connect_timeout_s):
                stream = await trio.open_tcp_stream(host, port)  # TCP_NODELAY set
            outcome = socket.socket(fileno=stream.socket.detach())
        except (OSError, trio.TooSlowError, BrokerConnectionError) as e:
            outcome = e
            self._cluster.request_update()
        self._opened.append((node, outcome))
        self.notify()

    def _take_opened(self) -> None:
        now = time.monotonic()
        while self._opened:
            node, outcome = self._opened.popleft()
            self._opening.discard(node)
            if isinstance(outcome, BaseException):
                self._back_off_node(node, now)
                log.debug("fetch connection to node %s failed: %s", node, outcome)
                continue
            if node in self._links or self._closed:
                outcome.close()
                continue
            outcome.settimeout(self._config.request_timeout_ms / 1000)  # bounds sendall
            self._links[node] = _Link(node, outcome, ClientConnection(client_id=self._config.client_id))
            self._not_before.pop(node, None)  # the backoff grows until a response comes

    def _back_off_node(self, node: int, now: float) -> None:
        """No new socket to ``node`` before its reconnect backoff (exponential, reset by a
        response): a broker that refuses, or accepts and closes, is not hammered."""
        backoff = self._backoffs.setdefault(
            node, Backoff(self._cluster.reconnect_backoff_s, self._cluster.reconnect_backoff_max_s))
        self._not_before[node] = now + backoff.next_delay()

    # -- fetch responses ------------------------------------------------------------------------

    def _read(self, link: _Link) -> None:
        plan = link.plan
        try:
            self._read_frames(link)
        except BaseException:  # interrupted (Ctrl-C): the stream's state is unknown
            if self._links.get(link.node) is link:
                self._drop(link, None, plan)
            elif plan is not None:
                self._unplan(plan, backoff=False)
            raise

    def _read_frames(self, link: _Link) -> None:
        try:
            try:
                data = os.read(link.sock.fileno(), READ_SIZE)
            except BlockingIOError:  # ready, then not (nothing is lost): wait again
                return
            if not data:
                raise BrokerConnectionError("the broker closed the connection")
            # a response arriving is not a stalled one, however long the application took
            # to come back and read it
            link.expires = time.monotonic() + self._timeout_s
            frames = link.proto.receive_data(data)
        except (OSError, BrokerConnectionError) as e:
            self._drop(link, str(e) or type(e).__name__)
            return
        except Exception as e:  # a frame the protocol refuses: the stream cannot be trusted
            self._drop(link, f"protocol violation: {e}")
            return
        for _, body in frames:
            plan, sent = link.plan, link.sent
            link.plan = None
            try:
                response = decode_response(self._rtype, body)
            except InvalidRequestError as e:
                self._drop(link, f"a fetch response did not decode: {e}", plan)
                return
            except TidelogError as e:  # the broker refused the whole request
                self._unplan(plan)
                if e.retriable:
                    self._portal.run_soon(self._cluster.request_update)
                elif raised_by_poll(e):
                    self._fetcher.errors.add(e)  # raised by this poll
                else:  # the broker failed unexpectedly: retried, as the loop's fetcher does
                    log.warning("fetch from node %s failed: %s", link.node, e)
                continue
            self._backoffs.pop(link.node, None)  # the broker answers: reconnect quickly next time
            throttle = body.get("throttle_time_ms")
            if type(throttle) is int and throttle > 0:
                link.throttled_until = sent + throttle / 1000
            self._absorb(response, plan, sent)

    def _absorb(self, response: Any, plan: FetchPlan, sent: float) -> None:
        with self._fetcher.state_lock:
            self._fetcher.release(plan)
            _, refresh, reset = self._fetcher.absorb(response, plan, sent, time.monotonic())
        if refresh:
            self._portal.run_soon(self._cluster.request_update)
        if reset:
            self._portal.run_soon(self._fetcher.wake)

    def _drop(self, link: _Link, why: str | None, plan: FetchPlan | None = None) -> None:
        """Close ``link``; its fetch in flight (or ``plan``) backs off; ``why`` None: closing."""
        self._links.pop(link.node, None)
        link.sock.close()
        plan = plan or link.plan
        link.plan = None
        if why is not None:
            log.debug("fetch connection to node %s closed: %s", link.node, why)
            self._back_off_node(link.node, time.monotonic())
            self._portal.run_soon(self._cluster.request_update)
        if plan is not None:
            self._unplan(plan)

    def _unplan(self, plan: FetchPlan, backoff: bool = True) -> None:
        """A fetch that failed or was never sent: its partitions may be fetched again (after
        the backoff)."""
        with self._fetcher.state_lock:
            self._fetcher.release(plan, time.monotonic() + self._backoff_s if backoff else None)
