"""Typed message bodies: one frozen dataclass per request and per response of every API.

Field names follow Kafka's JSON message schemas in snake_case; the codec
(``protocol.codec``) validates and encodes them from their annotations. Which API uses which
pair, and at which versions, is the registry's (``protocol.apis``).

Validation here is what needs no broker state, so a request that fails it is refused with
INVALID_REQUEST (naming the field) before anything is done:

* every integer of a request has Kafka's type as its range (``INT8`` .. ``INT64``), narrowed
  where a negative value means nothing: partitions, counts, sizes and timeouts are
  ``NON_NEGATIVE`` int32 (a negative ``timeout_ms`` is refused, not waited for after the work
  is done); ``retention_time_ms`` is -1 (the broker's default) or a non-negative int64;
* a CreateTopics assignment is keyed by partition numbers ("0", "1", ...);
* the controller's requests (LeaderAndIsr, UpdateMetadata, StopReplica) carry only valid
  topic names (``protocol.topics``): they become directory names. Client requests keep a
  per-topic answer instead (INVALID_TOPIC_EXCEPTION or UNKNOWN_TOPIC_OR_PARTITION, from the
  broker), as in Kafka.

Limits that depend on configuration (partitions per topic and per request, what ZooKeeper can
store, topic config minimums) are the broker's (``broker/controller/validation.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from tidelog.protocol.codec import INT8, INT16, INT32, INT64, Message
from tidelog.protocol.topics import MAX_PARTITION, topic_name_problem

# int32 without its negatives: partition numbers, counts, byte sizes, timeouts
NON_NEGATIVE = MappingProxyType({"min": 0, "max": (1 << 31) - 1})
PORT = MappingProxyType({"min": 0, "max": 65535})
RETENTION = MappingProxyType({"min": -1, "max": (1 << 63) - 1})  # -1: the broker's default


def _check_topic_names(names, where: str) -> None:
    """ValueError naming the first invalid topic name of ``names`` (a request field)."""
    for name in names:
        problem = topic_name_problem(name)
        if problem is not None:
            raise ValueError(f"{where}: {problem}")


def _is_partition_key(key: str) -> bool:
    """A CreateTopics assignment key: a partition number in canonical decimal form."""
    return (key.isascii() and key.isdigit() and (key == "0" or key[0] != "0") and len(key) <= 10
            and int(key) <= MAX_PARTITION)

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
    software_version: str | None = None  # Tidelog's: the broker's installed version (not on a Kafka listener)


# SASL (Kafka's keys 17 and 36): on a SASL listener, the only requests served before
# authentication completes, besides ApiVersions (broker/security/sasl.py).

@dataclass(frozen=True, slots=True)
class SaslHandshakeRequest(Message):
    mechanism: str


@dataclass(frozen=True, slots=True)
class SaslHandshakeResponse(Message):
    error_code: int = field(metadata=INT16)
    mechanisms: list[str] = field(default_factory=list)
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class SaslAuthenticateRequest(Message):
    auth_bytes: bytes


@dataclass(frozen=True, slots=True)
class SaslAuthenticateResponse(Message):
    error_code: int = field(metadata=INT16)
    error_message: str | None = None
    auth_bytes: bytes = b""
    session_lifetime_ms: int = field(default=0, metadata=INT64)


# ---------------------------------------------------------------------------------------------
# Cluster metadata and administration. Field names follow Kafka's JSON schemas in snake_case.

NO_LEADER = -1
TOPIC_RESOURCE = 2  # DescribeConfigs / AlterConfigs resource types, as in Kafka
BROKER_RESOURCE = 4
# Kafka's ConfigSource: where a described config value comes from (``ConfigEntry.source``)
TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 3, 4, 5


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
    num_partitions: int = field(default=-1, metadata=INT32)  # -1: the broker's num.partitions
    replication_factor: int = field(default=-1, metadata=INT16)  # -1: the broker's default.replication.factor
    # partition ("0") -> replicas; overrides the two above
    assignments: dict[str, list[int]] | None = field(default=None, metadata=INT32)
    # a null value is Kafka's CreateTopics asking nothing for the key: the topic is refused
    # (INVALID_CONFIG), not the request
    configs: dict[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in self.assignments or ():
            if not _is_partition_key(key):
                raise ValueError(f"assignments: key {key[:40]!r} is not a partition number "
                                 f"(0 to {MAX_PARTITION} in decimal)")


@dataclass(frozen=True, slots=True)
class CreateTopicsRequest(Message):
    topics: list[CreatableTopic]
    timeout_ms: int = field(default=30000, metadata=NON_NEGATIVE)
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
    timeout_ms: int = field(default=30000, metadata=NON_NEGATIVE)


@dataclass(frozen=True, slots=True)
class DeleteTopicsResponse(Message):
    responses: list[TopicResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class CreatePartitionsTopic(Message):
    name: str
    count: int = field(metadata=INT32)  # the new total number of partitions
    assignments: list[list[int]] | None = field(default=None, metadata=INT32)  # replicas of each new partition


@dataclass(frozen=True, slots=True)
class CreatePartitionsRequest(Message):
    topics: list[CreatePartitionsTopic]
    timeout_ms: int = field(default=30000, metadata=NON_NEGATIVE)
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class CreatePartitionsResponse(Message):
    results: list[TopicResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class DescribeConfigsResource(Message):
    resource_type: int = field(metadata=INT8)
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
    source: int | None = None  # Kafka's ConfigSource (TOPIC_CONFIG, ...); None from a broker not saying


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
    """Incremental: each key is set to its value; a None value removes the override. With
    ``replace`` (Kafka's legacy AlterConfigs, as its listener asks) the resource's overrides
    become exactly ``configs``: a key left out is removed, and a None value is refused."""
    resource_type: int = field(metadata=INT8)
    resource_name: str
    configs: dict[str, str | None]
    replace: bool = False


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


# DescribeLogDirs (Kafka's key 35): each broker describes its own replicas, log dir by log
# dir. Kafka's fields (partition_size, offset_lag: the HW minus the replica's LEO, never
# negative) plus Tidelog's log_start_offset, log_end_offset and high_watermark as this
# broker holds them, so a tool can draw every replica of a partition on one offset axis.


@dataclass(frozen=True, slots=True)
class DescribableLogDirTopic(Message):
    topic: str
    partitions: list[int]


@dataclass(frozen=True, slots=True)
class DescribeLogDirsRequest(Message):
    """None: every replica this broker holds."""
    topics: list[DescribableLogDirTopic] | None = None


@dataclass(frozen=True, slots=True)
class DescribeLogDirsPartition(Message):
    partition_index: int = field(metadata=INT32)
    partition_size: int = field(metadata=INT64)
    offset_lag: int = field(metadata=INT64)
    is_future_key: bool = False
    log_start_offset: int = field(default=-1, metadata=INT64)
    log_end_offset: int = field(default=-1, metadata=INT64)
    high_watermark: int = field(default=-1, metadata=INT64)


@dataclass(frozen=True, slots=True)
class DescribeLogDirsTopic(Message):
    name: str
    partitions: list[DescribeLogDirsPartition] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DescribeLogDirsResult(Message):
    error_code: int
    log_dir: str
    topics: list[DescribeLogDirsTopic] = field(default_factory=list)
    total_bytes: int = field(default=-1, metadata=INT64)
    usable_bytes: int = field(default=-1, metadata=INT64)


@dataclass(frozen=True, slots=True)
class DescribeLogDirsResponse(Message):
    error_code: int = 0
    results: list[DescribeLogDirsResult] = field(default_factory=list)
    throttle_time_ms: int = 0


# ---------------------------------------------------------------------------------------------
# User and client-id entity configs (Kafka's keys 48 to 51): client quotas and SCRAM
# credentials, stored in ZooKeeper (broker/security/entity_configs.py). Quota values are
# float64, as in Kafka; an entity component's name None is the entity type's default.

QUOTA_MATCH_EXACT, QUOTA_MATCH_DEFAULT, QUOTA_MATCH_ANY = 0, 1, 2  # a filter component's match_type
SCRAM_MECHANISM_IDS = {"SCRAM-SHA-256": 1, "SCRAM-SHA-512": 2}  # Kafka's ScramMechanism types (0: unknown)


@dataclass(frozen=True, slots=True)
class ClientQuotaFilterComponent(Message):
    entity_type: str  # "user" or "client-id"
    match_type: int = field(metadata=INT8)
    match: str | None = None  # the name for QUOTA_MATCH_EXACT, else None


@dataclass(frozen=True, slots=True)
class DescribeClientQuotasRequest(Message):
    components: list[ClientQuotaFilterComponent]
    strict: bool = False  # only entities with exactly the filtered entity types


@dataclass(frozen=True, slots=True)
class ClientQuotaEntityData(Message):
    entity_type: str
    entity_name: str | None  # None: the default entity of the type


@dataclass(frozen=True, slots=True)
class ClientQuotaValue(Message):
    key: str
    value: float


@dataclass(frozen=True, slots=True)
class DescribeClientQuotasEntry(Message):
    entity: list[ClientQuotaEntityData]
    values: list[ClientQuotaValue]


@dataclass(frozen=True, slots=True)
class DescribeClientQuotasResponse(Message):
    error_code: int
    error_message: str | None = None
    entries: list[DescribeClientQuotasEntry] | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class ClientQuotaOp(Message):
    key: str
    value: float = 0.0
    remove: bool = False


@dataclass(frozen=True, slots=True)
class AlterClientQuotasEntry(Message):
    entity: list[ClientQuotaEntityData]
    ops: list[ClientQuotaOp]


@dataclass(frozen=True, slots=True)
class AlterClientQuotasRequest(Message):
    entries: list[AlterClientQuotasEntry]
    validate_only: bool = False


@dataclass(frozen=True, slots=True)
class AlterClientQuotasEntryResult(Message):
    error_code: int
    error_message: str | None
    entity: list[ClientQuotaEntityData]


@dataclass(frozen=True, slots=True)
class AlterClientQuotasResponse(Message):
    entries: list[AlterClientQuotasEntryResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class ScramUserName(Message):
    name: str


@dataclass(frozen=True, slots=True)
class DescribeUserScramCredentialsRequest(Message):
    users: list[ScramUserName] | None = None  # None: every user with a credential


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo(Message):
    mechanism: int = field(metadata=INT8)
    iterations: int = field(metadata=INT32)


@dataclass(frozen=True, slots=True)
class DescribeUserScramCredentialsResult(Message):
    user: str
    error_code: int
    error_message: str | None = None
    credential_infos: list[ScramCredentialInfo] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DescribeUserScramCredentialsResponse(Message):
    error_code: int
    error_message: str | None = None
    results: list[DescribeUserScramCredentialsResult] = field(default_factory=list)
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class ScramCredentialDeletion(Message):
    name: str
    mechanism: int = field(metadata=INT8)


@dataclass(frozen=True, slots=True)
class ScramCredentialUpsertion(Message):
    """The client salts the password (``salted_password`` is Hi(password, salt, iterations)
    of RFC 5802): the password itself never crosses the network."""
    name: str
    mechanism: int = field(metadata=INT8)
    iterations: int = field(metadata=INT32)
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsRequest(Message):
    deletions: list[ScramCredentialDeletion] = field(default_factory=list)
    upsertions: list[ScramCredentialUpsertion] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsResult(Message):
    user: str
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class AlterUserScramCredentialsResponse(Message):
    results: list[AlterUserScramCredentialsResult]
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
    timeout_ms: int = field(metadata=NON_NEGATIVE)
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
    partition_max_bytes: int = field(default=1 << 20, metadata=NON_NEGATIVE)
    current_leader_epoch: int = field(default=-1, metadata=INT32)  # the fetcher's view; stale views are fenced
    last_fetched_epoch: int = field(default=-1, metadata=INT32)  # followers: epoch of the last batch they hold
    log_start_offset: int = field(default=-1, metadata=INT64)  # followers: their log start offset


@dataclass(frozen=True, slots=True)
class FetchTopic(Message):
    topic: str
    partitions: list[FetchPartition]


@dataclass(frozen=True, slots=True)
class FetchRequest(Message):
    topics: list[FetchTopic]
    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=INT32)  # a broker id for follower fetches
    max_wait_ms: int = field(default=500, metadata=NON_NEGATIVE)
    min_bytes: int = field(default=1, metadata=INT32)
    max_bytes: int = field(default=50 << 20, metadata=NON_NEGATIVE)
    isolation_level: int = field(default=0, metadata=INT8)
    replica_epoch: int = field(default=-1, metadata=INT64)  # followers: their broker epoch


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
    # Tidelog's: the leader's ISR is below the partition's effective min ISR, so the high
    # watermark cannot move and records past it stay invisible until the ISR grows back
    high_watermark_held: bool = False


@dataclass(frozen=True, slots=True)
class FetchTopicResponse(Message):
    topic: str
    partitions: list[FetchPartitionResponse]


@dataclass(frozen=True, slots=True)
class FetchResponse(Message):
    responses: list[FetchTopicResponse]
    error_code: int = 0
    throttle_time_ms: int = 0


def fetch_answer_parts(answer: Any) -> Iterator[tuple[str, int, bytes | None]]:
    """``(topic, error code, records)`` of each partition of a fetch answer: the FetchResponse
    or its body (the broker's fetch handler answers with the body). Anything else (a whole
    request's error body, None) has none."""
    if isinstance(answer, dict):
        for t in answer.get("responses") or ():
            for p in t.get("partitions") or ():
                yield t["topic"], p.get("error_code", 0), p.get("records")
    else:
        for t in getattr(answer, "responses", None) or ():
            for p in t.partitions:
                yield t.topic, p.error_code, p.records


@dataclass(frozen=True, slots=True)
class ListOffsetsPartition(Message):
    partition_index: int = field(metadata=INT32)
    timestamp: int = field(metadata=INT64)  # -2 earliest, -1 latest (the HW for consumers), -3 max timestamp, else ms
    current_leader_epoch: int = field(default=-1, metadata=INT32)


@dataclass(frozen=True, slots=True)
class ListOffsetsTopic(Message):
    name: str
    partitions: list[ListOffsetsPartition]


@dataclass(frozen=True, slots=True)
class ListOffsetsRequest(Message):
    topics: list[ListOffsetsTopic]
    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=INT32)
    isolation_level: int = field(default=0, metadata=INT8)


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
    timeout_ms: int = field(default=30000, metadata=NON_NEGATIVE)  # how long to wait for every live in-sync replica


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
    partition: int = field(metadata=INT32)
    leader_epoch: int = field(metadata=INT32)
    current_leader_epoch: int = field(default=-1, metadata=INT32)


@dataclass(frozen=True, slots=True)
class OffsetForLeaderTopic(Message):
    topic: str
    partitions: list[OffsetForLeaderPartition]


@dataclass(frozen=True, slots=True)
class OffsetsForLeaderEpochRequest(Message):
    topics: list[OffsetForLeaderTopic]
    replica_id: int = field(default=CONSUMER_REPLICA_ID, metadata=INT32)


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
    partition_index: int = field(metadata=NON_NEGATIVE)
    controller_epoch: int = field(metadata=INT32)
    leader: int = field(metadata=INT32)
    leader_epoch: int = field(metadata=INT32)
    isr: list[int] = field(metadata=INT32)
    zk_version: int = field(metadata=INT32)
    replicas: list[int] = field(metadata=INT32)
    is_new: bool = False
    offline_replicas: list[int] = field(default_factory=list, metadata=INT32)
    adding_replicas: list[int] = field(default_factory=list, metadata=INT32)  # a reassignment's
    removing_replicas: list[int] = field(default_factory=list, metadata=INT32)

    def __post_init__(self) -> None:
        _check_topic_names((self.topic_name,), "topic_name")


@dataclass(frozen=True, slots=True)
class LiveBrokerEndpoint(Message):
    listener: str
    host: str
    port: int = field(metadata=PORT)


@dataclass(frozen=True, slots=True)
class LiveBroker(Message):
    """A live broker: its inter-broker address (host, port) and every advertised listener."""

    broker_id: int = field(metadata=INT32)
    host: str
    port: int = field(metadata=PORT)
    rack: str | None = None
    endpoints: list[LiveBrokerEndpoint] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LeaderAndIsrRequest(Message):
    controller_id: int = field(metadata=INT32)
    controller_epoch: int = field(metadata=INT32)
    broker_epoch: int = field(metadata=INT64)
    partition_states: list[PartitionState]
    live_leaders: list[LiveBroker] = field(default_factory=list)
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)  # topic-level overrides
    # Kafka's FULL type: the states name every partition assigned to the broker, which
    # deletes its logs of any other (replicas removed while it was down)
    full: bool = False

    def __post_init__(self) -> None:
        _check_topic_names(self.topic_configs, "topic_configs")


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
    controller_id: int = field(metadata=INT32)
    controller_epoch: int = field(metadata=INT32)
    broker_epoch: int = field(metadata=INT64)
    partition_states: list[PartitionState]
    live_brokers: list[LiveBroker]
    deleted_topics: list[str] = field(default_factory=list)
    cluster_id: str | None = None
    topic_configs: dict[str, dict[str, str]] = field(default_factory=dict)  # topic-level overrides
    # Kafka's FULL type: the states name every topic, and the broker drops from its metadata
    # any topic they do not name (deleted while it did not hear)
    full: bool = False

    def __post_init__(self) -> None:
        _check_topic_names(self.deleted_topics, "deleted_topics")
        _check_topic_names(self.topic_configs, "topic_configs")


