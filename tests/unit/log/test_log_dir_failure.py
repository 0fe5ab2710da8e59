"""A log dir that fails (an OSError on it: a full disk, an I/O error, no descriptors left) as the
log layer sees it: the operation that met it raises LogDirFailure (KAFKA_STORAGE_ERROR) naming
the dir, the log manager notes it once, and the dir taken offline loses its logs, gets no new
partition, no checkpoint and no clean-shutdown marker, while the other dirs carry on."""

from __future__ import annotations

import errno
import fcntl
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
    with pytest.raises(StorageError, match=f"its log dir {d1} failed"):
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


def plant_unreadable_segment(log_dir: str, tp: TopicPartition) -> None:
    """A directory where the partition's first segment's index is: opening it fails
    (IsADirectoryError, an OSError as EIO would be) while the log is loaded."""
    index = os.path.join(log_dir, tp.dir_name, "00000000000000000000.index")
    if os.path.exists(index):
        os.unlink(index)
    os.mkdir(index)


def restarted(manager: LogManager) -> LogManager:
    manager.shutdown()
    m = LogManager(manager.log_dirs, CONFIG, broker_id=1)
    return m


def test_a_dir_failing_while_the_logs_load_is_offline_and_the_others_load(manager):
    d1, d2 = manager.log_dirs
    m = restarted(manager)
    plant_unreadable_segment(d2, B)
    m.startup()
    try:
        assert list(m.offline_dirs) == [d2] and "loading" in m.offline_dirs[d2]
        assert m.live_log_dirs == [d1]
        assert m.get_log(A).log_end_offset == 2  # the other dir's log is there
        assert m.get_log(B) is None and m.is_offline(B)
        with pytest.raises(StorageError, match="log dir .*d2 failed"):
            m.get_or_create_log(B, is_new=True)  # known to be in the failed dir
        before = {name: os.path.getmtime(os.path.join(d2, name)) for name in os.listdir(d2)}
    finally:
        m.shutdown()
    # nothing was written to it: its logs are as the last shutdown left them, marker included
    assert {name: os.path.getmtime(os.path.join(d2, name)) for name in os.listdir(d2)} == before


def test_a_replica_not_new_and_not_found_may_be_in_the_failed_dir(manager, monkeypatch, tmp_path):
    """The dir fails before its partitions are listed (Kafka does not know them either): a
    replica that has no log and is not new is offline; a new one is created in a live dir."""
    d1, d2 = manager.log_dirs
    m = restarted(manager)
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda d: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error"))
                        if d == d2 else real_listdir(d))
    m.startup()
    try:
        assert list(m.offline_dirs) == [d2] and not m.is_offline(B)
        with pytest.raises(StorageError, match="no log in the log dirs online.*d2"):
            m.get_or_create_log(B, is_new=False)
        assert m.is_offline(B)
        with pytest.raises(StorageError):  # offline until the broker restarts, new or not
            m.get_or_create_log(B, is_new=True)
        assert m.get_or_create_log(A, is_new=False).log_end_offset == 2  # found in a live dir
        assert m.get_or_create_log(C, is_new=True).log_dir == d1
    finally:
        m.shutdown()


def test_a_broker_whose_every_dir_fails_to_load_does_not_start(manager):
    m = restarted(manager)
    for d, tp in zip(m.log_dirs, (A, B)):
        plant_unreadable_segment(d, tp)
    with pytest.raises(StorageError, match="every log dir failed while loading: log dir .*d1.*; log dir .*d2"):
        m.startup()


def test_a_dir_that_is_no_directory_is_offline_from_the_start(tmp_path):
    (tmp_path / "file").write_text("not a log dir")
    m = LogManager([str(tmp_path / "file"), str(tmp_path / "d")], CONFIG, broker_id=1)
    m.startup()
    try:
        assert list(m.offline_dirs) == [str(tmp_path / "file")]
        m.get_or_create_log(A)
        assert m.get_log(A) is not None
    finally:
        m.shutdown()


def test_a_dir_whose_lock_fails_for_want_of_a_lock_is_offline_from_the_start(tmp_path, monkeypatch):
    """An OSError taking the lock other than "held by another" (no locks available, as on an
    NFS mount without its lock service) is the dir failing, as Kafka's lockLogDirs has it."""
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    real_flock = fcntl.flock

    def flock(fd, operation):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(d1 + os.sep):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        return real_flock(fd, operation)
    monkeypatch.setattr(fcntl, "flock", flock)
    m = LogManager([d1, d2], CONFIG, broker_id=1)
    m.startup()
    try:
        assert list(m.offline_dirs) == [d1] and "locking its .lock" in m.offline_dirs[d1]
        assert os.strerror(errno.ENOLCK) in m.offline_dirs[d1]
        assert m.get_or_create_log(A).log_dir == d2
    finally:
        m.shutdown()
    assert sorted(os.listdir(d1)) == [".lock"]  # not read, nothing written: no meta.properties, no marker


def test_a_dir_taken_offline_lets_its_lock_go(manager):
    """Its files are not touched again, and no descriptor of the broker's keeps its disk."""
    d1, d2 = manager.log_dirs
    manager.take_dir_offline(d1, "a failure")
    other = LogManager([d1], CONFIG, broker_id=1)
    other.startup()
    other.shutdown()
    with pytest.raises(StorageError, match=f"lock on file .lock in {d2}"):
        LogManager([d2], CONFIG, broker_id=1).startup()  # the dir still online keeps its lock
