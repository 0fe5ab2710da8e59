"""The blocking facade (client.Producer/Consumer/Admin): a round trip with the fake cluster on
its own thread, bounded errors when nothing listens, Ctrl-C, and thread lifecycle."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time

import pytest

from tidelog import (
    Admin,
    ClientClosedError,
    Consumer,
    NewTopic,
    Producer,
    RecordMetadata,
    RequestTimedOut,
    TidelogError,
    TopicPartition,
    WakeupError,
)
from tidelog.aio import producer as producer_module
from tidelog.aio.connection import BrokerConnection
from tidelog.aio.partitioner import default_partition
from tidelog.errors import OffsetOutOfRangeError
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NOT_LEADER_OR_FOLLOWER
from tidelog.protocol.records import iter_headers

NOWHERE = "127.0.0.1:1"


def test_round_trip(threaded_fake):
    bootstrap = threaded_fake.cluster.bootstrap
    with Admin(bootstrap) as admin:
        admin.create_topics([NewTopic("t", 3)])
        assert admin.list_topics() == ["t"]
    with Producer(bootstrap, linger_ms=2) as producer:
        futures = [producer.send("t", b"v%d" % i, key=b"k%d" % (i % 4)) for i in range(200)]
        producer.flush(timeout=10)
        results = [f.result(5) for f in futures]
        assert all(isinstance(r, RecordMetadata) for r in results)
        assert all(r.partition == default_partition(b"k%d" % (i % 4), 3) for i, r in enumerate(results))
        assert producer.partitions_for("t") == [0, 1, 2]
    assert not producer._portal.running and producer.closed
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("t", p) for p in range(3)])
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 200 and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=200)
        assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(200))
        assert consumer.end_offsets([TopicPartition("t", 0)])[TopicPartition("t", 0)] == \
            sum(1 for r in results if r.partition == 0)
        consumer.seek(TopicPartition("t", 1), 0)
        assert consumer.position(TopicPartition("t", 1)) == 0
    assert not consumer._portal.running


def test_iteration_stops_after_consumer_timeout(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap
    with Producer(bootstrap) as producer:
        for i in range(5):
            producer.send("t", b"%d" % i)
    with Consumer(bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=300) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        assert [r.value for r in consumer] == [b"0", b"1", b"2", b"3", b"4"]


def test_pause_and_resume_from_the_blocking_consumer(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap
    tp = TopicPartition("t", 0)
    with Producer(bootstrap) as producer:
        for i in range(5):
            producer.send("t", b"%d" % i)
    with Consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=2) as consumer:
        consumer.assign([tp])
        got = []
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=200)
        consumer.pause(tp)
        assert consumer.paused() == {tp}
        assert consumer.poll(timeout_ms=300) == []  # the rest is fetched, but held back
        consumer.resume(tp)
        assert consumer.paused() == set()
        while len(got) < 5 and time.monotonic() < deadline:
            got += consumer.poll(timeout_ms=200)
        assert [r.value for r in got] == [b"0", b"1", b"2", b"3", b"4"]


def test_wakeup_from_another_thread_ends_a_waiting_poll(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Consumer(threaded_fake.cluster.bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("t", 0)])
        timer = threading.Timer(0.2, consumer.wakeup)
        started = time.monotonic()
        timer.start()
        with pytest.raises(WakeupError, match="wakeup"):
            consumer.poll(timeout_ms=10_000)
        assert time.monotonic() - started < 5  # woken, not timed out
        assert consumer.poll(timeout_ms=10) == []  # once: the next poll is an ordinary one
        consumer.wakeup()  # with no poll waiting, the next poll raises at once
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=10_000)
    consumer.wakeup()  # closed: nothing to wake, no error


def test_wakeup_ends_a_group_members_poll_waiting_for_its_coordinator(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)  # the fake has no coordinator
    with Consumer(threaded_fake.cluster.bootstrap, group_id="g") as consumer:
        consumer.subscribe(["t"])
        threading.Timer(0.3, consumer.wakeup).start()
        started = time.monotonic()
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=10_000)
        assert time.monotonic() - started < 5  # woken, not at the poll's deadline
        consumer.wakeup()  # pending before the poll: raised before any group work
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=10_000)
        assert consumer.poll(timeout_ms=200) == []  # then an ordinary poll again (waits its time)


def test_many_threads_share_one_producer(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 2)
    futures, lock = [], threading.Lock()
    with Producer(threaded_fake.cluster.bootstrap, linger_ms=1, batch_size=2048) as producer:
        def work(n):
            mine = [producer.send("t", b"%d-%d" % (n, i), partition=0) for i in range(300)]
            with lock:
                futures.extend(mine)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    offsets = sorted(f.result(0).offset for f in futures)
    assert offsets == list(range(1200))


def send_from_threads(producer: Producer, per_thread: int, wait_every: int, threads: int = 3) -> dict:
    """Each of ``threads`` threads sends ``per_thread`` records ``b"n-i"`` to partition 0 of
    "t", waiting for every ``wait_every``-th to be acknowledged (so that now and then the
    sender is idle again when the next comes); the futures by ``(n, i)``."""
    futures, lock = {}, threading.Lock()

    def work(n):
        for i in range(per_thread):
            f = producer.send("t", b"%d-%d" % (n, i), partition=0)
            with lock:
                futures[(n, i)] = f
            if i % wait_every == 0:
                f.result(20)

    running = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    return futures


def test_requests_written_from_the_application_threads_lose_and_repeat_nothing(threaded_fake):
    # acks=1 and linger_ms 0: a send that finds the sender idle writes the request itself
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Producer(threaded_fake.cluster.bootstrap, acks=1, linger_ms=0) as producer:
        futures = send_from_threads(producer, 150, wait_every=3)
        producer.flush(10)
    # (not their order: the fake broker appends pipelined requests in the order its tasks run)
    assert sorted(f.result(0).offset for f in futures.values()) == list(range(450))


def wait_until_accounted(sender) -> None:
    """Until the loop thread has counted every answered request out of flight and taken over
    every request an application thread wrote."""
    deadline = time.monotonic() + 10
    while (any(sender._in_flight.values()) or sender._written) and time.monotonic() < deadline:
        time.sleep(0.001)


def caller_drains(sender, monkeypatch) -> list[bool]:
    """Each time an application thread tries to write (True: it wrote the request)."""
    outcomes: list[bool] = []
    drain = sender._drain_from_caller
    monkeypatch.setattr(sender, "_drain_from_caller", lambda: outcomes.append(drain()) or outcomes[-1])
    return outcomes


@contextlib.contextmanager
def warm_producer(threaded_fake, monkeypatch, **options):
    """A Producer on topic "t" (one partition) that has sent one record and counted its
    request out; yields it, its sender and ``caller_drains`` from then on."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Producer(threaded_fake.cluster.bootstrap, linger_ms=0, **options) as producer:
        sender = producer._aio._sender
        producer.send("t", b"warm").result(10)
        wait_until_accounted(sender)
        yield producer, sender, caller_drains(sender, monkeypatch)


