"""Broker APIs from a non-broker (issue 14), through the broker's API layer over a real
ReplicaManager and LogManager, with ZooKeeper played by ``FakeZooKeeper``.

Until brokers authenticate, what can be checked is checked against ZooKeeper, never against
what a request says of its sender: LeaderAndIsr, StopReplica and UpdateMetadata need the
controller id and epoch ZooKeeper holds now (STALE_CONTROLLER_EPOCH for an older epoch, a newer
one or another broker) and this broker's current broker epoch (STALE_BROKER_EPOCH); the
registry reads ZooKeeper again, boundedly, before it refuses a claim *ahead* of its watches
(a new controller's first request may come before the watch fires). ControlledShutdown needs
the broker's registration's epoch; InitProducerId cannot name another producer's id;
DeleteTopics cannot delete ``__consumer_offsets``.
"""

from __future__ import annotations

import dataclasses

import pytest
import trio

from tidelog.broker.apis import Apis
from tidelog.broker.config import BrokerConfig
from tidelog.broker.controller.controller import Controller, ControllerConfig, ControllerContext
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.manager import LogManager
from tidelog.broker.metadata_cache import MetadataCache, ZkRegistry
from tidelog.broker.producer_ids import ProducerIdManager
from tidelog.broker.replication.replica_manager import ReplicaConfig, ReplicaManager
from tidelog.broker.security.entity_configs import EntityConfigStore
from tidelog.broker.zookeeper.layout import BrokerInfo, LeaderAndIsr, ZkConnectionError
from tidelog.protocol.errors import (
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    STALE_BROKER_EPOCH,
    STALE_CONTROLLER_EPOCH,
    TidelogError,
)
from tidelog.protocol.messages import (
    TOPIC_RESOURCE,
    AlterConfigsRequest,
    AlterConfigsResource,
    ControlledShutdownRequest,
    DeleteTopicsRequest,
    ElectLeadersRequest,
    InitProducerIdRequest,
    LeaderAndIsrRequest,
    LiveBroker,
    PartitionState,
    StopReplicaPartition,
    StopReplicaRequest,
    TopicPartitionRef,
    TopicResult,
    UpdateMetadataRequest,
)
from tidelog.protocol.topics import TopicPartition

ME = 1
MY_EPOCH = 0x100000021  # a czxid
CONTROLLER, CONTROLLER_EPOCH = 2, 5
TP = TopicPartition("orders", 0)


class FakeZooKeeper:
    """What ZooKeeper holds; counts the registry's reads, and can hang them."""

    def __init__(self):
        self.controller: tuple[int | None, int] = (CONTROLLER, CONTROLLER_EPOCH)
        self.epochs = {ME: MY_EPOCH, 2: MY_EPOCH + 7, 3: MY_EPOCH + 9}
        self.reads = {"controller": 0, "brokers": 0}
        self.hang = False
        self.failures = 0  # reads of the controller that fail (connection loss) before one answers

    async def current_controller(self):
        self.reads["controller"] += 1
        if self.hang:
            await trio.sleep_forever()
        if self.failures:
            self.failures -= 1
            raise ZkConnectionError("connection lost")
        return self.controller

    async def broker_epochs(self):
        self.reads["brokers"] += 1
        if self.hang:
            await trio.sleep_forever()
        return dict(self.epochs)

    async def get_broker_epoch(self, broker_id):
        return self.epochs.get(broker_id)


class BrokerState:
    """The broker's side of ``Apis`` (``apis.BrokerState``)."""

    def __init__(self):
        self.broker_epoch = MY_EPOCH
        self.log_defaults = LogConfig()
        self.topic_overrides: dict = {}
        self.entity_configs = EntityConfigStore(zk=None)  # no dynamic broker configs set
        self.deleted_topics: list[str] = []  # told to metadata_updated (the metrics drop their series)

    def update_topic_overrides(self, configs):
        self.topic_overrides.update(configs)

    def metadata_updated(self, deleted=()):
        self.deleted_topics += deleted

    async def auto_create_topics(self, topics):
        pass


