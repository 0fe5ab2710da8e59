"""The idempotent producer's state in the log: duplicates, gaps, epochs, snapshots, truncation
and retention, example by example and against an oracle (a Hypothesis state machine that
recomputes the expected state from the batches in the log after every step)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tests.unit.log.helpers import TP, FakeClock, open_log, read_batches
from tidelog.broker.log import producer_state
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import LogDirFailure
from tidelog.broker.log.manager import LogManager
from tidelog.broker.log.producer_state import (
    MAX_SEQUENCE,
    BatchMetadata,
    ProducerStateManager,
    decode_snapshot,
    next_sequence,
    snapshot_path,
)
from tidelog.protocol.errors import (
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    UNKNOWN_PRODUCER_ID,
    TidelogError,
)
from tidelog.protocol.records import build_batch, iter_headers, read_header


def batch(pid: int, epoch: int, seq: int, n: int = 1, tag: str = "v") -> bytes:
    return build_batch([f"{tag}{seq + i}".encode() for i in range(n)], timestamp_ms=1000,
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def config(**kw) -> LogConfig:
    return LogConfig(**{"segment_bytes": 400, "index_interval_bytes": 100, "retention_ms": -1, **kw})


@pytest.fixture
def log_dir(tmp_path):
    return str(tmp_path / "events-0")


def error_of(fn) -> str:
    with pytest.raises(TidelogError) as e:
        fn()
    return e.value.error.name


def test_a_duplicate_returns_the_original_offsets_and_appends_nothing(log_dir):
    log = open_log(log_dir, config())
    log.append_as_leader(batch(7, 0, 0, 2), 0)
    first = log.append_as_leader(batch(7, 0, 2, 3), 0)
    log.append_as_leader(batch(9, 0, 0), 0)  # another producer in between
    end = log.log_end_offset
    again = log.append_as_leader(batch(7, 0, 2, 3), 0)
    assert (again.first_offset, again.last_offset, again.record_count) == (first.first_offset, first.last_offset, 0)
    assert log.log_end_offset == end
    assert [h.base_sequence for _, h in iter_headers(read_batches(log))] == [0, 2, 0]


def test_only_the_last_five_batches_are_remembered(log_dir):
    log = open_log(log_dir, config(segment_bytes=1 << 20))
    for seq in range(6):
        log.append_as_leader(batch(1, 0, seq), 0)
        log.append_as_leader(batch(2, 0, seq), 0)  # interleaved: nothing merges
    assert log.append_as_leader(batch(1, 0, 1), 0).first_offset == 2
    assert error_of(lambda: log.append_as_leader(batch(1, 0, 0), 0)) == OUT_OF_ORDER_SEQUENCE_NUMBER.name


def test_a_run_of_many_batches_is_one_entry_and_any_batch_of_it_a_duplicate(log_dir):
    log = open_log(log_dir, config(segment_bytes=1 << 20))
    log.append_as_leader(b"".join(batch(1, 0, seq * 2, 2) for seq in range(8)), 0)
    log.append_as_leader(batch(2, 0, 0), 0)
    log.append_as_leader(batch(1, 0, 16, 2), 0)  # continues the sequence, not the offsets
    assert [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in log.producer_state.producers[1].batches] \
        == [(0, 15, 0, 15), (16, 17, 17, 18)]
    for seq in (0, 6, 14):
        info = log.append_as_leader(batch(1, 0, seq, 2), 0)
        assert (info.first_offset, info.last_offset) == (seq, seq + 1)
    assert log.append_as_leader(batch(1, 0, 16, 2), 0).first_offset == 17
    assert error_of(lambda: log.append_as_leader(batch(1, 0, 15, 2), 0)) == OUT_OF_ORDER_SEQUENCE_NUMBER.name
    assert log.log_end_offset == 19


def test_a_duplicate_on_a_log_append_time_topic_answers_its_own_append_time(log_dir, tmp_path):
    # batches of one append share its time and are kept as one entry; those of two appends
    # a minute apart are not, so a retry of the first answers the first's time
    clock = FakeClock()
    cfg = config(segment_bytes=1 << 20, message_timestamp_type="LogAppendTime")
    log = open_log(log_dir, cfg, clock=clock)
    first = log.append_as_leader(batch(1, 0, 0, 2), 0)
    clock.advance(60_000)
    second = log.append_as_leader(b"".join(batch(1, 0, seq, 2) for seq in range(2, 16, 2)), 0)
    assert second.log_append_time == first.log_append_time + 60_000
    for seq, want in ((0, first), (2, second), (14, second)):
        info = log.append_as_leader(batch(1, 0, seq, 2), 0)
        assert (info.first_offset, info.log_append_time) == (seq, want.log_append_time)
    assert len(log.producer_state.producers[1].batches) == 2
    follower = open_log(str(tmp_path / "f" / "events-0"), cfg)
    follower.append_as_follower(read_batches(log))
    assert follower.producer_state.producers == log.producer_state.producers


def test_gaps_and_older_epochs_are_refused(log_dir):
    log = open_log(log_dir, config())
    log.append_as_leader(batch(1, 2, 0, 2), 0)
    assert error_of(lambda: log.append_as_leader(batch(1, 2, 3), 0)) == OUT_OF_ORDER_SEQUENCE_NUMBER.name
    assert error_of(lambda: log.append_as_leader(batch(1, 1, 2), 0)) == INVALID_PRODUCER_EPOCH.name
    assert error_of(lambda: log.append_as_leader(batch(1, 3, 5), 0)) == OUT_OF_ORDER_SEQUENCE_NUMBER.name
    assert error_of(lambda: log.append_as_leader(build_batch([b"x"], producer_id=1), 0)) == INVALID_RECORD.name
    assert log.log_end_offset == 2
    log.append_as_leader(batch(1, 3, 0), 0)  # a new epoch starts at 0
    assert error_of(lambda: log.append_as_leader(batch(1, 2, 2), 0)) == INVALID_PRODUCER_EPOCH.name
    assert log.producer_state.producers[1].producer_epoch == 3


def test_a_run_is_checked_batch_after_batch_and_never_mixes_duplicates(log_dir):
    log = open_log(log_dir, config(segment_bytes=1 << 20))
    log.append_as_leader(batch(1, 0, 0) + batch(1, 0, 1) + batch(2, 0, 0) + batch(1, 0, 2), 0)
    assert error_of(lambda: log.append_as_leader(batch(1, 0, 3) + batch(1, 0, 5), 0)) == \
        OUT_OF_ORDER_SEQUENCE_NUMBER.name
    # a run mixing a duplicate with a new batch is neither written nor "already written"
    # (DUPLICATE_SEQUENCE_NUMBER, which clients take for success): it is refused as invalid
    for run in (batch(1, 0, 2) + batch(1, 0, 3), batch(2, 0, 0) + batch(3, 0, 0),
                batch(1, 0, 0) + batch(2, 0, 0)):  # duplicates of batches not adjacent in the log
        with pytest.raises(TidelogError) as e:
            log.append_as_leader(run, 0)
        assert e.value.error is INVALID_RECORD and "send a retried batch alone" in str(e.value)
    assert log.append_as_leader(batch(1, 0, 0) + batch(1, 0, 1), 0).first_offset == 0  # all duplicates
    assert log.log_end_offset == 4


def test_sequences_wrap_at_int32_max():
    ps = ProducerStateManager()
    h = read_header(batch(5, 0, MAX_SEQUENCE - 1, 3))._replace(base_offset=10)  # MAX-1, MAX, 0
    ps.update([(0, h)])
    assert ps.producers[5].last_seq == 0 == next_sequence(MAX_SEQUENCE)
    nxt = read_header(batch(5, 0, 1, 3))
    assert ps.check_leader_append([(0, nxt)]) is None
    assert ps.check_leader_append([(0, read_header(batch(5, 0, MAX_SEQUENCE - 1, 3)))]).first_offset == 10
    assert ps.check_leader_append([(0, read_header(batch(5, 0, 0, 1)))]).first_offset == 12  # inside, wrapped
    ps.update([(0, nxt._replace(base_offset=13))])  # merges across the wrap
    assert ps.producers[5].batches[-1][:4] == (MAX_SEQUENCE - 1, 3, 10, 15)
    with pytest.raises(TidelogError):
        ps.check_leader_append([(0, read_header(batch(5, 0, 5, 1)))])


def test_followers_build_the_same_state_and_truncation_rebuilds_it(log_dir, tmp_path):
    leader = open_log(log_dir, config())
    for seq in range(0, 12, 2):
        leader.append_as_leader(batch(1, 0, seq, 2), 0)
    follower = open_log(str(tmp_path / "f" / "events-0"), config())
    follower.append_as_follower(read_batches(leader))
    assert follower.producer_state.producers == leader.producer_state.producers
    follower.truncate_to(5)  # the batch at 4..5 goes with everything after it
    assert follower.log_end_offset == 4
    assert follower.producer_state.producers[1].last_seq == 3
    assert follower.append_as_leader(batch(1, 0, 4, 2), 1).first_offset == 4
    follower.truncate_fully_and_start_at(20)
    assert follower.producer_state.producers == {}


def test_a_producer_with_no_state_starts_at_sequence_zero(log_dir):
    # never seen (or expired): at sequence 0 of any epoch, else UNKNOWN_PRODUCER_ID, which the
    # client answers with a new epoch (it knows nothing of it was written)
    log = open_log(log_dir, config(segment_bytes=1 << 20))
    assert error_of(lambda: log.append_as_leader(batch(1, 3, 17, 2), 0)) == UNKNOWN_PRODUCER_ID.name
    assert log.append_as_leader(batch(1, 3, 0, 2), 0).first_offset == 0
    assert log.producer_state.producers[1].last_seq == 1
    assert log.append_as_leader(batch(2, 0, 0) + batch(2, 0, 1), 0).first_offset == 2  # a run, checked in order
    assert error_of(lambda: log.append_as_leader(batch(3, 0, 0) + batch(3, 0, 2), 0)) == \
        OUT_OF_ORDER_SEQUENCE_NUMBER.name
    assert 3 not in log.producer_state.producers


def _producer_then_others(log) -> tuple[int, int]:
    """Producer 1 writes two records, then producer 2 twenty batches (several segments); the
    HW at the end. Returns producer 1's first offset and the log end."""
    first = log.append_as_leader(batch(1, 0, 0, 2), 0).first_offset
    for seq in range(20):
        log.append_as_leader(batch(2, 0, seq), 0)
    log.update_high_watermark(log.log_end_offset)
    return first, log.log_end_offset


