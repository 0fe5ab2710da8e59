"""The asyncio facade (tidelog.asyncio) against the fake cluster on its own thread: a round
trip, polls cancelled at any moment lose and repeat no record, the asyncio loop keeps running
while a call waits, wakeup, bounded errors, and the wrong event loop named in the error.

Each test runs its own asyncio loop (``asyncio.run``) from a plain test, beside pytest-trio."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import trio

import tidelog.aio
from tidelog import (
    ClientClosedError,
    NewTopic,
    RecordMetadata,
    RequestTimedOut,
    TidelogError,
    TopicPartition,
    WakeupError,
)
from tidelog.aio.partitioner import default_partition
from tidelog.asyncio import AsyncAdmin, AsyncConsumer, AsyncProducer
from tidelog.errors import OffsetOutOfRangeError
from tidelog.records import ConsumerRecords

NOWHERE = "127.0.0.1:1"


def test_round_trip(threaded_fake):
    bootstrap = threaded_fake.cluster.bootstrap

    async def main():
        async with AsyncAdmin(bootstrap) as admin:
            await admin.create_topics([NewTopic("t", 3)])
            assert await admin.list_topics() == ["t"]
        async with AsyncProducer(bootstrap, linger_ms=2) as producer:
            futures = [await producer.send("t", b"v%d" % i, key=b"k%d" % (i % 4)) for i in range(200)]
            many = await producer.send_many("t", [b"m%d" % i for i in range(50)], partition=1)
            await producer.flush(timeout=10)
            results = [await f for f in futures]
            assert all(isinstance(r, RecordMetadata) for r in results)
            assert all(r.partition == default_partition(b"k%d" % (i % 4), 3) for i, r in enumerate(results))
            assert [m.partition for m in await many] == [1] * 50
            assert futures[0].done() and futures[0].result() == results[0]
            assert (await producer.send_and_wait("t", b"last", partition=2)).partition == 2
            assert await producer.partitions_for("t") == [0, 1, 2]
        assert producer.closed and not producer._portal.running
        async with AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("t", p) for p in range(3)])
            got = []
            async for record in consumer:
                got.append(record.value)
                if len(got) == 251:
                    break
            expected = [b"v%d" % i for i in range(200)] + [b"m%d" % i for i in range(50)] + [b"last"]
            assert sorted(got) == sorted(expected)
            assert consumer.metrics()["consumer-fetch-manager-metrics"]["records-consumed-total"] == 251
            consumer.seek(TopicPartition("t", 1), 0)
            assert await consumer.position(TopicPartition("t", 1)) == 0
            by_partition = await consumer.getmany(timeout_ms=5000)
            assert set(by_partition) == {TopicPartition("t", 1)}
            assert await consumer.topics() == {"t"}
            assert await consumer.partitions_for_topic("t") == {0, 1, 2}
            assert await consumer.partitions_for_topic("nope") is None
            consumer.seek(TopicPartition("t", 2), 0)
            polled = await consumer.poll(timeout_ms=5000)
            assert dict(polled.items()) == {TopicPartition("t", 2): list(polled)}  # kafka-python's shape
            consumer.seek(TopicPartition("t", 1), 0)
            for _ in range(20):
                assert len(await consumer.poll(timeout_ms=5000, max_records=1)) == 1
            assert len(consumer._aio._fetcher.stats._queued) <= 3  # each poll records the last one's
            ends = await consumer.end_offsets([TopicPartition("t", 1)])
            assert ends[TopicPartition("t", 1)] == sum(1 for r in results if r.partition == 1) + 50
        assert not consumer._portal.running

    asyncio.run(main())


def test_cancelled_polls_lose_and_repeat_no_record(threaded_fake):
    """Polls cancelled at random moments (before, while and after records arrive): every
    record comes back exactly once, in order, and the consumer stays usable."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap
    rng = random.Random(7)

    async def main():
        async with AsyncConsumer(bootstrap, auto_offset_reset="earliest", max_poll_records=7,
                                 fetch_max_wait_ms=20) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            for _ in range(5):  # nothing there yet: cancelled while waiting
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(consumer.poll(timeout_ms=10_000), 0.02)
            async with AsyncProducer(bootstrap, linger_ms=0) as producer:
                for i in range(300):
                    await producer.send("t", b"%d" % i)
                await producer.flush(10)
            got, cancelled = [], 0
            while len(got) < 300:
                try:
                    got += await asyncio.wait_for(consumer.poll(timeout_ms=1000), rng.choice([0, 0.0005, 0.002, 1]))
                except asyncio.TimeoutError:
                    cancelled += 1
            assert [r.offset for r in got] == list(range(300))
            assert type(await consumer.poll(timeout_ms=10)) is ConsumerRecords
            assert cancelled > 0
            assert await consumer.poll(timeout_ms=50) == []

    asyncio.run(main())


