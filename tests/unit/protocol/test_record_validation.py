"""``validate_records``: a produced batch's records block against its header and the topic's
rules (Kafka's LogValidator), with each poison pill of issue 14 refused with its error code."""

from __future__ import annotations

import struct

import msgpack
import pytest
from crc32c import crc32c

from tidelog.protocol.errors import CORRUPT_MESSAGE, INVALID_RECORD, INVALID_TIMESTAMP, TidelogError
from tidelog.protocol.records import (
    MAX_LONG,
    Codec,
    RecordRules,
    build_batch,
    compress,
    validate_batch,
    validate_records,
)

NOW = 1_700_000_000_000
RULES = RecordRules()


def forge(records, n: int | None = None, *, first: int = NOW, max_ts: int | None = None,
          codec: int = Codec.NONE, raw: bytes | None = None, attributes: int = 0) -> bytes:
    """A batch with a valid CRC and whatever header and records block the test wants."""
    body = raw if raw is not None else msgpack.packb(records, use_bin_type=True)
    body = compress(codec, body)
    n = len(records) if n is None else n
    max_ts = first if max_ts is None else max_ts
    tail = struct.pack(">hiqqqhii", codec | attributes, n - 1, first, max_ts, -1, -1, -1, n)
    crc = crc32c(body, crc32c(tail))
    return struct.pack(">qiibI", 0, len(tail) + len(body) + 9, -1, 2, crc) + tail + body


def check(batch: bytes, rules: RecordRules = RULES, chunk: int | None = None, now: int = NOW) -> None:
    validate_records(batch, 0, validate_batch(batch), rules, now, chunk=chunk)


def refused(batch: bytes, rules: RecordRules = RULES, chunk: int | None = None, now: int = NOW) -> TidelogError:
    with pytest.raises(TidelogError) as e:
        check(batch, rules, chunk, now)
    return e.value


def rec(i: int, ts_delta: int = 0, key: bytes | None = None, value: bytes | None = b"v", headers=None):
    return [ts_delta, i, key, value, headers]


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("chunk", [None, 2])
def test_a_well_formed_batch_passes_in_every_codec(codec, chunk):
    records = [(b"k", b"v", [("h", b"x"), ("n", None)], NOW - 5), (None, None, None, NOW), b"plain"]
    check(build_batch(records, codec=codec, timestamp_ms=NOW), chunk=chunk)


def test_a_batch_without_timestamps_passes():
    check(build_batch([b"a", b"b"]))  # every record -1: no timestamp, exempt from the window


# -- the poison pills of issue 14 --------------------------------------------------------------

@pytest.mark.parametrize("chunk", [None, 4])
def test_a_header_claiming_2_31_minus_1_records_over_one_is_corrupt(chunk):
    e = refused(forge([rec(0)], n=2**31 - 1), chunk=chunk)
    assert e.error is CORRUPT_MESSAGE and "2147483647 records" in str(e)


@pytest.mark.parametrize("chunk", [None, 4])
def test_a_count_that_the_block_could_hold_but_does_not_is_corrupt(chunk):
    e = refused(forge([rec(0), rec(1), rec(2)], n=2), chunk=chunk)
    assert e.error is CORRUPT_MESSAGE and "2 records" in str(e)


@pytest.mark.parametrize("raw", [b"\xc1\xc1\xc1\xc1\xc1\xc1", b"not msgpack at all, just text", b"\x91"])
def test_a_records_block_that_is_not_msgpack_is_corrupt(raw):
    e = refused(forge([rec(0)], raw=raw))
    assert e.error is CORRUPT_MESSAGE


@pytest.mark.parametrize("ts", [-2**63, 2**63 - 1, -2])
def test_extreme_timestamps_are_refused(ts):
    e = refused(forge([rec(0)], first=ts))
    assert e.error is INVALID_TIMESTAMP and str(ts) in str(e) and "record 0" in str(e)


def test_a_timestamp_overflowing_int64_is_refused():
    e = refused(forge([rec(0), rec(1, ts_delta=10)], first=MAX_LONG - 5, max_ts=MAX_LONG))
    assert e.error is INVALID_TIMESTAMP and "record 1" in str(e)


# -- the rules one by one ----------------------------------------------------------------------

def test_offset_deltas_must_count_from_zero():
    e = refused(forge([rec(0), rec(2), rec(2)]))
    assert e.error is CORRUPT_MESSAGE and "record 1" in str(e) and "offset_delta 2, expected 1" in str(e)


@pytest.mark.parametrize("bad", [[0, 0, 5, b"v", None], [0, 0, None, "text", None], ["0", 0, None, b"v", None],
                                 [0, 0, None], 7, [0, 0, None, b"v", [("h",)]], [0, 0, None, b"v", 3]])
def test_a_malformed_record_is_named_by_its_index(bad):
    e = refused(forge([rec(0), bad[:1] + [1] + bad[2:] if isinstance(bad, list) and len(bad) > 1 else bad]))
    assert e.error is CORRUPT_MESSAGE and ("record 1" in str(e) or "can hold at most 1" in str(e))


@pytest.mark.parametrize("bad", [[0, 0, 5, b"v", None], [0, 0, None, "text", None], ["0", 0, None, b"v", None],
                                 [0, 0, None], 7, [0, 0, None, b"v", [("h",)]], [0, 0, None, b"v", 3],
                                 [0, 1, None, b"v", None], [0, 0.5, None, b"v", None], [0, 0, b"k", b"v"]])
