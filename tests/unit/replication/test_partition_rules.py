"""The leader's HW/ISR rules (docs/architecture.md, "HW and ISR rules"; Kafka's Replica.isCaughtUp and
Partition.maybeIncrementLeaderHW): the pure functions by table, then a real ``Partition`` over a
real log driven by Hypothesis through appends, follower fetches, ISR shrinks and expands
(pending, then confirmed or refused, as the replica manager does around its ZooKeeper write)
and leader epoch bumps, checking the invariants that keep acknowledged records safe.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.unit.log.helpers import TP, FakeClock, make_batch
from tests.unit.replication.memory_leader import scratch_dir
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.loader import load_log
from tidelog.broker.replication.partition import (
    Partition,
    ReplicaState,
    can_join_isr,
    check_leader_epoch,
    high_watermark,
)
from tidelog.protocol.errors import (
    FENCED_LEADER_EPOCH,
    NOT_ENOUGH_REPLICAS,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_LEADER_EPOCH,
    TidelogError,
)
from tidelog.protocol.messages import PartitionState
from tidelog.protocol.topics import effective_min_isr

LAG_MS = 10_000
LEADER, F1, F2 = 0, 1, 2
REPLICAS = [LEADER, F1, F2]


# -- ReplicaState: when a follower is caught up -------------------------------------------------


@pytest.mark.parametrize("fetches, expected", [
    # (fetch offset, leader LEO at the fetch, now) ... -> (LEO, last caught up, last leader LEO, last fetch)
    ([(10, 10, 100)], (10, 100, 10, 100)),  # at the leader's LEO: caught up now
    ([(12, 10, 100)], (12, 100, 10, 100)),  # beyond it (the leader never serves that, but >= counts)
    ([(5, 10, 100)], (5, 0, 10, 100)),  # behind, no previous fetch: never caught up
    ([(5, 10, 100), (10, 15, 200)], (10, 100, 15, 200)),  # reached the LEO of the previous fetch:
    ([(5, 10, 100), (12, 15, 200)], (12, 100, 15, 200)),  #   caught up as of that fetch
    ([(5, 10, 100), (9, 15, 200)], (9, 0, 15, 200)),  # still behind the previous LEO
    ([(10, 10, 100), (12, 20, 200), (14, 30, 300)], (14, 100, 30, 300)),  # falling behind: stays 100
    ([(10, 10, 100), (12, 20, 200), (20, 30, 300)], (20, 200, 30, 300)),
    ([(10, 10, 500), (10, 10, 300)], (10, 500, 10, 300)),  # the caught-up time never goes back
])
def test_after_fetch(fetches, expected):
    s = ReplicaState()
    for offset, leader_leo, now in fetches:
        s = s.after_fetch(offset, leader_leo, now)
    assert (s.log_end_offset, s.last_caught_up_time_ms, s.last_fetch_leader_log_end_offset,
            s.last_fetch_time_ms) == expected


def test_after_fetch_returns_a_new_state():
    s = ReplicaState()
    t = s.after_fetch(3, 3, 7)
    assert s == ReplicaState() and t is not s
    with pytest.raises(AttributeError):
        t.log_end_offset = 4  # type: ignore[misc]


@pytest.mark.parametrize("leo, caught_up_ms, leader_leo, now, caught_up", [
    (10, 0, 10, 10**9, True),  # at the leader's LEO: caught up whatever the time
    (9, 1000, 10, 1000 + LAG_MS, True),  # behind, but caught up within the lag
    (9, 1000, 10, 1001 + LAG_MS, False),
    (-1, 0, 0, LAG_MS + 1, False),  # never fetched
    (-1, 5000, 10, 5000, True),  # never fetched, but counted caught up when it became ISR
])
def test_is_caught_up(leo, caught_up_ms, leader_leo, now, caught_up):
    s = ReplicaState(log_end_offset=leo, last_caught_up_time_ms=caught_up_ms)
    assert s.is_caught_up(leader_leo, now, LAG_MS) is caught_up


# -- the HW rule, joining the ISR, epoch fencing ------------------------------------------------


@pytest.mark.parametrize("current, leader_leo, follower_leos, isr_size, min_isr, expected", [
    (0, 10, [5, 7], 3, 1, 5),  # the smallest LEO over the ISR
    (0, 10, [12], 2, 1, 10),  # the leader's LEO bounds it
    (0, 10, [], 1, 1, 10),  # a lone leader
    (6, 10, [5], 2, 1, 6),  # never decreases
    (0, 10, [5], 2, 3, 0),  # ISR below min.insync.replicas: frozen
    (4, 10, [10, 10], 2, 3, 4),
    (3, 10, [8], 2, 2, 8),  # exactly min.insync.replicas: moves
    (0, 10, [-1, 9], 3, 1, 0),  # a member whose LEO is not known yet holds it
    (2, 10, [-1, 9], 3, 1, 2),
])
def test_high_watermark(current, leader_leo, follower_leos, isr_size, min_isr, expected):
    assert high_watermark(current, leader_leo, follower_leos, isr_size, min_isr) == expected


@pytest.mark.parametrize("follower_leo, hw, epoch_start, joins", [
    (10, 10, 5, True),
    (11, 10, 5, True),
    (9, 10, 5, False),  # below the HW
    (10, 10, 11, False),  # below the start of the leader's epoch
    (12, 10, 12, True),
    (-1, 0, 0, False),  # never fetched
    (0, 0, 0, True),
])
def test_can_join_isr(follower_leo, hw, epoch_start, joins):
    assert can_join_isr(follower_leo, hw, epoch_start) is joins


@pytest.mark.parametrize("requested, current, error", [
    (-1, 5, None),  # no view: not fenced
    (5, 5, None),
    (4, 5, FENCED_LEADER_EPOCH),
    (0, 5, FENCED_LEADER_EPOCH),
    (6, 5, UNKNOWN_LEADER_EPOCH),
    (0, -1, UNKNOWN_LEADER_EPOCH),
])
def test_check_leader_epoch(requested, current, error):
    if error is None:
        assert check_leader_epoch(requested, current) is None
    else:
        with pytest.raises(TidelogError) as e:
            check_leader_epoch(requested, current)
        assert e.value.error is error


# -- Partition, deterministic --------------------------------------------------------------------


def state(epoch: int, isr, leader: int = LEADER, zk_version: int = 0) -> PartitionState:
    return PartitionState(TP.topic, TP.partition, 1, leader, epoch, sorted(isr), zk_version, REPLICAS)


@pytest.fixture
def leader(tmp_path):
    """A partition leading on a real log: factory of (partition, log) by min ISR and ISR."""
    logs = []

    def make(min_isr: int = 1, isr=(LEADER, F1, F2), now: int = 1000) -> tuple[Partition, object]:
        log = load_log(str(tmp_path / f"log-{len(logs)}"), TP, LogConfig(min_insync_replicas=min_isr))
        logs.append(log)
        p = Partition(TP, LEADER)
        p.make_leader(state(0, isr), log, now)
        return p, log
    yield make
    for log in logs:
        log.close()


def test_a_resent_state_older_than_the_leaders_own_isr_write_does_not_undo_it(leader):
    """A new controller resends, in the same leader epoch, a state it read before this leader
    expanded its ISR (znode version 10, the leader's write made it 11): the leader keeps the
    ISR ZooKeeper holds, its version, and a write in flight; it takes the replicas."""
    p, log = leader(isr=(LEADER, F1))
    p.make_leader(state(0, [LEADER, F1], zk_version=10), log, 1000)
    p.isr, p.zk_version = frozenset({LEADER, F1, F2}), 11  # its expansion, written
    p.make_leader(state(0, [LEADER, F1], zk_version=10), log, 2000)
    assert (p.isr, p.zk_version) == ({LEADER, F1, F2}, 11)
    p.pending_isr = frozenset({LEADER, F1})  # a shrink in flight, expecting version 11
    p.make_leader(state(0, [LEADER, F1, F2], zk_version=11), log, 3000)
    assert p.pending_isr == {LEADER, F1} and p.zk_version == 11
    p.make_leader(state(0, [LEADER, F1], zk_version=12), log, 4000)  # newer: adopted
    assert (p.isr, p.zk_version, p.pending_isr) == ({LEADER, F1}, 12, None)
    p.make_leader(state(1, [LEADER], zk_version=5), log, 5000)  # a new epoch: adopted whatever its version
    assert (p.isr, p.zk_version) == ({LEADER}, 5)


def test_make_leader_starts_its_epoch_at_the_log_end(leader):
    p, log = leader(isr=(LEADER, F1))
    p.append_as_leader(make_batch(3), 1)
    assert p.make_leader(state(1, [LEADER, F1]), log, 5000)
    assert p.leader_epoch_start_offset == 3 and log.epoch_cache.entries == [(0, 0), (1, 3)]
    assert p.remote[F1] == ReplicaState(last_caught_up_time_ms=5000)  # ISR: counted caught up now
    assert p.remote[F2] == ReplicaState(last_caught_up_time_ms=0)
    p.record_follower_fetch(F1, 3, 6000)
    assert not p.make_leader(state(1, [LEADER, F1], zk_version=1), log, 7000)  # same epoch: no reset
    assert p.remote[F1].log_end_offset == 3 and p.leader_epoch_start_offset == 3


def test_hw_waits_for_every_isr_member(leader):
    p, log = leader()
    p.append_as_leader(make_batch(4), -1)
    assert log.high_watermark == 0
    assert not p.record_follower_fetch(F1, 4, 1100)
    assert p.record_follower_fetch(F2, 2, 1100)
    assert log.high_watermark == 2
    assert p.record_follower_fetch(F2, 4, 1200) and log.high_watermark == 4


def test_the_low_watermark_waits_for_the_log_start_of_every_isr_follower(leader):
    p, log = leader(isr=(LEADER, F1, F2))
    p.append_as_leader(make_batch(6), -1)
    for f in (F1, F2):
        p.record_follower_fetch(f, 6, 1000, log_start_offset=0)
    assert log.high_watermark == 6 and p.low_watermark() == 0
    assert log.maybe_increment_log_start_offset(4) and p.low_watermark() == 0  # the followers still start at 0
    assert not p.record_follower_fetch(F1, 6, 1100, log_start_offset=0)  # nothing moved
    assert p.record_follower_fetch(F1, 6, 1200, log_start_offset=4)  # its log start moved: waiters wake
    assert p.low_watermark() == 0
    assert p.record_follower_fetch(F2, 6, 1200, log_start_offset=4) and p.low_watermark() == 4
    p.isr = frozenset({LEADER, F1})  # a follower outside the ISR is not waited for
    p.record_follower_fetch(F1, 6, 1300, log_start_offset=5)
    assert p.low_watermark() == 4  # the leader's own log start bounds it
    p.isr = frozenset({LEADER, F1, F2})
    p.record_follower_fetch(F2, 6, 1400, log_start_offset=3)
    assert p.low_watermark() == 3 and p.low_watermark(live_brokers={LEADER, F1}) == 4  # F2's broker is dead


def test_acks_all_needs_min_isr_at_append_time(leader):
    p, log = leader(min_isr=2, isr=(LEADER,))
    with pytest.raises(TidelogError) as e:
        p.append_as_leader(make_batch(), -1)
    assert e.value.error is NOT_ENOUGH_REPLICAS and log.log_end_offset == 0
    p.append_as_leader(make_batch(), 1)  # acks=1 does not care
    p.append_as_leader(make_batch(), 0)
    assert log.log_end_offset == 2 and log.high_watermark == 0  # frozen below min ISR
    p.record_follower_fetch(F1, 2, 2000)
    assert p.isr_to_expand() == {LEADER, F1}
    p.isr = frozenset({LEADER, F1})
    p.maybe_increment_high_watermark()
    assert log.high_watermark == 2
    p.append_as_leader(make_batch(), -1)


@pytest.mark.parametrize("min_isr, replicas, expected", [
    (2, 3, 2), (2, 2, 2), (2, 1, 1), (3, 2, 2), (1, 3, 1), (5, 0, 1)])
def test_effective_min_isr_is_min_isr_capped_at_the_replica_count(min_isr, replicas, expected):
    assert effective_min_isr(min_isr, replicas) == expected


def test_a_single_replica_below_min_isr_still_advances_its_hw(tmp_path):
    """Replication factor 1 with min.insync.replicas 2 (the broker default a cluster sets):
    acks=1 records become readable at once (the HW follows the one replica, as in Kafka), and
    acks=all is refused with NOT_ENOUGH_REPLICAS naming both numbers and the way out."""
    log = load_log(str(tmp_path / "log"), TP, LogConfig(min_insync_replicas=2))
    try:
        p = Partition(TP, LEADER)
        p.make_leader(PartitionState(TP.topic, TP.partition, 1, LEADER, 0, [LEADER], 0, [LEADER]), log, 1000)
        assert p.effective_min_isr == 1 and not p.high_watermark_held
        p.append_as_leader(make_batch(2), 1)
        assert (log.log_end_offset, log.high_watermark) == (2, 2)
        with pytest.raises(TidelogError) as e:
            p.append_as_leader(make_batch(), -1)
        assert e.value.error is NOT_ENOUGH_REPLICAS and log.log_end_offset == 2
        assert "replication factor 1 is below min.insync.replicas 2" in str(e.value)
        assert "min.insync.replicas=1" in str(e.value)
    finally:
        log.close()


def test_replicas_being_added_do_not_raise_the_min_isr_the_hw_needs(tmp_path):
    """A reassignment from one replica to two (min.insync.replicas 2): until the new replica
    has caught up and joined, the HW follows the one replica it had, as before the move;
    records acknowledged with acks=1 do not turn invisible for the length of the copy."""
    log = load_log(str(tmp_path / "log"), TP, LogConfig(min_insync_replicas=2))
    try:
        p = Partition(TP, LEADER)
        moving = PartitionState(TP.topic, TP.partition, 1, LEADER, 1, [LEADER], 0, [LEADER, F1],
                                adding_replicas=[F1])
        p.make_leader(moving, log, 1000)
        assert p.effective_min_isr == 1 and not p.high_watermark_held
        p.append_as_leader(make_batch(2), 1)
        assert log.high_watermark == 2
        done = PartitionState(TP.topic, TP.partition, 1, LEADER, 2, [LEADER], 1, [LEADER, F1])
        p.make_leader(done, log, 2000)  # the move done, the new replica out of sync: held again
        assert p.effective_min_isr == 2 and p.high_watermark_held
    finally:
        log.close()


def test_the_hw_is_held_while_the_isr_is_below_min_isr(leader):
    p, log = leader(min_isr=2, isr=(LEADER,))
    assert p.high_watermark_held
    p.record_follower_fetch(F1, 0, 2000)
    p.isr = frozenset({LEADER, F1})
    assert not p.high_watermark_held


def test_a_follower_cannot_append_or_serve(leader):
    p, log = leader()
    p.make_follower(state(1, REPLICAS, leader=F1), log)
    with pytest.raises(TidelogError) as e:
        p.append_as_leader(make_batch(), 1)
    assert e.value.error is NOT_LEADER_OR_FOLLOWER
    with pytest.raises(TidelogError):
        p.fetch_log(1, from_follower=True)
    assert p.isr_to_expand() is None and p.isr_to_shrink(10**9, LAG_MS) is None
    assert not p.record_follower_fetch(F2, 0, 0) and not p.maybe_increment_high_watermark()


def test_shrink_and_expand(leader):
    p, log = leader(now=1000)
    p.append_as_leader(make_batch(2), 1)
    p.record_follower_fetch(F1, 2, 2000)  # caught up at 2000
    p.record_follower_fetch(F2, 0, 2000)  # behind since it joined (1000)
    assert p.isr_to_shrink(1000 + LAG_MS, LAG_MS) is None
    assert p.isr_to_shrink(1001 + LAG_MS, LAG_MS) == {LEADER, F1}
    assert p.isr_to_shrink(10**9, LAG_MS) == {LEADER, F1}  # F1 is at the leader's LEO
    p.append_as_leader(make_batch(1), 1)
    p.append_as_leader(make_batch(1), 1)  # [2, 4): now F1 is behind too
    assert p.isr_to_shrink(2000 + LAG_MS, LAG_MS) == {LEADER, F1}
    assert p.isr_to_shrink(2001 + LAG_MS, LAG_MS) == {LEADER}
    p.record_follower_fetch(F1, 3, 2500)  # short of the LEO, but at the LEO of its last fetch
    assert p.remote[F1].last_caught_up_time_ms == 2000
    assert p.isr_to_shrink(2001 + LAG_MS, LAG_MS) == {LEADER}
    p.isr = frozenset({LEADER, F1})
    p.maybe_increment_high_watermark()
    assert log.high_watermark == 3
    assert p.isr_to_expand() is None  # F2 is at 0, below the HW
    p.record_follower_fetch(F2, 2, 3000)
    assert p.isr_to_expand() is None  # still below
    p.record_follower_fetch(F2, 3, 3100)
    assert p.isr_to_expand() == {LEADER, F1, F2}


def test_a_pending_isr_change_counts_the_larger_set(leader):
    p, log = leader()
    p.append_as_leader(make_batch(4), 1)
    p.record_follower_fetch(F1, 4, 2000)
    p.record_follower_fetch(F2, 1, 2000)
    assert log.high_watermark == 1
    p.pending_isr = frozenset({LEADER, F1})  # shrink written, not yet confirmed
    assert p.isr_to_shrink(10**9, LAG_MS) is None and p.isr_to_expand() is None  # one change at a time
    assert not p.maybe_increment_high_watermark() and log.high_watermark == 1  # F2 may stay in
    p.isr, p.pending_isr = p.pending_isr, None
    assert p.maybe_increment_high_watermark() and log.high_watermark == 4


# -- Partition, by Hypothesis -------------------------------------------------------------------


class LeaderPartitionMachine(RuleBasedStateMachine):
    """A leader (broker 0) with two simulated followers on a real log."""

    def __init__(self):
        super().__init__()
        self.tmp = scratch_dir("tidelog-partition-")
        self.clock = FakeClock(1_000_000)
        self.log = None

    @initialize(min_isr=st.sampled_from([1, 2]), isr=st.sampled_from([[0], [0, 1], [0, 2], [0, 1, 2]]),
                segment_bytes=st.sampled_from([300, 1 << 20]))
    def start(self, min_isr, isr, segment_bytes):
        self.min_isr = min_isr
        self.log = load_log(self.tmp.name, TP, LogConfig(min_insync_replicas=min_isr, segment_bytes=segment_bytes),
                            clock=self.clock)
        self.p = Partition(TP, LEADER)
        self.epoch, self.zk_version = 0, 0
        self.p.make_leader(state(0, isr), self.log, self.clock.now_ms)
        self.fetched = {F1: 0, F2: 0}  # each follower's last fetch offset (its LEO, as the leader learns it)
        self.caught_up = {f: (self.clock.now_ms if f in isr else 0) for f in self.fetched}
        self.last_leader_leo = {F1: -1, F2: -1}
        self.last_fetch_ms = {F1: 0, F2: 0}
        self.known = {F1: -1, F2: -1}  # what this leader epoch has seen (-1: nothing yet)
        self.hw = 0
        self.unacked: list[int] = []  # last offsets of acks=all appends waiting for the HW
        self.acked: list[int] = []

    def teardown(self):
        if self.log is not None:
            self.log.close()
        self.tmp.cleanup()

    # -- rules -------------------------------------------------------------------------------------

    @rule(records=st.integers(1, 3), acks=st.sampled_from([-1, 1]))
    def append(self, records, acks):
        leo = self.log.log_end_offset
        if acks == -1 and len(self.p.isr) < self.min_isr:
            with pytest.raises(TidelogError) as e:
                self.p.append_as_leader(make_batch(records), acks)
            assert e.value.error is NOT_ENOUGH_REPLICAS
            assert self.log.log_end_offset == leo
            return
        info = self.p.append_as_leader(make_batch(records), acks)
        assert (info.first_offset, info.last_offset) == (leo, leo + records - 1)
        if acks == -1:
            self.unacked.append(info.last_offset)
        self._check_hw_rule()

    @rule(follower=st.sampled_from([F1, F2]), progress=st.one_of(st.just(1.0), st.floats(0, 1)),
          elapsed_ms=st.integers(0, LAG_MS))
    def fetch(self, follower, progress, elapsed_ms):
        """A fetch at an offset between the follower's last one and the leader's LEO: a
        follower's log only grows within a leader epoch."""
        now = self.clock.advance(elapsed_ms)
        leo, before = self.log.log_end_offset, self.log.high_watermark
        offset = self.fetched[follower] + round(progress * (leo - self.fetched[follower]))
        moved = self.p.record_follower_fetch(follower, offset, now)
        assert moved == (self.log.high_watermark != before)
        self._model_fetch(follower, offset, leo, now)
        self._check_hw_rule()

    @rule(elapsed_ms=st.integers(0, 2 * LAG_MS))
    def tick(self, elapsed_ms):
        self.clock.advance(elapsed_ms)

    @precondition(lambda self: self.p.pending_isr is None)
    @rule()
    def propose_shrink(self):
        now, leo = self.clock.now_ms, self.log.log_end_offset
        out = {f for f in self.p.isr - {LEADER}
               if not (self.known[f] == leo or now - self.caught_up[f] <= LAG_MS)}
        new = self.p.isr_to_shrink(now, LAG_MS)
        assert new == (self.p.isr - out if out else None)
        if new is not None:
            self.p.pending_isr = new

    @precondition(lambda self: self.p.pending_isr is None)
    @rule()
    def propose_expand(self):
        hw, start = self.log.high_watermark, self.p.leader_epoch_start_offset
        joiners = {f for f in self.fetched if f not in self.p.isr and self.known[f] >= max(hw, start)}
        new = self.p.isr_to_expand()
        assert new == (self.p.isr | joiners if joiners else None)
        if new is not None:
            assert all(self.fetched[f] >= hw for f in joiners)
            self.p.pending_isr = new

    @precondition(lambda self: self.p.pending_isr is not None)
    @rule(written=st.booleans())
    def finish_isr_change(self, written):
        """The ZooKeeper write returns: applied as ReplicaManager._write_isr applies it."""
        if written:
            self.zk_version += 1
            self.p.isr, self.p.pending_isr, self.p.zk_version = self.p.pending_isr, None, self.zk_version
            self.p.maybe_increment_high_watermark()
            self._check_hw_rule()
        else:
            self.p.pending_isr = None

    @rule()
    def new_leader_epoch(self):
        """The controller re-elects this leader (an epoch bump with the committed ISR)."""
        self.epoch += 1
        self.zk_version += 1
        leo = self.log.log_end_offset
        assert self.p.make_leader(state(self.epoch, self.p.isr, zk_version=self.zk_version), self.log,
                                  self.clock.now_ms)
        assert self.p.leader_epoch_start_offset == leo and self.p.pending_isr is None
        for f in self.fetched:
            self.known[f], self.last_leader_leo[f], self.last_fetch_ms[f] = -1, -1, 0
            self.caught_up[f] = self.clock.now_ms if f in self.p.isr else 0
        self._check_hw_rule()

    # -- the model ---------------------------------------------------------------------------------

    def _model_fetch(self, f: int, offset: int, leader_leo: int, now: int) -> None:
        """Kafka's caught-up rule, kept independently of ReplicaState."""
        if offset >= leader_leo:
            self.caught_up[f] = max(self.caught_up[f], now)
        elif self.last_leader_leo[f] >= 0 and offset >= self.last_leader_leo[f]:
            self.caught_up[f] = max(self.caught_up[f], self.last_fetch_ms[f])
        self.fetched[f] = self.known[f] = offset
        self.last_leader_leo[f], self.last_fetch_ms[f] = leader_leo, now

    def _check_hw_rule(self) -> None:
        """After a recomputation the HW is exactly the rule: the smallest LEO the leader knows
        over the maximal ISR, when that has at least min ISR members; else unchanged."""
        isr = self.p.maximal_isr
        if len(isr) >= self.min_isr:
            bound = min([self.log.log_end_offset, *(self.known[f] for f in isr - {LEADER})])
            assert self.log.high_watermark == max(self.hw, bound)
        else:
            assert self.log.high_watermark == self.hw

    # -- invariants ----------------------------------------------------------------------------------

    @invariant()
    def hw_never_decreases(self):
        if self.log is None:
            return
        assert self.log.high_watermark >= self.hw
        self.hw = self.log.high_watermark

    @invariant()
    def hw_within_every_isr_member(self):
        if self.log is None:
            return
        hw = self.log.high_watermark
        assert hw <= self.log.log_end_offset
        for f in self.p.maximal_isr - {LEADER}:
            assert hw <= self.fetched[f], f"HW {hw} above ISR member {f}'s LEO {self.fetched[f]}"

    @invariant()
    def acknowledged_records_are_on_every_isr_member(self):
        if self.log is None:
            return
        hw = self.log.high_watermark
        self.acked += [o for o in self.unacked if o < hw]
        self.unacked = [o for o in self.unacked if o >= hw]
        leos = [self.log.log_end_offset, *(self.fetched[f] for f in self.p.isr - {LEADER})]
        for offset in self.acked:
            assert offset < hw and all(offset < leo for leo in leos)


TestLeaderPartition = LeaderPartitionMachine.TestCase
TestLeaderPartition.settings = settings(max_examples=80, stateful_step_count=40,
                                        suppress_health_check=[HealthCheck.too_slow])