def hold_first_poll(consumer, holding: threading.Event, go: threading.Event) -> None:
    """The consumer's next poll gets its records late: the Trio thread, holding them, sets
    ``holding`` and offers them only once ``go`` is set."""
    add_poll_waiter = consumer._aio.add_poll_waiter

    def held_first(limit, deliver):
        def late(outcome):
            holding.set()
            go.wait(10)
            deliver(outcome)
        consumer._aio.add_poll_waiter = add_poll_waiter
        add_poll_waiter(limit, late)

    consumer._aio.add_poll_waiter = held_first


def test_records_of_a_cancelled_poll_handed_over_late_come_before_the_next_polls(threaded_fake):
    """The Trio thread hands a cancelled poll's records over after the next poll started
    there (the two threads race): the late records still come first, none twice."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap
    go = threading.Event()

    async def main():
        async with AsyncConsumer(bootstrap, auto_offset_reset="earliest", max_poll_records=7,
                                 fetch_max_wait_ms=20) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            hold_first_poll(consumer, threading.Event(), go)  # its records reach it late
            first = asyncio.ensure_future(consumer.poll(timeout_ms=10_000))
            await asyncio.sleep(0.05)
            async with AsyncProducer(bootstrap, linger_ms=0) as producer:
                for i in range(20):
                    await producer.send("t", b"%d" % i)
                await producer.flush(10)
            first.cancel()
            second = asyncio.ensure_future(consumer.poll(timeout_ms=10_000))
            await asyncio.sleep(0)  # the second poll is waiting on the Trio thread
            go.set()
            got = list(await second)
            while len(got) < 20:
                got += await consumer.poll(timeout_ms=1000)
            assert [r.offset for r in got] == list(range(20))

    asyncio.run(main())


def _poll_left_before_its_records(threaded_fake, then):
    """40 records; a poll is cancelled (and has finished) while the Trio thread holds the
    records it took, which it offers only after; ``then(consumer, tp)`` runs after that."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap, tp = threaded_fake.cluster.bootstrap, TopicPartition("t", 0)
    holding, go = threading.Event(), threading.Event()

    async def main():
        async with AsyncProducer(bootstrap, linger_ms=0) as producer:
            await producer.send_many("t", [b"%d" % i for i in range(40)], partition=0)
            await producer.flush(10)
        async with AsyncConsumer(bootstrap, auto_offset_reset="earliest", max_poll_records=7,
                                 fetch_max_wait_ms=20) as consumer:
            consumer.assign([tp])
            hold_first_poll(consumer, holding, go)
            first = asyncio.ensure_future(consumer.poll(timeout_ms=10_000))
            assert await asyncio.get_running_loop().run_in_executor(None, holding.wait, 10)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            go.set()
            await then(consumer, tp)

    asyncio.run(main())


