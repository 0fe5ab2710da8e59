"""The console's watch over a fake Admin: rates from successive polls, a broker that stops
answering keeps its last figures, and no failure of the cluster stops the watch."""

from __future__ import annotations

import pytest
import trio

from tidelog.aio.admin import (
    ClusterDescription,
    ConsumerGroupDescription,
    GroupOffsets,
    ListedGroup,
    LogDirDescription,
    ReplicaInfo,
    TopicDescription,
)
from tidelog.aio.cluster import PartitionInfo
from tidelog.errors import BrokerConnectionError, RequestTimedOut
from tidelog.protocol.messages import BrokerMetadata
from tidelog.protocol.topics import TopicPartition
from tidelog.webconsole.watch import ClusterWatch

pytestmark = pytest.mark.unit

TP = TopicPartition("orders", 0)


class FakeAdmin:
    def __init__(self):
        self.leo = {1: 0, 2: 0}
        self.down: set[int] = set()
        self.committed = 0
        self.groups_fail = False
        self.groups = ["billing"]
        self.hung: set[str] = set()  # groups whose coordinator never answers
        self.timeouts: dict[str, list] = {}  # call -> the timeout_ms of each call

    def _called(self, name, timeout_ms):
        self.timeouts.setdefault(name, []).append(timeout_ms)

    async def describe_cluster(self, timeout_ms=None):
        self._called("describe_cluster", timeout_ms)
        return ClusterDescription("c", 1, [BrokerMetadata(1, "h", 1), BrokerMetadata(2, "h", 2)])

    async def describe_topics(self, timeout_ms=None):
        self._called("describe_topics", timeout_ms)
        return [TopicDescription("orders", [PartitionInfo("orders", 0, 1, 0, (1, 2), (1, 2))])]

    async def describe_log_dirs(self, brokers, timeout_ms=None):
        self._called("describe_log_dirs", timeout_ms)
        results = {}
        for b in brokers:
            if b in self.down:
                results[b] = BrokerConnectionError(f"broker {b} is down")
            else:
                leo = self.leo[b]
                results[b] = {"/d": LogDirDescription("/d", {TP: ReplicaInfo(TP, leo * 10, 0, False, 0, leo, leo)})}
        failures = [r for r in results.values() if isinstance(r, Exception)]
        if failures:
            failures[0].results = results
            raise failures[0]
        return results

    async def broker_versions(self, brokers, timeout_ms=None):
        self._called("broker_versions", timeout_ms)
        return {b: None if b in self.down else "0.2.0" for b in brokers}

    async def list_groups(self, timeout_ms=None):
        self._called("list_groups", timeout_ms)
        if self.groups_fail:  # as the SDK's concurrent ListGroups fails: a group of errors
            raise ExceptionGroup("nursery", [RequestTimedOut("ListGroups to broker 2 did not complete")])
        return [ListedGroup(g, "consumer", "Empty", 1) for g in self.groups]

    async def describe_groups(self, ids, timeout_ms=None):
        self._called("describe_groups", timeout_ms)
        if ids[0] in self.hung:
            await trio.sleep(3600)  # past any deadline the watch sets (virtual time)
        return [ConsumerGroupDescription(ids[0], "Empty", "consumer", "", 1, "", 1, ())]

    async def list_group_offsets(self, group_id, timeout_ms=None):
        self._called("list_group_offsets", timeout_ms)
        return [GroupOffsets(TP, self.committed, self.leo[1], self.leo[1] - self.committed)]


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


async def test_rates_lags_and_a_broker_that_stops_answering():
    admin, clock = FakeAdmin(), Clock()
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=clock)
    await watch.poll_once()
    admin.leo = {1: 100, 2: 100}
    admin.committed = 40
    clock.t += 2
    await watch.poll_once()
    assert watch.topic_in.points("orders")[-1][1] == 50.0  # 100 offsets in 2 s
    assert watch.topic_out.points("orders")[-1][1] == 20.0  # 40 committed in 2 s
    assert watch.broker_in.points(1)[-1][1] == 500.0  # 1,000 bytes in 2 s
    assert watch.group_lag.points("billing")[-1][1] == 60
    admin.down = {2}
    admin.leo[1] = 300
    clock.t += 1
    await watch.poll_once()
    s = watch.snapshot
    assert s.broker_errors == {2: "broker 2 is down"}
    assert s.replicas[TP][2].log_end_offset == 100 and s.replicas[TP][1].log_end_offset == 300
    assert watch.broker_in.points(2)[-1][1] is None and s.stale_brokers == {2}
    assert s.versions == {1: "0.2.0", 2: None}  # each broker's own version; unknown when it is down