@dataclass(frozen=True, slots=True)
class UpdateMetadataResponse(Message):
    error_code: int


@dataclass(frozen=True, slots=True)
class StopReplicaPartition(Message):
    topic_name: str
    partition_index: int = field(metadata=NON_NEGATIVE)
    leader_epoch: int = field(default=-1, metadata=INT32)
    delete_partition: bool = False

    def __post_init__(self) -> None:
        _check_topic_names((self.topic_name,), "topic_name")


@dataclass(frozen=True, slots=True)
class StopReplicaRequest(Message):
    controller_id: int = field(metadata=INT32)
    controller_epoch: int = field(metadata=INT32)
    broker_epoch: int = field(metadata=INT64)
    partitions: list[StopReplicaPartition]


@dataclass(frozen=True, slots=True)
class StopReplicaResponse(Message):
    error_code: int
    partition_errors: list[PartitionError] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ControlledShutdownRequest(Message):
    broker_id: int = field(metadata=INT32)
    broker_epoch: int = field(metadata=INT64)


@dataclass(frozen=True, slots=True)
class TopicPartitionRef(Message):
    topic_name: str
    partition_index: int = field(metadata=INT32)


@dataclass(frozen=True, slots=True)
class ControlledShutdownResponse(Message):
    error_code: int
    remaining_partitions: list[TopicPartitionRef] = field(default_factory=list)


