"""The record batch (protocol.records): round trips, validation faults, scanning, decoding.

The oracle for round trips is the input itself: whatever goes into BatchBuilder / build_batch
comes back out of iter_records, for every codec. For validation, each fault of the batch
format (docs/architecture.md, section 7) is produced on an otherwise valid batch and must be refused with the documented
exception and a message that names the problem. Hostile input (random bytes, mutated
batches, hand-built batches with a valid CRC but a malformed records block) must only ever
produce CorruptRecordError / UnsupportedCompressionError, never another exception.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import msgpack
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from tidelog.protocol.errors import CorruptRecordError, RecordTooLargeError, UnsupportedCompressionError
from tidelog.protocol.records import (
    ATTRIBUTES_AT,
    BATCH_LENGTH_AT,
    CODEC_MASK,
    CRC_AT,
    CRC_START,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAGIC_AT,
    MIN_BATCH_LENGTH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchBuilder,
    BatchRecord,
    Codec,
    TimestampType,
    any_compressed,
    build_batch,
    compress,
    compute_crc,
    decompress,
    holds_more_than_one_batch,
    iter_all_records,
    iter_headers,
    iter_records,
    patch_batch,
    read_header,
    scan_batches,
    set_log_append_time,
    validate_batch,
    validate_batches,
)

FAST = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
MEDIUM = settings(max_examples=120, suppress_health_check=[HealthCheck.too_slow])

ALL_CODECS = list(Codec)
RECORD_COUNT_AT = 57
LAST_OFFSET_DELTA_AT = 23

# -- strategies ---------------------------------------------------------------------------------

blobs = st.one_of(st.none(), st.binary(max_size=40))
headers_st = st.one_of(
    st.none(),
    st.lists(st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=10))), max_size=3),
)
timestamps = st.integers(min_value=0, max_value=2**41)
records_st = st.lists(st.tuples(blobs, blobs, headers_st, timestamps), min_size=1, max_size=12)
codecs = st.sampled_from(ALL_CODECS)


def _expected_headers(h):
    return [tuple(x) for x in h] if h else []


def _sample_batch(n: int = 3, codec: Codec = Codec.NONE, *, base_offset: int = 0,
                  value_size: int = 20) -> bytes:
    return build_batch([(b"k%d" % i, bytes([i % 256]) * value_size, [("h", b"v")], 1000 + i)
                        for i in range(n)], codec=codec, base_offset=base_offset, leader_epoch=3)


def _set(buf: bytes, at: int, fmt: str, value) -> bytearray:
    out = bytearray(buf)
    struct.pack_into(fmt, out, at, value)
    return out


def _fix_crc(buf: bytearray, pos: int = 0) -> bytearray:
    size = struct.unpack_from(">i", buf, pos + BATCH_LENGTH_AT)[0] + LOG_OVERHEAD
    struct.pack_into(">I", buf, pos + CRC_AT, compute_crc(buf, pos, size))
    return buf


def _hand_batch(body: bytes, record_count: int, *, codec: int = 0, base_offset: int = 0,
                first_ts: int = 1000, max_ts: int = 1000) -> bytes:
    """A batch with a correct header and CRC around an arbitrary records block."""
    tail = struct.pack(">hiqqqhii", codec, record_count - 1, first_ts, max_ts, -1, -1, -1,
                       record_count) + body
    return struct.pack(">qiibI", base_offset, len(tail) + 9, 0, MAGIC, crc32c(tail)) + tail


# -- round trips ---------------------------------------------------------------------------------


@FAST
@given(records=records_st, codec=codecs,
       base_offset=st.integers(min_value=0, max_value=2**62),
       leader_epoch=st.integers(min_value=-1, max_value=2**31 - 1),
       producer_id=st.integers(min_value=-1, max_value=2**62),
       producer_epoch=st.integers(min_value=-1, max_value=2**15 - 1),
       base_sequence=st.integers(min_value=-1, max_value=2**31 - 1))
def test_build_batch_round_trips_through_iter_records(records, codec, base_offset, leader_epoch,
                                                      producer_id, producer_epoch, base_sequence):
    buf = build_batch(records, codec=codec, base_offset=base_offset, leader_epoch=leader_epoch,
                      producer_id=producer_id, producer_epoch=producer_epoch,
                      base_sequence=base_sequence)
    h = validate_batch(buf)
    assert h.size == len(buf)
    assert (h.base_offset, h.leader_epoch, h.magic) == (base_offset, leader_epoch, MAGIC)
    assert h.record_count == len(records) and h.last_offset_delta == len(records) - 1
    assert h.codec == codec
    assert h.timestamp_type is TimestampType.CREATE_TIME
    assert not h.is_transactional and not h.is_control
    assert (h.producer_id, h.producer_epoch, h.base_sequence) == (producer_id, producer_epoch, base_sequence)
    assert h.first_timestamp == records[0][3]
    assert h.max_timestamp == max(r[3] for r in records)
    assert h.next_offset == base_offset + len(records)
    out = iter_records(buf)
    assert out == list(iter_records(buf, 0, h))
    assert len(out) == len(records)
    for i, (rec, (key, value, headers, ts)) in enumerate(zip(out, records)):
        assert isinstance(rec, BatchRecord)
        assert rec.offset == base_offset + i
        assert rec.timestamp == ts
        assert rec.key == key and rec.value == value
        assert rec.headers == _expected_headers(headers)


@FAST
@given(records=records_st, codec=codecs, transactional=st.booleans())
def test_batch_builder_round_trips(records, codec, transactional):
    b = BatchBuilder(codec, producer_id=7, producer_epoch=1, base_sequence=10,
                     is_transactional=transactional)
    for i, (key, value, headers, ts) in enumerate(records):
        assert b.append(ts, key, value, headers) == i
    assert len(b) == len(records)
    buf = b.build(base_offset=5, leader_epoch=2)
    h = validate_batch(buf)
    assert h.is_transactional is transactional
    assert h.last_sequence == 10 + len(records) - 1
    if codec == Codec.NONE:
        assert len(buf) <= b.estimated_size
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in iter_records(buf)] == [
        (5 + i, ts, key, value, _expected_headers(headers))
        for i, (key, value, headers, ts) in enumerate(records)]


@FAST
@given(records=records_st, split=st.integers(min_value=0, max_value=50), keyed=st.booleans())
def test_batch_builder_extend_equals_appending_one_by_one(records, split, keyed):
    """extend (the bulk path) interleaved with append encodes exactly what appends alone do."""
    ts = records[0][3]
    flat = [(key if keyed else None, value) for key, value, _, _ in records]
    one_by_one, bulk = BatchBuilder(), BatchBuilder()
    for key, value in flat:
        one_by_one.append(ts, key, value)
    head, tail = flat[:split], flat[split:]
    for key, value in head[:1]:
        bulk.append(ts, key, value)
    rest = head[1:] + tail
    if rest:
        keys = [k for k, _ in rest] if keyed else None
        assert bulk.extend(ts, [v for _, v in rest], keys) == min(1, len(head))
    assert len(bulk) == len(one_by_one)
    assert bulk.estimated_size == one_by_one.estimated_size
    assert bulk.build(base_offset=3) == one_by_one.build(base_offset=3)


def test_batch_builder_extend_after_a_record_with_headers_keeps_them_apart():
    b = BatchBuilder()
    b.append(10, None, b"a", [("h", b"1")])
    b.extend(12, [b"b", None], [b"k", None])
    assert [(r.timestamp, r.key, r.value, r.headers) for r in iter_records(b.build())] == [
        (10, None, b"a", [("h", b"1")]), (12, b"k", b"b", []), (12, None, None, [])]


def test_build_batch_accepts_values_pairs_and_four_tuples():
    buf = build_batch([b"a", None, (b"k", b"v"), (b"k2", None, [("x", None)], 99)], timestamp_ms=50)
    recs = iter_records(validate_batch(buf) and buf)
    assert [(r.key, r.value, r.timestamp, r.headers) for r in recs] == [
        (None, b"a", 50, []), (None, None, 50, []), (b"k", b"v", 50, []), (b"k2", None, 99, [("x", None)])]


def test_empty_builder_refuses_to_build():
    with pytest.raises(ValueError, match="empty"):
        BatchBuilder().build()


def test_last_sequence_wraps_like_kafka():
    b = BatchBuilder(producer_id=1, producer_epoch=0, base_sequence=2**31 - 1)
    b.append(0, None, b"a")
    b.append(0, None, b"b")
    h = validate_batch(b.build())
    assert h.last_sequence == 0
    assert validate_batch(build_batch([b"x"], timestamp_ms=0)).last_sequence == NO_SEQUENCE


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_compressed_batch_is_smaller_for_repetitive_data(codec):
    buf = build_batch([b"x" * 1000] * 20, codec=codec, timestamp_ms=1)
    h = validate_batch(buf)
    if codec != Codec.NONE:
        assert len(buf) < 20 * 1000 // 4
    assert [r.value for r in iter_records(buf, 0, h)] == [b"x" * 1000] * 20


def test_codec_parse():
    assert Codec.parse(None) is Codec.NONE
    assert Codec.parse("gzip") is Codec.GZIP and Codec.parse("ZSTD") is Codec.ZSTD
    assert Codec.parse(3) is Codec.LZ4 and Codec.parse("snappy") is Codec.SNAPPY
    with pytest.raises(UnsupportedCompressionError, match="brotli"):
        Codec.parse("brotli")
    with pytest.raises(UnsupportedCompressionError, match="5"):
        Codec.parse(5)


# -- validate_batch: one test per fault ----------------------------------------------------------


@pytest.mark.parametrize("keep", [0, 1, 12, 20, 21, HEADER_SIZE - 1])
def test_truncated_header_is_refused(keep):
    buf = _sample_batch()[:keep]
    with pytest.raises(CorruptRecordError, match="truncated"):
        validate_batch(buf)
    with pytest.raises(CorruptRecordError, match="truncated"):
        read_header(buf)


@pytest.mark.parametrize("length", [-1, 0, MIN_BATCH_LENGTH - 1, -(2**31)])
def test_batch_length_below_minimum_is_refused(length):
    buf = _set(_sample_batch(), BATCH_LENGTH_AT, ">i", length)
    with pytest.raises(CorruptRecordError, match="below the minimum"):
        validate_batch(buf)


def test_minimal_batch_length_is_not_refused_for_its_length():
    # a batch of exactly MIN_BATCH_LENGTH has no records block: it fails later, not on length
    buf = _set(_sample_batch()[:HEADER_SIZE], BATCH_LENGTH_AT, ">i", MIN_BATCH_LENGTH)
    with pytest.raises(CorruptRecordError, match="CRC"):
        validate_batch(buf)


@pytest.mark.parametrize("cut", [1, 5, 40])
def test_batch_length_beyond_buffer_is_refused(cut):
    buf = _sample_batch()
    with pytest.raises(CorruptRecordError, match="claims"):
        validate_batch(buf[:-cut])
    with pytest.raises(CorruptRecordError, match="claims"):
        validate_batch(buf, 0, len(buf) - cut)
    grown = _set(buf, BATCH_LENGTH_AT, ">i", 2**31 - 1)
    with pytest.raises(CorruptRecordError, match="claims"):
        validate_batch(grown)


@pytest.mark.parametrize("magic", [0, 1, 3, -1, 127])
def test_wrong_magic_is_refused(magic):
    buf = _set(_sample_batch(), MAGIC_AT, ">b", magic)
    with pytest.raises(CorruptRecordError, match=f"magic {magic}"):
        validate_batch(buf)


@pytest.mark.parametrize("count", [0, -1, -(2**31)])
def test_record_count_not_positive_is_refused(count):
    buf = _fix_crc(_set(_sample_batch(), RECORD_COUNT_AT, ">i", count))
    with pytest.raises(CorruptRecordError, match=f"record_count {count}"):
        validate_batch(buf)


@pytest.mark.parametrize("delta", [0, 1, 3, -1, 2**31 - 1])
def test_last_offset_delta_mismatch_is_refused(delta):
    buf = _fix_crc(_set(_sample_batch(3), LAST_OFFSET_DELTA_AT, ">i", delta))
    if delta == 2:
        return
    with pytest.raises(CorruptRecordError, match="last_offset_delta"):
        validate_batch(buf)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_is_refused(codec_id):
    buf = bytearray(_sample_batch())
    attributes = struct.unpack_from(">h", buf, ATTRIBUTES_AT)[0]
    struct.pack_into(">h", buf, ATTRIBUTES_AT, (attributes & ~0x07) | codec_id)
    _fix_crc(buf)
    with pytest.raises(UnsupportedCompressionError, match=f"codec id {codec_id}"):
        validate_batch(buf)
    # the error is still a refusal by scan_batches, not an escape
    res = scan_batches(bytes(buf))
    assert res.batches == [] and res.valid_bytes == 0 and "codec" in res.error


def test_size_above_max_batch_bytes_is_refused():
    buf = _sample_batch(5)
    assert validate_batch(buf, max_batch_bytes=len(buf)).size == len(buf)
    with pytest.raises(RecordTooLargeError, match=f"{len(buf)} bytes"):
        validate_batch(buf, max_batch_bytes=len(buf) - 1)
    with pytest.raises(RecordTooLargeError):
        validate_batches(_sample_batch(1) + buf, max_batch_bytes=len(buf) - 1)


def test_crc_mismatch_message_names_crc_and_base_offset():
    buf = bytearray(_sample_batch(base_offset=77))
    buf[-1] ^= 0x01
    with pytest.raises(CorruptRecordError, match=r"base offset 77.*CRC"):
        validate_batch(buf)


@MEDIUM
@given(data=st.data(), n=st.integers(1, 6), codec=codecs)
def test_any_single_bit_flip_after_byte_21_is_detected(data, n, codec):
    buf = _sample_batch(n, codec)
    i = data.draw(st.integers(min_value=CRC_START, max_value=len(buf) - 1), label="byte")
    bit = data.draw(st.integers(0, 7), label="bit")
    flipped = bytearray(buf)
    flipped[i] ^= 1 << bit
    with pytest.raises((CorruptRecordError, UnsupportedCompressionError)) as info:
        validate_batch(flipped)
    # The CRC is what catches the flip unless an earlier structural check already did; with
    # the CRC recomputed those structural checks are the only thing that can still refuse it.
    try:
        validate_batch(_fix_crc(bytearray(flipped)))
        structurally_ok = True
    except (CorruptRecordError, UnsupportedCompressionError):
        structurally_ok = False
    if structurally_ok:
        assert "CRC" in str(info.value)
    else:
        assert "CRC" not in str(info.value)
        assert i in range(ATTRIBUTES_AT, ATTRIBUTES_AT + 2) or i in range(LAST_OFFSET_DELTA_AT, LAST_OFFSET_DELTA_AT + 4) \
            or i in range(RECORD_COUNT_AT, RECORD_COUNT_AT + 4)


@MEDIUM
@given(base=st.integers(-(2**63), 2**63 - 1), epoch=st.integers(-(2**31), 2**31 - 1),
       n=st.integers(1, 4), codec=codecs)
def test_patching_base_offset_and_epoch_keeps_the_crc_valid(base, epoch, n, codec):
    buf = bytearray(_sample_batch(n, codec))
    crc_before = struct.unpack_from(">I", buf, CRC_AT)[0]
    patch_batch(buf, 0, base, epoch)
    h = validate_batch(buf)
    assert (h.base_offset, h.leader_epoch, h.crc) == (base, epoch, crc_before)
    assert [r.offset for r in iter_records(buf, 0, h)] == [base + i for i in range(n)]


@MEDIUM
@given(data=st.data())
def test_flipping_bits_of_base_offset_or_leader_epoch_is_invisible_to_the_crc(data):
    buf = bytearray(_sample_batch(2))
    i = data.draw(st.sampled_from(list(range(0, 8)) + list(range(12, 16))), label="byte")
    buf[i] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    validate_batch(buf)  # does not raise: that is what lets the leader patch in place


def test_patch_batch_in_the_middle_of_a_buffer():
    a, b = _sample_batch(2), _sample_batch(3)
    buf = bytearray(a + b)
    patch_batch(buf, len(a), 1000, 9)
    got = validate_batches(buf)
    assert [(p, h.base_offset, h.leader_epoch) for p, h in got] == [(0, 0, 3), (len(a), 1000, 9)]


# -- validate_batches ------------------------------------------------------------------------------


@FAST
@given(sizes=st.lists(st.integers(1, 5), min_size=1, max_size=6), codec=codecs)
def test_validate_batches_accepts_concatenations(sizes, codec):
    parts = [_sample_batch(n, codec, base_offset=i * 10) for i, n in enumerate(sizes)]
    buf = b"".join(parts)
    got = validate_batches(buf)
    positions = [sum(len(p) for p in parts[:i]) for i in range(len(parts))]
    assert [p for p, _ in got] == positions
    assert [h.base_offset for _, h in got] == [i * 10 for i in range(len(parts))]
    assert [r.offset for r in iter_all_records(buf)] == [
        i * 10 + j for i, n in enumerate(sizes) for j in range(n)]


def test_validate_batches_rejects_empty_input():
    with pytest.raises(CorruptRecordError, match="empty"):
        validate_batches(b"")


@FAST
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5), data=st.data())
def test_validate_batches_is_all_or_nothing(sizes, data):
    parts = [_sample_batch(n) for n in sizes]
    buf = b"".join(parts)
    fault = data.draw(st.sampled_from(["truncate", "garbage", "flip"]), label="fault")
    if fault == "truncate":
        cut = data.draw(st.integers(1, len(buf) - 1), label="cut")
        assume(cut not in {sum(len(p) for p in parts[:i]) for i in range(len(parts))})
        bad = buf[:cut]
    elif fault == "garbage":
        bad = buf + data.draw(st.binary(min_size=1, max_size=100), label="tail")
    else:
        k = data.draw(st.integers(0, len(parts) - 1), label="batch")
        start = sum(len(p) for p in parts[:k])
        i = data.draw(st.integers(start + CRC_START, start + len(parts[k]) - 1), label="byte")
        bad = bytearray(buf)
        bad[i] ^= 0x10
    with pytest.raises((CorruptRecordError, UnsupportedCompressionError), match="position"):
        validate_batches(bad)


# -- scan_batches ----------------------------------------------------------------------------------


def _check_scan(buf, res, start=0):
    pos = start
    for p, h in res.batches:
        assert p == pos
        assert validate_batch(buf, p) == h
        pos += h.size
    assert res.valid_bytes == pos
    assert (res.error is None) == (pos == len(buf) or start >= len(buf))
    if res.error is not None:
        assert isinstance(res.error, str) and res.error
        with pytest.raises((CorruptRecordError, UnsupportedCompressionError)):
            validate_batch(buf, pos)


@MEDIUM
@given(buf=st.binary(max_size=300))
@example(buf=b"")
@example(buf=b"\x00" * 61)
@example(buf=b"\xff" * 100)
def test_scan_batches_never_raises_on_garbage(buf):
    for verify in (True, False):
        res = scan_batches(buf, verify_crc=verify)
        if verify:
            _check_scan(buf, res)
    list(iter_headers(buf))  # framing walk terminates and does not raise


@MEDIUM
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5), codec=codecs, data=st.data())
def test_scan_batches_returns_the_valid_prefix_of_mutated_buffers(sizes, codec, data):
    parts = [_sample_batch(n, codec, base_offset=10 * i) for i, n in enumerate(sizes)]
    buf = bytearray(b"".join(parts))
    mutations = data.draw(st.lists(st.tuples(st.integers(0, len(buf) - 1), st.integers(1, 255)),
                                   max_size=4), label="xors")
    for i, x in mutations:
        buf[i] ^= x
    cut = data.draw(st.integers(0, len(buf)), label="cut")
    buf = bytes(buf[:cut])
    res = scan_batches(buf)
    _check_scan(buf, res)
    # every batch before the first damaged byte survives
    first_damage = min([i for i, _ in mutations if i < cut] + [cut])
    intact = 0
    for p in parts:
        if intact + len(p) > first_damage:
            break
        intact += len(p)
    assert res.valid_bytes >= intact


def test_scan_batches_from_a_start_position():
    a, b = _sample_batch(1), _sample_batch(2)
    res = scan_batches(a + b + b"junk", len(a))
    assert [p for p, _ in res.batches] == [len(a)]
    assert res.valid_bytes == len(a) + len(b) and "truncated" in res.error


def test_scan_without_crc_check_accepts_a_bad_crc():
    buf = bytearray(_sample_batch(2))
    buf[-1] ^= 1
    assert scan_batches(bytes(buf)).batches == []
    assert len(scan_batches(bytes(buf), verify_crc=False).batches) == 1


# -- iter_records on hostile records blocks --------------------------------------------------------


def _rec(i=0, ts=0, key=None, value=b"v", headers=None):
    return [ts, i, key, value, headers]


MALFORMED_BLOCKS = {
    "garbage msgpack": (b"\xc1\xc1\xc1", 1),
    "truncated msgpack": (msgpack.packb([_rec()])[:-2], 1),
    "extra data": (msgpack.packb([_rec()]) + b"\x01", 1),
    "not an array": (msgpack.packb({"a": 1}), 1),
    "scalar": (msgpack.packb(5), 1),
    "count too small": (msgpack.packb([_rec(0), _rec(1)]), 1),
    "count too large": (msgpack.packb([_rec(0)]), 2),
    "record not an array": (msgpack.packb([b"abc"]), 1),
    "record arity 4": (msgpack.packb([[0, 0, None, b"v"]]), 1),
    "record arity 6": (msgpack.packb([[0, 0, None, b"v", None, 1]]), 1),
    "timestamp delta str": (msgpack.packb([["0", 0, None, b"v", None]]), 1),
    "timestamp delta float": (msgpack.packb([[0.5, 0, None, b"v", None]]), 1),
    "timestamp delta bool": (msgpack.packb([[True, 0, None, b"v", None]]), 1),
    "offset delta wrong": (msgpack.packb([_rec(1)]), 1),
    "offset delta str": (msgpack.packb([["0", "0", None, b"v", None]]), 1),
    "key int": (msgpack.packb([_rec(key=5)]), 1),
    "key str": (msgpack.packb([_rec(key="k")], use_bin_type=True), 1),
    "value list": (msgpack.packb([_rec(value=[1])]), 1),
    "headers map": (msgpack.packb([_rec(headers={"a": b"b"})]), 1),
    "headers str": (msgpack.packb([_rec(headers="h")]), 1),
    "header arity": (msgpack.packb([_rec(headers=[["a"]])]), 1),
    "header key bytes": (msgpack.packb([_rec(headers=[[b"a", b"b"]])], use_bin_type=True), 1),
    "header value int": (msgpack.packb([_rec(headers=[["a", 1]])]), 1),
    "header not array": (msgpack.packb([_rec(headers=[5])]), 1),
    "map with int keys": (msgpack.packb({1: 2}), 1),
    "ext type": (msgpack.packb([msgpack.ExtType(5, b"x")]), 1),
    "deep nesting": (b"\x91" * 100_000 + b"\xc0", 1),
    "huge array header": (b"\xdd\xff\xff\xff\xff", 1),
    "huge bin header": (b"\x91\x95\x00\x00\xc0\xc6\xff\xff\xff\xff", 1),
    "empty block": (b"", 1),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_BLOCKS))
def test_iter_records_refuses_malformed_blocks(name):
    body, count = MALFORMED_BLOCKS[name]
    buf = _hand_batch(body, count)
    validate_batch(buf)  # the CRC and header are fine: only the records block is bad
    with pytest.raises(CorruptRecordError):
        iter_records(buf)


def test_hand_built_valid_block_decodes():
    buf = _hand_batch(msgpack.packb([_rec(0, 0, b"k", b"v", [["h", None]]), _rec(1, 5)],
                                    use_bin_type=True), 2, base_offset=40, first_ts=100)
    assert iter_records(buf) == [BatchRecord(40, 100, b"k", b"v", [("h", None)]),
                                 BatchRecord(41, 105, None, b"v", [])]


msgpack_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=False),
              st.text(max_size=5), st.binary(max_size=5)),
    lambda children: st.one_of(st.lists(children, max_size=6),
                               st.dictionaries(st.text(max_size=3), children, max_size=3)),
    max_leaves=20,
)


@MEDIUM
@given(body=st.one_of(st.binary(max_size=200), msgpack_values.map(lambda v: msgpack.packb(v, use_bin_type=True))),
       count=st.integers(1, 6), codec=codecs, compress_it=st.booleans())
def test_iter_records_raises_only_corrupt_record_error(body, count, codec, compress_it):
    if compress_it:
        body = compress(codec, body)
    buf = _hand_batch(body, count, codec=int(codec))
    validate_batch(buf)
    try:
        out = iter_records(buf)
    except CorruptRecordError as e:
        assert str(e)
    else:
        assert len(out) == count
        for r in out:
            assert isinstance(r, BatchRecord)
            assert r.key is None or type(r.key) is bytes
            assert r.value is None or type(r.value) is bytes
            assert all(type(k) is str and (v is None or type(v) is bytes) for k, v in r.headers)


@MEDIUM
@given(n=st.integers(1, 5), codec=st.sampled_from([Codec.GZIP, Codec.LZ4, Codec.ZSTD]), data=st.data())
def test_damaged_compressed_blocks_with_a_fixed_crc_raise_corrupt_record_error(n, codec, data):
    buf = bytearray(_sample_batch(n, codec, value_size=50))
    op = data.draw(st.sampled_from(["flip", "truncate"]), label="op")
    if op == "flip":
        i = data.draw(st.integers(HEADER_SIZE, len(buf) - 1), label="byte")
        buf[i] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    else:
        cut = data.draw(st.integers(HEADER_SIZE, len(buf) - 1), label="cut")
        buf = buf[:cut]
        struct.pack_into(">i", buf, BATCH_LENGTH_AT, len(buf) - LOG_OVERHEAD)
    _fix_crc(buf)
    validate_batch(buf)
    try:
        out = iter_records(buf)
    except CorruptRecordError:
        return
    # a damaged block that still decodes must still obey the grammar (e.g. a flip inside a value)
    assert len(out) == n


# -- decompression ---------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_decompression_bomb_is_refused(codec):
    bomb = compress(codec, b"\x00" * (4 * 1024 * 1024))
    assert len(bomb) < 64 * 1024
    with pytest.raises(CorruptRecordError, match="inflates beyond"):
        decompress(codec, bomb, max_bytes=10_000)
    assert decompress(codec, bomb, max_bytes=4 * 1024 * 1024) == b"\x00" * (4 * 1024 * 1024)


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_iter_records_honours_max_uncompressed_bytes(codec):
    buf = build_batch([b"\x00" * 100_000] * 10, codec=codec, timestamp_ms=0)
    h = validate_batch(buf)
    with pytest.raises(CorruptRecordError, match="inflates beyond"):
        iter_records(buf, 0, h, max_uncompressed_bytes=50_000)
    assert len(iter_records(buf, 0, h, max_uncompressed_bytes=2_000_000)) == 10


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_garbage_and_truncated_compressed_data_is_corrupt(codec):
    with pytest.raises(CorruptRecordError):
        decompress(codec, b"definitely not compressed data", max_bytes=1000)
    good = compress(codec, msgpack.packb(list(range(1000))))
    with pytest.raises(CorruptRecordError):
        decompress(codec, good[: len(good) // 2], max_bytes=1_000_000)


def test_gzip_members_interoperate_with_the_stdlib():
    data = msgpack.packb([_rec()])
    assert decompress(Codec.GZIP, gzip.compress(data)) == data
    assert gzip.decompress(compress(Codec.GZIP, data)) == data
    assert zlib.decompress(compress(Codec.GZIP, data), 31) == data


def test_decompress_unknown_codec():
    with pytest.raises(UnsupportedCompressionError):
        decompress(5, b"x")
    with pytest.raises(UnsupportedCompressionError):
        compress(7, b"x")


# -- LogAppendTime ---------------------------------------------------------------------------------


@FAST
@given(records=records_st, codec=codecs, now=timestamps, base=st.integers(0, 2**40))
def test_set_log_append_time_keeps_the_batch_valid(records, codec, now, base):
    prefix = _sample_batch(1)
    buf = bytearray(prefix + build_batch(records, codec=codec))
    pos = len(prefix)
    patch_batch(buf, pos, base, 4)
    set_log_append_time(buf, pos, len(buf) - pos, now)
    got = validate_batches(buf)
    h = got[1][1]
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert h.max_timestamp == now and h.base_offset == base
    assert h.first_timestamp == records[0][3]
    assert [(r.offset, r.timestamp, r.key, r.value) for r in iter_records(buf, pos, h)] == [
        (base + i, now, k, v) for i, (k, v, _, _) in enumerate(records)]
    # the neighbour is untouched
    assert bytes(buf[:pos]) == prefix


# -- header helpers ---------------------------------------------------------------------------------


def test_iter_headers_stops_at_a_partial_batch():
    a, b = _sample_batch(1), _sample_batch(2)
    buf = a + b
    for cut in range(len(buf) + 1):
        got = list(iter_headers(buf[:cut]))
        expected = [0] if len(a) <= cut < len(buf) else ([0, len(a)] if cut == len(buf) else [])
        assert [p for p, _ in got] == expected


def test_any_compressed_reads_each_whole_batch_as_its_header_says():
    plain = build_batch([b"v"], timestamp_ms=0)
    packed = build_batch([b"v" * 100], codec=Codec.GZIP, timestamp_ms=0)
    for buf in (b"", plain, packed, plain + packed, packed + plain, plain + plain):
        for cut in range(len(buf) + 1):  # a partial batch counts for nothing, as in iter_headers
            expected = any(h.attributes & CODEC_MASK for _, h in iter_headers(buf[:cut]))
            assert any_compressed(buf[:cut]) is expected


def test_header_layout_is_61_bytes_big_endian():
    buf = build_batch([b"v"], base_offset=0x0102030405060708, leader_epoch=0x0A0B0C0D, timestamp_ms=0)
    assert HEADER_SIZE == HEADER.size == 61
    assert buf[0:8] == bytes.fromhex("0102030405060708")
    assert buf[12:16] == bytes.fromhex("0A0B0C0D")
    assert buf[16] == MAGIC
    assert struct.unpack_from(">i", buf, 8)[0] == len(buf) - LOG_OVERHEAD
    assert struct.unpack_from(">I", buf, 17)[0] == crc32c(buf[21:])
    h = read_header(buf)
    assert h.producer_id == NO_PRODUCER_ID


def test_describe_names_the_fields():
    from tidelog.protocol.records import BatchSummary

    buf = _sample_batch(2, Codec.ZSTD, base_offset=5)
    text = BatchSummary(0, read_header(buf), True).describe()
    assert "baseOffset: 5 lastOffset: 6 count: 2" in text
    assert "compresscodec: ZSTD" in text and "isvalid: true" in text
    bad = read_header(_set(buf, ATTRIBUTES_AT, ">h", 6))
    assert "compresscodec: 6" in BatchSummary(0, bad, False).describe()


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.LZ4, Codec.ZSTD])
def test_torn_multi_block_stream_is_not_silently_shortened(codec):
    # zstd's stream reader returns the complete blocks of a torn frame without complaint
    import random

    rnd = random.Random(7)
    data = bytes(rnd.getrandbits(8) for _ in range(300_000)) + b"a" * 700_000
    packed = compress(codec, data)
    assert decompress(codec, packed, max_bytes=2_000_000) == data
    for cut in (len(packed) // 4, len(packed) * 3 // 4, len(packed) - 1):
        with pytest.raises(CorruptRecordError, match="truncated|decompress"):
            decompress(codec, packed[:cut], max_bytes=2_000_000)


@given(st.binary(max_size=300), st.integers(-(2**31), 2**31 - 1))
@example(bytes(262), -1_528_915_265 - 12)
def test_holds_more_than_one_batch_reads_any_bytes(data, first_length):
    """A Kafka produce's records are checked for a second batch before they are validated:
    any bytes, a negative or huge first length included, get an answer, never an error."""
    buf = bytearray(data)
    if len(buf) >= BATCH_LENGTH_AT + 4:
        struct.pack_into(">i", buf, BATCH_LENGTH_AT, first_length)
    assert holds_more_than_one_batch(bytes(buf)) in (True, False)
    one = _sample_batch(1, Codec.NONE)
    assert not holds_more_than_one_batch(one) and holds_more_than_one_batch(one + one)
