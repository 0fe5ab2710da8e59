"""The __consumer_offsets record codec and the fold that loads a partition, and Kafka's group
placement hash."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidelog.broker.groups.group_coordinator import java_string_hashcode, partition_for
from tidelog.broker.groups.offsets_records import (
    GroupKey,
    GroupMetadataValue,
    MemberValue,
    OffsetKey,
    OffsetsRecordError,
    OffsetValue,
    decode_group_value,
    decode_key,
    decode_offset_value,
    group_key,
    group_value,
    load,
    offset_key,
    offset_value,
)
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("orders", 3)


@given(st.text(max_size=30), st.text(min_size=1, max_size=30), st.integers(0, 2**31 - 1))
def test_keys_round_trip(group, topic, partition):
    assert decode_key(offset_key(group, TopicPartition(topic, partition))) == OffsetKey(group, topic, partition)
    assert decode_key(group_key(group)) == GroupKey(group)


def test_values_round_trip():
    v = OffsetValue(42, 7, "meta", 1000, -1)
    assert decode_offset_value(offset_value(v), record_offset=9) == OffsetValue(42, 7, "meta", 1000, -1, 9)
    g = GroupMetadataValue("consumer", 3, "range", "m1", 55, (
        MemberValue("m1", "i1", "client", "/127.0.0.1", 300000, 10000, b"sub", b"assign"),))
    assert decode_group_value(group_value(g)) == g


def test_newer_values_with_more_fields_are_read():
    raw = msgpack.packb({"version": 9, "offset": 5, "future": [1, 2]})
    assert decode_offset_value(raw).offset == 5


@pytest.mark.parametrize("raw,problem", [
    (b"\xc1", "not valid msgpack"),
    (msgpack.packb([7, "g"]), "unknown or malformed key"),
    (msgpack.packb({"k": 1}), "array starting with its version"),
    (msgpack.packb([1, "g", "t", "zero"]), "unknown or malformed key"),
])
def test_bad_keys_name_the_problem(raw, problem):
    with pytest.raises(OffsetsRecordError, match=problem):
        decode_key(raw)


def test_bad_values_name_the_problem():
    with pytest.raises(OffsetsRecordError, match="missing field 'offset'"):
        decode_offset_value(msgpack.packb({"version": 0}))
    with pytest.raises(OffsetsRecordError, match="'generation'"):
        decode_group_value(msgpack.packb({"version": 0, "generation": "x"}))


def test_loading_folds_records_in_order_with_tombstones_and_skips_bad_ones():
    gv = GroupMetadataValue("consumer", 1, "range", "m1", 0, ())
    records = [
        (0, offset_key("a", TP), offset_value(OffsetValue(10))),
        (1, offset_key("a", TP), offset_value(OffsetValue(20))),
        (2, offset_key("a", TopicPartition("orders", 4)), offset_value(OffsetValue(5))),
        (3, group_key("a"), group_value(gv)),
        (4, offset_key("b", TP), offset_value(OffsetValue(1))),
        (5, offset_key("b", TP), None),  # b's only offset deleted
        (6, b"garbage", b"x"),
        (7, None, b"x"),
        (8, group_key("c"), group_value(gv)),
        (9, group_key("c"), None),  # c deleted
    ]
    loaded = load(records)
    assert loaded.group_ids() == {"a"}
    assert loaded.offsets["a"][TP] == OffsetValue(20, record_offset=1)
    assert loaded.groups["a"] == gv
    assert [offset for offset, _ in loaded.skipped] == [6, 7]


def test_java_string_hashcode_matches_java():
    assert java_string_hashcode("") == 0
    assert java_string_hashcode("hello") == 99162322
    assert java_string_hashcode("abc") == 96354
    assert java_string_hashcode("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert java_string_hashcode("\U0001f600") == 1772899  # a surrogate pair: two UTF-16 units


def test_partition_for_is_kafkas():
    assert partition_for("polygenelubricants", 50) == 0  # Utils.abs(MIN_VALUE) is 0
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("my-group", 50) == abs(java_string_hashcode("my-group")) % 50
    assert all(0 <= partition_for(f"g{i}", 7) < 7 for i in range(100))
