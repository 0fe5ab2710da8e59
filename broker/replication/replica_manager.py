"""The replica manager: every partition replica on this broker, and the waiting around them.

It applies the controller's LeaderAndIsr and StopReplica requests (creating logs, becoming
leader or follower, starting and stopping follower fetchers), appends producer batches on
leaders, serves fetches (consumers below the HW, followers up to the LEO, long-polled), and
keeps the ISR: followers that fall behind are removed, caught-up ones added, each change
written to ZooKeeper (check-and-set on the partition state's version) before it takes effect.

Waiting is done with one "something changed" event per partition, set and dropped at every
change and made again when a task next asks for it (a fresh ``trio.Event`` per generation
that has a waiter): a long-polling fetch or an acks=all produce waits on the events of its
partitions with its own deadline, then re-checks.

A log directory that fails (an OSError on it: ``LogDirFailure``, see broker/log/manager.py)
is taken offline with its partitions (``handle_dir_failures``): at once where the failure
surfaces here (an append, a read, a follower's fetch, a LeaderAndIsr), else by a task woken
by the log manager (a periodic flush or checkpoint, a read in a worker thread). Each of its
partitions answers KAFKA_STORAGE_ERROR from then on, waiting produces and fetches included,
and is fetched no more; a partition of another directory is not affected. The controller is
told (``damage_reporter`` with ``offline``), and moves leadership off those replicas and out
of the ISRs. A controller whose view is behind (a new one, or one that saw this broker
register again after a lost session) learns them from this broker's KAFKA_STORAGE_ERROR
answers to its LeaderAndIsr, and is told again by a LeaderAndIsr that still counts on one
of them. A dir that failed while the broker loaded its logs is offline from the start, its
partitions unknown: a replica with no log here that LeaderAndIsr does not call new is taken
for one of them (``_apply``). When no log dir is left, ``on_all_dirs_offline`` stops the
broker.

Everything here runs on the broker's Trio thread; the logs it calls are synchronous.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
import itertools
import logging
import math
import operator
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Container, Iterator

import trio

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import Log, LogDirFailure, checked
from tidelog.broker.log.manager import LogManager, remove_deleted_dirs
from tidelog.broker.log.verifier import ClosedSegment, Pace, first_suspect_offset
from tidelog.broker.replication.fetcher import FetcherConfig, LeaderEndpoint, ReplicaFetcher
from tidelog.broker.replication.partition import Partition, check_leader_epoch
from tidelog.broker.replication.throttle import ReplicationQuota
from tidelog.protocol.errors import (
    INVALID_REQUIRED_ACKS,
    KAFKA_STORAGE_ERROR,
    NONE,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    POLICY_VIOLATION,
    REQUEST_TIMED_OUT,
    STALE_CONTROLLER_EPOCH,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_OR_PARTITION,
    CorruptRecordError,
    StorageError,
    TidelogError,
    code_of,
    error_body,
)
from tidelog.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    EpochEndOffsetResult,
    FetchPartition,
    FetchPartitionResponse,
    FetchRequest,
    FetchTopic,
    LeaderAndIsrRequest,
    LeaderAndIsrResponse,
    ListOffsetsPartitionResponse,
    PartitionError,
    PartitionState,
    StopReplicaRequest,
    StopReplicaResponse,
)
from tidelog.protocol.throttles import is_throttled
from tidelog.protocol.topics import TopicPartition

if TYPE_CHECKING:
    from tidelog.broker.config import BrokerConfig

logger = logging.getLogger("tidelog.replica_manager")

# One partition's answer to a fetch: a FetchPartitionResponse's body (``_read_one``).
PartitionAnswer = dict[str, Any]

# (topic partition, new isr, leader epoch, expected zk version) -> new zk version; raises on conflict
IsrWriter = Callable[[TopicPartition, list[int], int, int, int], Awaitable[int]]
# partitions whose replica here was found damaged on disk (with offline=True: is in a log dir
# that failed) -> reported to the controller
DamageReporter = Callable[..., Awaitable[None]]
DAMAGE_REPORT_RETRY_S = 1.0


def wall_ms() -> int:
    return int(time.time() * 1000)


def monotonic_ms() -> int:
    """What deadlines and lags count on: a step of the wall clock (NTP) moves none of them."""
    return int(time.monotonic() * 1000)


@dataclass(frozen=True)
class ReplicaConfig:
    broker_id: int
    replica_lag_time_max_ms: int = 30000
    fetcher: FetcherConfig | None = None
    num_replica_fetchers: int = 1  # fetchers (each with its own connection) per source broker
    verify_interval_ms: int = 0  # closed segments verified in the background (0: never)
    verify_bytes_per_second: int | None = None
    # the most a fetch's answer reads, whatever it asks (Kafka's fetch.max.bytes and
    # replica.fetch.response.max.bytes): what one request can make the broker hold
    fetch_max_bytes: int = 55 << 20
    replica_fetch_response_max_bytes: int = 10 << 20

    @classmethod
    def from_broker_config(cls, config: BrokerConfig) -> ReplicaConfig:
        return cls(config.broker_id, config.replica_lag_time_max_ms, FetcherConfig(
            config.broker_id, config.replica_fetch_wait_max_ms, config.replica_fetch_min_bytes,
            config.replica_fetch_response_max_bytes, config.replica_fetch_max_bytes,
            config.replica_fetch_backoff_ms / 1000), config.num_replica_fetchers,
            config.log_verify_interval_ms, config.log_verify_bytes_per_second or None,
            config.fetch_max_bytes, config.replica_fetch_response_max_bytes)


FetcherKey = tuple[int, int]  # (source broker id, fetcher id)


def fetcher_id(tp: TopicPartition, num_fetchers: int) -> int:
    """Which of a source broker's ``num.replica.fetchers`` fetchers copies ``tp``: Kafka's
    ``abs(31 * topic.hashCode() + partition) % num_fetchers``, so partitions spread the same way."""
    if num_fetchers <= 1:
        return 0
    units = tp.topic.encode("utf-16-be")  # Java's String.hashCode runs over UTF-16 code units
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    h = (31 * h + tp.partition) & 0xFFFFFFFF
    h = h - (1 << 32) if h >= 1 << 31 else h
    return (h & 0x7FFFFFFF if h == -(1 << 31) else abs(h)) % num_fetchers


PURGE_DELAYED_AT = 1000  # answered delayed fetches tolerated in the deadline heap before a purge


class NotifyingPartition(Partition):
    """A partition with a "changed" event for the tasks waiting for it, and the delayed
    operations watching it (fetches and acks=all produces, tried again, synchronously, on
    every change)."""

    def __init__(self, tp: TopicPartition, local_broker_id: int):
        super().__init__(tp, local_broker_id)
        self._changed: trio.Event | None = None
        self.watchers: dict[DelayedOperation, None] = {}  # insertion-ordered set

    @property
    def changed(self) -> trio.Event:
        """Set at the next change. Made when a task first asks for it: most changes (an
        append with only delayed operations watching) have no task waiting."""
        if self._changed is None:
            self._changed = trio.Event()
        return self._changed

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        if self.watchers:
            for d in list(self.watchers):
                d.try_complete()


class DelayedOperation:
    """A request answered later, by the change that completes it: Kafka's DelayedOperation
    in its purgatory. It is a deferred response (``attach`` / ``cancel``, see
    broker/deferred.py): the network layer attaches the function that answers the request.

    It watches its partitions: every change of one (an append, a high watermark move, a
    leadership change) tries it again (``NotifyingPartition.notify``), and the change that
    completes it answers it right there, synchronously, without a task of its own; at its
    deadline the replica manager's timer answers it with what there is (``force``).

    A try may itself notify a partition it watches (a follower's fetch records where the
    follower is, which may move the high watermark): that nested try of the same operation
    is skipped (``trying``), the outer one decides."""

    __slots__ = ("manager", "deadline", "partitions", "complete", "done", "queued", "trying")

    def __init__(self, manager: "ReplicaManager", deadline: float, partitions: list[NotifyingPartition]):
        self.manager = manager
        self.deadline = deadline
        self.partitions = partitions
        self.complete: Callable[[Any], None] | None = None
        self.done = False
        self.queued = False  # in the manager's deadline heap
        self.trying = False

    def outcome(self, force: bool) -> Any:
        """The response body if the operation is complete (always with ``force``), else None."""
        raise NotImplementedError

    def attach(self, complete: Callable[[Any], None]) -> None:
        self.complete = complete
        self._count(1)
        for p in self.partitions:
            p.watchers[self] = None
        self.manager._add_delayed(self)

    def try_complete(self, force: bool = False) -> bool:
        """Answer if complete (or ``force``: the deadline passed); True once answered."""
        if self.done or self.trying:
            return self.done
        self.trying = True
        try:
            body = self.outcome(force)
            if body is None:
                return False
        except Exception:  # a bug must not fail the change that woke us, nor leave it waiting
            logger.exception("%s failed; answering it with an error", type(self).__name__)
            body = error_body(UNKNOWN_SERVER_ERROR)
        finally:
            self.trying = False
        complete = self.complete
        self._mark_done()  # no other try answers it, one nested in the answer included
        try:
            complete(body)  # first: the answer is written, the bookkeeping can wait for it
        except Exception:  # the connection's problem: not the append's, nor the timer's
            logger.exception("answering a %s failed", type(self).__name__)
        finally:
            self._forget()
        return True

    def cancel(self) -> None:
        if not self.done:
            self._mark_done()
            self._forget()

    def _mark_done(self) -> None:
        """Done from now on, and counted at once among the deadline heap's finished entries:
        an answer can complete other operations, whose tidying may pop or purge this one's
        entry before ``_forget`` runs."""
        self.done = True
        if self.queued:
            self.manager._delayed_done += 1

    def _forget(self) -> None:
        """Once done: out of the watchers, and holding nothing of the request any more (its
        entry stays in the deadline heap until popped or purged, and the completion callback
        can hold the whole request, a produce's records included)."""
        for p in self.partitions:
            p.watchers.pop(self, None)
        if self.complete is not None:  # attached: out of its purgatory's count
            self._count(-1)
        self.complete, self.partitions = None, []
        self.release()
        if self.queued:
            self.manager._tidy_delayed()

    def release(self) -> None:
        """Drop what the operation needed to answer (called once it is done)."""

    def _count(self, n: int) -> None:
        """Count it in (1) or out of (-1) its purgatory's gauge, from ``attach`` to done."""
        raise NotImplementedError


class DelayedFetch(DelayedOperation):
    """A long poll waiting for records, a consumer's or a follower's (Kafka's DelayedFetch):
    complete once ``min_bytes`` are there, or a partition has an error. So the leader's
    append answers the followers' waiting fetches before its own produce response is
    written, and a follower's next fetch that moves the high watermark answers the consumers
    waiting for it, in the same scheduler pass. A follower's try reads as the follower: it
    records the fetch again, as a task waiting for the partition would on waking."""

    __slots__ = ("request", "respond", "from_follower")

    def __init__(self, manager: "ReplicaManager", request: FetchRequest, deadline: float,
                 partitions: list[NotifyingPartition], respond: Callable[[dict], Any]):
        super().__init__(manager, deadline, partitions)
        self.request = request
        self.respond = respond  # results -> the response body
        self.from_follower = request.replica_id >= 0

    def outcome(self, force: bool) -> Any:
        req = self.request
        waiting = None
        if not force and req.min_bytes > 1 and not self.from_follower:
            # a try without a read while the positions say min_bytes are not there: a read
            # per append of everything waiting grows with the square of min_bytes
            waiting = self.manager.bytes_waiting(req)
            if waiting is not None and waiting < req.min_bytes:
                return None
        results, size, throttled = self.manager._read_all(req, self.from_follower)
        # positions saying min_bytes are there complete it, as Kafka's tryComplete: a read
        # stopped by its bound short of a min_bytes capped at that bound would wait for ever
        if not force and size < req.min_bytes and waiting is None and not _has_errors(results):
            return None
        self.manager._charge_throttled(throttled)
        return self.respond(results)

    def release(self) -> None:
        self.request = self.respond = None

    def _count(self, n: int) -> None:
        self.manager.fetch_purgatory_size += n


class DelayedProduce(DelayedOperation):
    """An acks=all produce waiting for its batches to be committed (Kafka's DelayedProduce):
    complete once the high watermark passes each partition's last appended offset or the
    partition's wait ended otherwise (the ISR fell below ``min.insync.replicas``, leadership
    lost: ``ReplicaManager.settle_replication``). At ``timeout_ms`` the partitions still
    waiting get REQUEST_TIMED_OUT. The follower's fetch that moves the high watermark
    answers it, in that scheduler pass."""

    __slots__ = ("waiting", "results", "timeout_ms", "respond")

    def __init__(self, manager: "ReplicaManager", waiting: dict[TopicPartition, int], results: dict,
                 timeout_ms: int, deadline: float, partitions: list[NotifyingPartition],
                 respond: Callable[[dict], Any]):
        super().__init__(manager, deadline, partitions)
        self.waiting = waiting  # partition -> the last offset the HW must pass
        self.results = results
        self.timeout_ms = timeout_ms
        self.respond = respond  # results -> the response body

    def outcome(self, force: bool) -> Any:
        manager, waiting = self.manager, self.waiting
        for tp in [tp for tp, last in waiting.items() if manager.settle_replication(tp, last, self.results)]:
            del waiting[tp]
        if waiting and not force:
            return None
        manager.time_out_replication(waiting, self.timeout_ms, self.results)
        return self.respond(self.results)

    def release(self) -> None:
        self.waiting = self.results = self.respond = None

    def _count(self, n: int) -> None:
        self.manager.produce_purgatory_size += n


class ReplicaManager:
    def __init__(self, config: ReplicaConfig, log_manager: LogManager,
                 topic_config: Callable[[str], LogConfig],
                 endpoint_for: Callable[[int, int], LeaderEndpoint | None],
                 isr_writer: IsrWriter | None = None, clock: Callable[[], int] = monotonic_ms,
                 damage_reporter: DamageReporter | None = None, wall_clock: Callable[[], int] = wall_ms):
        """``clock``: what the followers' lag (the ISR), and the intervals between reports,
        count on, monotonic, so that a step of the wall clock neither drops every follower
        from the ISRs nor keeps a stalled one in them; ``wall_clock``: the time produced
        records are checked against (their timestamps, LogAppendTime)."""
        self.config = config
        self.broker_id = config.broker_id
        self.log_manager = log_manager
        self.topic_config = topic_config
        self.endpoint_for = endpoint_for
        self.isr_writer = isr_writer
        self.damage_reporter = damage_reporter
        self.clock = clock
        self.wall_clock = wall_clock
        self.partitions: dict[TopicPartition, NotifyingPartition] = {}
        self.controller_epoch = -1
        self.broker_epoch = -1  # this broker's registration in ZooKeeper: its fetchers send it
        self.fetchers: dict[FetcherKey, ReplicaFetcher] = {}
        self._nursery: trio.Nursery | None = None
        # deleted partitions' files are removed one deletion at a time (see _delete_logs)
        self._removals = trio.CapacityLimiter(1)
        self.isr_shrinks = 0
        self.isr_expands = 0
        self.damaged_replicas_found = 0
        # the replication throttles' rates (broker/replication/throttle.py); the broker points
        # ``rate_of`` at its dynamic configs
        self.leader_quota = ReplicationQuota(lambda: None)
        self.follower_quota = ReplicationQuota(lambda: None)
        # called with (partition, leads it now, leader epoch) after each LeaderAndIsr and
        # StopReplica: the group coordinator loads and unloads __consumer_offsets partitions
        self.leadership_listeners: list[Callable[[TopicPartition, bool, int], None]] = []
        # deadline heap of the delayed fetches (see _expire_delayed); answered ones stay in it
        # until they reach the top or are purged (_tidy_delayed)
        self._delayed: list[tuple[float, int, DelayedFetch]] = []
        self._delayed_done = 0  # answered or cancelled fetches still in the heap
        # Kafka's purgatory sizes: acks=all produces waiting for replication and fetches
        # waiting for records (consumers' and followers'), as delayed operations or coroutines
        self.produce_purgatory_size = 0
        self.fetch_purgatory_size = 0
        self._delayed_seq = itertools.count()
        self._timer: trio.CancelScope | None = None
        # log dir failures found away from this thread's calls wake ``_watch_dir_failures``
        log_manager.on_dir_failure_found = self._dir_failure_found
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self._dir_failures_found = trio.Event()
        # called once every log dir is offline (the broker stops)
        self.on_all_dirs_offline: Callable[[], None] | None = None

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._trio_token = trio.lowlevel.current_trio_token()
            nursery.start_soon(self._watch_dir_failures)
            nursery.start_soon(self._isr_maintenance)
            if self.config.verify_interval_ms > 0:
                nursery.start_soon(self._verify_segments)
            await nursery.start(self._expire_delayed)
            task_status.started()
            await trio.sleep_forever()

    # -- controller requests -------------------------------------------------------------------

    def become_leader_or_follower(self, req: LeaderAndIsrRequest) -> LeaderAndIsrResponse:
        if req.controller_epoch < self.controller_epoch:
            return LeaderAndIsrResponse(STALE_CONTROLLER_EPOCH.code)
        self.controller_epoch = req.controller_epoch
        errors, to_follow = [], {}
        for st in req.partition_states:
            tp = TopicPartition(st.topic_name, st.partition_index)
            errors.append(PartitionError(tp.topic, tp.partition, self._apply(tp, st, to_follow)))
        for leader_id, epochs in to_follow.items():
            by_fetcher: dict[int, dict] = {}
            for tp, epoch in epochs.items():
                by_fetcher.setdefault(fetcher_id(tp, self.config.num_replica_fetchers), {})[tp] = epoch
            for fid, part in by_fetcher.items():
                self._fetcher((leader_id, fid)).add_partitions(part)
        if req.full:
            self._delete_strays({TopicPartition(st.topic_name, st.partition_index) for st in req.partition_states
                                 if self.broker_id in st.replicas})
        return LeaderAndIsrResponse(NONE.code, errors)

    def _delete_strays(self, assigned: set[TopicPartition]) -> None:
        """After a full LeaderAndIsr: the logs of partitions no longer assigned here (a
        reassignment removed this replica, or its topic was deleted, while the broker was
        down) are deleted, as the StopReplica it missed would have."""
        strays = sorted(set(self.log_manager.logs) - assigned)
        for tp in strays:
            logger.warning("%s: not assigned to broker %d any more: deleting its log", tp, self.broker_id)
            self._stop_replica(tp, delete=True)
        self._delete_logs(strays)

    def _delete_logs(self, tps: list[TopicPartition]) -> None:
        """Delete the logs of stopped partitions. On the event loop: each directory renamed
        away and the checkpoints written once for all (``LogManager.delete_logs``); the files
        are removed in a worker thread, one deletion at a time (``_removals``), so that a
        topic of many partitions does not hold the loop nor take every worker thread."""
        doomed = self.log_manager.delete_logs(tps) if tps else []
        if not doomed:
            return
        if self._nursery is None:  # not running (tools, tests): at once
            remove_deleted_dirs(doomed)
            return
        # a shutdown does not wait for it: what is left is removed at the next start
        self._nursery.start_soon(functools.partial(
            trio.to_thread.run_sync, remove_deleted_dirs, doomed, limiter=self._removals, abandon_on_cancel=True))

    def _apply(self, tp: TopicPartition, st: PartitionState, to_follow: dict) -> int:
        if self.broker_id not in st.replicas:
            return UNKNOWN_TOPIC_OR_PARTITION.code
        if self.log_manager.is_offline(tp):
            return self._offline_replica(tp, st)
        p = self.partitions.get(tp)
        if p is not None and st.leader_epoch < p.leader_epoch:
            logger.info("%s: ignoring stale leader epoch %d (have %d)", tp, st.leader_epoch, p.leader_epoch)
            return NONE.code
        if p is None:
            p = self.partitions[tp] = NotifyingPartition(tp, self.broker_id)
        self._stop_fetching(tp)
        try:
            log = self.log_manager.get_or_create_log(tp, self.topic_config(tp.topic), is_new=st.is_new)
            if st.leader == self.broker_id:
                if p.make_leader(st, log, self.clock()):
                    logger.info("%s: leader at epoch %d, isr %s, log end %d", tp, st.leader_epoch, st.isr,
                                log.log_end_offset)
            else:
                p.make_follower(st, log)
        except StorageError as e:  # its log dir failed (now offline), or none is left
            logger.error("%s: cannot take the state of leader epoch %d: %s", tp, st.leader_epoch, e)
            self.handle_dir_failures()
            if p.offline is None and self.log_manager.is_offline(tp):  # maybe in a dir that failed to load
                return self._offline_replica(tp, st)
            return KAFKA_STORAGE_ERROR.code
        if st.leader != self.broker_id and st.leader >= 0:
            to_follow.setdefault(st.leader, {})[tp] = st.leader_epoch
        hole = log.damaged_from
        if hole is not None:  # loading found flushed records damaged on disk: repaired as any damage
            self._note_damage(p, hole, CorruptRecordError(f"{tp}: records from offset {hole} were damaged on "
                                                          "disk and dropped when the log was loaded"))
        p.notify()
        self._leadership_changed(p)
        return NONE.code

    def _offline_replica(self, tp: TopicPartition, st: PartitionState) -> int:
        """A LeaderAndIsr for a replica of an offline log dir: KAFKA_STORAGE_ERROR, as Kafka
        answers; it takes no role (it has no log here until the broker restarts). A state
        that has it lead, or follow in the ISR of a partition with a leader, is the
        controller not knowing: it is reported again."""
        p = self.partitions.get(tp)
        if p is None:
            p = self.partitions[tp] = NotifyingPartition(tp, self.broker_id)
        if p.offline is None:
            p.go_offline(self.log_manager.offline_reason(tp))
        self._stop_fetching(tp)
        if st.leader == self.broker_id or (st.leader >= 0 and self.broker_id in st.isr):
            self._report_offline([tp])
        return KAFKA_STORAGE_ERROR.code

    def _leadership_changed(self, p: NotifyingPartition) -> None:
        for listener in self.leadership_listeners:
            try:
                listener(p.tp, p.is_leader, p.leader_epoch)
            except Exception:  # a listener's bug must not fail the controller's request
                logger.exception("%s: leadership listener failed", p.tp)

    def stop_replicas(self, req: StopReplicaRequest) -> StopReplicaResponse:
        if req.controller_epoch < self.controller_epoch:
            return StopReplicaResponse(STALE_CONTROLLER_EPOCH.code)
        self.controller_epoch = req.controller_epoch
        errors, deleted = [], []
        for sp in req.partitions:
            tp = TopicPartition(sp.topic_name, sp.partition_index)
            if self.log_manager.is_offline(tp):  # its log is out of reach: not deleted (Kafka's answer)
                self._stop_fetching(tp)
                errors.append(PartitionError(tp.topic, tp.partition, KAFKA_STORAGE_ERROR.code))
                continue
            self._stop_replica(tp, sp.delete_partition)
            if sp.delete_partition:
                deleted.append(tp)
            errors.append(PartitionError(tp.topic, tp.partition, NONE.code))
        self._delete_logs(deleted)
        return StopReplicaResponse(NONE.code, errors)

    def _stop_replica(self, tp: TopicPartition, delete: bool) -> None:
        """Stop following or leading ``tp``; with ``delete``, forget the partition (its log is
        the caller's to delete, ``_delete_logs``)."""
        self._stop_fetching(tp)
        p = self.partitions.pop(tp, None) if delete else self.partitions.get(tp)
        if p is not None:
            p.leader_id = -1
            p.notify()
            self._leadership_changed(p)

    def _fetcher(self, key: FetcherKey) -> ReplicaFetcher:
        f = self.fetchers.get(key)
        if f is None:
            leader_id, fid = key
            endpoint = self.endpoint_for(leader_id, fid)
            f = self.fetchers[key] = ReplicaFetcher(
                leader_id, endpoint, self._log_of, self.config.fetcher or FetcherConfig(self.broker_id),
                broker_epoch=lambda: self.broker_epoch, quota=self.follower_quota,
                on_dir_failure=self.handle_dir_failures)
            self._nursery.start_soon(f.run)
        return f

    def _stop_fetching(self, tp: TopicPartition) -> None:
        for f in self.fetchers.values():
            if tp in f.partitions:
                f.remove_partitions([tp])

    def _log_of(self, tp: TopicPartition) -> Log | None:
        p = self.partitions.get(tp)
        return p.log if p is not None and not p.is_leader else None

    def leading(self) -> list[NotifyingPartition]:
        return [p for p in self.partitions.values() if p.is_leader]

    def is_follower(self, tp: TopicPartition, replica_id: int) -> bool:
        """Whether this broker leads ``tp`` and ``replica_id`` is one of its followers."""
        p = self.partitions.get(tp)
        return p is not None and p.is_leader and p.is_follower(replica_id)

    # -- produce -------------------------------------------------------------------------------

    async def append_records(self, acks: int, timeout_ms: int,
                             entries: dict[TopicPartition, bytes]) -> dict[TopicPartition, dict]:
        """Append to leaders; for acks=all wait until the HW passes each batch (or time out)."""
        results, waiting = self.append_now(acks, entries)
        if waiting:
            await self.await_replication(waiting, timeout_ms, results)
        return results

    def append_now(self, acks: int, entries: dict[TopicPartition, bytes]) -> tuple[dict, dict]:
        """The synchronous half of a produce: append to the leaders, right now.

        Returns per-partition results ({"error_code", "base_offset", "log_append_time_ms",
        "log_start_offset", "error_message"}) and, for acks=all, the last offset of each
        batch that must still be replicated (see ``await_replication``). Doing the append
        before anything awaits is what keeps pipelined produce requests of one connection in
        order.
        """
        if acks not in (-1, 0, 1):
            return {tp: _error(INVALID_REQUIRED_ACKS.code, f"acks={acks} is not -1, 0 or 1") for tp in entries}, {}
        results, waiting, appended = {}, {}, []
        for tp, records in entries.items():
            results[tp] = self._append_one(tp, records, acks)
            if results[tp]["error_code"] == NONE.code:
                appended.append(self.partitions[tp])
                if acks == -1:
                    waiting[tp] = results[tp]["_last_offset"]
            results[tp].pop("_last_offset", None)
        # after every append (Kafka's action queue): a follower's fetch waiting on several of
        # these partitions gets all their batches in one response, not the first one's alone.
        # The fetches answered here read the appended batches from memory (``Log.read``).
        try:
            for p in appended:
                p.notify()
        finally:
            for p in appended:
                if p.log is not None:  # (None: its log dir failed meanwhile)
                    p.log.release_appended()
        return results, waiting

    async def check_in_worker(self, entries: dict[TopicPartition, bytes]) -> tuple[dict, dict]:
        """Validate produced records in a worker thread, before ``append_now`` (large or
        compressed batches: see ``broker.produce_order``). Returns the entries to append, as
        ``CheckedRecords`` the append does not check again, and the error result of each
        partition whose records were refused. A partition this broker does not lead is left
        to ``append_now``, which answers it."""
        configs = {tp: p.log.config for tp, p in self.partitions.items()
                   if tp in entries and p.is_leader and p.log is not None}
        now = self.wall_clock()

        def work() -> tuple[dict, dict]:
            good, refused = {}, {}
            for tp, records in entries.items():
                try:
                    good[tp] = checked(records, configs[tp], now, tp) if tp in configs else records
                except TidelogError as e:
                    refused[tp] = (e.code, str(e))
            return good, refused

        good, refused = await trio.to_thread.run_sync(work)
        return good, {tp: _error(code, message, self._log_start_offset(tp)) for tp, (code, message) in refused.items()}

    def _log_start_offset(self, tp: TopicPartition) -> int:
        """What a refused produce of ``tp`` tells besides its error (Kafka's
        processFailedRecord): the log start offset when this broker leads ``tp``, else -1. A
        Kafka producer reads it to tell whether the records it misses were deleted."""
        p = self.partitions.get(tp)
        return p.log.log_start_offset if p is not None and p.is_leader and p.log is not None else -1

    def _append_one(self, tp: TopicPartition, records: bytes, acks: int) -> dict:
        p = self.partitions.get(tp)
        try:
            if p is None:
                raise TidelogError(f"broker {self.broker_id} does not host {tp}", error=NOT_LEADER_OR_FOLLOWER)
            info = p.append_as_leader(records, acks)
        except LogDirFailure as e:
            self.handle_dir_failures()
            return _error(e.code, str(e))
        except TidelogError as e:
            return _error(e.code, str(e), self._log_start_offset(tp))
        return {"error_code": NONE.code, "base_offset": info.first_offset,
                "log_append_time_ms": info.log_append_time, "log_start_offset": info.log_start_offset,
                "error_message": None, "_last_offset": info.last_offset}

    def replication_wait(self, waiting: dict[TopicPartition, int], timeout_ms: int, results: dict,
                         respond: Callable[[dict], Any]) -> Any:
        """acks=all after ``append_now``: ``respond(results)`` now when every batch is settled,
        else a DelayedProduce that answers when they are or at ``timeout_ms``. Without the
        timer running (``run``), the coroutine of ``await_replication`` instead."""
        partitions = [self.partitions[tp] for tp in waiting if tp in self.partitions]
        delayed = DelayedProduce(self, waiting, results, timeout_ms, trio.current_time() + max(0, timeout_ms) / 1000,
                                 partitions, respond)
        body = delayed.outcome(force=timeout_ms <= 0)
        if body is not None:
            return body
        if self._timer is None:
            return self._respond_after(self.await_replication(waiting, timeout_ms, results), lambda _: respond(results))
        return delayed

    async def await_replication(self, waiting: dict[TopicPartition, int], timeout_ms: int, results) -> None:
        self.produce_purgatory_size += 1  # as a DelayedProduce is counted
        try:
            await self._await_partitions(waiting, timeout_ms,
                                         functools.partial(self.settle_replication, results=results))
        finally:
            self.produce_purgatory_size -= 1
        self.time_out_replication(waiting, timeout_ms, results)

    def settle_replication(self, tp: TopicPartition, last_offset: int, results: dict) -> bool:
        """True once ``tp``'s wait for its batch ending at ``last_offset`` is over: committed,
        or failed (its error recorded in ``results``)."""
        done, code = self._replication_done(tp, last_offset)
        if done and code != NONE.code:
            if code == KAFKA_STORAGE_ERROR.code:
                message = str(self.partitions[tp].offline_error())
            elif code == NOT_LEADER_OR_FOLLOWER.code:
                message = f"{tp}: leadership moved before the batch was committed"
            else:
                message = f"{tp}: the in-sync replicas shrank below min.insync.replicas before the batch was committed"
            results[tp].update(_error(code, message, results[tp].get("log_start_offset", -1)))
        return done

    @staticmethod
    def time_out_replication(waiting: dict[TopicPartition, int], timeout_ms: int, results: dict) -> None:
        for tp in waiting:
            results[tp].update(_error(REQUEST_TIMED_OUT.code,
                                      f"{tp}: the batch was not replicated to the in-sync replicas within {timeout_ms} ms",
                                      results[tp].get("log_start_offset", -1)))

    async def _await_partitions(self, waiting: dict[TopicPartition, Any], timeout_ms: int,
                                settle: Callable[[TopicPartition, Any], bool], recheck_s: float = math.inf) -> None:
        """Until ``timeout_ms`` passes or ``waiting`` is empty: drop each partition for which
        ``settle(tp, value)`` is True (it records the outcome; it must settle a partition this
        broker no longer has), then wait until one of the others changes (or ``recheck_s``).
        What is left in ``waiting`` timed out."""
        with trio.move_on_after(max(0, timeout_ms) / 1000):
            while waiting:
                for tp in [tp for tp, value in waiting.items() if settle(tp, value)]:
                    del waiting[tp]
                if not waiting:
                    break
                events = [self.partitions[tp].changed for tp in waiting]
                if recheck_s == math.inf:  # acks=all: no extra cancel scope per wait
                    await _wait_any(events)
                else:
                    with trio.move_on_after(recheck_s):
                        await _wait_any(events)

    def _replication_done(self, tp: TopicPartition, last_offset: int) -> tuple[bool, int]:
        p = self.partitions.get(tp)
        if p is not None and p.offline is not None:
            return True, KAFKA_STORAGE_ERROR.code
        if p is None or not p.is_leader:
            return True, NOT_LEADER_OR_FOLLOWER.code
        if p.log.high_watermark > last_offset:
            return True, NONE.code
        if len(p.isr) < p.min_insync_replicas:
            return True, NOT_ENOUGH_REPLICAS_AFTER_APPEND.code
        return False, NONE.code

    # -- DeleteRecords -------------------------------------------------------------------------

    async def delete_records(self, offsets: dict[TopicPartition, int], timeout_ms: int,
                             live_brokers: Callable[[], Container[int]] | None = None) -> dict[TopicPartition, dict]:
        """Kafka's DeleteRecords: move each led partition's log start offset up to its
        requested offset (-1: the high watermark; never above it), then wait up to
        ``timeout_ms`` until its low watermark (the log start of every in-sync follower on a
        live broker, which each learns from its next fetch) has followed. Refused for a topic
        whose ``cleanup.policy`` does not delete (POLICY_VIOLATION, as Kafka). Whole segments
        below the log start are deleted by the next retention pass. Per partition:
        ``error_code``, ``low_watermark``, ``error_message``."""
        results: dict[TopicPartition, dict] = {}
        waiting: dict[TopicPartition, int] = {}
        for tp, offset in offsets.items():
            p = self.partitions.get(tp)
            if p is None or not p.is_leader or p.log is None:
                results[tp] = _delete_error(NOT_LEADER_OR_FOLLOWER.code, f"broker {self.broker_id} is not the leader of {tp}")
                continue
            log = p.log
            if not log.config.deletes:
                results[tp] = _delete_error(POLICY_VIOLATION.code, (
                    f"{tp}: records cannot be deleted from a topic whose cleanup.policy does not include "
                    f"delete ({log.config.cleanup_policy})"))
                continue
            target = log.high_watermark if offset == -1 else offset
            if not 0 <= target <= log.high_watermark:
                results[tp] = _delete_error(OFFSET_OUT_OF_RANGE.code, (
                    f"{tp}: cannot delete records below offset {offset}: it must be between 0 and the "
                    f"high watermark {log.high_watermark} (or -1 for the high watermark)"))
                continue
            try:
                if log.maybe_increment_log_start_offset(target):
                    p.notify()
            except LogDirFailure as e:
                self.handle_dir_failures()
                results[tp] = _delete_error(e.code, str(e))
                continue
            waiting[tp] = target
        def low_watermark(p: NotifyingPartition) -> int:
            return p.low_watermark(None if live_brokers is None else live_brokers())

        def settle(tp: TopicPartition, target: int) -> bool:
            p = self.partitions.get(tp)
            if p is None or not p.is_leader or p.log is None:
                results[tp] = _delete_error(NOT_LEADER_OR_FOLLOWER.code, f"{tp}: leadership moved while waiting")
                return True
            low = low_watermark(p)
            if low >= target:
                results[tp] = {"error_code": NONE.code, "low_watermark": low, "error_message": None}
            return low >= target

        # also looks again every 0.25 s: a broker's death moves no partition event
        await self._await_partitions(waiting, timeout_ms, settle, recheck_s=0.25)
        for tp, target in waiting.items():
            p = self.partitions.get(tp)
            low = low_watermark(p) if p is not None and p.log is not None else -1
            results[tp] = _delete_error(REQUEST_TIMED_OUT.code, (
                f"{tp}: the log start offset is {target} on the leader, but the in-sync replicas did not all "
                f"follow within {timeout_ms} ms (low watermark {low})"), low)
        return results

    # -- fetch ---------------------------------------------------------------------------------

    async def fetch(self, req: FetchRequest) -> dict[TopicPartition, PartitionAnswer]:
        """Serve a fetch; long-poll until min_bytes are available or max_wait_ms passed. The
        answers are FetchPartitionResponse bodies (``_read_one``)."""
        from_follower = req.replica_id >= 0
        req = self._min_bytes_capped(req)
        deadline = trio.current_time() + req.max_wait_ms / 1000
        while True:
            results, size, throttled = self._read_all(req, from_follower)
            waiting = [self.partitions[tp] for tp in results if tp in self.partitions]
            if (size >= req.min_bytes or trio.current_time() >= deadline or _has_errors(results)
                    or not waiting):
                self._charge_throttled(throttled)
                return results
            self.fetch_purgatory_size += 1  # as a DelayedFetch is counted
            try:
                with trio.move_on_at(deadline):
                    await _wait_any([p.changed for p in waiting])
            finally:
                self.fetch_purgatory_size -= 1

    def deferred_fetch(self, req: FetchRequest, respond: Callable[[dict], Any]) -> Any:
        """A consumer's or a follower's fetch: ``respond(results)`` now when it can be
        answered now, else a DelayedFetch that answers when satisfied or at ``max_wait_ms``
        (the same outcome as ``fetch``, without a task waiting). Without the timer running
        (``run``), the coroutine of ``fetch`` instead."""
        deadline = trio.current_time() + req.max_wait_ms / 1000
        capped = req.min_bytes > 1 and req is not (req := self._min_bytes_capped(req))
        results, size, throttled = self._read_all(req, req.replica_id >= 0)
        if size >= req.min_bytes or req.max_wait_ms <= 0 or _has_errors(results) or (
                capped and (waiting := self.bytes_waiting(req)) is not None and waiting >= req.min_bytes):
            self._charge_throttled(throttled)
            return respond(results)
        watched = [self.partitions[tp] for tp in results if tp in self.partitions]
        if not watched:
            self._charge_throttled(throttled)
            return respond(results)
        if self._timer is None:
            return self._respond_after(self.fetch(req), respond)
        return DelayedFetch(self, req, deadline, watched, respond)

    def _min_bytes_capped(self, req: FetchRequest) -> FetchRequest:
        """``req`` with its ``min_bytes`` at most the bytes its answer may hold (its
        ``max_bytes``, which a quota's window already caps, and the broker's bound), as
        Kafka's fetchMinBytes: more could never be sent, so waiting for it is waiting for
        ``max_wait_ms``. Positions saying they are there complete it (``DelayedFetch``)."""
        if req.min_bytes <= 1:
            return req
        cap = self.config.replica_fetch_response_max_bytes if req.replica_id >= 0 else self.config.fetch_max_bytes
        bound = min(req.max_bytes, cap)
        return req if req.min_bytes <= bound else dataclasses.replace(req, min_bytes=bound)

    @staticmethod
    async def _respond_after(fetching: Awaitable[dict], respond: Callable[[dict], Any]) -> Any:
        return respond(await fetching)

    def _add_delayed(self, d: DelayedFetch) -> None:
        heapq.heappush(self._delayed, (d.deadline, next(self._delayed_seq), d))
        d.queued = True
        if self._timer is not None and d.deadline < self._timer.deadline:
            self._timer.deadline = d.deadline

    def _tidy_delayed(self) -> None:
        """A delayed fetch was answered or cancelled (and counted in ``_delayed_done``). Once
        most of the heap is such entries (and there are more than PURGE_DELAYED_AT), rebuild
        it without them, as Kafka's purgatory purges completed operations: a consumer answered
        at once every time but asking for a long ``max_wait_ms`` must not grow the heap until
        its deadlines pass."""
        heap = self._delayed
        while heap and heap[0][2].done:  # operations of one kind mostly finish in deadline order
            heapq.heappop(heap)
            self._delayed_done -= 1
        if self._delayed_done > PURGE_DELAYED_AT and self._delayed_done * 2 > len(heap):
            heap[:] = [entry for entry in heap if not entry[2].done]  # in place: the timer holds it
            heapq.heapify(heap)
            self._delayed_done = 0

    async def _expire_delayed(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Answer delayed fetches whose ``max_wait_ms`` passed (the purgatory's reaper)."""
        heap = self._delayed
        started = False
        while True:
            with trio.CancelScope(deadline=heap[0][0] if heap else math.inf) as self._timer:
                if not started:
                    started = True
                    task_status.started()
                await trio.sleep_forever()
            now = trio.current_time()
            while heap and (heap[0][0] <= now or heap[0][2].done):
                _, _, d = heapq.heappop(heap)
                if d.done:
                    self._delayed_done -= 1
                else:
                    d.queued = False  # out of the heap: its answer is not counted there
                    d.try_complete(force=True)

    def _read_all(self, req: FetchRequest, from_follower: bool):
        """One try at a fetch: ``(results, bytes read, bytes read for throttled replicas)``.
        The throttled bytes are charged to the leader's throttle only by the try that answers
        (``_charge_throttled``): a waiting fetch is read again at every append until
        ``min_bytes`` are there, and the tries before sent nothing."""
        cap = self.config.replica_fetch_response_max_bytes if from_follower else self.config.fetch_max_bytes
        results, size, budget, throttled = {}, 0, min(req.max_bytes, cap), 0
        for t in req.topics:
            for fp in t.partitions:
                tp = TopicPartition(t.topic, fp.partition)
                r, charged = self._read_one(tp, fp, from_follower, req.replica_id, budget, size == 0, throttled)
                results[tp] = r
                n = len(r["records"] or b"")
                size += n
                throttled += charged
                budget = max(0, budget - n)
        return results, size, throttled

    def bytes_waiting(self, req: FetchRequest) -> int | None:
        """A consumer's fetch: about the bytes a read would return now, from positions
        (``Log.bytes_below``), or None when only a read can tell (a partition no longer
        served here, an offset out of range, damage)."""
        total, budget = 0, min(req.max_bytes, self.config.fetch_max_bytes)
        try:
            for t in req.topics:
                for fp in t.partitions:
                    p = self.partitions.get(TopicPartition(t.topic, fp.partition))
                    if p is None:
                        return None
                    log = p.fetch_log(fp.current_leader_epoch, False)
                    hw = log.high_watermark
                    if not log.log_start_offset <= fp.fetch_offset <= hw:
                        return None
                    total += log.bytes_below(fp.fetch_offset, hw, fp.partition_max_bytes)
        except TidelogError:  # CorruptRecordError and the fencing errors among them
            return None
        return min(total, budget)

    def _charge_throttled(self, nbytes: int) -> None:
        """The bytes an answered fetch sends to throttled replicas, against the leader's throttle."""
        if nbytes:
            self.leader_quota.record(nbytes, trio.current_time())

    def _read_one(self, tp, fp, from_follower: bool, replica_id: int, budget: int, first: bool,
                  pending: int) -> tuple[PartitionAnswer, int]:
        """One partition's part of a try, and the bytes it read for a throttled replica (the
        bucket is checked net of ``pending``, those the try read already for others).

        The part is a FetchPartitionResponse's body, the map its ``to_body()`` gives: a read is
        answered as it goes on the wire, without the typed message and its dump (at a low
        rate a waiting fetch's answer is on each record's path; unit tests hold the map to
        the message's)."""
        p = self.partitions.get(tp)
        try:
            if p is None:
                raise TidelogError(f"broker {self.broker_id} does not host {tp}", error=NOT_LEADER_OR_FOLLOWER)
            log = p.fetch_log(fp.current_leader_epoch, from_follower, replica_id)
            max_offset = None if from_follower else log.high_watermark
            # Kafka's leader side: this broker's replica is a listed source, the follower lags
            throttled = from_follower and replica_id not in p.isr and is_throttled(
                log.config.leader_replication_throttled_replicas, tp.partition, self.broker_id)
            if throttled and self.leader_quota.exceeded(trio.current_time(), pending):
                records = b""  # the follower waits for the bucket to refill (max_wait_ms at most)
            else:
                records = log.read(fp.fetch_offset, min(fp.partition_max_bytes, budget), max_offset,
                                   min_one_message=first)
            # only a fetch the log could serve says where the follower is (as in Kafka): one
            # beyond our LEO holds records we lack, and must not count as caught up
            if from_follower and p.record_follower_fetch(replica_id, fp.fetch_offset, self.clock(),
                                                         fp.log_start_offset):
                p.notify()
            if from_follower:
                self._maybe_expand_isr(p)
        except CorruptRecordError as e:  # this replica's own bytes failed their check on disk
            return self._damaged(p, fp.fetch_offset, e).to_body(), 0
        except TidelogError as e:
            if isinstance(e, LogDirFailure):
                self.handle_dir_failures()
            return FetchPartitionResponse(tp.partition, e.code, error_message=str(e),
                                          high_watermark=p.log.high_watermark if p and p.log else -1,
                                          log_start_offset=p.log.log_start_offset if p and p.log else -1
                                          ).to_body(), 0
        return {"partition_index": tp.partition, "error_code": NONE.code, "high_watermark": log.high_watermark,
                "log_start_offset": log.log_start_offset, "records": records, "diverging_epoch": None,
                "current_leader_epoch": p.leader_epoch, "error_message": None,
                "high_watermark_held": not from_follower and p.high_watermark_held
                }, len(records or b"") if throttled else 0

    def _damaged(self, p: NotifyingPartition, offset: int, e: CorruptRecordError) -> FetchPartitionResponse:
        """A read found this replica's batch at ``offset`` damaged on disk: the replica is
        reported (``_note_damage``), and the fetch gets KAFKA_STORAGE_ERROR (retriable: a client
        asks for metadata again and goes to the next leader) while another replica is in sync.
        Without one the damage is final here: CORRUPT_MESSAGE names it, and a consumer can
        decide to seek past it (an error it would retry for ever would hide the loss)."""
        self._note_damage(p, offset, e)
        if not p.isr - {self.broker_id}:
            return FetchPartitionResponse(p.tp.partition, e.code, error_message=str(e),
                                          high_watermark=p.log.high_watermark, log_start_offset=p.log.log_start_offset)
        return FetchPartitionResponse(
            p.tp.partition, KAFKA_STORAGE_ERROR.code,
            error_message=f"broker {self.broker_id}: the replica of {p.tp} is damaged on disk at offset {offset} "
                          f"({e}); it is being replaced by a replica in sync",
            high_watermark=p.log.high_watermark, log_start_offset=p.log.log_start_offset)

    def _note_damage(self, p: NotifyingPartition, offset: int, e: CorruptRecordError) -> None:
        """A replica found damaged is reported to the controller, again now and then while the
        damage lasts (see the rules in ``partition``)."""
        first = p.damage is None
        if p.mark_damaged(offset, self.clock()):
            if first:
                self.damaged_replicas_found += 1
            logger.error("%s: this replica is damaged on disk at offset %d (%s): reporting it, to be taken out "
                         "of the ISR and fetch the damaged records again", p.tp, offset, e)
            if self.damage_reporter is not None and self._nursery is not None:
                self._nursery.start_soon(self._report_damage, p)

    def _closed_segments(self) -> Iterator[ClosedSegment]:
        for tp, p in list(self.partitions.items()):
            if p.log is not None:
                for seg in p.log.segments[:-1]:
                    yield ClosedSegment(tp, seg.log_path, seg.base_offset, seg.size)

    async def _verify_segments(self) -> None:
        """Every ``log.verify.interval.ms``, every closed segment of every replica here read
        through in a worker thread (``broker/log/verifier.py``), each suspect offset checked."""
        pace = None
        try:
            while True:
                await trio.sleep(self.config.verify_interval_ms / 1000)
                pace = Pace(self.config.verify_bytes_per_second)  # the rate counts from each pass's start
                for seg in list(self._closed_segments()):
                    found = await trio.to_thread.run_sync(first_suspect_offset, seg.path, seg.base_offset, seg.size,
                                                          pace, abandon_on_cancel=True)
                    if found is not None:
                        logger.warning("%s: %s does not verify from offset %d on", seg.tp, seg.path, found)
                        self._check_suspect(seg.tp, found)
        finally:
            if pace is not None:
                pace.stop()  # an abandoned scan's thread ends at its next batch

    def _check_suspect(self, tp: TopicPartition, offset: int) -> None:
        """The background verification suspects ``offset``: an ordinary read of it tells."""
        p = self.partitions.get(tp)
        if p is None or p.log is None:
            return
        try:
            p.log.read(offset, 1)
        except CorruptRecordError as e:
            self._note_damage(p, offset, e)
        except TidelogError:  # out of range by now (retention, truncation): nothing to repair
            pass

    async def _report_damage(self, p: NotifyingPartition) -> None:
        """Report until ZooKeeper takes it, or the replica no longer needs it."""
        await self._report_until_taken([p.tp], f"{p.tp}: reporting the damaged replica",
                                       lambda: p.damage is not None and self.partitions.get(p.tp) is p)

    async def _report_until_taken(self, tps: list[TopicPartition], what: str,
                                  needed: Callable[[], bool] = lambda: True, **flags: bool) -> None:
        """``damage_reporter(tps, **flags)`` until ZooKeeper takes it (it may be away: tried
        again every ``DAMAGE_REPORT_RETRY_S``), while ``needed()``."""
        while needed():
            try:
                await self.damage_reporter(tps, **flags)
                return
            except Exception as e:  # ZooKeeper away: try again
                logger.warning("%s failed (%s); retrying", what, e)
                await trio.sleep(DAMAGE_REPORT_RETRY_S)

    # -- log directory failure -----------------------------------------------------------------

    def handle_dir_failures(self) -> None:
        """Take the log dirs found failing offline (``LogManager.take_dir_offline``) with their
        partitions: each answers KAFKA_STORAGE_ERROR from now on (the produces and fetches
        waiting for it included: notified), and is fetched no more."""
        for d, reason in self.log_manager.pending_dir_failures().items():
            offline = self.log_manager.take_dir_offline(d, reason)
            for tp in offline:
                self._stop_fetching(tp)
                p = self.partitions.get(tp)
                if p is not None:
                    p.go_offline(reason)
                    p.notify()
                    self._leadership_changed(p)
            if offline:
                self._report_offline(offline)
            if not self.log_manager.live_log_dirs and self.on_all_dirs_offline is not None:
                self.on_all_dirs_offline()

    def _report_offline(self, tps: list[TopicPartition]) -> None:
        """Report until ZooKeeper takes it: the replicas stay offline until the broker restarts."""
        if self.damage_reporter is not None and self._nursery is not None:
            self._nursery.start_soon(functools.partial(
                self._report_until_taken, tps, f"reporting {len(tps)} replicas of a failed log dir", offline=True))

    def _dir_failure_found(self) -> None:
        """The log manager noted a failure (in whichever thread met it): the watcher takes it
        offline on this thread."""
        token = self._trio_token
        if token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(self._wake_dir_failure_watcher)

    def _wake_dir_failure_watcher(self) -> None:
        self._dir_failures_found.set()

    async def _watch_dir_failures(self) -> None:
        while True:
            self.handle_dir_failures()
            await self._dir_failures_found.wait()
            self._dir_failures_found = trio.Event()

    # -- offsets -------------------------------------------------------------------------------

    def list_offset(self, tp: TopicPartition, timestamp: int, current_leader_epoch: int,
                    from_consumer: bool, from_any_replica: bool = False) -> ListOffsetsPartitionResponse:
        """``from_any_replica`` (the debugging replica id): a follower answers from its own
        log too, as Kafka does; otherwise only the leader answers."""
        p = self.partitions.get(tp)
        try:
            if p is None:
                raise TidelogError(f"broker {self.broker_id} does not host {tp}", error=NOT_LEADER_OR_FOLLOWER)
            log = p.local_log(current_leader_epoch) if from_any_replica else p.fetch_log(current_leader_epoch, False)
            offset, ts = self._offset_for(log, timestamp, from_consumer)
        except TidelogError as e:
            return ListOffsetsPartitionResponse(tp.partition, e.code, error_message=str(e))
        return ListOffsetsPartitionResponse(tp.partition, NONE.code, ts, offset, p.leader_epoch)

    @staticmethod
    def _offset_for(log: Log, timestamp: int, from_consumer: bool) -> tuple[int, int]:
        if timestamp == EARLIEST_TIMESTAMP:
            return log.log_start_offset, -1
        if timestamp == LATEST_TIMESTAMP:
            return (log.high_watermark if from_consumer else log.log_end_offset), -1
        if timestamp == MAX_TIMESTAMP:
            found = log.offset_of_max_timestamp()
        else:
            found = log.offset_for_timestamp(timestamp)
        # a consumer is told of no offset it could not fetch yet (Kafka's last fetchable offset)
        if found is None or (from_consumer and found[0] >= log.high_watermark):
            return -1, -1
        return found

    def end_offset_for_epoch(self, tp: TopicPartition, epoch: int, current_leader_epoch: int) -> EpochEndOffsetResult:
        p = self.partitions.get(tp)
        try:
            if p is None:
                raise TidelogError(f"broker {self.broker_id} does not host {tp}", error=NOT_LEADER_OR_FOLLOWER)
            log = p.fetch_log(current_leader_epoch, False)  # read-only: any replica id may ask
        except TidelogError as e:
            return EpochEndOffsetResult(tp.partition, e.code)
        found_epoch, end = log.end_offset_for_epoch(epoch)
        return EpochEndOffsetResult(tp.partition, NONE.code, found_epoch, end)

    # -- ISR maintenance -----------------------------------------------------------------------

    def _maybe_expand_isr(self, p: NotifyingPartition) -> None:
        new_isr = p.isr_to_expand()
        if new_isr is not None and self._nursery is not None:
            self._nursery.start_soon(self._write_isr, p, new_isr, "expand", p.leader_epoch, p.zk_version)

    async def _isr_maintenance(self) -> None:
        period = max(0.05, self.config.replica_lag_time_max_ms / 2000)
        while True:
            await trio.sleep(period)
            now = self.clock()
            for p in self.leading():
                new_isr = p.isr_to_shrink(now, self.config.replica_lag_time_max_ms)
                if new_isr is not None:
                    await self._write_isr(p, new_isr, "shrink", p.leader_epoch, p.zk_version)

    async def _write_isr(self, p: NotifyingPartition, new_isr: frozenset[int], why: str, epoch: int,
                         version: int) -> None:
        """Write ``new_isr``, decided on the partition's state at leader ``epoch`` and ZooKeeper
        ``version``, conditional on that version (Kafka's AlterPartition carries the epochs it
        was decided on). A state that changed before this task ran (a LeaderAndIsr, another
        ISR write) voids the decision: an expansion decided before a reassignment removed the
        follower must not add it back; the next fetch decides again."""
        if (self.isr_writer is None or p.pending_isr is not None or not p.is_leader
                or (p.leader_epoch, p.zk_version) != (epoch, version)):
            return
        if why == "expand":
            # decided again now: the HW may have moved past a joiner since the fetch that
            # qualified it, and a member of the ISR must hold everything below the HW
            new_isr = p.isr_to_expand()
            if new_isr is None:
                return
        p.pending_isr = new_isr
        p.isr_writes += 1
        write = p.isr_writes
        # Only this write's own pending state is cleared or applied: a LeaderAndIsr may have
        # cleared it meanwhile and a later write (the same ISR, say) set its own.
        try:
            new_version = await self.isr_writer(p.tp, sorted(new_isr), epoch, p.controller_epoch, version)
        except Exception as e:  # a conflict means the controller changed the state: wait for it
            logger.info("%s: ISR %s to %s not written: %s", p.tp, why, sorted(new_isr), e)
            if p.isr_writes == write and p.pending_isr is not None:
                p.pending_isr = None
            return
        if p.isr_writes != write or p.pending_isr is None or p.leader_epoch != epoch:
            return
        logger.info("%s: ISR %s from %s to %s", p.tp, why, sorted(p.isr), sorted(new_isr))
        p.isr, p.pending_isr, p.zk_version = new_isr, None, new_version
        if why == "shrink":
            self.isr_shrinks += 1
        else:
            self.isr_expands += 1
        p.maybe_increment_high_watermark()
        p.notify()

    # -- lifecycle -----------------------------------------------------------------------------

    def shutdown(self) -> None:
        for f in self.fetchers.values():
            f.remove_partitions(list(f.partitions))
        for p in self.partitions.values():
            p.notify()


def _error(code: int, message: str, log_start_offset: int = -1) -> dict:
    return {"error_code": code, "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": log_start_offset,
            "error_message": message}


def _delete_error(code: int, message: str, low_watermark: int = -1) -> dict:
    return {"error_code": code, "low_watermark": low_watermark, "error_message": message}


_TOPIC, _PARTITION = operator.attrgetter("topic"), operator.attrgetter("partition")


def by_partition(req: FetchRequest) -> FetchRequest:
    """``req`` with each partition named once, by its last entry, in the place of its first
    (Kafka's ``FetchRequest.fetchData``, a map keyed by partition): a request repeating a
    partition would be read, and a waiting one tried at every append, once per entry. The
    check costs a set per topic; only a request with repeats is rebuilt."""
    topics = req.topics
    if len(topics) == 1:
        parts = topics[0].partitions
        if len(parts) < 2 or len(set(map(_PARTITION, parts))) == len(parts):
            return req
    elif len(set(map(_TOPIC, topics))) == len(topics) and all(
            len(set(map(_PARTITION, t.partitions))) == len(t.partitions) for t in topics):
        return req
    last: dict[tuple[str, int], FetchPartition] = {}
    for t in topics:
        for p in t.partitions:
            last[t.topic, p.partition] = p
    grouped: dict[str, list[FetchPartition]] = {}
    for (topic, _), p in last.items():
        grouped.setdefault(topic, []).append(p)
    return dataclasses.replace(req, topics=[FetchTopic(topic, parts) for topic, parts in grouped.items()])


def _has_errors(results: dict[TopicPartition, PartitionAnswer]) -> bool:
    return any(r["error_code"] != NONE.code for r in results.values())


async def _wait_any(events: list[trio.Event]) -> None:
    """Return as soon as any of ``events`` is set."""
    if any(e.is_set() for e in events):
        return
    if len(events) == 1:  # the common long poll (one partition): no nursery, no tasks
        await events[0].wait()
        return
    async with trio.open_nursery() as nursery:
        async def waiter(ev: trio.Event) -> None:
            await ev.wait()
            nursery.cancel_scope.cancel()
        for ev in events:
            nursery.start_soon(waiter, ev)


__all__ = ["ReplicaManager", "ReplicaConfig", "by_partition", "check_leader_epoch", "OFFSET_OUT_OF_RANGE", "code_of"]
