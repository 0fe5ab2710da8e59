"""A leader's append validates the records of every produced batch (Kafka's LogValidator):
a failing batch is refused with its error code and nothing of the produce is stored; the
topic's timestamp configs (KIP-937) and compaction decide the rules; records validated off
the event loop (``checked``) are not checked again."""

from __future__ import annotations

import pytest

from tests.unit.log.helpers import TP, FakeClock, make_batch, open_log, read_records, segment_file_sizes
from tests.unit.protocol.test_record_validation import forge, rec
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import CheckedRecords, checked
from tidelog.protocol.errors import CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP, TidelogError
from tidelog.protocol.records import Codec, compress

NOW = 1_700_000_000_000


@pytest.fixture
def clock():
    return FakeClock(NOW)


def refused(log, records: bytes) -> TidelogError:
    before = (log.log_end_offset, segment_file_sizes(log.directory))
    with pytest.raises(TidelogError) as e:
        log.append_as_leader(records, 0)
    assert (log.log_end_offset, segment_file_sizes(log.directory)) == before  # nothing stored
    return e.value


POISON = {
    "count 2^31-1 over one record": (forge([rec(0)], n=2**31 - 1, first=NOW), CORRUPT_MESSAGE),
    "not msgpack": (forge([rec(0)], raw=b"\xc1 definitely not msgpack", first=NOW), CORRUPT_MESSAGE),
    "timestamp -2^63": (forge([rec(0)], first=-2**63), INVALID_TIMESTAMP),
    "timestamp 2^63-1": (forge([rec(0)], first=2**63 - 1), INVALID_TIMESTAMP),
    "record after max timestamp": (forge([rec(0), rec(1, ts_delta=9)], first=NOW), INVALID_RECORD),
    "gzip bomb": (forge([rec(0)], codec=Codec.GZIP, raw=b"\x00" * (20 << 20), first=NOW), CORRUPT_MESSAGE),
}


@pytest.mark.parametrize("name", list(POISON))
def test_each_poison_pill_is_refused_and_nothing_is_stored(tmp_path, clock, name):
    log = open_log(tmp_path / "p", clock=clock)
    log.append_as_leader(make_batch(2, ts=NOW), 0)
    batch, error = POISON[name]
    e = refused(log, batch)
    assert e.error is error and str(TP) in str(e) and "batch 0" in str(e)
    log.append_as_leader(make_batch(1, ts=NOW), 0)  # the partition keeps working
    assert [r.offset for r in read_records(log)] == [0, 1, 2]


@pytest.mark.parametrize("bit, named", [(0x20, "control batch"), (0x10, "transactional batch"),
                                        (0x40, "delete-horizon flag")])
def test_flags_only_the_broker_sets_are_refused_from_clients(tmp_path, clock, monkeypatch, bit, named):
    # Kafka's LogValidator: control records are the broker's own; transactions are not
    # served here; the delete horizon is the cleaner's (a client's would drop its tombstones
    # early). Refused even with the per-record checks switched off.
    log = open_log(tmp_path / "p", clock=clock)
    e = refused(log, forge([rec(0)], first=NOW, attributes=bit))
    assert e.error is INVALID_RECORD and named in str(e) and "batch 0" in str(e)
    with pytest.raises(TidelogError, match=named):
        checked(forge([rec(0)], first=NOW, attributes=bit), log.config, NOW, TP)
    monkeypatch.setattr("tidelog.broker.log.log.RECORD_VALIDATION", False)
    assert refused(log, forge([rec(0)], first=NOW, attributes=bit)).error is INVALID_RECORD
    log.append_as_leader(make_batch(1, ts=NOW), 0)  # the partition keeps working


def test_one_bad_batch_refuses_the_whole_produce(tmp_path, clock):
    log = open_log(tmp_path / "p", clock=clock)
    e = refused(log, make_batch(3, ts=NOW) + forge([rec(0)], raw=b"\xc1"))
    assert e.error is CORRUPT_MESSAGE and "batch 1" in str(e)
    assert log.log_end_offset == 0