class Broker:
    def __init__(self, log_dir: str):
        self.zk = FakeZooKeeper()
        self.log_manager = LogManager([log_dir], LogConfig(), broker_id=ME)
        self.log_manager.startup()
        self.replica_manager = ReplicaManager(ReplicaConfig(ME), self.log_manager, lambda t: LogConfig(),
                                              lambda leader, fetcher=0: None)
        self.registry = ZkRegistry(self.zk.current_controller, self.zk.broker_epochs,
                                   reread_interval_s=0.1, reread_timeout_s=2.0)
        self.metadata = MetadataCache(ME, self.registry)
        self.state = BrokerState()
        self.apis = Apis(BrokerConfig(broker_id=ME, zookeeper_connect="127.0.0.1:1"), self.replica_manager,
                         self.metadata, broker=self.state, producer_ids=ProducerIdManager(self.block))

    async def block(self):
        return 1000, 1999

    async def watches_fired(self):
        """What the broker's watches do at start-up: read the controller and the epochs."""
        assert await self.registry.refresh_controller() and await self.registry.refresh_broker_epochs()
        self.zk.reads = {"controller": 0, "brokers": 0}


@pytest.fixture
async def broker(tmp_path):
    b = Broker(str(tmp_path))
    await b.watches_fired()
    yield b
    for log in b.log_manager.logs.values():
        log.close()


def lead(leader_epoch: int = 0) -> list[PartitionState]:
    return [PartitionState(TP.topic, TP.partition, CONTROLLER_EPOCH, ME, leader_epoch, [ME], 0, [ME])]


def leader_and_isr(controller=CONTROLLER, epoch=CONTROLLER_EPOCH, broker_epoch=MY_EPOCH, leader_epoch=0):
    return LeaderAndIsrRequest(controller, epoch, broker_epoch, lead(leader_epoch))


FORGED = {  # what a client without ZooKeeper's knowledge can send, and the answer
    "a deposed controller's epoch": (dict(epoch=CONTROLLER_EPOCH - 1), STALE_CONTROLLER_EPOCH),
    "an epoch no election made": (dict(epoch=CONTROLLER_EPOCH + 1), STALE_CONTROLLER_EPOCH),
    "a broker that is not the controller": (dict(controller=3), STALE_CONTROLLER_EPOCH),
    "no broker epoch": (dict(broker_epoch=-1), STALE_BROKER_EPOCH),
    "an earlier registration's epoch": (dict(broker_epoch=MY_EPOCH - 1), STALE_BROKER_EPOCH),
    "a guessed newer epoch": (dict(broker_epoch=MY_EPOCH + 1000), STALE_BROKER_EPOCH),
}


@pytest.mark.parametrize("case", FORGED)
async def test_controller_requests_are_refused_unless_they_match_zookeeper(broker, case):
    claim, error = FORGED[case]
    r = await broker.apis.leader_and_isr(leader_and_isr(**claim))
    assert r.error_code == error.code
    assert TP not in broker.replica_manager.partitions and broker.log_manager.get_log(TP) is None
    r = await broker.apis.update_metadata(UpdateMetadataRequest(
        claim.get("controller", CONTROLLER), claim.get("epoch", CONTROLLER_EPOCH),
        claim.get("broker_epoch", MY_EPOCH), [], [LiveBroker(9, "evil", 1)]))
    assert r.error_code == error.code and broker.metadata.brokers == {}
    # and the real controller is served
    assert (await broker.apis.leader_and_isr(leader_and_isr())).error_code == NONE.code
    assert broker.replica_manager.partitions[TP].is_leader


