"""The public per-batch completion hook (``RecordFuture.batch``, ``RecordFutures.batches()``)
that ``tidelog perf`` measures with: records of one batch share one ProduceResult, whose
``add_callback`` runs once when the batch completes."""

from __future__ import annotations

import itertools

from tidelog.aio.accumulator import BATCH_OVERHEAD, BulkRecords, RecordAccumulator, record_size
from tidelog.errors import RequestTimedOut
from tidelog.protocol.topics import TopicPartition

T0 = TopicPartition("t", 0)
VALUE = b"v" * 10
SIZE = record_size(None, VALUE, None)


class Leaders:
    def leader_for(self, tp: TopicPartition) -> int | None:
        return 1


def accumulator(records_per_batch: int = 2) -> RecordAccumulator:
    return RecordAccumulator(batch_size=BATCH_OVERHEAD + records_per_batch * SIZE, clock=lambda: 100.0,
                             linger_s=0, delivery_timeout_s=30.0, retry_backoff_s=0.1)


def drain(acc: RecordAccumulator) -> list:
    out = []
    while acc.queued_batches():
        for batches in acc.drain(Leaders(), {1}, 1 << 20, 100.0).values():
            out += batches
    return out


def test_records_of_one_batch_share_its_completion_and_the_hook_runs_once_per_batch():
    acc = accumulator()
    futures = [acc.append(T0, 1000 + i, None, VALUE, None, SIZE) for i in range(3)]
    assert futures[0].batch is futures[1].batch and futures[2].batch is not futures[0].batch
    calls = []
    for handle in {id(f.batch): f.batch for f in futures}.values():
        handle.add_callback(lambda h=handle: calls.append(h.error))
    first, second = drain(acc)
    acc.complete(first, base_offset=0)
    assert calls == [None] and futures[0].batch.done() and not futures[2].batch.done()
    acc.complete(second, error=RequestTimedOut("boom"))
    assert calls[0] is None and isinstance(calls[1], RequestTimedOut)
    futures[0].batch.add_callback(lambda: calls.append("late"))  # already done: runs at once
    assert calls[-1] == "late"


def test_send_many_futures_list_their_runs_of_records_per_batch():
    acc = accumulator()
    values = [VALUE] * 5
    b = BulkRecords("t", values, None, list(itertools.accumulate([SIZE] * 5, initial=0)), 1000)
    b.runs = [(5, 0)]
    acc.append_many(b, 1, [0])
    runs = b.futures.batches()
    assert [first for first, _ in runs] == [0, 2, 4]
    assert [handle is b.futures[first].batch for first, handle in runs] == [True] * 3
    for batch in drain(acc):
        acc.complete(batch, base_offset=0)
    assert all(handle.done() for _, handle in runs)
