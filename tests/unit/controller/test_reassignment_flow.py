"""The controller's side of a reassignment (KIP-455), on an in-memory ZooKeeper: what it
writes to the topic znode and the partition state, and what it sends to which broker, when a
move starts, when the target joins the ISR, when it is cancelled, and after a failover."""

from __future__ import annotations

import pytest

from tests.support.controller_zk import FakeZk
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerContext
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    ELIGIBLE_LEADERS_NOT_AVAILABLE,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REQUEST,
    NO_REASSIGNMENT_IN_PROGRESS,
    NONE,
    REASSIGNMENT_IN_PROGRESS,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
)
from tidelog.protocol.topics import TopicPartition

T = "t"
TP = TopicPartition(T, 0)


def controller(live=(1, 2, 3, 4), replicas=(1, 2, 3), isr=(1, 2, 3), leader=1) -> tuple[Controller, FakeZk, list]:
    """A controller of brokers ``live`` with topic t, one partition; ``sent`` records every
    request it sends as (broker, api key, message)."""
    zk = FakeZk()
    zk.assignments[T] = {0: list(replicas)}
    zk.states[(T, 0)] = (LeaderAndIsr(leader, 5, tuple(isr), 1), 0)
    c = Controller(ControllerConfig(broker_id=live[0]), zk)
    c.ctx = ControllerContext(epoch=1, epoch_zk_version=0,
                              brokers={b: BrokerInfo(b, "127.0.0.1", 9000 + b) for b in live},
                              broker_epochs={b: 0 for b in live})
    sent: list = []
    c.channels.send = lambda b, key, msg: sent.append((b, key, msg))
    return c, zk, sent


async def load(c: Controller) -> None:
    await c._load_topic(T)


def to(sent, key):
    return sorted(b for b, k, _ in sent if k == key)


def state_sent(sent, broker):
    (msg,) = [m for b, k, m in sent if b == broker and k == ApiKey.LEADER_AND_ISR]
    (st,) = msg.partition_states
    return st


async def test_a_move_writes_rs_and_tells_every_replica_of_it():
    c, zk, sent = controller()
    await load(c)
    results, _ = await c.alter_reassignments([(TP, [2, 3, 4])])
    assert results == {TP: (NONE.code, None)}
    # RS = target + removed, with the replicas being added and removed beside it
    assert zk.assignments[T] == {0: [2, 3, 4, 1]}
    assert zk.moves[T] == {0: ((4,), (1,))}
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (1, 6, (1, 2, 3))  # a new epoch, same leader
    assert to(sent, ApiKey.LEADER_AND_ISR) == [1, 2, 3, 4]
    told = state_sent(sent, 4)
    assert (told.replicas, told.adding_replicas, told.removing_replicas) == ([2, 3, 4, 1], [4], [1])
    assert told.is_new and not any(state_sent(sent, b).is_new for b in (1, 2, 3))  # only the added
    assert to(sent, ApiKey.STOP_REPLICA) == []
    assert [tp for tp in c.reassignments(None)] == [TP]


async def test_the_move_completes_once_the_target_is_in_the_isr():
    c, zk, sent = controller()
    await load(c)
    await c.alter_reassignments([(TP, [2, 3, 4])])
    await c._advance_moves([TP])  # 4 not in sync yet: nothing happens
    assert zk.moves[T] == {0: ((4,), (1,))}
    zk.leader_changes_isr(T, 0, [1, 2, 3, 4])
    c.ctx.states[TP] = zk.states[(T, 0)]
    sent.clear()
    await c._advance_moves([TP])
    # leadership left the removed replica 1 for the first live target replica in sync
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (2, 7, (2, 3, 4))
    assert zk.assignments[T] == {0: [2, 3, 4]} and zk.moves[T] == {}
    assert to(sent, ApiKey.LEADER_AND_ISR) == [2, 3, 4]
    (stop,) = [m for b, k, m in sent if k == ApiKey.STOP_REPLICA and b == 1]
    assert [(p.topic_name, p.partition_index, p.delete_partition) for p in stop.partitions] == [(T, 0, True)]
    assert c.reassignments(None) == {}


