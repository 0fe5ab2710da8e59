"""Topic deletion on the controller, on an in-memory ZooKeeper: a topic whose replica sits on
a broker that is down stays marked for deletion (its znodes kept, its name not available
again) until that broker comes back and reports the replica deleted, so that a topic created
again under the name never meets the old records."""

from __future__ import annotations

import trio
import trio.testing

from tests.support.controller_zk import FakeZk
from tidelog.broker.controller.channels import Outgoing
from tidelog.broker.controller.controller import Controller, ControllerConfig
from tidelog.broker.controller.deletion import TopicDeletion, deleted_replicas
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.zookeeper.layout import LeaderAndIsr
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import KAFKA_STORAGE_ERROR, NONE, STALE_BROKER_EPOCH, TOPIC_ALREADY_EXISTS
from tidelog.protocol.messages import CreatableTopic, PartitionError, StopReplicaResponse

T = "t"


def test_a_deletion_is_complete_once_every_replica_is_reported_deleted():
    d = TopicDeletion.of({0: [1, 2, 3], 1: [2, 3, 1]})
    assert d.undeleted == {1: {0, 1}, 2: {0, 1}, 3: {0, 1}} and d.waiting_for({1, 2}) == [3]
    d.confirm(1, {0, 1})
    d.confirm(2, {0, 1})
    d.confirm(3, {1})
    assert not d.complete and d.undeleted == {3: {0}}
    d.confirm(3, {0, 7})
    assert d.complete and d.waiting_for(set()) == []
    assert TopicDeletion.of({}).complete


def test_only_replicas_answered_without_error_count_as_deleted():
    ok = StopReplicaResponse(NONE.code, [PartitionError(T, 0, NONE.code), PartitionError(T, 1, KAFKA_STORAGE_ERROR.code),
                                         PartitionError("u", 0, NONE.code)])
    assert deleted_replicas(ok) == {T: {0}, "u": {0}}
    refused = StopReplicaResponse(STALE_BROKER_EPOCH.code, [PartitionError(T, 0, NONE.code)])
    assert deleted_replicas(refused) == {}


class Brokers:
    """The controller's requests, recorded; each is answered only when the test says so."""

    def __init__(self, c: Controller):
        self.sent: list[tuple[int, Outgoing]] = []
        self.c = c
        c.channels.send = self.send

    def send(self, broker: int, key: ApiKey, message) -> Outgoing:
        out = Outgoing(key, message)
        self.sent.append((broker, out))
        return out

    def requests(self, key: ApiKey) -> list[tuple[int, object]]:
        return [(b, out.message) for b, out in self.sent if out.api_key == key]

    def drop_stop_replicas(self, broker: int) -> None:
        """``broker``'s queue is dropped before it answers (it died, or left the cluster)."""
        for b, out in self.sent:
            if b == broker and out.api_key == ApiKey.STOP_REPLICA:
                out.done.set()

    async def answer_stop_replicas(self) -> None:
        """Every StopReplica sent so far succeeds; the controller handles the answers."""
        for _, out in self.sent:
            if out.api_key == ApiKey.STOP_REPLICA and not out.done.is_set():
                out.response = StopReplicaResponse(NONE.code, [
                    PartitionError(p.topic_name, p.partition_index, NONE.code) for p in out.message.partitions])
                out.done.set()
        await trio.testing.wait_all_tasks_blocked()
        while True:
            try:
                event = self.c._events.receive_nowait()
            except trio.WouldBlock:
                return
            await self.c._handle(event)


async def elected(zk: FakeZk, nursery, broker_id: int = 1) -> tuple[Controller, Brokers]:
    """A controller on broker ``broker_id`` over ``zk``, its requests recorded, elected."""
    c = Controller(ControllerConfig(broker_id=broker_id), zk)
    c._nursery = nursery
    await nursery.start(c.channels.run)
    brokers = Brokers(c)
    await c._on_controller_change()
    return c, brokers


async def cluster_with_broker_3_down(nursery) -> tuple[Controller, FakeZk, Brokers]:
    zk = FakeZk()
    zk.live = {1: 10, 2: 11}
    zk.assignments[T] = {0: [1, 2, 3], 1: [3, 1, 2]}
    zk.configs[T] = {"retention.ms": "1000"}
    zk.states[(T, 0)] = (LeaderAndIsr(1, 4, (1, 2), 0), 0)
    zk.states[(T, 1)] = (LeaderAndIsr(1, 4, (1, 2), 0), 0)
    c, brokers = await elected(zk, nursery)
    assert c.is_active
    return c, zk, brokers


