"""A member whose coordinator was away longer than its session timeout (the coordinator's
broker was SIGKILLed: its ZooKeeper session has to expire before the group's partition gets a
new leader) heartbeats the new coordinator once it finds it, and so hears of the rebalance the
new coordinator is running. Before, the heartbeat task found the session expired again right
after FindCoordinator answered, dropped the coordinator it had just found, and never sent a
heartbeat: the member never rejoined and the group's rebalance waited for it (the fault matrix's
F2 against the coordinator found it). Kafka resets the session timer when the coordinator is
found (AbstractCoordinator: ``heartbeat.resetSessionTimeout()``)."""

from __future__ import annotations

import time
from typing import Any

import trio

from tidelog.aio.cluster import ClusterMetadata
from tidelog.aio.group import ConsumerCoordinator, call_maybe_async
from tidelog.aio.heartbeat import HeartbeatTimer
from tidelog.aio.membership import Generation
from tidelog.aio.subscription import ConsumerConfig, SubscriptionState
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NONE, REBALANCE_IN_PROGRESS
from tidelog.protocol.messages import EARLIEST_TIMESTAMP, FindCoordinatorResponse, HeartbeatResponse


class MovedCoordinatorCluster:
    """What ConsumerCoordinator uses of tidelog.aio.cluster.Cluster: FindCoordinator names
    broker 2; broker 2 answers heartbeats with REBALANCE_IN_PROGRESS."""

    def __init__(self) -> None:
        self.metadata = ClusterMetadata()
        self.sent: list[ApiKey] = []
        self.nodes: dict[int, tuple[str, int]] = {}

    async def request_any(self, message: Any, *, api_key: ApiKey, timeout: float) -> Any:
        self.sent.append(api_key)
        return FindCoordinatorResponse(NONE.code, 2, "127.0.0.1", 9093)

    async def request(self, node: int, message: Any, *, api_key: ApiKey, timeout: float) -> Any:
        self.sent.append(api_key)
        assert api_key is ApiKey.HEARTBEAT and self.nodes[node] == ("127.0.0.1", 9093)
        return HeartbeatResponse(REBALANCE_IN_PROGRESS.code)

    def add_node(self, node: int, host: str, port: int) -> None:
        self.nodes[node] = (host, port)

    def close_connection(self, node: int) -> None:
        pass


def test_finding_the_coordinator_restarts_the_session_clock():
    t = HeartbeatTimer(session_timeout_s=4, heartbeat_interval_s=0.4, max_poll_interval_s=60, now=100.0)
    t.sent(100.0)
    t.failed(100.5, 0.1)
    assert t.session_expired(110.0)
    t.coordinator_found(110.0)
    assert not t.session_expired(113.9) and t.session_expired(114.1)
    assert t.time_to_next_heartbeat(110.0) == 0.0  # a heartbeat is due at once


async def test_a_member_back_from_a_long_coordinator_outage_heartbeats_the_new_one_and_rejoins(autojump_clock):
    cluster = MovedCoordinatorCluster()
    config = ConsumerConfig(group_id="g", session_timeout_ms=4000, heartbeat_interval_ms=400)
    group = ConsumerCoordinator(cluster, config, SubscriptionState(EARLIEST_TIMESTAMP), call_maybe_async,
                                lambda: None)
    group.member.join_started()  # a stable member of generation 1
    group.member.joined(Generation(1, "m-1", "range"))
    group.member.synced()
    group.timer.received(time.monotonic() - 10)  # the old coordinator stopped answering 10 s ago
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        with trio.fail_after(30):
            while ApiKey.HEARTBEAT not in cluster.sent:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert cluster.sent[0] is ApiKey.FIND_COORDINATOR
    assert group.rejoin_needed and group.coordinator_id is not None