@pytest.mark.parametrize("revoked", [True, False], ids=["revoked", "still-assigned"])
def test_an_error_a_cancelled_poll_raised_late_is_dropped_once_its_partition_is_revoked(threaded_fake, revoked):
    """The Trio thread is stuck about to raise a partition's error for a poll that is then
    cancelled: the error, raised late, is for the next poll, unless its partition is no
    longer assigned by then (as the consumer drops any error of a partition it no longer has)."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 2)
    bootstrap = threaded_fake.cluster.bootstrap
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    stuck, released = threading.Event(), threading.Event()

    async def main():
        async with AsyncConsumer(bootstrap, group_id="g", enable_auto_commit=False,
                                 auto_offset_reset="none") as consumer:
            consumer.assign([t0, t1])
            consumer.seek(t0, 100)  # past the end: OFFSET_OUT_OF_RANGE, for poll to raise
            consumer.seek(t1, 0)
            deadline = time.monotonic() + 10
            while not consumer._aio._fetcher.errors and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            raise_pending = consumer._aio._raise_pending

            def stuck_then_raise():  # on the Trio thread
                if not stuck.is_set():
                    stuck.set()
                    assert released.wait(10)
                raise_pending()

            consumer._aio._raise_pending = stuck_then_raise
            first = asyncio.ensure_future(consumer.poll(timeout_ms=0))
            assert await asyncio.get_running_loop().run_in_executor(None, stuck.wait, 10)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            released.set()
            if revoked:
                consumer.assign([t1])
                assert await consumer.poll(timeout_ms=100) == []
            else:
                with pytest.raises(OffsetOutOfRangeError):
                    await consumer.poll(timeout_ms=100)

    asyncio.run(main())


def test_a_seek_after_a_cancelled_poll_is_not_undone_by_its_late_records(threaded_fake):
    async def then(consumer, tp):
        consumer.seek(tp, 30)
        assert [r.offset for r in await consumer.poll(timeout_ms=5000)] == list(range(30, 37))

    _poll_left_before_its_records(threaded_fake, then)


def test_a_pause_after_a_cancelled_poll_holds_its_late_records_back(threaded_fake):
    async def then(consumer, tp):
        consumer.pause(tp)
        assert await consumer.poll(timeout_ms=300) == []
        consumer.resume(tp)
        got = []
        while len(got) < 40:
            got += await consumer.poll(timeout_ms=5000)
        assert [r.offset for r in got] == list(range(40))

    _poll_left_before_its_records(threaded_fake, then)


def test_records_offered_as_their_poll_is_cancelled_count_as_not_consumed(threaded_fake):
    """The Trio thread offers the records, then the poll is cancelled before it wakes: the
    consumer's position and the next poll start at them."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap, tp = threaded_fake.cluster.bootstrap, TopicPartition("t", 0)
    offered = threading.Event()

    async def main():
        async with AsyncConsumer(bootstrap, auto_offset_reset="earliest", max_poll_records=7,
                                 fetch_max_wait_ms=20) as consumer:
            consumer.assign([tp])
            add_poll_waiter = consumer._aio.add_poll_waiter

            def noted_first(limit, deliver):
                def noted(outcome):
                    deliver(outcome)
                    offered.set()
                consumer._aio.add_poll_waiter = add_poll_waiter
                add_poll_waiter(limit, noted)

            consumer._aio.add_poll_waiter = noted_first
            first = asyncio.ensure_future(consumer.poll(timeout_ms=10_000))
            await asyncio.sleep(0.05)
            # a blocking producer: this loop runs nothing from here to the cancel, so the poll
            # is not woken (awaiting an asyncio producer's flush, it could be)
            with tidelog.Producer(bootstrap, linger_ms=0) as producer:
                producer.send_many("t", [b"%d" % i for i in range(20)], partition=0)
                producer.flush(10)
            assert offered.wait(10)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert await consumer.position(tp) == 0
            got = []
            while len(got) < 20:
                got += await consumer.poll(timeout_ms=5000)
            assert [r.offset for r in got] == list(range(20))

    asyncio.run(main())