async def create_again(c: Controller):
    (result,), _ = await c.create_topics([CreatableTopic(T, 2, 3)], validate_only=False)
    return result


async def test_a_replica_on_a_broker_that_is_down_holds_the_deletion_until_it_returns(nursery):
    c, zk, brokers = await cluster_with_broker_3_down(nursery)
    brokers.sent.clear()
    results, done = await c.delete_topics([T])
    assert [r.error_code for r in results] == [NONE.code] and done == []  # nothing to wait for: 3 is down
    stops = brokers.requests(ApiKey.STOP_REPLICA)
    assert sorted(b for b, _ in stops) == [1, 2]
    assert all(p.delete_partition for _, m in stops for p in m.partitions)
    assert all(m.deleted_topics == [T] for _, m in brokers.requests(ApiKey.UPDATE_METADATA))
    await brokers.answer_stop_replicas()

    # the replicas on 1 and 2 are gone, the one on 3 is not: the topic stays marked
    assert T in zk.assignments and (T, 0) in zk.states and T in zk.configs and zk.marked == {T}
    result = await create_again(c)
    assert result.error_code == TOPIC_ALREADY_EXISTS.code
    assert result.error_message == f"Topic '{T}' is marked for deletion."
    assert (await c.delete_topics([T]))[0][0].error_code == NONE.code  # asked again: still under way

    # broker 3 returns: it is sent no state of the topic, and StopReplica with deletion
    brokers.sent.clear()
    zk.live[3] = 12
    await c._on_brokers(["1", "2", "3"])
    assert all(p.topic_name != T for b, m in brokers.requests(ApiKey.LEADER_AND_ISR) for p in m.partition_states)
    ((to, stop),) = brokers.requests(ApiKey.STOP_REPLICA)
    assert to == 3 and sorted((p.topic_name, p.partition_index, p.delete_partition) for p in stop.partitions) == \
        [(T, 0, True), (T, 1, True)]
    assert zk.marked == {T}  # not before it answers
    await brokers.answer_stop_replicas()

    assert T not in zk.assignments and T not in zk.configs and zk.marked == set()
    assert not any(t == T for t, _ in zk.states)
    assert (await create_again(c)).error_code == NONE.code


async def test_a_stop_replica_lost_with_its_broker_holds_the_deletion(nursery):
    """Broker 3 is registered when the topic is deleted, but dies before it answers (the
    controller had not seen it go): its request is dropped with its queue. Completing the
    deletion then would let a topic created again under the name, with a replica on broker 3
    (registered when the assignment was made), find the old log there when 3 returns."""
    c, zk, brokers = await cluster_with_broker_3_down(nursery)
    zk.live[3] = 12
    await c._on_brokers(["1", "2", "3"])
    brokers.sent.clear()
    await c.delete_topics([T])
    brokers.drop_stop_replicas(3)
    await brokers.answer_stop_replicas()
    assert zk.marked == {T} and (await create_again(c)).error_code == TOPIC_ALREADY_EXISTS.code

    del zk.live[3]
    await c._on_brokers(["1", "2"])
    zk.live[3] = 13
    brokers.sent.clear()
    await c._on_brokers(["1", "2", "3"])
    assert [b for b, _ in brokers.requests(ApiKey.STOP_REPLICA)] == [3]
    await brokers.answer_stop_replicas()
    assert zk.marked == set() and (await create_again(c)).error_code == NONE.code


async def test_a_deletion_without_offline_replicas_completes_on_the_answers(nursery):
    c, zk, brokers = await cluster_with_broker_3_down(nursery)
    zk.live[3] = 12
    await c._on_brokers(["1", "2", "3"])
    results, done = await c.delete_topics([T])
    assert zk.marked == {T} and not any(d.is_set() for d in done)
    await brokers.answer_stop_replicas()
    assert zk.marked == set() and T not in zk.assignments and all(d.is_set() for d in done) and done


