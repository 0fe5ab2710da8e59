"""The idempotent producer against the fake cluster (which deduplicates with the broker's own
producer state): lost responses, several requests in flight with a failed one, a broker that
forgot the producer, and the epoch bump that follows."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from tidelog.aio import AsyncProducer
from tidelog.errors import TidelogError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    COORDINATOR_LOAD_IN_PROGRESS,
    NOT_LEADER_OR_FOLLOWER,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
)
from tidelog.protocol.records import iter_headers

FAST = dict(retry_backoff_ms=10, linger_ms=0)


def stored_batches(fake, topic="t", partition=0):
    return [h for _, data in fake.log(topic, partition).batches for _, h in iter_headers(data)]


async def test_acks_all_producers_are_idempotent_by_default(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        await producer.send_and_wait("t", b"a")
        await producer.send_and_wait("t", b"b")
    [init] = fake.sent(ApiKey.INIT_PRODUCER_ID)
    assert (init.producer_id, init.producer_epoch) == (-1, -1)
    assert [(h.producer_id, h.producer_epoch, h.base_sequence) for h in stored_batches(fake)] == \
        [(1000, 0, 0), (1000, 0, 1)]


async def test_lost_responses_are_resent_and_deduplicated_with_the_original_offsets(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, drop_after_append=True, count=3)
    async with AsyncProducer(fake.bootstrap, batch_size=200, **FAST) as producer:
        futures = [await producer.send("t", b"v%03d" % i, partition=0) for i in range(60)]
        with trio.fail_after(20):
            offsets = [(await f).offset for f in futures]
    assert fake.values("t") == [b"v%03d" % i for i in range(60)]
    assert offsets == list(range(60))
    assert len(fake.sent(ApiKey.PRODUCE)) > len(stored_batches(fake))  # some were sent twice


async def test_with_several_in_flight_a_failed_batch_is_resent_before_the_ones_behind_it(fake):
    fake.create_topic("t", 1)
    # the first produce is held back, then refused; the ones sent behind it meanwhile reach the
    # broker first and are refused for their sequence (the producer is unknown there)
    fake.inject(ApiKey.PRODUCE, error_code=NOT_LEADER_OR_FOLLOWER.code, delay_s=0.3)
    async with AsyncProducer(fake.bootstrap, batch_size=200, **FAST) as producer:
        futures = []
        for i in range(40):
            futures.append(await producer.send("t", b"v%03d" % i, partition=0))
            await trio.sleep(0.002)
        with trio.fail_after(20):
            offsets = [(await f).offset for f in futures]
    assert fake.values("t") == [b"v%03d" % i for i in range(40)]
    assert offsets == list(range(40))
    sequences = [h.base_sequence for h in stored_batches(fake)]
    assert sequences == sorted(sequences) and sequences[0] == 0


async def test_a_broker_that_forgot_the_producer_gets_the_batch_again_under_a_new_epoch(fake):
    # retention (or producer id expiration) removed the producer's state while it was idle:
    # nothing of the refused batch is in the log, so it is resent from sequence 0 of a new
    # epoch, as Kafka's producer does (KIP-360), instead of failing the caller's records
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        await producer.send_and_wait("t", b"a")
        fake.log("t").producer_state.clear()  # as if retention removed its batches
        with trio.fail_after(10):
            md = await producer.send_and_wait("t", b"b")
            assert md.offset == 1
            md = await producer.send_and_wait("t", b"c")
    assert md.offset == 2 and fake.values("t") == [b"a", b"b", b"c"]
    inits = fake.sent(ApiKey.INIT_PRODUCER_ID)
    assert [(r.producer_id, r.producer_epoch) for r in inits] == [(-1, -1)]  # the producer bumps its own epoch
    assert [(h.producer_epoch, h.base_sequence) for h in stored_batches(fake)] == [(0, 0), (1, 0), (1, 1)]


async def test_a_gap_in_the_brokers_sequence_fails_that_batch_and_the_epoch_is_bumped(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        await producer.send_and_wait("t", b"a")
        [entry] = fake.log("t").producer_state.producers.values()
        last = entry.batches[-1]  # as if the broker lost acknowledged records (unclean election)
        entry.batches[-1] = last._replace(last_seq=last.last_seq + 3)
        with pytest.raises(TidelogError) as e:
            await producer.send_and_wait("t", b"lost")
        assert e.value.error is OUT_OF_ORDER_SEQUENCE_NUMBER and "not written" in str(e.value)
        with trio.fail_after(10):
            md = await producer.send_and_wait("t", b"c")
    assert md.offset == 1 and fake.values("t") == [b"a", b"c"]
    inits = fake.sent(ApiKey.INIT_PRODUCER_ID)
    assert [(r.producer_id, r.producer_epoch) for r in inits] == [(-1, -1)]  # the producer bumps its own epoch
    assert [(h.producer_epoch, h.base_sequence) for h in stored_batches(fake)] == [(0, 0), (1, 0)]


async def test_queued_retries_behind_a_batch_moved_to_a_new_epoch_follow_it(fake):
    # a connection drop fails several pipelined requests: their batches wait for a retry with
    # their sequences; the first one is then refused by a broker that forgot the producer and
    # moves to a new epoch, and the ones queued behind it (not in the log either: the broker
    # takes a producer's sequences only in order) must follow it, not wait for it forever
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, batch_size=200, **FAST) as producer:
        await producer.send_and_wait("t", b"first")
        fake.inject(ApiKey.PRODUCE, drop_connection=True, delay_s=0.3)
        futures = []
        for i in range(12):
            futures.append(await producer.send("t", b"v%03d" % i, partition=0))
            await trio.sleep(0.01)
        fake.log("t").producer_state.clear()  # as if retention removed its batches
        with trio.fail_after(20):
            offsets = [(await f).offset for f in futures]
    values = fake.values("t")
    assert values == [b"first"] + [b"v%03d" % i for i in range(12)]
    assert offsets == list(range(1, 13))


async def test_batches_sent_behind_one_refused_as_too_large_follow_its_pieces_in_sequence(fake):
    # one batch per request, several requests in flight (the first answer is held back until
    # the others are sent): the batches above the topic's max.message.bytes are refused and
    # split, and the small last one, sent behind them, is refused for its sequence; it is
    # retried after the pieces, under the same epoch, and no record fails
    fake.create_topic("t", 1)
    fake.log("t").max_message_bytes = 200
    fake.inject(ApiKey.PRODUCE, delay_s=0.3)
    values = [b"record-%03d" % i for i in range(50)]
    async with AsyncProducer(fake.bootstrap, batch_size=600, max_request_size=400, linger_ms=10_000,
                             retry_backoff_ms=10) as producer:
        futures = []
        for v in values:  # each full batch is drained and sent as the next one opens
            futures.append(await producer.send("t", v, partition=0))
            await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(20):
            await producer.flush()
            offsets = [(await f).offset for f in futures]
    assert offsets == list(range(50)) and fake.values("t") == values
    first_sent = [h.base_sequence for r in fake.sent(ApiKey.PRODUCE)[:5]
                  for _, h in iter_headers(r.topic_data[0].partition_data[0].records)]
    assert first_sent == [0, 12, 24, 36, 48]  # all in flight before the first answer
    stored = stored_batches(fake)
    assert [(h.producer_epoch, h.base_sequence) for h in stored] == \
        [(0, sum(h.record_count for h in stored[:i])) for i in range(len(stored))]
    assert len(fake.sent(ApiKey.INIT_PRODUCER_ID)) == 1  # no epoch bump, no new id


async def test_a_producer_id_refused_for_good_fails_the_records_at_once_naming_the_cause(fake):
    fake.create_topic("t", 1)
    # answered late, so the first record is usually queued by then (else send raises it)
    fake.inject(ApiKey.INIT_PRODUCER_ID, error_code=CLUSTER_AUTHORIZATION_FAILED.code, count=math.inf,
                delay_s=0.2)
    async with AsyncProducer(fake.bootstrap, delivery_timeout_ms=120_000, **FAST) as producer:
        try:
            with trio.fail_after(5):  # not the delivery timeout
                with pytest.raises(TidelogError, match="CLUSTER_AUTHORIZATION_FAILED"):
                    await (await producer.send("t", b"a"))
            with pytest.raises(TidelogError, match="CLUSTER_AUTHORIZATION_FAILED"):
                await producer.send("t", b"b")
        finally:
            await producer.close(0)
    assert len(fake.sent(ApiKey.INIT_PRODUCER_ID)) == 1  # not retried
    assert fake.values("t") == []


async def test_a_retriable_error_getting_a_producer_id_is_retried(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.INIT_PRODUCER_ID, error_code=COORDINATOR_LOAD_IN_PROGRESS.code, count=2)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        with trio.fail_after(5):
            assert (await producer.send_and_wait("t", b"a")).offset == 0
    assert len(fake.sent(ApiKey.INIT_PRODUCER_ID)) == 3
