"""``Admin.log_end_offsets`` against the fake cluster: each leader is asked as a debugging
replica (ListOffsets latest, replica id -2), retried while a leader is stale, and the
blocking facade returns the same."""

from __future__ import annotations

from tidelog import Admin
from tidelog.aio import AsyncAdmin, TopicPartition
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import NOT_LEADER_OR_FOLLOWER
from tidelog.protocol.messages import DEBUGGING_REPLICA_ID, LATEST_TIMESTAMP
from tidelog.protocol.records import build_batch

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def fill(cluster, tp, count):
    cluster.log(tp.topic, tp.partition).append(build_batch([(None, b"v", None, 1000 + i) for i in range(count)]))


async def test_each_leader_is_asked_for_its_log_end_offset_as_a_debugging_replica(fake):
    fake.create_topic("t", 2, leaders=[0, 1])
    fill(fake, T0, 3)
    fill(fake, T1, 5)
    fake.inject(ApiKey.LIST_OFFSETS, node=1, error_code=NOT_LEADER_OR_FOLLOWER.code)  # retried
    async with AsyncAdmin(fake.bootstrap, retry_backoff_ms=10) as admin:
        assert await admin.log_end_offsets([T0, T1], timeout_ms=5000) == {T0: 3, T1: 5}
    sent = [(node, r) for node, key, r in fake.requests if key == ApiKey.LIST_OFFSETS]
    assert sorted(node for node, _ in sent) == [0, 1, 1]  # node 1 twice: after its error
    assert all(r.replica_id == DEBUGGING_REPLICA_ID for _, r in sent)
    assert all(p.timestamp == LATEST_TIMESTAMP for _, r in sent for t in r.topics for p in t.partitions)


async def test_no_partitions_ask_nothing(fake):
    async with AsyncAdmin(fake.bootstrap) as admin:
        assert await admin.log_end_offsets([]) == {}


def test_the_blocking_admin_returns_the_log_end_offsets(threaded_fake):
    threaded_fake.call(threaded_fake.cluster.create_topic, "t", 1)
    threaded_fake.call(fill, threaded_fake.cluster, T0, 4)
    with Admin(threaded_fake.cluster.bootstrap) as admin:
        assert admin.log_end_offsets([T0], timeout_ms=5000) == {T0: 4}
