"""AsyncProducer against the fake cluster: routing, acks, batching, compression, retries,
timeouts, back-pressure, flush and close."""

from __future__ import annotations

import time

import pytest
import trio
import trio.testing

from tests.component.client.fake_broker import PartitionLog
from tidelog.aio import AsyncConsumer, AsyncProducer, TopicPartition
from tidelog.aio.connection import BrokerConnection
from tidelog.aio.partitioner import default_partition
from tidelog.errors import ClientClosedError, RequestTimedOut
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    MESSAGE_TOO_LARGE,
    NOT_ENOUGH_REPLICAS,
    NOT_LEADER_OR_FOLLOWER,
    REQUEST_TIMED_OUT,
    TOPIC_AUTHORIZATION_FAILED,
    RecordTooLargeError,
    TidelogError,
)
from tidelog.protocol.records import Codec, iter_headers

FAST = dict(retry_backoff_ms=10, linger_ms=0)


def stored_batches(fake, topic="t", partition=0):
    return [h for _, data in fake.log(topic, partition).batches for _, h in iter_headers(data)]


def produce_requests(fake):
    return fake.sent(ApiKey.PRODUCE)


async def test_keyed_records_land_on_kafkas_partition_with_the_offsets_their_futures_report(fake):
    fake.create_topic("t", 3)
    keys = [b"k%d" % i for i in range(6)]
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        futures = [await producer.send("t", b"v%d" % i, key=keys[i % 6]) for i in range(60)]
        results = [await f for f in futures]
    for i, md in enumerate(results):
        assert md.partition == default_partition(keys[i % 6], 3)
        stored = fake.log("t", md.partition).records()[md.offset]
        assert (stored.key, stored.value, stored.offset) == (keys[i % 6], b"v%d" % i, md.offset)
    assert sum(len(fake.values("t", p)) for p in range(3)) == 60


async def test_round_trip_through_the_consumer_keeps_order_per_partition(fake):
    fake.create_topic("t", 2)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        for i in range(40):
            await producer.send("t", b"%d" % i, key=b"k%d" % (i % 2), headers=[("h", b"x"), ("n", None)])
        await producer.flush()
    async with AsyncConsumer(fake.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("t", 0), TopicPartition("t", 1)])
        got = []
        with trio.fail_after(5):
            while len(got) < 40:
                got += await consumer.poll(timeout_ms=500)
    by_key = {}
    for r in got:
        by_key.setdefault(r.key, []).append(int(r.value))
        assert r.headers == [("h", b"x"), ("n", None)]
    assert by_key == {b"k0": list(range(0, 40, 2)), b"k1": list(range(1, 40, 2))}


@pytest.mark.parametrize("acks,wire", [("all", -1), (1, 1), (0, 0)])
async def test_acks(fake, acks, wire):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, acks=acks, **FAST) as producer:
        futures = [await producer.send("t", b"v%d" % i) for i in range(10)]
        await producer.flush()
        offsets = [(await f).offset for f in futures]
    assert {r.acks for r in produce_requests(fake)} == {wire}
    assert fake.values("t") == [b"v%d" % i for i in range(10)]
    assert offsets == ([-1] * 10 if wire == 0 else list(range(10)))


async def test_linger_collects_records_into_one_request(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, retry_backoff_ms=10, linger_ms=200) as producer:
        futures = [await producer.send("t", b"v%d" % i) for i in range(25)]
        with trio.fail_after(5):
            [await f for f in futures]
    [request] = produce_requests(fake)
    [topic] = request.topic_data
    [part] = topic.partition_data
    [(_, header)] = list(iter_headers(part.records))
    assert header.record_count == 25


async def test_full_batches_go_without_waiting_for_linger_as_one_run_per_partition_per_request(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, retry_backoff_ms=10, linger_ms=10_000, batch_size=1000) as producer:
        futures = [await producer.send("t", b"x" * 100) for i in range(30)]
        with trio.fail_after(5):
            for f in futures[:28]:  # the four full batches; the last one lingers
                await f
        assert [(await f).offset for f in futures[:28]] == list(range(28))
        await producer.close(timeout=5)
    for request in produce_requests(fake):
        for topic in request.topic_data:
            assert len(topic.partition_data) == 1  # full batches of a partition travel together
            assert all(h.record_count <= 7 for _, h in iter_headers(topic.partition_data[0].records))
    assert len(fake.values("t")) == 30


