"""In-process brokers for replication tests: Kafka's MockLeaderEndPoint, built from the real parts.

``MemoryBroker`` is one broker's replica side with nothing mocked but the network and
ZooKeeper: a real ``LogManager`` (logs in a temp dir), a real ``ReplicaManager`` and the
broker's real Fetch and OffsetsForLeaderEpoch handlers (``Apis``), run as the network layer
runs them. It *is* a
``LeaderEndpoint``: another broker's ``ReplicaFetcher`` calls it directly, so a leader serves
a follower exactly as it would over a socket (epoch fencing, follower state and HW updates,
reads up to the LEO, OFFSET_OUT_OF_RANGE with the log start offset).

The fetchers are not started as tasks. ``MemoryBroker.fetcher_for`` installs a fetcher where
the replica manager looks for it (``ReplicaManager.fetchers``), so a LeaderAndIsr request
that makes the broker a follower adds the partition to it, truncating, as in production; the
test then drives ``maybe_truncate`` and ``fetch_once`` itself.

``MemoryCluster`` is the controller's part: it bumps the leader epoch and sends the same
LeaderAndIsr state to every replica. It is ZooKeeper's too: every broker's registry knows
every broker's epoch (``broker_epoch``), which their fetchers send, as in production.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from typing import Callable

import trio

from tidelog.broker.apis import Apis
from tidelog.broker.deferred import is_deferred
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import Log
from tidelog.broker.log.manager import LogManager
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.replication.fetcher import FetcherConfig, ReplicaFetcher
from tidelog.broker.replication.replica_manager import NotifyingPartition, ReplicaConfig, ReplicaManager
from tidelog.protocol.errors import NONE
from tidelog.protocol.messages import (
    FetchRequest,
    FetchResponse,
    LeaderAndIsrRequest,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    PartitionState,
)
from tidelog.protocol.records import validate_batches
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("replicated", 0)
CONTROLLER_EPOCH = 1
_TMPFS = "/dev/shm"


def scratch_dir(prefix: str) -> tempfile.TemporaryDirectory:
    """A temp dir for the many short-lived logs of a Hypothesis test: on tmpfs where there is
    one, as every leader election fsyncs the epoch checkpoint (milliseconds each on a disk)."""
    return tempfile.TemporaryDirectory(prefix=prefix, dir=_TMPFS if os.path.isdir(_TMPFS) else None)


class MemoryBroker:
    """A broker's replica manager and leader-side request handlers, without sockets."""

    def __init__(self, broker_id: int, log_dir: str | list[str], config: LogConfig, clock: Callable[[], int], *,
                 replica_lag_time_max_ms: int = 30000, start: bool = True):
        self.broker_id = broker_id
        self.config = config
        self.log_manager = LogManager([log_dir] if isinstance(log_dir, str) else log_dir, config,
                                      broker_id=broker_id, clock=clock)
        if start:  # loads (and locks) the log dirs; a test that starts it later says so
            self.log_manager.startup()
        self.replica_manager = ReplicaManager(
            ReplicaConfig(broker_id, replica_lag_time_max_ms), self.log_manager, lambda topic: config,
            endpoint_for=self._no_endpoint, clock=clock, wall_clock=clock)
        self.apis = Apis(None, self.replica_manager, MetadataCache(broker_id))
        self.broker_epoch = self.replica_manager.broker_epoch = 0x100000000 + broker_id  # a czxid
        self.fetch_requests = 0
        self.epoch_requests = 0

    def _no_endpoint(self, leader_id: int, fetcher_id: int = 0):
        raise AssertionError(f"broker {self.broker_id} has no fetcher installed for leader {leader_id}")

    # -- LeaderEndpoint ------------------------------------------------------------------------

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        """Through the broker's Fetch handler, as the network layer runs it: a response now,
        a DelayedFetch answered by whatever satisfies it, or a coroutine."""
        self.fetch_requests += 1
        started = self.apis.fetch(request)
        if is_deferred(started):
            answered: list[FetchResponse] = []
            done = trio.Event()
            started.attach(lambda body: (answered.append(body), done.set()))
            try:
                await done.wait()
            finally:
                started.cancel()
            return _typed(answered[0])
        return _typed(await started if inspect.isawaitable(started) else started)

    async def offsets_for_leader_epoch(self, request: OffsetsForLeaderEpochRequest) -> OffsetsForLeaderEpochResponse:
        self.epoch_requests += 1
        return await self.apis.offsets_for_leader_epoch(request)

    # -- following -----------------------------------------------------------------------------

    def fetcher_for(self, leader: "MemoryBroker", **config) -> ReplicaFetcher:
        """This broker's fetcher from ``leader``, installed where LeaderAndIsr looks for it."""
        f = self.replica_manager.fetchers.get((leader.broker_id, 0))
        if f is None:
            config.setdefault("max_wait_ms", 0)  # never long-poll: the test drives every round
            f = ReplicaFetcher(leader.broker_id, leader, self.follower_log,
                               FetcherConfig(self.broker_id, **config), broker_epoch=lambda: self.broker_epoch,
                               on_dir_failure=self.replica_manager.handle_dir_failures)
            self.replica_manager.fetchers[leader.broker_id, 0] = f
        return f

    def follower_log(self, tp: TopicPartition) -> Log | None:
        """What the replica manager hands its fetchers: the log of a partition it follows."""
        p = self.replica_manager.partitions.get(tp)
        return p.log if p is not None and not p.is_leader else None

    # -- state ---------------------------------------------------------------------------------

    def partition(self, tp: TopicPartition = TP) -> NotifyingPartition:
        return self.replica_manager.partitions[tp]

    def log(self, tp: TopicPartition = TP) -> Log:
        log = self.log_manager.get_log(tp)
        assert log is not None, f"broker {self.broker_id} has no log for {tp}"
        return log

    def produce(self, records: bytes, acks: int = 1, tp: TopicPartition = TP) -> dict:
        """Append as leader through the replica manager's produce path (no waiting)."""
        results, _ = self.replica_manager.append_now(acks, {tp: records})
        return results[tp]

    def close(self) -> None:
        for log in self.log_manager.logs.values():
            log.close()
        self.log_manager.abandon()  # the dirs' locks go too


