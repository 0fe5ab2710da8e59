"""The one registry of error codes, and the exceptions that carry them.

Numbers and names are Kafka's, so that the vocabulary (and a Kafka user's intuition about
which errors are retriable) transfers. Two flags travel with each code:

* ``retriable``: the same request may succeed if sent again (after a backoff);
* ``invalid_metadata``: the client's cached metadata is stale and must be refreshed first.

The broker turns exceptions into codes in one place (its API layer) with ``code_of``; the
client turns codes into exceptions in one place with ``for_code``. Nothing else in the
project invents error numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ErrorCode:
    name: str
    code: int
    retriable: bool
    invalid_metadata: bool
    message: str

    def __str__(self) -> str:
        return self.name


_BY_CODE: dict[int, ErrorCode] = {}
_BY_NAME: dict[str, ErrorCode] = {}


def _register(name: str, code: int, message: str, *, retriable: bool = False,
              invalid_metadata: bool = False) -> ErrorCode:
    if code in _BY_CODE or name in _BY_NAME:
        raise ValueError(f"error code {name}/{code} registered twice")
    err = ErrorCode(name, code, retriable, invalid_metadata, message)
    _BY_CODE[code] = err
    _BY_NAME[name] = err
    return err


R, M = True, True  # readability in the table below

UNKNOWN_SERVER_ERROR = _register("UNKNOWN_SERVER_ERROR", -1, "The server experienced an unexpected error")
NONE = _register("NONE", 0, "Success")
OFFSET_OUT_OF_RANGE = _register("OFFSET_OUT_OF_RANGE", 1, "The requested offset is outside the range the partition holds")
CORRUPT_MESSAGE = _register("CORRUPT_MESSAGE", 2, "The record batch failed validation (length, magic, CRC or count)", retriable=R)
UNKNOWN_TOPIC_OR_PARTITION = _register("UNKNOWN_TOPIC_OR_PARTITION", 3, "This server does not host this topic-partition", retriable=R, invalid_metadata=M)
INVALID_FETCH_SIZE = _register("INVALID_FETCH_SIZE", 4, "The requested fetch size is invalid")
LEADER_NOT_AVAILABLE = _register("LEADER_NOT_AVAILABLE", 5, "There is no leader for this partition right now (an election is in progress)", retriable=R, invalid_metadata=M)
NOT_LEADER_OR_FOLLOWER = _register("NOT_LEADER_OR_FOLLOWER", 6, "This server is not the leader or a follower of this partition", retriable=R, invalid_metadata=M)
REQUEST_TIMED_OUT = _register("REQUEST_TIMED_OUT", 7, "The request timed out", retriable=R)
BROKER_NOT_AVAILABLE = _register("BROKER_NOT_AVAILABLE", 8, "The broker is not available")
REPLICA_NOT_AVAILABLE = _register("REPLICA_NOT_AVAILABLE", 9, "The replica is not available for the requested partition", retriable=R, invalid_metadata=M)
MESSAGE_TOO_LARGE = _register("MESSAGE_TOO_LARGE", 10, "The record batch is larger than the maximum the server accepts (max.message.bytes)")
STALE_CONTROLLER_EPOCH = _register("STALE_CONTROLLER_EPOCH", 11, "The controller moved to another broker")
OFFSET_METADATA_TOO_LARGE = _register("OFFSET_METADATA_TOO_LARGE", 12, "The metadata field of the offset request was too large")
NETWORK_EXCEPTION = _register("NETWORK_EXCEPTION", 13, "The server disconnected before a response was received", retriable=R, invalid_metadata=M)
COORDINATOR_LOAD_IN_PROGRESS = _register("COORDINATOR_LOAD_IN_PROGRESS", 14, "The coordinator is loading and cannot process requests yet", retriable=R)
COORDINATOR_NOT_AVAILABLE = _register("COORDINATOR_NOT_AVAILABLE", 15, "The coordinator is not available", retriable=R)
NOT_COORDINATOR = _register("NOT_COORDINATOR", 16, "This is not the correct coordinator", retriable=R)
INVALID_TOPIC_EXCEPTION = _register("INVALID_TOPIC_EXCEPTION", 17, "The topic name is invalid or the operation is not allowed on it")
RECORD_LIST_TOO_LARGE = _register("RECORD_LIST_TOO_LARGE", 18, "The batch list in the produce request is larger than the segment size")
NOT_ENOUGH_REPLICAS = _register("NOT_ENOUGH_REPLICAS", 19, "Fewer in-sync replicas than min.insync.replicas; nothing was appended", retriable=R)
NOT_ENOUGH_REPLICAS_AFTER_APPEND = _register("NOT_ENOUGH_REPLICAS_AFTER_APPEND", 20, "The batch was appended, but the in-sync replicas fell below min.insync.replicas before it was committed", retriable=R)
INVALID_REQUIRED_ACKS = _register("INVALID_REQUIRED_ACKS", 21, "acks must be -1 (all), 0 or 1")
ILLEGAL_GENERATION = _register("ILLEGAL_GENERATION", 22, "The generation id is not the group's current generation")
INCONSISTENT_GROUP_PROTOCOL = _register("INCONSISTENT_GROUP_PROTOCOL", 23, "The member's protocol type or protocols are not compatible with the group's")
INVALID_GROUP_ID = _register("INVALID_GROUP_ID", 24, "The group id is invalid")
UNKNOWN_MEMBER_ID = _register("UNKNOWN_MEMBER_ID", 25, "The coordinator is not aware of this member")
INVALID_SESSION_TIMEOUT = _register("INVALID_SESSION_TIMEOUT", 26, "The session timeout is outside the range the broker allows")
REBALANCE_IN_PROGRESS = _register("REBALANCE_IN_PROGRESS", 27, "The group is rebalancing; rejoin it")
INVALID_COMMIT_OFFSET_SIZE = _register("INVALID_COMMIT_OFFSET_SIZE", 28, "The committing offset data size is not valid")
TOPIC_AUTHORIZATION_FAILED = _register("TOPIC_AUTHORIZATION_FAILED", 29, "Not authorized to access the topic")
GROUP_AUTHORIZATION_FAILED = _register("GROUP_AUTHORIZATION_FAILED", 30, "Not authorized to access the group")
CLUSTER_AUTHORIZATION_FAILED = _register("CLUSTER_AUTHORIZATION_FAILED", 31, "Cluster authorization failed")
INVALID_TIMESTAMP = _register("INVALID_TIMESTAMP", 32, "The timestamp of the record is out of the acceptable range")
UNSUPPORTED_SASL_MECHANISM = _register("UNSUPPORTED_SASL_MECHANISM", 33, "The broker does not support the requested SASL mechanism")
ILLEGAL_SASL_STATE = _register("ILLEGAL_SASL_STATE", 34, "The request is not valid given the current SASL state")
UNSUPPORTED_VERSION = _register("UNSUPPORTED_VERSION", 35, "The broker does not support this API key or version")
TOPIC_ALREADY_EXISTS = _register("TOPIC_ALREADY_EXISTS", 36, "The topic already exists")
INVALID_PARTITIONS = _register("INVALID_PARTITIONS", 37, "The number of partitions is invalid")
INVALID_REPLICATION_FACTOR = _register("INVALID_REPLICATION_FACTOR", 38, "The replication factor is invalid (larger than the number of live brokers?)")
INVALID_REPLICA_ASSIGNMENT = _register("INVALID_REPLICA_ASSIGNMENT", 39, "The replica assignment is invalid")
INVALID_CONFIG = _register("INVALID_CONFIG", 40, "The configuration is invalid")
NOT_CONTROLLER = _register("NOT_CONTROLLER", 41, "This is not the correct controller for this cluster", retriable=R)
INVALID_REQUEST = _register("INVALID_REQUEST", 42, "The request is malformed or violates the protocol")
UNSUPPORTED_FOR_MESSAGE_FORMAT = _register("UNSUPPORTED_FOR_MESSAGE_FORMAT", 43, "The message format does not support this request")
POLICY_VIOLATION = _register("POLICY_VIOLATION", 44, "The request parameters do not satisfy the configured policy")
OUT_OF_ORDER_SEQUENCE_NUMBER = _register("OUT_OF_ORDER_SEQUENCE_NUMBER", 45, "The broker received an out of order sequence number")
DUPLICATE_SEQUENCE_NUMBER = _register("DUPLICATE_SEQUENCE_NUMBER", 46, "The broker received a duplicate sequence number")
INVALID_PRODUCER_EPOCH = _register("INVALID_PRODUCER_EPOCH", 47, "The producer's epoch is older than the broker's (a newer producer took over)")
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = _register("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", 53, "Not authorized to use the transactional id")
SECURITY_DISABLED = _register("SECURITY_DISABLED", 54, "Security features are disabled (no authorizer is configured)")
KAFKA_STORAGE_ERROR = _register("KAFKA_STORAGE_ERROR", 56, "Disk error when trying to access the log on the broker", retriable=R, invalid_metadata=M)
SSL_HANDSHAKE_FAILED = _register("SSL_HANDSHAKE_FAILED", 57, "The TLS handshake failed (or the client did not speak TLS to a TLS listener)")
SASL_AUTHENTICATION_FAILED = _register("SASL_AUTHENTICATION_FAILED", 58, "SASL authentication failed")
UNKNOWN_PRODUCER_ID = _register("UNKNOWN_PRODUCER_ID", 59, "The broker has no state for this producer id")
REASSIGNMENT_IN_PROGRESS = _register("REASSIGNMENT_IN_PROGRESS", 60, "A partition reassignment is in progress")
NON_EMPTY_GROUP = _register("NON_EMPTY_GROUP", 68, "The group is not empty")
GROUP_ID_NOT_FOUND = _register("GROUP_ID_NOT_FOUND", 69, "The group id does not exist")
TOPIC_DELETION_DISABLED = _register("TOPIC_DELETION_DISABLED", 73, "Topic deletion is disabled")
FENCED_LEADER_EPOCH = _register("FENCED_LEADER_EPOCH", 74, "The leader epoch in the request is older than the broker's", retriable=R, invalid_metadata=M)
UNKNOWN_LEADER_EPOCH = _register("UNKNOWN_LEADER_EPOCH", 75, "The leader epoch in the request is newer than the broker's", retriable=R)
STALE_BROKER_EPOCH = _register("STALE_BROKER_EPOCH", 77, "The request was meant for an earlier incarnation of this broker")
UNSUPPORTED_COMPRESSION_TYPE = _register("UNSUPPORTED_COMPRESSION_TYPE", 76, "The compression codec is not supported")
OFFSET_NOT_AVAILABLE = _register("OFFSET_NOT_AVAILABLE", 78, "The leader's high watermark has not caught up to the requested offset yet", retriable=R)
MEMBER_ID_REQUIRED = _register("MEMBER_ID_REQUIRED", 79, "The group member needs a valid member id; rejoin with the one given")
PREFERRED_LEADER_NOT_AVAILABLE = _register("PREFERRED_LEADER_NOT_AVAILABLE", 80, "The preferred leader is not available", retriable=R)
GROUP_MAX_SIZE_REACHED = _register("GROUP_MAX_SIZE_REACHED", 81, "The group has reached its maximum size")
FENCED_INSTANCE_ID = _register("FENCED_INSTANCE_ID", 82, "Another member with the same group.instance.id fenced this one")
ELIGIBLE_LEADERS_NOT_AVAILABLE = _register("ELIGIBLE_LEADERS_NOT_AVAILABLE", 83, "No eligible leader is available for the partition", retriable=R)
ELECTION_NOT_NEEDED = _register("ELECTION_NOT_NEEDED", 84, "The leader is already the preferred one")
NO_REASSIGNMENT_IN_PROGRESS = _register("NO_REASSIGNMENT_IN_PROGRESS", 85, "No partition reassignment is in progress")
INVALID_RECORD = _register("INVALID_RECORD", 87, "A record in the batch failed broker-side validation")
UNSTABLE_OFFSET_COMMIT = _register("UNSTABLE_OFFSET_COMMIT", 88, "There are unstable offsets that need to be cleared", retriable=R)
PRODUCER_FENCED = _register("PRODUCER_FENCED", 90, "A newer epoch of this producer id was initialised; this one is fenced")
RESOURCE_NOT_FOUND = _register("RESOURCE_NOT_FOUND", 91, "The resource (a user's SCRAM credential, say) does not exist")
DUPLICATE_RESOURCE = _register("DUPLICATE_RESOURCE", 92, "The request names the same resource more than once")
UNACCEPTABLE_CREDENTIAL = _register("UNACCEPTABLE_CREDENTIAL", 93, "The credential does not meet the broker's requirements")

del R, M


def for_code(code: int) -> ErrorCode:
    """The registered ErrorCode for a number; unknown numbers map to UNKNOWN_SERVER_ERROR."""
    return _BY_CODE.get(code, UNKNOWN_SERVER_ERROR)


def by_name(name: str) -> ErrorCode:
    return _BY_NAME[name]


def all_codes() -> list[ErrorCode]:
    return sorted(_BY_CODE.values(), key=lambda e: e.code)


class TidelogError(Exception):
    """An error that maps to a protocol error code. ``str()`` names the problem."""

    error: ErrorCode = UNKNOWN_SERVER_ERROR

    def __init__(self, message: str | None = None, *, error: ErrorCode | None = None):
        if error is not None:
            self.error = error
        super().__init__(message or self.error.message)

    @property
    def code(self) -> int:
        return self.error.code

    @property
    def retriable(self) -> bool:
        return self.error.retriable

    @property
    def invalid_metadata(self) -> bool:
        return self.error.invalid_metadata


class CorruptRecordError(TidelogError):
    error = CORRUPT_MESSAGE


class RecordTooLargeError(TidelogError):
    error = MESSAGE_TOO_LARGE


class InvalidRequestError(TidelogError):
    error = INVALID_REQUEST


class UnsupportedVersionError(TidelogError):
    error = UNSUPPORTED_VERSION


class OffsetOutOfRangeError(TidelogError):
    error = OFFSET_OUT_OF_RANGE


class UnsupportedCompressionError(TidelogError):
    error = UNSUPPORTED_COMPRESSION_TYPE


class StorageError(TidelogError):
    error = KAFKA_STORAGE_ERROR


def code_of(exc: BaseException) -> ErrorCode:
    """The error code an exception turns into at the broker's boundary."""
    if isinstance(exc, TidelogError):
        return exc.error
    return UNKNOWN_SERVER_ERROR


