"""The log layer creates, renames and deletes nothing outside its log dirs (issue 14, point 2;
broker.log.paths), whatever its callers checked: topic-partitions are handed straight to the
LogManager here, with ``..``, absolute paths, NUL, separators, names too long for a file,
partitions out of range, and symlinks planted in a log dir."""

from __future__ import annotations

import logging
import os

import pytest

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.loader import load_log
from tidelog.broker.log.manager import LogManager
from tidelog.broker.log.paths import LogPathError, check_inside, check_partition_dir, partition_dir
from tidelog.protocol.errors import INVALID_TOPIC_EXCEPTION
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import TopicPartition

HOSTILE = [
    TopicPartition("../victim", 0),
    TopicPartition("..", 0),
    TopicPartition(".", 0),
    TopicPartition("../../../../tmp/escaped", 0),
    TopicPartition("/tmp/absolute", 0),
    TopicPartition("a/b", 0),
    TopicPartition("a\\b", 0),
    TopicPartition("nul\x00byte", 0),
    TopicPartition("space name", 0),
    TopicPartition("new\nline", 0),
    TopicPartition("x" * 300, 0),  # too long for a file name (ENAMETOOLONG in the fuzzer)
    TopicPartition("", 0),
    TopicPartition("ok", -1),
    TopicPartition("ok", 1 << 31),
    TopicPartition("ok", "0/../../x"),  # type: ignore[arg-type]
]


def hostile_id(tp: TopicPartition) -> str:
    return repr(tp)[:40]


@pytest.fixture
def dirs(tmp_path):
    """Two log dirs side by side, and a directory next to them that must stay untouched."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep me")
    log_dirs = [tmp_path / "logs-a", tmp_path / "logs-b"]
    return log_dirs, outside


def manager(log_dirs) -> LogManager:
    m = LogManager([str(d) for d in log_dirs], LogConfig(segment_bytes=1 << 20), broker_id=1, cluster_id="c")
    m.startup()
    return m


def tree(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs}


@pytest.mark.parametrize("tp", HOSTILE, ids=hostile_id)
def test_a_log_is_never_created_for_an_invalid_topic_partition(dirs, tmp_path, tp):
    log_dirs, outside = dirs
    m = manager(log_dirs)
    before = tree(tmp_path)
    with pytest.raises(LogPathError) as refused:
        m.get_or_create_log(tp)
    assert refused.value.error is INVALID_TOPIC_EXCEPTION
    assert tree(tmp_path) == before  # nothing created anywhere
    assert m.get_log(tp) is None and tp not in m.logs
    m.checkpoint_all()  # checkpoints stay parseable: no such entry in them
    m.shutdown()
    m2 = manager(log_dirs)
    assert list(m2.logs) == []
    m2.shutdown()
    assert (outside / "precious").read_text() == "keep me"


@pytest.mark.parametrize("tp", HOSTILE, ids=hostile_id)
def test_deleting_an_invalid_topic_partition_touches_nothing(dirs, tmp_path, tp):
    log_dirs, outside = dirs
    m = manager(log_dirs)
    good = m.get_or_create_log(TopicPartition("good", 0))
    good.append_as_leader(build_batch([b"v"]), 0)
    before = tree(tmp_path)
    assert m.delete_log(tp) is None
    assert tree(tmp_path) == before
    assert (outside / "precious").read_text() == "keep me"
    m.shutdown()


def test_a_log_whose_directory_escapes_is_not_deleted(dirs, tmp_path):
    """Defence in depth below the manager's map: if a log's directory were ever somewhere else
    (a bug, a tampered object), delete_log and Log.delete refuse instead of removing it."""
    log_dirs, outside = dirs
    m = manager(log_dirs)
    tp = TopicPartition("victim", 0)
    log = m.get_or_create_log(tp)
    log.directory = str(outside)
    with pytest.raises(LogPathError):
        m.delete_log(tp)
    with pytest.raises(LogPathError):
        log.delete()
    assert (outside / "precious").read_text() == "keep me"
    assert m.get_log(tp) is log  # still managed: nothing was half done


def test_a_log_directory_that_is_a_symlink_out_of_the_log_dir_is_ignored(dirs, tmp_path, caplog):
    log_dirs, outside = dirs
    m = manager(log_dirs)
    m.shutdown()
    os.symlink(outside, log_dirs[0] / "planted-0")
    os.symlink(outside, log_dirs[0] / "planted-1.0123abcd-delete")  # what startup would remove
    with caplog.at_level(logging.WARNING, logger="tidelog.log.manager"):
        m = manager(log_dirs)
    assert TopicPartition("planted", 0) not in m.logs
    assert sorted(os.listdir(outside)) == ["precious"]
    assert (outside / "precious").read_text() == "keep me"
    assert "planted-0" in caplog.text and "not to an entry of the log directory" in caplog.text
    # and a new log of that name is not created through the link either
    with pytest.raises(LogPathError):
        m.get_or_create_log(TopicPartition("planted", 0))
    assert sorted(os.listdir(outside)) == ["precious"]
    m.shutdown()


def test_valid_partitions_work_as_before(dirs, tmp_path):
    log_dirs, _ = dirs
    m = manager(log_dirs)
    tps = [TopicPartition("a.b_c-d", 0), TopicPartition("x" * 249, 99_999), TopicPartition("...", 3)]
    for tp in tps:
        m.get_or_create_log(tp).append_as_leader(build_batch([b"v"]), 0)
    m.shutdown()
    m = manager(log_dirs)
    assert sorted(m.logs) == sorted(tps)
    for tp in tps[:2]:  # the longest name too: its "-delete" name is cut to fit
        assert m.delete_log(tp) is not None
        assert tp not in m.logs
    assert [n for d in log_dirs for n in os.listdir(d) if (d / n).is_dir()] == ["...-3"]
    m.shutdown()
    m = manager(log_dirs)
    assert list(m.logs) == [tps[2]]
    m.shutdown()


def test_a_directory_name_too_long_for_the_file_system_is_refused_before_the_os_is_asked(dirs, tmp_path):
    log_dirs, _ = dirs
    m = manager(log_dirs)
    before = tree(tmp_path)
    with pytest.raises(LogPathError, match="longer than 255|more than 255"):
        m.get_or_create_log(TopicPartition("x" * 249, 100_000))
    assert tree(tmp_path) == before
    m.shutdown()


def test_the_path_checks():
    assert partition_dir("/data/logs", TopicPartition("t", 3)) == "/data/logs/t-3"
    check_inside("/data/logs", "/data/logs/t-3")
    for path in ("/data/logs/../t-3", "/data/logs/a/b", "/data/other", "/data/logs", "/data/logs/.."):
        with pytest.raises(LogPathError):
            check_inside("/data/logs", path)
    check_partition_dir("/data/logs/t-3", TopicPartition("t", 3))
    for directory, tp in (("/data/logs/t-4", TopicPartition("t", 3)), ("/data/logs/t-3", TopicPartition("../t", 3))):
        with pytest.raises(LogPathError):
            check_partition_dir(directory, tp)


def test_a_log_loaded_by_hand_outside_its_name_cannot_delete_itself(tmp_path):
    directory = tmp_path / "not-a-partition-dir"
    log = load_log(str(directory), TopicPartition("t", 0), LogConfig())
    with pytest.raises(LogPathError):
        log.delete()
    assert directory.exists()
    log.close()
