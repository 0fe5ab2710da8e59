"""AsyncConsumer against the fake cluster: positions, resets, long polls, pipelining,
leader changes and offset lookups."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from tidelog.aio import AsyncConsumer, TopicPartition
from tidelog.errors import NoOffsetForPartitionError, RequestTimedOut, WakeupError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    NOT_LEADER_OR_FOLLOWER,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
    OffsetOutOfRangeError,
    TidelogError,
)
from tidelog.protocol.records import build_batch

T0 = TopicPartition("t", 0)
T1 = TopicPartition("t", 1)


def fill(fake, tp=T0, values=(), timestamp_ms=1000, per_batch=5):
    """Append records straight into the fake's log, ``per_batch`` to a batch."""
    log = fake.log(tp.topic, tp.partition)
    values = list(values)
    for i in range(0, len(values), per_batch):
        chunk = values[i:i + per_batch]
        log.append(build_batch([(None, v, None, timestamp_ms + i + j) for j, v in enumerate(chunk)]))
    fake._notify()


async def poll_until(consumer, n, timeout=5.0):
    got = []
    with trio.fail_after(timeout):
        while len(got) < n:
            got += await consumer.poll(timeout_ms=200)
    return got


def values(records):
    return [r.value for r in records]


@pytest.fixture
def topic(fake):
    fake.create_topic("t", 2, leaders=[0, 1])
    fill(fake, T0, [b"a%d" % i for i in range(12)])
    fill(fake, T1, [b"b%d" % i for i in range(3)])
    return fake


async def test_earliest_reads_everything_from_every_assigned_partition(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0, T1])
        assert consumer.assignment() == {T0, T1}
        got = await poll_until(consumer, 15)
        assert [r.offset for r in got if r.partition == 0] == list(range(12))
        assert values(r for r in got if r.partition == 1) == [b"b0", b"b1", b"b2"]
        assert got[0].timestamp >= 1000 and got[0].topic == "t"
        assert await consumer.position(T0) == 12


async def test_latest_starts_at_the_end_and_a_long_poll_waits_for_new_records(topic):
    async with AsyncConsumer(topic.bootstrap, fetch_max_wait_ms=2000) as consumer:
        consumer.assign([T0])
        assert await consumer.position(T0) == 12
        assert await consumer.poll(timeout_ms=100) == []
        fill(topic, T0, [b"new"])
        started = trio.current_time()
        got = await poll_until(consumer, 1)
        assert values(got) == [b"new"] and got[0].offset == 12
        assert trio.current_time() - started < 1.5  # woken by the data, not by max_wait


async def test_a_compacted_gap_is_passed_in_a_partition_that_is_not_first_in_the_fetch(topic):
    # t-1's offsets 3-6 were cleaned away at the end of its log: nothing lies between its
    # position and the high watermark. Only a fetch with t-1 first can tell (the broker
    # returns a batch for the first partition whenever one lies below the HW), so the
    # consumer puts it first after an empty answer and then moves its position to the HW.
    topic.move_leader("t", 1, 0)  # both partitions in one fetch request
    topic.log("t", 1).log_end_offset = 7
    async with AsyncConsumer(topic.bootstrap, fetch_max_wait_ms=50) as consumer:
        consumer.assign([T0, T1])
        consumer.seek(T0, 12)  # t-0 at its end: first in every fetch, with nothing to return
        consumer.seek(T1, 3)
        with trio.fail_after(5):
            while await consumer.position(T1) != 7:
                assert await consumer.poll(timeout_ms=50) == []
        fill(topic, T1, [b"after the gap"])
        assert [(r.offset, r.value) for r in await poll_until(consumer, 1)] == [(7, b"after the gap")]


async def test_seek_reads_from_the_middle_of_a_batch(topic):
    async with AsyncConsumer(topic.bootstrap) as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 7)  # batch [5, 10): records 5 and 6 are skipped client-side
        got = await poll_until(consumer, 5)
        assert [r.offset for r in got] == [7, 8, 9, 10, 11]
        assert await consumer.position(T0) == 12


