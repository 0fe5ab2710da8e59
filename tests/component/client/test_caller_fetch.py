"""The blocking consumer fetching on its caller's thread (client._caller_fetch): the next fetch
goes out before poll returns (unless the consumer is caught up and polled again at once), and
every fault the loop's fetcher survives (a dropped connection, a stalled response, a moved
leader, an offset out of range, a seek while a fetch is in flight) it survives too."""

from __future__ import annotations

import os
import resource
import threading
import time

import pytest

from tidelog import ClientClosedError, Consumer, Producer, TopicPartition, _caller_fetch
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
    TidelogError,
)

TP = TopicPartition("t", 0)


def produce(bootstrap: str, values: list[bytes], partition: int = 0) -> None:
    with Producer(bootstrap) as producer:
        for v in values:
            producer.send("t", v, partition=partition)


def topic_with(threaded_fake, values: list[bytes]) -> str:
    """Topic "t" (one partition) holding ``values``; returns the bootstrap servers."""
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    bootstrap = threaded_fake.cluster.bootstrap
    produce(bootstrap, values)
    return bootstrap


def poll_values(consumer: Consumer, n: int, timeout_s: float = 15) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += [r.value for r in consumer.poll(timeout_ms=200)]
    return got


def in_flight(consumer: Consumer) -> int:
    return sum(link.plan is not None for link in consumer._caller._links.values())


def test_poll_fetches_on_its_thread_and_sends_the_next_fetch_before_returning(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a", b"b", b"c"])
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        assert consumer._caller is not None and not consumer._aio._fetcher.fetch_in_loop
        consumer.assign([TP])
        assert poll_values(consumer, 3) == [b"a", b"b", b"c"]
        assert in_flight(consumer) == 1  # pipelined: the next fetch waits at the broker already
        produce(bootstrap, [b"d"])
        assert poll_values(consumer, 1) == [b"d"]
        assert consumer.position(TP) == 4


def test_a_caught_up_consumer_polled_again_at_once_fetches_in_the_next_poll(threaded_fake, monkeypatch):
    monkeypatch.setattr(_caller_fetch, "DEFER_WITHIN_S", 3600.0)  # "at once", whatever the load
    bootstrap = topic_with(threaded_fake, [b"a"])
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 1) == [b"a"]
        assert in_flight(consumer) == 1  # the first poll: nothing known of the application yet
        later = threading.Timer(0.3, produce, (bootstrap, [b"b"]))
        later.start()
        try:
            assert poll_values(consumer, 1) == [b"b"]  # polled again at once, and caught up
        finally:
            later.join()
        assert in_flight(consumer) == 0  # so the records were not held for the next fetch
        monkeypatch.setattr(_caller_fetch, "DEFER_WITHIN_S", 0.0)  # the application away longer
        produce(bootstrap, [b"c"])
        assert poll_values(consumer, 1) == [b"c"]  # the next poll sent the fetch
        assert in_flight(consumer) == 1  # and, polled late, it fetches ahead again
        assert consumer.position(TP) == 3


def test_a_consumer_behind_fetches_ahead_even_when_polled_again_at_once(threaded_fake, monkeypatch):
    monkeypatch.setattr(_caller_fetch, "DEFER_WITHIN_S", 3600.0)
    bootstrap = topic_with(threaded_fake, [b"a"])
    for value in (b"b", b"c"):
        produce(bootstrap, [value])  # a batch of its own: one batch a response
    with Consumer(bootstrap, auto_offset_reset="earliest", max_partition_fetch_bytes=1) as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 1) == [b"a"]
        assert poll_values(consumer, 1) == [b"b"]  # polled again at once
        assert in_flight(consumer) == 1  # "c" lies below the high watermark: fetched ahead
        assert poll_values(consumer, 1) == [b"c"]
        assert in_flight(consumer) == 0  # caught up now


def test_a_loop_of_zero_timeout_polls_gets_the_records(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a", b"b"])
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        got: list[bytes] = []
        deadline = time.monotonic() + 15
        while len(got) < 2 and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout_ms=0)]
            time.sleep(0.001)
        assert got == [b"a", b"b"]


