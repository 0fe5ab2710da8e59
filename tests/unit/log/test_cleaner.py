"""Log compaction (broker.log.cleaner, broker.log.swap): a real LogManager in a temp dir.

Every test appends keyed records to compacted logs, rolls segments, runs the cleaner inline
(``LogCleaner.clean_once``: the same steps the broker runs in a worker thread) and reads the
log back through ``Log.read``. The oracle is "the last record of each key", with the
records' offsets, timestamps and headers as appended.
"""

from __future__ import annotations

import dataclasses
import errno
import os

import pytest

from tests.unit.log.helpers import FailingDir, FakeClock, read_batches, read_records
from tidelog.broker.log.checkpoint import OffsetCheckpoint
from tidelog.broker.log.cleaner import (
    BYTES_PER_MAP_ENTRY,
    CLEANER_OFFSET_CHECKPOINT,
    CleanerConfig,
    LogCleaner,
    OffsetMap,
    cleanable_offsets,
    log_to_clean,
    retain_record,
    run_steps_inline,
)
from tidelog.broker.log.config import InvalidConfigError, LogConfig
from tidelog.broker.log.dump import run as dump_run
from tidelog.broker.log.manager import LogManager
from tidelog.broker.log.segment import LOG_SUFFIX, OPEN_SEGMENT_FILES, set_max_open_segment_files
from tidelog.protocol.errors import INVALID_RECORD, TidelogError
from tidelog.protocol.records import NO_TIMESTAMP, BatchBuilder, Codec, build_batch, iter_headers
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("profiles", 0)
COMPACT = LogConfig(segment_bytes=700, index_interval_bytes=100, cleanup_policy="compact",
                    delete_retention_ms=10_000, retention_ms=-1)


class Env:
    def __init__(self, path, config: LogConfig = COMPACT, cleaner: CleanerConfig | None = None):
        self.path = str(path)
        self.clock = FakeClock()
        self.config = config
        self.cleaner_config = cleaner or CleanerConfig()
        self.expected: dict[int, tuple] = {}  # offset -> (key, value, timestamp, headers)
        self.open()

    def open(self):
        self.manager = LogManager([self.path], self.config, clock=self.clock)
        self.manager.startup({TP.topic: self.config})
        self.log = self.manager.get_or_create_log(TP, self.config)
        self.cleaner = LogCleaner(self.manager, self.cleaner_config, self.clock)

    def restart(self):
        self.manager.shutdown()
        self.open()

    def append(self, *records, producer_id=-1, codec=Codec.NONE, sequence=-1):
        """records: (key, value) or (key, value, headers)."""
        b = BatchBuilder(codec, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                         base_sequence=sequence)
        for r in records:
            b.append(self.clock(), r[0], r[1], r[2] if len(r) > 2 else None)
        info = self.log.append_as_leader(b.build(), 0)
        for i, r in enumerate(records):
            self.expected[info.first_offset + i] = (r[0], r[1], self.clock(), list(r[2]) if len(r) > 2 else [])
        self.clock.advance(1)
        self.log.update_high_watermark(self.log.log_end_offset)
        return info

    def roll(self):
        self.log.roll()

    def clean(self):
        return self.cleaner.clean_once()

    def records(self):
        return [(r.offset, (r.key, r.value, r.timestamp, list(r.headers))) for r in read_records(self.log)]

    def latest(self) -> dict[bytes, int]:
        out = {}
        for offset, (key, *_rest) in sorted(self.expected.items()):
            out[key] = offset
        return out

    def check_records_are_appended_ones(self):
        got = self.records()
        offsets = [o for o, _ in got]
        assert offsets == sorted(set(offsets))
        for offset, record in got:
            assert self.expected[offset] == record


def keys_below(records, end):
    keys = [r[1][0] for r in records if r[0] < end]
    return keys


