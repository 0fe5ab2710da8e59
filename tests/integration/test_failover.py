"""Failover on a real 3-broker cluster (one of its own per test): a leader killed with
SIGKILL while an acks=all producer keeps going, the controller killed, a broker restarted
after a crash, every broker restarted, a leader stopped with SIGTERM (controlled
shutdown), and a topic deleted while one of its replicas is down.

The clusters run with small timeouts (cluster_fixtures.FAST_FAILOVER): a killed broker's
ZooKeeper session expires after 6 s and a follower that stops fetching leaves the ISR after
3 s (replica.lag.time.max.ms). Topics have replication factor 3 and min.insync.replicas 2.
The oracle is docs/reliability.md's I1: every acknowledged (partition, offset, value) is found
at that offset when the partitions are read after healing.
"""

from __future__ import annotations

import time

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER, fresh_cluster_3  # noqa: F401
from tests.support.cluster import (
    broker_metadata,
    controller_id,
    end_offsets,
    partitions_of,
    running,
    wait_topic_ready,
)
from tests.support.disk import log_dirs, replica_high_watermark, replica_records
from tests.support.producing import SteadyProducer, assert_all_acked_present
from tests.support.waiting import NotYet, wait_until
from tidelog import Admin, NewTopic, Producer, TopicPartition
from tidelog.errors import TidelogError

LAG_MS = int(FAST_FAILOVER["replica.lag.time.max.ms"])
SESSION_S = int(FAST_FAILOVER["zookeeper.session.timeout.ms"]) / 1000
PARTITIONS = 3


def create_topic(cluster, name: str, partitions: int = PARTITIONS, rf: int = 3) -> None:
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(name, partitions, rf, config={"min.insync.replicas": "2"})])
    wait_topic_ready(cluster, name, partitions, rf)


def leader_of(cluster, topic: str, partition: int, via: int) -> int:
    return partitions_of(broker_metadata(cluster, via), topic)[partition].leader_id


def wait_rejoined(cluster, broker_id: int, topics: dict[str, int], timeout: float) -> float:
    """Wait until ``broker_id`` is in the ISR of every partition of ``topics`` (name ->
    partition count) as every running broker sees it; returns the seconds it took."""
    start = time.monotonic()

    def rejoined():
        for i in running(cluster):
            md = broker_metadata(cluster, i)
            for topic, n in topics.items():
                parts = partitions_of(md, topic)
                if len(parts) != n or any(broker_id not in p.isr_nodes for p in parts.values()):
                    return False
        return True

    wait_until(rejoined, timeout, f"broker {broker_id} back in the ISR of {topics}")
    return time.monotonic() - start