async def test_keyless_records_stick_to_one_partition_per_batch(fake):
    fake.create_topic("t", 4)
    async with AsyncProducer(fake.bootstrap, retry_backoff_ms=10, linger_ms=100) as producer:
        futures = [await producer.send("t", b"v") for _ in range(20)]
        parts = {(await f).partition for f in futures}
    assert len(parts) == 1


@pytest.mark.parametrize("compression", ["gzip", "lz4", "zstd"])
async def test_compression(fake, compression):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, compression_type=compression, linger_ms=50) as producer:
        futures = [await producer.send("t", b"value %d " % i * 10) for i in range(50)]
        [await f for f in futures]
    [(_, header)] = list(iter_headers(fake.log("t").batches[0][1]))
    assert header.codec == Codec.parse(compression)
    assert fake.values("t") == [b"value %d " % i * 10 for i in range(50)]


async def test_not_leader_refreshes_metadata_and_retries_on_the_new_leader(fake):
    fake.create_topic("t", 1, leaders=[0])
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        assert (await producer.send_and_wait("t", b"first")).offset == 0
        fake.move_leader("t", 0, 1)  # node 0 now answers NOT_LEADER_OR_FOLLOWER
        metadata_before = len(fake.sent(ApiKey.METADATA))
        futures = [await producer.send("t", b"v%d" % i) for i in range(5)]
        offsets = [(await f).offset for f in futures]
    assert offsets == [1, 2, 3, 4, 5]
    assert fake.values("t") == [b"first"] + [b"v%d" % i for i in range(5)]  # once each
    assert len(fake.sent(ApiKey.METADATA)) > metadata_before
    assert {node for node, key, _ in fake.requests if key == ApiKey.PRODUCE} == {0, 1}


async def test_injected_not_leader_errors_are_retried(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, error_code=NOT_LEADER_OR_FOLLOWER.code, count=3)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        md = await producer.send_and_wait("t", b"v")
    assert md.offset == 0 and fake.values("t") == [b"v"]
    assert len(produce_requests(fake)) == 4


