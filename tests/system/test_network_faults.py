"""The network faults of the fault matrix (docs/reliability.md): F4, F5 and F15.

Same cluster, workload and oracle as ``test_fault_matrix`` (3 brokers, a topic of 3
partitions with replication factor 3 and min.insync.replicas 2, a steady acks=all producer,
two live consumers; I1, I2, I3, I5, I6, I11 checked at the end, and I4 in F5, where the
leadership moves and the producer is idempotent), but every broker runs in its own
network namespace with its own address, and faults drop packets between chosen brokers and
between a broker and ZooKeeper (``netlab``: nftables rules in the brokers' namespaces). The
test's clients are never cut off.

* F4  a follower of partition 0 cut off from its leader (all traffic between the two brokers,
      both ways) until the leader has removed it from the ISR in ZooKeeper
      (``replica.lag.time.max.ms`` 2 s here), then healed: it catches up and rejoins. acks=all
      goes on during the fault on every partition (RF 3, min ISR 2: two in-sync replicas
      remain), and I8 is sampled throughout (``harness.IsrSampler``): every replica in
      ZooKeeper's ISR has a log end offset at or past the leader's high watermark.
* F5  the leader of partition 0 isolated from ZooKeeper and from both followers, but not
      from clients (the zombie leader): once its session expires the controller moves the
      leadership to an in-sync follower with a new leader epoch. The zombie still believes it
      leads; I7 is checked on it directly: an acks=all write sent to it is never
      acknowledged (no follower can fetch it, so its high watermark cannot move), and a
      consumer bootstrapped on it alone is never served anything that is not in the final
      log at the same offset (nothing beyond the committed prefix). After healing, the zombie
      learns its session expired, becomes a follower, truncates what it appended as a zombie
      (the probe's record is in none of its segments) and rejoins the ISR.

* F15 a slow network, three ways:
      - latency between partition 0's leader and a follower far under the lag time (150 ms
        one way, ``replica.lag.time.max.ms`` 4 s): the follower stays in the ISR throughout
        (partition 0's state znode is not rewritten), acks=all goes on, slower, on every
        partition, and I8 holds;
      - latency far over the lag time (3 s one way, a 6 s round trip, with the lag at 2 s):
        the follower leaves the ISR of partition 0 (and its leader the ISRs of the follower's
        partitions), acks=all goes on with the two replicas left, and after healing the
        follower catches up and rejoins (I8 sampled throughout);
      - the link into a follower limited far below the topic's intake (a tc token bucket):
        the follower leaves the ISR, acks=all goes on, and after healing it catches up and
        rejoins (I8 sampled throughout).
      tc's netem, which would add latency in the kernel, is missing from some kernels (this
      sandbox's among them). Latency comes from relays in the test process instead: with
      ``Scenario(..., latency=True)`` every connection a broker opens to another broker is
      redirected (nftables DNAT in its namespace) through a relay that holds each chunk for
      the link's delay, in order (``netlab``, ``delayrelay``). ZooKeeper traffic and the
      test's clients are never delayed, so no session expires. The relays' byte counts show
      that the delayed link carried the replication traffic.

These need root for the namespaces and ``ip``/``nft``, which ``./dev setup`` installs; they
are skipped, with the reason, when that is not the case.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.disk import replica_records
from tests.system.harness import (
    ELECTION_TIMEOUT_S,
    SETTLE_TIMEOUT_S,
    IsrSampler,
    Scenario,
    wait_until,
)
from tests.system.netlab import unavailable_reason

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))

WARMUP_ACKS = 300      # acknowledged records before the fault
DURING_ACKS = 300      # acknowledged records per partition while the fault lasts
AFTER_ACKS = 100       # acknowledged records on partition 0 after healing
F4_LAG_MS = 2000       # replica.lag.time.max.ms for F4
F15_SHORT_DELAY_MS = 150    # one way: a round trip far under SYSTEM_CONFIG's 4 s lag time
F15_LONG_DELAY_MS = 3000    # one way: a round trip of 6 s, three times F4_LAG_MS
IN_SYNC_SAMPLES = 25        # I8 samples of partition 0 under the short delay (5 s or more)


def run_to_report(s: Scenario):
    s.heal()
    s.stop_workload()
    return s.check()


def leader_and_follower(s: Scenario, round_: int) -> tuple[int, int]:
    """Partition 0's leader and a follower that is not the controller, so that the
    controller's requests reach both sides (with the controller cut off or slowed, metadata
    would lag on one side too)."""
    leader, controller = s.leader_of(0), s.controller()
    followers = [r for r in s.replicas_of(0) if r != leader]
    follower = next((f for f in followers if f != controller), followers[0])
    s.note(f"round {round_ + 1}: partition 0 led by {leader}, follower {follower}, controller {controller}")
    return leader, follower


def heal_and_see_it_rejoin(s: Scenario, zk, leader: int, follower: int) -> None:
    """Heal; ``follower`` is back in partition 0's ISR, which ``leader`` still leads."""
    s.heal()
    state = zk.partition_state(s.topic, 0)
    assert follower in state.isr and state.leader == leader, \
        f"after healing, partition 0 has {state}: expected leader {leader} and {follower} in the ISR"


