"""The controller's side of a damaged replica (a batch failing its check on a broker's disk):
leadership moves off it, it leaves the ISR, and its broker is told, so that its replica,
a follower outside the ISR, can drop the damaged records and fetch them again. And of a
replica in a log dir that failed (a report marked offline): handled as on a dead broker, and
not elected again until its broker registers again; a controller elected since learns it from
the broker's answer to its LeaderAndIsr."""

from __future__ import annotations

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_malformed_znodes import handle_queued
from tests.unit.controller.test_reassignment_flow import TP, T, controller, load, state_sent, to
from tests.unit.controller.test_topic_deletion import elected
from tidelog.broker.controller.controller import ControllerEvent
from tidelog.broker.controller.election import without_damaged_replica
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import KAFKA_STORAGE_ERROR, NONE
from tidelog.protocol.messages import LeaderAndIsrResponse, PartitionError
from tidelog.protocol.topics import TopicPartition

OFFLINE_TOPIC = "offline"


def test_a_damaged_leader_hands_over_to_the_next_in_sync_replica_and_leaves_the_isr():
    e = without_damaged_replica([1, 2, 3], leader=1, isr=[1, 2, 3], live={1, 2, 3}, damaged=1)
    assert (e.leader, e.isr) == (2, [2, 3])


def test_a_damaged_follower_leaves_the_isr_and_the_leader_stays():
    e = without_damaged_replica([1, 2, 3], leader=1, isr=[1, 2, 3], live={1, 2, 3}, damaged=3)
    assert (e.leader, e.isr) == (1, [1, 2])


def test_the_only_in_sync_copy_stays_even_damaged():
    assert without_damaged_replica([1, 2, 3], leader=1, isr=[1], live={1, 2, 3}, damaged=1) is None
    # nor does a dead in-sync replica take over
    assert without_damaged_replica([1, 2, 3], leader=1, isr=[1, 2], live={1, 3}, damaged=1) is None


def test_a_damaged_follower_already_out_of_the_isr_still_gets_a_new_state():
    # written, the state moves the leader epoch on: the follower's fetches from before it
    # drops its damaged records are fenced
    e = without_damaged_replica([1, 2, 3], leader=1, isr=[1, 2], live={1, 2, 3}, damaged=3)
    assert (e.leader, e.isr) == (1, [1, 2])
    assert without_damaged_replica([1, 2, 3], leader=-1, isr=[3], live={1, 2, 3}, damaged=3) is None


async def report(c, zk, broker, epoch=0, offline=False):
    await zk.notify_replica_damage(broker, epoch, [(T, 0)], offline=offline)
    await c._on_replica_damage(None)


async def test_a_report_moves_leadership_and_tells_every_replica():
    c, zk, sent = controller()
    await load(c)
    await report(c, zk, 1)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (2, 6, (2, 3))
    assert to(sent, ApiKey.LEADER_AND_ISR) == [1, 2, 3]
    told = state_sent(sent, 1)
    assert (told.leader, told.isr) == (2, [2, 3])
    assert zk.damage == {} and len(zk.deleted_notifications) == 1


async def test_a_damaged_follower_out_of_the_isr_in_the_controllers_view_gets_a_new_epoch():
    # the controller's view may lag: a leader may have just taken it back into the ISR
    c, zk, sent = controller(isr=(1, 2))
    await load(c)
    zk.leader_changes_isr(T, 0, [1, 2, 3])
    await report(c, zk, 3)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (1, 6, (1, 2))  # decided again on the fresh state
    assert to(sent, ApiKey.LEADER_AND_ISR) == [1, 2, 3]
    assert (state_sent(sent, 3).leader_epoch, state_sent(sent, 3).isr) == (6, [1, 2])


async def test_a_report_from_an_earlier_registration_is_dropped():
    c, zk, sent = controller()
    await load(c)
    zk.broker_epochs[1] = 7  # broker 1 registered again since the report
    c.ctx.broker_epochs[1] = 7
    await report(c, zk, 1, epoch=3)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch) == (1, 5) and to(sent, ApiKey.LEADER_AND_ISR) == []
    assert zk.damage == {}