def test_compaction_keeps_the_last_record_of_each_key_with_its_offset_timestamp_and_headers(tmp_path):
    env = Env(tmp_path)
    for i in range(120):
        env.append((f"k{i % 7}".encode(), f"value-{i}".encode(), [("h", str(i).encode())]))
    env.roll()
    before_active = env.log.active_segment
    size_before = env.log.size
    job = env.clean()
    assert job is not None and job.end_offset == env.log.active_segment.base_offset
    assert env.log.active_segment is before_active
    got = dict(env.records())
    latest = env.latest()
    assert sorted(got) == sorted(latest.values())  # exactly one record per key: its last one
    env.check_records_are_appended_ones()
    assert env.log.size < size_before / 5
    assert env.log.log_end_offset == 120
    ckpt = OffsetCheckpoint(os.path.join(env.path, CLEANER_OFFSET_CHECKPOINT)).read()
    assert ckpt == {TP: 120}


def test_reads_from_inside_a_gap_return_the_next_batch(tmp_path):
    env = Env(tmp_path)
    for i in range(40):
        env.append((f"k{i % 3}".encode(), f"v{i}".encode()))
    env.roll()
    env.clean()
    kept = [o for o, _ in env.records()]
    assert kept == [37, 38, 39]
    data = env.log.read(5, 1 << 20)
    first = next(iter_headers(data))[1]
    assert first.base_offset == 37
    assert env.log.read(39, 1 << 20, max_offset=39) == b""


def test_the_active_segment_and_records_above_the_high_watermark_are_not_cleaned(tmp_path):
    env = Env(tmp_path)
    for i in range(30):
        env.append((b"same", f"v{i}".encode()))
    env.roll()
    for i in range(30, 60):
        env.append((b"same", f"v{i}".encode()))
    env.log.update_high_watermark(30)  # the second run of segments is not committed yet
    env.clean()
    offsets = [o for o, _ in env.records()]
    assert offsets == [29] + list(range(30, 60))


def test_tombstones_are_kept_until_delete_retention_ms_after_their_first_cleaning(tmp_path):
    env = Env(tmp_path)
    for i in range(30):
        env.append((f"k{i % 3}".encode(), f"v{i}".encode()))
    env.append((b"k1", None))  # the tombstone of k1
    env.roll()
    horizon = env.clock() + COMPACT.delete_retention_ms
    env.clean()
    assert [(o, r[0], r[1]) for o, r in env.records()] == [(27, b"k0", b"v27"), (29, b"k2", b"v29"),
                                                         (30, b"k1", None)]
    tomb = [h for _, h in iter_headers(read_batches(env.log)) if h.base_offset == 30][0]
    assert tomb.delete_horizon_ms == horizon
    assert env.records()[-1][1][2] == env.expected[30][2]  # its timestamp survives the horizon stamp

    # dirty the log again; a cleaning before the horizon keeps the tombstone
    for i in range(40):
        env.append((b"k0", f"w{i}".encode()))
    env.roll()
    env.clock.now_ms = horizon - 1
    assert env.clean() is not None
    assert (30, b"k1") in [(o, r[0]) for o, r in env.records()]
    # after the horizon the next cleaning drops it
    for i in range(40):
        env.append((b"k0", f"x{i}".encode()))
    env.roll()
    env.clock.now_ms = horizon + 1
    assert env.clean() is not None
    assert b"k1" not in [r[0] for _, r in env.records()]
    env.check_records_are_appended_ones()


def test_a_compacted_topic_refuses_records_without_a_key(tmp_path):
    env = Env(tmp_path)
    with pytest.raises(TidelogError) as e:
        env.log.append_as_leader(build_batch([(b"k", b"v"), (None, b"no key")]), 0)
    assert e.value.error is INVALID_RECORD
    assert "profiles" in str(e.value) and "without a key" in str(e.value)
    assert env.log.log_end_offset == 0


def test_keyless_records_left_from_before_compaction_are_dropped_not_fatal(tmp_path):
    env = Env(tmp_path, dataclasses.replace(COMPACT, cleanup_policy="delete"))
    for i in range(20):
        env.append((None if i % 2 else b"k", f"v{i}".encode()))
    env.roll()
    compacted = COMPACT
    env.manager.update_config(TP, compacted)
    env.config = compacted
    assert env.clean() is not None
    assert [(o, r[0]) for o, r in env.records()] == [(18, b"k")]


