"""The group coordinator: consumer groups and their committed offsets, on the broker leading
the group's partition of ``__consumer_offsets`` (Kafka's GroupCoordinator and
GroupMetadataManager).

Which broker coordinates a group
--------------------------------
Group ``g`` lives in partition ``abs(java_hashcode(g)) % partitions`` of the internal topic
``__consumer_offsets`` (the hash is Java's ``String.hashCode``, so the placement is Kafka's);
the leader of that partition is its coordinator. Any broker answers FindCoordinator from its
metadata cache (COORDINATOR_NOT_AVAILABLE while the partition has no live leader). The topic
is created on first need with ``offsets.topic.num.partitions`` partitions,
``cleanup.policy=compact`` and ``offsets.topic.replication.factor`` replicas. As in Kafka, it
is never created with fewer: while fewer brokers are alive than that factor, FindCoordinator
is answered COORDINATOR_NOT_AVAILABLE with a message naming both numbers (clients retry),
and the broker logs a warning each time the live count it refuses changes. A cluster of
fewer brokers sets ``offsets.topic.replication.factor`` to its size (``tidelog dev up`` and
``deploy/config/single-node.toml`` do).

Loading and unloading (leadership callbacks from the replica manager)
---------------------------------------------------------------------
When this broker becomes leader of a partition of ``__consumer_offsets`` it reads the
partition from its log start to its log end, off the Trio thread (``trio.to_thread``), and
folds the records into groups and offsets (``offsets_records.load``); meanwhile requests for
its groups get COORDINATOR_LOAD_IN_PROGRESS, except, as in Kafka, SyncGroup (answered
REBALANCE_IN_PROGRESS: the member rejoins; clients do not expect the load error there) and
Heartbeat (answered NONE). When the broker stops leading the partition, its groups are
dropped, every waiting JoinGroup or SyncGroup is answered NOT_COORDINATOR, and later
requests get NOT_COORDINATOR: the client finds the new coordinator, which loads the same
records (they were committed with acks=all, so every in-sync replica has them).

A new leader epoch with this broker still the leader (the controller bumps it whenever the
ISR shrinks: a follower died or shut down) changes nothing here: the partition is owned (or
loading) already, and only the epoch is recorded, as Kafka's GroupMetadataManager keeps a
partition it owns. What fences a load or an append against a change of coordinator is the
partition's ownership token (``_owners``), new with each load and gone with each unload: a
load that finishes, or an append that is committed, under another token is discarded or
answered NOT_COORDINATOR. Losing the partition and leading it again is a new ownership
(the groups are loaded again: another broker may have written in between).

The commit path
---------------
OffsetCommit is validated against the group (``GroupMetadata.commit_error``: stale
generation, unknown member, rebalance in progress; generation -1 only while Empty). The
offsets are then appended to the group's partition as one batch of keyed records through
the replica manager's leader append, with acks=all: the response waits in the same purgatory
as an acks=all produce until the high watermark passes the batch. Only then are the offsets
put in the cache that OffsetFetch reads, so a fetched offset is always one that survives a
coordinator failover. Of two commits for one partition, the later record wins (the cache
keeps each offset's record position). While a commit waits, its group counts as holding
offsets and its partitions are exempt from expiry (Kafka's pending offset commits), so no
cleanup drops the group it will be cached in or writes a tombstone after its record. Group metadata (generation, protocol, leader, members
and their assignments) is written the same way when a rebalance completes, so a new
coordinator knows the group's generation and members after a failover.

Deleted topics: the UpdateMetadata that reports a topic deleted has the coordinator drop
the topic's offsets from its groups and append their tombstones (``handle_deleted_topics``,
Kafka's handleDeletedPartitions), so that a topic created again under the name does not
resume at the old offsets, after a reload neither.

Time: every group decision gets the time by two clocks (``GroupMetadata``'s ``Now``):
deadlines (session expiry, the end of a join phase, the SyncGroup deadline, pending members)
count on ``monotonic_clock``, so that a step of the wall clock (NTP) neither expires nor
prolongs them; what is stored or sent (commit and record timestamps, the group's state
timestamp, offset retention, as Kafka's) is ``clock``'s wall time. One timer task wakes at
the earliest group deadline and calls ``GroupMetadata.tick``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

import trio

from tidelog.broker.groups.group_metadata import (
    Effect,
    GroupConfig,
    GroupMetadata,
    GroupState,
    Now,
    Reply,
    StoreGroup,
    Waiting,
    join_error,
    sync_error,
)
from tidelog.broker.groups.offsets_records import (
    LoadedPartition,
    OffsetValue,
    group_key,
    group_value,
    offset_key,
    offset_value,
)
from tidelog.broker.replication.replica_manager import monotonic_ms, wall_ms
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    GROUP_ID_NOT_FOUND,
    INVALID_COMMIT_OFFSET_SIZE,
    INVALID_GROUP_ID,
    INVALID_REQUEST,
    KAFKA_STORAGE_ERROR,
    MESSAGE_TOO_LARGE,
    NON_EMPTY_GROUP,
    NONE,
    NOT_COORDINATOR,
    NOT_ENOUGH_REPLICAS,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_METADATA_TOO_LARGE,
    REBALANCE_IN_PROGRESS,
    RECORD_LIST_TOO_LARGE,
    REQUEST_TIMED_OUT,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode,
    OffsetOutOfRangeError,
    for_code,
)
from tidelog.protocol.messages import (
    GROUP_KEY,
    LATEST_TIMESTAMP,
    NO_OFFSET,
    UNKNOWN_MEMBER,
    DeletableGroupResult,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
    MemberResponse,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopicResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from tidelog.protocol.records import build_batch, iter_all_records, iter_headers
from tidelog.protocol.topics import OFFSETS_TOPIC, TopicPartition

logger = logging.getLogger("tidelog.group_coordinator")

LOAD_BUFFER_BYTES = 5 << 20  # Kafka's offsets.load.buffer.size
LAG_REFRESH_INTERVAL_S = 5.0  # end offsets of partitions led elsewhere, for the lag gauge
WAIT_MARGIN_MS = 10_000  # a JoinGroup/SyncGroup never waits longer than its timeout plus this


MAX_GROUP_ID_BYTES = 32767  # a Kafka protocol STRING: an int16 length
MAX_INT64 = (1 << 63) - 1


def invalid_group_id(group_id: str) -> bool:
    """Empty, or longer than a Kafka protocol string (32,767 bytes of UTF-8)."""
    return not group_id or (len(group_id) > MAX_GROUP_ID_BYTES // 4
                            and len(group_id.encode("utf-8", "surrogatepass")) > MAX_GROUP_ID_BYTES)


def java_string_hashcode(s: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, int32 arithmetic."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group_id: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode) % partitions`` (abs of Integer.MIN_VALUE is 0)."""
    h = java_string_hashcode(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


# Append errors as the committer sees them (Kafka's GroupMetadataManager mapping).
_APPEND_ERRORS = {
    UNKNOWN_TOPIC_OR_PARTITION.code: COORDINATOR_NOT_AVAILABLE,
    NOT_ENOUGH_REPLICAS.code: COORDINATOR_NOT_AVAILABLE,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND.code: COORDINATOR_NOT_AVAILABLE,
    REQUEST_TIMED_OUT.code: COORDINATOR_NOT_AVAILABLE,
    NOT_LEADER_OR_FOLLOWER.code: NOT_COORDINATOR,
    KAFKA_STORAGE_ERROR.code: NOT_COORDINATOR,
    MESSAGE_TOO_LARGE.code: INVALID_COMMIT_OFFSET_SIZE,
    RECORD_LIST_TOO_LARGE.code: INVALID_COMMIT_OFFSET_SIZE,
}


def offsets_topic_shortfall(live_brokers: int, replication_factor: int) -> str | None:
    """Why ``__consumer_offsets`` cannot be created yet (None: it can): fewer brokers alive
    than ``offsets.topic.replication.factor``. Kafka's rule and, nearly, its words."""
    if live_brokers >= replication_factor:
        return None
    return (f"{live_brokers} broker(s) alive, fewer than the {replication_factor} that offsets.topic.replication.factor "
            f"requires for {OFFSETS_TOPIC}: the group coordinator is not available until enough brokers are up "
            "(expected while a cluster starts; a smaller cluster must set offsets.topic.replication.factor to its size)")


def append_error(code: int) -> ErrorCode:
    if code == NONE.code:
        return NONE
    return _APPEND_ERRORS.get(code, UNKNOWN_SERVER_ERROR)


@dataclass(frozen=True)
class CoordinatorConfig:
    broker_id: int
    offsets_topic_num_partitions: int = 50
    offsets_topic_replication_factor: int = 3
    offsets_topic_segment_bytes: int = 100 << 20
    offsets_commit_timeout_ms: int = 5000
    offsets_retention_ms: int = 7 * 24 * 3600 * 1000
    offsets_retention_check_interval_ms: int = 600_000
    offset_metadata_max_bytes: int = 4096
    group: GroupConfig = field(default_factory=GroupConfig)

    @classmethod
    def from_broker_config(cls, c) -> "CoordinatorConfig":
        return cls(c.broker_id, c.offsets_topic_num_partitions, c.offsets_topic_replication_factor,
                   c.offsets_topic_segment_bytes, c.offsets_commit_timeout_ms,
                   c.offsets_retention_minutes * 60_000, c.offsets_retention_check_interval_ms,
                   c.offset_metadata_max_bytes,
                   GroupConfig(c.group_initial_rebalance_delay_ms, c.group_min_session_timeout_ms,
                               c.group_max_session_timeout_ms, c.group_max_size))


# a failed load of an offsets partition is tried again after this long, doubling up to the max
LOAD_RETRY_S, LOAD_RETRY_MAX_S = 0.5, 30.0


class _Appended(NamedTuple):
    """Records appended to an offsets partition (``GroupCoordinator._append_now``), their
    replication still to wait for: the partition's ownership token then (None: not the
    coordinator) and the replica manager's results and waits."""
    tp: TopicPartition
    owner: int | None
    results: dict
    waiting: dict


class _Waiter:
    """A JoinGroup or SyncGroup waiting for its Reply."""

    __slots__ = ("event", "response")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.response = None


CreateTopic = Callable[[str, int, int, dict[str, str]], Awaitable[None]]
ListOffsets = Callable[[int, ListOffsetsRequest], Awaitable[object]]


def _left_empty(group: GroupMetadata) -> bool:
    """An Empty group without offsets or joining members: one that retention or a topic's
    deletion has emptied goes, as Kafka's."""
    return group.is_(GroupState.EMPTY) and not group.has_offsets() and not group.pending_members


class GroupCoordinator:
    def __init__(self, config: CoordinatorConfig, replica_manager, metadata, *,
                 create_topic: CreateTopic | None = None, list_offsets: ListOffsets | None = None,
                 clock: Callable[[], int] = wall_ms, monotonic_clock: Callable[[], int] = monotonic_ms):
        self.config = config
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.create_topic = create_topic
        self.list_offsets = list_offsets
        self.clock = clock  # wall time: what is stored or sent
        self.monotonic_clock = monotonic_clock  # what deadlines count on
        self.groups: dict[str, GroupMetadata] = {}
        self.epochs: dict[int, int] = {}  # partitions of __consumer_offsets led here -> leader epoch
        self.loading: set[int] = set()
        # partitions led here -> ownership token: new with each load, so that what was begun
        # under an earlier ownership (a load, an append) is fenced, and a leader epoch bump is not
        self._owners: dict[int, int] = {}
        self._next_owner = itertools.count(1)
        # topics deleted while a partition loads: their offsets are dropped once it is loaded
        self._deleted_while_loading: dict[int, set[str]] = {}
        self.remote_end_offsets: dict[TopicPartition, int] = {}
        self._waiters: dict[tuple[str, str, str], list[_Waiter]] = {}
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._pending_loads: list[tuple[int, int]] = []
        self._creating_topic = False
        self._refused_at_live: int | None = None  # the live broker count last refused (logged once per count)

    def now(self) -> Now:
        """The time of a group decision, by both clocks (``group_metadata.Now``)."""
        return Now(self.monotonic_clock(), self.clock())

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for partition, owner in self._pending_loads:
                nursery.start_soon(self._load, partition, owner)
            self._pending_loads.clear()
            nursery.start_soon(self._timer_loop)
            nursery.start_soon(self._retention_loop)
            if self.list_offsets is not None:
                nursery.start_soon(self._lag_refresh_loop)
            task_status.started()
            await trio.sleep_forever()

    def shutdown(self) -> None:
        for partition in list(self.epochs):
            self._unload(partition)

    @property
    def num_partitions(self) -> int:
        return self.metadata.partition_count(OFFSETS_TOPIC) or self.config.offsets_topic_num_partitions

    def partition_of(self, group_id: str) -> int:
        return partition_for(group_id, self.num_partitions)

    # -- leadership of __consumer_offsets partitions --------------------------------------------

    def on_leadership_change(self, tp: TopicPartition, is_leader: bool, leader_epoch: int) -> None:
        """Called by the replica manager after each LeaderAndIsr / StopReplica of a partition.
        A partition owned here already (loaded or loading) stays so when the leader epoch
        alone changes: its groups, waiting requests and in-flight writes go on."""
        if tp.topic != OFFSETS_TOPIC:
            return
        if not is_leader:
            if tp.partition in self.epochs:
                self._unload(tp.partition)
            return
        if tp.partition in self.epochs:
            self.epochs[tp.partition] = leader_epoch
            return
        owner = next(self._next_owner)
        self.epochs[tp.partition], self._owners[tp.partition] = leader_epoch, owner
        self.loading.add(tp.partition)
        if self._nursery is None:
            self._pending_loads.append((tp.partition, owner))
        else:
            self._nursery.start_soon(self._load, tp.partition, owner)

    async def _load(self, partition: int, owner: int) -> None:
        """Read the partition's groups and offsets back, then serve them. A read that fails
        (the log changing under it, a disk error) is tried again, backing off, for as long as
        this leadership lasts: its groups answer COORDINATOR_LOAD_IN_PROGRESS meanwhile,
        which clients retry; serving them half loaded would hand out no committed offsets."""
        tp = TopicPartition(OFFSETS_TOPIC, partition)
        started, delay = time.monotonic(), LOAD_RETRY_S
        while True:
            p = self.replica_manager.partitions.get(tp)
            if p is not None and p.log is not None:
                try:
                    loaded = await self._read_partition(p.log)
                    break
                except Exception:
                    logger.exception("loading %s failed; trying again in %.1f s", tp, delay)
            await trio.sleep(delay)
            delay = min(2 * delay, LOAD_RETRY_MAX_S)
            if self._owners.get(partition) != owner:
                return
        if self._owners.get(partition) != owner:
            logger.info("%s: load discarded (leadership moved while it read)", tp)
            return
        self._install(partition, loaded)
        logger.info("%s: loaded %d groups and %d offsets in %.0f ms (leader epoch %d)%s", tp,
                    len(loaded.group_ids()), sum(len(o) for o in loaded.offsets.values()),
                    (time.monotonic() - started) * 1000, self.epochs[partition],
                    f"; {len(loaded.skipped)} undecodable records skipped" if loaded.skipped else "")
        for record_offset, problem in loaded.skipped[:10]:
            logger.warning("%s: record at offset %d skipped: %s", tp, record_offset, problem)

    async def _read_partition(self, log) -> LoadedPartition:
        loaded = LoadedPartition()
        end = log.log_end_offset
        offset = log.log_start_offset
        for _ in range(1 << 30):  # each round moves past at least one batch
            if offset >= end:
                break
            next_offset = await trio.to_thread.run_sync(_fold_chunk, log, offset, end, loaded)
            if next_offset <= offset:
                break
            offset = next_offset
        return loaded

    def _install(self, partition: int, loaded: LoadedPartition) -> None:
        now = self.now()
        for group_id in loaded.group_ids():
            group = GroupMetadata.restore(group_id, loaded.groups.get(group_id),
                                          loaded.offsets.get(group_id, {}), now)
            self.groups[group_id] = group
        self.loading.discard(partition)
        deleted = self._deleted_while_loading.pop(partition, None)
        if deleted:
            self._drop_deleted_topics(deleted, {partition})
        self._wake.set()

    def _unload(self, partition: int) -> None:
        self.epochs.pop(partition, None)
        self._owners.pop(partition, None)
        self._deleted_while_loading.pop(partition, None)
        self.loading.discard(partition)
        gone = [g for gid, g in self.groups.items() if self.partition_of(gid) == partition]
        for group in gone:
            del self.groups[group.group_id]
            group.state = GroupState.DEAD
            self._answer_all(group.group_id, NOT_COORDINATOR)
        if gone:
            logger.info("%s-%d: unloaded %d groups (no longer the leader)", OFFSETS_TOPIC, partition, len(gone))

    def _answer_all(self, group_id: str, error: ErrorCode) -> None:
        message = f"this broker is no longer the coordinator of group {group_id}; find it again"
        for key in [k for k in self._waiters if k[0] == group_id]:
            response = join_error(error, key[1], message) if key[2] is Waiting.JOIN else sync_error(error, message)
            self._deliver(key, response)

    # -- FindCoordinator -----------------------------------------------------------------------

    async def find_coordinator(self, req: FindCoordinatorRequest, listener: str | None = None) -> FindCoordinatorResponse:
        """The coordinator's address on ``listener`` (the one the client connected on)."""
        if req.key_type != GROUP_KEY:
            return FindCoordinatorResponse(INVALID_REQUEST.code, error_message=(
                f"key type {req.key_type} is not supported (only groups, {GROUP_KEY}; no transactions)"))
        if invalid_group_id(req.key):
            return FindCoordinatorResponse(INVALID_GROUP_ID.code, error_message=(
                f"a group id is 1 to {MAX_GROUP_ID_BYTES} bytes of UTF-8"))
        if not self.metadata.contains_topic(OFFSETS_TOPIC):
            return FindCoordinatorResponse(COORDINATOR_NOT_AVAILABLE.code,
                                           error_message=await self._create_offsets_topic())
        tp = TopicPartition(OFFSETS_TOPIC, self.partition_of(req.key))
        leader = self.metadata.brokers.get(self.metadata.leader_of(tp))
        address = None if leader is None else self.metadata.address_on(leader, listener)
        if address is None:
            return FindCoordinatorResponse(COORDINATOR_NOT_AVAILABLE.code, error_message=(
                f"{tp} (the partition of group {req.key!r}) has no live leader"
                + (f" with a listener named {listener}" if leader is not None else "")))
        return FindCoordinatorResponse(NONE.code, leader.broker_id, *address)

    async def _create_offsets_topic(self) -> str:
        """Create ``__consumer_offsets`` unless too few brokers are alive for its replication
        factor; returns why the coordinator is not available yet (FindCoordinator's message)."""
        live = len(self.metadata.brokers)
        shortfall = offsets_topic_shortfall(live, self.config.offsets_topic_replication_factor)
        if shortfall is not None:
            if live != self._refused_at_live:
                self._refused_at_live = live
                logger.warning("not creating %s: %s", OFFSETS_TOPIC, shortfall)
            return shortfall
        if not self._creating_topic and self.create_topic is not None:
            self._creating_topic = True
            try:
                configs = {"cleanup.policy": "compact", "segment.bytes": str(self.config.offsets_topic_segment_bytes)}
                await self.create_topic(OFFSETS_TOPIC, self.config.offsets_topic_num_partitions,
                                        self.config.offsets_topic_replication_factor, configs)
                logger.info("created %s: %d partitions, replication factor %d", OFFSETS_TOPIC,
                            self.config.offsets_topic_num_partitions, self.config.offsets_topic_replication_factor)
            except Exception as e:  # another broker created it first
                logger.info("%s not created here: %s", OFFSETS_TOPIC, e)
            finally:
                self._creating_topic = False
        return f"{OFFSETS_TOPIC} is being created; retry"

    # -- group APIs ----------------------------------------------------------------------------

    def coordinator_error(self, group_id: str) -> ErrorCode | None:
        """Why this broker cannot answer for ``group_id`` now (None: it can). A group id is
        a non-empty Kafka protocol string: at most 32,767 bytes of UTF-8 (INVALID_GROUP_ID)."""
        if invalid_group_id(group_id):
            return INVALID_GROUP_ID
        partition = self.partition_of(group_id)
        if partition in self.loading:
            return COORDINATOR_LOAD_IN_PROGRESS
        if partition not in self.epochs:
            return NOT_COORDINATOR
        return None

    async def join_group(self, req: JoinGroupRequest, client_id: str | None, client_host: str, *,
                         supports_skip_assignment: bool = True) -> JoinGroupResponse:
        """``supports_skip_assignment``: the client reads JoinGroup's skip_assignment (the
        native protocol; Kafka's from v9 on), see ``GroupMetadata.join``."""
        error = self.coordinator_error(req.group_id)
        if error is not None:
            return join_error(error, req.member_id)
        group = self.groups.get(req.group_id)
        if group is None:
            if req.member_id != UNKNOWN_MEMBER:
                return join_error(UNKNOWN_MEMBER_ID, req.member_id, f"group {req.group_id} does not exist")
            group = self.groups[req.group_id] = GroupMetadata(req.group_id, state_timestamp_ms=self.clock())
        prefix = req.group_instance_id or client_id or "member"
        result = group.join(req, client_id or "", client_host, f"{prefix}-{uuid.uuid4()}", self.now(),
                            self.config.group, supports_skip_assignment=supports_skip_assignment)
        if result.immediate is not None:
            self._apply(group, result.effects)
            self._forget_if_unused(group)
            return result.immediate
        waiter = self._register(req.group_id, result.wait_for, Waiting.JOIN)
        self._apply(group, result.effects)
        wait_ms = max(req.rebalance_timeout_ms, req.session_timeout_ms) + self.config.group.initial_rebalance_delay_ms
        return await self._await(waiter, (req.group_id, result.wait_for, Waiting.JOIN), wait_ms,
                                 join_error(REBALANCE_IN_PROGRESS, result.wait_for))

    def _forget_if_unused(self, group: GroupMetadata) -> None:
        """A group that a refused first JoinGroup created and that holds nothing is not kept
        (it would show in ListGroups until the next retention check)."""
        if (group.is_(GroupState.EMPTY) and group.generation_id == 0 and not group.members
                and not group.pending_members and not group.has_offsets()
                and self.groups.get(group.group_id) is group):
            del self.groups[group.group_id]

    async def sync_group(self, req: SyncGroupRequest) -> SyncGroupResponse:
        error = self.coordinator_error(req.group_id)
        if error is COORDINATOR_LOAD_IN_PROGRESS:
            # the rebalance it belongs to is lost with the load: the member rejoins (Kafka's
            # answer; clients do not expect COORDINATOR_LOAD_IN_PROGRESS from SyncGroup)
            return sync_error(REBALANCE_IN_PROGRESS, f"group {req.group_id} is being loaded: rejoin it")
        if error is not None:
            return sync_error(error)
        group = self.groups.get(req.group_id)
        if group is None:
            return sync_error(UNKNOWN_MEMBER_ID, f"group {req.group_id} does not exist")
        result = group.sync(req, self.now())
        if result.immediate is not None:
            self._apply(group, result.effects)
            return result.immediate
        waiter = self._register(req.group_id, req.member_id, Waiting.SYNC)
        self._apply(group, result.effects)
        return await self._await(waiter, (req.group_id, req.member_id, Waiting.SYNC), group.rebalance_timeout_ms,
                                 sync_error(REBALANCE_IN_PROGRESS))

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        error = self.coordinator_error(req.group_id)
        if error is COORDINATOR_LOAD_IN_PROGRESS:  # answered blindly, as Kafka: the load restarts every session
            return HeartbeatResponse(NONE.code)
        if error is not None:
            return HeartbeatResponse(error.code, error.message)
        group = self.groups.get(req.group_id)
        if group is None:
            return HeartbeatResponse(UNKNOWN_MEMBER_ID.code, f"group {req.group_id} does not exist")
        error, message = group.heartbeat(req.member_id, req.group_instance_id, req.generation_id, self.now())
        return HeartbeatResponse(error.code, message)

    async def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        error = self.coordinator_error(req.group_id)
        if error is not None:
            return LeaveGroupResponse(error.code, error_message=error.message)
        group = self.groups.get(req.group_id)
        if group is None or group.is_(GroupState.DEAD):
            members = [MemberResponse(m.member_id, UNKNOWN_MEMBER_ID.code, m.group_instance_id) for m in req.members]
            return LeaveGroupResponse(_single_error(members), members)
        members, effects = group.leave(req.members, self.now(), self.config.group)
        self._apply(group, effects)
        return LeaveGroupResponse(_single_error(members), members)

    async def list_groups(self, req: ListGroupsRequest) -> ListGroupsResponse:
        wanted = {s.lower() for s in req.states_filter}
        groups = [ListedGroup(g.group_id, g.protocol_type or "", str(g.state)) for g in self.groups.values()
                  if not wanted or str(g.state).lower() in wanted]
        error = COORDINATOR_LOAD_IN_PROGRESS if self.loading else NONE
        return ListGroupsResponse(error.code, groups)

    async def describe_groups(self, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
        out = []
        for group_id in req.groups:
            error = self.coordinator_error(group_id)
            group = self.groups.get(group_id)
            if error is not None:
                out.append(DescribedGroup(error.code, group_id, error_message=error.message))
            elif group is None:
                out.append(DescribedGroup(NONE.code, group_id, str(GroupState.DEAD)))
            else:
                out.append(group.describe())
        return DescribeGroupsResponse(out)

    async def delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        results = []
        for group_id in req.groups_names:
            error, message = await self._delete_group(group_id)
            results.append(DeletableGroupResult(group_id, error.code, message))
        return DeleteGroupsResponse(results)

    async def _delete_group(self, group_id: str) -> tuple[ErrorCode, str | None]:
        error = self.coordinator_error(group_id)
        if error is not None:
            return error, error.message
        group = self.groups.get(group_id)
        if group is None or group.is_(GroupState.DEAD):
            return GROUP_ID_NOT_FOUND, f"group {group_id} does not exist"
        if not group.is_(GroupState.EMPTY):
            return NON_EMPTY_GROUP, (f"group {group_id} has {len(group.members)} members ({group.state}); "
                                     "only a group without members can be deleted")
        records = self._remove_group(group_id, group, self.clock())
        error, _ = await self._append(self.partition_of(group_id), records)
        return error, None if error is NONE else f"the group's tombstones were not written: {error.message}"

    # -- offsets -------------------------------------------------------------------------------

    async def offset_commit(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        errors = self._commit_errors(req)
        valid = [(t.name, p) for t in req.topics for p in t.partitions
                 if errors.get((t.name, p.partition_index)) is None]
        if valid:
            group = self.groups[req.group_id]
            outcome = await self._write_offsets(group, req, valid)
            for (topic, p), error in zip(valid, outcome):
                errors[(topic, p.partition_index)] = (error, None if error is NONE else error.message)
        return OffsetCommitResponse([OffsetCommitTopicResponse(t.name, [
            OffsetCommitPartitionResponse(p.partition_index, errors[(t.name, p.partition_index)][0].code,
                                          errors[(t.name, p.partition_index)][1])
            for p in t.partitions]) for t in req.topics])

    def _commit_errors(self, req: OffsetCommitRequest) -> dict[tuple[str, int], tuple[ErrorCode, str | None] | None]:
        """Per partition: the error that refuses its commit, or None (to be written). As in
        Kafka, a partition the cluster does not have (by the metadata: so also any name that
        is not a valid topic name, and a negative partition) is refused first with
        UNKNOWN_TOPIC_OR_PARTITION, whatever the group's state."""
        unknown = {(t.name, p.partition_index): (UNKNOWN_TOPIC_OR_PARTITION, f"{t.name[:255]!r} has no partition "
                                                 f"{p.partition_index}: offsets are committed for existing partitions only")
                   for t in req.topics for p in t.partitions
                   if self.metadata.partition_state(TopicPartition(t.name, p.partition_index)) is None}
        keys = [(t.name, p.partition_index) for t in req.topics for p in t.partitions if
                (t.name, p.partition_index) not in unknown]
        if not keys:
            return unknown
        error = self.coordinator_error(req.group_id)
        refusal = (error, error.message) if error is not None else self._group_refusal(req)
        if refusal is not None:
            return {**dict.fromkeys(keys, refusal), **unknown}
        out: dict = dict(unknown)
        for t in req.topics:
            for p in t.partitions:
                if (t.name, p.partition_index) in unknown:
                    continue
                too_large = p.committed_metadata is not None and len(
                    p.committed_metadata.encode()) > self.config.offset_metadata_max_bytes
                out[(t.name, p.partition_index)] = (OFFSET_METADATA_TOO_LARGE, (
                    f"metadata is larger than offset.metadata.max.bytes={self.config.offset_metadata_max_bytes}"
                )) if too_large else None
        return out

    def _group_refusal(self, req: OffsetCommitRequest) -> tuple[ErrorCode, str] | None:
        group = self.groups.get(req.group_id)
        if group is None:
            if req.generation_id >= 0:
                return UNKNOWN_MEMBER_ID, (f"group {req.group_id} does not exist (its members expired or its "
                                           "coordinator moved): rejoin before committing")
            group = self.groups[req.group_id] = GroupMetadata(req.group_id, state_timestamp_ms=self.clock())
        return group.commit_error(req.generation_id, req.member_id, req.group_instance_id, self.now())

    async def _write_offsets(self, group: GroupMetadata, req: OffsetCommitRequest, valid) -> list[ErrorCode]:
        now = self.clock()
        # retention_time_ms is -1 or an int64 (protocol.messages); the sum stays an int64
        expire = min(now + req.retention_time_ms, MAX_INT64) if req.retention_time_ms >= 0 else -1
        values = [OffsetValue(p.committed_offset, p.committed_leader_epoch, p.committed_metadata, now, expire)
                  for _, p in valid]
        tps = [TopicPartition(topic, p.partition_index) for topic, p in valid]
        records = [(offset_key(req.group_id, tp), offset_value(v)) for tp, v in zip(tps, values)]
        group.begin_offset_commit(tps)
        try:
            error, base_offset = await self._append(self.partition_of(req.group_id), records)
            if error is NONE and self.groups.get(req.group_id) is group:  # still pending: see remove_topics
                for i, (tp, v) in enumerate(zip(tps, values)):
                    group.apply_offset(tp, OffsetValue(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp_ms,
                                                       v.expire_timestamp_ms, base_offset + i))
        finally:
            group.end_offset_commit(tps)
        return [error] * len(valid)

    async def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        error = self.coordinator_error(req.group_id)
        if error is not None:
            return OffsetFetchResponse(error.code)
        group = self.groups.get(req.group_id)
        offsets = group.offsets if group is not None else {}
        if req.topics is None:
            wanted: dict[str, list[int]] = {}
            for tp in sorted(offsets):
                wanted.setdefault(tp.topic, []).append(tp.partition)
        else:
            wanted = {t.name: list(t.partition_indexes) for t in req.topics}
        return OffsetFetchResponse(NONE.code, [OffsetFetchTopicResponse(topic, [
            _fetched(p, offsets.get(TopicPartition(topic, p))) for p in parts]) for topic, parts in wanted.items()])

    # -- writing to __consumer_offsets -----------------------------------------------------------

    async def _append(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> tuple[ErrorCode, int]:
        """Append keyed records to our partition with acks=all and wait until committed:
        (error, base offset)."""
        return await self._committed(self._append_now(partition, records), len(records))

    def _append_now(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> _Appended:
        """The synchronous half of ``_append``: the records are in the log when it returns,
        in the order of the calls (``_committed`` waits for them)."""
        tp = TopicPartition(OFFSETS_TOPIC, partition)
        owner = self._owners.get(partition)
        if owner is None:
            return _Appended(tp, None, {}, {})
        results, waiting = self.replica_manager.append_now(-1, {tp: build_batch(records, timestamp_ms=self.clock())})
        return _Appended(tp, owner, results, waiting)

    async def _committed(self, appended: _Appended, n: int) -> tuple[ErrorCode, int]:
        tp, owner, results, waiting = appended
        if owner is None:
            return NOT_COORDINATOR, -1
        if waiting:
            await self.replica_manager.await_replication(waiting, self.config.offsets_commit_timeout_ms, results)
        r = results[tp]
        error = append_error(r["error_code"])
        if error is NONE and self._owners.get(tp.partition) != owner:
            error = NOT_COORDINATOR
        if error is not NONE:
            logger.info("%s: append of %d records failed: %s (%s)", tp, n, for_code(r["error_code"]),
                        r.get("error_message"))
        return error, r["base_offset"]

    async def _store_group(self, group: GroupMetadata, store: StoreGroup, appended: _Appended) -> None:
        error, _ = await self._committed(appended, 1)
        if self.groups.get(group.group_id) is group:
            self._apply(group, group.on_store_complete(store, error, self.now(), self.config.group))

    # -- effects and waiting -------------------------------------------------------------------

    def _register(self, group_id: str, member_id: str, kind: Waiting) -> _Waiter:
        waiter = _Waiter()
        self._waiters.setdefault((group_id, member_id, kind), []).append(waiter)
        return waiter

    def _deliver(self, key: tuple[str, str, str], response) -> None:
        for waiter in self._waiters.pop(key, []):
            waiter.response = response
            waiter.event.set()

    def _apply(self, group: GroupMetadata, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, Reply):
                self._deliver((group.group_id, e.member_id, e.kind), e.response)
            elif self._nursery is not None:
                # appended now, in the order the group decided them (a task would append a
                # pass later, and Trio may run a pass's tasks in reverse: the log's last record
                # of the group, what a reload believes, could be an older state, or follow a
                # DeleteGroups' tombstone); only the replication wait is the task's
                appended = self._append_now(self.partition_of(group.group_id),
                                            [(group_key(group.group_id), group_value(e.value))])
                self._nursery.start_soon(self._store_group, group, e, appended)
        self._wake.set()

    async def _await(self, waiter: _Waiter, key, wait_ms: int, fallback):
        with trio.move_on_after((wait_ms + WAIT_MARGIN_MS) / 1000):
            await waiter.event.wait()
        if waiter.response is None:
            with contextlib.suppress(ValueError, KeyError):
                self._waiters[key].remove(waiter)
            return fallback
        return waiter.response

    # -- timers --------------------------------------------------------------------------------

    def tick(self) -> float | None:
        """Run every due group deadline; returns the next deadline (monotonic ms) or None."""
        now = self.now()
        earliest = None
        for group in list(self.groups.values()):
            deadline = group.next_deadline_ms()
            if deadline is not None and deadline <= now.ms:
                self._apply(group, group.tick(now, self.config.group))
                deadline = group.next_deadline_ms()
            if deadline is not None and (earliest is None or deadline < earliest):
                earliest = deadline
        return earliest

    async def _timer_loop(self) -> None:
        while True:
            self._wake = trio.Event()
            earliest = self.tick()
            delay_s = 1.0 if earliest is None else (earliest - self.monotonic_clock()) / 1000
            with trio.move_on_after(min(1.0, max(0.005, delay_s))):
                await self._wake.wait()

    async def _retention_loop(self) -> None:
        while True:
            await trio.sleep(self.config.offsets_retention_check_interval_ms / 1000)
            await self.expire_offsets()

    async def expire_offsets(self) -> int:
        """Drop expired offsets (and groups left Empty without offsets), writing tombstones.
        Every partition's tombstones are appended in the step that decided them: a commit
        that comes while one partition's wait for replication goes on (re-creating a group
        just dropped, say) is appended after them, not overwritten by them."""
        now = self.clock()
        tombstones: dict[int, list[tuple[bytes, None]]] = {}
        for group_id, group in list(self.groups.items()):
            if self.coordinator_error(group_id) is not None:
                continue
            expired = group.expire_offsets(now, self.config.offsets_retention_ms)
            out = tombstones.setdefault(self.partition_of(group_id), [])
            out += [(offset_key(group_id, tp), None) for tp in expired]
            if _left_empty(group):
                out += self._remove_group(group_id, group, now, tombstoned=expired)
        written = await self._written(self._append_all(tombstones))
        if written:
            logger.info("expired offsets and groups: %d tombstones written", written)
        return written

    def _append_all(self, records: dict[int, list[tuple[bytes, None]]]) -> list[tuple[_Appended, int]]:
        """Append each offsets partition's records now (``_committed`` waits for them)."""
        return [(self._append_now(partition, rs), len(rs)) for partition, rs in records.items() if rs]

    async def _written(self, appended: list[tuple[_Appended, int]]) -> int:
        """How many of the appended records were committed."""
        written = 0
        for started, n in appended:
            if (await self._committed(started, n))[0] is NONE:
                written += n
        return written

    def handle_deleted_topics(self, topics) -> int:
        """Topics were deleted (UpdateMetadata): drop their offsets from every group
        coordinated here and write their tombstones, so that neither a reload nor a topic
        created again under the name finds them (Kafka's handleDeletedPartitions); a group
        left Empty without offsets goes too. A partition still loading gets the same once
        loaded. The tombstones are appended now, their replication is not waited for.
        Returns the number of offsets dropped."""
        deleted = set(topics)
        if not deleted:
            return 0
        for partition in self.loading:
            self._deleted_while_loading.setdefault(partition, set()).update(deleted)
        return self._drop_deleted_topics(deleted, set(self._owners) - self.loading)

    def _drop_deleted_topics(self, deleted: set[str], partitions: set[int]) -> int:
        now = self.clock()
        tombstones: dict[int, list[tuple[bytes, None]]] = {}
        dropped = 0
        for group_id, group in list(self.groups.items()):
            partition = self.partition_of(group_id)
            if partition not in partitions or self.coordinator_error(group_id) is not None:
                continue
            tps, n = group.remove_topics(deleted, self._log_end(partition))
            if not tps:
                continue
            dropped += n
            out = tombstones.setdefault(partition, [])
            out += [(offset_key(group_id, tp), None) for tp in tps]
            if _left_empty(group):
                out += self._remove_group(group_id, group, now)
        appended = self._append_all(tombstones)
        if appended:
            logger.info("deleted topics %s: %d offsets dropped", sorted(deleted), dropped)
            if self._nursery is not None:
                self._nursery.start_soon(self._written, appended)
        return dropped

    def _remove_group(self, group_id: str, group: GroupMetadata, wall_ms: int,
                      tombstoned: Iterable[TopicPartition] = ()) -> list[tuple[bytes, None]]:
        """Drop ``group`` (Dead from now): the tombstones of its key and of every offset it may
        have in the log but those in ``tombstoned`` already. A commit still waiting for
        replication, or one that failed (timed out: its record may be committed yet), is in
        the log before these: its partition gets a tombstone too, or a reload would bring
        that offset back to a deleted group (``GroupMetadata.offset_keys``)."""
        group.transition_to(GroupState.DEAD, wall_ms)
        del self.groups[group_id]
        keys = sorted(group.offset_keys() - set(tombstoned))
        return [(offset_key(group_id, tp), None) for tp in keys] + [(group_key(group_id), None)]

    def _log_end(self, partition: int) -> int:
        """The offsets partition's log end offset (every record appended so far is below it)."""
        p = self.replica_manager.partitions.get(TopicPartition(OFFSETS_TOPIC, partition))
        return p.log.log_end_offset if p is not None and p.log is not None else MAX_INT64

    # -- lag -----------------------------------------------------------------------------------

    def lag(self) -> list[tuple[str, TopicPartition, int, int]]:
        """(group, partition, committed offset, lag) for every committed offset of the groups
        coordinated here whose partition's end is known: the local high watermark where this
        broker leads the partition, else the last ListOffsets answer of its leader."""
        out = []
        for group_id, group in sorted(self.groups.items()):
            for tp, v in sorted(group.offsets.items()):
                end = self._end_offset(tp)
                if end is not None:
                    out.append((group_id, tp, v.offset, max(0, end - v.offset)))
        return out

    def _end_offset(self, tp: TopicPartition) -> int | None:
        p = self.replica_manager.partitions.get(tp)
        if p is not None and p.is_leader and p.log is not None:
            return p.log.high_watermark
        return self.remote_end_offsets.get(tp)

    async def _lag_refresh_loop(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                await self.refresh_remote_end_offsets()
            await trio.sleep(LAG_REFRESH_INTERVAL_S)

    async def refresh_remote_end_offsets(self) -> None:
        by_leader: dict[int, set[TopicPartition]] = {}
        for group in list(self.groups.values()):
            for tp in group.offsets:
                leader = self.metadata.leader_of(tp)
                if leader >= 0 and self._end_offset_is_remote(tp):
                    by_leader.setdefault(leader, set()).add(tp)
        known = set().union(*by_leader.values()) if by_leader else set()
        for tp in [tp for tp in self.remote_end_offsets if tp not in known]:
            del self.remote_end_offsets[tp]
        for leader, tps in by_leader.items():
            with contextlib.suppress(Exception):
                await self._refresh_from(leader, tps)

    def _end_offset_is_remote(self, tp: TopicPartition) -> bool:
        p = self.replica_manager.partitions.get(tp)
        return not (p is not None and p.is_leader)

    async def _refresh_from(self, leader: int, tps: set[TopicPartition]) -> None:
        by_topic: dict[str, list[ListOffsetsPartition]] = {}
        for tp in sorted(tps):
            by_topic.setdefault(tp.topic, []).append(ListOffsetsPartition(tp.partition, LATEST_TIMESTAMP))
        req = ListOffsetsRequest(topics=[ListOffsetsTopic(t, ps) for t, ps in by_topic.items()])
        resp = await self.list_offsets(leader, req)
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code == NONE.code:
                    self.remote_end_offsets[TopicPartition(t.name, p.partition_index)] = p.offset

    def state_counts(self) -> dict[str, int]:
        counts = {str(s): 0 for s in GroupState if s is not GroupState.DEAD}
        for g in self.groups.values():
            if not g.is_(GroupState.DEAD):
                counts[str(g.state)] += 1
        return counts


def _fold_chunk(log, offset: int, end: int, loaded: LoadedPartition) -> int:
    """Worker thread: read whole batches from ``offset`` (below ``end``), fold their records
    into ``loaded``; returns the offset to continue from."""
    try:
        data = log.read(offset, LOAD_BUFFER_BYTES, max_offset=end, min_one_message=True)
    except OffsetOutOfRangeError:  # retention or the cleaner moved the log start
        return max(offset + 1, log.log_start_offset)
    if not data:
        return end
    next_offset = offset
    for _, header in iter_headers(data):
        next_offset = header.next_offset
    for r in iter_all_records(data):
        if offset <= r.offset < end:
            loaded.apply(r.offset, r.key, r.value)
    return next_offset


def _fetched(partition: int, v: OffsetValue | None) -> OffsetFetchPartitionResponse:
    if v is None:
        return OffsetFetchPartitionResponse(partition, NO_OFFSET)
    return OffsetFetchPartitionResponse(partition, v.offset, v.leader_epoch, v.metadata)


def _single_error(members) -> int:
    """Top-level LeaveGroup error: the member's own when one member left (what clients of
    the single-member LeaveGroup read), else NONE (per-member errors say the rest)."""
    return members[0].error_code if len(members) == 1 else NONE.code