PREFERRED_ELECTION = 0
UNCLEAN_ELECTION = 1  # elect a partition without a leader, from any live replica if none in sync is
DEBUGGING_REPLICA_ID = -2  # ListOffsets "latest" then means the log end offset, not the HW


@dataclass(frozen=True, slots=True)
class ElectLeadersRequest(Message):
    """PREFERRED_ELECTION: move leadership to the preferred (first assigned) replica;
    UNCLEAN_ELECTION: elect a leader for a partition without one. None: every partition."""
    topic_partitions: list[TopicPartitionRef] | None = None
    election_type: int = field(default=PREFERRED_ELECTION, metadata=INT8)
    timeout_ms: int = field(default=30000, metadata=NON_NEGATIVE)


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


# Partition reassignment (KIP-455, keys 45 and 46), on the controller.

@dataclass(frozen=True, slots=True)
class ReassignablePartition(Message):
    partition_index: int = field(metadata=NON_NEGATIVE)
    replicas: list[int] | None = field(default=None, metadata=INT32)  # None: cancel the partition's move


@dataclass(frozen=True, slots=True)
class ReassignableTopic(Message):
    name: str
    partitions: list[ReassignablePartition]


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsRequest(Message):
    topics: list[ReassignableTopic]
    timeout_ms: int = field(default=60000, metadata=NON_NEGATIVE)