def test_the_last_record_of_each_idempotent_producer_survives_unless_superseded(tmp_path):
    env = Env(tmp_path)
    env.append((b"a", b"1"), (b"b", None), producer_id=7, sequence=0)  # producer 7's last batch
    env.append((b"c", b"1"), producer_id=8, sequence=0)  # producer 8's last batch
    for i in range(30):
        env.append((b"a", f"x{i}".encode()), (b"c", f"y{i}".encode()))
    env.roll()
    env.clean()
    env.clock.advance(COMPACT.delete_retention_ms + 1)
    for i in range(30):
        env.append((b"a", f"z{i}".encode()))
    env.roll()
    env.clean()
    got = [o for o, _ in env.records()]
    # (b, None): a tombstone past its delete horizon, kept: it carries producer 7's last sequence
    assert 1 in got and 0 not in got
    batch = [h for _, h in iter_headers(read_batches(env.log)) if h.base_offset == 1][0]
    assert (batch.producer_id, batch.base_sequence, batch.last_sequence) == (7, 1, 1)
    assert 2 not in got  # (c, 1): producer 8's last record, superseded by later values of c


def test_compressed_batches_are_cleaned_record_by_record(tmp_path):
    env = Env(tmp_path)
    for i in range(20):
        env.append(*[(f"k{j}".encode(), f"v{i}-{j}".encode() * 3) for j in range(4)], codec=Codec.GZIP)
    env.roll()
    env.clean()
    assert sorted(o for o, _ in env.records()) == sorted(env.latest().values())
    env.check_records_are_appended_ones()


def test_a_small_offset_map_cleans_in_rounds_and_converges(tmp_path):
    env = Env(tmp_path, dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.0),
              cleaner=CleanerConfig(dedupe_buffer_size=BYTES_PER_MAP_ENTRY * 4, io_buffer_load_factor=1.0))
    for i in range(100):
        env.append((f"k{i % 10}".encode(), f"v{i}".encode()))
    env.roll()
    ends = []
    for _ in range(60):
        job = env.clean()
        if job is None:
            break
        assert len(job.map) <= 4
        ends.append(job.end_offset)
        env.check_records_are_appended_ones()
        assert set(env.latest().values()) <= {o for o, _ in env.records()}
    assert ends == sorted(ends) and ends[0] < 100 and ends[-1] == 100
    assert sorted(o for o, _ in env.records()) == sorted(env.latest().values())


def test_dirty_ratio_and_compaction_lags_decide_when_to_clean(tmp_path):
    env = Env(tmp_path, dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.9))
    for i in range(30):
        env.append((f"k{i}".encode(), b"v"))
    env.roll()
    env.clean()  # all dirty: ratio 1.0
    for i in range(3):
        env.append((f"k{i}".encode(), b"w"))
    env.roll()
    assert env.clean() is None  # a little dirt on a large clean section
    lagged = dataclasses.replace(env.config, max_compaction_lag_ms=1000)
    env.manager.update_config(TP, lagged)
    env.clock.advance(2000)
    assert env.clean() is not None  # the dirty records are overdue
    young = dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=60_000)
    env.manager.update_config(TP, young)
    env.append((b"k0", b"z"))
    env.roll()
    offsets = cleanable_offsets(env.log, env.manager.cleaner_checkpoints().get(TP), env.clock())
    assert offsets.first_uncleanable_offset == offsets.first_dirty_offset  # too young to clean


def test_min_compaction_lag_holds_records_without_timestamps_by_their_segment_last_write(tmp_path):
    # a segment created long ago, written just now with records of no timestamp (-1)
    env = Env(tmp_path, dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=60_000))
    env.clock.advance(3_600_000)  # the active segment was created an hour before its records
    for i in range(20):
        b = BatchBuilder(Codec.NONE)
        b.append(NO_TIMESTAMP, b"k%d" % (i % 2), b"v%d" % i)
        env.log.append_as_leader(b.build(), 0)
    env.log.update_high_watermark(env.log.log_end_offset)
    env.roll()
    assert env.log.segments[0].max_timestamp == NO_TIMESTAMP
    assert env.clean() is None  # written 0 ms ago: younger than min.compaction.lag.ms
    env.clock.advance(60_001)
    assert env.clean() is not None
    assert len(env.records()) == 2


