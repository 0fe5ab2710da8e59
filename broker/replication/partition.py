"""One partition on this broker: its role, its log, and the leader's HW/ISR bookkeeping.

The rules (Kafka's; docs/architecture.md, "HW and ISR rules")
-------------------------------------------------------------
* The leader appends producer batches, assigning offsets and its leader epoch.
* Each follower fetches from the leader with its fetch offset, which is its log end offset
  (LEO). From these fetches the leader learns every follower's LEO and when it was last
  *caught up*: a fetch at the leader's LEO means caught up now; a fetch at or beyond the LEO
  the leader had at the follower's previous fetch means it was caught up back then.
* The high watermark (HW) is the smallest LEO over the ISR (the leader included). It only
  moves while the ISR has at least the *effective* min ISR members: ``min.insync.replicas``
  capped at the number of assigned replicas (Kafka's ``effectiveMinIsr`` of KIP-966), and it
  never moves back on the leader. Consumers only see offsets below it; a record below the HW
  is on every ISR member, so any of them can become leader without losing it, and on at
  least the effective min ISR replicas. The cap is what keeps a topic whose replication
  factor is below its ``min.insync.replicas`` readable: without it, its HW could never move
  and every record written to it would stay invisible for ever.
* An acks=all produce needs ``min.insync.replicas`` in-sync replicas, uncapped (Kafka's
  NOT_ENOUGH_REPLICAS): on such a topic acks=all can never succeed, and the error says why.
* A follower leaves the ISR when it has not been caught up for ``replica.lag.time.max.ms``;
  it rejoins once its LEO reaches the HW (and the start of the current leader epoch). An ISR
  change is written to ZooKeeper before it takes effect; while the write is in flight the
  change is *pending*, and the HW is computed over the larger of the two sets, so a pending
  change can never make the HW move past a replica that might stay in the ISR.
* A follower sets its HW to min(leader HW, own LEO).
* A replica whose stored batch fails its check on disk (a bit flipped in a closed segment)
  is *damaged* from that batch on: it never serves the batch, and its broker reports it to
  the controller, which moves leadership off it and takes it out of the ISR. Only then, a
  follower outside the ISR, does it drop its log from the damaged batch on and fetch it
  again from the leader; it rejoins the ISR as any follower that caught up. Until then it
  keeps what it has: while it is in the ISR, elections and the HW count on it. A damaged
  leader with no other live replica in sync stays leader; the damaged records cannot be
  served (CORRUPT_MESSAGE when no other replica is in sync: a consumer may seek past them),
  never silently skipped. While the damage lasts it is reported
  again every ``DAMAGE_REPORT_INTERVAL_MS`` it is met (a report can be dropped, or find no
  replica in sync to hand over to); a log cut below it by other means (truncation to the
  leader) no longer holds it, and the mark goes.
* A replica whose log directory failed (an I/O error, a full disk) is *offline* on this
  broker until it restarts: it has neither a role nor a log here, and answers every produce
  and read with KAFKA_STORAGE_ERROR (retriable: a client asks for metadata again and goes to
  the leader the controller elects instead). Its broker reports it; the controller moves
  leadership off it and takes it out of the ISR, as for a broker that died.

This module decides; it does no I/O beyond the local log and reads no clock: ``now_ms`` is
passed in. The replica manager owns the awaiting (ZooKeeper writes, purgatory, fetchers).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from tidelog.broker.log.log import Log, LogAppendInfo
from tidelog.protocol.errors import (
    FENCED_LEADER_EPOCH,
    NOT_ENOUGH_REPLICAS,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_LEADER_EPOCH,
    StorageError,
    TidelogError,
)
from tidelog.protocol.messages import PartitionState
from tidelog.protocol.topics import TopicPartition, effective_min_isr

UNKNOWN_OFFSET = -1
DAMAGE_REPORT_INTERVAL_MS = 10_000


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A follower as its leader sees it. Immutable: each fetch yields a new one."""

    log_end_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = 0
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = 0
    log_start_offset: int = UNKNOWN_OFFSET  # as the follower last reported it (DeleteRecords)

    def after_fetch(self, fetch_offset: int, leader_end_offset: int, now_ms: int,
                    log_start_offset: int = UNKNOWN_OFFSET) -> "ReplicaState":
        caught_up = self.last_caught_up_time_ms
        if fetch_offset >= leader_end_offset:
            caught_up = max(caught_up, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset >= 0:
            caught_up = max(caught_up, self.last_fetch_time_ms)
        return ReplicaState(fetch_offset, caught_up, leader_end_offset, now_ms, log_start_offset)

    def is_caught_up(self, leader_end_offset: int, now_ms: int, replica_lag_time_max_ms: int) -> bool:
        return (self.log_end_offset == leader_end_offset
                or now_ms - self.last_caught_up_time_ms <= replica_lag_time_max_ms)


def high_watermark(current_hw: int, leader_leo: int, isr_leos: list[int], isr_size: int, min_isr: int) -> int:
    """The HW rule: min LEO over the ISR, only while |ISR| >= min ISR (the effective one),
    never decreasing."""
    if isr_size < min_isr:
        return current_hw
    candidate = min([leader_leo, *isr_leos])
    return max(current_hw, candidate)


def not_enough_replicas_message(tp: TopicPartition, isr: frozenset[int], replicas: list[int], min_isr: int) -> str:
    """NOT_ENOUGH_REPLICAS's text; when the replication factor itself is below min ISR it says
    that no acks=all produce can ever succeed, and what to change (replicas cannot be added:
    there is no reassignment)."""
    if len(replicas) < min_isr:
        return (f"{tp}: replication factor {len(replicas)} is below min.insync.replicas {min_isr}, so an acks=all "
                "produce can never succeed on it: lower the topic's min.insync.replicas (tidelog topics alter "
                f"{tp.topic} --config min.insync.replicas={len(replicas)}) or produce with acks=1")
    return f"{tp}: {len(isr)} in-sync replicas {sorted(isr)}, below min.insync.replicas {min_isr}"


def can_join_isr(follower_leo: int, high_watermark_: int, leader_epoch_start_offset: int) -> bool:
    return follower_leo >= high_watermark_ and follower_leo >= leader_epoch_start_offset


def check_leader_epoch(requested: int, current: int) -> None:
    """Fence a requester whose view of the leader epoch differs from ours (-1: no view)."""
    if requested < 0 or requested == current:
        return
    if requested < current:
        raise TidelogError(f"leader epoch {requested} in the request is older than {current}",
                           error=FENCED_LEADER_EPOCH)
    raise TidelogError(f"leader epoch {requested} in the request is newer than {current}",
                       error=UNKNOWN_LEADER_EPOCH)


class Partition:
    def __init__(self, tp: TopicPartition, local_broker_id: int):
        self.tp = tp
        self.local_broker_id = local_broker_id
        self.log: Log | None = None
        self.leader_id = -1
        self.leader_epoch = -1
        self.leader_epoch_start_offset = UNKNOWN_OFFSET
        self.replicas: list[int] = []
        self.adding_replicas: list[int] = []  # a reassignment's, not yet part of the replica set
        self.isr: frozenset[int] = frozenset()
        self.pending_isr: frozenset[int] | None = None  # an ISR change written but not yet confirmed
        self.isr_writes = 0  # counts ISR writes started: which one ``pending_isr`` belongs to
        self.zk_version = -1
        self.controller_epoch = -1
        self.remote: dict[int, ReplicaState] = {}
        self.damaged_from: int | None = None  # an offset of the first batch found damaged on disk
        self.damage_reported_ms: int | None = None
        self.offline: str | None = None  # why this replica is offline here: its log dir failed

    # -- role ----------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.leader_id == self.local_broker_id

    @property
    def maximal_isr(self) -> frozenset[int]:
        return self.isr | self.pending_isr if self.pending_isr is not None else self.isr

    @property
    def min_insync_replicas(self) -> int:
        return self.log.config.min_insync_replicas if self.log is not None else 1

    @property
    def effective_min_isr(self) -> int:
        """The ISR size the HW needs to move: min.insync.replicas, at most the replica count
        less the replicas a reassignment is adding (until they join, the partition has the
        replicas it had: raising the replication factor must not hold records invisible for
        the length of the copy)."""
        return effective_min_isr(self.min_insync_replicas, len(self.replicas) - len(self.adding_replicas))

    @property
    def high_watermark_held(self) -> bool:
        """Leader side: the maximal ISR is below the effective min ISR, so the HW cannot move."""
        return len(self.maximal_isr) < self.effective_min_isr

    def _apply_state(self, st: PartitionState) -> bool:
        """Adopt the controller's state; returns True when the leader epoch changed.

        In the same leader epoch, a state no newer than the one held (its znode version at
        or below ours: a new controller's resend of what it read before this leader changed
        the ISR) keeps the ISR this leader wrote, its version and any write of it in flight:
        adopting it would put the leader back on an ISR ZooKeeper no longer holds, one whose
        HW ignores a member the controller may elect. Its replicas are taken all the same."""
        changed = st.leader_epoch != self.leader_epoch
        known = not changed and 0 <= st.zk_version <= self.zk_version
        self.leader_id, self.leader_epoch = st.leader, st.leader_epoch
        self.replicas = list(st.replicas)
        self.adding_replicas = [r for r in st.adding_replicas if r in st.replicas]
        # an ISR member that is not a replica (a state written before a reassignment dropped
        # it) is out of sync here: its fetches no longer count, so it must not hold the HW
        if known:
            self.isr = frozenset(r for r in self.isr if r in st.replicas)
        else:
            self.pending_isr = None
            self.isr = frozenset(r for r in st.isr if r in st.replicas)
            self.zk_version = st.zk_version
        self.controller_epoch = st.controller_epoch
        return changed

    def make_leader(self, st: PartitionState, log: Log, now_ms: int) -> bool:
        """Become (or stay) leader. The epoch's start offset is our LEO: everything we hold
        was written under earlier epochs."""
        was_leader = self.is_leader
        self.log = log
        epoch_changed = self._apply_state(st)
        if epoch_changed or not was_leader:
            self.leader_epoch_start_offset = log.log_end_offset
            log.assign_epoch(self.leader_epoch, log.log_end_offset)
            self.remote = {}
        # a reassignment changes the replicas: those kept keep what their fetches told
        self.remote = {r: self.remote.get(r) or ReplicaState(last_caught_up_time_ms=now_ms if r in self.isr else 0)
                       for r in self.replicas if r != self.local_broker_id}
        self.maybe_increment_high_watermark()
        return not was_leader or epoch_changed

    def make_follower(self, st: PartitionState, log: Log) -> bool:
        was_follower = not self.is_leader and self.leader_id >= 0
        self.log = log
        changed = self._apply_state(st)
        self.remote = {}
        self.leader_epoch_start_offset = UNKNOWN_OFFSET
        if self.damage is not None and self.local_broker_id not in self.isr:
            log.truncate_damaged(self.damage)
            self.damaged_from = self.damage_reported_ms = None
        return changed or not was_follower

    @property
    def damage(self) -> int | None:
        """The offset this replica was found damaged at, while its log still holds it."""
        if self.damaged_from is not None and (self.log is None or self.log.log_end_offset <= self.damaged_from):
            self.damaged_from = self.damage_reported_ms = None
        return self.damaged_from

    def mark_damaged(self, offset: int, now_ms: int) -> bool:
        """The batch holding ``offset`` failed its check on disk; True when the damage is to
        be reported: the first time, and again once DAMAGE_REPORT_INTERVAL_MS passed."""
        known = self.damage
        self.damaged_from = offset if known is None else min(offset, known)
        if known is not None and now_ms - self.damage_reported_ms < DAMAGE_REPORT_INTERVAL_MS:
            return False
        self.damage_reported_ms = now_ms
        return True

    def go_offline(self, reason: str) -> None:
        """This replica's log dir failed (``reason``): no role and no log here until the broker
        restarts (the controller elects elsewhere)."""
        self.offline = reason
        self.log = None
        self.leader_id = -1
        self.remote = {}
        self.pending_isr = None
        self.damaged_from = self.damage_reported_ms = None

    def offline_error(self) -> StorageError:
        return StorageError(f"broker {self.local_broker_id}: the replica of {self.tp} is offline: {self.offline}")

    # -- leader --------------------------------------------------------------------------------

    def _leader_log(self, requested_epoch: int = -1) -> Log:
        if not self.is_leader or self.log is None:
            if self.offline is not None:
                raise self.offline_error()
            raise TidelogError(f"broker {self.local_broker_id} is not the leader of {self.tp} "
                               f"(leader is {self.leader_id})", error=NOT_LEADER_OR_FOLLOWER)
        check_leader_epoch(requested_epoch, self.leader_epoch)
        return self.log

    def append_as_leader(self, records: bytes, required_acks: int) -> LogAppendInfo:
        log = self._leader_log()
        if required_acks == -1 and len(self.isr) < self.min_insync_replicas:
            raise TidelogError(not_enough_replicas_message(self.tp, self.isr, self.replicas, self.min_insync_replicas),
                               error=NOT_ENOUGH_REPLICAS)
        info = log.append_as_leader(records, self.leader_epoch)
        self.maybe_increment_high_watermark()
        return info

    def maybe_increment_high_watermark(self) -> bool:
        """Recompute the HW over the maximal ISR; True if it moved."""
        if not self.is_leader or self.log is None:
            return False
        isr = self.maximal_isr
        followers = [self.remote.get(r, ReplicaState()).log_end_offset for r in isr if r != self.local_broker_id]
        new_hw = high_watermark(self.log.high_watermark, self.log.log_end_offset, followers,
                                len(isr), self.effective_min_isr)
        if new_hw != self.log.high_watermark:
            self.log.update_high_watermark(new_hw)
            return True
        return False

    def record_follower_fetch(self, follower_id: int, fetch_offset: int, now_ms: int,
                              log_start_offset: int = UNKNOWN_OFFSET) -> bool:
        """Update a follower's state from its fetch; True if the HW or the follower's log
        start offset (what ``low_watermark`` waits for) moved."""
        before = self.remote.get(follower_id)
        if before is None:
            return False
        self.remote[follower_id] = before.after_fetch(fetch_offset, self.log.log_end_offset, now_ms,
                                                      log_start_offset)
        return self.maybe_increment_high_watermark() or log_start_offset != before.log_start_offset

    def low_watermark(self, live_brokers: Container[int] | None = None) -> int:
        """Kafka's low watermark: the smallest log start offset of the leader and of the
        followers in the ISR (as each last reported it) whose broker is alive (all, when
        ``live_brokers`` is None), so a DeleteRecords is done once every replica that could
        become leader no longer serves the deleted records. A follower that has not
        reported one yet counts as not there yet (-1)."""
        followers = [self.remote.get(r, ReplicaState()).log_start_offset for r in self.isr
                     if r != self.local_broker_id and (live_brokers is None or r in live_brokers)]
        return min([self.log.log_start_offset, *followers])

    def isr_to_expand(self) -> frozenset[int] | None:
        """The ISR with every caught-up follower added, or None if nobody qualifies."""
        if not self.is_leader or self.pending_isr is not None or self.log is None:
            return None
        joiners = {r for r, st in self.remote.items() if r not in self.isr and r in self.replicas
                   and can_join_isr(st.log_end_offset, self.log.high_watermark, self.leader_epoch_start_offset)}
        return self.isr | joiners if joiners else None

    def isr_to_shrink(self, now_ms: int, replica_lag_time_max_ms: int) -> frozenset[int] | None:
        """The ISR without followers that fell behind for too long, or None."""
        if not self.is_leader or self.pending_isr is not None or self.log is None:
            return None
        leo = self.log.log_end_offset
        out = {r for r in self.isr if r != self.local_broker_id and r in self.remote
               and not self.remote[r].is_caught_up(leo, now_ms, replica_lag_time_max_ms)}
        return self.isr - out if out else None

    # -- reads ---------------------------------------------------------------------------------

    def local_log(self, requested_epoch: int = -1) -> Log:
        """This replica's own log, leader or follower (Kafka's ``localLogWithEpochOrThrow``
        with requireLeader false: ListOffsets from the debugging replica id)."""
        if self.log is None:
            if self.offline is not None:
                raise self.offline_error()
            raise TidelogError(f"broker {self.local_broker_id} has no replica of {self.tp}",
                               error=NOT_LEADER_OR_FOLLOWER)
        check_leader_epoch(requested_epoch, self.leader_epoch)
        return self.log

    def fetch_log(self, current_leader_epoch: int, from_follower: bool, replica_id: int = -1) -> Log:
        """The log to read for a fetch: the leader's (fencing stale epochs). A follower's
        fetch (read up to the LEO, and the follower's LEO recorded for the HW and the ISR)
        must come from one of this partition's followers: any other replica id is refused
        (Kafka's ``followerReplicaOrThrow``), so it is never served above the HW."""
        log = self._leader_log(current_leader_epoch)
        if from_follower and not self.is_follower(replica_id):
            raise TidelogError(f"{self.tp}: the leader cannot accept a fetch from replica {replica_id}: it is not "
                               f"one of the followers of the assigned replicas {self.replicas}",
                               error=NOT_LEADER_OR_FOLLOWER)
        return log

    def is_follower(self, replica_id: int) -> bool:
        """Whether ``replica_id`` is an assigned replica other than this one (leader side)."""
        return replica_id != self.local_broker_id and replica_id in self.remote

    def __repr__(self) -> str:
        return (f"Partition({self.tp}, leader={self.leader_id}, epoch={self.leader_epoch}, "
                f"isr={sorted(self.isr)}, replicas={self.replicas})")
