"""The broker's view of the cluster, as the controller last described it (UpdateMetadata),
and, apart from it, who ZooKeeper says may send broker-to-broker requests (``ZkRegistry``).

Every broker answers Metadata requests from this cache, so any broker can bootstrap a
client. The cache is replaced partition by partition; a request from an older controller
epoch than the newest one seen is ignored (the sender was deposed). A topic goes when a
request names it deleted, or when a *full* request (what a controller sends after its
election and to every broker when one registers) does not name it: a broker that was away
(its ZooKeeper session lost) while a topic was deleted hears of it no other way.

The registry is not fed by requests: a request could describe its own sender. The broker
watches ZooKeeper (``/controller``, ``/brokers/ids``) and the registry holds what it read: the
controller's id and epoch, and each registered broker's epoch (the czxid of its
``/brokers/ids/<id>``). Requests that claim to come from the controller or from a replica are
checked against it (broker/apis.py). A watch fires after the change it reports, so a request
from a new controller (or a restarted follower) can arrive first: a claim *ahead* of what the
registry holds is checked again against a fresh read of ZooKeeper before it is refused. Those
reads run in ZooKeeper's worker threads, one at a time per kind, at most one every
``reread_interval_s`` (a stream of forged claims costs ZooKeeper a few reads a second). A
caller waits for one that started after it asked; while ZooKeeper does not answer it tries
again, up to ``reread_timeout_s``: a claim is refused when ZooKeeper contradicts it, or could
not be asked for that long. (The controller resends a request that timed out, not one that
was refused: the broker sets it longer than the controller's request timeout,
``controller.socket.timeout.ms``.)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterator

import trio

from tidelog.protocol.errors import LEADER_NOT_AVAILABLE, NONE, UNKNOWN_TOPIC_OR_PARTITION
from tidelog.protocol.messages import (
    NO_LEADER,
    BrokerMetadata,
    LiveBroker,
    PartitionMetadata,
    PartitionState,
    TopicMetadata,
    UpdateMetadataRequest,
)
from tidelog.protocol.topics import TopicPartition, is_internal_topic

logger = logging.getLogger("tidelog.metadata")


class MetadataCache:
    def __init__(self, broker_id: int, registry: ZkRegistry | None = None):
        self.broker_id = broker_id
        self.registry = registry if registry is not None else ZkRegistry()
        self.controller_id = -1
        self.controller_epoch = -1
        self.cluster_id: str | None = None
        self.brokers: dict[int, LiveBroker] = {}
        self._partitions: dict[str, dict[int, PartitionState]] = {}

    def update(self, req: UpdateMetadataRequest) -> bool:
        """Apply an UpdateMetadata request; False (ignored) if it comes from a stale controller.
        It removes the topics of ``deleted_by``."""
        if req.controller_epoch < self.controller_epoch:
            return False
        self.controller_id, self.controller_epoch = req.controller_id, req.controller_epoch
        if req.cluster_id:
            self.cluster_id = req.cluster_id
        self.brokers = {b.broker_id: b for b in req.live_brokers}
        for topic in self.deleted_by(req):
            self._partitions.pop(topic, None)
        for st in req.partition_states:
            self._partitions.setdefault(st.topic_name, {})[st.partition_index] = st
        return True

    def deleted_by(self, req: UpdateMetadataRequest) -> list[str]:
        """The topics ``req`` deletes: those it names deleted and, if it is full, every topic
        held that it does not name (deleted while this broker did not hear: it had lost its
        ZooKeeper session, say; no later request would name it). None from a stale controller."""
        if req.controller_epoch < self.controller_epoch:
            return []
        named = {st.topic_name for st in req.partition_states}
        absent = [t for t in sorted(self._partitions) if t not in named] if req.full else []
        return list(dict.fromkeys([*req.deleted_topics, *absent]))

    def remove_topic(self, topic: str) -> None:
        self._partitions.pop(topic, None)

    # -- queries -------------------------------------------------------------------------------

    @property
    def topics(self) -> list[str]:
        return sorted(self._partitions)

    def contains_topic(self, topic: str) -> bool:
        return topic in self._partitions

    def partitions(self) -> Iterator[TopicPartition]:
        """Every partition held, topic by topic (Kafka's ``getAllTopics`` and
        ``getTopicPartitions``)."""
        for topic in sorted(self._partitions):
            for p in sorted(self._partitions[topic]):
                yield TopicPartition(topic, p)

    def partition_state(self, tp: TopicPartition) -> PartitionState | None:
        return self._partitions.get(tp.topic, {}).get(tp.partition)

    def partition_count(self, topic: str) -> int:
        return len(self._partitions.get(topic, {}))

    def leader_of(self, tp: TopicPartition) -> int:
        st = self.partition_state(tp)
        return NO_LEADER if st is None else st.leader

    def broker_metadata(self, listener: str | None = None) -> list[BrokerMetadata]:
        """The live brokers as a client on ``listener`` reaches them (``address_on``)."""
        return [BrokerMetadata(b.broker_id, *address, b.rack) for _, b in sorted(self.brokers.items())
                if (address := self.address_on(b, listener)) is not None]

    @staticmethod
    def address_on(broker: LiveBroker, listener: str | None) -> tuple[str, int] | None:
        """A broker's address on the listener of that name (Kafka's rule: a client is told
        the addresses of the listener it connected on; None if the broker has no such
        listener), or its inter-broker address (``listener`` None, or a broker listing no
        endpoints)."""
        if listener is None or not broker.endpoints:
            return broker.host, broker.port
        return next(((e.host, e.port) for e in broker.endpoints if e.listener == listener), None)

    def topic_metadata(self, topics: list[str] | None) -> list[TopicMetadata]:
        """One entry per topic asked for (each name once, as Kafka answers: a request naming
        a topic 10^5 times is not answered with 10^5 copies of it), or per topic known."""
        names = self.topics if topics is None else dict.fromkeys(topics)
        return [self._one_topic(name) for name in names]

    def _one_topic(self, name: str) -> TopicMetadata:
        parts = self._partitions.get(name)
        if parts is None:
            return TopicMetadata(UNKNOWN_TOPIC_OR_PARTITION.code, name,
                                 error_message=f"topic {name!r} does not exist")
        return TopicMetadata(NONE.code, name, [self._one_partition(p) for _, p in sorted(parts.items())],
                             is_internal=is_internal_topic(name))

    def _one_partition(self, st: PartitionState) -> PartitionMetadata:
        # (a replica in a log dir that failed is offline too: the controller names it)
        offline = [r for r in st.replicas if r not in self.brokers or r in st.offline_replicas]
        leader_alive = st.leader in self.brokers
        return PartitionMetadata(
            error_code=NONE.code if leader_alive else LEADER_NOT_AVAILABLE.code,
            partition_index=st.partition_index,
            leader_id=st.leader if leader_alive else NO_LEADER,
            leader_epoch=st.leader_epoch,
            replica_nodes=list(st.replicas),
            isr_nodes=list(st.isr),
            offline_replicas=offline,
        )


ControllerReader = Callable[[], Awaitable[tuple[int | None, int]]]  # (controller id or None, epoch)
BrokerEpochsReader = Callable[[], Awaitable[dict[int, int]]]  # broker id -> broker epoch


class ZkRegistry:
    """The controller and the broker epochs as this broker last read them from ZooKeeper
    (see the module docstring). Without readers (tests) it holds what it is given."""

    def __init__(self, read_controller: ControllerReader | None = None,
                 read_broker_epochs: BrokerEpochsReader | None = None, *,
                 reread_interval_s: float = 0.1, reread_timeout_s: float = 35.0):
        self.controller_id: int | None = None
        self.controller_epoch = -1
        self.broker_epochs: dict[int, int] = {}
        self.reread_timeout_s = reread_timeout_s
        self._controller = _Reread(read_controller, self._set_controller, reread_interval_s)
        self._brokers = _Reread(read_broker_epochs, self._set_broker_epochs, reread_interval_s)

    def _set_controller(self, value: tuple[int | None, int]) -> None:
        self.controller_id, self.controller_epoch = value

    def _set_broker_epochs(self, epochs: dict[int, int]) -> None:
        self.broker_epochs = dict(epochs)

    async def refresh_controller(self) -> bool:
        """Read the controller from ZooKeeper now; False if that failed or took too long."""
        return await self._controller.fresh(self.reread_timeout_s)

    async def refresh_broker_epochs(self) -> bool:
        """Read every broker's epoch from ZooKeeper now; False if that failed or took too long."""
        return await self._brokers.fresh(self.reread_timeout_s)

    # -- checks: why a claim is refused, None when it holds --------------------------------------

    async def controller_problem(self, controller_id: int, controller_epoch: int) -> str | None:
        """A request from the controller (LeaderAndIsr, StopReplica, UpdateMetadata) must
        name the controller ZooKeeper holds now and its epoch: an older epoch is a deposed
        controller's, a newer one no election made (or one our watch has not reported yet:
        ZooKeeper is read again before that is decided)."""
        if not self._is_controller(controller_id, controller_epoch) and controller_epoch >= self.controller_epoch:
            await self.refresh_controller()
        if self._is_controller(controller_id, controller_epoch):
            return None
        zk_epoch = self.controller_epoch
        if controller_epoch < zk_epoch:
            return f"controller epoch {controller_epoch} is older than the current one ({zk_epoch})"
        if controller_epoch > zk_epoch:
            return f"controller epoch {controller_epoch} is ahead of ZooKeeper's ({zk_epoch}): no controller has it"
        if self.controller_id is None:
            return f"no controller is elected in ZooKeeper (controller epoch {zk_epoch})"
        return f"broker {controller_id} is not the controller of epoch {zk_epoch} (broker {self.controller_id} is)"

    def _is_controller(self, controller_id: int, controller_epoch: int) -> bool:
        return self.controller_id is not None and (controller_id, controller_epoch) == (
            self.controller_id, self.controller_epoch)

    async def broker_epoch_problem(self, broker_id: int, broker_epoch: int, *, may_reread: bool = True) -> str | None:
        """A request on behalf of a broker must carry that broker's current epoch. A newer
        one than the registry holds (the broker registered again, our watch has not said so
        yet) is checked against ZooKeeper again when ``may_reread``. The message does not
        say what the epoch is: it goes back to whoever sent the request."""
        known = self.broker_epochs.get(broker_id)
        if known is not None and broker_epoch == known:
            return None
        if may_reread and broker_epoch >= 0 and (known is None or broker_epoch > known):
            await self.refresh_broker_epochs()
            known = self.broker_epochs.get(broker_id)
            if known is not None and broker_epoch == known:
                return None
        if known is None:
            return f"broker {broker_id} is not registered in ZooKeeper"
        return f"broker epoch {broker_epoch} is not the epoch of broker {broker_id}'s current registration"