async def test_no_failure_of_the_cluster_stops_the_watch():
    admin, clock = FakeAdmin(), Clock()
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=clock)
    await watch.poll_once()
    admin.groups_fail = True
    clock.t += 1
    await watch.poll_once()
    assert watch.error is None
    assert "did not complete" in watch.snapshot.groups["billing"].error

    async def broken(timeout_ms=None):
        raise ExceptionGroup("nursery", [BrokerConnectionError("no broker")])
    admin.describe_cluster = broken
    await watch.poll_once()
    assert "no broker" in watch.error and watch.snapshot is not None  # the last snapshot stays


def test_a_groups_lag_is_unknown_rather_than_a_partial_sum():
    """0 reads as caught up: a group consuming a backlog before its first commit, or one of
    whose partitions' end could not be read, shows no total lag instead."""
    from tidelog.aio.admin import MemberDescription
    from tidelog.webconsole.watch import GroupState

    one, two = TopicPartition("orders", 0), TopicPartition("orders", 1)
    member = MemberDescription("m", None, "app", "h", (one, two))
    stable = ConsumerGroupDescription("billing", "Stable", "consumer", "range", 3, "m", 1, (member,))
    assert GroupState(stable, []).lag is None  # consuming, nothing committed yet
    assert GroupState(stable, [GroupOffsets(one, 5, 10, 5)]).lag is None  # partition 1 unknown
    assert GroupState(stable, [GroupOffsets(one, 5, 10, 5), GroupOffsets(two, 1, None, None)]).lag is None
    assert GroupState(stable, [GroupOffsets(one, 5, 10, 5), GroupOffsets(two, 1, 3, 2)]).lag == 7
    empty = ConsumerGroupDescription("idle", "Empty", "consumer", "", 3, "", 1, ())
    assert GroupState(empty, []).lag == 0 and GroupState(empty, [GroupOffsets(one, 10, 10, 0)]).lag == 0
    assert GroupState(empty, [], error="not authorized").lag is None


async def test_every_call_of_a_poll_is_bounded_by_the_refresh_interval():
    """A broker in the metadata but unreachable must not hold each refresh for the Admin's
    default timeout (15 s): each call gets the poll's deadline."""
    admin = FakeAdmin()
    watch = ClusterWatch(admin, interval_s=2, window_s=60, clock=Clock())
    await watch.poll_once()
    assert set(admin.timeouts) == {"describe_cluster", "describe_topics", "describe_log_dirs", "broker_versions",
                                   "list_groups", "describe_groups", "list_group_offsets"}
    for call, timeouts in admin.timeouts.items():
        assert all(t is not None and 0 < t <= 2000 for t in timeouts), (call, timeouts)


async def test_a_group_that_does_not_answer_keeps_its_last_state_and_the_poll_moves_on(autojump_clock):
    admin, clock = FakeAdmin(), Clock()
    admin.groups = ["billing", "audit"]
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=clock)
    await watch.poll_once()
    assert watch.snapshot.groups["audit"].error is None
    admin.hung = {"audit"}  # its coordinator stops answering (the fake ignores the timeout)
    admin.committed = 7
    clock.t += 1
    await watch.poll_once()
    audit, billing = watch.snapshot.groups["audit"], watch.snapshot.groups["billing"]
    assert audit.description.group_id == "audit" and "no answer within 1000 ms" in audit.error
    assert billing.error is None and billing.offsets[0].committed == 7  # what answered is kept
    assert watch.error is None


async def polls(watch, clock, n=1):
    for _ in range(n):
        clock.t += 1
        await watch.poll_once()


async def test_a_follower_joining_the_isr_or_leadership_moving_is_not_traffic():
    """A broker's out is each led partition's growth times its followers in sync: a follower
    rejoining the ISR, or leadership moving, moves no bytes."""
    admin, clock = FakeAdmin(), Clock()
    admin.leo = {1: 1_000_000, 2: 1_000_000}
    isr, leader = [(1,)], [1]
    admin.describe_topics = lambda timeout_ms=None: _async(
        [TopicDescription("orders", [PartitionInfo("orders", 0, leader[0], 0, (1, 2), isr[0])])])
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=clock)
    await polls(watch, clock, 2)
    assert watch.broker_out.points(1)[-1][1] == 0.0
    isr[0] = (1, 2)
    await polls(watch, clock)
    assert watch.broker_out.points(1)[-1][1] == 0.0
    leader[0] = 2
    await polls(watch, clock)
    assert watch.broker_out.points(2)[-1][1] == 0.0
    admin.leo = {1: 1_000_100, 2: 1_000_100}
    await polls(watch, clock)
    assert watch.broker_out.points(2)[-1][1] == 1000.0  # 1,000 bytes copied by broker 1
    assert watch.topic_in.points("orders")[-1][1] == 100.0


