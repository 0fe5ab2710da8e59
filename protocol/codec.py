"""The msgpack envelope, bounded msgpack, and the schema compiler of typed message bodies.

Envelope (the body of one frame; see ``protocol.frames`` for the length prefix)::

    request  := [api_key:int16, api_version:int16, correlation_id:int32, client_id:str|nil, body:map]
    response := [correlation_id:int32, body:map]
    body     := map with str keys

Decoding is two steps, so each failure maps to one error code:

1. ``decode_request`` checks the envelope only. Bad bytes, a wrong shape or an out-of-range
   header raise InvalidRequestError (INVALID_REQUEST) and nothing else; the error carries
   ``correlation_id`` (None if it could not be read) so a server can still answer in order.
   An unknown api_key is not a decode error: the header keeps the raw number.
2. ``protocol.apis.api_for`` raises UnsupportedVersionError (UNSUPPORTED_VERSION) for an API
   this node does not serve or a version outside its range; then the API's request type
   (``Message.from_body``) turns the body map into its typed message, or raises
   InvalidRequestError naming the field path
   (``topics[2].partitions[0].partition: expected int, got str``).

msgpack is always unpacked with explicit bounds (container lengths, no ext types, str keys
only) and a bound on the *total* number of objects a frame may decode into:
``max(MAX_OBJECTS_FLOOR, len(frame) // BYTES_PER_OBJECT)``. Container lengths alone do not
bound memory: an empty map is one byte on the wire and ~70 bytes of Python objects, so 99 MiB
of empty maps decoded into 7.4 GB. A frame no larger than the floor cannot hold more objects
than it has bytes, so it is decoded as it is; a larger one is decoded with hooks that count
every container and its elements as it completes and stop the decoding (INVALID_REQUEST) once
the count passes the bound. So a frame costs at most about ``max(110 MB, 1.6 x its size)`` of
decoded objects (bench/RESULTS.md, "Decoding hostile frames"), and a real request (record
batches travel as ``bin``: a few objects per partition) never comes near the bound.

Typed bodies (``protocol.messages``): one frozen dataclass per request and per response,
subclassing ``Message``. Field annotations drive both validation and encoding; the plan for a
class is built once, on first use, and cached. Unknown keys in a body are ignored (a newer
peer may send more fields); missing fields take their defaults; missing required fields are
an error.
"""

from __future__ import annotations

import dataclasses
import threading
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple, Self

import msgpack

from tidelog.protocol.errors import InvalidRequestError

INT8 = types.MappingProxyType({"min": -(1 << 7), "max": (1 << 7) - 1})
INT16 = types.MappingProxyType({"min": -(1 << 15), "max": (1 << 15) - 1})
INT32 = types.MappingProxyType({"min": -(1 << 31), "max": (1 << 31) - 1})
INT64 = types.MappingProxyType({"min": -(1 << 63), "max": (1 << 63) - 1})

MAX_CONTAINER_LEN = 1 << 20  # elements in one msgpack array or map
# Objects one frame may decode into: at least MAX_OBJECTS_FLOOR, else one per BYTES_PER_OBJECT
# bytes of frame. The densest real frames (LeaderAndIsr, UpdateMetadata, Metadata responses)
# take 6-8 bytes per object, so the floor covers ~100,000 partitions in one of them; the worst
# object costs ~100 bytes (a one-entry map), so the floor is ~100 MB of decoded objects.
MAX_OBJECTS_FLOOR = 1 << 20
BYTES_PER_OBJECT = 64


class ApiKey(IntEnum):
    """Kafka's API numbers, so the vocabulary (and packet captures) transfer. Naming a key
    here serves nothing: what a node serves is ``protocol.apis.APIS``."""

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
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    ELECT_LEADERS = 43
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60


_API_KEYS: dict[int, ApiKey] = {int(k): k for k in ApiKey}



# ---------------------------------------------------------------------------------------------
# envelope


class RequestHeader(NamedTuple):
    """The envelope fields of a request. ``api_key`` is an ApiKey when known, else the raw int.
    (A tuple: one is made per request, in one call.)"""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None = None