@pytest.mark.parametrize("error", [NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS])
@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_request_refused_as_a_whole_with_a_retriable_code_is_retried(fake, error, idempotent):
    # the broker answers an error body (no partition results), as it does for a request its
    # handler refused outright: the batches take the retry path a partition's error takes
    fake.create_topic("t", 2)
    fake.inject(ApiKey.PRODUCE, error_code=error.code, whole_request=True, count=2)
    async with AsyncProducer(fake.bootstrap, acks=-1 if idempotent else 1, enable_idempotence=idempotent,
                             linger_ms=50, retry_backoff_ms=10) as producer:
        metadata_before = len(fake.sent(ApiKey.METADATA))
        futures = [await producer.send("t", b"v%d" % i, partition=i % 2) for i in range(6)]
        with trio.fail_after(5):
            results = [await f for f in futures]
        refreshed = len(fake.sent(ApiKey.METADATA)) > metadata_before
    assert [(md.partition, md.offset) for md in results] == [(i % 2, i // 2) for i in range(6)]
    assert fake.values("t", 0) == [b"v0", b"v2", b"v4"] and fake.values("t", 1) == [b"v1", b"v3", b"v5"]
    assert refreshed or not error.invalid_metadata


async def test_a_request_refused_as_a_whole_with_a_non_retriable_code_fails_its_records(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, error_code=TOPIC_AUTHORIZATION_FAILED.code, whole_request=True)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        future = await producer.send("t", b"v")
        with pytest.raises(TidelogError, match="TOPIC_AUTHORIZATION_FAILED"):
            await future
        assert len(produce_requests(fake)) == 1
        assert (await producer.send_and_wait("t", b"w")).offset == 0


async def test_a_dropped_connection_is_retried_on_a_new_one(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, drop_connection=True)
    async with AsyncProducer(fake.bootstrap, max_in_flight_requests_per_connection=1, **FAST) as producer:
        futures = [await producer.send("t", b"v%d" % i) for i in range(10)]
        offsets = [(await f).offset for f in futures]
    assert offsets == list(range(10))
    assert fake.values("t") == [b"v%d" % i for i in range(10)]
    assert fake.connections >= 3  # bootstrap, the first leader connection, its replacement


async def test_retries_keep_per_partition_order_with_one_request_in_flight(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, error_code=NOT_LEADER_OR_FOLLOWER.code, count=2)
    async with AsyncProducer(fake.bootstrap, max_in_flight_requests_per_connection=1, batch_size=200,
                             **FAST) as producer:
        futures = [await producer.send("t", b"%03d" % i) for i in range(30)]
        offsets = [(await f).offset for f in futures]
    assert offsets == list(range(30))
    assert fake.values("t") == [b"%03d" % i for i in range(30)]


async def test_a_non_retriable_error_fails_the_records_naming_the_partition(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, error_code=MESSAGE_TOO_LARGE.code)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        future = await producer.send("t", b"v")
        with pytest.raises(RecordTooLargeError, match="topic 't' partition 0"):
            await future
        assert (await producer.send_and_wait("t", b"w")).offset == 0


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_batch_too_large_fails_alone_not_the_batches_sent_with_it(fake, idempotent):
    # batches of three small records around one of a large record, drained together as one
    # run of the partition: the broker refuses the run for the large batch alone
    fake.create_topic("t", 1)
    fake.log("t").max_message_bytes = 400
    small, large = [b"s%d" % i for i in range(6)], b"L" * 1000
    async with AsyncProducer(fake.bootstrap, batch_size=200, linger_ms=10_000, retry_backoff_ms=10,
                             acks=-1 if idempotent else 1, enable_idempotence=idempotent) as producer:
        futures = [await producer.send("t", v) for v in small[:3]]
        too_large = await producer.send("t", large)
        futures += [await producer.send("t", v) for v in small[3:]]
        await producer.flush()
        with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
            await too_large
        assert [(await f).offset for f in futures] == list(range(6))
    assert fake.values("t") == small
    assert len(produce_requests(fake)[0].topic_data[0].partition_data[0].records) > 1000  # one run


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_batch_larger_than_max_message_bytes_is_split_and_every_record_delivered_in_order(fake, idempotent):
    # 40 records that each fit the topic's max.message.bytes and together are far above it,
    # in one lingering batch: the broker refuses it, the producer splits it (again) and sends
    # the pieces, each record keeping its future and callbacks
    fake.create_topic("t", 1)
    fake.log("t").max_message_bytes = 300
    values = [b"record-%03d" % i for i in range(40)]
    acked: list[int] = []
    async with AsyncProducer(fake.bootstrap, linger_ms=10_000, retry_backoff_ms=10,
                             acks=-1 if idempotent else 1, enable_idempotence=idempotent) as producer:
        futures = [await producer.send("t", v, key=b"k") for v in values[:20]]
        futures += list(await producer.send_many("t", values[20:], keys=[b"k"] * 20))
        for f in futures:
            f.add_callback(lambda md: acked.append(md.offset))
        with trio.fail_after(10):
            await producer.flush()
        assert [(await f).offset for f in futures] == list(range(40))
    assert acked == list(range(40)) and fake.values("t") == values
    stored = stored_batches(fake)
    assert len(stored) > 2 and all(h.batch_length + 12 <= 300 for h in stored)
    if idempotent:  # the pieces took the refused batch's sequences, in order, under one epoch
        assert [(h.producer_epoch, h.base_sequence) for h in stored] == \
            [(0, sum(h.record_count for h in stored[:i])) for i in range(len(stored))]


async def test_retries_end_at_the_delivery_timeout(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, error_code=NOT_LEADER_OR_FOLLOWER.code, count=10**9)
    async with AsyncProducer(fake.bootstrap, retry_backoff_ms=10, linger_ms=0, request_timeout_ms=200,
                             delivery_timeout_ms=300) as producer:
        future = await producer.send("t", b"v")
        with trio.fail_after(5):
            # the last error is NOT_LEADER_OR_FOLLOWER, or on a loaded machine the attempt in
            # flight at the deadline: the delivery timeout ends the retries either way
            with pytest.raises(RequestTimedOut, match="delivery_timeout_ms"):
                await future
    assert fake.values("t") == []


async def test_a_batch_in_flight_fails_at_its_delivery_timeout_not_a_request_timeout_later(fake):
    # the first attempt is answered late with a retriable error, the retry never: the retry's
    # request timeout would end ~2.9 s after the send, the delivery timeout ends at 1 s
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, error_code=NOT_LEADER_OR_FOLLOWER.code, delay_s=0.9)
    fake.inject(ApiKey.PRODUCE, delay_s=3600, count=10**9)
    async with AsyncProducer(fake.bootstrap, retry_backoff_ms=10, linger_ms=0, request_timeout_ms=1000,
                             delivery_timeout_ms=1000) as producer:
        future = await producer.send("t", b"v")
        with trio.fail_after(2.6):  # a bound, well before the retry's own timeout (~2.9 s)
            with pytest.raises(RequestTimedOut, match="delivery_timeout_ms"):
                await future
        assert len(produce_requests(fake)) == 2  # failed while its retry was in flight
        fake.faults.clear()
        assert (await producer.send_and_wait("t", b"w")).offset == 0
    assert fake.values("t") == [b"w"]


async def test_retries_zero_fails_at_the_first_error(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, error_code=NOT_LEADER_OR_FOLLOWER.code)
    async with AsyncProducer(fake.bootstrap, retries=0, **FAST) as producer:
        future = await producer.send("t", b"v")
        with pytest.raises(Exception, match="NOT_LEADER_OR_FOLLOWER"):
            await future


async def test_an_unknown_topic_blocks_send_for_max_block_ms(fake):
    async with AsyncProducer(fake.bootstrap, max_block_ms=300, **FAST) as producer:
        with trio.fail_after(5):
            with pytest.raises(RequestTimedOut, match="'nope' not present in metadata after 300 ms"):
                await producer.send("nope", b"v")


async def test_the_producer_may_ask_the_broker_to_create_a_topic(fake):
    fake.auto_create_partitions = 2
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        md = await producer.send_and_wait("fresh", b"v", key=b"k")
    assert md.partition == default_partition(b"k", 2) and "fresh" in fake.topics


async def test_buffer_memory_back_pressure_blocks_send_until_memory_is_released(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, delay_s=0.3)
    async with AsyncProducer(fake.bootstrap, buffer_memory=400, batch_size=400, **FAST) as producer:
        first = await producer.send("t", b"x" * 300)
        started = trio.current_time()
        second = await producer.send("t", b"y" * 300)  # waits until the first is acknowledged
        assert first.done() and trio.current_time() - started >= 0.2
        await second
    assert fake.values("t") == [b"x" * 300, b"y" * 300]


async def test_exhausted_buffer_memory_raises_after_max_block_ms(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, delay_s=2)
    async with AsyncProducer(fake.bootstrap, buffer_memory=400, batch_size=400, max_block_ms=100,
                             **FAST) as producer:
        # metadata first: max_block_ms also bounds the wait for it, which is not under test
        await producer.wait_for_topic("t", time.monotonic() + 30)
        await producer.send("t", b"x" * 300)
        with pytest.raises(RequestTimedOut, match="buffer_memory"):
            await producer.send("t", b"y" * 300)
        await producer.close(timeout=0)


async def test_records_larger_than_the_request_limit_are_refused_at_once(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, max_request_size=1000, **FAST) as producer:
        with pytest.raises(RecordTooLargeError):
            await producer.send("t", b"x" * 2000)
        with pytest.raises(ValueError, match="partition -1"):
            await producer.send("t", b"x", partition=-1)


async def test_flush_waits_for_every_record_sent_before_it(fake):
    fake.create_topic("t", 2)
    async with AsyncProducer(fake.bootstrap, linger_ms=10_000) as producer:
        futures = [await producer.send("t", b"v", partition=i % 2) for i in range(10)]
        assert not any(f.done() for f in futures)
        with trio.fail_after(5):
            await producer.flush()
        assert all(f.done() for f in futures)


async def test_close_delivers_pending_records_and_then_refuses_new_ones(fake):
    fake.create_topic("t", 1)
    producer = AsyncProducer(fake.bootstrap, linger_ms=10_000)
    async with producer:
        futures = [await producer.send("t", b"v") for _ in range(5)]
    assert [f.result(0).offset for f in futures] == list(range(5))
    with pytest.raises(ClientClosedError):
        await producer.send("t", b"late")


async def test_close_with_no_time_left_fails_pending_records_instead_of_dropping_them(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, delay_s=5)
    async with AsyncProducer(fake.bootstrap, linger_ms=0) as producer:
        first = await producer.send("t", b"a")
        await trio.sleep(0.05)
        second = await producer.send("t", b"b")  # pipelined behind the first, whose answer is slow
        with trio.fail_after(2):
            await producer.close(timeout=0.1)
    for future in (first, second):  # outcome unknown when the producer gives up: failed, not dropped
        assert future.done()
        with pytest.raises(ClientClosedError):
            future.result(0)


async def test_run_in_a_nursery_of_your_own(fake, nursery):
    fake.create_topic("t", 1)
    producer = AsyncProducer(fake.bootstrap, **FAST)
    await nursery.start(producer.run)
    assert (await producer.send_and_wait("t", b"v")).offset == 0
    assert await producer.partitions_for("t") == [0]
    await producer.close()
    assert producer.closed


async def test_a_tight_send_loop_lets_the_sender_run_and_can_be_cancelled(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, linger_ms=1, batch_size=2000) as producer:
        await producer.send_and_wait("t", b"first")
        sent = 0
        with trio.move_on_after(0.2):
            while True:  # never awaits a future: only send's own checkpoints let others run
                await producer.send("t", b"x" * 50)
                sent += 1
        assert sent > 0 and len(produce_requests(fake)) > 2  # batches left while the loop ran
        await producer.flush()
    assert len(fake.values("t")) == sent + 1


async def test_an_error_in_the_body_propagates_as_itself(fake):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        async with AsyncProducer(fake.bootstrap):
            raise Boom


# -- send_many ----------------------------------------------------------------------------------


async def test_send_many_keyless_fills_sticky_batches_and_reports_offsets_in_call_order(fake):
    fake.create_topic("t", 3)
    values = [b"v%03d" % i for i in range(500)]
    async with AsyncProducer(fake.bootstrap, batch_size=2000, **FAST) as producer:
        futures = await producer.send_many("t", values)
        assert len(futures) == 500
        results = await futures
    stored = {(md.partition, md.offset): v for md, v in zip(results, values)}
    for p in range(3):
        for r in fake.log("t", p).records():
            assert stored[(p, r.offset)] == r.value and r.key is None
    assert sum(len(fake.values("t", p)) for p in range(3)) == 500
    assert len({md.timestamp for md in results}) == 1  # one timestamp per call


async def test_send_many_with_keys_uses_kafkas_partitioner_and_none_keys_go_sticky(fake):
    fake.create_topic("t", 4)
    keys = [b"k%d" % (i % 7) if i % 5 else None for i in range(100)]
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        results = await (await producer.send_many("t", [b"%d" % i for i in range(100)], keys=keys))
    for i, md in enumerate(results):
        if keys[i] is not None:
            assert md.partition == default_partition(keys[i], 4)
        record = fake.log("t", md.partition).records()[md.offset]
        assert (record.key, record.value) == (keys[i], b"%d" % i)


async def test_send_many_to_a_partition_interleaves_with_send_in_call_order(fake):
    fake.create_topic("t", 2)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        await producer.send("t", b"a", partition=1)
        many = await producer.send_many("t", [b"b", None, "c"], partition=1, timestamp_ms=42)
        await producer.send("t", b"d", partition=1)
        await producer.flush()
        assert [md.timestamp for md in await many] == [42, 42, 42]
    assert fake.values("t", 1) == [b"a", b"b", None, b"c", b"d"]
    assert [r.timestamp for r in fake.log("t", 1).records()][1:4] == [42, 42, 42]


async def test_send_many_uses_the_serializers(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, value_serializer=lambda v: b"<%d>" % v,
                             key_serializer=lambda k: None if k is None else k.upper().encode(),
                             **FAST) as producer:
        await (await producer.send_many("t", [1, 2], keys=["a", None]))
    assert [(r.key, r.value) for r in fake.log("t").records()] == [(b"A", b"<1>"), (None, b"<2>")]


async def test_send_many_refuses_bad_arguments_before_queueing_anything(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, max_request_size=1000, **FAST) as producer:
        with pytest.raises(RecordTooLargeError, match="record 1"):
            await producer.send_many("t", [b"x", b"x" * 2000])
        with pytest.raises(ValueError, match="partition -1"):
            await producer.send_many("t", [b"x"], partition=-1)
        with pytest.raises(ValueError, match="2 values but 1 keys"):
            await producer.send_many("t", [b"x", b"y"], keys=[b"k"])
        assert len(await producer.send_many("t", [])) == 0
        await producer.flush()
    assert fake.values("t") == []


class Millis:
    """An integer type of another library (numpy's int64, say)."""

    def __index__(self) -> int:
        return 42


async def test_a_timestamp_of_any_integer_type_is_taken_and_anything_else_refused(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, **FAST) as producer:
        one = await producer.send("t", b"a", timestamp_ms=Millis())  # a batch of one record
        many = await producer.send_many("t", [b"b", b"c"], timestamp_ms=Millis())
        assert (await one).timestamp == 42 and [md.timestamp for md in await many] == [42, 42]
        with pytest.raises(TypeError, match="timestamp_ms must be an integer .* got float 1.5"):
            await producer.send("t", b"x", timestamp_ms=1.5)
        with pytest.raises(TypeError, match="timestamp_ms must be an integer .* got str '7'"):
            await producer.send_many("t", [b"x"], timestamp_ms="7")
        await producer.flush()
    assert [(r.value, r.timestamp) for r in fake.log("t").records()] == [(b"a", 42), (b"b", 42), (b"c", 42)]


async def test_send_many_waits_for_buffer_memory_part_way_and_keeps_order(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, delay_s=0.1)
    values = [b"%04d" % i for i in range(40)]
    async with AsyncProducer(fake.bootstrap, buffer_memory=400, batch_size=200,
                             max_in_flight_requests_per_connection=1, **FAST) as producer:
        futures = await producer.send_many("t", values)  # 11 records fit in buffer memory at a time
        assert [md.offset for md in await futures] == list(range(40))
    assert fake.values("t") == values


async def test_send_many_gives_up_after_max_block_ms_naming_the_records_it_queued(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, delay_s=2)
    async with AsyncProducer(fake.bootstrap, buffer_memory=400, batch_size=400, max_block_ms=100,
                             **FAST) as producer:
        await producer.wait_for_topic("t", time.monotonic() + 30)  # max_block_ms bounds this wait too
        with pytest.raises(RequestTimedOut, match="buffer_memory") as info:
            await producer.send_many("t", [b"%04d" % i for i in range(40)])
        assert len(info.value.futures) == 11  # 11 records of 36 bytes fit in 400
        await producer.close(timeout=0)


async def test_a_callback_that_raises_is_logged_and_every_other_record_still_completes(fake, caplog):
    fake.create_topic("t", 2, leaders=[1, 1])  # both partitions in one request
    async with AsyncProducer(fake.bootstrap, linger_ms=10_000, retry_backoff_ms=10) as producer:
        first = await producer.send("t", b"a", partition=0)
        second = await producer.send("t", b"b", partition=1)
        ran = []

        def boom(future):
            raise ValueError("a bug in the application's callback")

        first.add_done_callback(boom)
        first.add_done_callback(lambda future: ran.append(future.result(0).offset))
        with trio.fail_after(5):
            await producer.flush()
        assert [first.done(), second.done(), ran] == [True, True, [0]]
        assert [first.result(0).offset, second.result(0).offset] == [0, 0]
        assert producer.metrics["buffer_used_bytes"] == 0
        third = await producer.send("t", b"c", partition=1)
        with trio.fail_after(5):
            await producer.flush()  # the sender still runs
        assert third.result(0).offset == 1
    assert "a bug in the application's callback" in caplog.text


async def test_a_partition_added_since_the_metadata_was_fetched_is_waited_for(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, max_block_ms=10_000, **FAST) as producer:
        assert (await producer.send_and_wait("t", b"a")).offset == 0
        fake.topics["t"].partitions.append(PartitionLog())  # CreatePartitions, seen by no refresh yet
        fake.topics["t"].leaders.append(1)
        with trio.fail_after(5):
            assert (await producer.send_and_wait("t", b"b", partition=1)).partition == 1
            many = await producer.send_many("t", [b"c", b"d"], partition=1)
            assert [(await f).offset for f in many] == [1, 2]
    assert fake.values("t", 1) == [b"b", b"c", b"d"]


async def test_a_partition_the_topic_never_gets_fails_after_max_block_ms_naming_it(fake):
    fake.create_topic("t", 2)
    async with AsyncProducer(fake.bootstrap, max_block_ms=200, **FAST) as producer:
        with pytest.raises(RequestTimedOut, match="partition 5 of topic 't' with partition count 2"):
            await producer.send("t", b"x", partition=5)
        with pytest.raises(RequestTimedOut, match="partition 5 of topic 't'"):
            await producer.send_many("t", [b"x"], partition=5)
        await producer.flush()
    assert fake.values("t", 0) == fake.values("t", 1) == []


async def test_a_throttled_connection_gets_the_records_sent_meanwhile_in_order_in_one_request(fake):
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, throttle_ms=500)  # the first response asks for a pause (KIP-219)
    async with AsyncProducer(fake.bootstrap, acks=1, **FAST) as producer:
        await producer.send_and_wait("t", b"0")
        futures = []
        for i in range(1, 11):  # each its own request, were it not throttled
            futures.append(await producer.send("t", b"%d" % i))
            await trio.sleep(0)
        with trio.fail_after(5):
            for future in futures:
                await future
    assert fake.arrived_values() == [b"%d" % i for i in range(11)]
    # the first, then one with everything sent during the pause (a bound: sends that outlast
    # the pause make a third request)
    assert len(fake.arrived) <= 3


