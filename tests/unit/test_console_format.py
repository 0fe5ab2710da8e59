"""``tidelog consume``'s record lines: kafka-console-consumer's fields, order and markers."""

from __future__ import annotations

from argparse import Namespace

from tidelog.commands.console import record_line
from tidelog.records import Record

NONE_ASKED = dict(print_timestamp=False, print_partition=False, print_offset=False, print_headers=False,
                  print_key=False)


def line(record, **asked) -> bytes:
    return record_line(record, Namespace(**{**NONE_ASKED, **asked}))


def record(**fields) -> Record:
    base = dict(topic="t", partition=2, offset=7, timestamp=1700000000123, key=b"k", value=b"v",
                headers=[("trace", b"abc"), ("empty", None)], timestamp_type=0)
    return Record(**{**base, **fields})


def test_only_the_value_by_default_and_null_for_none():
    assert line(record()) == b"v\n"
    assert line(record(value=None)) == b"null\n"


def test_every_field_in_kafkas_order():
    everything = dict(print_timestamp=True, print_partition=True, print_offset=True, print_headers=True,
                      print_key=True)
    assert line(record(), **everything) == \
        b"CreateTime:1700000000123\tPartition:2\tOffset:7\ttrace:abc,empty:null\tk\tv\n"
    assert line(record(timestamp_type=1, headers=[], key=None), **everything) == \
        b"LogAppendTime:1700000000123\tPartition:2\tOffset:7\tNO_HEADERS\tnull\tv\n"
    assert line(record(timestamp=-1), print_timestamp=True) == b"NO_TIMESTAMP\tv\n"
