"""The idempotent producer's sequence bookkeeping, as pure code: sequences assigned at first
drain and kept across retries, in-order retries behind a failed batch, fatal sequence errors,
and the move of each partition to a new epoch once its old batches are resolved."""

from __future__ import annotations

from tidelog.aio.accumulator import ProducerBatch, RecordAccumulator
from tidelog.aio.idempotence import MAX_EPOCH, MAX_SEQUENCE, NO_PRODUCER, IdempotenceState, next_sequence
from tidelog.aio.producer import Decision, decide, decide_sequenced
from tidelog.protocol.errors import (
    DUPLICATE_SEQUENCE_NUMBER,
    INVALID_PRODUCER_EPOCH,
    NOT_LEADER_OR_FOLLOWER,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    UNKNOWN_PRODUCER_ID,
)
from tidelog.protocol.records import Codec, read_header
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("orders", 0)
OTHER = TopicPartition("orders", 1)


class Leaders:
    def leader_for(self, tp):
        return 1


def batch(n: int = 2, tp=TP) -> ProducerBatch:
    b = ProducerBatch(tp, Codec.NONE, 0.0, 100.0)
    for i in range(n):
        b.append(i, None, b"v%d" % i, None, 40)
    b.mark_full()
    return b


def ready_state() -> IdempotenceState:
    s = IdempotenceState()
    s.set_producer(7, 0)
    return s


def test_sequences_follow_record_counts_per_partition_and_wrap():
    s = ready_state()
    a, b, c = batch(3), batch(2), batch(1, OTHER)
    for x in (a, b, c):
        s.assign(x)
    assert [(x.producer_id, x.producer_epoch, x.base_sequence) for x in (a, b, c)] == [(7, 0, 0), (7, 0, 3), (7, 0, 0)]
    assert read_header(b.encode()).base_sequence == 3
    assert next_sequence(MAX_SEQUENCE - 1, 3) == 1


def test_no_sequence_before_a_producer_id_or_while_a_bump_is_pending():
    s = IdempotenceState()
    assert not s.may_assign(TP)
    s.set_producer(7, 0)
    assert s.may_assign(TP)
    s.request_bump()
    assert not s.may_assign(TP)


def test_the_accumulator_assigns_at_first_drain_and_a_retry_keeps_its_sequence():
    s = ready_state()
    acc = RecordAccumulator(linger_s=0, clock=lambda: 0.0)
    acc.idempotence = s
    for i in range(3):
        acc.append(TP, i, None, b"x" * 10, None, 42)
    [first] = acc.drain(Leaders(), {1}, 1 << 20, 0.0)[1]
    assert first.base_sequence == 0
    payload = first.encode()
    acc.reenqueue(first, 0.0)
    [again] = acc.drain(Leaders(), {1}, 1 << 20, 1.0)[1]
    assert again is first and first.encode() is payload  # same bytes, same sequence


def test_the_accumulator_holds_new_batches_until_there_is_a_producer_id():
    acc = RecordAccumulator(linger_s=0, clock=lambda: 0.0)
    acc.idempotence = IdempotenceState()
    acc.append(TP, 0, None, b"x", None, 33)
    assert acc.ready(Leaders(), 1.0).nodes == set()
    assert acc.drain(Leaders(), {1}, 1 << 20, 1.0) == {}
    acc.idempotence.set_producer(3, 0)
    assert acc.ready(Leaders(), 1.0).nodes == {1}


def test_a_batch_behind_a_failed_one_is_retried_and_the_next_one_is_fatal():
    s = ready_state()
    a, b = batch(), batch()
    s.assign(a)
    s.assign(b)
    s.mark_sent([a, b])
    for code in (OUT_OF_ORDER_SEQUENCE_NUMBER.code, UNKNOWN_PRODUCER_ID.code):
        assert s.decide(b, code).action == "retry"  # a (sequence 0) goes first
    # a followed only acknowledged sequences: the broker lost acknowledged records (fatal), or
    # forgot the producer (a is sent again under a new epoch)
    assert s.decide(a, OUT_OF_ORDER_SEQUENCE_NUMBER.code).action == "fatal"
    assert s.decide(a, UNKNOWN_PRODUCER_ID.code).action == "reset"
    s.on_complete(a, 10, failed=False)
    # b was sent while a was unresolved: it may simply have overtaken a
    assert s.decide(b, OUT_OF_ORDER_SEQUENCE_NUMBER.code).action == "retry"
    s.mark_sent([b])
    assert s.decide(b, OUT_OF_ORDER_SEQUENCE_NUMBER.code).action == "fatal"
    assert s.decide(b, DUPLICATE_SEQUENCE_NUMBER.code).action == "done"
    assert s.decide(b, INVALID_PRODUCER_EPOCH.code).action == "fatal"
    assert s.decide(b, NOT_LEADER_OR_FOLLOWER.code).action == "keep"