def test_a_producer_sending_in_bursts_leaves_the_writes_to_its_loop_thread(threaded_fake, monkeypatch):
    fake = threaded_fake.cluster
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, sender, written):
        producer.send("t", b"one").result(10)
        assert written == [True]  # one at a time: the application thread writes it
        wait_until_accounted(sender)
        # the first request of the burst is held (the fake then appends it after the others)
        threaded_fake.call(functools.partial(fake.inject, ApiKey.PRODUCE, delay_s=1.0))
        burst = [producer.send("t", b"b%02d" % i) for i in range(50)]
        assert sorted(f.result(10).offset for f in burst) == list(range(2, 52))
        # the first of the burst was written at once; the others found it in flight, and the
        # loop thread's wake-up gathered them into a few requests
        assert written.count(True) == 2
        assert len(threaded_fake.call(fake.sent, ApiKey.PRODUCE)) < 2 + 25
        wait_until_accounted(sender)
        wrote = []
        for i in range(40):  # one at a time again: after a while the application thread writes
            before = len(written)
            producer.send("t", b"s%02d" % i).result(10)
            wait_until_accounted(sender)
            wrote.append(True in written[before:])
        assert not wrote[0] and wrote[-1] and sum(wrote) >= 20
    assert sorted(threaded_fake.call(fake.values, "t")[2:52]) == [b"b%02d" % i for i in range(50)]


