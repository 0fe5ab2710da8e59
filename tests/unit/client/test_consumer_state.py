"""The consumer's pure parts: positions and resets, fetch planning, partition results, and
decoding fetched batches at the position."""

from __future__ import annotations

import dataclasses

import pytest

from tidelog.aio.cluster import ClusterMetadata
from tidelog.aio.fetcher import CompletedFetch, handle_partition_response, plan_fetches
from tidelog.aio.subscription import ConsumerConfig, PartitionState, SubscriptionState
from tidelog.protocol.errors import (
    FENCED_LEADER_EPOCH,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_SERVER_ERROR,
    CorruptRecordError,
    OffsetOutOfRangeError,
)
from tidelog.protocol.messages import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    BrokerMetadata,
    FetchPartitionResponse,
    MetadataResponse,
    PartitionMetadata,
    TopicMetadata,
)
from tidelog.protocol.records import build_batch, iter_headers, patch_batch, set_log_append_time
from tidelog.protocol.topics import TopicPartition
from tidelog.records import Record

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
CONFIG = ConsumerConfig(fetch_max_wait_ms=250, fetch_min_bytes=7, max_partition_fetch_bytes=1000)


def metadata(leaders):
    topics = {}
    for tp, leader in leaders.items():
        topics.setdefault(tp.topic, []).append(PartitionMetadata(0, tp.partition, leader, 4, [leader], [leader]))
    return ClusterMetadata().merge(MetadataResponse([BrokerMetadata(n, "h", 1) for n in (1, 2)], None, 1,
                                                    [TopicMetadata(0, t, ps) for t, ps in topics.items()]), None)


def batches(*spans, codec=0):
    """Back-to-back batches as a broker stores them: (base_offset, count) per batch."""
    out = bytearray()
    for base, count in spans:
        raw = bytearray(build_batch([b"%d" % (base + i) for i in range(count)], codec=codec, timestamp_ms=50))
        patch_batch(raw, 0, base, 0)
        out += raw
    return bytes(out)


def completed(tp, data):
    return CompletedFetch(tp, data, list(iter_headers(data)))


def test_assign_gives_new_partitions_the_default_reset_and_keeps_existing_state():
    subs = SubscriptionState(EARLIEST_TIMESTAMP)
    subs.assign([A0, A1])
    assert subs.needing_reset() == [A0, A1]
    subs.state(A0).seek(5)
    subs.assign([A0, B0])
    assert subs.state(A0).position == 5 and set(subs.partitions) == {A0, B0}
    with pytest.raises(ValueError):
        subs.state(A1)


def test_without_a_reset_strategy_a_new_partition_has_no_position():
    subs = SubscriptionState(None)
    subs.assign([A0])
    assert subs.missing_position() == [A0] and subs.fetchable(0) == []


def test_seek_and_reset_bump_the_generation_and_drop_buffered_data():
    state = PartitionState()
    state.seek(3)
    generation = state.generation
    state.buffered.append(completed(A0, batches((3, 2))))
    state.request_reset(LATEST_TIMESTAMP)
    assert state.generation == generation + 1 and not state.buffered and not state.has_position


def test_plan_fetches_one_request_per_leader_for_fetchable_partitions():
    subs = SubscriptionState(None)
    subs.assign([A0, A1, B0])
    for tp, offset in ((A0, 10), (A1, 20), (B0, 30)):
        subs.state(tp).seek(offset)
    plans, unknown = plan_fetches(subs, metadata({A0: 1, A1: 2, B0: 1}), busy_nodes=(), now=0, config=CONFIG)
    assert not unknown and set(plans) == {1, 2}
    request = plans[1].request
    assert (request.max_wait_ms, request.min_bytes) == (250, 7)
    assert {t.topic: [(p.partition, p.fetch_offset, p.partition_max_bytes, p.current_leader_epoch)
                      for p in t.partitions] for t in request.topics} == \
        {"a": [(0, 10, 1000, 4)], "b": [(0, 30, 1000, 4)]}
    assert plans[1].sent == {A0: (subs.state(A0).generation, 10), B0: (subs.state(B0).generation, 30)}


