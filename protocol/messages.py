"""Typed message bodies: one frozen dataclass per request and per response of every API.

Field names follow Kafka's JSON message schemas in snake_case; the codec
(``protocol.codec``) validates and encodes them from their annotations. Which API uses which
pair, and at which versions, is the registry's (``protocol.apis``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tidelog.protocol.codec import INT8, INT16, INT32, INT64, Message

# ---------------------------------------------------------------------------------------------
# ApiVersions (key 18): the first request a client sends, to learn which versions to speak


@dataclass(frozen=True, slots=True)
class ApiVersionsRequest(Message):
    client_software_name: str = ""
    client_software_version: str = ""


@dataclass(frozen=True, slots=True)
class ApiVersion(Message):
    api_key: int = field(metadata=INT16)
    min_version: int = field(metadata=INT16)
    max_version: int = field(metadata=INT16)


@dataclass(frozen=True, slots=True)
class ApiVersionsResponse(Message):
    error_code: int = field(metadata=INT16)
    api_keys: list[ApiVersion] = field(default_factory=list)
    throttle_time_ms: int = field(default=0, metadata=INT32)



# ---------------------------------------------------------------------------------------------
# Cluster metadata and administration. Field names follow Kafka's JSON schemas in snake_case.

NO_LEADER = -1
TOPIC_RESOURCE = 2  # DescribeConfigs / AlterConfigs resource types, as in Kafka
BROKER_RESOURCE = 4


@dataclass(frozen=True, slots=True)
class MetadataRequest(Message):
    topics: list[str] | None = None  # None: every topic
    allow_auto_topic_creation: bool = False


@dataclass(frozen=True, slots=True)
class BrokerMetadata(Message):
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionMetadata(Message):
    error_code: int
    partition_index: int
    leader_id: int
    leader_epoch: int
    replica_nodes: list[int]
    isr_nodes: list[int]
    offline_replicas: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TopicMetadata(Message):
    error_code: int
    name: str
    partitions: list[PartitionMetadata] = field(default_factory=list)
    is_internal: bool = False
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class MetadataResponse(Message):
    brokers: list[BrokerMetadata]
    cluster_id: str | None
    controller_id: int
    topics: list[TopicMetadata]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class CreatableTopic(Message):
    name: str
    num_partitions: int = -1  # -1: the broker's num.partitions
    replication_factor: int = -1  # -1: the broker's default.replication.factor
    assignments: dict[str, list[int]] | None = None  # partition ("0") -> replicas; overrides the two above
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest(Message):
    topics: list[CreatableTopic]
    timeout_ms: int = 30000
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class TopicResult(Message):
    """The per-topic outcome of CreateTopics, DeleteTopics and CreatePartitions."""
    name: str
    error_code: int
    error_message: str | None = None
    num_partitions: int = -1
    replication_factor: int = -1


@dataclass(frozen=True, slots=True)
class CreateTopicsResponse(Message):
    topics: list[TopicResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class DeleteTopicsRequest(Message):
    topic_names: list[str]
    timeout_ms: int = 30000


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse(Message):
    responses: list[TopicResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopic(Message):
    name: str
    count: int  # the new total number of partitions
    assignments: list[list[int]] | None = None  # replicas of each new partition


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest(Message):
    topics: list[CreatePartitionsTopic]
    timeout_ms: int = 30000
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class CreatePartitionsResponse(Message):
    results: list[TopicResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class DescribeConfigsResource(Message):
    resource_type: int
    resource_name: str
    configuration_keys: list[str] | None = None  # None: all


@dataclass(frozen=True, slots=True)
class DescribeConfigsRequest(Message):
    resources: list[DescribeConfigsResource]


@dataclass(frozen=True, slots=True)
class ConfigEntry(Message):
    name: str
    value: str | None
    read_only: bool = False
    is_default: bool = True
    is_sensitive: bool = False


@dataclass(frozen=True, slots=True)
class DescribeConfigsResult(Message):
    error_code: int
    resource_type: int
    resource_name: str
    configs: list[ConfigEntry] = field(default_factory=list)
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DescribeConfigsResponse(Message):
    results: list[DescribeConfigsResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class AlterConfigsResource(Message):
    """Incremental: each key is set to its value; a None value removes the override."""
    resource_type: int
    resource_name: str
    configs: dict[str, str | None]


@dataclass(frozen=True, slots=True)
class AlterConfigsRequest(Message):
    resources: list[AlterConfigsResource]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class AlterConfigsResult(Message):
    error_code: int
    resource_type: int
    resource_name: str
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterConfigsResponse(Message):
    responses: list[AlterConfigsResult]
    throttle_time_ms: int = 0


# ---------------------------------------------------------------------------------------------
# Data: Produce, Fetch, ListOffsets, OffsetsForLeaderEpoch. Record sets travel as ``bytes``:
# back-to-back record batches (protocol.records), never decoded by the broker.

ACKS_ALL = -1
CONSUMER_REPLICA_ID = -1
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3


@dataclass(frozen=True, slots=True)
class PartitionProduceData(Message):
    index: int = field(metadata=INT32)
    records: bytes


@dataclass(frozen=True, slots=True)
class TopicProduceData(Message):
    name: str
    partition_data: list[PartitionProduceData]


@dataclass(frozen=True, slots=True)
class ProduceRequest(Message):
    acks: int = field(metadata=INT16)
    timeout_ms: int = field(metadata=INT32)
    topic_data: list[TopicProduceData]
    transactional_id: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionProduceResponse(Message):
    index: int
    error_code: int
    base_offset: int = -1
    log_append_time_ms: int = -1
    log_start_offset: int = -1
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class TopicProduceResponse(Message):
    name: str
    partition_responses: list[PartitionProduceResponse]


@dataclass(frozen=True, slots=True)
class ProduceResponse(Message):
    responses: list[TopicProduceResponse]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class FetchPartition(Message):
    partition: int = field(metadata=INT32)
    fetch_offset: int = field(metadata=INT64)
    partition_max_bytes: int = field(default=1 << 20, metadata=INT32)
    current_leader_epoch: int = -1  # the fetcher's view; stale views are fenced
    last_fetched_epoch: int = -1  # followers: epoch of the last batch they hold
    log_start_offset: int = -1  # followers: their log start offset


@dataclass(frozen=True, slots=True)
class FetchTopic(Message):
    topic: str
    partitions: list[FetchPartition]


@dataclass(frozen=True, slots=True)
class FetchRequest(Message):
    topics: list[FetchTopic]
    replica_id: int = CONSUMER_REPLICA_ID  # a broker id for follower fetches
    max_wait_ms: int = field(default=500, metadata=INT32)
    min_bytes: int = field(default=1, metadata=INT32)
    max_bytes: int = field(default=50 << 20, metadata=INT32)
    isolation_level: int = 0
    replica_epoch: int = -1  # followers: their broker epoch


@dataclass(frozen=True, slots=True)
class EpochEndOffset(Message):
    epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class FetchPartitionResponse(Message):
    partition_index: int
    error_code: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes | None = None
    diverging_epoch: EpochEndOffset | None = None  # followers: truncate to this first
    current_leader_epoch: int = -1
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class FetchTopicResponse(Message):
    topic: str
    partitions: list[FetchPartitionResponse]


@dataclass(frozen=True, slots=True)
class FetchResponse(Message):
    responses: list[FetchTopicResponse]
    error_code: int = 0
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition(Message):
    partition_index: int
    timestamp: int  # -2 earliest, -1 latest (the HW for consumers), -3 max timestamp, else ms
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ListOffsetsTopic(Message):
    name: str
    partitions: list[ListOffsetsPartition]


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(Message):
    topics: list[ListOffsetsTopic]
    replica_id: int = CONSUMER_REPLICA_ID
    isolation_level: int = 0


@dataclass(frozen=True, slots=True)
class ListOffsetsPartitionResponse(Message):
    partition_index: int
    error_code: int
    timestamp: int = -1
    offset: int = -1
    leader_epoch: int = -1
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ListOffsetsTopicResponse(Message):
    name: str
    partitions: list[ListOffsetsPartitionResponse]


@dataclass(frozen=True, slots=True)
class ListOffsetsResponse(Message):
    topics: list[ListOffsetsTopicResponse]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class DeleteRecordsPartition(Message):
    partition_index: int = field(metadata=INT32)
    offset: int = field(metadata=INT64)  # the new log start offset; -1: the high watermark


@dataclass(frozen=True, slots=True)
class DeleteRecordsTopic(Message):
    name: str
    partitions: list[DeleteRecordsPartition]


@dataclass(frozen=True, slots=True)
class DeleteRecordsRequest(Message):
    topics: list[DeleteRecordsTopic]
    timeout_ms: int = 30000  # how long to wait for every live in-sync replica to follow


@dataclass(frozen=True, slots=True)
class DeleteRecordsPartitionResult(Message):
    partition_index: int
    error_code: int
    low_watermark: int = -1  # the smallest log start offset of the replicas
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteRecordsTopicResult(Message):
    name: str
    partitions: list[DeleteRecordsPartitionResult]


@dataclass(frozen=True, slots=True)
class DeleteRecordsResponse(Message):
    topics: list[DeleteRecordsTopicResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class OffsetForLeaderPartition(Message):
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class OffsetForLeaderTopic(Message):
    topic: str
    partitions: list[OffsetForLeaderPartition]


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochRequest(Message):
    topics: list[OffsetForLeaderTopic]
    replica_id: int = CONSUMER_REPLICA_ID


@dataclass(frozen=True, slots=True)
class EpochEndOffsetResult(Message):
    partition: int
    error_code: int
    leader_epoch: int = -1
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class OffsetForLeaderTopicResult(Message):
    topic: str
    partitions: list[EpochEndOffsetResult]


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochResponse(Message):
    topics: list[OffsetForLeaderTopicResult]
    throttle_time_ms: int = 0


# ---------------------------------------------------------------------------------------------
# Controller to broker (and broker to controller). Every request carries the controller epoch
# (a broker ignores a stale controller) and the target's broker epoch (a request meant for an
# earlier incarnation of a broker is refused).


@dataclass(frozen=True, slots=True)
class PartitionState(Message):
    topic_name: str
    partition_index: int
    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: list[int]
    zk_version: int
    replicas: list[int]
    is_new: bool = False
    offline_replicas: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LiveBroker(Message):
    broker_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True, slots=True)
class LeaderAndIsrRequest(Message):
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: list[PartitionState]
    live_leaders: list[LiveBroker] = field(default_factory=list)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)  # topic-level overrides


@dataclass(frozen=True, slots=True)
class PartitionError(Message):
    topic_name: str
    partition_index: int
    error_code: int


@dataclass(frozen=True, slots=True)
class LeaderAndIsrResponse(Message):
    error_code: int
    partition_errors: list[PartitionError] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class UpdateMetadataRequest(Message):
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partition_states: list[PartitionState]
    live_brokers: list[LiveBroker]
    deleted_topics: list[str] = field(default_factory=list)
    cluster_id: str | None = None
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)  # topic-level overrides


@dataclass(frozen=True, slots=True)
class UpdateMetadataResponse(Message):
    error_code: int


@dataclass(frozen=True, slots=True)
class StopReplicaPartition(Message):
    topic_name: str
    partition_index: int
    leader_epoch: int = -1
    delete_partition: bool = False


@dataclass(frozen=True, slots=True)
class StopReplicaRequest(Message):
    controller_id: int
    controller_epoch: int
    broker_epoch: int
    partitions: list[StopReplicaPartition]


@dataclass(frozen=True, slots=True)
class StopReplicaResponse(Message):
    error_code: int
    partition_errors: list[PartitionError] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ControlledShutdownRequest(Message):
    broker_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class TopicPartitionRef(Message):
    topic_name: str
    partition_index: int


@dataclass(frozen=True, slots=True)
class ControlledShutdownResponse(Message):
    error_code: int
    remaining_partitions: list[TopicPartitionRef] = field(default_factory=list)


PREFERRED_ELECTION = 0
DEBUGGING_REPLICA_ID = -2  # ListOffsets "latest" then means the log end offset, not the HW


@dataclass(frozen=True, slots=True)
class ElectLeadersRequest(Message):
    """Move leadership to the preferred (first assigned) replica; None: every partition."""
    topic_partitions: list[TopicPartitionRef] | None = None
    election_type: int = PREFERRED_ELECTION
    timeout_ms: int = 30000


@dataclass(frozen=True, slots=True)
class ElectLeadersResult(Message):
    topic_name: str
    partition_index: int
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ElectLeadersResponse(Message):
    error_code: int
    results: list[ElectLeadersResult] = field(default_factory=list)



# ---------------------------------------------------------------------------------------------
# Consumer groups (keys 8-16, 42) and the idempotent producer (22). Field names are Kafka's
# JSON schema names in snake_case. Member metadata and assignments are opaque bytes to the
# coordinator: the client's assignor encodes and decodes them (client/aio/assignors.py).

GROUP_KEY = 0  # FindCoordinator key types, as in Kafka
TRANSACTION_KEY = 1
UNKNOWN_MEMBER = ""  # member_id of a member joining for the first time
NO_GENERATION = -1
NO_OFFSET = -1  # OffsetFetch: nothing committed for the partition


@dataclass(frozen=True, slots=True)
class FindCoordinatorRequest(Message):
    key: str
    key_type: int = field(default=GROUP_KEY, metadata=INT8)


@dataclass(frozen=True, slots=True)
class FindCoordinatorResponse(Message):
    error_code: int
    node_id: int = -1
    host: str = ""
    port: int = -1
    error_message: str | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class JoinGroupProtocol(Message):
    name: str
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupRequest(Message):
    group_id: str
    session_timeout_ms: int = field(metadata=INT32)
    member_id: str
    protocol_type: str
    protocols: list[JoinGroupProtocol]
    rebalance_timeout_ms: int = field(default=-1, metadata=INT32)  # -1: the session timeout
    group_instance_id: str | None = None  # static membership
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JoinGroupMember(Message):
    member_id: str
    metadata: bytes
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class JoinGroupResponse(Message):
    error_code: int
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[JoinGroupMember] = field(default_factory=list)  # only for the leader
    skip_assignment: bool = False
    error_message: str | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class SyncGroupAssignment(Message):
    member_id: str
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncGroupRequest(Message):
    group_id: str
    generation_id: int = field(metadata=INT32)
    member_id: str
    assignments: list[SyncGroupAssignment] = field(default_factory=list)  # only the leader's
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class SyncGroupResponse(Message):
    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None
    error_message: str | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class HeartbeatRequest(Message):
    group_id: str
    generation_id: int = field(metadata=INT32)
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResponse(Message):
    error_code: int
    error_message: str | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class MemberIdentity(Message):
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest(Message):
    group_id: str
    members: list[MemberIdentity]


@dataclass(frozen=True, slots=True)
class MemberResponse(Message):
    member_id: str
    error_code: int
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse(Message):
    error_code: int
    members: list[MemberResponse] = field(default_factory=list)
    error_message: str | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class OffsetCommitPartition(Message):
    partition_index: int = field(metadata=INT32)
    committed_offset: int = field(metadata=INT64)
    committed_leader_epoch: int = field(default=-1, metadata=INT32)
    committed_metadata: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitTopic(Message):
    name: str
    partitions: list[OffsetCommitPartition]


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest(Message):
    """generation_id -1 with member_id "": a commit outside group management (allowed only
    while the group has no members, as in Kafka)."""
    group_id: str
    topics: list[OffsetCommitTopic]
    generation_id: int = field(default=NO_GENERATION, metadata=INT32)
    member_id: str = UNKNOWN_MEMBER
    group_instance_id: str | None = None
    retention_time_ms: int = -1


@dataclass(frozen=True, slots=True)
class OffsetCommitPartitionResponse(Message):
    partition_index: int
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitTopicResponse(Message):
    name: str
    partitions: list[OffsetCommitPartitionResponse]


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse(Message):
    topics: list[OffsetCommitTopicResponse]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class OffsetFetchTopic(Message):
    name: str
    partition_indexes: list[int]


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest(Message):
    """topics None: every partition the group has committed offsets for."""
    group_id: str
    topics: list[OffsetFetchTopic] | None = None
    require_stable: bool = False


@dataclass(frozen=True, slots=True)
class OffsetFetchPartitionResponse(Message):
    partition_index: int
    committed_offset: int = NO_OFFSET
    committed_leader_epoch: int = -1
    metadata: str | None = None
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class OffsetFetchTopicResponse(Message):
    name: str
    partitions: list[OffsetFetchPartitionResponse]


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse(Message):
    error_code: int
    topics: list[OffsetFetchTopicResponse] = field(default_factory=list)
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class ListGroupsRequest(Message):
    states_filter: list[str] = field(default_factory=list)  # empty: every state


@dataclass(frozen=True, slots=True)
class ListedGroup(Message):
    group_id: str
    protocol_type: str
    group_state: str = ""


@dataclass(frozen=True, slots=True)
class ListGroupsResponse(Message):
    error_code: int
    groups: list[ListedGroup] = field(default_factory=list)
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class DescribeGroupsRequest(Message):
    groups: list[str]


@dataclass(frozen=True, slots=True)
class DescribedGroupMember(Message):
    member_id: str
    client_id: str
    client_host: str
    member_metadata: bytes
    member_assignment: bytes
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class DescribedGroup(Message):
    """group_state: Empty, PreparingRebalance, CompletingRebalance, Stable or Dead (Kafka's)."""
    error_code: int
    group_id: str
    group_state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""  # the chosen protocol (assignor) name
    members: list[DescribedGroupMember] = field(default_factory=list)
    generation_id: int = NO_GENERATION
    leader: str = ""
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse(Message):
    groups: list[DescribedGroup]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class DeleteGroupsRequest(Message):
    groups_names: list[str]


@dataclass(frozen=True, slots=True)
class DeletableGroupResult(Message):
    group_id: str
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse(Message):
    results: list[DeletableGroupResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest(Message):
    """A new idempotent producer asks for an id (producer_id -1), or an existing one for a new
    epoch of its id (after a fatal sequence error)."""
    transactional_id: str | None = None
    transaction_timeout_ms: int = field(default=60000, metadata=INT32)
    producer_id: int = field(default=-1, metadata=INT64)
    producer_epoch: int = field(default=-1, metadata=INT16)


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse(Message):
    error_code: int
    producer_id: int = -1
    producer_epoch: int = -1
    error_message: str | None = None
    throttle_time_ms: int = 0
