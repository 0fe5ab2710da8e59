"""The controller: one broker, elected through ZooKeeper, that manages partition leadership.

Theory of operation
-------------------
Every broker runs a ``Controller``; the one that creates the ephemeral ``/controller`` znode
is active and increments ``/controller_epoch``. Every partition-state write it makes is a
check-and-set on the state's znode version *and* on the controller-epoch znode's version, so
a controller that was deposed (its session expired while it was paused) cannot write
anything: it is fenced. So are its other writes (assignments, topic configs, deletions of the
notifications it handled). A fenced write makes it resign at once, whatever the event (its
queue may still hold work). Brokers ignore requests that carry an older controller epoch.

All work happens in one task that drains one event channel (ZooKeeper watches only enqueue;
API calls such as CreateTopics are enqueued as closures), so the controller's view of the
cluster (``ControllerContext``) is never touched concurrently.

Leaders write their own ISR changes to the same state znodes, so the controller's copy of a
state can be stale when it writes (a leader shrank or expanded its ISR and the notification
has not been handled yet). Every partition-state change is therefore a decision on the
current state (``_update_state``): on a version conflict the state is read again and the
decision made again, as Kafka's controller retries the partitions whose update hit BADVERSION.
A conflict never aborts the rest of the work (the other partitions, the LeaderAndIsr and
metadata that follow).

Events and what they do:

* controller znode changed: try to become controller; on success, *failover*: read brokers,
  topics, assignments and partition states from ZooKeeper, initialise new partitions, elect
  leaders for partitions whose leader is gone, and send every live broker its LeaderAndIsr
  and the full metadata (UpdateMetadata).
* broker set changed: a new (or restarted: new broker epoch) broker gets its partitions'
  LeaderAndIsr and everyone gets the full metadata (which drops any topic it does not name,
  as one deleted while a broker was away); for a broker that died, partitions it led
  get a new leader (the first live replica in assignment order that is in the ISR; outside
  the ISR only with unclean.leader.election.enable), and it is removed from the ISR of the
  partitions it followed. Each change bumps the leader epoch. A broker whose registration
  does not decode is not live (one live before is gone) and logged
  (``_note_unreadable_brokers``).
* broker registration changed (a data watch on each ``/brokers/ids/<id>``): a registration
  rewritten in place (new endpoints or rack, the same broker epoch) replaces the one held and
  every broker gets UpdateMetadata with it (Kafka's BrokerModifications); one that turned
  unreadable, or readable again, is a broker change.
* topics created, ISR change notifications from leaders.
* topics marked for deletion (the rules: broker/controller/deletion.py): the controller stops
  managing the topic at once and has every replica deleted; the topic's znodes go once every
  broker holding a replica has reported it deleted, a broker that is down when it returns.
* replica damage notifications: a broker found a batch of one of its replicas failing its
  check on disk; leadership moves off that replica and it leaves the ISR (``election.
  without_damaged_replica``), and it is sent its state, on which, a follower outside the ISR,
  it drops the damaged records and fetches them again. A report marked ``offline`` names the
  replicas of a log directory that failed (Kafka's log dir failure): each is handled as a
  replica on a dead broker (a new leader among the other live in-sync replicas, out of the
  ISR) and is not live for its partition, in any election, until its broker registers again
  (``ControllerContext.offline_replicas``). A controller elected since learns them from the
  brokers' answers to its LeaderAndIsr (KAFKA_STORAGE_ERROR per partition), as Kafka's.
* requests: CreateTopics, CreatePartitions, DeleteTopics, AlterConfigs, ControlledShutdown.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Collection, Hashable, Iterable, Iterator

import trio

from tidelog.broker.controller.channels import ChannelManager, Outgoing
from tidelog.broker.controller.deletion import EPOCH_DURING_DELETE, TopicDeletion, deleted_replicas
from tidelog.broker.controller.election import (
    Election,
    controlled_shutdown_leader,
    offline_partition_leader,
    preferred_replica_leader,
    remove_from_isr,
    without_damaged_replica,
)
from tidelog.broker.controller.reassignment import ReplicaAssignment, Step, check_target, next_step, restate
from tidelog.broker.controller.validation import (
    PartitionLimits,
    by_metric_name,
    check_assignment,
    check_assignment_size,
    check_fits_zookeeper,
    check_no_null_configs,
    check_partition_count,
    check_replication_factor,
    check_request_total,
    check_topic_name,
)
from tidelog.broker.log.config import REQUEST_MINIMUMS, InvalidConfigError, LogConfig, check_requested, parse_value
from tidelog.broker.security.inter_broker import inter_broker_security
from tidelog.broker.security.listeners import parse_endpoints
from tidelog.broker.zookeeper.layout import (
    BrokerInfo,
    ControllerMovedError,
    LeaderAndIsr,
    ZkConnectionError,
    ZkTimeoutError,
    ZkVersionConflict,
    decode_broker_info,
)
from tidelog.protocol import placement
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    ELECTION_NOT_NEEDED,
    ELIGIBLE_LEADERS_NOT_AVAILABLE,
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    KAFKA_STORAGE_ERROR,
    NO_REASSIGNMENT_IN_PROGRESS,
    NONE,
    PREFERRED_LEADER_NOT_AVAILABLE,
    REASSIGNMENT_IN_PROGRESS,
    STALE_BROKER_EPOCH,
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
    code_of,
)
from tidelog.protocol.messages import (
    LeaderAndIsrRequest,
    LiveBroker,
    LiveBrokerEndpoint,
    PartitionState,
    StopReplicaPartition,
    StopReplicaRequest,
    TopicResult,
    UpdateMetadataRequest,
)
from tidelog.protocol.topics import TopicPartition, is_internal_topic, topic_name_problem, validate_topic_name

if TYPE_CHECKING:
    from tidelog.broker.config import BrokerConfig

logger = logging.getLogger("tidelog.controller")

# how often one partition-state change is decided again after a version conflict before the
# controller gives up on it (each conflict is a leader's ISR write, which takes a round trip)
STATE_UPDATE_ATTEMPTS = 10


def _topic_names(names: Iterable[str], what: str) -> list[str]:
    """``names`` read from ZooKeeper less those no broker writes (they validate): such a name
    (too long for a znode path, say) is logged and never acted on or sent anywhere."""
    out = []
    for name in names:
        problem = topic_name_problem(name)
        if problem is None:
            out.append(name)
        else:
            logger.error("ignoring %s %r in ZooKeeper: %s", what, name, problem)
    return out


@dataclass(frozen=True)
class ControllerConfig:
    broker_id: int
    default_partitions: int = 1
    default_replication_factor: int = 1
    unclean_leader_election: bool = False
    delete_topic_enable: bool = True
    topic_defaults: LogConfig = field(default_factory=LogConfig)
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_check_interval_s: float = 300.0
    leader_imbalance_per_broker_percentage: int = 10
    request_timeout_s: float = 30.0  # controller.socket.timeout.ms: one request to a broker
    partition_limits: PartitionLimits = field(default_factory=PartitionLimits)
    # topic configs a client sets must meet these (log.segment.min.bytes, log.roll.min.ms, ...)
    config_minimums: dict[str, int] = field(default_factory=lambda: dict(REQUEST_MINIMUMS))
    inter_broker_security: Any = None  # tidelog.security.SecurityConfig; None: plain TCP

    @classmethod
    def from_broker_config(cls, config: BrokerConfig) -> ControllerConfig:
        return cls(config.broker_id, config.num_partitions, config.default_replication_factor,
                   config.unclean_leader_election_enable, config.delete_topic_enable, config.log_config(),
                   config.auto_leader_rebalance_enable, config.leader_imbalance_check_interval_seconds,
                   request_timeout_s=config.controller_socket_timeout_ms / 1000,
                   partition_limits=PartitionLimits(config.max_partitions_per_topic, config.max_partitions_per_request),
                   config_minimums={**REQUEST_MINIMUMS, "segment.bytes": config.log_segment_min_bytes,
                                    "segment.ms": config.log_roll_min_ms},
                   inter_broker_security=inter_broker_security(config))


@dataclass
class ControllerContext:
    epoch: int
    epoch_zk_version: int
    brokers: dict[int, BrokerInfo] = field(default_factory=dict)
    broker_epochs: dict[int, int] = field(default_factory=dict)
    assignments: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    states: dict[TopicPartition, tuple[LeaderAndIsr, int]] = field(default_factory=dict)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    shutting_down: set[int] = field(default_factory=set)
    # partitions under reassignment; their ``assignments`` entry is the move's RS
    moves: dict[TopicPartition, ReplicaAssignment] = field(default_factory=dict)
    # every topic in ZooKeeper was read: only then may a LeaderAndIsr be full (a broker deletes
    # the logs it holds that a full one does not list)
    complete: bool = False
    unreadable: set[str] = field(default_factory=set)  # topics whose znodes could not be decoded
    # topics marked for deletion, out of every view above, with their replicas not yet deleted
    deleting: dict[str, TopicDeletion] = field(default_factory=dict)
    # replicas in a log dir that failed, by broker: not live for their partitions until the
    # broker registers again (restarted, its dirs loaded again)
    offline_replicas: dict[int, set[TopicPartition]] = field(default_factory=dict)
    # registered brokers whose registration does not decode: (the problem, broker epoch).
    # Not live (in no view above) until it does
    unreadable_brokers: dict[int, tuple[str, int]] = field(default_factory=dict)

    @property
    def live(self) -> set[int]:
        return set(self.brokers) - self.shutting_down

    def leader_offline(self, tp: TopicPartition, st: LeaderAndIsr) -> bool:
        """Whether ``tp``'s leader in ``st`` cannot serve it: not registered (a broker in
        controlled shutdown is, and still serves), or its replica in a log dir that failed."""
        return st.leader not in self.brokers or tp in self.offline_replicas.get(st.leader, ())

    def live_for(self, tp: TopicPartition) -> set[int]:
        """The live brokers that can serve ``tp``: not with its replica in an offline log dir."""
        live = self.live
        if not self.offline_replicas:
            return live
        return {b for b in live if tp not in self.offline_replicas.get(b, ())}

    def partitions_of(self, topic: str) -> list[TopicPartition]:
        return [TopicPartition(topic, p) for p in sorted(self.assignments.get(topic, {}))]

    def all_partitions(self) -> list[TopicPartition]:
        return [tp for t in sorted(self.assignments) for tp in self.partitions_of(t)]

    def partitions_on(self, broker_id: int) -> list[TopicPartition]:
        """Every partition with a replica on ``broker_id`` (a moving one's RS counts): what a
        full LeaderAndIsr to it lists."""
        return [tp for tp in self.all_partitions() if broker_id in self.assignments[tp.topic][tp.partition]]


class ControllerEvent(enum.Enum):
    """What the controller's one task drains from its channel (Kafka's ControllerEvent kinds).
    ZooKeeper watches, the auto-rebalance timer and ``call`` only enqueue one of these."""

    CONTROLLER_CHANGE = "controller change"  # /controller changed
    BROKER_CHANGE = "broker change"  # /brokers/ids children
    BROKER_MODIFICATION = "broker modification"  # /brokers/ids/<id> data (a registration rewritten)
    TOPIC_CHANGE = "topic change"  # /brokers/topics children
    TOPIC_DELETION = "topic deletion"  # /admin/delete_topics children
    ISR_CHANGE = "isr change notification"  # /isr_change_notification children
    REPLICA_DAMAGE = "replica damage notification"  # /replica_damage_notification children
    REPLICAS_DELETED = "replicas deleted"  # a broker answered a StopReplica with deletion
    LEADER_AND_ISR_ANSWERED = "leader and isr answered"  # a broker answered a LeaderAndIsr
    AUTO_LEADER_BALANCE = "auto leader balance"  # leader.imbalance.check.interval.seconds
    CALL = "call"  # an admin request's work, run in the loop (Controller.call)


class _CountingZk:
    """The controller's view of its ZkClient: the calls made through it that raised
    ZkTimeoutError or ZkConnectionError (ZooKeeper may have applied them anyway) are counted
    in ``unanswered``, those a newer controller epoch fenced (ControllerMovedError) in
    ``fenced``. The controller's calls alone, not those of the other tasks sharing the
    client, tell it that an event's work may be half done, or that it is deposed."""

    def __init__(self, zk: Any):
        self._zk = zk
        self.unanswered = 0
        self.fenced = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._zk, name)
        if name == "until_answered":  # waited out: what failed on the way was done again
            async def waited(attempt: Callable[[], Awaitable[Any]]) -> Any:
                before = self.unanswered
                result = await attr(attempt)
                self.unanswered = before
                return result
            return waited
        if not inspect.iscoroutinefunction(attr):
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return await attr(*args, **kwargs)
            except (ZkTimeoutError, ZkConnectionError):
                self.unanswered += 1
                raise
            except ControllerMovedError:
                self.fenced += 1
                raise
        return counted


