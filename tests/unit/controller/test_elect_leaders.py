"""ElectLeaders' answer, either type: each partition named is answered, one that needs no
election with ELECTION_NOT_NEEDED; an election of all partitions (null partitions: the
CLI without topic names, ``Admin.elect_leaders()``) answers only the partitions elected or
that failed, as Kafka does (KIP-460)."""

from __future__ import annotations

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_topic_deletion import elected
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.protocol.errors import ELECTION_NOT_NEEDED, NONE, PREFERRED_LEADER_NOT_AVAILABLE
from tidelog.protocol.topics import TopicPartition

T = "orders"
PREFERRED, MOVED, STUCK = TopicPartition(T, 0), TopicPartition(T, 1), TopicPartition(T, 2)


def cluster() -> FakeZk:
    """orders-0 is led by its preferred replica; orders-1 is not, and can be; orders-2 is
    not, and cannot be (its preferred replica 3 is out of the ISR)."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[T] = {0: [1, 2], 1: [1, 2], 2: [3, 2]}
    zk.configs[T] = {}
    zk.states[(T, 0)] = (LeaderAndIsr(1, 0, (1, 2), 0), 0)
    zk.states[(T, 1)] = (LeaderAndIsr(2, 0, (1, 2), 0), 0)
    zk.states[(T, 2)] = (LeaderAndIsr(2, 0, (2,), 0), 0)
    return zk


async def test_a_preferred_election_of_all_partitions_leaves_out_those_that_need_none(nursery):
    c, _ = await elected(cluster(), nursery)
    results, _ = await c.elect_preferred(None)
    assert [(tp, code) for tp, code, _ in results] == [(MOVED, NONE.code), (STUCK, PREFERRED_LEADER_NOT_AVAILABLE.code)]
    results, _ = await c.elect_preferred(None)  # nothing left to elect
    assert [(tp, code) for tp, code, _ in results] == [(STUCK, PREFERRED_LEADER_NOT_AVAILABLE.code)]


async def test_a_preferred_election_of_named_partitions_answers_each(nursery):
    c, _ = await elected(cluster(), nursery)
    results, _ = await c.elect_preferred([PREFERRED, MOVED])
    assert [(tp, code) for tp, code, _ in results] == [(PREFERRED, ELECTION_NOT_NEEDED.code), (MOVED, NONE.code)]


async def test_an_unclean_election_of_all_partitions_leaves_out_those_led(nursery):
    zk = cluster()
    zk.live.pop(3)
    zk.states[(T, 2)] = (LeaderAndIsr(3, 0, (3,), 0), 0)  # its only in-sync replica is gone
    c, _ = await elected(zk, nursery)
    results, _ = await c.elect_unclean(None)
    assert [(tp, code) for tp, code, _ in results] == [(STUCK, NONE.code)]
    assert (await c.elect_unclean(None))[0] == []
    results, _ = await c.elect_unclean([PREFERRED])
    assert [(tp, code) for tp, code, _ in results] == [(PREFERRED, ELECTION_NOT_NEEDED.code)]
