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
              the response, None (acks=0), a deferred response (``broker.deferred``: the
              acks=all wait, a DelayedProduce) or an awaitable of the response (a produce
              validated in a worker thread; for acks=all, of its DelayedProduce)
ASYNC         a coroutine function: the network layer awaits it in the request's own task
DEFERRED      a plain function returning the response or a deferred response (a long-poll
              fetch, answered by the change that satisfies it or at ``max_wait_ms``) or,
              for a follower's fetch whose broker epoch must be read again, the coroutine
              that serves it
============  ===========================================================================

Errors: a handler raises a ``TidelogError`` (or records a per-partition error in its
response); the network layer is the one place where an escaping exception becomes an error
body. Controller-only APIs (topic administration, controlled shutdown) answer NOT_CONTROLLER
on other brokers, as Kafka does.

Authorization: with an authorizer (``authorizer.class.name``) every handler checks what
Kafka's KafkaApis checks for its API before it acts (docs/architecture.md, "Authorization",
has the table) and answers TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED,
CLUSTER_AUTHORIZATION_FAILED or TRANSACTIONAL_ID_AUTHORIZATION_FAILED for what it refuses;
Metadata, ListGroups and OffsetFetch leave out what the principal may not Describe. With or
without one, the inter-broker APIs (a follower's Fetch and OffsetsForLeaderEpoch,
LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown) pass
``broker.security.authorizer.cluster_action_problem`` first. A handler called without a
context is the broker calling itself, and is allowed everything.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import logging
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import trio

