"""The controller's partition-state writes against a leader's concurrent ISR changes.

A leader writes its own ISR shrinks and expansions to the state znode; the controller learns of
them from a notification it may not have handled yet, so its copy can be stale when it writes.
The write then hits a version conflict, and the controller must read the state again and decide
again (as Kafka's controller retries BADVERSION partitions), never write a decision made on the
stale copy, and never abandon the rest of its work.
"""

from __future__ import annotations

import pytest
import trio

from tests.support.controller_zk import FakeZk
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerContext, ControllerEvent
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr, ZkTimeoutError
from tidelog.protocol.errors import NOT_CONTROLLER
from tidelog.protocol.topics import TopicPartition

T = "t"


def controller_with(states: dict[int, LeaderAndIsr], live: list[int]) -> tuple[Controller, FakeZk]:
    zk = FakeZk()
    c = Controller(ControllerConfig(broker_id=live[0]), zk)
    c.ctx = ControllerContext(epoch=1, epoch_zk_version=0,
                              brokers={b: BrokerInfo(b, "127.0.0.1", 9000 + b) for b in live},
                              broker_epochs={b: 0 for b in live},
                              assignments={T: {p: [1, 2, 3] for p in states}})
    for p, st in states.items():
        zk.states[(T, p)] = (st, 0)
        c.ctx.states[TopicPartition(T, p)] = (st, 0)
    return c, zk


async def test_shrink_decides_again_on_the_fresh_state():
    # broker 3 died; meanwhile leader 1 removed 2 from partition 0's ISR (not yet seen)
    c, zk = controller_with({0: LeaderAndIsr(1, 0, (1, 2, 3), 1), 1: LeaderAndIsr(1, 0, (1, 2, 3), 1)}, [1, 2])
    zk.leader_changes_isr(T, 0, [1, 3])
    await c._shrink_isr([TopicPartition(T, 0), TopicPartition(T, 1)], {3})
    # partition 0: 3 removed from the fresh ISR [1, 3]; the stale decision [1, 2] would have
    # put the lagging 2 back in sync
    st, version = zk.states[(T, 0)]
    assert (st.leader, st.isr, version) == (1, (1,), 2)
    assert c.ctx.states[TopicPartition(T, 0)] == (st, 2)
    # the conflict did not stop the work on the next partition
    assert zk.states[(T, 1)][0].isr == (1, 2)


async def test_shrink_writes_nothing_when_the_leader_already_did_it():
    c, zk = controller_with({0: LeaderAndIsr(1, 0, (1, 2, 3), 1)}, [1, 2])
    zk.leader_changes_isr(T, 0, [1, 2])
    await c._shrink_isr([TopicPartition(T, 0)], {3})
    assert zk.writes == 0
    assert c.ctx.states[TopicPartition(T, 0)] == (LeaderAndIsr(1, 0, (1, 2), 1), 1)


async def test_offline_election_uses_the_isr_the_dead_leader_wrote_last():
    # leader 3 shrank its ISR to [3, 1] just before it died: 2 must not lead or be in sync
    c, zk = controller_with({0: LeaderAndIsr(3, 4, (3, 2, 1), 1)}, [1, 2])
    zk.leader_changes_isr(T, 0, [3, 1])
    await c._elect_offline([TopicPartition(T, 0)])
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (1, 5, (1,))


@pytest.mark.parametrize("broker_default, topic_setting, elected", [
    (True, "false", None),  # the topic protects its data against the broker's default
    (False, "TRUE", 3),  # any case the config validation takes
    (True, None, 3),  # no setting of its own: the broker's
    (False, None, None),
])
async def test_a_topics_unclean_election_setting_wins_over_the_brokers(broker_default, topic_setting, elected):
    # leader 1 died with the ISR [1]; only the out-of-sync 3 is alive
    import dataclasses
    c, zk = controller_with({0: LeaderAndIsr(1, 4, (1,), 1)}, [3])
    c.config = dataclasses.replace(c.config, unclean_leader_election=broker_default)
    c.ctx.assignments[T] = {0: [1, 3]}
    if topic_setting is not None:
        c.ctx.topic_configs[T] = {"unclean.leader.election.enable": topic_setting}
    await c._elect_offline([TopicPartition(T, 0)])
    st, _ = zk.states[(T, 0)]
    assert (st.leader if st.leader != -1 else None) == elected