def test_a_log_start_inside_the_active_segment_leaves_nothing_to_clean(tmp_path):
    """Found by the Kafka listener's fuzzer: records deleted up to the middle of the only
    (active) segment, then cleanup.policy=compact. The dirty range [5, 5) is empty, but the
    active segment was counted as cleanable, so the cleaner chose the log, found the active
    segment in its group, abandoned the cleaning and chose it again, a thousand times a second."""
    one_segment = dataclasses.replace(COMPACT, segment_bytes=1 << 20)
    env = Env(tmp_path, dataclasses.replace(one_segment, cleanup_policy="delete"))
    for i in range(10):
        env.append((b"k%d" % (i % 3), b"v"))
    assert env.log.maybe_increment_log_start_offset(5) and len(env.log.segments) == 1
    env.manager.update_config(TP, one_segment)
    offsets = cleanable_offsets(env.log, env.manager.cleaner_checkpoints().get(TP), env.clock())
    assert (offsets.first_dirty_offset, offsets.first_uncleanable_offset) == (5, 5)
    assert log_to_clean(TP, env.log, offsets, env.clock()).cleanable_bytes == 0
    assert env.clean() is None and env.clean() is None


def test_a_delete_policy_log_is_never_cleaned(tmp_path):
    env = Env(tmp_path, dataclasses.replace(COMPACT, cleanup_policy="delete"))
    for i in range(30):
        env.append((b"k", b"v"))
    env.roll()
    assert env.clean() is None


def test_compaction_survives_restarts_and_dump_log_verifies_it(tmp_path, capsys):
    env = Env(tmp_path)
    for i in range(100):
        env.append((f"k{i % 9}".encode(), None if i % 17 == 0 else f"v{i}".encode()))
    env.roll()
    env.clean()
    before = env.records()
    env.restart()
    assert env.records() == before
    # an unclean restart with no recovery point re-validates every (gapped) segment and keeps them all
    env.manager.abandon()  # a crash: descriptors and the dir's lock closed, nothing written
    os.unlink(os.path.join(env.path, "recovery-point-offset-checkpoint"))
    env.open()
    assert env.records() == before
    logs = sorted(os.path.join(env.log.directory, n) for n in os.listdir(env.log.directory) if n.endswith(LOG_SUFFIX))
    assert dump_run(logs, verify=True) == 0, capsys.readouterr().out


def test_a_follower_copies_a_compacted_log_with_its_gaps(tmp_path):
    env = Env(tmp_path / "leader")
    for i in range(50):
        env.append((f"k{i % 4}".encode(), f"v{i}".encode()))
    env.roll()
    env.clean()
    follower = Env(tmp_path / "follower")
    offset = 0
    while offset < env.log.log_end_offset:
        data = env.log.read(offset, 300)
        info = follower.log.append_as_follower(data)
        offset = info.last_offset + 1
    assert read_batches(follower.log) == read_batches(env.log)


def test_cleaner_checkpoint_outside_the_log_is_reset(tmp_path):
    env = Env(tmp_path)
    for i in range(20):
        env.append((b"k", b"v"))
    env.roll()
    env.manager.update_cleaner_checkpoint(TP, 10_000)
    env.clean()
    assert env.manager.cleaner_checkpoints()[TP] == env.log.active_segment.base_offset
    assert [o for o, _ in env.records()] == [19]


def test_pure_rules():
    assert retain_record(10, b"k", b"v", latest_in_map=5, map_offset=-1, horizon=None, now_ms=0)
    assert not retain_record(3, None, b"v", 5, -1, None, 0)
    assert not retain_record(3, b"k", b"v", 5, 4, None, 0)
    assert retain_record(4, b"k", None, 5, 4, None, 0)  # a tombstone never cleaned before
    assert retain_record(4, b"k", None, 5, 4, 100, 99)
    assert not retain_record(4, b"k", None, 5, 4, 100, 100)
    m = OffsetMap(2)
    assert m.put(b"a", 1) and m.put(b"b", 2) and m.put(b"a", 3)
    assert not m.put(b"c", 4) and m.get(b"a") == 3 and m.get(b"c") == -1
    assert CleanerConfig(dedupe_buffer_size=17600, threads=2, io_buffer_load_factor=0.5).map_capacity == 25