def test_the_topic_timestamp_window(tmp_path, clock):
    config = LogConfig().with_overrides({"message.timestamp.before.max.ms": "60000",
                                         "message.timestamp.after.max.ms": "1000"})
    log = open_log(tmp_path / "p", config, clock=clock)
    log.append_as_leader(make_batch(1, ts=NOW - 60000), 0)
    log.append_as_leader(make_batch(1, ts=NOW + 1000), 0)
    e = refused(log, make_batch(1, ts=NOW - 60001))
    assert e.error is INVALID_TIMESTAMP and "message.timestamp.before.max.ms (60000 ms)" in str(e)
    e = refused(log, make_batch(2, ts=[NOW, NOW + 1001]))
    assert e.error is INVALID_TIMESTAMP and "record 1" in str(e) and "after.max.ms" in str(e)


def test_the_deprecated_difference_bounds_both_sides(tmp_path, clock):
    config = LogConfig().with_overrides({"message.timestamp.difference.max.ms": "10"})
    log = open_log(tmp_path / "p", config, clock=clock)
    log.append_as_leader(make_batch(2, ts=[NOW - 10, NOW + 10]), 0)
    assert refused(log, make_batch(1, ts=NOW - 11)).error is INVALID_TIMESTAMP
    assert refused(log, make_batch(1, ts=NOW + 11)).error is INVALID_TIMESTAMP


def test_a_future_timestamp_is_refused_by_default_but_not_under_log_append_time(tmp_path, clock):
    log = open_log(tmp_path / "p", clock=clock)
    assert refused(log, make_batch(1, ts=NOW + 3600_001)).error is INVALID_TIMESTAMP
    appended = open_log(tmp_path / "q", LogConfig().with_overrides({"message.timestamp.type": "LogAppendTime"}),
                        clock=clock)
    appended.append_as_leader(make_batch(1, ts=NOW + 3600_001), 0)
    assert [r.timestamp for r in read_records(appended)] == [NOW]


def test_a_compacted_topic_refuses_a_record_without_a_key(tmp_path, clock):
    log = open_log(tmp_path / "p", LogConfig().with_overrides({"cleanup.policy": "compact"}), clock=clock)
    log.append_as_leader(make_batch(2, ts=NOW, key=b"k"), 0)
    e = refused(log, forge([rec(0, key=b"k"), rec(1)], first=NOW))
    assert e.error is INVALID_RECORD and "record 1" in str(e) and "without a key" in str(e)


def test_compressed_batches_within_the_bound_are_accepted(tmp_path, clock):
    log = open_log(tmp_path / "p", LogConfig().with_overrides({"max.message.bytes": "200000"}), clock=clock)
    log.append_as_leader(make_batch(100, size=1000, ts=NOW, codec=Codec.ZSTD), 0)  # ~100 KB inflated
    assert log.config.max_uncompressed_bytes == 8 * 200000
    bomb = forge([rec(0)], codec=Codec.ZSTD, raw=b"\x00" * (8 * 200000 + 1), first=NOW)
    assert len(bomb) < 1000 and len(compress(Codec.ZSTD, b"x")) < 100
    e = refused(log, bomb)
    assert e.error is CORRUPT_MESSAGE and "inflates beyond 1600000 bytes" in str(e)


def test_records_checked_in_a_worker_are_not_checked_again_under_the_same_config(tmp_path, clock):
    log = open_log(tmp_path / "p", clock=clock)
    good = checked(make_batch(2, ts=NOW), log.config, NOW, TP)
    assert isinstance(good, CheckedRecords)
    log.append_as_leader(good, 0)
    with pytest.raises(TidelogError) as e:
        checked(forge([rec(0)], raw=b"\xc1"), log.config, NOW, TP)
    assert e.value.error is CORRUPT_MESSAGE
    # checked against another config: the append checks again
    stale = checked(make_batch(1, ts=NOW + 3600_001), LogConfig(message_timestamp_after_max_ms=2**62), NOW, TP)
    assert refused(log, stale).error is INVALID_TIMESTAMP
    assert log.log_end_offset == 2
