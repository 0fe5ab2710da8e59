"""Requests and responses: the msgpack envelope, the API keys, and typed message bodies.

Envelope (the body of one frame; see ``protocol.frames`` for the length prefix)::

    request  := [api_key:int16, api_version:int16, correlation_id:int32, client_id:str|nil, body:map]
    response := [correlation_id:int32, body:map]
    body     := map with str keys

Decoding is two steps, so each failure maps to one error code:

1. ``decode_request`` checks the envelope only. Bad bytes, a wrong shape or an out-of-range
   header raise InvalidRequestError (INVALID_REQUEST) and nothing else; the error carries
   ``correlation_id`` (None if it could not be read) so a server can still answer in order.
   An unknown api_key is not a decode error: the header keeps the raw number.
2. ``check_supported`` raises UnsupportedVersionError (UNSUPPORTED_VERSION) for an unknown
   api_key or a version outside ``SUPPORTED_VERSIONS``; then ``REQUESTS[api_key].from_body``
   turns the body map into its typed message, or raises InvalidRequestError naming the field
   path (``topics[2].partitions[0].partition: expected int, got str``).

msgpack is always unpacked with explicit bounds (container lengths, no ext types, str keys
only), so a hostile frame costs at most a small multiple of its own size.

Typed bodies: each API has one frozen dataclass per request and per response, subclassing
``Message``. Field annotations drive both validation and encoding; the plan for a class is
built once, on first use, and cached. Unknown keys in a body are ignored (a newer peer may
send more fields); missing fields take their defaults; missing required fields are an error.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NamedTuple, Self

import msgpack

from tidelog.protocol.errors import InvalidRequestError, UnsupportedVersionError

INT8 = types.MappingProxyType({"min": -(1 << 7), "max": (1 << 7) - 1})
INT16 = types.MappingProxyType({"min": -(1 << 15), "max": (1 << 15) - 1})
INT32 = types.MappingProxyType({"min": -(1 << 31), "max": (1 << 31) - 1})
INT64 = types.MappingProxyType({"min": -(1 << 63), "max": (1 << 63) - 1})

MAX_CONTAINER_LEN = 1 << 20  # elements in one msgpack array or map


class ApiKey(IntEnum):
    """Kafka's API numbers, so the vocabulary (and packet captures) transfer."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSETS_FOR_LEADER_EPOCH = 23
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43


_API_KEYS: dict[int, ApiKey] = {int(k): k for k in ApiKey}

# [min, max] version this broker speaks, per API. Bump max when a version is added.
SUPPORTED_VERSIONS: dict[ApiKey, tuple[int, int]] = {key: (0, 0) for key in ApiKey}


# ---------------------------------------------------------------------------------------------
# envelope


