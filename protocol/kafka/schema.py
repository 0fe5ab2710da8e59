"""Kafka's message bodies, compiled from Kafka's own JSON message specs (``specs/``).

Kafka describes every request and response in a JSON file: fields with their types, the
versions that carry them, the versions where they may be null, and, from each API's first
"flexible" version on (KIP-482), compact encodings and tagged fields. This module reads those
files as they are and builds, once per (message, version), a decoder and an encoder, so the
wire format is Kafka's by construction and adding an API is adding its two files.

Values are plain Python: a struct is a dict keyed by the snake_case of Kafka's field names
(``TopicData`` -> ``topic_data``), an array a list, ``string`` a str, ``bytes`` and
``records`` bytes, ``uuid`` 16 bytes. Decoding fills the fields a version does not carry with
their spec defaults; encoding takes a missing key as its default, so a body written for the
newest version encodes for any older one (fields the version lacks are left out).

Encodings (all integers big-endian):

* ``int8/16/32/64``, ``uint16``, ``float64``, ``bool`` (one byte, non-zero is true), ``uuid``;
* non-flexible: ``string`` = int16 length (-1: null) + UTF-8 (decoded as Kafka's broker
  decodes it: bytes that are not UTF-8 become U+FFFD), ``bytes``/``records`` = int32
  length (-1: null), array = int32 count (-1: null);
* flexible: the same with an unsigned varint of length + 1 (0: null), and after each struct's
  fields its tagged fields: a varint count, then per field a varint tag, a varint size and
  the value. Unknown tags are skipped; a tagged field is written only when it differs from
  its default. Encoding None where a version's field cannot be null writes its empty value
(Tidelog's bodies say "absent" with None: a protocol name before the join completed, say);
a string longer than a non-flexible version's int16 length can say is cut to fit, with "..."
(only error messages get that long).

Decoding is bounded like the native codec (``protocol.codec``): a length or count may not
exceed the bytes left in the frame, and a frame decodes into at most
``codec.max_objects(len(frame))`` values, so no frame costs more memory than a bounded
multiple of its size. Every failure is an InvalidRequestError naming the field path.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from tidelog.protocol.codec import max_objects
from tidelog.protocol.errors import InvalidRequestError

SPECS = Path(__file__).with_name("specs")
MAX_VERSION = 0x7FFF
ZERO_UUID = bytes(16)

Decode = Callable[["Reader"], Any]
Encode = Callable[[Any, bytearray], None]


def snake(name: str) -> str:
    """Kafka's field name in snake_case: ``ThrottleTimeMs`` -> ``throttle_time_ms``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def parse_versions(text: str | None) -> tuple[int, int]:
    """``"0+"``, ``"3-7"``, ``"5"`` or ``"none"`` as an inclusive (low, high) range."""
    if text is None or text == "none":
        return 1, 0
    if text.endswith("+"):
        return int(text[:-1]), MAX_VERSION
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def _within(versions: tuple[int, int], v: int) -> bool:
    return versions[0] <= v <= versions[1]


@cache
def spec(name: str) -> dict[str, Any]:
    """The JSON spec ``specs/<name>.json`` (Kafka's files carry // comments)."""
    text = (SPECS / f"{name}.json").read_text()
    return json.loads(re.sub(r"^\s*//.*$", "", text, flags=re.M))


# -- reading ------------------------------------------------------------------------------------


class Reader:
    """A cursor over one frame, with its object budget."""

    __slots__ = ("buf", "pos", "end", "budget")

    def __init__(self, buf: bytes | memoryview, pos: int = 0, end: int | None = None):
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end
        self.budget = max_objects(self.end - pos)

    def take(self, n: int, what: str) -> memoryview | bytes:
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise InvalidRequestError(f"{what}: needs {n} bytes, {self.end - pos} left")
        self.pos = pos + n
        return self.buf[pos:pos + n]

    def unpack(self, s: struct.Struct, what: str) -> Any:
        pos = self.pos
        if pos + s.size > self.end:
            raise InvalidRequestError(f"{what}: needs {s.size} bytes, {self.end - pos} left")
        self.pos = pos + s.size
        return s.unpack_from(self.buf, pos)[0]

    def uvarint(self, what: str) -> int:
        value = shift = 0
        buf, pos, end = self.buf, self.pos, self.end
        while True:
            if pos >= end:
                raise InvalidRequestError(f"{what}: truncated varint")
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                self.pos = pos
                return value
            shift += 7
            if shift > 28:
                raise InvalidRequestError(f"{what}: varint longer than 5 bytes")

    def count(self, n: int, what: str, values: int | None = None) -> int:
        """A length or element count read from the frame, checked against what is left; it
        costs ``values`` (default ``n``: an array's elements) of the frame's budget."""
        if n > self.end - self.pos:
            raise InvalidRequestError(f"{what}: {n} elements announced, only {self.end - self.pos} bytes left")
        self.budget -= n if values is None else values
        if self.budget < 0:
            raise InvalidRequestError(f"{what}: the frame decodes into too many values")
        return n


