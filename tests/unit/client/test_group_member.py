"""The consumer group client (client/aio/group.py ConsumerCoordinator) against a scripted
coordinator: requests are answered by handlers that may hold their answer, so races between
the member's tasks (commits, committed-offset lookups, rebalances) are played out in order.
Time is Trio's autojump clock: waits pass instantly and only their order matters."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from tidelog.aio.cluster import ClusterMetadata
from tidelog.aio.group import ConsumerCoordinator, call_maybe_async
from tidelog.aio.subscription import ConsumerConfig, SubscriptionState
from tidelog.errors import RequestTimedOut
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import (
    EARLIEST_TIMESTAMP,
    OffsetCommitPartitionResponse,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchResponse,
    OffsetFetchTopicResponse,
)
from tidelog.protocol.topics import TopicPartition as TP

A0 = TP("a", 0)


class ScriptedCluster:
    """What ConsumerCoordinator uses of tidelog.aio.cluster.Cluster; the coordinator is node 1."""

    def __init__(self) -> None:
        self.metadata = ClusterMetadata()
        self.handlers: dict[ApiKey, Callable[[Any], Awaitable[Any]]] = {}
        self.sent: list[tuple[ApiKey, Any]] = []

    async def request(self, node: int, message: Any, *, api_key: ApiKey, timeout: float) -> Any:
        self.sent.append((api_key, message))
        return await self.handlers[api_key](message)

    def close_connection(self, node: int) -> None:
        pass

    def set_topics(self, topics: Any) -> None:
        pass

    def request_update(self) -> None:
        pass


def member(cluster: ScriptedCluster, subscriptions: SubscriptionState) -> ConsumerCoordinator:
    coordinator = ConsumerCoordinator(cluster, ConsumerConfig(group_id="g"), subscriptions, call_maybe_async,
                                      lambda: None)
    coordinator.link.coordinator_id = 1  # known: no FindCoordinator in these scripts
    return coordinator


def commit_ok(message: Any) -> OffsetCommitResponse:
    return OffsetCommitResponse([OffsetCommitTopicResponse(t.name, [
        OffsetCommitPartitionResponse(p.partition_index, NONE.code) for p in t.partitions]) for t in message.topics])


async def wait_sent(cluster: ScriptedCluster, count: int) -> None:
    with trio.fail_after(60):
        while len(cluster.sent) < count:
            await trio.sleep(0.01)


async def test_a_commit_behind_an_earlier_one_gives_up_at_its_own_deadline(autojump_clock):
    """commit(timeout) is bounded by its own timeout even while an earlier commit (e.g. an
    automatic one) holds the commit order lock."""
    cluster, release = ScriptedCluster(), trio.Event()

    async def slow_commit(message):
        await release.wait()
        return commit_ok(message)

    cluster.handlers[ApiKey.OFFSET_COMMIT] = slow_commit
    group = member(cluster, SubscriptionState(EARLIEST_TIMESTAMP))
    first_done = trio.Event()

    async def first():
        await group.offsets.commit({A0: 1}, trio.current_time() + 300)
        first_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await wait_sent(cluster, 1)
        with pytest.raises(RequestTimedOut):
            await group.offsets.commit({A0: 2}, trio.current_time() + 5)
        assert not first_done.is_set()  # it gave up before the earlier commit finished
        release.set()
        await first_done.wait()
    assert [m.topics[0].partitions[0].committed_offset for _, m in cluster.sent] == [1]


async def test_a_committed_offset_looked_up_for_an_earlier_assignment_is_not_applied_to_a_later_one(
        autojump_clock):
    """A lookup answered after the partition was revoked and assigned again (another member
    owned and committed it meanwhile) is stale: the new assignment looks its offset up again
    (Kafka drops a committed-offsets request of another generation)."""
    cluster, subscriptions = ScriptedCluster(), SubscriptionState(EARLIEST_TIMESTAMP)
    answers = [trio.Event(), trio.Event()]
    offsets = [50, 100]

    async def offset_fetch(message):
        n = sum(1 for key, _ in cluster.sent if key is ApiKey.OFFSET_FETCH) - 1
        await answers[n].wait()
        return OffsetFetchResponse(NONE.code, [OffsetFetchTopicResponse("a", [OffsetFetchPartitionResponse(0, offsets[n])])])

    cluster.handlers[ApiKey.OFFSET_FETCH] = offset_fetch
    group = member(cluster, subscriptions)
    subscriptions.assign([A0], need_committed=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(group.offsets.refresh_committed_positions)
        await wait_sent(cluster, 1)
        group._drop_partitions([A0])  # a rebalance takes A0 away; a later one hands it back
        subscriptions.assign([A0], need_committed=True)
        answers[0].set()
    state = subscriptions.partitions[A0]
    assert state.awaiting_committed and state.position is None and A0 not in group.committed
    answers[1].set()
    await group.offsets.refresh_committed_positions()
    assert state.position == 100 and group.committed[A0] == 100