async def test_a_broker_restarted_unseen_is_first_gone_then_joined(nursery):
    """Leader 1 restarted (a new broker epoch) before the controller saw its old session end:
    as Kafka's bounced brokers, it is handled as gone (a new leader in a new epoch, out of the
    ISR: it may have lost an unflushed tail), then as joined (it follows, and catches up)."""
    c, zk = controller_with({0: LeaderAndIsr(1, 4, (1, 2), 1)}, [1, 2])
    await nursery.start(c.channels.run)
    zk.live = {1: 7, 2: 0}  # broker 1 registered again, epoch 7
    await c._on_brokers(None)
    c.channels.close_all()
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, 1 in st.isr) == (2, 5, False)
    assert c.ctx.broker_epochs == {1: 7, 2: 0} and c.ctx.live == {1, 2}


async def test_a_partition_created_with_no_live_replica_starts_once_one_is_live():
    # created while its replicas were down (a rolling restart, say): no leader, an empty ISR;
    # an empty ISR elects nobody, but this partition never had a leader nor a record
    c, zk = controller_with({0: LeaderAndIsr(-1, 0, (), 1)}, [2])
    c.ctx.assignments[T] = {0: [1, 2]}
    await c._elect_offline([TopicPartition(T, 0)])
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (2, 1, (2,))


async def test_controlled_shutdown_moves_leadership_despite_a_conflict():
    c, zk = controller_with({0: LeaderAndIsr(2, 0, (2, 1, 3), 1)}, [1, 2, 3])
    zk.leader_changes_isr(T, 0, [2, 1])  # leader 2 dropped 3
    remaining, _ = await c.controlled_shutdown(2, broker_epoch=0)
    st, _ = zk.states[(T, 0)]
    assert remaining == [] and (st.leader, st.isr) == (1, (1,))


async def test_controlled_shutdown_does_not_wait_for_partitions_with_no_other_replica():
    # as Kafka's doControlledShutdown: only partitions with more than one replica remain
    c, zk = controller_with({0: LeaderAndIsr(2, 0, (2,), 1), 1: LeaderAndIsr(2, 0, (2, 1), 1)}, [2])
    c.ctx.assignments[T] = {0: [2], 1: [2, 1]}
    remaining, _ = await c.controlled_shutdown(2, broker_epoch=0)
    assert remaining == [TopicPartition(T, 1)]  # 1 is offline: no ISR member to move to yet


async def test_gives_up_after_repeated_conflicts():
    c, zk = controller_with({0: LeaderAndIsr(1, 0, (1, 2, 3), 1)}, [1, 2])
    real_get = zk.get_partition_state

    async def get_then_change(topic, partition):
        got = await real_get(topic, partition)
        zk.leader_changes_isr(T, partition, [1, 2, 3])  # a leader that keeps writing
        return got
    zk.get_partition_state = get_then_change
    zk.leader_changes_isr(T, 0, [1, 2, 3])
    await c._shrink_isr([TopicPartition(T, 0)], {3})
    assert zk.writes == 0


