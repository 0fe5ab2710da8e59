"""Kafka's record encoding inside a v2 record batch, and how it meets Tidelog's.

A Kafka v2 batch and a Tidelog batch share the 61-byte header, its CRC-32C (over attributes
to the end) and its codec numbers; they differ only in how the records block encodes each
record. Kafka's::

    record  := length:varint attributes:int8 timestamp_delta:varlong offset_delta:varint
               key_length:varint key value_length:varint value header_count:varint header*
    header  := key_length:varint key(UTF-8) value_length:varint value     (-1 length: null)

(varints are zigzag-encoded, as in protocol buffers). Tidelog's is one msgpack array.

The broker stores both, told apart by the magic byte, which lies outside the CRC: a batch
produced through the Kafka listener is stored byte for byte as the client sent it, except
that its magic 2 becomes ``KAFKA_MAGIC`` (``to_stored``: one byte per batch, no re-encoding);
a fetch through the Kafka listener gives such a batch back with magic 2
(``to_kafka``), and translates a Tidelog batch record by record into Kafka's encoding
(same offsets, timestamps, keys, values, headers and codec). The Tidelog SDK reads both
encodings (``protocol.records`` dispatches on the magic). docs/architecture.md gives the
reasons and the costs.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from tidelog.protocol.errors import CorruptRecordError, TidelogError

KAFKA_MAGIC = 0x4B  # "K": a stored batch whose records block is in Kafka's encoding
WIRE_MAGIC = 2  # what Kafka clients send and read


# -- varints ----------------------------------------------------------------------------------


def _zigzag_out(out: bytearray, value: int) -> None:
    v = (value << 1) ^ (value >> 63)
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


class _Malformed(Exception):
    pass


MIN_RECORD_BYTES = 7  # length, attributes, two deltas, key and value lengths, header count


def decode_records(raw, n: int, base_offset: int) -> tuple[tuple, ...]:
    """The ``n`` records of an (uncompressed) Kafka records block as Tidelog's record
    tuples ``(timestamp_delta, offset_delta, key, value, headers)``, headers being None or a
    tuple of ``(str, bytes | None)``. Raises CorruptRecordError naming the bad record."""
    return tuple(r for part in iter_record_parts(raw, n, base_offset, n or 1) for r in part)


def iter_record_parts(raw, n: int, base_offset: int, chunk: int) -> Iterator[list[tuple]]:
    """``decode_records`` ``chunk`` records at a time, so a caller that checks each part
    (a produce's validation) holds one part at a time and stops at the first bad one."""
    raw = bytes(raw)
    end = len(raw)
    if n > end // MIN_RECORD_BYTES:
        raise CorruptRecordError(f"batch at offset {base_offset} declares {n} records, but its {end}-byte "
                                 f"records block can hold at most {end // MIN_RECORD_BYTES}")
    pos = 0
    out: list[tuple] = []
    i = 0

    def varint() -> int:
        nonlocal pos
        if pos >= end:
            raise _Malformed("truncated")
        b = raw[pos]
        pos += 1
        if b < 0x80:
            return (b >> 1) ^ -(b & 1)
        value, shift = b & 0x7F, 7
        while True:
            if pos >= end:
                raise _Malformed("truncated varint")
            b = raw[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
            if shift > 63:
                raise _Malformed("varint longer than 10 bytes")

    def blob(record_end: int) -> bytes | None:
        nonlocal pos
        size = varint()
        if size < 0:
            if size != -1:
                raise _Malformed(f"length {size}")
            return None
        if pos + size > record_end:
            raise _Malformed(f"a {size}-byte field runs past the record's end")
        pos += size
        return raw[pos - size:pos]

    try:
        for i in range(n):
            length = varint()
            if length < 6 or pos + length > end:
                raise _Malformed(f"length {length} with {end - pos} bytes left")
            record_end = pos + length
            pos += 1  # attributes: unused by Kafka so far
            ts_delta = varint()
            offset_delta = varint()
            key = blob(record_end)
            value = blob(record_end)
            count = varint()
            if count < 0 or count > record_end - pos:
                raise _Malformed(f"{count} headers")
            headers = None
            if count:
                hs = []
                for _ in range(count):
                    name = blob(record_end)
                    if name is None:
                        raise _Malformed("a header without a key")
                    # Java's Kafka reads a header key with replacement characters, never refuses it
                    hs.append((name.decode("utf-8", "replace"), blob(record_end)))
                headers = tuple(hs)
            if pos != record_end:
                raise _Malformed(f"{record_end - pos} bytes left inside the record")
            out.append((ts_delta, offset_delta, key, value, headers))
            if len(out) == chunk:
                yield out
                out = []
    except _Malformed as e:
        raise CorruptRecordError(f"record {i} of batch at offset {base_offset} is malformed (Kafka encoding): "
                                 f"{e}") from None
    if pos != end:
        raise CorruptRecordError(f"records block of batch at offset {base_offset} has {end - pos} bytes after "
                                 f"its {n} records")
    if out:
        yield out


def encode_records(records) -> bytes:
    """Tidelog record tuples ``(timestamp_delta, offset_delta, key, value, headers)`` (headers
    None or pairs) in Kafka's encoding, uncompressed."""
    out = bytearray()
    body = bytearray()
    for ts_delta, offset_delta, key, value, headers in records:
        body.clear()
        body.append(0)
        _zigzag_out(body, ts_delta)
        _zigzag_out(body, offset_delta)
        for blob in (key, value):
            if blob is None:
                body.append(1)  # zigzag(-1)
            else:
                _zigzag_out(body, len(blob))
                body += blob
        _zigzag_out(body, len(headers) if headers else 0)
        for name, hv in headers or ():
            encoded = name.encode()
            _zigzag_out(body, len(encoded))
            body += encoded
            if hv is None:
                body.append(1)
            else:
                _zigzag_out(body, len(hv))
                body += hv
        _zigzag_out(out, len(body))
        out += body
    return bytes(out)


# -- batches between the wire and the log ------------------------------------------------------

_MAGIC_AT = 16
_LENGTH = struct.Struct(">qi")
_OVERHEAD = 12
_HEADER_SIZE = 61
_COUNT = struct.Struct(">i")
_ATTRIBUTES = struct.Struct(">h")
_COUNT_AT = 57  # record_count, the header's last field


def to_stored(records: bytes) -> bytes:
    """A Kafka client's produced record set as the log stores it: each batch's magic 2
    becomes ``KAFKA_MAGIC``. A batch with another magic (Kafka's v0/v1 message sets), or a
    set that does not split into whole batches, raises CorruptRecordError; the log's own
    validation then checks each batch in full."""
    buf = bytearray(records)
    pos, end = 0, len(buf)
    while pos < end:
        if end - pos < _HEADER_SIZE:
            raise CorruptRecordError(f"record batch at position {pos} truncated: {end - pos} bytes left")
        _, length = _LENGTH.unpack_from(buf, pos)
        if length < _HEADER_SIZE - _OVERHEAD or pos + _OVERHEAD + length > end:
            raise CorruptRecordError(f"record batch at position {pos} has batch_length {length}, "
                                     f"{end - pos - _OVERHEAD} bytes remain")
        magic = buf[pos + _MAGIC_AT]
        if magic != WIRE_MAGIC:
            raise CorruptRecordError(f"record batch at position {pos} has magic {magic}: only the v2 record "
                                     "batch (magic 2) is supported")
        buf[pos + _MAGIC_AT] = KAFKA_MAGIC
        pos += _OVERHEAD + length
    return bytes(buf)


# A compressed batch's stored byte counted as this many bytes to translate: decompressing and
# recompressing dominate (gzip ~130 ns, zstd ~90 ns a stored byte of text, where an
# uncompressed batch costs ~3.5 ns a byte), and its uncompressed size is not in its header.
COMPRESSED_COST = 32
_ATTRIBUTES_AT = 21
_CODEC_MASK = 0x07


def translation_bytes(size: int, attributes: int) -> int:
    """What translating a Tidelog-encoded batch of ``size`` stored bytes costs, in bytes of
    an uncompressed batch (``COMPRESSED_COST``): its header alone tells it."""
    return size if attributes & _CODEC_MASK == 0 else size * COMPRESSED_COST


class TranslationBudget:
    """How much of Tidelog-encoded batches one fetch response may still translate: records
    and bytes (``translation_bytes``), as translation costs per record and per byte.

    A response translates at most ``records`` records and ``bytes`` bytes of them (and
    always its first batch, so every fetch makes progress, as Kafka returns at least one
    batch); the batches after that are left out, and the client fetches them next, as after
    any response cut at its size limit."""

    __slots__ = ("left", "bytes_left", "used")

    def __init__(self, records: int, bytes: int):
        self.left = records
        self.bytes_left = bytes
        self.used = False

    def allows(self, count: int, cost: int) -> bool:
        if self.used and (count > self.left or cost > self.bytes_left):
            return False
        self.left -= count
        self.bytes_left -= cost
        self.used = True
        return True


def to_kafka(records: bytes | memoryview, translate, budget: TranslationBudget | None = None) -> bytes:
    """Stored batches as a Kafka client reads them: a Kafka-encoded batch with magic 2 again,
    a Tidelog batch through ``translate(buf, pos) -> bytes`` (the records re-encoded) while
    ``budget`` allows. A trailing partial batch (a fetch cut at its size limit) is passed on,
    as Kafka does (with Kafka's magic: clients read it first); nothing after a batch the
    budget refused, or after bytes that are not a batch, is. A batch that does not translate
    (TidelogError) ends what is passed on there; when it is the first, the error is raised,
    for the caller to answer its partition with."""
    buf = bytearray(records)
    pos, end = 0, len(buf)
    pieces: list[bytes] = []
    start = 0  # the first byte not yet in pieces
    while end - pos >= _HEADER_SIZE:
        _, length = _LENGTH.unpack_from(buf, pos)
        size = _OVERHEAD + length
        if length < _HEADER_SIZE - _OVERHEAD:  # not a batch: nothing from here on is passed on
            end = pos
            break
        if pos + size > end:
            if buf[pos + _MAGIC_AT] == KAFKA_MAGIC:  # a trailing partial batch: librdkafka reads its magic
                buf[pos + _MAGIC_AT] = WIRE_MAGIC
            break
        magic = buf[pos + _MAGIC_AT]
        if magic == KAFKA_MAGIC:
            buf[pos + _MAGIC_AT] = WIRE_MAGIC
        else:
            if budget is not None and not budget.allows(
                    _COUNT.unpack_from(buf, pos + _COUNT_AT)[0],
                    translation_bytes(size, _ATTRIBUTES.unpack_from(buf, pos + _ATTRIBUTES_AT)[0])):
                end = pos  # this batch and everything after it wait for the next fetch
                break
            try:
                translated = translate(buf, pos)
            except TidelogError:
                if pos == 0:
                    raise
                end = pos  # what came before is served; the client's next fetch meets the error
                break
            pieces.append(bytes(buf[start:pos]))
            pieces.append(translated)
            start = pos + size
        pos += size
    if not pieces:
        return bytes(buf[:end])
    pieces.append(bytes(buf[start:end]))
    return b"".join(pieces)
