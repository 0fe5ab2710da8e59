"""The consumer group client (client/aio/group.py ConsumerCoordinator) against a scripted
coordinator, for ways a member could stall, time out or miss a callback:

* FindCoordinator answered with a non-retriable error (GROUP_AUTHORIZATION_FAILED): every
  poll raises it until it is resolved, and the lookup goes on with backoff, so a join waiting
  for the coordinator proceeds once it is found (before, the lookup stopped after the first
  such answer and a join in progress waited for ever).
* Heartbeats while the member is COMPLETING_REBALANCE (JoinGroup answered, SyncGroup not yet
  sent: the leader refreshing metadata to compute the assignment can take longer than the
  session timeout), as Kafka's heartbeat thread does; none while the SyncGroup is in flight
  (the coordinator keeps a member awaiting SyncGroup alive, and responses come in request
  order, so a heartbeat would wait behind the SyncGroup).
* ``poll(deadline)`` does its group work within the deadline: the automatic commit before a
  rebalance goes on in the background and the next poll continues the rebalance, as Kafka's
  onJoinPrepare does.
* An ``on_partitions_assigned`` that did not run to its end (the poll was cancelled, or the
  facade could not hand it to its caller) runs in the next poll, once, before any record of
  those partitions, as Kafka's consumer calls onJoinComplete again.

Time is Trio's autojump clock (the module's ``time.monotonic`` is Trio's clock here, so the
heartbeat timer moves with it); the tests assert the order of events only."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio

import tidelog.aio.commits as commits_module
import tidelog.aio.group as group_module
import tidelog.aio.heartbeat as heartbeat_module
from tidelog.aio.assignors import Assignment, encode_assignment
from tidelog.aio.cluster import ClusterMetadata
from tidelog.aio.group import ConsumerCoordinator, ConsumerRebalanceListener, call_maybe_async
from tidelog.aio.heartbeat import heartbeats_due
from tidelog.aio.membership import Generation, MemberState
from tidelog.aio.subscription import ConsumerConfig, SubscriptionState
from tidelog.errors import CallbackNotRunError, SaslAuthenticationError, TidelogError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    GROUP_AUTHORIZATION_FAILED,
    ILLEGAL_GENERATION,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    REQUEST_TIMED_OUT,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_OR_PARTITION,
    error_for,
)
from tidelog.protocol.messages import (
    EARLIEST_TIMESTAMP,
    FindCoordinatorResponse,
    HeartbeatResponse,
    JoinGroupMember,
    JoinGroupResponse,
    OffsetCommitPartitionResponse,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from tidelog.protocol.topics import TopicPartition as TP

A0 = TP("a", 0)


@pytest.fixture(autouse=True)
def trio_monotonic(monkeypatch):
    """The group modules' clock is Trio's (autojump) clock."""
    for module in (group_module, heartbeat_module, commits_module):
        monkeypatch.setattr(module, "time", SimpleNamespace(monotonic=trio.current_time))


class ScriptedCoordinator:
    """What ConsumerCoordinator uses of tidelog.aio.cluster.Cluster. ``events`` records what the
    coordinator saw and answered, in order; handlers may be replaced per test."""

    def __init__(self, *, leader: bool = False) -> None:
        self.metadata = ClusterMetadata()
        self.events: list[str] = []
        self.find_error = NONE.code
        self.join_errors: list[int] = []  # answers for the next JoinGroups, then NONE
        self.heartbeat_error = NONE.code
        self.leader = leader
        self.assignment: tuple[TP, ...] = ()
        self.refresh_s = 0.0  # how long the leader's metadata refresh takes
        self.sync_hold: trio.Event | None = None
        self.commit_hold: trio.Event | None = None
        self.generations: list[int] = []  # generation of each heartbeat
        self.heartbeat_times: list[float] = []  # when each heartbeat arrived (the autojump clock)
        # the next heartbeats' outcomes (an exception raised, or an error code answered), then answers
        self.heartbeat_script: list[BaseException | int] = []
        self.join_member_ids: list[str] = []  # the member id each JoinGroup carried

    async def request_any(self, message: Any, *, api_key: ApiKey, timeout: float) -> Any:
        assert api_key is ApiKey.FIND_COORDINATOR
        error = self.find_error
        self.events.append("find" if error == NONE.code else "find-refused")
        await trio.sleep(0.01)
        if error != NONE.code:
            return FindCoordinatorResponse(error, error_message="not authorized")
        return FindCoordinatorResponse(NONE.code, 1, "127.0.0.1", 9092)

    async def request(self, node: int, message: Any, *, api_key: ApiKey, timeout: float) -> Any:
        await trio.sleep(0.01)
        if api_key is ApiKey.JOIN_GROUP:
            self.join_member_ids.append(message.member_id)
            if self.join_errors:
                self.events.append("join-refused")
                return JoinGroupResponse(self.join_errors.pop(0))
            self.events.append("join")
            leader = "m-1" if self.leader else "m-0"
            members = [JoinGroupMember("m-1", message.protocols[0].metadata)] if self.leader else []
            return JoinGroupResponse(NONE.code, 1, "consumer", message.protocols[0].name, leader, "m-1", members)
        if api_key is ApiKey.SYNC_GROUP:
            self.events.append("sync")
            if self.sync_hold is not None:
                await self.sync_hold.wait()
            self.events.append("sync-answered")
            return SyncGroupResponse(NONE.code, encode_assignment(Assignment(self.assignment)))
        if api_key is ApiKey.HEARTBEAT:
            self.events.append("heartbeat")
            self.generations.append(message.generation_id)
            self.heartbeat_times.append(trio.current_time())
            if self.heartbeat_script:
                outcome = self.heartbeat_script.pop(0)
                if isinstance(outcome, BaseException):
                    raise outcome
                return HeartbeatResponse(outcome)
            return HeartbeatResponse(self.heartbeat_error)
        if api_key is ApiKey.OFFSET_COMMIT:
            self.events.append("commit")
            if self.commit_hold is not None:
                await self.commit_hold.wait()
            self.events.append("commit-answered")
            return OffsetCommitResponse([OffsetCommitTopicResponse(t.name, [
                OffsetCommitPartitionResponse(p.partition_index, NONE.code) for p in t.partitions])
                for t in message.topics])
        if api_key is ApiKey.OFFSET_FETCH:
            return OffsetFetchResponse(NONE.code, [])
        if api_key is ApiKey.LEAVE_GROUP:
            raise AssertionError("no member leaves in these scripts")
        raise AssertionError(f"unexpected {api_key}")

    async def refresh(self, timeout: float) -> ClusterMetadata:
        self.events.append("refresh")
        await trio.sleep(self.refresh_s)
        self.events.append("refreshed")
        return self.metadata

    def add_node(self, node: int, host: str, port: int) -> None:
        pass

    def add_topics(self, topics: Any) -> None:
        pass

    def set_topics(self, topics: Any) -> None:
        pass

    def request_update(self) -> None:
        pass

    def close_connection(self, node: int) -> None:
        pass


def new_member(cluster: ScriptedCoordinator, *, coordinator_known: bool = True, **config: Any
               ) -> ConsumerCoordinator:
    group = ConsumerCoordinator(cluster, ConsumerConfig(group_id="g", **config),
                                SubscriptionState(EARLIEST_TIMESTAMP), call_maybe_async, lambda: None)
    if coordinator_known:
        group.link.coordinator_id = 1
    group.subscribe(["a"], None, None)
    return group


def become_stable(group: ConsumerCoordinator, generation: Generation) -> None:
    """The member as after a completed rebalance of ``generation``."""
    group.member.join_started()
    group.member.joined(generation)
    group.member.synced()


def without_heartbeats(events: list[str]) -> list[str]:
    return [e for e in events if e != "heartbeat"]


async def poll_until(group: ConsumerCoordinator, done: Any, *, polls: int = 50, timeout_s: float = 1.0) -> None:
    for _ in range(polls):
        await group.poll(trio.current_time() + timeout_s)
        if done():
            return
    raise AssertionError(f"not done after {polls} polls")



async def stable_until(group: ConsumerCoordinator, done: Any) -> None:
    """Run ``group`` to STABLE, then poll each second (a poll raises a fatal answer) until
    ``done()``."""
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        await poll_until(group, lambda: group.state is MemberState.STABLE, timeout_s=60)
        while not done():
            await group.poll(trio.current_time() + 1)
            await trio.sleep(1)
        nursery.cancel_scope.cancel()

# -- 1. FindCoordinator with a non-retriable error ------------------------------------------------


async def test_a_refused_coordinator_lookup_is_raised_by_every_poll_until_resolved(autojump_clock):
    cluster = ScriptedCoordinator()
    cluster.find_error = GROUP_AUTHORIZATION_FAILED.code
    group = new_member(cluster, coordinator_known=False)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        for _ in range(3):  # each poll raises it, not only the first
            with pytest.raises(TidelogError) as raised:
                await group.poll(trio.current_time() + 5)
            assert raised.value.error is GROUP_AUTHORIZATION_FAILED and "FindCoordinator" in str(raised.value)
        cluster.find_error = NONE.code  # the ACL was fixed
        await poll_until(group, lambda: group.state is MemberState.STABLE)
        nursery.cancel_scope.cancel()
    assert cluster.events.count("find-refused") >= 3  # looked up again, not given up on
    assert cluster.events[-4:] == ["find", "join", "sync", "sync-answered"]


async def test_a_join_waiting_for_the_coordinator_goes_on_after_a_refused_lookup(autojump_clock):
    """The join task waits for the coordinator while the lookup retries with backoff: it
    proceeds once the coordinator is found, even with no poll in between."""
    cluster = ScriptedCoordinator()
    cluster.join_errors = [NOT_COORDINATOR.code]
    group = new_member(cluster)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        cluster.find_error = GROUP_AUTHORIZATION_FAILED.code
        await group.poll(trio.current_time() + 0.005)  # starts the join; returns before its answer
        assert group._join_done is not None
        with trio.fail_after(30):
            while "find-refused" not in cluster.events:
                await trio.sleep(0.01)
        cluster.find_error = NONE.code
        with trio.fail_after(60):
            await group._join_done.wait()  # no poll needed for the join to complete
        await group.poll(trio.current_time() + 1)
        nursery.cancel_scope.cancel()
    assert group.state is MemberState.STABLE
    assert cluster.events[0] == "join-refused" and cluster.events[-3:] == ["join", "sync", "sync-answered"]
    assert cluster.events.index("find-refused") < cluster.events.index("find")


# -- 2. heartbeats while completing the rebalance -------------------------------------------------


@pytest.mark.parametrize("state,valid,sync_in_flight,due", [
    (MemberState.STABLE, True, False, True),
    (MemberState.COMPLETING_REBALANCE, True, False, True),
    (MemberState.COMPLETING_REBALANCE, True, True, False),
    (MemberState.PREPARING_REBALANCE, True, False, False),
    (MemberState.UNJOINED, False, False, False),
    (MemberState.STABLE, False, False, False),
])
def test_when_heartbeats_are_due(state, valid, sync_in_flight, due):
    assert heartbeats_due(state, valid, sync_in_flight) is due


async def test_the_leader_heartbeats_while_it_computes_the_assignment(autojump_clock):
    """The leader's metadata refresh before assigning takes three session timeouts: its
    heartbeats of the new generation keep its session (Kafka heartbeats in
    COMPLETING_REBALANCE)."""
    cluster = ScriptedCoordinator(leader=True)
    cluster.refresh_s = 3 * 6.0
    group = new_member(cluster, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        await poll_until(group, lambda: group.state is MemberState.STABLE, timeout_s=60)
        nursery.cancel_scope.cancel()
    events = cluster.events
    during = events[events.index("refresh"):events.index("refreshed")]
    assert during.count("heartbeat") >= 3  # at least one per session timeout of the refresh
    assert set(cluster.generations) == {1}
    assert events.index("join") < events.index("refresh") < events.index("sync")


async def test_no_heartbeat_waits_behind_a_sync_group_in_flight(autojump_clock):
    """A follower's SyncGroup waits for the leader: the coordinator keeps the member alive
    meanwhile, and a heartbeat's answer would come only after the SyncGroup's (responses in
    request order), so none is sent until the SyncGroup is answered."""
    cluster = ScriptedCoordinator()
    cluster.sync_hold = trio.Event()
    group = new_member(cluster, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        await group.poll(trio.current_time() + 0.1)
        with trio.fail_after(30):
            while "sync" not in cluster.events:
                await trio.sleep(0.01)
        await trio.sleep(3 * 6.0)
        cluster.sync_hold.set()
        await poll_until(group, lambda: group.state is MemberState.STABLE)
        nursery.cancel_scope.cancel()
    events = cluster.events
    assert "heartbeat" not in events[events.index("sync"):events.index("sync-answered")]


async def test_rebalance_in_progress_answered_to_a_heartbeat_while_completing_is_ignored(autojump_clock):
    """As Kafka: the SyncGroup of this generation tells whether the member must rejoin; the
    heartbeat's REBALANCE_IN_PROGRESS during COMPLETING_REBALANCE does not start another one."""
    cluster = ScriptedCoordinator(leader=True)
    cluster.refresh_s = 3.0
    cluster.heartbeat_error = REBALANCE_IN_PROGRESS.code
    group = new_member(cluster, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        await poll_until(group, lambda: group.state is MemberState.STABLE, timeout_s=60)
        nursery.cancel_scope.cancel()
    events = cluster.events
    assert "heartbeat" in events[events.index("refresh"):events.index("refreshed")]
    assert not group.rejoin_needed and events.count("join") == 1


async def test_a_heartbeat_refused_as_a_whole_is_retried_and_the_member_lives_on(autojump_clock):
    """A heartbeat answered with an error body (UNKNOWN_SERVER_ERROR: the broker's handler
    failed) or failing authentication is a failed heartbeat, retried, as Kafka's heartbeat
    thread does: the heartbeat task does not die and take the consumer with it, nor does the
    member lose its generation."""
    cluster = ScriptedCoordinator()
    cluster.heartbeat_script = [error_for(UNKNOWN_SERVER_ERROR.code, "handler failed"),
                                SaslAuthenticationError("SASL authentication failed"),
                                UNKNOWN_SERVER_ERROR.code]  # an error body decoded as the response
    group = new_member(cluster, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    await stable_until(group, lambda: cluster.events.count("heartbeat") >= 5)
    assert group.state is MemberState.STABLE and cluster.events.count("join") == 1


@pytest.mark.parametrize("outcome", [REQUEST_TIMED_OUT.code, UNKNOWN_TOPIC_OR_PARTITION.code, 9999,
                                     error_for(TOPIC_AUTHORIZATION_FAILED.code, "refused as a whole")])
async def test_a_heartbeat_answered_with_an_unexpected_code_is_a_failed_heartbeat(autojump_clock, outcome):
    """Kafka's heartbeat thread takes any code its HeartbeatResponseHandler does not name
    (REQUEST_TIMED_OUT, a code the client does not know, ...) as a failed heartbeat: retried
    after the backoff, with the member's generation, its partitions and the coordinator kept.
    Only FENCED_INSTANCE_ID and GROUP_AUTHORIZATION_FAILED end the member."""
    cluster = ScriptedCoordinator()
    cluster.heartbeat_script = [outcome, outcome]
    group = new_member(cluster, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    await stable_until(group, lambda: cluster.events.count("heartbeat") >= 4)
    assert group.state is MemberState.STABLE and group.generation.generation_id == 1
    assert without_heartbeats(cluster.events) == ["join", "sync", "sync-answered"]  # no lookup, no rejoin


@pytest.mark.parametrize("code, rejoins_as", [(ILLEGAL_GENERATION.code, "m-1"), (UNKNOWN_MEMBER_ID.code, "")])
async def test_a_heartbeat_refusing_the_generation_keeps_the_member_id(autojump_clock, code, rejoins_as):
    """As Kafka's HeartbeatResponseHandler: ILLEGAL_GENERATION resets the generation but keeps
    the member id, which is still the coordinator's (the rejoin needs no MEMBER_ID_REQUIRED
    round, and the old id is not left to expire); UNKNOWN_MEMBER_ID forgets it."""
    cluster = ScriptedCoordinator()
    cluster.heartbeat_script = [code]
    group = new_member(cluster, session_timeout_ms=6000, heartbeat_interval_ms=1000)
    await stable_until(group, lambda: cluster.events.count("sync-answered") >= 2)
    assert cluster.join_member_ids == ["", rejoins_as]


async def test_a_failed_heartbeat_is_sent_again_after_the_backoff(autojump_clock):
    """As Kafka's Heartbeat.failHeartbeat: the heartbeat after a failed one waits
    ``retry_backoff_ms`` (doubling while they fail), not a whole heartbeat interval."""
    cluster = ScriptedCoordinator()
    cluster.heartbeat_script = [9999, 9999]  # two failed heartbeats, then answers
    group = new_member(cluster, session_timeout_ms=30_000, heartbeat_interval_ms=5000, retry_backoff_ms=100)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        await poll_until(group, lambda: group.state is MemberState.STABLE, timeout_s=60)
        while len(cluster.heartbeat_times) < 4:
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(cluster.heartbeat_times, cluster.heartbeat_times[1:])]
    assert gaps[0] < 1 and gaps[1] < 1 and gaps[2] >= 5  # after the backoffs, the interval


async def test_a_leave_group_refused_as_a_whole_is_logged_and_the_member_left(autojump_clock):
    """The heartbeat task leaves the group when the poll interval expired: a LeaveGroup
    answered with an error body does not end that task (the session expires instead)."""
    class Refusing(ScriptedCoordinator):
        async def request(self, node: int, message: Any, *, api_key: ApiKey, timeout: float) -> Any:
            if api_key is ApiKey.LEAVE_GROUP:
                raise error_for(UNKNOWN_SERVER_ERROR.code, "handler failed")
            return await super().request(node, message, api_key=api_key, timeout=timeout)

    group = new_member(Refusing())
    become_stable(group, Generation(1, "m-1"))
    await group.maybe_leave_group("consumer poll timeout has expired")
    assert not group.generation.member_id


# -- 3. poll's group work within its deadline -----------------------------------------------------


async def test_poll_returns_at_its_deadline_while_the_commit_before_a_rebalance_waits(autojump_clock):
    cluster = ScriptedCoordinator()
    cluster.commit_hold = trio.Event()
    cluster.assignment = (A0,)
    group = new_member(cluster)
    become_stable(group, Generation(1, "m-1", "range"))
    group.subscriptions.assign([A0])
    group.subscriptions.partitions[A0].seek(5)
    group.request_rejoin("a new member joined")
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        await group.poll(trio.current_time() + 1)
        assert without_heartbeats(cluster.events) == ["commit"]  # returned at its deadline, the commit still waiting
        assert group.subscriptions.partitions.keys() == {A0}  # not revoked before the commit ends
        assert group.holds_records()  # poll returns no records meanwhile: the commit is of these positions
        await group.poll(trio.current_time() + 1)
        assert without_heartbeats(cluster.events) == ["commit"]
        cluster.commit_hold.set()
        with trio.fail_after(30):
            while group.holds_records():
                await trio.sleep(0.01)
        await poll_until(group, lambda: group.state is MemberState.STABLE and not group.rejoin_needed)
        nursery.cancel_scope.cancel()
    assert without_heartbeats(cluster.events) == ["commit", "commit-answered", "join", "sync", "sync-answered"]
    assert set(group.subscriptions.partitions) == {A0}


# -- 4. an on_partitions_assigned that did not run ------------------------------------------------


class AssignedListener(ConsumerRebalanceListener):
    """Records each on_partitions_assigned; ``block_first``: the first one waits for ever."""

    def __init__(self, *, block_first: bool = False, fail_first: bool = False) -> None:
        self.calls: list[set[TP]] = []
        self.block_first, self.fail_first = block_first, fail_first

    async def on_partitions_assigned(self, assigned: set[TP]) -> None:
        self.calls.append(set(assigned))
        if len(self.calls) == 1 and self.block_first:
            await trio.sleep_forever()
        if len(self.calls) == 1 and self.fail_first:
            raise ValueError("the listener's own error")


async def poll_forever(group: ConsumerCoordinator) -> None:
    while True:
        await group.poll(trio.current_time() + 1)


async def test_an_assigned_listener_cut_short_by_a_cancelled_poll_runs_again_in_the_next_poll(autojump_clock):
    # as Kafka's consumer calls onJoinComplete again after a wakeup in its listener: the
    # assignment stands, and the next poll calls the listener with it, once
    cluster = ScriptedCoordinator()
    cluster.assignment = (A0,)
    group = new_member(cluster)
    listener = AssignedListener(block_first=True)
    group.subscribe(["a"], None, listener)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        with trio.move_on_after(30):
            await poll_forever(group)  # ends cancelled inside the listener
        assert listener.calls == [{A0}] and set(group.subscriptions.partitions) == {A0}
        assert group.holds_records()  # no records of A0 before its listener ran
        await group.poll(trio.current_time() + 1)
        assert listener.calls == [{A0}, {A0}] and not group.holds_records()
        await group.poll(trio.current_time() + 1)
        nursery.cancel_scope.cancel()
    assert listener.calls == [{A0}, {A0}] and group.state is MemberState.STABLE


async def test_an_assigned_listener_the_facade_could_not_run_runs_in_the_next_poll(autojump_clock):
    # the blocking facade's poll was left (Ctrl-C, a stuck thread) before the listener was
    # handed to its thread: that poll ends without records, and the next one runs it, once
    cluster = ScriptedCoordinator()
    cluster.assignment = (A0,)
    missed: list[Any] = []

    async def invoke(fn: Any, *args: Any) -> Any:
        if fn.__name__ == "on_partitions_assigned" and not missed:
            missed.append(args)
            raise CallbackNotRunError("on_partitions_assigned was not called: its poll had ended")
        return await call_maybe_async(fn, *args)

    group = ConsumerCoordinator(cluster, ConsumerConfig(group_id="g"), SubscriptionState(EARLIEST_TIMESTAMP),
                                invoke, lambda: None)
    group.link.coordinator_id = 1
    listener = AssignedListener()
    group.subscribe(["a"], None, listener)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        await poll_until(group, lambda: bool(missed))  # no error: the call is only put off
        assert listener.calls == [] and group.holds_records()
        await group.poll(trio.current_time() + 1)
        assert listener.calls == [{A0}] and not group.holds_records()
        await group.poll(trio.current_time() + 1)
        nursery.cancel_scope.cancel()
    assert listener.calls == [{A0}] and without_heartbeats(cluster.events) == ["join", "sync", "sync-answered"]


async def test_an_assigned_listeners_own_error_is_raised_once_and_not_repeated(autojump_clock):
    cluster = ScriptedCoordinator()
    cluster.assignment = (A0,)
    group = new_member(cluster)
    listener = AssignedListener(fail_first=True)
    group.subscribe(["a"], None, listener)
    async with trio.open_nursery() as nursery:
        group.start(nursery)
        with pytest.raises(ValueError, match="own error"):
            await poll_forever(group)
        await group.poll(trio.current_time() + 1)
        nursery.cancel_scope.cancel()
    assert listener.calls == [{A0}] and not group.holds_records()
