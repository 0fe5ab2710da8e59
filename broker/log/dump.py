"""``tidelog dump-log``: print and check segment files, like Kafka's kafka-dump-log.

What is read (the formats are in ``protocol.records``, ``broker.log.segment`` and
``broker.log.index``), always relative to the base offset in the file's name:

* ``<base>.log``: back-to-back record batches, each printed as Kafka's DumpLogSegments line
  (``BatchSummary.describe``) and, with ``print_data``, one ``| offset: ...`` line per record.
  Each batch's *framing* (a whole header, a length that fits the file, magic 2) and *content*
  (``validate_batch``: counts, codec, CRC-32C) are checked. A batch whose framing holds but
  whose content is bad is reported and stepped over: its length still says where the next
  batch starts. Broken framing ends the walk: from there on the file is a torn or corrupt tail
  in which no batch can be located, and it is reported with its position and the reason.
* ``<base>.index`` (8-byte entries: uint32 relative offset, uint32 position) and
  ``<base>.timeindex`` (12-byte entries: int64 timestamp, uint32 relative offset) are decoded
  directly, not through the index classes, so a damaged file is shown as it is.
* ``<offset>.snapshot``: an idempotent producer state snapshot (``broker.log.producer_state``),
  one ``producerId: ...`` line per producer and its last batches; a snapshot that does not
  decode (CRC, format) is a problem line.

Problems are ``Problem`` lines (``ERROR: ...``). Damage to the bytes (a torn or corrupt tail,
a batch failing validation, an index file that is not whole entries) is always reported.
``verify`` adds the consistency checks that recovery and lookups rely on:

* across batches: offsets strictly increasing, within the segment's 32-bit relative range and
  below the base offset of the next segment file in the same directory, leader epochs
  non-decreasing; every batch's records decode, and no CreateTime record is newer than its
  batch's ``maxTimestamp``;
* offset index entries strictly increase (offset and position) and each names the start of a
  batch of the sibling ``.log`` whose base offset is the entry's offset;
* time index entries increase (timestamps strictly, offsets never go back), name an offset in
  the log, and have a timestamp at least that of every record at or below that offset.

A ``.log`` checked with ``verify`` also checks its sibling index files when they exist.

The functions yield lines so a 1 GiB segment streams through without being held in memory
(files are read in chunks); the log and index dumpers take a ``read_at`` function or a binary
file object, so tests can run them over bytes. ``run`` is what the CLI calls.
"""

from __future__ import annotations

import bisect
import os
import re
import stat
import struct
import sys
from array import array
from contextlib import ExitStack
from typing import BinaryIO, Callable, Iterable, Iterator, NamedTuple, TextIO

from tidelog.broker.log.producer_state import MAX_SNAPSHOT_BYTES, decode_snapshot
from tidelog.broker.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    TIME_INDEX_SUFFIX,
    filename_prefix,
)
from tidelog.protocol.errors import TidelogError
from tidelog.protocol.records import (
    HEADER_SIZE,
    MAGIC,
    MAGICS,
    MIN_BATCH_LENGTH,
    NO_SEQUENCE,
    BatchHeader,
    BatchRecord,
    BatchSummary,
    TimestampType,
    compute_crc,
    iter_records,
    read_header,
    validate_batch,
)

EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE = 0, 1, 2

OFFSET_ENTRY = struct.Struct(">II")  # relative offset, position
TIME_ENTRY = struct.Struct(">qI")  # timestamp, relative offset
READ_CHUNK_BYTES = 1 << 20
_ENTRY_CHUNK_BYTES = 24 << 12  # a multiple of both entry sizes
_INT64_MAX = 2**63 - 1
# ASCII digits only: str.isdigit (used by parse_base_offset) also accepts other scripts' digits
SEGMENT_FILE_NAME = re.compile(r"([0-9]{20})(\.log|\.index|\.timeindex|\.snapshot)", re.ASCII)
SNAPSHOT_SUFFIX = ".snapshot"

ReadAt = Callable[[int, int], bytes]  # (position, length) -> up to length bytes


class Problem(str):
    """An output line that reports a problem: ``ERROR: <message>``."""

    __slots__ = ()

    def __new__(cls, message: str) -> "Problem":
        return super().__new__(cls, "ERROR: " + message)


