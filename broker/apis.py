"""One handler per API key: typed request in, typed response out.

This is the broker's one boundary between exceptions and error codes: a handler raises a
``TidelogError`` (or a per-partition error is recorded in the response), and the network
layer turns an escaping exception into an error response. Controller-only APIs (topic
administration, controlled shutdown) answer NOT_CONTROLLER on other brokers, as Kafka does.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from tidelog.broker.controller.channels import wait_all
from tidelog.broker.metadata_cache import MetadataCache
from tidelog.broker.network import current_peer
from tidelog.broker.replication.replica_manager import ReplicaManager
from tidelog.protocol.errors import (
    COORDINATOR_NOT_AVAILABLE,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    NONE,
    NOT_CONTROLLER,
    NOT_LEADER_OR_FOLLOWER,
    STALE_BROKER_EPOCH,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
)
from tidelog.protocol.messages import (
    BROKER_RESOURCE,
    CONSUMER_REPLICA_ID,
    DEBUGGING_REPLICA_ID,
    REQUESTS,
    TOPIC_RESOURCE,
    AlterConfigsRequest,
    AlterConfigsResponse,
    AlterConfigsResult,
    ApiKey,
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
    RequestHeader,
    StopReplicaRequest,
    StopReplicaResponse,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicPartitionRef,
    TopicProduceResponse,
    TopicResult,
    UpdateMetadataRequest,
    UpdateMetadataResponse,
    supported_api_versions,
)
from tidelog.protocol.topics import TopicPartition, is_internal_topic

logger = logging.getLogger("tidelog.apis")

# a handler returns its response, an awaitable of it, or a DeferredResponse (a consumer fetch)
Handler = Callable[..., Any]


class Apis:
    def __init__(self, broker, replica_manager: ReplicaManager, metadata: MetadataCache):
        self.broker = broker  # the server: config, controller, zk, topic configs, broker epoch
        self.replica_manager = replica_manager
        self.metadata = metadata
        self._handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata_,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self._fetch_dispatch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.DELETE_RECORDS: self.delete_records,
            ApiKey.OFFSETS_FOR_LEADER_EPOCH: self.offsets_for_leader_epoch,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.CREATE_PARTITIONS: self.create_partitions,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.ALTER_CONFIGS: self.alter_configs,
            ApiKey.LEADER_AND_ISR: self.leader_and_isr,
            ApiKey.UPDATE_METADATA: self.update_metadata,
            ApiKey.STOP_REPLICA: self.stop_replica,
            ApiKey.CONTROLLED_SHUTDOWN: self.controlled_shutdown,
            ApiKey.ELECT_LEADERS: self.elect_leaders,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.JOIN_GROUP: self.join_group,
            ApiKey.SYNC_GROUP: self.sync_group,
            ApiKey.HEARTBEAT: self.heartbeat,
            ApiKey.LEAVE_GROUP: self.leave_group,
            ApiKey.OFFSET_COMMIT: self.offset_commit,
            ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.LIST_GROUPS: self.list_groups,
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups,
        }

    def handle(self, header: RequestHeader, body: dict):
        """Called by the network layer in request order; returns the response or an awaitable.

        Produce appends before returning (see ``produce``); a consumer's fetch returns the
        response or a ``DeferredResponse`` answered by the append that satisfies it or at
        its ``max_wait_ms`` (``_fetch_dispatch``); every other API returns its coroutine,
        which the network layer awaits in the request's own task.
        """
        handler = self._handlers.get(header.api_key)
        if handler is None:
            raise TidelogError(f"api key {header.api_key} is not served by this broker", error=INVALID_REQUEST)
        if header.api_key == ApiKey.JOIN_GROUP:  # the member's client id and host are recorded
            return handler(REQUESTS[header.api_key].from_body(body), header)
        return handler(REQUESTS[header.api_key].from_body(body))

    # -- metadata ------------------------------------------------------------------------------

    async def api_versions(self, req) -> ApiVersionsResponse:
        return ApiVersionsResponse(NONE.code, supported_api_versions())

    async def metadata_(self, req: MetadataRequest) -> MetadataResponse:
        missing = [t for t in req.topics or [] if not self.metadata.contains_topic(t)]
        if missing and req.allow_auto_topic_creation and self.broker.config.auto_create_topics_enable:
            await self.broker.auto_create_topics(missing)
        return MetadataResponse(self.metadata.broker_metadata(), self.metadata.cluster_id,
                                self.metadata.controller_id, self.metadata.topic_metadata(req.topics))

    # -- data ----------------------------------------------------------------------------------

    def produce(self, req: ProduceRequest):
        """Append now (so pipelined produces of a connection append in the order sent); for
        acks=all return the coroutine that waits for replication."""
        entries = {TopicPartition(t.name, p.index): p.records for t in req.topic_data for p in t.partition_data}
        refused = {tp: _internal_topic_refused(tp) for tp in entries if is_internal_topic(tp.topic)}
        results, waiting = self.replica_manager.append_now(
            req.acks, {tp: records for tp, records in entries.items() if tp not in refused})
        for tp, r in results.items():
            r["error_code"] = self._absent_as_unknown(tp, r["error_code"])
        results.update(refused)
        if req.acks == 0:
            return None
        if waiting:
            return self._produce_after_replication(req, results, waiting)
        return _produce_response(results)

    async def _produce_after_replication(self, req: ProduceRequest, results, waiting) -> ProduceResponse:
        await self.replica_manager.await_replication(waiting, req.timeout_ms, results)
        return _produce_response(results)

    def _fetch_dispatch(self, req: FetchRequest):
        """A fetch from the network: a consumer's is answered now or deferred (a DelayedFetch,
        answered by the append that satisfies it or at max_wait_ms, see ReplicaManager.
        consumer_fetch); a follower's runs as ``fetch`` in a task of its own."""
        if req.replica_id >= 0:
            return self.fetch(req)
        return self.replica_manager.consumer_fetch(req, self._fetch_response)

    async def fetch(self, req: FetchRequest) -> FetchResponse:
        return self._fetch_response(await self.replica_manager.fetch(req))

    def _fetch_response(self, results) -> FetchResponse:
        by_topic: dict[str, list] = {}
        for tp, r in results.items():
            code = self._absent_as_unknown(tp, r.error_code)
            if code != r.error_code:
                r = dataclasses.replace(r, error_code=code)
            by_topic.setdefault(tp.topic, []).append(r)
        return FetchResponse([FetchTopicResponse(t, ps) for t, ps in by_topic.items()])

    async def list_offsets(self, req: ListOffsetsRequest) -> ListOffsetsResponse:
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

    async def delete_records(self, req: DeleteRecordsRequest) -> DeleteRecordsResponse:
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

    async def offsets_for_leader_epoch(self, req: OffsetsForLeaderEpochRequest) -> OffsetsForLeaderEpochResponse:
        rm = self.replica_manager
        return OffsetsForLeaderEpochResponse([
            OffsetForLeaderTopicResult(t.topic, [
                rm.end_offset_for_epoch(TopicPartition(t.topic, p.partition), p.leader_epoch, p.current_leader_epoch)
                for p in t.partitions])
            for t in req.topics])

    # -- controller-only administration --------------------------------------------------------

    def _controller(self):
        c = self.broker.controller
        if c is None or not c.is_active:
            raise TidelogError(f"broker {self.broker.broker_id} is not the controller "
                               f"(controller: {self.metadata.controller_id})", error=NOT_CONTROLLER)
        return c

    async def create_topics(self, req: CreateTopicsRequest) -> CreateTopicsResponse:
        try:
            c = self._controller()
        except TidelogError as e:
            return CreateTopicsResponse([TopicResult(t.name, e.code, str(e)) for t in req.topics])
        results, waits = await c.call(lambda: c.create_topics(req.topics, req.validate_only))
        await wait_all(waits, req.timeout_ms / 1000)
        return CreateTopicsResponse(results)

    async def delete_topics(self, req: DeleteTopicsRequest) -> DeleteTopicsResponse:
        try:
            c = self._controller()
            if not self.broker.config.delete_topic_enable:
                raise TidelogError("topic deletion is disabled (delete.topic.enable=false)",
                                   error=INVALID_REQUEST)
        except TidelogError as e:
            return DeleteTopicsResponse([TopicResult(n, e.code, str(e)) for n in req.topic_names])
        return DeleteTopicsResponse(await c.call(lambda: c.delete_topics(req.topic_names)))

    async def create_partitions(self, req: CreatePartitionsRequest) -> CreatePartitionsResponse:
        results = []
        for t in req.topics:
            try:
                c = self._controller()
                waits = await c.call(lambda t=t: c.create_partitions(t.name, t.count, t.assignments, req.validate_only))
                await wait_all(waits, req.timeout_ms / 1000)
                results.append(TopicResult(t.name, NONE.code, None, t.count))
            except TidelogError as e:
                results.append(TopicResult(t.name, e.code, str(e)))
        return CreatePartitionsResponse(results)

    async def describe_configs(self, req: DescribeConfigsRequest) -> DescribeConfigsResponse:
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
            props = self.broker.config.to_props()
            return [ConfigEntry(k, _render(v), read_only=True)
                    for k, v in sorted(props.items()) if keys is None or k in keys]
        raise TidelogError(f"unknown config resource type {resource_type}", error=INVALID_REQUEST)

    async def alter_configs(self, req: AlterConfigsRequest) -> AlterConfigsResponse:
        out = []
        for r in req.resources:
            try:
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

    async def init_producer_id(self, req: InitProducerIdRequest) -> InitProducerIdResponse:
        """Any broker answers: a new producer id at epoch 0, or the next epoch of the given one."""
        try:
            if req.transactional_id is not None:
                raise TidelogError("transactional producers are not supported (transactional_id must be null)",
                                   error=INVALID_REQUEST)
            pid, epoch = await self.broker.producer_ids.init_producer_id(req.producer_id, req.producer_epoch)
        except TidelogError as e:
            return InitProducerIdResponse(e.code, error_message=str(e))
        return InitProducerIdResponse(NONE.code, pid, epoch)

    async def elect_leaders(self, req: ElectLeadersRequest) -> ElectLeadersResponse:
        c = self._controller()
        tps = None if req.topic_partitions is None else [
            TopicPartition(r.topic_name, r.partition_index) for r in req.topic_partitions]
        results, waits = await c.call(lambda: c.elect_preferred(tps))
        await wait_all(waits, req.timeout_ms / 1000)
        return ElectLeadersResponse(NONE.code, [ElectLeadersResult(tp.topic, tp.partition, code, msg)
                                                for tp, code, msg in results])

    async def controlled_shutdown(self, req: ControlledShutdownRequest) -> ControlledShutdownResponse:
        c = self._controller()
        remaining, waits = await c.call(lambda: c.controlled_shutdown(req.broker_id, req.broker_epoch))
        # new leaders learn of their leadership before the old one goes away
        await wait_all([w for w in waits if w is not None and w.api_key == ApiKey.LEADER_AND_ISR], 10)
        return ControlledShutdownResponse(NONE.code, [TopicPartitionRef(tp.topic, tp.partition) for tp in remaining])

    # -- consumer groups (broker/groups/group_coordinator.py) ------------------------------

    @property
    def group_coordinator(self):
        c = getattr(self.broker, "group_coordinator", None)
        if c is None:
            raise TidelogError("this broker runs no group coordinator", error=COORDINATOR_NOT_AVAILABLE)
        return c

    async def find_coordinator(self, req: FindCoordinatorRequest) -> FindCoordinatorResponse:
        return await self.group_coordinator.find_coordinator(req)

    async def join_group(self, req: JoinGroupRequest, header: RequestHeader) -> JoinGroupResponse:
        host = current_peer.get().rpartition(":")[0]
        return await self.group_coordinator.join_group(req, header.client_id, host)

    async def sync_group(self, req: SyncGroupRequest) -> SyncGroupResponse:
        return await self.group_coordinator.sync_group(req)

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        return await self.group_coordinator.heartbeat(req)

    async def leave_group(self, req: LeaveGroupRequest) -> LeaveGroupResponse:
        return await self.group_coordinator.leave_group(req)

    async def offset_commit(self, req: OffsetCommitRequest) -> OffsetCommitResponse:
        return await self.group_coordinator.offset_commit(req)

    async def offset_fetch(self, req: OffsetFetchRequest) -> OffsetFetchResponse:
        return await self.group_coordinator.offset_fetch(req)

    async def list_groups(self, req: ListGroupsRequest) -> ListGroupsResponse:
        return await self.group_coordinator.list_groups(req)

    async def describe_groups(self, req: DescribeGroupsRequest) -> DescribeGroupsResponse:
        return await self.group_coordinator.describe_groups(req)

    async def delete_groups(self, req: DeleteGroupsRequest) -> DeleteGroupsResponse:
        return await self.group_coordinator.delete_groups(req)

    # -- from the controller -------------------------------------------------------------------

    def _check_broker_epoch(self, epoch: int) -> None:
        # Kafka's rule: only an *older* epoch is stale. The controller learns our new epoch from
        # ZooKeeper's watch and may send before our own register call has returned (epoch -1).
        if epoch >= 0 and epoch < self.broker.broker_epoch:
            raise TidelogError(f"request for broker epoch {epoch}, this broker's is {self.broker.broker_epoch}",
                               error=STALE_BROKER_EPOCH)

    async def leader_and_isr(self, req: LeaderAndIsrRequest) -> LeaderAndIsrResponse:
        try:
            self._check_broker_epoch(req.broker_epoch)
        except TidelogError as e:
            return LeaderAndIsrResponse(e.code)
        self.broker.update_topic_overrides(req.topic_configs)
        return self.replica_manager.become_leader_or_follower(req)

    async def update_metadata(self, req: UpdateMetadataRequest) -> UpdateMetadataResponse:
        try:
            self._check_broker_epoch(req.broker_epoch)
        except TidelogError as e:
            return UpdateMetadataResponse(e.code)
        self.broker.update_topic_overrides(req.topic_configs)
        self.metadata.update(req)
        for topic in req.deleted_topics:
            self.broker.topic_overrides.pop(topic, None)
        self.broker.metadata_updated()
        return UpdateMetadataResponse(NONE.code)

    async def stop_replica(self, req: StopReplicaRequest) -> StopReplicaResponse:
        try:
            self._check_broker_epoch(req.broker_epoch)
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

