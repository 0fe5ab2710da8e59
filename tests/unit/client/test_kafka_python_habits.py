"""kafka-python's habits, the pure parts: where the consumer's positional arguments go,
commits with OffsetAndMetadata (the metadata string travels with its offset, also when a
later commit's offset is sent in its place), committed offsets with their metadata, the
metrics' two shapes, and record futures' ``get`` / ``add_callback`` / ``add_errback``."""

from __future__ import annotations

import pytest
import trio

from tests.unit.client.test_group_member import A0, ScriptedCluster, commit_ok, member, wait_sent
from tidelog import OffsetAndMetadata
from tidelog.aio.accumulator import ProduceResult, RecordFuture
from tidelog.aio.commits import commit_request
from tidelog.aio.consumer import Metrics, rewind_offsets, split_commit
from tidelog.aio.membership import NO_GENERATION_INFO
from tidelog.aio.subscription import SubscriptionState
from tidelog.blocking import split_positional
from tidelog.errors import ClientClosedError, RequestTimedOut
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.messages import (
    EARLIEST_TIMESTAMP,
    OffsetFetchPartitionResponse,
    OffsetFetchResponse,
    OffsetFetchTopicResponse,
)
from tidelog.protocol.topics import TopicPartition as TP
from tidelog.records import Record, RecordMetadata

A1 = TP("a", 1)


@pytest.mark.parametrize("args, keyword, expected", [
    (("orders", "payments"), "h:1", ("h:1", ["orders", "payments"])),  # kafka-python's form
    (("orders",), None, ("localhost:9092", ["orders"])),  # kafka-python's default servers
    (("h:1",), None, ("h:1", [])),  # Tidelog's form: servers first
    (("h:1,h:2", "t"), None, ("h:1,h:2", ["t"])),
    ((["h:1", "h:2"], "t"), None, (["h:1", "h:2"], ["t"])),
    ((), None, ("localhost:9092", [])),
])
def test_positional_arguments_are_topics_unless_the_first_names_servers(args, keyword, expected):
    assert split_positional(args, keyword) == expected


@pytest.mark.parametrize("args, keyword", [(("h:1",), "h:2"), (("t", ["x"]), None)])
def test_servers_given_twice_or_a_list_among_topics_is_a_type_error(args, keyword):
    with pytest.raises(TypeError):
        split_positional(args, keyword)


def test_split_commit_takes_ints_and_offset_and_metadata():
    assert split_commit({A0: 5, ("a", 1): OffsetAndMetadata(7, "m")}) == ({A0: 5, A1: 7}, {A1: "m"})
    assert split_commit({A0: OffsetAndMetadata(3)}) == ({A0: 3}, {A0: ""})
    assert split_commit({A0: (3, None, -1)}) == ({A0: 3}, {A0: None})  # kafka-python's own tuple


def test_commit_request_carries_metadata_per_partition():
    request = commit_request("g", {A0: 5, A1: 7}, NO_GENERATION_INFO, None, {A1: "m"})
    assert [(p.partition_index, p.committed_offset, p.committed_metadata)
            for p in request.topics[0].partitions] == [(0, 5, None), (1, 7, "m")]


def test_rewind_offsets_is_each_partitions_first_record():
    records = [Record("a", 0, 4, 0, None, b""), Record("a", 1, 9, 0, None, b""), Record("a", 0, 5, 0, None, b"")]
    assert rewind_offsets(records) == {A0: 4, A1: 9}


def test_metrics_keep_their_flat_gauges_and_answer_kafka_pythons_shape():
    m = Metrics({"assigned_partitions": 2, "records_lag_max": 6, "partitions_high_watermark_held": 1})
    assert m["records_lag_max"] == 6
    assert m() == {"consumer-metrics": {"assigned-partitions": 2},
                   "consumer-fetch-manager-metrics": {"records-lag-max": 6, "partitions-high-watermark-held": 1}}