def error_body(error: ErrorCode, message: str | None = None) -> dict[str, Any]:
    """The response body for a request that failed as a whole."""
    return {"error_code": error.code, "error_message": message or error.message}


# an error body's fields: the error, and the throttle a quota adds to any answer
_ERROR_BODY_FIELDS = frozenset({"error_code", "error_message", "throttle_time_ms"})


def is_error_body(body: Any) -> bool:
    """Whether ``body`` is a whole-request error (``error_body``, maybe throttled)."""
    return isinstance(body, dict) and "error_code" in body and body.keys() <= _ERROR_BODY_FIELDS


def error_for(code: int, message: str | None = None) -> TidelogError:
    """The exception the client raises for a code received from a broker."""
    err = for_code(code)
    for cls in _EXCEPTION_CLASSES:
        if cls.error is err:
            return cls(message)
    return TidelogError(message, error=err)


_EXCEPTION_CLASSES = (CorruptRecordError, RecordTooLargeError, InvalidRequestError,
                      UnsupportedVersionError, OffsetOutOfRangeError,
                      UnsupportedCompressionError, StorageError)


class FrameTooLargeError(InvalidRequestError):
    """A frame's length prefix exceeds the receiver's bound (``socket.request.max.bytes``).

    Raised as soon as the 4-byte prefix is read, before the body is buffered. The byte stream
    cannot be resynchronised after it, so the connection must be closed. It shares
    INVALID_REQUEST with its base class, so ``error_for`` (first match wins) still returns an
    InvalidRequestError on the client side.
    """

    def __init__(self, message: str | None = None, *, size: int | None = None,
                 limit: int | None = None, error: ErrorCode | None = None):
        self.size = size
        self.limit = limit
        if message is None and size is not None:
            message = f"frame of {size} bytes is larger than the limit of {limit} bytes"
        super().__init__(message, error=error)


_EXCEPTION_CLASSES += (FrameTooLargeError,)