@dataclass(frozen=True, slots=True)
class RequestHeader:
    """The envelope fields of a request. ``api_key`` is an ApiKey when known, else the raw int."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None


def encode_request(header: RequestHeader, body: dict[str, Any] | Message) -> bytes:
    """The frame body of a request (without the length prefix). Raises ValueError/TypeError
    for a header out of range or a body that is not a map with str keys."""
    for name, value, bounds in (("api_key", header.api_key, INT16),
                                ("api_version", header.api_version, INT16),
                                ("correlation_id", header.correlation_id, INT32)):
        if (problem := _int_problem(value, bounds)) is not None:
            raise ValueError(f"request {name}: {problem}")
    if header.client_id is not None and type(header.client_id) is not str:
        raise TypeError(f"request client_id: expected str or None, got {_type_name(header.client_id)}")
    return _pack([int(header.api_key), int(header.api_version), int(header.correlation_id),
                  header.client_id, _body_map(body)])


def decode_request(frame: bytes | bytearray | memoryview) -> tuple[RequestHeader, dict[str, Any]]:
    """Parse a request frame body into its header and body map, or raise InvalidRequestError
    (with ``correlation_id`` set to the request's id when it could be read, else None)."""
    try:
        return _parse_request(_unpack(frame, "request"))
    except InvalidRequestError as e:
        e.correlation_id = _salvage_correlation_id(frame, index=2)
        raise


def encode_response(correlation_id: int, body: dict[str, Any] | Message) -> bytes:
    """The frame body of a response (without the length prefix)."""
    if (problem := _int_problem(correlation_id, INT32)) is not None:
        raise ValueError(f"response correlation_id: {problem}")
    return _pack([int(correlation_id), _body_map(body)])


def decode_response(frame: bytes | bytearray | memoryview) -> tuple[int, dict[str, Any]]:
    """Parse a response frame body into ``(correlation_id, body)``, or raise
    InvalidRequestError (with ``correlation_id`` as for ``decode_request``)."""
    try:
        return _parse_response(_unpack(frame, "response"))
    except InvalidRequestError as e:
        e.correlation_id = _salvage_correlation_id(frame, index=0)
        raise


def check_supported(header: RequestHeader) -> ApiKey:
    """The header's ApiKey, or UnsupportedVersionError for an unknown key or version."""
    key = _API_KEYS.get(header.api_key)
    if key is None or key not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(f"unsupported api_key {header.api_key}")
    low, high = SUPPORTED_VERSIONS[key]
    if not low <= header.api_version <= high:
        raise UnsupportedVersionError(
            f"{key.name} version {header.api_version} is not supported: "
            f"this broker speaks versions {low} to {high}")
    return key


def _parse_request(items: Any) -> tuple[RequestHeader, dict[str, Any]]:
    if type(items) is not list or len(items) != 5:
        raise InvalidRequestError(
            "a request must be an array [api_key, api_version, correlation_id, client_id, body], "
            f"got {_shape(items)}")
    api_key, api_version, correlation_id, client_id, body = items
    _expect_int("correlation_id", correlation_id, INT32)
    _expect_int("api_key", api_key, INT16)
    _expect_int("api_version", api_version, INT16)
    if client_id is not None and type(client_id) is not str:
        raise InvalidRequestError(f"request client_id: expected str or nil, got {_type_name(client_id)}")
    _expect_body("request", body)
    return RequestHeader(_API_KEYS.get(api_key, api_key), api_version, correlation_id, client_id), body


def _parse_response(items: Any) -> tuple[int, dict[str, Any]]:
    if type(items) is not list or len(items) != 2:
        raise InvalidRequestError(f"a response must be an array [correlation_id, body], got {_shape(items)}")
    correlation_id, body = items
    _expect_int("correlation_id", correlation_id, INT32)
    _expect_body("response", body)
    return correlation_id, body


def _expect_int(name: str, value: Any, bounds: Mapping[str, int]) -> None:
    if (problem := _int_problem(value, bounds)) is not None:
        raise InvalidRequestError(f"{name}: {problem}")


def _expect_body(what: str, body: Any) -> None:
    if type(body) is not dict:
        raise InvalidRequestError(f"{what} body: expected map, got {_type_name(body)}")
    for key in body:
        if type(key) is not str:
            raise InvalidRequestError(f"{what} body: keys must be str, got {_type_name(key)} {key!r:.40}")


def _int_problem(value: Any, bounds: Mapping[str, int]) -> str | None:
    """Why ``value`` is not an int within ``bounds`` (None if it is). bool is not an int."""
    if type(value) is not int and not isinstance(value, IntEnum):
        return f"expected int, got {_type_name(value)}"
    low, high = bounds.get("min"), bounds.get("max")
    if (low is not None and value < low) or (high is not None and value > high):
        return f"{value} is out of range [{low}, {high}]"
    return None


def _body_map(body: dict[str, Any] | Message) -> dict[str, Any]:
    if isinstance(body, Message):
        return body.to_body()
    if not isinstance(body, dict) or not all(type(k) is str for k in body):
        raise TypeError(f"a message body must be a dict with str keys or a Message, got {_shape(body)}")
    return body


# ---------------------------------------------------------------------------------------------
# bounded msgpack


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed")


def _unpack_options(size: int) -> dict[str, Any]:
    containers = min(size, MAX_CONTAINER_LEN)
    return dict(raw=False, use_list=True, strict_map_key=True, ext_hook=_reject_ext,
                max_ext_len=0, max_str_len=size, max_bin_len=size,
                max_array_len=containers, max_map_len=containers)


# Everything msgpack documents (and a few it does not) for malformed input.
_UNPACK_ERRORS = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


def _unpack(frame: bytes | bytearray | memoryview, what: str) -> Any:
    try:
        return msgpack.unpackb(frame, **_unpack_options(len(frame)))
    except msgpack.ExtraData:
        raise InvalidRequestError(f"{what} frame has bytes after its msgpack value") from None
    except _UNPACK_ERRORS as e:
        reason = str(e) or type(e).__name__
        raise InvalidRequestError(f"{what} frame is not valid msgpack: {reason}") from None


_SALVAGE_WINDOW = 64  # enough for an array header and three ints


def _salvage_correlation_id(frame: bytes | bytearray | memoryview, index: int) -> int | None:
    """Best effort, for error replies: the int32 at ``index`` of a top-level array, read from
    the first bytes of a frame that failed to parse (so it may be truncated or corrupt later)."""
    head = bytes(frame[:_SALVAGE_WINDOW])
    unpacker = msgpack.Unpacker(max_buffer_size=_SALVAGE_WINDOW, **_unpack_options(len(head)))
    try:
        unpacker.feed(head)
        if unpacker.read_array_header() <= index:
            return None
        for _ in range(index):
            unpacker.skip()
        value = unpacker.unpack()
    except _UNPACK_ERRORS:
        return None
    return value if _int_problem(value, INT32) is None else None


_WIRE_NAMES = {type(None): "nil", list: "array", dict: "map"}


def _type_name(value: Any) -> str:
    """The msgpack-flavoured name of a decoded value's type, for error messages."""
    return _WIRE_NAMES.get(type(value)) or type(value).__name__


def _shape(value: Any) -> str:
    if type(value) is list:
        return f"an array of {len(value)} elements"
    return _type_name(value)


# ---------------------------------------------------------------------------------------------
# typed message bodies


class Message:
    """Base class of typed bodies: ``@dataclass(frozen=True, slots=True) class X(Message)``.

    Field annotations may be int, str, bytes, bool, float, ``X | None``, ``list[X]``,
    ``dict[str, X]`` or another Message subclass. An int field (or the ints inside a list,
    dict or optional) is range-checked when declared with ``field(metadata=INT16)`` or any
    ``{"min": .., "max": ..}``. bool is never accepted as an int; an int is accepted (and
    converted) for a float. A ``__post_init__`` may raise ValueError for cross-field rules;
    ``from_body`` reports it like a type error.
    """

    __slots__ = ()

    def to_body(self) -> dict[str, Any]:
        """A plain dict of msgpack-able values (nested messages become dicts)."""
        return _plan_of(type(self)).dump(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        """The message for a decoded body map, or InvalidRequestError naming the field path."""
        try:
            return _plan_of(cls).load(body)
        except _FieldError as e:
            raise InvalidRequestError(e.describe()) from None


class _FieldError(Exception):
    """Internal: a mismatch deep in a body. Each enclosing container adds its path segment as
    the error propagates, so the happy path never builds a path string."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []  # innermost segment first

    def describe(self) -> str:
        out = ""
        for segment in reversed(self.path):
            out += segment if segment.startswith("[") or not out else "." + segment
        return f"{out}: {self.problem}" if out else self.problem


Load = Callable[[Any], Any]
Dump = Callable[[Any], Any] | None  # None: the value is already msgpack-able as it is


class _FieldPlan(NamedTuple):
    name: str
    load: Load
    dump: Dump
    required: bool


@dataclass(frozen=True, slots=True)
class _Plan:
    cls: type
    fields: tuple[_FieldPlan, ...]

    def load(self, body: Any) -> Any:
        if type(body) is not dict:
            raise _FieldError(f"expected map, got {_type_name(body)}")
        kwargs = {}
        name = ""
        try:
            for name, load, _, required in self.fields:
                if name in body:
                    kwargs[name] = load(body[name])
                elif required:
                    raise _FieldError("missing required field")
        except _FieldError as e:
            e.path.append(name)
            raise
        return self._construct(kwargs)

    def _construct(self, kwargs: dict[str, Any]) -> Any:
        try:
            return self.cls(**kwargs)
        except ValueError as e:  # a __post_init__ cross-field rule
            raise _FieldError(str(e)) from None

    def dump(self, message: Any) -> dict[str, Any]:
        out = {}
        for name, _, dump, _ in self.fields:
            value = getattr(message, name)
            out[name] = value if dump is None else dump(value)
        return out


_PLANS: dict[type, _Plan] = {}


def _plan_of(cls: type) -> _Plan:
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _build_plan(cls)
    return plan


def _build_plan(cls: type) -> _Plan:
    if not (isinstance(cls, type) and issubclass(cls, Message) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a Message dataclass")
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        load, dump = _compile(hints[f.name], f.metadata, f"{cls.__name__}.{f.name}")
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        rows.append(_FieldPlan(f.name, load, dump, required))
    return _Plan(cls, tuple(rows))


def _compile(tp: Any, meta: Mapping[str, Any], where: str) -> tuple[Load, Dump]:
    """Loader and dumper for an annotation. Raises TypeError for an unsupported one."""
    origin = typing.get_origin(tp)
    if tp in _SCALARS:
        return _SCALARS[tp](meta), None
    if origin is typing.Union or origin is types.UnionType:
        return _compile_optional(tp, meta, where)
    if origin is list:
        return _compile_list(typing.get_args(tp)[0], meta, where)
    if origin is dict:
        return _compile_dict(typing.get_args(tp), meta, where)
    if isinstance(tp, type) and issubclass(tp, Message):
        return _message_loader(tp), _dump_message
    raise TypeError(f"{where}: unsupported field type {tp!r}")


def _int_loader(meta: Mapping[str, Any]) -> Load:
    bounds = {k: meta[k] for k in ("min", "max") if k in meta}

    def load(value: Any) -> int:
        if type(value) is not int:
            raise _FieldError(f"expected int, got {_type_name(value)}")
        if bounds and (problem := _int_problem(value, bounds)) is not None:
            raise _FieldError(problem)
        return value

    return load


def _exact_loader(expected: type) -> Callable[[Mapping[str, Any]], Load]:
    def make(meta: Mapping[str, Any]) -> Load:
        def load(value: Any) -> Any:
            if type(value) is not expected:
                raise _FieldError(f"expected {expected.__name__}, got {_type_name(value)}")
            return value

        return load

    return make


def _float_loader(meta: Mapping[str, Any]) -> Load:
    def load(value: Any) -> float:
        if type(value) is float:
            return value
        if type(value) is int:
            return float(value)
        raise _FieldError(f"expected float, got {_type_name(value)}")

    return load


_SCALARS: dict[type, Callable[[Mapping[str, Any]], Load]] = {
    int: _int_loader,
    str: _exact_loader(str),
    bytes: _exact_loader(bytes),
    bool: _exact_loader(bool),
    float: _float_loader,
}


def _compile_optional(tp: Any, meta: Mapping[str, Any], where: str) -> tuple[Load, Dump]:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) != 1 or len(typing.get_args(tp)) != 2:
        raise TypeError(f"{where}: only `X | None` unions are supported, got {tp!r}")
    inner_load, inner_dump = _compile(args[0], meta, where)

    def load(value: Any) -> Any:
        return None if value is None else inner_load(value)

    if inner_dump is None:
        return load, None
    return load, lambda value: None if value is None else inner_dump(value)


def _compile_list(item: Any, meta: Mapping[str, Any], where: str) -> tuple[Load, Dump]:
    item_load, item_dump = _compile(item, meta, where)

    def load(value: Any) -> list[Any]:
        if type(value) is not list:
            raise _FieldError(f"expected array, got {_type_name(value)}")
        out, i = [], 0
        try:
            for i, x in enumerate(value):
                out.append(item_load(x))
        except _FieldError as e:
            e.path.append(f"[{i}]")
            raise
        return out

    if item_dump is None:
        return load, None
    return load, lambda value: [item_dump(x) for x in value]


def _compile_dict(args: tuple[Any, ...], meta: Mapping[str, Any], where: str) -> tuple[Load, Dump]:
    if args[0] is not str:
        raise TypeError(f"{where}: dict keys must be str, got {args[0]!r}")
    item_load, item_dump = _compile(args[1], meta, where)

    def load(value: Any) -> dict[str, Any]:
        if type(value) is not dict:
            raise _FieldError(f"expected map, got {_type_name(value)}")
        out, key = {}, None
        try:
            for key, x in value.items():
                if type(key) is not str:
                    raise _FieldError(f"keys must be str, got {_type_name(key)}")
                out[key] = item_load(x)
        except _FieldError as e:
            e.path.append(f"[{key!r}]")
            raise
        return out

    if item_dump is None:
        return load, None
    return load, lambda value: {k: item_dump(x) for k, x in value.items()}


def _message_loader(cls: type[Message]) -> Load:
    # The plan is looked up at call time, so a message may (indirectly) contain itself.
    return lambda value: _plan_of(cls).load(value)


def _dump_message(message: Message) -> dict[str, Any]:
    return _plan_of(type(message)).dump(message)


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


def supported_api_versions() -> list[ApiVersion]:
    """``SUPPORTED_VERSIONS`` as the ApiVersions response lists it, by api key."""
    return [ApiVersion(int(key), low, high) for key, (low, high) in sorted(SUPPORTED_VERSIONS.items())]


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


# The typed body of each API, by key.
REQUESTS: dict[ApiKey, type[Message]] = {
    ApiKey.API_VERSIONS: ApiVersionsRequest,
    ApiKey.METADATA: MetadataRequest,
    ApiKey.CREATE_TOPICS: CreateTopicsRequest,
    ApiKey.DELETE_TOPICS: DeleteTopicsRequest,
    ApiKey.CREATE_PARTITIONS: CreatePartitionsRequest,
    ApiKey.DESCRIBE_CONFIGS: DescribeConfigsRequest,
    ApiKey.ALTER_CONFIGS: AlterConfigsRequest,
    ApiKey.PRODUCE: ProduceRequest,
    ApiKey.FETCH: FetchRequest,
    ApiKey.LIST_OFFSETS: ListOffsetsRequest,
    ApiKey.DELETE_RECORDS: DeleteRecordsRequest,
    ApiKey.OFFSETS_FOR_LEADER_EPOCH: OffsetsForLeaderEpochRequest,
    ApiKey.LEADER_AND_ISR: LeaderAndIsrRequest,
    ApiKey.UPDATE_METADATA: UpdateMetadataRequest,
    ApiKey.STOP_REPLICA: StopReplicaRequest,
    ApiKey.CONTROLLED_SHUTDOWN: ControlledShutdownRequest,
    ApiKey.ELECT_LEADERS: ElectLeadersRequest,
    ApiKey.FIND_COORDINATOR: FindCoordinatorRequest,
    ApiKey.JOIN_GROUP: JoinGroupRequest,
    ApiKey.SYNC_GROUP: SyncGroupRequest,
    ApiKey.HEARTBEAT: HeartbeatRequest,
    ApiKey.LEAVE_GROUP: LeaveGroupRequest,
    ApiKey.OFFSET_COMMIT: OffsetCommitRequest,
    ApiKey.OFFSET_FETCH: OffsetFetchRequest,
    ApiKey.LIST_GROUPS: ListGroupsRequest,
    ApiKey.DESCRIBE_GROUPS: DescribeGroupsRequest,
    ApiKey.DELETE_GROUPS: DeleteGroupsRequest,
    ApiKey.INIT_PRODUCER_ID: InitProducerIdRequest,
}
RESPONSES: dict[ApiKey, type[Message]] = {
    ApiKey.API_VERSIONS: ApiVersionsResponse,
    ApiKey.METADATA: MetadataResponse,
    ApiKey.CREATE_TOPICS: CreateTopicsResponse,
    ApiKey.DELETE_TOPICS: DeleteTopicsResponse,
    ApiKey.CREATE_PARTITIONS: CreatePartitionsResponse,
    ApiKey.DESCRIBE_CONFIGS: DescribeConfigsResponse,
    ApiKey.ALTER_CONFIGS: AlterConfigsResponse,
    ApiKey.PRODUCE: ProduceResponse,
    ApiKey.FETCH: FetchResponse,
    ApiKey.LIST_OFFSETS: ListOffsetsResponse,
    ApiKey.DELETE_RECORDS: DeleteRecordsResponse,
    ApiKey.OFFSETS_FOR_LEADER_EPOCH: OffsetsForLeaderEpochResponse,
    ApiKey.LEADER_AND_ISR: LeaderAndIsrResponse,
    ApiKey.UPDATE_METADATA: UpdateMetadataResponse,
    ApiKey.STOP_REPLICA: StopReplicaResponse,
    ApiKey.CONTROLLED_SHUTDOWN: ControlledShutdownResponse,
    ApiKey.ELECT_LEADERS: ElectLeadersResponse,
    ApiKey.FIND_COORDINATOR: FindCoordinatorResponse,
    ApiKey.JOIN_GROUP: JoinGroupResponse,
    ApiKey.SYNC_GROUP: SyncGroupResponse,
    ApiKey.HEARTBEAT: HeartbeatResponse,
    ApiKey.LEAVE_GROUP: LeaveGroupResponse,
    ApiKey.OFFSET_COMMIT: OffsetCommitResponse,
    ApiKey.OFFSET_FETCH: OffsetFetchResponse,
    ApiKey.LIST_GROUPS: ListGroupsResponse,
    ApiKey.DESCRIBE_GROUPS: DescribeGroupsResponse,
    ApiKey.DELETE_GROUPS: DeleteGroupsResponse,
    ApiKey.INIT_PRODUCER_ID: InitProducerIdResponse,
}
