"""Kafka's record encoding, the stored form of Kafka-produced batches, and the translation of
Tidelog batches for Kafka clients, checked against kafka-python's record code."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():  # kafka-python reads its own package data with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from tests.unit.protocol.test_record_validation import forge, rec
from tidelog.protocol.errors import CorruptRecordError
from tidelog.protocol.kafka.records import KAFKA_MAGIC, WIRE_MAGIC, decode_records, encode_records, to_kafka, to_stored
from tidelog.protocol.records import (
    HEADER_SIZE,
    Codec,
    RecordRules,
    build_batch,
    iter_all_records,
    iter_headers,
    kafka_batch,
    read_header,
    validate_batch,
    validate_records,
)

RECORDS = [(0, 0, b"k", b"v", None), (5, 1, None, b"", (("h", b"x"), ("n", None))), (-1, 2, b"", None, None),
           (300, 3, b"k" * 200, b"v" * 70000, None)]


def kafka_python_batch(codec: str | None = None, records=None) -> bytes:
    types = {None: 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
    b = DefaultRecordBatchBuilder(magic=2, compression_type=types[codec], is_transactional=False, producer_id=-1,
                                  producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i, (key, value, headers) in enumerate(records or [(b"k0", b"v0", [("h", b"1")]), (None, b"v1", []),
                                                          (b"k2", None, [])]):
        b.append(i, timestamp=1_700_000_000_000 + i, key=key, value=value, headers=headers)
    return bytes(b.build())


def test_records_round_trip():
    assert decode_records(encode_records(RECORDS), len(RECORDS), 0) == tuple(RECORDS)


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_a_kafka_clients_batch_is_stored_as_sent_and_read_by_the_sdk(codec):
    wire = kafka_python_batch(codec)
    stored = to_stored(wire)
    assert stored[16] == KAFKA_MAGIC and stored[:16] == wire[:16] and stored[17:] == wire[17:]
    h = validate_batch(stored)
    validate_records(stored, 0, h, RecordRules(), 1_700_000_000_000)
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in iter_all_records(stored)]
    assert got == [(0, 1_700_000_000_000, b"k0", b"v0", [("h", b"1")]), (1, 1_700_000_000_001, None, b"v1", []),
                   (2, 1_700_000_000_002, b"k2", None, [])]
    assert to_kafka(stored, kafka_batch) == wire  # given back byte for byte


@pytest.mark.parametrize("codec", list(Codec))
def test_a_tidelog_batch_reaches_kafka_clients_with_the_same_records(codec):
    native = build_batch([(b"k", b"v", [("h", b"x")], 1_700_000_000_000), (None, b"w", [], 1_700_000_000_005)],
                         codec=codec, base_offset=40, producer_id=9, producer_epoch=1, base_sequence=3)
    wire = to_kafka(native, kafka_batch)
    assert wire[16] == WIRE_MAGIC
    theirs = DefaultRecordBatch(wire)
    assert theirs.validate_crc() and theirs.producer_id == 9 and theirs.base_sequence == 3
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in theirs] == [
        (40, 1_700_000_000_000, b"k", b"v", [("h", b"x")]), (41, 1_700_000_000_005, None, b"w", [])]
    # and the translation is what the log would store for the same records sent by a Kafka client
    assert [(r.key, r.value, r.headers) for r in iter_all_records(to_stored(wire))] == [
        (r.key, r.value, r.headers) for r in iter_all_records(native)]


def test_a_fetch_mixing_both_encodings_and_ending_in_a_partial_batch():
    native = build_batch([b"a", b"b"], base_offset=0, timestamp_ms=1)
    kafka = to_stored(kafka_python_batch())
    kafka = bytearray(kafka)
    kafka[0:8] = (2).to_bytes(8, "big")
    out = to_kafka(native + bytes(kafka) + native[:30], kafka_batch)
    heads = [(h.base_offset, h.magic) for _, h in iter_headers(out)]
    assert heads == [(0, WIRE_MAGIC), (2, WIRE_MAGIC)] and out.endswith(native[:30])


@pytest.mark.parametrize("mutate,problem", [
    (lambda b: b[:-3], "remain"),
    (lambda b: b[:16] + b"\x01" + b[17:], "magic 1"),
])
def test_produced_sets_that_are_not_whole_v2_batches_are_refused(mutate, problem):
    with pytest.raises(CorruptRecordError, match=problem):
        to_stored(mutate(kafka_python_batch()))


@pytest.mark.parametrize("raw,problem", [
    (b"\x10\x00\x00\x00\x01", "can hold at most 0"),  # length 8, truncated: fewer bytes than a record
    (encode_records(RECORDS[:1])[:-1], "malformed"),
    (encode_records(RECORDS[:1]) + b"\x00", "bytes after"),
    (b"\x0e\x00\x00\x00\x03\xff\x01\x00", "malformed"),  # a key longer than its record
])
def test_malformed_kafka_records_name_the_record(raw, problem):
    with pytest.raises(CorruptRecordError, match=problem):
        decode_records(raw, 1, 0)


def test_a_header_key_that_is_not_utf8_is_read_as_java_reads_it():
    """Kafka's broker never refuses a record for its header key's bytes (a Java consumer
    decodes them with replacement characters): nor does Tidelog's check."""
    raw = encode_records([(0, 0, b"k", b"v", (("h\u00e9", b"x"),))])
    raw = raw.replace("h\u00e9".encode(), b"h\xff\xfe")
    [(_, _, key, value, headers)] = decode_records(raw, 1, 0)
    assert (key, value, headers) == (b"k", b"v", (("h\ufffd\ufffd", b"x"),))


