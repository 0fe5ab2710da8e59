"""Kafka-compatible key hashing and the sticky partitioner for keyless records."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.aio.accumulator import RecordAccumulator
from tidelog.aio.partitioner import StickyPartitioner, default_partition, murmur2, to_positive

# org.apache.kafka.common.utils.UtilsTest#testMurmur2 (and the empty array), as Java ints.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"": 275646681,
}


@pytest.mark.parametrize("data,expected", KAFKA_VECTORS.items(), ids=lambda v: repr(v)[:20])
def test_murmur2_matches_kafkas_utils_test_vectors(data, expected):
    assert murmur2(data) == expected


@pytest.mark.parametrize("data,expected", [
    (b"string-f-24-chars-length", 124730809),     # one vector per tail length (0..3)
    (b"string-fo-25-chars-length", 1269511650),
    (b"string-foo-26-chars-length", 119165628),
    (b"string-last-27-chars-length", 1089971754),
])
def test_murmur2_covers_every_tail_length(data, expected):
    assert murmur2(data) == expected


def _reference_murmur2(data: bytes) -> int:
    """Kafka's Java code transcribed literally, with Java int overflow emulated per step."""
    def i32(x):
        x &= 0xFFFFFFFF
        return x - (1 << 32) if x & 0x80000000 else x

    def ushr(x, n):
        return (x & 0xFFFFFFFF) >> n

    length, m, r = len(data), 0x5BD1E995, 24
    h = i32(0x9747B28C ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = i32(data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24))
        k = i32(k * m)
        k ^= ushr(k, r)
        k = i32(k * m)
        h = i32(h * m)
        h = i32(h ^ k)
    rest = length % 4
    if rest >= 3:
        h = i32(h ^ (data[(length & ~3) + 2] << 16))
    if rest >= 2:
        h = i32(h ^ (data[(length & ~3) + 1] << 8))
    if rest >= 1:
        h = i32(h ^ data[length & ~3])
        h = i32(h * m)
    h = i32(h ^ ushr(h, 13))
    h = i32(h * m)
    h = i32(h ^ ushr(h, 15))
    return h


@given(st.binary(max_size=64))
def test_murmur2_agrees_with_a_literal_transcription(data):
    assert murmur2(data) == _reference_murmur2(data)


def test_to_positive_clears_the_sign_bit_like_kafka():
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(1 << 31)) == 0  # abs() would overflow in Java
    assert to_positive(5) == 5


def test_default_partition_is_kafkas_formula():
    for key, h in KAFKA_VECTORS.items():
        assert default_partition(key, 7) == (h & 0x7FFFFFFF) % 7
    assert default_partition(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50


def test_sticky_partitioner_sticks_until_told_of_a_new_batch():
    picks = iter([2, 2, 0, 1])
    p = StickyPartitioner(rng=lambda n: next(picks))
    assert p.partition("t", 4) == 2
    assert p.partition("t", 4) == 2
    assert p.on_new_batch("t", 4, [], previous=2) == 0  # skips the previous partition (2, then 0)
    assert p.partition("t", 4) == 0
    assert p.on_new_batch("t", 4, [], previous=2) == 0  # someone else already moved on


@pytest.mark.parametrize("available", [[], [0]])
def test_a_topic_of_one_partition_stays_on_it(available):
    def no_draw(n):
        raise AssertionError("nothing to choose from")

    p = StickyPartitioner(rng=no_draw)
    assert p.partition("t", 1, available) == 0
    assert p.on_new_batch("t", 1, available, previous=0) == 0
    assert p.partition("t", 1, available) == 0


def test_sticky_partitioner_prefers_available_partitions():
    p = StickyPartitioner(rng=lambda n: 0)
    assert p.partition("t", 4, available=[3]) == 3
    assert p.on_new_batch("t", 4, [3], previous=3) == 3  # the only one


def test_keyless_records_fill_one_batch_then_switch_partition():
    choices = iter([1, 3, 2, 0])
    acc = RecordAccumulator(batch_size=66 + 3 * 42, linger_s=10, clock=lambda: 0.0,
                            partitioner=StickyPartitioner(rng=lambda n: next(choices)))
    futures = [acc.append_keyless("t", 4, [0, 1, 2, 3], 0, b"0123456789", None, 42) for _ in range(7)]
    parts = [f.topic_partition.partition for f in futures]
    assert parts == [1, 1, 1, 3, 3, 3, 2]  # three 42-byte records fill a batch, then move on
