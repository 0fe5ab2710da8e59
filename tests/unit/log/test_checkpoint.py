"""Checkpoint files (broker.log.checkpoint): Kafka's text format, atomic writes, corruption.

The format is fixed by docs/architecture.md (section 8): a version line, a count line, then one entry per
line. A file that does not parse must raise CorruptCheckpointError naming the file (callers
then fall back to "no checkpoint"), never return wrong entries or another exception.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidelog.broker.log.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_CHECKPOINT,
    CheckpointFile,
    CorruptCheckpointError,
    LeaderEpochCheckpoint,
    OffsetCheckpoint,
    atomic_write,
)
from tidelog.protocol.errors import StorageError
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition


def test_file_names_are_kafkas():
    assert RECOVERY_POINT_CHECKPOINT == "recovery-point-offset-checkpoint"
    assert REPLICATION_CHECKPOINT == "replication-offset-checkpoint"
    assert LOG_START_OFFSET_CHECKPOINT == "log-start-offset-checkpoint"
    assert LEADER_EPOCH_CHECKPOINT == "leader-epoch-checkpoint"


def test_offset_checkpoint_format_is_exact(tmp_path):
    path = tmp_path / "replication-offset-checkpoint"
    cp = OffsetCheckpoint(str(path))
    cp.write({TP("orders", 1): 42, TP("audit.log", 0): 7, TP("orders", 0): 0})
    # sorted by (topic, partition); version 0; count; "topic partition offset"
    assert path.read_bytes() == b"0\n3\naudit.log 0 7\norders 0 0\norders 1 42\n"
    assert cp.read() == {TP("orders", 1): 42, TP("audit.log", 0): 7, TP("orders", 0): 0}
    assert cp.path == str(path)


def test_empty_checkpoint_format(tmp_path):
    path = tmp_path / "cp"
    OffsetCheckpoint(str(path)).write({})
    assert path.read_bytes() == b"0\n0\n"
    assert OffsetCheckpoint(str(path)).read() == {}


def test_missing_file_reads_as_empty(tmp_path):
    assert OffsetCheckpoint(str(tmp_path / "nope")).read() == {}
    assert LeaderEpochCheckpoint(str(tmp_path / "nope")).read() == []


def test_reads_a_file_written_by_kafka(tmp_path):
    path = tmp_path / "recovery-point-offset-checkpoint"
    path.write_bytes(b"0\n2\n__consumer_offsets 12 1003\nmy-topic 0 987654321012\n")
    assert OffsetCheckpoint(str(path)).read() == {TP("__consumer_offsets", 12): 1003,
                                                  TP("my-topic", 0): 987654321012}


def test_leader_epoch_checkpoint_format_is_exact(tmp_path):
    path = tmp_path / "leader-epoch-checkpoint"
    cp = LeaderEpochCheckpoint(str(path))
    cp.write([(0, 0), (3, 120), (7, 4000)])
    assert path.read_bytes() == b"0\n3\n0 0\n3 120\n7 4000\n"
    assert cp.read() == [(0, 0), (3, 120), (7, 4000)]
    assert cp.path == str(path)


def test_write_replaces_and_leaves_no_tmp(tmp_path):
    path = tmp_path / "cp"
    cp = OffsetCheckpoint(str(path))
    cp.write({TP("a", 0): 1})
    cp.write({TP("b", 0): 2})
    assert cp.read() == {TP("b", 0): 2}
    assert sorted(os.listdir(tmp_path)) == ["cp"]


def test_atomic_write_overwrites_a_stale_tmp(tmp_path):
    path = tmp_path / "cp"
    (tmp_path / "cp.tmp").write_bytes(b"garbage from a crash")
    atomic_write(str(path), b"0\n0\n")
    assert path.read_bytes() == b"0\n0\n"
    assert sorted(os.listdir(tmp_path)) == ["cp"]


def test_atomic_write_never_exposes_a_torn_file(tmp_path, monkeypatch):
    """A failure between writing the temp file and the rename leaves the old file intact."""
    path = tmp_path / "cp"
    cp = OffsetCheckpoint(str(path))
    cp.write({TP("a", 0): 1})

    def boom(src, dst):
        raise OSError("simulated crash before rename")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        cp.write({TP("a", 0): 2})
    monkeypatch.undo()
    assert cp.read() == {TP("a", 0): 1}


CORRUPT_OFFSET_FILES = {
    "empty": b"",
    "only version": b"0\n",
    "bad version": b"1\n0\n",
    "version text": b"x\n0\n",
    "count text": b"0\nthree\n",
    "count too high": b"0\n2\na 0 1\n",
    "count too low": b"0\n1\na 0 1\nb 0 2\n",
    "negative count": b"0\n-1\n",
    "two fields": b"0\n1\na 0\n",
    "four fields": b"0\n1\na 0 1 2\n",
    "offset text": b"0\n1\na 0 x\n",
    "partition text": b"0\n1\na x 1\n",
    "negative offset": b"0\n1\na 0 -5\n",
    "negative partition": b"0\n1\na -1 5\n",
    "empty topic": b"0\n1\n 0 5\n",
    "not utf-8": b"0\n1\n\xff\xfe 0 1\n",
    "binary garbage": bytes(range(256)),
    "truncated entry": b"0\n2\na 0 1\nb 0",
    "tab separated": b"0\n1\na\t0\t1\n",
}


@pytest.mark.parametrize("name", sorted(CORRUPT_OFFSET_FILES))
def test_corrupt_offset_checkpoint_raises_naming_the_file(tmp_path, name):
    path = tmp_path / "replication-offset-checkpoint"
    path.write_bytes(CORRUPT_OFFSET_FILES[name])
    with pytest.raises(CorruptCheckpointError, match="replication-offset-checkpoint") as info:
        OffsetCheckpoint(str(path)).read()
    assert isinstance(info.value, StorageError)
    assert str(path) in str(info.value)


CORRUPT_EPOCH_FILES = {
    "epoch text": b"0\n1\nx 0\n",
    "three fields": b"0\n1\n1 2 3\n",
    "negative epoch": b"0\n1\n-1 0\n",
    "epochs decreasing": b"0\n2\n5 0\n3 10\n",
    "epochs repeated": b"0\n2\n5 0\n5 10\n",
    "offsets decreasing": b"0\n2\n1 10\n2 5\n",
    "count mismatch": b"0\n3\n1 0\n",
}


@pytest.mark.parametrize("name", sorted(CORRUPT_EPOCH_FILES))
def test_corrupt_leader_epoch_checkpoint_raises_naming_the_file(tmp_path, name):
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_bytes(CORRUPT_EPOCH_FILES[name])
    with pytest.raises(CorruptCheckpointError, match="leader-epoch-checkpoint"):
        LeaderEpochCheckpoint(str(path)).read()


def test_line_number_is_named(tmp_path):
    path = tmp_path / "cp"
    path.write_bytes(b"0\n2\na 0 1\nb zero 2\n")
    with pytest.raises(CorruptCheckpointError, match="line 4"):
        OffsetCheckpoint(str(path)).read()


topics = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABC0123456789._-", min_size=1, max_size=20)
offset_maps = st.dictionaries(st.builds(TP, topics, st.integers(0, 10_000)),
                              st.integers(0, 2**63 - 1), max_size=20)


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(offsets=offset_maps)
def test_offset_checkpoint_round_trips(tmp_path, offsets):
    cp = OffsetCheckpoint(str(tmp_path / "cp"))
    cp.write(offsets)
    assert cp.read() == offsets
    lines = (tmp_path / "cp").read_text().split("\n")
    assert lines[0] == "0" and lines[1] == str(len(offsets)) and lines[-1] == ""


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.binary(max_size=80),
                     st.lists(st.sampled_from(["0", "1", "2", "a 0 1", "b 1 2", "x", "", "-1", "a 0 -1",
                                               "0 0", "1 5", "a  0 1"]), max_size=6)
                     .map(lambda ls: "\n".join(ls).encode())))
def test_reading_arbitrary_bytes_parses_or_raises_corrupt(tmp_path, raw):
    path = tmp_path / "cp"
    path.write_bytes(raw)
    for reader in (OffsetCheckpoint(str(path)), LeaderEpochCheckpoint(str(path))):
        try:
            entries = reader.read()
        except CorruptCheckpointError as e:
            assert str(path) in str(e)
            continue
        # whatever parses re-serialises to the same entries
        reader.write(entries)
        assert reader.read() == entries
        path.write_bytes(raw)


def test_generic_checkpoint_file(tmp_path):
    cp = CheckpointFile(str(tmp_path / "g"), lambda e: f"{e[0]}={e[1]}",
                        lambda fields: tuple(fields[0].split("=")))
    cp.write([("a", "1"), ("b", "2")])
    assert (tmp_path / "g").read_text() == "0\n2\na=1\nb=2\n"
    assert cp.read() == [("a", "1"), ("b", "2")]
