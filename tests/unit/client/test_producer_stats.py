"""The clients' metrics (tidelog.aio.stats), with time passed in: sampled windows
as Kafka's (a new window each ``window_s``, the oldest dropped), rates over the time the
windows cover but at least ``(samples - 1) * window_s``, and kafka-python's names."""

from __future__ import annotations

import threading

import tidelog.aio.stats as stats_module
from tidelog.aio.stats import ConsumerStats, ProducerStats, Sampled


def test_sampled_windows_roll_and_old_values_drop_out():
    s = Sampled(window_s=10, samples=2)
    s.record(4, now=0)
    s.record(8, now=5)
    assert (s.avg(5), s.max(5)) == (6, 8)
    s.record(2, now=12)  # a second window
    assert (s.avg(12), s.max(12)) == (14 / 3, 8)
    s.record(1, now=25)  # a third: the first is dropped
    assert (s.avg(25), s.max(25)) == (1.5, 2)
    assert (s.avg(100), s.max(100), s.rate(100)) == (0.0, 0.0, 0.0)  # nothing recent
    assert s.cumulative == 15


def test_a_rate_is_spread_over_at_least_one_full_window():
    s = Sampled(window_s=30, samples=2)
    s.record(300, now=0)
    assert s.rate(1) == 10  # 300 over 30 s, not over 1 s
    s.record(300, now=40)
    assert s.rate(60) == 10  # 600 over the 60 s the two windows cover
    assert s.count_rate(60) == 2 / 60



class Batch:
    def __init__(self, records: int, size: int, created: float):
        self.payload, self.created, self._n = b"x" * size, created, records

    def __len__(self) -> int:
        return self._n


def test_producer_metrics_have_kafka_pythons_names_and_meanings():
    stats = ProducerStats(window_s=30, samples=2)
    stats.on_request(10.0, [Batch(10, 1000, 9.9), Batch(30, 3000, 9.5)])
    stats.on_response(10.2, 0.2)
    stats.on_request(20.0, [Batch(20, 2000, 19.9)])
    stats.on_response(20.1, 0.1)
    stats.on_retry(20.1, 5)
    stats.on_error(20.1, 2)
    m = stats.producer_metrics(40.0, buffer_total=100, buffer_used=30)
    assert m["record-send-total"] == 60 and m["record-send-rate"] == 60 / 30
    assert m["records-per-request-avg"] == 30 and m["request-rate"] == 2 / 30
    assert (m["batch-size-avg"], m["batch-size-max"], m["record-size-avg"]) == (2000, 3000, 100)
    assert abs(m["request-latency-avg"] - 150) < 1e-6 and abs(m["request-latency-max"] - 200) < 1e-6
    assert abs(m["record-queue-time-max"] - 500) < 1e-6
    assert (m["record-retry-rate"], m["record-error-total"]) == (5 / 30, 2)
    assert (m["buffer-total-bytes"], m["buffer-available-bytes"]) == (100, 70)


def test_consumer_metrics_have_kafka_pythons_fetch_manager_names():
    stats = ConsumerStats(window_s=30, samples=2)
    stats.on_fetch(10.0, 0.05, 3000)
    stats.on_fetch(11.0, 0.15, 0)  # an empty long poll is a fetch too
    stats.on_consumed(11.0, 40)
    m = stats.consumer_metrics(40.0)
    assert m["fetch-rate"] == 2 / 30 and abs(m["fetch-latency-avg"] - 100) < 1e-6
    assert abs(m["fetch-latency-max"] - 150) < 1e-6
    assert (m["fetch-size-avg"], m["fetch-size-max"], m["bytes-consumed-total"]) == (1500, 3000, 3000)
    assert m["bytes-consumed-rate"] == 100 and m["records-consumed-rate"] == 40 / 30
    assert m["records-consumed-total"] == 40


def test_consumer_values_are_queued_and_recorded_at_the_time_they_were_measured():
    stats = ConsumerStats(window_s=30, samples=2)
    stats.on_fetch(10.0, 0.05, 3000)
    stats.on_consumed(10.0, 40)
    assert stats.records.cumulative == 0  # queued, off the path of the records
    stats.settle()
    assert (stats.records.cumulative, stats.fetch_bytes.cumulative) == (40, 3000)
    stats.on_consumed(100.0, 2)  # in a later window: the older ones are out of it
    assert stats.consumer_metrics(100.0)["records-consumed-rate"] == 2 / 30


def test_queued_consumer_values_are_bounded_without_a_reader():
    stats = ConsumerStats()
    for i in range(5000):
        stats.on_consumed(float(i), 1)
    assert len(stats._queued) < stats_module.SETTLE_AT
    assert stats.records.cumulative + len(stats._queued) == 5000


def test_settling_from_two_threads_records_every_value_once():
    stats = ConsumerStats()
    for i in range(2000):
        stats.on_fetch(1.0, 0.001, 1)

    def settle():
        for _ in range(50):
            stats.settle()

    threads = [threading.Thread(target=settle) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.fetch_bytes.cumulative == 2000
