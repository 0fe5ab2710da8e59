"""The log manager (broker.log.manager): startup, shutdown, checkpoints, log directories.

docs/architecture.md (section 8) fixes the layout of a log directory: ``meta.properties``, three
checkpoint files in Kafka's format, the clean-shutdown marker, one directory per partition.
These tests drive a LogManager over real directories through clean restarts, crashes
(the manager is dropped after its file descriptors are closed, nothing else), damaged or
missing checkpoint files, deletion and retention, and compare what comes back with what
was appended.
"""

from __future__ import annotations

import logging
import os
import re

import pytest

from tidelog.broker.log.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_CHECKPOINT,
    OffsetCheckpoint,
)
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import Log
from tidelog.broker.log.manager import CLEAN_SHUTDOWN_MARKER, META_PROPERTIES, LogManager
from tidelog.broker.log.segment import LOG_SUFFIX, LogSegment, filename_prefix
from tidelog.protocol.errors import StorageError
from tidelog.protocol.records import build_batch, iter_headers, iter_records, validate_batch
from tidelog.protocol.topics import TopicPartition

T0 = TopicPartition("orders", 0)
T1 = TopicPartition("orders", 1)
T2 = TopicPartition("audit", 0)
SMALL = LogConfig(segment_bytes=4096, index_interval_bytes=512)
CHECKPOINTS = (RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT, LOG_START_OFFSET_CHECKPOINT)


class FakeClock:
    def __init__(self, now: int = 1_700_000_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def manager(dirs, *, config: LogConfig = SMALL, broker_id: int = 1, cluster_id: str | None = "c-1",
            clock=None) -> LogManager:
    m = LogManager([str(d) for d in dirs], config, broker_id=broker_id, cluster_id=cluster_id,
                   clock=clock or FakeClock())
    m.startup()
    return m


def fill(log: Log, n: int, *, ts: int = 1_700_000_000_000, epoch: int = 0, size: int = 100) -> None:
    for i in range(n):
        log.append_as_leader(build_batch([(b"k", b"%d-%d:" % (log.log_end_offset, i) + b"x" * size)] * 3,
                                         timestamp_ms=ts + i), epoch)


def contents(log: Log) -> list[tuple[int, bytes]]:
    """Every record from the log start to the LEO: (offset, value), every batch validated."""
    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        assert data
        for pos, h in iter_headers(data):
            validate_batch(data, pos)
            out.extend((r.offset, r.value) for r in iter_records(data, pos, h))
            offset = h.next_offset
    return out


def crash(m: LogManager) -> None:
    """SIGKILL: close the file descriptors, the log dirs' locks' included, nothing else (no
    flush, no checkpoint, no marker)."""
    m.abandon()


def checkpoint(d, name: str) -> dict[TopicPartition, int]:
    return OffsetCheckpoint(os.path.join(str(d), name)).read()


# -- startup and shutdown ------------------------------------------------------------------------------


def test_marker_is_written_on_shutdown_and_removed_at_startup(tmp_path):
    m = manager([tmp_path])
    assert m.had_clean_shutdown == {str(tmp_path): False}
    fill(m.get_or_create_log(T0), 5)
    assert not (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()
    m.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path))
    m2 = manager([tmp_path])
    assert m2.had_clean_shutdown == {str(tmp_path): True}
    assert not (tmp_path / CLEAN_SHUTDOWN_MARKER).exists()  # any crash from now on is unclean
    m2.shutdown()