class DumpUsageError(Exception):
    """The file cannot be dumped at all: missing, unreadable, or not a segment file name."""


# ---------------------------------------------------------------------------------------------
# reading


class FileWindow:
    """``read_at`` over a binary file, through one buffered chunk (a short read means EOF)."""

    def __init__(self, f: BinaryIO, chunk_bytes: int = READ_CHUNK_BYTES):
        self._f = f
        self._chunk_bytes = chunk_bytes
        self._start = 0
        self._buf = b""

    def __call__(self, position: int, length: int) -> bytes:
        at = position - self._start
        if at < 0 or at + length > len(self._buf):
            self._f.seek(position)
            self._buf = self._f.read(max(length, self._chunk_bytes))
            self._start, at = position, 0
        return self._buf[at:at + length]


def bytes_reader(data: bytes) -> ReadAt:
    """``read_at`` over bytes already in memory."""
    return lambda position, length: data[position:position + length]


# ---------------------------------------------------------------------------------------------
# walking a .log


class Batch(NamedTuple):
    position: int
    header: BatchHeader
    data: bytes  # the whole batch
    fault: str | None  # why its content is invalid (its framing is sound), or None


class Damage(NamedTuple):
    """Where the framing breaks: nothing from ``position`` on can be read as batches."""

    position: int
    reason: str


def iter_batches(read_at: ReadAt, size: int) -> Iterator[Batch | Damage]:
    """The batches of a ``.log`` of ``size`` bytes, in file order; a final Damage if torn."""
    position = 0
    while position < size:
        item = _batch_at(read_at, position, size)
        yield item
        if isinstance(item, Damage):
            return
        position += item.header.size


def _batch_at(read_at: ReadAt, position: int, size: int) -> Batch | Damage:
    want = min(HEADER_SIZE, size - position)
    head = read_at(position, want)
    if len(head) < want:
        return Damage(position, f"the file shrank while being read (at position {position})")
    h, why = _framing_fault(head, position, size)
    if why is not None:
        return Damage(position, why)
    data = read_at(position, h.size)
    if len(data) < h.size:
        return Damage(position, f"the file shrank while being read (at position {position})")
    return Batch(position, h, data, _content_fault(data, position))


def _framing_fault(head: bytes, position: int, size: int) -> tuple[BatchHeader | None, str | None]:
    left = size - position
    if left < HEADER_SIZE:
        return None, (f"torn tail at position {position}: {left} bytes, "
                      f"fewer than the {HEADER_SIZE} of a batch header")
    h = read_header(head)
    if h.batch_length < MIN_BATCH_LENGTH:
        return h, (f"corrupt batch header at position {position}: batch_length {h.batch_length} "
                   f"is below the minimum {MIN_BATCH_LENGTH}")
    if h.size > left:
        return h, (f"torn tail at position {position}: the batch there claims {h.size} bytes "
                   f"but only {left} remain (a partial write, or a corrupt length)")
    if h.magic not in MAGICS:
        return h, f"corrupt batch header at position {position}: magic {h.magic}, expected {MAGIC}"
    return h, None


def _content_fault(data: bytes, position: int) -> str | None:
    try:
        validate_batch(data)
    except TidelogError as e:  # validate_batch names the position within ``data``: 0
        return str(e).replace("at position 0", f"at position {position}", 1)
    return None


def _decode(batch: Batch) -> tuple[list[BatchRecord] | None, str | None]:
    try:
        return iter_records(batch.data, 0, batch.header), None
    except TidelogError as e:
        return None, f"batch at position {batch.position}: {e}"