def write_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


# -- primitives ----------------------------------------------------------------------------------

_FIXED = {
    "int8": struct.Struct(">b"), "int16": struct.Struct(">h"), "uint16": struct.Struct(">H"),
    "int32": struct.Struct(">i"), "int64": struct.Struct(">q"), "float64": struct.Struct(">d"),
}
_I16 = _FIXED["int16"]
_I16_MAX = 0x7FFF
_I32 = _FIXED["int32"]


def _fixed(kind: str, where: str) -> tuple[Decode, Encode]:
    s = _FIXED[kind]
    pack = s.pack

    def decode(r: Reader) -> Any:
        return r.unpack(s, where)

    def encode(value: Any, out: bytearray) -> None:
        try:
            out += pack(value)
        except struct.error as e:
            raise ValueError(f"{where}: {value!r} does not fit {kind}: {e}") from None

    return decode, encode


def _bool(where: str) -> tuple[Decode, Encode]:
    def decode(r: Reader) -> bool:
        return bool(r.take(1, where)[0])

    def encode(value: Any, out: bytearray) -> None:
        out.append(1 if value else 0)

    return decode, encode


def _uuid(where: str) -> tuple[Decode, Encode]:
    def decode(r: Reader) -> bytes:
        return bytes(r.take(16, where))

    def encode(value: Any, out: bytearray) -> None:
        value = value or ZERO_UUID
        if len(value) != 16:
            raise ValueError(f"{where}: a uuid is 16 bytes, got {len(value)}")
        out += value

    return decode, encode


def _length(flexible: bool, prefix: struct.Struct, nullable: bool, where: str, values: int | None = None
            ) -> tuple[Callable[[Reader], int | None], Callable[[int | None, bytearray], None]]:
    """The length (or count) prefix of a string, bytes or array; None is null. ``values``: what
    one costs of the frame's budget (None: the count, for an array's elements)."""
    if flexible:
        def read(r: Reader) -> int | None:
            n = r.uvarint(where) - 1
            if n < 0:
                if not nullable:
                    raise InvalidRequestError(f"{where}: null where the field is not nullable")
                return None
            return r.count(n, where, values)

        def write(n: int | None, out: bytearray) -> None:
            write_uvarint(out, 0 if n is None else n + 1)
    else:
        def read(r: Reader) -> int | None:
            n = r.unpack(prefix, where)
            if n < 0:
                if n != -1 or not nullable:
                    raise InvalidRequestError(f"{where}: length {n}")
                return None
            return r.count(n, where, values)

        def write(n: int | None, out: bytearray) -> None:
            out += prefix.pack(-1 if n is None else n)
    return read, write


def _utf8(data: Any) -> str:
    """A string's bytes decoded as Kafka's broker decodes every string of a request (Java's
    ``new String(bytes, UTF_8)``): bytes that are not UTF-8 become replacement characters
    (U+FFFD), and the request is served. A name holding them is refused by name where it is
    used (a topic name is INVALID_TOPIC_EXCEPTION, as any name outside Kafka's characters)."""
    return str(data, "utf-8", "replace")


def _string(flexible: bool, nullable: bool, where: str) -> tuple[Decode, Encode]:
    read, write = _length(flexible, _I16, nullable, where, values=1)

    def decode(r: Reader) -> str | None:
        n = read(r)
        return None if n is None else _utf8(r.take(n, where))

    def encode(value: Any, out: bytearray) -> None:
        if value is None:  # an absent value of a version where the field cannot be null: ""
            write(None if nullable else 0, out)
            return
        data = value.encode()
        if not flexible and len(data) > _I16_MAX:  # a long error message: cut, not unencodable
            data = data[:_I16_MAX - 3].decode("utf-8", "ignore").encode() + b"..."
        write(len(data), out)
        out += data

    return decode, encode


def header_string(where: str) -> Decode:
    """The decoder of a request header's nullable string (the client id: the header's only
    string, in every header version, never compact), as Kafka's broker reads it: a negative
    length is null, and bytes that are not UTF-8 become replacement characters (``_utf8``),
    so the request is served."""
    def decode(r: Reader) -> str | None:
        n = r.unpack(_I16, where)
        return None if n < 0 else _utf8(r.take(n, where))

    return decode