def test_topic_config_validation():
    assert LogConfig.from_props({"cleanup.policy": "delete, compact"}).cleanup_policy == "compact,delete"
    assert LogConfig.from_props({"cleanup.policy": "compact"}).compacts
    for bad in ({"cleanup.policy": "compacted"}, {"cleanup.policy": ""},
                {"min.cleanable.dirty.ratio": "1.5"}, {"min.cleanable.dirty.ratio": -0.1},
                {"min.compaction.lag.ms": -1}, {"max.compaction.lag.ms": 0}):
        with pytest.raises(InvalidConfigError) as e:
            LogConfig.from_props(bad)
        assert next(iter(bad)) in str(e.value)


DAY_MS = 86_400_000


@pytest.mark.parametrize("restart", [False, True])
def test_a_cleaning_that_empties_the_first_segments_does_not_delay_time_retention(tmp_path, restart):
    # compact,delete: the first group's records are all superseded, so the cleaner leaves an
    # empty segment in its place; it carries the time of the records it replaced, so records
    # of the same age behind it still expire after retention.ms (Kafka keeps lastModified)
    env = Env(tmp_path, dataclasses.replace(COMPACT, cleanup_policy="compact,delete", retention_ms=DAY_MS))
    day0 = env.clock()
    for i in range(10):
        env.append((b"a", b"x" * 50))
    env.roll()
    for i in range(10):
        env.append((f"u{i}".encode(), b"y" * 50))  # keys never written again
    env.roll()
    env.clock.advance(DAY_MS // 2)
    env.append((b"a", b"new"))
    env.roll()
    env.append((b"z", b"z"))
    env.clean()
    first = env.log.segments[0]
    assert first.base_offset == 0 and first.size == 0
    assert env.log.segment_timestamp(first) < day0 + 100
    if restart:
        env.restart()
        assert env.log.segment_timestamp(env.log.segments[0]) < day0 + 100
    env.clock.now_ms = day0 + DAY_MS + DAY_MS // 4  # the u-keys are over a day old, a's newest is not
    env.log.update_high_watermark(env.log.log_end_offset)
    deleted = env.log.delete_old_segments()
    assert 0 in deleted
    assert [r[0] for _, r in env.records()] == [b"a", b"z"]


def _fds_in(directory: str) -> int:
    """Descriptors of this process open on a file in ``directory``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(directory + os.sep)
        except OSError:
            pass
    return count


@pytest.fixture
def lru_of_8():
    before = OPEN_SEGMENT_FILES.max_open
    set_max_open_segment_files(8)
    yield 8
    set_max_open_segment_files(before)


def test_a_cleaning_holds_no_more_descriptors_than_the_segment_lru(tmp_path, lru_of_8):
    # log.max.open.segment.files bounds the cleaner too: a log of more segments than free
    # descriptors is still cleaned (it opened one per segment of the log, all at once)
    env = Env(tmp_path)
    for i in range(300):
        env.append((f"k{i % 20}".encode(), b"v" * 200))
    env.roll()
    assert len(env.log.segments) > 10 * lru_of_8
    directory = env.log.directory
    job = env.cleaner.grab_filthiest_log()
    peak = [_fds_in(directory)]
    check = job.check
    job.check = lambda: (peak.append(_fds_in(directory)), check())[1]
    run_steps_inline(job)
    env.cleaner.done_cleaning(job)
    assert job.swapped_groups > 0
    assert max(peak) <= lru_of_8 + 2  # the LRU, the active segment, one being written
    assert sorted(o for o, _ in env.records()) == sorted(env.latest().values())
    env.check_records_are_appended_ones()


def test_an_os_error_while_cleaning_is_a_failure_of_the_log_dir(tmp_path, monkeypatch):
    env = Env(tmp_path / "logs")
    for i in range(40):
        env.append((b"k%d" % (i % 4), b"v%d" % i))
    env.roll()
    FailingDir(monkeypatch, env.path)  # the cleaned segments cannot be written: a full disk
    with pytest.raises(OSError):
        env.clean()
    assert list(env.manager.pending_dir_failures()) == [env.manager.log_dirs[0]]
    assert TP in env.cleaner.uncleanable


def _batch_near(limit: int, now_ms: int, tombstone_first: bool = True) -> bytes:
    """One uncompressed batch of keyed records as close to ``limit`` bytes as records allow."""
    def build(n: int) -> bytes:
        b = BatchBuilder(Codec.NONE)
        for i in range(n):
            b.append(now_ms, f"key-{i}".encode(), None if tombstone_first and i == 0 else b"value-%d" % i)
        return b.build()
    n = 1
    while len(build(n + 1)) <= limit:
        n += 1
    return build(n)


def test_a_batch_the_cleaner_grew_past_max_message_bytes_is_copied_by_a_follower(tmp_path):
    # cleaning stamps the delete horizon as the batch's first timestamp: every record's delta grows
    config = dataclasses.replace(COMPACT, segment_bytes=1 << 20, max_message_bytes=4000)
    env = Env(tmp_path / "leader", config)
    data = _batch_near(4000, env.clock())
    assert 3980 <= len(data) <= 4000
    env.log.append_as_leader(data, 0)
    env.roll()
    env.log.update_high_watermark(env.log.log_end_offset)
    env.clean()
    stored = read_batches(env.log)
    assert [h.size for _, h in iter_headers(stored)][0] > 4000  # the grown batch
    follower = Env(tmp_path / "follower", config)
    # a fetch smaller than the batch still returns it whole (the first batch of a fetch)
    assert env.log.read(0, 1000) == stored
    follower.log.append_as_follower(env.log.read(0, 1 << 20))
    assert read_batches(follower.log) == stored


def test_a_follower_copies_batches_written_before_max_message_bytes_was_lowered(tmp_path):
    leader = Env(tmp_path / "leader", dataclasses.replace(COMPACT, segment_bytes=1 << 20))
    leader.log.append_as_leader(_batch_near(3000, leader.clock(), tombstone_first=False), 0)
    lowered = dataclasses.replace(COMPACT, segment_bytes=1 << 20, max_message_bytes=2000)
    follower = Env(tmp_path / "follower", lowered)
    follower.log.append_as_follower(leader.log.read(0, 1 << 20))
    assert read_batches(follower.log) == read_batches(leader.log)
    with pytest.raises(TidelogError, match="max.message.bytes"):  # a producer's batch is still refused
        follower.log.append_as_leader(_batch_near(3000, leader.clock(), tombstone_first=False), 0)


def fail_cleaner_checkpoint_writes(monkeypatch, log_dir: str) -> None:
    """Writes of ``log_dir``'s cleaner checkpoint fail with ENOSPC (a full disk)."""
    real = OffsetCheckpoint.write
    target = os.path.join(log_dir, CLEANER_OFFSET_CHECKPOINT)

    def write(self, offsets):
        if self.path == target:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, offsets)
    monkeypatch.setattr(OffsetCheckpoint, "write", write)


