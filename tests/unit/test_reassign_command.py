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


# -- --cancel ---------------------------------------------------------------------------------------


class _Admin:
    """The admin calls ``--cancel`` makes, recorded; ``moving``: the moves still running."""

    def __init__(self, moving):
        self.moving = moving
        self.calls: list = []

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def describe_cluster(self, timeout_ms=None):
        from types import SimpleNamespace

        return SimpleNamespace(brokers=[SimpleNamespace(node_id=b, rack=None) for b in (1, 2, 3)])

    async def list_partition_reassignments(self, partitions=None):
        return {tp: None for tp in partitions if tp in self.moving}

    async def alter_partition_reassignments(self, moves, timeout_ms=None):
        from tidelog.protocol.errors import NONE

        self.calls.append(("cancel", sorted(moves)))
        return {tp: (NONE.code, None) for tp in moves}

    async def alter_broker_configs(self, broker, configs, timeout_ms=None):
        self.calls.append(("broker", broker, sorted(configs)))

    async def alter_configs(self, topic, configs, timeout_ms=None):
        self.calls.append(("topic", topic, sorted(configs)))


async def _cancel(monkeypatch, tmp_path, moving, preserve=False):
    import argparse

    from tidelog.commands import reassign

    path = tmp_path / "moves.json"
    path.write_text(EXPAND)
    admin = _Admin(moving)
    monkeypatch.setattr(reassign, "_admin", lambda args: admin)
    args = argparse.Namespace(reassignment_json_file=str(path), preserve_throttles=preserve, timeout_ms=1000,
                              connect_timeout_ms=1000, bootstrap="localhost:9092")
    return await reassign._cancel(args), admin.calls


@pytest.mark.parametrize("moving", [set(), {("foo1", 1)}])
async def test_cancel_clears_the_throttles_even_when_nothing_moves_any_more(monkeypatch, tmp_path, capsys, moving):
    """Kafka's cancelAssignment: the moves may have finished (or been cancelled) since
    --execute --throttle; the throttles they left are cleared all the same."""
    from tidelog import TopicPartition

    moving = {TopicPartition(t, p) for t, p in moving}
    code, calls = await _cancel(monkeypatch, tmp_path, moving)
    assert code == 0
    cancelled = [c for c in calls if c[0] == "cancel"]
    assert cancelled == ([("cancel", sorted(moving))] if moving else [])
    assert sorted(c[1] for c in calls if c[0] == "broker") == [1, 2, 3]
    assert sorted(c[1] for c in calls if c[0] == "topic") == ["foo1", "foo2"]
    out = capsys.readouterr().out
    assert ("None of the specified partition reassignments are active." in out) == (not moving)
    assert "Clearing topic-level throttles on topic foo2" in out


async def test_cancel_with_preserve_throttles_leaves_them(monkeypatch, tmp_path):
    code, calls = await _cancel(monkeypatch, tmp_path, set(), preserve=True)
    assert code == 0 and calls == []
