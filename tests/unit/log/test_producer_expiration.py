"""Producer id expiration (Kafka's producer.id.expiration.ms) and what it frees in a compacted
log: an idle producer's state is forgotten, and the record the cleaner kept for its last
sequence becomes an ordinary record again, so a compacted topic written by many short-lived
idempotent producers does not keep a record for each of them. A producer's last record is
never kept when a later record of its key supersedes it: a deleted key would come back."""

from __future__ import annotations

import dataclasses

from tests.unit.log.test_cleaner import COMPACT, Env
from tidelog.broker.log.producer_state import BatchMetadata, ProducerStateEntry, ProducerStateManager

EXPIRATION_MS = 60_000


def entry(pid: int, last_timestamp: int) -> ProducerStateEntry:
    return ProducerStateEntry(pid, 0, [BatchMetadata(0, 0, pid, pid, last_timestamp)])


def test_producers_idle_for_the_expiration_time_are_removed():
    ps = ProducerStateManager()
    ps.producers = {1: entry(1, 1_000), 2: entry(2, 50_000), 3: entry(3, 61_000)}
    gone = ps.remove_expired_producers(now_ms=61_000, expiration_ms=EXPIRATION_MS)
    assert sorted(e.producer_id for e in gone) == [1]
    assert sorted(ps.producers) == [2, 3]
    assert ps.remove_expired_producers(now_ms=61_000, expiration_ms=EXPIRATION_MS) == []


def test_a_compacted_log_of_many_short_lived_producers_sheds_their_records_once_they_expire(tmp_path):
    env = Env(tmp_path, dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.01))
    for pid in range(12):  # a delete each, as producers that restart get a new id each time
        env.append((b"k%d" % pid, None), producer_id=100 + pid, sequence=0)
    env.append((b"other", b"x"))
    env.roll()
    env.clean()
    env.clock.advance(COMPACT.delete_retention_ms + 1)
    env.append((b"other", b"y"))
    env.roll()
    env.clean()
    # past their delete horizon, the tombstones stay as the live producers' last records
    assert len([r for r in env.records() if r[1][1] is None]) == 12
    env.clock.advance(EXPIRATION_MS + 1)
    env.manager.producer_id_expiration_ms = EXPIRATION_MS
    assert env.manager.remove_expired_producers() == 12
    assert env.log.producer_state.producers == {}
    env.clean()
    assert [(o, r[:2]) for o, r in env.records()] == [(13, (b"other", b"y"))]
    env.check_records_are_appended_ones()
    env.restart()
    assert env.log.producer_state.producers == {}  # the snapshot at shutdown has none of them


def test_a_deleted_key_does_not_come_back_with_a_producers_superseded_last_record(tmp_path):
    env = Env(tmp_path, dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.01))
    env.append((b"k", b"stale"), producer_id=7, sequence=0)  # producer 7's last record
    for i in range(20):
        env.append((b"k", b"v%d" % i))
    env.append((b"k", None))  # k is deleted
    env.roll()
    env.clean()
    env.clock.advance(COMPACT.delete_retention_ms + 1)
    for i in range(20):
        env.append((b"other", b"x%d" % i))
    env.roll()
    env.clean()  # the tombstone's delete horizon has passed: it goes
    assert b"k" not in [r[0] for _, r in env.records()]  # k stays deleted
    assert 7 in env.log.producer_state.producers  # the producer is still known (its state)
    env.check_records_are_appended_ones()


def test_a_producer_whose_records_were_deleted_expires_without_moving_the_checkpoint(tmp_path):
    # a log start past a producer's records forgets nothing (Kafka 2.5+); its expiry later has
    # no record left to reconsider, so the cleaner checkpoint stays inside the log
    env = Env(tmp_path, dataclasses.replace(COMPACT, cleanup_policy="compact,delete", min_cleanable_dirty_ratio=0.01))
    env.append((b"k", b"v"), producer_id=7, sequence=0)
    for i in range(10):
        env.append((b"k%d" % i, b"v"))
    env.roll()
    env.clean()
    before = env.manager.cleaner_checkpoints()[env.log.topic_partition]
    env.log.maybe_increment_log_start_offset(5)
    assert 7 in env.log.producer_state.producers
    env.clock.advance(EXPIRATION_MS + 1)
    env.manager.producer_id_expiration_ms = EXPIRATION_MS
    assert env.manager.remove_expired_producers() == 1
    assert env.manager.cleaner_checkpoints()[env.log.topic_partition] == before
