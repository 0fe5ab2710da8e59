"""The consumer group client's pure decisions: error tables, join prepare/complete for the
eager and cooperative protocols, heartbeat timing, automatic commit offsets, patterns."""

from __future__ import annotations

import re

import pytest

from tidelog.aio.assignors import COOPERATIVE, EAGER
from tidelog.aio.cluster import ClusterMetadata
from tidelog.aio.commits import auto_commit_offsets, coalesce_commit, commit_failed_message, not_superseded
from tidelog.aio.group import matching_topics
from tidelog.aio.heartbeat import HeartbeatTimer
from tidelog.aio.membership import (
    COMMIT_ACTIONS,
    FATAL,
    HEARTBEAT_ACTIONS,
    JOIN_ACTIONS,
    OK,
    REDISCOVER,
    REJOIN,
    RESET_MEMBER,
    RETRY,
    SYNC_ACTIONS,
    TAKE_MEMBER_ID,
    Generation,
    action_for,
    complete_join,
    heartbeat_action,
    prepare_join,
)
from tidelog.aio.subscription import ConsumerConfig, SubscriptionState
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_AUTHORIZATION_FAILED,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_REQUEST,
    MEMBER_ID_REQUIRED,
    NONE,
    NOT_COORDINATOR,
    REBALANCE_IN_PROGRESS,
    REQUEST_TIMED_OUT,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_SERVER_ERROR,
)
from tidelog.protocol.messages import (
    EARLIEST_TIMESTAMP,
    BrokerMetadata,
    MetadataResponse,
    PartitionMetadata,
    TopicMetadata,
)
from tidelog.protocol.topics import TopicPartition as TP

A0, A1, B0 = TP("a", 0), TP("a", 1), TP("b", 0)


@pytest.mark.parametrize("table, code, action", [
    (JOIN_ACTIONS, NONE, OK),
    (JOIN_ACTIONS, MEMBER_ID_REQUIRED, TAKE_MEMBER_ID),
    (JOIN_ACTIONS, UNKNOWN_MEMBER_ID, RESET_MEMBER),
    (JOIN_ACTIONS, COORDINATOR_LOAD_IN_PROGRESS, RETRY),
    (JOIN_ACTIONS, NOT_COORDINATOR, REDISCOVER),
    (JOIN_ACTIONS, FENCED_INSTANCE_ID, FATAL),
    (JOIN_ACTIONS, INCONSISTENT_GROUP_PROTOCOL, FATAL),
    (SYNC_ACTIONS, REBALANCE_IN_PROGRESS, REJOIN),
    (SYNC_ACTIONS, ILLEGAL_GENERATION, RESET_MEMBER),
    (HEARTBEAT_ACTIONS, REBALANCE_IN_PROGRESS, REJOIN),
    (HEARTBEAT_ACTIONS, COORDINATOR_NOT_AVAILABLE, REDISCOVER),
    (HEARTBEAT_ACTIONS, FENCED_INSTANCE_ID, FATAL),
    (HEARTBEAT_ACTIONS, GROUP_AUTHORIZATION_FAILED, FATAL),
    (HEARTBEAT_ACTIONS, NOT_COORDINATOR, REDISCOVER),
    (HEARTBEAT_ACTIONS, ILLEGAL_GENERATION, RESET_MEMBER),
    (HEARTBEAT_ACTIONS, UNKNOWN_MEMBER_ID, RESET_MEMBER),
    (COMMIT_ACTIONS, ILLEGAL_GENERATION, RESET_MEMBER),
    (COMMIT_ACTIONS, REBALANCE_IN_PROGRESS, REJOIN),
    (COMMIT_ACTIONS, GROUP_AUTHORIZATION_FAILED, FATAL),
])
def test_error_tables(table, code, action):
    assert action_for(table, code.code) == action


@pytest.mark.parametrize("code", [REQUEST_TIMED_OUT.code, COORDINATOR_LOAD_IN_PROGRESS.code,
                                  UNKNOWN_SERVER_ERROR.code, INVALID_REQUEST.code, 9999])
def test_any_other_heartbeat_answer_is_a_failed_heartbeat_retried(code):
    # Kafka's heartbeat thread: failHeartbeat for whatever its response handler does not name
    assert heartbeat_action(code) == RETRY


def test_a_failed_heartbeat_is_sent_again_after_the_backoff_not_an_interval():
    # Kafka's Heartbeat.failHeartbeat: the timer restarts at the retry backoff
    t = HeartbeatTimer(session_timeout_s=10, heartbeat_interval_s=3, max_poll_interval_s=60, now=100.0)
    t.sent(100.0)
    t.failed(100.5, 0.2)
    assert t.time_to_next_heartbeat(100.6) == pytest.approx(0.1)
    t.sent(100.7)
    t.received(100.8)
    assert t.time_to_next_heartbeat(101.0) == pytest.approx(2.7)  # answered: the interval again


def test_prepare_join_eager_revokes_everything():
    prep = prepare_join(EAGER, {A0, B0}, True, {"a", "b"})
    assert prep.revoke == {A0, B0} and not prep.lose


def test_prepare_join_cooperative_revokes_only_unsubscribed():
    prep = prepare_join(COOPERATIVE, {A0, B0}, True, {"a"})
    assert prep.revoke == {B0} and not prep.lose


@pytest.mark.parametrize("protocol", [EAGER, COOPERATIVE])
def test_prepare_join_without_generation_loses_everything(protocol):
    prep = prepare_join(protocol, {A0, B0}, False, {"a", "b"})
    assert prep.lose == {A0, B0} and not prep.revoke


def test_complete_join_eager_all_new():
    done = complete_join(EAGER, set(), {A0, A1})
    assert done.added == {A0, A1} and not done.revoked and not done.rejoin