class _Reread:
    """Reads of one kind from ZooKeeper, one at a time, applied in the order they were made.
    ``fresh`` waits for a read that started after it was called (joining one if there is),
    so what it sees is no older than the call, and tries again while reads fail; reads start
    at most every ``interval_s``."""

    def __init__(self, read: Callable[[], Awaitable] | None, apply: Callable[[object], None], interval_s: float):
        self._read = read
        self._apply = apply
        self.interval_s = interval_s
        self._last_start = -math.inf
        self._running: _Read | None = None

    async def fresh(self, timeout_s: float) -> bool:
        if self._read is None:
            return False
        asked = trio.current_time()
        with trio.move_on_after(timeout_s):
            while True:
                r = self._running
                if r is None:
                    r = await self._run(asked)
                else:
                    await r.done.wait()
                if r.started >= asked and r.ok:
                    return True

        return False

    async def _run(self, asked: float) -> "_Read":
        r = self._running = _Read(max(asked, self._last_start + self.interval_s))
        self._last_start = r.started
        try:
            await trio.sleep_until(r.started)
            value = await self._read()
        except Exception as e:  # noqa: BLE001 -- ZooKeeper unreachable or slow: the claim stays unproven
            logger.info("reading ZooKeeper again failed: %s", e)
            r.ok = False
        else:
            self._apply(value)
            r.ok = True
        finally:
            self._running = None
            r.done.set()
        return r


class _Read:
    __slots__ = ("started", "done", "ok")

    def __init__(self, started: float):
        self.started = started
        self.done = trio.Event()
        self.ok: bool | None = None  # None: cancelled before it finished