class Controller:
    def __init__(self, config: ControllerConfig, zk, cluster_id: str | None = None):
        self.config = config
        self.broker_id = config.broker_id
        self.zk = _CountingZk(zk)
        self.cluster_id = cluster_id
        self.ctx: ControllerContext | None = None
        self.channels = ChannelManager(config.broker_id, config.request_timeout_s,
                                       security=config.inter_broker_security)
        self.channels.on_overflow = self._restate_to
        self._events_send, self._events = trio.open_memory_channel[tuple[ControllerEvent, Any]](math.inf)
        self._nursery: trio.Nursery | None = None
        self.active_changed = trio.Event()
        self._shutting_down: dict[int, int | None] = {}  # carried into a reload's failover
        self._deleted: dict[str, trio.Event] = {}  # set when the topic's deletion completes
        # data watches on every registration, by broker id (``_watch_registrations``)
        self._registration_watches: dict[int, trio.CancelScope] = {}

    @property
    def is_active(self) -> bool:
        return self.ctx is not None

    # -- the event loop ------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.channels.run)
            paths = self.zk.paths
            for kind, path, kind_of_watch in (
                    (ControllerEvent.CONTROLLER_CHANGE, paths.controller, "data"),
                    (ControllerEvent.BROKER_CHANGE, paths.broker_ids, "children"),
                    (ControllerEvent.TOPIC_CHANGE, paths.topics, "children"),
                    (ControllerEvent.TOPIC_DELETION, paths.delete_topics, "children"),
                    (ControllerEvent.ISR_CHANGE, paths.isr_change_notification, "children"),
                    (ControllerEvent.REPLICA_DAMAGE, paths.replica_damage_notification, "children")):
                watch = self.zk.watch_data if kind_of_watch == "data" else self.zk.watch_children
                nursery.start_soon(self._forward, kind, await watch(path))
            if self.config.auto_leader_rebalance_enable:
                nursery.start_soon(self._rebalance_timer)
            task_status.started()
            async for event in self._events:
                await self._handle(event)

    async def _rebalance_timer(self) -> None:
        while True:
            await trio.sleep(self.config.leader_imbalance_check_interval_s)
            self._events_send.send_nowait((ControllerEvent.AUTO_LEADER_BALANCE, None))

    async def _forward(self, kind: ControllerEvent, channel) -> None:
        async for payload in channel:
            self._events_send.send_nowait((kind, payload))

    async def call(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``fn`` inside the event loop (serialised with every other controller action)."""
        done = trio.Event()
        box: dict[str, Any] = {}
        self._events_send.send_nowait((ControllerEvent.CALL, (fn, box, done)))
        await done.wait()
        if "error" in box:
            raise box["error"]
        return box["result"]

    async def _handle(self, event: tuple) -> None:
        kind, payload = event
        unanswered, fenced = self.zk.unanswered, self.zk.fenced
        if kind is ControllerEvent.CALL:
            fn, box, done = payload
            try:
                if self.ctx is None:  # resigned while the call was queued
                    raise ControllerMovedError(f"broker {self.broker_id} is no longer the controller")
                box["result"] = await fn()
            except Exception as e:  # handed back to the caller
                box["error"] = e
            done.set()
        else:
            try:
                await self._handlers[kind](self, payload)
            except TidelogError as e:
                logger.warning("controller event %s failed: %s", kind.value, e)
            except Exception:
                logger.exception("controller event %s failed", kind.value)
        if self.ctx is not None and self.zk.fenced != fenced:
            # a write was fenced: another controller was elected since this one's epoch (its
            # session expired unseen). Stop at once, leaving everything to the successor,
            # and look at /controller again (as after any resignation)
            logger.warning("controller event %s was fenced: broker %d is no longer the controller; resigning",
                           kind.value, self.broker_id)
            self._resign()
            await self._on_controller_change()
        elif (self.ctx is not None and self.zk.unanswered != unanswered
                and kind is not ControllerEvent.CONTROLLER_CHANGE):  # that one retries its own calls
            # ZooKeeper did not answer some call of this event's: its work may be half done in
            # the context (a dead broker dropped before its partitions were elected, a topic's
            # assignment without its states, leaders moved but not told). Read everything
            # again, as a new controller does, rather than act on it.
            logger.warning("controller event %s met an unanswered ZooKeeper call; reading the cluster's "
                           "state again", kind.value)
            old = self.ctx
            # a broker shutting down still is (if it keeps its registration): known to the
            # failover before it elects anyone or sends anything
            self._shutting_down = {b: old.broker_epochs.get(b) for b in old.shutting_down}
            self._resign()
            try:
                await self._on_controller_change()
            finally:
                self._shutting_down = {}

    # -- election ------------------------------------------------------------------------------

    async def _on_controller_change(self, _payload=None) -> None:
        """Resign if another broker holds ``/controller``; run for it while none does, or
        while this session holds it but this controller is idle (an election ZooKeeper applied
        whose answer was lost to a timeout). Tried until ZooKeeper answers: a controller must
        neither stay elected and idle nor give the role away because ZooKeeper was slow."""
        try:
            current = await self.zk.until_answered(self.zk.get_controller_id)
            if self.ctx is not None and current != self.broker_id:
                logger.warning("broker %d is no longer the controller (now %s)", self.broker_id, current)
                self._resign()
            if self.ctx is None and current in (None, self.broker_id):
                await self.zk.until_answered(self._run_for_controller)
        except Exception as e:  # a partial view must not act: let the election run again
            if self.ctx is not None:
                self._resign()
            if self.zk.closed:  # shutting down
                return
            if isinstance(e, ControllerMovedError):  # another broker was elected meanwhile
                logger.warning("broker %d is not the controller: %s", self.broker_id, e)
            else:
                logger.exception("broker %d: controller failover failed; resigning", self.broker_id)
            with contextlib.suppress(Exception):  # only if /controller is this session's
                await self.zk.until_answered(functools.partial(self.zk.resign_controller, self.broker_id))

    async def _run_for_controller(self) -> None:
        """One try: elect this broker (or find this session elected already), then read the
        cluster. A try ZooKeeper did not answer leaves no context behind, so that the next
        one starts over; the role is kept meanwhile."""
        epoch = await self.zk.try_elect_controller(self.broker_id)
        if epoch is None:
            return
        try:
            await self._failover(epoch)
        except (ZkTimeoutError, ZkConnectionError):
            self.ctx = None
            self.channels.close_all()
            self._unwatch_registrations(set())
            raise

    def _resign(self) -> None:
        self.ctx = None
        self.channels.close_all()
        for done in self._deleted.values():  # those waiting stop; the successor completes them
            done.set()
        self._deleted = {}
        self._unwatch_registrations(set())
        self._signal()

    def _signal(self) -> None:
        self.active_changed.set()
        self.active_changed = trio.Event()

    async def _failover(self, epoch: int) -> None:
        # reads are waited out, so that only a write ZooKeeper did not answer starts it over
        until = self.zk.until_answered
        current, version = await until(self.zk.controller_epoch)
        if current != epoch:  # elected again since: its version must not fence our writes
            raise ControllerMovedError(f"controller epoch {current} is not ours ({epoch})")
        self.ctx = ctx = ControllerContext(epoch, version)
        logger.info("broker %d is the controller (epoch %d)", self.broker_id, epoch)
        self._add_brokers((await self._refresh_brokers())[0])
        ctx.shutting_down = {b for b, e in self._shutting_down.items() if ctx.broker_epochs.get(b) == e}
        for topic in await until(self.zk.get_topics):
            await self._load_topic(topic)
        ctx.complete = not ctx.unreadable
        # before anything is elected or sent: no broker is told of a topic being deleted
        known = [t for t in _topic_names(await until(self.zk.topics_marked_for_deletion), "deletion marker")
                 if self._queue_deletion(t)]
        created = set(await self._init_new_partitions(ctx.all_partitions()))
        await self._elect_offline(ctx.all_partitions())
        # brokers that died while no controller was watching (the previous controller among
        # them) leave the ISRs now
        dead = {r for st, _ in ctx.states.values() for r in st.isr} - set(ctx.brokers)
        await self._shrink_isr([tp for tp, (st, _) in ctx.states.items()
                                if st.leader in ctx.live and set(st.isr) & dead], dead)
        for b in ctx.brokers:  # not to a broker shutting down: it would fetch again (_propagate)
            if b not in ctx.shutting_down:
                self._send_leader_and_isr(b, ctx.partitions_on(b), full=True, new=created)
        self._send_update_metadata(ctx.all_partitions(), deleted=known, full=True)
        self._stop_deleted_replicas()
        await self._complete_deletions()
        await self._on_isr_change(None)
        await self._on_replica_damage(None)
        await self._advance_moves(list(ctx.moves))
        self._signal()

    async def _refresh_brokers(self) -> tuple[dict[int, tuple[BrokerInfo, int]], set[int], list[int]]:
        """Re-read the live brokers: returns (joined, with their registration and epoch; gone;
        those whose registration was rewritten in place, updated here: ``_update_registrations``).
        A broker registered again with a new epoch (restarted before its old session was
        seen to end) is in both: it is taken out of the context here, and the caller handles
        it as gone, then adds the joined (``_add_brokers``) and handles them, as Kafka's
        controller does its bounced brokers: a leader that lost an unflushed tail must not
        keep leading in the same epoch, nor a follower stay in the ISR."""
        ctx = self.ctx
        with_epochs, unreadable = await self.zk.until_answered(self.zk.broker_registrations)
        self._note_unreadable_brokers(unreadable)
        self._watch_registrations(set(with_epochs) | set(unreadable))
        gone = {b for b in ctx.brokers if b not in with_epochs or with_epochs[b][1] != ctx.broker_epochs.get(b)}
        joined = {b: entry for b, entry in with_epochs.items()
                  if b not in ctx.brokers or entry[1] != ctx.broker_epochs.get(b)}
        for b in gone:
            ctx.brokers.pop(b, None)
            ctx.broker_epochs.pop(b, None)
            ctx.shutting_down.discard(b)
            ctx.offline_replicas.pop(b, None)
            self.channels.remove_broker(b)
        return joined, gone, self._update_registrations(with_epochs)

    def _update_registrations(self, registered: dict[int, tuple[BrokerInfo, int]]) -> list[int]:
        """Into the context, the brokers of ``registered`` live under the same registration
        (broker epoch) with new data (endpoints, rack: rewritten in place), their channel
        retargeted; returns their ids. Not a restart: their replicas and leadership stay as
        they are (Kafka's BrokerModifications)."""
        ctx = self.ctx
        updated = sorted(b for b, (info, epoch) in registered.items()
                         if b in ctx.brokers and epoch == ctx.broker_epochs.get(b) and info != ctx.brokers[b])
        for b in updated:
            info, _ = registered[b]
            logger.info("broker %d: registration changed in place: %s -> %s", b, ctx.brokers[b], info)
            ctx.brokers[b] = info
            self.channels.add_broker(b, info.host, info.port)
        return updated

    def _note_unreadable_brokers(self, unreadable: dict[int, tuple[str, int]]) -> None:
        """Registered brokers whose registration does not decode are not live: left out of
        the brokers read (one known before is handled as gone), each logged once per problem
        and registration (its znode is watched as every registration is)."""
        ctx = self.ctx
        for b, (problem, epoch) in sorted(unreadable.items()):
            if ctx.unreadable_brokers.get(b) != (problem, epoch):
                logger.warning("broker %d (broker epoch %d) is registered, but its registration does not decode: "
                               "%s; it is not live until the registration is readable", b, epoch, problem)
        for b in sorted(ctx.unreadable_brokers.keys() - unreadable.keys()):
            logger.info("broker %d: its registration is readable again, or gone", b)
        ctx.unreadable_brokers = dict(unreadable)

    def _watch_registrations(self, registered: set[int]) -> None:
        """Keep a data watch on the registration of each of the ``registered`` brokers, and
        on no other. A broker rewriting its registration in place (its session unchanged:
        new endpoints or rack, data that turned unreadable or readable again) changes no
        child of ``/brokers/ids``: only this watch sees it (``_on_broker_modification``)."""
        self._unwatch_registrations(registered)
        for b in sorted(registered - self._registration_watches.keys()):
            if self._nursery is not None:
                self._registration_watches[b] = scope = trio.CancelScope()
                self._nursery.start_soon(self._watch_registration, b, scope)

    def _unwatch_registrations(self, keep: set[int]) -> None:
        for b in list(self._registration_watches.keys() - keep):
            self._registration_watches.pop(b).cancel()

    async def _watch_registration(self, broker_id: int, scope: trio.CancelScope) -> None:
        with scope:
            try:
                changes = await self.zk.watch_data(self.zk.paths.broker(broker_id))
            except Exception as e:  # the controller goes on: a new registration still changes the children
                if not self.zk.closed:
                    logger.warning("cannot watch the registration of broker %d: %s", broker_id, e)
                return
            with changes:
                async for report in changes:
                    self._events_send.send_nowait((ControllerEvent.BROKER_MODIFICATION, (broker_id, report)))

    def _add_brokers(self, joined: dict[int, tuple[BrokerInfo, int]]) -> None:
        ctx = self.ctx
        for b, (info, epoch) in joined.items():
            ctx.brokers[b] = info
            ctx.broker_epochs[b] = epoch
            self.channels.add_broker(b, info.host, info.port)

    async def _load_topic(self, topic: str) -> None:
        ctx = self.ctx
        if not _topic_names([topic], "topic"):
            return
        until = self.zk.until_answered
        try:
            got = await until(functools.partial(self.zk.get_assignment_and_moves, topic))
            if got is None:
                return
            config = await until(functools.partial(self.zk.get_topic_config, topic))
            states = await until(functools.partial(self.zk.get_partition_states, topic))
        except ValueError as e:
            # a malformed znode (assignment, config or a partition's state): the topic is left
            # alone, and no request is full. Raised, it would fail this failover, and the next
            # controller's, each in turn
            logger.error("ignoring topic %r in ZooKeeper: %s", topic, e)
            ctx.unreadable.add(topic)
            ctx.complete = False
            return
        assignment, moves = got
        ctx.assignments[topic] = assignment
        for p, (adding, removing) in moves.items():
            if p in assignment:
                ctx.moves[TopicPartition(topic, p)] = ReplicaAssignment(tuple(assignment[p]), adding, removing)
        ctx.topic_configs[topic] = config
        for p, state in states.items():
            if state is not None:
                ctx.states[TopicPartition(topic, p)] = state

    # -- broker membership ---------------------------------------------------------------------

    async def _on_brokers(self, _children) -> None:
        if self.ctx is None:
            return
        joined, gone, updated = await self._refresh_brokers()
        if updated and not gone and not joined:  # else the metadata sent below names them
            self._send_update_metadata([])  # every broker: the new addresses (Kafka's onBrokerUpdate)
        if gone:
            restarted = sorted(gone & joined.keys())
            logger.info("brokers gone: %s%s", sorted(gone), f" (restarted: {restarted})" if restarted else "")
            await self._on_brokers_gone(gone)
        self._add_brokers(joined)
        if joined:
            logger.info("brokers joined: %s", sorted(joined))
            await self._on_brokers_joined(set(joined))

    async def _on_broker_modification(self, payload: tuple[int, tuple[bytes | None, int | None]]) -> None:
        """A watch reported a broker's registration (``_watch_registrations``). Its first
        report is the registration as the controller read it: a report that decodes to the
        registration known changes nothing. Any other is handled as a broker change, which
        reads every registration again: one rewritten in place is updated
        (``_update_registrations``), one that turned unreadable is gone, one readable again
        joins."""
        broker, (data, _version) = payload
        if self.ctx is None:
            return
        known = self.ctx.brokers.get(broker)
        if known is not None and data is not None:
            with contextlib.suppress(ValueError):
                if decode_broker_info(broker, data) == known:
                    return
        await self._on_brokers(None)

    async def _on_brokers_gone(self, gone: set[int]) -> None:
        ctx = self.ctx
        affected = [tp for tp, (st, _) in ctx.states.items()
                    if st.leader in gone or any(r in gone for r in st.isr)]
        await self._elect_offline([tp for tp in affected if ctx.states[tp][0].leader in gone])
        await self._shrink_isr([tp for tp in affected if ctx.states[tp][0].leader not in gone], gone)
        self._send_update_metadata(ctx.all_partitions())
        await self._advance_moves([tp for tp in affected if tp in ctx.moves])

    async def _on_brokers_joined(self, joined: set[int]) -> None:
        ctx = self.ctx
        # full: a broker registered again may hold topics deleted while it was away
        self._send_update_metadata(ctx.all_partitions(), full=True)
        for b in joined:  # full: a log of a partition no longer assigned to it is deleted
            self._send_leader_and_isr(b, ctx.partitions_on(b), full=True)
        self._stop_deleted_replicas(brokers=joined)
        await self._elect_offline([tp for tp, (st, _) in ctx.states.items() if ctx.leader_offline(tp, st)])
        await self._advance_moves(list(ctx.moves))

    def _replicas(self, tp: TopicPartition) -> list[int]:
        return self.ctx.assignments.get(tp.topic, {}).get(tp.partition, [])

    def _live_replicas(self, tp: TopicPartition) -> list[int]:
        """A new partition's leader (the first) and ISR: its live replicas, in assignment order."""
        live = self.ctx.live
        return [r for r in self._replicas(tp) if r in live]

    # -- partition state changes ---------------------------------------------------------------

    async def _init_new_partitions(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """Partitions without a state znode: leader = first live replica, ISR = live replicas."""
        ctx, created = self.ctx, []
        for tp in tps:
            if tp in ctx.states:
                continue
            live = self._live_replicas(tp)
            st = LeaderAndIsr(live[0] if live else -1, 0, live, ctx.epoch)
            version = await self.zk.create_partition_state(tp.topic, tp.partition, st, ctx.epoch_zk_version)
            ctx.states[tp] = (st, version)
            created.append(tp)
        return created

    async def _elect_offline(self, tps: list[TopicPartition]) -> list[Outgoing | None]:
        """Elect the offline partitions of ``tps`` (``_offline_election``); the propagation waits."""
        changed, new = [], set()
        for tp in tps:
            never_led = tp in self.ctx.states and _never_led(self.ctx.states[tp][0])
            if await self._update_state(tp, lambda st, tp=tp: self._offline_election(tp, st)):
                changed.append(tp)
                if never_led:
                    new.add(tp)
        return self._propagate(changed, new=new)

    def _offline_election(self, tp: TopicPartition, st: LeaderAndIsr,
                          unclean: bool | None = None) -> tuple[int, list[int]] | None:
        """The new (leader, ISR) of ``tp`` if it is offline, else None; outside the ISR only
        if ``unclean`` (None: as the topic's unclean.leader.election.enable says).

        Offline means its leader is not registered (or it never had one). A leader in
        controlled shutdown is registered, and still serves: its partition is online (as in
        Kafka, only Offline and New partitions are elected), for a new leader elected now
        would lead next to it, which is sent no LeaderAndIsr (``_propagate``). The new leader
        itself is chosen among the live brokers, none of them shutting down. A leader whose
        replica is in a log dir that failed is offline too, and no such replica is chosen
        (``ControllerContext.live_for``)."""
        ctx = self.ctx
        live = ctx.live_for(tp)
        if not ctx.leader_offline(tp, st):
            return None
        if _never_led(st):  # its first live replicas start it, as a new one
            live = self._live_replicas(tp)
            return (live[0], live) if live else None
        unclean = self._unclean_allowed(tp.topic) if unclean is None else unclean
        election = offline_partition_leader(self._replicas(tp), st.isr, live, unclean)
        if election is None:
            logger.error("%s has no live in-sync replica (ISR %s): offline", tp, st.isr)
            return None if st.leader == -1 else (-1, [r for r in st.isr if r in live] or [st.leader])
        if election.unclean:
            logger.error("%s: unclean leader election of broker %d (ISR was %s): "
                         "acknowledged records may be lost", tp, election.leader, st.isr)
        return election.leader, election.isr

    def _unclean_allowed(self, topic: str) -> bool:
        """``unclean.leader.election.enable`` for ``topic``: its own setting when it has one,
        either way (a topic protecting its data against a broker default of true included),
        else the broker's."""
        own = self.ctx.topic_configs.get(topic, {}).get("unclean.leader.election.enable")
        if own is None:
            return self.config.unclean_leader_election
        try:
            return bool(parse_value("unclean.leader.election.enable", own))
        except InvalidConfigError:  # validated when written: not expected
            logger.error("topic %s: unclean.leader.election.enable %r does not parse; the broker's "
                         "setting applies", topic, own)
            return self.config.unclean_leader_election

    async def _shrink_isr(self, tps: list[TopicPartition], gone: set[int]) -> None:
        changed = []
        for tp in tps:
            if await self._update_state(tp, lambda st: _without(st, gone)):
                changed.append(tp)
        self._propagate(changed)

    async def _update_state(self, tp: TopicPartition,
                            decide: Callable[[LeaderAndIsr], tuple[int, list[int]] | None]) -> bool:
        """Write the (leader, ISR) that ``decide`` makes of ``tp``'s current state (nothing if
        it returns None); True if written. On a version conflict (a leader changed its ISR
        since the state was read) the state is read again and ``decide`` asked again."""
        for _ in range(STATE_UPDATE_ATTEMPTS):
            decision = decide(self.ctx.states[tp][0])
            if decision is None:
                return False
            try:
                await self._write_state(tp, *decision)
                return True
            except ZkVersionConflict:
                fresh = await self._read_state(tp)
                if fresh is None:
                    return False
                logger.info("%s: state changed since it was read (now %s, version %d): deciding again",
                            tp, fresh[0], fresh[1])
                self.ctx.states[tp] = fresh
        logger.error("%s: state changed under the controller %d times in a row: left as it is",
                     tp, STATE_UPDATE_ATTEMPTS)
        return False

    async def _read_state(self, tp: TopicPartition) -> tuple[LeaderAndIsr, int] | None:
        """``tp``'s state as ZooKeeper holds it now; None if it has none, or if it does not
        decode (logged: the controller keeps its copy rather than fail the event, a failover
        among them)."""
        try:
            return await self.zk.get_partition_state(tp.topic, tp.partition)
        except ValueError as e:
            logger.error("%s: %s; its state stays as the controller last read it", tp, e)
            return None

    async def _write_state(self, tp: TopicPartition, leader: int, isr: list[int]) -> None:
        ctx = self.ctx
        old, version = ctx.states[tp]
        new = LeaderAndIsr(leader, old.leader_epoch + 1, list(isr), ctx.epoch)
        new_version = await self.zk.update_partition_state(tp.topic, tp.partition, new, version,
                                                           controller_epoch_zk_version=ctx.epoch_zk_version)
        ctx.states[tp] = (new, new_version)

    def _adding(self, tp: TopicPartition, broker_id: int) -> bool:
        move = self.ctx.moves.get(tp)
        return move is not None and broker_id in move.adding

    def _propagate(self, tps: list[TopicPartition], new: Collection[TopicPartition] = ()) -> list[Outgoing | None]:
        """Send the new states of ``tps`` to their replicas, and metadata to everyone; ``new``:
        those just created (``_send_leader_and_isr``).

        A broker in controlled shutdown gets no LeaderAndIsr: it would start fetching under
        the new epoch, and a leader could take it back into the ISR just before it stops."""
        if not tps:
            return []
        out = []
        for b in self.ctx.brokers:
            if b in self.ctx.shutting_down:
                continue
            mine = [tp for tp in tps if b in self._replicas(tp)]
            if mine:
                out.append(self._send_leader_and_isr(b, mine, new=new))
        return out + self._send_update_metadata(tps)

    # -- requests to brokers -------------------------------------------------------------------

    def _partition_state(self, tp: TopicPartition, is_new: bool = False) -> PartitionState:
        st, version = self.ctx.states[tp]
        replicas = self._replicas(tp)
        move = self.ctx.moves.get(tp)
        offline = self.ctx.offline_replicas
        return PartitionState(tp.topic, tp.partition, st.controller_epoch, st.leader, st.leader_epoch,
                              list(st.isr), version, list(replicas), bool(is_new),
                              [r for r in replicas if r not in self.ctx.brokers or tp in offline.get(r, ())],
                              list(move.adding) if move else [], list(move.removing) if move else [])

    def _live_brokers(self) -> list[LiveBroker]:
        return [LiveBroker(b, i.host, i.port, i.rack, _endpoints(i)) for b, i in sorted(self.ctx.brokers.items())]

    def _send_leader_and_isr(self, broker_id: int, tps: list[TopicPartition], full: bool = False,
                             new: Collection[TopicPartition] = ()) -> Outgoing | None:
        """``full``: ``tps`` holds every partition assigned to the broker (Kafka's FULL type):
        the broker deletes the logs of any other partition it holds (a replica removed while
        it was down). The replicas of ``new`` (partitions just created) and those a
        reassignment adds are sent as new: a broker with a log dir offline creates a log only
        for those (Kafka's isNew; another may be in the dir that is offline)."""
        known = [tp for tp in tps if tp in self.ctx.states]
        if len(known) < len(tps) or not self.ctx.complete:  # nothing may look stray on a guess
            full, tps = False, known
        if not tps and not full:
            return None
        leaders = {self.ctx.states[tp][0].leader for tp in tps}
        req = LeaderAndIsrRequest(self.broker_id, self.ctx.epoch, self.ctx.broker_epochs.get(broker_id, -1),
                                  [self._partition_state(tp, tp in new or self._adding(tp, broker_id)
                                                         or _never_led(self.ctx.states[tp][0])) for tp in tps],
                                  [lb for lb in self._live_brokers() if lb.broker_id in leaders],
                                  topic_configs={t: self.ctx.topic_configs.get(t, {}) for t in {tp.topic for tp in tps}},
                                  full=full)
        out = self.channels.send(broker_id, ApiKey.LEADER_AND_ISR, req)
        self._on_answer(ControllerEvent.LEADER_AND_ISR_ANSWERED, broker_id, out)
        return out

    def _send_update_metadata(self, tps: list[TopicPartition], deleted: list[str] | None = None,
                              configs_of: list[str] | None = None, brokers: Iterable[int] | None = None,
                              full: bool = False) -> list[Outgoing | None]:
        """UpdateMetadata with the states of ``tps`` to ``brokers`` (None: every registered one).
        ``full``: ``tps`` are every partition, and the brokers drop any topic they do not name
        (only while every topic was read: one that was not would go too)."""
        ctx = self.ctx
        full = full and ctx.complete
        states = [self._partition_state(tp) for tp in tps if tp in ctx.states]
        topics = set(configs_of or []) | {tp.topic for tp in tps}
        out = []
        for b in (ctx.brokers if brokers is None else brokers):
            req = UpdateMetadataRequest(self.broker_id, ctx.epoch, ctx.broker_epochs.get(b, -1), states,
                                        self._live_brokers(), deleted or [], self.cluster_id,
                                        topic_configs={t: ctx.topic_configs.get(t, {}) for t in topics}, full=full)
            out.append(self.channels.send(b, ApiKey.UPDATE_METADATA, req))
        return out

    def _restate_to(self, broker_id: int) -> None:
        """Everything ``broker_id`` must know, as a controller just elected tells it: its
        partitions (a full LeaderAndIsr; none while it shuts down), the metadata of every
        partition, and StopReplica for its replicas of the topics being deleted. What
        replaces its queue when that overflowed (channels.py): it supersedes every request
        dropped. Only queues: it runs inside ``ChannelManager.send``, anywhere in an event."""
        ctx = self.ctx
        if ctx is None or broker_id not in ctx.brokers:
            return
        if broker_id not in ctx.shutting_down:
            self._send_leader_and_isr(broker_id, ctx.partitions_on(broker_id), full=True)
        self._send_update_metadata(ctx.all_partitions(), deleted=sorted(ctx.deleting), brokers=[broker_id], full=True)
        self._stop_deleted_replicas(brokers={broker_id})

    # -- topics --------------------------------------------------------------------------------

    async def _on_topics(self, children) -> None:
        if self.ctx is None:
            return
        new = [t for t in children if t not in self.ctx.assignments and t not in self.ctx.deleting]
        for topic in new:
            await self._on_new_topic(topic)

    async def _on_new_topic(self, topic: str) -> list[Outgoing | None]:
        await self._load_topic(topic)
        created = await self._init_new_partitions(self.ctx.partitions_of(topic))
        return self._propagate(created, new=set(created))

    async def create_topics(self, topics, validate_only: bool) -> tuple[list[TopicResult], list]:
        """CreateTopics, on the controller. Returns results and the propagation waits.

        Everything is checked before anything is written (broker/controller/validation.py):
        a topic named twice in the request is refused (INVALID_REQUEST), and if the request
        asks for more than max.partitions.per.request partitions in all (counting the topics
        within max.partitions.per.topic), every topic of it is refused (INVALID_PARTITIONS). A
        topic created earlier in the request counts as existing for the later ones (so
        ``coll.x`` and ``coll_x`` in one request collide)."""
        existing = set(self.ctx.assignments) | set(await self.zk.get_topics())
        metric_names = by_metric_name(existing)
        twice = _named_twice(t.name for t in topics)
        per_topic = self.config.partition_limits.per_topic
        total = sum(n for t in topics if 0 < (n := self._requested_partitions(t)) <= per_topic)
        results, waits = [], []
        for t in topics:
            try:
                if t.name in twice:
                    raise TidelogError(f"topic {t.name!r} appears more than once in the request", error=INVALID_REQUEST)
                result, out = await self._create_topic(t, validate_only, existing, metric_names, total)
                existing.add(t.name)
                metric_names.update(by_metric_name([t.name]))
            except TidelogError as e:
                result, out = TopicResult(t.name, e.code, str(e)), []
            results.append(result)
            waits += out
        return results, waits

    def _requested_partitions(self, t) -> int:
        """How many partitions CreateTopics entry ``t`` asks for (0 if it is invalid anyway)."""
        if t.assignments:
            return len(t.assignments)
        if t.num_partitions == -1:
            return self.config.default_partitions
        return max(t.num_partitions, 0)

    async def _create_topic(self, t, validate_only: bool, existing: set[str], metric_names: dict[str, str],
                            request_total: int):
        validate_topic_name(t.name)
        if t.name in self.ctx.deleting:  # Kafka's words
            raise TidelogError(f"Topic '{t.name}' is marked for deletion.", error=TOPIC_ALREADY_EXISTS)
        if t.name in existing:
            raise TidelogError(f"topic {t.name!r} already exists", error=TOPIC_ALREADY_EXISTS)
        check_no_null_configs(t.configs)
        check_topic_name(t.name, metric_names)
        self._check_configs(t.name, t.configs, t.configs)
        assignment = self._assignment_for(t, request_total)
        check_assignment_size(t.name, assignment, t.configs, self.config.partition_limits)
        rf = len(next(iter(assignment.values())))
        result = TopicResult(t.name, NONE.code, None, len(assignment), rf)
        if validate_only:
            return result, []
        await self.zk.create_topic(t.name, assignment, dict(t.configs))
        logger.info("created topic %s: %d partitions, replication factor %d", t.name, len(assignment), rf)
        return result, await self._on_new_topic(t.name)

    def _check_configs(self, topic: str, effective: dict[str, str], requested: dict[str, str | None]) -> None:
        """INVALID_CONFIG unless ``effective`` (the topic's overrides after the request) are
        valid topic configs and the ``requested`` ones meet the minimums for clients."""
        try:
            check_requested(requested, self.config.config_minimums)
            self.config.topic_defaults.with_overrides(effective)
        except InvalidConfigError as e:
            raise TidelogError(f"topic {topic!r}: {e}", error=INVALID_CONFIG) from None

    def _assignment_for(self, t, request_total: int) -> dict[int, list[int]]:
        """The replica assignment of a new topic; its partition count and replication factor
        are checked against the limits before an assignment is planned."""
        live = sorted(self.ctx.live)
        limits = self.config.partition_limits
        if t.assignments:
            if t.num_partitions != -1 or t.replication_factor != -1:  # Kafka's rule and words
                raise TidelogError(f"topic {t.name!r}: both numPartitions or replicationFactor and assignments "
                                   f"were set; both cannot be used at the same time", error=INVALID_REQUEST)
            check_partition_count(t.name, len(t.assignments), limits)
            check_request_total(request_total, limits)
            assignment = {int(p): list(r) for p, r in t.assignments.items()}
            check_assignment(assignment, set(self.ctx.brokers))
            return assignment
        if t.num_partitions == 0 or t.num_partitions < -1:
            raise TidelogError(f"topic {t.name!r}: the number of partitions must be positive (or -1 for the "
                               f"default), got {t.num_partitions}", error=INVALID_PARTITIONS)
        n = t.num_partitions if t.num_partitions > 0 else self.config.default_partitions
        rf = t.replication_factor if t.replication_factor != -1 else self.config.default_replication_factor
        check_partition_count(t.name, n, limits)
        check_request_total(request_total, limits)
        check_replication_factor(t.name, rf, len(live))
        check_fits_zookeeper(t.name, n, rf, live, t.configs, limits)
        return placement.assign_replicas(live, n, rf, racks=self._racks(live))

    def _racks(self, live: list[int]) -> dict[int, str] | None:
        return placement.racks_when_complete({b: self.ctx.brokers[b].rack for b in live})

    async def create_partitions_all(self, topics, validate_only: bool) -> tuple[list[TopicResult], list]:
        """CreatePartitions, on the controller: results (in request order) and the propagation
        waits. Above max.partitions.per.request new partitions in all, every topic is refused."""
        current = {t.name: len(self.ctx.assignments[t.name]) for t in topics if t.name in self.ctx.assignments}
        per_topic = self.config.partition_limits.per_topic
        total = sum(t.count - current[t.name] for t in topics if current.get(t.name, t.count) < t.count <= per_topic)
        twice = _named_twice(t.name for t in topics)
        results, waits = [], []
        for t in topics:
            try:
                if t.name in twice:
                    raise TidelogError(f"topic {t.name!r} appears more than once in the request", error=INVALID_REQUEST)
                waits += await self.create_partitions(t.name, t.count, t.assignments, validate_only, total)
                results.append(TopicResult(t.name, NONE.code, None, t.count))
            except TidelogError as e:
                results.append(TopicResult(t.name, e.code, str(e)))
        return results, waits

    async def create_partitions(self, topic: str, count: int, assignments, validate_only: bool,
                                request_total: int | None = None):
        """Add partitions to ``topic`` (``request_total``: the new partitions of the whole
        request, checked against max.partitions.per.request; default: this topic's)."""
        ctx = self.ctx
        limits = self.config.partition_limits
        validate_topic_name(topic)
        if is_internal_topic(topic):  # the group -> partition mapping would move every group
            raise TidelogError(f"{topic} is an internal topic: its partitions cannot be added to",
                               error=INVALID_TOPIC_EXCEPTION)
        current = ctx.assignments.get(topic)
        if current is None:
            raise TidelogError(f"topic {topic!r} does not exist", error=UNKNOWN_TOPIC_OR_PARTITION)
        if count <= len(current):
            raise TidelogError(f"topic {topic!r} has {len(current)} partitions; the new count {count} "
                               "must be larger", error=INVALID_PARTITIONS)
        moving = sorted(tp.partition for tp in ctx.moves if tp.topic == topic)
        if moving:  # the new assignment would be written over the moves' replica sets
            raise TidelogError(f"topic {topic!r} has partitions being reassigned ({moving[:20]}): add partitions "
                               "once the reassignment is done", error=REASSIGNMENT_IN_PROGRESS)
        check_partition_count(topic, count, limits)
        check_request_total(count - len(current) if request_total is None else request_total, limits)
        rf = len(current[0])
        if assignments:
            if len(assignments) != count - len(current):
                raise TidelogError(f"{len(assignments)} assignments given for {count - len(current)} new partitions",
                                   error=INVALID_REPLICA_ASSIGNMENT)
            new = {len(current) + i: list(r) for i, r in enumerate(assignments)}
            check_assignment(new, set(ctx.brokers), start=len(current), replication_factor=rf)
        else:
            live = sorted(ctx.live)
            check_replication_factor(topic, rf, len(live))
            check_fits_zookeeper(topic, count, rf, live, ctx.topic_configs.get(topic, {}), limits)
            # Kafka's createNewPartitionsAssignment: rack-aware, continuing partition 0's round-robin
            new = placement.assign_replicas(live, count - len(current), rf, start_partition_id=len(current),
                                            start_index=placement.partition_zero_start(live, current.get(0, [])),
                                            racks=self._racks(live))
        merged = {**current, **new}
        check_assignment_size(topic, merged, ctx.topic_configs.get(topic, {}), limits)
        if validate_only:
            return []
        await self.zk.set_assignment(topic, merged, controller_epoch_zk_version=ctx.epoch_zk_version)
        ctx.assignments[topic] = merged
        created = await self._init_new_partitions([TopicPartition(topic, p) for p in sorted(new)])
        return self._propagate(created, new=set(created))

    async def alter_topic_config(self, topic: str, changes: dict[str, str | None], validate_only: bool,
                                 replace: bool = False):
        """Set (None: remove) each override in ``changes``; with ``replace`` the overrides become
        exactly ``changes`` (Kafka's legacy AlterConfigs)."""
        ctx = self.ctx
        validate_topic_name(topic)
        if topic not in ctx.assignments:
            raise TidelogError(f"topic {topic!r} does not exist", error=UNKNOWN_TOPIC_OR_PARTITION)
        merged = {} if replace else dict(ctx.topic_configs.get(topic, {}))
        for k, v in changes.items():
            if v is None:
                merged.pop(k, None)
            else:
                merged[k] = v
        self._check_configs(topic, merged, changes)
        check_assignment_size(topic, ctx.assignments[topic], merged, self.config.partition_limits)
        if validate_only:
            return []
        await self.zk.set_topic_config(topic, merged, controller_epoch_zk_version=ctx.epoch_zk_version)
        ctx.topic_configs[topic] = merged
        waits = self._send_update_metadata([], configs_of=[topic])
        if self._unclean_allowed(topic):  # as Kafka 2.7+: its offline partitions are elected at once
            waits += await self._elect_offline([tp for tp in ctx.partitions_of(topic) if tp in ctx.states])
        return waits

    async def delete_topics(self, names: list[str]) -> tuple[list[TopicResult], list[trio.Event]]:
        """DeleteTopics, on the controller: results in request order, and an event per topic
        whose deletion can complete now (every replica on a registered broker), set when it
        has. A topic named twice in the request is refused (INVALID_REQUEST, as in Kafka):
        otherwise a request naming one topic 10^5 times (a few hundred kB) had the controller
        mark it and delete it 10^5 times, each a ZooKeeper write and an UpdateMetadata,
        holding every other controller event (CreateTopics, elections) for half an hour. A
        topic marked for deletion already succeeds again, as in Kafka."""
        ctx = self.ctx
        twice = _named_twice(names)
        results, marked = [], []
        for name in names:
            if name in twice:
                results.append(TopicResult(name, INVALID_REQUEST.code,
                                           f"topic {name!r} appears more than once in the request"))
            elif name in ctx.deleting:
                results.append(TopicResult(name, NONE.code))
            elif name not in ctx.assignments:
                results.append(TopicResult(name, UNKNOWN_TOPIC_OR_PARTITION.code, f"topic {name!r} does not exist"))
            else:
                await self.zk.mark_topic_for_deletion(name)
                results.append(TopicResult(name, NONE.code))
                marked.append(name)
        await self._on_delete_topics(marked)
        done = [self._deleted.setdefault(t, trio.Event()) for t in marked
                if t in ctx.deleting and not ctx.deleting[t].waiting_for(set(ctx.brokers))]
        return results, done

    async def _on_deletion_markers(self, _children) -> None:
        """``/admin/delete_topics`` changed: its markers, read now. The names the watch
        reported may be stale by the time the event is handled (read before a deletion that
        completed since, the topic perhaps created again): acted on, they would delete a
        live topic."""
        if self.ctx is None:
            return
        await self._on_delete_topics(await self.zk.topics_marked_for_deletion())

    async def _on_delete_topics(self, children) -> None:
        """Topics marked for deletion (the rules: broker/controller/deletion.py)."""
        if self.ctx is None:
            return
        known = [t for t in _topic_names(children, "deletion marker")
                 if t not in self.ctx.deleting and self._queue_deletion(t)]
        if known:
            self._send_update_metadata([], deleted=known)
            self._stop_deleted_replicas(known)
        await self._complete_deletions()

    def _queue_deletion(self, topic: str) -> bool:
        """Stop managing ``topic``: out of every view (so out of every election, LeaderAndIsr
        and metadata), its replicas to be deleted. True if the topic was known (a marker
        without a readable topic only has its znodes removed)."""
        ctx = self.ctx
        known = topic in ctx.assignments
        deletion = ctx.deleting[topic] = TopicDeletion.of(ctx.assignments.pop(topic, {}))
        ctx.topic_configs.pop(topic, None)
        for tp in [tp for tp in ctx.states if tp.topic == topic]:
            del ctx.states[tp]
        for tp in [tp for tp in ctx.moves if tp.topic == topic]:
            del ctx.moves[tp]
        offline = deletion.waiting_for(set(ctx.brokers))
        if offline:
            logger.warning("topic %s is marked for deletion; its replicas on brokers %s, which are down, are "
                           "deleted when they return, and the deletion completes then", topic, offline)
        return known

    def _stop_deleted_replicas(self, topics: Iterable[str] | None = None, brokers: Iterable[int] | None = None) -> None:
        """StopReplica with deletion to each registered broker (of ``brokers``; None: all) for
        its replicas of the topics being deleted (of ``topics``; None: all) that it has not
        reported deleted; its answer comes back as a REPLICAS_DELETED event."""
        ctx = self.ctx
        by_broker: dict[int, list[StopReplicaPartition]] = {}
        for topic in sorted(ctx.deleting if topics is None else set(topics) & ctx.deleting.keys()):
            for b, partitions in ctx.deleting[topic].undeleted.items():
                if b in ctx.brokers and (brokers is None or b in brokers):
                    by_broker.setdefault(b, []).extend(
                        StopReplicaPartition(topic, p, EPOCH_DURING_DELETE, True) for p in sorted(partitions))
        for b, partitions in sorted(by_broker.items()):
            out = self.channels.send(b, ApiKey.STOP_REPLICA, StopReplicaRequest(
                self.broker_id, ctx.epoch, ctx.broker_epochs.get(b, -1), partitions))
            self._on_answer(ControllerEvent.REPLICAS_DELETED, b, out)

    def _on_answer(self, kind: ControllerEvent, broker: int, out: Outgoing | None) -> None:
        """Have ``broker``'s answer to ``out`` handled as a ``kind`` event, (context, broker,
        request sent), in the loop."""
        if out is not None and self._nursery is not None:
            self._nursery.start_soon(self._await_answer, kind, self.ctx, broker, out)

    async def _await_answer(self, kind: ControllerEvent, ctx: ControllerContext, broker: int, out: Outgoing) -> None:
        await out.done.wait()
        if out.response is not None:  # else dropped: the broker left, or the controller resigned
            self._events_send.send_nowait((kind, (ctx, broker, out)))

    async def _on_replicas_deleted(self, payload) -> None:
        ctx, broker, out = payload
        if ctx is not self.ctx:  # an answer to a request of an earlier term
            return
        for topic, partitions in deleted_replicas(out.response).items():
            if topic in ctx.deleting:
                ctx.deleting[topic].confirm(broker, partitions)
        await self._complete_deletions()

    async def _complete_deletions(self) -> None:
        """Remove the znodes of each topic being deleted whose every replica is deleted (the
        marker last: a controller stopped midway finds it and finishes)."""
        ctx = self.ctx
        for topic in [t for t, d in ctx.deleting.items() if d.complete]:
            await self.zk.delete_topic(topic, controller_epoch_zk_version=ctx.epoch_zk_version)
            del ctx.deleting[topic]
            self._deleted.pop(topic, trio.Event()).set()
            logger.info("deleted topic %s", topic)

    # -- ISR change notifications --------------------------------------------------------------

    async def _on_isr_change(self, _children) -> None:
        if self.ctx is None:
            return
        notes = await self.zk.isr_change_notifications()
        if not notes:
            return
        tps = set()
        for _, partitions in notes:
            # only partitions it manages: not those of a topic gone, being deleted, unreadable
            # or with a name no topic can have (whose path would not even be a znode's)
            tps.update(TopicPartition(t, p) for t, p in partitions if p in self.ctx.assignments.get(t, {}))
        for tp in sorted(tps):
            state = await self._read_state(tp)
            if state is not None:
                self.ctx.states[tp] = state
        self._send_update_metadata(sorted(tp for tp in tps if tp in self.ctx.states))
        await self.zk.delete_isr_change_notifications([path for path, _ in notes],
                                                      controller_epoch_zk_version=self.ctx.epoch_zk_version)
        # a leader may have taken a broker into its ISR just before the broker died
        dead = {r for tp in tps if tp in self.ctx.states for r in self.ctx.states[tp][0].isr} - set(self.ctx.brokers)
        if dead:
            await self._shrink_isr([tp for tp in tps if tp in self.ctx.states
                                    and self.ctx.states[tp][0].leader in self.ctx.live
                                    and set(self.ctx.states[tp][0].isr) & dead], dead)
        await self._advance_moves(sorted(tp for tp in tps if tp in self.ctx.moves))

    async def _on_replica_damage(self, _children) -> None:
        """Brokers that found replicas damaged on disk: each such replica gives up leadership
        to a live in-sync replica and leaves the ISR, in a new partition state (with a new
        leader epoch, even for a follower already out of the ISR: see
        ``election.without_damaged_replica``), on which the replica, now a follower outside the
        ISR, drops its damaged records and fetches them again. A report from an earlier
        registration of the broker is dropped: the broker reports again while the damage lasts.
        A report marked offline names replicas of a log dir that failed (``_on_offline_replicas``)."""
        if self.ctx is None:
            return
        notes = await self.zk.replica_damage_notifications()
        if not notes:
            return
        ctx = self.ctx
        changed = []
        for _, (broker, broker_epoch, partitions, offline) in notes:
            if broker not in ctx.brokers or not await self._is_current_broker_epoch(broker, broker_epoch):
                logger.info("replica damage report of broker %d (epoch %d) is stale: ignored", broker, broker_epoch)
                continue
            if offline:
                changed += await self._on_offline_replicas(broker, [TopicPartition(t, p) for t, p in partitions])
                continue
            for topic, partition in partitions:
                tp = TopicPartition(topic, partition)
                if tp not in ctx.states or broker not in self._replicas(tp):
                    continue
                if await self._update_state(tp, lambda st, tp=tp, b=broker: _decision(
                        without_damaged_replica(self._replicas(tp), st.leader, st.isr, ctx.live_for(tp), b))):
                    changed.append(tp)
                    logger.warning("%s: the replica on broker %d is damaged: now led by %d, ISR %s", tp, broker,
                                   ctx.states[tp][0].leader, ctx.states[tp][0].isr)
                elif ctx.states[tp][0].leader == broker:
                    logger.error("%s: the replica on broker %d is damaged and no other live replica is in "
                                 "sync: it stays leader, and cannot serve the damaged records", tp, broker)
        self._propagate(sorted(set(changed)))
        await self.zk.delete_isr_change_notifications([path for path, _ in notes],
                                                      controller_epoch_zk_version=ctx.epoch_zk_version)
        await self._advance_moves(sorted(tp for tp in set(changed) if tp in ctx.moves))

    async def _on_offline_replicas(self, broker: int, tps: list[TopicPartition]) -> list[TopicPartition]:
        """``broker``'s replicas of ``tps`` are in a log dir that failed: from now on not live
        for their partitions (until the broker registers again), as Kafka's OfflineReplica.
        A partition it led gets a new leader among the other live in-sync replicas (or none,
        keeping its ISR, as for a dead broker; unclean election where allowed); one it
        follows in the ISR goes on without it. Returns the partitions whose state changed
        (for the caller to propagate). Every broker's metadata names the replica offline:
        that of a partition whose state did not change (a follower already out of the ISR)
        is sent here, as Kafka's controller sends UpdateMetadata for replicas gone offline
        without an election."""
        ctx = self.ctx
        offline = ctx.offline_replicas.setdefault(broker, set())
        mine = [tp for tp in tps if tp in ctx.states and broker in self._replicas(tp)]
        newly = [tp for tp in mine if tp not in offline]
        offline.update(mine)
        changed = []
        for tp in mine:
            if await self._update_state(tp, lambda st, tp=tp: self._without_offline_replica(tp, st, broker)):
                changed.append(tp)
                st = ctx.states[tp][0]
                logger.warning("%s: the replica on broker %d is in a failed log dir: led by %d, ISR %s",
                               tp, broker, st.leader, st.isr)
        unchanged = [tp for tp in newly if tp not in changed]
        if unchanged:
            self._send_update_metadata(unchanged)
        return changed

    async def _on_leader_and_isr_answered(self, payload) -> None:
        """A broker answered a LeaderAndIsr: the replicas it answered KAFKA_STORAGE_ERROR for
        are in a log dir that failed, as Kafka's controller reads the answer
        (``handleLeaderAndIsrResponse``). So a controller just elected learns the offline
        replicas of every broker from the full LeaderAndIsr of its failover (and of a broker
        that joins), with no report from the broker: the one it made (``_on_replica_damage``)
        was handled, and deleted, by an earlier controller. Those it knew already change
        nothing. An answer of an earlier term, or to a request of the broker's earlier
        registration (its replicas are live again), is dropped."""
        ctx, broker, out = payload
        if ctx is not self.ctx or out.message.broker_epoch != ctx.broker_epochs.get(broker):
            return
        if out.response.error_code != NONE.code:
            return
        known = ctx.offline_replicas.get(broker, set())
        tps = sorted({TopicPartition(e.topic_name, e.partition_index) for e in out.response.partition_errors
                      if e.error_code == KAFKA_STORAGE_ERROR.code} - known)
        if not tps:
            return
        changed = await self._on_offline_replicas(broker, tps)
        newly = [tp for tp in tps if tp in ctx.offline_replicas.get(broker, ())]
        if not newly:
            return
        logger.warning("broker %d answered KAFKA_STORAGE_ERROR for %d replicas (%s): in a failed log dir, not live "
                       "until it registers again", broker, len(newly), ", ".join(map(str, newly[:10])))
        self._propagate(changed)
        await self._advance_moves([tp for tp in changed if tp in ctx.moves])

    def _without_offline_replica(self, tp: TopicPartition, st: LeaderAndIsr,
                                 broker: int) -> tuple[int, list[int]] | None:
        if st.leader == broker:
            return self._offline_election(tp, st)
        decision = _without(st, {broker})
        return None if decision is None or decision == (st.leader, list(st.isr)) else decision

    # -- controlled shutdown -------------------------------------------------------------------

    async def controlled_shutdown(self, broker_id: int, broker_epoch: int):
        """Move leadership off ``broker_id``; returns the partitions it still leads that have
        other replicas (those the broker should wait for) and the propagation waits.

        Only for the broker's current registration: ``broker_epoch`` must be the epoch of its
        ``/brokers/ids/<id>`` (which the broker knows and a client does not), else
        STALE_BROKER_EPOCH. One newer than the controller has seen is checked against
        ZooKeeper (the broker registered again and the broker-change event is still queued)."""
        ctx = self.ctx
        if not await self._is_current_broker_epoch(broker_id, broker_epoch):
            raise TidelogError(f"ControlledShutdown of broker {broker_id}: broker epoch {broker_epoch} is not the "
                               "epoch of its current registration", error=STALE_BROKER_EPOCH)
        if broker_id not in ctx.brokers:
            return [], []
        ctx.shutting_down.add(broker_id)
        moved, remaining = [], []

        def decide(tp: TopicPartition, st: LeaderAndIsr) -> tuple[int, list[int]] | None:
            if st.leader == broker_id:
                return _decision(controlled_shutdown_leader(self._replicas(tp), st.isr, set(ctx.brokers),
                                                            ctx.shutting_down))
            if broker_id in st.isr and len(st.isr) > 1:
                return st.leader, [r for r in st.isr if r != broker_id]
            return None

        for tp in list(ctx.states):
            if await self._update_state(tp, lambda st, tp=tp: decide(tp, st)):
                moved.append(tp)
            elif ctx.states[tp][0].leader == broker_id and len(self._replicas(tp)) > 1:
                remaining.append(tp)  # as in Kafka, a partition with no other replica cannot move: not waited for
        followed = [StopReplicaPartition(tp.topic, tp.partition, st.leader_epoch, False)
                    for tp, (st, _) in ctx.states.items()
                    if st.leader != broker_id and broker_id in self._replicas(tp)]
        if followed:  # so that the leaders do not take it back into their ISRs
            self.channels.send(broker_id, ApiKey.STOP_REPLICA, StopReplicaRequest(
                self.broker_id, ctx.epoch, ctx.broker_epochs.get(broker_id, -1), followed))
        waits = self._propagate(moved)
        logger.info("controlled shutdown of broker %d: %d partitions moved, %d remain",
                    broker_id, len(moved), len(remaining))
        return remaining, waits

    async def _is_current_broker_epoch(self, broker_id: int, broker_epoch: int) -> bool:
        known = self.ctx.broker_epochs.get(broker_id)
        if broker_epoch == known:
            return True
        if broker_epoch < 0 or (known is not None and broker_epoch < known):
            return False
        return broker_epoch == await self.zk.get_broker_epoch(broker_id)

    # -- reassignment (the rules: broker/controller/reassignment.py) ----------------------------

    async def alter_reassignments(self, requested: list[tuple[TopicPartition, list[int] | None]]):
        """AlterPartitionReassignments: move each partition to its target replicas (None:
        cancel its move). Returns {tp: (error code, message)} and the propagation waits. A
        partition named twice is refused (INVALID_REQUEST), as Kafka does; a target equal to
        the replicas of a partition that is not moving changes nothing.

        Order of the writes, so that ZooKeeper is consistent after each one (a controller that
        takes over resumes from there): first the state of each partition that drops replicas
        at once (a cancel or a replaced move: they leave the ISR, a leader among them hands
        over), refusing that partition if the state cannot be written; then, per topic, the
        new replica sets and moves in the topic's znode (checked against the znode size
        bound; memory follows only once written); then each moving partition's state with a
        new leader epoch; then LeaderAndIsr to the new RS (added replicas start fetching) and
        StopReplica with deletion to the dropped replicas."""
        ctx = self.ctx
        results: dict[TopicPartition, tuple[int, str | None]] = {}
        plans: dict[TopicPartition, tuple[ReplicaAssignment, ReplicaAssignment]] = {}
        twice = _named_twice(tp for tp, _ in requested)
        for tp, target in requested:
            if tp in twice:
                results[tp] = (INVALID_REQUEST.code, f"{tp} appears more than once in the request")
                continue
            try:
                before, after = self._plan_move(tp, target)
                results[tp] = (NONE.code, None)
                if after != before:
                    plans[tp] = (before, after)
            except TidelogError as e:
                results[tp] = (e.code, str(e))
        changed = []
        for tp, (before, after) in list(plans.items()):
            if set(before.replicas) - set(after.replicas):
                if not await self._update_state(
                        tp, lambda st, tp=tp, b=before, a=after: restate(b, a, st.leader, st.isr, ctx.live_for(tp))):
                    del plans[tp]
                    results[tp] = (ELIGIBLE_LEADERS_NOT_AVAILABLE.code,
                                   f"{tp}: the state changed to {ctx.states[tp][0]}, from which the replicas it "
                                   "drops cannot leave the ISR (no other live in-sync replica to lead): retry")
                    continue
                changed.append(tp)
        for topic in sorted({tp.topic for tp in plans}):
            mine = {tp: after for tp, (_, after) in plans.items() if tp.topic == topic}
            assignment = {**ctx.assignments[topic], **{tp.partition: list(a.replicas) for tp, a in mine.items()}}
            moves = {**{tp: m for tp, m in ctx.moves.items() if tp.topic == topic and tp not in mine},
                     **{tp: a for tp, a in mine.items() if a.is_reassigning}}
            try:
                check_assignment_size(topic, assignment, ctx.topic_configs.get(topic, {}), self.config.partition_limits,
                                      moving=_moving(moves))
                await self.zk.set_assignment(topic, assignment, moving=_moving(moves),
                                             controller_epoch_zk_version=ctx.epoch_zk_version)
            except TidelogError as e:  # the states written above stay valid under the old replicas
                for tp in mine:
                    del plans[tp]
                    results[tp] = (e.code, str(e))
                continue
            ctx.assignments[topic] = assignment
            for tp in mine:
                ctx.moves.pop(tp, None)
            ctx.moves.update(moves)
        for tp, (before, after) in plans.items():
            if tp not in changed:  # a new leader epoch tells every replica of the new RS
                await self._update_state(tp, lambda st: (st.leader, list(st.isr)))
                changed.append(tp)
            if after.is_reassigning:
                logger.info("%s: reassigning from %s to %s", tp, list(after.original), list(after.target))
            else:
                logger.info("%s: replicas %s (move cancelled)", tp, list(after.replicas))
        # every state written goes out, also one whose topic znode then failed to be written
        # (its ISR shrank under the old replicas: the leader must learn it)
        waits = self._propagate(changed)
        self._stop_dropped({tp: set(b.replicas) - set(a.replicas) for tp, (b, a) in plans.items()})
        waits += await self._advance_moves([tp for tp in changed if tp in ctx.moves])
        return results, waits

    def _plan_move(self, tp: TopicPartition, target: list[int] | None) -> tuple[ReplicaAssignment, ReplicaAssignment]:
        """(assignment now, assignment after) for moving ``tp`` to ``target`` (None: cancel),
        or the TidelogError that refuses it."""
        ctx = self.ctx
        if tp not in ctx.states or tp.partition not in ctx.assignments.get(tp.topic, {}):
            raise TidelogError(f"{tp} does not exist", error=UNKNOWN_TOPIC_OR_PARTITION)
        before = ctx.moves.get(tp) or ReplicaAssignment.of(self._replicas(tp))
        if target is None:
            if not before.is_reassigning:
                raise TidelogError(f"{tp} is not being reassigned: nothing to cancel",
                                   error=NO_REASSIGNMENT_IN_PROGRESS)
            after = before.cancel()
        else:
            check_target(target, original=before.original, registered=ctx.brokers)
            after = before.reassign_to(target)
        st = ctx.states[tp][0]
        if restate(before, after, st.leader, st.isr, ctx.live_for(tp)) is None:
            raise TidelogError(f"{tp}: no replica of {list(after.replicas)} is live and in the ISR {list(st.isr)} "
                               "to lead it", error=ELIGIBLE_LEADERS_NOT_AVAILABLE)
        return before, after

    async def _write_assignment(self, topic: str) -> None:
        ctx = self.ctx
        await self.zk.set_assignment(topic, ctx.assignments[topic],
                                     moving=_moving({tp: m for tp, m in ctx.moves.items() if tp.topic == topic}),
                                     controller_epoch_zk_version=ctx.epoch_zk_version)

    def _stop_dropped(self, dropped: dict[TopicPartition, set[int]]) -> None:
        """StopReplica with deletion to the live brokers of replicas a partition no longer has
        (one that is down deletes its copy when it comes back: its LeaderAndIsr is full)."""
        ctx = self.ctx
        by_broker: dict[int, list[StopReplicaPartition]] = {}
        for tp, brokers in dropped.items():
            epoch = ctx.states[tp][0].leader_epoch if tp in ctx.states else -1
            for b in sorted(brokers):
                if b in ctx.brokers:
                    by_broker.setdefault(b, []).append(StopReplicaPartition(tp.topic, tp.partition, epoch, True))
        for b, partitions in by_broker.items():
            self.channels.send(b, ApiKey.STOP_REPLICA, StopReplicaRequest(
                self.broker_id, ctx.epoch, ctx.broker_epochs.get(b, -1), partitions))

    async def _advance_moves(self, tps: list[TopicPartition]) -> list[Outgoing | None]:
        """Phase 2 of the moves of ``tps`` whose target replicas are all in the ISR: leadership
        onto the target if needed, the removed replicas out of the ISR, stopped and deleted,
        and the target written as the partition's replicas."""
        ctx = self.ctx
        done: list[TopicPartition] = []
        for tp in tps:
            move = ctx.moves.get(tp)
            if move is None or tp not in ctx.states:
                continue

            def decide(st: LeaderAndIsr, move=move) -> tuple[int, list[int]] | None:
                d = next_step(move, st.leader, st.isr, ctx.live_for(tp))
                return None if d.step is Step.CATCH_UP else (d.leader, list(d.isr))
            if await self._update_state(tp, decide):
                done.append(tp)
        if not done:
            return []
        removed = {}
        for tp in done:
            move = ctx.moves.pop(tp)
            ctx.assignments[tp.topic][tp.partition] = list(move.target)
            removed[tp] = set(move.removing)
            logger.info("%s: reassignment done, replicas %s (removed %s)", tp, list(move.target), list(move.removing))
        for topic in sorted({tp.topic for tp in done}):
            await self._write_assignment(topic)
        waits = self._propagate(done)
        self._stop_dropped(removed)
        return waits

    def reassignments(self, tps: list[TopicPartition] | None) -> dict[TopicPartition, ReplicaAssignment]:
        """ListPartitionReassignments: the moves in progress (of ``tps``; None: all)."""
        moves = self.ctx.moves
        return {tp: moves[tp] for tp in sorted(moves if tps is None else (tp for tp in tps if tp in moves))}

    # -- preferred leaders ---------------------------------------------------------------------

    def _existing(self, tps: list[TopicPartition] | None, results: list) -> Iterator[TopicPartition]:
        """``tps`` (None: all) that exist; the others answered UNKNOWN_TOPIC_OR_PARTITION."""
        ctx = self.ctx
        for tp in (ctx.all_partitions() if tps is None else tps):
            if tp in ctx.states:
                yield tp
            else:
                results.append((tp, UNKNOWN_TOPIC_OR_PARTITION.code, f"{tp} does not exist"))

    async def elect_preferred(self, tps: list[TopicPartition] | None):
        """Move leadership of ``tps`` (None: all) to their preferred replica where possible.
        Returns [(tp, error code, message)] (``_answered``) and the propagation waits."""
        ctx = self.ctx
        results, changed = [], []
        for tp in self._existing(tps, results):
            st, _ = ctx.states[tp]
            replicas = self._replicas(tp)
            if replicas and st.leader == replicas[0]:
                results.append((tp, ELECTION_NOT_NEEDED.code, f"broker {st.leader} already leads {tp}"))
                continue
            election = preferred_replica_leader(replicas, st.isr, ctx.live_for(tp))
            if election is None:
                results.append((tp, PREFERRED_LEADER_NOT_AVAILABLE.code,
                                f"preferred replica {replicas[0] if replicas else None} of {tp} is not live "
                                f"and in the ISR {st.isr}"))
                continue
            if not await self._update_state(tp, lambda st, tp=tp, replicas=replicas: _preferred(replicas, st,
                                                                                             ctx.live_for(tp))):
                results.append((tp, PREFERRED_LEADER_NOT_AVAILABLE.code,
                                f"the state of {tp} changed during the election: {ctx.states[tp][0]}"))
                continue
            changed.append(tp)
            results.append((tp, NONE.code, None))
        waits = self._propagate(changed)
        if changed:
            logger.info("preferred leader election moved %d partitions", len(changed))
        return _answered(results, tps), waits

    async def elect_unclean(self, tps: list[TopicPartition] | None):
        """ElectLeaders of the UNCLEAN type (Kafka's ElectionType.UNCLEAN): a leader for each of
        ``tps`` (None: all) that has none, its leader not registered. The first live replica in
        assignment order that is in the ISR; with none, the first live replica at all, whatever
        the topic's unclean.leader.election.enable (acknowledged records it lacks are lost).
        Returns [(tp, error code, message)] (``_answered``) and the propagation waits."""
        ctx = self.ctx
        results, changed = [], []
        for tp in self._existing(tps, results):
            if not ctx.leader_offline(tp, ctx.states[tp][0]):  # one shutting down still leads
                results.append((tp, ELECTION_NOT_NEEDED.code, f"broker {ctx.states[tp][0].leader} leads {tp}"))
                continue
            if await self._update_state(tp, lambda st, tp=tp: self._offline_election(tp, st, unclean=True)):
                changed.append(tp)
            st = ctx.states[tp][0]
            if not ctx.leader_offline(tp, st):
                results.append((tp, NONE.code, None) if tp in changed else
                               (tp, ELECTION_NOT_NEEDED.code, f"broker {st.leader} leads {tp}"))
            else:
                results.append((tp, ELIGIBLE_LEADERS_NOT_AVAILABLE.code,
                                f"no replica of {tp} ({self._replicas(tp)}) is live to lead it"))
        waits = self._propagate(changed)
        if changed:
            logger.warning("unclean leader election asked for: %d partitions elected", len(changed))
        return _answered(results, tps), waits

    async def _on_rebalance(self, _payload) -> None:
        """Kafka's auto leader rebalance: per broker, if more than the allowed percentage of
        the partitions it prefers are led elsewhere, move them back."""
        if self.ctx is None:
            return
        imbalanced = []
        for broker in self.ctx.live:
            preferred = [tp for tp in self.ctx.all_partitions()  # a moving partition's leader moves with it
                         if self._replicas(tp)[:1] == [broker] and tp in self.ctx.states and tp not in self.ctx.moves]
            elsewhere = [tp for tp in preferred if self.ctx.states[tp][0].leader != broker]
            if preferred and len(elsewhere) * 100 > self.config.leader_imbalance_per_broker_percentage * len(preferred):
                imbalanced += elsewhere
        if imbalanced:
            await self.elect_preferred(imbalanced)

    _handlers = {
        ControllerEvent.AUTO_LEADER_BALANCE: _on_rebalance,
        ControllerEvent.CONTROLLER_CHANGE: _on_controller_change,
        ControllerEvent.BROKER_CHANGE: _on_brokers,
        ControllerEvent.BROKER_MODIFICATION: _on_broker_modification,
        ControllerEvent.TOPIC_CHANGE: _on_topics,
        ControllerEvent.TOPIC_DELETION: _on_deletion_markers,
        ControllerEvent.ISR_CHANGE: _on_isr_change,
        ControllerEvent.REPLICA_DAMAGE: _on_replica_damage,
        ControllerEvent.REPLICAS_DELETED: _on_replicas_deleted,
        ControllerEvent.LEADER_AND_ISR_ANSWERED: _on_leader_and_isr_answered,
    }


def _without(st: LeaderAndIsr, gone: set[int]) -> tuple[int, list[int]] | None:
    """``st`` with the ``gone`` brokers out of its ISR, or None if none of them is in it. As
    Kafka: an ISR never becomes empty; its last member stays, so that only it (or an unclean
    election) can bring the partition back."""
    leader, isr = remove_from_isr(st.leader, st.isr, gone)
    if tuple(isr) == tuple(st.isr):
        return None
    return leader, isr or list(st.isr[-1:])


def _answered(results: list[tuple[TopicPartition, int, str | None]],
              tps: list[TopicPartition] | None) -> list[tuple[TopicPartition, int, str | None]]:
    """An election's results as ElectLeaders answers them: each partition named, but of an
    election of all partitions (``tps`` None) only those elected or that failed, as Kafka
    answers a request with null partitions (KIP-460): one that needed no election is left out."""
    if tps is not None:
        return results
    return [r for r in results if r[1] != ELECTION_NOT_NEEDED.code]


def _decision(election: Election | None) -> tuple[int, list[int]] | None:
    """An election as ``_update_state``'s decision: the new (leader, ISR), or None."""
    return None if election is None else (election.leader, election.isr)


def _preferred(replicas: list[int], st: LeaderAndIsr, live: set[int]) -> tuple[int, list[int]] | None:
    """The preferred replica as leader of ``st``, if it is live, in the ISR and not leading."""
    if replicas and st.leader == replicas[0]:
        return None
    return _decision(preferred_replica_leader(replicas, st.isr, live))


def _never_led(st: LeaderAndIsr) -> bool:
    """A partition created while none of its replicas was live (``_init_new_partitions``): it
    never had a leader nor a record, so each of its replicas is new."""
    return st.leader == -1 and not st.isr and st.leader_epoch == 0


def _moving(moves: dict[TopicPartition, ReplicaAssignment]) -> dict[int, tuple[tuple[int, ...], tuple[int, ...]]]:
    """A topic's moves as its znode keeps them: partition -> (adding, removing)."""
    return {tp.partition: (m.adding, m.removing) for tp, m in moves.items()}


def _named_twice(names: Iterable[Hashable]) -> set:
    seen, twice = set(), set()
    for n in names:
        (twice if n in seen else seen).add(n)
    return twice


__all__ = ["Controller", "ControllerConfig", "ControllerContext", "ControllerEvent", "Election", "code_of"]


def _endpoints(info: BrokerInfo) -> list[LiveBrokerEndpoint]:
    """A broker's advertised listeners, as UpdateMetadata carries them (they parse: a
    registration whose endpoints do not is unreadable, its broker not live)."""
    return [LiveBrokerEndpoint(e.name, e.host, e.port) for e in parse_endpoints(",".join(info.endpoints))]