def test_decisions_for_sequence_errors():
    s = ready_state()
    a, b = batch(), batch()
    s.assign(a)
    s.assign(b)
    s.mark_sent([a, b])
    b.attempts = a.attempts = 1
    d = decide(b, OUT_OF_ORDER_SEQUENCE_NUMBER.code, now=1.0, retries=5)
    assert d.action == "fail"  # not retriable as a plain error ...
    assert decide_sequenced(b, d, s.decide(b, d.error_code), now=1.0, retries=5).action == "retry"  # ... but behind a
    fatal = decide_sequenced(a, d, s.decide(a, d.error_code), now=1.0, retries=5)
    assert fatal.action == "fail" and "not written" in str(fatal.error) and "orders" in str(fatal.error)
    assert decide_sequenced(b, d, s.decide(b, d.error_code), now=200.0, retries=5).action == "fail"  # expired
    dup = Decision("fail", 42, error_code=DUPLICATE_SEQUENCE_NUMBER.code)
    assert decide_sequenced(b, dup, s.decide(b, dup.error_code), now=1.0, retries=5) == Decision("done", 42)


def test_a_failed_batch_bumps_the_epoch_and_partitions_move_once_resolved():
    s = ready_state()
    a, b, c = batch(), batch(), batch(1, OTHER)
    for x in (a, b, c):
        s.assign(x)
    s.on_complete(a, -1, failed=True)  # e.g. it expired after an unknown outcome
    assert s.bump_requested and not s.ready
    assert s.bump_epoch() and s.producer == (7, 1) and s.ready  # the producer's own bump (KIP-360)
    assert not s.may_assign(TP) and not s.may_assign(OTHER)  # b and c unresolved under epoch 0
    assert s.decide(b, OUT_OF_ORDER_SEQUENCE_NUMBER.code).action == "resequence"
    s.clear_sequence(b)
    assert b.base_sequence == -1 and s.may_assign(TP)
    s.assign(b)
    assert (b.producer_epoch, b.base_sequence) == (1, 0)
    s.on_complete(c, 5, failed=False)  # c acknowledged under epoch 0: no new bump
    assert not s.bump_requested and s.may_assign(OTHER)
    d = batch(1, OTHER)
    s.assign(d)
    assert (d.producer_epoch, d.base_sequence) == (1, 0)


def test_the_producer_bumps_its_own_epoch_and_takes_a_new_id_when_the_epoch_is_used_up():
    s = ready_state()
    assert not s.bump_epoch() and s.producer == (7, 0)  # nothing requested
    s.request_bump()
    assert s.bump_epoch() and s.producer == (7, 1) and not s.bump_requested
    s.set_producer(7, MAX_EPOCH - 1)
    s.request_bump()
    assert not s.bump_epoch()  # no epoch left: a new producer id is needed (InitProducerId)
    assert s.producer == NO_PRODUCER and not s.ready and not s.bump_requested
    fresh = IdempotenceState()
    assert not fresh.bump_epoch() and fresh.producer == NO_PRODUCER


def test_a_batch_refused_by_a_broker_that_forgot_the_producer_moves_to_a_new_epoch():
    s = ready_state()
    a, b = batch(), batch()
    s.assign(a)
    s.on_complete(a, 10, failed=False)
    s.assign(b)
    s.mark_sent([b])
    assert s.decide(b, UNKNOWN_PRODUCER_ID.code).action == "reset"
    s.reset_sequence(b)
    assert s.bump_requested and b.base_sequence == -1 and not s.may_assign(TP)
    s.set_producer(7, 1)
    assert s.may_assign(TP)
    s.assign(b)
    assert (b.producer_epoch, b.base_sequence) == (1, 0)


def test_batches_queued_behind_one_moved_to_a_new_epoch_follow_it():
    s = ready_state()
    acc = RecordAccumulator(linger_s=0, clock=lambda: 0.0, batch_size=60)
    acc.idempotence = s
    for i in range(4):
        acc.append(TP, i, None, b"x" * 20, None, 42)
    drained = acc.drain(Leaders(), {1}, 1 << 20, 0.0)[1]
    assert len(drained) >= 3
    for b in drained:  # the request failed: every batch waits for a retry with its sequence
        b.attempts = 1
        acc.reenqueue(b, 0.0)
    first, rest = drained[0], drained[1:]
    acc.clear_queued_sequences(first)  # refused by a broker that forgot the producer
    s.reset_sequence(first)
    assert [b.base_sequence for b in drained] == [-1] * len(drained)
    s.set_producer(7, 1)
    again = acc.drain(Leaders(), {1}, 1 << 20, 1.0)[1]
    assert again == [first] and (first.producer_epoch, first.base_sequence) == (1, 0)
    assert all(b.base_sequence == -1 for b in rest)


def test_the_pieces_of_a_split_batch_take_its_sequences_and_its_place_in_order():
    s = ready_state()
    acc = RecordAccumulator(batch_size=16384)
    acc.idempotence = s
    before, big, after = batch(n=1), batch(n=4), batch(n=2)
    for b in (before, big, after):
        s.assign(b)
    assert [b.base_sequence for b in (before, big, after)] == [0, 1, 5]
    first, second = big.split(16384, 0.0)
    s.split(big, [first, second])
    assert [(p.producer_id, p.producer_epoch, p.base_sequence, len(p)) for p in (first, second)] == \
        [(7, 0, 1, 2), (7, 0, 3, 2)]
    assert s.partitions[TP].unresolved == [before, first, second, after]
    assert s.partitions[TP].next_sequence == 7  # no gap: the batch behind keeps its sequence
    assert [read_header(p.encode()).base_sequence for p in (first, second)] == [1, 3]