def test_clean_restart_gives_back_identical_logs(tmp_path):
    m = manager([tmp_path])
    for tp, n in ((T0, 60), (T1, 3), (T2, 0)):
        fill(m.get_or_create_log(tp), n)
    m.get_log(T0).update_high_watermark(100)
    before = {tp: (contents(log), log.log_end_offset, [s.base_offset for s in log.segments],
                   [(s.index.entries(), s.time_index.entries()) for s in log.segments])
              for tp, log in m.logs.items()}
    assert len(before[T0][2]) > 3
    m.shutdown()
    m2 = manager([tmp_path])
    assert set(m2.logs) == {T0, T1, T2}
    for tp, log in m2.logs.items():
        assert (contents(log), log.log_end_offset, [s.base_offset for s in log.segments],
                [(s.index.entries(), s.time_index.entries()) for s in log.segments]) == before[tp]
        assert log.recovery_report == []
        assert log.recovery_point == log.log_end_offset
    assert m2.get_log(T0).high_watermark == 100
    # appends continue where they left off
    fill(m2.get_log(T0), 2)
    assert [o for o, _ in contents(m2.get_log(T0))] == list(range(before[T0][1] + 6))
    m2.shutdown()


def test_a_lower_segment_index_bytes_does_not_make_clean_restarts_reread_segments(tmp_path, monkeypatch):
    # indexes written under a larger segment.index.bytes hold more entries than the new
    # value allows: they are sized from their files (as Kafka's), not rebuilt at every start
    big = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=100)
    m = manager([tmp_path], config=big)
    fill(m.get_or_create_log(T0), 460)
    log = m.get_log(T0)
    assert len(log.segments) > 2 and len(log.active_segment.index) > 1024 // 8
    before = contents(log)
    m.shutdown()
    recovered = []
    real_recover = LogSegment.recover
    monkeypatch.setattr(LogSegment, "recover", lambda seg: (recovered.append(seg.base_offset), real_recover(seg))[1])
    small = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=100, segment_index_bytes=1024)
    for _ in range(2):
        m = manager([tmp_path], config=small)
        assert recovered == [] and m.get_log(T0).recovery_report == []
        assert contents(m.get_log(T0)) == before
        m.shutdown()
    # the active segment's index is over the new bound: the next append rolls
    m = manager([tmp_path], config=small)
    log = m.get_log(T0)
    active = log.active_segment
    fill(log, 1)
    assert log.active_segment is not active and log.active_segment.base_offset == before[-1][0] + 1
    m.shutdown()


def test_after_a_crash_everything_above_the_recovery_point_is_recovered(tmp_path, caplog):
    m = manager([tmp_path])
    log = m.get_or_create_log(T0)
    fill(log, 30)
    m.flush_dirty_logs()  # segments closed by rolls become durable; the recovery point moves
    m.checkpoint_recovery_points()
    rp = checkpoint(tmp_path, RECOVERY_POINT_CHECKPOINT)[T0]
    assert 0 < rp == log.active_segment.base_offset
    fill(log, 10)
    expected = contents(log)
    active = log.active_segment.log_path
    crash(m)
    del m, log
    with open(active, "ab") as f:  # the torn tail of the power loss
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x10\x00garbage")
    with caplog.at_level(logging.INFO):
        m2 = manager([tmp_path])
    assert m2.had_clean_shutdown == {str(tmp_path): False}
    log2 = m2.get_log(T0)
    assert contents(log2) == expected
    assert len(log2.recovery_report) == 1 and active in log2.recovery_report[0]
    assert any(r.levelno == logging.ERROR and active in r.getMessage() for r in caplog.records)
    assert log2.recovery_point == log2.log_end_offset
    m2.shutdown()



def test_every_roll_is_made_durable_whatever_the_flush_settings(tmp_path):
    """As Kafka schedules a flush at each roll: the segments a roll closed are fsynced (by a
    worker thread: ``RolledFlush.run``) and the recovery point moves to the active segment,
    so that a crash re-reads only that one (with log.flush.* at their defaults nothing else
    ever moved it while the broker ran)."""
    m = manager([tmp_path])
    log = m.get_or_create_log(T0)
    fill(log, 30)
    assert len(log.segments) > 2 and log.recovery_point == 0
    (flush,) = m.rolled_flushes()
    assert m.rolled_flushes() == []  # handed out once
    flush.run()
    log.flushed(flush)
    assert log.recovery_point == log.active_segment.base_offset
    fill(log, 30)
    (flush,) = m.rolled_flushes()
    log.truncate_to(log.segments[1].base_offset + 1)  # a truncation while the fsyncs run
    flush.run()
    log.flushed(flush)
    assert log.recovery_point <= log.segments[1].base_offset + 1  # not moved by a stale flush
    m.checkpoint_recovery_points()
    m.shutdown()

