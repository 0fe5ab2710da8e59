"""The API registry: one row per API this node serves, and nothing else.

Each row names the API's key, the versions spoken and the typed request and response bodies
(``protocol.messages``). Everything that depends on "which APIs exist" reads this table:
ApiVersions lists exactly its rows, a request for any other key or version is refused with
UNSUPPORTED_VERSION before it is decoded (``api_for``), the broker registers one handler per
row and checks at start-up that it covers the table, and clients decode a response with the
row's response type. Adding an API is adding a row (and a handler).

Kafka keys that are named in ``ApiKey`` but have no row here are not served: a client that
asks gets UNSUPPORTED_VERSION. SaslHandshake and SaslAuthenticate have rows (clients look
them up in ApiVersions) but are answered by the connection itself on SASL listeners
(broker/network.py); on other listeners their handlers refuse them with ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tidelog.protocol import messages as m
from tidelog.protocol.codec import ApiKey, Message, RequestHeader
from tidelog.protocol.errors import UnsupportedVersionError


@dataclass(frozen=True, slots=True)
class Api:
    """One served API: versions ``[min_version, max_version]`` and its body types."""

    key: ApiKey
    min_version: int
    max_version: int
    request: type[Message]
    response: type[Message]

    @property
    def name(self) -> str:
        return self.key.name


def _table(*rows: Api) -> Mapping[ApiKey, Api]:
    table = {row.key: row for row in rows}
    if len(table) != len(rows):
        raise ValueError("an API key appears twice in the registry")
    return MappingProxyType(dict(sorted(table.items())))


# Bump max_version when a version is added.
APIS: Mapping[ApiKey, Api] = _table(
    Api(ApiKey.PRODUCE, 0, 0, m.ProduceRequest, m.ProduceResponse),
    Api(ApiKey.FETCH, 0, 0, m.FetchRequest, m.FetchResponse),
    Api(ApiKey.LIST_OFFSETS, 0, 0, m.ListOffsetsRequest, m.ListOffsetsResponse),
    Api(ApiKey.METADATA, 0, 0, m.MetadataRequest, m.MetadataResponse),
    Api(ApiKey.LEADER_AND_ISR, 0, 0, m.LeaderAndIsrRequest, m.LeaderAndIsrResponse),
    Api(ApiKey.STOP_REPLICA, 0, 0, m.StopReplicaRequest, m.StopReplicaResponse),
    Api(ApiKey.UPDATE_METADATA, 0, 0, m.UpdateMetadataRequest, m.UpdateMetadataResponse),
    Api(ApiKey.CONTROLLED_SHUTDOWN, 0, 0, m.ControlledShutdownRequest, m.ControlledShutdownResponse),
    Api(ApiKey.OFFSET_COMMIT, 0, 0, m.OffsetCommitRequest, m.OffsetCommitResponse),
    Api(ApiKey.OFFSET_FETCH, 0, 0, m.OffsetFetchRequest, m.OffsetFetchResponse),
    Api(ApiKey.FIND_COORDINATOR, 0, 0, m.FindCoordinatorRequest, m.FindCoordinatorResponse),
    Api(ApiKey.JOIN_GROUP, 0, 0, m.JoinGroupRequest, m.JoinGroupResponse),
    Api(ApiKey.HEARTBEAT, 0, 0, m.HeartbeatRequest, m.HeartbeatResponse),
    Api(ApiKey.LEAVE_GROUP, 0, 0, m.LeaveGroupRequest, m.LeaveGroupResponse),
    Api(ApiKey.SYNC_GROUP, 0, 0, m.SyncGroupRequest, m.SyncGroupResponse),
    Api(ApiKey.DESCRIBE_GROUPS, 0, 0, m.DescribeGroupsRequest, m.DescribeGroupsResponse),
    Api(ApiKey.LIST_GROUPS, 0, 0, m.ListGroupsRequest, m.ListGroupsResponse),
    Api(ApiKey.API_VERSIONS, 0, 0, m.ApiVersionsRequest, m.ApiVersionsResponse),
    Api(ApiKey.CREATE_TOPICS, 0, 0, m.CreateTopicsRequest, m.CreateTopicsResponse),
    Api(ApiKey.DELETE_TOPICS, 0, 0, m.DeleteTopicsRequest, m.DeleteTopicsResponse),
    Api(ApiKey.DELETE_RECORDS, 0, 0, m.DeleteRecordsRequest, m.DeleteRecordsResponse),
    Api(ApiKey.INIT_PRODUCER_ID, 0, 0, m.InitProducerIdRequest, m.InitProducerIdResponse),
    Api(ApiKey.OFFSETS_FOR_LEADER_EPOCH, 0, 0, m.OffsetsForLeaderEpochRequest, m.OffsetsForLeaderEpochResponse),
    Api(ApiKey.DESCRIBE_ACLS, 0, 0, m.DescribeAclsRequest, m.DescribeAclsResponse),
    Api(ApiKey.CREATE_ACLS, 0, 0, m.CreateAclsRequest, m.CreateAclsResponse),
    Api(ApiKey.DELETE_ACLS, 0, 0, m.DeleteAclsRequest, m.DeleteAclsResponse),
    Api(ApiKey.DESCRIBE_CONFIGS, 0, 0, m.DescribeConfigsRequest, m.DescribeConfigsResponse),
    Api(ApiKey.ALTER_CONFIGS, 0, 0, m.AlterConfigsRequest, m.AlterConfigsResponse),
    Api(ApiKey.DESCRIBE_LOG_DIRS, 0, 0, m.DescribeLogDirsRequest, m.DescribeLogDirsResponse),
    Api(ApiKey.CREATE_PARTITIONS, 0, 0, m.CreatePartitionsRequest, m.CreatePartitionsResponse),
    Api(ApiKey.DELETE_GROUPS, 0, 0, m.DeleteGroupsRequest, m.DeleteGroupsResponse),
    Api(ApiKey.ELECT_LEADERS, 0, 0, m.ElectLeadersRequest, m.ElectLeadersResponse),
    Api(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 0, m.AlterPartitionReassignmentsRequest,
        m.AlterPartitionReassignmentsResponse),
    Api(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0, m.ListPartitionReassignmentsRequest,
        m.ListPartitionReassignmentsResponse),
    Api(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 0, m.DescribeClientQuotasRequest, m.DescribeClientQuotasResponse),
    Api(ApiKey.ALTER_CLIENT_QUOTAS, 0, 0, m.AlterClientQuotasRequest, m.AlterClientQuotasResponse),
    Api(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, 0, m.DescribeUserScramCredentialsRequest,
        m.DescribeUserScramCredentialsResponse),
    Api(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, 0, m.AlterUserScramCredentialsRequest,
        m.AlterUserScramCredentialsResponse),
    Api(ApiKey.SASL_HANDSHAKE, 0, 0, m.SaslHandshakeRequest, m.SaslHandshakeResponse),
    Api(ApiKey.SASL_AUTHENTICATE, 0, 0, m.SaslAuthenticateRequest, m.SaslAuthenticateResponse),
)


def api_for(header: RequestHeader) -> Api:
    """The served API of a request, or UnsupportedVersionError (UNSUPPORTED_VERSION) for a key
    this node does not serve or a version outside the API's range."""
    api = APIS.get(header.api_key)  # type: ignore[call-overload]  # a raw int for unknown keys
    if api is None:
        name = getattr(header.api_key, "name", None)
        raise UnsupportedVersionError(f"api key {header.api_key}{f' ({name})' if name else ''} is not served")
    if not api.min_version <= header.api_version <= api.max_version:
        raise UnsupportedVersionError(
            f"{api.name} version {header.api_version} is not supported: "
            f"this node speaks versions {api.min_version} to {api.max_version}")
    return api


def api_versions() -> list[m.ApiVersion]:
    """The registry as the ApiVersions response lists it, by api key."""
    return [m.ApiVersion(int(api.key), api.min_version, api.max_version) for api in APIS.values()]


def response_type(api_key: ApiKey) -> type[Message]:
    """The typed response body of a served API (KeyError for any other key)."""
    return APIS[api_key].response