@dataclass(frozen=True, slots=True)
class ReassignablePartitionResponse(Message):
    partition_index: int
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class ReassignableTopicResponse(Message):
    name: str
    partitions: list[ReassignablePartitionResponse]


@dataclass(frozen=True, slots=True)
class AlterPartitionReassignmentsResponse(Message):
    error_code: int
    error_message: str | None = None
    responses: list[ReassignableTopicResponse] = field(default_factory=list)
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class ListPartitionReassignmentsTopics(Message):
    name: str
    partition_indexes: list[int] = field(metadata=NON_NEGATIVE)


@dataclass(frozen=True, slots=True)
class ListPartitionReassignmentsRequest(Message):
    topics: list[ListPartitionReassignmentsTopics] | None = None  # None: every partition being moved
    timeout_ms: int = field(default=60000, metadata=NON_NEGATIVE)


@dataclass(frozen=True, slots=True)
class OngoingPartitionReassignment(Message):
    partition_index: int
    replicas: list[int]
    adding_replicas: list[int]
    removing_replicas: list[int]


@dataclass(frozen=True, slots=True)
class OngoingTopicReassignment(Message):
    name: str
    partitions: list[OngoingPartitionReassignment]


@dataclass(frozen=True, slots=True)
class ListPartitionReassignmentsResponse(Message):
    error_code: int
    error_message: str | None = None
    topics: list[OngoingTopicReassignment] = field(default_factory=list)
    throttle_time_ms: int = 0



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
    retention_time_ms: int = field(default=-1, metadata=RETENTION)


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
    partition_indexes: list[int] = field(metadata=INT32)


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