def test_leader_killed_while_producing_loses_no_acknowledged_record(fresh_cluster_3):
    cluster, topic = fresh_cluster_3, "hard-kill"
    create_topic(cluster, topic)
    with SteadyProducer(cluster.bootstrap, topic) as producer:
        producer.wait_acked(3000, 30)
        # the leader of a partition, not the controller (killing that one is the next test):
        # the surviving controller moves the leadership
        ctrl = controller_id(cluster, via=1)
        part, before = next((p, pm) for p, pm in sorted(partitions_of(broker_metadata(cluster, 1), topic).items())
                            if pm.leader_id != ctrl)
        victim, replicas = before.leader_id, before.replica_nodes
        cluster.brokers[victim].kill()
        killed_at = len(producer.futures)
        survivor = next(i for i in cluster.brokers if i != victim)

        # a new leader among the live replicas, on every live broker's metadata
        def new_leader():
            leaders = {leader_of(cluster, topic, part, via=i) for i in running(cluster)}
            return len(leaders) == 1 and leaders <= set(replicas) - {victim}
        wait_until(new_leader, SESSION_S + 20, f"a new leader for {topic}-{part}")
        assert victim not in {b.node_id for b in broker_metadata(cluster, survivor).brokers}

        # the same producer keeps going: records sent after the kill are acknowledged,
        # in the killed leader's partition too
        producer.wait_acked(1000, 30, partition=part, since=killed_at)
        after = partitions_of(broker_metadata(cluster, survivor), topic)[part]
        assert after.leader_epoch == before.leader_epoch + 1, f"one election, one new leader epoch: {after}"
        assert victim not in after.isr_nodes

        # the killed broker restarts, recovers its logs (no clean-shutdown marker) and
        # rejoins the ISR while the load goes on
        assert not (log_dirs(cluster)[victim] / ".tidelog_cleanshutdown").exists()
        cluster.brokers[victim].start()
        cluster.wait_ready(60)
        took = wait_rejoined(cluster, victim, {topic: PARTITIONS}, timeout=30)
        assert took * 1000 <= LAG_MS, f"broker {victim} took {took:.2f} s to rejoin the ISR"
        producer.wait_acked(500, 30, partition=part, since=len(producer.futures))
        acked = producer.finish()

    assert len(acked) > 5000
    assert_all_acked_present(cluster, topic, acked, PARTITIONS)

    # on disk, after a clean stop: the recovered replica holds exactly what the others hold
    # below the high watermark (I2), every acknowledged record included. All three were in
    # the ISR when the load stopped, so the highest checkpointed HW (the last leader's;
    # followers learn it a fetch later) bounds what every replica must have.
    for b in cluster.brokers.values():
        assert b.stop(60) == 0
    acked_by_partition = {p: {m.offset: v for v, m in acked if m.partition == p} for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        hws = {i: replica_high_watermark(cluster, i, topic, p) for i in cluster.brokers}
        hw = max(hws.values())
        assert max(acked_by_partition[p]) < hw, f"{topic}-{p}: acked offsets reach beyond the HWs {hws}"
        prefixes = {i: [r for r in replica_records(cluster, i, topic, p) if r[0] < hw] for i in cluster.brokers}
        assert [o for o, _ in prefixes[victim]] == list(range(hw)), f"{topic}-{p}: replica {victim} has gaps"
        for i in cluster.brokers:
            assert prefixes[i] == prefixes[victim], f"{topic}-{p}: replicas {i} and {victim} diverge below {hw}"
        stored = dict(prefixes[victim])
        assert all(stored[o] == v for o, v in acked_by_partition[p].items())


def test_controller_killed_another_takes_over_and_the_broker_rejoins(fresh_cluster_3):
    cluster = fresh_cluster_3
    create_topic(cluster, "before")
    with Producer(cluster.bootstrap, acks="all") as producer:
        futures = [producer.send("before", b"b-%d" % i, key=b"%d" % i) for i in range(2000)]
        producer.flush(timeout=60)
        acked = [(b"b-%d" % i, f.result(0)) for i, f in enumerate(futures)]

    old = controller_id(cluster, via=1)
    assert old in cluster.brokers
    cluster.brokers[old].kill()
    live = [i for i in cluster.brokers if i != old]

    def new_controller():
        ids = {controller_id(cluster, via=i) for i in live}
        return ids.pop() if len(ids) == 1 and ids <= set(live) else None
    new = wait_until(new_controller, SESSION_S + 20, "a new controller")
    assert new != old

    # the new controller serves topic administration (RF 2: two brokers are alive)
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic("after", 4, 2)])
    wait_topic_ready(cluster, "after", 4, 2, via=live)
    with Producer(cluster.bootstrap, acks="all") as producer:
        meta = producer.send("after", b"hello", partition=3).result(timeout=30)
    assert (meta.partition, meta.offset) == (3, 0)

    # the old controller comes back as an ordinary broker, recovers its logs after the crash
    # (no clean-shutdown marker) and rejoins the ISRs
    assert not (log_dirs(cluster)[old] / ".tidelog_cleanshutdown").exists()
    cluster.brokers[old].start()
    cluster.wait_ready(60)
    took = wait_rejoined(cluster, old, {"before": PARTITIONS}, timeout=30)
    assert took * 1000 <= LAG_MS, f"broker {old} took {took:.2f} s to rejoin the ISR"
    assert {controller_id(cluster, via=i) for i in cluster.brokers} == {new}
    assert_all_acked_present(cluster, "before", acked, PARTITIONS)


