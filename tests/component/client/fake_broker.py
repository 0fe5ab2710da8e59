"""An in-process fake cluster for the client's component tests.

Several broker "nodes" (one loopback listener each) share one in-memory state: topics with
one log per partition (stored batch bytes, offsets and leader epoch patched in place with
``protocol.records.patch_batch``, as a real leader does), a leader node per partition, and a
controller. It speaks the real wire protocol through ``protocol.connection.ServerConnection``
and implements Metadata, Produce (acks -1/1/0), Fetch (long poll), ListOffsets, CreateTopics,
DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs, DescribeLogDirs,
ApiVersions, ElectLeaders and the reassignment APIs (no election or move is ever needed), and
FindCoordinator and OffsetFetch for the groups given committed offsets, with Kafka's routing rules:
produce and fetch only on the partition's leader (else NOT_LEADER_OR_FOLLOWER), topic
administration only on the controller (else NOT_CONTROLLER). The high watermark is the log
end offset (there is no replication).

Faults are injected per request (``inject``): answer with an error code (per partition or topic, or
for the request as a whole), drop the connection before doing anything, or delay. A produce fault fires before anything is appended (so
the log holds each record exactly once when the client retries correctly), except
``drop_after_append``: the batches are appended, then the connection is dropped instead of
answering (a lost response). Idempotent batches are checked and deduplicated by the broker's
own ``ProducerStateManager``, and InitProducerId hands out new ids (and refuses, as the broker
does, a request that names an existing one).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import trio

from tidelog.broker.log.producer_state import ProducerStateManager
from tidelog.protocol.apis import api_for
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import BadRequest, ServerConnection
from tidelog.protocol.errors import (
    COORDINATOR_NOT_AVAILABLE,
    ELECTION_NOT_NEEDED,
    INVALID_PARTITIONS,
    INVALID_REQUEST,
    NONE,
    NOT_CONTROLLER,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
    error_body,
    for_code,
)
from tidelog.protocol.messages import (
    AlterConfigsResponse,
    AlterConfigsResult,
    AlterPartitionReassignmentsResponse,
    ApiVersionsResponse,
    BrokerMetadata,
    ConfigEntry,
    CreatePartitionsResponse,
    CreateTopicsResponse,
    DeleteTopicsResponse,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeLogDirsPartition,
    DescribeLogDirsResponse,
    DescribeLogDirsResult,
    DescribeLogDirsTopic,
    ElectLeadersResponse,
    ElectLeadersResult,
    FetchPartitionResponse,
    FetchResponse,
    FetchTopicResponse,
    FindCoordinatorResponse,
    InitProducerIdResponse,
    ListGroupsResponse,
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
    ListPartitionReassignmentsResponse,
    MetadataResponse,
    OffsetFetchPartitionResponse,
    OffsetFetchResponse,
    OffsetFetchTopicResponse,
    PartitionMetadata,
    PartitionProduceResponse,
    ProduceResponse,
    TopicMetadata,
    TopicProduceResponse,
    TopicResult,
)
from tidelog.protocol.records import BatchRecord, iter_all_records, iter_headers, patch_batch, validate_batches

HOST = "127.0.0.1"


class PartitionLog:
    def __init__(self) -> None:
        self.batches: list[tuple[int, bytes]] = []  # (base offset, batch bytes)
        self.log_end_offset = 0
        self.log_start_offset = 0
        self.leader_epoch = 0
        self.producer_state = ProducerStateManager()
        self.max_message_bytes: int | None = None  # the topic's max.message.bytes, per batch

    def append(self, records: bytes) -> int:
        headers = validate_batches(records, self.max_message_bytes)
        duplicate = self.producer_state.check_leader_append(headers)
        if duplicate is not None:
            return duplicate.first_offset
        base = self.log_end_offset
        buf = bytearray(records)
        for pos, h in headers:
            patch_batch(buf, pos, self.log_end_offset, self.leader_epoch)
            size = h.batch_length + 12
            self.batches.append((self.log_end_offset, bytes(buf[pos:pos + size])))
            self.log_end_offset += h.record_count
        self.producer_state.update(iter_headers(buf))
        return base

    def read(self, offset: int, max_bytes: int) -> bytes:
        out, size = [], 0
        for base, data in self.batches:
            last = base + _count(data) - 1
            if last < offset:
                continue
            if out and size + len(data) > max_bytes:
                break
            out.append(data)
            size += len(data)
        return b"".join(out)

    def records(self) -> list[BatchRecord]:
        return list(iter_all_records(b"".join(d for _, d in self.batches)))

    def offset_for_time(self, timestamp: int) -> tuple[int, int]:
        for r in self.records():
            if r.offset >= self.log_start_offset and r.timestamp >= timestamp:
                return r.offset, r.timestamp
        return -1, -1


def _count(batch: bytes) -> int:
    [(_, h)] = list(iter_headers(batch))
    return h.record_count


@dataclass
class Fault:
    api_key: ApiKey
    node: int | None = None  # None: any node
    error_code: int | None = None
    drop_connection: bool = False
    delay_s: float = 0.0
    count: int = 1  # how many matching requests it hits (math.inf: all)
    hits: int = 0
    drop_after_append: bool = False  # produce: append, then drop the connection (a lost response)
    throttle_ms: int = 0  # produce, fetch: the response asks the client to wait that long (KIP-219)
    whole_request: bool = False  # answer ``error_code`` for the request as a whole (an error body)


@dataclass
class Topic:
    partitions: list[PartitionLog]
    leaders: list[int]
    configs: dict[str, str] = field(default_factory=dict)


class FakeCluster:
    """``async with trio.open_nursery() as n: await n.start(cluster.run)``; then
    ``cluster.bootstrap`` is the bootstrap string."""

    def __init__(self, brokers: int = 1, *, controller: int = 0, cluster_id: str = "fake-cluster",
                 auto_create_partitions: int | None = None):
        self.node_ids = list(range(brokers))
        self.controller = controller
        self.cluster_id = cluster_id
        self.auto_create_partitions = auto_create_partitions
        self.ports: dict[int, int] = {}
        self.topics: dict[str, Topic] = {}
        self.faults: list[Fault] = []
        self.requests: list[tuple[int, ApiKey, Any]] = []  # (node, api, typed request)
        # produce requests in the order their frames arrived on each connection (requests are
        # handled in tasks of their own: ``requests`` and the logs may show another order)
        self.arrived: list[Any] = []
        self.connections = 0
        self.next_producer_id = 1000
        # group id -> committed offsets: node 0 coordinates these (no other group has one)
        self.group_offsets: dict[str, dict[tuple[str, int], int]] = {}
        self._data = trio.Event()
        self._streams: set[trio.SocketStream] = set()
        self._nursery: trio.Nursery | None = None

    # -- set-up and inspection ------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{HOST}:{self.ports[n]}" for n in self.node_ids)

    def create_topic(self, name: str, partitions: int = 1, leaders: list[int] | None = None) -> None:
        leaders = leaders or [self.node_ids[p % len(self.node_ids)] for p in range(partitions)]
        self.topics[name] = Topic([PartitionLog() for _ in range(partitions)], list(leaders))

    def move_leader(self, topic: str, partition: int, node: int) -> None:
        t = self.topics[topic]
        t.leaders[partition] = node
        t.partitions[partition].leader_epoch += 1

    def log(self, topic: str, partition: int = 0) -> PartitionLog:
        return self.topics[topic].partitions[partition]

    def values(self, topic: str, partition: int = 0) -> list[bytes | None]:
        return [r.value for r in self.log(topic, partition).records()]

    def inject(self, api_key: ApiKey, *, node: int | None = None, error_code: int | None = None,
               drop_connection: bool = False, delay_s: float = 0.0, count: float = 1,
               drop_after_append: bool = False, throttle_ms: int = 0, whole_request: bool = False) -> Fault:
        fault = Fault(api_key, node, error_code, drop_connection, delay_s, count,
                      drop_after_append=drop_after_append, throttle_ms=throttle_ms, whole_request=whole_request)
        self.faults.append(fault)
        return fault

    def sent(self, api_key: ApiKey) -> list[Any]:
        return [r for _, k, r in self.requests if k == api_key]

    def arrived_values(self, topic: str = "t", partition: int = 0) -> list[bytes | None]:
        """The values produced to ``topic``/``partition``, in the order they reached the wire."""
        return [r.value for request in self.arrived for t in request.topic_data if t.name == topic
                for p in t.partition_data if p.index == partition for r in iter_all_records(p.records)]

    def drop_all_connections(self) -> None:
        for stream in list(self._streams):
            stream.socket.close()

    # -- serving --------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for node in self.node_ids:
                [listener] = await trio.open_tcp_listeners(0, host=HOST)
                self.ports[node] = listener.socket.getsockname()[1]
                nursery.start_soon(trio.serve_listeners, lambda s, node=node: self._serve(node, s), [listener])
            task_status.started()

    def stop(self) -> None:
        self.drop_all_connections()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _serve(self, node: int, stream: trio.SocketStream) -> None:
        self.connections += 1
        self._streams.add(stream)
        conn = ServerConnection()
        lock = trio.Lock()
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    try:
                        data = await stream.receive_some(1 << 16)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        break
                    if not data:
                        break
                    for event in conn.receive_data(data):
                        if isinstance(event, BadRequest):
                            return
                        api = api_for(event.header)
                        if api.key == ApiKey.PRODUCE:
                            self.arrived.append(api.request.from_body(event.body))
                        nursery.start_soon(self._handle, node, conn, stream, lock, event)
                nursery.cancel_scope.cancel()
        finally:
            self._streams.discard(stream)
            stream.socket.close()

    async def _handle(self, node: int, conn: ServerConnection, stream: trio.SocketStream,
                      lock: trio.Lock, event: Any) -> None:
        header = event.header
        api = api_for(header)
        key = api.key
        request = api.request.from_body(event.body)
        self.requests.append((node, key, request))
        fault = self._fault_for(key, node)
        if fault is not None and fault.delay_s:
            await trio.sleep(fault.delay_s)
        if fault is not None and fault.drop_connection:
            stream.socket.close()
            return
        if fault is not None and fault.drop_after_append:
            self._append_produce(node, request, None)
            stream.socket.close()
            return
        if fault is not None and fault.whole_request:  # as the broker's network layer answers a raise
            out = conn.send_response(header.correlation_id, error_body(for_code(fault.error_code)))
        elif key == ApiKey.PRODUCE and request.acks == 0:
            if fault is None or fault.error_code is None:
                self._append_produce(node, request, None)
            out = conn.skip_response(header.correlation_id)
        else:
            body = await getattr(self, f"_{key.name.lower()}")(node, request, fault.error_code if fault else None)
            if fault is not None and fault.throttle_ms:
                body = dataclasses.replace(body, throttle_time_ms=fault.throttle_ms)
            out = conn.send_response(header.correlation_id, body)
        if out:
            async with lock:
                try:
                    await stream.send_all(out)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    def _fault_for(self, key: ApiKey, node: int) -> Fault | None:
        for fault in self.faults:
            if fault.api_key == key and (fault.node is None or fault.node == node) and fault.hits < fault.count:
                fault.hits += 1
                return fault
        return None

    # -- APIs -----------------------------------------------------------------------------------

    async def _api_versions(self, node: int, request: Any, error: int | None) -> ApiVersionsResponse:
        return ApiVersionsResponse(error or NONE.code, software_version=f"fake-{node}")

    async def _list_groups(self, node: int, request: Any, error: int | None) -> ListGroupsResponse:
        return ListGroupsResponse(error or NONE.code)  # no groups in the fake cluster

    async def _metadata(self, node: int, request: Any, error: int | None) -> MetadataResponse:
        names = list(self.topics) if request.topics is None else request.topics
        topics = []
        for name in names:
            t = self.topics.get(name)
            if t is None and request.allow_auto_topic_creation and self.auto_create_partitions:
                self.create_topic(name, self.auto_create_partitions)
                t = self.topics[name]
            if t is None:
                topics.append(TopicMetadata(UNKNOWN_TOPIC_OR_PARTITION.code, name))
                continue
            parts = [PartitionMetadata(0, p, t.leaders[p], log.leader_epoch, [t.leaders[p]], [t.leaders[p]])
                     for p, log in enumerate(t.partitions)]
            topics.append(TopicMetadata(0, name, parts))
        brokers = [BrokerMetadata(n, HOST, self.ports[n]) for n in self.node_ids]
        return MetadataResponse(brokers, self.cluster_id, self.controller, topics)

    async def _find_coordinator(self, node: int, request: Any, error: int | None) -> FindCoordinatorResponse:
        if error is not None:
            return FindCoordinatorResponse(error, error_message="fake says no")
        if request.key in self.group_offsets:
            return FindCoordinatorResponse(NONE.code, 0, HOST, self.ports[0])
        # no group coordinator here: as a cluster whose coordinator is down
        return FindCoordinatorResponse(COORDINATOR_NOT_AVAILABLE.code)

    async def _offset_fetch(self, node: int, request: Any, error: int | None) -> OffsetFetchResponse:
        """The offsets of ``group_offsets`` (every committed partition when no topics are named)."""
        committed = self.group_offsets[request.group_id]
        wanted = sorted(committed) if request.topics is None else \
            [(t.name, p) for t in request.topics for p in t.partition_indexes]
        by_topic: dict[str, list[OffsetFetchPartitionResponse]] = {}
        for topic, p in wanted:
            by_topic.setdefault(topic, []).append(OffsetFetchPartitionResponse(p, committed.get((topic, p), -1)))
        return OffsetFetchResponse(NONE.code, [OffsetFetchTopicResponse(t, ps) for t, ps in by_topic.items()])

    async def _init_producer_id(self, node: int, request: Any, error: int | None) -> InitProducerIdResponse:
        if error is not None:
            return InitProducerIdResponse(error)
        if request.producer_id != -1 or request.producer_epoch != -1:  # as the broker: no transactions
            return InitProducerIdResponse(INVALID_REQUEST.code, error_message="names an existing producer id")
        self.next_producer_id += 1
        return InitProducerIdResponse(NONE.code, self.next_producer_id - 1, 0)

    async def _produce(self, node: int, request: Any, error: int | None) -> ProduceResponse:
        return self._append_produce(node, request, error)

    def _append_produce(self, node: int, request: Any, error: int | None) -> ProduceResponse:
        out = []
        for t in request.topic_data:
            parts = []
            for p in t.partition_data:
                code, base = self._produce_one(node, t.name, p.index, p.records, error)
                parts.append(PartitionProduceResponse(p.index, code, base))
            out.append(TopicProduceResponse(t.name, parts))
        if any(p.error_code == NONE.code for t in out for p in t.partition_responses):
            self._notify()
        return ProduceResponse(out)

    def _produce_one(self, node: int, topic: str, partition: int, records: bytes,
                     error: int | None) -> tuple[int, int]:
        if error is not None:
            return error, -1
        t = self.topics.get(topic)
        if t is None or not 0 <= partition < len(t.partitions):
            return UNKNOWN_TOPIC_OR_PARTITION.code, -1
        if t.leaders[partition] != node:
            return NOT_LEADER_OR_FOLLOWER.code, -1
        try:
            return NONE.code, t.partitions[partition].append(records)
        except TidelogError as e:
            return e.code, -1

    def _notify(self) -> None:
        data, self._data = self._data, trio.Event()
        data.set()

    async def _fetch(self, node: int, request: Any, error: int | None) -> FetchResponse:
        deadline = trio.current_time() + request.max_wait_ms / 1000
        while True:
            response, size = self._fetch_once(node, request, error)
            if size >= request.min_bytes or trio.current_time() >= deadline or error is not None \
                    or any(p.error_code for t in response.responses for p in t.partitions):
                return response
            with trio.move_on_at(deadline):
                await self._data.wait()

    def _fetch_once(self, node: int, request: Any, error: int | None) -> tuple[FetchResponse, int]:
        out, size = [], 0
        for t in request.topics:
            parts = []
            for p in t.partitions:
                r = self._fetch_partition(node, t.topic, p, error)
                size += len(r.records or b"")
                parts.append(r)
            out.append(FetchTopicResponse(t.topic, parts))
        return FetchResponse(out), size

    def _fetch_partition(self, node: int, topic: str, p: Any, error: int | None) -> FetchPartitionResponse:
        if error is not None:
            return FetchPartitionResponse(p.partition, error)
        t = self.topics.get(topic)
        if t is None or not 0 <= p.partition < len(t.partitions):
            return FetchPartitionResponse(p.partition, UNKNOWN_TOPIC_OR_PARTITION.code)
        if t.leaders[p.partition] != node:
            return FetchPartitionResponse(p.partition, NOT_LEADER_OR_FOLLOWER.code)
        log = t.partitions[p.partition]
        hw = log.log_end_offset
        if not log.log_start_offset <= p.fetch_offset <= hw:
            return FetchPartitionResponse(p.partition, OFFSET_OUT_OF_RANGE.code, hw, log.log_start_offset)
        return FetchPartitionResponse(p.partition, NONE.code, hw, log.log_start_offset,
                                      log.read(p.fetch_offset, p.partition_max_bytes) or None)

    async def _list_offsets(self, node: int, request: Any, error: int | None) -> ListOffsetsResponse:
        out = []
        for t in request.topics:
            parts = []
            for p in t.partitions:
                parts.append(self._list_offset(node, t.name, p, error))
            out.append(ListOffsetsTopicResponse(t.name, parts))
        return ListOffsetsResponse(out)

    def _list_offset(self, node: int, topic: str, p: Any, error: int | None) -> ListOffsetsPartitionResponse:
        if error is not None:
            return ListOffsetsPartitionResponse(p.partition_index, error)
        t = self.topics.get(topic)
        if t is None or not 0 <= p.partition_index < len(t.partitions):
            return ListOffsetsPartitionResponse(p.partition_index, UNKNOWN_TOPIC_OR_PARTITION.code)
        if t.leaders[p.partition_index] != node:
            return ListOffsetsPartitionResponse(p.partition_index, NOT_LEADER_OR_FOLLOWER.code)
        log = t.partitions[p.partition_index]
        if p.timestamp == -2:
            offset, ts = log.log_start_offset, -1
        elif p.timestamp == -1:
            offset, ts = log.log_end_offset, -1
        else:
            offset, ts = log.offset_for_time(p.timestamp)
        return ListOffsetsPartitionResponse(p.partition_index, 0, ts, offset, log.leader_epoch)

    def _not_controller(self, node: int) -> bool:
        return node != self.controller

    async def _create_topics(self, node: int, request: Any, error: int | None) -> CreateTopicsResponse:
        out = []
        for t in request.topics:
            code = error if error is not None else (NOT_CONTROLLER.code if self._not_controller(node) else 0)
            if code == 0 and t.name in self.topics:
                code = TOPIC_ALREADY_EXISTS.code
            if code == 0 and not request.validate_only:
                n = t.num_partitions if t.num_partitions > 0 else 1
                leaders = None
                if t.assignments:
                    n = len(t.assignments)
                    leaders = [t.assignments[str(p)][0] for p in range(n)]
                self.create_topic(t.name, n, leaders)
                self.topics[t.name].configs.update(t.configs)
            out.append(TopicResult(t.name, code, None if code == 0 else "fake says no"))
        return CreateTopicsResponse(out)

    async def _delete_topics(self, node: int, request: Any, error: int | None) -> DeleteTopicsResponse:
        out = []
        for name in request.topic_names:
            code = error if error is not None else (NOT_CONTROLLER.code if self._not_controller(node) else 0)
            if code == 0 and name not in self.topics:
                code = UNKNOWN_TOPIC_OR_PARTITION.code
            if code == 0:
                del self.topics[name]
            out.append(TopicResult(name, code))
        return DeleteTopicsResponse(out)

    async def _create_partitions(self, node: int, request: Any, error: int | None) -> CreatePartitionsResponse:
        out = []
        for t in request.topics:
            code = error if error is not None else (NOT_CONTROLLER.code if self._not_controller(node) else 0)
            topic = self.topics.get(t.name)
            if code == 0 and topic is None:
                code = UNKNOWN_TOPIC_OR_PARTITION.code
            elif code == 0 and t.count <= len(topic.partitions):
                code = INVALID_PARTITIONS.code
            if code == 0 and not request.validate_only:
                for p in range(len(topic.partitions), t.count):
                    topic.partitions.append(PartitionLog())
                    topic.leaders.append(self.node_ids[p % len(self.node_ids)])
            out.append(TopicResult(t.name, code))
        return CreatePartitionsResponse(out)

    async def _elect_leaders(self, node: int, request: Any, error: int | None) -> ElectLeadersResponse:
        """No election is ever needed here. As Kafka's broker: NOT_CONTROLLER per partition
        (of a null list, each partition of the fake), another error for the request too."""
        code = error or (NOT_CONTROLLER.code if self._not_controller(node) else ELECTION_NOT_NEEDED.code)
        named = [(r.topic_name, r.partition_index) for r in request.topic_partitions] \
            if request.topic_partitions is not None else \
            [(t, p) for t, topic in self.topics.items() for p in range(len(topic.partitions))]
        if request.topic_partitions is None and code == ELECTION_NOT_NEEDED.code:
            named = []  # of all partitions, only those elected or that failed are answered (KIP-460)
        return ElectLeadersResponse(NONE.code if code in (NOT_CONTROLLER.code, ELECTION_NOT_NEEDED.code) else code,
                                    [ElectLeadersResult(t, p, code) for t, p in named])

    async def _alter_partition_reassignments(self, node: int, request: Any, error: int | None
                                             ) -> AlterPartitionReassignmentsResponse:
        return AlterPartitionReassignmentsResponse(
            error or (NOT_CONTROLLER.code if self._not_controller(node) else NONE.code), "fake says no")

    async def _list_partition_reassignments(self, node: int, request: Any, error: int | None
                                            ) -> ListPartitionReassignmentsResponse:
        return ListPartitionReassignmentsResponse(
            error or (NOT_CONTROLLER.code if self._not_controller(node) else NONE.code), "fake says no")

    async def _describe_configs(self, node: int, request: Any, error: int | None) -> DescribeConfigsResponse:
        out = []
        for r in request.resources:
            topic = self.topics.get(r.resource_name)
            if topic is None:
                out.append(DescribeConfigsResult(UNKNOWN_TOPIC_OR_PARTITION.code, r.resource_type, r.resource_name))
                continue
            configs = {"retention.ms": "604800000", **topic.configs}
            entries = [ConfigEntry(k, v, is_default=k not in topic.configs) for k, v in sorted(configs.items())
                       if r.configuration_keys is None or k in r.configuration_keys]
            out.append(DescribeConfigsResult(0, r.resource_type, r.resource_name, entries))
        return DescribeConfigsResponse(out)

    async def _describe_log_dirs(self, node: int, request: Any, error: int | None) -> DescribeLogDirsResponse:
        """The partitions this node leads (the fake's only replicas), in one log dir."""
        if error is not None:
            return DescribeLogDirsResponse(error)
        topics = []
        for name, t in sorted(self.topics.items()):
            parts = [DescribeLogDirsPartition(p, sum(len(d) for _, d in log.batches), 0, False, log.log_start_offset,
                                              log.log_end_offset, log.log_end_offset)
                     for p, log in enumerate(t.partitions) if t.leaders[p] == node]
            if parts:
                topics.append(DescribeLogDirsTopic(name, parts))
        return DescribeLogDirsResponse(0, [DescribeLogDirsResult(0, f"/fake/{node}", topics, 1000, 500)])

    async def _alter_configs(self, node: int, request: Any, error: int | None) -> AlterConfigsResponse:
        out = []
        for r in request.resources:
            code = error if error is not None else (NOT_CONTROLLER.code if self._not_controller(node) else 0)
            topic = self.topics.get(r.resource_name)
            if code == 0 and topic is None:
                code = UNKNOWN_TOPIC_OR_PARTITION.code
            if code == 0 and not request.validate_only:
                for k, v in r.configs.items():
                    if v is None:
                        topic.configs.pop(k, None)
                    else:
                        topic.configs[k] = v
            out.append(AlterConfigsResult(code, r.resource_type, r.resource_name))
        return AlterConfigsResponse(out)