def test_a_record_alone_in_its_batch_gets_the_same_verdicts(bad):
    # one record is checked field by field rather than a column at a time: the verdicts agree
    e = refused(forge([bad]))
    assert e.error is CORRUPT_MESSAGE and ("record 0" in str(e) or "can hold at most 0" in str(e))
    check(forge([rec(0, key=b"k", headers=[("h", b"x"), ("n", None)])]))
    check(forge([rec(0, value=None)]))
    e = refused(forge([rec(0)]), RecordRules(require_keys=True))
    assert e.error is INVALID_RECORD and "record 0" in str(e)
    e = refused(forge([rec(0, ts_delta=5)], max_ts=NOW + 3))
    assert e.error is INVALID_RECORD and "record 0" in str(e)


def test_a_record_after_the_batch_max_timestamp_is_invalid():
    e = refused(forge([rec(0), rec(1, ts_delta=7)], max_ts=NOW + 3))
    assert e.error is INVALID_RECORD and "record 1" in str(e) and str(NOW + 3) in str(e)


def test_a_max_timestamp_above_every_record_is_invalid():
    e = refused(forge([rec(0)], max_ts=NOW + 1000))
    assert e.error is INVALID_RECORD and "largest record timestamp" in str(e)


def test_the_window_before_and_after_the_broker_clock():
    batch = forge([rec(0), rec(1, ts_delta=100)], max_ts=NOW + 100)
    check(batch, RecordRules(before_max_ms=0, after_max_ms=100))
    e = refused(batch, RecordRules(after_max_ms=99))
    assert e.error is INVALID_TIMESTAMP and "record 1" in str(e) and "message.timestamp.after.max.ms" in str(e)
    e = refused(batch, RecordRules(before_max_ms=999), now=NOW + 1000)
    assert e.error is INVALID_TIMESTAMP and "record 0" in str(e) and "message.timestamp.before.max.ms" in str(e)
    check(batch, RecordRules(before_max_ms=999, create_time=False), now=NOW + 1000)  # LogAppendTime topic


def test_records_without_timestamp_are_exempt_from_the_window_but_others_are_not():
    batch = forge([rec(0, ts_delta=0), rec(1, ts_delta=NOW + 1)], first=-1, max_ts=NOW)
    check(batch, RecordRules(before_max_ms=0, after_max_ms=1))
    e = refused(batch, RecordRules(before_max_ms=5), now=NOW + 10)
    assert e.error is INVALID_TIMESTAMP and "record 1" in str(e)


def test_a_compacted_topic_needs_a_key_on_every_record():
    batch = forge([rec(0, key=b"k"), rec(1), rec(2, key=b"k")])
    check(batch)
    e = refused(batch, RecordRules(require_keys=True))
    assert e.error is INVALID_RECORD and "record 1" in str(e) and "without a key" in str(e)


# -- bounded decompression ---------------------------------------------------------------------

@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_a_decompression_bomb_stops_at_the_bound(codec):
    bomb = forge([rec(0)], codec=codec, raw=b"\x00" * (8 << 20))
    e = refused(bomb, RecordRules(max_uncompressed_bytes=1 << 20))
    assert e.error is CORRUPT_MESSAGE and "1048576" in str(e)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_a_torn_compressed_block_is_corrupt(codec):
    good = compress(codec, msgpack.packb([rec(0)] * 1, use_bin_type=True))
    e = refused(forge([rec(0)], raw=good[: len(good) // 2]))  # codec NONE: garbage to msgpack
    assert e.error is CORRUPT_MESSAGE
    tail = struct.pack(">hiqqqhii", codec, 0, NOW, NOW, -1, -1, -1, 1)
    body = good[: len(good) - 3]
    batch = struct.pack(">qiibI", 0, len(tail) + len(body) + 9, -1, 2, crc32c(body, crc32c(tail))) + tail + body
    assert refused(batch).error is CORRUPT_MESSAGE


def test_many_tiny_records_are_unpacked_in_chunks_with_the_same_verdict():
    records = [rec(i) for i in range(10_000)]
    check(forge(records), chunk=1000)
    records[9_999] = [0, 1, None, b"v", None]
    e = refused(forge(records), chunk=1000)
    assert e.error is CORRUPT_MESSAGE and "record 9999" in str(e) and "expected 9999" in str(e)
    records[9_999] = [0, 9_999, None, b"v", None]
    records[4_321] = [5, 4_321, None, b"v", None]  # after the batch's max timestamp
    e = refused(forge(records), chunk=1000)
    assert e.error is INVALID_RECORD and "record 4321" in str(e)
    e = refused(forge(records, max_ts=NOW + 5), RecordRules(after_max_ms=1), chunk=1000)
    assert e.error is INVALID_TIMESTAMP and "record 4321" in str(e)
    records[4_321] = [0, 4_321, None, b"v", None]
    assert refused(forge(records, max_ts=NOW + 1), chunk=1000).error is INVALID_RECORD  # none reaches the max
    e = refused(forge(records), RecordRules(require_keys=True), chunk=1000)
    assert e.error is INVALID_RECORD and "record 0" in str(e)
    assert refused(forge(records[:-1], n=10_000), chunk=1000).error is CORRUPT_MESSAGE