def test_delete_records_keeps_the_state_of_producers_it_removes_the_batches_of(log_dir):
    # Kafka 2.5+ forgets a producer only by producer.id.expiration.ms: a producer whose
    # batches DeleteRecords removed (Kafka Streams purges its repartition topics at every
    # commit) goes on with its next sequence, and its retries are still duplicates
    log = open_log(log_dir, config())
    first, end = _producer_then_others(log)
    log.maybe_increment_log_start_offset(log.high_watermark)
    assert log.log_start_offset == end
    assert log.append_as_leader(batch(1, 0, 0, 2), 0).first_offset == first  # a duplicate, as before
    assert log.log_end_offset == end
    assert log.append_as_leader(batch(1, 0, 2), 0).first_offset == end
    assert error_of(lambda: log.append_as_leader(batch(1, 0, 9), 0)) == OUT_OF_ORDER_SEQUENCE_NUMBER.name


def test_retention_keeps_the_state_of_producers_whose_segments_it_deletes(log_dir):
    cfg = config()
    log = open_log(log_dir, cfg)
    first, end = _producer_then_others(log)
    log.maybe_increment_log_start_offset(end - 1)
    assert log.delete_old_segments()
    assert log.segments[0].base_offset > 1  # producer 1's batch is gone from the disk
    assert log.append_as_leader(batch(1, 0, 0, 2), 0).first_offset == first
    log.close()  # the state is in the snapshot at the log end: a restart keeps it
    log = open_log(log_dir, cfg, had_clean_shutdown=True, recovery_point=end, log_start_offset=end - 1,
                   high_watermark=end)
    assert log.producer_state.producers[1].last_seq == 1
    assert log.append_as_leader(batch(1, 0, 2), 0).first_offset == end


