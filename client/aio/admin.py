"""The Trio admin client: topics, partitions, configs, cluster description.

Routing follows Kafka's ZooKeeper era: CreateTopics, DeleteTopics, CreatePartitions,
AlterConfigs, ElectLeaders and the reassignments go to the controller
(``MetadataResponse.controller_id``). A NOT_CONTROLLER answer (per topic, resource or
partition, or for the whole request), a lost connection or a timeout refreshes the metadata
and retries the affected items, with backoff, until the call's timeout. Reads
(describe_topics, list_topics, describe_cluster, a topic's DescribeConfigs) go to any broker:
AlterConfigs returns once the brokers have the new configs.

Consumer groups (Kafka's AdminClient for groups): ListGroups goes to every broker (each lists
the groups it coordinates); DescribeGroups, DeleteGroups, OffsetFetch and OffsetCommit go to
the group's coordinator (FindCoordinator), retried with backoff while it answers
COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS.
``alter_group_offsets`` (a reset) first checks that the group has no members: the
coordinator only accepts a commit without a generation from an empty group, and the error
says to stop the group's consumers first. Offsets (earliest, the high watermark, for a
timestamp, and the log end offset) come from ListOffsets to each partition's leader.

ACLs (Kafka's AdminClient for ACLs, with confluent-kafka's types from ``protocol.acls``):
CreateAcls, DescribeAcls and DeleteAcls go to any broker, which stores them in ZooKeeper;
the other brokers apply a change when its notification reaches them (within a second or so),
so a describe right after a create may not show it yet on another broker.

Per-topic error codes become exceptions in one place (``client.errors.broker_error``), whose
message names the topic and the cause. A call over several topics raises the first topic's
error, with ``.results`` (topic -> None or exception) attached so the others are not lost.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import trio

from tidelog.aio._lifecycle import RunsInOwnNursery
from tidelog.aio.assignors import PROTOCOL_TYPE, decode_assignment
from tidelog.aio.cluster import Backoff, Cluster, PartitionInfo, list_offsets, list_offsets_request, to_leaders
from tidelog.aio.entity_configs import (
    ClientQuotaAlteration,
    ClientQuotaEntity,
    ClientQuotaFilter,
    EntityConfigClient,
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from tidelog.errors import BrokerConnectionError, RequestTimedOut, TidelogError, broker_error
from tidelog.protocol.acls import AclBinding, AclBindingFilter
from tidelog.protocol.codec import ApiKey, Message
from tidelog.protocol.errors import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    GROUP_ID_NOT_FOUND,
    ILLEGAL_GENERATION,
    NON_EMPTY_GROUP,
    NONE,
    NOT_CONTROLLER,
    NOT_COORDINATOR,
    UNKNOWN_MEMBER_ID,
    error_for,
)
from tidelog.protocol.messages import (
    BROKER_RESOURCE,
    DEBUGGING_REPLICA_ID,
    LATEST_TIMESTAMP,
    NO_OFFSET,
    PREFERRED_ELECTION,
    TOPIC_RESOURCE,
    UNCLEAN_ELECTION,
    AclCreation,
    AclFilter,
    AlterConfigsRequest,
    AlterConfigsResource,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ApiVersionsRequest,
    BrokerMetadata,
    ConfigEntry,
    CreatableTopic,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsTopic,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupsRequest,
    DeleteRecordsPartition,
    DeleteRecordsRequest,
    DeleteRecordsTopic,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeGroupsRequest,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    FindCoordinatorRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    ListPartitionReassignmentsTopics,
    MetadataResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchTopic,
    ReassignablePartition,
    ReassignableTopic,
    TopicPartitionRef,
)
from tidelog.protocol.topics import TopicPartition, validate_topic_name
from tidelog.security import SecurityConfig

if TYPE_CHECKING:  # the options' names and types, for IDEs and type checkers
    from typing import Unpack

    from tidelog.options import SecurityOptions

__all__ = ["AsyncAdmin", "NewTopic", "TopicDescription", "PartitionInfo", "ClusterDescription",
           "ConfigEntry", "BrokerMetadata", "ListedGroup", "MemberDescription", "ConsumerGroupDescription",
           "GroupOffsets", "ReplicaInfo", "LogDirDescription", "ClientQuotaAlteration", "ClientQuotaEntity", "ClientQuotaFilter",
           "UserScramCredentialDeletion", "UserScramCredentialUpsertion", "UserScramCredentialsDescription"]


_ELECTION_TYPES = {"preferred": PREFERRED_ELECTION, "unclean": UNCLEAN_ELECTION}  # ElectLeaders' election_type


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create. -1 means the broker's default (num.partitions,
    default.replication.factor); ``replica_assignment`` (partition -> broker ids) sets both
    instead, and then neither may be given (Kafka's broker refuses both). A count that is
    neither positive nor -1 is refused here, naming it, before any request is sent."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    replica_assignment: dict[int, list[int]] | None = None
    config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the fields' widths in CreateTopics: INT32 and INT16
        for what, value, most in (("num_partitions", self.num_partitions, (1 << 31) - 1),
                                  ("replication_factor", self.replication_factor, (1 << 15) - 1)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"topic {self.name!r}: {what} must be an int, got {value!r}")
            if value == 0 or value < -1:
                raise ValueError(f"topic {self.name!r}: {what} must be positive or -1 (the broker's default), "
                                 f"got {value}")
            if value > most:
                raise ValueError(f"topic {self.name!r}: {what} must be at most {most}, got {value}")
            if value != -1 and self.replica_assignment is not None:
                raise ValueError(f"topic {self.name!r}: replica_assignment sets the partitions and replication "
                                 f"factor: give {what}={value} or it, not both")

    def to_creatable(self) -> CreatableTopic:
        assignments = None
        if self.replica_assignment is not None:
            assignments = {str(p): list(replicas) for p, replicas in self.replica_assignment.items()}
        return CreatableTopic(self.name, self.num_partitions, self.replication_factor, assignments,
                              {k: str(v) for k, v in self.config.items()})


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partitions: list[PartitionInfo]
    is_internal: bool = False


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: list[BrokerMetadata]


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    coordinator: int


@dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    """state: Empty, PreparingRebalance, CompletingRebalance, Stable or Dead (no such group)."""

    group_id: str
    state: str
    protocol_type: str
    assignor: str
    generation: int
    leader: str
    coordinator: int
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True, slots=True)
class GroupOffsets:
    """One partition of a group: its committed offset (None: none), the partition's log end
    offset (the high watermark: what a consumer can read) and the lag between them."""

    partition: TopicPartition
    committed: int | None
    log_end_offset: int | None
    lag: int | None


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A partition being moved (Kafka's names): its replica set RS while the move runs (the
    target first, then the replicas leaving), the replicas being added and those being
    removed. The target is ``replicas`` without ``removing_replicas``."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing_replicas)


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One replica as its broker holds it (DescribeLogDirs): size on disk, Kafka's
    ``offset_lag`` (the HW minus the replica's LEO, never negative), and the replica's log
    start offset, log end offset and high watermark."""

    partition: TopicPartition
    size: int
    offset_lag: int
    is_future: bool
    log_start_offset: int
    log_end_offset: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class LogDirDescription:
    """One log dir of a broker: its replicas, and its file system's total and usable bytes
    (-1 when unknown); ``error`` (Kafka's ``LogDirDescription.error()``), when the broker
    cannot use the dir: KafkaStorageError for a dir it took offline after a failure."""

    path: str
    replicas: dict[TopicPartition, ReplicaInfo]
    total_bytes: int = -1
    usable_bytes: int = -1
    error: TidelogError | None = None


