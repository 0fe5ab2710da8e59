"""A kafka-python program runs against a real cluster with only its imports changed.

Acceptance (issue "Fit the user's habits", point 2): ``kafka_python_app.py`` (serializers and
deserializers, positional topics, ``future.get``, ``add_callback`` / ``add_errback``, commits
of ``OffsetAndMetadata``, ``committed(tp, metadata=True)``, ``topics()``,
``partitions_for_topic()``, both ``metrics()``) is run with its import block replaced by
Tidelog's; every order comes back deserialized, and each partition's committed offset carries
the metadata string committed with it. Also: metadata over the broker's
``offset.metadata.max.bytes`` is refused with OFFSET_METADATA_TOO_LARGE.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cluster_fixtures import FAST_FAILOVER
from tests.support.cluster import cluster_fixture, wait_topic_ready
from tidelog import Admin, Consumer, NewTopic, OffsetAndMetadata, TidelogError, TopicPartition

APP = Path(__file__).with_name("kafka_python_app.py")
KAFKA_IMPORTS = ("from kafka import KafkaConsumer, KafkaProducer, TopicPartition\n"
                 "from kafka.structs import OffsetAndMetadata\n")
TIDELOG_IMPORTS = ("from tidelog import Consumer as KafkaConsumer, Producer as KafkaProducer, TopicPartition\n"
                   "from tidelog import OffsetAndMetadata\n")


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory):
    yield from cluster_fixture(request, tmp_path_factory.mktemp("kafka-python"), 1, {
        **FAST_FAILOVER, "offsets.topic.num.partitions": 3, "offsets.topic.replication.factor": 1,
        "group.initial.rebalance.delay.ms": 300, "offset.metadata.max.bytes": 64})


def create_topic(cluster, name: str, partitions: int) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topics([NewTopic(name, partitions, 1)])
    wait_topic_ready(cluster, name, partitions, 1)


def test_a_kafka_python_program_runs_with_only_its_imports_changed(cluster, tmp_path):
    source = APP.read_text()
    assert source.count(KAFKA_IMPORTS) == 1
    program = tmp_path / "app.py"
    program.write_text(source.replace(KAFKA_IMPORTS, TIDELOG_IMPORTS))
    create_topic(cluster, "orders", 3)
    count = 30
    run = subprocess.run([sys.executable, str(program), cluster.bootstrap, "orders", "billing", str(count)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(o[1] for o in seen["orders"]) == list(range(count + 1))
    assert all(key == "customer-%d" % (order % 3) and amount == (order * 10 if order < count else 0)
               for key, order, amount in seen["orders"])
    assert seen["delivered"] == count and seen["last"][0] == "orders" and seen["leftover"] == 0
    assert seen["topics"] == ["orders"] and seen["send_rate_positive"] and seen["fetch_metrics"]
    last_order = {}  # partition -> the metadata committed with its last record
    with Consumer("orders", bootstrap_servers=cluster.bootstrap) as c:
        ends = c.end_offsets([TopicPartition("orders", p) for p in range(3)])
    assert sum(ends.values()) == count + 1
    for p, (offset, offset_again, metadata) in seen["committed"].items():
        tp = TopicPartition("orders", int(p))
        assert offset == offset_again == ends[tp]
        if ends[tp]:
            last_order[int(p)] = metadata
    assert all(m.startswith("order-") for m in last_order.values()) and last_order


def test_metadata_over_the_brokers_limit_is_refused(cluster):
    create_topic(cluster, "audit", 1)
    tp = TopicPartition("audit", 0)
    with Consumer(bootstrap_servers=cluster.bootstrap, group_id="auditors") as consumer:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(0, "fits")})
        assert consumer.committed(tp, metadata=True) == OffsetAndMetadata(0, "fits", -1)
        with pytest.raises(TidelogError) as refused:
            consumer.commit({tp: OffsetAndMetadata(0, "x" * 65)})
        assert refused.value.error.name == "OFFSET_METADATA_TOO_LARGE"
        assert consumer.committed(tp, metadata=True).metadata == "fits"


def produce_values(cluster, topic: str, values: range) -> None:
    from tidelog import Producer
    with Producer(cluster.bootstrap) as producer:
        for v in values:
            producer.send(topic, value=str(v).encode(), partition=0)
        producer.flush()


def test_assign_with_a_group_starts_at_the_groups_committed_offset(cluster):
    """Kafka's rule: manually assigned partitions of a consumer with a group_id start at the
    group's committed offset; auto_offset_reset is only for a partition without one."""
    create_topic(cluster, "assigned", 1)
    tp = TopicPartition("assigned", 0)
    produce_values(cluster, "assigned", range(10))
    with Consumer(cluster.bootstrap, group_id="manual", auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        consumer.commit({tp: OffsetAndMetadata(4, "")})
    with Consumer(cluster.bootstrap, group_id="manual", auto_offset_reset="latest") as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 4
        records = []
        for _ in range(50):
            records += [r for batch in consumer.poll(200).values() for r in batch]
            if len(records) >= 6:
                break
        assert [int(r.value) for r in records] == list(range(4, 10))


def test_iterating_consumes_record_by_record(cluster):
    """kafka-python's iterator: a record counts as consumed once yielded. A commit inside
    the loop commits up to the record in hand, not the whole batch the poll fetched; a seek
    inside the loop is the next record yielded; close commits what was yielded."""
    create_topic(cluster, "iterated", 1)
    tp = TopicPartition("iterated", 0)
    produce_values(cluster, "iterated", range(20))
    with Consumer(cluster.bootstrap, group_id="iterating", auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        consumer.assign([tp])
        seen = []
        for record in consumer:
            seen.append(record.offset)
            if record.offset == 2:
                consumer.commit()
                assert consumer.committed(tp) == 3 and consumer.position(tp) == 3
            if record.offset == 5 and seen.count(5) == 1:
                consumer.seek(tp, 1)
            if record.offset == 7 and seen.count(7) == 1:
                break
        assert seen == [0, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 6, 7]
        assert consumer.position(tp) == 8
        consumer.commit()
        assert consumer.committed(tp) == 8
    with Consumer(cluster.bootstrap, group_id="iterating-auto", auto_offset_reset="earliest",
                  enable_auto_commit=True) as consumer:
        consumer.assign([tp])
        for record in consumer:
            if record.offset == 3:
                break
    with Consumer(cluster.bootstrap, group_id="iterating-auto") as consumer:
        assert consumer.committed(tp) == 4  # close's commit: up to the record in hand


def test_the_asyncio_iterator_consumes_record_by_record(cluster):
    import asyncio

    from tidelog.asyncio import AsyncConsumer

    create_topic(cluster, "iterated-aio", 1)
    tp = TopicPartition("iterated-aio", 0)
    produce_values(cluster, "iterated-aio", range(10))

    async def main():
        async with AsyncConsumer(cluster.bootstrap, group_id="aio", auto_offset_reset="earliest",
                                 enable_auto_commit=False) as consumer:
            consumer.assign([tp])
            first = await consumer.getone()
            assert first.offset == 0 and await consumer.position(tp) == 1
            await consumer.commit()
            assert await consumer.committed(tp) == 1
            consumer.seek(tp, 5)
            offsets = []
            async for record in consumer:
                offsets.append(record.offset)
                if record.offset == 9:
                    break
            assert offsets == [5, 6, 7, 8, 9]

    asyncio.run(main())