# ---------------------------------------------------------------------------------------------
# ACLs (keys 29-31). Field names are Kafka's JSON schema names in snake_case; the enums are
# Kafka's codes (protocol.acls): resource type, pattern type (3 LITERAL, 4 PREFIXED; filters
# also 1 ANY and 2 MATCH), operation, permission type (2 DENY, 3 ALLOW). Whether a value can
# be stored or matched is the broker's answer per creation or filter (INVALID_REQUEST with a
# message), as in Kafka, not a refusal of the whole request.

LITERAL_PATTERN = 3


@dataclass(frozen=True, slots=True)
class AclCreation(Message):
    resource_type: int = field(metadata=INT8)
    resource_name: str
    principal: str
    host: str
    operation: int = field(metadata=INT8)
    permission_type: int = field(metadata=INT8)
    resource_pattern_type: int = field(default=LITERAL_PATTERN, metadata=INT8)


@dataclass(frozen=True, slots=True)
class CreateAclsRequest(Message):
    creations: list[AclCreation]


@dataclass(frozen=True, slots=True)
class AclCreationResult(Message):
    error_code: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class CreateAclsResponse(Message):
    results: list[AclCreationResult]
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class AclFilter(Message):
    """DescribeAcls' body and each DeleteAcls filter: None strings match anything."""
    resource_type_filter: int = field(metadata=INT8)
    operation: int = field(metadata=INT8)
    permission_type: int = field(metadata=INT8)
    resource_name_filter: str | None = None
    pattern_type_filter: int = field(default=LITERAL_PATTERN, metadata=INT8)
    principal_filter: str | None = None
    host_filter: str | None = None


