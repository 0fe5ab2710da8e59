"""The F16 oracle (tests/system/spark_harness.py) on a made-up history: it accepts a correct
one (a batch in flight at a kill, partly written, then replayed whole) and finds what it is
meant to find (a record its batch's run did not write, a run writing outside its batches or
twice, a wrong value, a replay of another range or with other rows); and it reads Spark's
offsets log as Spark writes it."""

from __future__ import annotations

import json

from tests.system.spark_harness import Checkpoint, Kill, Written, batch_of, batch_ranges, check_spark, committers

# one partition, four batches: [0, 10) [10, 20) [20, 30) [30, 35); run 1 committed 0 and 1 and
# was killed with batch 2 in flight, after writing offsets 20..24; run 2 replayed 2 and ran 3
PLANNED = {0: {0: 10}, 1: {0: 20}, 2: {0: 30}, 3: {0: 35}}
FINAL = {0: {o: b"v%d" % o for o in range(35)}}
KILLS = [Kill(run=1, committed=1, in_flight=2, start={0: 20}, end={0: 30})]


def progress(batch: int, start: int, end: int, rows: int | None = None) -> dict:
    return {"batch": batch, "rows": end - start if rows is None else rows, "start": {"t": {"0": start}},
            "end": {"t": {"0": end}}}


PROGRESS = {1: {0: progress(0, 0, 10), 1: progress(1, 10, 20)},
            2: {2: progress(2, 20, 30), 3: progress(3, 30, 35)}}


def written(run: int, offsets, value=lambda o: b"v%d" % o) -> list[Written]:
    return [Written(run, 0, o, value(o)) for o in offsets]


GOOD = written(1, range(0, 25)) + written(2, range(20, 35))


def check(written_records=GOOD, planned=PLANNED, kills=KILLS, prog=PROGRESS):
    return check_spark(FINAL, planned, 3, kills, 2, prog, written_records)


def test_a_correct_history_with_a_replay_passes():
    report = check()
    assert report.violations() == {}
    assert report.duplicates == 5 and report.written == 40 and report.batches == 4
    assert report.replayed == ["batch 2: killed in run 1, replayed by run 2: {0: 20} -> {0: 30}, 10 rows"]


def test_each_batch_is_committed_by_the_run_after_the_last_commit_it_found():
    assert committers(KILLS, 2) == [(0, 1), (2, 2)]
    between = [Kill(1, 4, None), Kill(2, 7, 8, {0: 1}, {0: 2}), Kill(3, None, 0, None, {0: 1})]
    assert committers(between, 4) == [(0, 1), (5, 2), (8, 3), (0, 4)]


def test_an_offset_belongs_to_the_batch_that_planned_it():
    ranges = batch_ranges({0: {0: 10, 1: 0}, 1: {0: 10, 1: 4}, 2: {0: 12, 1: 4}}, 2)
    assert [batch_of(ranges, 0, o) for o in (0, 9, 10, 11, 12)] == [0, 0, 2, 2, None]
    assert [batch_of(ranges, 1, o) for o in (0, 3, 4)] == [1, 1, None]


def test_a_record_the_committing_run_did_not_write_is_lost():
    report = check(written(1, range(0, 25)) + written(2, [20, 21, 22, 23, 24, 26, 27, 28, 29, *range(30, 35)]))
    assert report.lost == ["input 0:25 (batch 2, run 2) is not in the output; written by []"]


def test_the_killed_run_writing_is_not_enough():
    report = check(written(1, range(0, 25)) + written(2, range(25, 35)))  # the replay skipped 20..24
    assert len(report.lost) == 5 and "input 0:20 (batch 2, run 2)" in report.lost[0]


def test_a_run_writing_a_batch_it_did_not_run_or_twice_or_beyond():
    report = check(GOOD + written(2, [3]) + written(2, [33]) + [Written(2, 0, 35, b"x")])
    assert report.unexpected == ["input 0:3 (batch 0) written by runs [1, 2]; only runs [1] ran that batch"]
    assert report.twice_in_run == ["run 2 wrote input 0:33 2 times"]
    assert report.beyond == ["input 0:35 written by runs [2]: no committed batch planned it"]


def test_a_wrong_value():
    report = check(written(1, range(0, 25)) + written(2, range(20, 35), lambda o: b"w" if o == 30 else b"v%d" % o))
    assert report.wrong_value == ["run 2 wrote b'w' for input 0:30, which holds b'v30'"]


def test_i14_a_replay_of_another_range_or_with_other_rows():
    moved = {**PLANNED, 2: {0: 31}, 3: {0: 35}}
    assert "the offsets log now holds {0: 20} -> {0: 31}" in check(planned=moved).not_replayed[0]
    other = {1: PROGRESS[1], 2: {**PROGRESS[2], 2: progress(2, 20, 30, rows=9)}}
    assert check(prog=other).not_replayed == [
        "batch 2: planned {0: 20} -> {0: 30} (10 records) by run 1, run 2 read {0: 20} -> {0: 30} (9 rows)"]
    missing = {1: PROGRESS[1], 2: {3: PROGRESS[2][3]}}
    assert check(prog=missing).not_replayed == ["batch 2: run 2 reported no progress for it"]


def test_the_checkpoint_is_read_as_spark_writes_it(tmp_path):
    for log, batches in (("offsets", (0, 1)), ("commits", (0,))):
        (tmp_path / log).mkdir()
        for b in batches:
            (tmp_path / log / f".{b}.crc").write_bytes(b"")
            (tmp_path / log / str(b)).write_text(
                'v1\n{"batchWatermarkMs":0}\n' + json.dumps({"t": {"0": 5 * (b + 1), "1": 3}, "u": {"0": 9}})
                if log == "offsets" else 'v1\n{"nextBatchWatermarkMs":0}')
    ckpt = Checkpoint(tmp_path, "t")
    assert ckpt.ids("offsets") == [0, 1] and ckpt.last("commits") == 0 and Checkpoint(tmp_path / "x", "t").last("x") is None
    assert ckpt.planned_ends() == {0: {0: 5, 1: 3}, 1: {0: 10, 1: 3}}
