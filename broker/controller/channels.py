"""The controller's outgoing requests: one ordered queue and one sender task per broker.

Requests to a broker are delivered in the order they were queued and retried until they
succeed or the broker leaves the cluster (its queue is then dropped). Each queued request
has a ``done`` event, so a caller may wait (with its own deadline) for propagation.

A queue holds at most ``max_queued`` requests (the one being delivered aside): a broker that
stays registered but unreachable must not grow it without end. Queuing never fails, for the
controller queues in the middle of its work, after its ZooKeeper writes: a full queue is
dropped (its waiters released, as when the broker leaves) and ``on_overflow(broker)`` queues
in its place the broker's whole state as the controller holds it now (a full LeaderAndIsr and
UpdateMetadata, as after a failover), which supersedes every request dropped; the request
being queued follows it.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import trio

from tidelog.broker.channel import BrokerChannel, BrokerUnreachable
from tidelog.protocol.codec import ApiKey, Message

logger = logging.getLogger("tidelog.controller.channels")


@dataclass
class Outgoing:
    api_key: ApiKey
    message: Message
    done: trio.Event = field(default_factory=trio.Event)
    response: Message | None = None


# requests queued to one broker before its queue is replaced by its whole state
MAX_QUEUED_REQUESTS = 1000
# the least bound: what ``on_overflow`` queues (LeaderAndIsr, UpdateMetadata, StopReplica)
# and the request being queued must fit in an empty queue
MIN_QUEUED_REQUESTS = 4


class _BrokerQueue:
    """One broker's requests in order, and whoever waits for the next."""

    def __init__(self, channel: BrokerChannel):
        self.channel = channel
        self._pending: deque[Outgoing] = deque()
        self._arrived = trio.Event()
        self.cancel_scope = trio.CancelScope()

    def __len__(self) -> int:
        return len(self._pending)

    def pending(self) -> list[Outgoing]:
        return list(self._pending)

    def put(self, out: Outgoing) -> None:
        self._pending.append(out)
        self._arrived.set()

    async def get(self) -> Outgoing:
        while not self._pending:
            self._arrived = trio.Event()
            await self._arrived.wait()
        return self._pending.popleft()

    def drop_all(self) -> int:
        """Release every waiter of a request not delivered (its ``response`` stays None)."""
        dropped = len(self._pending)
        while self._pending:
            self._pending.popleft().done.set()
        return dropped


class ChannelManager:
    def __init__(self, controller_id: int, request_timeout_s: float = 30.0, retry_backoff_s: float = 0.2,
                 security: Any = None, max_queued: int = MAX_QUEUED_REQUESTS):
        if max_queued < MIN_QUEUED_REQUESTS:
            raise ValueError(f"max_queued must be at least {MIN_QUEUED_REQUESTS} (what replaces a full queue "
                             f"must fit in it), got {max_queued}")
        self.controller_id = controller_id
        self.security = security  # tidelog.security.SecurityConfig of the inter-broker listener
        self.request_timeout_s = request_timeout_s
        self.retry_backoff_s = retry_backoff_s
        self.max_queued = max_queued
        # queues, through ``send``, everything the broker must know: what replaces a full queue
        self.on_overflow: Callable[[int], None] | None = None
        self._queues: dict[int, _BrokerQueue] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def add_broker(self, broker_id: int, host: str, port: int) -> None:
        q = self._queues.get(broker_id)
        if q is not None:
            q.channel.retarget(host, port)
            return
        q = self._queues[broker_id] = _BrokerQueue(
            BrokerChannel(broker_id, host, port, client_id=f"controller-{self.controller_id}",
                          security=self.security))
        self._nursery.start_soon(self._sender, broker_id, q)

    def remove_broker(self, broker_id: int) -> None:
        q = self._queues.pop(broker_id, None)
        if q is not None:
            q.cancel_scope.cancel()

    def brokers(self) -> set[int]:
        return set(self._queues)

    def send(self, broker_id: int, api_key: ApiKey, message: Message) -> Outgoing | None:
        """Queue a request to ``broker_id`` (None: it has no queue, not being registered).
        Never fails: a full queue is replaced first (the module docstring)."""
        q = self._queues.get(broker_id)
        if q is None:
            return None
        if len(q) >= self.max_queued:
            self._overflow(broker_id, q)
        out = Outgoing(api_key, message)
        q.put(out)
        return out

    def _overflow(self, broker_id: int, q: _BrokerQueue) -> None:
        dropped = q.drop_all()
        logger.warning("%d controller requests to broker %d were not delivered (is it reachable?): dropped, "
                       "its whole state is queued instead", dropped, broker_id)
        if self.on_overflow is not None:
            self.on_overflow(broker_id)

    def close_all(self) -> None:
        for broker_id in list(self._queues):
            self.remove_broker(broker_id)

    async def _sender(self, broker_id: int, q: _BrokerQueue) -> None:
        out: Outgoing | None = None
        with q.cancel_scope:
            try:
                while True:
                    out = await q.get()
                    await self._deliver(broker_id, q.channel, out)
            finally:
                # the queue was dropped (the broker left, or the controller resigned): whoever
                # waits for a request not delivered stops waiting (its ``response`` stays None)
                if out is not None:
                    out.done.set()
                q.drop_all()
                await q.channel.aclose()

    async def _deliver(self, broker_id: int, channel: BrokerChannel, out: Outgoing) -> None:
        while True:
            try:
                out.response = await channel.request(out.api_key, out.message, self.request_timeout_s)
                out.done.set()
                return
            except BrokerUnreachable as e:
                logger.debug("controller request to broker %d failed (%s); retrying", broker_id, e)
                await trio.sleep(self.retry_backoff_s)


async def wait_all(outgoing: list[Outgoing | None], timeout_s: float) -> bool:
    """Wait until every request was delivered or dropped, up to ``timeout_s``; True if all
    were delivered."""
    with trio.move_on_after(timeout_s):
        for out in outgoing:
            if out is not None:
                await out.done.wait()
        return all(out.response is not None for out in outgoing if out is not None)
    return False
