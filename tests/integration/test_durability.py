"""Durability of rolled segments on a real broker: with the flush settings at their defaults
(nothing flushed by time or count, as in Kafka), every roll is followed by an fsync of the
closed segment and the recovery point moves to the active segment, so that the checkpoint a
crash finds names it and recovery re-reads only that segment."""

from __future__ import annotations

import pytest

from tests.support.cluster import cluster_fixture, wait_topic_ready
from tests.support.disk import log_dir
from tests.support.waiting import wait_until
from tidelog import Admin, NewTopic, Producer, TopicPartition
from tidelog.broker.log.checkpoint import RECOVERY_POINT_CHECKPOINT, OffsetCheckpoint

TOPIC = "rolled"


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("durability"), 1,
                               {"log.flush.offset.checkpoint.interval.ms": 500, "log.segment.min.bytes": 100000})


def test_the_recovery_point_follows_the_rolls(cluster):
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(TOPIC, 1, 1, config={"segment.bytes": "100000"})])
    wait_topic_ready(cluster, TOPIC, 1, 1)
    with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
        for i in range(600):
            producer.send(TOPIC, b"%d" % i + b"x" * 1000, partition=0)
        producer.flush(timeout=60)
    directory = log_dir(cluster, 1)
    segments = sorted(int(p.name.split(".")[0]) for p in (directory / f"{TOPIC}-0").iterdir()
                      if p.name.endswith(".log"))
    assert len(segments) >= 3
    checkpoint = OffsetCheckpoint(str(directory / RECOVERY_POINT_CHECKPOINT))
    wait_until(lambda: checkpoint.read().get(TopicPartition(TOPIC, 0), 0) >= segments[-1], 30,
               "the recovery point checkpointed at the active segment's base")
