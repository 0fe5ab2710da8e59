"""The sender's decisions as pure functions: what happens to a batch after each attempt,
how requests are built, and how options are parsed."""

from __future__ import annotations

import msgpack
import pytest

from tidelog.aio.accumulator import ProducerBatch
from tidelog.aio.producer import (
    Decision,
    ProducerConfig,
    build_produce_request,
    decide,
    decide_failure,
    decide_response,
    parse_acks,
    serialize,
)
from tidelog.errors import BrokerConnectionError, RequestTimedOut
from tidelog.protocol.errors import (
    CORRUPT_MESSAGE,
    LEADER_NOT_AVAILABLE,
    MESSAGE_TOO_LARGE,
    NOT_ENOUGH_REPLICAS,
    NOT_LEADER_OR_FOLLOWER,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    RecordTooLargeError,
    TidelogError,
)
from tidelog.protocol.messages import PartitionProduceResponse, ProduceRequest, ProduceResponse, TopicProduceResponse
from tidelog.protocol.records import Codec, iter_all_records
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("orders", 3)


def batch(attempts: int = 1, created: float = 0.0, deadline: float = 120.0, tp=TP, n: int = 2) -> ProducerBatch:
    b = ProducerBatch(tp, Codec.NONE, created, deadline)
    for i in range(n):
        b.append(i, None, b"v%d" % i, None, 40)
    b.attempts = attempts
    return b


def test_success_completes_with_the_base_offset():
    assert decide(batch(), 0, now=1.0, retries=5, base_offset=7, log_append_time=9) == Decision("done", 7, 9)


@pytest.mark.parametrize("error", [NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE])
def test_stale_metadata_errors_retry_and_refresh(error):
    d = decide(batch(), error.code, now=1.0, retries=5)
    assert d.action == "retry" and d.refresh_metadata


def test_retriable_errors_without_stale_metadata_retry_without_refresh():
    d = decide(batch(), NOT_ENOUGH_REPLICAS.code, now=1.0, retries=5)
    assert d.action == "retry" and not d.refresh_metadata


def test_retries_are_bounded_by_the_retries_option():
    # retries=2: the first attempt and two more
    assert decide(batch(attempts=2), NOT_LEADER_OR_FOLLOWER.code, now=1, retries=2).action == "retry"
    d = decide(batch(attempts=3), NOT_LEADER_OR_FOLLOWER.code, now=1, retries=2)
    assert d.action == "fail" and "retries exhausted" in str(d.error)
    assert decide(batch(attempts=1), NOT_LEADER_OR_FOLLOWER.code, now=1, retries=0).action == "fail"


def test_retries_stop_at_the_delivery_timeout():
    d = decide(batch(deadline=10.0), NOT_LEADER_OR_FOLLOWER.code, now=10.0, retries=100)
    assert d.action == "fail" and isinstance(d.error, RequestTimedOut)
    assert "NOT_LEADER_OR_FOLLOWER" in str(d.error) and "orders" in str(d.error)


@pytest.mark.parametrize("error,cls", [(MESSAGE_TOO_LARGE, RecordTooLargeError),
                                       (TOPIC_AUTHORIZATION_FAILED, TidelogError)])
def test_non_retriable_errors_fail_at_once_naming_the_partition(error, cls):
    d = decide(batch(n=1), error.code, now=1, retries=100, message="too big")
    assert d.action == "fail" and isinstance(d.error, cls)
    assert d.error.error is error
    assert "topic 'orders' partition 3" in str(d.error) and error.name in str(d.error)
    assert "too big" in str(d.error)


def test_a_batch_of_several_records_too_large_is_split_whatever_the_retries_left():
    too_large = ProduceResponse([TopicProduceResponse("orders", [PartitionProduceResponse(3, MESSAGE_TOO_LARGE.code)])])
    [(_, d)] = decide_response(too_large, [batch(attempts=5, n=2)], now=1, retries=0)
    assert d.action == "split" and isinstance(d.error, RecordTooLargeError)
    # a record too large alone fails, and nothing is split past the delivery timeout
    assert decide(batch(n=1), MESSAGE_TOO_LARGE.code, now=1, retries=3).action == "fail"
    assert decide(batch(n=2), MESSAGE_TOO_LARGE.code, now=120, retries=3).action == "fail"


def test_corrupt_message_is_retriable_like_kafka():
    assert decide(batch(), CORRUPT_MESSAGE.code, now=1, retries=3).action == "retry"


def test_a_request_failure_decides_every_batch_alike():
    batches = [batch(), batch(tp=TopicPartition("x", 0))]
    out = decide_failure(batches, BrokerConnectionError("gone"), now=1, retries=3)
    assert [d.action for _, d in out] == ["retry", "retry"] and all(d.refresh_metadata for _, d in out)
    out = decide_failure(batches, RequestTimedOut("slow"), now=1, retries=3)
    # a timed-out request refreshes metadata too: the node may be a paused, deposed leader
    assert [d.action for _, d in out] == ["retry", "retry"] and all(d.refresh_metadata for _, d in out)


def test_decide_response_matches_partitions_and_fails_missing_ones():
    a, b = batch(), batch(tp=TopicPartition("orders", 4))
    response = ProduceResponse([TopicProduceResponse("orders", [PartitionProduceResponse(3, 0, base_offset=10)])])
    [(ba, da), (bb, db)] = decide_response(response, [a, b], now=1, retries=3)
    assert ba is a and da == Decision("done", 10, -1)
    assert bb is b and db.action == "fail" and "no result" in str(db.error)


