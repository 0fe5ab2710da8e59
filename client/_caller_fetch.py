"""The blocking consumer's fetching on its application's thread.

A blocking ``Consumer`` without a group, on a PLAINTEXT listener, fetches from the thread
that calls ``poll``: over sockets of its own (one per leader), it writes each fetch request,
waits for the response in ``select``, reads and decodes it, and hands the records out, all
in that thread. The other path (the client's event loop fetching, and handing the records
over to the polling thread) costs two wake-ups of idle threads per response where this one
has one, and the loop's next fetch request waits for both: at a low rate, a record written
meanwhile found no fetch waiting at the broker. Here the next fetch goes out before the
records are returned (Kafka's pipelining, as its ``poll`` does).

Rules.

* The event loop still owns everything else: metadata (a stale leader asks it for a refresh),
  position resets (ListOffsets), ``seek``, ``assign``, ``position``. Its fetcher does not
  fetch (``Fetcher.fetch_in_loop`` is False); it calls ``notify`` whenever it changed what
  can be fetched (a reset done, new metadata, an assignment), which ends the ``select``.
* Both threads touch the partitions' states only under ``Fetcher.state_lock``. The plan of
  fetches, the absorption of a response and the hand-out of records are the loop's own pure
  functions (``plan_fetches``, ``Fetcher.absorb``, ``Fetcher.drain``): the same rules, only
  another thread.
* One fetch in flight per node, bounded by ``request_timeout_ms + fetch_max_wait_ms``; a
  response that does not come by then, a connection that fails or a frame that does not
  decode closes that node's socket, backs its partitions off ``retry_backoff_ms`` and asks
  for new metadata, as the loop's fetcher does. A response whose partitions were sought
  meanwhile is discarded by its generation (``handle_partition_response``). A throttled
  response (KIP-219) holds the node's next fetch until the throttle ends.
* ``wakeup`` (any thread) ends the wait: the loop sets the consumer's flag and notifies.
* Nothing here is shared with another thread but the states under the lock and the wake-up
  socket pair, so ``poll`` must not be called from two threads at once (as Kafka's).
"""

from __future__ import annotations

import logging
import select
import socket
import time
from typing import TYPE_CHECKING, Any

from tidelog.aio.fetcher import FetchPlan, plan_fetches
from tidelog.errors import BrokerConnectionError, decode_response
from tidelog.protocol.apis import response_type
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import ClientConnection
from tidelog.records import Record

if TYPE_CHECKING:
    from tidelog._portal import Portal
    from tidelog.aio.consumer import AsyncConsumer