def test_sends_that_each_wait_for_the_last_are_written_by_the_application_thread(threaded_fake, monkeypatch):
    # the answered request is counted out of flight before its future completes: the next
    # send finds the sender idle, and sends made one at a time are no burst
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, sender, written):
        for i in range(40):
            producer.send("t", b"%d" % i).result(10)
        assert sender._found_busy <= producer_module.BURST_SHARE
        assert written.count(True) >= 36  # all but a chance meeting with the loop thread's round


def test_requests_written_by_the_application_thread_wake_the_loop_thread_once_and_start_no_task(threaded_fake, monkeypatch):
    # the loop thread takes each request's task over at the response, or at a round it is
    # due for anyway: it is woken by the first write only, not after every one
    monkeypatch.setattr(producer_module, "TRACK_WITHIN_S", 30.0)
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, sender, written):
        wakes = []  # what the application threads ask of the loop thread

        class CountingToken:
            def __init__(self, token):
                self.token = token

            def run_sync_soon(self, fn, *args):
                if threading.get_ident() != sender._thread:
                    wakes.append(fn)
                return self.token.run_sync_soon(fn, *args)

        monkeypatch.setattr(sender, "_token", CountingToken(sender._token))
        tasks = []  # a task awaits a response only if the reader did not apply it first
        send = sender._send

        async def counted_send(*args):
            tasks.append(True)
            await send(*args)

        monkeypatch.setattr(sender, "_send", counted_send)
        for i in range(40):
            producer.send("t", b"%d" % i).result(10)
        assert written.count(True) >= 36 and len(wakes) <= 2
        assert len(tasks) <= 40 - written.count(True) + 2
        wait_until_accounted(sender)
        assert not sender._written  # every written request taken over


def test_requests_written_by_the_application_thread_count_in_the_metrics_as_sent(threaded_fake, monkeypatch):
    # the loop thread records them (the application thread's send ends sooner)
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, sender, written):
        records, batches = sender.stats.records.cumulative, sender.stats.batch_bytes.cumulative
        for i in range(5):
            producer.send("t", b"x" * 50).result(10)
        wait_until_accounted(sender)
        assert written == [True] * 5
        assert sender.stats.records.cumulative - records == 5
        assert sender.stats.batch_bytes.cumulative - batches > 5 * 50
        assert producer.metrics()["producer-metrics"]["batch-size-avg"] > 50


def test_a_request_written_by_the_application_thread_that_gets_no_answer_times_out_and_is_retried(
        threaded_fake, monkeypatch):
    fake = threaded_fake.cluster
    with warm_producer(threaded_fake, monkeypatch, acks=1, request_timeout_ms=300) as (producer, _, written):
        threaded_fake.call(functools.partial(fake.inject, ApiKey.PRODUCE, delay_s=5.0))
        assert producer.send("t", b"a").result(10).offset >= 1  # its timeout, then the retry's answer
        assert written[0] is True
    assert b"a" in threaded_fake.call(fake.values, "t")


def test_a_request_written_by_the_application_thread_refused_as_a_whole_is_retried(threaded_fake, monkeypatch):
    fake = threaded_fake.cluster
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, _, written):
        threaded_fake.call(functools.partial(fake.inject, ApiKey.PRODUCE, error_code=NOT_LEADER_OR_FOLLOWER.code,
                                             whole_request=True))
        assert producer.send("t", b"a").result(10).offset >= 1  # the refusal, then the retry's answer
        assert written[0] is True
    assert threaded_fake.call(fake.values, "t").count(b"a") == 1


