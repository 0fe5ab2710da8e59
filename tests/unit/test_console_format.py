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


# -- a batch the console consumer cannot read ----------------------------------------------------


def test_an_unreadable_batch_names_the_command_that_skips_it():
    """The SDK's error advises ``consumer.seek``; the console consumer's names a command."""
    from tidelog.aio.fetcher import corrupt_batch_error
    from tidelog.commands.console import unreadable_batch_message
    from tidelog.records import TopicPartition

    e = corrupt_batch_error(TopicPartition("orders", 2), 40, None, "CRC mismatch")
    alone = unreadable_batch_message(e, Namespace(group=None))
    assert alone.startswith("topic orders partition 2: the record batch at offset 40 cannot be read: CRC mismatch.")
    assert alone.endswith(": tidelog consume orders --partition 2 --offset 41")
    assert "consumer.seek" not in alone
    grouped = unreadable_batch_message(e, Namespace(group="billing"))
    assert grouped.endswith(": tidelog groups reset-offsets --group billing --topic orders:2 --to-offset 41 --execute")