async def test_a_commit_sends_its_metadata_and_committed_returns_it(autojump_clock):
    cluster = ScriptedCluster()

    async def answer_commit(message):
        return commit_ok(message)

    async def answer_fetch(message):
        return OffsetFetchResponse(0, [OffsetFetchTopicResponse("a", [
            OffsetFetchPartitionResponse(0, 5, -1, "m"), OffsetFetchPartitionResponse(1, 7, -1, None)])])

    cluster.handlers[ApiKey.OFFSET_COMMIT] = answer_commit
    cluster.handlers[ApiKey.OFFSET_FETCH] = answer_fetch
    group = member(cluster, SubscriptionState(EARLIEST_TIMESTAMP))
    await group.offsets.commit({A0: 5}, trio.current_time() + 5, {A0: "m"})
    assert cluster.sent[0][1].topics[0].partitions[0].committed_metadata == "m"
    found = await group.offsets.fetch_committed_metadata([A0, A1, TP("b", 0)], trio.current_time() + 5)
    assert found == {A0: OffsetAndMetadata(5, "m"), A1: OffsetAndMetadata(7, ""), TP("b", 0): None}
    assert await group.offsets.fetch_committed([A0], trio.current_time() + 5) == {A0: 5}
    with pytest.raises(ValueError):
        await group.offsets.commit({A0: 6}, trio.current_time() + 5, {A0: b"bytes"})


async def test_a_coalesced_commit_sends_the_later_commits_metadata_with_its_offset(autojump_clock):
    cluster, release = ScriptedCluster(), trio.Event()

    async def held_commit(message):
        await release.wait()
        return commit_ok(message)

    cluster.handlers[ApiKey.OFFSET_COMMIT] = held_commit
    group = member(cluster, SubscriptionState(EARLIEST_TIMESTAMP))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(group.offsets.commit, {A0: 1}, trio.current_time() + 60, {A0: "first"})
        await wait_sent(cluster, 1)
        # a second commit waits behind the first; a third, queued after it, is coalesced into it
        nursery.start_soon(group.offsets.commit, {A0: 2}, trio.current_time() + 60, {A0: "second"})
        await trio.sleep(1)
        nursery.start_soon(group.offsets.commit, {A0: 3}, trio.current_time() + 60, {A0: "third"})
        await trio.sleep(1)
        release.set()
    sent = [(p.committed_offset, p.committed_metadata) for _, m in cluster.sent for p in m.topics[0].partitions]
    assert sent == [(1, "first"), (3, "third")]


def test_record_future_get_add_callback_and_add_errback():
    result = ProduceResult(TP("t", 0))
    future = RecordFuture(result, 2, 77)
    seen: list = []
    assert future.add_callback(lambda md, extra=None: seen.append(("ok", md, extra)), extra="x") is future
    future.add_errback(lambda tag, e: seen.append((tag, e)), "failed")
    with pytest.raises(RequestTimedOut):
        future.get(timeout=0.01)
    assert (future.is_done, future.succeeded(), future.failed(), future.value) == (False, False, False, None)
    result.complete(base_offset=10)
    assert future.get(timeout=0) == RecordMetadata("t", 0, 12, 77)
    assert (future.is_done, future.succeeded(), future.failed()) == (True, True, False)
    assert future.value == RecordMetadata("t", 0, 12, 77)
    assert seen == [("ok", RecordMetadata("t", 0, 12, 77), "x")]

    failed = ProduceResult(TP("t", 0))
    error = ClientClosedError("closed")
    failed.complete(error=error)
    later: list = []
    failed_future = RecordFuture(failed, 0, 0)
    failed_future.add_callback(later.append).add_errback(later.append)  # done: called at once
    assert later == [error]
    assert (failed_future.is_done, failed_future.succeeded(), failed_future.failed(), failed_future.value) == (
        True, False, True, None)


def test_poll_records_are_a_list_that_also_groups_by_partition():
    from tidelog.records import ConsumerRecords

    records = ConsumerRecords([Record("a", 0, 4, 0, None, b"x"), Record("a", 1, 9, 0, None, b"y"),
                               Record("a", 0, 5, 0, None, b"z")])
    assert [r.offset for r in records] == [4, 9, 5] and len(records) == 3
    assert [(tp, [r.offset for r in rs]) for tp, rs in records.items()] == [(A0, [4, 5]), (A1, [9])]
    assert list(records.keys()) == [A0, A1] and [len(v) for v in records.values()] == [2, 1]
    assert [r.offset for r in records.get(("a", 1))] == [9] and records.get(TP("b", 0)) is None
    assert list(ConsumerRecords().items()) == []