def encode_request(header: RequestHeader, body: dict[str, Any] | Message) -> bytes:
    """The frame body of a request (without the length prefix). Raises ValueError/TypeError
    for a header out of range or a body that is not a map with str keys."""
    api_key, api_version, correlation_id, client_id = (header.api_key, header.api_version,
                                                       header.correlation_id, header.client_id)
    # an ApiKey packs as its number; another IntEnum is converted, anything else worded
    if not ((type(api_key) is int or type(api_key) is ApiKey) and -0x8000 <= api_key <= 0x7FFF
            and type(api_version) is int and -0x8000 <= api_version <= 0x7FFF
            and type(correlation_id) is int and -0x80000000 <= correlation_id <= 0x7FFFFFFF):
        for name, value, bounds in (("api_key", api_key, INT16), ("api_version", api_version, INT16),
                                    ("correlation_id", correlation_id, INT32)):
            if (problem := _int_problem(value, bounds)) is not None:
                raise ValueError(f"request {name}: {problem}")
        api_key, api_version, correlation_id = int(api_key), int(api_version), int(correlation_id)
    if client_id is not None and type(client_id) is not str:
        raise TypeError(f"request client_id: expected str or None, got {_type_name(client_id)}")
    return pack([api_key, api_version, correlation_id, client_id, _body_map(body)])


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
    if type(correlation_id) is not int or not -0x80000000 <= correlation_id <= 0x7FFFFFFF:
        if (problem := _int_problem(correlation_id, INT32)) is not None:
            raise ValueError(f"response correlation_id: {problem}")
        correlation_id = int(correlation_id)
    return pack([correlation_id, _body_map(body)])


def decode_response(frame: bytes | bytearray | memoryview) -> tuple[int, dict[str, Any]]:
    """Parse a response frame body into ``(correlation_id, body)``, or raise
    InvalidRequestError (with ``correlation_id`` as for ``decode_request``)."""
    try:
        return _parse_response(_unpack(frame, "response"))
    except InvalidRequestError as e:
        e.correlation_id = _salvage_correlation_id(frame, index=0)
        raise



def _parse_request(items: Any) -> tuple[RequestHeader, dict[str, Any]]:
    # the usual request, checked in one expression; anything else takes the checks that word
    # the error
    if type(items) is list and len(items) == 5:
        api_key, api_version, correlation_id, client_id, body = items
        if (type(api_key) is int and -0x8000 <= api_key <= 0x7FFF and type(api_version) is int
                and -0x8000 <= api_version <= 0x7FFF and type(correlation_id) is int
                and -0x80000000 <= correlation_id <= 0x7FFFFFFF
                and (client_id is None or type(client_id) is str) and type(body) is dict and _str_keys(body)):
            return RequestHeader(_API_KEYS.get(api_key, api_key), api_version, correlation_id, client_id), body
    return _parse_request_checked(items)


def _parse_request_checked(items: Any) -> tuple[RequestHeader, dict[str, Any]]:
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
    if type(items) is list and len(items) == 2:  # the usual response (see _parse_request)
        correlation_id, body = items
        if (type(correlation_id) is int and -0x80000000 <= correlation_id <= 0x7FFFFFFF and type(body) is dict
                and _str_keys(body)):
            return correlation_id, body
    return _parse_response_checked(items)


def _str_keys(body: dict) -> bool:
    for key in body:
        if type(key) is not str:
            return False
    return True


def _parse_response_checked(items: Any) -> tuple[int, dict[str, Any]]:
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
    if not isinstance(body, dict) or not _str_keys(body):
        raise TypeError(f"a message body must be a dict with str keys or a Message, got {_shape(body)}")
    return body


# ---------------------------------------------------------------------------------------------
# bounded msgpack


