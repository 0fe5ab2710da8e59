"""A batch that cannot be read never leaves a consumer stuck without a way out: the SDK's
error names topic, partition and offsets and how to skip the batch (``seek``), the records
before it are handed out first, and the Spark source skips it with a warning when
failOnDataLoss is false (and fails naming the offsets when it is true)."""

from __future__ import annotations

import pytest

from tests.spark.test_planning import ScriptedConsumer
from tests.unit.client.test_consumer_state import A0, batches, completed, state_at
from tidelog import Record, TopicPartition
from tidelog.aio.fetcher import corrupt_batch_error, handle_partition_response
from tidelog.errors import CorruptRecordError
from tidelog.protocol.errors import CORRUPT_MESSAGE
from tidelog.protocol.messages import FetchPartitionResponse
from tidelog.spark.fetch import DataLossError, read_range
from tidelog.spark.planning import OffsetRange


def damaged(*spans, bad: int) -> bytes:
    """Back-to-back batches ``(base, count)``; the one at index ``bad`` has a flipped bit."""
    out = b""
    for i, span in enumerate(spans):
        b = bytearray(batches(span))
        if i == bad:
            b[-2] ^= 0x10
        out += bytes(b)
    return out


def test_the_records_before_a_damaged_batch_are_handed_out_then_it_is_reported():
    state = state_at(0)
    fetch = completed(A0, damaged((0, 3), (3, 4), (7, 2), bad=1))
    assert [r.offset for r in fetch.take(state, 100, check_crcs=True)] == [0, 1, 2]
    assert state.position == 3
    with pytest.raises(CorruptRecordError):
        fetch.take(state, 100, check_crcs=True)
    assert fetch.failed is not None and fetch.failed.base_offset == 3 and fetch.failed.next_offset == 7
    assert state.position == 3  # nothing of the bad batch or after it was handed out


def test_the_error_names_topic_partition_offsets_and_the_seek_that_skips_the_batch():
    fetch = completed(A0, damaged((0, 3), (3, 4), bad=1))
    state = state_at(4)
    with pytest.raises(CorruptRecordError) as cause:
        fetch.take(state, 100, check_crcs=True)
    e = corrupt_batch_error(TopicPartition("a", 0), state.position, fetch.failed, cause.value)
    text = str(e)
    assert "topic a partition 0" in text and "offset 4" in text and "offsets 3 to 6" in text
    assert "CRC" in text and "consumer.seek(TopicPartition('a', 0), 7)" in text
    assert (e.topic_partition, e.offset, e.skip_offset) == (TopicPartition("a", 0), 4, 7)


def test_a_batch_the_broker_refuses_to_serve_stops_the_partition_instead_of_retrying_forever():
    """CORRUPT_MESSAGE in a fetch answer: the broker found the batch damaged on disk. Kafka's
    consumer raises; so does this one, naming the offset and the seek past it."""
    state = state_at(5)
    outcome = handle_partition_response(A0, state, state.generation, 5, FetchPartitionResponse(
        0, CORRUPT_MESSAGE.code, error_message="batch at position 120 fails its CRC check on disk"),
        now=10.0, backoff_s=0.5)
    assert outcome.action == "error" and state.stopped and isinstance(outcome.error, CorruptRecordError)
    text = str(outcome.error)
    assert "topic a partition 0" in text and "offset 5" in text and "fails its CRC check on disk" in text
    assert "consumer.seek(TopicPartition('a', 0), 6)" in text and outcome.error.skip_offset == 6


def test_an_implausible_header_falls_back_to_the_next_offset():
    e = corrupt_batch_error(TopicPartition("a", 0), 10, None, ValueError("garbage"))
    assert e.skip_offset == 11 and "seek(TopicPartition('a', 0), 11)" in str(e)


class CorruptAt(ScriptedConsumer):
    """A log of offsets [0, 100) with a batch ``[bad_from, bad_to)`` that cannot be read:
    polls return up to 5 records, stopping before the bad batch, and raise at it."""

    def __init__(self, bad_from: int, bad_to: int):
        super().__init__(0, 100)
        self.bad = (bad_from, bad_to)

    def poll(self, timeout_ms=0, max_records=None):
        if self.stopped:
            return []
        lo, hi = self.bad
        if lo <= self.pos < hi:
            self.stopped = True
            e = CorruptRecordError(f"topic t partition 0: the record batch at offset {self.pos} cannot be read")
            e.offset, e.skip_offset = self.pos, hi
            raise e
        end = min(self.pos + 5, self.hw, lo if self.pos < lo else self.hw)
        out = [Record("t", 0, o, 1000 + o, b"k", b"v%d" % o) for o in range(self.pos, end)]
        self.pos = end
        return out


def _offsets(chunks):
    return [r.offset for c in chunks for r in c]


def test_spark_skips_a_corrupt_batch_with_a_warning_when_fail_on_data_loss_is_false():
    warnings = []
    got = _offsets(read_range(CorruptAt(14, 21), OffsetRange("t", 0, 10, 30), fail_on_data_loss=False,
                              warn=warnings.append))
    assert got == list(range(10, 14)) + list(range(21, 30))
    assert len(warnings) == 1 and "offsets [14, 21)" in warnings[0] and "skipping" in warnings[0]
    assert "cannot be read" in warnings[0]


def test_spark_fails_naming_the_offsets_when_fail_on_data_loss_is_true():
    with pytest.raises(DataLossError) as e:
        list(read_range(CorruptAt(14, 21), OffsetRange("t", 0, 10, 30)))
    assert "topic 't' partition 0: offsets [14, 21)" in str(e.value) and "failOnDataLoss=false" in str(e.value)


def test_spark_stops_at_the_range_end_when_the_corrupt_batch_reaches_past_it():
    warnings = []
    got = _offsets(read_range(CorruptAt(25, 40), OffsetRange("t", 0, 20, 30), fail_on_data_loss=False,
                              warn=warnings.append))
    assert got == list(range(20, 25)) and "offsets [25, 30)" in warnings[0]