# a partition without a leader for that many metadata fetches (about a second with the default
# backoff) has an unknown lag: describing a group does not wait the whole timeout for it
_LAG_LEADERLESS_ROUNDS = 4
_COORDINATOR_RETRY = {COORDINATOR_NOT_AVAILABLE.code, NOT_COORDINATOR.code, COORDINATOR_LOAD_IN_PROGRESS.code}
INACTIVE_STATES = ("Empty", "Dead")

Outcomes = dict[str, tuple[int, str | None]]  # name -> (error code, message)
# the name in Outcomes of a request answered as a whole (ElectLeaders, the reassignments);
# no topic name has a space
_WHOLE_REQUEST = "the request"


class AsyncAdmin(RunsInOwnNursery):
    """Use ``async with AsyncAdmin(...) as admin:`` or ``await nursery.start(admin.run)``."""

    def __init__(self, bootstrap_servers: str | Sequence[str] = "localhost:9092", *,
                 client_id: str | None = None, request_timeout_ms: int = 30000,
                 retry_backoff_ms: int = 100, retry_backoff_max_ms: int = 1000,
                 default_api_timeout_ms: int = 60000, **security: Unpack[SecurityOptions]):
        """``security``: ``tidelog.security.SecurityConfig``'s options (``security_protocol``,
        ``ssl_cafile``, ``sasl_mechanism``, ``sasl_plain_username``, ...)."""
        self.request_timeout_ms = request_timeout_ms
        self.default_api_timeout_ms = default_api_timeout_ms
        self._backoff = (retry_backoff_ms / 1000, retry_backoff_max_ms / 1000)
        self._cluster = Cluster(bootstrap_servers, client_id=client_id,
                                request_timeout_ms=request_timeout_ms,
                                retry_backoff_ms=retry_backoff_ms,
                                retry_backoff_max_ms=retry_backoff_max_ms,
                                security=SecurityConfig(**security))
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._stopped = trio.Event()
        self._coordinators: dict[str, int] = {}  # group id -> coordinator node, until it moves

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._started:
            raise RuntimeError("this admin client was already started")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self._cluster.run)
                task_status.started()
        finally:
            self._stopped.set()

    async def close(self) -> None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()
        if self._started:
            with trio.CancelScope(shield=True):
                await self._stopped.wait()

    # -- topics ---------------------------------------------------------------------------------

    async def create_topics(self, new_topics: Iterable[NewTopic], timeout_ms: int | None = None,
                            validate_only: bool = False) -> dict[str, None]:
        """Create topics on the controller; returns ``{name: None}`` or raises the first
        failure (e.g. TOPIC_ALREADY_EXISTS) naming its topic."""
        topics = {t.name: t for t in new_topics}
        for name in topics:
            validate_topic_name(name)
        timeout_ms = self._timeout_ms(timeout_ms)

        def build(names: list[str]) -> Message:
            return CreateTopicsRequest([topics[n].to_creatable() for n in names], timeout_ms, validate_only)

        outcomes = await self._to_controller(list(topics), build, ApiKey.CREATE_TOPICS,
                                             lambda r: {t.name: (t.error_code, t.error_message) for t in r.topics},
                                             timeout_ms)
        return _raise_for(outcomes, "create")

    async def delete_topics(self, names: Iterable[str], timeout_ms: int | None = None) -> dict[str, None]:
        names = list(dict.fromkeys(names))
        timeout_ms = self._timeout_ms(timeout_ms)
        outcomes = await self._to_controller(
            names, lambda ns: DeleteTopicsRequest(ns, timeout_ms), ApiKey.DELETE_TOPICS,
            lambda r: {t.name: (t.error_code, t.error_message) for t in r.responses}, timeout_ms)
        return _raise_for(outcomes, "delete")

    async def create_partitions(self, new_counts: dict[str, int], timeout_ms: int | None = None,
                                validate_only: bool = False) -> dict[str, None]:
        """Grow each topic to the given total number of partitions."""
        timeout_ms = self._timeout_ms(timeout_ms)

        def build(names: list[str]) -> Message:
            return CreatePartitionsRequest([CreatePartitionsTopic(n, new_counts[n]) for n in names],
                                           timeout_ms, validate_only)

        outcomes = await self._to_controller(
            list(new_counts), build, ApiKey.CREATE_PARTITIONS,
            lambda r: {t.name: (t.error_code, t.error_message) for t in r.results}, timeout_ms)
        return _raise_for(outcomes, "add partitions to")

    async def describe_topics(self, names: Iterable[str] | None = None,
                              timeout_ms: int | None = None) -> list[TopicDescription]:
        """Partition, leader, leader epoch, replicas, ISR and offline replicas of each topic
        (every topic when ``names`` is None). Raises for a topic that does not exist."""
        wanted = None if names is None else list(dict.fromkeys(names))
        response = await self._metadata(wanted, timeout_ms)
        out = []
        for t in response.topics:
            if t.error_code != NONE.code:
                raise broker_error(t.error_code, f"topic {t.name!r}", t.error_message)
            parts = sorted((PartitionInfo(t.name, p.partition_index, p.leader_id, p.leader_epoch,
                                          tuple(p.replica_nodes), tuple(p.isr_nodes),
                                          tuple(p.offline_replicas), p.error_code)
                            for p in t.partitions), key=lambda p: p.partition)
            out.append(TopicDescription(t.name, parts, t.is_internal))
        return sorted(out, key=lambda d: d.name)

    async def list_topics(self, include_internal: bool = False, timeout_ms: int | None = None) -> list[str]:
        response = await self._metadata(None, timeout_ms)
        return sorted(t.name for t in response.topics
                      if t.error_code == NONE.code and (include_internal or not t.is_internal))

    async def describe_cluster(self, timeout_ms: int | None = None) -> ClusterDescription:
        response = await self._metadata([], timeout_ms)
        return ClusterDescription(response.cluster_id, response.controller_id,
                                  sorted(response.brokers, key=lambda b: b.node_id))

    async def describe_log_dirs(self, brokers: Iterable[int] | None = None, timeout_ms: int | None = None
                                ) -> dict[int, dict[str, LogDirDescription]]:
        """Kafka's ``describeLogDirs``: each broker's log dirs and the replicas in them, asked
        of each broker (None: every broker of the cluster), all at once. Returns broker ->
        log dir path -> description, or raises the first broker's failure (for instance
        CLUSTER_AUTHORIZATION_FAILED without Describe on the cluster, or a broker that cannot
        be reached) with ``.results`` (broker -> its dirs or the exception) attached. A broker
        not reached (a retriable error) is asked again until the call's timeout."""
        deadline = self._deadline(timeout_ms)
        if brokers is None:
            await self._cluster.refresh(timeout=self._remaining(deadline))
            brokers = sorted(self._cluster.metadata.brokers)
        results: dict[int, Any] = {}

        async def ask(node: int) -> None:
            # as Kafka's describeLogDirs: a broker not reached (not yet in the metadata, a lost
            # connection, a retriable error) is asked again until the call's timeout
            backoff = Backoff(*self._backoff)
            while True:
                try:
                    await self._know_brokers([node], deadline)
                    r: DescribeLogDirsResponse = await self._cluster.request(
                        node, DescribeLogDirsRequest(None), api_key=ApiKey.DESCRIBE_LOG_DIRS,
                        timeout=self._request_s(deadline))
                except TidelogError as e:
                    results[node] = e
                else:
                    if r.error_code == NONE.code:
                        results[node] = {d.log_dir: _log_dir_description(d, node) for d in r.results}
                        return
                    results[node] = broker_error(r.error_code, f"cannot describe the log dirs of broker {node}")
                if not results[node].retriable or time.monotonic() + backoff.initial_s >= deadline:
                    return
                self._cluster.request_update()
                await trio.sleep(min(backoff.next_delay(), self._remaining(deadline)))

        async with trio.open_nursery() as nursery:
            for node in dict.fromkeys(brokers):
                nursery.start_soon(ask, node)
        failures = [e for e in results.values() if isinstance(e, BaseException)]
        if failures:
            failures[0].results = results
            raise failures[0]
        return dict(sorted(results.items()))

    async def _know_brokers(self, nodes: list[int] | None, deadline: float) -> None:
        """Refresh the metadata unless it lists every one of ``nodes`` (None: every broker, so
        always): a fresh client knows no broker until its first metadata answer."""
        known = self._cluster.metadata.brokers
        if nodes is None or any(n not in known for n in nodes):
            await self._cluster.refresh(timeout=self._remaining(deadline))

    async def _metadata(self, topics: list[str] | None, timeout_ms: int | None) -> MetadataResponse:
        return await self._cluster.fetch_metadata(topics, timeout=self._timeout_ms(timeout_ms) / 1000,
                                                  allow_auto_topic_creation=False)

    # -- configs --------------------------------------------------------------------------------

    async def describe_configs(self, topic: str, keys: Sequence[str] | None = None,
                               timeout_ms: int | None = None) -> dict[str, ConfigEntry]:
        """The topic's configuration: ``name -> ConfigEntry(name, value, read_only,
        is_default, is_sensitive)``. Any broker answers (as Kafka's admin client asks the least
        loaded one): each applies a topic's configs before AlterConfigs returns."""
        request = DescribeConfigsRequest([DescribeConfigsResource(TOPIC_RESOURCE, topic, list(keys) if keys else None)])
        r = await self._to_any(request, ApiKey.DESCRIBE_CONFIGS, timeout_ms)
        res = next((res for res in r.results if res.resource_name == topic), None)
        if res is None:
            raise TidelogError(f"DescribeConfigs answered no result for topic {topic!r}")
        if res.error_code != NONE.code:
            raise broker_error(res.error_code, f"cannot describe the configuration of topic {topic!r}",
                               res.error_message)
        return {c.name: c for c in res.configs}

    async def alter_configs(self, topic: str, configs: dict[str, str | None],
                            validate_only: bool = False, timeout_ms: int | None = None) -> None:
        """Set each key of the topic's configuration; a None value removes the override."""
        outcomes = await self._alter_configs(TOPIC_RESOURCE, topic, configs, validate_only, timeout_ms)
        _raise_for(outcomes, "alter the configuration of")

    async def alter_broker_configs(self, broker_id: int | None, configs: dict[str, str | None],
                                   validate_only: bool = False, timeout_ms: int | None = None) -> None:
        """Set a broker's dynamic configs (None: the cluster-wide default): the replication
        throttle rates, ``leader.replication.throttled.rate`` and
        ``follower.replication.throttled.rate`` (bytes/s). A None value removes one."""
        name = "" if broker_id is None else str(int(broker_id))
        code, message = (await self._alter_configs(BROKER_RESOURCE, name, configs, validate_only, timeout_ms))[name]
        if code != NONE.code:
            raise broker_error(code, f"cannot alter the configs of {f'broker {name}' if name else 'every broker'}",
                               message)

    async def _alter_configs(self, resource_type: int, name: str, configs: dict[str, str | None],
                             validate_only: bool, timeout_ms: int | None) -> Outcomes:
        """AlterConfigs of one resource, on the controller: its (error code, message)."""
        values = {k: None if v is None else str(v) for k, v in configs.items()}
        return await self._to_controller(
            [name], lambda ns: AlterConfigsRequest([AlterConfigsResource(resource_type, name, values)],
                                                   validate_only),
            ApiKey.ALTER_CONFIGS,
            lambda r: {res.resource_name: (res.error_code, res.error_message) for res in r.responses},
            self._timeout_ms(timeout_ms))

    async def elect_leaders(self, partitions: Iterable[TopicPartition] | None = None,
                            timeout_ms: int | None = None, election_type: str = "preferred"
                            ) -> dict[TopicPartition, tuple[int, str | None]]:
        """Leader election, as kafka-leader-election's ``--election-type``. ``"preferred"``:
        move leadership of ``partitions`` (None: all) back to their first assigned replica;
        ELECTION_NOT_NEEDED (84) means it already leads. ``"unclean"``: elect a leader for
        those without one, from the ISR or else any live replica (acknowledged records it
        lacks are lost), whatever unclean.leader.election.enable says; ELECTION_NOT_NEEDED
        means the partition has a leader. Returns each partition's (error code, message);
        with ``partitions`` None only those elected or that failed, as Kafka's
        ``electLeaders`` with null partitions: one that needed no election is left out."""
        election = _ELECTION_TYPES.get(election_type)
        if election is None:
            raise ValueError(f"election_type must be one of {sorted(_ELECTION_TYPES)}, not {election_type!r}")
        timeout_ms = self._timeout_ms(timeout_ms)
        asked = None if partitions is None else list(dict.fromkeys(TopicPartition(*tp) for tp in partitions))
        results: dict[TopicPartition, tuple[int, str | None]] = {}

        def build(_names: list[str]) -> ElectLeadersRequest:
            # after a NOT_CONTROLLER per partition, those partitions again (or all again)
            refs = None if asked is None else [TopicPartitionRef(tp.topic, tp.partition)
                                               for tp in asked if tp not in results]
            return ElectLeadersRequest(refs, election, timeout_ms)

        def extract(r: ElectLeadersResponse) -> Outcomes:
            if r.error_code != NONE.code:
                return {_WHOLE_REQUEST: (r.error_code, None)}
            moved = None  # a resigned controller, or not the controller: Kafka's per-partition answer
            for x in r.results:
                if x.error_code == NOT_CONTROLLER.code:
                    moved = (x.error_code, f"{x.topic_name}-{x.partition_index}: {x.error_message}")
                else:
                    results[TopicPartition(x.topic_name, x.partition_index)] = (x.error_code, x.error_message)
            return {_WHOLE_REQUEST: moved or (NONE.code, None)}
        outcomes = await self._to_controller([_WHOLE_REQUEST], build, ApiKey.ELECT_LEADERS, extract, timeout_ms)
        _raise_for_request(outcomes, "cannot elect leaders")
        return results

    async def broker_versions(self, brokers: Iterable[int] | None = None,
                              timeout_ms: int | None = None) -> dict[int, str | None]:
        """Each broker's software version (ApiVersions, asked of each broker; None for one that
        did not answer or does not say)."""
        timeout_s = self._timeout_ms(timeout_ms) / 1000
        deadline = time.monotonic() + timeout_s
        with contextlib.suppress(TidelogError):  # a broker not reached is None
            await self._know_brokers(None if brokers is None else list(brokers), deadline)
        nodes = sorted(self._cluster.metadata.brokers) if brokers is None else list(brokers)
        timeout_s = self._remaining(deadline)
        out: dict[int, str | None] = {}

        async def ask(node: int) -> None:
            try:
                r = await self._cluster.request(node, ApiVersionsRequest(), api_key=ApiKey.API_VERSIONS,
                                                timeout=timeout_s)
                out[node] = r.software_version
            except (TidelogError, OSError):
                out[node] = None
        async with trio.open_nursery() as nursery:
            for node in nodes:
                nursery.start_soon(ask, node)
        return out

    # -- reassignment ---------------------------------------------------------------------------

    async def alter_partition_reassignments(self, reassignments: dict[TopicPartition, Sequence[int] | None],
                                            timeout_ms: int | None = None
                                            ) -> dict[TopicPartition, tuple[int, str | None]]:
        """Move each partition to its target replicas (the first one becomes the preferred
        leader), or cancel its move (None), as kafka-reassign-partitions --execute/--cancel.
        The call returns once the moves have started; ``list_partition_reassignments`` tells
        when they are done. Returns each partition's (error code, message)."""
        timeout_ms = self._timeout_ms(timeout_ms)
        by_topic: dict[str, list[ReassignablePartition]] = {}
        for tp, replicas in reassignments.items():
            by_topic.setdefault(tp.topic, []).append(
                ReassignablePartition(tp.partition, None if replicas is None else [int(r) for r in replicas]))
        request = AlterPartitionReassignmentsRequest([ReassignableTopic(t, ps) for t, ps in by_topic.items()],
                                                     timeout_ms=timeout_ms)
        answers: list[AlterPartitionReassignmentsResponse] = []

        def extract(r: AlterPartitionReassignmentsResponse) -> Outcomes:
            answers.append(r)
            return {_WHOLE_REQUEST: (r.error_code, r.error_message)}
        outcomes = await self._to_controller([_WHOLE_REQUEST], lambda ns: request,
                                             ApiKey.ALTER_PARTITION_REASSIGNMENTS, extract, timeout_ms)
        _raise_for_request(outcomes, "cannot reassign partitions")
        return {TopicPartition(t.name, p.partition_index): (p.error_code, p.error_message)
                for t in answers[-1].responses for p in t.partitions}

    async def list_partition_reassignments(self, partitions: Iterable[TopicPartition] | None = None,
                                           timeout_ms: int | None = None
                                           ) -> dict[TopicPartition, PartitionReassignment]:
        """The moves in progress (of ``partitions``; None: all), as kafka-reassign-partitions
        --verify and kafka-topics --describe see them."""
        timeout_ms = self._timeout_ms(timeout_ms)
        topics = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for tp in partitions:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            topics = [ListPartitionReassignmentsTopics(t, ps) for t, ps in by_topic.items()]
        answers: list[ListPartitionReassignmentsResponse] = []

        def extract(r: ListPartitionReassignmentsResponse) -> Outcomes:
            answers.append(r)
            return {_WHOLE_REQUEST: (r.error_code, r.error_message)}
        outcomes = await self._to_controller(
            [_WHOLE_REQUEST], lambda ns: ListPartitionReassignmentsRequest(topics, timeout_ms=timeout_ms),
            ApiKey.LIST_PARTITION_REASSIGNMENTS, extract, timeout_ms)
        _raise_for_request(outcomes, "cannot list the partition reassignments")
        return {TopicPartition(t.name, p.partition_index): PartitionReassignment(
                    tuple(p.replicas), tuple(p.adding_replicas), tuple(p.removing_replicas))
                for t in answers[-1].topics for p in t.partitions}

    # -- ACLs -----------------------------------------------------------------------------------

    async def create_acls(self, bindings: Iterable[AclBinding], timeout_ms: int | None = None
                          ) -> dict[AclBinding, None]:
        """Create ACLs; returns ``{binding: None}`` or raises the first failure (e.g.
        CLUSTER_AUTHORIZATION_FAILED without Alter on the cluster, SECURITY_DISABLED without an
        authorizer, INVALID_REQUEST for a binding that cannot be stored) with ``.results``."""
        bindings = list(dict.fromkeys(bindings))
        request = CreateAclsRequest([AclCreation(int(b.restype), b.name, b.principal, b.host, int(b.operation),
                                                 int(b.permission_type), int(b.resource_pattern_type))
                                     for b in bindings])
        r: CreateAclsResponse = await self._to_any(request, ApiKey.CREATE_ACLS, timeout_ms)
        results: dict[AclBinding, TidelogError | None] = {}
        for b, res in zip(bindings, r.results):
            results[b] = None if res.error_code == NONE.code else broker_error(
                res.error_code, f"cannot create ACL {b}", res.error_message)
        if len(r.results) != len(bindings):
            raise TidelogError(f"CreateAcls answered {len(r.results)} results for {len(bindings)} ACLs")
        return _raise_first(results)

    async def describe_acls(self, acl_filter: AclBindingFilter = AclBindingFilter(),
                            timeout_ms: int | None = None) -> list[AclBinding]:
        """The ACLs that match ``acl_filter`` (every ACL by default), as the broker asked holds them."""
        f = acl_filter
        request = DescribeAclsRequest(int(f.restype), int(f.operation), int(f.permission_type), f.name,
                                      int(f.resource_pattern_type), f.principal, f.host)
        r: DescribeAclsResponse = await self._to_any(request, ApiKey.DESCRIBE_ACLS, timeout_ms)
        if r.error_code != NONE.code:
            raise broker_error(r.error_code, "cannot describe ACLs", r.error_message)
        return sorted((AclBinding(res.resource_type, res.resource_name, res.pattern_type, a.principal, a.host,
                                  a.operation, a.permission_type)
                       for res in r.resources for a in res.acls), key=_acl_order)

    async def delete_acls(self, filters: Iterable[AclBindingFilter], timeout_ms: int | None = None
                          ) -> dict[AclBindingFilter, list[AclBinding]]:
        """Delete the ACLs each filter matches; returns the deleted bindings per filter, or
        raises the first failure (a filter's, or a binding's that could not be deleted) with
        ``.results``."""
        filters = list(dict.fromkeys(filters))
        request = DeleteAclsRequest([AclFilter(int(f.restype), int(f.operation), int(f.permission_type), f.name,
                                               int(f.resource_pattern_type), f.principal, f.host) for f in filters])
        r: DeleteAclsResponse = await self._to_any(request, ApiKey.DELETE_ACLS, timeout_ms)
        if len(r.filter_results) != len(filters):
            raise TidelogError(f"DeleteAcls answered {len(r.filter_results)} results for {len(filters)} filters")
        deleted: dict[AclBindingFilter, list[AclBinding]] = {}
        results: dict[AclBindingFilter, TidelogError | None] = {}
        for f, res in zip(filters, r.filter_results):
            deleted[f] = [AclBinding(m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host,
                                     m.operation, m.permission_type) for m in res.matching_acls]
            failed = next((m for m in res.matching_acls if m.error_code != NONE.code), None)
            if res.error_code != NONE.code:
                results[f] = broker_error(res.error_code, "cannot delete ACLs", res.error_message)
            elif failed is not None:
                results[f] = broker_error(failed.error_code, "cannot delete ACL", failed.error_message)
            else:
                results[f] = None
        _raise_first(results)
        return deleted

    async def _to_any(self, request: Message, api_key: ApiKey, timeout_ms: int | None) -> Any:
        return await self._cluster.request_any(request, api_key=api_key, timeout=self._timeout_ms(timeout_ms) / 1000)

    # -- users and client quotas (tidelog.aio.entity_configs) -----------------------------------
    # Any broker answers these (each writes ZooKeeper itself), as in Kafka's ZooKeeper mode.

    async def alter_user_scram_credentials(
            self, alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion],
            timeout_ms: int | None = None) -> dict[str, None]:
        """Create, replace or delete users' SCRAM credentials. Passwords are salted here: the
        request carries the salt and the salted password. Returns ``{user: None}``, or raises
        the first user's error (UNACCEPTABLE_CREDENTIAL, RESOURCE_NOT_FOUND, ...) with
        ``.results`` (user -> None or error) attached; a user's alterations succeed or fail together."""
        return await self._entity_configs(timeout_ms).alter_user_scram_credentials(alterations)

    async def describe_user_scram_credentials(self, users: Iterable[str] | None = None,
                                              timeout_ms: int | None = None
                                              ) -> dict[str, UserScramCredentialsDescription]:
        """Each user's SCRAM mechanisms and iteration counts (every user with a credential when
        ``users`` is None); raises RESOURCE_NOT_FOUND for a named user without one."""
        return await self._entity_configs(timeout_ms).describe_user_scram_credentials(users)

    async def alter_client_quotas(self, alterations: Iterable[ClientQuotaAlteration], validate_only: bool = False,
                                  timeout_ms: int | None = None) -> dict[ClientQuotaEntity, None]:
        """Set or remove quotas (producer_byte_rate, consumer_byte_rate, request_percentage) of
        users, client ids, or a user's client id; raises the first entity's error with
        ``.results`` attached."""
        return await self._entity_configs(timeout_ms).alter_client_quotas(alterations, validate_only)

    async def describe_client_quotas(self, quota_filter: ClientQuotaFilter | None = None,
                                     timeout_ms: int | None = None) -> dict[ClientQuotaEntity, dict[str, float]]:
        """The quotas of the entities that match ``quota_filter`` (default: all)."""
        return await self._entity_configs(timeout_ms).describe_client_quotas(quota_filter)

    def _entity_configs(self, timeout_ms: int | None) -> EntityConfigClient:
        timeout_s = self._timeout_ms(timeout_ms) / 1000

        async def call(api_key: ApiKey, request: Message) -> Any:
            return await self._cluster.request_any(request, api_key=api_key, timeout=timeout_s)
        return EntityConfigClient(call)

    # -- consumer groups ------------------------------------------------------------------------

    async def list_groups(self, states: Iterable[str] | None = None,
                          timeout_ms: int | None = None) -> list[ListedGroup]:
        """Every group of the cluster (each broker lists the groups it coordinates)."""
        deadline = self._deadline(timeout_ms)
        await self._cluster.refresh(timeout=self._remaining(deadline))
        request = ListGroupsRequest(list(states or []))
        found: dict[str, ListedGroup] = {}

        failures: list[TidelogError] = []

        async def ask(node: int) -> None:
            try:
                r = await self._retry_coordinator_codes(
                    lambda: self._cluster.request(node, request, api_key=ApiKey.LIST_GROUPS,
                                                  timeout=self._request_s(deadline)),
                    lambda r: r.error_code, deadline, f"ListGroups to broker {node}")
            except TidelogError as e:  # raised once every broker answered or failed
                failures.append(e)
                return
            for g in r.groups:
                found[g.group_id] = ListedGroup(g.group_id, g.protocol_type, g.group_state, node)

        async with trio.open_nursery() as nursery:
            for node in self._cluster.metadata.brokers:
                nursery.start_soon(ask, node)
        if failures:  # the first broker's error, not a group of them (the listing is incomplete)
            raise failures[0]
        return sorted(found.values(), key=lambda g: g.group_id)

    async def describe_groups(self, group_ids: Iterable[str],
                              timeout_ms: int | None = None) -> list[ConsumerGroupDescription]:
        """State, assignor, generation and members (with their assignments) of each group; a
        group that does not exist is described with state "Dead"."""
        deadline = self._deadline(timeout_ms)
        out = []
        for group_id in dict.fromkeys(group_ids):
            node, r = await self._to_coordinator(
                group_id, DescribeGroupsRequest([group_id]), ApiKey.DESCRIBE_GROUPS,
                lambda r: r.groups[0].error_code if r.groups else NONE.code, deadline)
            g = r.groups[0]
            if g.error_code not in (NONE.code, GROUP_ID_NOT_FOUND.code):
                raise broker_error(g.error_code, f"group {group_id!r}", g.error_message)
            out.append(_group_description(g, node))
        return out

    async def delete_groups(self, group_ids: Iterable[str], timeout_ms: int | None = None) -> None:
        """Delete each group and its committed offsets; a group with members is refused."""
        deadline = self._deadline(timeout_ms)
        for group_id in dict.fromkeys(group_ids):
            _, r = await self._to_coordinator(
                group_id, DeleteGroupsRequest([group_id]), ApiKey.DELETE_GROUPS,
                lambda r: r.results[0].error_code if r.results else NONE.code, deadline)
            result = r.results[0] if r.results else None
            if result is not None and result.error_code == NON_EMPTY_GROUP.code:
                raise broker_error(result.error_code, f"cannot delete group {group_id!r}",
                                   "the group has active members; stop its consumers first")
            if result is not None and result.error_code != NONE.code:
                raise broker_error(result.error_code, f"cannot delete group {group_id!r}", result.error_message)

    async def list_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None,
                                 timeout_ms: int | None = None) -> list[GroupOffsets]:
        """The group's committed offset, log end offset and lag per partition (every partition
        with a committed offset when ``partitions`` is None)."""
        deadline = self._deadline(timeout_ms)
        committed = await self._fetch_group_offsets(group_id, partitions, deadline)
        ends = await self._log_end_offsets(list(committed), deadline)
        out = []
        for tp in sorted(committed):
            c, end = committed[tp], ends.get(tp)
            lag = None if c is None or end is None else max(0, end - c)
            out.append(GroupOffsets(tp, c, end, lag))
        return out

    async def alter_group_offsets(self, group_id: str, offsets: dict[TopicPartition, int],
                                  timeout_ms: int | None = None) -> None:
        """Set the group's committed offsets (a reset). Only while the group has no members:
        raises NON_EMPTY_GROUP naming its state otherwise."""
        deadline = self._deadline(timeout_ms)
        for tp, offset in offsets.items():
            if not isinstance(offset, int) or offset < 0:
                raise ValueError(f"offset for {tp} must be an int >= 0, got {offset!r}")
        (description,) = await self.describe_groups([group_id], timeout_ms=self._left_ms(deadline))
        if description.state not in INACTIVE_STATES:
            raise _active_group_error(group_id, description.state, len(description.members))
        by_topic: dict[str, list[OffsetCommitPartition]] = {}
        for tp, offset in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(OffsetCommitPartition(tp.partition, offset))
        request = OffsetCommitRequest(group_id, [OffsetCommitTopic(t, ps) for t, ps in by_topic.items()])
        _, r = await self._to_coordinator(
            group_id, request, ApiKey.OFFSET_COMMIT,
            lambda r: next((p.error_code for t in r.topics for p in t.partitions if p.error_code != NONE.code),
                           NONE.code), deadline)
        for t in r.topics:
            for p in t.partitions:
                if p.error_code in (UNKNOWN_MEMBER_ID.code, ILLEGAL_GENERATION.code):
                    raise _active_group_error(group_id, "not empty", None)
                if p.error_code != NONE.code:
                    raise broker_error(p.error_code, f"group {group_id!r} offset of {t.name}-{p.partition_index}",
                                       p.error_message)

    async def list_offsets(self, specs: dict[TopicPartition, int], timeout_ms: int | None = None
                           ) -> dict[TopicPartition, tuple[int, int]]:
        """ListOffsets: per partition ``EARLIEST_TIMESTAMP`` (-2), ``LATEST_TIMESTAMP`` (-1, the
        high watermark) or a timestamp in ms -> (offset, timestamp); offset -1 when no record
        has that timestamp or a later one."""
        return await self._list_offsets(dict(specs), self._deadline(timeout_ms))

    async def log_end_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
                              ) -> dict[TopicPartition, int]:
        """Each partition's log end offset (LEO) on its leader: the offset its next record
        will get. It is ahead of the high watermark (``list_offsets``' latest) by the records
        not yet copied by every in-sync replica. Asked as Kafka's tools ask for it: ListOffsets
        latest with replica id -2 (DEBUGGING_REPLICA_ID), which a broker answers with its LEO;
        retried like ``list_offsets`` until the call's timeout."""
        wanted = {TopicPartition(*tp): LATEST_TIMESTAMP for tp in partitions}
        if not wanted:
            return {}

        def request_for(latest: dict[TopicPartition, int], metadata: Any, _timeout_s: float) -> ListOffsetsRequest:
            return replace(list_offsets_request(latest, metadata), replica_id=DEBUGGING_REPLICA_ID)

        return await to_leaders(self._cluster, wanted, self._deadline(timeout_ms), backoff=Backoff(*self._backoff),
                                api_key=ApiKey.LIST_OFFSETS, request_for=request_for,
                                answer_of=lambda p: p.offset, what="log end offsets", refetch_metadata=True)

    async def delete_records(self, offsets: dict[TopicPartition, int], timeout_ms: int | None = None
                             ) -> dict[TopicPartition, int]:
        """Kafka's ``deleteRecords``: every record below ``offsets[tp]`` (-1: below the high
        watermark) is deleted; the partition's log start offset moves there on every in-sync
        replica, and consumers asking for an older offset get OFFSET_OUT_OF_RANGE (and follow
        ``auto_offset_reset``). Returns each partition's low watermark (the replicas' smallest
        log start offset). An offset above the high watermark raises OffsetOutOfRangeError."""
        wanted = {TopicPartition(*tp): offset for tp, offset in offsets.items()}
        for tp, offset in wanted.items():
            if offset < -1:
                raise ValueError(f"{tp}: the offset to delete records below must be >= 0 or -1 (the high "
                                 f"watermark), got {offset}")

        def request_for(values: dict[TopicPartition, int], _metadata: Any, timeout_s: float) -> DeleteRecordsRequest:
            by_topic: dict[str, list[DeleteRecordsPartition]] = {}
            for tp, offset in values.items():
                by_topic.setdefault(tp.topic, []).append(DeleteRecordsPartition(tp.partition, offset))
            # the broker's wait for the replicas ends half a second before the request's timeout
            return DeleteRecordsRequest([DeleteRecordsTopic(t, ps) for t, ps in by_topic.items()],
                                        timeout_ms=max(0, int(timeout_s * 1000) - 500))

        errors: dict[TopicPartition, TidelogError] = {}
        low = await to_leaders(self._cluster, wanted, self._deadline(timeout_ms), backoff=Backoff(*self._backoff),
                               api_key=ApiKey.DELETE_RECORDS, request_for=request_for,
                               answer_of=lambda p: p.low_watermark, what="records deleted",
                               refetch_metadata=True, errors=errors)
        if errors:  # every partition was tried: say which failed and which were done
            first = next(iter(errors.values()))
            done = ", ".join(f"{tp} (low watermark {w})" for tp, w in sorted(low.items())) or "none"
            raise error_for(first.code, f"{'; '.join(str(e) for _, e in sorted(errors.items()))}; done: {done}")
        return low

    async def _fetch_group_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None,
                                   deadline: float) -> dict[TopicPartition, int | None]:
        topics = None
        if partitions is not None:
            by_topic: dict[str, list[int]] = {}
            for tp in partitions:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            topics = [OffsetFetchTopic(t, ps) for t, ps in by_topic.items()]
        _, r = await self._to_coordinator(
            group_id, OffsetFetchRequest(group_id, topics), ApiKey.OFFSET_FETCH,
            lambda r: r.error_code, deadline)
        if r.error_code != NONE.code:
            raise broker_error(r.error_code, f"group {group_id!r} (OffsetFetch)")
        out: dict[TopicPartition, int | None] = {}
        for t in r.topics:
            for p in t.partitions:
                if p.error_code != NONE.code:
                    raise broker_error(p.error_code, f"group {group_id!r} offset of {t.name}-{p.partition_index}")
                out[TopicPartition(t.name, p.partition_index)] = \
                    None if p.committed_offset == NO_OFFSET else p.committed_offset
        return out

    async def _log_end_offsets(self, tps: list[TopicPartition], deadline: float) -> dict[TopicPartition, int]:
        """The high watermarks a group's lag is measured against; a partition that fails (no
        leader after a few rounds, an error, a leader that does not answer before ``deadline``)
        is left out: its lag is unknown, not the others'."""
        if not tps:
            return {}
        errors: dict[TopicPartition, TidelogError] = {}
        try:
            found = await to_leaders(
                self._cluster, {tp: LATEST_TIMESTAMP for tp in tps}, deadline, backoff=Backoff(*self._backoff),
                api_key=ApiKey.LIST_OFFSETS,
                request_for=lambda timestamps, metadata, _timeout_s: list_offsets_request(timestamps, metadata),
                answer_of=lambda p: p.offset, what="offsets", refetch_metadata=True, tolerate_missing=True,
                errors=errors, leaderless_rounds=_LAG_LEADERLESS_ROUNDS, partial=True)
        except TidelogError:
            return {}
        return found

    async def _list_offsets(self, wanted: dict[TopicPartition, int], deadline: float,
                            tolerate_missing: bool = False) -> dict[TopicPartition, tuple[int, int]]:
        return await list_offsets(self._cluster, wanted, deadline, backoff=Backoff(*self._backoff),
                                  refetch_metadata=True, tolerate_missing=tolerate_missing)

    async def _find_coordinator(self, group_id: str, deadline: float) -> int:
        async def find() -> Any:
            return await self._cluster.request_any(FindCoordinatorRequest(group_id), api_key=ApiKey.FIND_COORDINATOR,
                                                   timeout=self._request_s(deadline))
        r = await self._retry_coordinator_codes(find, lambda r: r.error_code, deadline,
                                                f"FindCoordinator for group {group_id!r}")
        if r.error_code != NONE.code:  # GROUP_AUTHORIZATION_FAILED, INVALID_REQUEST, ...: no node to ask
            raise broker_error(r.error_code, f"FindCoordinator for group {group_id!r}", r.error_message)
        if r.node_id not in self._cluster.metadata.brokers:
            await self._cluster.refresh(timeout=self._remaining(deadline))
        return r.node_id

    async def _to_coordinator(self, group_id: str, request: Message, api_key: ApiKey,
                              code_of: Callable[[Any], int], deadline: float) -> tuple[int, Any]:
        """Send ``request`` to the group's coordinator until it answers with something other
        than "not the coordinator (yet)"; returns (coordinator node, response)."""
        node = -1

        async def attempt() -> Any:
            nonlocal node
            node = self._coordinators.get(group_id)
            if node is None:
                node = self._coordinators[group_id] = await self._find_coordinator(group_id, deadline)
            try:
                response = await self._cluster.request(node, request, api_key=api_key,
                                                       timeout=self._request_s(deadline))
            except (BrokerConnectionError, RequestTimedOut):
                self._coordinators.pop(group_id, None)
                raise
            if code_of(response) in _COORDINATOR_RETRY:
                self._coordinators.pop(group_id, None)  # look it up again
            return response

        response = await self._retry_coordinator_codes(attempt, code_of, deadline,
                                                       f"{api_key.name} for group {group_id!r}")
        return node, response

    async def _retry_coordinator_codes(self, attempt: Callable[[], Any], code_of: Callable[[Any], int],
                                       deadline: float, what: str) -> Any:
        backoff = Backoff(*self._backoff)
        last: BaseException | None = None
        while True:
            try:
                response = await attempt()
                code = code_of(response)
                if code not in _COORDINATOR_RETRY:
                    return response  # the caller reads the codes it knows
                last = broker_error(code, what)
            except (BrokerConnectionError, RequestTimedOut) as e:
                last = e
                self._cluster.request_update()
            if time.monotonic() + backoff.initial_s >= deadline:
                raise RequestTimedOut(f"{what} did not complete in time (last error: {last})")
            await trio.sleep(min(backoff.next_delay(), self._remaining(deadline)))

    def _deadline(self, timeout_ms: int | None) -> float:
        return time.monotonic() + self._timeout_ms(timeout_ms) / 1000

    def _remaining(self, deadline: float) -> float:
        return max(0.001, deadline - time.monotonic())

    def _left_ms(self, deadline: float) -> int:
        return max(1, int(self._remaining(deadline) * 1000))

    def _request_s(self, deadline: float) -> float:
        return min(self._remaining(deadline), self.request_timeout_ms / 1000)

    # -- routing --------------------------------------------------------------------------------

    def _timeout_ms(self, timeout_ms: int | None) -> int:
        return self.default_api_timeout_ms if timeout_ms is None else timeout_ms

    async def _to_controller(self, names: list[str], build: Callable[[list[str]], Message],
                             api_key: ApiKey, extract: Callable[[Any], Outcomes],
                             timeout_ms: int) -> Outcomes:
        """Send ``build(names)`` to the controller; retry the names answered NOT_CONTROLLER
        (and everything after a connection failure or a NOT_CONTROLLER for the whole request)
        after a metadata refresh, until ``timeout_ms``. Returns every name's final (code, message)."""
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = Backoff(*self._backoff)
        outcomes: Outcomes = {}
        pending = list(names)
        last: BaseException | None = None
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                of = "" if pending == [_WHOLE_REQUEST] else f" for {pending}"
                raise RequestTimedOut(f"{api_key.name}{of} did not complete within "
                                      f"{timeout_ms} ms (last error: {last or 'none'})")
            try:
                conn = await self._cluster.controller_connection(timeout=remaining)
                response = await conn.request(build(pending), api_key=api_key, timeout=remaining + 1.0)
            except (BrokerConnectionError, RequestTimedOut) as e:
                last = e
                self._cluster.request_update()
                await self._backoff_then_refresh(backoff, deadline)
                continue
            except TidelogError as e:
                if e.error is not NOT_CONTROLLER:
                    raise
                # refused as a whole (the controller resigned while the request was queued):
                # every pending name was answered NOT_CONTROLLER
                last = e
                await self._backoff_then_refresh(backoff, deadline)
                continue
            answered = extract(response)
            retry = []
            for name in pending:
                code, message = answered.get(name, (NOT_CONTROLLER.code, "no result for this topic"))
                if code == NOT_CONTROLLER.code:
                    retry.append(name)
                    last = broker_error(code, api_key.name if name == _WHOLE_REQUEST else f"topic {name!r}", message)
                else:
                    outcomes[name] = (code, message)
            pending = retry
            if pending:
                await self._backoff_then_refresh(backoff, deadline)
        return outcomes

    async def _backoff_then_refresh(self, backoff: Backoff, deadline: float) -> None:
        await trio.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))
        with contextlib.suppress(TidelogError):
            await self._cluster.refresh(timeout=max(0.001, deadline - time.monotonic()))


