"""The fault matrix's oracle (tests/system/harness.py) on made-up logs: I4 counts a value twice
in an idempotent producer's log and only counts it otherwise; I1 leaves acknowledged records
below the final log start to I11; I11 finds a log start inside a segment, an acknowledged
record deleted before it expired, an expired segment left in place, and accepts a correct
history."""

from __future__ import annotations

from tests.support.disk import SegmentFile
from tests.system.harness import (
    Ack,
    LogStart,
    ReplicaOnDisk,
    Report,
    check_acked,
    check_expired_segments_deleted,
    check_final_log,
    check_log_starts_at_boundaries,
    check_nothing_deleted_early,
    check_retention,
    value_of,
)

RETENTION_MS = 6000
SLACK_MS = 5000


def ack(offset: int, timestamp: int, partition: int = 0) -> Ack:
    return Ack(partition, offset, value_of(partition, offset), offset, 0.0, timestamp)


def replica(log_start: int | None, *segments: tuple[int, int, int], broker: int = 1, hw: int | None = None,
            started_ms: float = 0.0, stopped_ms: float = 100_000.0) -> ReplicaOnDisk:
    segs = [SegmentFile(*s) for s in segments]
    return ReplicaOnDisk(broker, 0, log_start, segs[-1].next_offset if hw is None else hw, segs,
                         started_ms, stopped_ms)


# -- I4 --------------------------------------------------------------------------------------------


def test_a_value_twice_is_a_violation_only_for_an_idempotent_producer():
    final = {0: [(0, value_of(0, 0)), (1, value_of(0, 3)), (2, value_of(0, 3)), (3, value_of(0, 6))]}
    for idempotent in (False, True):
        report = Report("t", idempotent=idempotent)
        check_final_log(final, report)
        assert report.duplicates == 1 and not report.misordered
        assert report.violations() == ({"duplicated": 1} if idempotent else {})
    assert "at offset 2, first at offset 1" in report.duplicated[0]


# -- I1 with retention -----------------------------------------------------------------------------


def test_acked_records_below_the_final_log_start_are_left_to_retention():
    final = {0: [(o, value_of(0, o)) for o in range(5, 8)]}
    report = Report("t")
    check_acked([ack(o, 0) for o in range(8)], check_final_log(final, report), {0: 5}, report)
    assert report.expired == 5 and not report.lost
    check_acked([ack(o, 0) for o in range(8)], check_final_log(final, report), {0: 4}, report)
    assert len(report.lost) == 1 and "offset 4" in report.lost[0]


# -- I11 (a): the log start is a segment boundary ---------------------------------------------------


def test_a_log_start_at_the_first_segment_or_a_later_boundary_is_whole_segments():
    report = Report("t")
    check_log_starts_at_boundaries([replica(100, (100, 200, 1), (200, 250, 2)),
                                    replica(200, (100, 200, 1), (200, 250, 2), broker=2),  # 100-200 due next run
                                    replica(250, (250, 250, -1), broker=3)], {}, report)  # everything deleted
    assert not report.cut_inside


def test_a_log_start_inside_a_segment_needs_another_replicas_boundary_there():
    follower = replica(150, (100, 200, 1), (200, 250, 2), broker=2)
    report = Report("t")
    check_log_starts_at_boundaries([replica(100, (100, 200, 1)), follower], {}, report)
    assert len(report.cut_inside) == 1 and "log start 150 inside its segment [100, 200)" in report.cut_inside[0]
    for others, logged in (([replica(150, (150, 250, 1))], {}), ([], {0: {150}})):
        report = Report("t")
        check_log_starts_at_boundaries([*others, follower], logged, report)
        assert not report.cut_inside, report.cut_inside


def test_a_log_start_outside_the_segments_or_not_checkpointed_is_a_violation():
    report = Report("t")
    check_log_starts_at_boundaries([replica(50, (100, 200, 1)), replica(None, (0, 200, 1), broker=2)], {}, report)
    assert len(report.cut_inside) == 2
    assert "log start 50 outside its segments [100, 200)" in report.cut_inside[0]


# -- I11 (b): nothing deleted before it expired -----------------------------------------------------


def test_an_acked_record_below_a_log_start_must_have_expired_when_it_was_seen():
    acked = [ack(o, 1000 * o) for o in range(10)]  # offset o written at o seconds
    report = Report("t")
    # at 10 s, offsets below 4 (the newest at 3 s: 7 s old) had expired; at 10.5 s, 5 (5.5 s old) had not
    check_nothing_deleted_early([LogStart(10_000, 0, 4, "broker 1"), LogStart(10_500, 0, 6, "broker 2"),
                                 LogStart(10_800, 0, 6, "broker 3"), LogStart(11_000, 0, 6, "broker 1")],
                                acked, RETENTION_MS, report)
    assert len(report.deleted_early) == 1  # one example per record, not one per sighting
    assert "log start 6 (broker 2)" in report.deleted_early[0] and "acked offset 5" in report.deleted_early[0]


def test_without_time_retention_nothing_acked_may_be_below_a_log_start():
    report = Report("t")
    check_nothing_deleted_early([LogStart(10**9, 0, 0, "broker 1"), LogStart(10**9, 1, 1, "broker 1")],
                                [ack(0, 0), ack(0, 0, partition=1)], -1, report)
    assert len(report.deleted_early) == 1 and report.deleted_early[0].startswith("partition 1")


# -- I11 (c): whatever expired was deleted ------------------------------------------------------------


def test_an_expired_segment_below_the_high_watermark_must_be_gone_by_the_stop():
    # stopped at 100 s: a segment whose newest record is older than 100 - 6 - 5 = 89 s is overdue
    kept = replica(0, (0, 10, 80_000), (10, 20, 88_000), (20, 30, 95_000))
    report = Report("t")
    check_expired_segments_deleted([kept], RETENTION_MS, SLACK_MS, report)
    assert len(report.kept_expired) == 1 and "2 expired segments kept, the first [0, 10)" in report.kept_expired[0]
    # not overdue: above the high watermark, up too briefly, or retention off
    for r, retention_ms in ((replica(0, (0, 10, 80_000), hw=5), RETENTION_MS),
                            (replica(0, (0, 10, 80_000), started_ms=96_000), RETENTION_MS),
                            (kept, -1)):
        report = Report("t")
        check_expired_segments_deleted([r], retention_ms, SLACK_MS, report)
        assert not report.kept_expired, report.kept_expired


def test_a_correct_history_passes_every_retention_check():
    # offset o written at o seconds; stopped at 100 s, each broker kept the segment written from 80 s on
    acked = [ack(o, 1000 * o) for o in range(90)]
    replicas = [replica(80, (80, 90, 89_000), broker=b) for b in (1, 2, 3)]
    report = Report("t")
    check_retention(replicas, [LogStart(70_000, 0, 20, "broker 1")], acked, RETENTION_MS, SLACK_MS, {}, report)
    assert report.violations() == {}
    assert report.log_starts == {0: {1: 80, 2: 80, 3: 80}}
