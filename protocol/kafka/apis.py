"""The APIs the Kafka listener serves, their versions, and how each meets Tidelog's bodies.

Each row names a Kafka API, the versions served (chosen so that librdkafka, kafka-python and
kcat all negotiate one: docs/kafka-compatibility.md) and, where Kafka's body differs from
Tidelog's (``protocol.messages``) by more than the names both take from Kafka, a function
that turns a decoded Kafka request into Tidelog's body and one that turns Tidelog's
response body into Kafka's. Both are pure functions of dicts; everything else about the
listener is the socket server's (broker/network.py), as for the native listener.

What crosses with a meaning, not only a shape:

* Produce: each batch's magic 2 becomes ``records.KAFKA_MAGIC`` (stored as sent).
* Produce from v3 on (every version served) carries one batch per partition, as in Kafka
  (``ProduceRequest.validateRecords``): a partition with more is answered INVALID_RECORD by
  the broker's produce handler; a native produce may carry a run of batches.
* Fetch: stored batches become Kafka's (``records.to_kafka``); ``last_stable_offset`` is
  the high watermark (no transactions), no fetch session is kept (session id 0, so clients
  send full fetches), and a Kafka client always fetches as a consumer (replica id -1).
  Before v10 a partition whose answer holds zstd batches is answered
  UNSUPPORTED_COMPRESSION_TYPE (KIP-110; a Produce before v7 with zstd is refused by the
  broker's produce handler, which sees the Kafka version in the request's context).
* ApiVersions lists this table, never the native one; an unsupported ApiVersions version
  gets a v0 response with UNSUPPORTED_VERSION and the table (KIP-511).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tidelog.protocol.codec import ApiKey
from tidelog.protocol.errors import (
    UNKNOWN_SERVER_ERROR,
    UNSUPPORTED_COMPRESSION_TYPE,
    CorruptRecordError,
    TidelogError,
    is_error_body,
)
from tidelog.protocol.kafka.records import TranslationBudget, to_kafka, to_stored, translation_bytes
from tidelog.protocol.messages import (
    DEFAULT_CONFIG,
    STATIC_BROKER_CONFIG,
    TOPIC_CONFIG,
    TOPIC_RESOURCE,
    fetch_answer_parts,
)
from tidelog.protocol.records import MAGIC, Codec, holds_codec, iter_headers, kafka_batch

Body = dict[str, Any]
Adapt = Callable[[Body, int], Body]

CONSUMER_REPLICA_ID = -1
# KIP-110: Kafka clients write zstd from Produce v7 on and read it from Fetch v10 on
ZSTD_PRODUCE_VERSION, ZSTD_FETCH_VERSION = 7, 10
# Kafka's ProduceRequest.validateRecords: from Produce v3 on, one batch per partition
ONE_BATCH_PRODUCE_VERSION = 3
# KIP-814: JoinGroup's skip_assignment, from v9 on (older versions are answered without it)
SKIP_ASSIGNMENT_JOIN_VERSION = 9


def _same(body: Body, version: int) -> Body:
    return body


@dataclass(frozen=True, slots=True)
class KafkaApi:
    key: ApiKey
    spec: str  # the JSON spec's name without Request/Response
    min_version: int
    max_version: int
    request: Adapt = _same  # Kafka's decoded request -> Tidelog's body
    response: Adapt = _same  # Tidelog's response body -> Kafka's, for the version asked
    native: ApiKey | None = None  # the Tidelog API that serves it (default: the same key)
    # the first version whose client waits out a response's throttle_time_ms itself (KIP-219:
    # Kafka's ``shouldClientThrottle`` of the response); None: no version does
    client_throttles_from: int | None = None

    @property
    def native_key(self) -> ApiKey:
        return self.native if self.native is not None else self.key

    def client_throttles(self, version: int) -> bool:
        """Whether a client of ``version`` waits out ``throttle_time_ms`` itself, so the broker
        answers at once and mutes the connection instead of delaying the answer (KIP-219)."""
        return self.client_throttles_from is not None and version >= self.client_throttles_from

    @property
    def request_spec(self) -> str:
        return f"{self.spec}Request"

    @property
    def response_spec(self) -> str:
        return f"{self.spec}Response"


# -- adapters ------------------------------------------------------------------------------------


def _api_versions_response(body: Body, version: int) -> Body:
    kafka = {k: v for k, v in body.items() if k != "software_version"}  # a field of Tidelog's only
    return {**kafka, "api_keys": api_versions()}


def _metadata_request(body: Body, version: int) -> Body:
    topics = body.get("topics")
    if topics is not None:
        topics = [t["name"] for t in topics if t.get("name") is not None]
    # v0 asks for every topic with an empty list, later versions with null
    if version == 0 and not topics:
        topics = None
    # before v4 a Metadata request creates topics if the broker allows it (Kafka's rule)
    auto = body.get("allow_auto_topic_creation", True) if version >= 4 else True
    return {"topics": topics, "allow_auto_topic_creation": auto}


def _produce_request(body: Body, version: int) -> Body:
    for topic in body.get("topic_data") or ():
        for partition in topic.get("partition_data") or ():
            if partition.get("records") is not None:
                try:
                    partition["records"] = to_stored(partition["records"])
                except CorruptRecordError:
                    pass  # left as sent: the log's validation answers this partition CORRUPT_MESSAGE
    return body


def _fetch_request(body: Body, version: int) -> Body:
    body["replica_id"] = CONSUMER_REPLICA_ID
    if version < 3:
        body["max_bytes"] = 0x7FFFFFFF
    return body


# Records and bytes of Tidelog-encoded batches one Kafka fetch response may translate
# (records.TranslationBudget): about 30 ms at ~1.4 us a record, and about 60 ms at ~3.5 ns a
# byte (a compressed batch's stored bytes counted ``COMPRESSED_COST`` times: ~512 KiB of them).
TRANSLATE_RECORDS_PER_FETCH = 20_000
TRANSLATE_BYTES_PER_FETCH = 16 << 20


# A key the broker adds to a Kafka client's fetch answer, on each partition with records: the
# bound its topic inflates a batch to (8 x max.message.bytes, as on produce), which
# translation decompresses within; never encoded.
INFLATION_BOUND = "max_uncompressed_bytes"


def _fetch_response(body: Body, version: int) -> Body:
    """The native answer in Kafka's terms. Its topics and partitions are copied, not changed:
    the broker's fetch handler answers with the body itself (``Apis._fetch_response``),
    which the request's metrics read after the write, and this may run in a worker thread."""
    budget = TranslationBudget(TRANSLATE_RECORDS_PER_FETCH, TRANSLATE_BYTES_PER_FETCH)
    no_zstd = version < ZSTD_FETCH_VERSION
    topics = []
    for topic in body.get("responses") or ():
        parts = []
        for p in topic.get("partitions") or ():
            p = dict(p, last_stable_offset=p.get("high_watermark", -1))
            bound = p.pop(INFLATION_BOUND, None)
            if no_zstd and p.get("records") and holds_codec(p["records"], Codec.ZSTD):
                p = _unsupported_compression(p)
            if p.get("records"):
                try:
                    translate = kafka_batch if bound is None else functools.partial(kafka_batch,
                                                                                   max_uncompressed_bytes=bound)
                    p["records"] = to_kafka(p["records"], translate, budget)
                except TidelogError:
                    p = _untranslatable(p)
            if p.get("diverging_epoch") is None:
                p["diverging_epoch"] = {"epoch": -1, "end_offset": -1}
            parts.append(p)
        topics.append(dict(topic, partitions=parts))
    body["responses"] = topics
    body["session_id"] = 0
    return body


