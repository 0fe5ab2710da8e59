"""The fault matrix (docs/reliability.md) against real broker processes and a real ZooKeeper.

Every scenario runs a 3-broker cluster (``harness.SYSTEM_CONFIG``: 6 s ZooKeeper sessions,
4 s replica lag) with a topic of 3 partitions, replication factor 3, min.insync.replicas 2,
under a steady acks=all produce load with two live consumers; it injects its fault, heals,
stops the workload and runs the oracle (``harness.Scenario.check``: I1, I2, I3, I5, I6, I11,
and I4 where the producer is idempotent; see the harness's docstring), then asserts on the
report, which it prints. The producer is idempotent (``Scenario(idempotent=True)``) wherever
leadership moves, since a produce retried after a failover could append its records twice
(without idempotence, F10, F11, F12 and F13 do show such duplicates): a value twice in the
log is then an I4 violation. F11 with unclean election is the exception: that election
loses acknowledged batches, and the producer's sequences with them; there, as in the
network faults that move no leader (F4, F15), the producer is not idempotent and a
duplicate is only counted.

Covered here:

* F1, F2, F3  one scenario, parametrized by fault x role (as Kafka's replication_test.py):
      the leader of partition 0 (5 bounces) or the controller (one) is bounced cleanly
      (SIGTERM: controlled shutdown, restart; F1 for the leader) or hard (SIGKILL; restart
      once its ZooKeeper session expired; F2 for the leader, F3 for the controller); after a
      controller bounce topic creation still works;
* F6  the leader of partition 0 paused (SIGSTOP) past its session timeout, then resumed: the
      zombie steps down (it refuses to serve the partition) and nothing it acknowledged is
      missing (I7, checked by I1);
* F7  two SIGKILLs of successive leaders of partition 0 in quick succession;
* F8  power loss: SIGKILL, then the tail of the active segment of partition 0 truncated in the
      middle of a batch, or its last few hundred bytes garbled; the broker recovers, refetches
      and its segments verify;
* F11 a partition whose ISR is only its leader: acks=all produce fails with
      NOT_ENOUGH_REPLICAS and nothing is acknowledged (I9); the leader is then killed: with
      unclean election off the partition stays offline until that leader returns (no loss);
      with ``unclean.leader.election.enable=true`` a stale follower leads, and the loss it
      causes is announced to consumers by OFFSET_OUT_OF_RANGE, never skipped silently (I10).

F4 and F5, the network partitions, are in ``test_network_faults`` (a network namespace per
broker, see ``netlab``). F14 (consumer group churn) and F1/F2/F3 against the group coordinator's
broker (F3: SIGKILL of the broker that is both controller and coordinator), checked by I12
and I13, are in ``test_group_faults``. F13 (reassignment onto an added broker, through a
leader kill and a controller kill) is the last scenario here; F10 (index and checkpoint files
deleted or garbled on a killed leader) follows F8, F12 (a leader whose clock is minutes ahead
or behind, through libfaketime; I11 finds that its 30-minute retention deleted nothing)
follows F10, and F9 (a bit flipped in a closed segment of the leader, found by a read, or of
a follower, found by the background verification; the damaged replica is re-fetched) follows
F12's helpers. F15 is in ``test_network_faults``. F16 (the Spark driver SIGKILLed mid-batch
and restarted from its checkpoint, checked by I14 and the sink's at-least-once guarantee) is
in ``test_spark_faults``.

I11 (retention deletes only whole, expired segments) is checked by every scenario, but most
keep the default retention of 7 days, so there it only finds that nothing was deleted. Its
own scenario follows F12: 16 KiB segments expire 6 s after their newest record and retention
runs every 0.5 s, so segments roll and are deleted throughout, while the leader of
partition 0 is SIGKILLed and restarted and one live consumer is held back until retention
deleted what it had not fetched: it must be told (OFFSET_OUT_OF_RANGE, I10). I1 applies to
what is above the final log start; what is below it, I11 (b) holds to its timestamp.

``--soak`` (with ``tests/system`` on the command line; or TIDELOG_SOAK=1) multiplies the
bounces and the load between faults by ``conftest.SOAK_FACTOR``. Each scenario is bounded: every wait polls a condition
under a deadline.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.support.disk import log_dir
from tests.system.harness import (
    ELECTION_TIMEOUT_S,
    HEAL_TIMEOUT_S,
    RETENTION_SLACK_MS,
    SESSION_S,
    SETTLE_TIMEOUT_S,
    IsrSampler,
    LogStartSampler,
    Scenario,
    value_of,
    wait_until,
)
from tidelog import Admin, Consumer, Producer, TopicPartition
from tidelog.broker.log.verifier import first_suspect_offset
from tidelog.protocol.errors import KAFKA_STORAGE_ERROR, NOT_ENOUGH_REPLICAS
from tidelog.protocol.records import CRC_START, iter_headers

BOUNCES = 5
WARMUP_ACKS = 300      # acknowledged records before the first fault
BETWEEN_ACKS = 100     # acknowledged records on partition 0 between faults


def run_to_report(s: Scenario):
    s.heal()
    s.stop_workload()
    return s.check()


# -- F1, F2, F3: a broker in a role bounced, cleanly or hard ----------------------------------------

# fault x role, as Kafka's replication_test.py: (fault, role) -> the fault matrix's name
BOUNCE_SCENARIOS = {
    ("clean", "leader"): "F1",      # SIGTERM (controlled shutdown), restart
    ("hard", "leader"): "F2",       # SIGKILL, restart once the ZooKeeper session expired
    ("clean", "controller"): "F3c",
    ("hard", "controller"): "F3",   # the controller moves; topic creation still works
}
ROUNDS = {"leader": BOUNCES, "controller": 1}  # times soak


def victim_in(s: Scenario, role: str, not_in: tuple[int, ...] = ()) -> int:
    """The broker in ``role`` (leader of partition 0, or the controller), other than ``not_in``."""
    return s.leader_of(0, not_in=not_in) if role == "leader" else s.controller(not_in=not_in)


@pytest.mark.parametrize("role", ["leader", "controller"])
@pytest.mark.parametrize("fault", ["clean", "hard"])
def test_f1_f2_f3_bounce(tmp_path: Path, soak: int, fault: str, role: str) -> None:
    # idempotent: a produce retried after a failover must not append its records twice (I4)
    with Scenario(tmp_path, f"{BOUNCE_SCENARIOS[fault, role]} {role} {fault} bounce", idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(ROUNDS[role] * soak):
            victim = victim_in(s, role)
            s.note(f"bounce {i + 1}: the {role} is broker {victim}")
            if fault == "clean":
                s.stop(victim)
            else:
                s.kill(victim)
                s.wait_gone(victim)
            successor = victim_in(s, role, not_in=(victim,))
            s.note(f"broker {successor} is the {role}")
            if role == "controller":
                s.wait_acked(BETWEEN_ACKS * soak)
                s.create_topic(f"after-controller-{fault}-bounce-{i}", 2, 2, {"min.insync.replicas": "1"})
            s.start(victim)
            s.wait_isr_full()
            if role == "leader":
                s.wait_acked(BETWEEN_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()


# -- F6: the zombie leader -----------------------------------------------------------------------


def test_f6_paused_leader_becomes_zombie(tmp_path: Path, soak: int) -> None:
    with Scenario(tmp_path, "F6 zombie leader", idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            zombie = s.leader_of(0)
            s.note(f"round {i + 1}: leader of partition 0 is {zombie}")
            s.pause(zombie)
            s.leader_of(0, not_in=[zombie])
            s.wait_gone(zombie)
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
            s.resume(zombie)
            # the zombie learns it lost its session and its leadership: it stops serving the
            # partition (a consumer fetch gets NOT_LEADER_OR_FOLLOWER or a fenced epoch)
            wait_until(lambda z=zombie: s.fetch_error_from(z, 0) != 0, ELECTION_TIMEOUT_S,
                       f"the zombie {zombie} to stop leading partition 0")
            s.note(f"the zombie {zombie} no longer serves partition 0")
            s.wait_isr_full()
        report = run_to_report(s)
    report.assert_ok()


# -- F7: back-to-back failovers ------------------------------------------------------------------


def test_f7_two_quick_leader_kills(tmp_path: Path, soak: int) -> None:
    with Scenario(tmp_path, "F7 back-to-back leader kills", idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            first = s.leader_of(0)
            s.note(f"round {i + 1}: leader of partition 0 is {first}")
            s.kill(first)

            def second_leader(first: int = first) -> int | None:
                # the first broker that reports a new leader: kill it before it settles
                for md in s.views().values():
                    for t in md.topics:
                        for p in t.partitions:
                            if t.name == s.topic and p.partition_index == 0 and p.leader_id not in (-1, first):
                                return p.leader_id
                return None
            second = wait_until(second_leader, ELECTION_TIMEOUT_S, "a second leader of partition 0", interval=0.02)
            s.kill(second)
            third = s.leader_of(0, not_in=[first, second])
            s.note(f"broker {third} leads partition 0")
            s.heal()
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()


# -- F8: power loss ------------------------------------------------------------------------------


def active_segment(s: Scenario, broker_id: int, partition: int) -> Path:
    d = log_dir(s.cluster, broker_id) / f"{s.topic}-{partition}"
    return max(d.glob("*.log"), key=lambda p: int(p.stem))


@pytest.mark.parametrize("damage", ["truncate", "garble"])
def test_f8_power_loss_torn_tail(tmp_path: Path, soak: int, damage: str) -> None:
    with Scenario(tmp_path, f"F8 power loss ({damage})", idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            victim = s.leader_of(0)
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
            s.kill(victim)
            seg = active_segment(s, victim, 0)
            size = seg.stat().st_size
            assert size > 1000, f"{seg} holds only {size} bytes"
            with open(seg, "r+b") as f:
                if damage == "truncate":
                    f.truncate(size - max(777, size // 3))  # the unflushed third, torn mid-batch
                else:
                    f.seek(size - 300)
                    f.write(os.urandom(300))
            s.note(f"{damage}d the tail of {seg.name} on broker {victim} ({size} bytes)")
            s.wait_gone(victim)
            s.start(victim)
            s.wait_isr_full()
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()


# -- F10: index and checkpoint files lost ---------------------------------------------------------

# several closed segments, each with its indexes (below the 1 MiB clients may ask for by default)
SMALL_SEGMENTS = {"segment.bytes": "16384"}
SMALL_SEGMENTS_ALLOWED = {"log.segment.min.bytes": 16384}


@pytest.mark.parametrize("damage", ["delete", "garble"])
def test_f10_index_and_checkpoint_files_lost(tmp_path: Path, soak: int, damage: str) -> None:
    """The leader of partition 0 is SIGKILLed; every .index and .timeindex of its segments,
    each partition's leader-epoch-checkpoint and the log dir's checkpoints (recovery point,
    replication offsets, log start) are deleted or overwritten with random bytes; it restarts,
    rebuilds what it lost from the segments themselves, catches up and rejoins every ISR."""
    with Scenario(tmp_path, f"F10 index and checkpoint files ({damage})", topic_config=SMALL_SEGMENTS,
                  extra_config=SMALL_SEGMENTS_ALLOWED, idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            victim = s.leader_of(0)
            d = log_dir(s.cluster, victim)
            wait_until(lambda d=d: len(list(d.glob(f"{s.topic}-0/*.log"))) >= 3, SETTLE_TIMEOUT_S,
                       f"three segments of partition 0 on broker {victim}")
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
            s.kill(victim)
            segments = list(d.glob(f"{s.topic}-0/*.log"))
            files = [*d.glob(f"{s.topic}-*/*.index"), *d.glob(f"{s.topic}-*/*.timeindex"),
                     *d.glob(f"{s.topic}-*/leader-epoch-checkpoint"), *d.glob("*-checkpoint")]
            for f in files:
                if damage == "delete":
                    f.unlink()
                else:
                    f.write_bytes(os.urandom(max(f.stat().st_size, 16)))
            s.note(f"{damage}d {len(files)} index and checkpoint files on broker {victim} "
                   f"({len(segments)} segments of partition 0)")
            s.wait_gone(victim)
            s.start(victim)
            s.wait_isr_full()
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()


# -- F9: a bit flipped in a closed segment --------------------------------------------------------

# the background verification of closed segments, every 2 s without a rate limit
VERIFYING = {"log.verify.interval.ms": 2000, "log.verify.bytes.per.second": 0}


def flip_a_bit_mid_segment(path: Path) -> tuple[int, int]:
    """Flip one bit inside the CRC-covered part of the batch in the middle of the segment file
    ``path``, through the file (the broker's page cache sees it); ``(base offset, position)``."""
    data = path.read_bytes()
    batches = list(iter_headers(data))
    pos, h = batches[len(batches) // 2]
    at = pos + CRC_START + (h.size - CRC_START) // 2
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x04]))
    return h.base_offset, at


