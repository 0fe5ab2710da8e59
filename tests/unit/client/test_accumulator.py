"""The record accumulator with a fake clock: readiness, linger, drain, retries, expiry,
buffer-memory back-pressure, and the thread-safe append path."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest
import trio

from tidelog.aio.accumulator import (
    BATCH_OVERHEAD,
    BulkRecords,
    ProduceResult,
    RecordAccumulator,
    RecordFutures,
    record_size,
)
from tidelog.aio.partitioner import StickyPartitioner
from tidelog.errors import ClientClosedError, RequestTimedOut
from tidelog.protocol.records import iter_all_records
from tidelog.protocol.topics import TopicPartition

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)
U0 = TopicPartition("u", 0)
VALUE = b"v" * 10
SIZE = record_size(None, VALUE, None)  # 42


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Leaders:
    def __init__(self, leaders: dict[TopicPartition, int]):
        self.leaders = leaders

    def leader_for(self, tp: TopicPartition) -> int | None:
        return self.leaders.get(tp)


LEADERS = Leaders({T0: 1, T1: 2, U0: 1})


def make(clock: Clock | None = None, *, records_per_batch: int = 3, **kw) -> RecordAccumulator:
    kw.setdefault("linger_s", 0.005)
    kw.setdefault("delivery_timeout_s", 30.0)
    kw.setdefault("retry_backoff_s", 0.1)
    return RecordAccumulator(batch_size=BATCH_OVERHEAD + records_per_batch * SIZE, clock=clock or Clock(), **kw)


def add(acc, tp=T0, n=1, value=VALUE):
    return [acc.append(tp, 1000 + i, None, value, None, record_size(None, value, None)) for i in range(n)]


def test_a_batch_is_not_ready_before_linger_then_ready_after():
    clock = Clock()
    acc = make(clock)
    add(acc)
    check = acc.ready(LEADERS, clock.now)
    assert check.nodes == set() and check.next_delay == pytest.approx(0.005)
    clock.now += 0.005
    assert acc.ready(LEADERS, clock.now).nodes == {1}


def _agrees_with_ready(acc, clock, leaders=LEADERS):
    """``sole_ready`` names the one node ``ready`` finds, or leaves it to ``ready``."""
    sole = acc.sole_ready(leaders, clock.now)
    check = acc.ready(leaders, clock.now)
    assert sole is None or (check.nodes == {sole} and not check.unknown_leaders)
    return sole


def test_sole_ready_is_readys_answer_when_one_partition_holds_batches():
    clock = Clock()
    acc = make(clock, linger_s=0.0)
    assert _agrees_with_ready(acc, clock) is None  # nothing queued
    add(acc)
    assert _agrees_with_ready(acc, clock) == 1
    add(acc, T1)  # a second partition: ready's walk decides
    assert _agrees_with_ready(acc, clock) is None
    acc.drain(LEADERS, {1, 2}, 1 << 20, clock.now)
    add(acc, U0)
    assert _agrees_with_ready(acc, clock, Leaders({})) is None  # no leader known
    assert _agrees_with_ready(acc, clock) == 1


def test_sole_ready_waits_for_linger_retries_and_the_partition_in_flight():
    clock = Clock()
    acc = make(clock)
    add(acc)
    assert _agrees_with_ready(acc, clock) is None  # lingering
    clock.now += 0.005
    assert _agrees_with_ready(acc, clock) == 1
    [b] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    b.attempts = 1
    acc.reenqueue(b, clock.now)
    assert _agrees_with_ready(acc, clock) is None  # its backoff first
    clock.now += 0.1
    assert _agrees_with_ready(acc, clock) == 1
    acc.guarantee_order = True
    acc.drain(LEADERS, {1}, 1 << 20, clock.now)
    add(acc)
    clock.now += 0.005
    assert _agrees_with_ready(acc, clock) is None  # one batch of the partition in flight


def test_sole_ready_clears_the_pending_wake_up():
    woken = []
    acc = make(linger_s=0.0, wakeup=lambda: woken.append(1))
    add(acc)
    assert woken == [1]
    add(acc, T1)  # a wake-up is pending: no second one
    assert woken == [1]
    acc.sole_ready(LEADERS, 200.0)
    acc.drain(LEADERS, {1, 2}, 1 << 20, 200.0)
    add(acc)
    assert woken == [1, 1]


def test_a_full_batch_is_ready_at_once_and_a_new_one_opens():
    clock = Clock()
    acc = make(clock)
    futures = add(acc, n=4)
    assert acc.queued_batches() == 2
    assert acc.ready(LEADERS, clock.now).nodes == {1}
    drained = acc.drain(LEADERS, {1}, 1 << 20, clock.now)
    assert [len(b) for b in drained[1]] == [3]  # one batch per partition per request
    assert futures[0].topic_partition == T0


def test_drain_takes_one_batch_per_partition_grouped_by_leader():
    clock = Clock()
    acc = make(clock, linger_s=0)
    add(acc, T0, 4)
    add(acc, T1, 1)
    add(acc, U0, 1)
    check = acc.ready(LEADERS, clock.now)
    assert check.nodes == {1, 2}
    drained = acc.drain(LEADERS, check.nodes, 1 << 20, clock.now)
    assert sorted((b.tp, len(b)) for b in drained[1]) == [(T0, 3), (U0, 1)]
    assert [(b.tp, len(b)) for b in drained[2]] == [(T1, 1)]
    assert acc.queued_batches() == 1  # T0's second batch waits for the next request


def test_drain_takes_a_partitions_full_batches_together_but_not_its_open_one():
    clock = Clock()
    acc = make(clock, linger_s=60)
    futures = add(acc, T0, 8)  # batches of 3, 3 and 2 (still open)
    [run] = [acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]]
    assert [len(b) for b in run] == [3, 3] and acc.queued_batches() == 1
    assert [len(b) for b in acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]] == [2]  # drained alone
    for batch, base in zip(run, (0, 3)):
        acc.complete(batch, base_offset=base)
    assert [f.result(0).offset for f in futures[:6]] == list(range(6))
    add(acc, T0, 7)
    assert [len(b) for b in acc.drain(LEADERS, {1}, 2 * (BATCH_OVERHEAD + 3 * SIZE), clock.now)[1]] == [3, 3]


def test_drain_respects_max_request_size_but_always_sends_one_batch():
    clock = Clock()
    acc = make(clock, linger_s=0)
    add(acc, T0)
    add(acc, U0)
    drained = acc.drain(LEADERS, {1}, 10, clock.now)
    assert len(drained[1]) == 1 and acc.queued_batches() == 1


def test_busy_nodes_and_unknown_leaders():
    clock = Clock()
    acc = make(clock, linger_s=0)
    add(acc, T0)
    add(acc, TopicPartition("nobody", 0))
    check = acc.ready(LEADERS, clock.now, busy_nodes=[1])
    assert check.nodes == set() and check.unknown_leaders


def test_flush_and_close_make_lingering_batches_ready():
    clock = Clock()
    acc = make(clock, linger_s=60)
    add(acc)
    assert acc.ready(LEADERS, clock.now).nodes == set()
    waiting = acc.begin_flush()
    assert len(waiting) == 1 and acc.ready(LEADERS, clock.now).nodes == {1}
    acc.end_flush()
    assert acc.ready(LEADERS, clock.now).nodes == set()
    acc.close()
    assert acc.ready(LEADERS, clock.now).nodes == {1}
    with pytest.raises(ClientClosedError):
        add(acc)


def test_completion_resolves_each_record_with_base_offset_plus_index():
    clock = Clock()
    acc = make(clock, linger_s=0)
    futures = add(acc, n=3)
    [batch] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    records = list(iter_all_records(batch.encode()))
    assert [r.timestamp for r in records] == [1000, 1001, 1002]
    acc.complete(batch, base_offset=40)
    assert [f.result(0).offset for f in futures] == [40, 41, 42]
    assert [f.result(0).timestamp for f in futures] == [1000, 1001, 1002]
    assert acc.used_memory == 0 and not acc.has_incomplete()


def test_log_append_time_replaces_the_record_timestamp():
    acc = make(linger_s=0)
    [future] = add(acc)
    [batch] = acc.drain(LEADERS, {1}, 1 << 20, 100.0)[1]
    acc.complete(batch, base_offset=0, log_append_time=777)
    assert future.result(0).timestamp == 777


def test_a_failed_batch_fails_every_record():
    acc = make(linger_s=0)
    futures = add(acc, n=2)
    [batch] = acc.drain(LEADERS, {1}, 1 << 20, 100.0)[1]
    acc.complete(batch, error=RequestTimedOut("boom"))
    for f in futures:
        assert isinstance(f.exception(0), RequestTimedOut)
        with pytest.raises(RequestTimedOut):
            f.result(0)


def test_a_retried_batch_goes_back_in_front_waits_its_backoff_and_flies_alone():
    clock = Clock()
    acc = make(clock, linger_s=0, records_per_batch=1)
    a, b, c = (add(acc)[0] for _ in range(3))
    # a 1-byte request limit: one batch per request (else the full batches would share one)
    [first] = acc.drain(LEADERS, {1}, 1, clock.now)[1]
    [second] = acc.drain(LEADERS, {1}, 1, clock.now)[1]  # pipelined: two in flight
    first.attempts = second.attempts = 1
    acc.reenqueue(second, clock.now)  # the later batch fails first...
    acc.reenqueue(first, clock.now)   # ...the earlier one still goes first
    assert acc.ready(LEADERS, clock.now).nodes == set()  # backing off
    clock.now += 0.1
    assert acc.ready(LEADERS, clock.now).nodes == {1}
    [again] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    assert again is first
    # while the retry is in flight nothing else of the partition is sent
    assert acc.ready(LEADERS, clock.now).nodes == set()
    assert acc.drain(LEADERS, {1}, 1 << 20, clock.now) == {}
    acc.complete(first, base_offset=0)
    [then] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]  # a retry flies alone
    assert then is second
    assert a.result(0).offset == 0 and not b.done() and not c.done()


def test_new_records_never_join_a_retried_batch():
    clock = Clock()
    acc = make(clock, linger_s=0)
    add(acc)
    [batch] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    batch.attempts = 1
    acc.reenqueue(batch, clock.now)
    add(acc)
    assert acc.queued_batches() == 2 and len(batch) == 1


def test_expire_removes_queued_batches_past_the_delivery_timeout():
    clock = Clock()
    acc = make(clock, linger_s=60, delivery_timeout_s=1.0)
    add(acc)
    assert acc.expire(clock.now) == []
    assert acc.ready(LEADERS, clock.now).next_delay == pytest.approx(1.0)
    clock.now += 1.0
    [expired] = acc.expire(clock.now)
    assert acc.queued_batches() == 0 and expired.tp == T0


def test_a_keyless_record_after_its_sticky_batch_expired_opens_a_new_batch():
    clock = Clock()
    acc = make(clock, linger_s=60, delivery_timeout_s=1.0,
               partitioner=StickyPartitioner(rng=lambda n: 0))
    old = acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE)
    clock.now += 1.0
    for batch in acc.expire(clock.now):
        acc.complete(batch, error=RequestTimedOut("expired"), in_flight=False)
    assert old.failed() and acc.used_memory == 0
    new = acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE)
    assert not new.done() and new.batch is not old.batch
    assert acc.queued_batches() == 1 and acc.used_memory == SIZE
    b = bulk([VALUE], runs=[])
    acc.append_many(b, 2, [0, 1])
    assert b.futures[0].batch is new.batch
    [batch] = acc.drain(LEADERS, {1, 2}, 1 << 20, clock.now)[1]
    acc.complete(batch, base_offset=0)
    assert new.result(0).offset == 0 and acc.used_memory == 0


def test_a_keyless_record_after_an_abort_opens_a_new_batch():
    acc = make(linger_s=60, partitioner=StickyPartitioner(rng=lambda n: 0))
    old = acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE)
    for batch in acc.abort():
        acc.complete(batch, error=ClientClosedError("aborted"), in_flight=False)
    new = acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE)
    assert old.failed() and not new.done() and acc.queued_batches() == 1
    assert acc.used_memory == SIZE


def test_abort_returns_everything_queued():
    acc = make(linger_s=60)
    add(acc, T0, 4)
    add(acc, T1)
    assert sorted(len(b) for b in acc.abort()) == [1, 1, 3]
    assert acc.queued_batches() == 0


def test_append_returns_none_when_buffer_memory_is_exhausted():
    acc = make(buffer_memory=2 * SIZE)
    assert all(add(acc, n=2))
    assert add(acc) == [None]


def test_a_record_larger_than_the_buffer_is_taken_when_the_buffer_is_empty():
    acc = make(buffer_memory=10)
    assert add(acc) != [None]


def test_memory_waiters_make_every_batch_ready():
    clock = Clock()
    acc = make(clock, linger_s=60, buffer_memory=SIZE)
    add(acc)
    assert acc.ready(LEADERS, clock.now).nodes == set()
    released = threading.Event()

    def waiter():
        acc.wait_for_memory(SIZE, deadline=clock.now + 5)
        released.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    for _ in range(200):
        if acc.ready(LEADERS, clock.now).nodes:
            break
        time.sleep(0.005)
    assert acc.ready(LEADERS, clock.now).nodes == {1}
    [batch] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    acc.complete(batch, base_offset=0)
    assert released.wait(5)
    thread.join()


def test_wait_for_memory_times_out():
    clock = Clock()
    acc = make(clock, buffer_memory=SIZE)
    add(acc)
    with pytest.raises(RequestTimedOut, match="buffer_memory"):
        acc.wait_for_memory(SIZE, deadline=clock.now)


async def test_wait_for_memory_async_wakes_on_release():
    clock = Clock()
    acc = make(clock, linger_s=0, buffer_memory=SIZE)
    add(acc)
    [batch] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def waiter():
            await acc.wait_for_memory_async(SIZE, deadline=clock.now + 5)
            done.set()

        nursery.start_soon(waiter)
        await trio.sleep(0.01)
        assert not done.is_set()
        acc.complete(batch, base_offset=0)
        with trio.fail_after(2):
            await done.wait()


def test_wakeup_fires_once_per_new_or_full_batch_not_per_record():
    wakes = []
    clock = Clock()
    acc = make(clock, linger_s=60, wakeup=lambda: wakes.append(1))
    add(acc)  # opens a batch
    assert len(wakes) == 1
    add(acc)  # joins it: the sender is already due to look (wake pending)
    assert len(wakes) == 1
    acc.ready(LEADERS, clock.now)  # the sender looked
    add(acc)  # fills it
    assert len(wakes) == 2
    acc.ready(LEADERS, clock.now)
    add(acc)  # opens another
    assert len(wakes) == 3


def test_keyless_records_switch_partition_once_their_batch_is_drained():
    clock = Clock()
    choices = iter([0, 1])
    acc = make(clock, linger_s=0, partitioner=StickyPartitioner(rng=lambda n: next(choices)))
    first = acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE)
    assert acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE).topic_partition == first.topic_partition
    acc.drain(LEADERS, {1, 2}, 1 << 20, clock.now)
    later = acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE)
    assert later.topic_partition != first.topic_partition


def test_many_threads_append_concurrently_without_losing_records():
    clock = Clock()
    acc = make(clock, linger_s=60, records_per_batch=7)
    per_thread, threads = 500, 4
    futures: list = []
    lock = threading.Lock()

    def producer():
        mine = add(acc, T0, per_thread)
        with lock:
            futures.extend(mine)

    workers = [threading.Thread(target=producer) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    base = 0
    batches = []
    while acc.queued_batches():
        batches += acc.drain(LEADERS, {1}, math.inf, clock.now)[1]
    for batch in batches:
        acc.complete(batch, base_offset=base)
        base += len(batch)
    offsets = sorted(f.result(0).offset for f in futures)
    assert offsets == list(range(per_thread * threads))
    assert acc.used_memory == 0


def test_with_guarantee_order_a_partition_has_one_batch_in_flight_even_across_leaders():
    # max_in_flight_requests_per_connection 1: the leader moved while a batch was in flight to
    # the old one; the next batch must not go to the new leader before the first is settled,
    # or a retry of the first would land after it
    clock = Clock()
    acc = make(clock, linger_s=0, records_per_batch=1)
    acc.guarantee_order = True
    add(acc)
    add(acc)
    [first] = acc.drain(LEADERS, {1}, 1, clock.now)[1]  # one batch per request
    moved = Leaders({T0: 2})
    assert acc.ready(moved, clock.now).nodes == set()
    assert acc.drain(moved, {2}, 1 << 20, clock.now) == {}
    first.attempts = 1
    acc.reenqueue(first, clock.now)
    clock.now += 0.1
    [again] = acc.drain(moved, {2}, 1 << 20, clock.now)[2]
    assert again is first
    acc.complete(first, base_offset=0)
    [second] = acc.drain(moved, {2}, 1 << 20, clock.now)[2]
    assert second is not first


# -- bulk appends (send_many) -----------------------------------------------------------------


def bulk(values, keys=None, runs=None, timestamp=1000, topic="t"):
    sizes = [record_size(None if keys is None else keys[i], v, None) for i, v in enumerate(values)]
    b = BulkRecords(topic, list(values), keys, list(itertools.accumulate(sizes, initial=0)), timestamp)
    b.runs = runs
    return b


def drain_all(acc, clock, nodes=(1, 2)):
    out = []
    while acc.queued_batches():
        for batches in acc.drain(LEADERS, set(nodes), math.inf, clock.now).values():
            out += batches
    return out


def test_append_many_fills_batches_a_batch_full_at_a_time_in_call_order():
    clock = Clock()
    wakes = []
    acc = make(clock, wakeup=lambda: wakes.append(1))
    values = [b"v%09d" % i for i in range(7)]
    b = bulk(values, runs=[(7, 0)])
    assert acc.append_many(b, 2, [0, 1]) == 0
    assert b.appended == 7 and len(b.futures) == 7 and acc.used_memory == 7 * SIZE
    assert acc.queued_batches() == 3 and wakes  # full batches are ready at once
    batches = drain_all(acc, clock)
    assert [len(x) for x in batches] == [3, 3, 1]
    base = 0
    for batch in batches:
        assert [r.value for r in iter_all_records(batch.encode())] == values[base:base + len(batch)]
        acc.complete(batch, base_offset=100 + base)
        base += len(batch)
    assert [md.offset for md in b.futures.result(0)] == list(range(100, 107))
    assert all(md.timestamp == 1000 and md.partition == 0 for md in b.futures.result(0))
    assert acc.used_memory == 0


def test_append_many_joins_the_open_batch_and_later_sends_join_after_it():
    clock = Clock()
    acc = make(clock, records_per_batch=4)
    single = add(acc, T0)[0]
    b = bulk([VALUE] * 2, runs=[(2, 0)])
    acc.append_many(b, 1, [0])
    after = add(acc, T0)[0]
    [batch] = drain_all(acc, clock)
    acc.complete(batch, base_offset=0)
    assert [single.result(0).offset, *[f.result(0).offset for f in b.futures], after.result(0).offset] == [0, 1, 2, 3]


def test_append_many_without_runs_uses_the_sticky_partitioner_like_append_keyless():
    clock = Clock()
    choices = iter([0, 1, 0])
    acc = make(clock, partitioner=StickyPartitioner(rng=lambda n: next(choices)))
    b = bulk([VALUE] * 7, runs=[])
    acc.append_many(b, 2, [0, 1])
    assert [f.topic_partition.partition for f in b.futures] == [0, 0, 0, 1, 1, 1, 0]
    # a single keyless send continues in the sticky batch the bulk left open
    assert acc.append_keyless("t", 2, [0, 1], 0, VALUE, None, SIZE).topic_partition == T0


def test_append_many_routes_each_run_to_its_partition_and_keeps_call_order_in_the_futures():
    clock = Clock()
    acc = make(clock, records_per_batch=10)
    keys = [b"a", b"a", b"b", b"a", b"a"]
    values = [b"%d" % i for i in range(5)]
    b = bulk(values, keys=keys, runs=[(2, 0), (3, 1), (5, 0)])
    acc.append_many(b, 2, [0, 1])
    assert [f.topic_partition.partition for f in b.futures] == [0, 0, 1, 0, 0]
    assert [f.topic_partition.partition for f in b.futures[1:4]] == [0, 1, 0]
    assert b.futures[-1]._index == 3
    by_tp = {batch.tp: batch for batch in drain_all(acc, clock)}
    assert [(r.key, r.value) for r in iter_all_records(by_tp[T0].encode())] == [
        (b"a", b"0"), (b"a", b"1"), (b"a", b"3"), (b"a", b"4")]
    acc.complete(by_tp[T0], base_offset=10)
    acc.complete(by_tp[T1], base_offset=20)
    assert [md.offset for md in b.futures.result(0)] == [10, 11, 20, 12, 13]


def test_append_many_stops_when_buffer_memory_is_exhausted_and_resumes_where_it_stopped():
    clock = Clock()
    acc = make(clock, records_per_batch=2, buffer_memory=5 * SIZE)
    b = bulk([b"%010d" % i for i in range(8)], runs=[(8, 0)])
    assert acc.append_many(b, 1, [0]) == SIZE  # 5 records fit; the 6th needs SIZE more bytes
    assert b.appended == 5 and acc.used_memory == 5 * SIZE
    base = 0
    for appended in (7, 8):  # each completed batch of 2 makes room for 2 more records
        [batch] = acc.drain(LEADERS, {1}, 1, clock.now)[1]
        acc.complete(batch, base_offset=base)
        base += len(batch)
        assert acc.append_many(b, 1, [0]) == (0 if appended == 8 else SIZE) and b.appended == appended
    for batch in drain_all(acc, clock):
        acc.complete(batch, base_offset=base)
        base += len(batch)
    assert [md.offset for md in b.futures.result(0)] == list(range(8))


def test_append_many_takes_a_record_larger_than_a_batch_alone_in_a_new_batch():
    clock = Clock()
    acc = make(clock, records_per_batch=2)
    big = b"x" * (5 * SIZE)
    b = bulk([VALUE, big, VALUE], runs=[(3, 0)])
    acc.append_many(b, 1, [0])
    assert [len(x) for x in drain_all(acc, clock)] == [1, 1, 1]


def test_append_many_after_close_is_refused():
    acc = make()
    acc.close()
    with pytest.raises(ClientClosedError):
        acc.append_many(bulk([VALUE], runs=[]), 1, [0])


def test_record_futures_resolve_together_and_report_the_first_error():
    ok, bad = ProduceResult(T0), ProduceResult(T1)
    futures = RecordFutures(77)
    futures._add_run(ok, 5, 2)
    futures._add_run(bad, 0, 1)
    called = []
    futures.add_done_callback(lambda fs: called.append(fs))
    assert not futures.done() and len(futures) == 3
    with pytest.raises(RequestTimedOut):
        futures.result(0.01)
    ok.complete(base_offset=10)
    assert not called and futures[0].result(0).offset == 15
    bad.complete(error=ClientClosedError("gone"))
    assert called == [futures] and futures.done()
    assert isinstance(futures.exception(0), ClientClosedError)
    with pytest.raises(ClientClosedError):
        futures.result(0)
    assert [f._index for f in futures] == [5, 6, 0] == [futures[i]._index for i in range(-3, 0)]
    with pytest.raises(IndexError):
        futures[3]


def test_empty_record_futures_are_done():
    futures = RecordFutures(0)
    assert futures.done() and futures.result(0) == [] and list(futures) == []


def test_a_batch_refused_as_too_large_is_split_in_order_and_each_record_keeps_its_future():
    clock = Clock()
    acc = make(clock, linger_s=0, records_per_batch=8)
    futures = add(acc, n=4)
    acked, failed = [], []
    for f in futures:
        f.add_callback(acked.append).add_errback(failed.append)
    whole = futures[0].batch
    [big] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    big.attempts = 1
    add(acc)  # a newer batch, queued behind
    first, second = acc.split_and_reenqueue(big, clock.now)
    assert (len(first), len(second)) == (2, 2)  # at most half the records' size each
    assert acc.used_memory == 5 * SIZE and acc.has_incomplete()
    # the pieces go first, at once (no backoff), one at a time, in order
    assert acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1] == [first]
    assert acc.drain(LEADERS, {1}, 1 << 20, clock.now) == {}
    acc.complete(first, base_offset=10)
    assert not futures[0].done()  # the records complete with the whole batch
    assert acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1] == [second]
    acc.complete(second, base_offset=20)
    assert whole.done() and whole.error is None
    assert [f.result(0).offset for f in futures] == [10, 11, 20, 21]
    assert [f.result(0).timestamp for f in futures] == [1000, 1001, 1002, 1003]
    assert [md.offset for md in acked] == [10, 11, 20, 21] and failed == []
    [newer] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    assert len(newer) == 1 and newer.seq > second.seq > first.seq > big.seq


def test_a_split_piece_can_split_again_and_fail_alone():
    clock = Clock()
    acc = make(clock, linger_s=0, records_per_batch=8)
    futures = add(acc, n=4)
    [big] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    first, second = acc.split_and_reenqueue(big, clock.now)
    [first] = acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1]
    one, two = acc.split_and_reenqueue(first, clock.now)
    for piece, outcome in ((one, {"base_offset": 5}), (two, {"error": RequestTimedOut("too big")}),
                           (second, {"base_offset": 6})):
        assert acc.drain(LEADERS, {1}, 1 << 20, clock.now)[1] == [piece]
        acc.complete(piece, **outcome)
    assert futures[0].result(0).offset == 5 and futures[0].exception(0) is None
    assert isinstance(futures[1].exception(0), RequestTimedOut) and futures[1].failed()
    assert [f.result(0).offset for f in futures[2:]] == [6, 7] and futures[3].succeeded()
    assert isinstance(futures[0].batch.error, RequestTimedOut)  # the whole batch's: its first error
    assert acc.used_memory == 0 and not acc.has_incomplete()


def test_record_futures_of_a_split_batch_report_the_first_failed_records_error():
    whole, first, second = ProduceResult(T0), ProduceResult(T0), ProduceResult(T0)
    futures = RecordFutures(77)
    futures._add_run(whole, 0, 3)
    whole.hand_over([0, 2], [first, second])
    first.complete(base_offset=0)
    assert not futures.done()
    second.complete(error=ClientClosedError("gone"))
    assert futures.done() and isinstance(futures.exception(0), ClientClosedError)
    assert [f.exception(0) is None for f in futures] == [True, True, False]
    whole.complete(base_offset=99)  # a split batch completes with its pieces only
    assert futures[1].result(0).offset == 1