def test_the_rest_of_a_request_the_kernel_did_not_take_from_the_application_thread_is_written_at_once(
        threaded_fake, monkeypatch):
    import tidelog.aio.connection as connection_module
    monkeypatch.setattr(producer_module, "TRACK_WITHIN_S", 30.0)  # no round comes in time
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, sender, written):
        fds = {conn._socket.fileno() for conn in sender.cluster._conns.values() if conn._socket is not None}
        loop_thread, real_write, halved = sender._thread, os.write, []

        def half_from_threads(f, data):  # the kernel takes half of what a thread writes
            if f in fds and threading.get_ident() != loop_thread and len(data) > 1:
                halved.append(len(data))
                return real_write(f, memoryview(data)[:len(data) // 2])
            return real_write(f, data)

        monkeypatch.setattr(connection_module.os, "write", half_from_threads)
        assert producer.send("t", b"a" * 1000).result(10).offset == 1
        assert written == [True] and halved


def test_a_written_request_the_closing_sender_cannot_take_over_fails_its_records(threaded_fake, monkeypatch):
    # between its nursery closing and its end, the sender can start no task for a request a
    # thread wrote: its records fail, rather than wait for ever
    fake = threaded_fake.cluster
    monkeypatch.setattr(producer_module, "TRACK_WITHIN_S", 30.0)
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, sender, written):
        threaded_fake.call(functools.partial(fake.inject, ApiKey.PRODUCE, delay_s=5.0))
        future = producer.send("t", b"a")
        assert written == [True] and len(sender._written) == 1

        class ClosedNursery:
            def start_soon(self, *args):
                raise RuntimeError("Nursery is closed to new arrivals")

        nursery = sender._nursery
        monkeypatch.setattr(sender, "_nursery", ClosedNursery())
        producer._portal.run_sync(sender._track_written)
        monkeypatch.setattr(sender, "_nursery", nursery)
        with pytest.raises(ClientClosedError):
            future.result(10)


def test_batches_drained_by_an_application_thread_that_fails_to_write_are_sent_by_the_loop(
        threaded_fake, monkeypatch):
    # the batch has its sequence already (idempotent, acks=all): dropped, it would be lost,
    # and every later batch of the partition refused as out of order
    fake = threaded_fake.cluster
    with warm_producer(threaded_fake, monkeypatch) as (producer, _, written):
        failures = []
        write = BrokerConnection.start_request_from_thread

        def fail_once(self, *args, **kwargs):
            if not failures:
                failures.append(True)
                raise RuntimeError("the write failed")
            return write(self, *args, **kwargs)

        monkeypatch.setattr(BrokerConnection, "start_request_from_thread", fail_once)
        assert producer.send("t", b"a").result(10).offset == 1
        assert failures and written[0] is True  # drained on the application thread
        assert producer.send("t", b"b").result(10).offset == 2
    assert threaded_fake.call(fake.values, "t") == [b"warm", b"a", b"b"]


def test_a_request_the_loop_thread_cannot_frame_fails_its_records_instead_of_losing_them(
        threaded_fake, monkeypatch):
    fake = threaded_fake.cluster
    with warm_producer(threaded_fake, monkeypatch, acks=1) as (producer, _, written):
        monkeypatch.setattr(producer_module, "BURST_SHARE", -1.0)  # every write the loop thread's
        start = BrokerConnection.start_request

        def fail_once(self, *args, **kwargs):
            monkeypatch.setattr(BrokerConnection, "start_request", start)
            raise RuntimeError("the frame cannot be encoded")

        monkeypatch.setattr(BrokerConnection, "start_request", fail_once)
        with pytest.raises(RuntimeError, match="cannot be encoded"):
            producer.send("t", b"a").result(10)  # drained by the loop thread: failed, not lost
        assert producer.send("t", b"b").result(10).offset == 1
        producer.flush(10)
        assert written and not any(written)
    assert threaded_fake.call(fake.values, "t") == [b"warm", b"b"]


def test_an_application_thread_interrupted_after_its_write_leaves_nothing_counted(threaded_fake, monkeypatch):
    # Ctrl-C right after the frame went out: the loop thread sends the batches again (the
    # broker deduplicates them by sequence), and neither request is left counted in flight
    fake = threaded_fake.cluster
    with warm_producer(threaded_fake, monkeypatch) as (producer, sender, written):
        write = BrokerConnection.start_request_from_thread

        def write_then_interrupt(self, *args, **kwargs):
            monkeypatch.setattr(BrokerConnection, "start_request_from_thread", write)
            write(self, *args, **kwargs)
            raise KeyboardInterrupt

        monkeypatch.setattr(BrokerConnection, "start_request_from_thread", write_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            producer.send("t", b"a")
        producer.flush(10)
        wait_until_accounted(sender)
        assert sender._in_flight == {next(iter(sender._in_flight)): 0}
        before = len(written)
        assert producer.send("t", b"b").result(10).offset == 2
        assert written[before:] == [True]  # the sender is idle again: the thread writes
    assert threaded_fake.call(fake.values, "t") == [b"warm", b"a", b"b"]


def test_an_idempotent_producer_writes_from_the_application_threads_in_sequence(threaded_fake, monkeypatch):
    # acks=all (idempotent by default) and linger_ms 0: the application threads drain and
    # write too, giving batches their sequences; lost responses make the loop thread resend
    # some meanwhile, and the broker deduplicates them by those sequences
    fake = threaded_fake.cluster
    with warm_producer(threaded_fake, monkeypatch, retry_backoff_ms=10, request_timeout_ms=2000) as (
            producer, sender, written):
        assert sender.idempotence is not None
        producer.send("t", b"one").result(10)
        assert written == [True]
        # every idle moment written from a thread, bursts or not: the most drains on the
        # application threads beside the loop thread's resends
        monkeypatch.setattr(producer_module, "BURST_SHARE", 1.0)
        threaded_fake.call(functools.partial(fake.inject, ApiKey.PRODUCE, drop_after_append=True, count=4))
        futures = send_from_threads(producer, 100, wait_every=4)
        producer.flush(20)
        wait_until_accounted(sender)
        before = len(written)
        producer.send("t", b"last").result(10)
        assert written[before:] == [True]  # after the faults, the application thread writes again
    offsets = {key: f.result(0).offset for key, f in futures.items()}
    *values, last = threaded_fake.call(fake.values, "t")[2:]
    assert last == b"last"
    assert sorted(values) == sorted(b"%d-%d" % key for key in futures)  # each once
    assert all(values[offset - 2] == b"%d-%d" % key for key, offset in offsets.items())
    for n in range(3):  # each thread's records in the order it sent them
        mine = [offsets[(n, i)] for i in range(100)]
        assert mine == sorted(mine)
    batches = [h for _, data in threaded_fake.call(fake.log, "t").batches for _, h in iter_headers(data)]
    assert {(h.producer_id, h.producer_epoch) for h in batches} == {(batches[0].producer_id, 0)}
    expected = 0
    for h in batches:  # the sequences run on without a gap or a repeat
        assert h.base_sequence == expected
        expected += h.record_count


def test_an_idempotent_producer_whose_state_the_broker_lost_resends_under_a_new_epoch(threaded_fake, monkeypatch):
    # the refused batch bumps the epoch: no application thread drains until it is bumped
    fake = threaded_fake.cluster
    threaded_fake.call(fake.create_topic, "t", 1)
    with Producer(fake.bootstrap, linger_ms=0, retry_backoff_ms=10) as producer:
        assert producer.send("t", b"a").result(10).offset == 0
        wait_until_accounted(producer._aio._sender)
        written = caller_drains(producer._aio._sender, monkeypatch)
        threaded_fake.call(threaded_fake.call(fake.log, "t").producer_state.clear)
        assert producer.send("t", b"b").result(10).offset == 1
        assert written[0] is True
        assert producer.send("t", b"c").result(10).offset == 2
    assert threaded_fake.call(fake.values, "t") == [b"a", b"b", b"c"]
    batches = [h for _, data in threaded_fake.call(fake.log, "t").batches for _, h in iter_headers(data)]
    assert [(h.producer_epoch, h.base_sequence) for h in batches] == [(0, 0), (1, 0), (1, 1)]
    # "b", written by the application thread as the first of its partition's unacknowledged
    # batches, was refused once and resent at once under the new epoch
    assert len(threaded_fake.call(fake.sent, ApiKey.PRODUCE)) == 4


def test_send_many_round_trip_mixed_with_send_from_threads(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 2)
    results, lock = [], threading.Lock()
    # one request in flight: the fake broker may append concurrent requests in any order
    with Producer(threaded_fake.cluster.bootstrap, linger_ms=1, batch_size=2048,
                  max_in_flight_requests_per_connection=1) as producer:
        def work(n):
            for i in range(5):
                many = producer.send_many("t", [b"%d-%d-%d" % (n, i, j) for j in range(100)], partition=0)
                one = producer.send("t", b"%d-%d-single" % (n, i), partition=0)
                with lock:
                    results.append((many, one))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        producer.flush(timeout=10)
        offsets = []
        for many, one in results:
            mds = many.result(5)
            # a call's records are contiguous and in order; the send after it comes later
            assert [md.offset for md in mds] == list(range(mds[0].offset, mds[0].offset + 100))
            assert one.result(5).offset > mds[-1].offset
            offsets += [md.offset for md in mds] + [one.result(0).offset]
    assert sorted(offsets) == list(range(1515))


def test_send_many_waits_for_metadata_then_blocks_at_most_max_block_ms_for_memory(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    threaded_fake.call(lambda: threaded_fake.cluster.inject(ApiKey.PRODUCE, delay_s=2))
    with Producer(threaded_fake.cluster.bootstrap, buffer_memory=400, batch_size=400, max_block_ms=200,
                  linger_ms=0, max_in_flight_requests_per_connection=1) as producer:
        for _ in range(50):  # metadata first, however loaded the machine: each try waits max_block_ms
            try:
                producer.partitions_for("t")
                break
            except RequestTimedOut:
                pass
        started = time.monotonic()
        with pytest.raises(RequestTimedOut, match="buffer_memory") as info:
            producer.send_many("t", [b"%04d" % i for i in range(40)])
        assert time.monotonic() - started >= 0.15  # it waited for memory before giving up
        queued = info.value.futures
        assert len(queued) == 11
        producer.flush(timeout=10)
        assert [md.offset for md in queued.result(5)] == list(range(11))


def test_nothing_listening_gives_bounded_errors_not_hangs():
    started = time.monotonic()
    with Producer(NOWHERE, max_block_ms=300, retry_backoff_ms=20) as producer:
        with pytest.raises(RequestTimedOut, match="not present in metadata after 300 ms"):
            producer.send("t", b"v")
    with Consumer(NOWHERE, retry_backoff_ms=20, request_timeout_ms=300) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        assert consumer.poll(timeout_ms=100) == []
        with pytest.raises(RequestTimedOut):
            consumer.position(TopicPartition("t", 0), timeout_ms=300)
        with pytest.raises(RequestTimedOut):
            consumer.end_offsets([TopicPartition("t", 0)], timeout_ms=300)
    with Admin(NOWHERE, retry_backoff_ms=20) as admin:
        with pytest.raises(TidelogError, match="127.0.0.1:1"):
            admin.describe_cluster(timeout_ms=300)
    assert time.monotonic() - started < 8


def test_records_pending_when_the_producer_closes_fail_with_an_error():
    producer = Producer(NOWHERE, linger_ms=0)
    producer._aio._cluster.metadata = _fake_metadata()  # pretend to know the topic
    future = producer.send("t", b"v")
    producer.close(timeout=0.2)
    with pytest.raises(TidelogError):
        future.result(1)


def _fake_metadata():
    from tidelog.aio.cluster import ClusterMetadata
    from tidelog.protocol.messages import BrokerMetadata, MetadataResponse, PartitionMetadata, TopicMetadata
    return ClusterMetadata().merge(MetadataResponse(
        [BrokerMetadata(0, "127.0.0.1", 1)], None, 0,
        [TopicMetadata(0, "t", [PartitionMetadata(0, 0, 0, 0, [0], [0])])]), None)


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt for the test's duration, also when the suite runs as a
    background job (which inherits SIGINT ignored); the previous handler is restored after."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_interrupts_a_blocking_call(threaded_fake, ctrl_c_raises):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Consumer(threaded_fake.cluster.bootstrap) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
        started = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            consumer.poll(timeout_ms=10_000)
        assert time.monotonic() - started < 5
        assert consumer.poll(timeout_ms=10) == []  # still usable afterwards


def test_calls_after_close_are_refused(threaded_fake):
    consumer = Consumer(threaded_fake.cluster.bootstrap)
    consumer.close()
    consumer.close()  # idempotent
    with pytest.raises(TidelogError, match="closed"):
        consumer.poll()


def test_wakeup_is_raised_before_records_an_iterator_left(threaded_fake):
    """The records of an iterator's last poll wait their turn; a wakeup does not (Kafka's
    rule: the next poll raises it)."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Producer(threaded_fake.cluster.bootstrap, linger_ms=0) as producer:
        producer.send_many("t", [b"%d" % i for i in range(5)], partition=0)
        producer.flush(10)
    with Consumer(threaded_fake.cluster.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition("t", 0)])
        assert next(iter(consumer)).offset == 0  # 1-4 are left unreturned
        consumer.wakeup()
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=1000)
        assert [r.offset for r in consumer.poll(timeout_ms=1000)] == [1, 2, 3, 4]


def test_close_from_a_record_callback_closes_at_once_and_the_applications_close_waits(threaded_fake):
    """Kafka's close from the I/O thread: a record callback's close() does not wait. The
    producer refuses records from then on, the ones pending fail with ClientClosedError
    (none is silently dropped), and the application's own close() ends the loop thread."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    producer = Producer(threaded_fake.cluster.bootstrap, linger_ms=0)
    in_callback: dict[str, object] = {}
    called = threading.Event()

    def on_done(_future):
        in_callback["pending"] = producer.send("t", b"pending", partition=0)
        try:
            producer.close()
        except BaseException as e:
            in_callback["error"] = e
        in_callback["closed"] = producer.closed
        called.set()

    first = producer.send("t", b"first", partition=0)
    # added on the loop thread: on_done runs there even if the record is acknowledged already
    producer._portal.run_sync(first.add_done_callback, on_done)
    assert called.wait(10)
    assert "error" not in in_callback and in_callback["closed"] is True
    with pytest.raises(ClientClosedError, match="producer"):
        in_callback["pending"].result(10)
    with pytest.raises(ClientClosedError):
        producer.send("t", b"after", partition=0)
    with pytest.raises(ClientClosedError):
        producer.flush(1)
    producer.close()
    assert not producer._portal.running


def test_a_consumer_or_admin_closed_from_its_own_loop_thread_refuses_and_stays_open(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Consumer(threaded_fake.cluster.bootstrap) as consumer, Admin(threaded_fake.cluster.bootstrap) as admin:
        for client in (consumer, admin):
            with pytest.raises(RuntimeError, match="own event loop thread"):
                client._portal.run_sync(client.close)
            assert not client.closed
        consumer.assign([TopicPartition("t", 0)])
        assert consumer.poll(timeout_ms=10) == []
        assert "t" in admin.list_topics()


@pytest.mark.parametrize("group", [True, False], ids=["group", "loop-fetch"])
def test_records_a_poll_took_as_it_was_interrupted_come_in_the_next_poll(threaded_fake, ctrl_c_raises,
                                                                         monkeypatch, group):
    """Ctrl-C reaches the poll just as the loop thread takes its records (here: while the
    loop deserializes them): they are not lost, and the consumed position is theirs. With a
    group the loop thread runs the poll; without one, over TLS or SASL, it hands a waiting
    poll its records (taken here for PLAINTEXT)."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Producer(threaded_fake.cluster.bootstrap, linger_ms=0) as producer:
        producer.send_many("t", [b"%d" % i for i in range(5)], partition=0)
        producer.flush(10)
    monkeypatch.setattr("tidelog.blocking.caller_can_fetch", lambda _aio: False)
    interrupted, released = threading.Event(), threading.Event()

    def deserialize(value):  # on the loop thread
        if not interrupted.is_set():
            interrupted.set()
            os.kill(os.getpid(), signal.SIGINT)
            assert released.wait(10)
        return value

    options = {"group_id": "g", "enable_auto_commit": False} if group else {}
    tp = TopicPartition("t", 0)
    with Consumer(threaded_fake.cluster.bootstrap, value_deserializer=deserialize, **options) as consumer:
        assert consumer._aio.polls_without_task is not group
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with pytest.raises(KeyboardInterrupt):
            consumer.poll(timeout_ms=10_000)
        released.set()
        assert consumer.position(tp) == 0
        got = []
        while len(got) < 5:
            got += consumer.poll(timeout_ms=5000)
        assert [r.offset for r in got] == list(range(5))


def test_records_a_group_poll_took_after_its_caller_gave_up_on_a_stuck_loop_come_next(threaded_fake, monkeypatch):
    """The loop thread is stuck (here: in a deserializer) while it takes a poll's records:
    the caller's bounded wait ends with RequestTimedOut, and the records, handed over late,
    come in the next poll; the consumed position is theirs meanwhile."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    with Producer(threaded_fake.cluster.bootstrap, linger_ms=0) as producer:
        producer.send_many("t", [b"%d" % i for i in range(5)], partition=0)
        producer.flush(10)
    monkeypatch.setattr("tidelog.blocking.GRACE_S", 0.1)
    stuck, released = threading.Event(), threading.Event()

    def deserialize(value):  # on the loop thread
        if stuck.is_set():
            assert released.wait(10)
        return value

    tp = TopicPartition("t", 0)
    with Consumer(threaded_fake.cluster.bootstrap, group_id="g", enable_auto_commit=False,
                  request_timeout_ms=200, value_deserializer=deserialize) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got = []
        while not got:
            got = consumer.poll(timeout_ms=5000, max_records=1)  # the rest of the batch is buffered
        stuck.set()
        with pytest.raises(RequestTimedOut):
            consumer.poll(timeout_ms=0)
        released.set()
        assert consumer.position(tp) == 1
        while len(got) < 5:
            got += consumer.poll(timeout_ms=5000)
        assert [r.offset for r in got] == list(range(5))


@pytest.mark.parametrize("revoked", [True, False], ids=["revoked", "still-assigned"])
def test_an_error_a_poll_raised_after_its_caller_gave_up_is_dropped_once_its_partition_is_revoked(
        threaded_fake, monkeypatch, revoked):
    """The loop thread is stuck (here: about to raise a partition's error) while it runs a
    poll: the caller's bounded wait ends with RequestTimedOut and the error, raised late, is
    for the next poll, unless its partition is no longer assigned by then (as the consumer
    drops any error of a partition it no longer has)."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 2)
    monkeypatch.setattr("tidelog.blocking.GRACE_S", 0.1)
    t0, t1 = TopicPartition("t", 0), TopicPartition("t", 1)
    with Consumer(threaded_fake.cluster.bootstrap, group_id="g", enable_auto_commit=False,
                  auto_offset_reset="none", request_timeout_ms=200) as consumer:
        consumer.assign([t0, t1])
        consumer.seek(t0, 100)  # past the end: OFFSET_OUT_OF_RANGE, for poll to raise
        consumer.seek(t1, 0)
        deadline = time.monotonic() + 10
        while not consumer._aio._fetcher.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        stuck, released = threading.Event(), threading.Event()
        raise_pending = consumer._aio._raise_pending

        def stuck_then_raise():  # on the loop thread
            if stuck.is_set():
                assert released.wait(10)
            raise_pending()

        monkeypatch.setattr(consumer._aio, "_raise_pending", stuck_then_raise)
        stuck.set()
        with pytest.raises(RequestTimedOut):
            consumer.poll(timeout_ms=0)
        stuck.clear()
        released.set()
        if revoked:
            consumer.assign([t1])
            assert consumer.poll(timeout_ms=100) == []
        else:
            with pytest.raises(OffsetOutOfRangeError):
                consumer.poll(timeout_ms=100)
