"""Producer id expiration (Kafka's producer.id.expiration.ms) and what it frees in a compacted
log: an idle producer's state is forgotten, and the record the cleaner kept for its last
sequence becomes an ordinary record again, so a compacted topic written by many short-lived
idempotent producers converges to one record per key."""

from __future__ import annotations

import dataclasses

import pytest

from broker.log.producer_state import BatchMetadata, ProducerStateEntry, ProducerStateManager

from tests.unit.log.test_cleaner import COMPACT, Env

pytestmark = pytest.mark.unit

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


def test_a_compacted_log_of_many_short_lived_producers_converges_once_they_expire(tmp_path):
    env = Env(tmp_path, dataclasses.replace(COMPACT, min_cleanable_dirty_ratio=0.01))
    for pid in range(12):  # one record each, as producers that restart get a new id each time
        env.append((b"k", b"v%d" % pid), producer_id=100 + pid, sequence=0)
    env.append((b"other", b"x"))
    env.roll()
    env.clean()
    # each live producer keeps its last record (its last sequence stays in the log)
    assert len([r for r in env.records() if r[1][0] == b"k"]) == 12
    env.clock.advance(EXPIRATION_MS + 1)
    env.manager.producer_id_expiration_ms = EXPIRATION_MS
    assert env.manager.remove_expired_producers() == 12
    assert env.log.producer_state.producers == {}
    env.clean()
    assert [(o, r[:2]) for o, r in env.records()] == [(11, (b"k", b"v11")), (12, (b"other", b"x"))]
    env.check_records_are_appended_ones()
    env.restart()
    assert env.log.producer_state.producers == {}  # the snapshot at shutdown has none of them