class MemoryCluster:
    """The controller's side: leader epochs and LeaderAndIsr for one partition."""

    def __init__(self, brokers: list[MemoryBroker], tp: TopicPartition = TP, **fetcher_config):
        self.brokers = {b.broker_id: b for b in brokers}
        self.tp = tp
        for b in brokers:
            b.apis.metadata.registry.broker_epochs = {other.broker_id: other.broker_epoch for other in brokers}
        self.leader_epoch = -1
        self.zk_version = -1
        self.leader_id = -1
        for follower in brokers:
            for leader in brokers:
                if leader is not follower:
                    follower.fetcher_for(leader, **fetcher_config)

    @property
    def replicas(self) -> list[int]:
        return sorted(self.brokers)

    @property
    def leader(self) -> MemoryBroker:
        return self.brokers[self.leader_id]

    @property
    def followers(self) -> list[MemoryBroker]:
        return [b for i, b in sorted(self.brokers.items()) if i != self.leader_id]

    def fetcher(self, follower: MemoryBroker) -> ReplicaFetcher:
        return follower.replica_manager.fetchers[self.leader_id, 0]

    def elect(self, leader_id: int, isr: list[int] | None = None, *, to: list[int] | None = None) -> PartitionState:
        """A new leader epoch with ``leader_id`` leading, sent to ``to`` (default: every replica)."""
        self.leader_epoch += 1
        self.zk_version += 1
        self.leader_id = leader_id
        st = PartitionState(self.tp.topic, self.tp.partition, CONTROLLER_EPOCH, leader_id, self.leader_epoch,
                            list(self.replicas if isr is None else isr), self.zk_version, self.replicas)
        for b in (self.brokers[i] for i in (self.replicas if to is None else to)):
            self.send(b, st)
        return st

    def send(self, broker: MemoryBroker, st: PartitionState) -> None:
        resp = broker.replica_manager.become_leader_or_follower(
            LeaderAndIsrRequest(0, CONTROLLER_EPOCH, 0, [st]))
        assert resp.error_code == NONE.code and all(e.error_code == NONE.code for e in resp.partition_errors), resp

    async def fetch_round(self, follower: MemoryBroker) -> None:
        """One turn of the follower's fetcher loop (``ReplicaFetcher.run`` minus the waiting)."""
        f = self.fetcher(follower)
        await f.maybe_truncate()
        await f.fetch_once()

    async def _wait_out_backoff(self) -> None:
        """Like the fetcher's run loop: with every partition backing off, sleep until one may go."""
        retry = [self.fetcher(f).partitions[self.tp].retry_at for f in self.followers
                 if self.tp in self.fetcher(f).partitions]
        if retry and min(retry) > trio.current_time():
            await trio.sleep_until(min(retry))

    def in_sync(self, follower: MemoryBroker) -> bool:
        """The follower holds the leader's LEO, has fetched there since (so the leader counted
        it for its HW), and took the leader's HW from that fetch."""
        leader_log, log = self.leader.log(self.tp), follower.log(self.tp)
        st = self.fetcher(follower).partitions.get(self.tp)
        seen = self.leader.partition(self.tp).remote[follower.broker_id]
        return (st is not None and not st.truncating and log.log_end_offset == leader_log.log_end_offset
                and seen.log_end_offset == leader_log.log_end_offset
                and log.high_watermark == leader_log.high_watermark)

    async def sync(self, max_rounds: int = 200) -> int:
        """Run every follower's fetcher until all equal the leader (LEO and HW); returns rounds."""
        for n in range(max_rounds):
            if all(self.in_sync(f) for f in self.followers):
                return n
            for f in self.followers:
                await self.fetch_round(f)
            await self._wait_out_backoff()
        raise AssertionError(f"followers did not converge in {max_rounds} rounds: " + "; ".join(
            f"broker {f.broker_id}: {f.log(self.tp)!r} {self.fetcher(f).partitions.get(self.tp)}"
            for f in self.followers) + f"; leader {self.leader.log(self.tp)!r}")