async def test_nothing_is_drained_for_a_throttled_node_before_its_throttle_ends(fake):
    # Kafka's NetworkClient: a node whose throttle has not passed is not ready, so the records
    # sent meanwhile wait in the accumulator and go in one request when it ends
    fake.create_topic("t", 1)
    fake.inject(ApiKey.PRODUCE, throttle_ms=3_600_000)  # the first response asks for a pause the test ends
    async with AsyncProducer(fake.bootstrap, acks=1, **FAST) as producer:
        try:
            await producer.send_and_wait("t", b"0")
            conn = producer._cluster.open_connection(0)
            assert conn.throttled_until > trio.current_time()
            futures = [await producer.send("t", b"1")]
            await trio.testing.wait_all_tasks_blocked()  # the sender looked and let it be
            assert producer.metrics["queued_batches"] == 1
            futures += [await producer.send("t", b"%d" % i) for i in range(2, 6)]
            await trio.testing.wait_all_tasks_blocked()
            assert producer.metrics["queued_batches"] == 1 and len(fake.arrived) == 1
            conn.throttled_until = trio.current_time()  # the throttle ends
            producer._sender.wakeup()
            with trio.fail_after(5):
                assert [(await f).offset for f in futures] == [1, 2, 3, 4, 5]
        finally:
            await producer.close(0)  # a request waiting out the throttle would hold close for an hour
    assert fake.arrived_values() == [b"%d" % i for i in range(6)] and len(fake.arrived) == 2