@dataclass(frozen=True, slots=True)
class DescribeAclsRequest(Message):
    resource_type_filter: int = field(metadata=INT8)
    operation: int = field(metadata=INT8)
    permission_type: int = field(metadata=INT8)
    resource_name_filter: str | None = None
    pattern_type_filter: int = field(default=LITERAL_PATTERN, metadata=INT8)
    principal_filter: str | None = None
    host_filter: str | None = None


@dataclass(frozen=True, slots=True)
class AclDescription(Message):
    principal: str
    host: str
    operation: int
    permission_type: int


@dataclass(frozen=True, slots=True)
class DescribeAclsResource(Message):
    resource_type: int
    resource_name: str
    pattern_type: int
    acls: list[AclDescription]


@dataclass(frozen=True, slots=True)
class DescribeAclsResponse(Message):
    error_code: int
    error_message: str | None = None
    resources: list[DescribeAclsResource] = field(default_factory=list)
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class DeleteAclsRequest(Message):
    filters: list[AclFilter]


@dataclass(frozen=True, slots=True)
class DeleteAclsMatchingAcl(Message):
    error_code: int
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission_type: int
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class DeleteAclsFilterResult(Message):
    error_code: int
    error_message: str | None = None
    matching_acls: list[DeleteAclsMatchingAcl] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DeleteAclsResponse(Message):
    filter_results: list[DeleteAclsFilterResult]
    throttle_time_ms: int = 0