def test_plan_fetches_skips_busy_nodes_buffered_backing_off_and_leaderless_partitions():
    subs = SubscriptionState(None)
    subs.assign([A0, A1, B0])
    for tp in (A0, A1, B0):
        subs.state(tp).seek(0)
    subs.state(A1).retry_at = 5.0
    subs.state(B0).buffered.append(completed(B0, batches((0, 1))))
    plans, unknown = plan_fetches(subs, metadata({A0: 1}), busy_nodes=(), now=1.0, config=CONFIG)
    assert set(plans) == {1} and list(plans[1].sent) == [A0]
    plans, unknown = plan_fetches(subs, metadata({A0: 1}), busy_nodes={1}, now=1.0, config=CONFIG)
    assert plans == {}
    plans, unknown = plan_fetches(subs, metadata({}), busy_nodes=(), now=1.0, config=CONFIG)
    assert unknown


def first_in(plan) -> TopicPartition:
    """The partition that came first in the plan's request; its ``sent`` must begin with it
    (``Fetcher.absorb`` takes it from there)."""
    t = plan.request.topics[0]
    first = TopicPartition(t.topic, t.partitions[0].partition)
    assert next(iter(plan.sent)) == first
    return first


def test_plan_fetches_puts_a_partition_marked_fetch_first_first_in_its_request():
    subs = SubscriptionState(None)
    subs.assign([A0, A1, B0])
    for tp in (A0, A1, B0):
        subs.state(tp).seek(5)
    leaders = metadata({A0: 1, A1: 1, B0: 1})
    plans, _ = plan_fetches(subs, leaders, busy_nodes=(), now=0, config=CONFIG)
    first_in(plans[1])
    assert [(t.topic, [p.partition for p in t.partitions]) for t in plans[1].request.topics] == \
        [("a", [0, 1]), ("b", [0])]
    # b-0 got nothing below its high watermark while a-0 came first: b-0 goes first next time
    handle_partition_response(B0, subs.state(B0), subs.state(B0).generation, 5,
                              FetchPartitionResponse(0, 0, 9, 0), now=0, backoff_s=0, first=False)
    plans, _ = plan_fetches(subs, leaders, busy_nodes=(), now=0, config=CONFIG)
    first_in(plans[1])
    assert [(t.topic, [p.partition for p in t.partitions]) for t in plans[1].request.topics] == \
        [("b", [0]), ("a", [0, 1])]
    subs.state(B0).fetch_first = False
    subs.state(A1).fetch_first = True
    plans, _ = plan_fetches(subs, leaders, busy_nodes=(), now=0, config=CONFIG)
    first_in(plans[1])
    assert [(t.topic, [p.partition for p in t.partitions]) for t in plans[1].request.topics] == \
        [("a", [1, 0]), ("b", [0])]


def test_a_paused_partition_is_not_fetchable_and_keeps_its_pause_while_it_stays_assigned():
    subs = SubscriptionState(None)
    subs.assign([A0, A1])
    for tp in (A0, A1):
        subs.state(tp).seek(0)
    subs.state(A0).paused = True
    assert subs.fetchable(now=0) == [A1]
    plans, _ = plan_fetches(subs, metadata({A0: 1, A1: 1}), busy_nodes=(), now=0, config=CONFIG)
    assert list(plans[1].sent) == [A1]
    subs.assign([A0, B0])  # a cooperative rebalance keeps a-0
    assert subs.state(A0).paused and not subs.state(B0).paused
    subs.assign([])
    subs.assign([A0])  # revoked, then assigned again: a fresh state
    assert not subs.state(A0).paused


def state_at(offset):
    state = PartitionState()
    state.seek(offset)
    return state


