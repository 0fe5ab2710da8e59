"""One handler per served API: typed request and its context in, typed response out.

Every row of the API registry (``protocol.apis.APIS``) has exactly one handler here, declared
with ``@handles(key, kind)``; ``Apis`` checks the table against the registry when it is built,
so ApiVersions never advertises an API the broker does not serve. A handler takes
``(request, context)``: the typed request body and the ``RequestContext`` (header, peer,
listener, principal). Its kind says how the network layer runs it:

============  ===========================================================================
kind          what the handler is and returns
============  ===========================================================================
ORDERED       a plain function called by the connection's reader in request order; it does
              its order-sensitive work (the produce append) before it returns, and returns
              the response, None (acks=0) or an awaitable of the response (the acks=all wait)
ASYNC         a coroutine function: the network layer awaits it in the request's own task
DEFERRED      a plain function returning a deferred response (``broker.deferred``: a
              consumer's long-poll fetch, answered by the append that satisfies it or at
              ``max_wait_ms``) or, for a follower's fetch, the coroutine that serves it
============  ===========================================================================

Errors: a handler raises a ``TidelogError`` (or records a per-partition error in its
response); the network layer is the one place where an escaping exception becomes an error
body. Controller-only APIs (topic administration, controlled shutdown) answer NOT_CONTROLLER
on other brokers, as Kafka does.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from tidelog.broker.context import RequestContext
from tidelog.broker.controller.channels import wait_all
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.produce_order import ProduceOrder, needs_worker
from tidelog.broker.replication.replica_manager import ReplicaManager
from tidelog.protocol.apis import APIS, api_versions
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    COORDINATOR_NOT_AVAILABLE,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    NOT_CONTROLLER,
    NOT_LEADER_OR_FOLLOWER,
    STALE_BROKER_EPOCH,
    STALE_CONTROLLER_EPOCH,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
)
from tidelog.protocol.messages import (
    BROKER_RESOURCE,
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    TOPIC_RESOURCE,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterConfigsResult,
    ApiVersionsResponse,
    ConfigEntry,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsPartitionResult,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ElectLeadersResult,
    FetchPartitionResponse,
    FetchRequest,
    FetchResponse,
    FetchTopicResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaderAndIsrRequest,
    LeaderAndIsrResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetForLeaderTopicResult,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    StopReplicaRequest,
    StopReplicaResponse,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicMetadata,
    TopicPartitionRef,
    TopicProduceResponse,
    TopicResult,
    UpdateMetadataRequest,
    UpdateMetadataResponse,
)
from tidelog.protocol.topics import TopicPartition, is_internal_topic, metric_name, topic_name_problem

logger = logging.getLogger("tidelog.apis")


class Kind(enum.Enum):
    """How the network layer runs a handler (the module docstring's table)."""

    ORDERED = "ordered"
    ASYNC = "async"
    DEFERRED = "deferred"


_HANDLERS: dict[ApiKey, tuple[Kind, Callable[..., Any]]] = {}


def handles(key: ApiKey, kind: Kind) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated ``Apis`` method as the handler of ``key``."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if key in _HANDLERS:
            raise ValueError(f"{key.name} has two handlers")
        if inspect.iscoroutinefunction(fn) != (kind is Kind.ASYNC):
            raise TypeError(f"{fn.__name__}: an {kind.name} handler must "
                            f"{'' if kind is Kind.ASYNC else 'not '}be a coroutine function")
        _HANDLERS[key] = (kind, fn)
        return fn

    return register


def handler_table() -> Mapping[ApiKey, tuple[Kind, Callable[..., Any]]]:
    """The registered handlers: api key -> (kind, ``Apis`` method)."""
    return dict(_HANDLERS)


class BrokerState(Protocol):
    """What the handlers read and change of the broker beyond its components."""

    broker_epoch: int
    log_defaults: Any  # broker.log.config.LogConfig
    topic_overrides: dict[str, dict[str, str]]

    def update_topic_overrides(self, configs: Mapping[str, Mapping[str, str]]) -> None: ...

    def metadata_updated(self) -> None: ...

    async def auto_create_topics(self, topics: Iterable[str]) -> None: ...


class Apis:
    """The broker's request handlers, built from the components they use."""

    def __init__(self, config: Any, replica_manager: ReplicaManager, metadata: MetadataCache, *,
                 broker: BrokerState | None = None, controller: Any = None, group_coordinator: Any = None,
                 producer_ids: Any = None):
        self.config = config  # broker.config.BrokerConfig
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.broker = broker
        self.controller = controller  # broker.controller.Controller
        self.coordinator = group_coordinator  # broker.groups.GroupCoordinator
        self.producer_ids = producer_ids  # broker.producer_ids.ProducerIdManager
        self.produce_order = ProduceOrder()  # produces validated off the event loop keep their order
        missing = set(APIS) - set(_HANDLERS)
        if missing or set(_HANDLERS) - set(APIS):
            raise RuntimeError(f"the handlers do not match the API registry: no handler for "
                               f"{sorted(k.name for k in missing)}, unregistered "
                               f"{sorted(k.name for k in set(_HANDLERS) - set(APIS))}")

    def handle(self, context: RequestContext, body: dict) -> Any:
        """Called by the network layer in request order, for a key the registry serves (the
        network layer checked it with ``protocol.apis.api_for``); see the kinds above."""
        key = context.header.api_key
        request = APIS[key].request.from_body(body)
        return _HANDLERS[key][1](self, request, context)

    # -- metadata ------------------------------------------------------------------------------

    @handles(ApiKey.API_VERSIONS, Kind.ASYNC)
    async def api_versions(self, req, ctx: RequestContext | None = None) -> ApiVersionsResponse:
        return ApiVersionsResponse(NONE.code, api_versions())

    @handles(ApiKey.METADATA, Kind.ASYNC)
    async def metadata_(self, req: MetadataRequest, ctx: RequestContext | None = None) -> MetadataResponse:
        # A name Kafka refuses is answered INVALID_TOPIC_EXCEPTION and never created; so is one
        # that would collide with an existing topic's metric names. Internal topics are created
        # by the broker's own components, with their own configs, not by a client's metadata.
        refused: dict[str, str] = {}
        for t in req.topics or []:
            if (problem := topic_name_problem(t)) is not None:
                refused[t] = problem
        missing = [t for t in dict.fromkeys(req.topics or []) if t not in refused
                   and not self.metadata.contains_topic(t) and not is_internal_topic(t)]
        if missing and req.allow_auto_topic_creation and self.config.auto_create_topics_enable:
            known = {metric_name(t): t for t in self.metadata.topics}
            for t in missing:
                if known.get(metric_name(t), t) != t:
                    refused[t] = (f"topic {t!r} collides with existing topic {known[metric_name(t)]!r}: names "
                                  "that differ only in '.' and '_' share metric names")
                known.setdefault(metric_name(t), t)
            await self.broker.auto_create_topics([t for t in missing if t not in refused])
        topics = [TopicMetadata(INVALID_TOPIC_EXCEPTION.code, t.name, error_message=refused[t.name])
                  if t.name in refused else t for t in self.metadata.topic_metadata(req.topics)]
        return MetadataResponse(self.metadata.broker_metadata(), self.metadata.cluster_id,
                                self.metadata.controller_id, topics)

    # -- data ----------------------------------------------------------------------------------

    @handles(ApiKey.PRODUCE, Kind.ORDERED)
    def produce(self, req: ProduceRequest, ctx: RequestContext | None = None):
        """Append now (so pipelined produces of a connection append in the order sent); for
        acks=all return the coroutine that waits for replication."""
        entries = {TopicPartition(t.name, p.index): p.records for t in req.topic_data for p in t.partition_data}
        refused = {tp: _internal_topic_refused(tp) for tp in entries if is_internal_topic(tp.topic)}
        entries = {tp: records for tp, records in entries.items() if tp not in refused}
        keys = [("connection", ctx.listener, ctx.peer)] if ctx is not None and ctx.peer != "?" else []
        keys += entries
        before = self.produce_order.predecessors(keys)
        if before or needs_worker(entries):
            # validated in a worker thread, or behind one that is: later produces of this
            # connection and of these partitions wait for this one (broker.produce_order)
            done = self.produce_order.enter(keys)
            return self._produce_in_order(req, entries, refused, keys, before, done)
        return self._produce_appended(req, refused, *self.replica_manager.append_now(req.acks, entries))

    def _produce_appended(self, req: ProduceRequest, refused: dict, results: dict, waiting: dict):
        for tp, r in results.items():
            r["error_code"] = self._absent_as_unknown(tp, r["error_code"])
        results.update(refused)
        if req.acks == 0:
            return None
        if waiting:
            return self._produce_after_replication(req, results, waiting)
        return _produce_response(results)

    async def _produce_in_order(self, req: ProduceRequest, entries: dict, refused: dict, keys: list,
                                before: list, done) -> ProduceResponse | None:
        try:
            for event in before:
                await event.wait()
            if req.acks in (-1, 0, 1):
                entries, invalid = await self.replica_manager.check_in_worker(entries)
                refused = {**refused, **invalid}
                entries = {tp: records for tp, records in entries.items() if tp not in invalid}
            outcome = self._produce_appended(req, refused, *self.replica_manager.append_now(req.acks, entries))
        finally:
            self.produce_order.leave(keys, done)
        return await outcome if inspect.isawaitable(outcome) else outcome

    async def _produce_after_replication(self, req: ProduceRequest, results, waiting) -> ProduceResponse:
        await self.replica_manager.await_replication(waiting, req.timeout_ms, results)
        return _produce_response(results)

    @handles(ApiKey.FETCH, Kind.DEFERRED)
    def fetch(self, req: FetchRequest, ctx: RequestContext | None = None):
        """A fetch from the network: a consumer's is answered now or deferred (a DelayedFetch,
        answered by the append that satisfies it or at max_wait_ms, see ReplicaManager.
        consumer_fetch); a follower's runs as ``fetch`` in a task of its own."""
        if req.replica_id >= 0:
            return self.replica_fetch(req)
        return self.replica_manager.consumer_fetch(req, self._fetch_response)

    async def replica_fetch(self, req: FetchRequest) -> FetchResponse:
        """A follower's fetch. Until brokers authenticate, what can be checked is: the replica
        id names a replica of each partition (the replica manager refuses the others) and
        the request carries that broker's current broker epoch, which ZooKeeper knows and a
        client does not (KIP-903's check). Refused: NOT_LEADER_OR_FOLLOWER for every
        partition (Kafka's answer to a fetch from a replica it does not recognise), nothing
        read, no follower state, HW or ISR touched."""
        rm = self.replica_manager
        tps = [TopicPartition(t.topic, p.partition) for t in req.topics for p in t.partitions]
        if any(rm.is_follower(tp, req.replica_id) for tp in tps):
            problem = await self.metadata.registry.broker_epoch_problem(req.replica_id, req.replica_epoch)
            if problem is not None:
                logger.info("follower fetch from broker %d refused: %s", req.replica_id, problem)
                return self._fetch_response({tp: FetchPartitionResponse(
                    tp.partition, NOT_LEADER_OR_FOLLOWER.code,
                    error_message=f"{tp}: a fetch as replica {req.replica_id} refused: {problem}") for tp in tps})
        return self._fetch_response(await rm.fetch(req))

    def _fetch_response(self, results) -> FetchResponse:
        by_topic: dict[str, list] = {}
        for tp, r in results.items():
            code = self._absent_as_unknown(tp, r.error_code)
            if code != r.error_code:
                r = dataclasses.replace(r, error_code=code)
            by_topic.setdefault(tp.topic, []).append(r)
        return FetchResponse([FetchTopicResponse(t, ps) for t, ps in by_topic.items()])

    @handles(ApiKey.LIST_OFFSETS, Kind.ASYNC)
    async def list_offsets(self, req: ListOffsetsRequest, ctx: RequestContext | None = None) -> ListOffsetsResponse:
        rm = self.replica_manager
        # Consumers see the HW as "latest"; followers and debugging tools (replica id -2,
        # Kafka's DEBUGGING_REPLICA_ID) see the log end offset. Only the debugging replica id
        # is answered by a follower too (from its own log), as in Kafka.
        from_consumer = req.replica_id == CONSUMER_REPLICA_ID
        from_any_replica = req.replica_id == DEBUGGING_REPLICA_ID
        out = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                r = rm.list_offset(tp, p.timestamp, p.current_leader_epoch, from_consumer, from_any_replica)
                code = self._absent_as_unknown(tp, r.error_code)
                parts.append(r if code == r.error_code else dataclasses.replace(r, error_code=code))
            out.append(ListOffsetsTopicResponse(t.name, parts))
        return ListOffsetsResponse(out)

    @handles(ApiKey.DELETE_RECORDS, Kind.ASYNC)
    async def delete_records(self, req: DeleteRecordsRequest, ctx: RequestContext | None = None) -> DeleteRecordsResponse:
        offsets = {TopicPartition(t.name, p.partition_index): p.offset for t in req.topics for p in t.partitions}
        refused = {tp: {"error_code": INVALID_TOPIC_EXCEPTION.code, "low_watermark": -1,
                        "error_message": f"records of the internal topic {tp.topic} cannot be deleted"}
                   for tp in offsets if is_internal_topic(tp.topic)}
        results = await self.replica_manager.delete_records(
            {tp: o for tp, o in offsets.items() if tp not in refused}, req.timeout_ms,
            live_brokers=lambda: self.metadata.brokers)
        results.update(refused)
        by_topic: dict[str, list[DeleteRecordsPartitionResult]] = {}
        for tp, r in results.items():
            code = self._absent_as_unknown(tp, r["error_code"])
            by_topic.setdefault(tp.topic, []).append(
                DeleteRecordsPartitionResult(tp.partition, code, r["low_watermark"], r["error_message"]))
        return DeleteRecordsResponse([DeleteRecordsTopicResult(t, ps) for t, ps in by_topic.items()])

    def _absent_as_unknown(self, tp: TopicPartition, code: int) -> int:
        """Kafka's distinction: a partition this broker does not host is NOT_LEADER_OR_FOLLOWER
        when the cluster has it, UNKNOWN_TOPIC_OR_PARTITION when it does not exist at all."""
        if code == NOT_LEADER_OR_FOLLOWER.code and self.metadata.partition_state(tp) is None:
            return UNKNOWN_TOPIC_OR_PARTITION.code
        return code

    @handles(ApiKey.OFFSETS_FOR_LEADER_EPOCH, Kind.ASYNC)
    async def offsets_for_leader_epoch(self, req: OffsetsForLeaderEpochRequest,
                                       ctx: RequestContext | None = None) -> OffsetsForLeaderEpochResponse:
        rm = self.replica_manager
        return OffsetsForLeaderEpochResponse([
            OffsetForLeaderTopicResult(t.topic, [
                rm.end_offset_for_epoch(TopicPartition(t.topic, p.partition), p.leader_epoch, p.current_leader_epoch)
                for p in t.partitions])
            for t in req.topics])

    # -- controller-only administration --------------------------------------------------------

    def _controller(self):
        c = self.controller
        if c is None or not c.is_active:
            raise TidelogError(f"broker {self.config.broker_id} is not the controller "
                               f"(controller: {self.metadata.controller_id})", error=NOT_CONTROLLER)
        return c

    @handles(ApiKey.CREATE_TOPICS, Kind.ASYNC)
    async def create_topics(self, req: CreateTopicsRequest, ctx: RequestContext | None = None) -> CreateTopicsResponse:
        try:
            c = self._controller()
        except TidelogError as e:
            return CreateTopicsResponse([TopicResult(t.name, e.code, str(e)) for t in req.topics])
        results, waits = await c.call(lambda: c.create_topics(req.topics, req.validate_only))
        await wait_all(waits, req.timeout_ms / 1000)
        return CreateTopicsResponse(results)

    @handles(ApiKey.DELETE_TOPICS, Kind.ASYNC)
    async def delete_topics(self, req: DeleteTopicsRequest, ctx: RequestContext | None = None) -> DeleteTopicsResponse:
        try:
            c = self._controller()
            if not self.config.delete_topic_enable:
                raise TidelogError("topic deletion is disabled (delete.topic.enable=false)",
                                   error=INVALID_REQUEST)
        except TidelogError as e:
            return DeleteTopicsResponse([TopicResult(n, e.code, str(e)) for n in req.topic_names])
        # the broker's own topics (__consumer_offsets: every group's committed offsets) are
        # not the clients' to delete, as they are not theirs to produce to
        refused = {n: TopicResult(n, INVALID_TOPIC_EXCEPTION.code, f"{n} is an internal topic: it cannot be deleted")
                   for n in req.topic_names if is_internal_topic(n)}
        names = [n for n in req.topic_names if n not in refused]
        deleted = {r.name: r for r in await c.call(lambda: c.delete_topics(names))} if names else {}
        return DeleteTopicsResponse([refused.get(n) or deleted[n] for n in req.topic_names])

    @handles(ApiKey.CREATE_PARTITIONS, Kind.ASYNC)
    async def create_partitions(self, req: CreatePartitionsRequest, ctx: RequestContext | None = None) -> CreatePartitionsResponse:
        try:
            c = self._controller()
        except TidelogError as e:
            return CreatePartitionsResponse([TopicResult(t.name, e.code, str(e)) for t in req.topics])
        results, waits = await c.call(lambda: c.create_partitions_all(req.topics, req.validate_only))
        await wait_all(waits, req.timeout_ms / 1000)
        return CreatePartitionsResponse(results)

    @handles(ApiKey.DESCRIBE_CONFIGS, Kind.ASYNC)
    async def describe_configs(self, req: DescribeConfigsRequest, ctx: RequestContext | None = None) -> DescribeConfigsResponse:
        out = []
        for r in req.resources:
            try:
                entries = self._describe(r.resource_type, r.resource_name, r.configuration_keys)
                out.append(DescribeConfigsResult(NONE.code, r.resource_type, r.resource_name, entries))
            except TidelogError as e:
                out.append(DescribeConfigsResult(e.code, r.resource_type, r.resource_name, error_message=str(e)))
        return DescribeConfigsResponse(out)

    def _describe(self, resource_type: int, name: str, keys: list[str] | None) -> list[ConfigEntry]:
        if resource_type == TOPIC_RESOURCE:
            if not self.metadata.contains_topic(name):
                raise TidelogError(f"topic {name!r} does not exist", error=UNKNOWN_TOPIC_OR_PARTITION)
            overrides = self.broker.topic_overrides.get(name, {})
            effective = self.broker.log_defaults.with_overrides(overrides).to_props()
            return [ConfigEntry(k, _render(v), is_default=k not in overrides)
                    for k, v in sorted(effective.items()) if keys is None or k in keys]
        if resource_type == BROKER_RESOURCE:
            props = self.config.to_props()
            return [ConfigEntry(k, _render(v), read_only=True)
                    for k, v in sorted(props.items()) if keys is None or k in keys]
        raise TidelogError(f"unknown config resource type {resource_type}", error=INVALID_REQUEST)

    @handles(ApiKey.ALTER_CONFIGS, Kind.ASYNC)
    async def alter_configs(self, req: AlterConfigsRequest, ctx: RequestContext | None = None) -> AlterConfigsResponse:
        """Each resource is altered in turn on the controller. A resource named twice in the
        request is refused (INVALID_REQUEST, as in Kafka): a request naming one topic 16,000
        times would otherwise be 16,000 ZooKeeper writes and UpdateMetadata rounds, with every
        other controller event waiting behind them."""
        named = Counter((r.resource_type, r.resource_name) for r in req.resources)
        out = []
        for r in req.resources:
            try:
                if named[(r.resource_type, r.resource_name)] > 1:
                    raise TidelogError(f"resource {r.resource_name[:250]!r} (type {r.resource_type}) appears more "
                                       "than once in the request", error=INVALID_REQUEST)
                if r.resource_type != TOPIC_RESOURCE:
                    raise TidelogError("only topic configs can be altered at runtime", error=INVALID_REQUEST)
                c = self._controller()
                waits = await c.call(lambda r=r: c.alter_topic_config(r.resource_name, r.configs, req.validate_only))
                await wait_all(waits, 10)
                out.append(AlterConfigsResult(NONE.code, r.resource_type, r.resource_name))
            except TidelogError as e:
                out.append(AlterConfigsResult(e.code, r.resource_type, r.resource_name, str(e)))
        return AlterConfigsResponse(out)

    # -- idempotent producers ------------------------------------------------------------------

    @handles(ApiKey.INIT_PRODUCER_ID, Kind.ASYNC)
    async def init_producer_id(self, req: InitProducerIdRequest, ctx: RequestContext | None = None) -> InitProducerIdResponse:
        """Any broker answers: a new producer id at epoch 0 (an existing id only with its
        transactional id, and there are no transactions: see broker/producer_ids.py)."""
        try:
            if req.transactional_id is not None:
                raise TidelogError("transactional producers are not supported (transactional_id must be null)",
                                   error=INVALID_REQUEST)
            pid, epoch = await self.producer_ids.init_producer_id(req.producer_id, req.producer_epoch)
        except TidelogError as e:
            return InitProducerIdResponse(e.code, error_message=str(e))
        return InitProducerIdResponse(NONE.code, pid, epoch)

    @handles(ApiKey.ELECT_LEADERS, Kind.ASYNC)
    async def elect_leaders(self, req: ElectLeadersRequest, ctx: RequestContext | None = None) -> ElectLeadersResponse:
        c = self._controller()
        tps = None if req.topic_partitions is None else [
            TopicPartition(r.topic_name, r.partition_index) for r in req.topic_partitions]
        results, waits = await c.call(lambda: c.elect_preferred(tps))
        await wait_all(waits, req.timeout_ms / 1000)
        return ElectLeadersResponse(NONE.code, [ElectLeadersResult(tp.topic, tp.partition, code, msg)
                                                for tp, code, msg in results])

    @handles(ApiKey.CONTROLLED_SHUTDOWN, Kind.ASYNC)
    async def controlled_shutdown(self, req: ControlledShutdownRequest, ctx: RequestContext | None = None) -> ControlledShutdownResponse:
        c = self._controller()
        try:  # STALE_BROKER_EPOCH unless the epoch is the broker's registration's (see the controller)
            remaining, waits = await c.call(lambda: c.controlled_shutdown(req.broker_id, req.broker_epoch))
        except TidelogError as e:
            logger.warning("ControlledShutdown refused: %s", e)
            return ControlledShutdownResponse(e.code)
        # new leaders learn of their leadership before the old one goes away
        await wait_all([w for w in waits if w is not None and w.api_key == ApiKey.LEADER_AND_ISR], 10)
        return ControlledShutdownResponse(NONE.code, [TopicPartitionRef(tp.topic, tp.partition) for tp in remaining])

    # -- consumer groups (broker/groups/group_coordinator.py) ------------------------------

    @property
    def group_coordinator(self):
        c = self.coordinator
        if c is None:
            raise TidelogError("this broker runs no group coordinator", error=COORDINATOR_NOT_AVAILABLE)
        return c

    @handles(ApiKey.FIND_COORDINATOR, Kind.ASYNC)
    async def find_coordinator(self, req: FindCoordinatorRequest, ctx: RequestContext | None = None) -> FindCoordinatorResponse:
        return await self.group_coordinator.find_coordinator(req)

    @handles(ApiKey.JOIN_GROUP, Kind.ASYNC)
    async def join_group(self, req: JoinGroupRequest, ctx: RequestContext | None = None) -> JoinGroupResponse:
        return await self.group_coordinator.join_group(req, ctx.client_id, ctx.peer_host)

    @handles(ApiKey.SYNC_GROUP, Kind.ASYNC)
    async def sync_group(self, req: SyncGroupRequest, ctx: RequestContext | None = None) -> SyncGroupResponse:
        return await self.group_coordinator.sync_group(req)

    @handles(ApiKey.HEARTBEAT, Kind.ASYNC)
    async def heartbeat(self, req: HeartbeatRequest, ctx: RequestContext | None = None) -> HeartbeatResponse:
        return await self.group_coordinator.heartbeat(req)

    @handles(ApiKey.LEAVE_GROUP, Kind.ASYNC)
    async def leave_group(self, req: LeaveGroupRequest, ctx: RequestContext | None = None) -> LeaveGroupResponse:
        return await self.group_coordinator.leave_group(req)

    @handles(ApiKey.OFFSET_COMMIT, Kind.ASYNC)
    async def offset_commit(self, req: OffsetCommitRequest, ctx: RequestContext | None = None) -> OffsetCommitResponse:
        return await self.group_coordinator.offset_commit(req)

    @handles(ApiKey.OFFSET_FETCH, Kind.ASYNC)
    async def offset_fetch(self, req: OffsetFetchRequest, ctx: RequestContext | None = None) -> OffsetFetchResponse:
        return await self.group_coordinator.offset_fetch(req)

    @handles(ApiKey.LIST_GROUPS, Kind.ASYNC)
    async def list_groups(self, req: ListGroupsRequest, ctx: RequestContext | None = None) -> ListGroupsResponse:
        return await self.group_coordinator.list_groups(req)

    @handles(ApiKey.DESCRIBE_GROUPS, Kind.ASYNC)
    async def describe_groups(self, req: DescribeGroupsRequest, ctx: RequestContext | None = None) -> DescribeGroupsResponse:
        return await self.group_coordinator.describe_groups(req)

    @handles(ApiKey.DELETE_GROUPS, Kind.ASYNC)
    async def delete_groups(self, req: DeleteGroupsRequest, ctx: RequestContext | None = None) -> DeleteGroupsResponse:
        return await self.group_coordinator.delete_groups(req)

    # -- from the controller -------------------------------------------------------------------

    async def _check_from_controller(self, api: str, req: LeaderAndIsrRequest | UpdateMetadataRequest
                                     | StopReplicaRequest) -> None:
        """Until brokers authenticate: a request from the controller names the controller and
        the controller epoch ZooKeeper holds now (STALE_CONTROLLER_EPOCH for an older epoch,
        a newer one, or another broker), and this broker's current broker epoch
        (STALE_BROKER_EPOCH: it was meant for an earlier registration, or the sender does
        not know ours). The registry reads ZooKeeper again before it refuses a claim ahead of
        what its watches said: the controller's watch of our registration, or our watch of
        its election, may have fired first (broker/metadata_cache.py)."""
        registry = self.metadata.registry
        error, problem = STALE_CONTROLLER_EPOCH, await registry.controller_problem(req.controller_id,
                                                                                  req.controller_epoch)
        if problem is None and req.broker_epoch != self.broker.broker_epoch:
            # not ours as we know it: our register call may not have returned yet
            error, problem = STALE_BROKER_EPOCH, await registry.broker_epoch_problem(
                self.config.broker_id, req.broker_epoch)
        if problem is not None:
            logger.warning("%s from broker %d refused: %s", api, req.controller_id, problem)
            raise TidelogError(f"{api} refused: {problem}", error=error)

    @handles(ApiKey.LEADER_AND_ISR, Kind.ASYNC)
    async def leader_and_isr(self, req: LeaderAndIsrRequest, ctx: RequestContext | None = None) -> LeaderAndIsrResponse:
        try:
            await self._check_from_controller("LeaderAndIsr", req)
        except TidelogError as e:
            return LeaderAndIsrResponse(e.code)
        self.broker.update_topic_overrides(req.topic_configs)
        return self.replica_manager.become_leader_or_follower(req)

    @handles(ApiKey.UPDATE_METADATA, Kind.ASYNC)
    async def update_metadata(self, req: UpdateMetadataRequest, ctx: RequestContext | None = None) -> UpdateMetadataResponse:
        try:
            await self._check_from_controller("UpdateMetadata", req)
        except TidelogError as e:
            return UpdateMetadataResponse(e.code)
        self.broker.update_topic_overrides(req.topic_configs)
        self.metadata.update(req)
        for topic in req.deleted_topics:
            self.broker.topic_overrides.pop(topic, None)
        self.broker.metadata_updated()
        return UpdateMetadataResponse(NONE.code)

    @handles(ApiKey.STOP_REPLICA, Kind.ASYNC)
    async def stop_replica(self, req: StopReplicaRequest, ctx: RequestContext | None = None) -> StopReplicaResponse:
        try:
            await self._check_from_controller("StopReplica", req)
        except TidelogError as e:
            return StopReplicaResponse(e.code)
        return self.replica_manager.stop_replicas(req)


def _internal_topic_refused(tp: TopicPartition) -> dict:
    """A client's Produce to an internal topic (Kafka: ``internalTopicsAllowed`` is false for
    clients). The group coordinator appends through the replica manager, not through here."""
    return {"error_code": INVALID_TOPIC_EXCEPTION.code,
            "error_message": f"cannot append to internal topic {tp.topic} (partition {tp.partition}): only the "
                             "broker writes it; commit consumer offsets with OffsetCommit (Consumer.commit)"}


def _produce_response(results: dict) -> ProduceResponse:
    by_topic: dict[str, list[PartitionProduceResponse]] = {}
    for tp, r in results.items():
        by_topic.setdefault(tp.topic, []).append(PartitionProduceResponse(tp.partition, **r))
    return ProduceResponse([TopicProduceResponse(t, ps) for t, ps in by_topic.items()])


def _render(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)

