"""A cleaning in progress while the log changes under it on the owner thread: a truncation
(a follower after an unclean leader election) or the deletion of the topic (and a new topic
of the same name). The cleaning's heavy steps run between the owner thread's calls, as in the
broker; here they are called one by one, with the change in between."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.log.test_cleaner import COMPACT, TP, Env
from tidelog.broker.log.cleaner import CleaningAborted, run_steps_inline

EAGER = dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.01)


def fill(env, tag: str, n: int = 15) -> None:
    for i in range(n):
        env.append((f"f{i}".encode(), f"{tag}{i}".encode()))


def clean_groups(job) -> None:
    """The groups' cleanings and swaps, as ``cleaning_steps`` runs them."""
    for group in job.groups():
        job.swap(group, job.clean_group(group))


def fill_rounds(env, prefix: str, rounds: int = 3) -> None:
    """``rounds`` segments of ``fill``, each rolled."""
    for round_ in range(rounds):
        fill(env, f"{prefix}{round_}-")
        env.roll()


def test_a_truncation_during_a_cleaning_abandons_it_and_loses_no_latest_record(tmp_path):
    env = Env(tmp_path, EAGER)
    env.append((b"k", b"old"))  # offset 0: k's latest record once the tail below is truncated
    fill(env, "a")
    env.roll()
    fill(env, "b")
    env.roll()
    truncation_point = env.log.log_end_offset
    env.append((b"k", b"new"))  # superseded k=old; lost by the truncation below
    fill(env, "c")
    env.roll()
    assert len(env.log.segments) >= 4
    job = env.cleaner.grab_filthiest_log()
    job.build_offset_map()
    assert job.end_offset > truncation_point
    # an unclean leader election: this replica truncates below its high watermark
    assert env.log.truncate_to(truncation_point)
    with pytest.raises(CleaningAborted):
        clean_groups(job)
    env.cleaner.abandon(job, CleaningAborted("truncated"))
    assert (b"k", b"old") in [r[:2] for _, r in env.records()]
    assert not env.cleaner.uncleanable
    env.log.update_high_watermark(env.log.log_end_offset)
    env.roll()
    env.clean()  # a later cleaning sees the truncated log: k=old stays, it is k's latest
    assert [(o, r[:2]) for o, r in env.records() if r[0] == b"k"] == [(0, (b"k", b"old"))]


def test_a_topic_deleted_and_created_again_during_a_cleaning_keeps_the_new_topics_data(tmp_path):
    env = Env(tmp_path, EAGER)
    fill_rounds(env, "r")
    job = env.cleaner.grab_filthiest_log()
    job.build_offset_map()
    groups = job.groups()
    cleaned = job.clean_group(groups[0])
    assert cleaned is not None
    env.manager.delete_log(TP)
    env.log = env.manager.get_or_create_log(TP, EAGER)  # the topic is created again
    env.expected = {}
    fill(env, "new-", 30)
    env.roll()
    with pytest.raises(CleaningAborted):
        job.swap(groups[0], cleaned)
    env.cleaner.abandon(job, CleaningAborted("deleted"))
    assert not env.cleaner.uncleanable
    env.check_records_are_appended_ones()
    assert len(env.records()) == 30
    env.restart()  # nothing of the new topic is left renamed aside for the loader to remove
    env.check_records_are_appended_ones()
    assert len(env.records()) == 30


def test_a_log_closed_during_a_cleaning_is_not_swapped(tmp_path):
    env = Env(tmp_path, EAGER)
    fill_rounds(env, "r")
    job = env.cleaner.grab_filthiest_log()
    env.manager.shutdown()  # the broker stops while the worker thread is busy
    with pytest.raises(CleaningAborted):
        run_steps_inline(job)
    env.cleaner.abandon(job, CleaningAborted("closed"))
    env.open()
    env.check_records_are_appended_ones()
    assert len(env.records()) == 45