class _OffsetOrder:
    """The cross-batch rules recovery applies (``LogSegment.recover``, the loader)."""

    def __init__(self, base_offset: int, next_segment: int | None = None):
        self.base_offset = base_offset
        self.next_segment = next_segment  # base offset of the following segment, if known
        self.last_offset: int | None = None
        self.epoch = -1

    def faults(self, position: int, h: BatchHeader) -> list[str]:
        out = []
        where = f"batch at position {position}"
        if h.base_offset < self.base_offset:
            out.append(f"{where}: base offset {h.base_offset} is below the segment's base offset "
                       f"{self.base_offset}")
        elif h.last_offset - self.base_offset > MAX_RELATIVE_OFFSET:
            out.append(f"{where}: last offset {h.last_offset} is out of the 32-bit relative range "
                       f"of segment {self.base_offset}")
        if self.next_segment is not None and h.last_offset >= self.next_segment:
            out.append(f"{where}: last offset {h.last_offset} reaches into the next segment, "
                       f"which starts at offset {self.next_segment}")
        if self.last_offset is not None and h.base_offset <= self.last_offset:
            out.append(f"{where}: base offset {h.base_offset} does not follow the previous batch's "
                       f"last offset {self.last_offset} (offsets must strictly increase)")
        if h.leader_epoch < self.epoch:
            out.append(f"{where}: leader epoch {h.leader_epoch} is below the previous batch's "
                       f"{self.epoch}")
        if self.last_offset is None or h.last_offset > self.last_offset:
            self.last_offset = h.last_offset
        self.epoch = max(self.epoch, h.leader_epoch)
        return out


def _timestamp_fault(h: BatchHeader, records: list[BatchRecord]) -> str | None:
    if h.timestamp_type is not TimestampType.CREATE_TIME:
        return None
    for r in records:
        if r.timestamp > h.max_timestamp:
            return (f"record at offset {r.offset} has timestamp {r.timestamp}, above its batch's "
                    f"maxTimestamp {h.max_timestamp} (time index lookups would miss it)")
    return None


# ---------------------------------------------------------------------------------------------
# what the index checks need to know about the log


class LogLayout:
    """Where the batches of a ``.log`` start and what they hold: enough to check index entries.

    Batches are added in file order while the log is walked; they are contiguous up to
    ``valid_end``, where the framing broke (or the file ended).
    """

    def __init__(self, base_offset: int, size: int, read_at: ReadAt, *, decode: bool = False):
        self.base_offset = base_offset
        self.size = size
        self.read_at = read_at
        self.decode = decode  # decode records for per-record timestamps (the time index check)
        self.valid_end = 0
        self.ordered = True  # offsets strictly increase from batch to batch
        self.positions = array("q")
        self.base_offsets = array("q")
        self.last_offsets = array("q")
        self.max_timestamps = array("q")  # per batch: header maxTimestamp, raised by its records'
        self._prefix_max: array | None = None

    def add(self, batch: Batch, records: list[BatchRecord] | None) -> None:
        h = batch.header
        if self.last_offsets and h.base_offset <= self.last_offsets[-1]:
            self.ordered = False
        newest = max([h.max_timestamp, *(r.timestamp for r in records or ())])
        self.positions.append(batch.position)
        self.base_offsets.append(h.base_offset)
        self.last_offsets.append(h.last_offset)
        self.max_timestamps.append(min(newest, _INT64_MAX))
        self.valid_end = batch.position + h.size
        self._prefix_max = None

    @property
    def last_offset(self) -> int | None:
        return self.last_offsets[-1] if self.last_offsets else None

    def batch_containing(self, position: int) -> int:
        """Index of the batch holding byte ``position`` (which must be below ``valid_end``)."""
        return bisect.bisect_right(self.positions, position) - 1

    def newest_timestamp_through(self, offset: int) -> int | None:
        """The largest timestamp of the records at or below ``offset`` (None if there are none).

        Assumes ``ordered``: batch ``i`` then holds the offsets after those of batch ``i - 1``.
        """
        i = bisect.bisect_left(self.last_offsets, offset)  # the first batch reaching ``offset``
        newest = self._newest_before(i)
        if i < len(self.positions) and self.base_offsets[i] <= offset:
            within = self._newest_in_batch_through(i, offset)
            newest = within if newest is None else max(newest, within)
        return newest

    def _newest_before(self, i: int) -> int | None:
        if self._prefix_max is None:
            self._prefix_max = array("q")
            for ts in self.max_timestamps:
                self._prefix_max.append(max(ts, self._prefix_max[-1]) if self._prefix_max else ts)
        return self._prefix_max[i - 1] if i > 0 else None

    def _newest_in_batch_through(self, i: int, offset: int) -> int:
        if offset >= self.last_offsets[i]:
            return self.max_timestamps[i]
        end = self.positions[i + 1] if i + 1 < len(self.positions) else self.valid_end
        data = self.read_at(self.positions[i], end - self.positions[i])
        try:
            records = iter_records(data, 0)
        except TidelogError:  # reported by the log's own check; the header bound is the best left
            return self.max_timestamps[i]
        return max(r.timestamp for r in records if r.offset <= offset)


