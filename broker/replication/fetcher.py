"""Follower fetching: pull a leader's log, one fetcher per leader broker.

A partition enters a fetcher *truncating*: before fetching, the follower asks the leader
(OffsetsForLeaderEpoch) where its latest epoch ends in the leader's log, and truncates its
own log there, so it drops exactly what the leader never had (never blindly to its HW). If
the leader does not know that epoch, it answers with the largest epoch below it; the
follower then truncates to its own end of that epoch and asks again. Only then does the
partition move to *fetching*: each round sends one Fetch for all fetching partitions with
fetch offset = the follower's LEO; the leader answers with batches (up to its LEO) and its
HW; the follower appends them as they are and sets HW = min(leader HW, own LEO). Each Fetch
carries the follower's broker epoch (its registration in ZooKeeper, read when the request is
built): the leader serves a follower fetch only with that broker's current epoch.

A partition whose log dir fails here (``LogDirFailure``: a write, a truncation, a checkpoint
met an OSError) leaves the fetcher at once, the other partitions going on; the replica
manager takes the dir offline (``on_dir_failure``).

The fetcher is written against ``LeaderEndpoint`` so it can be driven by an in-memory
leader in tests; ``RemoteLeaderEndpoint`` is the real one over a broker channel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Protocol

import trio

from tidelog.broker.log.log import Log, LogDirFailure
from tidelog.broker.replication.throttle import ReplicationQuota
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NONE, OFFSET_OUT_OF_RANGE, CorruptRecordError, TidelogError, for_code
from tidelog.protocol.messages import (
    FetchPartition,
    FetchRequest,
    FetchResponse,
    FetchTopic,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
)
from tidelog.protocol.records import read_header
from tidelog.protocol.throttles import is_throttled
from tidelog.protocol.topics import TopicPartition

logger = logging.getLogger("tidelog.fetcher")


class LeaderEndpoint(Protocol):
    async def fetch(self, request: FetchRequest) -> FetchResponse: ...

    async def offsets_for_leader_epoch(self, request: OffsetsForLeaderEpochRequest) -> OffsetsForLeaderEpochResponse: ...


class RemoteLeaderEndpoint:
    """The leader over the network (a BrokerChannel)."""

    def __init__(self, channel, timeout_s: float):
        self.channel = channel
        self.timeout_s = timeout_s

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        return await self.channel.request(ApiKey.FETCH, request, self.timeout_s + request.max_wait_ms / 1000)

    async def offsets_for_leader_epoch(self, request):
        return await self.channel.request(ApiKey.OFFSETS_FOR_LEADER_EPOCH, request, self.timeout_s)


# how long a fetcher whose every partition is held by its throttle waits before trying again
THROTTLE_WAIT_S = 0.1

@dataclass
class FetchState:
    leader_epoch: int  # the leader epoch this broker follows under
    truncating: bool = True
    retry_at: float = 0.0  # trio time before which the partition is skipped (after an error)
    # records behind: the leader's HW at the last fetch minus our LEO (Kafka's fetcher lag);
    # -1 before the first answer (not known to be in sync: a throttle applies)
    lag: int = -1


@dataclass(frozen=True)
class FetcherConfig:
    replica_id: int
    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 10 << 20
    partition_max_bytes: int = 1 << 20
    backoff_s: float = 1.0


@dataclass
class ReplicaFetcher:
    leader_id: int
    endpoint: LeaderEndpoint
    log_of: Callable[[TopicPartition], Log | None]
    config: FetcherConfig
    broker_epoch: Callable[[], int] = lambda: -1  # this broker's, now (it changes on re-registration)
    # follower.replication.throttled.rate (broker/replication/throttle.py); None: never throttled
    quota: ReplicationQuota | None = None
    # a partition's log dir failed: the replica manager takes it offline (handle_dir_failures)
    on_dir_failure: Callable[[], None] = lambda: None
    partitions: dict[TopicPartition, FetchState] = field(default_factory=dict)
    _changed: trio.Event = field(default_factory=trio.Event)

    def add_partitions(self, epochs: dict[TopicPartition, int]) -> None:
        for tp, epoch in epochs.items():
            self.partitions[tp] = FetchState(epoch)
        self._wake()

    def remove_partitions(self, tps) -> None:
        for tp in tps:
            self.partitions.pop(tp, None)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            if not self._active():
                await self._wait_for_work()
                continue
            try:
                await self.maybe_truncate()
                await self.fetch_once()
            except TidelogError as e:
                logger.info("fetcher for leader %d: %s; backing off", self.leader_id, e)
                await trio.sleep(self.config.backoff_s)

    def _active(self) -> dict[TopicPartition, FetchState]:
        now = trio.current_time()
        return {tp: st for tp, st in self.partitions.items() if st.retry_at <= now}

    async def _wait_for_work(self) -> None:
        changed = self._changed
        pending = [st.retry_at for st in self.partitions.values()]
        with trio.move_on_at(min(pending) if pending else trio.current_time() + 3600):
            await changed.wait()

    def _dir_failed(self, tp: TopicPartition, e: LogDirFailure) -> None:
        """``tp``'s log dir failed under the fetcher: it is fetched no more (until a LeaderAndIsr
        adds it again, which an offline replica refuses), the others go on."""
        logger.error("%s: no longer fetched from leader %d: %s", tp, self.leader_id, e)
        self.partitions.pop(tp, None)
        self.on_dir_failure()

    def _delay(self, tp: TopicPartition) -> None:
        st = self.partitions.get(tp)
        if st is not None:
            st.retry_at = trio.current_time() + self.config.backoff_s

    # -- truncation ----------------------------------------------------------------------------

    async def maybe_truncate(self) -> None:
        todo = {tp: st for tp, st in self._active().items() if st.truncating}
        if not todo:
            return
        request = self._epoch_request(todo)
        response = await self.endpoint.offsets_for_leader_epoch(request)
        for t in response.topics:
            for r in t.partitions:
                tp = TopicPartition(t.topic, r.partition)
                if tp in todo:
                    try:
                        self._apply_epoch_answer(tp, r, todo[tp])
                    except LogDirFailure as e:
                        self._dir_failed(tp, e)

    def _epoch_request(self, todo: dict[TopicPartition, FetchState]) -> OffsetsForLeaderEpochRequest:
        by_topic: dict[str, list[OffsetForLeaderPartition]] = {}
        for tp, st in todo.items():
            log = self.log_of(tp)
            epoch = log.latest_epoch if log is not None else -1
            by_topic.setdefault(tp.topic, []).append(OffsetForLeaderPartition(tp.partition, epoch, st.leader_epoch))
        return OffsetsForLeaderEpochRequest([OffsetForLeaderTopic(t, ps) for t, ps in by_topic.items()],
                                            replica_id=self.config.replica_id)

    def _apply_epoch_answer(self, tp: TopicPartition, r, asked: FetchState) -> None:
        st, log = self.partitions.get(tp), self.log_of(tp)
        if st is not asked or log is None or not st.truncating:
            return  # removed, or added again (another epoch) while the question was out
        if r.error_code != NONE.code:
            logger.info("%s: OffsetsForLeaderEpoch failed: %s", tp, for_code(r.error_code).name)
            self._delay(tp)
            return
        target, done = truncation_target(log, r.leader_epoch, r.end_offset)
        if target < log.log_end_offset:
            logger.info("%s: truncating to offset %d (leader epoch %d ends at %d)",
                        tp, target, r.leader_epoch, r.end_offset)
            truncate_follower(tp, log, target)
        # an epoch this broker led without writing starts at its LEO: no batch of ours is in
        # it, so drop it, or we would ask about it forever, and refuse the leader's batches of
        # older epochs that belong there
        log.truncate_epochs_from_end(log.log_end_offset)
        st.truncating = not done

    # -- fetching ------------------------------------------------------------------------------

    async def fetch_once(self) -> None:
        todo = {tp: st for tp, st in self._active().items() if not st.truncating}
        if not todo:
            return
        request = self._fetch_request(todo)
        if not request.topics:  # every partition waits for the throttle's bucket to refill
            await trio.sleep(THROTTLE_WAIT_S)
            return
        response = await self.endpoint.fetch(request)
        for t in response.responses:
            for p in t.partitions:
                tp = TopicPartition(t.topic, p.partition_index)
                try:
                    self._apply_fetch(tp, p, todo)
                except LogDirFailure as e:
                    self._dir_failed(tp, e)

    def _fetch_request(self, todo: dict[TopicPartition, FetchState]) -> FetchRequest:
        by_topic: dict[str, list[FetchPartition]] = {}
        holding = self.quota is not None and self.quota.exceeded(trio.current_time())
        for tp, st in todo.items():
            log = self.log_of(tp)
            if log is None or (holding and self._throttled(tp, st, log)):
                continue
            by_topic.setdefault(tp.topic, []).append(FetchPartition(
                tp.partition, log.log_end_offset, self.config.partition_max_bytes,
                current_leader_epoch=st.leader_epoch, last_fetched_epoch=log.latest_epoch,
                log_start_offset=log.log_start_offset))
        c = self.config
        return FetchRequest([FetchTopic(t, ps) for t, ps in by_topic.items()], replica_id=c.replica_id,
                            max_wait_ms=c.max_wait_ms, min_bytes=c.min_bytes, max_bytes=c.max_bytes,
                            replica_epoch=self.broker_epoch())

    def _throttled(self, tp: TopicPartition, st: FetchState, log: Log) -> bool:
        """A replica listed in follower.replication.throttled.replicas that is behind (the
        follower's view of "not in sync": the leader's HW was above its LEO last time)."""
        return st.lag != 0 and is_throttled(log.config.follower_replication_throttled_replicas, tp.partition,
                                           self.config.replica_id)

    def _apply_fetch(self, tp: TopicPartition, p, sent: dict[TopicPartition, FetchState]) -> None:
        st, log = self.partitions.get(tp), self.log_of(tp)
        if st is None or log is None or st is not sent.get(tp) or st.truncating:
            return  # removed or re-added while the fetch was in flight
        if p.error_code == OFFSET_OUT_OF_RANGE.code:
            self._out_of_range(tp, log, p)
            return
        if p.error_code != NONE.code:
            logger.info("%s: fetch from leader %d failed: %s", tp, self.leader_id, for_code(p.error_code).name)
            self._delay(tp)
            return
        try:
            if p.records:
                if self.quota is not None and self._throttled(tp, st, log):
                    self.quota.record(len(p.records), trio.current_time())
                _maybe_restart_at_first_batch(tp, log, p.records)
                log.append_as_follower(p.records)
                # to the end of the next request, as Kafka's fetcher does: only the first
                # partition with data may exceed its max bytes, and the response's budget is
                # spent in request order, so a fixed order starves the partitions behind
                self.partitions[tp] = self.partitions.pop(tp)
        except LogDirFailure:
            raise
        except TidelogError as e:
            logger.error("%s: cannot append the leader's batches: %s", tp, e)
            st.truncating = True
            self._delay(tp)
            return
        log.update_high_watermark(min(p.high_watermark, log.log_end_offset))
        st.lag = max(0, p.high_watermark - log.log_end_offset)
        # follow the leader's log start, as Kafka's follower does: what we hold below it may
        # have diverged from what the leader held there, and must not be served as the log
        if p.log_start_offset > log.log_start_offset:
            log.maybe_increment_log_start_offset(min(p.log_start_offset, log.high_watermark))

    def _out_of_range(self, tp: TopicPartition, log: Log, p) -> None:
        if p.log_start_offset >= 0 and log.log_end_offset < p.log_start_offset:
            logger.warning("%s: log end %d is below the leader's log start %d; restarting the log there",
                           tp, log.log_end_offset, p.log_start_offset)
            log.truncate_fully_and_start_at(p.log_start_offset)
        elif 0 <= p.high_watermark < log.log_end_offset:
            # not below the leader's log start, so beyond its LEO: the leader's log is shorter
            # than ours (our truncation fell back to an offset it does not have). Kafka cuts to
            # the leader's LEO; its HW, at or below it, is what the answer tells us
            logger.warning("%s: log end %d is beyond leader %d's log end; truncating to its high watermark %d",
                           tp, log.log_end_offset, self.leader_id, p.high_watermark)
            truncate_follower(tp, log, p.high_watermark)
        else:
            self.partitions[tp].truncating = True


def _maybe_restart_at_first_batch(tp: TopicPartition, log: Log, records: bytes) -> None:
    """An empty log whose start falls inside the leader's first batch (our start came from our
    own, diverged, segments) restarts at that batch, as Kafka's follower does on
    UnexpectedAppendOffsetException: the batch cannot be split, and refetching cannot help."""
    first = read_header(records)
    if log.log_end_offset == log.log_start_offset and first.base_offset < log.log_end_offset <= first.last_offset:
        logger.info("%s: the leader's batch at %d starts below our empty log's start %d; restarting the log there",
                    tp, first.base_offset, log.log_start_offset)
        log.truncate_fully_and_start_at(first.base_offset)


def truncate_follower(tp: TopicPartition, log: Log, offset: int) -> None:
    """A follower's truncation to ``offset``. Where the cut falls in damaged framing (the
    batch holding it cannot be found), more goes (``Log.truncate_damaged``): a follower
    fetches again whatever it cut, while a truncation that raised every round would stop
    every partition of its fetcher."""
    try:
        log.truncate_to(offset)
    except CorruptRecordError as e:
        logger.warning("%s: the truncation to offset %d met damaged records (%s); dropping them whole",
                       tp, offset, e)
        log.truncate_damaged(offset)


def truncation_target(log: Log, leader_epoch: int, leader_end_offset: int) -> tuple[int, bool]:
    """Where a follower truncates given the leader's answer for its latest epoch.

    Returns ``(offset, done)``. Unknown epoch on the leader: fall back to the HW. Leader
    answered with an epoch we do not have: cut to our end of that epoch and ask again.
    """
    if leader_epoch < 0 or leader_end_offset < 0:
        return log.high_watermark, True
    own_epoch, own_end = log.end_offset_for_epoch(leader_epoch)
    if own_epoch != leader_epoch:
        return (own_end if own_end >= 0 else log.high_watermark), False
    return min(leader_end_offset, own_end), True
