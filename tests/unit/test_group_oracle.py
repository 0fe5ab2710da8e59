"""The group fault oracle (tests/system/group_harness.py) on made-up events: it finds what it
is meant to find (commits going backwards, two committers in one generation, a resume away
from the committed offset, an offset nobody processed, a processed record not in the log) and
accepts a correct history."""

from __future__ import annotations

import pytest

from tests.system.group_harness import (
    GroupReport,
    Sample,
    check_commits_monotonic,
    check_coverage,
    check_one_committer,
    check_records,
    check_resumes,
    check_sampled_monotonic,
)


def assigned(*tps: int, committed: dict | None = None, error: str | None = None) -> dict:
    return {"e": "assigned", "tps": list(tps), "generation": [1, "m"], "committed_error": error,
            "committed": {str(p): o for p, o in (committed or {}).items()}}


def records(p: int, *offsets: int) -> dict:
    return {"e": "records", "p": p, "offsets": list(offsets), "values": [f"{p}:{o}" for o in offsets]}


def test_commits_merged_in_acknowledgement_order_must_not_go_back():
    report = GroupReport("t")
    check_commits_monotonic([(1.0, "a", 1, 0, 10), (2.0, "b", 2, 0, 10), (3.0, "b", 2, 0, 15),
                             (3.5, "b", 2, 1, 3), (4.0, "a", 1, 0, 12)], report)
    assert len(report.backwards) == 1 and "a committed 12" in report.backwards[0]


def test_the_coordinators_answers_must_not_go_back():
    report = GroupReport("t")
    check_sampled_monotonic({0: [Sample(1.0, 1, 5), Sample(2.0, 2, 9), Sample(3.0, 2, 7)], 1: [Sample(1.0, 1, 0)]},
                            report)
    assert len(report.sampled_backwards) == 1 and "answered 9" in report.sampled_backwards[0]


def test_one_committer_per_partition_and_generation():
    report = GroupReport("t")
    check_one_committer([(1.0, "a", 1, 0, 1), (2.0, "a", 1, 0, 2), (3.0, "b", 2, 0, 3), (4.0, "c", 2, 0, 4)], report)
    assert len(report.shared) == 1 and "generation 2" in report.shared[0]


def test_a_partition_resumes_at_the_committed_offset_after_each_assignment():
    report = GroupReport("t")
    check_resumes("m", [assigned(0, 1, committed={0: 5, 1: None}), records(0, 5, 6), records(1, 0),
                        {"e": "revoked", "tps": [0, 1]},
                        assigned(0, committed={0: 7}), records(0, 8),       # skipped offset 7
                        assigned(1, error="RequestTimedOut"), records(1, 3)],  # not asked: unchecked
                  report)
    assert report.resumes_checked == 3 and report.resumes_unchecked == 1
    assert report.wrong_resume == ["m: partition 0 resumed at 8, the committed offset was 7"]


def test_a_revoked_partition_without_records_is_not_checked():
    report = GroupReport("t")
    check_resumes("m", [assigned(0, committed={0: 5}), {"e": "lost", "tps": [0]}, records(0, 9)], report)
    assert report.resumes_checked == 0 and not report.wrong_resume


def test_processed_records_must_be_in_the_final_log():
    report = GroupReport("t")
    processed: dict[int, set[int]] = {0: set()}
    check_records("m", records(0, 0, 1, 2), {0: {0: b"0:0", 1: b"0:1", 2: b"0:x"}}, processed, report)
    assert processed == {0: {0, 1, 2}} and report.records_processed == 3
    assert len(report.phantom) == 1 and "offset 2" in report.phantom[0]


def test_every_offset_below_the_final_commit_was_processed_and_the_commit_reached_the_hw():
    report = GroupReport("t")
    check_coverage({0: {0, 1, 2, 3}, 1: {0, 2}, 2: {0, 1}}, {0: 4, 1: 3, 2: 2}, {0: 4, 1: 3, 2: 3}, report)
    assert report.gaps == ["partition 1: 1 offsets below the committed 3 never processed, first [1]"]
    assert report.not_committed == ["partition 2: last acknowledged commit 2, HW 3"]


def test_a_clean_report_passes_and_a_violation_fails():
    report = GroupReport("t", commits_acked=1, resumes_checked=1)
    report.assert_ok()
    report.gaps.append("partition 0: offset 3 never processed")
    with pytest.raises(AssertionError, match="gaps"):
        report.assert_ok()