# ---------------------------------------------------------------------------------------------
# dumping a .log


def dump_log(read_at: ReadAt, size: int, base_offset: int, *, print_data: bool = False,
             verify: bool = False, layout: LogLayout | None = None,
             next_segment: int | None = None) -> Iterator[str]:
    """Lines describing a ``.log`` of ``size`` bytes; fills ``layout`` when given.

    ``next_segment``: the base offset of the segment after this one, which ``verify`` checks
    that no batch reaches.
    """
    yield f"Log starting offset: {base_offset}"
    dumper = _BatchDumper(_OffsetOrder(base_offset, next_segment), print_data, verify, layout)
    for item in iter_batches(read_at, size):
        if isinstance(item, Damage):
            yield _tail_problem(item, read_at, size)
            return
        yield from dumper.lines(item)


def _tail_problem(damage: Damage, read_at: ReadAt, size: int) -> Problem:
    zeros = ""
    if _zeros(read_at, damage.position, size):
        zeros = " (all zero: space allocated but never written)"
    return Problem(f"{damage.reason}; the {size - damage.position} bytes from there to the end of the "
                   f"file{zeros} are not dumped (recovery truncates a log at its first bad batch)")


def _zeros(read_at: ReadAt, position: int, size: int) -> bool:
    while position < size:
        chunk = read_at(position, min(READ_CHUNK_BYTES, size - position))
        if not chunk or chunk.strip(b"\x00"):
            return False
        position += len(chunk)
    return True


class _BatchDumper:
    """The lines for each batch of one ``.log``, in file order."""

    def __init__(self, order: _OffsetOrder, print_data: bool, verify: bool, layout: LogLayout | None):
        self.order = order
        self.print_data = print_data
        self.verify = verify
        self.layout = layout
        self.decode = print_data or verify or (layout is not None and layout.decode)

    def lines(self, batch: Batch) -> Iterator[str]:
        h = batch.header
        yield BatchSummary(batch.position, h, compute_crc(batch.data, 0, h.size) == h.crc).describe()
        if batch.fault:
            yield Problem(batch.fault)
        records, faults = self._check(batch)
        yield from map(Problem, faults)
        if self.print_data:
            yield from _record_lines(batch, records)
        if self.layout is not None:
            self.layout.add(batch, records)

    def _check(self, batch: Batch) -> tuple[list[BatchRecord] | None, list[str]]:
        faults = self.order.faults(batch.position, batch.header) if self.verify else []
        records, why = _decode(batch) if self.decode and batch.fault is None else (None, None)
        if why is not None:
            faults.append(why)
        elif records and self.verify:
            faults.append(_timestamp_fault(batch.header, records))
        return records, [f for f in faults if f]


def _record_lines(batch: Batch, records: list[BatchRecord] | None) -> Iterator[str]:
    if batch.fault:
        yield "| (records not shown: the batch is invalid)"
    for r in records or ():
        yield describe_record(r, batch.header)


def describe_record(r: BatchRecord, h: BatchHeader) -> str:
    """Kafka's ``| offset: ...`` line for one record, with its key, payload and headers."""
    sequence = NO_SEQUENCE
    if h.base_sequence != NO_SEQUENCE:
        sequence = (h.base_sequence + r.offset - h.base_offset) & 0x7FFFFFFF
    kind = "LogAppendTime" if h.timestamp_type is TimestampType.LOG_APPEND_TIME else "CreateTime"
    headers = ", ".join(f"{_show_text(k)}={show_bytes(v)}" for k, v in r.headers)
    return (f"| offset: {r.offset} {kind}: {r.timestamp} keySize: {_size(r.key)} "
            f"valueSize: {_size(r.value)} sequence: {sequence} headers: [{headers}] "
            f"key: {show_bytes(r.key)} payload: {show_bytes(r.value)}")


