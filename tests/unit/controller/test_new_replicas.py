"""Which replicas the controller sends as new (LeaderAndIsr's is_new, Kafka's isNew), on an
in-memory ZooKeeper: those of a topic or partition just created, of a partition that never had
a leader, and those a reassignment adds; no other. A broker with a log dir offline creates a
log only for a new replica, for another one's may be in the dir that is offline
(tests/unit/replication/test_log_dir_failure.py)."""

from __future__ import annotations

from tests.support.controller_zk import FakeZk
from tests.unit.controller.test_topic_deletion import elected
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.messages import CreatableTopic

T = "t"


def told_new(brokers) -> dict[int, dict[tuple[str, int], bool]]:
    """Per broker, the partitions of every LeaderAndIsr sent to it and whether as new."""
    out: dict[int, dict[tuple[str, int], bool]] = {}
    for b, m in brokers.requests(ApiKey.LEADER_AND_ISR):
        for st in m.partition_states:
            out.setdefault(b, {})[(st.topic_name, st.partition_index)] = st.is_new
    return out


async def test_a_created_topic_and_its_added_partitions_are_new_once(nursery):
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    c, brokers = await elected(zk, nursery)
    brokers.sent.clear()
    (result,), _ = await c.create_topics([CreatableTopic(T, 2, 2)], validate_only=False)
    assert result.error_code == 0
    sent = told_new(brokers)
    assert sent and all(all(new.values()) for new in sent.values())

    brokers.sent.clear()
    await c.create_partitions(T, 3, None, validate_only=False)
    assert {p for new in told_new(brokers).values() for p, is_new in new.items() if is_new} == {(T, 2)}

    brokers.sent.clear()  # a broker registered again is told every partition of it, none new
    zk.live[1] = 20
    await c._on_brokers(["1", "2", "3"])
    assert told_new(brokers)[1] and not any(told_new(brokers)[1].values())


async def test_a_partition_that_never_had_a_leader_is_new_when_its_replicas_come(nursery):
    zk = FakeZk()
    zk.live = {1: 10}
    zk.assignments[T] = {0: [2, 3], 1: [1, 2]}
    zk.states[(T, 1)] = (LeaderAndIsr(1, 3, (1,), 0), 0)  # partition 1 led, 2 down since
    c, brokers = await elected(zk, nursery)  # creates partition 0's state: no live replica
    assert zk.states[(T, 0)][0].leader == -1
    brokers.sent.clear()
    zk.live[2] = 11
    await c._on_brokers(["1", "2"])
    assert zk.states[(T, 0)][0].leader == 2
    new_to_2 = [st.is_new for b, m in brokers.requests(ApiKey.LEADER_AND_ISR) if b == 2
                for st in m.partition_states if st.partition_index == 0]
    assert new_to_2 and all(new_to_2)  # its joining state and its election's
    assert not told_new(brokers)[2][(T, 1)]