def assert_sampled_out(sampler: IsrSampler, follower: int) -> None:
    shrunk = [isr for (p, isr), n in sampler.isrs.items() if p == 0 and follower not in isr]
    assert shrunk, f"I8 was never sampled with {follower} out of the ISR: {dict(sampler.isrs)}"


# -- F4: a follower cut off from its leader ------------------------------------------------------


def test_f4_follower_cut_off_from_leader(tmp_path: Path, soak: int) -> None:
    with Scenario(tmp_path, "F4 follower cut off from the leader", network=True,
                  extra_config={"replica.lag.time.max.ms": F4_LAG_MS}) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            leader, follower = leader_and_follower(s, i)
            with IsrSampler(s) as sampler, s.zookeeper() as zk:
                s.cut(leader, follower)
                wait_until(lambda: follower not in zk.partition_state(s.topic, 0).isr, ELECTION_TIMEOUT_S,
                           f"the leader {leader} to remove {follower} from the ISR of partition 0 in ZooKeeper")
                s.note(f"ZooKeeper: ISR of partition 0 is {list(zk.partition_state(s.topic, 0).isr)}")
                since = time.monotonic()
                for p in range(s.partitions):
                    s.wait_acked(DURING_ACKS * soak, partition=p, since=since)
                s.note(f"acks=all went on during the partition: {DURING_ACKS * soak} more per partition")
                # the cut-off follower fell behind the committed prefix: rejoining means catching up
                leo, hw = s.log_end_offset_of(follower, 0), s.high_watermark_of(leader, 0)
                assert leo is not None and hw is not None and leo < hw, \
                    f"the cut-off follower {follower} has LEO {leo}, the leader's HW is {hw}"
                s.note(f"the cut-off follower {follower} has LEO {leo}, the leader's HW is {hw}")
                heal_and_see_it_rejoin(s, zk, leader, follower)
            assert_sampled_out(sampler, follower)
            s.wait_acked(AFTER_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()
    assert report.isr_samples > 0


# -- F5: the leader isolated from ZooKeeper and its followers (zombie) ---------------------------


def test_f5_leader_isolated_becomes_zombie(tmp_path: Path, soak: int) -> None:
    probe_values: list[bytes] = []
    served: list[tuple[int, int, bytes | None]] = []  # (round, offset, value) the zombie served
    # The zombie answers the steady producer's acks=all requests with REQUEST_TIMED_OUT, which
    # (as in Kafka) does not invalidate the producer's metadata: it learns of the new leader
    # from its periodic refresh, every metadata_max_age_ms (Kafka's default is 5 minutes).
    with Scenario(tmp_path, "F5 leader isolated from ZooKeeper and its followers", network=True,
                  producer_config={"metadata_max_age_ms": 3000}, idempotent=True) as s:
        s.wait_acked(WARMUP_ACKS)
        zombies = []
        for i in range(soak):
            zombie = s.leader_of(0)
            zombies.append(zombie)
            with s.zookeeper() as zk:
                before = zk.partition_state(s.topic, 0)
                s.note(f"round {i + 1}: partition 0 led by {zombie} (epoch {before.leader_epoch}), "
                       f"controller {s.controller()}")
                s.isolate(zombie)
                # the controller moves the leadership once the zombie's session has expired
                after = wait_until(
                    lambda: (st := zk.partition_state(s.topic, 0)) is not None and st.leader not in (-1, zombie) and st,
                    ELECTION_TIMEOUT_S, f"a leader of partition 0 other than the isolated {zombie}")
                s.note(f"ZooKeeper: partition 0 led by {after.leader} (epoch {after.leader_epoch}), ISR {list(after.isr)}")
                assert after.leader_epoch > before.leader_epoch and zombie not in after.isr, after
            # I7: the zombie, still reachable by clients, acknowledges no acks=all write
            # (sent straight to it: a client would soon learn the new leader from another broker)
            value = b"zombie-probe-%d" % i
            probe_values.append(value)
            r = s.produce_to(zombie, 0, value)
            s.note(f"I7: acks=all Produce straight to the zombie {zombie}: error {r.error_code} ({r.error_message})")
            assert r.error_code != 0, f"the isolated zombie {zombie} acknowledged an acks=all write: {r}"
            # ... and serves nothing beyond the committed prefix (its HW cannot move)
            hw, leo = s.high_watermark_of(zombie, 0), s.log_end_offset_of(zombie, 0)
            error, read = s.read_from(zombie, 0)
            s.note(f"the zombie {zombie}: HW {hw}, LEO {leo}; it served {len(read)} records of partition 0 "
                   f"(fetch error {error})")
            assert hw is not None and leo is not None and leo > hw, \
                f"the zombie {zombie} holds nothing past its HW (HW {hw}, LEO {leo}): the probe was not appended"
            assert [o for o, _ in read] == list(range(hw)), \
                f"the zombie {zombie} with HW {hw} served offsets {read[0][0] if read else None}..{read[-1][0] if read else None}"
            served += [(i, o, v) for o, v in read]
            # the rest of the cluster goes on
            s.wait_acked(DURING_ACKS * soak, partition=0)
            s.heal()
            wait_until(lambda z=zombie: s.fetch_error_from(z, 0) != 0, ELECTION_TIMEOUT_S,
                       f"the former zombie {zombie} to stop leading partition 0")
            s.note(f"the former zombie {zombie} follows again")
            s.wait_acked(AFTER_ACKS * soak, partition=0)
        report = run_to_report(s)
    print(report.summary())
    final = s.final_log[0]
    # nothing the zombie served is missing from the final log (I6 for the zombie's reader)
    vanished = [(i, o, v) for i, o, v in served if final.get(o, b"<missing>") != v]
    assert not vanished, f"the zombie served records that are not in the final log: {vanished[:5]}"
    # what the zombie appended as a zombie was never committed, and it truncated it
    for value in probe_values:
        assert value not in final.values(), f"the zombie's unacknowledged {value!r} is in the final log"
        for z in set(zombies):
            kept = [o for o, v in replica_records(s.cluster, z, s.topic, 0) if v == value]
            assert not kept, f"broker {z} still holds the zombie write {value!r} at {kept} after rejoining"
    report.assert_ok()


# -- F15: a slow link ------------------------------------------------------------------------------


def test_f15_slow_link_into_a_follower(tmp_path: Path, soak: int) -> None:
    """The link into a follower of partition 0 is limited far below what the topic takes in
    (a tc token bucket): the follower falls behind and its leader removes it from the ISR in
    ZooKeeper; acks=all goes on with the other two replicas. Once the link is healed it
    catches up and rejoins. I8 is sampled throughout."""
    with Scenario(tmp_path, "F15 slow link", network=True,
                  extra_config={"replica.lag.time.max.ms": F4_LAG_MS}) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            leader, follower = leader_and_follower(s, i)
            with IsrSampler(s) as sampler, s.zookeeper() as zk:
                s.slow(follower, rate_kbit=8)
                wait_until(lambda: follower not in zk.partition_state(s.topic, 0).isr, ELECTION_TIMEOUT_S,
                           f"the leader {leader} to remove the slow follower {follower} from the ISR")
                s.note(f"ZooKeeper: ISR of partition 0 is {list(zk.partition_state(s.topic, 0).isr)}")
                since = time.monotonic()
                s.wait_acked(DURING_ACKS * soak, partition=0, since=since)
                s.note("acks=all went on with the slow follower out of the ISR")
                # the sampler's requests to the slowed broker (for the partitions it is still in
                # sync on) crawl too: let it reach partition 0's shrunk ISR before healing
                wait_until(lambda: any(p == 0 and follower not in isr for p, isr in list(sampler.isrs)),
                           ELECTION_TIMEOUT_S, f"an I8 sample of partition 0 without {follower}")
                s.heal()
                assert follower in zk.partition_state(s.topic, 0).isr
            shrunk = [isr for (p, isr), n in sampler.isrs.items() if p == 0 and follower not in isr]
            assert shrunk, f"I8 was never sampled with {follower} out of the ISR: {dict(sampler.isrs)}"
            s.wait_acked(AFTER_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()


def samples_of(sampler: IsrSampler, partition: int) -> int:
    return sum(n for (p, _), n in list(sampler.isrs.items()) if p == partition)


def test_f15_latency_under_the_lag_time(tmp_path: Path, soak: int) -> None:
    """A one-way delay of 150 ms between partition 0's leader and a follower, far under the
    lag time: each fetch round trip takes 300 ms longer, the follower still reaches the
    leader's log end offset on every one, and the ISR never changes (the state znode keeps its
    version). acks=all goes on on every partition; I8 is sampled throughout."""
    with Scenario(tmp_path, "F15 latency under the lag time", network=True, latency=True) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            leader, follower = leader_and_follower(s, i)
            with IsrSampler(s) as sampler, s.zookeeper() as zk:
                before = zk.partition_state(s.topic, 0)
                relayed = s.relayed_bytes(leader, follower)
                s.delay(leader, follower, F15_SHORT_DELAY_MS)
                since, sampled = time.monotonic(), samples_of(sampler, 0)
                for p in range(s.partitions):
                    s.wait_acked(DURING_ACKS * soak, partition=p, since=since)
                wait_until(lambda n=sampled: samples_of(sampler, 0) - n >= IN_SYNC_SAMPLES * soak,
                           SETTLE_TIMEOUT_S, f"{IN_SYNC_SAMPLES * soak} I8 samples of partition 0 under the delay")
                after = zk.partition_state(s.topic, 0)
                carried = s.relayed_bytes(leader, follower) - relayed
                s.note(f"acks=all went on: {DURING_ACKS * soak} more per partition; the delayed link carried "
                       f"{carried} bytes; ZooKeeper: partition 0 {after}")
                assert carried > 0, f"nothing went through the relays between {leader} and {follower}"
                assert after == before, \
                    f"the ISR of partition 0 changed under a {F15_SHORT_DELAY_MS} ms delay: {before} -> {after}"
                s.heal()
            isrs = {isr for (p, isr), n in sampler.isrs.items() if p == 0}
            assert isrs == {before.isr}, f"I8 sampled partition 0 with the ISRs {isrs}, not only {before.isr}"
        report = run_to_report(s)
    report.assert_ok()
    assert report.isr_samples > 0


def test_f15_latency_over_the_lag_time(tmp_path: Path, soak: int) -> None:
    """A one-way delay of 3 s between partition 0's leader and a follower, with the lag time
    at 2 s: a fetch round trip (6 s) outlasts the lag time, the leader removes the follower
    from the ISR in ZooKeeper, and acks=all goes on with the other two replicas on every
    partition. Once the delay is gone the follower catches up and rejoins. I8 is sampled
    throughout."""
    with Scenario(tmp_path, "F15 latency over the lag time", network=True, latency=True,
                  extra_config={"replica.lag.time.max.ms": F4_LAG_MS}) as s:
        s.wait_acked(WARMUP_ACKS)
        for i in range(soak):
            leader, follower = leader_and_follower(s, i)
            with IsrSampler(s) as sampler, s.zookeeper() as zk:
                relayed = s.relayed_bytes(leader, follower)
                s.delay(leader, follower, F15_LONG_DELAY_MS)
                wait_until(lambda: follower not in zk.partition_state(s.topic, 0).isr, ELECTION_TIMEOUT_S,
                           f"the leader {leader} to remove the delayed follower {follower} from the ISR")
                s.note(f"ZooKeeper: ISR of partition 0 is {list(zk.partition_state(s.topic, 0).isr)}")
                since = time.monotonic()
                for p in range(s.partitions):
                    s.wait_acked(DURING_ACKS * soak, partition=p, since=since)
                s.note(f"acks=all went on with the delayed follower out of the ISR: {DURING_ACKS * soak} more "
                       f"per partition; the delayed link carried {s.relayed_bytes(leader, follower) - relayed} bytes")
                wait_until(lambda: any(p == 0 and follower not in isr for p, isr in list(sampler.isrs)),
                           ELECTION_TIMEOUT_S, f"an I8 sample of partition 0 without {follower}")
                assert s.relayed_bytes(leader, follower) > relayed, \
                    f"nothing went through the relays between {leader} and {follower}"
                heal_and_see_it_rejoin(s, zk, leader, follower)
            assert_sampled_out(sampler, follower)
            s.wait_acked(AFTER_ACKS * soak, partition=0)
        report = run_to_report(s)
    report.assert_ok()
