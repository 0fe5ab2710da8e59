"""Sparse offset and time indexes of one segment.

Offset index file (``<base>.index``): 8-byte entries ``(uint32 offset - base, uint32
position)``, big-endian, appended in increasing offset order. An entry says "the batch that
starts at offset ``base + relative`` starts at byte ``position`` of the ``.log`` file". One
entry is added per ``index.interval.bytes`` of log, so lookups land within that many bytes
of their target and then scan batch headers forward.

Time index file (``<base>.timeindex``): 12-byte entries ``(int64 max timestamp so far,
uint32 offset - base)``. An entry says "every record at or below that offset has a timestamp
<= that timestamp". Entries are appended only when the maximum grows, so both columns are
non-decreasing. A lookup for the first record with timestamp >= T starts scanning just after
the last entry whose timestamp is < T.

Concurrency and durability contract: an index belongs to one segment and is used from one
thread. Entries live in memory (``array``) and are appended to the file lazily; ``flush``
writes and fsyncs them. After an unclean shutdown an index is never trusted: the loader
rebuilds it from the log. After a clean shutdown ``load`` reads it back and ``sanity_check``
rejects anything inconsistent (the loader then rebuilds).

Size: a new index holds up to ``segment.index.bytes`` of entries (full, it rolls its
segment). An index read back is sized from its file, as Kafka's: written under a larger
``segment.index.bytes``, it may hold more entries than the current value allows, and is
then full (an active segment rolls at its next append) but not damaged (rebuilt, it would
hold as many entries again, and be rejected again at every start).
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
from array import array

from tidelog.protocol.errors import StorageError

_BIG_ENDIAN = sys.byteorder == "big"
_TIME_ENTRY = struct.Struct(">qI")


class CorruptIndexError(StorageError):
    pass


def _column(typecode: str, raw: bytes) -> array:
    a = array(typecode)
    a.frombytes(raw)
    if not _BIG_ENDIAN:
        a.byteswap()
    return a


def _to_big_endian(a: array) -> bytes:
    if _BIG_ENDIAN:
        return a.tobytes()
    b = array(a.typecode, a)
    b.byteswap()
    return b.tobytes()


class _IndexFile:
    """Shared file handling: pending (unwritten) entries, flush, truncate, close."""

    ENTRY_SIZE = 0

    def __init__(self, path: str, base_offset: int, max_index_bytes: int):
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // self.ENTRY_SIZE)
        self._written = 0  # entries already in the file

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def is_full(self) -> bool:
        return len(self) >= self.max_entries

    @property
    def size_bytes(self) -> int:
        return len(self) * self.ENTRY_SIZE

    def _serialize(self, start: int, end: int) -> bytes:
        raise NotImplementedError

    def flush(self, fsync: bool = True) -> None:
        """Write pending entries; fsync when asked. Truncates the file if entries were dropped."""
        n = len(self)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if self._written > n or os.fstat(fd).st_size != self._written * self.ENTRY_SIZE:
                os.ftruncate(fd, 0)
                self._written = 0
            if n > self._written:
                os.pwrite(fd, self._serialize(self._written, n), self._written * self.ENTRY_SIZE)
                self._written = n
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def delete(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def rename(self, path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, path)
        self.path = path

    def _read_file(self) -> bytes:
        with open(self.path, "rb") as f:
            raw = f.read()
        if len(raw) % self.ENTRY_SIZE:
            raise CorruptIndexError(
                f"index file {self.path} is {len(raw)} bytes, not a multiple of {self.ENTRY_SIZE}")
        # sized from its file when that holds more (see the module docstring)
        self.max_entries = max(self.max_entries, len(raw) // self.ENTRY_SIZE)
        return raw


class OffsetIndex(_IndexFile):
    ENTRY_SIZE = 8

    def __init__(self, path: str, base_offset: int, max_index_bytes: int = 10 * 1024 * 1024):
        super().__init__(path, base_offset, max_index_bytes)
        self._offsets = array("I")  # relative offsets
        self._positions = array("I")

    def __len__(self) -> int:
        return len(self._offsets)

    def load(self) -> None:
        """Read entries from the file (after a clean shutdown). Raises CorruptIndexError."""
        raw = self._read_file()
        table = _column("I", raw)
        self._offsets = table[0::2]
        self._positions = table[1::2]
        self._written = len(self._offsets)

    def sanity_check(self, log_size: int) -> None:
        o, p = self._offsets, self._positions
        for i in range(1, len(o)):
            if o[i] <= o[i - 1] or p[i] <= p[i - 1]:
                raise CorruptIndexError(f"index file {self.path}: entry {i} does not increase")
        if p and p[-1] >= log_size:
            raise CorruptIndexError(
                f"index file {self.path}: last entry points at position {p[-1]}, log is {log_size} bytes")

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if self._offsets and rel <= self._offsets[-1]:
            raise ValueError(f"index append of offset {offset} not above the last entry")
        self._offsets.append(rel)
        self._positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """The last entry with offset <= ``offset``: ``(offset, position)``; (base, 0) if none."""
        i = bisect.bisect_right(self._offsets, offset - self.base_offset)
        if i == 0:
            return self.base_offset, 0
        return self.base_offset + self._offsets[i - 1], self._positions[i - 1]

    def entries(self) -> list[tuple[int, int]]:
        return [(self.base_offset + o, p) for o, p in zip(self._offsets, self._positions)]

    @property
    def last_entry(self) -> tuple[int, int]:
        if not self._offsets:
            return self.base_offset, 0
        return self.base_offset + self._offsets[-1], self._positions[-1]

    def truncate_to(self, offset: int) -> None:
        """Drop entries for offsets >= ``offset``."""
        i = bisect.bisect_left(self._offsets, max(0, offset - self.base_offset))
        del self._offsets[i:], self._positions[i:]
        self._written = min(self._written, i)

    def reset(self) -> None:
        self.truncate_to(self.base_offset)

    def _serialize(self, start: int, end: int) -> bytes:
        table = array("I", bytes(8 * (end - start)))
        table[0::2] = self._offsets[start:end]
        table[1::2] = self._positions[start:end]
        return _to_big_endian(table)


class TimeIndex(_IndexFile):
    ENTRY_SIZE = 12

    def __init__(self, path: str, base_offset: int, max_index_bytes: int = 10 * 1024 * 1024):
        super().__init__(path, base_offset, max_index_bytes)
        self._timestamps = array("q")
        self._offsets = array("I")

    def __len__(self) -> int:
        return len(self._offsets)

    def load(self) -> None:
        raw = self._read_file()
        self._timestamps = array("q")
        self._offsets = array("I")
        for ts, rel in _TIME_ENTRY.iter_unpack(raw):
            self._timestamps.append(ts)
            self._offsets.append(rel)
        self._written = len(self._offsets)

    def sanity_check(self, next_offset: int) -> None:
        t, o = self._timestamps, self._offsets
        for i in range(1, len(o)):
            if t[i] <= t[i - 1] or o[i] < o[i - 1]:
                raise CorruptIndexError(f"time index file {self.path}: entry {i} does not increase")
        if o and self.base_offset + o[-1] >= next_offset:
            raise CorruptIndexError(
                f"time index file {self.path}: last entry names offset {self.base_offset + o[-1]}, "
                f"beyond the log's last offset {next_offset - 1}")

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base) when empty."""
        if not self._offsets:
            return -1, self.base_offset
        return self._timestamps[-1], self.base_offset + self._offsets[-1]

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Append when ``timestamp`` is a new maximum (and the offset does not go backwards)."""
        if self._timestamps and timestamp <= self._timestamps[-1]:
            return
        rel = offset - self.base_offset
        if self._offsets and rel < self._offsets[-1]:
            return
        self._timestamps.append(timestamp)
        self._offsets.append(rel)

    def lookup_before(self, timestamp: int) -> int | None:
        """The offset of the last entry whose timestamp is < ``timestamp``, or None.

        Every record at or below that offset is older than ``timestamp``, so a search for the
        first record at or after ``timestamp`` can start right after it.
        """
        i = bisect.bisect_left(self._timestamps, timestamp)
        if i == 0:
            return None
        return self.base_offset + self._offsets[i - 1]

    def entries(self) -> list[tuple[int, int]]:
        return [(t, self.base_offset + o) for t, o in zip(self._timestamps, self._offsets)]

    def truncate_to(self, offset: int) -> None:
        """Drop entries naming offsets >= ``offset``."""
        i = bisect.bisect_left(self._offsets, max(0, offset - self.base_offset))
        del self._timestamps[i:], self._offsets[i:]
        self._written = min(self._written, i)

    def reset(self) -> None:
        self.truncate_to(self.base_offset)

    def _serialize(self, start: int, end: int) -> bytes:
        pack = _TIME_ENTRY.pack
        return b"".join(pack(self._timestamps[i], self._offsets[i]) for i in range(start, end))