# Packers reused, from a small pool: ``msgpack.packb`` builds a Packer (its buffer allocated)
# and frees it on every call, ~2 us more than a reused one's ``pack`` when the caches are cold,
# as on a request's path at a low rate (``bench/path_bench.py cold``). A packer leaves the pool
# while it packs (``list.pop`` and ``append`` are atomic), so two threads, or a ``pack`` reached
# again during one (a finalizer run inside it), never share one. A packer whose ``pack`` raised,
# or that packed REUSE_PACKER_BELOW bytes or more, is not put back, and the pool keeps about
# PACKER_POOL: no large buffer is kept.
REUSE_PACKER_BELOW = 256 << 10
PACKER_POOL = 4
_PACKER_BUFFER = 16 << 10  # the buffer a packer starts with (msgpack's default: 256 KiB)
_packers: list[msgpack.Packer] = []


def pack(value: Any) -> bytes:
    """``msgpack.packb(value, use_bin_type=True)``, with a reused packer."""
    try:
        packer = _packers.pop()
    except IndexError:
        packer = msgpack.Packer(use_bin_type=True, buf_size=_PACKER_BUFFER)
    out = packer.pack(value)
    if len(out) < REUSE_PACKER_BELOW and len(_packers) < PACKER_POOL:
        _packers.append(packer)
    return out


def _reject_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} is not allowed")