def test_a_truncation_writes_down_the_lowered_recovery_point_at_once(tmp_path):
    """A follower truncates into a flushed segment and fetches again; a power loss then takes
    the unflushed appends to that segment while a later segment survives. Recovery must not
    trust the old, higher recovery point: it cuts at the hole instead of keeping it."""
    m = manager([tmp_path])
    log = m.get_or_create_log(T0)
    fill(log, 30)
    log.flush()
    m.checkpoint_recovery_points()
    assert checkpoint(tmp_path, RECOVERY_POINT_CHECKPOINT)[T0] == log.log_end_offset
    first = log.segments[0]
    cut = first.base_offset + 3
    log.truncate_to(cut)
    assert checkpoint(tmp_path, RECOVERY_POINT_CHECKPOINT)[T0] == cut  # before any append
    size_at_cut = first.size
    fill(log, 30, epoch=1)  # fetched again, rolled, never flushed
    assert len(log.segments) > 1
    expected = [r for r in contents(log) if r[0] < cut]
    crash(m)
    os.truncate(first.log_path, size_at_cut)  # the power loss: the appends after the cut are gone
    m2 = manager([tmp_path])
    log2 = m2.get_log(T0)
    assert contents(log2) == expected  # a prefix, no hole
    assert log2.log_end_offset == cut and log2.recovery_report
    m2.shutdown()


def test_a_crash_before_any_checkpoint_recovers_everything(tmp_path):
    m = manager([tmp_path])
    fill(m.get_or_create_log(T0), 40)
    fill(m.get_or_create_log(T1), 5)
    expected = {tp: contents(log) for tp, log in m.logs.items()}
    crash(m)
    assert not any((tmp_path / name).exists() for name in CHECKPOINTS)
    m2 = manager([tmp_path])
    assert {tp: contents(log) for tp, log in m2.logs.items()} == expected
    m2.shutdown()


def test_crash_after_a_clean_restart_is_unclean(tmp_path):
    m = manager([tmp_path])
    fill(m.get_or_create_log(T0), 10)
    m.shutdown()
    m2 = manager([tmp_path])
    fill(m2.get_log(T0), 10)
    expected = contents(m2.get_log(T0))
    crash(m2)
    m3 = manager([tmp_path])
    assert m3.had_clean_shutdown == {str(tmp_path): False}
    assert contents(m3.get_log(T0)) == expected
    m3.shutdown()


# -- checkpoints --------------------------------------------------------------------------------------


def test_checkpoints_are_written_in_kafkas_format(tmp_path):
    m = manager([tmp_path])
    a, b = m.get_or_create_log(T0), m.get_or_create_log(T2)
    fill(a, 4)
    fill(b, 2)
    a.update_high_watermark(7)
    b.update_high_watermark(6)
    m.shutdown()
    assert (tmp_path / RECOVERY_POINT_CHECKPOINT).read_text() == "0\n2\naudit 0 6\norders 0 12\n"
    assert (tmp_path / REPLICATION_CHECKPOINT).read_text() == "0\n2\naudit 0 6\norders 0 7\n"
    assert (tmp_path / LOG_START_OFFSET_CHECKPOINT).read_text() == "0\n2\naudit 0 0\norders 0 0\n"
    m2 = manager([tmp_path])
    assert m2.get_log(T0).high_watermark == 7 and m2.get_log(T2).high_watermark == 6
    assert m2.get_log(T0).recovery_point == 12
    m2.shutdown()


def test_checkpoint_methods_write_atomically(tmp_path):
    m = manager([tmp_path])
    fill(m.get_or_create_log(T0), 3)
    m.get_log(T0).update_high_watermark(5)
    m.checkpoint_high_watermarks()
    assert checkpoint(tmp_path, REPLICATION_CHECKPOINT) == {T0: 5}
    m.checkpoint_all()
    assert checkpoint(tmp_path, LOG_START_OFFSET_CHECKPOINT) == {T0: 0}
    assert not any(n.endswith(".tmp") for n in os.listdir(tmp_path))
    m.shutdown()


