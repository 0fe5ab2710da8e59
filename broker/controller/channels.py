"""The controller's outgoing requests: one ordered queue and one sender task per broker.

Requests to a broker are delivered in the order they were queued and retried until they
succeed or the broker leaves the cluster (its queue is then dropped). Each queued request
has a ``done`` event, so a caller may wait (with its own deadline) for propagation.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

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


class _BrokerQueue:
    def __init__(self, channel: BrokerChannel):
        self.channel = channel
        self.send, self.receive = trio.open_memory_channel[Outgoing](10_000)
        self.cancel_scope = trio.CancelScope()


class ChannelManager:
    def __init__(self, controller_id: int, request_timeout_s: float = 30.0, retry_backoff_s: float = 0.2,
                 security: Any = None):
        self.controller_id = controller_id
        self.security = security  # tidelog.security.SecurityConfig of the inter-broker listener
        self.request_timeout_s = request_timeout_s
        self.retry_backoff_s = retry_backoff_s
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
        q = self._queues.get(broker_id)
        if q is None:
            return None
        out = Outgoing(api_key, message)
        q.send.send_nowait(out)
        return out

    def close_all(self) -> None:
        for broker_id in list(self._queues):
            self.remove_broker(broker_id)

    async def _sender(self, broker_id: int, q: _BrokerQueue) -> None:
        out: Outgoing | None = None
        with q.cancel_scope:
            try:
                async for out in q.receive:
                    await self._deliver(broker_id, q.channel, out)
            finally:
                # the queue was dropped (the broker left, or the controller resigned): whoever
                # waits for a request not delivered stops waiting (its ``response`` stays None)
                if out is not None:
                    out.done.set()
                while True:
                    try:
                        q.receive.receive_nowait().done.set()
                    except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                        break
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