async def test_the_only_in_sync_copy_keeps_leading():
    c, zk, sent = controller(isr=(1,))
    await load(c)
    await report(c, zk, 1)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (1, 5, (1,))
    assert to(sent, ApiKey.LEADER_AND_ISR) == [] and zk.damage == {}


async def test_a_moving_partition_goes_on_moving():
    c, zk, sent = controller()
    await load(c)
    await c.alter_reassignments([(TP, [2, 3, 4])])
    zk.leader_changes_isr(T, 0, [1, 2, 3, 4])
    await report(c, zk, 1)  # the leader, which the move removes
    assert zk.assignments[T] == {0: [2, 3, 4]} and not c.reassignments(None)


# -- replicas of a log dir that failed (reported with offline=True) --------------------------------


async def report_offline(c, zk, broker, epoch=0):
    await report(c, zk, broker, epoch, offline=True)


async def test_an_offline_leader_hands_over_to_the_next_in_sync_replica_and_leaves_the_isr():
    c, zk, sent = controller()
    await load(c)
    await report_offline(c, zk, 1)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (2, 6, (2, 3))
    assert to(sent, ApiKey.LEADER_AND_ISR) == [1, 2, 3] and zk.damage == {}
    assert state_sent(sent, 2).offline_replicas == [1]  # in the metadata too, as Kafka's


async def test_an_offline_follower_leaves_the_isr_and_one_out_of_it_changes_nothing():
    c, zk, sent = controller()
    await load(c)
    await report_offline(c, zk, 3)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (1, 6, (1, 2))
    sent.clear()
    await report_offline(c, zk, 3)  # reported again (a LeaderAndIsr still counted on it): nothing to do
    assert zk.states[(T, 0)][0].leader_epoch == 6 and to(sent, ApiKey.LEADER_AND_ISR) == []


async def test_an_offline_follower_out_of_the_isr_is_named_offline_in_every_brokers_metadata():
    """No state changes, so no LeaderAndIsr; but the metadata names the replica offline, as
    Kafka's controller sends UpdateMetadata when a replica goes offline with no election."""
    c, zk, sent = controller(isr=(1, 2))
    await load(c)
    await report_offline(c, zk, 3)
    assert zk.states[(T, 0)][0].leader_epoch == 5 and to(sent, ApiKey.LEADER_AND_ISR) == []
    assert to(sent, ApiKey.UPDATE_METADATA) == [1, 2, 3, 4]
    assert {tuple(p.offline_replicas) for _, k, m in sent if k == ApiKey.UPDATE_METADATA
            for p in m.partition_states} == {(3,)}
    sent.clear()
    await report_offline(c, zk, 3)  # known offline already: nothing new to say
    assert sent == []


async def test_an_offline_only_in_sync_replica_leaves_the_partition_without_a_leader():
    # unlike a damaged one, it cannot serve anything: the partition is offline, its ISR kept
    # (as Kafka, for a dead broker), until the replica comes back
    c, zk, sent = controller(isr=(1,))
    await load(c)
    await report_offline(c, zk, 1)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (-1, 6, (1,))
    sent.clear()
    await report_offline(c, zk, 1)
    assert zk.states[(T, 0)][0].leader_epoch == 6 and to(sent, ApiKey.LEADER_AND_ISR) == []


async def test_an_offline_replica_is_not_elected_until_its_broker_registers_again(nursery):
    c, zk, sent = controller(isr=(1,))
    await nursery.start(c.channels.run)
    await load(c)
    await report_offline(c, zk, 1)
    zk.live = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0}  # a broker joins: offline partitions are elected again
    await c._on_brokers(None)
    assert zk.states[(T, 0)][0].leader == -1
    zk.live[1] = 9  # broker 1 restarted (its log dirs loaded again): a new registration
    await c._on_brokers(None)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.isr) == (1, (1,))


async def test_an_offline_only_in_sync_leader_hands_over_uncleanly_where_allowed():
    c, zk, sent = controller(isr=(1,))
    zk.configs[T] = {"unclean.leader.election.enable": "true"}
    await load(c)
    await report_offline(c, zk, 1)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.isr) == (2, (2,))


