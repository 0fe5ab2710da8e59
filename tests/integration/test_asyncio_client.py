"""The asyncio client (tidelog.asyncio) against a real cluster: ZooKeeper and three broker
processes.

Acceptance (issue "Fit the user's habits", point 1): an asyncio application produces,
consumes in a group and commits; ``asyncio.wait_for`` around ``poll`` (and a cancelled task)
leaves the consumer usable, with no record lost or repeated. Each test runs its own asyncio
loop from a plain test (pytest runs in trio_mode).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, wait_topic_ready
from tidelog import ConsumerRebalanceListener, NewTopic, TopicPartition
from tidelog.asyncio import AsyncAdmin, AsyncConsumer, AsyncProducer

GROUP_CONFIG = dict(FAST_FAILOVER, **{"group.initial.rebalance.delay.ms": 300,
                                      "group.min.session.timeout.ms": 1000})
FAST_MEMBER = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300, "fetch_max_wait_ms": 100}
WAIT_S = 60


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("asyncio"), 3, GROUP_CONFIG)


def create_topic(cluster, name: str, partitions: int) -> None:
    async def main():
        async with AsyncAdmin(cluster.bootstrap) as admin:
            await admin.create_topics([NewTopic(name, partitions, 3)])
    asyncio.run(main())
    wait_topic_ready(cluster, name, partitions, 3)


async def produce(bootstrap: str, topic: str, count: int) -> list:
    """Half with ``send`` (keyed), half with ``send_many``; returns every RecordMetadata."""
    async with AsyncProducer(bootstrap, acks="all", linger_ms=5) as producer:
        futures = [await producer.send(topic, b"v%d" % i, key=b"k%d" % i) for i in range(count // 2)]
        many = await producer.send_many(topic, [b"v%d" % i for i in range(count // 2, count)],
                                        keys=[b"k%d" % i for i in range(count // 2, count)])
        return [await f for f in futures] + await many


def test_produce_consume_in_a_group_and_commit(cluster):
    create_topic(cluster, "orders", 6)
    bootstrap = cluster.bootstrap

    async def main():
        metadata = await produce(bootstrap, "orders", 600)
        assert len({(m.partition, m.offset) for m in metadata}) == 600
        main_thread = threading.current_thread()
        got: list = []
        done = asyncio.Event()
        events: list[tuple[str, int, bool]] = []

        async def member(name: str) -> None:
            consumer = AsyncConsumer(bootstrap, group_id="billing", enable_auto_commit=False,
                                     auto_offset_reset="earliest", **FAST_MEMBER)

            class Listener(ConsumerRebalanceListener):
                async def on_partitions_revoked(self, revoked):
                    events.append((name, len(revoked), threading.current_thread() is main_thread))
                    if revoked:
                        await consumer.commit()  # re-entrant: a call from inside poll's callback

                def on_partitions_assigned(self, assigned):
                    events.append((name, len(assigned), threading.current_thread() is main_thread))

            async with consumer:
                consumer.subscribe(["orders"], listener=Listener())
                while not done.is_set():
                    records = await consumer.poll(timeout_ms=200)
                    got.extend(records)
                    if records:
                        await consumer.commit()
                    if len(got) >= 600:
                        done.set()

        await asyncio.wait_for(asyncio.gather(member("a"), member("b")), WAIT_S)
        assert Counter((r.partition, r.offset) for r in got) == Counter((m.partition, m.offset) for m in metadata)
        assert events and all(on_main for _name, _n, on_main in events)
        async with AsyncAdmin(bootstrap) as admin:
            lags = await admin.list_group_offsets("billing")
            assert len(lags) == 6 and all(g.lag == 0 for g in lags)
            assert [g.group_id for g in await admin.list_groups()].count("billing") == 1
        async with AsyncConsumer(bootstrap, group_id="billing", **FAST_MEMBER) as again:
            again.subscribe(["orders"])
            for _ in range(10):  # joins, resumes at the committed offsets: nothing left to read
                assert await again.poll(timeout_ms=300) == []
            tps = [TopicPartition("orders", p) for p in range(6)]
            assert await again.committed(tps) == await again.end_offsets(tps)

    asyncio.run(main())


def test_wait_for_around_poll_and_cancelled_tasks_leave_the_consumer_usable(cluster):
    create_topic(cluster, "cancelled", 3)
    bootstrap = cluster.bootstrap
    rng = random.Random(11)

    async def main():
        metadata = await produce(bootstrap, "cancelled", 400)
        async with AsyncConsumer(bootstrap, group_id="impatient", enable_auto_commit=False,
                                 auto_offset_reset="earliest", max_poll_records=13, **FAST_MEMBER) as consumer:
            consumer.subscribe(["cancelled"])
            got, timeouts = [], 0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while len(got) < 400 and loop.time() < deadline:
                try:  # cancelled while joining, waiting, fetching and handing over records
                    got += await asyncio.wait_for(consumer.poll(timeout_ms=2000),
                                                  rng.choice([0.001, 0.005, 0.02, 0.1, 3]))
                except asyncio.TimeoutError:
                    timeouts += 1
                if rng.random() < 0.1:
                    task = asyncio.create_task(consumer.getone())
                    await asyncio.sleep(rng.choice([0, 0.001, 0.01]))
                    task.cancel()
                    try:
                        got.append(await task)
                    except asyncio.CancelledError:
                        pass
            assert timeouts > 0
            assert Counter((r.partition, r.offset) for r in got) == Counter((m.partition, m.offset) for m in metadata)
            await consumer.commit()
            tps = [TopicPartition("cancelled", p) for p in range(3)]
            assert await consumer.committed(tps) == await consumer.end_offsets(tps)
            assert await consumer.poll(timeout_ms=200) == []

    asyncio.run(main())


def test_records_of_a_cancelled_group_poll_returned_late_come_before_the_next_polls(cluster):
    """A group's poll runs as a call on the Trio thread; one whose caller was cancelled can
    return its records there after the next poll took more: they still come first, none
    twice (as tests/component/client/test_asyncio_facade.py shows for a poll without a group)."""
    create_topic(cluster, "late", 1)
    holding, go, second_returned = threading.Event(), threading.Event(), threading.Event()

    async def main():
        async with AsyncConsumer(cluster.bootstrap, group_id="late", auto_offset_reset="earliest",
                                 max_poll_records=7, **FAST_MEMBER) as consumer:
            consumer.assign([TopicPartition("late", 0)])
            poll, calls = consumer._aio.poll, []

            async def held(timeout_ms, limit):  # the first poll's records come back late
                calls.append(limit)
                records = await poll(timeout_ms, limit)
                if len(calls) == 1:
                    holding.set()
                    go.wait(WAIT_S)
                elif len(calls) == 2:
                    second_returned.set()
                return records

            consumer._aio.poll = held
            first = asyncio.ensure_future(consumer.poll(timeout_ms=WAIT_S * 1000))
            await produce(cluster.bootstrap, "late", 20)
            assert await asyncio.get_running_loop().run_in_executor(None, holding.wait, WAIT_S)
            first.cancel()
            second = asyncio.ensure_future(consumer.poll(timeout_ms=WAIT_S * 1000))
            await asyncio.sleep(0)  # the second poll is submitted to the Trio thread
            go.set()
            assert second_returned.wait(WAIT_S)  # this loop runs no callback meanwhile
            got = list(await second)
            while len(got) < 20:
                got += await consumer.poll(timeout_ms=1000)
            assert [r.offset for r in got] == list(range(20))

    asyncio.run(main())