async def test_a_stop_replica_with_delete_from_a_client_deletes_nothing(broker):
    await broker.apis.leader_and_isr(leader_and_isr())
    log = broker.log_manager.get_log(TP)
    for claim, error in FORGED.values():
        req = StopReplicaRequest(claim.get("controller", CONTROLLER), claim.get("epoch", CONTROLLER_EPOCH),
                                 claim.get("broker_epoch", MY_EPOCH), [StopReplicaPartition(TP.topic, 0, 0, True)])
        assert (await broker.apis.stop_replica(req)).error_code == error.code
    assert broker.log_manager.get_log(TP) is log and broker.replica_manager.partitions[TP].is_leader


async def test_a_new_controllers_first_request_before_the_watch_fired_is_accepted(broker):
    # broker 3 won an election (epoch 6) and sends before our /controller watch reported it
    broker.zk.controller = (3, CONTROLLER_EPOCH + 1)
    r = await broker.apis.leader_and_isr(leader_and_isr(controller=3, epoch=CONTROLLER_EPOCH + 1))
    assert r.error_code == NONE.code and broker.zk.reads["controller"] == 1
    assert (broker.registry.controller_id, broker.registry.controller_epoch) == (3, CONTROLLER_EPOCH + 1)
    # the deposed controller is refused from now on, without asking ZooKeeper again
    r = await broker.apis.leader_and_isr(leader_and_isr(leader_epoch=1))
    assert r.error_code == STALE_CONTROLLER_EPOCH.code and broker.zk.reads["controller"] == 1


async def test_a_request_for_a_registration_whose_register_call_has_not_returned_is_accepted(broker):
    # the broker registered again (session expired): the controller saw the new znode first
    broker.zk.epochs[ME] = MY_EPOCH + 50
    r = await broker.apis.leader_and_isr(leader_and_isr(broker_epoch=MY_EPOCH + 50))
    assert r.error_code == NONE.code and broker.zk.reads["brokers"] == 1


async def test_a_late_request_for_an_earlier_registration_is_refused_though_the_registry_lags(broker):
    """Kafka's rule: a request carrying an older broker epoch than ours is stale, whatever the
    registry says. A controller's UpdateMetadata sent before our session expired can arrive
    late on the connection it gave up, after our new registration's metadata: it must not
    roll the metadata back (while the registry, whose watch may have missed our new
    registration, still holds the old epoch)."""
    old, new = MY_EPOCH, MY_EPOCH + 50

    def update(broker_epoch: int, isr: list[int], version: int) -> UpdateMetadataRequest:
        return UpdateMetadataRequest(CONTROLLER, CONTROLLER_EPOCH, broker_epoch,
                                     [PartitionState(TP.topic, TP.partition, CONTROLLER_EPOCH, 2, 0, isr, version,
                                                     [1, 2, 3])],
                                     [LiveBroker(b, "h", 9000 + b) for b in (1, 2, 3)])

    broker.zk.epochs[ME] = broker.state.broker_epoch = new  # registered again; the registry holds `old`
    assert (await broker.apis.update_metadata(update(new, [1, 2, 3], 2))).error_code == NONE.code
    late = await broker.apis.update_metadata(update(old, [2, 3], 1))
    assert late.error_code == STALE_BROKER_EPOCH.code
    assert broker.metadata.partition_state(TP).isr == [1, 2, 3]
    assert broker.zk.reads["brokers"] == 0  # refused without asking ZooKeeper


async def test_a_controller_resigned_in_zookeeper_is_refused(broker):
    broker.zk.controller = (None, CONTROLLER_EPOCH)  # its session expired: /controller is gone
    await broker.registry.refresh_controller()
    assert (await broker.apis.leader_and_isr(leader_and_isr())).error_code == STALE_CONTROLLER_EPOCH.code


