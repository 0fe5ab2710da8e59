"""The console's view of the cluster: one task polls it through the SDK's Admin at a set
interval and keeps the latest snapshot plus a bounded window of rates and lags.

Each poll asks Metadata (brokers, controller, every topic's partitions), DescribeLogDirs of
every broker (each replica's size, log start offset, LEO and HW) and, for every consumer
group, its description and committed offsets, every request bounded by the refresh interval
(``call_timeout_ms``). A broker that does not answer in time keeps its replicas' last known
figures (``stale_brokers``), a group its last state with the reason; a poll that fails
altogether keeps the last snapshot and says why (``error``). Pages read the snapshot, so a
page never waits on the cluster and a thousand open pages cost the cluster one poll per
interval.

What the rates measure (docs in the README): a broker's *in* is the growth per second of
the bytes its replicas hold (records produced to the partitions it leads and copied to the
ones it follows); its *out* is what its followers copied from it (each led partition's
growth times its other in-sync replicas). Every rate is a sum of growths per partition (per
group and partition for commits) between two polls, over the subjects present in both, so
that a follower joining the ISR, leadership moving or a group missing from one poll is not
read as traffic. Consumer reads are not visible to an admin client;
the broker's Prometheus metrics have them. A topic's messages in is the growth of its
partitions' LEOs; its messages out is the growth of the offsets its groups committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from tidelog.errors import TidelogError
from tidelog.protocol.topics import TopicPartition
from tidelog.webconsole.model import Window, growth

logger = logging.getLogger(__name__)

GROUP_REQUESTS_AT_ONCE = 8
# the least time a poll gives the cluster to answer (a poll's deadline is its refresh
# interval, never less than this)
MIN_CALL_TIMEOUT_MS = 1000


@dataclass
class GroupState:
    description: Any = None  # ConsumerGroupDescription
    offsets: list = field(default_factory=list)  # GroupOffsets
    error: str | None = None

    @property
    def lag(self) -> int | None:
        """The total lag; None when any part of it is unknown (a partition's end not read, or
        one assigned to a member with no committed offset yet), never a partial sum: 0 would
        read as caught up."""
        if self.error is not None or any(o.lag is None for o in self.offsets):
            return None
        committed = {o.partition for o in self.offsets}
        members = self.description.members if self.description is not None else ()
        if any(tp not in committed for m in members for tp in m.assignment):
            return None
        return sum(o.lag for o in self.offsets)


@dataclass
class Snapshot:
    time_ms: int
    cluster: Any  # ClusterDescription
    topics: dict[str, Any]  # name -> TopicDescription
    replicas: dict[TopicPartition, dict[int, Any]]  # -> broker -> ReplicaInfo
    broker_errors: dict[int, str]
    groups: dict[str, GroupState]
    stale_brokers: set[int] = field(default_factory=set)  # their replicas' figures are the last known
    versions: dict[int, str | None] = field(default_factory=dict)  # broker -> its software version


def topics_partitions(topics: dict[str, Any]) -> set[TopicPartition]:
    return {TopicPartition(p.topic, p.partition) for t in topics.values() for p in t.partitions}


class Series:
    """Windows by name (a broker, a topic, a group), created on first use and forgotten
    when their subject is gone."""

    def __init__(self, span_ms: int, max_points: int):
        self.span_ms, self.max_points = span_ms, max_points
        self.windows: dict[Any, Window] = {}

    def add(self, key: Any, now_ms: int, value: float | None) -> None:
        w = self.windows.get(key)
        if w is None:
            w = self.windows[key] = Window(self.span_ms, self.max_points)
        w.add(now_ms, value)

    def keep(self, keys: set) -> None:
        for k in [k for k in self.windows if k not in keys]:
            del self.windows[k]

    def points(self, key: Any) -> list:
        w = self.windows.get(key)
        return w.points() if w is not None else []


class ClusterWatch:
    def __init__(self, admin: Any, *, interval_s: float = 1.0, window_s: float = 300.0,
                 clock: Callable[[], float] = time.time):
        self.admin = admin
        self.interval_s = interval_s
        self.call_timeout_ms = max(MIN_CALL_TIMEOUT_MS, int(interval_s * 1000))
        self.clock = clock
        span_ms, points = int(window_s * 1000), max(2, int(window_s / interval_s) + 1)
        self.snapshot: Snapshot | None = None
        self.error: str | None = None
        self.broker_in = Series(span_ms, points)
        self.broker_out = Series(span_ms, points)
        self.topic_in = Series(span_ms, points)
        self.topic_out = Series(span_ms, points)
        self.group_lag = Series(span_ms, points)
        self._previous: tuple[int, dict] | None = None  # the last poll's (time_ms, ``counters``)
        self.polled = trio.Event()  # a fresh one per poll
        self._poll_lock = trio.Lock()
        self._polls_started = 0  # polls begun, and the number of the last one completed
        self._polls_done = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.poll_once()
            await trio.sleep(self.interval_s)

    async def poll_once(self) -> None:
        """A snapshot taken after this call: the watch's loop and the actions (which poll once
        what they changed is done) poll one at a time, so a snapshot never replaces a newer
        one (a topic just created never disappears for a refresh). A caller that waited while
        another poll started after its call and completed takes that one."""
        wanted = self._polls_started + 1  # a poll starting from now on will do
        async with self._poll_lock:
            if self._polls_done >= wanted:
                return
            self._polls_started += 1
            number = self._polls_started
            try:
                snapshot = await self._poll()
            except Exception as e:  # the watch outlives any failure (trio.Cancelled is not an Exception)
                self.error = f"the cluster did not answer: {_describe(e)}"
                logger.warning("%s", self.error)
            else:
                self.error = None
                self._record(snapshot)
                self.snapshot = snapshot
            self._polls_done = number
        self.polled.set()
        self.polled = trio.Event()

    async def _poll(self) -> Snapshot:
        """One snapshot, every request bounded by ``call_timeout_ms``: a broker listed in the
        metadata but unreachable must not hold the view for the Admin's default timeout. The
        log dirs, the groups and the versions are asked at once, under one deadline; what did
        not answer by then keeps its last known figures, marked (stale brokers, a group's
        error, an unknown version)."""
        timeout_ms = self.call_timeout_ms
        cluster = await self.admin.describe_cluster(timeout_ms=timeout_ms)
        topics = {t.name: t for t in await self.admin.describe_topics(timeout_ms=timeout_ms)}
        brokers = [b.node_id for b in cluster.brokers]
        found: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._log_dirs_into, found, brokers, timeout_ms)
            nursery.start_soon(self._groups_into, found, timeout_ms)
            nursery.start_soon(self._versions_into, found, brokers, timeout_ms)
        by_broker, errors = found["log_dirs"]
        replicas: dict[TopicPartition, dict[int, Any]] = {}
        for broker, dirs in by_broker.items():
            for d in dirs.values():
                for tp, info in d.replicas.items():
                    replicas.setdefault(tp, {})[broker] = info
        stale: set[int] = set()
        if self.snapshot is not None:  # a replica whose broker did not answer (or left) keeps its last figures
            existing = topics_partitions(topics)
            for tp, held in self.snapshot.replicas.items():
                for broker, info in held.items():
                    if broker not in by_broker and tp in existing:
                        replicas.setdefault(tp, {})[broker] = info
                        stale.add(broker)
        return Snapshot(int(self.clock() * 1000), cluster, topics, replicas, errors, found["groups"], stale,
                        found["versions"])

    async def _log_dirs_into(self, found: dict, brokers: list[int], timeout_ms: int) -> None:
        """``found["log_dirs"]``: (broker -> its dirs, broker -> why it did not answer)."""
        try:
            found["log_dirs"] = await self.admin.describe_log_dirs(brokers, timeout_ms=timeout_ms), {}
        except TidelogError as e:
            results = getattr(e, "results", None) or {b: e for b in brokers}
            found["log_dirs"] = ({b: r for b, r in results.items() if not isinstance(r, BaseException)},
                                 {b: str(r) for b, r in results.items() if isinstance(r, BaseException)})

    async def _versions_into(self, found: dict, brokers: list[int], timeout_ms: int) -> None:
        """``found["versions"]``: broker -> its version, None for one that did not answer."""
        found["versions"] = {b: None for b in brokers}
        with trio.move_on_after(timeout_ms / 1000):
            found["versions"] = await self.admin.broker_versions(brokers, timeout_ms=timeout_ms)

    async def _groups_into(self, found: dict, timeout_ms: int) -> None:
        """``found["groups"]``: the groups, each described by the deadline or keeping its last
        known state with the reason it is stale."""
        old = self.snapshot.groups if self.snapshot is not None else {}
        try:
            found["groups"] = await self._groups(timeout_ms, old)
        except Exception as e:  # keep the last known groups, each saying why it is stale
            reason = f"the groups could not be listed: {_describe(e)}"
            found["groups"] = {g: GroupState(st.description, st.offsets, reason) for g, st in old.items()}

    async def _groups(self, timeout_ms: int, old: dict[str, GroupState]) -> dict[str, GroupState]:
        deadline = trio.current_time() + timeout_ms / 1000
        listed = await self.admin.list_groups(timeout_ms=timeout_ms)
        out: dict[str, GroupState] = {g.group_id: GroupState() for g in listed}
        done: set[str] = set()
        limiter = trio.CapacityLimiter(GROUP_REQUESTS_AT_ONCE)

        async def one(group_id: str) -> None:
            async with limiter:
                state = out[group_id]
                try:
                    left_ms = max(1, int((deadline - trio.current_time()) * 1000))
                    (state.description,) = await self.admin.describe_groups([group_id], timeout_ms=left_ms)
                    left_ms = max(1, int((deadline - trio.current_time()) * 1000))
                    state.offsets = await self.admin.list_group_offsets(group_id, timeout_ms=left_ms)
                except Exception as e:
                    state.error = _describe(e)
                done.add(group_id)

        with trio.move_on_at(deadline):
            async with trio.open_nursery() as nursery:
                for g in out:
                    nursery.start_soon(one, g)
        late = f"no answer within {timeout_ms} ms"
        for g in out.keys() - done:  # its last known figures, marked stale
            last = old.get(g, GroupState())
            out[g] = GroupState(last.description, last.offsets, late)
        return out

    # -- rates ----------------------------------------------------------------------------------

    def _record(self, s: Snapshot) -> None:
        now = s.time_ms
        current = counters(s)
        rates = growth(self._previous, (now, current)) if self._previous is not None else None
        self._previous = (now, current)
        brokers = {b.node_id for b in s.cluster.brokers}
        for b in brokers:
            known = rates is not None and b not in s.broker_errors
            self.broker_in.add(b, now, rates.get(("in", b), 0.0) if known else None)
            self.broker_out.add(b, now, rates.get(("out", b), 0.0) if known else None)
        for t in s.topics:
            self.topic_in.add(t, now, rates.get(("messages_in", t)) if rates is not None else None)
            self.topic_out.add(t, now, rates.get(("messages_out", t)) if rates is not None else None)
        for g, state in s.groups.items():
            self.group_lag.add(g, now, state.lag)
        self.broker_in.keep(brokers)
        self.broker_out.keep(brokers)
        self.topic_in.keep(set(s.topics))
        self.topic_out.keep(set(s.topics))
        self.group_lag.keep(set(s.groups))


def counters(s: Snapshot) -> dict[tuple, tuple[tuple, int, int]]:
    """The counters a snapshot reads, per subject: subject -> (the rate it adds to, its
    value, the weight of its growth). Subjects are single partitions (and groups), so that a
    total moving for another reason than traffic (a follower joining the ISR, leadership
    moving, a partition or a group missing from one poll) is not read as traffic. Figures
    that are only the last known (a stale broker, a group that did not answer) are left out."""
    out: dict[tuple, tuple[tuple, int, int]] = {}
    for topic in s.topics.values():
        for p in topic.partitions:
            tp = TopicPartition(p.topic, p.partition)
            reps = {b: info for b, info in s.replicas.get(tp, {}).items() if b not in s.stale_brokers}
            for broker, info in reps.items():
                out["held", broker, tp] = (("in", broker), info.size, 1)
            leader = reps.get(p.leader)
            if leader is not None:  # its growth, copied by each in-sync follower
                followers = sum(1 for b in p.isr if b != p.leader)
                out["led", p.leader, tp] = (("out", p.leader), leader.size, followers)
                out["end", tp] = (("messages_in", p.topic), leader.log_end_offset, 1)
    for g, state in s.groups.items():
        if state.error is None:
            for o in state.offsets:
                if o.committed is not None:
                    out["committed", g, o.partition] = (("messages_out", o.partition.topic), o.committed, 1)
    return out


def _describe(e: BaseException) -> str:
    """An error's text; an exception group's first leaf's (concurrent requests fail together)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return str(e) if isinstance(e, TidelogError) else f"{type(e).__name__}: {e}"