def _size(blob: bytes | None) -> int:
    return -1 if blob is None else len(blob)


def show_bytes(blob: bytes | None) -> str:
    """Printable UTF-8 as it is; other UTF-8 as a Python literal; anything else as hex."""
    if blob is None:
        return "null"
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + blob.hex()
    return _show_text(text)


def _show_text(text: str) -> str:
    return text if text.isprintable() else repr(text)


# ---------------------------------------------------------------------------------------------
# dumping the indexes


class _Entries:
    """Fixed-size entries of an index file, read in chunks; ``trailing`` counts leftover bytes."""

    def __init__(self, f: BinaryIO, entry: struct.Struct):
        self._f = f
        self._entry = entry
        self.trailing = 0

    def __iter__(self) -> Iterator[tuple]:
        rest = b""
        while chunk := self._f.read(_ENTRY_CHUNK_BYTES):
            data = rest + chunk
            whole = len(data) - len(data) % self._entry.size
            yield from self._entry.iter_unpack(memoryview(data)[:whole])
            rest = data[whole:]
        self.trailing = len(rest)


def _partial_entry(trailing: int, entry: struct.Struct) -> Problem:
    return Problem(f"the file ends with {trailing} bytes that are not a whole {entry.size}-byte "
                   "entry (a partial write)")


def dump_offset_index(f: BinaryIO, base_offset: int, *, verify: bool = False,
                      layout: LogLayout | None = None, show_entries: bool = True) -> Iterator[str]:
    """Lines for a ``.index``: ``offset: X position: Y``; with ``verify``, its problems."""
    entries = _Entries(f, OFFSET_ENTRY)
    previous = None
    for i, (relative, position) in enumerate(entries):
        offset = base_offset + relative
        if show_entries:
            yield f"offset: {offset} position: {position}"
        if verify:
            where = f"index entry {i} (offset {offset}, position {position})"
            yield from (Problem(f"{where} {why}")
                        for why in _offset_entry_faults(offset, position, previous, layout))
        previous = offset, position
    if entries.trailing:
        yield _partial_entry(entries.trailing, OFFSET_ENTRY)


def _offset_entry_faults(offset: int, position: int, previous: tuple[int, int] | None,
                         layout: LogLayout | None) -> list[str]:
    out = []
    if previous is not None and (offset <= previous[0] or position <= previous[1]):
        out.append(f"does not increase: the previous entry is offset {previous[0]}, "
                   f"position {previous[1]}")
    if layout is not None:
        out.append(_offset_entry_vs_log(offset, position, layout))
    return [why for why in out if why]


def _offset_entry_vs_log(offset: int, position: int, layout: LogLayout) -> str | None:
    if position >= layout.size:
        return f"points beyond the end of the log ({layout.size} bytes)"
    if position >= layout.valid_end:
        return f"points into the log's torn or corrupt tail (from position {layout.valid_end})"
    i = layout.batch_containing(position)
    if layout.positions[i] != position:
        return (f"does not point at the start of a batch: position {position} is inside the batch "
                f"at position {layout.positions[i]} (base offset {layout.base_offsets[i]})")
    if layout.base_offsets[i] != offset:
        found = layout.base_offsets[i]
        return (f"does not match the log: the batch at position {position} has base offset {found} "
                f"(index offset: {offset}, log offset: {found})")
    return None


def dump_time_index(f: BinaryIO, base_offset: int, *, verify: bool = False,
                    layout: LogLayout | None = None, show_entries: bool = True) -> Iterator[str]:
    """Lines for a ``.timeindex``: ``timestamp: T offset: O``; with ``verify``, its problems."""
    entries = _Entries(f, TIME_ENTRY)
    previous = None
    if verify and layout is not None and not layout.ordered:
        yield Problem("the time index cannot be checked against the log: the log's batch offsets "
                      "do not increase (verify the .log)")
        layout = None
    for i, (timestamp, relative) in enumerate(entries):
        offset = base_offset + relative
        if show_entries:
            yield f"timestamp: {timestamp} offset: {offset}"
        if verify:
            where = f"time index entry {i} (timestamp {timestamp}, offset {offset})"
            yield from (Problem(f"{where} {why}")
                        for why in _time_entry_faults(timestamp, offset, previous, layout))
        previous = timestamp, offset
    if entries.trailing:
        yield _partial_entry(entries.trailing, TIME_ENTRY)