def _typed(answer) -> FetchResponse:
    """The handler's answer as a follower reads it off the wire: the typed response (the
    handler answers with the body, see ``Apis._fetch_response``)."""
    return FetchResponse.from_body(answer) if isinstance(answer, dict) else answer


def log_bytes(log: Log, start: int | None = None) -> bytes:
    """Every stored batch from ``start`` (default: the log start) to the LEO, one read at a time."""
    offset, out = log.log_start_offset if start is None else start, bytearray()
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        assert data, f"{log!r}: empty read at {offset}"
        batches = validate_batches(data)
        out += data
        offset = batches[-1][1].next_offset
    return bytes(out)


def assert_same_log(follower: Log, leader: Log, *, same_start: bool = True) -> None:
    """Byte-identical logs with the same offsets and leader epochs. Without ``same_start``
    (each replica applies its own retention) they are compared from the later log start."""
    if same_start:
        assert follower.log_start_offset == leader.log_start_offset
    assert follower.log_end_offset == leader.log_end_offset
    assert follower.high_watermark == leader.high_watermark
    start = max(follower.log_start_offset, leader.log_start_offset)
    assert log_bytes(follower, start) == log_bytes(leader, start)
    if follower.log_start_offset == leader.log_start_offset:
        assert epochs_with_data(follower) == epochs_with_data(leader)


def epochs_with_data(log: Log) -> list[tuple[int, int]]:
    """The epoch cache without a trailing epoch that has no batches yet (a leader assigns its
    epoch when elected; a follower learns it from the first batch)."""
    return [(e, start) for e, start in log.epoch_cache.entries if start < log.log_end_offset]