CORRUPT = {
    "garbage": b"\x00\xffnot a checkpoint",
    "empty": b"",
    "count mismatch": b"0\n5\norders 0 3\n",
    "bad version": b"9\n0\n",
}


@pytest.mark.parametrize("damage", ["deleted", *CORRUPT])
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_damaged_checkpoints_are_treated_as_absent_and_nothing_is_lost(tmp_path, name, damage, caplog):
    m = manager([tmp_path])
    for tp in (T0, T1):
        fill(m.get_or_create_log(tp), 25)
        m.get_log(tp).update_high_watermark(m.get_log(tp).log_end_offset - 10)
    expected = {tp: contents(log) for tp, log in m.logs.items()}
    hws = {tp: log.high_watermark for tp, log in m.logs.items()}
    m.shutdown()
    path = tmp_path / name
    if damage == "deleted":
        path.unlink()
    else:
        path.write_bytes(CORRUPT[damage])
    with caplog.at_level(logging.WARNING):
        m2 = manager([tmp_path])
    if damage != "deleted":
        assert any(str(path) in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    for tp, log in m2.logs.items():
        assert contents(log) == expected[tp]
        assert log.recovery_report == []
        assert log.log_start_offset == 0
        # without the HW checkpoint the HW starts from the log start, never above the data
        assert log.high_watermark == (0 if name == REPLICATION_CHECKPOINT else hws[tp])
        assert log.recovery_point == log.log_end_offset
    m2.shutdown()
    # the next shutdown writes sound checkpoints again
    assert checkpoint(tmp_path, name).keys() == {T0, T1}


def test_without_a_recovery_point_a_clean_shutdown_still_recovers_in_full(tmp_path, caplog):
    """A missing recovery-point checkpoint means "recover everything", even after a clean
    shutdown: the indexes are not trusted, so corrupt ones cannot survive."""
    m = manager([tmp_path])
    log = m.get_or_create_log(T0)
    fill(log, 30)
    first = log.segments[0]
    entries = first.index.entries()
    assert len(entries) >= 2
    (o1, _), (_, p2) = entries[0], entries[1]
    expected = contents(log)
    m.shutdown()
    (tmp_path / RECOVERY_POINT_CHECKPOINT).unlink()
    # a plausible index that passes the sanity checks: one entry, at a real batch boundary,
    # naming the wrong offset; trusted, it would send a lookup of o1 to the wrong batch
    with open(first.index.path, "wb") as f:
        f.write((o1 - first.base_offset).to_bytes(4, "big") + p2.to_bytes(4, "big"))
    m2 = manager([tmp_path])
    log2 = m2.get_log(T0)
    assert log2.segments[0].index.entries() == entries
    assert log2.read(o1, 1)
    assert contents(log2) == expected
    m2.shutdown()


def test_hw_checkpoint_beyond_the_log_is_clamped(tmp_path):
    m = manager([tmp_path])
    fill(m.get_or_create_log(T0), 3)
    m.shutdown()
    (tmp_path / REPLICATION_CHECKPOINT).write_text("0\n1\norders 0 1000\n")
    m2 = manager([tmp_path])
    assert m2.get_log(T0).high_watermark == 9 == m2.get_log(T0).log_end_offset
    m2.shutdown()


# -- meta.properties ----------------------------------------------------------------------------------


def _props(d) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (d / META_PROPERTIES).read_text().splitlines() if line)


def test_meta_properties_is_created(tmp_path):
    manager([tmp_path], broker_id=3, cluster_id="abc").shutdown()
    assert _props(tmp_path) == {"version": "1", "broker.id": "3", "cluster.id": "abc"}
    manager([tmp_path], broker_id=3, cluster_id="abc").shutdown()  # and accepted again


