"""A crash at every step of the swap of cleaned segments (broker.log.swap).

The swap is a list of file operations (``plan_swap``). For every k, a copy of the same log is
cleaned, the first k operations are applied, and the broker "crashes" (its file descriptors
are closed, nothing else). The log loaded again (an unclean start, no recovery point) must
hold exactly the records before the swap or exactly those after it: the old ones up to the
rename of the lowest new segment's ``.log`` (the decision), the new ones after it. No
``.cleaned``, ``.swap`` or ``.deleted`` file is left, and every segment passes dump-log
--verify.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from tests.unit.log.helpers import FakeClock, read_records
from tidelog.broker.log.cleaner import CleanerConfig, LogCleaner
from tidelog.broker.log.dump import run as dump_run
from tidelog.broker.log.manager import LogManager
from tidelog.broker.log.segment import CLEANED_SUFFIX, DELETED_SUFFIX, LOG_SUFFIX, OPEN_SEGMENT_FILES, SWAP_SUFFIX
from tidelog.broker.log.swap import apply_ops, plan_swap
from tidelog.protocol.records import build_batch
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("compacted", 0)


def _config():
    from tidelog.broker.log.config import LogConfig
    return LogConfig(segment_bytes=700, index_interval_bytes=100, cleanup_policy="compact",
                     min_cleanable_dirty_ratio=0.0, retention_ms=-1)


CONFIG = _config()


def _open(path, clock):
    m = LogManager([str(path)], CONFIG, clock=clock)
    m.startup({TP.topic: CONFIG})
    return m


def _records(log):
    return [(r.offset, r.key, r.value, r.timestamp) for r in read_records(log)]


@pytest.fixture
def template(tmp_path):
    """A compacted log cleaned once (small segments) and dirtied again, shut down cleanly."""
    clock = FakeClock()
    m = _open(tmp_path / "template", clock)
    log = m.get_or_create_log(TP, CONFIG)
    for round_ in range(2):
        for i in range(60):
            log.append_as_leader(build_batch([(f"k{i % 6}".encode(), f"r{round_}-{i}".encode())],
                                             timestamp_ms=clock()), 0)
            clock.advance(1)
        if round_ == 1:  # the last segment then holds a superseded record among latest ones
            log.append_as_leader(build_batch([(b"k0", b"last")], timestamp_ms=clock()), 0)
        log.roll()
        log.update_high_watermark(log.log_end_offset)
        if round_ == 0:
            assert LogCleaner(m, CleanerConfig(), clock).clean_once() is not None
    m.shutdown()
    return tmp_path / "template", clock


WANTED = {
    "first-group-emptied": (700, lambda group, cleaned: len(cleaned) == 1 and cleaned[0].size == 0),
    "group-removed": (700, lambda group, cleaned: not cleaned),
    "one-new-segment": (700, lambda group, cleaned: len(cleaned) == 1 and cleaned[0].size > 0),
    "several-new-segments": (90, lambda group, cleaned: len(cleaned) > 1),
}


def _prepare(path, clock, case):
    """A manager on ``path`` with the first group of a cleaning whose output fits ``case``
    written, not swapped (the output of the groups before it is discarded)."""
    output_segment_bytes, wanted = WANTED[case]
    m = _open(path, clock)
    log = m.get_log(TP)
    job = LogCleaner(m, CleanerConfig(), clock).grab_filthiest_log()
    job.build_offset_map()
    groups = job.groups()
    job.config = dataclasses.replace(job.config, segment_bytes=output_segment_bytes)  # the output rolls
    for group in groups:
        cleaned = job.clean_group(group)
        if cleaned is not None and wanted(group, cleaned):
            return m, log, job, group, cleaned
        for seg in cleaned or ():
            seg.delete()
    raise AssertionError(f"no group of the cleaning is a case of {case}")


def _crash(m, cleaned):
    """SIGKILL: every descriptor closed (the log dir's lock's too), nothing written."""
    for seg in cleaned:
        OPEN_SEGMENT_FILES.close(seg)
    m.abandon()


@pytest.mark.parametrize("case", sorted(WANTED))
def test_crash_after_every_swap_step_recovers_the_old_or_the_new_segments(template, tmp_path, capsys, case):
    source, clock = template
    m = _open(source, clock)
    old_records = _records(m.get_log(TP))
    m.shutdown()

    path = tmp_path / "complete"
    shutil.copytree(source, path)
    m, log, job, group, cleaned = _prepare(path, clock, case)
    ops = plan_swap(log.directory, [s.base_offset for s in cleaned], [s.base_offset for s in group])
    decision = max(i for i, op in enumerate(ops) if op.path.endswith(LOG_SUFFIX + CLEANED_SUFFIX)
                   and op.kind != "create")  # the last .cleaned goes: the swap is decided
    job.swap(group, cleaned)
    new_records = _records(log)
    assert new_records != old_records
    assert {o for o, *_ in new_records} < {o for o, *_ in old_records}
    m.shutdown()

    for k in range(len(ops) + 1):
        path = tmp_path / f"crash-after-{k}"
        shutil.copytree(source, path)
        m, log, job, group, cleaned = _prepare(path, clock, case)
        here = plan_swap(log.directory, [s.base_offset for s in cleaned], [s.base_offset for s in group])
        assert len(here) == len(ops)
        apply_ops(here[:k])
        _crash(m, cleaned)
        m = _open(path, clock)
        got = _records(m.get_log(TP))
        assert got == (old_records if k <= decision else new_records), f"crash after step {k}: {ops[k - 1]}"
        directory = m.get_log(TP).directory
        names = os.listdir(directory)
        assert not [n for n in names if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX))], names
        logs = sorted(os.path.join(directory, n) for n in names if n.endswith(LOG_SUFFIX))
        m.shutdown()
        assert dump_run(logs, verify=True) == 0, capsys.readouterr().out

