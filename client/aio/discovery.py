"""Finding a group's coordinator and talking to it.

FindCoordinator (to any broker) names the broker that leads the group's ``__consumer_offsets``
partition. It gets a connection of its own (node id ``COORDINATOR_ID_BASE - broker id``) so
that a JoinGroup that waits for a whole rebalance, or a heartbeat, never queues behind a
long-polling fetch. COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, a lost connection or a
timeout mark it unknown; it is looked up again with backoff (COORDINATOR_LOAD_IN_PROGRESS is
retried against the same broker).

One background task looks it up, retrying with backoff up to ``retry_backoff_max_ms`` while
anyone waits for it; a non-retriable answer (GROUP_AUTHORIZATION_FAILED, INVALID_GROUP_ID)
is raised to every waiter while it is the latest answer, as Kafka's ensureCoordinatorReady
does, and a join waiting for the coordinator goes on once it is found: never a silent stall.
After a non-retriable answer the task stops when nobody waits (the next wait starts it
again), so a member whose lookup is refused neither stalls nor keeps asking unasked.

A request to the coordinator that fails (lost connection, timeout) raises ``GroupRetry``:
the caller retries with backoff, rediscovering the coordinator when ``rediscover`` is set.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from typing import Any

import trio

from tidelog.aio.cluster import Backoff, Cluster
from tidelog.errors import BrokerConnectionError, RequestTimedOut, TidelogError, broker_error
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import FindCoordinatorRequest, FindCoordinatorResponse

__all__ = ["CoordinatorLink", "GroupRetry", "COORDINATOR_ID_BASE"]

log = logging.getLogger(__name__)

COORDINATOR_ID_BASE = 2**31 - 1


class GroupRetry(Exception):
    """A retriable failure inside the group protocol (never reaches the application)."""

    def __init__(self, message: str, *, rediscover: bool):
        super().__init__(message)
        self.rediscover = rediscover


class CoordinatorLink:
    """The group's coordinator: who it is, waiting for it to be known, requests to it.

    ``spawn_once(name, fn)`` runs the lookup task in the background (once at a time);
    ``poll_wait(deadline)`` is the context of one of poll's waits (ends at the deadline or at
    the consumer's wakeup); ``on_found()`` is called when a lookup names the coordinator."""

    def __init__(self, cluster: Cluster, group_id: str, *, request_timeout_s: float, backoff_s: float,
                 backoff_max_s: float, spawn_once: Callable[[str, Callable[[], Awaitable[None]]], None],
                 poll_wait: Callable[[float], AbstractContextManager[Any]], on_found: Callable[[], None]):
        self.cluster = cluster
        self.group_id = group_id
        self.coordinator_id: int | None = None
        self._request_timeout_s = request_timeout_s
        self._backoff_s = backoff_s
        self._backoff_max_s = backoff_max_s
        self._spawn_once = spawn_once
        self._poll_wait = poll_wait
        self._on_found = on_found
        self._lookup_done = trio.Event()  # set when a FindCoordinator attempt ends (then renewed)
        self._lookup_error: TidelogError | None = None  # the last attempt's non-retriable error
        self._waiters = 0

    @property
    def known(self) -> bool:
        return self.coordinator_id is not None

    def mark_unknown(self, reason: str) -> None:
        if self.coordinator_id is not None:
            log.info("group %r: coordinator %d unknown (%s)", self.group_id,
                     COORDINATOR_ID_BASE - self.coordinator_id, reason)
            self.cluster.close_connection(self.coordinator_id)
        self.coordinator_id = None

    def close_connection(self) -> None:
        """Drop the connection (what is in flight on it fails), keeping the coordinator known."""
        if self.coordinator_id is not None:
            self.cluster.close_connection(self.coordinator_id)

    async def ensure(self, deadline: float | None, *, raise_errors: bool = True,
                     interruptible: bool = False) -> bool:
        """Wait (until ``deadline``, trio time; None: no limit) for the coordinator, which a
        background task looks up with backoff. True once it is known. A lookup refused with a
        non-retriable error is raised to every caller while it is the latest answer
        (``raise_errors``; the join task and the heartbeat task leave that to poll and go on
        waiting while the lookup retries). ``interruptible``: poll's wait, which the
        consumer's wakeup ends too."""
        self._waiters += 1
        try:
            while self.coordinator_id is None:
                self._spawn_once("lookup", self._lookup)
                attempt = self._lookup_done
                limit = math.inf if deadline is None else deadline
                with self._poll_wait(limit) if interruptible else trio.move_on_at(limit):
                    await attempt.wait()
                if self.coordinator_id is None and raise_errors and self._lookup_error is not None:
                    raise self._lookup_error
                if not attempt.is_set():
                    break
            return self.coordinator_id is not None
        finally:
            self._waiters -= 1

    async def _lookup(self) -> None:
        """FindCoordinator until it answers, with backoff (``retry_backoff_ms`` doubling up to
        ``retry_backoff_max_ms``)."""
        backoff = Backoff(self._backoff_s, self._backoff_max_s)
        while self.coordinator_id is None:
            try:
                await self._find(self._request_timeout_s)
                self._lookup_error = None
            except (BrokerConnectionError, RequestTimedOut) as e:
                self._lookup_error = None
                log.debug("group %r: no coordinator yet: %s", self.group_id, e)
            except TidelogError as e:
                self._lookup_error = None if e.retriable else e
                log.log(logging.DEBUG if e.retriable else logging.WARNING,
                        "group %r: no coordinator yet: %s", self.group_id, e)
            self._end_attempt()
            if self.coordinator_id is not None:
                return
            await trio.sleep(backoff.next_delay())
            if self._lookup_error is not None and not self._waiters:
                return

    def _end_attempt(self) -> None:
        done, self._lookup_done = self._lookup_done, trio.Event()
        done.set()

    async def _find(self, timeout: float) -> None:
        response: FindCoordinatorResponse = await self.cluster.request_any(
            FindCoordinatorRequest(self.group_id), api_key=ApiKey.FIND_COORDINATOR,
            timeout=min(timeout, self._request_timeout_s))
        if response.error_code != NONE.code:
            raise broker_error(response.error_code, f"group {self.group_id!r} (FindCoordinator)",
                               response.error_message)
        node = COORDINATOR_ID_BASE - response.node_id
        self.cluster.add_node(node, response.host, response.port)
        self.coordinator_id = node
        self._on_found()
        log.debug("group %r: coordinator is broker %d", self.group_id, response.node_id)

    async def request(self, message: Message, api_key: ApiKey, timeout: float) -> Any:
        """Send ``message`` to the coordinator; GroupRetry when it is unknown or the request
        fails (the coordinator is then marked unknown)."""
        node = self.coordinator_id
        if node is None:
            raise GroupRetry("the coordinator is not known", rediscover=True)
        try:
            return await self.cluster.request(node, message, api_key=api_key, timeout=timeout)
        except (BrokerConnectionError, RequestTimedOut) as e:
            if self.coordinator_id == node:
                self.mark_unknown(str(e))
            raise GroupRetry(f"{api_key.name} to the coordinator failed: {e}", rediscover=False) from None