def _bytes(flexible: bool, nullable: bool, where: str) -> tuple[Decode, Encode]:
    read, write = _length(flexible, _I32, nullable, where, values=1)

    def decode(r: Reader) -> bytes | None:
        n = read(r)
        return None if n is None else bytes(r.take(n, where))

    def encode(value: Any, out: bytearray) -> None:
        if value is None:
            write(None if nullable else 0, out)
            return
        write(len(value), out)
        out += value

    return decode, encode


# -- structs and arrays --------------------------------------------------------------------------


class _Field:
    """One field of a struct as a version sees it."""

    __slots__ = ("key", "decode", "encode", "default", "tag", "skip_default")

    def __init__(self, key: str, decode: Decode, encode: Encode, default: Callable[[], Any], tag: int | None):
        self.key = key
        self.decode = decode
        self.encode = encode
        self.default = default
        self.tag = tag


def _default_of(field: dict[str, Any], nullable: bool, structs: dict[str, list]) -> Callable[[], Any]:
    kind = field["type"]
    text = field.get("default")
    text = None if text is None else str(text).lower()  # a few specs write numbers and booleans bare
    if kind.startswith("[]"):
        return (lambda: None) if text == "null" else list
    if kind in _FIXED:
        value: Any = 0 if text is None else (float(text) if kind == "float64" else int(text, 0))
        return lambda: value
    if kind == "bool":
        value = text == "true"
        return lambda: value
    if kind == "string":
        value = None if text == "null" and nullable else (text or "")
        return lambda: value
    if kind in ("bytes", "records"):
        value = None if nullable and text == "null" else b""
        return lambda: value
    if kind == "uuid":
        return lambda: ZERO_UUID
    if nullable and text == "null":
        return lambda: None
    return dict  # a struct: every field at its default


def _compile_type(kind: str, field: dict[str, Any], v: int, flexible: bool, nullable: bool,
                  structs: dict[str, list], where: str) -> tuple[Decode, Encode]:
    if kind.startswith("[]"):
        item = kind[2:]
        item_decode, item_encode = _compile_type(item, field, v, flexible, False, structs, f"{where}[]")
        read, write = _length(flexible, _I32, nullable, where)

        def decode(r: Reader) -> list | None:
            n = read(r)
            if n is None:
                return None
            return [item_decode(r) for _ in range(n)]

        def encode(value: Any, out: bytearray) -> None:
            if value is None:
                write(None if nullable else 0, out)
                return
            write(len(value), out)
            for x in value:
                item_encode(x, out)

        return decode, encode
    if kind in _FIXED:
        return _fixed(kind, where)
    if kind == "bool":
        return _bool(where)
    if kind == "uuid":
        return _uuid(where)
    if kind == "string":
        return _string(flexible, nullable, where)
    if kind in ("bytes", "records"):
        return _bytes(flexible, nullable, where)
    fields = field["fields"] if "fields" in field and field["type"].removeprefix("[]") == kind else structs.get(kind)
    if fields is None:
        raise ValueError(f"{where}: unknown type {kind!r}")
    decode, encode_present = _compile_struct(fields, v, flexible, structs, where)
    if not nullable:
        def encode(value: Any, out: bytearray) -> None:
            encode_present({} if value is None else value, out)

        return decode, encode

    def decode_nullable(r: Reader) -> dict | None:
        return None if r.unpack(_FIXED["int8"], where) < 0 else decode(r)

    def encode_nullable(value: Any, out: bytearray) -> None:
        if value is None:
            out.append(0xFF)
        else:
            out.append(1)
            encode_present(value, out)

    return decode_nullable, encode_nullable