def _unsupported_compression(partition: Body) -> Body:
    """A partition whose answer holds zstd batches, for a client before Fetch v10, which
    cannot read them: UNSUPPORTED_COMPRESSION_TYPE and nothing else, as Kafka's
    ``FetchResponse.partitionResponse`` (Kafka refuses by the topic's compression.type, which
    Tidelog keeps at ``producer``: here the batches' own codec decides)."""
    return {"partition_index": partition.get("partition_index"), "error_code": UNSUPPORTED_COMPRESSION_TYPE.code,
            "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1, "records": None}


def _untranslatable(partition: Body) -> Body:
    """A partition whose first Tidelog-encoded batch does not translate (it does not
    decode, or inflates beyond the bound): UNKNOWN_SERVER_ERROR for it alone, as a Kafka
    broker answers a partition whose read failed unexpectedly; clients retry it and go on
    with the fetch's other partitions."""
    return {"partition_index": partition.get("partition_index"), "error_code": UNKNOWN_SERVER_ERROR.code,
            "high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1, "records": None}


def to_translate(body: Any) -> tuple[int, int]:
    """How many records, and bytes (``records.translation_bytes``), of Tidelog-encoded
    batches a (native) fetch answer holds, its body or the typed message: what a Kafka fetch
    answer would translate (headers only: per batch)."""
    count = cost = 0
    for _, _, records in fetch_answer_parts(body):
        for _, h in iter_headers(records) if records else ():
            if h.magic == MAGIC:
                count += h.record_count
                cost += translation_bytes(h.size, h.attributes)
    return count, cost


def _list_offsets_response(body: Body, version: int) -> Body:
    if version == 0:
        for topic in body.get("topics") or ():
            for p in topic.get("partitions") or ():
                p["old_style_offsets"] = [] if p.get("offset", -1) < 0 else [p["offset"]]
    return body


def _leave_group_request(body: Body, version: int) -> Body:
    if version < 3:
        body["members"] = [{"member_id": body.get("member_id", "")}]
    return body


def _offset_commit_request(body: Body, version: int) -> Body:
    body["generation_id"] = body.get("generation_id_or_member_epoch", -1)
    if body.get("retention_time_ms", -1) is None:
        body["retention_time_ms"] = -1
    return body


def _create_topics_request(body: Body, version: int) -> Body:
    for topic in body.get("topics") or ():
        assignments = topic.get("assignments")
        topic["assignments"] = ({str(a["partition_index"]): a["broker_ids"] for a in assignments}
                                if assignments else None)
        # a null value stays null: the broker refuses that topic (INVALID_CONFIG), as Kafka does
        topic["configs"] = {c["name"]: c["value"] for c in topic.get("configs") or ()}
    return body


def _create_partitions_request(body: Body, version: int) -> Body:
    for topic in body.get("topics") or ():
        assignments = topic.get("assignments")
        topic["assignments"] = [a["broker_ids"] for a in assignments] if assignments is not None else None
    return body


def _alter_configs_request(body: Body, version: int) -> Body:
    # Kafka's AlterConfigs (not the incremental one) replaces a resource's whole override set
    for resource in body.get("resources") or ():
        resource["configs"] = {c["name"]: c["value"] for c in resource.get("configs") or ()}
        resource["replace"] = True
    return body


def _describe_configs_response(body: Body, version: int) -> Body:
    """Each entry's config_source is the broker's ``source`` (Kafka's ConfigSource: kafka-configs
    shows and deletes a broker's dynamic configs by it); from a broker that does not say, a
    topic override is TOPIC_CONFIG and a broker's explicit value STATIC_BROKER_CONFIG."""
    for result in body.get("results") or ():
        explicit = TOPIC_CONFIG if result.get("resource_type") == TOPIC_RESOURCE else STATIC_BROKER_CONFIG
        for entry in result.get("configs") or ():
            source = entry.get("source")
            if source is None:
                source = DEFAULT_CONFIG if entry.get("is_default", True) else explicit
            entry["config_source"] = source
    return body


def _consumer_replica(body: Body, version: int) -> Body:
    body["replica_id"] = CONSUMER_REPLICA_ID
    return body


def _describe_cluster_request(body: Body, version: int) -> Body:
    return {"topics": [], "allow_auto_topic_creation": False}


def _describe_cluster_response(body: Body, version: int) -> Body:
    """A Metadata answer without topics, as DescribeCluster's."""
    if set(body) <= {"error_code", "error_message"}:
        return body
    return {"throttle_time_ms": body.get("throttle_time_ms", 0), "error_code": 0, "endpoint_type": 1,
            "cluster_id": body.get("cluster_id") or "", "controller_id": body.get("controller_id", -1),
            "brokers": [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"], "rack": b.get("rack")}
                        for b in body.get("brokers") or ()]}


# -- whole-request errors -------------------------------------------------------------------------
#
# A request the broker refuses as a whole (not authenticated, not authorized, malformed for
# its handler) gets Tidelog's error body {"error_code", "error_message"}. Kafka's clients read
# such an answer per partition (or per topic, group, resource): librdkafka even aborts when a
# DescribeGroups answer lacks a group it asked for. So the error is spread over every entry
# the request named, as a Kafka broker's getErrorResponse does.


def _per_partition(topics_key: str, name_key: str, partitions_key: str, index_key: str,
                   out_topics: str, out_name: str, out_partitions: str, out_index: str) -> Callable:
    def spread(request: Body, code: int, message: str | None) -> Body:
        return {out_topics: [{out_name: t.get(name_key), out_partitions: [
            {out_index: p.get(index_key), "error_code": code, "error_message": message}
            for p in t.get(partitions_key) or ()]} for t in request.get(topics_key) or ()]}
    return spread


def _per_entry(entries_key: str, name_key: str, out_key: str, out_name: str, *extra: str) -> Callable:
    def spread(request: Body, code: int, message: str | None) -> Body:
        out = []
        for entry in request.get(entries_key) or ():
            name = entry if isinstance(entry, str) else entry.get(name_key)
            row = {out_name: name, "error_code": code, "error_message": message}
            for key in extra:
                row[key] = entry.get(key) if isinstance(entry, dict) else None
            out.append(row)
        return {out_key: out}
    return spread


def _offset_fetch_spread(request: Body, code: int, message: str | None) -> Body:
    # before v2 the answer has no top-level error: every partition asked carries it
    return {"topics": [{"name": t.get("name"), "partitions": [
        {"partition_index": p, "error_code": code, "committed_offset": -1} for p in t.get("partition_indexes") or ()]}
        for t in request.get("topics") or ()]}


_SPREAD: Mapping[int, Callable[[Body, int, str | None], Body]] = MappingProxyType({
    ApiKey.METADATA: _per_entry("topics", "name", "topics", "name"),
    ApiKey.OFFSET_FETCH: _offset_fetch_spread,
    ApiKey.PRODUCE: _per_partition("topic_data", "name", "partition_data", "index",
                                   "responses", "name", "partition_responses", "index"),
    ApiKey.FETCH: _per_partition("topics", "topic", "partitions", "partition",
                                 "responses", "topic", "partitions", "partition_index"),
    ApiKey.LIST_OFFSETS: _per_partition("topics", "name", "partitions", "partition_index",
                                        "topics", "name", "partitions", "partition_index"),
    ApiKey.OFFSET_COMMIT: _per_partition("topics", "name", "partitions", "partition_index",
                                         "topics", "name", "partitions", "partition_index"),
    ApiKey.DELETE_RECORDS: _per_partition("topics", "name", "partitions", "partition_index",
                                          "topics", "name", "partitions", "partition_index"),
    ApiKey.OFFSETS_FOR_LEADER_EPOCH: _per_partition("topics", "topic", "partitions", "partition",
                                                    "topics", "topic", "partitions", "partition"),
    ApiKey.CREATE_TOPICS: _per_entry("topics", "name", "topics", "name"),
    ApiKey.DELETE_TOPICS: _per_entry("topic_names", "name", "responses", "name"),
    ApiKey.CREATE_PARTITIONS: _per_entry("topics", "name", "results", "name"),
    ApiKey.DESCRIBE_CONFIGS: _per_entry("resources", "resource_name", "results", "resource_name", "resource_type"),
    ApiKey.ALTER_CONFIGS: _per_entry("resources", "resource_name", "responses", "resource_name", "resource_type"),
    ApiKey.DESCRIBE_GROUPS: _per_entry("groups", "group_id", "groups", "group_id"),
    ApiKey.DELETE_GROUPS: _per_entry("groups_names", "group_id", "results", "group_id"),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _per_partition("topics", "name", "partitions", "partition_index",
                                                         "responses", "name", "partitions", "partition_index"),
})


def error_response(key: int, request: Body, error: Body) -> Body:
    """Tidelog's whole-request error as Kafka's answer to ``request`` (its decoded body),
    with the throttle a quota added to it."""
    code, message = error.get("error_code", -1), error.get("error_message")
    spread = _SPREAD.get(key)
    body = spread(request, code, message) if spread is not None else {}
    body = {**body, "error_code": code, "error_message": message}
    if "throttle_time_ms" in error:
        body["throttle_time_ms"] = error["throttle_time_ms"]
    return body


def held_request(key: int, request: Body) -> Body:
    """What a request waiting for its answer keeps for ``error_response``: a Produce its
    topic names and partition indexes, never its records (they are the log's once the
    handler has them); any other request as decoded (none carries records)."""
    if key != ApiKey.PRODUCE:
        return request
    return {"topic_data": [{"name": t.get("name"), "partition_data": [{"index": p.get("index")}
                                                                      for p in t.get("partition_data") or ()]}
                           for t in request.get("topic_data") or ()]}


def answers_as_error(key: int, version: int, body: Body) -> bool:
    """Whether Tidelog's answer ``body`` goes to the Kafka client as a whole-request error
    (``error_response``): an error body, or an OffsetFetch refused whole (NOT_COORDINATOR,
    GROUP_AUTHORIZATION_FAILED, ...) at v0 or v1, whose answer has no top-level error: sent
    as it is, with no partitions, it would read as a group without committed offsets."""
    return is_error_body(body) or (key == ApiKey.OFFSET_FETCH and version < 2 and bool(body.get("error_code")))


# -- the table ----------------------------------------------------------------------------------
#
# ``client_throttles_from`` is Kafka's ``shouldClientThrottle`` of each response class
# (KIP-219). OffsetForLeaderEpoch, DescribeCluster and the SASL APIs have none: their
# clients never wait on their own.


def _table(*rows: KafkaApi) -> Mapping[int, KafkaApi]:
    return MappingProxyType({int(row.key): row for row in rows})


KAFKA_APIS: Mapping[int, KafkaApi] = _table(
    KafkaApi(ApiKey.PRODUCE, "Produce", 3, 10, _produce_request, client_throttles_from=6),
    KafkaApi(ApiKey.FETCH, "Fetch", 4, 12, _fetch_request, _fetch_response, client_throttles_from=8),
    KafkaApi(ApiKey.LIST_OFFSETS, "ListOffsets", 1, 7, _consumer_replica, _list_offsets_response, client_throttles_from=3),
    KafkaApi(ApiKey.METADATA, "Metadata", 0, 12, _metadata_request, client_throttles_from=6),
    KafkaApi(ApiKey.API_VERSIONS, "ApiVersions", 0, 3, response=_api_versions_response, client_throttles_from=2),
    KafkaApi(ApiKey.INIT_PRODUCER_ID, "InitProducerId", 0, 4, client_throttles_from=1),
    KafkaApi(ApiKey.FIND_COORDINATOR, "FindCoordinator", 0, 3, client_throttles_from=2),
    # from v4 on a new member first gets MEMBER_ID_REQUIRED, which the coordinator always asks
    KafkaApi(ApiKey.JOIN_GROUP, "JoinGroup", 4, 7, client_throttles_from=3),
    KafkaApi(ApiKey.SYNC_GROUP, "SyncGroup", 0, 5, client_throttles_from=2),
    KafkaApi(ApiKey.HEARTBEAT, "Heartbeat", 0, 4, client_throttles_from=2),
    KafkaApi(ApiKey.LEAVE_GROUP, "LeaveGroup", 0, 5, _leave_group_request, client_throttles_from=2),
    KafkaApi(ApiKey.OFFSET_COMMIT, "OffsetCommit", 0, 8, _offset_commit_request, client_throttles_from=4),
    KafkaApi(ApiKey.OFFSET_FETCH, "OffsetFetch", 0, 7, client_throttles_from=4),
    KafkaApi(ApiKey.LIST_GROUPS, "ListGroups", 0, 4, client_throttles_from=2),
    KafkaApi(ApiKey.DESCRIBE_GROUPS, "DescribeGroups", 0, 5, client_throttles_from=2),
    KafkaApi(ApiKey.DELETE_GROUPS, "DeleteGroups", 0, 2, client_throttles_from=1),
    KafkaApi(ApiKey.CREATE_TOPICS, "CreateTopics", 0, 7, _create_topics_request, client_throttles_from=3),
    KafkaApi(ApiKey.DELETE_TOPICS, "DeleteTopics", 0, 5, client_throttles_from=2),
    KafkaApi(ApiKey.CREATE_PARTITIONS, "CreatePartitions", 0, 3, _create_partitions_request, client_throttles_from=1),
    KafkaApi(ApiKey.DESCRIBE_CONFIGS, "DescribeConfigs", 0, 4, response=_describe_configs_response, client_throttles_from=2),
    KafkaApi(ApiKey.ALTER_CONFIGS, "AlterConfigs", 0, 2, _alter_configs_request, client_throttles_from=1),
    KafkaApi(ApiKey.DELETE_RECORDS, "DeleteRecords", 0, 2, client_throttles_from=1),
    KafkaApi(ApiKey.ALTER_PARTITION_REASSIGNMENTS, "AlterPartitionReassignments", 0, 0, client_throttles_from=0),
    KafkaApi(ApiKey.LIST_PARTITION_REASSIGNMENTS, "ListPartitionReassignments", 0, 0, client_throttles_from=0),
    KafkaApi(ApiKey.OFFSETS_FOR_LEADER_EPOCH, "OffsetForLeaderEpoch", 0, 4, _consumer_replica),
    KafkaApi(ApiKey.DESCRIBE_CLUSTER, "DescribeCluster", 0, 1, _describe_cluster_request,
             _describe_cluster_response, native=ApiKey.METADATA),
    KafkaApi(ApiKey.SASL_HANDSHAKE, "SaslHandshake", 1, 1),
    KafkaApi(ApiKey.SASL_AUTHENTICATE, "SaslAuthenticate", 0, 2),
)


def api_versions() -> list[Body]:
    return [{"api_key": key, "min_version": api.min_version, "max_version": api.max_version}
            for key, api in sorted(KAFKA_APIS.items())]
