"""A log dir that fails (an OSError on it: a full disk, an I/O error, no descriptors left) as the
log layer sees it: the operation that met it raises LogDirFailure (KAFKA_STORAGE_ERROR) naming
the dir, the log manager notes it once, and the dir taken offline loses its logs, gets no new
partition, no checkpoint and no clean-shutdown marker, while the other dirs carry on."""

from __future__ import annotations

import errno
import os

import pytest

from tests.unit.log.helpers import FailingDir, make_batch
from tidelog.broker.log.checkpoint import RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import LogDirFailure
from tidelog.broker.log.manager import CLEAN_SHUTDOWN_MARKER, LogManager
from tidelog.protocol.errors import KAFKA_STORAGE_ERROR, StorageError
from tidelog.protocol.topics import TopicPartition

A, B, C = TopicPartition("a", 0), TopicPartition("b", 0), TopicPartition("c", 0)
CONFIG = LogConfig(segment_bytes=1000, index_interval_bytes=100, retention_ms=-1)


@pytest.fixture
def manager(tmp_path):
    """A log manager of two dirs, A's log in the first and B's in the second."""
    m = LogManager([str(tmp_path / "d1"), str(tmp_path / "d2")], CONFIG, broker_id=1)
    m.startup()
    found = []
    m.on_dir_failure_found = lambda: found.append(True)
    m.found = found
    for tp in (A, B):
        m.get_or_create_log(tp).append_as_leader(make_batch(2), 0)
    yield m
    m.shutdown()


@pytest.mark.parametrize("call, code", [("pwrite", errno.ENOSPC), ("fsync", errno.EIO)])
def test_an_os_error_is_a_failure_of_the_log_dir(manager, monkeypatch, call, code):
    d1, d2 = manager.log_dirs
    failing = FailingDir(monkeypatch, d1, call, code)
    log = manager.get_log(A)

    def append_and_flush():
        log.append_as_leader(make_batch(1), 0)
        log.flush()
    with pytest.raises(LogDirFailure) as e:
        append_and_flush()
    assert isinstance(e.value, StorageError) and e.value.code == KAFKA_STORAGE_ERROR.code
    assert e.value.log_dir == d1 and d1 in str(e.value) and os.strerror(code) in str(e.value)
    assert failing.calls == 1
    # noted once (the owner is woken once), then taken offline by the owner
    with pytest.raises(LogDirFailure):
        append_and_flush()
    assert manager.found == [True]
    assert list(manager.pending_dir_failures()) == [d1]


def test_a_truncation_whose_recovery_checkpoint_fails_is_a_failure_of_its_dir(manager, monkeypatch):
    log = manager.get_log(A)
    log.append_as_leader(make_batch(2), 0)
    log.flush()
    FailingDir(monkeypatch, manager.log_dirs[0], "fsync", errno.EIO)
    with pytest.raises(LogDirFailure):
        log.truncate_to(1)  # its lowered recovery point is checkpointed at once
    assert list(manager.pending_dir_failures()) == [manager.log_dirs[0]]


def test_an_offline_dir_loses_its_logs_and_gets_nothing_more(manager, monkeypatch, tmp_path):
    d1, d2 = manager.log_dirs
    FailingDir(monkeypatch, d1)
    with pytest.raises(LogDirFailure):
        manager.get_log(A).append_as_leader(make_batch(1), 0)
    (reason,) = manager.pending_dir_failures().values()
    monkeypatch.undo()  # the disk answers again: the dir stays offline until the broker restarts
    assert manager.take_dir_offline(d1, reason) == [A]
    assert manager.take_dir_offline(d1, reason) == []
    assert manager.offline_dirs == {d1: reason} and manager.live_log_dirs == [d2]
    assert manager.get_log(A) is None and manager.is_offline(A) and not manager.is_offline(B)
    # its log is not made again elsewhere, and new partitions go to the dirs left
    with pytest.raises(StorageError, match=f"its log dir {d1} is offline"):
        manager.get_or_create_log(A)
    assert manager.get_or_create_log(C).log_dir == d2
    # nothing is written to it: checkpoints and the clean-shutdown marker go to d2 only
    before = {name: os.path.getmtime(os.path.join(d1, name)) for name in os.listdir(d1)}
    manager.checkpoint_all()
    manager.flush_dirty_logs()
    manager.shutdown()
    assert {name: os.path.getmtime(os.path.join(d1, name)) for name in os.listdir(d1)} == before
    assert not os.path.exists(os.path.join(d1, CLEAN_SHUTDOWN_MARKER))
    assert os.path.exists(os.path.join(d2, CLEAN_SHUTDOWN_MARKER))


def test_periodic_work_goes_on_with_the_other_dirs(manager, monkeypatch):
    d1, d2 = manager.log_dirs
    for name in (RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT):
        for d in (d1, d2):
            os.unlink(os.path.join(d, name)) if os.path.exists(os.path.join(d, name)) else None
    FailingDir(monkeypatch, d1, "fsync", errno.EIO)
    manager.checkpoint_all()
    manager.flush_dirty_logs()
    assert list(manager.pending_dir_failures()) == [d1]
    assert os.path.exists(os.path.join(d2, RECOVERY_POINT_CHECKPOINT))
    assert os.path.exists(os.path.join(d2, REPLICATION_CHECKPOINT))


def test_a_log_whose_creation_fails_is_offline_with_its_dir(manager, monkeypatch):
    d1, _ = manager.log_dirs
    manager.take_dir_offline(manager.log_dirs[1], "a test")  # C can only go to d1
    FailingDir(monkeypatch, d1, "open", errno.EMFILE)
    with pytest.raises(LogDirFailure, match="creating the log of c-0"):
        manager.get_or_create_log(C)
    assert manager.is_offline(C)
    assert sorted(manager.take_dir_offline(d1, "failed")) == [A, C]
    with pytest.raises(StorageError, match="every log dir is offline"):
        manager.get_or_create_log(TopicPartition("d", 0))