async def test_an_offline_replica_is_never_the_preferred_leader_again():
    c, zk, sent = controller(leader=2, isr=(2, 3))
    await load(c)
    await report_offline(c, zk, 1)  # the preferred replica, out of the ISR: no new state
    assert zk.states[(T, 0)][0].leader_epoch == 5
    zk.leader_changes_isr(T, 0, [1, 2, 3])  # a leader that took it back before it knew
    c.ctx.states[TP] = zk.states[(T, 0)]
    results, _ = await c.elect_preferred([TP])
    assert results[0][1] != 0 and zk.states[(T, 0)][0].leader == 2


def storage_errors(brokers, broker: int, partitions: list[int], first_only: bool = False) -> None:
    """``broker`` answers the LeaderAndIsr requests sent to it so far: KAFKA_STORAGE_ERROR for
    its replicas of ``partitions`` of ``offline`` (in its failed log dir), NONE for the others."""
    for b, out in brokers.sent:
        if b == broker and out.api_key == ApiKey.LEADER_AND_ISR and not out.done.is_set():
            out.response = LeaderAndIsrResponse(NONE.code, [
                PartitionError(p.topic_name, p.partition_index,
                               KAFKA_STORAGE_ERROR.code if p.partition_index in partitions else NONE.code)
                for p in out.message.partition_states])
            out.done.set()
            if first_only:
                return


def offline_dir_cluster() -> FakeZk:
    """Broker 2's replica of offline-0 is in a log dir that failed: an earlier controller took
    it out of the ISR (and deleted the report). Its replica of offline-1 is fine, and leads."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[OFFLINE_TOPIC] = {0: [2, 3], 1: [2, 3]}
    zk.configs[OFFLINE_TOPIC] = {"unclean.leader.election.enable": "true"}
    zk.states[(OFFLINE_TOPIC, 0)] = (LeaderAndIsr(3, 5, (3,), 0), 0)
    zk.states[(OFFLINE_TOPIC, 1)] = (LeaderAndIsr(2, 5, (2, 3), 0), 0)
    return zk


async def test_a_new_controller_learns_offline_replicas_from_the_answers_to_its_leader_and_isr(nursery):
    """As Kafka's controller (handleLeaderAndIsrResponse): the broker answers the failover's
    full LeaderAndIsr with KAFKA_STORAGE_ERROR for its offline replica, and the new controller
    never elects that replica, not even uncleanly, until the broker registers again."""
    zk = offline_dir_cluster()
    c, brokers = await elected(zk, nursery)
    assert c.ctx.offline_replicas == {}
    storage_errors(brokers, 2, [0])
    brokers.sent.clear()
    await handle_queued(c)
    assert c.ctx.offline_replicas == {2: {TopicPartition(OFFLINE_TOPIC, 0)}}
    (told,) = {tuple(p.offline_replicas) for _, m in brokers.requests(ApiKey.UPDATE_METADATA)
               for p in m.partition_states if p.partition_index == 0}
    assert told == (2,)

    del zk.live[3]  # the last in-sync replica of offline-0 goes
    await c._handle((ControllerEvent.BROKER_CHANGE, None))
    assert zk.states[(OFFLINE_TOPIC, 0)][0].leader == -1  # not broker 2, whose replica cannot serve
    assert zk.states[(OFFLINE_TOPIC, 1)][0].leader == 2

    zk.live[2] = 20  # broker 2 restarted, its log dirs loaded again
    await c._handle((ControllerEvent.BROKER_CHANGE, None))
    assert c.ctx.offline_replicas == {} and zk.states[(OFFLINE_TOPIC, 0)][0].leader == 2


async def test_an_answer_of_a_brokers_earlier_registration_marks_nothing_offline(nursery):
    zk = offline_dir_cluster()
    c, brokers = await elected(zk, nursery)
    zk.live[2] = 20  # broker 2 restarted before it answered
    await c._handle((ControllerEvent.BROKER_CHANGE, None))
    storage_errors(brokers, 2, [0], first_only=True)  # to the request of its registration of epoch 11
    await handle_queued(c)
    assert c.ctx.offline_replicas == {}