def _raise_for(outcomes: Outcomes, verb: str) -> dict[str, None]:
    results: dict[str, TidelogError | None] = {}
    for name, (code, message) in outcomes.items():
        results[name] = None if code == NONE.code else broker_error(
            code, f"cannot {verb} topic {name!r}", message)
    failures = [e for e in results.values() if e is not None]
    if failures:
        error = failures[0]
        error.results = results
        raise error
    return {name: None for name in results}


def _raise_for_request(outcomes: Outcomes, what: str) -> None:
    """Raise the error of a request answered as a whole (``_WHOLE_REQUEST``), if any."""
    code, message = outcomes[_WHOLE_REQUEST]
    if code != NONE.code:
        raise broker_error(code, what, message)


def _raise_first(results: dict) -> dict:
    failures = [e for e in results.values() if e is not None]
    if failures:
        failures[0].results = results
        raise failures[0]
    return {key: None for key in results}


def _log_dir_description(d: Any, node: int) -> LogDirDescription:
    replicas = {}
    for t in d.topics:
        for p in t.partitions:
            tp = TopicPartition(t.name, p.partition_index)
            replicas[tp] = ReplicaInfo(tp, p.partition_size, p.offset_lag, p.is_future_key, p.log_start_offset,
                                       p.log_end_offset, p.high_watermark)
    error = None if d.error_code == NONE.code else broker_error(d.error_code, f"log dir {d.log_dir} of broker {node}")
    return LogDirDescription(d.log_dir, replicas, d.total_bytes, d.usable_bytes, error)


def _acl_order(b: AclBinding) -> tuple:
    return (b.restype, b.resource_pattern_type, b.name, b.principal, b.host, b.operation, b.permission_type)


def _group_description(g: Any, node: int) -> ConsumerGroupDescription:
    members = []
    for m in g.members:
        assignment: tuple[TopicPartition, ...] = ()
        if g.protocol_type == PROTOCOL_TYPE and m.member_assignment:
            try:
                assignment = decode_assignment(m.member_assignment).partitions
            except TidelogError:
                assignment = ()
        members.append(MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host, assignment))
    state = "Dead" if g.error_code == GROUP_ID_NOT_FOUND.code else g.group_state
    return ConsumerGroupDescription(g.group_id, state, g.protocol_type, g.protocol_data, g.generation_id,
                                    g.leader, node, tuple(sorted(members, key=lambda m: m.member_id)))


def _active_group_error(group_id: str, state: str, members: int | None) -> TidelogError:
    count = "" if members is None else f" with {members} member{'s' if members != 1 else ''}"
    return broker_error(NON_EMPTY_GROUP.code, f"group {group_id!r}",
                        f"offsets can be reset only when the group is inactive, but it is {state}{count}: "
                        "stop its consumers first (and wait for their session timeout if they were killed)")