def test_a_full_offset_map_stays_within_the_dedupe_buffer():
    # log.cleaner.dedupe.buffer.size bounds the memory of the cleaners' key -> offset maps
    import tracemalloc

    from tidelog.broker.log.cleaner import CleanerConfig, OffsetMap
    buffer_bytes = 8 * 1024 * 1024
    capacity = CleanerConfig(dedupe_buffer_size=buffer_bytes, io_buffer_load_factor=1.0).map_capacity
    tracemalloc.start()
    try:
        m = OffsetMap(capacity)
        for i in range(capacity):
            assert m.put(b"key-%d" % i, 1_000_000_000 + i)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not m.put(b"one more", 0)
    assert peak <= buffer_bytes


def test_a_topic_created_again_does_not_inherit_the_deleted_ones_cleaner_checkpoint(tmp_path):
    env = Env(tmp_path, EAGER)
    fill_rounds(env, "r")
    assert env.clean() is not None  # the checkpoint is now 45
    env.manager.delete_log(TP)
    env.log = env.manager.get_or_create_log(TP, EAGER)
    env.expected = {}
    for round_ in range(3):
        fill(env, f"new{round_}-")
    fill(env, "new3-", 5)
    env.roll()
    assert env.clean() is not None  # all of the new log is dirty: every key once
    assert sorted(r[0] for _, r in env.records()) == sorted(f"f{i}".encode() for i in range(15))
    env.check_records_are_appended_ones()


def test_records_written_again_below_the_cleaner_checkpoint_after_a_truncation_are_cleaned(tmp_path):
    env = Env(tmp_path, EAGER)
    fill(env, "a")
    env.roll()
    fill(env, "b")
    env.roll()
    assert env.clean() is not None  # the checkpoint is now 30
    # an unclean leader election: this replica truncates below its checkpoint, then copies the
    # new leader's records, which were never cleaned
    assert env.log.truncate_to(10)
    for offset in [o for o in env.expected if o >= 10]:
        del env.expected[offset]
    start = env.log.log_end_offset
    for i in range(40 - start):  # past the checkpoint, with keys of its own after it
        env.append((b"g%d" % (i % 3) if env.log.log_end_offset < 30 else b"h", b"new%d" % i))
    env.roll()
    env.clean()
    keys = [r[0] for _, r in env.records()]
    assert sorted(keys) == sorted(set(keys))  # one record per key
    env.check_records_are_appended_ones()


def test_a_failure_of_a_log_deleted_during_its_cleaning_is_an_abort(tmp_path):
    # the deletion renames the directory under the worker thread: its step fails with
    # FileNotFoundError, not CleaningAborted; the new topic of the name is cleaned as usual
    env = Env(tmp_path, EAGER)
    fill_rounds(env, "r")
    job = env.cleaner.grab_filthiest_log()
    job.build_offset_map()
    env.manager.delete_log(TP)
    env.cleaner.abandon(job, FileNotFoundError(2, "No such file or directory", job.log.directory))
    assert not env.cleaner.uncleanable
    env.log = env.manager.get_or_create_log(TP, EAGER)
    env.expected = {}
    fill_rounds(env, "new")
    assert env.clean() is not None


def test_an_uncleanable_partition_deleted_and_created_again_is_cleaned(tmp_path):
    env = Env(tmp_path, EAGER)
    fill_rounds(env, "r")
    job = env.cleaner.grab_filthiest_log()
    env.cleaner.abandon(job, ValueError("a segment the cleaner cannot read"))
    assert TP in env.cleaner.uncleanable
    assert env.clean() is None  # not cleaned again while that log lives
    env.manager.delete_log(TP)
    env.log = env.manager.get_or_create_log(TP, EAGER)
    env.expected = {}
    fill_rounds(env, "new")
    assert env.clean() is not None
    assert not env.cleaner.uncleanable
    env.check_records_are_appended_ones()