def segments_of(s: Scenario, broker_id: int, partition: int) -> list[Path]:
    d = log_dir(s.cluster, broker_id) / f"{s.topic}-{partition}"
    return sorted(d.glob("*.log"), key=lambda p: int(p.stem))


def verifies(path: Path) -> bool:
    size = path.stat().st_size if path.exists() else 0
    return size > 0 and first_suspect_offset(str(path), int(path.stem), size) is None


@pytest.mark.parametrize("replica", ["leader", "follower"])
def test_f9_a_bit_flipped_in_a_closed_segment(tmp_path: Path, soak: int, replica: str) -> None:
    """One bit of a closed segment of partition 0 flipped on disk, in the middle of a batch, on
    its leader or on a follower, while the brokers run. The leader's is found by the next read
    of it: a consumer fetching straight from that broker gets every record before the damaged
    batch, then KAFKA_STORAGE_ERROR, never the batch; an SDK consumer reading the partition from
    its start gets every acknowledged record, as the leadership moves to an in-sync replica. The
    follower's is found by the background verification of closed segments (every 2 s here). In
    both cases the damaged replica leaves the ISR, drops its log from the damaged batch on,
    fetches it again and rejoins; the oracle's I2 and I5 then find every replica's segments
    identical and verifying."""
    with Scenario(tmp_path, f"F9 a bit flipped on the {replica}", topic_config=SMALL_SEGMENTS,
                  extra_config={**SMALL_SEGMENTS_ALLOWED, **(VERIFYING if replica == "follower" else {})},
                  idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            leader = s.leader_of(0)
            victim = leader if replica == "leader" else next(r for r in s.replicas_of(0) if r != leader)
            wait_until(lambda v=victim: len(segments_of(s, v, 0)) >= 3, SETTLE_TIMEOUT_S,
                       f"three segments of partition 0 on broker {victim}")
            seg = segments_of(s, victim, 0)[-2]  # the newest closed one
            damaged, at = flip_a_bit_mid_segment(seg)
            s.note(f"flipped a bit at position {at} of {seg.name} (batch at offset {damaged}) on broker "
                   f"{victim}, the {replica} of partition 0")
            if replica == "leader":
                error, served = s.read_from(victim, 0)
                assert error == KAFKA_STORAGE_ERROR.code, f"broker {victim} answered error {error}"
                acked = {a.offset: a.value for a in s.producer.acks() if a.partition == 0}
                assert served and served[-1][0] < damaged, f"served up to {served[-1:]}, damaged at {damaged}"
                assert all(acked.get(o, v) == v for o, v in served), "the damaged leader served a wrong value"
                s.note(f"broker {victim} served offsets 0-{served[-1][0]}, then KAFKA_STORAGE_ERROR")
                read_all(s, 0, damaged + 1)
                s.leader_of(0, not_in=[victim])
            wait_until(lambda: verifies(seg), HEAL_TIMEOUT_S,
                       f"{seg.name} on broker {victim} fetched again and verifying")
            s.note(f"{seg.name} on broker {victim} verifies again")
            s.wait_isr_full()
            s.wait_acked(BETWEEN_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()


def read_all(s: Scenario, partition: int, past: int) -> None:
    """An SDK consumer reads ``partition`` from its start past offset ``past``: every record it
    gets is the acknowledged one at its offset (the damaged batch is never delivered)."""
    tp = TopicPartition(s.topic, partition)
    acked = {a.offset: a.value for a in s.producer.acks() if a.partition == partition}
    got: dict[int, bytes | None] = {}
    with Consumer(s.bootstrap, auto_offset_reset="earliest", default_api_timeout_ms=30000) as c:
        c.assign([tp])
        c.seek(tp, 0)
        deadline = time.monotonic() + HEAL_TIMEOUT_S
        while (not got or max(got) < past) and time.monotonic() < deadline:
            for r in c.poll(timeout_ms=500).get(tp, []):
                got[r.offset] = r.value
    assert got and max(got) >= past, f"read only up to {max(got, default=None)} of partition {partition}"
    assert sorted(got) == list(range(max(got) + 1)), "offsets skipped"
    wrong = [o for o, v in got.items() if o in acked and acked[o] != v]
    assert not wrong, f"values differ from the acknowledged ones at {wrong[:5]}"
    s.note(f"an SDK consumer read partition {partition} from 0 to {max(got)}, every record intact")


# -- F12: one broker's clock skewed --------------------------------------------------------------

FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"  # Debian's faketime (./dev setup)


def first_offset_at_or_after(records: list, timestamp: int) -> int | None:
    return next((r.offset for r in records if r.timestamp >= timestamp), None)


@pytest.mark.skipif(not os.path.exists(FAKETIME), reason=f"{FAKETIME} (Debian's faketime) is not installed")
@pytest.mark.parametrize("skew", ["+4m", "-3m"])
def test_f12_a_leader_whose_clock_is_minutes_off(tmp_path: Path, soak: int, skew: str) -> None:
    """The leader of partition 0 restarts with its wall clock minutes ahead or behind (libfaketime;
    its monotonic clock, which timeouts use, is left alone) and leads again under the load. Its
    retention (30 minutes, time-based, checked every second) deletes nothing: the oracle's I11
    finds every replica's log start at 0 and every acknowledged record above it (4 minutes
    ahead is still far from 30; a retention that aged records by the wrong clock or unit
    would show as records deleted early). Its ISR lag decisions keep the followers (the
    oracle's final ISR), and a timestamp lookup it answers (ListOffsets, the time index) finds
    the first record at or after the time, as the records' own timestamps say."""
    with Scenario(tmp_path, f"F12 leader clock {skew}", topic_config={**SMALL_SEGMENTS, "retention.ms": str(30 * 60 * 1000)},
                  extra_config={**SMALL_SEGMENTS_ALLOWED, "log.retention.check.interval.ms": 1000}, idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        victim = s.leader_of(0)
        s.stop(victim)
        s.cluster.brokers[victim].env = {"LD_PRELOAD": FAKETIME, "FAKETIME": skew,
                                         "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        s.note(f"broker {victim} restarts with its clock {skew}")
        s.start(victim)
        s.wait_isr_full()
        with s.admin() as a:
            a.elect_leaders([TopicPartition(s.topic, 0)])
        wait_until(lambda: s.leader_of(0) == victim, ELECTION_TIMEOUT_S, f"broker {victim} to lead partition 0 again")
        s.note(f"broker {victim} leads partition 0 with its clock {skew}")
        for _ in range(soak):
            s.wait_acked(BETWEEN_ACKS * 3, partition=0)
        tp = TopicPartition(s.topic, 0)
        with Consumer(s.bootstrap, auto_offset_reset="earliest", client_id="system-probe") as c:
            end = c.end_offsets([tp])[tp]
            c.assign([tp])
            records = []
            deadline = time.monotonic() + ELECTION_TIMEOUT_S
            while len(records) < end and time.monotonic() < deadline:
                records += c.poll(timeout_ms=500)
            assert len(records) >= end > 0
            for probe in (records[len(records) // 3], records[-5]):
                found = c.offsets_for_times({tp: probe.timestamp})[tp]
                assert found is not None and found.offset == first_offset_at_or_after(records, probe.timestamp), \
                    (probe, found)
            s.note(f"timestamp lookups on the skewed leader agree with the records' timestamps ({end} records)")
            # retention ran every second on closed segments none of which is 30 minutes old
            assert c.beginning_offsets([tp])[tp] == 0
        report = run_to_report(s)
    report.assert_ok()  # I11 (b): nothing below any replica's log start was younger than 30 minutes
    assert report.expired == 0 and all(start == 0 for starts in report.log_starts.values()
                                       for start in starts.values()), report.summary()


# -- I11: retention under a leader bounce ---------------------------------------------------------

RETENTION_MS = 6000
# 16 KiB segments hold a few seconds of the load; expired 6 s after their newest record, checked
# every half second: segments roll and are deleted all through the scenario
SHORT_RETENTION = {**SMALL_SEGMENTS, "retention.ms": str(RETENTION_MS)}
RETENTION_CHECK_INTERVAL_MS = 500
FREQUENT_RETENTION_CHECKS = {**SMALL_SEGMENTS_ALLOWED, "log.retention.check.interval.ms": RETENTION_CHECK_INTERVAL_MS}


def test_i11_retention_under_a_leader_bounce(tmp_path: Path, soak: int) -> None:
    """Retention deletes segments of every partition all along while the leader of partition 0
    is SIGKILLed and restarted, and one live consumer is held back until retention deleted what
    it had not fetched. The oracle's I11 checks every replica: its log start is a segment boundary,
    no acknowledged record below a log start seen (sampled every half second, at a consumer's
    reset, by the final read, in the checkpoints) was younger than retention.ms, every expired
    segment is gone; I1 holds for what is above the final log start. The consumer held back is
    told (OFFSET_OUT_OF_RANGE) on every partition and goes on from the log start, never
    skipping silently (I10)."""
    with Scenario(tmp_path, "I11 retention under a leader bounce", topic_config=SHORT_RETENTION,
                  extra_config=FREQUENT_RETENTION_CHECKS, idempotent=True) as s:
        with LogStartSampler(s):
            s.wait_acked(WARMUP_ACKS)
            wait_until(lambda: min(s.beginning_offsets().values()) > 0, SETTLE_TIMEOUT_S,
                       "retention to delete a segment of every partition")
            s.note(f"retention under way: log starts {s.beginning_offsets()}")
            held = s.consumers[-1]
            held.pause()
            s.wait_acked(BETWEEN_ACKS)  # its last fetch (a long poll of at most 200 ms) is back
            fetched = s.end_offsets()   # it may have fetched (not read) up to these, no further
            s.note(f"{held.name} held back at {dict(held.next_offset)}, fetched at most to {fetched}")
            for i in range(soak):
                victim = s.leader_of(0)
                s.note(f"bounce {i + 1}: the leader of partition 0 is broker {victim}")
                s.kill(victim)
                s.wait_gone(victim)
                s.wait_acked(BETWEEN_ACKS * soak, partition=0)
                s.start(victim)
                s.wait_isr_full()
            wait_until(lambda: all(start > fetched[p] for p, start in s.beginning_offsets().items()),
                       SETTLE_TIMEOUT_S, f"retention to delete what {held.name} has not fetched")
            held.resume()
            wait_until(lambda: all(held.events_for(p, "OFFSET_OUT_OF_RANGE") for p in range(s.partitions)),
                       ELECTION_TIMEOUT_S, f"{held.name} to be told OFFSET_OUT_OF_RANGE on every partition")
            s.note(f"{held.name} was told OFFSET_OUT_OF_RANGE and jumped {held.told}")
            # long enough after the restart that I11's liveness (c) holds the restarted broker to
            # retention too: its oldest segments expire and must be gone, slack included
            s.wait_acked(s.rate * (RETENTION_MS + RETENTION_SLACK_MS + RETENTION_CHECK_INTERVAL_MS) // 1000)
        report = run_to_report(s)
    report.assert_ok()
    assert report.expired > 0 and report.log_start_samples > 0, \
        f"retention deleted no acknowledged record, or no log start was seen while it ran\n{report.summary()}"
    assert all(start > 0 for starts in report.log_starts.values() for start in starts.values()), report.summary()


# -- F11: an ISR of one loses its leader ---------------------------------------------------------


def shrink_to_leader_only(s: Scenario, partition: int) -> tuple[int, int, int, int]:
    """Stop the two followers of ``partition`` one after the other (acks keep flowing in
    between, so the first one stopped misses acknowledged records), until the ISR is the
    leader alone; then check I9. Returns (leader, first follower stopped, second, the HW
    once the ISR was the leader alone)."""
    leader = s.leader_of(partition)
    f1, f2 = [r for r in s.replicas_of(partition) if r != leader]
    s.stop(f1)
    s.wait_isr(partition, [leader, f2])
    s.wait_acked(BETWEEN_ACKS, partition=partition)
    s.stop(f2)
    s.wait_isr(partition, [leader])
    s.note(f"the ISR of partition {partition} is [{leader}]")
    hw = s.end_offsets()[partition]
    # I9: an acks=all produce to a partition whose ISR is below min.insync.replicas fails
    # with NOT_ENOUGH_REPLICAS (tried once: the steady producer retries it instead)
    with Producer(s.bootstrap, acks="all", retries=0, request_timeout_ms=10000, delivery_timeout_ms=20000,
                  client_id="system-probe") as probe:
        fut = probe.send(s.topic, value_of(partition, -1), partition=partition)
        err = fut.exception(30)
    assert err is not None and getattr(err, "error", None) == NOT_ENOUGH_REPLICAS, \
        f"acks=all with the ISR [{leader}] answered {err!r}, not NOT_ENOUGH_REPLICAS"
    s.note(f"I9: acks=all to partition {partition} failed with {err.error.name}; HW {hw}")
    return leader, f1, f2, hw


def assert_nothing_acked_beyond(s: Scenario, partition: int, hw: int, since: float) -> None:
    """I9: while the ISR was below min.insync.replicas, no record at or past the HW it had
    then was acknowledged."""
    late = [a for a in s.producer.acks() if a.partition == partition and a.offset >= hw and a.at >= since]
    assert not late, f"acknowledged with an ISR below min.insync.replicas: {late[:5]}"


def test_f11_isr_of_one_loses_leader_unclean_off(tmp_path: Path) -> None:
    with Scenario(tmp_path, "F11 ISR of one, unclean election off", idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        leader, f1, f2, hw = shrink_to_leader_only(s, 0)
        since = time.monotonic()
        s.kill(leader)
        s.start(f1, wait=False)
        s.start(f2, wait=False)
        s.cluster.wait_ready(ELECTION_TIMEOUT_S, brokers={f1, f2})
        s.wait_gone(leader)
        # the followers are back, but neither was in the ISR: the partition stays offline
        # (watched for two session timeouts; an election would show up as a leader)
        deadline = time.monotonic() + 2 * SESSION_S
        while time.monotonic() < deadline:
            st = s.partition_state(0)
            assert st is None or st[0] == -1, f"partition 0 got leader {st[0]} with unclean election off"
            time.sleep(0.2)
        s.note("partition 0 stayed offline with its only in-sync replica down")
        assert_nothing_acked_beyond(s, 0, hw, since)
        s.start(leader)
        assert s.leader_of(0) == leader
        s.note(f"the old leader {leader} leads partition 0 again")
        report = run_to_report(s)
    report.assert_ok()


def test_f11_isr_of_one_loses_leader_unclean_on(tmp_path: Path) -> None:
    # one partition: unclean election is a topic setting, and with one partition every loss
    # and every consumer reset belongs to the partition whose leader the test kills. Not
    # idempotent: the unclean election loses acknowledged batches, and their sequences with them
    with Scenario(tmp_path, "F11 ISR of one, unclean election on", partitions=1,
                  topic_config={"unclean.leader.election.enable": "true"}) as s:
        s.wait_acked(WARMUP_ACKS)
        hw_before = s.end_offsets()[0]
        leader, f1, _f2, hw = shrink_to_leader_only(s, 0)
        # the live consumers have read what was acknowledged while f1 was down
        s.wait_consumed({0: hw})
        since = time.monotonic()
        s.kill(leader)
        s.start(f1)
        s.wait_gone(leader)
        new = s.leader_of(0)
        assert new == f1, f"partition 0 led by {new}, expected the unclean election of {f1}"
        s.note(f"unclean election: {f1} leads partition 0")
        # every live consumer was past f1's log end: it is told (OFFSET_OUT_OF_RANGE), and
        # resets. f1 alone cannot append (min.insync.replicas 2), so its log end stays put
        # until the others return.
        wait_until(lambda: all(c.events_for(0, "OFFSET_OUT_OF_RANGE") for c in s.consumers), ELECTION_TIMEOUT_S,
                   "every live consumer to get OFFSET_OUT_OF_RANGE on partition 0")
        s.note("every live consumer got OFFSET_OUT_OF_RANGE on partition 0")
        assert_nothing_acked_beyond(s, 0, hw, since)
        report = run_to_report(s)
    print(report.summary())
    # the loss unclean election allows: acknowledged records past what f1 held (f1 was in
    # the ISR until it stopped, so it held everything below hw_before)
    assert report.lost_records, "unclean election lost nothing: the scenario did not exercise it"
    below = [a for a in report.lost_records if a.offset < hw_before]
    assert not below, f"lost below the HW {hw_before} that f1 had: {below[:5]}"
    # consumers saw records that are gone (I6 cannot hold), but each of them was told
    told = {c.name for c in s.consumers if c.events_for(0, "OFFSET_OUT_OF_RANGE")}
    untold = [x for x in report.phantom_records if x[0] not in told]
    assert not untold, f"consumed records vanished without an OFFSET_OUT_OF_RANGE: {untold[:5]}"
    # never a silent skip; everything else holds (replicas agree after the truncation)
    report.assert_ok(ignore=("lost", "phantom", "not_consumed"))


# -- F13: partitions moved onto an added broker, through a leader kill and a controller kill ---------


def test_f13_reassignment_onto_an_added_broker_through_failures(tmp_path: Path, soak: int) -> None:
    """A fourth broker joins and every partition is moved to include it, under the acks=all
    load. While the moves wait (the new broker is paused: registered, not fetching), the leader
    of partition 0 is SIGKILLed and then the controller; the new controller resumes the moves
    from ZooKeeper, and once the new broker resumes they complete. The oracle then also finds
    every replica of the final assignment, and only those, on disk (I2 over each holder)."""
    target = {0: [4, 1, 2], 1: [2, 4, 3], 2: [3, 1, 4]}
    with Scenario(tmp_path, "F13 reassignment under faults", idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        # The admin that starts the moves is opened, and has asked the controller once, before
        # broker 4 joins, so its metadata names brokers 1-3 only. Opened while broker 4 is
        # paused, its first refresh could pick the paused broker and hang until that broker's
        # ZooKeeper session expired; the controller then refuses a target naming an
        # unregistered broker.
        with Admin(s.bootstrap, default_api_timeout_ms=30000, request_timeout_ms=10000) as mover:
            mover.list_partition_reassignments()
            s.note("adding broker 4")
            s.cluster.add_broker(timeout=ELECTION_TIMEOUT_S)
            s.pause(4)
            with IsrSampler(s) as sampler:  # I8 throughout the move
                results = mover.alter_partition_reassignments(
                    {TopicPartition(s.topic, p): r for p, r in target.items()})
                assert all(code == 0 for code, _ in results.values()), results
                s.note(f"reassignment started: {target}")
                leader = s.leader_of(0)
                s.kill(leader)
                s.leader_of(0, not_in=[leader])
                s.wait_acked(BETWEEN_ACKS * soak, partition=0)
                controller = s.controller(not_in=[leader])
                s.kill(controller)
                s.controller(not_in=[leader, controller])
                s.resume(4)
                s.heal()  # the killed brokers back; every replica in its ISR

                def moved() -> bool:
                    with s.admin() as a:
                        if a.list_partition_reassignments():
                            return False
                    return all(s.replicas_of(p) == r for p, r in target.items())
                wait_until(moved, HEAL_TIMEOUT_S, f"the reassignment to {target} to complete")
                # the moves can complete between two of the sampler's rounds (a round asks every
                # ISR member, and waits on the brokers just restarted): I8 is checked with broker
                # 4 in an ISR once at least, so sampling goes on until a round has seen it there
                wait_until(lambda: any(4 in isr for _, isr in list(sampler.isrs)), HEAL_TIMEOUT_S,
                           "the ISR sampler to sample an ISR holding broker 4")
        assert any(4 in isr for _, isr in sampler.isrs), f"I8 never sampled broker 4 in an ISR: {dict(sampler.isrs)}"
        s.note("reassignment complete")
        s.wait_isr_full()
        s.wait_acked(BETWEEN_ACKS * soak)
        report = run_to_report(s)
    report.assert_ok()
    holders = {p: sorted(b for b in s.cluster.brokers if (log_dir(s.cluster, b) / f"{s.topic}-{p}").is_dir())
               for p in target}
    assert holders == {p: sorted(r) for p, r in target.items()}, holders