async def test_cancelling_removes_what_the_move_added():
    c, zk, sent = controller()
    await load(c)
    await c.alter_reassignments([(TP, [2, 3, 4])])
    zk.leader_changes_isr(T, 0, [1, 2, 3, 4])  # 4 caught up, but the move is cancelled first
    c.ctx.states[TP] = zk.states[(T, 0)]
    sent.clear()
    results, _ = await c.alter_reassignments([(TP, None)])
    assert results == {TP: (NONE.code, None)}
    # the original replicas in RS order, as Kafka's cancel leaves them
    assert zk.assignments[T] == {0: [2, 3, 1]} and zk.moves[T] == {}
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.isr) == (1, (1, 2, 3))
    assert to(sent, ApiKey.STOP_REPLICA) == [4]


async def test_a_new_target_replaces_the_move_in_progress():
    c, zk, sent = controller(live=(1, 2, 3, 4, 5))
    await load(c)
    await c.alter_reassignments([(TP, [2, 3, 4])])
    sent.clear()
    await c.alter_reassignments([(TP, [2, 3, 5])])
    # measured from the original replicas: 4 is dropped again, 5 added, 1 still leaves
    assert zk.assignments[T] == {0: [2, 3, 5, 1]} and zk.moves[T] == {0: ((5,), (1,))}
    assert to(sent, ApiKey.STOP_REPLICA) == [4]


async def test_a_shrinking_replication_factor_completes_at_once():
    c, zk, sent = controller()
    await load(c)
    await c.alter_reassignments([(TP, [1, 2])])
    assert zk.assignments[T] == {0: [1, 2]} and zk.moves[T] == {}
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.isr) == (1, (1, 2))
    assert to(sent, ApiKey.STOP_REPLICA) == [3]


async def test_refusals_name_the_problem():
    c, zk, sent = controller()
    await load(c)
    results, _ = await c.alter_reassignments([
        (TP, [2, 9]), (TopicPartition(T, 7), [1]), (TopicPartition("nope", 0), [1])])
    assert results[TP][0] == INVALID_REPLICA_ASSIGNMENT.code and "[9]" in results[TP][1]
    assert results[TopicPartition(T, 7)][0] == UNKNOWN_TOPIC_OR_PARTITION.code
    assert results[TopicPartition("nope", 0)][0] == UNKNOWN_TOPIC_OR_PARTITION.code
    results, _ = await c.alter_reassignments([(TP, None)])
    assert results[TP][0] == NO_REASSIGNMENT_IN_PROGRESS.code
    results, _ = await c.alter_reassignments([(TP, [2, 3, 4]), (TP, [1, 2, 4])])
    assert results[TP][0] == INVALID_REQUEST.code
    assert zk.writes == 0 and sent == []


async def test_a_target_may_keep_a_replica_on_a_broker_that_is_down():
    # broker 3 is down; adding 4 while keeping 3 is allowed, as Kafka: only 4 must be registered
    c, zk, sent = controller(live=(1, 2, 4), isr=(1, 2))
    await load(c)
    results, _ = await c.alter_reassignments([(TP, [1, 2, 3, 4])])
    assert results == {TP: (NONE.code, None)}
    assert zk.assignments[T] == {0: [1, 2, 3, 4]} and zk.moves[T] == {0: ((4,), ())}
    assert to(sent, ApiKey.LEADER_AND_ISR) == [1, 2, 4]
    results, _ = await c.alter_reassignments([(TP, [1, 3, 5])])
    assert results[TP][0] == INVALID_REPLICA_ASSIGNMENT.code and "[5]" in results[TP][1]


