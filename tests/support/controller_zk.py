"""An in-memory stand-in for the ZooKeeper calls the controller makes, for its unit tests.

It keeps what the controller reads and writes (topics with their assignments and moves,
topic configs, partition states with versions and check-and-set) in dicts and counts every
write. The controller's writes are fenced as on ZooKeeper: one carrying a
``controller_epoch_zk_version`` other than ``epoch`` (another controller elected since)
raises ControllerMovedError and changes nothing. The controller's behaviour on the real
ZooKeeper is covered by the integration tests."""

from __future__ import annotations

import math

import trio

from tidelog.broker.zookeeper.layout import (
    BrokerInfo,
    ControllerMovedError,
    LeaderAndIsr,
    ReplicaReport,
    TopicExistsError,
    ZkPaths,
    ZkVersionConflict,
)
from tidelog.broker.zookeeper.zk import ZkClient

PATHS = ZkPaths()


class FakeZk:
    paths = PATHS

    def __init__(self):
        self.assignments: dict[str, dict[int, list[int]]] = {}
        self.moves: dict[str, dict[int, tuple]] = {}
        self.configs: dict[str, dict[str, str]] = {}
        self.states: dict[tuple[str, int], tuple[LeaderAndIsr, int]] = {}
        self.damage: dict[str, ReplicaReport] = {}  # path -> report
        self.isr_changes: dict[str, list[tuple[str, int]]] = {}  # path -> partitions
        self.marked: set[str] = set()  # /admin/delete_topics children
        self.deleted_notifications: list[str] = []
        self.broker_epochs: dict[int, int] = {}
        self.writes = 0
        self.controller: int | None = None  # /controller
        self.controller_ours = True  # /controller, when it names this broker, is this session's
        self.epoch = 0  # /controller_epoch (also its znode version here)
        self.live: dict[int, int] = {}  # registered broker -> broker epoch
        # registered broker -> its registration, where not BrokerInfo(b, "127.0.0.1", 9000 + b)
        self.infos: dict[int, BrokerInfo] = {}
        self.unreadable: dict[int, str] = {}  # registered broker -> why its registration does not decode
        self.data_watches: dict[str, trio.MemorySendChannel] = {}  # watched path -> its reports
        self.failures: dict[str, list[Exception]] = {}  # method -> what its next calls raise
        self._closed = False

    until_answered = ZkClient.until_answered  # the real retry rule, over this stand-in
    closed = ZkClient.closed

    def _maybe_fail(self, method: str) -> None:
        if self.failures.get(method):
            raise self.failures[method].pop(0)

    def _fence(self, controller_epoch_zk_version: int | None) -> None:
        if controller_epoch_zk_version is not None and controller_epoch_zk_version != self.epoch:
            raise ControllerMovedError(f"the controller epoch moved on (expected znode version "
                                       f"{controller_epoch_zk_version}, now {self.epoch})")

    def elect_another(self, broker_id: int) -> None:
        """Another broker wins an election (this controller's session expired unseen)."""
        self.controller, self.controller_ours, self.epoch = broker_id, False, self.epoch + 1

    # -- the controller and the brokers

    async def controller_epoch(self):
        return self.epoch, self.epoch

    async def get_controller_id(self):
        return self.controller

    async def try_elect_controller(self, broker_id):
        if self.controller is None:
            self.controller, self.controller_ours, self.epoch = broker_id, True, self.epoch + 1
            return self.epoch
        return self.epoch if self.controller == broker_id and self.controller_ours else None

    async def resign_controller(self, broker_id):
        if self.controller == broker_id and self.controller_ours:
            self.controller = None

    async def live_brokers_and_epochs(self):
        return {b: (self.infos.get(b) or BrokerInfo(b, "127.0.0.1", 9000 + b), e) for b, e in self.live.items()}

    async def broker_registrations(self):
        """As ZkClient's: the ``unreadable`` registrations apart, with their problem."""
        readable = await self.live_brokers_and_epochs()
        return ({b: r for b, r in readable.items() if b not in self.unreadable},
                {b: (f"{PATHS.broker(b)}: {problem}", readable[b][1]) for b, problem in self.unreadable.items()
                 if b in readable})

    async def watch_data(self, path):
        """A channel the test reports ``path``'s changes into (``data_watches``)."""
        send, receive = trio.open_memory_channel(math.inf)
        self.data_watches[path] = send
        return receive

    async def topics_marked_for_deletion(self):
        return sorted(self.marked)

    # -- topics

    async def get_topics(self):
        self._maybe_fail("get_topics")
        return list(self.assignments)

    async def create_topic(self, name, assignment, config):
        if name in self.assignments:
            raise TopicExistsError(f"Topic '{name}' already exists.")
        self.writes += 1
        self.assignments[name] = {p: list(r) for p, r in assignment.items()}
        self.configs[name] = dict(config)

    async def get_assignment(self, topic):
        return self.assignments.get(topic)

    async def get_assignment_and_moves(self, topic):
        if topic not in self.assignments:
            return None
        return dict(self.assignments[topic]), dict(self.moves.get(topic, {}))

    async def set_assignment(self, topic, assignment, version=None, moving=None, *, controller_epoch_zk_version):
        self._fence(controller_epoch_zk_version)
        self.writes += 1
        self.assignments[topic] = {p: list(r) for p, r in assignment.items()}
        self.moves[topic] = {p: (tuple(a), tuple(r)) for p, (a, r) in (moving or {}).items()}

    async def get_topic_config(self, topic):
        return dict(self.configs.get(topic, {}))

    async def set_topic_config(self, topic, config, *, controller_epoch_zk_version):
        self._fence(controller_epoch_zk_version)
        self.writes += 1
        self.configs[topic] = dict(config)

    async def mark_topic_for_deletion(self, topic):
        self.writes += 1
        self.marked.add(topic)

    async def delete_topic(self, topic, *, controller_epoch_zk_version):
        PATHS.topic(topic), PATHS.delete_topic_marker(topic)  # as ZkClient, refuses what is no znode name
        self._fence(controller_epoch_zk_version)
        self.writes += 1
        self.assignments.pop(topic, None)
        self.moves.pop(topic, None)
        self.configs.pop(topic, None)
        self.states = {tp: st for tp, st in self.states.items() if tp[0] != topic}
        self.marked.discard(topic)

    # -- partition states

    async def get_partition_state(self, topic, partition):
        return self.states.get((topic, partition))

    async def get_partition_states(self, topic):
        return {p: st for (t, p), st in self.states.items() if t == topic}

    async def create_partition_state(self, topic, partition, st, expected_version):
        self._fence(expected_version)
        self.writes += 1
        self.states[(topic, partition)] = (st, 0)
        return 0

    async def update_partition_state(self, topic, partition, st, expected_version, controller_epoch_zk_version=None):
        self._maybe_fail("update_partition_state")
        self._fence(controller_epoch_zk_version)
        _, version = self.states[(topic, partition)]
        if version != expected_version:
            raise ZkVersionConflict(f"{topic}-{partition}: version {version}, expected {expected_version}")
        self.writes += 1
        self.states[(topic, partition)] = (st, version + 1)
        return version + 1

    def leader_changes_isr(self, topic: str, partition: int, isr: list[int]) -> None:
        """What a leader's ISR write does (same leader epoch), unseen by the controller."""
        st, version = self.states[(topic, partition)]
        self.states[(topic, partition)] = (st.with_isr(isr), version + 1)

    # -- notifications

    async def notify_replica_damage(self, broker_id, broker_epoch, partitions, offline=False):
        path = f"/replica_damage_notification/replica_damage_{len(self.damage):010d}"
        self.damage[path] = ReplicaReport(broker_id, broker_epoch, list(partitions), offline)
        return path

    async def replica_damage_notifications(self):
        return sorted(self.damage.items())

    async def notify_isr_change(self, partitions):
        path = f"/isr_change_notification/isr_change_{len(self.isr_changes):010d}"
        self.isr_changes[path] = list(partitions)
        return path

    async def isr_change_notifications(self):
        return sorted(self.isr_changes.items())

    async def delete_isr_change_notifications(self, paths, controller_epoch_zk_version=None):
        self._fence(controller_epoch_zk_version)
        for p in paths:
            self.damage.pop(p, None)
            self.isr_changes.pop(p, None)
            self.deleted_notifications.append(p)

    async def get_broker_epoch(self, broker_id):
        return self.broker_epochs.get(broker_id)
