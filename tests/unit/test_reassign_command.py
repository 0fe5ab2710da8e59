"""``tidelog reassign``'s JSON files and proposal: Kafka's documentation examples are read as
they are, Kafka's refusals are kept, and ``--generate`` places replicas by the creation rule."""

from __future__ import annotations

import json
import random

import pytest

from tidelog.commands.reassign import (
    generate,
    parse_reassignment,
    parse_topics_to_move,
    reassignment_json,
    throttled_replicas,
)

# kafka-reassign-partitions' examples, from Kafka's operations documentation
TOPICS_TO_MOVE = """{"topics": [{"topic": "foo1"},
            {"topic": "foo2"}],
 "version":1
}"""
EXPAND = """{"version":1,
 "partitions":[{"topic":"foo1","partition":0,"replicas":[5,6]},
               {"topic":"foo1","partition":1,"replicas":[5,6]},
               {"topic":"foo1","partition":2,"replicas":[5,6]},
               {"topic":"foo2","partition":0,"replicas":[5,6]},
               {"topic":"foo2","partition":1,"replicas":[5,6]},
               {"topic":"foo2","partition":2,"replicas":[5,6]}]
}"""
WITH_LOG_DIRS = """{"version":1,"partitions":[{"topic":"foo1","partition":0,"replicas":[2,1],"log_dirs":["any","any"]}]}"""
INCREASE_RF = """{"version":1,
 "partitions":[{"topic":"foo","partition":0,"replicas":[5,6,7]}]}"""


def test_kafka_documentation_files_are_read_as_they_are():
    assert parse_topics_to_move(json.loads(TOPICS_TO_MOVE)) == ["foo1", "foo2"]
    expand = parse_reassignment(json.loads(EXPAND))
    assert len(expand) == 6 and expand[("foo2", 1)] == [5, 6]
    assert parse_reassignment(json.loads(WITH_LOG_DIRS)) == {("foo1", 0): [2, 1]}
    assert parse_reassignment(json.loads(INCREASE_RF)) == {("foo", 0): [5, 6, 7]}


def test_what_is_written_reads_back_and_is_kafkas_shape():
    assignment = {("foo", 1): [3, 1], ("foo", 0): [1, 2]}
    text = reassignment_json(assignment)
    assert json.loads(text)["partitions"][0] == {"topic": "foo", "partition": 0, "replicas": [1, 2],
                                                 "log_dirs": ["any", "any"]}
    assert parse_reassignment(json.loads(text)) == assignment


@pytest.mark.parametrize("doc, words", [
    ({"partitions": [{"topic": "a", "partition": 0, "replicas": []}]}, "cannot be empty"),
    ({"partitions": [{"topic": "a", "partition": 0, "replicas": [1, 1]}]}, "names a broker twice"),
    ({"partitions": [{"topic": "a", "partition": 0, "replicas": [1]}] * 2}, "more than once"),
    ({"partitions": [{"topic": "a", "partition": -1, "replicas": [1]}]}, "non-negative"),
    ({"partitions": [{"topic": "a", "partition": 0, "replicas": [1], "log_dirs": ["/d", "/e"]}]}, "one entry per"),
    ({"partitions": [{"topic": "a", "partition": 0, "replicas": [1], "log_dirs": ["/data"]}]}, '"any"'),
    ({"partitions": []}, "no partition"),
    ({"topics": []}, "expected"),
    ([], "expected"),
])
def test_bad_reassignment_files_name_the_problem(doc, words):
    with pytest.raises(ValueError, match=words):
        parse_reassignment(doc)


def test_bad_topic_files_name_the_problem():
    with pytest.raises(ValueError, match="more than once"):
        parse_topics_to_move({"topics": [{"topic": "a"}, {"topic": "a"}]})
    with pytest.raises(ValueError, match=r"topics\[0\]"):
        parse_topics_to_move({"topics": ["a"]})


def test_generate_keeps_counts_and_factors_and_uses_only_the_listed_brokers():
    current = {("a", p): [1, 2, 3] for p in range(6)} | {("b", p): [2, 3] for p in range(3)}
    proposal = generate(current, [2, 3, 4], None, rng=random.Random(7))
    assert set(proposal) == set(current)
    assert all(len(proposal[tp]) == len(current[tp]) for tp in current)
    assert {b for r in proposal.values() for b in r} <= {2, 3, 4}  # broker 1 is drained
    leaders = [proposal[("a", p)][0] for p in range(6)]
    assert sorted(leaders) == [2, 2, 3, 3, 4, 4]  # leadership spread as at creation


def test_generate_spreads_replicas_over_racks():
    current = {("a", p): [1, 2] for p in range(4)}
    racks = {1: "r1", 2: "r1", 3: "r2", 4: "r2"}
    proposal = generate(current, [1, 2, 3, 4], racks, rng=random.Random(1))
    assert all({racks[b] for b in r} == {"r1", "r2"} for r in proposal.values())


def test_the_cli_throttles_the_sources_leader_side_and_the_new_replicas_follower_side():
    current = {("t", 0): [1, 2, 3], ("t", 1): [2, 3, 1], ("u", 0): [1, 2]}
    wanted = {("t", 0): [4, 2, 3], ("t", 1): [2, 3, 1], ("u", 0): [2, 5]}
    assert throttled_replicas(wanted, current) == {"t": ("0:1,0:2,0:3", "0:4"), "u": ("0:1,0:2", "0:5")}