def test_a_response_left_unread_while_the_application_works_is_not_timed_out(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a"])
    with Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=1000,
                  fetch_max_wait_ms=100) as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 1) == [b"a"]
        produce(bootstrap, [b"b"])  # answers the fetch sent before "a" was returned
        time.sleep(1.5)  # longer than that fetch's timeout: its answer waits in the socket
        assert [r.value for r in consumer.poll(timeout_ms=0)] == [b"b"]  # not dropped and fetched again


class OsOf(dict):
    """The ``os`` the caller fetch's module sees: these functions in place of os's."""

    def __getattr__(self, name):
        return self[name] if name in self else getattr(os, name)


def test_a_fetch_the_kernel_takes_in_part_is_finished_and_answered(threaded_fake, monkeypatch):
    bootstrap = topic_with(threaded_fake, [b"a", b"b"])
    halved = []

    def half(fd, data):  # the kernel takes half of each fetch, the rest goes through sendall
        halved.append(len(data))
        return os.write(fd, memoryview(data)[:len(data) // 2])

    monkeypatch.setattr(_caller_fetch, "os", OsOf(write=half))
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 2) == [b"a", b"b"]
        assert halved


def test_a_socket_found_readable_with_nothing_to_read_is_waited_on_again(threaded_fake, monkeypatch):
    bootstrap = topic_with(threaded_fake, [b"a"])
    spurious = []

    def once_empty(fd, n):
        if not spurious:
            spurious.append(fd)
            raise BlockingIOError
        return os.read(fd, n)

    monkeypatch.setattr(_caller_fetch, "os", OsOf(read=once_empty))
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        got = []
        while not consumer._caller._links:  # the socket, opened by the loop, taken by a poll
            got += [r.value for r in consumer.poll(timeout_ms=10)]
        [link] = consumer._caller._links.values()
        assert got + poll_values(consumer, 1 - len(got)) == [b"a"]
        assert spurious and list(consumer._caller._links.values()) == [link]  # nothing dropped
        assert not consumer._caller._not_before  # nor backed off


def test_a_group_member_fetches_on_the_loop(threaded_fake):
    with Consumer(threaded_fake.cluster.bootstrap, group_id="g") as consumer:
        assert consumer._caller is None and consumer._aio._fetcher.fetch_in_loop


def test_a_dropped_fetch_connection_is_opened_again(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a", b"b"])
    threaded_fake.cluster.inject(ApiKey.FETCH, drop_connection=True, count=2)
    with Consumer(bootstrap, auto_offset_reset="earliest", retry_backoff_ms=50) as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 2) == [b"a", b"b"]


def test_a_fetch_refused_as_a_whole_with_an_unknown_server_error_is_retried_without_raising(threaded_fake):
    """As the loop's fetcher and Kafka's: the broker's unexpected failure is logged and retried."""
    bootstrap = topic_with(threaded_fake, [b"a", b"b"])
    threaded_fake.cluster.inject(ApiKey.FETCH, error_code=UNKNOWN_SERVER_ERROR.code, whole_request=True, count=2)
    with Consumer(bootstrap, auto_offset_reset="earliest", retry_backoff_ms=50) as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 2) == [b"a", b"b"]


def test_a_fetch_refused_as_a_whole_for_good_is_raised_by_poll(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a", b"b"])
    threaded_fake.cluster.inject(ApiKey.FETCH, error_code=TOPIC_AUTHORIZATION_FAILED.code, whole_request=True)
    with Consumer(bootstrap, auto_offset_reset="earliest", retry_backoff_ms=50) as consumer:
        consumer.assign([TP])
        with pytest.raises(TidelogError, match="Not authorized"):
            poll_values(consumer, 2)
        assert poll_values(consumer, 2) == [b"a", b"b"]


def test_a_stalled_fetch_response_times_out_and_is_fetched_again(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a"])
    threaded_fake.cluster.inject(ApiKey.FETCH, delay_s=60, count=1)
    with Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=1000, fetch_max_wait_ms=100,
                  retry_backoff_ms=50) as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 1) == [b"a"]
        assert len(threaded_fake.cluster.sent(ApiKey.FETCH)) >= 2