async def test_acks_0_requests_reach_the_wire_in_the_order_they_were_drained(fake):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, acks=0, **FAST) as producer:
        for i in range(2000):
            await producer.send("t", b"%d" % i)
            if not i % 7:
                await trio.sleep(0)  # the sender drains a request now and then
        with trio.fail_after(5):
            await producer.flush()
    assert fake.arrived_values() == [b"%d" % i for i in range(2000)]


async def test_callbacks_of_one_partition_run_in_send_order(fake, monkeypatch):
    fake.create_topic("t", 1)
    async with AsyncProducer(fake.bootstrap, acks=1, **FAST) as producer:
        await producer.send_and_wait("t", b"warm")
        start_request = BrokerConnection.start_request
        refused = []

        def start_request_once_refused(conn, *args, **kwargs):
            if not refused:  # as when throttled, or another write in progress: the request's task writes it
                refused.append(True)
                return None
            return start_request(conn, *args, **kwargs)

        monkeypatch.setattr(BrokerConnection, "start_request", start_request_once_refused)
        fake.inject(ApiKey.PRODUCE, delay_s=0.3)  # both responses come back together
        order = []
        first = await producer.send("t", b"1")
        first.add_done_callback(lambda future: order.append(1))
        await trio.sleep(0.1)  # the first request is on the wire, answered late
        second = await producer.send("t", b"2")
        second.add_done_callback(lambda future: order.append(2))
        with trio.fail_after(5):
            await producer.flush()
    assert order == [1, 2]
