"""The controller's side of a damaged replica (a batch failing its check on a broker's disk):
leadership moves off it, it leaves the ISR, and its broker is told, so that its replica,
a follower outside the ISR, can drop the damaged records and fetch them again."""

from __future__ import annotations

from tests.unit.controller.test_reassignment_flow import TP, T, controller, load, state_sent, to
from tidelog.broker.controller.election import without_damaged_replica
from tidelog.protocol.codec import ApiKey


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
    # a damaged follower already out of the ISR changes nothing
    assert without_damaged_replica([1, 2, 3], leader=1, isr=[1, 2], live={1, 2, 3}, damaged=3) is None


async def report(c, zk, broker, epoch=0):
    await zk.notify_replica_damage(broker, epoch, [(T, 0)])
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


async def test_a_damaged_replica_already_out_of_the_isr_is_told_its_state_again():
    c, zk, sent = controller(isr=(1, 2))
    await load(c)
    await report(c, zk, 3)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.leader_epoch, st.isr) == (1, 5, (1, 2))  # nothing written
    assert to(sent, ApiKey.LEADER_AND_ISR) == [3]
    assert state_sent(sent, 3).isr == [1, 2]


async def test_a_report_from_an_earlier_registration_is_dropped():
    c, zk, sent = controller()
    await load(c)
    await report(c, zk, 1, epoch=-5)
    st, _ = zk.states[(T, 0)]
    assert st.leader == 1 and to(sent, ApiKey.LEADER_AND_ISR) == []
    assert zk.damage == {}


async def test_the_only_in_sync_copy_keeps_leading():
    c, zk, sent = controller(isr=(1,))
    await load(c)
    await report(c, zk, 1)
    st, _ = zk.states[(T, 0)]
    assert (st.leader, st.isr) == (1, (1,))
    assert TP in c.ctx.states