async def test_forged_claims_ahead_cost_zookeeper_one_read_at_a_time(broker, autojump_clock):
    answers = []

    async def forge():
        answers.append((await broker.apis.leader_and_isr(leader_and_isr(epoch=CONTROLLER_EPOCH + 7))).error_code)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(50):
            nursery.start_soon(forge)
    assert answers == [STALE_CONTROLLER_EPOCH.code] * 50
    assert broker.zk.reads["controller"] == 1  # all 50 waited for the same read
    for _ in range(20):  # one after the other: a read each, every reread_interval_s at most
        await forge()
    assert broker.zk.reads["controller"] == 21 and trio.current_time() - start >= 20 * 0.1


async def test_a_claim_zookeeper_cannot_check_waits_until_it_can(broker, autojump_clock):
    # a new controller's first request while this broker's connection to ZooKeeper is down:
    # refusing it would lose it (the controller resends only what timed out)
    broker.zk.controller, broker.zk.failures = (3, CONTROLLER_EPOCH + 1), 5
    r = await broker.apis.leader_and_isr(leader_and_isr(controller=3, epoch=CONTROLLER_EPOCH + 1))
    assert r.error_code == NONE.code and broker.zk.reads["controller"] == 6
    broker.zk.failures = 5  # and a forged claim is still refused once ZooKeeper answers
    r = await broker.apis.leader_and_isr(leader_and_isr(controller=3, epoch=CONTROLLER_EPOCH + 2))
    assert r.error_code == STALE_CONTROLLER_EPOCH.code and broker.zk.reads["controller"] == 12


async def test_a_zookeeper_that_does_not_answer_holds_a_claim_at_most_the_reread_timeout(broker, autojump_clock):
    broker.zk.hang = True
    start = trio.current_time()
    r = await broker.apis.leader_and_isr(leader_and_isr(epoch=CONTROLLER_EPOCH + 1))
    assert r.error_code == STALE_CONTROLLER_EPOCH.code and trio.current_time() - start <= 2.0 + 0.2
    broker.zk.hang = False  # the next claim gets a read of its own
    broker.zk.controller = (CONTROLLER, CONTROLLER_EPOCH + 1)
    assert (await broker.apis.leader_and_isr(leader_and_isr(epoch=CONTROLLER_EPOCH + 1))).error_code == NONE.code


# -- ControlledShutdown, InitProducerId, DeleteTopics --------------------------------------------


class SerialController:
    """The controller's ``call`` without its event loop: the test is the only caller."""

    def __init__(self, controller: Controller):
        self.controller = controller
        self.is_active = True
        self.deleted: list[str] = []

    async def call(self, fn):
        return await fn()

    async def controlled_shutdown(self, broker_id, broker_epoch):
        return await self.controller.controlled_shutdown(broker_id, broker_epoch)

    async def delete_topics(self, names):
        self.deleted += names
        return [TopicResult(n, NONE.code) for n in names], []


def active_controller(zk: FakeZooKeeper, *, partitions: bool = True) -> Controller:
    """Controller 2, with broker 1 leading ``TP`` (or, without ``partitions``, leading nothing)."""
    c = Controller(ControllerConfig(broker_id=CONTROLLER), zk)
    c.ctx = ControllerContext(CONTROLLER_EPOCH, 0, brokers={b: BrokerInfo(b, "127.0.0.1", 9000 + b) for b in zk.epochs},
                              broker_epochs=dict(zk.epochs))
    if partitions:
        c.ctx.assignments[TP.topic] = {0: [ME, 2, 3]}
        c.ctx.states[TP] = (LeaderAndIsr(ME, 0, (ME, 2, 3), CONTROLLER_EPOCH), 0)
    return c


@pytest.mark.parametrize("epoch", [-1, 0, MY_EPOCH - 1, MY_EPOCH + 1, MY_EPOCH + 7])
async def test_controlled_shutdown_needs_the_brokers_own_epoch(broker, epoch):
    controller = active_controller(broker.zk)
    broker.apis.controller = SerialController(controller)
    r = await broker.apis.controlled_shutdown(ControlledShutdownRequest(ME, epoch))
    assert r.error_code == STALE_BROKER_EPOCH.code
    assert controller.ctx.shutting_down == set() and controller.ctx.states[TP][0].leader == ME