async def test_a_new_controller_resumes_a_pending_deletion(nursery):
    c, zk, brokers = await cluster_with_broker_3_down(nursery)
    await c.delete_topics([T])
    await brokers.answer_stop_replicas()
    assert zk.marked == {T}

    # broker 2 takes over, broker 3 back meanwhile: the marker is still there
    c._resign()
    zk.controller, zk.live[3] = None, 12
    successor, brokers = await elected(zk, nursery, broker_id=2)
    assert successor.is_active and T not in successor.ctx.assignments
    assert all(p.topic_name != T for _, m in brokers.requests(ApiKey.LEADER_AND_ISR) for p in m.partition_states)
    assert sorted(b for b, _ in brokers.requests(ApiKey.STOP_REPLICA)) == [1, 2, 3]
    await brokers.answer_stop_replicas()
    assert zk.marked == set() and T not in zk.assignments


async def test_a_deletion_marker_that_names_no_valid_topic_is_ignored(nursery):
    """Only other tools write such a marker (the brokers validate names): at a takeover and
    when it appears, the controller logs it and goes on (a name too long for the topic's
    znode path made the takeover fail, and with it every election)."""
    long_name = "x" * 300
    c, zk, brokers = await cluster_with_broker_3_down(nursery)
    zk.marked = {long_name, "a b"}
    await c._on_delete_topics(sorted(zk.marked))
    assert c.is_active and zk.marked == {long_name, "a b"}

    c._resign()
    zk.controller, zk.live[3] = None, 12
    successor, _ = await elected(zk, nursery, broker_id=2)
    assert successor.is_active and T in successor.ctx.assignments and not successor.ctx.deleting
    await successor.delete_topics([T])  # a valid deletion still goes ahead
    assert T in successor.ctx.deleting


async def test_a_broker_that_missed_a_deletion_drops_the_topic_when_it_registers_again(nursery):
    """Broker 3 holds no replica of the topic but has it in its metadata; it loses its
    ZooKeeper session (its process and cache live on), and the topic is deleted meanwhile.
    When it registers again its UpdateMetadata is full: its cache keeps no topic the
    controller does not list, and a Metadata request it answers no longer names the topic."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11, 3: 12}
    zk.assignments[T] = {0: [1, 2]}
    zk.assignments["kept"] = {0: [1, 2]}
    for topic in (T, "kept"):
        zk.configs[topic] = {}
        zk.states[(topic, 0)] = (LeaderAndIsr(1, 4, (1, 2), 0), 0)
    c, brokers = await elected(zk, nursery)
    cache = MetadataCache(3)
    for b, m in brokers.requests(ApiKey.UPDATE_METADATA):
        if b == 3:
            cache.update(m)
    assert cache.topics == ["kept", T]

    del zk.live[3]
    await c._on_brokers(["1", "2"])
    await c.delete_topics([T])
    await brokers.answer_stop_replicas()
    assert T not in zk.assignments and zk.marked == set()
    brokers.sent.clear()
    zk.live[3] = 13
    await c._on_brokers(["1", "2", "3"])
    (to_3,) = [m for b, m in brokers.requests(ApiKey.UPDATE_METADATA) if b == 3]
    assert to_3.full and to_3.broker_epoch == 13
    assert cache.deleted_by(to_3) == [T]
    cache.update(to_3)
    assert cache.topics == ["kept"]


async def test_no_update_metadata_is_full_while_a_topic_is_unreadable(nursery):
    """Its partitions are in no request: a full one would have brokers drop them."""
    zk = FakeZk()
    zk.live = {1: 10, 2: 11}
    zk.assignments[T] = {0: [1, 2]}
    zk.states[(T, 0)] = (LeaderAndIsr(1, 4, (1, 2), 0), 0)
    zk.assignments["bad"] = {0: [1, 2]}
    real = zk.get_assignment_and_moves

    async def malformed(topic):
        if topic == "bad":
            raise ValueError("malformed topic znode data")
        return await real(topic)
    zk.get_assignment_and_moves = malformed
    c, brokers = await elected(zk, nursery)
    zk.live[3] = 12
    await c._on_brokers(["1", "2", "3"])
    assert brokers.requests(ApiKey.UPDATE_METADATA)
    assert not any(m.full for _, m in brokers.requests(ApiKey.UPDATE_METADATA))