def test_the_loop_runs_while_a_call_waits(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async with AsyncConsumer(bootstrap) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            task = asyncio.create_task(ticker())
            assert await consumer.poll(timeout_ms=300) == []
            task.cancel()
        assert ticks >= 3

    asyncio.run(main())


def test_wakeup_ends_a_waiting_poll_and_a_cancelled_group_poll_leaves_the_consumer_usable(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap

    async def main():
        async with AsyncConsumer(bootstrap) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            threading.Timer(0.2, consumer.wakeup).start()
            with pytest.raises(WakeupError):
                await consumer.poll(timeout_ms=10_000)
            assert await consumer.poll(timeout_ms=10) == []
        # the fake cluster has no group coordinator: a group's poll waits for one
        async with AsyncConsumer(bootstrap, group_id="g") as member:
            member.subscribe(["t"])
            for _ in range(3):
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(member.poll(timeout_ms=10_000), 0.1)
            assert await member.poll(timeout_ms=100) == []
            asyncio.get_running_loop().call_later(0.2, member.wakeup)
            with pytest.raises(WakeupError):
                await member.poll(timeout_ms=10_000)

    asyncio.run(main())


def test_topic_created_later_and_nothing_listening_give_bounded_answers(threaded_fake):
    bootstrap = threaded_fake.cluster.bootstrap

    async def main():
        async with AsyncProducer(bootstrap, max_block_ms=10_000) as producer:
            asyncio.get_running_loop().call_later(
                0.3, threading.Thread(target=threaded_fake.call, args=(threaded_fake.cluster.create_topic, "late", 1)).start)
            assert (await producer.send_and_wait("late", b"x")).offset == 0
        async with AsyncProducer(NOWHERE, max_block_ms=300, retry_backoff_ms=20) as producer:
            with pytest.raises(RequestTimedOut, match="not present in metadata after 300 ms"):
                await producer.send("t", b"x")
        async with AsyncConsumer(NOWHERE, retry_backoff_ms=20, request_timeout_ms=300) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            assert await consumer.poll(timeout_ms=100) == []
            with pytest.raises(RequestTimedOut):
                await consumer.end_offsets([TopicPartition("t", 0)], timeout_ms=300)
        async with AsyncAdmin(NOWHERE, retry_backoff_ms=20) as admin:
            with pytest.raises(TidelogError, match="127.0.0.1:1"):
                await admin.describe_cluster(timeout_ms=300)

    asyncio.run(main())


def test_the_trio_core_under_asyncio_names_the_asyncio_import():
    async def main():
        with pytest.raises(RuntimeError, match="from tidelog.asyncio import AsyncConsumer"):
            async with tidelog.aio.AsyncConsumer(NOWHERE):
                pass

    asyncio.run(main())


async def test_the_asyncio_facade_under_trio_names_the_trio_import():
    with pytest.raises(RuntimeError, match="from tidelog.aio import AsyncProducer"):
        async with AsyncProducer(NOWHERE):
            pass
    await trio.lowlevel.checkpoint()


def test_calls_before_start_and_after_close_say_so():
    async def main():
        consumer = AsyncConsumer(NOWHERE)
        with pytest.raises(RuntimeError, match="start the consumer first"):
            await consumer.poll()
        async with consumer:
            pass
        with pytest.raises(tidelog.ClientClosedError):
            await consumer.poll()
        async for _ in consumer:  # a closed consumer's iteration ends
            raise AssertionError("no record expected")

    asyncio.run(main())


def test_records_pending_when_the_producer_closes_fail_and_their_callbacks_run_on_the_loop():
    from tests.component.client.test_blocking import _fake_metadata

    async def main():
        loop_thread = threading.current_thread()
        called = []
        async with AsyncProducer(NOWHERE, linger_ms=0) as producer:
            producer._aio._cluster.metadata = _fake_metadata()  # pretend to know the topic
            future = await producer.send("t", b"v")
            with pytest.raises(asyncio.InvalidStateError):
                future.result()
            future.add_done_callback(lambda f: called.append((f.done(), threading.current_thread())))
            waiting = asyncio.ensure_future(future)  # a second waiter on the same batch
            await producer.close(timeout=0.2)
            with pytest.raises(tidelog.ClientClosedError):
                await future
            with pytest.raises(tidelog.ClientClosedError):
                await waiting
            assert isinstance(future.exception(), tidelog.ClientClosedError)
            with pytest.raises(tidelog.ClientClosedError):
                await producer.send("t", b"after")
        await asyncio.sleep(0)
        assert called == [(True, loop_thread)]

    asyncio.run(main())


def test_a_callback_for_a_loop_closed_before_it_ran_fails_instead_of_waiting_forever(threaded_fake):
    """A rebalance listener or commit callback is run on the application's loop; when that
    loop is closed before running it (asyncio.run ended without closing the consumer), the
    client's thread gets ClientClosedError instead of waiting for it forever."""
    bootstrap = threaded_fake.cluster.bootstrap
    loop = asyncio.new_event_loop()
    consumer = AsyncConsumer(bootstrap)
    loop.run_until_complete(consumer.start())
    ran = []
    call = consumer._portal.submit(consumer._callback_on_loop, ran.append, 1, timeout=None)
    for _ in range(1000):  # until the client's thread has scheduled it (bounded)
        if loop._ready:
            break
        time.sleep(0.01)
    loop.close()  # the callback was scheduled on it, and never runs
    with pytest.raises(ClientClosedError, match="event loop is closed"):
        call.future.result(timeout=30)
    assert ran == []
    consumer._portal.stop()


def test_wakeup_is_raised_before_records_getone_left(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap

    async def main():
        async with AsyncProducer(bootstrap, linger_ms=0) as producer:
            await producer.send_many("t", [b"%d" % i for i in range(5)], partition=0)
            await producer.flush(10)
        async with AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition("t", 0)])
            assert (await consumer.getone()).offset == 0  # 1-4 are left unreturned
            consumer.wakeup()
            with pytest.raises(WakeupError):
                await consumer.getone()
            assert [r.offset for r in await consumer.poll(timeout_ms=1000)] == [1, 2, 3, 4]

    asyncio.run(main())


def test_a_close_while_another_is_under_way_waits_for_it_without_error():
    """E.g. a record's callback starts ``producer.close()`` as a task and the application
    closes too: the second close waits for the first to end, and raises nothing."""
    from tests.component.client.test_blocking import _fake_metadata

    async def main():
        producer = AsyncProducer(NOWHERE, linger_ms=0)
        await producer.start()
        producer._aio._cluster.metadata = _fake_metadata()  # pretend to know the topic
        future = await producer.send("t", b"v")  # never delivered: the first close waits
        first = asyncio.ensure_future(producer.close(timeout=0.5))
        await asyncio.sleep(0)  # the first close is under way
        await producer.close()
        assert first.done() and first.exception() is None
        assert producer.closed and not producer._portal.running
        with pytest.raises(tidelog.ClientClosedError):
            await future

    asyncio.run(main())


def test_close_waits_for_async_commits_and_runs_their_callbacks_on_the_loop():
    from tests.component.client.test_group_facade import hold_commits

    async def main():
        consumer = AsyncConsumer(NOWHERE, group_id="g", enable_auto_commit=False)
        await consumer.start()
        tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
        consumer.assign([tp0, tp1])
        hold_commits(consumer)
        seen = []

        async def callback(offsets, error):
            seen.append((offsets, type(error).__name__ if error else None, threading.current_thread().name))

        consumer.commit_async({tp0: 5}, callback)
        consumer.commit_async({tp1: 7}, callback)
        await consumer.close(timeout=2)
        me = threading.current_thread().name
        assert seen == [({tp0: 5}, None, me), ({tp1: 7}, ClientClosedError.__name__, me)]

    asyncio.run(main())