async def test_controlled_shutdown_with_a_registration_the_controller_has_not_seen_yet(broker):
    controller = active_controller(broker.zk, partitions=False)
    broker.zk.epochs[ME] = MY_EPOCH + 50  # registered again; the broker-change event is queued
    with pytest.raises(TidelogError) as e:
        await controller.controlled_shutdown(ME, MY_EPOCH + 51)
    assert e.value.error is STALE_BROKER_EPOCH and controller.ctx.shutting_down == set()
    assert await controller.controlled_shutdown(ME, MY_EPOCH + 50) == ([], [])
    assert controller.ctx.shutting_down == {ME}


async def test_init_producer_id_cannot_name_another_producers_id(broker):
    r = await broker.apis.init_producer_id(InitProducerIdRequest())
    assert (r.error_code, r.producer_id, r.producer_epoch) == (NONE.code, 1000, 0)
    # as in Kafka without a transactional id: the named id is not continued, a new one is given
    r = await broker.apis.init_producer_id(InitProducerIdRequest(producer_id=1000, producer_epoch=0))
    assert (r.error_code, r.producer_id, r.producer_epoch) == (NONE.code, 1001, 0)
    r = await broker.apis.init_producer_id(InitProducerIdRequest(producer_id=1000, producer_epoch=-1))
    assert r.error_code == INVALID_REQUEST.code and "both" in r.error_message


async def test_internal_topics_cannot_be_deleted(broker):
    controller = broker.apis.controller = SerialController(active_controller(broker.zk))
    r = await broker.apis.delete_topics(DeleteTopicsRequest(["a", "__consumer_offsets", "b"]))
    assert [(t.name, t.error_code) for t in r.responses] == [
        ("a", NONE.code), ("__consumer_offsets", INVALID_TOPIC_EXCEPTION.code), ("b", NONE.code)]
    assert "internal topic" in r.responses[1].error_message and controller.deleted == ["a", "b"]
    r = await broker.apis.delete_topics(DeleteTopicsRequest(["__consumer_offsets"]))
    assert r.responses[0].error_code == INVALID_TOPIC_EXCEPTION.code and controller.deleted == ["a", "b"]


async def test_a_replacing_alter_configs_with_a_null_value_is_refused_without_the_controller(broker):
    # Kafka's legacy AlterConfigs replaces the whole set: a key is removed by leaving it out,
    # and a null value is refused (INVALID_REQUEST), as Kafka does
    controller = broker.apis.controller = SerialController(active_controller(broker.zk))
    calls = []
    controller.call = lambda fn: calls.append(fn)
    resource = AlterConfigsResource(TOPIC_RESOURCE, TP.topic, {"retention.ms": None, "segment.ms": "90000"},
                                    replace=True)
    [r] = (await broker.apis.alter_configs(AlterConfigsRequest([resource]))).responses
    assert r.error_code == INVALID_REQUEST.code and "retention.ms" in r.error_message and "leave a key out" in r.error_message
    assert calls == []


async def test_a_resource_named_twice_in_alter_configs_is_refused_without_the_controller(broker):
    """Found by the fuzzer's kind of input: AlterConfigs naming one topic thousands of times
    was a ZooKeeper write and an UpdateMetadata round each, every other controller event
    waiting behind them."""
    controller = broker.apis.controller = SerialController(active_controller(broker.zk))
    calls = []
    controller.call = lambda fn: calls.append(fn)  # never awaited: nothing may reach it
    twice = AlterConfigsResource(TOPIC_RESOURCE, TP.topic, {"retention.ms": "1000"})
    r = await broker.apis.alter_configs(AlterConfigsRequest([twice] * 16_000))
    assert {(x.error_code, x.resource_name) for x in r.responses} == {(INVALID_REQUEST.code, TP.topic)}
    assert len(r.responses) == 16_000 and "appears more than once" in r.responses[0].error_message
    assert calls == []