def test_batches_of_one_partition_travel_as_one_run_and_get_consecutive_offsets():
    first, second, other = batch(n=2), batch(n=3), batch(tp=TopicPartition("orders", 4))
    request = ProduceRequest.from_body(build_produce_request([first, second, other], acks=1, timeout_ms=30000))
    [topic] = request.topic_data
    assert [p.index for p in topic.partition_data] == [3, 4]
    assert [r.value for r in iter_all_records(topic.partition_data[0].records)] == [b"v0", b"v1", b"v0", b"v1", b"v2"]
    response = ProduceResponse([TopicProduceResponse("orders", [
        PartitionProduceResponse(3, 0, base_offset=10), PartitionProduceResponse(4, 0, base_offset=7)])])
    decisions = decide_response(response, [first, second, other], now=1, retries=3)
    assert [d.base_offset for _, d in decisions] == [10, 12, 7]
    failed = ProduceResponse([TopicProduceResponse("orders", [
        PartitionProduceResponse(3, NOT_LEADER_OR_FOLLOWER.code), PartitionProduceResponse(4, 0, base_offset=7)])])
    assert [d.action for _, d in decide_response(failed, [first, second, other], now=1, retries=3)] == \
        ["retry", "retry", "done"]


def test_a_run_refused_for_one_bad_batch_is_retried_batch_by_batch():
    first, second, other = batch(n=2), batch(n=3), batch(tp=TopicPartition("orders", 4), n=1)
    too_large = ProduceResponse([TopicProduceResponse("orders", [
        PartitionProduceResponse(3, MESSAGE_TOO_LARGE.code), PartitionProduceResponse(4, MESSAGE_TOO_LARGE.code)])])
    # the run of partition 3 goes again, each batch alone; partition 4's single record is the bad one
    decisions = decide_response(too_large, [first, second, other], now=1, retries=0)
    assert [d.action for _, d in decisions] == ["retry", "retry", "fail"]
    assert isinstance(decisions[2][1].error, RecordTooLargeError)
    # past the delivery timeout, nothing is retried
    assert [d.action for _, d in decide_response(too_large, [first, second], now=120, retries=3)] == ["fail", "fail"]


def test_build_produce_request_groups_by_topic_with_the_encoded_batches():
    a, b, c = batch(), batch(tp=TopicPartition("orders", 4)), batch(tp=TopicPartition("audit", 0))
    body = build_produce_request([a, b, c], acks=-1, timeout_ms=30000)
    request = ProduceRequest.from_body(body)
    assert request.acks == -1 and request.timeout_ms == 30000 and request.transactional_id is None
    # the map built directly is the typed message's own, byte for byte on the wire
    assert msgpack.packb(body) == msgpack.packb(request.to_body())
    assert {t.name: [p.index for p in t.partition_data] for t in request.topic_data} == \
        {"orders": [3, 4], "audit": [0]}
    records = list(iter_all_records(request.topic_data[0].partition_data[0].records))
    assert [r.value for r in records] == [b"v0", b"v1"]
    assert a.encode() is a.encode()  # built once, reused by retries


def test_a_request_of_one_batch_is_the_typed_messages_map():
    one = batch(tp=TopicPartition("orders", 4), n=1)
    body = build_produce_request([one], acks=1, timeout_ms=5000)
    request = ProduceRequest.from_body(body)
    assert msgpack.packb(body) == msgpack.packb(request.to_body())
    [topic] = request.topic_data
    assert topic.name == "orders" and [p.index for p in topic.partition_data] == [4]
    assert topic.partition_data[0].records is one.encode()


@pytest.mark.parametrize("given,acks", [("all", -1), (-1, -1), ("-1", -1), (1, 1), ("1", 1), (0, 0), ("0", 0)])
def test_parse_acks(given, acks):
    assert parse_acks(given) == acks


def test_parse_acks_rejects_other_values():
    with pytest.raises(ValueError, match="acks"):
        parse_acks(2)


def test_serialize():
    assert serialize(None) is None and serialize(b"x") == b"x"
    assert serialize(bytearray(b"x")) == b"x" and serialize("é") == "é".encode()
    with pytest.raises(TypeError, match="value_serializer"):
        serialize(3)


def test_config_defaults_are_kafkas():
    c = ProducerConfig()
    assert (c.acks, c.linger_ms, c.batch_size, c.buffer_memory, c.delivery_timeout_ms,
            c.request_timeout_ms, c.retries, c.max_in_flight_requests_per_connection,
            c.max_block_ms) == (-1, 5, 16384, 32 << 20, 120000, 30000, 2147483647, 5, 60000)


@pytest.mark.parametrize("options,match", [
    ({"compression_type": "brotli"}, "compression"),
    ({"batch_size": 0}, "batch_size"),
    ({"delivery_timeout_ms": 1000}, "delivery_timeout_ms"),
    ({"acks": "some"}, "acks"),
])
def test_config_rejects_bad_options(options, match):
    with pytest.raises((ValueError, TidelogError), match=match):
        ProducerConfig(**options)


def test_idempotence_is_on_by_default_with_acks_all_only():
    assert ProducerConfig().enable_idempotence
    assert not ProducerConfig(acks=1).enable_idempotence
    assert not ProducerConfig(max_in_flight_requests_per_connection=6).enable_idempotence
    assert not ProducerConfig(enable_idempotence=False).enable_idempotence


@pytest.mark.parametrize("options, match", [
    ({"acks": 1}, "acks=1"), ({"acks": 0}, "acks=0"),
    ({"max_in_flight_requests_per_connection": 6}, "max_in_flight"), ({"retries": 0}, "retries=0"),
])
def test_idempotence_refuses_contradicting_options(options, match):
    with pytest.raises(ValueError, match=match):
        ProducerConfig(enable_idempotence=True, **options)