from tidelog.broker.config import SENSITIVE
from tidelog.broker.context import RequestContext
from tidelog.broker.controller.channels import wait_all
from tidelog.broker.deferred import CLOSE_CONNECTION
from tidelog.broker.log_dirs import LocalReplica, describe_log_dirs, log_dir_of, wanted_partitions
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.produce_order import ProduceOrder, needs_worker
from tidelog.broker.replication.replica_manager import PartitionAnswer, ReplicaManager, by_partition
from tidelog.broker.security.authorizer import Authorizer, ZkAclStore, cluster_action_problem
from tidelog.broker.security.entity_configs import EntityConfigAdmin
from tidelog.protocol.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    ResourceType,
)
from tidelog.protocol.apis import APIS, api_versions
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    CLUSTER_AUTHORIZATION_FAILED,
    COORDINATOR_NOT_AVAILABLE,
    GROUP_AUTHORIZATION_FAILED,
    ILLEGAL_SASL_STATE,
    INVALID_RECORD,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    NOT_CONTROLLER,
    NOT_LEADER_OR_FOLLOWER,
    SECURITY_DISABLED,
    STALE_BROKER_EPOCH,
    STALE_CONTROLLER_EPOCH,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_COMPRESSION_TYPE,
    ErrorCode,
    TidelogError,
    code_of,
)
from tidelog.protocol.kafka.apis import (
    INFLATION_BOUND,
    ONE_BATCH_PRODUCE_VERSION,
    SKIP_ASSIGNMENT_JOIN_VERSION,
    ZSTD_PRODUCE_VERSION,
)
from tidelog.protocol.messages import (
    BROKER_RESOURCE,
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    DEFAULT_CONFIG,
    DYNAMIC_BROKER_CONFIG,
    DYNAMIC_DEFAULT_BROKER_CONFIG,
    EARLIEST_TIMESTAMP,
    GROUP_KEY,
    LATEST_TIMESTAMP,
    PREFERRED_ELECTION,
    STATIC_BROKER_CONFIG,
    TOPIC_CONFIG,
    TOPIC_RESOURCE,
    UNCLEAN_ELECTION,
    AclCreationResult,
    AclDescription,
    AlterClientQuotasEntryResult,
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterConfigsResult,
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    AlterUserScramCredentialsResult,
    ApiVersionsResponse,
    ConfigEntry,
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableGroupResult,
    DeleteAclsFilterResult,
    DeleteAclsMatchingAcl,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DeleteRecordsPartitionResult,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteRecordsTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeAclsRequest,
    DescribeAclsResource,
    DescribeAclsResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribedGroup,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ElectLeadersResult,
    EpochEndOffsetResult,
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
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitPartitionResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopicResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopicResponse,
    OffsetForLeaderTopicResult,
    OffsetsForLeaderEpochRequest,
    OffsetsForLeaderEpochResponse,
    OngoingPartitionReassignment,
    OngoingTopicReassignment,
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    ReassignablePartitionResponse,
    ReassignableTopicResponse,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
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
from tidelog.protocol.records import Codec, holds_codec, holds_more_than_one_batch
from tidelog.protocol.throttles import DYNAMIC_BROKER_CONFIGS
from tidelog.protocol.topics import TopicPartition, is_internal_topic, metric_name, topic_name_problem

logger = logging.getLogger("tidelog.apis")

SCAN_THREADS = 2  # ListOffsets searches by timestamp running at once (worker threads)


class Kind(enum.Enum):
    """How the network layer runs a handler (the module docstring's table)."""

    ORDERED = "ordered"
    ASYNC = "async"
    DEFERRED = "deferred"


_HANDLERS: dict[ApiKey, tuple[Kind, Callable[..., Any]]] = {}


def handles(key: ApiKey, kind: Kind) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated ``Apis`` method as the handler of ``key``."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn) != (kind is Kind.ASYNC):
            raise TypeError(f"{fn.__name__}: an {kind.name} handler must "
                            f"{'' if kind is Kind.ASYNC else 'not '}be a coroutine function")
        if key in _HANDLERS:
            raise ValueError(f"{key.name} has two handlers")
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
    zk: Any  # broker.zookeeper.zk.ZkClient
    topic_overrides: dict[str, dict[str, str]]
    entity_configs: Any  # broker.security.entity_configs.EntityConfigStore (dynamic broker configs)

    def update_topic_overrides(self, configs: Mapping[str, Mapping[str, str]]) -> None: ...

    def metadata_updated(self, deleted: Iterable[str] = ()) -> None: ...

    async def auto_create_topics(self, topics: Iterable[str]) -> None: ...


class Apis:
    """The broker's request handlers, built from the components they use."""

    def __init__(self, config: Any, replica_manager: ReplicaManager, metadata: MetadataCache, *,
                 broker: BrokerState | None = None, controller: Any = None, group_coordinator: Any = None,
                 producer_ids: Any = None, authorizer: Authorizer | None = None,
                 acl_store: ZkAclStore | None = None, broker_principals: frozenset[str] = frozenset()):
        self.config = config  # broker.config.BrokerConfig
        self.authorizer = authorizer  # None: no authorizer.class.name
        self.acl_store = acl_store  # the authorizer's ZooKeeper side (CreateAcls, DeleteAcls)
        self.broker_principals = broker_principals  # super.users and the inter-broker principal
        self.replica_manager = replica_manager
        self.metadata = metadata
        self.broker = broker
        self.controller = controller  # broker.controller.Controller
        self.coordinator = group_coordinator  # broker.groups.GroupCoordinator
        self.producer_ids = producer_ids  # broker.producer_ids.ProducerIdManager
        self.produce_order = ProduceOrder()  # produces validated off the event loop keep their order
        # searches by timestamp scan segments in worker threads, this many at a time
        self.scan_limiter = trio.CapacityLimiter(SCAN_THREADS)
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

    # -- authorization -------------------------------------------------------------------------

    def _can(self, ctx: RequestContext | None, operation: AclOperation, resource_type: ResourceType,
             name: str) -> bool:
        """The authorizer's decision (a dict lookup once decided); no authorizer or no context
        (the broker calling itself): allowed."""
        a = self.authorizer
        return a is None or ctx is None or a.authorize(ctx.principal, ctx.peer_host, operation, resource_type, name)

    def _denied_topics(self, ctx: RequestContext | None, operation: AclOperation, names: Iterable[str]) -> set[str]:
        if self.authorizer is None or ctx is None:
            return set()
        return {n for n in names if not self._can(ctx, operation, ResourceType.TOPIC, n)}

    def _cluster_action_problem(self, ctx: RequestContext | None, api: str) -> str | None:
        problem = cluster_action_problem(ctx, self.broker_principals, self.authorizer, api)
        if problem is not None:
            logger.warning("%s (peer %s)", problem, ctx.peer if ctx is not None else "?")
        return problem

    # -- metadata ------------------------------------------------------------------------------

    @handles(ApiKey.API_VERSIONS, Kind.ASYNC)
    async def api_versions(self, req, ctx: RequestContext | None = None) -> ApiVersionsResponse:
        return ApiVersionsResponse(NONE.code, api_versions(), software_version=_software_version())

    @handles(ApiKey.SASL_HANDSHAKE, Kind.ASYNC)
    async def sasl_handshake(self, req: SaslHandshakeRequest, ctx: RequestContext | None = None) -> SaslHandshakeResponse:
        # a SASL listener's connection answers these itself until it is authenticated
        return SaslHandshakeResponse(ILLEGAL_SASL_STATE.code, [], _sasl_refusal(ctx))

    @handles(ApiKey.SASL_AUTHENTICATE, Kind.ASYNC)
    async def sasl_authenticate(self, req: SaslAuthenticateRequest,
                                ctx: RequestContext | None = None) -> SaslAuthenticateResponse:
        return SaslAuthenticateResponse(ILLEGAL_SASL_STATE.code, _sasl_refusal(ctx))

    @handles(ApiKey.METADATA, Kind.ASYNC)
    async def metadata_(self, req: MetadataRequest, ctx: RequestContext | None = None) -> MetadataResponse:
        # A name Kafka refuses is answered INVALID_TOPIC_EXCEPTION and never created; so is one
        # that would collide with an existing topic's metric names. Internal topics are created
        # by the broker's own components, with their own configs, not by a client's metadata.
        # With an authorizer, a topic named in the request that the principal may not Describe
        # is answered TOPIC_AUTHORIZATION_FAILED (whether it exists or not), and one it may not
        # create (Create on the Cluster or on the topic) is not auto-created; a request for
        # every topic leaves out those it may not Describe (Kafka's rules).
        denied = self._denied_topics(ctx, AclOperation.DESCRIBE, req.topics or [])
        no_create: set[str] = set()
        refused: dict[str, str] = {}
        for t in req.topics or []:
            if t not in denied and (problem := topic_name_problem(t)) is not None:
                refused[t] = problem
        missing = [t for t in dict.fromkeys(req.topics or []) if t not in refused and t not in denied
                   and not self.metadata.contains_topic(t) and not is_internal_topic(t)]
        if missing and req.allow_auto_topic_creation and self.config.auto_create_topics_enable:
            if not self._can(ctx, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME):
                no_create = self._denied_topics(ctx, AclOperation.CREATE, missing)
                denied |= no_create
                missing = [t for t in missing if t not in no_create]
            known = {metric_name(t): t for t in self.metadata.topics}
            for t in missing:
                if known.get(metric_name(t), t) != t:
                    refused[t] = (f"topic {t!r} collides with existing topic {known[metric_name(t)]!r}: names "
                                  "that differ only in '.' and '_' share metric names")
                known.setdefault(metric_name(t), t)
            await self.broker.auto_create_topics([t for t in missing if t not in refused])
        topics = [TopicMetadata(INVALID_TOPIC_EXCEPTION.code, t.name, error_message=refused[t.name])
                  if t.name in refused else t for t in self.metadata.topic_metadata(req.topics)]
        if denied:
            topics = [TopicMetadata(TOPIC_AUTHORIZATION_FAILED.code, t.name, is_internal=t.is_internal,
                                    error_message=_denied(ctx, "Create" if t.name in no_create else "Describe",
                                                          "topic", t.name))
                      if t.name in denied else t for t in topics]
        elif req.topics is None and self.authorizer is not None:
            topics = [t for t in topics if self._can(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)]
        return MetadataResponse(self.metadata.broker_metadata(ctx.listener if ctx is not None else None),
                                self.metadata.cluster_id,
                                self.metadata.controller_id, topics)

    # -- data ----------------------------------------------------------------------------------

    @handles(ApiKey.PRODUCE, Kind.ORDERED)
    def produce(self, req: ProduceRequest, ctx: RequestContext | None = None):
        """Append now (so pipelined produces of a connection append in the order sent); for
        acks=all return the wait for replication (a DelayedProduce, or a coroutine). A produce
        validated in a worker thread is a coroutine that appends, then returns that wait: the
        request (its records) is not held while it waits, as in Kafka, where the handler
        returns once appended."""
        entries = {TopicPartition(t.name, p.index): p.records for t in req.topic_data for p in t.partition_data}
        if self.authorizer is not None and ctx is not None:  # Write on each topic (and on the transactional id)
            refused = self._produce_refused(ctx, req, entries)
            refused.update({tp: _internal_topic_refused(tp) for tp in entries
                            if is_internal_topic(tp.topic) and tp not in refused})
        else:
            refused = {tp: _internal_topic_refused(tp) for tp in entries if is_internal_topic(tp.topic)}
        if ctx is not None and ctx.kafka_version is not None:
            if ctx.kafka_version < ZSTD_PRODUCE_VERSION:
                refused.update(_zstd_refused(ctx.kafka_version, entries, refused))
            if ctx.kafka_version >= ONE_BATCH_PRODUCE_VERSION:
                refused.update(_batches_refused(ctx.kafka_version, entries, refused))
        if refused:
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

    def _produce_refused(self, ctx: RequestContext, req: ProduceRequest, entries: dict) -> dict:
        """The hot path: one remembered decision (a dict lookup) per topic of the request."""
        authorize, principal, peer = self.authorizer.authorize, ctx.principal, ctx.peer_host
        if req.transactional_id is not None and not authorize(principal, peer, _WRITE, ResourceType.TRANSACTIONAL_ID,
                                                              req.transactional_id):
            message = _denied(ctx, "Write", "transactional id", req.transactional_id)
            return {tp: {"error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code, "error_message": message}
                    for tp in entries}
        denied = [t.name for t in req.topic_data if not authorize(principal, peer, _WRITE, _TOPIC, t.name)]
        if not denied:
            return {}
        return {tp: {"error_code": TOPIC_AUTHORIZATION_FAILED.code,
                     "error_message": _denied(ctx, "Write", "topic", tp.topic)}
                for tp in entries if tp.topic in denied}

    def _produce_appended(self, req: ProduceRequest, refused: dict, results: dict, waiting: dict):
        """The response to an appended produce: None for acks=0; for acks=all with batches
        to replicate, the wait for them (``ReplicaManager.replication_wait``)."""
        for tp, r in results.items():
            r["error_code"] = self._absent_as_unknown(tp, r["error_code"])
        results.update(refused)
        if req.acks == 0:  # no response; a failure ends the connection (``CLOSE_CONNECTION``)
            return CLOSE_CONNECTION if any(r["error_code"] for r in results.values()) else None
        if waiting:
            return self.replica_manager.replication_wait(waiting, req.timeout_ms, results, _produce_response)
        return _produce_response(results)

    async def _produce_in_order(self, req: ProduceRequest, entries: dict, refused: dict, keys: list,
                                before: list, done) -> Any:
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
        # the wait for replication (a DelayedProduce) is handed over as it is, the request
        # dropped: the network layer awaits it (without the timer running, its coroutine here)
        return await outcome if inspect.isawaitable(outcome) else outcome

    @handles(ApiKey.FETCH, Kind.DEFERRED)
    def fetch(self, req: FetchRequest, ctx: RequestContext | None = None):
        """A fetch from the network, a consumer's or a follower's: answered now or deferred (a
        DelayedFetch, answered by the change that satisfies it or at max_wait_ms, see
        ReplicaManager.deferred_fetch). A follower's whose broker epoch the registry does not
        know as current runs as ``replica_fetch``, in a task of its own (it may ask ZooKeeper).
        The answer is the FetchResponse's body (``_fetch_response``), or the typed message
        when the whole request is refused. A partition named more than once is fetched once,
        as its last entry asks (``by_partition``), for both listeners."""
        req = by_partition(req)
        answer = (self._kafka_fetch_response if ctx is not None and ctx.kafka_version is not None
                  else self._fetch_response)
        if req.replica_id >= 0:
            problem = self._cluster_action_problem(ctx, f"Fetch as replica {req.replica_id}")
            if problem is not None:
                return self._fetch_refused(req, CLUSTER_AUTHORIZATION_FAILED, problem)
            if (self.metadata.registry.broker_epochs.get(req.replica_id) != req.replica_epoch
                    and self._names_a_follower(req)):
                return self.replica_fetch(req)
            return self.replica_manager.deferred_fetch(req, self._fetch_response)
        denied = self._denied_topics(ctx, AclOperation.READ, {t.topic for t in req.topics})
        if denied:  # Read on each topic: the others are read, these answered TOPIC_AUTHORIZATION_FAILED
            refused = {TopicPartition(t.topic, p.partition): FetchPartitionResponse(
                p.partition, TOPIC_AUTHORIZATION_FAILED.code, error_message=_denied(ctx, "Read", "topic", t.topic)
                ).to_body() for t in req.topics if t.topic in denied for p in t.partitions}
            allowed = [t for t in req.topics if t.topic not in denied]
            if not allowed:
                return answer(refused)
            return self.replica_manager.deferred_fetch(dataclasses.replace(req, topics=allowed),
                                                       lambda results: answer({**results, **refused}))
        return self.replica_manager.deferred_fetch(req, answer)

    def _fetch_refused(self, req: FetchRequest, error: ErrorCode, message: str) -> FetchResponse:
        return FetchResponse([FetchTopicResponse(t.topic, [FetchPartitionResponse(p.partition, error.code,
                                                                                  error_message=message)
                                                           for p in t.partitions]) for t in req.topics],
                             error_code=error.code)

    async def replica_fetch(self, req: FetchRequest) -> dict[str, Any]:
        """A follower's fetch. Until brokers authenticate, what can be checked is: the replica
        id names a replica of each partition (the replica manager refuses the others) and
        the request carries that broker's current broker epoch, which ZooKeeper knows and a
        client does not (KIP-903's check). Refused: NOT_LEADER_OR_FOLLOWER for every
        partition (Kafka's answer to a fetch from a replica it does not recognise), nothing
        read, no follower state, HW or ISR touched."""
        rm = self.replica_manager
        tps = [TopicPartition(t.topic, p.partition) for t in req.topics for p in t.partitions]
        if self._names_a_follower(req):
            problem = await self.metadata.registry.broker_epoch_problem(req.replica_id, req.replica_epoch)
            if problem is not None:
                logger.info("follower fetch from broker %d refused: %s", req.replica_id, problem)
                return self._fetch_response({tp: FetchPartitionResponse(
                    tp.partition, NOT_LEADER_OR_FOLLOWER.code,
                    error_message=f"{tp}: a fetch as replica {req.replica_id} refused: {problem}").to_body()
                    for tp in tps})
        return self._fetch_response(await rm.fetch(req))

    def _names_a_follower(self, req: FetchRequest) -> bool:
        """The fetch names a partition of which its replica id is a follower here: its broker
        epoch must be checked (``replica_fetch``)."""
        is_follower = self.replica_manager.is_follower
        return any(is_follower(TopicPartition(t.topic, p.partition), req.replica_id)
                   for t in req.topics for p in t.partitions)

    def _fetch_response(self, results: dict[TopicPartition, PartitionAnswer]) -> dict[str, Any]:
        """The FetchResponse body of the replica manager's answers (FetchPartitionResponse
        bodies, see ``ReplicaManager._read_one``), as the typed message's ``to_body()``."""
        by_topic: dict[str, list] = {}
        for tp, r in results.items():
            code = self._absent_as_unknown(tp, r["error_code"])
            if code != r["error_code"]:
                r = {**r, "error_code": code}
            by_topic.setdefault(tp.topic, []).append(r)
        return {"responses": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
                "error_code": NONE.code, "throttle_time_ms": 0}

    def _kafka_fetch_response(self, results: dict[TopicPartition, PartitionAnswer]) -> dict[str, Any]:
        """``_fetch_response`` for a Kafka client: each partition with records also carries the
        bound its topic inflates a batch to (``INFLATION_BOUND``), within which the Kafka
        listener decompresses a batch to translate it. The answers are copied, not changed."""
        body = self._fetch_response(results)
        logs = self.replica_manager.log_manager
        for t in body["responses"]:
            parts = []
            for p in t["partitions"]:
                log = logs.get_log(TopicPartition(t["topic"], p["partition_index"])) if p.get("records") else None
                parts.append(p if log is None else {**p, INFLATION_BOUND: log.config.max_uncompressed_bytes})
            t["partitions"] = parts
        return body

    @handles(ApiKey.LIST_OFFSETS, Kind.ASYNC)
    async def list_offsets(self, req: ListOffsetsRequest, ctx: RequestContext | None = None) -> ListOffsetsResponse:
        rm = self.replica_manager
        # Consumers see the HW as "latest"; followers and debugging tools (replica id -2,
        # Kafka's DEBUGGING_REPLICA_ID) see the log end offset. Only the debugging replica id
        # is answered by a follower too (from its own log), as in Kafka.
        from_consumer = req.replica_id == CONSUMER_REPLICA_ID
        from_any_replica = req.replica_id == DEBUGGING_REPLICA_ID
        denied = self._denied_topics(ctx, AclOperation.DESCRIBE, {t.name for t in req.topics})
        # a partition named twice is answered INVALID_REQUEST, as Kafka does (each search by
        # timestamp may read a segment: a request repeating one must not multiply that)
        named = Counter(TopicPartition(t.name, p.partition_index) for t in req.topics for p in t.partitions)
        out = []
        for t in req.topics:
            if t.name in denied:
                message = _denied(ctx, "Describe", "topic", t.name)
                out.append(ListOffsetsTopicResponse(t.name, [ListOffsetsPartitionResponse(
                    p.partition_index, TOPIC_AUTHORIZATION_FAILED.code, error_message=message) for p in t.partitions]))
                continue
            parts = []
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                if named[tp] > 1:
                    parts.append(ListOffsetsPartitionResponse(p.partition_index, INVALID_REQUEST.code, error_message=(
                        f"{tp} is named {named[tp]} times in the request: name each partition once")))
                    continue
                args = (tp, p.timestamp, p.current_leader_epoch, from_consumer, from_any_replica)
                if p.timestamp in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
                    r = rm.list_offset(*args)
                else:  # a search by timestamp reads batch headers, a whole segment at worst
                    r = await trio.to_thread.run_sync(rm.list_offset, *args, limiter=self.scan_limiter)
                code = self._absent_as_unknown(tp, r.error_code)
                parts.append(r if code == r.error_code else dataclasses.replace(r, error_code=code))
            out.append(ListOffsetsTopicResponse(t.name, parts))
        return ListOffsetsResponse(out)

    @handles(ApiKey.DELETE_RECORDS, Kind.ASYNC)
    async def delete_records(self, req: DeleteRecordsRequest, ctx: RequestContext | None = None) -> DeleteRecordsResponse:
        offsets = {TopicPartition(t.name, p.partition_index): p.offset for t in req.topics for p in t.partitions}
        denied = self._denied_topics(ctx, AclOperation.DELETE, {tp.topic for tp in offsets})
        refused = {tp: {"error_code": TOPIC_AUTHORIZATION_FAILED.code, "low_watermark": -1,
                        "error_message": _denied(ctx, "Delete", "topic", tp.topic)}
                   if tp.topic in denied else
                   {"error_code": INVALID_TOPIC_EXCEPTION.code, "low_watermark": -1,
                    "error_message": f"records of the internal topic {tp.topic} cannot be deleted"}
                   for tp in offsets if tp.topic in denied or is_internal_topic(tp.topic)}
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
        if req.replica_id >= 0:  # a follower truncating: a cluster action
            problem = self._cluster_action_problem(ctx, f"OffsetsForLeaderEpoch as replica {req.replica_id}")
            denied = {t.topic for t in req.topics} if problem is not None else set()
            error = CLUSTER_AUTHORIZATION_FAILED
        else:
            denied, error = self._denied_topics(ctx, AclOperation.DESCRIBE, {t.topic for t in req.topics}), \
                TOPIC_AUTHORIZATION_FAILED
        return OffsetsForLeaderEpochResponse([
            OffsetForLeaderTopicResult(t.topic, [
                EpochEndOffsetResult(p.partition, error.code) if t.topic in denied else
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
        denied: set[str] = set()
        if not self._can(ctx, AclOperation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME):  # else Create on each topic
            denied = self._denied_topics(ctx, AclOperation.CREATE, {t.name for t in req.topics})
        refused = [TopicResult(n, TOPIC_AUTHORIZATION_FAILED.code, _denied(ctx, "Create", "topic", n))
                   for n in dict.fromkeys(t.name for t in req.topics if t.name in denied)]
        topics = [t for t in req.topics if t.name not in denied]
        if not topics:
            return CreateTopicsResponse(refused)
        results, waits = await _per_topic_call(c, lambda: c.create_topics(topics, req.validate_only),
                                               [t.name for t in topics])
        await wait_all(waits, req.timeout_ms / 1000)
        return CreateTopicsResponse(refused + list(results))

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
        denied = self._denied_topics(ctx, AclOperation.DELETE, req.topic_names)
        refused = {n: TopicResult(n, TOPIC_AUTHORIZATION_FAILED.code, _denied(ctx, "Delete", "topic", n))
                   if n in denied else
                   TopicResult(n, INVALID_TOPIC_EXCEPTION.code, f"{n} is an internal topic: it cannot be deleted")
                   for n in req.topic_names if n in denied or is_internal_topic(n)}
        names = [n for n in req.topic_names if n not in refused]
        results, done = await _per_topic_call(c, lambda: c.delete_topics(names), names) if names else ([], [])
        # the answer comes once the deletions that can complete have (so that the name can be
        # taken again), up to the request's timeout; one held by a replica on a broker that is
        # down is answered at once (it completes when the broker returns)
        with trio.move_on_after(req.timeout_ms / 1000):
            for d in done:
                await d.wait()
        deleted = {r.name: r for r in results}
        return DeleteTopicsResponse([refused.get(n) or deleted[n] for n in req.topic_names])

    @handles(ApiKey.CREATE_PARTITIONS, Kind.ASYNC)
    async def create_partitions(self, req: CreatePartitionsRequest, ctx: RequestContext | None = None) -> CreatePartitionsResponse:
        try:
            c = self._controller()
        except TidelogError as e:
            return CreatePartitionsResponse([TopicResult(t.name, e.code, str(e)) for t in req.topics])
        denied = self._denied_topics(ctx, AclOperation.ALTER, {t.name for t in req.topics})
        refused = [TopicResult(n, TOPIC_AUTHORIZATION_FAILED.code, _denied(ctx, "Alter", "topic", n))
                   for n in dict.fromkeys(t.name for t in req.topics if t.name in denied)]
        topics = [t for t in req.topics if t.name not in denied]
        if not topics:
            return CreatePartitionsResponse(refused)
        results, waits = await _per_topic_call(c, lambda: c.create_partitions_all(topics, req.validate_only),
                                               [t.name for t in topics])
        await wait_all(waits, req.timeout_ms / 1000)
        return CreatePartitionsResponse(refused + list(results))

    @handles(ApiKey.DESCRIBE_CONFIGS, Kind.ASYNC)
    async def describe_configs(self, req: DescribeConfigsRequest, ctx: RequestContext | None = None) -> DescribeConfigsResponse:
        out = []
        for r in req.resources:
            try:
                self._check_config_access(ctx, AclOperation.DESCRIBE_CONFIGS, r.resource_type, r.resource_name)
                entries = self._describe(r.resource_type, r.resource_name, r.configuration_keys)
                out.append(DescribeConfigsResult(NONE.code, r.resource_type, r.resource_name, entries))
            except TidelogError as e:
                out.append(DescribeConfigsResult(e.code, r.resource_type, r.resource_name, error_message=str(e)))
        return DescribeConfigsResponse(out)

    def _check_config_access(self, ctx: RequestContext | None, operation: AclOperation, resource_type: int,
                             name: str) -> None:
        """DescribeConfigs / AlterConfigs on the topic (TOPIC_AUTHORIZATION_FAILED) or, for a
        broker's configs, on the Cluster (CLUSTER_AUTHORIZATION_FAILED)."""
        if self.authorizer is None or ctx is None:
            return
        what = "DescribeConfigs" if operation is AclOperation.DESCRIBE_CONFIGS else "AlterConfigs"
        if resource_type == TOPIC_RESOURCE and not self._can(ctx, operation, ResourceType.TOPIC, name):
            raise TidelogError(_denied(ctx, what, "topic", name), error=TOPIC_AUTHORIZATION_FAILED)
        if resource_type == BROKER_RESOURCE and not self._can(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME):
            raise TidelogError(_denied(ctx, what, "cluster", CLUSTER_NAME), error=CLUSTER_AUTHORIZATION_FAILED)

    def _describe(self, resource_type: int, name: str, keys: list[str] | None) -> list[ConfigEntry]:
        if resource_type == TOPIC_RESOURCE:
            if not self.metadata.contains_topic(name):
                raise TidelogError(f"topic {name!r} does not exist", error=UNKNOWN_TOPIC_OR_PARTITION)
            overrides = self.broker.topic_overrides.get(name, {})
            effective = self.broker.log_defaults.with_overrides(overrides).to_props()
            return [ConfigEntry(k, _render(v), is_default=k not in overrides,
                                source=TOPIC_CONFIG if k in overrides else DEFAULT_CONFIG)
                    for k, v in sorted(effective.items()) if keys is None or k in keys]
        if resource_type == BROKER_RESOURCE:
            if name == "":  # the cluster-wide default entity: its dynamic values alone, as Kafka
                return [e for e in self._dynamic_broker_entries(name)
                        if e.source == DYNAMIC_DEFAULT_BROKER_CONFIG and (keys is None or e.name in keys)]
            if name != str(self.config.broker_id):  # Kafka's words; a client asks that broker itself
                raise TidelogError(f"Unexpected broker id, expected {self.config.broker_id} or empty string, "
                                   f"but received {name[:100]}", error=INVALID_REQUEST)
            props = self.config.to_props()  # secrets (SENSITIVE) without their value, as Kafka
            static = self.config.static_names()
            entries = [ConfigEntry(k, None if k in SENSITIVE else _render(v), read_only=True, is_default=k not in static,
                                   is_sensitive=k in SENSITIVE,
                                   source=STATIC_BROKER_CONFIG if k in static else DEFAULT_CONFIG)
                       for k, v in props.items()]
            entries += self._dynamic_broker_entries(name)
            return sorted((e for e in entries if keys is None or e.name in keys), key=lambda e: e.name)
        raise TidelogError(f"unknown config resource type {resource_type}", error=INVALID_REQUEST)

    def _dynamic_broker_entries(self, name: str) -> list[ConfigEntry]:
        """The dynamic broker configs of broker resource ``name``, as Kafka describes them:
        "" is the cluster-wide default entity (its values DYNAMIC_DEFAULT_BROKER_CONFIG), a
        broker id this broker (its own values DYNAMIC_BROKER_CONFIG over the default's)."""
        store = self.broker.entity_configs if self.broker else None
        default = store.broker_entity_config(None) if store else {}
        own = store.broker_entity_config(self.config.broker_id) if store and name != "" else {}
        entries = []
        for k in DYNAMIC_BROKER_CONFIGS:
            if k in own:
                entries.append(ConfigEntry(k, own[k], is_default=False, source=DYNAMIC_BROKER_CONFIG))
            elif k in default:
                entries.append(ConfigEntry(k, default[k], is_default=False, source=DYNAMIC_DEFAULT_BROKER_CONFIG))
            else:
                entries.append(ConfigEntry(k, None, source=DEFAULT_CONFIG))
        return entries

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
                self._check_config_access(ctx, AclOperation.ALTER_CONFIGS, r.resource_type, r.resource_name)
                if r.replace and (nulls := sorted(k for k, v in r.configs.items() if v is None)):
                    raise TidelogError(f"null values are not supported when the whole set of configs is replaced: "
                                       f"{', '.join(k[:100] for k in nulls[:10])} (leave a key out to remove it)",
                                       error=INVALID_REQUEST)
                if r.resource_type == BROKER_RESOURCE:  # any broker writes it; each follows the notification
                    await self._entity_configs.alter_broker_config(r.resource_name, r.configs, req.validate_only,
                                                                   replace=r.replace)
                    out.append(AlterConfigsResult(NONE.code, r.resource_type, r.resource_name))
                    continue
                if r.resource_type != TOPIC_RESOURCE:
                    raise TidelogError("only topic and broker configs can be altered at runtime",
                                       error=INVALID_REQUEST)
                c = self._controller()
                waits = await c.call(lambda r=r: c.alter_topic_config(r.resource_name, r.configs, req.validate_only,
                                                                      replace=r.replace))
                await wait_all(waits, 10)
                out.append(AlterConfigsResult(NONE.code, r.resource_type, r.resource_name))
            except TidelogError as e:
                out.append(AlterConfigsResult(e.code, r.resource_type, r.resource_name, str(e)))
        return AlterConfigsResponse(out)

    @handles(ApiKey.DESCRIBE_LOG_DIRS, Kind.ASYNC)
    async def describe_log_dirs(self, req: DescribeLogDirsRequest,
                                ctx: RequestContext | None = None) -> DescribeLogDirsResponse:
        """This broker's replicas (broker/log_dirs.py); Describe on the Cluster, as in Kafka."""
        if not self._can(ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return DescribeLogDirsResponse(CLUSTER_AUTHORIZATION_FAILED.code)
        manager = self.replica_manager.log_manager
        # the logs are read on the event loop, where they change; only statvfs goes to a thread
        replicas = {tp: LocalReplica(log_dir_of(log.directory), log.size, log.log_start_offset,
                                     log.log_end_offset, log.high_watermark)
                    for tp, log in manager.logs.items()}
        disk = await trio.to_thread.run_sync(_disk_usage, manager.live_log_dirs)
        return DescribeLogDirsResponse(NONE.code, describe_log_dirs(manager.log_dirs, replicas,
                                                                    wanted_partitions(req.topics), disk,
                                                                    manager.offline_dirs))

    # -- user and client-id configs: quotas, SCRAM credentials (broker/security/entity_configs.py)
    # Any broker answers: each reads and writes ZooKeeper itself, and every broker's
    # EntityConfigStore follows the change notifications the writes leave. Authorization is
    # Kafka's (Describe/Alter, DescribeConfigs/AlterConfigs on the cluster); without an
    # authorizer, a principal that is not a broker principal may still not alter them (an
    # unauthenticated one included, once the brokers have principals of their own): a user who
    # could set the brokers' own credential could act as a broker.

    def _entity_refusal(self, ctx: RequestContext | None, operation: AclOperation,
                        what: str) -> tuple[ErrorCode, str] | None:
        if self.authorizer is not None:
            if self._can(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME):
                return None
            return CLUSTER_AUTHORIZATION_FAILED, _denied(ctx, operation.kafka_name, "cluster", CLUSTER_NAME)
        altering = operation in (AclOperation.ALTER, AclOperation.ALTER_CONFIGS)
        # an unauthenticated client too, once brokers authenticate (their principals known):
        # it could set the brokers' own credential and then act as one
        if (altering and ctx is not None and (ctx.authenticated or self.broker_principals)
                and ctx.principal not in self.broker_principals):
            how = "" if ctx.authenticated else f" (not authenticated, on listener {ctx.listener})"
            return CLUSTER_AUTHORIZATION_FAILED, (
                f"{ctx.principal}{how} may not alter {what}: without an authorizer only super users "
                "(super.users) may")
        return None

    @property
    def _entity_configs(self) -> EntityConfigAdmin:
        return EntityConfigAdmin(self.broker.zk)

    @handles(ApiKey.DESCRIBE_CLIENT_QUOTAS, Kind.ASYNC)
    async def describe_client_quotas(self, req: DescribeClientQuotasRequest,
                                     ctx: RequestContext | None = None) -> DescribeClientQuotasResponse:
        if refusal := self._entity_refusal(ctx, AclOperation.DESCRIBE_CONFIGS, "client quotas"):
            return DescribeClientQuotasResponse(refusal[0].code, refusal[1])
        return await self._entity_configs.describe_client_quotas(req)

    @handles(ApiKey.ALTER_CLIENT_QUOTAS, Kind.ASYNC)
    async def alter_client_quotas(self, req: AlterClientQuotasRequest,
                                  ctx: RequestContext | None = None) -> AlterClientQuotasResponse:
        if refusal := self._entity_refusal(ctx, AclOperation.ALTER_CONFIGS, "client quotas"):
            return AlterClientQuotasResponse([AlterClientQuotasEntryResult(refusal[0].code, refusal[1], e.entity)
                                              for e in req.entries])
        return await self._entity_configs.alter_client_quotas(req)

    @handles(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, Kind.ASYNC)
    async def describe_user_scram_credentials(self, req: DescribeUserScramCredentialsRequest,
                                              ctx: RequestContext | None = None) -> DescribeUserScramCredentialsResponse:
        if refusal := self._entity_refusal(ctx, AclOperation.DESCRIBE, "SCRAM credentials"):
            return DescribeUserScramCredentialsResponse(refusal[0].code, refusal[1])
        return await self._entity_configs.describe_user_scram_credentials(req)

    @handles(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, Kind.ASYNC)
    async def alter_user_scram_credentials(self, req: AlterUserScramCredentialsRequest,
                                           ctx: RequestContext | None = None) -> AlterUserScramCredentialsResponse:
        if refusal := self._entity_refusal(ctx, AclOperation.ALTER, "SCRAM credentials"):
            users = dict.fromkeys([*(d.name for d in req.deletions), *(u.name for u in req.upsertions)])
            return AlterUserScramCredentialsResponse([AlterUserScramCredentialsResult(u, refusal[0].code, refusal[1])
                                                      for u in users])
        return await self._entity_configs.alter_user_scram_credentials(req)

    # -- idempotent producers ------------------------------------------------------------------

    @handles(ApiKey.INIT_PRODUCER_ID, Kind.ASYNC)
    async def init_producer_id(self, req: InitProducerIdRequest, ctx: RequestContext | None = None) -> InitProducerIdResponse:
        """Any broker answers: a new producer id at epoch 0, whatever id and epoch the request
        names (an existing id only with its transactional id, and there are no transactions:
        see broker/producer_ids.py)."""
        try:
            self._check_init_producer_id(ctx, req)
            if req.transactional_id is not None:
                raise TidelogError("transactional producers are not supported (transactional_id must be null)",
                                   error=INVALID_REQUEST)
            pid, epoch = await self.producer_ids.init_producer_id(req.producer_id, req.producer_epoch)
        except TidelogError as e:
            return InitProducerIdResponse(e.code, error_message=str(e))
        return InitProducerIdResponse(NONE.code, pid, epoch)

    def _check_init_producer_id(self, ctx: RequestContext | None, req: InitProducerIdRequest) -> None:
        """Kafka's rule: Write on the transactional id; without one, IdempotentWrite on the
        Cluster or Write on some topic (KIP-679)."""
        a = self.authorizer
        if a is None or ctx is None:
            return
        if req.transactional_id is not None:
            if not self._can(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
                raise TidelogError(_denied(ctx, "Write", "transactional id", req.transactional_id),
                                   error=TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        elif not (self._can(ctx, AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)
                  or a.authorize_any(ctx.principal, ctx.peer_host, AclOperation.WRITE, ResourceType.TOPIC)):
            raise TidelogError(f"{ctx.principal} may not initialise an idempotent producer: it needs "
                               "IdempotentWrite on the cluster or Write on a topic", error=CLUSTER_AUTHORIZATION_FAILED)

    @handles(ApiKey.ELECT_LEADERS, Kind.ASYNC)
    async def elect_leaders(self, req: ElectLeadersRequest, ctx: RequestContext | None = None) -> ElectLeadersResponse:
        """On the controller (Alter on the cluster, as in Kafka); elsewhere, and from a
        controller that resigned while the call was queued, NOT_CONTROLLER per partition
        (``_election_refusals``) under a top-level NONE, as Kafka's answer."""
        if not self._can(ctx, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
            message = _denied(ctx, "Alter", "cluster", CLUSTER_NAME)
            return ElectLeadersResponse(CLUSTER_AUTHORIZATION_FAILED.code, [
                ElectLeadersResult(r.topic_name, r.partition_index, CLUSTER_AUTHORIZATION_FAILED.code, message)
                for r in req.topic_partitions or []])
        if req.election_type not in (PREFERRED_ELECTION, UNCLEAN_ELECTION):
            message = (f"election type {req.election_type} is neither PREFERRED ({PREFERRED_ELECTION}) "
                       f"nor UNCLEAN ({UNCLEAN_ELECTION})")
            return ElectLeadersResponse(INVALID_REQUEST.code, [
                ElectLeadersResult(r.topic_name, r.partition_index, INVALID_REQUEST.code, message)
                for r in req.topic_partitions or []])
        tps = None if req.topic_partitions is None else [
            TopicPartition(r.topic_name, r.partition_index) for r in req.topic_partitions]
        try:
            c = self._controller()
        except TidelogError as e:
            results, waits = _election_refusals(tps, self.metadata, e)
        else:
            elect = c.elect_preferred if req.election_type == PREFERRED_ELECTION else c.elect_unclean
            results, waits = await _per_item_call(c, lambda: elect(tps),
                                                  lambda e: _election_refusals(tps, self.metadata, e))
        await wait_all(waits, req.timeout_ms / 1000)
        return ElectLeadersResponse(NONE.code, [ElectLeadersResult(tp.topic, tp.partition, code, msg)
                                                for tp, code, msg in results])

    @handles(ApiKey.ALTER_PARTITION_REASSIGNMENTS, Kind.ASYNC)
    async def alter_partition_reassignments(self, req: AlterPartitionReassignmentsRequest,
                                            ctx: RequestContext | None = None) -> AlterPartitionReassignmentsResponse:
        """Start, replace or cancel (replicas None) partition moves, on the controller (Alter
        on the cluster, as in Kafka). A partition named twice is INVALID_REQUEST. Off the
        controller the request is refused as a whole (a top-level NOT_CONTROLLER), as Kafka's
        controller refuses it, whatever the per-partition codes of the response."""
        named = [TopicPartition(t.name, p.partition_index) for t in req.topics for p in t.partitions]
        if not self._can(ctx, AclOperation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
            return _reassignment_answer(named, {}, CLUSTER_AUTHORIZATION_FAILED.code,
                                        _denied(ctx, "Alter", "cluster", CLUSTER_NAME))
        c = self._controller()
        targets = [(TopicPartition(t.name, p.partition_index), p.replicas) for t in req.topics for p in t.partitions]
        # as Kafka: answered once the moves are written and sent, not when replicas have acted
        results, _ = await c.call(lambda: c.alter_reassignments(targets))
        return _reassignment_answer(named, results)

    @handles(ApiKey.LIST_PARTITION_REASSIGNMENTS, Kind.ASYNC)
    async def list_partition_reassignments(self, req: ListPartitionReassignmentsRequest,
                                           ctx: RequestContext | None = None) -> ListPartitionReassignmentsResponse:
        if not self._can(ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return ListPartitionReassignmentsResponse(CLUSTER_AUTHORIZATION_FAILED.code,
                                                      _denied(ctx, "Describe", "cluster", CLUSTER_NAME))
        c = self._controller()
        tps = None if req.topics is None else [TopicPartition(t.name, p) for t in req.topics
                                               for p in t.partition_indexes]
        moves = await c.call(lambda: _async(c.reassignments(tps)))
        by_topic: dict[str, list[OngoingPartitionReassignment]] = {}
        for tp, m in moves.items():
            by_topic.setdefault(tp.topic, []).append(OngoingPartitionReassignment(
                tp.partition, list(m.replicas), list(m.adding), list(m.removing)))
        return ListPartitionReassignmentsResponse(NONE.code, None, [OngoingTopicReassignment(t, ps)
                                                                    for t, ps in by_topic.items()])

    @handles(ApiKey.CONTROLLED_SHUTDOWN, Kind.ASYNC)
    async def controlled_shutdown(self, req: ControlledShutdownRequest, ctx: RequestContext | None = None) -> ControlledShutdownResponse:
        if self._cluster_action_problem(ctx, f"ControlledShutdown of broker {req.broker_id}") is not None:
            return ControlledShutdownResponse(CLUSTER_AUTHORIZATION_FAILED.code)
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
        if req.key_type == GROUP_KEY and not self._can(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, req.key):
            return FindCoordinatorResponse(GROUP_AUTHORIZATION_FAILED.code,
                                           error_message=_denied(ctx, "Describe", "group", req.key))
        if req.key_type != GROUP_KEY and not self._can(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                                                       req.key):
            return FindCoordinatorResponse(TRANSACTIONAL_ID_AUTHORIZATION_FAILED.code,
                                           error_message=_denied(ctx, "Describe", "transactional id", req.key))
        return await self.group_coordinator.find_coordinator(req, ctx.listener if ctx is not None else None)

    def _group_denied(self, ctx: RequestContext | None, operation: AclOperation, group_id: str) -> str | None:
        """Why the group's API is refused (GROUP_AUTHORIZATION_FAILED), or None."""
        if self._can(ctx, operation, ResourceType.GROUP, group_id):
            return None
        return _denied(ctx, operation.kafka_name, "group", group_id)

    @handles(ApiKey.JOIN_GROUP, Kind.ASYNC)
    async def join_group(self, req: JoinGroupRequest, ctx: RequestContext | None = None) -> JoinGroupResponse:
        if (denied := self._group_denied(ctx, AclOperation.READ, req.group_id)) is not None:
            return JoinGroupResponse(GROUP_AUTHORIZATION_FAILED.code, member_id=req.member_id, error_message=denied)
        # the native protocol has skip_assignment; a Kafka client only from JoinGroup v9 on
        supports_skip = ctx.kafka_version is None or ctx.kafka_version >= SKIP_ASSIGNMENT_JOIN_VERSION
        return await self.group_coordinator.join_group(req, ctx.client_id, ctx.peer_host,
                                                       supports_skip_assignment=supports_skip)

    @handles(ApiKey.SYNC_GROUP, Kind.ASYNC)
    async def sync_group(self, req: SyncGroupRequest, ctx: RequestContext | None = None) -> SyncGroupResponse:
        if (denied := self._group_denied(ctx, AclOperation.READ, req.group_id)) is not None:
            return SyncGroupResponse(GROUP_AUTHORIZATION_FAILED.code, error_message=denied)
        return await self.group_coordinator.sync_group(req)

    @handles(ApiKey.HEARTBEAT, Kind.ASYNC)
    async def heartbeat(self, req: HeartbeatRequest, ctx: RequestContext | None = None) -> HeartbeatResponse:
        if (denied := self._group_denied(ctx, AclOperation.READ, req.group_id)) is not None:
            return HeartbeatResponse(GROUP_AUTHORIZATION_FAILED.code, denied)
        return await self.group_coordinator.heartbeat(req)

    @handles(ApiKey.LEAVE_GROUP, Kind.ASYNC)
    async def leave_group(self, req: LeaveGroupRequest, ctx: RequestContext | None = None) -> LeaveGroupResponse:
        if (denied := self._group_denied(ctx, AclOperation.READ, req.group_id)) is not None:
            return LeaveGroupResponse(GROUP_AUTHORIZATION_FAILED.code, error_message=denied)
        return await self.group_coordinator.leave_group(req)

    @handles(ApiKey.OFFSET_COMMIT, Kind.ASYNC)
    async def offset_commit(self, req: OffsetCommitRequest, ctx: RequestContext | None = None) -> OffsetCommitResponse:
        """Read on the group (else every partition GROUP_AUTHORIZATION_FAILED), then Read on
        each topic (else its partitions TOPIC_AUTHORIZATION_FAILED)."""
        if (denied_group := self._group_denied(ctx, AclOperation.READ, req.group_id)) is not None:
            return OffsetCommitResponse([OffsetCommitTopicResponse(t.name, [
                OffsetCommitPartitionResponse(p.partition_index, GROUP_AUTHORIZATION_FAILED.code, denied_group)
                for p in t.partitions]) for t in req.topics])
        denied = self._denied_topics(ctx, AclOperation.READ, {t.name for t in req.topics})
        if not denied:
            return await self.group_coordinator.offset_commit(req)
        allowed = [t for t in req.topics if t.name not in denied]
        answered = (await self.group_coordinator.offset_commit(dataclasses.replace(req, topics=allowed))).topics \
            if allowed else []
        return OffsetCommitResponse(answered + [OffsetCommitTopicResponse(t.name, [
            OffsetCommitPartitionResponse(p.partition_index, TOPIC_AUTHORIZATION_FAILED.code,
                                          _denied(ctx, "Read", "topic", t.name)) for p in t.partitions])
            for t in req.topics if t.name in denied])

    @handles(ApiKey.OFFSET_FETCH, Kind.ASYNC)
    async def offset_fetch(self, req: OffsetFetchRequest, ctx: RequestContext | None = None) -> OffsetFetchResponse:
        """Describe on the group (else GROUP_AUTHORIZATION_FAILED); a topic asked for that the
        principal may not Describe is answered TOPIC_AUTHORIZATION_FAILED, and a request for
        every topic leaves such topics out."""
        if self._group_denied(ctx, AclOperation.DESCRIBE, req.group_id) is not None:
            return OffsetFetchResponse(GROUP_AUTHORIZATION_FAILED.code)
        if self.authorizer is None or ctx is None:
            return await self.group_coordinator.offset_fetch(req)
        if req.topics is None:
            r = await self.group_coordinator.offset_fetch(req)
            return dataclasses.replace(r, topics=[
                t for t in r.topics if self._can(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)])
        denied = self._denied_topics(ctx, AclOperation.DESCRIBE, {t.name for t in req.topics})
        if not denied:
            return await self.group_coordinator.offset_fetch(req)
        allowed = [t for t in req.topics if t.name not in denied]
        r = await self.group_coordinator.offset_fetch(dataclasses.replace(req, topics=allowed))
        if r.error_code != NONE.code:
            return r
        return dataclasses.replace(r, topics=r.topics + [OffsetFetchTopicResponse(t.name, [
            OffsetFetchPartitionResponse(p, error_code=TOPIC_AUTHORIZATION_FAILED.code) for p in t.partition_indexes])
            for t in req.topics if t.name in denied])

    @handles(ApiKey.LIST_GROUPS, Kind.ASYNC)
    async def list_groups(self, req: ListGroupsRequest, ctx: RequestContext | None = None) -> ListGroupsResponse:
        """Every group with Describe on the Cluster, else the groups the principal may Describe."""
        r = await self.group_coordinator.list_groups(req)
        if self._can(ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return r
        return dataclasses.replace(r, groups=[
            g for g in r.groups if self._can(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, g.group_id)])

    @handles(ApiKey.DESCRIBE_GROUPS, Kind.ASYNC)
    async def describe_groups(self, req: DescribeGroupsRequest, ctx: RequestContext | None = None) -> DescribeGroupsResponse:
        denied = {g: m for g in req.groups if (m := self._group_denied(ctx, AclOperation.DESCRIBE, g)) is not None}
        if not denied:
            return await self.group_coordinator.describe_groups(req)
        allowed = [g for g in req.groups if g not in denied]
        answered = (await self.group_coordinator.describe_groups(DescribeGroupsRequest(allowed))).groups \
            if allowed else []
        return DescribeGroupsResponse(answered + [DescribedGroup(GROUP_AUTHORIZATION_FAILED.code, g, error_message=m)
                                                  for g, m in denied.items()])

    @handles(ApiKey.DELETE_GROUPS, Kind.ASYNC)
    async def delete_groups(self, req: DeleteGroupsRequest, ctx: RequestContext | None = None) -> DeleteGroupsResponse:
        denied = {g: m for g in req.groups_names if (m := self._group_denied(ctx, AclOperation.DELETE, g)) is not None}
        if not denied:
            return await self.group_coordinator.delete_groups(req)
        allowed = [g for g in req.groups_names if g not in denied]
        answered = (await self.group_coordinator.delete_groups(DeleteGroupsRequest(allowed))).results \
            if allowed else []
        return DeleteGroupsResponse(answered + [DeletableGroupResult(g, GROUP_AUTHORIZATION_FAILED.code, m)
                                                for g, m in denied.items()])

    # -- ACLs (broker/security/authorizer.py) --------------------------------------------------

    @handles(ApiKey.CREATE_ACLS, Kind.ASYNC)
    async def create_acls(self, req: CreateAclsRequest, ctx: RequestContext | None = None) -> CreateAclsResponse:
        """Alter on the Cluster; each creation stored (or refused: INVALID_REQUEST naming the
        field) in ZooKeeper by this broker. No authorizer: SECURITY_DISABLED."""
        refusal = self._acl_api_refusal(ctx, AclOperation.ALTER)
        if refusal is not None:
            return CreateAclsResponse([AclCreationResult(refusal[0].code, refusal[1]) for _ in req.creations])
        results: list[AclCreationResult | None] = [None] * len(req.creations)
        bindings, at = [], []
        for i, c in enumerate(req.creations):
            try:
                bindings.append(AclBinding(c.resource_type, c.resource_name, c.resource_pattern_type, c.principal,
                                           c.host, c.operation, c.permission_type))
                at.append(i)
            except AclError as e:
                results[i] = AclCreationResult(INVALID_REQUEST.code, str(e))
        for i, error in zip(at, await self.acl_store.create(bindings)):
            results[i] = AclCreationResult(NONE.code) if error is None else AclCreationResult(
                INVALID_REQUEST.code if isinstance(error, AclError) else code_of(error).code, str(error))
        return CreateAclsResponse(results)

    @handles(ApiKey.DESCRIBE_ACLS, Kind.ASYNC)
    async def describe_acls(self, req: DescribeAclsRequest, ctx: RequestContext | None = None) -> DescribeAclsResponse:
        """Describe on the Cluster; the bindings this broker holds that match the filter, by
        pattern."""
        refusal = self._acl_api_refusal(ctx, AclOperation.DESCRIBE)
        if refusal is not None:
            return DescribeAclsResponse(refusal[0].code, refusal[1])
        try:
            acl_filter = _acl_filter(req)
        except AclError as e:
            return DescribeAclsResponse(INVALID_REQUEST.code, str(e))
        by_pattern: dict[tuple, list[AclDescription]] = {}
        for b in self.authorizer.bindings(acl_filter):
            by_pattern.setdefault(b.pattern, []).append(
                AclDescription(b.principal, b.host, int(b.operation), int(b.permission_type)))
        return DescribeAclsResponse(NONE.code, resources=[
            DescribeAclsResource(int(t), name, int(p), acls) for (t, name, p), acls in by_pattern.items()])

    @handles(ApiKey.DELETE_ACLS, Kind.ASYNC)
    async def delete_acls(self, req: DeleteAclsRequest, ctx: RequestContext | None = None) -> DeleteAclsResponse:
        """Alter on the Cluster; per filter the bindings deleted."""
        refusal = self._acl_api_refusal(ctx, AclOperation.ALTER)
        if refusal is not None:
            return DeleteAclsResponse([DeleteAclsFilterResult(refusal[0].code, refusal[1]) for _ in req.filters])
        results: list[DeleteAclsFilterResult | None] = [None] * len(req.filters)
        filters, at = [], []
        for i, f in enumerate(req.filters):
            try:
                filters.append(_acl_filter(f))
                at.append(i)
            except AclError as e:
                results[i] = DeleteAclsFilterResult(INVALID_REQUEST.code, str(e))
        for i, deleted in zip(at, await self.acl_store.delete(filters)):
            results[i] = DeleteAclsFilterResult(NONE.code, matching_acls=[DeleteAclsMatchingAcl(
                NONE.code if e is None else code_of(e).code, int(b.restype), b.name, int(b.resource_pattern_type),
                b.principal, b.host, int(b.operation), int(b.permission_type), None if e is None else str(e))
                for b, e in deleted])
        return DeleteAclsResponse(results)

    def _acl_api_refusal(self, ctx: RequestContext | None, operation: AclOperation) -> tuple[ErrorCode, str] | None:
        if self.authorizer is None or self.acl_store is None:
            return SECURITY_DISABLED, "no authorizer is configured on this broker (authorizer.class.name)"
        if not self._can(ctx, operation, ResourceType.CLUSTER, CLUSTER_NAME):
            return CLUSTER_AUTHORIZATION_FAILED, _denied(ctx, operation.kafka_name, "cluster", CLUSTER_NAME)
        return None

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
        own = self.broker.broker_epoch
        if problem is None and 0 <= req.broker_epoch < own:
            # meant for an earlier registration of ours (as Kafka's isBrokerEpochStale): refused
            # whatever the registry holds, which may not have seen our new registration yet; a
            # request the controller sent before our session expired can arrive late, on a
            # connection it had given up, and must not roll our metadata back
            error, problem = STALE_BROKER_EPOCH, (f"broker epoch {req.broker_epoch} is of an earlier registration "
                                                  f"of broker {self.config.broker_id}")
        elif problem is None and req.broker_epoch != own:
            # not ours as we know it: our register call may not have returned yet
            error, problem = STALE_BROKER_EPOCH, await registry.broker_epoch_problem(
                self.config.broker_id, req.broker_epoch)
        if problem is not None:
            logger.warning("%s from broker %d refused: %s", api, req.controller_id, problem)
            raise TidelogError(f"{api} refused: {problem}", error=error)

    @handles(ApiKey.LEADER_AND_ISR, Kind.ASYNC)
    async def leader_and_isr(self, req: LeaderAndIsrRequest, ctx: RequestContext | None = None) -> LeaderAndIsrResponse:
        if self._cluster_action_problem(ctx, "LeaderAndIsr") is not None:
            return LeaderAndIsrResponse(CLUSTER_AUTHORIZATION_FAILED.code)
        try:
            await self._check_from_controller("LeaderAndIsr", req)
        except TidelogError as e:
            return LeaderAndIsrResponse(e.code)
        self.broker.update_topic_overrides(req.topic_configs)
        return self.replica_manager.become_leader_or_follower(req)

    @handles(ApiKey.UPDATE_METADATA, Kind.ASYNC)
    async def update_metadata(self, req: UpdateMetadataRequest, ctx: RequestContext | None = None) -> UpdateMetadataResponse:
        if self._cluster_action_problem(ctx, "UpdateMetadata") is not None:
            return UpdateMetadataResponse(CLUSTER_AUTHORIZATION_FAILED.code)
        try:
            await self._check_from_controller("UpdateMetadata", req)
        except TidelogError as e:
            return UpdateMetadataResponse(e.code)
        self.broker.update_topic_overrides(req.topic_configs)
        deleted = self.metadata.deleted_by(req)  # read before the update drops them
        current = self.metadata.update(req)
        for topic in deleted:
            self.broker.topic_overrides.pop(topic, None)
        if current and deleted and self.coordinator is not None:
            # a topic created again under the name must not resume at the old offsets
            self.coordinator.handle_deleted_topics(deleted)
        self.broker.metadata_updated(deleted)
        return UpdateMetadataResponse(NONE.code)

    @handles(ApiKey.STOP_REPLICA, Kind.ASYNC)
    async def stop_replica(self, req: StopReplicaRequest, ctx: RequestContext | None = None) -> StopReplicaResponse:
        if self._cluster_action_problem(ctx, "StopReplica") is not None:
            return StopReplicaResponse(CLUSTER_AUTHORIZATION_FAILED.code)
        try:
            await self._check_from_controller("StopReplica", req)
        except TidelogError as e:
            return StopReplicaResponse(e.code)
        return self.replica_manager.stop_replicas(req)


def _sasl_refusal(ctx: RequestContext | None) -> str:
    if ctx is not None and ctx.authenticated:
        return f"the connection is already authenticated as {ctx.principal}"
    listener = ctx.listener if ctx is not None else "this listener"
    return f"listener {listener} does not use SASL"


_WRITE, _TOPIC = AclOperation.WRITE, ResourceType.TOPIC  # the produce path's (an enum's attribute costs ~70 ns)


def _disk_usage(log_dirs: list[str]) -> dict[str, tuple[int, int]]:
    """(total, usable) bytes of each log dir's file system; (-1, -1) when it cannot be read."""
    out = {}
    for d in log_dirs:
        try:
            usage = shutil.disk_usage(d)
            out[d] = (usage.total, usage.free)
        except OSError:
            out[d] = (-1, -1)
    return out


async def _per_item_call(c, call, refused: Callable[[TidelogError], tuple[list, list]]) -> tuple[list, list]:
    """``c.call(call)``'s (results, waits); a controller that resigned while the call was
    queued answers ``refused(error)`` instead: NOT_CONTROLLER for each item (topic,
    partition), as Kafka's handlers do, and the client asks the new one."""
    try:
        return await c.call(call)
    except TidelogError as e:
        if e.error is not NOT_CONTROLLER:
            raise
        return refused(e)


async def _per_topic_call(c, call, names: list[str]) -> tuple[list, list]:
    """``_per_item_call`` of a call answered per topic (CreateTopics, DeleteTopics, CreatePartitions)."""
    return await _per_item_call(c, call, lambda e: ([TopicResult(n, e.code, str(e)) for n in names], []))


def _election_refusals(tps: list[TopicPartition] | None, metadata: MetadataCache,
                       e: TidelogError) -> tuple[list, list]:
    """ElectLeaders off the controller, as Kafka answers it: ``e`` (NOT_CONTROLLER) for each
    partition named or, of a null list, each one the broker knows. Knowing none, the request
    is refused as a whole: an empty answer would read as "no partition needed an election"."""
    results = [(tp, e.code, str(e)) for tp in (metadata.partitions() if tps is None else tps)]
    if tps is None and not results:
        raise e
    return results, []


def _denied(ctx: RequestContext | None, operation: str, kind: str, name: str) -> str:
    principal = ctx.principal if ctx is not None else "?"
    return f"{principal} is not authorized to {operation} {kind} {name[:255]!r}"


def _acl_filter(f: Any) -> AclBindingFilter:
    """A DescribeAcls request or DeleteAcls filter as an ``AclBindingFilter`` (AclError for an
    unknown code or an UNKNOWN field)."""
    return AclBindingFilter(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                            f.principal_filter, f.host_filter, f.operation, f.permission_type).validate()


def _internal_topic_refused(tp: TopicPartition) -> dict:
    """A client's Produce to an internal topic (Kafka: ``internalTopicsAllowed`` is false for
    clients). The group coordinator appends through the replica manager, not through here."""
    return {"error_code": INVALID_TOPIC_EXCEPTION.code,
            "error_message": f"cannot append to internal topic {tp.topic} (partition {tp.partition}): only the "
                             "broker writes it; commit consumer offsets with OffsetCommit (Consumer.commit)"}


def _zstd_refused(kafka_version: int, entries: dict, refused: dict) -> dict:
    """The partitions a Kafka client's Produce before v7 sent zstd batches to (KIP-110: Kafka's
    ``ProduceRequest.validateRecords``), found from the batch headers; authorization first."""
    message = f"Produce requests with version {kafka_version} are not allowed to use ZStandard compression"
    return {tp: {"error_code": UNSUPPORTED_COMPRESSION_TYPE.code, "error_message": message}
            for tp, records in entries.items() if tp not in refused and holds_codec(records, Codec.ZSTD)}


def _batches_refused(kafka_version: int, entries: dict, refused: dict) -> dict:
    """The partitions a Kafka client's Produce v3+ sent more than one batch to (Kafka's
    ``ProduceRequest.validateRecords``: INVALID_RECORD), found from the batch headers."""
    message = (f"Produce requests with version {kafka_version} are only allowed to contain exactly one record "
               "batch per partition")
    return {tp: {"error_code": INVALID_RECORD.code, "error_message": message}
            for tp, records in entries.items() if tp not in refused and records and holds_more_than_one_batch(records)}


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



def _reassignment_answer(named: list[TopicPartition], results: dict[TopicPartition, tuple[int, str | None]],
                         code: int = NONE.code, message: str | None = None) -> AlterPartitionReassignmentsResponse:
    """AlterPartitionReassignments' answer: each partition named (once) with its result, or
    with ``code``/``message`` when the whole request was refused."""
    by_topic: dict[str, dict[int, ReassignablePartitionResponse]] = {}
    for tp in named:
        err, msg = results.get(tp, (code, message))
        by_topic.setdefault(tp.topic, {})[tp.partition] = ReassignablePartitionResponse(tp.partition, err, msg)
    return AlterPartitionReassignmentsResponse(code, message, [ReassignableTopicResponse(t, list(ps.values()))
                                                               for t, ps in by_topic.items()])


async def _async(value):
    return value


@functools.lru_cache(maxsize=1)
def _software_version() -> str:
    from tidelog.broker.cli import installed_version

    return installed_version()