def test_data_is_buffered_and_the_fetch_offset_moves_past_the_last_batch():
    state = state_at(3)
    data = batches((0, 5), (5, 2))
    outcome = handle_partition_response(A0, state, state.generation, 3,
                                        FetchPartitionResponse(0, 0, 7, 0, data), now=0, backoff_s=0.1)
    assert outcome.action == "data" and state.fetch_offset == 7 and state.high_watermark == 7
    assert state.position == 3 and len(state.buffered) == 1


def test_the_metrics_count_partitions_whose_high_watermark_is_held():
    """A leader whose ISR is below the effective min ISR says so in each fetch answer: the
    consumer's metrics count those partitions (their newer records are invisible for now)."""
    subs = SubscriptionState(None)
    subs.assign([A0, A1])
    assert subs.metrics() == {"assigned_partitions": 2, "records_lag_max": 0, "partitions_high_watermark_held": 0}
    for tp, hw, held in ((A0, 9, True), (A1, 4, False)):
        state = subs.state(tp)
        state.seek(3)
        handle_partition_response(tp, state, state.generation, 3, FetchPartitionResponse(
            0, 0, hw, 0, high_watermark_held=held), now=0, backoff_s=0)
    assert subs.metrics() == {"assigned_partitions": 2, "records_lag_max": 6, "partitions_high_watermark_held": 1}
    state = subs.state(A0)
    handle_partition_response(A0, state, state.generation, 3, FetchPartitionResponse(0, 0, 9, 0), now=0, backoff_s=0)
    assert subs.metrics()["partitions_high_watermark_held"] == 0


def test_a_response_for_an_older_generation_or_offset_is_stale():
    state = state_at(3)
    data = batches((0, 5))
    response = FetchPartitionResponse(0, 0, 5, 0, data)
    assert handle_partition_response(A0, state, state.generation - 1, 3, response, now=0, backoff_s=0).action == "stale"
    assert handle_partition_response(A0, state, state.generation, 2, response, now=0, backoff_s=0).action == "stale"
    assert handle_partition_response(A0, None, 0, 3, response, now=0, backoff_s=0).action == "stale"
    assert not state.buffered


def test_empty_fetch_changes_nothing_but_the_watermarks():
    state = state_at(3)
    outcome = handle_partition_response(A0, state, state.generation, 3, FetchPartitionResponse(0, 0, 3, 1),
                                        now=0, backoff_s=0)
    assert outcome.action == "empty" and state.fetch_offset == 3 and state.log_start_offset == 1


def test_nothing_below_the_high_watermark_for_the_first_partition_is_a_compacted_gap():
    # the broker answers the first partition of a fetch with a batch whenever one lies between
    # the fetch offset and the HW: none means the offsets were cleaned away
    state = state_at(3)
    outcome = handle_partition_response(A0, state, state.generation, 3, FetchPartitionResponse(0, 0, 9, 0),
                                        now=0, backoff_s=0, first=True)
    assert outcome.action == "gap" and (state.position, state.fetch_offset) == (9, 9)
    # not first: its share of the response may have been used up by the partitions before it;
    # it asks to be first in its next fetch, which tells
    state = state_at(3)
    outcome = handle_partition_response(A0, state, state.generation, 3, FetchPartitionResponse(0, 0, 9, 0),
                                        now=0, backoff_s=0, first=False)
    assert outcome.action == "empty" and (state.position, state.fetch_offset) == (3, 3)
    assert state.fetch_first
    outcome = handle_partition_response(A0, state, state.generation, 3, FetchPartitionResponse(0, 0, 9, 0),
                                        now=0, backoff_s=0, first=True)
    assert outcome.action == "gap" and (state.position, state.fetch_offset) == (9, 9)
    assert not state.fetch_first
    # caught up (nothing below the HW): nothing to ask
    outcome = handle_partition_response(A0, state, state.generation, 9, FetchPartitionResponse(0, 0, 9, 0),
                                        now=0, backoff_s=0, first=False)
    assert outcome.action == "empty" and not state.fetch_first
    # records still buffered: it waits until they are read (then the next empty answer moves it)
    state = state_at(3)
    handle_partition_response(A0, state, state.generation, 3,
                              FetchPartitionResponse(0, 0, 9, 0, batches((3, 2))), now=0, backoff_s=0)
    outcome = handle_partition_response(A0, state, state.generation, 5, FetchPartitionResponse(0, 0, 9, 0),
                                        now=0, backoff_s=0, first=True)
    assert outcome.action == "empty" and state.fetch_offset == 5