def test_a_retry_of_a_batch_in_a_deleted_segment_is_a_duplicate_though_later_ones_continued_it(log_dir):
    # one producer alone: its requests continue each other and are kept as one entry; the
    # segment holding the first three goes, and a retry of the last of them (one of the
    # producer's last five requests) is still a duplicate, live, after truncation and restart
    cfg = config()
    log = open_log(log_dir, cfg)
    infos = []
    while len(log.segments) < 2:
        infos.append(log.append_as_leader(batch(1, 0, 5 * len(infos), 5), 0))
    assert [i.first_offset for i in infos] == [0, 5, 10, 15] and log.segments[1].base_offset == 15
    log.update_high_watermark(log.log_end_offset)
    log.maybe_increment_log_start_offset(15)  # DeleteRecords
    assert log.delete_old_segments() == [0]
    assert log.append_as_leader(batch(1, 0, 10, 5), 0).first_offset == 10
    log.append_as_leader(batch(1, 0, 20, 5), 0)
    log.truncate_to(25)  # rebuilt from the snapshot at 15 and the batches after it: the same
    assert log.append_as_leader(batch(1, 0, 5, 5), 0).first_offset == 5
    end = log.log_end_offset
    log.close()
    log = open_log(log_dir, cfg, had_clean_shutdown=True, recovery_point=end, log_start_offset=15,
                   high_watermark=end)
    assert log.append_as_leader(batch(1, 0, 10, 5), 0).first_offset == 10
    assert log.append_as_leader(batch(1, 0, 25, 5), 0).first_offset == end == 25


