"""A fuzzer of the Kafka listener's request path (protocol/kafka): the inputs, and a driver
that sends them on several pipelined connections and judges every answer. The Kafka
counterpart of ``tests.support.fuzz`` (the native listener's fuzzer), built the same way: both
drive their lanes with ``tests.support.fuzz_lanes``.

Inputs (``Generator``), each the exact bytes to write:

- ``valid``: a request of a random API of ``KAFKA_APIS`` at a random served version, its
  body built from Kafka's JSON spec of that version (``Sampler``: every field the version
  carries, tagged ones included, values that name only the fuzz topics and groups), some of
  its values set to extremes of their type (ints at their bounds, long or odd strings, null
  or empty arrays, lists grown to the frame limit), encoded with the listener's own codec
  (``schema.codec(...).encode``). Every such frame decodes: the connection must stay open.
- ``batch``: a valid Produce whose records are a mutated Kafka v2 record batch (a 61-byte
  header around ``records.encode_records``): bytes flipped with and without the CRC-32C
  recomputed, header fields that lie (count, last offset delta, length, magic, attributes,
  producer fields), records blocks whose varints lie, compressed blocks (gzip, snappy, lz4,
  zstd) of garbage, torn, under the wrong codec, bombs, several batches back to back.
- ``frame``: a valid request (or a ``batch`` one) whose bytes are then mutated, with a
  correct length prefix: bytes flipped, cut short, trailing bytes, a length or count prefix
  (found by ``encode_tracked``) set to -1, -2, 2^31-1, a lie or a huge or over-long varint,
  a fixed int field at an extreme, tagged fields with unknown, duplicated or out-of-order
  tags or lying sizes, an unsupported version, an API key not served (the inter-broker
  4, 5, 6, 7 among them), a header of the wrong version, a client id that lies, random bytes.
- ``stream``: bytes for a connection of their own, then end-of-stream: random bytes, a
  length prefix beyond the frame limit, a frame cut short, frames then garbage.

Every input is a pure function of ``(seed, lane, number)`` (its correlation id is its
number), so ``replay(seed, lane, number, lane_kind)`` rebuilds an input a finding names.

The oracle (``Driver``). What the broker should do with each frame is predicted by the
listener's own sans-IO decoder (``KafkaServerConnection.decode``, pure and thread-safe):
a frame it decodes gets one response (an acks=0 Produce may get none, and end its connection
if it failed, as Kafka's does), a frame it refuses
closes the connection, after the answers to the frames before it. So: every response is a
well-formed Kafka response (the response header, then a body that decodes exactly with
the response codec of the version asked, or KIP-511's v0 ApiVersions answer), with the
correlation id of the next request awaiting one, in order; no response carries
UNKNOWN_SERVER_ERROR; the broker closes a connection only after a frame it cannot answer
(or the end of a stream), and every connection that should close does; nothing waits more
than ``hang_s`` without an answer; the decoder raises nothing but its own errors. ``check``
(the test's well-behaved client) is called every ``check_every_s`` while the lanes'
requests are in flight.

One refusal of a valid request is counted, not failed (``Stats.dense``): a list grown to the
frame limit with small entries (a config entry is a few bytes, and three values) can pass
the object bound the decoder applies to every frame (``schema.Reader``: ``codec.max_objects``
of the frame's size), and the listener closes the connection as for any frame it refuses.
"""

from __future__ import annotations

import copy
import socket
import struct
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from random import Random
from typing import Any

from crc32c import crc32c

from tests.support import fuzz_lanes
from tests.support.fuzz_lanes import PROBE_CORRELATION_ID, BatchMutations, LaneDriver, frame, wrap
from tidelog.protocol.codec import ApiKey
from tidelog.protocol.connection import BadRequest
from tidelog.protocol.errors import UNKNOWN_SERVER_ERROR, TidelogError
from tidelog.protocol.kafka.apis import KAFKA_APIS
from tidelog.protocol.kafka.connection import KafkaRequest, KafkaServerConnection
from tidelog.protocol.kafka.records import encode_records
from tidelog.protocol.kafka.schema import (
    Reader,
    _structs_of,
    _within,
    codec,
    flexible_versions,
    parse_versions,
    snake,
    spec,
    write_uvarint,
)
from tidelog.protocol.records import Codec, compress