async def test_a_group_missing_from_one_poll_is_not_read_as_commits():
    admin, clock = FakeAdmin(), Clock()
    admin.leo = {1: 10_000_000, 2: 10_000_000}
    admin.committed = 9_000_000
    admin.groups = ["billing", "audit"]
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=clock)
    await polls(watch, clock, 2)
    assert watch.topic_out.points("orders")[-1][1] == 0.0
    describe = admin.describe_groups

    async def failing(ids, timeout_ms=None):
        if ids[0] == "audit":
            raise RequestTimedOut("the coordinator is moving")
        return await describe(ids, timeout_ms)

    admin.describe_groups = failing
    await polls(watch, clock)
    assert watch.topic_out.points("orders")[-1][1] == 0.0
    admin.describe_groups = describe
    await polls(watch, clock)
    assert watch.topic_out.points("orders")[-1][1] == 0.0
    admin.committed += 10
    await polls(watch, clock)
    assert watch.topic_out.points("orders")[-1][1] == 20.0  # 10 each, both groups


async def test_an_offline_partition_coming_back_is_not_read_as_messages_in():
    admin, clock = FakeAdmin(), Clock()
    admin.leo = {1: 5_000, 2: 5_000}
    two = TopicPartition("orders", 1)
    leaders = [1]
    describe_log_dirs = admin.describe_log_dirs

    async def log_dirs(brokers, timeout_ms=None):
        out = await describe_log_dirs(brokers, timeout_ms)
        for b in out:
            out[b]["/d"].replicas[two] = ReplicaInfo(two, 80_000, 0, False, 0, 8_000, 8_000)
        return out

    admin.describe_log_dirs = log_dirs
    admin.describe_topics = lambda timeout_ms=None: _async([TopicDescription("orders", [
        PartitionInfo("orders", 0, 1, 0, (1, 2), (1, 2)), PartitionInfo("orders", 1, leaders[0], 0, (1, 2), (1, 2))])])
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=clock)
    await polls(watch, clock, 2)
    leaders[0] = -1  # offline: no leader's end to read
    await polls(watch, clock)
    assert watch.topic_in.points("orders")[-1][1] == 0.0
    leaders[0] = 2
    await polls(watch, clock)
    assert watch.topic_in.points("orders")[-1][1] == 0.0


async def _async(value):
    return value


async def test_an_actions_poll_never_publishes_a_snapshot_older_than_the_current():
    """The loop's poll, slow, read the topics before a topic was created; the create
    handler's poll reads them after. The older must not replace the newer."""
    from trio.testing import wait_all_tasks_blocked

    admin = FakeAdmin()
    names = ["orders"]
    admin.describe_topics = lambda timeout_ms=None: _async(
        [TopicDescription(n, [PartitionInfo(n, 0, 1, 0, (1, 2), (1, 2))]) for n in names])
    gate = trio.Event()
    describe_log_dirs = admin.describe_log_dirs

    async def slow_once(brokers, timeout_ms=None):
        nonlocal gate
        if gate is not None:  # the first poll's log dirs answer late
            g, gate = gate, None
            await g.wait()
        return await describe_log_dirs(brokers, timeout_ms)

    admin.describe_log_dirs = slow_once
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=Clock())
    first = gate
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.poll_once)  # the loop's
        await wait_all_tasks_blocked()
        names.append("created")
        nursery.start_soon(watch.poll_once)  # the create handler's
        await wait_all_tasks_blocked()
        first.set()
    assert set(watch.snapshot.topics) == {"orders", "created"}


async def test_callers_waiting_for_a_poll_share_the_next_one():
    """Callers that came while a poll was under way need one that starts after them: one
    poll serves them all."""
    from trio.testing import wait_all_tasks_blocked

    admin = FakeAdmin()
    gate = trio.Event()
    describe_cluster = admin.describe_cluster

    async def held(timeout_ms=None):
        await gate.wait()
        return await describe_cluster(timeout_ms)

    admin.describe_cluster = held
    watch = ClusterWatch(admin, interval_s=1, window_s=60, clock=Clock())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.poll_once)  # under way
        await wait_all_tasks_blocked()
        for _ in range(4):
            nursery.start_soon(watch.poll_once)
        await wait_all_tasks_blocked()
        gate.set()
    assert len(admin.timeouts["describe_cluster"]) == 2  # the one under way, then one for the four