async def test_a_zookeeper_timeout_mid_event_reads_the_cluster_again(nursery):
    """Broker 3, the leader, dies and the offline election's write times out after the event
    dropped 3 from the controller's view: repeating the event would find no broker gone. The
    controller reads everything again, as a new controller does, and elects the leader."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[T] = {0: [3, 1, 2]}
    zk.states[(T, 0)] = (LeaderAndIsr(3, 0, (3, 1, 2), 0), 0)
    c = Controller(ControllerConfig(broker_id=1), zk)
    await nursery.start(c.channels.run)
    await c._on_controller_change()
    assert c.is_active and zk.controller == 1

    del zk.live[3]
    zk.failures["update_partition_state"] = [ZkTimeoutError("ZooKeeper update: no answer within 10.0 s")]
    await c._handle((ControllerEvent.BROKER_CHANGE, ["1", "2"]))
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (1, 1, (1, 2))
    assert c.is_active and c.ctx.states[TopicPartition(T, 0)][0] == st
    c.channels.close_all()


async def test_an_election_whose_answer_was_lost_is_taken_up():
    """ZooKeeper applied the election but the answer timed out: /controller is this
    session's, the controller idle. The next look takes the role up instead of leaving the
    cluster with an elected controller that never acts."""
    zk = FakeZk()
    zk.live = {1: 10}
    c = Controller(ControllerConfig(broker_id=1), zk)
    zk.controller, zk.epoch = 1, 4
    async with trio.open_nursery() as nursery:
        await nursery.start(c.channels.run)
        await c._on_controller_change()
        assert c.is_active and c.ctx.epoch == 4
        c.channels.close_all()
        nursery.cancel_scope.cancel()


async def test_controller_znode_of_an_earlier_session_is_not_taken_up(nursery):
    """/controller names this broker but was made by its previous, not yet expired session:
    no failover until it expires (its deletion is a controller change of its own)."""
    zk = FakeZk()
    zk.live = {1: 10}
    zk.controller, zk.controller_ours, zk.epoch = 1, False, 4
    c = Controller(ControllerConfig(broker_id=1), zk)
    await nursery.start(c.channels.run)
    await c._on_controller_change()
    assert not c.is_active and zk.controller == 1
    zk.controller = None                                  # the old session expired
    await c._on_controller_change()
    assert c.is_active and c.ctx.epoch == 5
    c.channels.close_all()


async def test_an_admin_call_cut_short_by_zookeeper_makes_the_controller_read_again(nursery):
    """A controlled shutdown moves partition 0's leadership, then the write for partition 1
    times out: partition 0's new leader was written but never propagated. The controller
    reads everything again rather than leave it half done, and the broker stays shutting
    down (so it is chosen as no leader)."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[T] = {0: [2, 1, 3], 1: [2, 3, 1]}
    for p in (0, 1):
        zk.states[(T, p)] = (LeaderAndIsr(2, 0, tuple(zk.assignments[T][p]), 0), 0)
    c = Controller(ControllerConfig(broker_id=1), zk)
    await nursery.start(c.channels.run)
    await c._on_controller_change()
    before = c.ctx
    original, writes = zk.update_partition_state, []

    async def first_then_timeout(*args, **kwargs):
        writes.append(args[:2])
        if len(writes) == 2:
            raise ZkTimeoutError("ZooKeeper update: no answer")
        return await original(*args, **kwargs)
    zk.update_partition_state = first_then_timeout
    done, box = trio.Event(), {}
    await c._handle((ControllerEvent.CALL, (lambda: c.controlled_shutdown(2, broker_epoch=11), box, done)))
    assert isinstance(box.get("error"), ZkTimeoutError) and done.is_set()
    assert c.is_active and c.ctx is not before            # read again, still the controller
    assert {tp.partition: st for tp, (st, _) in c.ctx.states.items()} == \
        {p: st for (t, p), (st, _) in zk.states.items()}
    assert c.ctx.shutting_down == {2}
    c.channels.close_all()


def elected_controller(zk: FakeZk) -> Controller:
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[T] = {0: [3, 1, 2]}
    zk.states[(T, 0)] = (LeaderAndIsr(3, 0, (3, 1, 2), 0), 0)
    return Controller(ControllerConfig(broker_id=1), zk)