async def test_a_cancel_that_would_leave_no_leader_is_refused():
    # the move made 4 leader and the original replicas fell out of sync: cancelling now
    # would hand the partition to nobody
    c, zk, sent = controller(live=(1, 2, 3, 4, 5, 6))
    await load(c)
    await c.alter_reassignments([(TP, [4, 5, 6])])
    zk.states[(T, 0)] = (LeaderAndIsr(4, 9, (4,), 1), zk.states[(T, 0)][1])
    c.ctx.states[TP] = zk.states[(T, 0)]
    results, _ = await c.alter_reassignments([(TP, None)])
    assert results[TP][0] == ELIGIBLE_LEADERS_NOT_AVAILABLE.code and "[4]" in results[TP][1]
    assert c.reassignments(None)[TP].target == (4, 5, 6)


async def test_a_new_controller_resumes_the_move():
    c, zk, _ = controller()
    await load(c)
    await c.alter_reassignments([(TP, [2, 3, 4])])
    zk.leader_changes_isr(T, 0, [1, 2, 3, 4])
    successor, _, sent = controller()
    successor.zk = zk
    await load(successor)
    assert successor.reassignments(None)[TP].target == (2, 3, 4)
    await successor._advance_moves([TP])
    assert zk.assignments[T] == {0: [2, 3, 4]} and to(sent, ApiKey.STOP_REPLICA) == [1]


async def test_partitions_cannot_be_added_while_a_topic_moves():
    c, zk, _ = controller()
    await load(c)
    await c.alter_reassignments([(TP, [2, 3, 4])])
    with pytest.raises(TidelogError) as e:
        await c.create_partitions(T, 2, None, validate_only=False)
    assert e.value.code == REASSIGNMENT_IN_PROGRESS.code


async def test_a_returning_broker_gets_a_full_leader_and_isr_only_from_a_complete_view():
    c, zk, sent = controller()
    await load(c)
    c._send_leader_and_isr(4, [], full=True)
    assert sent == []  # the topics were not all read (no failover ran): nothing may look stray
    c.ctx.complete = True
    c._send_leader_and_isr(4, [tp for tp in c.ctx.all_partitions() if 4 in c._replicas(tp)], full=True)
    (msg,) = [m for b, k, m in sent if b == 4]
    assert msg.full and msg.partition_states == []  # 4 holds nothing: any log of it is stray
    sent.clear()
    c.ctx.states.clear()  # a partition without a known state: nothing may look stray
    c._send_leader_and_isr(1, [TP], full=True)
    assert sent == []


async def test_a_target_equal_to_the_replicas_changes_nothing():
    c, zk, sent = controller()
    await load(c)
    results, _ = await c.alter_reassignments([(TP, [1, 2, 3])])
    assert results == {TP: (NONE.code, None)}
    assert zk.writes == 0 and sent == [] and c.reassignments(None) == {}


async def test_a_cancel_refused_on_a_fresh_state_leaves_the_move_as_it_was():
    # the cancel is planned on a state where 1 is in sync; a leader's ISR write removes it
    # before the controller's own write: the move stays, nothing is stopped or deleted
    c, zk, sent = controller(live=(1, 2, 3, 4, 5, 6))
    await load(c)
    await c.alter_reassignments([(TP, [4, 5, 6])])
    zk.states[(T, 0)] = (LeaderAndIsr(4, 9, (4, 1), 1), zk.states[(T, 0)][1])
    c.ctx.states[TP] = zk.states[(T, 0)]
    zk.leader_changes_isr(T, 0, [4])
    sent.clear()
    results, _ = await c.alter_reassignments([(TP, None)])
    assert results[TP][0] == ELIGIBLE_LEADERS_NOT_AVAILABLE.code
    assert zk.assignments[T] == {0: [4, 5, 6, 1, 2, 3]} and c.reassignments(None)[TP].target == (4, 5, 6)
    assert to(sent, ApiKey.STOP_REPLICA) == []
