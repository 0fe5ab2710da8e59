"""The blocking facade in kafka-python's hands, against the fake cluster: deserializers,
positional topics without a group (every partition assigned), poll's records grouped by
partition (``items()``), ``topics()``,
``partitions_for_topic()``, ``metrics()``, a deserializer that fails (Kafka's rule: the
records before it are returned, then the error names the record and the partition stays at
it until a seek), and record futures' ``get`` / ``add_callback`` / ``add_errback``."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tidelog import Consumer, ConsumerRecords, Producer, RecordDeserializationError, TopicPartition


def poll_all(consumer: Consumer, count: int) -> ConsumerRecords:
    got = ConsumerRecords()
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(timeout_ms=200)
    return got


def test_positional_topics_deserializers_and_metadata_calls(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "orders", 2)
    threaded_fake.call(threaded_fake.cluster.create_topic, "payments", 1)
    bootstrap = threaded_fake.cluster.bootstrap
    with Producer(bootstrap_servers=bootstrap, key_serializer=str.encode,
                  value_serializer=lambda v: json.dumps(v).encode()) as producer:
        for i in range(6):
            producer.send("orders", {"n": i}, key=f"k{i}")
        producer.send("payments", {"n": 99}, key="p").get(timeout=10)
        producer.flush(10)
    with Consumer("orders", "payments", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                  key_deserializer=bytes.decode, value_deserializer=lambda b: json.loads(b)) as consumer:
        assert consumer.assignment() == {TopicPartition("orders", 0), TopicPartition("orders", 1),
                                         TopicPartition("payments", 0)}
        got = poll_all(consumer, 7)
        assert sorted((r.key, r.value["n"]) for r in got) == [(f"k{i}", i) for i in range(6)] + [("p", 99)]
        assert {"orders", "payments"} <= consumer.topics()
        assert consumer.partitions_for_topic("orders") == {0, 1}
        assert consumer.partitions_for_topic("nothing-here") is None
        polled = consumer.poll(timeout_ms=100)  # nothing left: still answers kafka-python's items()
        assert list(polled.items()) == [] and polled == []
        metrics = consumer.metrics()
        assert metrics["consumer-metrics"]["assigned-partitions"] == 3
        fetched = metrics["consumer-fetch-manager-metrics"]
        assert fetched["records-consumed-total"] == 7 and fetched["bytes-consumed-total"] > 0
        assert fetched["fetch-rate"] > 0 and fetched["records-lag-max"] == 0
        assert consumer.metrics["assigned_partitions"] == 3  # the flat gauges, as before


def test_bootstrap_as_the_first_argument_still_works(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Consumer(threaded_fake.cluster.bootstrap, "t", auto_offset_reset="earliest") as consumer:
        assert consumer.assignment() == {TopicPartition("t", 0)}


def test_a_failing_deserializer_names_the_record_and_keeps_the_partition_there(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap
    with Producer(bootstrap) as producer:
        for v in (b"1", b"2", b"bad", b"4"):
            producer.send("t", v)
        producer.flush(10)
    tp = TopicPartition("t", 0)
    with Consumer("t", bootstrap_servers=bootstrap, auto_offset_reset="earliest", value_deserializer=int) as consumer:
        first = poll_all(consumer, 2)
        assert [r.value for r in first] == [1, 2]
        assert [(tp, [r.value for r in rs]) for tp, rs in first.items()] == [(tp, [1, 2])]
        for _ in range(2):  # the next polls fail on the same record
            with pytest.raises(RecordDeserializationError) as failed:
                poll_all(consumer, 1)
            assert (failed.value.topic_partition, failed.value.offset) == (tp, 2)
            assert isinstance(failed.value.__cause__, ValueError)
            assert consumer.position(tp) == 2
        consumer.seek(tp, 3)
        assert [r.value for r in poll_all(consumer, 1)] == [4]


def test_record_futures_answer_get_and_chain_callbacks(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    seen: list = []
    done = threading.Event()
    with Producer(threaded_fake.cluster.bootstrap) as producer:
        future = producer.send("t", b"v")
        same = future.add_callback(lambda tag, md: seen.append((tag, md.offset)), "ok")
        assert same is future
        future.add_errback(lambda e: seen.append(("failed", e))).add_callback(lambda md: done.set())
        metadata = future.get(timeout=10)
        assert done.wait(10)
    assert seen == [("ok", metadata.offset)]


def test_producer_metrics_report_what_kafka_pythons_do(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Producer(threaded_fake.cluster.bootstrap, buffer_memory=1 << 20) as producer:
        for i in range(50):
            producer.send("t", b"v%d" % i)
        producer.flush(10)
        m = producer.metrics()["producer-metrics"]
        assert m["record-send-total"] == 50 and m["record-send-rate"] > 0
        assert m["batch-size-avg"] > 0 and m["request-latency-avg"] >= 0
        assert m["buffer-total-bytes"] == 1 << 20 and m["buffer-available-bytes"] == 1 << 20
        assert producer.metrics["buffer_used_bytes"] == 0  # the flat gauges, as before