def _time_entry_faults(timestamp: int, offset: int, previous: tuple[int, int] | None,
                       layout: LogLayout | None) -> list[str]:
    out = []
    if previous is not None and timestamp <= previous[0]:
        out.append(f"does not increase: the previous entry's timestamp is {previous[0]}")
    if previous is not None and offset < previous[1]:
        out.append(f"goes back: the previous entry's offset is {previous[1]}")
    if layout is not None:
        out.append(_time_entry_vs_log(timestamp, offset, layout))
    return [why for why in out if why]


def _time_entry_vs_log(timestamp: int, offset: int, layout: LogLayout) -> str | None:
    last = layout.last_offset
    if last is None:
        return "names an offset, but the log holds no batches"
    if offset > last:
        return f"names an offset beyond the log's last offset {last}"
    newest = layout.newest_timestamp_through(offset)
    if newest is not None and newest > timestamp:
        return (f"is wrong: a record at or below offset {offset} has timestamp {newest}, "
                f"above the entry's (index timestamp: {timestamp}, log timestamp: {newest})")
    return None


# ---------------------------------------------------------------------------------------------
# files


def segment_file(path: str) -> tuple[int, str]:
    """(base offset, suffix) of a segment file, or DumpUsageError saying why it can't be dumped."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DumpUsageError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise DumpUsageError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise DumpUsageError(f"{path}: is a directory; name the segment files in it")
    if not stat.S_ISREG(st.st_mode):
        raise DumpUsageError(f"{path}: not a regular file")
    m = SEGMENT_FILE_NAME.fullmatch(os.path.basename(path))
    if m is None:
        raise DumpUsageError(
            f"{path}: not a segment file name: expected a 20-digit base offset and .log, .index, "
            ".timeindex or .snapshot, like 00000000000000000000.log")
    return int(m.group(1)), m.group(2)


def _open(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as e:
        raise DumpUsageError(f"{path}: {e.strerror or e}") from None


def sibling(path: str, base_offset: int, suffix: str) -> str:
    return os.path.join(os.path.dirname(path), filename_prefix(base_offset) + suffix)


def dump_file(path: str, *, verify: bool = False, print_data: bool = False,
              also_named: Iterable[str] = ()) -> Iterator[str]:
    """Lines for one segment file. Raises DumpUsageError at once when it cannot be dumped.

    ``also_named``: real paths of the other files being dumped; a ``.log`` does not re-check
    sibling index files that are dumped (and checked) on their own.
    """
    base_offset, suffix = segment_file(path)
    f = _open(path)
    return _dump_open_file(f, path, base_offset, suffix, verify, print_data, frozenset(also_named))


def _dump_open_file(f: BinaryIO, path: str, base_offset: int, suffix: str, verify: bool,
                    print_data: bool, also_named: frozenset[str]) -> Iterator[str]:
    with f:
        yield f"Dumping {path}"
        try:
            if suffix == LOG_SUFFIX:
                yield from _dump_log_file(f, path, base_offset, verify, print_data, also_named)
            elif suffix == SNAPSHOT_SUFFIX:
                yield from dump_producer_snapshot(f.read(MAX_SNAPSHOT_BYTES + 1))
            else:
                yield from _dump_index_file(f, path, base_offset, suffix, verify)
        except OSError as e:
            yield Problem(f"cannot read {e.filename or path}: {e.strerror or e}")


def dump_producer_snapshot(data: bytes) -> Iterator[str]:
    """Lines for a producer state snapshot, like kafka-dump-log's for ``.snapshot`` files."""
    try:
        offset, entries = decode_snapshot(data)
    except ValueError as e:
        yield Problem(f"not a readable producer state snapshot: {e}")
        return
    yield f"Producer state as of offset {offset}: {len(entries)} producers"
    for e in entries:
        for b in e.batches:
            yield (f"producerId: {e.producer_id} producerEpoch: {e.producer_epoch} "
                   f"firstSequence: {b.first_seq} lastSequence: {b.last_seq} "
                   f"firstOffset: {b.first_offset} lastOffset: {b.last_offset} lastTimestamp: {b.max_timestamp}")