async def test_a_seek_discards_data_fetched_for_the_old_position(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", max_poll_records=2) as consumer:
        consumer.assign([T0])
        assert [r.offset for r in await poll_until(consumer, 2)] == [0, 1]
        consumer.seek(T0, 10)
        got = await poll_until(consumer, 2)
        assert [r.offset for r in got] == [10, 11]


async def test_seek_to_beginning_and_end(topic):
    async with AsyncConsumer(topic.bootstrap) as consumer:
        consumer.assign([T0, T1])
        consumer.seek_to_beginning(T1)
        assert await consumer.position(T1) == 0
        consumer.seek_to_end()
        assert (await consumer.position(T0), await consumer.position(T1)) == (12, 3)
        consumer.seek_to_beginning()
        got = await poll_until(consumer, 15)
        assert len(got) == 15


async def test_a_paused_partition_is_neither_fetched_nor_returned_until_resumed(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0, T1])
        consumer.pause(T0)
        assert consumer.paused() == {T0}
        assert values(await poll_until(consumer, 3)) == [b"b0", b"b1", b"b2"]
        fill(topic, T0, [b"while paused"])
        assert await consumer.poll(timeout_ms=300) == []
        assert not any(p.partition == 0 for r in topic.sent(ApiKey.FETCH)
                       for t in r.topics for p in t.partitions)  # t-0 was never fetched
        assert await consumer.position(T0) == 0
        consumer.resume(T0)
        assert consumer.paused() == set()
        got = await poll_until(consumer, 13)
        assert [r.offset for r in got] == list(range(13)) and got[-1].value == b"while paused"
        with pytest.raises(ValueError, match="not assigned"):
            consumer.pause(TopicPartition("other", 0))


async def test_resume_wakes_a_poll_waiting_for_the_records_of_the_paused_partition(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", max_poll_records=1) as consumer:
        consumer.assign([T1])
        assert values(await poll_until(consumer, 1)) == [b"b0"]  # b1 and b2 stay buffered
        consumer.pause(T1)
        assert await consumer.poll(timeout_ms=100) == []

        async def resume_soon():
            await trio.sleep(0.1)
            consumer.resume(T1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(resume_soon)
            started = trio.current_time()
            got = await consumer.poll(timeout_ms=5000)
        assert values(got) == [b"b1"] and trio.current_time() - started < 4  # woken, not timed out


async def test_wakeup_ends_a_waiting_poll_and_records_stay_for_the_next(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="latest") as consumer:
        consumer.assign([T0])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_call_later, 0.1, consumer.wakeup)
            started = trio.current_time()
            with pytest.raises(WakeupError):
                await consumer.poll(timeout_ms=5000)
            assert trio.current_time() - started < 4
        fill(topic, T0, [b"after"])
        assert values(await poll_until(consumer, 1)) == [b"after"]


async def _call_later(delay_s, fn):
    await trio.sleep(delay_s)
    fn()


async def test_max_poll_records_bounds_each_poll(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", max_poll_records=4) as consumer:
        consumer.assign([T0])
        sizes = []
        with trio.fail_after(5):
            while sum(sizes) < 12:
                if batch := await consumer.poll(timeout_ms=200):
                    sizes.append(len(batch))
        assert max(sizes) <= 4
        assert await consumer.poll(timeout_ms=5, max_records=1) == []


async def test_fetches_are_pipelined_while_the_application_works(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", max_poll_records=12) as consumer:
        consumer.assign([T0])
        await poll_until(consumer, 12)  # drains the buffer: the next fetch goes out at once
        fetches = len(topic.sent(ApiKey.FETCH))
        await trio.sleep(0.05)  # "processing", no poll
        assert len(topic.sent(ApiKey.FETCH)) == fetches + 1
        fill(topic, T0, [b"next"])
        assert values(await poll_until(consumer, 1)) == [b"next"]


async def test_auto_offset_reset_none_needs_a_seek(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        with pytest.raises(NoOffsetForPartitionError, match="t-0"):
            await consumer.poll(timeout_ms=10)
        with pytest.raises(NoOffsetForPartitionError):
            await consumer.position(T0)
        consumer.seek(T0, 11)
        assert values(await poll_until(consumer, 1)) == [b"a11"]


async def test_out_of_range_is_reset_by_policy(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 500)
        got = await poll_until(consumer, 12)
        assert got[0].offset == 0


async def test_out_of_range_is_raised_with_reset_none_and_the_partition_waits_for_a_seek(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="none") as consumer:
        consumer.assign([T0])
        consumer.seek(T0, 500)
        with trio.fail_after(5):
            with pytest.raises(OffsetOutOfRangeError, match="t-0 at offset 500"):
                while True:
                    await consumer.poll(timeout_ms=200)
        assert await consumer.poll(timeout_ms=50) == []
        consumer.seek(T0, 0)
        assert len(await poll_until(consumer, 12)) == 12


async def test_a_leader_change_is_followed(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=10) as consumer:
        consumer.assign([T0])
        await poll_until(consumer, 12)
        topic.move_leader("t", 0, 1)
        fill(topic, T0, [b"after"])
        assert values(await poll_until(consumer, 1)) == [b"after"]
    assert {node for node, key, _ in topic.requests if key == ApiKey.FETCH} >= {0, 1}


async def test_injected_fetch_errors_are_retried(topic):
    topic.inject(ApiKey.FETCH, error_code=NOT_LEADER_OR_FOLLOWER.code, count=2)
    topic.inject(ApiKey.FETCH, drop_connection=True)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=10) as consumer:
        consumer.assign([T0])
        assert len(await poll_until(consumer, 12)) == 12


async def test_beginning_end_offsets_and_offsets_for_times(topic):
    async with AsyncConsumer(topic.bootstrap) as consumer:
        assert await consumer.beginning_offsets([T0, T1]) == {T0: 0, T1: 0}
        assert await consumer.end_offsets([T0, T1]) == {T0: 12, T1: 3}
        found = await consumer.offsets_for_times({T0: 1007, T1: 99999})
        assert found[T0] == (7, 1007) and found[T1] is None


async def test_offset_lookups_retry_stale_metadata(topic):
    topic.inject(ApiKey.LIST_OFFSETS, error_code=NOT_LEADER_OR_FOLLOWER.code, count=2)
    async with AsyncConsumer(topic.bootstrap, retry_backoff_ms=10) as consumer:
        assert await consumer.end_offsets([T0]) == {T0: 12}


async def test_offset_lookups_for_an_unknown_topic_time_out(topic):
    async with AsyncConsumer(topic.bootstrap, retry_backoff_ms=10) as consumer:
        with trio.fail_after(5):
            with pytest.raises(RequestTimedOut, match="UNKNOWN_TOPIC_OR_PARTITION"):
                await consumer.end_offsets([TopicPartition("nope", 0)], timeout_ms=300)


async def test_async_iteration(topic):
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T1])
        seen = []
        with trio.fail_after(5):
            async for record in consumer:
                seen.append(record.value)
                if len(seen) == 3:
                    break
        assert seen == [b"b0", b"b1", b"b2"]


async def test_unassigned_partitions_and_groups_are_refused(topic):
    async with AsyncConsumer(topic.bootstrap) as consumer:
        with pytest.raises(ValueError, match="not assigned"):
            consumer.seek(T0, 1)
        with pytest.raises(ValueError, match="needs a consumer group"):
            consumer.subscribe(["t"])


async def test_poll_after_close_is_refused(topic):
    consumer = AsyncConsumer(topic.bootstrap)
    async with consumer:
        pass
    with pytest.raises(TidelogError):
        await consumer.poll()


# -- a broker's error answers never end the consumer ---------------------------------------------


async def test_a_fetch_refused_as_a_whole_is_retried_and_the_consumer_lives_on(topic):
    """A Fetch answered with an error body (UNKNOWN_SERVER_ERROR: the broker's handler failed)
    is retried after a backoff, as Kafka's fetcher does; the consumer is not closed by it."""
    topic.inject(ApiKey.FETCH, error_code=UNKNOWN_SERVER_ERROR.code, whole_request=True, count=2)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0, T1])
        got = await poll_until(consumer, 15)
        assert sorted(values(r for r in got if r.partition == 1)) == [b"b0", b"b1", b"b2"]


