"""The broker's log cleaner task (``BrokerServer._run_log_cleaner``) over a real LogManager
in two temp dirs, without starting a broker: a dir whose cleaner checkpoint cannot be
written fails alone; the task goes on cleaning the other dir's logs."""

from __future__ import annotations

import dataclasses
import types

import trio

from tests.unit.log.test_cleaner import COMPACT, fail_cleaner_checkpoint_writes
from tidelog.broker.log.cleaner import CleanerConfig, LogCleaner
from tidelog.broker.log.manager import LogManager
from tidelog.broker.server import BrokerServer
from tidelog.protocol.records import BatchBuilder, Codec
from tidelog.protocol.topics import TopicPartition

EAGER = dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.01)


def dirty_log(manager: LogManager, tp: TopicPartition):
    log = manager.get_or_create_log(tp, EAGER)
    for i in range(40):
        b = BatchBuilder(Codec.NONE)
        b.append(1_700_000_000_000, b"k%d" % (i % 4), b"v%d" % i)
        log.append_as_leader(b.build(), 0)
    log.roll()
    log.update_high_watermark(log.log_end_offset)
    return log


async def test_a_failing_cleaner_checkpoint_takes_its_dir_offline_and_the_cleaner_goes_on(tmp_path, monkeypatch):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    manager = LogManager(dirs, EAGER)
    manager.startup({})
    first, second = TopicPartition("t", 0), TopicPartition("t", 1)
    dirty_log(manager, first)
    dirty_log(manager, second)
    failing = manager._dir_of[first]
    assert manager._dir_of[second] != failing
    fail_cleaner_checkpoint_writes(monkeypatch, failing)
    cleaner = LogCleaner(manager, CleanerConfig())
    server = types.SimpleNamespace(log_cleaner=cleaner, config=types.SimpleNamespace(log_cleaner_backoff_ms=10))
    server._clean = lambda job: BrokerServer._clean(server, job)
    grab = cleaner.grab_filthiest_log
    offline: list[str] = []

    def next_round():
        # the broker's owner takes a failed dir offline between rounds (on_dir_failure_found)
        for d, reason in manager.pending_dir_failures().items():
            manager.take_dir_offline(d, reason)
            offline.append(d)
        job = grab()
        if job is None:
            scope.cancel()  # nothing left to clean
        return job
    cleaner.grab_filthiest_log = next_round
    with trio.CancelScope() as scope:
        await BrokerServer._run_log_cleaner(server)  # returns only through the cancel
    assert offline == [failing]
    assert cleaner.cleanings == 2
    assert manager.cleaner_checkpoints() == {second: manager.get_log(second).active_segment.base_offset}
    manager.shutdown()