def max_objects(size: int) -> int:
    """How many objects (values, map entries and containers) a frame of ``size`` bytes may
    decode into."""
    return max(MAX_OBJECTS_FLOOR, size // BYTES_PER_OBJECT)


def _unpack_options(size: int) -> dict[str, Any]:
    containers = min(size, MAX_CONTAINER_LEN)
    return dict(raw=False, use_list=True, strict_map_key=True, ext_hook=_reject_ext,
                max_ext_len=0, max_str_len=size, max_bin_len=size,
                max_array_len=containers, max_map_len=containers)


# Everything msgpack documents (and a few it does not) for malformed input.
_UNPACK_ERRORS = (ValueError, TypeError, OverflowError, msgpack.UnpackException)


class _TooManyObjects(Exception):
    """Internal: raised by the counting hooks to stop a decoding at the object bound."""


def _counting_hooks(budget: int) -> dict[str, Callable[[Any], Any]]:
    """``list_hook`` and ``object_hook`` that count every container and its elements (an
    array's items, a map's values): every object of the frame but the map keys (which msgpack
    interns), containers once more (they cost the most: an empty map is ~70 bytes), and stop
    the decoding past ``budget``. msgpack calls a hook when a container is complete, so at most
    one array's scalars (bounded by ``max_array_len``) are decoded beyond the budget."""
    left = budget

    def count(container: Any) -> Any:
        nonlocal left
        left -= len(container) + 1
        if left < 0:
            raise _TooManyObjects
        return container

    return {"list_hook": count, "object_hook": count}


def _unpack(frame: bytes | bytearray | memoryview, what: str) -> Any:
    size = len(frame)
    budget = MAX_OBJECTS_FLOOR  # max_objects(size) for any frame at or below the floor
    try:
        if size <= budget:  # it cannot hold more objects than it has bytes: nothing to count
            # _unpack_options spelled out: building its dict costs more than a small frame
            containers = min(size, MAX_CONTAINER_LEN)
            return msgpack.unpackb(frame, raw=False, use_list=True, strict_map_key=True, ext_hook=_reject_ext,
                                   max_ext_len=0, max_str_len=size, max_bin_len=size,
                                   max_array_len=containers, max_map_len=containers)
        budget = max_objects(size)
        return msgpack.unpackb(frame, **_unpack_options(size), **_counting_hooks(budget))
    except _TooManyObjects:
        raise InvalidRequestError(
            f"{what} frame of {size} bytes decodes into more than {budget} objects (the bound: one per "
            f"{BYTES_PER_OBJECT} bytes of frame, at least {MAX_OBJECTS_FLOOR})") from None
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
        return _dump_any(self)

    @classmethod
    def from_body(cls, body: Any) -> Self:
        """The message for a decoded body map, or InvalidRequestError naming the field path."""
        try:
            return (_FAST_LOADS.get(cls) or _fast_loader(cls))(body)
        except (_Slow, ValueError):  # the interpreted plan decides, and words the error
            pass
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
# generated loaders and dumpers
#
# The plans above interpret a class's fields through a closure per field; they are the
# reference, and the only place an error is worded. For speed (every request and response
# passes through them: bench/RESULTS.md, "Typed bodies, generated"), each class also gets a
# loader and a dumper generated as Python source from the same annotations: straight-line
# checks and one constructor call per message, nested messages written in (up to
# ``MAX_INLINE_DEPTH``) rather than called. The generated loader accepts exactly what the plan
# accepts and builds the same message; anything it does not accept (a missing or mistyped
# field, an int out of range, a ``__post_init__`` rule) raises ``_Slow`` (or the rule's
# ValueError), and ``from_body`` runs the plan, which raises the error naming the field path
# (or, if the two ever disagreed, returns the plan's message).


class _Slow(Exception):
    """Internal: the generated loader does not accept the body; the plan decides."""


_MISSING = object()  # a field absent from the body
_FAST_LOADS: dict[type, Callable[[Any], Any]] = {}
_FAST_DUMPS: dict[type, Callable[[Any], dict[str, Any]]] = {}
_LOADS_GENERATING: set[type] = set()  # under _GENERATE_LOCK
_DUMPS_GENERATING: set[type] = set()
_GENERATE_LOCK = threading.RLock()


class _Source:
    """The lines and namespace of one generated function."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {"_Slow": _Slow, "_MISSING": _MISSING}
        self._names = 0

    def name(self, prefix: str, value: Any = _MISSING) -> str:
        self._names += 1
        name = f"{prefix}{self._names}"
        if value is not _MISSING:
            self.ns[name] = value
        return name

    def build(self, fn: str, what: str) -> Callable[..., Any]:
        code = compile("\n".join(self.lines), f"<{fn} of {what}>", "exec")
        exec(code, self.ns)
        return self.ns[fn]


def _fast_loader(cls: type) -> Callable[[Any], Any]:
    """The generated loader of ``cls`` (built on first use, then cached)."""
    with _GENERATE_LOCK:  # once per class, also when two threads meet it first together
        if (load := _FAST_LOADS.get(cls)) is not None:
            return load
        plan = _plan_of(cls)  # the reference: raises TypeError for an unsupported class
        if cls in _LOADS_GENERATING:  # a class that contains itself: looked up when called
            # (another thread calling it meanwhile waits for the lock, not for a KeyError)
            return lambda body: (_FAST_LOADS.get(cls) or _fast_loader(cls))(body)
        _LOADS_GENERATING.add(cls)
        try:
            load = _generate_loader(cls, plan)
        finally:
            _LOADS_GENERATING.discard(cls)
        _FAST_LOADS[cls] = load
        return load


def _generate_loader(cls: type, plan: _Plan) -> Callable[[Any], Any]:
    src = _Source()
    src.lines.append("def load(body):")
    _emit_message_load(src, cls, plan, "body", "    ", (cls,))
    src.lines.append("    return body")
    return src.build("load", cls.__name__)


# Messages nested this deep (the loaded class counts) have their loading and dumping written
# into their container's function: a ProduceRequest is loaded, and a FetchResponse dumped,
# by one call rather than one per nested message and list (they run for every produce and
# fetch). A class that contains itself is called, never written in.
MAX_INLINE_DEPTH = 4


def _inlinable(cls: type, inlined: tuple[type, ...]) -> bool:
    return cls not in inlined and len(inlined) < MAX_INLINE_DEPTH


def _emit_message_load(src: _Source, cls: type, plan: _Plan, var: str, ind: str,
                       inlined: tuple[type, ...]) -> None:
    """Lines that check the body map in ``var`` field by field (raising ``_Slow`` where the
    plan would raise) and rebind ``var`` to the ``cls`` message, as ``plan.load``;
    ``inlined``: the classes being written in, ``cls`` last."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    get = src.name("get")
    src.lines += [f"{ind}if type({var}) is not dict: raise _Slow", f"{ind}{get} = {var}.get"]
    values = []  # (field name, the variable holding its value)
    for row in plan.fields:
        f, v = fields[row.name], src.name("v")
        src.lines.append(f"{ind}{v} = {get}({row.name!r}, _MISSING)")
        if row.required:  # _MISSING fails every check
            _emit_load(src, hints[row.name], f.metadata, v, ind, inlined)
        else:
            default = (src.name("factory", f.default_factory) + "()"
                       if f.default is dataclasses.MISSING else src.name("default", f.default))
            src.lines += [f"{ind}if {v} is _MISSING:", f"{ind}    {v} = {default}", f"{ind}else:"]
            _emit_load(src, hints[row.name], f.metadata, v, ind + "    ", inlined)
        values.append((row.name, v))
    c = src.name("cls", cls)
    if _plain_init(cls):  # set the slots without the frozen __init__'s setattr calls
        src.ns["_new"] = object.__new__
        m = src.name("m")
        src.lines.append(f"{ind}{m} = _new({c})")
        for name, v in values:
            src.lines.append(f"{ind}{src.name('set', cls.__dict__[name].__set__)}({m}, {v})")
        src.lines.append(f"{ind}{var} = {m}")
    else:
        src.lines.append(f"{ind}{var} = {c}({', '.join(f'{name}={v}' for name, v in values)})")


def _plain_init(cls: type) -> bool:
    """Whether making ``cls`` does nothing but set each field's slot: a slotted dataclass
    whose ``__init__`` is the one the dataclass decorator wrote (its source is a string:
    CPython 3.11 compiles it from one), with every field in it, no ``__post_init__`` and no
    ``__new__`` of its own."""
    init = cls.__dict__.get("__init__")
    return (cls.__dataclass_params__.init and getattr(getattr(init, "__code__", None), "co_filename", "") == "<string>"
            and cls.__new__ is object.__new__ and not hasattr(cls, "__post_init__") and "__slots__" in cls.__dict__
            and all(f.init and isinstance(cls.__dict__.get(f.name), types.MemberDescriptorType)
                    for f in dataclasses.fields(cls)))


def _emit_load(src: _Source, tp: Any, meta: Mapping[str, Any], var: str, ind: str,
               inlined: tuple[type, ...]) -> None:
    """Lines that check the decoded value in ``var`` against ``tp`` (raising ``_Slow`` where
    the plan would raise) and rebind ``var`` to the loaded value, as ``_compile``'s loader."""
    origin = typing.get_origin(tp)
    if tp is int:
        cond = f"type({var}) is not int"
        if meta.get("min") is not None:  # the bounds as _int_problem compares them
            cond += f" or {var} < {src.name('low', meta['min'])}"
        if meta.get("max") is not None:
            cond += f" or {var} > {src.name('high', meta['max'])}"
        src.lines.append(f"{ind}if {cond}: raise _Slow")
    elif tp in (str, bytes, bool):
        src.lines.append(f"{ind}if type({var}) is not {tp.__name__}: raise _Slow")
    elif tp is float:
        src.lines += [f"{ind}if type({var}) is not float:",
                      f"{ind}    if type({var}) is not int: raise _Slow",
                      f"{ind}    {var} = float({var})"]
    elif origin is typing.Union or origin is types.UnionType:
        [inner] = [a for a in typing.get_args(tp) if a is not type(None)]
        src.lines.append(f"{ind}if {var} is not None:")
        _emit_load(src, inner, meta, var, ind + "    ", inlined)
    elif origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(item, type) and issubclass(item, Message) and not _inlinable(item, inlined):
            load = src.name("load", _fast_loader(item))
            src.lines += [f"{ind}if type({var}) is not list: raise _Slow",
                          f"{ind}{var} = [{load}(x) for x in {var}]"]
            return
        out, x = src.name("out"), src.name("x")
        src.lines += [f"{ind}if type({var}) is not list: raise _Slow", f"{ind}{out} = []",
                      f"{ind}for {x} in {var}:"]
        _emit_load(src, item, meta, x, ind + "    ", inlined)
        src.lines += [f"{ind}    {out}.append({x})", f"{ind}{var} = {out}"]
    elif origin is dict:
        _, item = typing.get_args(tp)
        out, k, x = src.name("out"), src.name("k"), src.name("x")
        src.lines += [f"{ind}if type({var}) is not dict: raise _Slow", f"{ind}{out} = {{}}",
                      f"{ind}for {k}, {x} in {var}.items():", f"{ind}    if type({k}) is not str: raise _Slow"]
        _emit_load(src, item, meta, x, ind + "    ", inlined)
        src.lines += [f"{ind}    {out}[{k}] = {x}", f"{ind}{var} = {out}"]
    elif isinstance(tp, type) and issubclass(tp, Message):
        if _inlinable(tp, inlined):
            _emit_message_load(src, tp, _plan_of(tp), var, ind, (*inlined, tp))
        else:
            src.lines.append(f"{ind}{var} = {src.name('load', _fast_loader(tp))}({var})")
    else:  # _plan_of accepted the class, so this cannot happen
        raise TypeError(f"unsupported field type {tp!r}")


def _fast_dumper(cls: type) -> Callable[[Any], dict[str, Any]]:
    """The generated dumper of ``cls``: the plan's ``dump`` as one dict display."""
    with _GENERATE_LOCK:
        if (dump := _FAST_DUMPS.get(cls)) is not None:
            return dump
        plan = _plan_of(cls)
        if cls in _DUMPS_GENERATING:
            return _dump_any
        _DUMPS_GENERATING.add(cls)
        try:
            src = _Source()
            src.lines += ["def dump(m):", f"    return {_dump_display(src, cls, plan, 'm', (cls,))}"]
            dump = src.build("dump", cls.__name__)
        finally:
            _DUMPS_GENERATING.discard(cls)
        _FAST_DUMPS[cls] = dump
        return dump


def _dump_display(src: _Source, cls: type, plan: _Plan, m: str, inlined: tuple[type, ...]) -> str:
    """A dict display of the ``cls`` message ``m``'s fields, as ``plan.dump`` gives them."""
    hints = typing.get_type_hints(cls)
    items = [f"{row.name!r}: {_dump_expr(src, hints[row.name], f'{m}.{row.name}', inlined)}"
             for row in plan.fields]
    return f"{{{', '.join(items)}}}"


def _dump_expr(src: _Source, tp: Any, expr: str, inlined: tuple[type, ...]) -> str:
    """An expression for the msgpack-able form of ``expr`` (of type ``tp``), as ``_compile``'s
    dumper: values that need no dumping are used as they are."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        [inner] = [a for a in typing.get_args(tp) if a is not type(None)]
        t = src.name("t")
        inner_expr = _dump_expr(src, inner, t, inlined)
        return expr if inner_expr == t else f"(None if ({t} := {expr}) is None else {inner_expr})"
    if origin is list:
        x = src.name("x")
        item = _dump_expr(src, typing.get_args(tp)[0], x, inlined)
        return expr if item == x else f"[{item} for {x} in {expr}]"
    if origin is dict:
        k, x = src.name("k"), src.name("x")
        item = _dump_expr(src, typing.get_args(tp)[1], x, inlined)
        return expr if item == x else f"{{{k}: {item} for {k}, {x} in {expr}.items()}}"
    if isinstance(tp, type) and issubclass(tp, Message):
        # an instance of another class (a subclass) dumps by its own class, as the plan's
        # dumper does
        cls, t = src.name("cls", tp), src.name("t")
        src.ns["_dump_any"] = _dump_any
        if _inlinable(tp, inlined):
            own = _dump_display(src, tp, _plan_of(tp), t, (*inlined, tp))
        else:
            own = f"{src.name('dump', _fast_dumper(tp))}({t})"
        return f"({own} if type({t} := {expr}) is {cls} else _dump_any({t}))"
    return expr


def _dump_any(message: Any) -> dict[str, Any]:
    """The generated dumper of ``message``'s own class (``_dump_message``'s counterpart)."""
    cls = type(message)
    return (_FAST_DUMPS.get(cls) or _fast_dumper(cls))(message)