async def test_an_offset_reset_refused_as_a_whole_is_retried(topic):
    topic.inject(ApiKey.LIST_OFFSETS, error_code=UNKNOWN_SERVER_ERROR.code, whole_request=True, count=2)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T1])
        assert values(await poll_until(consumer, 3)) == [b"b0", b"b1", b"b2"]


async def test_offset_lookups_refused_as_a_whole_raise_the_brokers_error(topic):
    """Not an ExceptionGroup out of the requests to each leader: the error the broker sent."""
    async with AsyncConsumer(topic.bootstrap) as consumer:
        topic.inject(ApiKey.LIST_OFFSETS, error_code=TOPIC_AUTHORIZATION_FAILED.code, whole_request=True)
        with pytest.raises(TidelogError, match="Not authorized"):
            await consumer.end_offsets([T0], timeout_ms=2000)
        consumer.assign([T1])
        # two: the fetcher's own reset of T1 may take one first (and retry after a backoff)
        topic.inject(ApiKey.LIST_OFFSETS, error_code=TOPIC_AUTHORIZATION_FAILED.code, whole_request=True, count=2)
        consumer.seek_to_end(T1)
        with pytest.raises(TidelogError, match="Not authorized"):
            await consumer.position(T1, timeout_ms=2000)
        assert await consumer.end_offsets([T1]) == {T1: 3}