def test_a_segment_deleted_by_retention_during_a_cleaning_abandons_it_for_a_later_one(tmp_path):
    # the cleaner reads segments through their own descriptors (the segment LRU): one that
    # retention dropped is not read again by its path; the cleaning is tried again later
    env = Env(tmp_path, dataclasses.replace(EAGER, cleanup_policy="compact,delete"))
    fill_rounds(env, "r")
    job = env.cleaner.grab_filthiest_log()
    job.build_offset_map()
    second = env.log.segments[1].base_offset
    assert env.log.maybe_increment_log_start_offset(second)
    assert env.log.delete_old_segments() == [0]
    with pytest.raises(CleaningAborted, match="segment 0 was dropped") as aborted:
        clean_groups(job)
    env.cleaner.abandon(job, aborted.value)
    assert not env.cleaner.uncleanable
    assert env.clean() is not None
    env.expected = {o: r for o, r in env.expected.items() if o >= second}
    assert sorted(o for o, _ in env.records()) == sorted(env.latest().values())
    env.check_records_are_appended_ones()


def _truncate_below_the_checkpoint_and_write_k_again(env) -> None:
    """Checkpoint 40 over 40 distinct keys; a truncation to 10; then k's value and its
    tombstone below the old checkpoint, and records past it."""
    for i in range(40):
        env.append((f"a{i}".encode(), b"x"))
    env.roll()
    assert env.clean() is not None
    assert env.manager.cleaner_checkpoints()[TP] == 40
    assert env.log.truncate_to(10)
    assert env.manager.cleaner_checkpoints()[TP] <= 10  # written at the truncation
    env.append((b"k", b"old"))
    env.append((b"k", None))
    while env.log.log_end_offset < 45:
        env.append((b"b%d" % env.log.log_end_offset, b"y"))
    env.roll()


def _clean_past_the_delete_horizon(env) -> None:
    for round_ in range(4):
        fill(env, f"c{round_}-", 40)
        env.roll()
        env.clean()
        env.clock.advance(env.config.delete_retention_ms + 1)


def test_a_truncation_below_the_cleaner_checkpoint_is_written_before_a_restart(tmp_path):
    env = Env(tmp_path, EAGER)
    _truncate_below_the_checkpoint_and_write_k_again(env)
    env.restart()  # before the cleaner's next pick
    assert env.manager.cleaner_checkpoints()[TP] <= 10
    _clean_past_the_delete_horizon(env)
    assert [v for _, (k, v, *_r) in env.records() if k == b"k"] == []  # the old value does not come back


def test_a_truncation_of_an_uncleanable_log_lowers_its_cleaner_checkpoint(tmp_path):
    env = Env(tmp_path, EAGER)
    for i in range(40):
        env.append((f"a{i}".encode(), b"x"))
    env.roll()
    assert env.clean() is not None
    env.cleaner.uncleanable[TP] = (env.log, "CorruptRecordError: a damaged batch")  # as ``abandon`` marks it
    env.log.truncate_damaged(10)  # the damaged replica's repair
    for i in range(35):
        env.append((b"b%d" % i, b"y"))
    env.roll()
    env.restart()
    assert env.manager.cleaner_checkpoints()[TP] <= 10


def test_a_cleaning_ending_after_a_truncation_does_not_raise_the_checkpoint_again(tmp_path):
    env = Env(tmp_path, EAGER)
    for i in range(40):
        env.append((f"a{i}".encode(), b"x"))
    env.roll()
    job = env.cleaner.grab_filthiest_log()
    job.build_offset_map()
    assert job.end_offset == 40
    for group in job.groups():
        cleaned = job.clean_group(group)
        assert cleaned is None  # nothing to remove: the swap checks no fence
        job.swap(group, cleaned)
    assert env.log.truncate_to(10)
    env.cleaner.done_cleaning(job)
    assert env.manager.cleaner_checkpoints().get(TP, 0) <= 10