async def test_a_failover_waits_out_a_slow_read_and_keeps_the_role(nursery):
    zk = FakeZk()
    c = elected_controller(zk)
    await nursery.start(c.channels.run)
    zk.failures["get_topics"] = [ZkTimeoutError("ZooKeeper get children: no answer")] * 2
    await c._on_controller_change()
    assert c.is_active and (zk.controller, zk.epoch) == (1, 1)   # elected once, role kept
    assert TopicPartition(T, 0) in c.ctx.states
    c.channels.close_all()


async def test_a_failover_whose_write_goes_unanswered_starts_over_keeping_the_role(nursery):
    """Broker 3, partition 0's leader, is gone: the failover elects a new leader, and that
    write times out. The try starts over (the role kept, not handed to the next broker) and
    elects it."""
    zk = FakeZk()
    c = elected_controller(zk)
    del zk.live[3]
    await nursery.start(c.channels.run)
    zk.failures["update_partition_state"] = [ZkTimeoutError("ZooKeeper update: no answer")]
    await c._on_controller_change()
    assert c.is_active and (zk.controller, zk.epoch) == (1, 1)
    assert zk.states[(T, 0)][0].leader == 1
    c.channels.close_all()


async def test_an_epoch_moved_under_the_failover_is_not_acted_on(nursery):
    zk = FakeZk()
    c = elected_controller(zk)
    await nursery.start(c.channels.run)

    async def moved_on():
        return zk.epoch + 1, zk.epoch + 1                    # another broker elected since
    zk.controller_epoch = moved_on
    await c._on_controller_change()
    assert not c.is_active and zk.writes == 0


async def test_a_call_queued_before_a_resignation_is_refused():
    zk = FakeZk()
    c = elected_controller(zk)
    done, box = trio.Event(), {}
    await c._handle((ControllerEvent.CALL, (lambda: c.controlled_shutdown(2, broker_epoch=11), box, done)))
    assert done.is_set() and box["error"].error is NOT_CONTROLLER


async def test_other_tasks_unanswered_calls_do_not_reload_the_controller(nursery):
    zk = FakeZk()
    c = elected_controller(zk)
    await nursery.start(c.channels.run)
    await c._on_controller_change()
    before = c.ctx
    zk.failures["update_partition_state"] = [ZkTimeoutError("ZooKeeper update: no answer")]
    with pytest.raises(ZkTimeoutError):                      # a leader's ISR write, say
        await zk.update_partition_state(T, 0, zk.states[(T, 0)][0], 0)
    await c._handle((ControllerEvent.ISR_CHANGE, None))
    assert c.ctx is before
    c.channels.close_all()


async def deposed_controller(nursery) -> tuple[Controller, FakeZk]:
    """Controller 1, elected and loaded; then broker 2 is elected in its stead, unseen (its
    session expired while it was paused): its event queue still holds work."""
    zk = FakeZk()
    c = elected_controller(zk)
    await nursery.start(c.channels.run)
    await c._on_controller_change()
    assert c.is_active
    zk.elect_another(2)
    return c, zk


async def test_a_deposed_controller_leaves_isr_change_notifications_to_its_successor(nursery):
    """Deleting a notification it handled is a controller write like any other: fenced. Else
    the successor never sees the ISR change (its brokers' metadata keeps the old ISR). The
    fence failure makes it resign at once, before it acts on anything else."""
    c, zk = await deposed_controller(nursery)
    zk.leader_changes_isr(T, 0, [3, 1])
    path = await zk.notify_isr_change([(T, 0)])
    await c._handle((ControllerEvent.ISR_CHANGE, [path]))
    assert path in zk.isr_changes and zk.deleted_notifications == []
    assert not c.is_active


async def test_a_deposed_controller_leaves_replica_damage_reports_to_its_successor(nursery):
    """A report the controller drops (from a broker it does not know) writes no state, so no
    other write fences the event: the deletion must."""
    c, zk = await deposed_controller(nursery)
    path = await zk.notify_replica_damage(9, 0, [(T, 0)])
    await c._handle((ControllerEvent.REPLICA_DAMAGE, [path]))
    assert path in zk.damage and zk.deleted_notifications == []
    assert not c.is_active
