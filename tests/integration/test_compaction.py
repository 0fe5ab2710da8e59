"""Log compaction against real brokers (3 broker processes, real ZooKeeper).

A compacted topic with small segments gets many updates per key (and a few tombstones).
Every replica's cleaner must converge to one record per key below its active segment; a
consumer reading from the beginning then sees the latest value of every key, in increasing
offsets across the gaps compaction left; dump-log --verify passes on every replica's
segments; a record without a key is refused with an error naming the topic.
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, consume_range, end_offsets, wait_topic_ready
from tests.support.disk import log_dirs
from tests.support.waiting import wait_until
from tidelog import Admin, NewTopic, Producer, TopicPartition
from tidelog.broker.log.dump import run as dump_run
from tidelog.protocol.records import iter_all_records

TOPIC = "profiles"
KEYS = 40
UPDATES = 30
TOMBSTONED = {f"user-{i}".encode() for i in range(5)}


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    # small segments roll often, which is the point here: allow them (the API's minimums
    # are 1 MiB and 60 s, log.segment.min.bytes and log.roll.min.ms)
    yield from cluster_fixture(request, tmp_path_factory.mktemp("compaction"), 3,
                               {**FAST_FAILOVER, "log.cleaner.backoff.ms": 200,
                                "log.segment.min.bytes": 4096, "log.roll.min.ms": 1000})


def segment_files(cluster, broker_id):
    d = log_dirs(cluster)[broker_id] / f"{TOPIC}-0"
    return sorted(str(p) for p in d.glob("*.log"))


def replica_state(cluster, broker_id):
    """(keys below the active segment, records in the active segment) of one replica."""
    files = segment_files(cluster, broker_id)
    closed = []
    for path in files[:-1]:
        with open(path, "rb") as f:
            closed += [r.key for r in iter_all_records(f.read())]
    with open(files[-1], "rb") as f:
        active = list(iter_all_records(f.read()))
    return closed, active


def converged(cluster):
    for broker_id in cluster.brokers:
        try:
            closed, _ = replica_state(cluster, broker_id)
        except OSError:  # a swap renamed a file under us: look again
            return False
        counts = Counter(closed)
        if not closed or max(counts.values()) > 1:
            return False
    return True


def test_a_compacted_topic_converges_and_a_consumer_sees_the_latest_values(cluster):
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 3, config={
            "cleanup.policy": "compact", "segment.bytes": "4096", "segment.ms": "1500",
            "min.cleanable.dirty.ratio": "0.1", "delete.retention.ms": "3600000"})], timeout_ms=30000)
    wait_topic_ready(cluster, TOPIC, 1, 3)
    latest: dict[bytes, bytes | None] = {}
    with Producer(cluster.bootstrap, acks="all", linger_ms=2, batch_size=1024) as producer:
        futures = []
        for round_ in range(UPDATES):
            for i in range(KEYS):
                key = f"user-{i}".encode()
                value = None if round_ == UPDATES - 1 and key in TOMBSTONED else f"{key.decode()}@{round_}".encode()
                futures.append(producer.send(TOPIC, value, key=key))
                latest[key] = value
        producer.flush(timeout=60)
        for f in futures:
            f.result(timeout=10)
        with pytest.raises(Exception) as refused:
            producer.send(TOPIC, b"no key").result(timeout=30)
        assert "without a key" in str(refused.value) and TOPIC in str(refused.value)
        time.sleep(1.6)  # past segment.ms: the next append rolls the segment holding the updates
        producer.send(TOPIC, b"now", key=b"sentinel").result(timeout=30)
        latest[b"sentinel"] = b"now"

    wait_until(lambda: converged(cluster), 90, "every replica compacted to one record per key")
    for broker_id in cluster.brokers:
        closed, active = replica_state(cluster, broker_id)
        assert sorted(closed) == sorted(k for k in latest if k != b"sentinel")
        assert [r.key for r in active] == [b"sentinel"]

    tp = TopicPartition(TOPIC, 0)
    end = end_offsets(cluster.bootstrap, [tp])[tp]
    assert end == KEYS * UPDATES + 1
    records = consume_range(cluster.bootstrap, {tp: end})[tp]
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets)) and len(records) < end  # gaps, read across
    seen = {r.key: r.value for r in records}
    assert seen == latest
    assert len(records) == len(latest)

    for broker_id in cluster.brokers:
        files = segment_files(cluster, broker_id)
        with open(os.devnull, "w") as out:
            assert dump_run(files, verify=True, out=out) == 0, f"broker {broker_id}: dump-log --verify failed"


OFFSETS_SEGMENT_BYTES = 4096


@pytest.fixture(scope="module")
def offsets_cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("offsets-compaction"), 1, {
        **FAST_FAILOVER, "log.cleaner.backoff.ms": 200, "offsets.topic.num.partitions": 1,
        "offsets.topic.replication.factor": 1, "offsets.topic.segment.bytes": OFFSETS_SEGMENT_BYTES})


def offsets_partition_bytes(cluster):
    """The partition's segment bytes; None if the cleaner kept swapping segments between a
    listing and its sizes (each try lists again)."""
    d = log_dirs(cluster)[1] / "__consumer_offsets-0"
    for _ in range(100):
        try:
            return sum(p.stat().st_size for p in d.glob("*.log"))
        except FileNotFoundError:  # a swap renamed a segment under us
            continue
    return None


def test_consumer_offsets_stay_bounded_under_a_commit_load(offsets_cluster):
    """Thousands of commits of the same few (group, partition) keys: the cleaner keeps
    __consumer_offsets to about one record per key (plus the segments it may not clean yet)."""
    cluster = offsets_cluster
    with Admin(cluster.bootstrap, default_api_timeout_ms=30000) as admin:
        admin.create_topics([NewTopic("events", 4, 1)], timeout_ms=30000)
        wait_topic_ready(cluster, "events", 4, 1)
        tps = [TopicPartition("events", p) for p in range(4)]
        commits = 600
        for n in range(commits):
            admin.alter_group_offsets(f"group-{n % 3}", {tp: n for tp in tps})
        written = commits * len(tps) * 60  # at least ~60 bytes a committed offset record
        assert offsets_partition_bytes(cluster) is not None
        bound = 6 * OFFSETS_SEGMENT_BYTES  # a few segments: the active one, the uncleaned, the cleaned
        wait_until(lambda: (offsets_partition_bytes(cluster) or written) <= bound, 60,
                   f"__consumer_offsets-0 compacted below {bound} bytes ({written} bytes were committed)")
        for g in range(3):  # the last commit of each group survived
            committed = admin.list_group_offsets(f"group-{g}", tps)
            last = max(n for n in range(commits) if n % 3 == g)
            assert {o.partition: o.committed for o in committed} == {tp: last for tp in tps}