def test_a_stored_kafka_batch_keeps_its_header_fields():
    stored = to_stored(kafka_python_batch("gzip", [(b"k", b"v" * 1000, [])] * 3))
    h = read_header(stored)
    assert h.magic == KAFKA_MAGIC and h.codec == Codec.GZIP and h.record_count == 3


def test_a_fetch_translates_at_most_its_budget_and_always_one_batch():
    from tidelog.protocol.kafka.records import TranslationBudget

    batches = [build_batch([b"r%d" % i for i in range(10)], base_offset=10 * b, timestamp_ms=1) for b in range(3)]
    stored = b"".join(batches)
    budget = TranslationBudget(15, 1 << 30)
    first = to_kafka(stored, kafka_batch, budget)  # 10 records, then 10 more would pass 15
    assert [h.base_offset for _, h in iter_headers(first)] == [0]
    assert [h.base_offset for _, h in iter_headers(to_kafka(stored, kafka_batch, TranslationBudget(1, 1 << 30)))] == [0]
    # a Kafka-encoded batch costs nothing and still comes after the budget is spent on others
    kafka = to_stored(kafka_python_batch())
    out = to_kafka(batches[0] + kafka, kafka_batch, TranslationBudget(10, 1 << 30))
    assert [h.magic for _, h in iter_headers(out)] == [WIRE_MAGIC, WIRE_MAGIC]


def test_a_produced_bomb_of_tiny_records_is_refused_holding_one_part_at_a_time():
    """845 bytes of zstd inflating to 1.2 million 7-byte records, every offset delta 0: the
    first part of 8,192 records fails; the whole block is never decoded at once."""
    import struct
    import tracemalloc

    import zstandard
    from crc32c import crc32c

    n = 1_200_000
    block = zstandard.ZstdCompressor().compress(b"\x0c\x00\x00\x00\x01\x01\x00" * n)
    tail = struct.pack(">hiqqqhii", 4, n - 1, 1, 1, -1, -1, -1, n)
    batch = struct.pack(">qiibI", 0, len(tail) + len(block) + 9, 0, KAFKA_MAGIC, crc32c(block, crc32c(tail))) + tail + block
    h = validate_batch(batch)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="record 1 .*offset_delta 0, expected 1"):
            validate_records(batch, 0, h, RecordRules(max_uncompressed_bytes=16 << 20), 1, chunk=8192)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 30 * 1024 * 1024  # the inflated block (8.4 MB) and one part, not 1.2 million tuples


@pytest.mark.parametrize("records", [[rec(0), rec(1)], []])
def test_a_batch_of_one_whose_block_holds_another_count_is_refused_not_translated(records):
    # stored unchecked (a follower's copy of a leader that skipped its checks, say): the header
    # declares one record
    with pytest.raises(CorruptRecordError):
        kafka_batch(forge(records, n=1))


def test_bytes_that_are_not_a_batch_end_what_a_fetch_passes_on():
    good = to_stored(kafka_python_batch())
    lying = bytearray(good)
    lying[8:12] = (-5).to_bytes(4, "big", signed=True)  # a negative batch length
    assert to_kafka(good + bytes(lying), kafka_batch) == to_kafka(good, kafka_batch)
    partial = to_kafka(good + good[:70], kafka_batch)  # a fetch cut inside the second batch
    assert partial[len(good) + 16] == WIRE_MAGIC and len(partial) == len(good) + 70


def test_a_fetch_translates_at_most_its_budget_of_bytes_and_always_one_batch():
    from tidelog.protocol.kafka.records import TranslationBudget

    batches = [build_batch([b"r" * 1000] * 3, base_offset=3 * b, timestamp_ms=1) for b in range(3)]
    stored = b"".join(batches)
    # few records, but each batch is 3 KB to translate: a 5 KB budget takes one of them
    out = to_kafka(stored, kafka_batch, TranslationBudget(1000, 5000))
    assert [h.base_offset for _, h in iter_headers(out)] == [0]
    assert [h.base_offset for _, h in iter_headers(to_kafka(stored, kafka_batch, TranslationBudget(1000, 1)))] == [0]
    # a compressed batch counts its stored bytes many times over: recompressing it dominates
    gzipped = [build_batch([b"r" * 1000] * 3, base_offset=3 * b, timestamp_ms=1, codec=Codec.GZIP) for b in range(2)]
    assert sum(map(len, gzipped)) < 5000
    out = to_kafka(b"".join(gzipped), kafka_batch, TranslationBudget(1000, 5000))
    assert [h.base_offset for _, h in iter_headers(out)] == [0]


def test_a_batch_that_fails_translation_ends_the_partition_after_what_came_before():
    good = build_batch([b"a", b"b"], timestamp_ms=1)
    bad = bytearray(build_batch([b"c"], base_offset=2, timestamp_ms=1))
    bad[HEADER_SIZE:] = b"\xc1" * (len(bad) - HEADER_SIZE)  # not msgpack (the CRC is not checked here)
    out = to_kafka(good + bytes(bad), kafka_batch)
    assert [h.base_offset for _, h in iter_headers(out)] == [0]
    with pytest.raises(CorruptRecordError):
        to_kafka(bytes(bad) + good, kafka_batch)