def test_deduplication_survives_clean_and_unclean_restarts(log_dir):
    cfg = config()
    log = open_log(log_dir, cfg)
    infos = [log.append_as_leader(batch(1, 0, seq, 3), 0) for seq in range(0, 30, 3)]
    assert len(log.segments) > 2
    snapshots = log.producer_state.snapshot_offsets()
    assert snapshots == [s.base_offset for s in log.segments[1:]]  # one per roll
    log.close()
    log = open_log(log_dir, cfg, had_clean_shutdown=True, recovery_point=log.log_end_offset)
    assert log.producer_state.snapshot_offsets()[-1] == log.log_end_offset  # written at close
    assert log.append_as_leader(batch(1, 0, 27, 3), 0).first_offset == infos[-1].first_offset
    # unclean: the close snapshot is gone, so the state is the roll snapshot plus a replay
    os.unlink(snapshot_path(log_dir, log.log_end_offset))
    for seg in log.segments:
        os.close(seg._fd)
    log = open_log(log_dir, cfg)
    assert log.append_as_leader(batch(1, 0, 24, 3), 0).first_offset == infos[-2].first_offset
    assert log.append_as_leader(batch(1, 0, 30, 1), 0).first_offset == 30


def test_snapshots_of_a_log_whose_start_never_moves_do_not_pile_up(tmp_path):
    # a compacted log: every roll writes a snapshot, and the log start never passes them;
    # after a recovery-point checkpoint only those from the recovery point's segment or the
    # second-to-last one on are kept (Kafka's deleteSnapshotsAfterRecoveryPointCheckpoint)
    cfg = config(cleanup_policy="compact")
    manager = LogManager([str(tmp_path)], cfg)
    manager.startup({TP.topic: cfg})
    log = manager.get_or_create_log(TP, cfg)
    for i in range(12):
        log.append_as_leader(build_batch([(b"k%d" % (i % 3), b"v")], timestamp_ms=1000, producer_id=i % 4,
                                         producer_epoch=0, base_sequence=i // 4), 0)
        log.roll()
    log.append_as_leader(build_batch([(b"k", b"v")], timestamp_ms=1000, producer_id=1, producer_epoch=0,
                                     base_sequence=3), 0)
    assert len(log.producer_state.snapshot_offsets()) == 12
    log.flush()
    manager.checkpoint_recovery_points()
    bases = [s.base_offset for s in log.segments]
    assert log.producer_state.snapshot_offsets() == bases[-2:]
    expected = dict(log.producer_state.producers)
    for seg in log.segments:  # a crash: the state comes from the roll snapshot and a replay
        os.close(seg._fd)
    log = open_log(log.directory, cfg, recovery_point=log.recovery_point)
    assert log.producer_state.producers == expected


def test_a_damaged_snapshot_is_ignored_and_the_log_replayed(log_dir):
    cfg = config()
    log = open_log(log_dir, cfg)
    for seq in range(0, 30, 3):
        log.append_as_leader(batch(1, 0, seq, 3), 0)
    expected = dict(log.producer_state.producers)
    log.close()
    for offset in log.producer_state.snapshot_offsets():
        with open(snapshot_path(log_dir, offset), "r+b") as f:
            f.seek(12)
            f.write(b"\xff\xff")
    log = open_log(log_dir, cfg, had_clean_shutdown=True, recovery_point=30)
    assert log.producer_state.producers == expected
    assert log.producer_state.snapshot_offsets() == []


def test_a_snapshot_that_cannot_be_opened_is_kept_and_its_dir_fails(log_dir, monkeypatch):
    # out of descriptors (or an I/O error) says nothing of the file: it is the log dir failing,
    # and the snapshot stays for the next start; only a failed format check deletes one
    cfg = config()
    log = open_log(log_dir, cfg)
    for seq in range(0, 30, 3):
        log.append_as_leader(batch(1, 0, seq, 3), 0)
    log.close()
    snapshots = log.producer_state.snapshot_offsets()
    assert len(snapshots) > 1
    real_open = open

    def no_descriptors(path, *args, **kwargs):
        if str(path).endswith(".snapshot"):
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(producer_state, "open", no_descriptors, raising=False)
    with pytest.raises(LogDirFailure) as e:
        open_log(log_dir, cfg, had_clean_shutdown=True, recovery_point=30)
    assert os.strerror(errno.EMFILE) in str(e.value)
    assert log.producer_state.snapshot_offsets() == snapshots
    monkeypatch.undo()
    log = open_log(log_dir, cfg, had_clean_shutdown=True, recovery_point=30)
    failures = []
    log.on_dir_failure = failures.append
    monkeypatch.setattr(producer_state, "open", no_descriptors, raising=False)
    with pytest.raises(LogDirFailure) as e:
        log.reload_producer_state()
    assert failures == [e.value]
    assert log.producer_state.snapshot_offsets() == snapshots


def test_snapshot_format_rejects_garbage():
    for data in (b"", b"TLPS", b"XXXX\x00\x01\x00\x00\x00\x00\x90", b"TLPS\x00\x01\x00\x00\x00\x00\x90"):
        with pytest.raises(ValueError):
            decode_snapshot(data)


# ---------------------------------------------------------------------------------------------
# the state machine


class ProducerStateMachine(RuleBasedStateMachine):
    """Appends of three producers (in sequence, duplicates, gaps, epoch changes), rolls,
    truncations, retention, clean restarts and crashes. After each step the log's producer
    state must equal the one recomputed from every batch appended and not truncated away,
    also for the batches retention deleted: nothing is cut when the log start moves, and a
    rebuild (truncation, restart, crash) starts from the snapshot written when the first
    segment was rolled, which holds them all."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="tidelog-pstate-")
        self.path = os.path.join(self.dir, "events-0")
        self.batches: list[tuple[int, int, int, int, int]] = []  # (base offset, pid, epoch, first seq, count)
        self.log = None

    @initialize(segment_bytes=st.integers(250, 1200))
    def open(self, segment_bytes):
        self.config = config(segment_bytes=segment_bytes)
        self.log = open_log(self.path, self.config, clock=FakeClock())

    def teardown(self):
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the oracle ---------------------------------------------------------------------------

    def expected(self) -> dict[int, tuple[int, list[BatchMetadata]]]:
        out: dict[int, tuple[int, list[BatchMetadata]]] = {}
        for base, pid, epoch, seq, n in self.batches:
            meta = BatchMetadata(seq, next_sequence(seq, n - 1), base, base + n - 1, 1000)
            old = out.get(pid)
            kept = old[1] if old is not None and old[0] == epoch else []
            if kept and kept[-1].last_offset + 1 == base and next_sequence(kept[-1].last_seq) == seq:
                last = kept.pop()
                meta = BatchMetadata(last.first_seq, meta.last_seq, last.first_offset, meta.last_offset, 1000)
            out[pid] = (epoch, (kept + [meta])[-5:])
        return out

    def state(self, pid: int) -> tuple[int, list[BatchMetadata]] | None:
        """The log's state of ``pid`` (the invariant checks it against ``expected``)."""
        e = self.log.producer_state.producers.get(pid)
        return None if e is None else (e.producer_epoch, list(e.batches))

    def outcome(self, pid: int, epoch: int, seq: int, n: int):
        state = self.state(pid)
        if state is None:
            return None if seq == 0 else UNKNOWN_PRODUCER_ID.name  # an unknown producer starts at 0
        known, metas = state
        if epoch < known:
            return INVALID_PRODUCER_EPOCH.name
        if epoch > known:
            return None if seq == 0 else OUT_OF_ORDER_SEQUENCE_NUMBER.name
        for m in metas:
            delta = seq - m.first_seq
            if 0 <= delta and delta + n - 1 <= m.last_seq - m.first_seq:
                return BatchMetadata(seq, seq + n - 1, m.first_offset + delta, m.first_offset + delta + n - 1, 1000)
        return None if seq == next_sequence(metas[-1].last_seq) else OUT_OF_ORDER_SEQUENCE_NUMBER.name

    # -- rules --------------------------------------------------------------------------------

    @rule(pid=st.integers(0, 2), n=st.integers(1, 3),
          kind=st.sampled_from(["next", "next", "next", "duplicate", "gap", "zero", "older", "newer"]),
          data=st.data())
    def append(self, pid, n, kind, data):
        state = self.state(pid)
        epoch, metas = state if state is not None else (0, [])
        seq = next_sequence(metas[-1].last_seq) if metas else 0
        if kind == "duplicate" and metas:
            m = data.draw(st.sampled_from(metas))
            seq = data.draw(st.integers(m.first_seq, m.last_seq))
            n = data.draw(st.integers(1, m.last_seq - seq + 1))
        elif kind == "gap":
            seq += data.draw(st.integers(1, 3))
        elif kind == "zero":
            seq = 0
        elif kind == "older":
            epoch -= 1
        elif kind == "newer":
            epoch, seq = epoch + 1, data.draw(st.sampled_from([0, 0, 1]))
        if epoch < 0:
            return
        expect = self.outcome(pid, epoch, seq, n)
        end = self.log.log_end_offset
        try:
            info = self.log.append_as_leader(batch(pid, epoch, seq, n), 0)
        except TidelogError as e:
            assert e.error.name == expect
            assert self.log.log_end_offset == end
            return
        if isinstance(expect, BatchMetadata):
            assert (info.first_offset, info.last_offset) == (expect.first_offset, expect.last_offset)
            assert self.log.log_end_offset == end
        else:
            assert expect is None and info.first_offset == end
            self.batches.append((end, pid, epoch, seq, n))

    @rule()
    def roll(self):
        self.log.roll()

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def truncate(self, data):
        offset = data.draw(st.integers(self.log.log_start_offset, self.log.log_end_offset))
        first, end = self.log.segments[0].base_offset, self.log.log_end_offset
        self.log.truncate_to(offset)
        if offset < end and offset <= first:
            self.batches = []  # truncated fully: the state starts empty
        else:
            self.batches = [b for b in self.batches if b[0] + b[4] <= offset]

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def advance_log_start(self, data):
        self.log.update_high_watermark(self.log.log_end_offset)
        self.log.maybe_increment_log_start_offset(data.draw(st.integers(0, self.log.log_end_offset)))
        self.log.delete_old_segments()

    @rule()
    def clean_restart(self):
        log = self.log
        log.close()
        self.log = open_log(self.path, self.config, had_clean_shutdown=True, recovery_point=log.log_end_offset,
                            log_start_offset=log.log_start_offset, high_watermark=log.high_watermark)

    @rule()
    def crash(self):
        log = self.log
        for seg in log.segments:
            os.close(seg._fd)
        self.log = open_log(self.path, self.config, log_start_offset=log.log_start_offset,
                            high_watermark=log.high_watermark)

    @invariant()
    def state_matches_the_log(self):
        if self.log is None:
            return
        got = {pid: (e.producer_epoch, list(e.batches)) for pid, e in self.log.producer_state.producers.items()}
        assert got == self.expected()
        assert self.log.producer_state.map_end_offset == self.log.log_end_offset


ProducerStateMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
TestProducerStateMachine = ProducerStateMachine.TestCase