def test_every_broker_restarted_keeps_all_data(fresh_cluster_3):
    cluster, topic = fresh_cluster_3, "durable"
    create_topic(cluster, topic)
    with Producer(cluster.bootstrap, acks="all") as producer:
        futures = [producer.send(topic, b"d-%d" % i, key=b"%d" % (i % 37)) for i in range(5000)]
        producer.flush(timeout=60)
        acked = [(b"d-%d" % i, f.result(0)) for i, f in enumerate(futures)]
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    before = end_offsets(cluster.bootstrap, tps)
    assert sum(before.values()) == 5000

    for i, b in cluster.brokers.items():
        assert b.stop(60) == 0, f"broker {i} did not exit cleanly after SIGTERM"
        assert (log_dirs(cluster)[i] / ".tidelog_cleanshutdown").exists()
    for b in cluster.brokers.values():
        b.start()
    cluster.wait_ready(60)
    wait_topic_ready(cluster, topic, PARTITIONS, 3)

    assert end_offsets(cluster.bootstrap, tps) == before
    assert_all_acked_present(cluster, topic, acked, PARTITIONS)
    with Producer(cluster.bootstrap, acks="all") as producer:
        meta = producer.send(topic, b"after-restart", partition=0).result(timeout=30)
    assert meta.offset == before[tps[0]]


def test_sigterm_moves_leadership_away_before_the_leader_stops(fresh_cluster_3):
    cluster, topic = fresh_cluster_3, "controlled"
    create_topic(cluster, topic)
    with SteadyProducer(cluster.bootstrap, topic) as producer:
        producer.wait_acked(3000, 30)
        victim = leader_of(cluster, topic, 0, via=1)
        led = {p for p, pm in partitions_of(broker_metadata(cluster, victim), topic).items()
               if pm.leader_id == victim}
        epochs = {p: pm.leader_epoch for p, pm in partitions_of(broker_metadata(cluster, victim), topic).items()}
        stopping_at = len(producer.futures)

        assert cluster.brokers[victim].stop(60) == 0
        log = cluster.brokers[victim].log_path.read_text()
        assert f"controlled shutdown of broker {victim} succeeded" in log
        assert log.index("controlled shutdown of broker") < log.rindex(f"broker {victim} stopped")

        # the succeeded shutdown moved every leadership before the broker stopped; the other
        # brokers' metadata learns it from the controller's UpdateMetadata, or, when the
        # broker stopped was the controller and had not sent it yet, from the next one's
        others = [i for i in cluster.brokers if i != victim]

        def moved() -> bool | NotYet:
            stale = []
            for i in others:
                parts = partitions_of(broker_metadata(cluster, i), topic)
                stale += [f"broker {i}: {topic}-{p} led by {parts[p].leader_id} at epoch {parts[p].leader_epoch}"
                          for p in led if parts[p].leader_id not in others or parts[p].leader_epoch <= epochs[p]]
            return NotYet("; ".join(stale)) if stale else True

        wait_until(moved, 15, "the other brokers' metadata to show the moved leaders")
        producer.wait_acked(1000, 30, partition=0, since=stopping_at)
        acked = producer.finish()  # every record acknowledged: no error got past the retries

    assert_all_acked_present(cluster, topic, acked, PARTITIONS)


def test_a_topic_deleted_while_a_replica_is_down_completes_when_the_broker_returns(fresh_cluster_3):
    """A broker holding a replica of every partition of "doomed" is stopped, and the topic is
    deleted meanwhile. Until the broker returns the topic stays marked for deletion and its
    name cannot be taken again; once back, the broker deletes its copy and the deletion
    completes. A new "doomed" (RF 3: a replica of each partition on that broker again) then
    starts empty everywhere."""
    cluster, topic = fresh_cluster_3, "doomed"
    create_topic(cluster, topic)
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(300):
            producer.send(topic, b"old-%d" % i, key=b"%d" % i)
        producer.flush(timeout=60)
    down = max(i for i in cluster.brokers if i != controller_id(cluster, via=1))
    assert cluster.brokers[down].stop(60) == 0

    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.delete_topics([topic])
        with pytest.raises(TidelogError, match="is marked for deletion"):
            admin.create_topics([NewTopic(topic, PARTITIONS, 2)])
        cluster.brokers[down].start()
        cluster.wait_ready(60)

        def created_again() -> bool:
            try:
                admin.create_topics([NewTopic(topic, PARTITIONS, 3)])
                return True
            except TidelogError as e:
                if "marked for deletion" not in str(e):
                    raise
                return False
        wait_until(created_again, 30, f"{topic!r} deleted once broker {down} is back, and created again")
    wait_topic_ready(cluster, topic, PARTITIONS, 3)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    assert end_offsets(cluster.bootstrap, tps) == {tp: 0 for tp in tps}
    assert all(replica_records(cluster, down, topic, p) == [] for p in range(PARTITIONS))