def test_broker_id_mismatch_raises(tmp_path):
    manager([tmp_path], broker_id=3).shutdown()
    with pytest.raises(StorageError, match=r"broker\.id 3.*this broker is 4"):
        manager([tmp_path], broker_id=4)


def test_cluster_id_mismatch_raises(tmp_path):
    manager([tmp_path], cluster_id="one").shutdown()
    with pytest.raises(StorageError, match="cluster one"):
        manager([tmp_path], cluster_id="two")


def test_cluster_id_is_added_when_learned(tmp_path):
    manager([tmp_path], cluster_id=None).shutdown()
    assert "cluster.id" not in _props(tmp_path)
    manager([tmp_path], cluster_id="late").shutdown()
    assert _props(tmp_path)["cluster.id"] == "late"


@pytest.mark.parametrize("raw", [b"\xff\xfe\x00binary", b"broker.id 1\n"])
def test_unreadable_meta_properties_raises(tmp_path, raw):
    (tmp_path / META_PROPERTIES).write_bytes(raw)
    with pytest.raises(StorageError, match=META_PROPERTIES):
        manager([tmp_path])


def test_meta_properties_comments_and_blank_lines(tmp_path):
    (tmp_path / META_PROPERTIES).write_text("#written by hand\n\nversion=1\nbroker.id = 1\n")
    manager([tmp_path], broker_id=1).shutdown()


# -- directories --------------------------------------------------------------------------------------


def test_delete_log_removes_the_directory(tmp_path):
    m = manager([tmp_path])
    fill(m.get_or_create_log(T0), 20)
    fill(m.get_or_create_log(T1), 2)
    assert (tmp_path / T0.dir_name).is_dir()
    assert m.delete_log(T0) is not None
    assert not (tmp_path / T0.dir_name).exists()
    assert not any(n.endswith("-delete") for n in os.listdir(tmp_path))
    assert m.get_log(T0) is None and m.delete_log(T0) is None
    for name in CHECKPOINTS:
        assert set(checkpoint(tmp_path, name)) == {T1}
    m.shutdown()
    m2 = manager([tmp_path])
    assert set(m2.logs) == {T1}
    m2.shutdown()


def test_directories_marked_for_deletion_are_removed_at_startup(tmp_path):
    doomed = tmp_path / f"{T0.dir_name}.0123456789abcdef-delete"
    doomed.mkdir()
    (doomed / (filename_prefix(0) + LOG_SUFFIX)).write_bytes(build_batch([b"x"], timestamp_ms=1))
    stray = tmp_path / "not a partition"
    stray.mkdir()
    m = manager([tmp_path])
    assert not doomed.exists()
    assert stray.is_dir()  # ignored, not deleted
    assert m.logs == {}
    m.shutdown()


def test_a_partition_in_two_log_dirs_raises(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    m = manager([a])
    fill(m.get_or_create_log(T0), 1)
    m.shutdown()
    os.makedirs(b / T0.dir_name)
    with pytest.raises(StorageError, match="two log directories"):
        manager([a, b])


# -- the log dir lock ----------------------------------------------------------------------------------


def files_of(d) -> dict[str, bytes]:
    """Every file under ``d`` with its bytes: what a second broker must leave as it found it."""
    out = {}
    for root, _, names in os.walk(d):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, d)] = f.read()
    return out


def test_a_second_manager_on_a_dir_in_use_is_refused_and_touches_nothing(tmp_path):
    """A second broker started on a running broker's dir would recover the active segments
    under its appends and write checkpoints and the clean-shutdown marker into the live dir:
    the dir's lock, taken before anything is read, refuses it (as Kafka's lockLogDirs)."""
    a = manager([tmp_path])
    fill(a.get_or_create_log(T0), 20)  # unflushed, no checkpoint yet: all of it above the recovery point
    before = files_of(tmp_path)
    b = LogManager([str(tmp_path)], SMALL, broker_id=1, cluster_id="c-1", clock=FakeClock())
    with pytest.raises(StorageError, match=re.escape(f"Failed to acquire lock on file .lock in {tmp_path}. "
                                                     "A Tidelog broker in another process or thread")):
        b.startup()
    assert b.logs == {}
    b.shutdown()  # as the broker's shutdown path would: a manager that did not start writes nothing
    assert files_of(tmp_path) == before
    fill(a.get_log(T0), 1)
    expected = contents(a.get_log(T0))
    a.shutdown()
    c = manager([tmp_path])  # the lock went with the shutdown
    assert contents(c.get_log(T0)) == expected and c.had_clean_shutdown == {str(tmp_path): True}
    c.shutdown()