async def test_an_update_metadata_deleting_topics_has_the_group_coordinator_drop_their_offsets(broker):
    """Kafka's handleUpdateMetadataRequest -> groupCoordinator.handleDeletedPartitions; a
    refused UpdateMetadata deletes nothing."""
    deleted = []

    class Coordinator:
        def handle_deleted_topics(self, topics):
            deleted.append(list(topics))

    broker.apis.coordinator = Coordinator()

    def update(**claim) -> UpdateMetadataRequest:
        return UpdateMetadataRequest(claim.get("controller", CONTROLLER), claim.get("epoch", CONTROLLER_EPOCH),
                                     claim.get("broker_epoch", MY_EPOCH), [], [LiveBroker(ME, "h", 9000)],
                                     deleted_topics=["orders"])

    for claim, error in FORGED.values():
        assert (await broker.apis.update_metadata(update(**claim))).error_code == error.code
    assert deleted == []
    assert (await broker.apis.update_metadata(update())).error_code == NONE.code
    assert deleted == [["orders"]]
    assert broker.state.deleted_topics == ["orders"]  # the broker is told too (its metrics forget them)


async def test_a_full_update_metadata_deletes_the_topics_it_does_not_name(broker):
    """A broker that missed a topic's deletion learns of it from the full UpdateMetadata it gets
    when it registers again: gone from its metadata, its overrides and its groups' offsets."""
    deleted = []

    class Coordinator:
        def handle_deleted_topics(self, topics):
            deleted.append(list(topics))

    broker.apis.coordinator = Coordinator()
    st = PartitionState("kept", 0, CONTROLLER_EPOCH, ME, 0, [ME], 0, [ME])
    gone = dataclasses.replace(st, topic_name="gone")

    def update(states, full) -> UpdateMetadataRequest:
        return UpdateMetadataRequest(CONTROLLER, CONTROLLER_EPOCH, MY_EPOCH, states, [LiveBroker(ME, "h", 9000)],
                                     topic_configs={s.topic_name: {"retention.ms": "1000"} for s in states}, full=full)

    assert (await broker.apis.update_metadata(update([st, gone], full=False))).error_code == NONE.code
    assert "gone" in broker.state.topic_overrides and deleted == []
    assert (await broker.apis.update_metadata(update([st], full=True))).error_code == NONE.code
    assert broker.metadata.topics == ["kept"] and "gone" not in broker.state.topic_overrides
    assert deleted == [["gone"]]


class Elections:
    """The controller's elections, recorded."""

    is_active = True

    def __init__(self):
        self.asked: list[tuple[str, list | None]] = []

    async def call(self, fn):
        return await fn()

    async def elect_preferred(self, tps):
        self.asked.append(("preferred", tps))
        return [(tp, NONE.code, None) for tp in tps or []], []

    async def elect_unclean(self, tps):
        self.asked.append(("unclean", tps))
        return [(tp, NONE.code, None) for tp in tps or []], []


@pytest.mark.parametrize("election_type, asked", [(0, "preferred"), (1, "unclean")])
async def test_elect_leaders_runs_the_election_of_its_type(broker, election_type, asked):
    broker.apis.controller = elections = Elections()
    r = await broker.apis.elect_leaders(ElectLeadersRequest([TopicPartitionRef(TP.topic, 0)], election_type))
    assert r.error_code == NONE.code and [x.error_code for x in r.results] == [NONE.code]
    assert elections.asked == [(asked, [TP])]


async def test_elect_leaders_of_an_unknown_election_type_is_refused(broker):
    broker.apis.controller = elections = Elections()
    r = await broker.apis.elect_leaders(ElectLeadersRequest([TopicPartitionRef(TP.topic, 0)], 2))
    assert r.error_code == INVALID_REQUEST.code and [x.error_code for x in r.results] == [INVALID_REQUEST.code]
    assert "election type 2" in r.results[0].error_message and elections.asked == []