def _compile_struct(fields: list[dict[str, Any]], v: int, flexible: bool, structs: dict[str, list],
                    where: str) -> tuple[Decode, Encode]:
    regular: list[_Field] = []
    tagged: dict[int, _Field] = {}
    absent: list[_Field] = []  # fields this version does not carry: decoded as their defaults
    for f in fields:
        key = snake(f["name"])
        in_version = _within(parse_versions(f.get("versions")), v)
        tag_versions = parse_versions(f.get("taggedVersions"))
        is_tagged = in_version and "tag" in f and _within(tag_versions, v)
        nullable = _within(parse_versions(f.get("nullableVersions")), v)
        field_flexible = flexible and f.get("flexibleVersions") != "none"
        # a field a version lacks takes its spec default, null included ("absent" to Tidelog)
        default = _default_of(f, nullable or (not in_version and f.get("default") == "null"), structs)
        if not in_version:
            absent.append(_Field(key, None, None, default, None))  # type: ignore[arg-type]
            continue
        decode, encode = _compile_type(f["type"], f, v, field_flexible, nullable, structs, f"{where}.{key}")
        compiled = _Field(key, decode, encode, default, f["tag"] if is_tagged else None)
        if is_tagged:
            tagged[f["tag"]] = compiled
        else:
            regular.append(compiled)
    ordered_tags = sorted(tagged.items())

    def decode(r: Reader) -> dict[str, Any]:
        r.budget -= len(regular) + len(absent) + len(tagged) + 1  # every key gets a value
        if r.budget < 0:
            raise InvalidRequestError(f"{where}: the frame decodes into too many values")
        out = {f.key: f.decode(r) for f in regular}
        for f in absent:
            out[f.key] = f.default()
        if flexible:
            for f in tagged.values():
                out[f.key] = f.default()
            seen = -1
            for _ in range(r.count(r.uvarint(where), where)):
                tag = r.uvarint(f"{where} tag")
                size = r.count(r.uvarint(f"{where} tag {tag}"), f"{where} tag {tag}", values=0)
                if tag <= seen:
                    raise InvalidRequestError(f"{where}: tagged fields out of order ({tag} after {seen})")
                seen = tag
                end = r.pos + size
                if (f := tagged.get(tag)) is None:
                    r.pos = end  # a tag this version does not know
                    continue
                outer_end, r.end = r.end, end
                try:
                    out[f.key] = f.decode(r)
                    if r.pos != end:
                        raise InvalidRequestError(f"{where}.{f.key}: {end - r.pos} bytes left in the tagged field")
                finally:
                    r.end = outer_end
        return out

    def encode(value: Any, out: bytearray) -> None:
        get = value.get
        for f in regular:
            x = get(f.key)
            f.encode(f.default() if x is None and f.key not in value else x, out)
        if flexible:
            present = []
            for tag, f in ordered_tags:
                x = get(f.key)
                if x is None and f.key not in value:
                    continue
                if x == f.default():
                    continue
                buf = bytearray()
                f.encode(x, buf)
                present.append((tag, buf))
            write_uvarint(out, len(present))
            for tag, buf in present:
                write_uvarint(out, tag)
                write_uvarint(out, len(buf))
                out += buf

    return decode, encode


def _structs_of(doc: dict[str, Any]) -> dict[str, list]:
    """Every named struct of a spec: its common structs and the inline ones."""
    found: dict[str, list] = {s["name"]: s["fields"] for s in doc.get("commonStructs", [])}

    def walk(fields: list[dict[str, Any]]) -> None:
        for f in fields:
            if "fields" in f:
                found.setdefault(f["type"].removeprefix("[]"), f["fields"])
                walk(f["fields"])

    walk(doc["fields"])
    for s in doc.get("commonStructs", []):
        walk(s["fields"])
    return found


class MessageCodec:
    """One message (a request or a response of one API, or a header) at one version."""

    def __init__(self, name: str, version: int):
        doc = spec(name)
        low, high = parse_versions(doc["validVersions"])
        if not low <= version <= high:
            raise ValueError(f"{name} has no version {version} (valid: {doc['validVersions']})")
        self.name = name
        self.version = version
        self.flexible = _within(parse_versions(doc.get("flexibleVersions")), version)
        self._decode, self._encode = _compile_struct(doc["fields"], version, self.flexible, _structs_of(doc),
                                                     f"{name} v{version}")

    def decode(self, r: Reader) -> dict[str, Any]:
        """The body at the reader's position; raises InvalidRequestError."""
        try:
            return self._decode(r)
        except RecursionError:
            raise InvalidRequestError(f"{self.name}: nested too deeply") from None

    def decode_all(self, data: bytes | memoryview) -> dict[str, Any]:
        """A whole buffer that must hold exactly this body."""
        r = Reader(data)
        body = self.decode(r)
        if r.pos != r.end:
            raise InvalidRequestError(f"{self.name} v{self.version}: {r.end - r.pos} bytes after the body")
        return body

    def encode(self, body: dict[str, Any], out: bytearray | None = None) -> bytearray:
        out = bytearray() if out is None else out
        self._encode(body, out)
        return out


@cache
def codec(name: str, version: int) -> MessageCodec:
    """The compiled codec of ``name`` (``ProduceRequest``, ``RequestHeader``, ...) at ``version``."""
    return MessageCodec(name, version)


def valid_versions(name: str) -> tuple[int, int]:
    return parse_versions(spec(name)["validVersions"])


def flexible_versions(name: str) -> tuple[int, int]:
    return parse_versions(spec(name).get("flexibleVersions"))