def test_offset_out_of_range_asks_for_a_reset():
    state = state_at(99)
    outcome = handle_partition_response(A0, state, state.generation, 99,
                                        FetchPartitionResponse(0, OFFSET_OUT_OF_RANGE.code, 5, 0), now=0, backoff_s=0)
    assert outcome.action == "reset" and isinstance(outcome.error, OffsetOutOfRangeError)
    assert "a-0" in str(outcome.error) and "99" in str(outcome.error)


@pytest.mark.parametrize("error,action", [(NOT_LEADER_OR_FOLLOWER, "refresh"), (FENCED_LEADER_EPOCH, "refresh"),
                                          (UNKNOWN_LEADER_EPOCH, "retry")])
def test_retriable_partition_errors_back_off(error, action):
    state = state_at(0)
    outcome = handle_partition_response(A0, state, state.generation, 0, FetchPartitionResponse(0, error.code),
                                        now=10.0, backoff_s=0.5)
    assert outcome.action == action and state.retry_at == 10.5


def test_other_errors_are_reported_and_the_partition_fetched_again_after_a_backoff():
    """As Kafka: TOPIC_AUTHORIZATION_FAILED is raised by poll and the partition is fetched
    again, so it resumes once the ACL is granted; nothing waits for a seek."""
    state = state_at(0)
    outcome = handle_partition_response(A0, state, state.generation, 0,
                                        FetchPartitionResponse(0, TOPIC_AUTHORIZATION_FAILED.code), now=10.0,
                                        backoff_s=0.5)
    assert outcome.action == "error" and "TOPIC_AUTHORIZATION_FAILED" in str(outcome.error)
    assert not state.stopped and state.retry_at == 10.5


def test_an_unknown_server_error_is_retried_without_raising():
    """Kafka's fetcher logs UNKNOWN_SERVER_ERROR and fetches again."""
    state = state_at(0)
    outcome = handle_partition_response(A0, state, state.generation, 0,
                                        FetchPartitionResponse(0, UNKNOWN_SERVER_ERROR.code), now=10.0, backoff_s=0.5)
    assert outcome.action == "retry" and not state.stopped and state.retry_at == 10.5
    assert "UNKNOWN_SERVER_ERROR" in str(outcome.error)  # for the log


def test_a_partial_batch_alone_is_reported_as_too_large():
    state = state_at(0)
    data = batches((0, 3))[:-4]
    outcome = handle_partition_response(A0, state, state.generation, 0, FetchPartitionResponse(0, 0, 3, 0, data),
                                        now=0, backoff_s=0)
    assert outcome.action == "error" and "max_partition_fetch_bytes" in str(outcome.error)


def test_take_skips_records_below_the_position_and_advances_it():
    state = state_at(3)
    fetch = completed(A0, batches((0, 5), (5, 3)))
    records = fetch.take(state, 100, check_crcs=True)
    assert [r.offset for r in records] == [3, 4, 5, 6, 7]
    assert [r.value for r in records] == [b"3", b"4", b"5", b"6", b"7"]
    assert records[0].topic == "a" and records[0].partition == 0 and records[0].timestamp == 50
    assert state.position == 8 and fetch.exhausted


def test_take_stops_at_max_records_and_resumes_in_the_middle_of_a_batch():
    state = state_at(0)
    fetch = completed(A0, batches((0, 5), (5, 3)))
    assert [r.offset for r in fetch.take(state, 3, True)] == [0, 1, 2]
    assert state.position == 3 and not fetch.exhausted
    assert [r.offset for r in fetch.take(state, 4, True)] == [3, 4, 5, 6]
    assert [r.offset for r in fetch.take(state, 4, True)] == [7]
    assert state.position == 8