def test_complete_join_cooperative_revokes_and_rejoins():
    done = complete_join(COOPERATIVE, {A0, A1}, {A1, B0})
    assert done.assignment == {A1, B0} and done.added == {B0} and done.revoked == {A0} and done.rejoin
    same = complete_join(COOPERATIVE, {A0}, {A0})
    assert not same.added and not same.revoked and not same.rejoin


def test_heartbeat_timer():
    t = HeartbeatTimer(session_timeout_s=10, heartbeat_interval_s=3, max_poll_interval_s=60, now=100.0)
    assert t.time_to_next_heartbeat(100.0) == 0.0
    t.sent(100.0)
    assert t.time_to_next_heartbeat(101.0) == 3  # in flight: wait an interval
    t.received(100.5)
    assert t.time_to_next_heartbeat(102.0) == pytest.approx(1.0)
    assert not t.session_expired(110.0) and t.session_expired(110.6)
    assert not t.poll_timeout_expired(160.0) and t.poll_timeout_expired(160.1)
    t.polled(150.0)
    assert t.time_to_poll_timeout(170.0) == pytest.approx(40.0)
    t.reset_session(200.0)
    assert t.time_to_next_heartbeat(200.0) == 3 and not t.session_expired(209.0)


def test_auto_commit_sends_each_position_that_differs_from_the_committed_offset():
    assert auto_commit_offsets({A0: 5, B0: 7}, {A0: 5}) == {B0: 7}  # nothing new for A0
    assert auto_commit_offsets({A0: 6}, {A0: 5}) == {A0: 6}
    # after a seek back, the consumed position is committed as it is (as Kafka does), so the
    # records after it are consumed again after a crash
    assert auto_commit_offsets({A0: 5, A1: 3, B0: 7}, {A0: 5, A1: 4}) == {A1: 3, B0: 7}


def test_matching_topics_full_match_without_internal():
    md = ClusterMetadata().merge(MetadataResponse([BrokerMetadata(1, "h", 1)], None, 1, [
        TopicMetadata(0, name, [PartitionMetadata(0, 0, 1, 0, [1], [1])], internal)
        for name, internal in [("orders", False), ("orders-eu", False), ("x-orders", False),
                               ("__consumer_offsets", True), ("__audit", False)]]), None)
    assert matching_topics(re.compile("orders.*"), md) == {"orders", "orders-eu"}
    # as Kafka: a user topic named with "__" is not internal, only the broker's own topics are
    assert matching_topics(re.compile(".*"), md) == {"orders", "orders-eu", "x-orders", "__audit"}
    assert "__consumer_offsets" in matching_topics(re.compile(".*"), md, exclude_internal=False)


def test_commit_failed_message_says_what_happened_and_what_to_do():
    text = commit_failed_message("g", "the coordinator answered ILLEGAL_GENERATION")
    for phrase in ("rebalanced", "reassigned", "max_poll_interval_ms", "max_poll_records", "ILLEGAL_GENERATION"):
        assert phrase in text


def test_group_assignment_awaits_committed_offsets():
    subs = SubscriptionState(EARLIEST_TIMESTAMP)
    subs.assign([A0, A1], need_committed=True)
    assert set(subs.awaiting_committed()) == {A0, A1}
    assert not subs.missing_position() and not subs.needing_reset() and not subs.fetchable(0)
    subs.partitions[A0].seek(42)
    subs.reset_to_default(A1)
    assert subs.consumed_positions() == {A0: 42} and subs.needing_reset() == [A1]
    none = SubscriptionState(None)
    none.assign([A0], need_committed=True)
    none.reset_to_default(A0)
    assert none.missing_position() == [A0]


@pytest.mark.parametrize("options, problem", [
    ({"group_instance_id": "i"}, "needs a group_id"),
    ({"group_id": "g", "heartbeat_interval_ms": 10000, "session_timeout_ms": 6000}, "lower than"),
    ({"group_id": "g", "partition_assignment_strategy": ["sticky"]}, "unknown partition assignor"),
    ({"group_id": ""}, "non-empty"),
])
def test_group_options_are_checked(options, problem):
    with pytest.raises(ValueError, match=problem):
        ConsumerConfig(**options)


def test_commits_reaching_the_lock_out_of_order_never_move_back():
    sent = {}
    later = {A0: 10, A1: 7}
    assert not_superseded(later, 2, sent) == later
    sent.update(dict.fromkeys(later, 2))
    assert not_superseded({A0: 5, B0: 3}, 1, sent) == {B0: 3}  # the older commit's A0 is stale
    assert not_superseded({A0: 4}, 3, sent) == {A0: 4}  # a newer explicit commit may move back


def test_a_commit_sends_the_latest_offset_asked_for_its_partitions_in_its_generation():
    g1, g2 = Generation(1, "m"), Generation(2, "m")
    requested = {A0: (5, 50, g1), A1: (3, 30, g1), B0: (6, 60, g2)}
    # commit 3 asked for A0 and B0; commit 5 (same generation) later asked A0 -> 50
    assert coalesce_commit({A0: 20, B0: 21}, 3, g1, requested) == ({A0: 50, B0: 21}, {A0: 5, B0: 3})
    # its own request is the latest: sent as asked
    assert coalesce_commit({A1: 30}, 3, g1, requested) == ({A1: 30}, {A1: 3})
    # a later commit of another generation is not borrowed (that member may no longer own it)
    assert coalesce_commit({B0: 40}, 4, g1, requested) == ({B0: 40}, {B0: 4})
    # a later commit asking a lower offset (after a seek back) still wins: the latest request is what is stored
    assert coalesce_commit({A0: 70}, 4, g1, requested) == ({A0: 50}, {A0: 5})
