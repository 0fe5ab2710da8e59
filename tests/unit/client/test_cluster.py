"""Bootstrap parsing, the metadata snapshot, backoff."""

from __future__ import annotations

import pytest

from tidelog.aio.cluster import Backoff, ClusterMetadata, parse_bootstrap
from tidelog.protocol.errors import LEADER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION
from tidelog.protocol.messages import BrokerMetadata, MetadataResponse, PartitionMetadata, TopicMetadata
from tidelog.protocol.topics import TopicPartition


@pytest.mark.parametrize("text,expected", [
    ("localhost:9092", [("localhost", 9092)]),
    ("a:1, b:2,,c:3 ", [("a", 1), ("b", 2), ("c", 3)]),
    ("[::1]:9092", [("::1", 9092)]),
    (["h1:1", "h2:2"], [("h1", 1), ("h2", 2)]),
])
def test_parse_bootstrap(text, expected):
    assert parse_bootstrap(text) == expected


@pytest.mark.parametrize("text", ["", "localhost", "h:", ":9092", "h:x", "h:0", "h:70000", " , "])
def test_parse_bootstrap_rejects(text):
    with pytest.raises(ValueError):
        parse_bootstrap(text)


def response(topics, brokers=(0, 1), controller=1):
    return MetadataResponse([BrokerMetadata(n, f"h{n}", 9000 + n) for n in brokers], "cid", controller, topics)


def topic(name, leaders, epoch=3):
    return TopicMetadata(0, name, [PartitionMetadata(0, p, leader, epoch, [leader, 9], [leader])
                                   for p, leader in enumerate(leaders)])


def test_merge_builds_brokers_topics_and_leaders():
    md = ClusterMetadata().merge(response([topic("a", [0, 1, -1])]), None)
    assert md.version == 1 and md.cluster_id == "cid" and md.controller_id == 1
    assert set(md.brokers) == {0, 1}
    assert md.partitions_for("a") == (0, 1, 2)
    assert md.available_partitions_for("a") == (0, 1)
    assert md.leader_for(TopicPartition("a", 1)) == 1
    assert md.leader_for(TopicPartition("a", 2)) is None  # no leader
    assert md.leader_for(TopicPartition("a", 7)) is None
    assert md.leader_for(TopicPartition("b", 0)) is None
    p = md.partition(TopicPartition("a", 0))
    assert (p.leader, p.leader_epoch, p.replicas, p.isr) == (0, 3, (0, 9), (0,))


def test_a_leader_that_is_not_a_live_broker_is_unknown():
    md = ClusterMetadata().merge(response([topic("a", [5])]), None)
    assert md.leader_for(TopicPartition("a", 0)) is None


def test_merge_for_some_topics_keeps_the_others():
    md = ClusterMetadata().merge(response([topic("a", [0]), topic("b", [1])]), None)
    md = md.merge(response([topic("a", [1, 1])]), ["a"])
    assert md.partitions_for("a") == (0, 1) and md.partitions_for("b") == (0,)
    md = md.merge(response([topic("x", [0])]), None)  # an all-topics answer replaces the listing
    assert set(md.topics) == {"x"}


def test_topics_answered_with_an_error_are_recorded_not_kept():
    md = ClusterMetadata().merge(response([topic("a", [0])]), None)
    md = md.merge(response([TopicMetadata(UNKNOWN_TOPIC_OR_PARTITION.code, "a"),
                            TopicMetadata(LEADER_NOT_AVAILABLE.code, "b")]), ["a", "b"])
    assert md.partitions_for("a") is None
    assert md.topic_errors == {"a": UNKNOWN_TOPIC_OR_PARTITION.code, "b": LEADER_NOT_AVAILABLE.code}
    md = md.merge(response([topic("a", [0])]), ["a"])
    assert md.topic_errors == {"b": LEADER_NOT_AVAILABLE.code}


def test_backoff_doubles_up_to_its_maximum_with_jitter():
    b = Backoff(0.1, 1.0)
    delays = [b.next_delay() for _ in range(8)]
    assert 0.08 <= delays[0] <= 0.12 and 0.16 <= delays[1] <= 0.24
    assert delays[-1] == 1.0 and all(d <= 1.0 for d in delays)
    b.reset()
    assert b.next_delay() <= 0.12