def test_a_moved_leader_is_found_through_the_loops_metadata(threaded_fake_two):
    cluster = threaded_fake_two.cluster
    threaded_fake_two.call(cluster.create_topic, "t", 1, [0])
    bootstrap = cluster.bootstrap
    produce(bootstrap, [b"a"])
    with Consumer(bootstrap, auto_offset_reset="earliest", retry_backoff_ms=50) as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 1) == [b"a"]
        threaded_fake_two.call(cluster.move_leader, "t", 0, 1)
        cluster.inject(ApiKey.FETCH, node=0, error_code=NOT_LEADER_OR_FOLLOWER.code, count=1_000_000)
        produce(bootstrap, [b"b"])  # may answer the fetch waiting at node 0 still
        produce(bootstrap, [b"c"])
        assert poll_values(consumer, 2) == [b"b", b"c"]
        assert 1 in consumer._caller._links  # the partition is fetched from its new leader


def test_an_offset_out_of_range_is_reset_by_the_loop(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a", b"b"])
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        consumer.seek(TP, 50)  # beyond the end: the broker answers OFFSET_OUT_OF_RANGE
        assert poll_values(consumer, 2) == [b"a", b"b"]  # reset to the earliest, fetched again
        # the next fetch is refused (the one in flight, or the one after it if the broker
        # had it already: that one gets "c"), and the loop resets the position to the earliest
        threaded_fake.cluster.inject(ApiKey.FETCH, error_code=OFFSET_OUT_OF_RANGE.code, count=1)
        produce(bootstrap, [b"c"])
        got: list[bytes] = []
        deadline = time.monotonic() + 15
        while got[-3:] != [b"a", b"b", b"c"] and time.monotonic() < deadline:
            got += [r.value for r in consumer.poll(timeout_ms=200)]
        assert got in ([b"a", b"b", b"c"], [b"c", b"a", b"b", b"c"])


def test_a_seek_while_a_fetch_is_in_flight_discards_its_answer(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a", b"b", b"c"])
    with Consumer(bootstrap, auto_offset_reset="earliest", max_poll_records=1, fetch_max_wait_ms=100) as consumer:
        consumer.assign([TP])
        assert poll_values(consumer, 1) == [b"a"]
        consumer.seek(TP, 0)
        assert poll_values(consumer, 3) == [b"a", b"b", b"c"]
        produce(bootstrap, [b"d"])  # answered to the fetch sent before returning "c"
        assert poll_values(consumer, 1) == [b"d"]


def test_sockets_above_descriptor_1023_are_waited_on(threaded_fake):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit ({hard}) is too low to open sockets above 1023")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(max(0, 1030 - len(os.listdir("/proc/self/fd"))))]
    try:
        threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
        bootstrap = threaded_fake.cluster.bootstrap
        produce(bootstrap, [b"a"])
        with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
            consumer.assign([TP])
            assert poll_values(consumer, 1) == [b"a"]
            assert max(link.sock.fileno() for link in consumer._caller._links.values()) > 1023
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stopped_event_loop_is_reported_not_hidden(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    consumer = Consumer(threaded_fake.cluster.bootstrap, auto_offset_reset="earliest")
    try:
        consumer.assign([TP])
        consumer._portal.stop()  # as if the loop had crashed
        with pytest.raises(ClientClosedError):
            consumer.poll(timeout_ms=100)
    finally:
        with pytest.raises(ClientClosedError):  # close says so too, and still lets go
            consumer.close(1)
    assert consumer.closed and consumer._caller._wake_r.fileno() == -1


def test_an_interrupted_poll_loses_no_record_and_no_partition(threaded_fake):
    # Ctrl-C inside a deserializer: the records drained for that poll come again, and the
    # partition is still fetched afterwards
    bootstrap = topic_with(threaded_fake, [b"a", b"b", b"c"])
    interrupt = [True]

    def value(v: bytes) -> bytes:
        if v == b"b" and interrupt[0]:
            interrupt[0] = False
            raise KeyboardInterrupt
        return v

    with Consumer(bootstrap, auto_offset_reset="earliest", value_deserializer=value) as consumer:
        consumer.assign([TP])
        with pytest.raises(KeyboardInterrupt):
            poll_values(consumer, 3)
        assert poll_values(consumer, 3) == [b"a", b"b", b"c"]
        produce(bootstrap, [b"d"])
        assert poll_values(consumer, 1) == [b"d"]


def test_a_wait_longer_than_poll2_takes_is_split(threaded_fake):
    bootstrap = topic_with(threaded_fake, [b"a"])
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP])
        assert [r.value for r in consumer.poll(timeout_ms=2**40)] == [b"a"]