__all__ = ["CallerFetch", "caller_can_fetch"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024


def caller_can_fetch(consumer: AsyncConsumer) -> bool:
    """Whether the blocking facade may fetch on its caller's thread: no group (its poll does
    the group's work on the loop) and a PLAINTEXT listener (TLS and SASL live in the loop's
    connections)."""
    return consumer.polls_without_task and consumer.config.security_protocol == "PLAINTEXT"


class _Link:
    """The socket to one node and its fetch in flight."""

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
        self._backoff_s = self._config.retry_backoff_ms / 1000
        self._timeout_s = (self._config.request_timeout_ms + self._config.fetch_max_wait_ms) / 1000
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._rtype = response_type(ApiKey.FETCH)

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
        for link in list(self._links.values()):
            self._drop(link, None)
        self._wake_r.close()
        self._wake_w.close()

    # -- poll -----------------------------------------------------------------------------------

    def poll(self, timeout_s: float, limit: int) -> list[Record]:
        """Records (at most ``limit``), waiting up to ``timeout_s`` for some; raises what the
        consumer's ``poll`` raises."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        aio, lock = self._aio, self._fetcher.state_lock
        last = False
        while True:
            with lock:
                aio._raise_pending()
                records = aio._drain(limit, wake=False)
                plans = self._plan()
            self._send(plans)
            if records or aio.closed or last:
                return records
            now = time.monotonic()
            # at the deadline (or with timeout 0) still read what has arrived, once: a loop of
            # poll(0) gets its records
            last = now >= deadline
            self._wait(0.0 if last else min(deadline, self._next_event(now)) - now)

    def _next_event(self, now: float) -> float:
        """When the wait must end even if nothing arrives: an expiring fetch, the end of a
        backoff or a throttle (the other changes notify)."""
        times = [link.expires for link in self._links.values() if link.plan is not None]
        times += [link.throttled_until for link in self._links.values() if link.throttled_until > now]
        times += [s.retry_at for s in self._aio._subscriptions.partitions.values() if s.retry_at > now]
        return min(times, default=float("inf"))

    def _wait(self, timeout: float) -> None:
        waiting = {link.sock: link for link in self._links.values() if link.plan is not None}
        readable, _, _ = select.select([self._wake_r, *waiting], [], [], max(0.0, timeout))
        for sock in readable:
            if sock is self._wake_r:
                try:
                    while self._wake_r.recv(512):
                        pass
                except OSError:
                    pass
            else:
                self._read(waiting[sock])
        now = time.monotonic()
        for link in list(self._links.values()):
            if link.plan is not None and now >= link.expires:
                self._drop(link, f"no fetch response within {self._timeout_s:g} s")

    # -- fetch requests -------------------------------------------------------------------------

    def _plan(self) -> dict[int, FetchPlan]:
        """Under the state lock: a fetch to every leader with nothing in flight, for its
        fetchable partitions (the loop's own plan), which are marked as fetching."""
        now = time.monotonic()
        busy = [n for n, link in self._links.items() if link.plan is not None or link.throttled_until > now]
        subs = self._aio._subscriptions
        plans, unknown = plan_fetches(subs, self._cluster.metadata, busy, now, self._config)
        if unknown:
            self._portal.run_soon(self._cluster.request_update)
        for plan in plans.values():
            for tp in plan.sent:
                subs.partitions[tp].fetching = True
        return plans

    def _send(self, plans: dict[int, FetchPlan]) -> None:
        """Write the planned fetches (connecting first where needed: outside the lock)."""
        for node, plan in plans.items():
            link = self._links.get(node) or self._connect(node, plan)
            if link is None:
                continue
            _, frame = link.proto.send_request(ApiKey.FETCH, 0, plan.request, True)
            link.plan, link.sent = plan, time.monotonic()
            link.expires = link.sent + self._timeout_s
            try:
                link.sock.sendall(frame)
            except OSError as e:
                self._drop(link, f"write failed: {e}")

    def _connect(self, node: int, plan: FetchPlan) -> _Link | None:
        try:
            host, port = self._cluster.address_of(node)
            sock = socket.create_connection((host, port), timeout=self._config.request_timeout_ms / 1000)
        except (OSError, BrokerConnectionError) as e:
            log.debug("fetch connection to node %s failed: %s", node, e)
            self._unplan(plan)
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = self._links[node] = _Link(node, sock, ClientConnection(client_id=self._config.client_id))
        return link

    # -- fetch responses ------------------------------------------------------------------------

    def _read(self, link: _Link) -> None:
        try:
            data = link.sock.recv(READ_SIZE)
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
            except Exception as e:
                self._drop(link, f"a fetch response did not decode: {e}", plan)
                return
            throttle = body.get("throttle_time_ms")
            if type(throttle) is int and throttle > 0:
                link.throttled_until = sent + throttle / 1000
            self._absorb(response, plan, sent)

    def _absorb(self, response: Any, plan: FetchPlan, sent: float) -> None:
        subs = self._aio._subscriptions
        with self._fetcher.state_lock:
            for tp in plan.sent:
                state = subs.partitions.get(tp)
                if state is not None:
                    state.fetching = False
            _, refresh = self._fetcher.absorb(response, plan, sent, time.monotonic())
            reset = bool(subs.needing_reset())
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
            self._portal.run_soon(self._cluster.request_update)
        if plan is not None:
            self._unplan(plan)

    def _unplan(self, plan: FetchPlan) -> None:
        """A fetch that failed: its partitions may be fetched again after the backoff."""
        retry_at = time.monotonic() + self._backoff_s
        with self._fetcher.state_lock:
            for tp in plan.sent:
                state = self._aio._subscriptions.partitions.get(tp)
                if state is not None:
                    state.fetching = False
                    state.retry_at = retry_at