def test_take_moves_the_position_over_offset_gaps_between_batches():
    state = state_at(0)
    fetch = completed(A0, batches((0, 2), (10, 1)))  # as after compaction
    assert [r.offset for r in fetch.take(state, 2, True)] == [0, 1]
    assert [r.offset for r in fetch.take(state, 5, True)] == [10]
    assert state.position == 11


def test_take_decodes_compressed_batches():
    state = state_at(1)
    fetch = completed(A0, batches((0, 4), codec=1))
    assert [r.offset for r in fetch.take(state, 10, True)] == [1, 2, 3]


def test_take_detects_a_corrupt_batch_when_checking_crcs():
    data = bytearray(batches((0, 3)))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        completed(A0, bytes(data)).take(state_at(0), 10, check_crcs=True)


def test_take_builds_records_with_their_own_headers_and_timestamp_type():
    with_headers = build_batch([(b"k", b"v", [("h", b"1")], 7), (None, b"w", None, 8)], base_offset=0)
    without = build_batch([b"x", b"y"], base_offset=2, timestamp_ms=9)
    records = completed(A0, with_headers + without).take(state_at(0), 10, check_crcs=False)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp, r.timestamp_type) for r in records] == [
        (0, b"k", b"v", [("h", b"1")], 7, 0), (1, None, b"w", [], 8, 0), (2, None, b"x", [], 9, 0),
        (3, None, b"y", [], 9, 0)]
    records[2].headers.append(("added", None))  # each record's (lazily made) list is its own
    assert records[3].headers == [] and records[2].headers == [("added", None)]
    assert dataclasses.asdict(records[3])["headers"] == []
    assert records[3] == Record("a", 0, 3, 9, None, b"y")


def test_take_builds_a_batch_of_one_record_as_any_other():
    # one record is built by one constructor call (a low rate's batches): the same records
    one = bytearray(build_batch([(b"k", b"v", [("h", b"1")], 7)], base_offset=0))
    two = bytearray(build_batch([b"x"], base_offset=1, timestamp_ms=9))
    set_log_append_time(two, 0, len(two), 11)
    records = completed(A0, bytes(one + two)).take(state_at(0), 10, check_crcs=True)
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp, r.timestamp_type) for r in records] == [
        (0, b"k", b"v", [("h", b"1")], 7, 0), (1, None, b"x", [], 11, 1)]
    state = state_at(1)  # below the position: skipped
    assert [r.offset for r in completed(A0, bytes(one + two)).take(state, 10, True)] == [1]
    assert state.position == 2


def test_consumer_config_validates():
    with pytest.raises(ValueError, match="auto_offset_reset"):
        ConsumerConfig(auto_offset_reset="smallest")
    assert ConsumerConfig(group_id="g").group_id == "g"


def test_unreturned_records_are_shared_safely_between_threads():
    """A facade's thread takes and puts back unreturned records while the loop thread
    commits (``consumed_positions``) and seeks (``give_back``): no 'deque mutated during
    iteration', no record lost."""
    import threading

    subs = SubscriptionState(default_reset=EARLIEST_TIMESTAMP)
    subs.assign([A0, A1])
    for tp in (A0, A1):
        subs.partitions[tp].seek(0)
    records = [Record("a", p, o, 0, None, b"") for o in range(50) for p in (0, 1)]
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop_thread():
        try:
            while not stop.is_set():
                subs.consumed_positions()
                subs.consumed_position(A1)
                subs.give_back([B0])  # holds nothing of B0: keeps every record
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=loop_thread)
    thread.start()
    try:
        for _ in range(2000):
            subs.put_back(records)
            taken = [subs.next_unreturned() for _ in range(5)] + subs.take_unreturned(len(records))
            assert taken == records
    finally:
        stop.set()
        thread.join()
    assert errors == []