def test_a_cleaner_checkpoint_that_cannot_be_written_fails_its_dir_not_the_cleaner(tmp_path, monkeypatch):
    env = Env(tmp_path / "logs")
    for i in range(40):
        env.append((b"k%d" % (i % 4), b"v%d" % i))
    env.roll()
    job = env.cleaner.grab_filthiest_log()
    run_steps_inline(job)  # the cleaning itself succeeds and swaps
    fail_cleaner_checkpoint_writes(monkeypatch, env.path)
    env.cleaner.done_cleaning(job)  # does not raise: the dir is noted failing
    assert list(env.manager.pending_dir_failures()) == [env.path]
    assert env.cleaner.cleanings == 1 and not env.cleaner.in_progress


def test_a_cleaner_checkpoint_that_cannot_be_read_fails_its_dir(tmp_path, monkeypatch):
    env = Env(tmp_path / "logs")
    for i in range(40):
        env.append((b"k%d" % (i % 4), b"v%d" % i))
    env.roll()
    assert env.clean() is not None
    real = OffsetCheckpoint.read
    monkeypatch.setattr(OffsetCheckpoint, "read", lambda self: (
        _raise(OSError(errno.EIO, os.strerror(errno.EIO))) if self.path.endswith(CLEANER_OFFSET_CHECKPOINT)
        else real(self)))
    assert env.cleaner.grab_filthiest_log() is None  # the round is skipped
    assert list(env.manager.pending_dir_failures()) == [env.path]  # and the dir noted failing


def _raise(e: BaseException):
    raise e