SERVED = tuple(sorted(KAFKA_APIS))
INTER_BROKER = (4, 5, 6, 7)  # LeaderAndIsr, StopReplica, UpdateMetadata, ControlledShutdown
UNSERVED = tuple(sorted({*range(0, 75), 1000, 32767, -1, -32768} - set(KAFKA_APIS)))
# APIs that may legitimately wait (a long poll, a rebalance): their values are kept short
WAITING = frozenset({ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
API_VERSIONS = int(ApiKey.API_VERSIONS)
PRODUCE = int(ApiKey.PRODUCE)

_FIXED = {"int8": ">b", "int16": ">h", "uint16": ">H", "int32": ">i", "int64": ">q", "float64": ">d"}
_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_HEAD = struct.Struct(">hhi")
# the timestamp of every generated record and query: a constant, so inputs are pure functions of
# (seed, lane, number) (records older than the retention are the fuzz topics' business)
TIMESTAMP_MS = 1_790_000_000_000


def is_flexible(spec_name: str, version: int) -> bool:
    return _within(flexible_versions(spec_name), version)


# -- a message's shape at one version, from its JSON spec ------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One field as a version sees it: ``kind`` a primitive type name, ``"array"`` (``item``
    its element) or ``"struct"`` (``fields`` the struct's, ``tags`` whether it ends with a
    tagged-fields section)."""
    key: str
    kind: str
    nullable: bool = False
    flexible: bool = False
    tag: int | None = None
    default: Any = None
    item: Shape | None = None
    fields: tuple[Shape, ...] = ()
    tags: bool = False


def _default(f: dict, kind: str, nullable: bool) -> Any:
    text = f.get("default")
    text = None if text is None else str(text).lower()
    if kind.startswith("[]"):
        return None if text == "null" else []
    if kind in _BITS or kind == "uint16":
        return 0 if text is None else int(text, 0)
    if kind == "float64":
        return 0.0 if text is None else float(text)
    if kind == "bool":
        return text == "true"
    if kind == "string":
        return None if text == "null" and nullable else (text or "")
    if kind in ("bytes", "records"):
        return None if nullable and text == "null" else b""
    if kind == "uuid":
        return bytes(16)
    return None if nullable and text == "null" else {}


def _type_shape(key: str, kind: str, f: dict, v: int, flexible: bool, nullable: bool, structs: dict) -> Shape:
    if kind.startswith("[]"):
        item = _type_shape(key, kind[2:], f, v, flexible, False, structs)
        return Shape(key, "array", nullable, flexible, item=item)
    if kind in _FIXED or kind in ("bool", "uuid", "string", "bytes", "records"):
        return Shape(key, kind, nullable, flexible)
    fields = f["fields"] if "fields" in f and f["type"].removeprefix("[]") == kind else structs[kind]
    return Shape(key, "struct", nullable, flexible, fields=_fields(fields, v, flexible, structs), tags=flexible)


def _fields(fields: list, v: int, flexible: bool, structs: dict) -> tuple[Shape, ...]:
    out = []
    for f in fields:
        if not _within(parse_versions(f.get("versions")), v):
            continue
        nullable = _within(parse_versions(f.get("nullableVersions")), v)
        tagged = "tag" in f and _within(parse_versions(f.get("taggedVersions")), v)
        field_flexible = flexible and f.get("flexibleVersions") != "none"
        s = _type_shape(snake(f["name"]), f["type"], f, v, field_flexible, nullable, structs)
        out.append(Shape(s.key, s.kind, s.nullable, s.flexible, f["tag"] if tagged else None,
                         _default(f, f["type"], nullable), s.item, s.fields, s.tags))
    return tuple(out)


_SHAPES: dict[tuple[str, int], Shape] = {}


def shape(name: str, version: int) -> Shape:
    """The top-level struct of message ``name`` at ``version``."""
    key = (name, version)
    if key not in _SHAPES:
        doc = spec(name)
        flexible = is_flexible(name, version)
        _SHAPES[key] = Shape(name, "struct", flexible=flexible, fields=_fields(doc["fields"], version, flexible,
                                                                               _structs_of(doc)), tags=flexible)
    return _SHAPES[key]


# -- encoding that remembers where the lengths, counts, ints and tags are ------------------------


@dataclass(frozen=True)
class Slot:
    """A place in an encoded body: ``kind`` is ``len16``/``len32`` (a fixed length or count),
    ``uvar`` (a compact one, value + 1), ``int`` (``fmt`` its struct format), or ``tags`` (a
    tagged-fields count; ``known`` the tags the struct defines)."""
    offset: int
    kind: str
    size: int
    fmt: str = ""
    known: tuple[int, ...] = ()


class Tracked:
    """``encode_tracked``'s walk: the bytes, as ``codec(...).encode`` writes them, and the slots."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.slots: list[Slot] = []

    def length(self, s: Shape, n: int | None, fixed: str) -> None:
        at = len(self.out)
        if s.flexible:
            write_uvarint(self.out, 0 if n is None else n + 1)
            self.slots.append(Slot(at, "uvar", len(self.out) - at))
        else:
            self.out += struct.pack(fixed, -1 if n is None else n)
            self.slots.append(Slot(at, "len16" if fixed == ">h" else "len32", struct.calcsize(fixed)))

    def value(self, s: Shape, x: Any) -> None:
        kind = s.kind
        if kind in _FIXED:
            if kind in _BITS:
                self.slots.append(Slot(len(self.out), "int", struct.calcsize(_FIXED[kind]), _FIXED[kind]))
            self.out += struct.pack(_FIXED[kind], x)
        elif kind == "bool":
            self.out.append(1 if x else 0)
        elif kind == "uuid":
            self.out += x or bytes(16)
        elif kind == "string":
            if x is None:
                self.length(s, None if s.nullable else 0, ">h")
            else:
                data = x.encode()
                self.length(s, len(data), ">h")
                self.out += data
        elif kind in ("bytes", "records"):
            if x is None:
                self.length(s, None if s.nullable else 0, ">i")
            else:
                self.length(s, len(x), ">i")
                self.out += x
        elif kind == "array":
            if x is None:
                self.length(s, None if s.nullable else 0, ">i")
            elif type(x) is Repeated and x:
                self.length(s, len(x), ">i")
                at = len(self.out)
                self.value(s.item, x[0])  # its slots, once
                self.out += self.out[at:] * (len(x) - 1)
            else:
                self.length(s, len(x), ">i")
                for item in x:
                    self.value(s.item, item)
        elif s.nullable:
            if x is None:
                self.out.append(0xFF)
            else:
                self.out.append(1)
                self.struct(s, x)
        else:
            self.struct(s, {} if x is None else x)

    def struct(self, s: Shape, x: dict) -> None:
        tagged = []
        for f in s.fields:
            if f.tag is not None:
                tagged.append(f)
            else:
                self.value(f, x[f.key] if f.key in x else f.default)
        if s.tags:
            present = []
            for f in sorted(tagged, key=lambda t: t.tag):
                if f.key not in x or x[f.key] == f.default:
                    continue
                sub = Tracked()
                sub.value(f, x[f.key])
                present.append((f.tag, sub))
            self.slots.append(Slot(len(self.out), "tags", 1, known=tuple(sorted(t.tag for t in tagged))))
            write_uvarint(self.out, len(present))
            for tag, sub in present:
                write_uvarint(self.out, tag)
                write_uvarint(self.out, len(sub.out))
                base = len(self.out)
                self.out += sub.out
                self.slots += [Slot(base + sl.offset, sl.kind, sl.size, sl.fmt, sl.known) for sl in sub.slots]


def encode_tracked(name: str, version: int, body: dict) -> tuple[bytes, list[Slot]]:
    """``codec(name, version).encode(body)`` (the unit tests check they agree) with its slots."""
    t = Tracked()
    t.struct(shape(name, version), body)
    return bytes(t.out), t.slots


# -- valid bodies -------------------------------------------------------------------------------


@dataclass
class Names:
    """What the generated requests name: the fuzz topics (never the well-behaved client's),
    topics CreateTopics, CreatePartitions and DeleteTopics may churn, and groups."""
    topics: tuple[str, ...] = ("kfuzz-a", "kfuzz-b")
    churn: tuple[str, ...] = ("kfuzz-c", "kfuzz-d", "kfuzz-e")
    groups: tuple[str, ...] = ("kfuzz-g1", "kfuzz-g2")
    partitions: int = 2


CONFIGS = (("retention.ms", "600000"), ("cleanup.policy", "compact"), ("cleanup.policy", "delete"),
           ("max.message.bytes", "100000"), ("min.insync.replicas", "1"), ("segment.bytes", "1048576"),
           ("compression.type", "gzip"), ("retention.bytes", "100000"), ("no.such.config", "1"),
           ("retention.ms", "-1"), ("retention.ms", "x"))
ODD_STRINGS = ("", "..", "/", "\x00", "é😀", "x" * 250, "x" * 300, "\u202e\ufeff", "%s%n", "__consumer_offsets",
               "a" * 5000)
CHURNING = frozenset({ApiKey.CREATE_TOPICS, ApiKey.CREATE_PARTITIONS, ApiKey.DELETE_TOPICS})


def _int_extremes(kind: str) -> tuple[int, ...]:
    bits = _BITS.get(kind, 16)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if kind == "uint16":
        low, high = 0, 65535
    return tuple(x for x in (0, -1, -2, 1, low, high, 2**31 - 1, -2**31, 127, -128) if low <= x <= high)


class Sampler:
    """Bodies of one API at one version, field by field from its spec. ``extreme_p``: the
    chance each value is set to an extreme of its type instead (what was done is in ``done``)."""

    def __init__(self, rng: Random, names: Names, records: Callable[[], bytes], max_frame_bytes: int):
        self.rng, self.names, self.records, self.max_frame_bytes = rng, names, records, max_frame_bytes
        self.api = 0
        self.extreme_p = 0.0
        self.done: list[str] = []
        self.grown = False  # a list of this body was grown to the frame limit already

    def body(self, api_key: int, version: int, extreme_p: float = 0.0) -> dict:
        self.api, self.extreme_p, self.done, self.grown = api_key, extreme_p, [], False
        s = shape(KAFKA_APIS[api_key].request_spec, version)
        return self.struct(s, "")

    def struct(self, s: Shape, path: str) -> dict:
        out = {}
        for f in s.fields:
            if f.tag is not None and self.rng.random() < 0.7:
                continue  # a tagged field is mostly left out, so at its default
            value = self.value(f, f"{path}.{f.key}")
            if f.tag is not None and value == f.default:
                continue
            out[f.key] = value
        return out

    def value(self, f: Shape, path: str) -> Any:
        r = self.rng
        if f.kind not in ("struct",) and self.extreme_p and r.random() < self.extreme_p and not _keep(f.key):
            x = self.extreme(f, path)
            self.done.append(f"{path}={_short(x)}")
            return x
        if f.kind == "array":
            if f.nullable and r.random() < 0.1:
                return None
            n = r.choice((1, 1, 1, 2, 2, 0)) if f.item.kind == "struct" else r.choice((1, 1, 2, 0))
            return [self.value(f.item, f"{path}[{i}]") for i in range(n)]
        if f.kind == "struct":
            if f.nullable and r.random() < 0.2:
                return None
            return self.struct(f, path)
        return self.leaf(f, path)

    def topic(self) -> str:
        return self.rng.choice(self.names.churn if self.api in CHURNING else self.names.topics)

    def group(self) -> str:
        r = self.rng
        return r.choice(self.names.groups) if r.random() < 0.3 else f"kfuzz-g-{r.getrandbits(40):x}"

    def leaf(self, f: Shape, path: str) -> Any:
        r, key, kind = self.rng, f.key, f.kind
        if kind == "string":
            if key in ("name", "topic") and "protocols" in path:
                return r.choice(("range", "roundrobin", "cooperative-sticky"))
            if key == "name" and "configs" in path:
                return r.choice(CONFIGS)[0]
            if key in ("name", "topic", "topic_names") or key == "resource_name" and "resources" in path:
                return self.topic()
            if key in ("group_id", "groups", "groups_names", "key", "coordinator_keys"):
                return self.group()
            if key == "value":
                return r.choice(CONFIGS)[1]
            if key == "member_id":
                return r.choice(("", "", f"member-{r.randrange(5)}"))
            if key in ("group_instance_id", "transactional_id", "reason", "cluster_id"):
                return None if f.nullable else ""
            if key == "protocol_type":
                return "consumer"
            if key == "mechanism":
                return r.choice(("PLAIN", "SCRAM-SHA-256", "GSSAPI", ""))
            if key in ("client_software_name", "client_software_version"):
                return r.choice(("kfuzz", "1.0", "a-b.c", ""))
            if key in ("states_filter",):
                return r.choice(("Stable", "Empty", "Dead", "PreparingRebalance"))
            if key == "types_filter":
                return r.choice(("classic", "consumer"))
            if key == "configuration_keys":
                return r.choice(CONFIGS)[0]
            return r.choice(("", "kfuzz", None if f.nullable else "x"))
        if kind in ("bytes", "records"):
            if kind == "records" or key == "records":
                return self.records()
            return r.randbytes(r.randrange(0, 48))
        if kind == "bool":
            return key != "allow_auto_topic_creation" and r.random() < 0.5
        if kind == "uuid":
            return bytes(16) if r.random() < 0.8 else r.randbytes(16)
        if kind == "float64":
            return r.random()
        return self.number(key, kind)

    def number(self, key: str, kind: str) -> int:
        r = self.rng
        if key in ("partition_index", "partition", "index", "partitions", "partition_indexes"):
            return r.randrange(self.names.partitions + (1 if r.random() < 0.1 else 0))
        if key == "acks":
            return r.choice((-1, -1, 1, 1, 0))
        if key in ("timeout_ms",):
            return r.choice((0, 1000, 5000))
        if key == "max_wait_ms":
            return r.randrange(0, 100)
        if key == "session_timeout_ms":
            return r.randrange(6000, 10001)
        if key == "rebalance_timeout_ms":
            return r.randrange(1000, 5001)
        if key in ("max_bytes", "partition_max_bytes"):
            return r.choice((1, 1024, 1 << 16))
        if key == "min_bytes":
            return r.choice((0, 1))
        if key in ("replica_id",):
            return -1
        if key in ("isolation_level", "key_type", "endpoint_type"):
            return r.choice((0, 1))
        if key == "timestamp":
            return r.choice((-1, -2, -3, TIMESTAMP_MS))
        if key in ("fetch_offset", "committed_offset", "offset", "log_start_offset"):
            return r.choice((-1, 0, r.randrange(100)))
        if key in ("num_partitions", "count"):
            return r.choice((-1, 1, 2, 3, 5))
        if key in ("replication_factor",):
            return r.choice((-1, 1, 1, 2))
        if key == "resource_type":
            return 2 if "AlterConfigs" in KAFKA_APIS[self.api].spec else r.choice((2, 2, 4))
        if key in ("broker_ids",):
            return r.choice((1, 1, 2))
        if key in ("session_id",):
            return 0
        if key in ("session_epoch",):
            return r.choice((-1, 0))
        if key in ("producer_id", "producer_epoch", "current_leader_epoch", "leader_epoch", "last_fetched_epoch",
                   "committed_leader_epoch", "member_epoch", "commit_timestamp", "replica_epoch"):
            return r.choice((-1, -1, 0))
        if key in ("generation_id", "generation_id_or_member_epoch"):
            return r.randrange(-1, 5)
        if key in ("retention_time_ms", "transaction_timeout_ms"):
            return r.choice((-1, 60000))
        if key == "max_num_offsets":
            return r.choice((1, 10))
        return r.choice((0, 1, -1, r.randrange(100)))

    def extreme(self, f: Shape, path: str) -> Any:
        r, kind = self.rng, f.kind
        if kind in _BITS or kind == "uint16":
            return r.choice(_int_extremes(kind))
        if kind == "float64":
            return r.choice((float("nan"), float("inf"), -0.0, 1e300))
        if kind == "bool":
            return r.random() < 0.5
        if kind == "uuid":
            return r.choice((bytes(16), b"\xff" * 16, r.randbytes(16)))
        if kind == "string":
            x = r.choice(ODD_STRINGS + (None,))
            if x is not None and not f.flexible and len(x.encode()) > 0x7FFF:
                x = x[:0x7FFF]
            return x
        if kind in ("bytes", "records"):
            return r.choice((None, b"", r.randbytes(r.randrange(1, 300))))
        if kind == "array":
            if r.random() < 0.8 or self.grown:
                return r.choice((None, []))
            self.grown = True
            p, self.extreme_p = self.extreme_p, 0.0  # one grown list, of a plain item
            try:
                item = self.value(f.item, f"{path}[]")
            finally:
                self.extreme_p = p
            most = min(100_000, (self.max_frame_bytes - 4096) // max(1, len(encode_item(f.item, item))))
            return Repeated(item, r.randint(min(100, most), most)) if most > 1 else [item]
        return None


class Repeated(list):
    """``n`` times one item (a list grown to the frame limit), encoded once and repeated."""

    def __init__(self, item: Any, n: int):
        super().__init__([item] * n)


def _keep(key: str) -> bool:
    """Values an extreme would turn into a wait (a fetch's max_wait_ms at 2^31-1 is a correct
    long poll, not a hang) or into churn of the well-behaved client's topic: never mutated
    in valid requests."""
    return key in ("max_wait_ms", "session_timeout_ms", "rebalance_timeout_ms", "name", "topic", "topic_names",
                   "resource_name", "min_bytes", "timeout_ms")


def encode_item(s: Shape, x: Any) -> bytes:
    t = Tracked()
    t.value(s, x)
    return bytes(t.out)


def _short(x: Any) -> str:
    if type(x) is list:
        return f"[{len(x)} items]"
    if type(x) in (str, bytes) and len(x) > 24:
        return f"{type(x).__name__}[{len(x)}]"
    return repr(x)


# -- Kafka record batches -----------------------------------------------------------------------

_BATCH_HEAD = struct.Struct(">qiibI")  # base offset, batch length, leader epoch, magic, crc
_BATCH_TAIL = struct.Struct(">hiqqqhii")  # attributes .. record count: where the CRC starts


def kafka_batch(block: bytes, *, count: int, codec: int = 0, attributes: int | None = None,
                last_offset_delta: int | None = None, first_ts: int | None = None, max_ts: int | None = None,
                producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1, base_offset: int = 0,
                leader_epoch: int = -1, magic: int = 2, batch_length: int | None = None) -> bytes:
    """A Kafka v2 record batch around ``block`` (the records, compressed or not) with every
    header field as given (wrapped to its width), the CRC-32C over bytes [21:] computed."""
    now = TIMESTAMP_MS
    tail = _BATCH_TAIL.pack(wrap(codec if attributes is None else attributes, 16),
                            wrap(count - 1 if last_offset_delta is None else last_offset_delta, 32),
                            wrap(now if first_ts is None else first_ts, 64), wrap(now if max_ts is None else max_ts, 64),
                            wrap(producer_id, 64), wrap(producer_epoch, 16), wrap(base_sequence, 32),
                            wrap(count, 32))
    length = len(tail) + len(block) + 9 if batch_length is None else batch_length
    return _BATCH_HEAD.pack(wrap(base_offset, 64), wrap(length, 32), wrap(leader_epoch, 32), wrap(magic, 8),
                            crc32c(block, crc32c(tail))) + tail + block


_BOMBS: dict[str, bytes] = {}


def bombs() -> dict[str, bytes]:
    """Compressed blocks that inflate far beyond any limit, made once per process: zeros,
    and four million minimal Kafka records (7 bytes each)."""
    if not _BOMBS:
        zeros = b"\x00" * (32 << 20)
        records = b"\x0c\x00\x00\x00\x01\x01\x00" * 4_000_000
        for c in (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD):
            _BOMBS[f"zeros-{c.name}"] = compress(c, zeros)
            _BOMBS[f"records-{c.name}"] = compress(c, records)
    return _BOMBS


CODECS = (Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD)


class BatchMutator(BatchMutations):
    """Record sets for a Produce: one valid Kafka batch mutated, or several batches."""

    WEIGHTS = (10, 12, 16, 14, 14, 3, 6, 5, 8)

    def __init__(self, rng: Random, max_frame_bytes: int):
        self.rng, self.max_frame_bytes = rng, max_frame_bytes

    def records(self) -> list[tuple]:
        r = self.rng
        return [(r.randrange(0, 100), i, r.choice((None, b"k%d" % i)), r.randbytes(r.randrange(0, 64)),
                 r.choice((None, [("h", b"v")], [("a", None), ("b", b"")]))) for i in range(r.randint(1, 5))]

    def valid_batch(self) -> bytes:
        recs = self.records()
        c = self.rng.choice((Codec.NONE, Codec.NONE) + CODECS)
        return kafka_batch(compress(c, encode_records(recs)), count=len(recs), codec=c)

    def small_batch(self) -> bytes:
        return kafka_batch(encode_records([(0, 0, None, b"s", None)]), count=1)

    def header(self) -> tuple[bytes, str]:
        r = self.rng
        recs = self.records()
        fields: dict[str, Any] = {"count": len(recs)}
        for name in r.sample(("count", "last_offset_delta", "first_ts", "max_ts", "attributes", "producer_id",
                              "producer_epoch", "base_sequence", "base_offset", "leader_epoch", "magic",
                              "batch_length"), r.randint(1, 3)):
            if name == "count":
                fields[name] = r.choice((0, -1, len(recs) - 1, len(recs) + 1, 2**31 - 1, -2**31, 10_000))
            elif name == "attributes":
                fields[name] = r.choice((0x05, 0x06, 0x07, 0x08, 0x10, 0x20, 0x30, 0x40, 0x7F, -1, 0x28))
            elif name == "magic":
                fields[name] = r.choice((0, 1, 3, -1, 0x4B, 127))
            elif name == "batch_length":
                block = len(encode_records(recs))
                fields[name] = r.choice((0, -1, 48, 49, block + 48, block + 50, 2**31 - 1))
            else:
                fields[name] = r.choice((0, -1, 1, 2**31 - 1, -2**31, 2**63 - 1, -2**63, r.randrange(1 << 40)))
        return kafka_batch(encode_records(recs), **fields), ",".join(f"{k}={v}" for k, v in fields.items())

    def _block(self) -> tuple[bytes, int, str]:
        """A records block (uncompressed) of some shape, the count the header should claim."""
        r = self.rng
        recs = self.records()
        n = len(recs)
        shape_ = r.choice(("garbage", "length", "key-length", "header-count", "header-key", "varint", "extra",
                           "short", "trailing", "many", "deltas", "timestamps"))
        if shape_ == "garbage":
            return r.randbytes(r.randrange(1, 200)), n, shape_
        if shape_ == "deltas":
            recs = [(ts, r.choice((0, -1, n, 2**31 - 1, -2**31)), k, v, h) for ts, _, k, v, h in recs]
        elif shape_ == "timestamps":
            recs = [(r.choice((-1, -2**63, 2**63 - 1, 10**15)), od, k, v, h) for _, od, k, v, h in recs]
        elif shape_ == "extra":
            recs.append((0, n, None, b"extra", None))
        elif shape_ == "short":
            recs = recs[:-1]
        elif shape_ == "many":
            n = r.randint(1000, 60_000)
            return b"\x0c\x00\x00\x00\x01\x01\x00" * n, n, shape_
        block = bytearray(encode_records(recs))
        if shape_ == "length":
            block[0:1] = r.choice((b"\x01", b"\x00", b"\xfe\xff\xff\xff\x0f", b"\x0a", b"\x80" * 12))
        elif shape_ == "key-length":  # the key length is the record's 5th varint at most a few bytes in
            block = bytearray(encode_records([(0, 0, None, b"v", None)])) + block
            block[4:5] = r.choice((b"\x03", b"\xfe\xff\xff\xff\x0f", b"\x7f", b"\x05"))
        elif shape_ == "header-count":
            block = bytearray(encode_records([(0, 0, None, None, None)])) + block
            block[6:7] = r.choice((b"\x01", b"\x7f", b"\xfe\xff\xff\xff\x0f", b"\x04"))
        elif shape_ == "header-key":
            one = bytearray(encode_records([(0, 0, None, None, [("k", b"v")])]))
            one[one.index(b"k")] = r.choice((0xFF, 0xC3, 0x00))
            block = one + block
        elif shape_ == "varint":
            block = bytearray(b"\xff" * r.randint(10, 20)) + block
        elif shape_ == "trailing":
            block += r.randbytes(r.randrange(1, 20))
        return bytes(block), n, shape_

    def block(self) -> tuple[bytes, str]:
        block, n, s = self._block()
        return kafka_batch(block, count=n), s

    def compressed(self) -> tuple[bytes, str]:
        r = self.rng
        c = r.choice(CODECS)
        what = r.choice(("garbage", "records", "torn", "wrong-codec", "empty", "valid", "codec-5-7"))
        if what == "garbage":
            data, n = r.randbytes(r.randrange(0, 300)), r.randint(1, 3)
        elif what == "empty":
            data, n = compress(c, b""), 1
        else:
            block, n, s = self._block() if what != "valid" else (encode_records([(0, 0, None, b"ok", None)]), 1, "")
            data = compress(c, block)
            if what == "torn":
                data = data[:r.randrange(len(data))]
            elif what == "wrong-codec":
                c = r.choice([x for x in CODECS if x != c])
            elif what == "codec-5-7":
                c = r.choice((5, 6, 7))
            what += f"/{s}"
        return kafka_batch(data, count=n, codec=c), f"{Codec(c).name if c < 5 else c}/{what}"

    def bomb(self) -> tuple[bytes, str]:
        name, data = self.rng.choice(sorted(bombs().items()))
        c = Codec[name.split("-")[1]]
        count = self.rng.choice((1, 4_000_000, 2**31 - 1))
        return kafka_batch(data, count=count, codec=c), f"{name},count={count}"


# -- inputs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    """What one frame should get: a response with ``correlation_id``, decoded as ``key`` at
    ``version``'s response (``optional``: an acks=0 Produce), or the connection closed."""
    correlation_id: int = 0
    key: int = 0
    version: int = 0
    optional: bool = False
    closes: bool = False
    why: str = ""
    waits: bool = False  # a request that may rightly wait long (a long poll, a slow rebalance)


@dataclass(frozen=True)
class Input:
    """One input: the bytes to write (length prefixes included) and what they should get."""
    lane: int
    number: int
    kind: str  # valid, batch, frame, stream
    api_key: int | None
    version: int | None
    mutation: str
    data: bytes
    expects: tuple[Expect, ...] = ()
    tags: tuple[str, ...] = ()
    decoder_error: str = ""  # the decoder raised something other than its own errors

    @property
    def closes(self) -> bool:
        return any(e.closes for e in self.expects)

    def describe(self) -> str:
        api = KAFKA_APIS[self.api_key].spec if self.api_key in KAFKA_APIS else self.api_key
        return (f"lane {self.lane} input {self.number}: {self.kind} {api} v{self.version} [{self.mutation}] "
                f"{len(self.data)} bytes, starts {self.data[:120].hex()}")


def header(api_key: int, version: int, correlation_id: int, client_id: str | None = "kfuzz",
           flexible: bool = False) -> bytes:
    out = bytearray(_HEAD.pack(api_key, version, correlation_id))
    if client_id is None:
        out += b"\xff\xff"
    else:
        data = client_id.encode()
        out += struct.pack(">h", len(data)) + data
    if flexible:
        out.append(0)
    return bytes(out)


def predict(body: bytes, max_frame_bytes: int) -> tuple[Expect, str]:
    """What the listener does with one frame (``body`` without its length prefix), from its
    own decoder; and the decoder's unexpected exception, if it raised one."""
    if len(body) > max_frame_bytes:
        return Expect(closes=True, why="over the frame limit"), ""
    try:
        event = KafkaServerConnection.decode(bytes(body))
    except Exception as e:  # noqa: BLE001 -- anything but its own errors is what the fuzzer looks for
        return Expect(closes=True, why=f"decoder raised {e!r}"), f"{type(e).__name__}: {e}"
    if isinstance(event, BadRequest):
        if event.must_close:
            return Expect(closes=True, why=str(event.error)[:200]), ""
        return Expect(event.correlation_id, why="bad request answered"), ""
    assert isinstance(event, KafkaRequest)
    body = event.body if type(event.body) is dict else {}
    optional = event.key == PRODUCE and body.get("acks") == 0
    waits = any(type(body.get(k)) is int and body[k] > cap for k, cap in WAIT_CAPS.get(event.key, ()))
    return Expect(event.header.correlation_id, event.key, 0 if event.refused else event.version, optional,
                  waits=waits), ""


# what makes a request rightly wait (in milliseconds, as the broker reads it) beyond what the
# driver waits for: a mutated frame that would is drawn again
WAIT_CAPS = {int(ApiKey.FETCH): (("max_wait_ms", 1000),),
             int(ApiKey.JOIN_GROUP): (("rebalance_timeout_ms", 10000), ("session_timeout_ms", 10000))}


def split_frames(data: bytes, max_frame_bytes: int) -> list[bytes]:
    """The whole frames of a byte stream as the listener reads them, up to the first one it
    refuses for its size."""
    out, pos = [], 0
    while len(data) - pos >= 4:
        (n,) = struct.unpack_from(">I", data, pos)
        if n > max_frame_bytes:
            out.append(b"\x00" * (max_frame_bytes + 1))  # stands for the refused frame
            break
        if len(data) - pos - 4 < n:
            break
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


class Generator:
    """The inputs of one lane: a pure function of ``(seed, lane)`` and how many were drawn."""

    def __init__(self, seed: int, lane: int, names: Names | None = None, max_frame_bytes: int = 1 << 20):
        self.rng = Random(f"kafka/{seed}/{lane}")
        self.seed, self.lane, self.number = seed, lane, 0
        self.max_frame_bytes = max_frame_bytes
        self.batches = BatchMutator(self.rng, max_frame_bytes)
        self.sampler = Sampler(self.rng, names or Names(), self.batches.valid_batch, max_frame_bytes)

    def version(self, api_key: int) -> int:
        api = KAFKA_APIS[api_key]
        return self.rng.randint(api.min_version, api.max_version)

    def _request(self, number: int, extreme_p: float) -> tuple[int, int, bytes, list[Slot], str, str, tuple]:
        """A valid request: (api key, version, frame body, slots (offsets in the frame body),
        mutation, kind, tags)."""
        r = self.rng
        if r.random() < 0.3:
            api_key, kind = PRODUCE, "batch"
        else:
            api_key, kind = r.choice(SERVED), "valid"
        version = self.version(api_key)
        body = self.sampler.body(api_key, version, extreme_p)
        done = list(self.sampler.done)
        tags: tuple[str, ...] = ("extreme",) if done else ()
        if kind == "batch":
            records, mutation = self.batches.make()
            if type(body.get("topic_data")) is Repeated:  # the record set, not the list, fills the frame
                body["topic_data"] = [copy.deepcopy(body["topic_data"][0])]
            for t in body.get("topic_data") or ():
                if type(t.get("partition_data")) is Repeated:
                    t["partition_data"] = [copy.deepcopy(t["partition_data"][0])]
            for t in body.get("topic_data") or ():
                for p in t.get("partition_data") or ():
                    p["records"] = records
            done.append(mutation)
            tags = (mutation.split(":")[0],)
        spec_name = KAFKA_APIS[api_key].request_spec
        head = header(api_key, version, number, r.choice(("kfuzz", "kfuzz", "", None)), is_flexible(spec_name, version))
        encoded, slots = encode_tracked(spec_name, version, body)
        slots = [Slot(s.offset + len(head), s.kind, s.size, s.fmt, s.known) for s in slots]
        return api_key, version, head + encoded, slots, " ".join(done) or "none", kind, tags

    def _finish(self, kind: str, api_key: int | None, version: int | None, mutation: str, data: bytes,
                tags: tuple[str, ...]) -> Input:
        expects, errors = [], []
        for f in split_frames(data, self.max_frame_bytes):
            e, err = predict(f, self.max_frame_bytes)
            expects.append(e)
            if err:
                errors.append(err)
            if e.closes:
                break
        return Input(self.lane, self.number, kind, api_key, version, mutation, data, tuple(expects), tags,
                     "; ".join(errors))

    def valid(self) -> Input:
        """A request that decodes: some values at extremes, or a Produce of a mutated batch."""
        self.number += 1
        for _ in range(5):
            api_key, version, body, _, mutation, kind, tags = self._request(self.number, 0.08)
            if len(body) <= self.max_frame_bytes:
                return self._finish(kind, api_key, version, mutation, frame(body), tags)
        return self._finish("valid", API_VERSIONS, 0, "none", frame(header(API_VERSIONS, 0, self.number)), ())

    def mutated(self) -> Input:
        """A frame with a correct length prefix: a valid request with its bytes mutated, or
        random bytes."""
        self.number += 1
        for _ in range(5):
            inp = self._mutated_once()
            if not any(e.waits for e in inp.expects):
                return inp
        return self._finish("frame", API_VERSIONS, 0, "none", frame(header(API_VERSIONS, 0, self.number)), ())

    def _mutated_once(self) -> Input:
        r = self.rng
        if r.random() < 0.05:
            body = r.randbytes(r.choice((0, 1, 4, 7, 8, 9, r.randrange(10, 2048))))
            if r.random() < 0.5 and len(body) >= 8:
                api_key = r.choice(SERVED)
                body = _HEAD.pack(api_key, self.version(api_key), self.number) + body[8:]
            return self._finish("frame", None, None, f"random {len(body)}", frame(body), ("random",))
        api_key, version, body, slots, mutation, _, _ = self._request(self.number, 0.02)
        b = bytearray(body)
        done = []
        for _ in range(r.choice((1, 1, 1, 2, 3))):
            what = r.choices(FRAME_MUTATIONS, FRAME_WEIGHTS)[0]
            b, detail = getattr(self, f"_m_{what}")(b, slots, api_key, version)
            done.append(f"{what}:{detail}")
        data = bytes(b[:self.max_frame_bytes])
        return self._finish("frame", api_key, version, " ".join(done) + f" ({mutation:.200})", frame(data),
                            tuple(d.split(":")[0] for d in done))

    def stream(self) -> Input:
        """Bytes for a connection of their own, ended with end-of-stream."""
        self.number += 1
        r = self.rng
        kind = r.choice(("random", "huge-prefix", "partial", "frames-then-garbage", "zero-frames"))
        if kind == "random":
            data = r.randbytes(r.randint(1, 4096))
        elif kind == "huge-prefix":
            data = struct.pack(">I", r.choice((0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, self.max_frame_bytes + 1))) \
                + r.randbytes(100)
        elif kind == "partial":
            data = struct.pack(">I", r.randrange(1, self.max_frame_bytes)) + r.randbytes(r.randrange(0, 1000))
        elif kind == "zero-frames":
            data = b"\x00\x00\x00\x00" * r.randint(1, 5)
        else:
            data = frame(header(API_VERSIONS, 3, self.number, "kfuzz", True) + b"\x06kfuzz\x041.0\x00")
            data += r.randbytes(r.randint(1, 64))
        return self._finish("stream", None, None, kind, data, (kind,))

    # -- byte mutations of a frame body (slots are offsets into it, stale after a resize) --

    def _m_flip(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        n = self.rng.randint(1, 6)
        for _ in range(n):
            if b:
                b[self.rng.randrange(len(b))] ^= 1 << self.rng.randrange(8)
        return b, f"{n} bits"

    def _m_byte(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        at = self.rng.randrange(len(b)) if b else 0
        if b:
            b[at] = self.rng.choice((0, 0xFF, 0x7F, 0x80, self.rng.randrange(256)))
        return b, f"at {at}"

    def _m_cut(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        at = self.rng.randrange(len(b)) if b else 0
        return b[:at], f"at {at}"

    def _m_trailing(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        n = self.rng.randint(1, 64)
        return b + self.rng.randbytes(n), f"{n} bytes"

    def _slot(self, slots: list[Slot], b: bytearray, kinds: tuple[str, ...]) -> Slot | None:
        fit = [s for s in slots if s.kind in kinds and s.offset + s.size <= len(b)]
        return self.rng.choice(fit) if fit else None

    def _m_length(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        r = self.rng
        s = self._slot(slots, b, ("len16", "len32", "uvar"))
        if s is None:
            return self._m_flip(b, slots, key, version)
        if s.kind == "uvar":
            old = _read_uvarint(b, s.offset)
            new = r.choice((b"\x00", b"\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x07", b"\x80\x80\x80\x80\x80\x01",
                            b"\x80\x00", b"\xff" * 6, _uvarint(old + 1), _uvarint(old + 2), _uvarint(max(0, old - 1)),
                            _uvarint(2**31 - 1)))
            return b[:s.offset] + new + b[s.offset + s.size:], f"uvar@{s.offset}={new.hex()}"
        fmt = ">h" if s.kind == "len16" else ">i"
        (old,) = struct.unpack_from(fmt, b, s.offset)
        bits = 16 if s.kind == "len16" else 32
        value = r.choice((-1, -2, 2**31 - 1, -2**31, 0x7FFF, -0x8000, old + 1, max(0, old - 1), old * 2 + 1, 0))
        struct.pack_into(fmt, b, s.offset, wrap(value, bits))
        return b, f"{s.kind}@{s.offset}={wrap(value, bits)}"

    def _m_int(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        s = self._slot(slots, b, ("int",))
        if s is None:
            return self._m_flip(b, slots, key, version)
        kind = {">b": "int8", ">h": "int16", ">i": "int32", ">q": "int64"}[s.fmt]
        value = self.rng.choice(_int_extremes(kind))
        struct.pack_into(s.fmt, b, s.offset, value)
        return b, f"{kind}@{s.offset}={value}"

    def _m_tags(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        r = self.rng
        s = self._slot(slots, b, ("tags",))
        if s is None or b[s.offset] != 0:
            return self._m_flip(b, slots, key, version)
        known = list(s.known)
        tag = r.choice(known + [r.choice((3, 17, 1000, 2**31 - 1))])
        what = r.choice(("unknown", "out-of-order", "duplicate", "garbage-known", "size-lies", "huge-count",
                         "long-varint", "many"))
        out = bytearray()
        if what == "unknown":
            payload = r.randbytes(r.randrange(0, 40))
            write_uvarint(out, 1)
            write_uvarint(out, r.choice((50, 1000, 2**31 - 1, 2**32 - 1)))
            write_uvarint(out, len(payload))
            out += payload
        elif what in ("out-of-order", "duplicate"):
            first, second = (5, 2) if what == "out-of-order" else (tag, tag)
            write_uvarint(out, 2)
            for t in (first, second):
                write_uvarint(out, t)
                out += b"\x00"
        elif what == "garbage-known":
            payload = r.randbytes(r.randrange(0, 24))
            write_uvarint(out, 1)
            write_uvarint(out, tag)
            write_uvarint(out, len(payload))
            out += payload
        elif what == "size-lies":
            write_uvarint(out, 1)
            write_uvarint(out, tag)
            write_uvarint(out, r.choice((2**31 - 1, 2**32 - 1, 10_000, 3)))
            out += b"\x00"
        elif what == "huge-count":
            write_uvarint(out, r.choice((2**31 - 1, 2**32 - 1, 100_000)))
        elif what == "long-varint":
            out += b"\x80" * r.randint(5, 12) + b"\x00"
        else:
            n = r.randint(10, 3000)
            write_uvarint(out, n)
            for t in range(n):
                out += _uvarint(t + 100) + b"\x00"
        return b[:s.offset] + out + b[s.offset + 1:], f"{what} tag {tag}@{s.offset}"

    def _m_version(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        if len(b) < 10:  # cut short already: no header to aim at
            return self._m_flip(b, slots, key, version)
        api = KAFKA_APIS[key]
        v = self.rng.choice((api.min_version - 1, api.max_version + 1, -1, 32767, -32768, api.max_version + 5))
        struct.pack_into(">h", b, 2, wrap(v, 16))
        return b, f"v{wrap(v, 16)}"

    def _m_api_key(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        if len(b) < 10:  # cut short already: no header to aim at
            return self._m_flip(b, slots, key, version)
        r = self.rng
        k = r.choice(INTER_BROKER) if r.random() < 0.5 else r.choice(UNSERVED + SERVED)
        struct.pack_into(">h", b, 0, k)
        return b, f"key {k}"

    def _m_header(self, b: bytearray, slots: list[Slot], key: int, version: int) -> tuple[bytearray, str]:
        """The header's version or client id lies."""
        if len(b) < 10:  # cut short already: no header to aim at
            return self._m_flip(b, slots, key, version)
        r = self.rng
        (n,) = struct.unpack_from(">h", b, 8)
        end = 10 + max(n, 0)
        flexible = is_flexible(KAFKA_APIS[key].request_spec, version)
        what = r.choice(("other-version", "client-id-null", "client-id-lies", "client-id-utf8", "client-id-long",
                         "header-tags"))
        if what == "other-version":
            return (b[:end] + b[end + 1:] if flexible else b[:end] + b"\x00" + b[end:]), what
        if what == "client-id-null":
            return b[:8] + b"\xff\xff" + b[end:], what
        if what == "client-id-lies":
            v = wrap(r.choice((-2, -32768, 32767, n + 1, n + 50)), 16)
            struct.pack_into(">h", b, 8, v)
            return b, f"{what} {v}"
        if what == "client-id-utf8":
            bad = r.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"))
            return b[:8] + struct.pack(">h", len(bad)) + bad + b[end:], f"{what} {bad.hex()}"
        if what == "client-id-long":
            cid = b"c" * r.choice((1000, 32767))
            return b[:8] + struct.pack(">h", len(cid)) + cid + b[end:], f"{what} {len(cid)}"
        if not flexible:
            return self._m_flip(b, slots, key, version)
        tags = r.choice((b"\x01\x00\x00", b"\x02\x01\x00\x00\x00", b"\x01\x05\xff\xff\xff\xff\x0f", b"\xff\xff\xff\xff\x0f",
                         b"\x01\x00\x03abc"))
        return b[:end] + tags + b[end + 1:], f"{what} {tags.hex()}"


FRAME_MUTATIONS = ("flip", "byte", "cut", "trailing", "length", "int", "tags", "version", "api_key", "header")
FRAME_WEIGHTS = (10, 8, 8, 3, 16, 8, 10, 5, 5, 6)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    write_uvarint(out, value)
    return bytes(out)


def _read_uvarint(b: bytes, pos: int) -> int:
    value = shift = 0
    while pos < len(b) and shift < 35:
        value |= (b[pos] & 0x7F) << shift
        if not b[pos] & 0x80:
            break
        pos += 1
        shift += 7
    return value


LANE_KINDS = ("valid", "frames", "stream")


def draw(g: Generator, lane_kind: str) -> Input:
    if lane_kind == "valid":
        return g.valid()
    if lane_kind == "frames":
        return g.mutated()
    return g.stream()


def replay(seed: int, lane: int, number: int, lane_kind: str, names: Names | None = None,
           max_frame_bytes: int = 1 << 20) -> Input:
    """Input ``number`` of a lane (numbers count from 1), as the driver drew it."""
    return fuzz_lanes.nth_input(Generator(seed, lane, names, max_frame_bytes), number, lane_kind, draw)


# -- judging responses --------------------------------------------------------------------------


def decode_response(response: bytes, expect: Expect) -> dict:
    """A response frame (without its length prefix) as Kafka's client reads it: raises
    TidelogError or AssertionError when it is not well formed."""
    api = KAFKA_APIS[expect.key]
    r = Reader(response)
    r.budget = 1 << 40  # a response may hold far more values than its request (judged, not bounded)
    (cid,) = struct.unpack_from(">i", response, 0)
    assert cid == expect.correlation_id, f"correlation id {cid}, expected {expect.correlation_id}"
    r.pos = 4
    if expect.key != API_VERSIONS and is_flexible(api.response_spec, expect.version):
        for _ in range(r.count(r.uvarint("header tags"), "header tags")):
            r.uvarint("header tag")
            r.take(r.uvarint("header tag size"), "header tag")
    body = codec(api.response_spec, expect.version).decode(r)
    assert r.pos == len(response), f"{len(response) - r.pos} bytes after the body"
    return body


# -- the driver ---------------------------------------------------------------------------------

# schema.Reader's refusal of a frame that decodes into more values than its size allows
OBJECT_BOUND = "the frame decodes into too many values"


def probe() -> tuple[bytes, Expect]:
    return (frame(header(API_VERSIONS, 3, PROBE_CORRELATION_ID, "kfuzz-probe", True) + b"\x06kfuzz\x041.0\x00"),
            Expect(PROBE_CORRELATION_ID, API_VERSIONS, 3))


@dataclass
class Stats(fuzz_lanes.Stats):
    """``fuzz_lanes.Stats`` (``apis`` by API and version, requests that decode; ``errors`` by
    code) and what the Kafka oracle counts besides."""
    refusals: Counter = field(default_factory=Counter)  # why the decoder refuses frames (first words)
    unanswered_before_close: int = 0
    dense: int = 0  # valid requests refused (closed) for decoding into more values than the frame's bound
    slowest: list[tuple[float, str]] = field(default_factory=list)  # the slowest answers (seconds since sent,
    # or since the answer before it on its connection), and to what


@dataclass
class _Pending:
    expect: Expect
    input: Input | None  # None: the probe
    sent_at: float = 0.0  # when it was queued (behind the lane's earlier requests)


class Lane(fuzz_lanes.Lane):
    """One connection: what it sent and what it still awaits, a close included (``closing``,
    the input sent that closes the connection)."""

    ROUNDS = "kafka/{seed}/{index}/rounds"

    def __init__(self, index: int, kind: str, port: int, generator: Generator):
        super().__init__(index, kind, port, generator)
        self.closing: Input | None = None
        self.sent: deque[Input] = deque(maxlen=64)
        self.local_port = 0
        self.answered_at = 0.0  # when its last response arrived
        self.acks_zero: list[int] = []  # the numbers of the acks=0 Produces sent on this connection

    def busy(self) -> bool:
        return bool(self.pending or self.out or self.closing)

    def overdue(self) -> bool:
        return bool(self.pending or self.closing)

    def connect(self) -> socket.socket:
        sock = super().connect()
        self.local_port = sock.getsockname()[1]
        self.closing = None
        return sock


class Driver(LaneDriver):
    """Sends inputs on several lanes at once and judges every answer (module docstring;
    ``fuzz_lanes.LaneDriver`` the loop).

    Lanes: ``valid_lanes`` of requests that decode (pipelined, ``batch`` per round at most),
    ``frame_lanes`` of mutated frames (a round ends at the first frame the listener refuses,
    else with a probe), one stream lane. Stops after ``seconds`` or ``max_inputs``, or once
    ``max_findings`` findings are recorded. ``ports`` maps each local port a lane used to
    ``(lane, first input number on it)``, to name the inputs behind a broker log line."""

    HANG = "no answer and no close"
    LATE = "not answered or closed"
    AWAITING = "after"

    def __init__(self, port: int, seed: int, *, seconds: float, max_inputs: int = 10**9, valid_lanes: int = 2,
                 frame_lanes: int = 2, batch: int = 24, names: Names | None = None, max_frame_bytes: int = 1 << 20,
                 hang_s: float = 30.0, check: Callable[[], None] | None = None, check_every_s: float = 2.0,
                 alive: Callable[[], bool] | None = None, max_findings: int = 20):
        kinds = ["valid"] * valid_lanes + ["frames"] * frame_lanes + ["stream"]
        lanes = [Lane(i, k, port, Generator(seed, i, names, max_frame_bytes)) for i, k in enumerate(kinds)]
        super().__init__(port, seed, lanes, Stats(), seconds=seconds, max_inputs=max_inputs, batch=batch,
                         hang_s=hang_s, check=check, check_every_s=check_every_s, alive=alive,
                         max_findings=max_findings)
        self.ports: dict[int, tuple[int, str, int]] = {}

    def _connected(self, lane: Lane) -> None:
        self.ports[lane.local_port] = (lane.index, lane.kind, lane.generator.number + 1)

    def _fill(self, lane: Lane) -> None:
        size = 1 if lane.kind == "stream" else lane.rounds.randint(1, self.batch)
        for _ in range(size):
            inp = draw(lane.generator, lane.kind)
            self._count(inp)
            lane.out += inp.data
            lane.sent.append(inp)
            if inp.decoder_error:
                self._finding(lane, f"the decoder raised {inp.decoder_error} on {inp.describe()}")
            for e in inp.expects:
                if e.closes:
                    lane.closing = inp
                    self.stats.refusals[e.why.split(":")[0][:60]] += 1
                else:
                    lane.pending.append(_Pending(e, inp, time.monotonic()))
                    if e.optional:
                        lane.acks_zero.append(inp.number)
            if lane.closing is not None:
                break
        if lane.kind == "valid" and lane.closing is not None:
            if OBJECT_BOUND in lane.closing.expects[-1].why:
                self.stats.dense += 1  # a grown list of small entries over the decoder's object bound
            else:
                self._finding(lane, f"a valid request the listener refuses: {lane.closing.describe()}")
        if lane.closing is None and lane.kind != "stream":
            data, expect = probe()
            lane.out += data
            lane.pending.append(_Pending(expect, None, time.monotonic()))

    def _count_apis(self, inp: Input) -> None:
        for e in inp.expects:
            if not e.closes and e.key in KAFKA_APIS:
                self.stats.apis[f"{KAFKA_APIS[e.key].spec} v{e.version}"] += 1

    def _stream_ended(self, lane: Lane) -> None:
        lane.closing = lane.closing or lane.sent[-1]  # after end-of-stream the broker closes

    # -- the oracle --

    def _judge(self, lane: Lane, response: bytes) -> None:
        self.stats.responses += 1
        pending = lane.pending
        if len(response) < 4:
            self._finding(lane, f"a {len(response)}-byte response frame after {self._recent(lane)}")
            self._close(lane)
            return
        (cid,) = struct.unpack_from(">i", response, 0)
        while pending and pending[0].expect.correlation_id != cid and pending[0].expect.optional:
            pending.popleft()
        if not pending or pending[0].expect.correlation_id != cid:
            expected = pending[0].expect.correlation_id if pending else None
            self._finding(lane, f"response with correlation id {cid}, expected {expected}, after {self._recent(lane)}")
            self._close(lane)
            return
        p = pending.popleft()
        what = p.input.describe() if p.input is not None else "the probe"
        now = time.monotonic()
        latency = now - max(p.sent_at, lane.answered_at)  # its own wait, not the wait for those before it
        lane.answered_at = now
        if len(self.stats.slowest) < 3 or latency > self.stats.slowest[-1][0]:
            self.stats.slowest = sorted(self.stats.slowest + [(latency, what[:300])], reverse=True)[:3]
        try:
            body = decode_response(response, p.expect)
        except (TidelogError, AssertionError, struct.error) as e:
            self._finding(lane, f"a response that does not decode ({e}) to {what}: {response[:200].hex()}")
            return
        codes = fuzz_lanes.error_codes(body, [], max_depth=10)
        for code in set(codes):
            self.stats.errors[code] += 1
        if UNKNOWN_SERVER_ERROR.code in codes:
            self._finding(lane, f"UNKNOWN_SERVER_ERROR for {what}: {body!r:.300}")

    def _recent(self, lane: Lane) -> str:
        return "; ".join(inp.describe() for inp in list(lane.sent)[-3:])

    def _closed_by_broker(self, lane: Lane) -> None:
        self.stats.closed[lane.kind] += 1
        # an acks=0 Produce that failed ends its connection (Kafka's rule), once the requests
        # read with it are answered: one must come before the first request left unanswered
        unanswered = next((p.input.number for p in lane.pending if p.input is not None and not p.expect.optional),
                          None)
        after_acks_zero = unanswered is None or any(n < unanswered for n in lane.acks_zero)
        if lane.closing is None and not after_acks_zero:
            self._finding(lane, f"the broker closed a connection whose frames all decode, awaiting "
                                f"{len(lane.pending)} responses, after {self._recent(lane)}")
        elif lane.closing is None:
            self.stats.closed[f"{lane.kind}, after an acks=0 Produce"] += 1
        else:
            self.stats.unanswered_before_close += sum(1 for p in lane.pending if not p.expect.optional)
        self._close(lane)

    def _close(self, lane: Lane) -> None:
        super()._close(lane)
        lane.closing = None
        lane.acks_zero.clear()

    def inputs_on(self, port: int) -> str:
        """The lane and first input of the connection from local ``port`` (for a log line)."""
        if port not in self.ports:
            return f"no lane used port {port}"
        lane, kind, first = self.ports[port]
        return (f"lane {lane} ({kind}) connection opened at input {first}: replay(seed={self.seed}, lane={lane}, "
                f"number=<n from {first}>, lane_kind={kind!r})")