def _dump_log_file(f: BinaryIO, path: str, base_offset: int, verify: bool, print_data: bool,
                   also_named: frozenset[str]) -> Iterator[str]:
    size = os.fstat(f.fileno()).st_size
    read_at = FileWindow(f)
    if not verify:
        yield from dump_log(read_at, size, base_offset, print_data=print_data)
        return
    layout = LogLayout(base_offset, size, read_at, decode=True)
    following = next_segment_base(os.listdir(os.path.dirname(path) or "."), base_offset)
    yield from dump_log(read_at, size, base_offset, print_data=print_data, verify=True, layout=layout,
                        next_segment=following)
    for suffix, dumper in ((INDEX_SUFFIX, dump_offset_index), (TIME_INDEX_SUFFIX, dump_time_index)):
        index_path = sibling(path, base_offset, suffix)
        if os.path.realpath(index_path) in also_named or not os.path.isfile(index_path):
            continue
        yield f"Checking {index_path} against {path}"
        with open(index_path, "rb") as g:
            yield from dumper(g, base_offset, verify=True, layout=layout, show_entries=False)


def next_segment_base(names: Iterable[str], base_offset: int) -> int | None:
    """The smallest base offset above ``base_offset`` among the ``.log`` files in ``names``."""
    bases = (int(m.group(1)) for m in map(SEGMENT_FILE_NAME.fullmatch, names)
             if m is not None and m.group(2) == LOG_SUFFIX)
    return min((b for b in bases if b > base_offset), default=None)


def _dump_index_file(f: BinaryIO, path: str, base_offset: int, suffix: str,
                     verify: bool) -> Iterator[str]:
    dumper = dump_offset_index if suffix == INDEX_SUFFIX else dump_time_index
    with ExitStack() as stack:
        layout = None
        if verify:
            log_path = sibling(path, base_offset, LOG_SUFFIX)
            layout = _scan_log(stack, log_path, base_offset, decode=suffix == TIME_INDEX_SUFFIX)
            if layout is None:
                yield Problem(f"the entries cannot be checked against the log: {log_path} "
                              "does not exist")
        yield from dumper(f, base_offset, verify=verify, layout=layout)


def _scan_log(stack: ExitStack, log_path: str, base_offset: int, *, decode: bool) -> LogLayout | None:
    """The layout of a sibling log (kept open in ``stack``), or None if there is none."""
    if not os.path.isfile(log_path):
        return None
    g = stack.enter_context(open(log_path, "rb"))
    size = os.fstat(g.fileno()).st_size
    layout = LogLayout(base_offset, size, FileWindow(g), decode=decode)
    for _ in dump_log(layout.read_at, size, base_offset, layout=layout):
        pass  # the log's own problems are its own dump's business
    return layout


# ---------------------------------------------------------------------------------------------
# the command


def run(paths: list[str], *, verify: bool = False, print_data: bool = False,
        out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Dump each file to ``out``; 0 if all is well, 1 if problems were found, 2 on usage errors."""
    out = out or sys.stdout
    err = err or sys.stderr
    named = frozenset(os.path.realpath(p) for p in paths)
    status = EXIT_OK
    for path in paths:
        status = max(status, _run_one(path, verify, print_data, named, out, err))
    return status


def _run_one(path: str, verify: bool, print_data: bool, named: frozenset[str],
             out: TextIO, err: TextIO) -> int:
    try:
        lines = dump_file(path, verify=verify, print_data=print_data,
                          also_named=named - {os.path.realpath(path)})
    except DumpUsageError as e:
        print(f"tidelog dump-log: error: {e}", file=err)
        return EXIT_USAGE
    problems = 0
    for line in lines:
        problems += isinstance(line, Problem)
        print(line, file=out)
    if verify:
        verdict = f"{problems} problem(s) found" if problems else "verified, no problems found"
        print(f"{path}: {verdict}", file=out)
    return EXIT_PROBLEMS if problems else EXIT_OK