async def test_a_refused_offset_reset_is_retried_after_a_backoff_and_raised_once_per_poll(topic):
    """As Kafka's requestFailed: a reset refused for good (TOPIC_AUTHORIZATION_FAILED) is
    retried every retry_backoff_ms, not in a hot loop, and poll raises it, one error kept
    however many retries failed meanwhile; once the ACL is granted the partition starts."""
    refused = topic.inject(ApiKey.LIST_OFFSETS, error_code=TOPIC_AUTHORIZATION_FAILED.code, count=math.inf)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=200) as consumer:
        started = trio.current_time()
        consumer.assign([T1])
        with pytest.raises(TidelogError, match="TOPIC_AUTHORIZATION_FAILED"):
            await consumer.poll(timeout_ms=5000)
        await trio.sleep(0.6)
        attempts = len(topic.sent(ApiKey.LIST_OFFSETS))
        assert attempts <= (trio.current_time() - started) / 0.2 + 2
        assert len(consumer._fetcher.errors) <= 1
        with pytest.raises(TidelogError, match="TOPIC_AUTHORIZATION_FAILED"):
            await consumer.poll(timeout_ms=5000)
        refused.count = refused.hits  # the ACL granted
        assert values(await poll_until(consumer, 3)) == [b"b0", b"b1", b"b2"]


async def test_a_partition_refused_by_a_fetch_resumes_once_authorized(topic):
    """As Kafka: TOPIC_AUTHORIZATION_FAILED in a fetch answer is raised by poll and the
    partition is fetched again after a backoff: an ACL granted a moment later resumes it,
    without a seek (it stalled for good before)."""
    topic.inject(ApiKey.FETCH, error_code=TOPIC_AUTHORIZATION_FAILED.code, count=1)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T1])
        with pytest.raises(TidelogError, match="TOPIC_AUTHORIZATION_FAILED"):
            await poll_until(consumer, 1)
        assert values(await poll_until(consumer, 3)) == [b"b0", b"b1", b"b2"]


async def test_an_unknown_server_error_of_a_partition_is_retried_without_raising(topic):
    topic.inject(ApiKey.FETCH, error_code=UNKNOWN_SERVER_ERROR.code, count=2)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T1])
        assert values(await poll_until(consumer, 3)) == [b"b0", b"b1", b"b2"]


async def wait_for_pending_error(consumer):
    with trio.fail_after(5):
        while not consumer._fetcher.errors:
            await trio.sleep(0.01)


async def test_an_error_of_a_partition_no_longer_assigned_is_not_raised(topic):
    """As Kafka drops the fetches of partitions no longer assigned: an error that arrived for
    a partition the application then unassigned is not raised by a later poll."""
    topic.inject(ApiKey.FETCH, error_code=TOPIC_AUTHORIZATION_FAILED.code, count=1)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T0])
        await wait_for_pending_error(consumer)
        consumer.assign([T1])
        assert values(await poll_until(consumer, 3)) == [b"b0", b"b1", b"b2"]


async def test_an_error_from_before_a_seek_is_not_raised(topic):
    topic.inject(ApiKey.FETCH, error_code=TOPIC_AUTHORIZATION_FAILED.code, count=1)
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([T1])
        await wait_for_pending_error(consumer)
        consumer.seek(T1, 1)
        assert values(await poll_until(consumer, 2)) == [b"b1", b"b2"]


async def test_no_fetch_is_planned_for_a_throttled_node_before_its_throttle_ends(topic):
    # Kafka's NetworkClient: a node whose throttle has not passed is not ready; a fetch planned
    # at the throttle's start would hold its partitions, positions and assignment as they were
    topic.inject(ApiKey.FETCH, node=0, throttle_ms=3_600_000)  # a pause the test ends
    async with AsyncConsumer(topic.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        try:
            consumer.assign([T0])
            assert values(await poll_until(consumer, 12)) == [b"a%d" % i for i in range(12)]
            conn = consumer._cluster.open_connection(0)
            assert conn.throttled_until > trio.current_time()
            await trio.testing.wait_all_tasks_blocked()
            assert not consumer._fetcher._fetching_nodes  # nothing waits to be sent to node 0
            consumer.seek(T0, 3)
            await trio.testing.wait_all_tasks_blocked()
            assert not consumer._fetcher._fetching_nodes
            conn.throttled_until = trio.current_time()  # the throttle ends
            consumer._fetcher.wake()
            assert values(await poll_until(consumer, 9)) == [b"a%d" % i for i in range(3, 12)]
        finally:
            await consumer.close()