def test_every_dir_is_locked_before_any_is_read(tmp_path):
    """One dir in use refuses the start before the other dirs are loaded or written, and the
    locks taken on those are let go."""
    free, used = tmp_path / "free", tmp_path / "used"
    a = manager([used])
    b = LogManager([str(free), str(used)], SMALL, broker_id=1, cluster_id="c-1", clock=FakeClock())
    with pytest.raises(StorageError, match=re.escape(f"lock on file .lock in {used}.")):
        b.startup()
    assert set(os.listdir(free)) == {".lock"}  # no meta.properties: nothing read or written there
    c = manager([free])
    c.shutdown()
    a.shutdown()


def test_a_shutdown_after_a_failed_startup_writes_nothing(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    m = manager([a])
    fill(m.get_or_create_log(T0), 1)
    m.shutdown()
    os.makedirs(b / T0.dir_name)
    os.unlink(a / CLEAN_SHUTDOWN_MARKER)  # as a crash would leave it
    before = files_of(tmp_path)
    m2 = LogManager([str(a), str(b)], SMALL, broker_id=1, cluster_id="c-1", clock=FakeClock())
    with pytest.raises(StorageError, match="two log directories"):
        m2.startup()
    m2.shutdown()
    after = files_of(tmp_path)
    assert {name: after.get(name) for name in before} == before  # nothing rewritten
    assert set(after) - set(before) <= {"b/.lock", "b/meta.properties"}  # no marker, no checkpoint
    m3 = manager([a])  # the failed start let its locks go
    m3.shutdown()


def test_a_manager_not_running_creates_no_log_and_a_second_shutdown_writes_nothing(tmp_path):
    m = LogManager([str(tmp_path)], SMALL, broker_id=1, cluster_id="c-1", clock=FakeClock())
    with pytest.raises(StorageError, match="not running"):  # its dir is not locked yet
        m.get_or_create_log(T0)
    m.startup()
    fill(m.get_or_create_log(T0), 1)
    m.shutdown()
    with pytest.raises(StorageError, match="not running"):
        m.get_or_create_log(T1)
    m.shutdown()
    assert not (tmp_path / T1.dir_name).exists()
    assert all(set(checkpoint(tmp_path, name)) == {T0} for name in CHECKPOINTS)


def test_the_lock_file_is_neither_a_partition_nor_a_leftover(tmp_path):
    m = manager([tmp_path])
    fill(m.get_or_create_log(T0), 1)
    m.shutdown()
    assert (tmp_path / ".lock").is_file()
    m2 = manager([tmp_path])
    assert set(m2.logs) == {T0} and (tmp_path / ".lock").is_file()
    m2.shutdown()
    assert (tmp_path / ".lock").is_file()  # kept: deleting it would let two holders lock two files


def test_partitions_spread_over_log_dirs(tmp_path):
    dirs = [tmp_path / "d1", tmp_path / "d2", tmp_path / "d3"]
    m = manager(dirs)
    tps = [TopicPartition("t", i) for i in range(7)]
    for i, tp in enumerate(tps):
        fill(m.get_or_create_log(tp), 1 + i)
    homes = {tp: os.path.dirname(m.get_log(tp).directory) for tp in tps}
    counts = {str(d): sum(1 for h in homes.values() if h == str(d)) for d in dirs}
    assert sorted(counts.values()) == [2, 2, 3]
    expected = {tp: contents(m.get_log(tp)) for tp in tps}
    m.shutdown()
    for d in dirs:
        assert (d / CLEAN_SHUTDOWN_MARKER).exists() and (d / META_PROPERTIES).exists()
        for name in CHECKPOINTS:
            assert set(checkpoint(d, name)) == {tp for tp in tps if homes[tp] == str(d)}
    m2 = manager(dirs)
    assert m2.had_clean_shutdown == {str(d): True for d in dirs}
    assert {tp: contents(log) for tp, log in m2.logs.items()} == expected
    assert {tp: os.path.dirname(log.directory) for tp, log in m2.logs.items()} == homes
    # a new partition goes to the directory with the fewest
    fresh = m2.get_or_create_log(TopicPartition("t", 99))
    assert counts[os.path.dirname(fresh.directory)] == 2
    m2.shutdown()


def test_get_or_create_returns_the_same_log_and_topic_configs_apply(tmp_path):
    m = manager([tmp_path])
    assert m.get_or_create_log(T0) is m.get_or_create_log(T0)
    m.shutdown()
    big = LogConfig(segment_bytes=1 << 20)
    m2 = LogManager([str(tmp_path)], SMALL, broker_id=1, cluster_id="c-1", clock=FakeClock())
    m2.startup({"orders": big})
    assert m2.get_log(T0).config == big
    m2.shutdown()


def test_no_log_dirs_is_refused():
    with pytest.raises(ValueError):
        LogManager([])


# -- retention and periodic work -----------------------------------------------------------------------


def test_retention_advances_the_log_start_offset_checkpoint(tmp_path):
    clock = FakeClock()
    config = LogConfig(segment_bytes=4096, index_interval_bytes=512, retention_ms=60_000)
    m = manager([tmp_path], config=config, clock=clock)
    log = m.get_or_create_log(T0)
    fill(log, 30, ts=clock.now - 3_600_000)   # an hour old
    fill(log, 1, ts=clock.now)                # fresh: keeps the last segment alive
    log.update_high_watermark(log.log_end_offset)
    expired = [s.base_offset for s in log.segments if s.max_timestamp < clock.now - 60_000]
    assert len(expired) > 2 and expired == [s.base_offset for s in log.segments[:len(expired)]]
    assert m.cleanup_logs() == len(expired)
    start = log.log_start_offset
    assert start > 0 and start == log.segments[0].base_offset
    assert checkpoint(tmp_path, LOG_START_OFFSET_CHECKPOINT) == {T0: start}
    assert [o for o, _ in contents(log)] == list(range(start, log.log_end_offset))
    assert not os.path.exists(os.path.join(log.directory, filename_prefix(0) + LOG_SUFFIX))
    crash(m)  # even without a clean shutdown the start offset survives
    m2 = manager([tmp_path], config=config, clock=clock)
    assert m2.get_log(T0).log_start_offset == start
    assert [o for o, _ in contents(m2.get_log(T0))] == list(range(start, m2.get_log(T0).log_end_offset))
    m2.shutdown()


def test_retention_never_deletes_above_the_high_watermark(tmp_path):
    clock = FakeClock()
    config = LogConfig(segment_bytes=4096, index_interval_bytes=512, retention_ms=60_000)
    m = manager([tmp_path], config=config, clock=clock)
    log = m.get_or_create_log(T0)
    fill(log, 30, ts=clock.now - 3_600_000)
    assert m.cleanup_logs() == 0  # HW 0: nothing is committed, nothing goes
    assert log.log_start_offset == 0
    m.shutdown()


def test_flush_dirty_logs_moves_the_recovery_point(tmp_path):
    clock = FakeClock()
    m = manager([tmp_path], config=LogConfig(segment_bytes=4096, flush_ms=1000), clock=clock)
    log = m.get_or_create_log(T0)
    fill(log, 20)
    assert len(log.segments) > 1
    m.flush_dirty_logs()
    assert log.recovery_point == log.active_segment.base_offset
    clock.now += 1000
    m.flush_dirty_logs()
    assert log.recovery_point == log.log_end_offset
    m.shutdown()
