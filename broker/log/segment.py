"""One log segment: ``<base>.log`` plus its sparse ``<base>.index`` and ``<base>.timeindex``.

The ``.log`` file is a sequence of record batches exactly as they were appended (see
``protocol.records``); offsets inside a segment increase strictly, and the file name is the
segment's base offset in 20 digits. The segment keeps in memory what it needs to answer
without reading: its size, the next offset after its last batch, the largest timestamp in
it, and the indexes (see ``index``).

Reads: ``translate_offset`` finds the batch holding an offset with one index lookup and a
short forward scan of batch headers (never more than ``index.interval.bytes`` plus one batch
in a healthy segment). ``read`` returns whole stored batches, byte for byte, never a torn
one, and checks each batch's CRC on the way out, so a batch damaged on disk is never served.

Recovery (``recover``): every batch is re-read and validated (framing, magic, CRC,
offsets strictly increasing, leader epochs non-decreasing); the indexes are rebuilt from
what is valid, and the file is truncated at the first bad byte. What was cut is reported.

Descriptors: an *active* segment (created to be appended to, or appended to since it was
opened) keeps its ``.log`` open until it is rolled (``on_become_inactive``) or closed. Every
other segment opens its file on demand: its descriptor is held in a process-wide LRU
(``OPEN_SEGMENT_FILES``, at most ``log.max.open.segment.files`` descriptors), and the least
recently used one is closed when a newer one needs the room. A descriptor is pinned while
a read uses it (a ``pread``, never across a yield of a generator), so the LRU, shared by
the Trio thread and worker threads (loading, the group coordinator's reads), never closes
one under a reader; when every descriptor in it is pinned it exceeds its size until they
are released. So a partition with many segments holds one descriptor plus its share of the
LRU, however many segments it has. A segment closed for good (closed, deleted, swapped
out) is never reopened by its path, which may name another file by then (a segment created
at the same base offset) or none: a read that needs its descriptor again gets
``SegmentClosedError`` and reads the log's new segments instead (see ``log``).

Not thread-safe: a segment is used by its log, which serialises access (the descriptor LRU
is the exception: it is locked).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import threading
import weakref
from collections import OrderedDict
from typing import Iterator, NamedTuple

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.index import CorruptIndexError, OffsetIndex, TimeIndex
from tidelog.protocol.errors import CorruptRecordError, StorageError
from tidelog.protocol.records import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    MAGICS,
    MIN_BATCH_LENGTH,
    BatchHeader,
    compute_crc,
    iter_headers,
    iter_records,
    read_header,
    scan_batches,
)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
# suffixes added to the three file names during log compaction's swap (broker.log.swap)
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
SCAN_CHUNK_BYTES = 1 << 20
RECENT_BATCHES = 64  # batch positions remembered from the last appends (see LogSegment._recent)
MAX_RELATIVE_OFFSET = 2**32 - 1
# Disk blocks are reserved ahead of the active segment's end in steps of this size
# (fallocate with FALLOC_FL_KEEP_SIZE: the file size is unchanged). Appends into reserved
# blocks skip the filesystem's per-write block allocation, which otherwise dominates the
# cost of a 16 KiB append on ext4. Unused reserved blocks are released when the segment
# is rolled or closed.
PREALLOCATE_STEP_BYTES = 8 << 20
_FALLOC_FL_KEEP_SIZE = 1


def _load_fallocate():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fn.restype = ctypes.c_int
    return fn


_fallocate = _load_fallocate()


def reserve_blocks(fd: int, offset: int, length: int) -> bool:
    """Reserve disk blocks for [offset, offset + length) without changing the file size."""
    return _fallocate is not None and _fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0


MAX_OPEN_SEGMENT_FILES_DEFAULT = 256  # log.max.open.segment.files


class SegmentClosedError(StorageError):
    """The segment was closed for good (deleted, swapped out, its log closed) under a read."""


class SegmentFileCache:
    """The descriptors of inactive segments, least recently used first (see the module
    docstring); at most ``max_open`` of them open unless pinned. Thread-safe."""

    def __init__(self, max_open: int = MAX_OPEN_SEGMENT_FILES_DEFAULT):
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.max_open = max_open
        self._lock = threading.RLock()  # reentrant: a weakref callback may run under it
        # id(segment) -> a weak reference to it: a segment dropped without being closed (a
        # test's simulated crash) leaves the LRU instead of being evicted later, when its
        # old descriptor number may belong to another file
        self._lru: OrderedDict[int, weakref.ref[LogSegment]] = OrderedDict()

    @property
    def open_count(self) -> int:
        return len(self._lru)

    def acquire(self, seg: "LogSegment") -> int:
        """The segment's descriptor, opened if need be, pinned until ``release``. Raises
        SegmentClosedError when the segment was closed for good and its descriptor is gone."""
        with self._lock:
            if seg._fd < 0:
                if seg._closed:
                    raise SegmentClosedError(f"{seg.log_path}: the segment was closed")
                _reopen(seg)
            seg._pins += 1
            if not seg._keep_open:
                self._touch(seg)
            return seg._fd

    def release(self, seg: "LogSegment") -> None:
        with self._lock:
            seg._pins -= 1
            if seg._close_when_released and not seg._pins:
                seg._close_when_released = False
                _close_fd(seg)
            elif len(self._lru) > self.max_open:
                self._evict()

    def keep_open(self, seg: "LogSegment", keep: bool) -> None:
        """An active segment stays open outside the LRU; an inactive one joins it."""
        with self._lock:
            seg._keep_open = keep
            if keep:
                self._lru.pop(id(seg), None)
                if seg._fd < 0:
                    _reopen(seg)
            elif seg._fd >= 0:
                self._touch(seg)

    def close(self, seg: "LogSegment") -> None:
        """Close the segment's descriptor for good (the segment is closed or deleted). A read
        holding it (a worker thread's: the group coordinator's load, a search by timestamp)
        keeps it until its ``release``: closed under it, its ``pread`` would fail, or read
        another file that took the number meanwhile."""
        with self._lock:
            self._lru.pop(id(seg), None)
            seg._keep_open = False
            seg._closed = True
            if seg._pins:
                seg._close_when_released = True
            else:
                _close_fd(seg)

    def resize(self, max_open: int) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        with self._lock:
            self.max_open = max_open
            self._evict()

    def _touch(self, seg: "LogSegment") -> None:
        key = id(seg)
        if key in self._lru:
            self._lru.move_to_end(key)
        else:
            self._lru[key] = weakref.ref(seg, functools.partial(self._forget, key))
            self._evict()

    def _forget(self, key: int, ref: weakref.ref) -> None:
        with self._lock:
            if self._lru.get(key) is ref:
                del self._lru[key]

    def _evict(self) -> None:
        excess = len(self._lru) - self.max_open
        if excess <= 0:
            return
        for key, ref in list(self._lru.items()):
            victim = ref()
            if victim is None or victim._pins:
                continue
            del self._lru[key]
            _close_fd(victim)
            excess -= 1
            if not excess:
                return


def _reopen(seg: "LogSegment") -> None:
    fd = os.open(seg.log_path, os.O_RDWR | os.O_CLOEXEC)
    st = os.fstat(fd)
    seg._fd, seg._file_id = fd, (st.st_dev, st.st_ino)


def _close_fd(seg: "LogSegment") -> None:
    """Close the segment's descriptor if it is still the one it opened: a descriptor closed
    behind its back (a simulated crash in tests) may have been reused for another file."""
    fd, seg._fd = seg._fd, -1
    if fd < 0:
        return
    try:
        st = os.fstat(fd)
    except OSError:
        return
    if (st.st_dev, st.st_ino) == seg._file_id:
        os.close(fd)


OPEN_SEGMENT_FILES = SegmentFileCache()


def set_max_open_segment_files(max_open: int) -> None:
    """``log.max.open.segment.files``: the size of the process-wide descriptor LRU."""
    OPEN_SEGMENT_FILES.resize(max_open)


_BASE_OFFSET_NAME = re.compile(r"[0-9]{20}", re.ASCII)


def filename_prefix(base_offset: int) -> str:
    return f"{base_offset:020d}"


def parse_base_offset(filename: str) -> int | None:
    """``00000000000000000042.log`` -> 42; None when the name is not a segment file name."""
    stem, _, _ = filename.partition(".")
    if not _BASE_OFFSET_NAME.fullmatch(stem):
        return None
    return int(stem)


class RecoveryResult(NamedTuple):
    truncated_bytes: int
    valid_bytes: int
    reason: str | None


class LogSegment:
    def __init__(self, directory: str, base_offset: int, config: LogConfig, fd: int, created_ms: int,
                 *, active: bool = True):
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        self._fd = fd  # -1 while closed (an inactive segment evicted from the LRU)
        self._pins = 0  # reads using _fd now (OPEN_SEGMENT_FILES)
        self._close_when_released = False  # closed for good while pinned: the last release closes
        self._closed = False  # closed for good: never reopened (see the module docstring)
        self._keep_open = active
        self.created_ms = created_ms
        # the last write of records without timestamps, what dates them (``Log.segment_timestamp``,
        # Kafka's lastModified): kept by the log on append, the file's mtime once reopened
        self.last_modified_ms = created_ms
        prefix = os.path.join(directory, filename_prefix(base_offset))
        self.log_path = prefix + LOG_SUFFIX
        self.index = OffsetIndex(prefix + INDEX_SUFFIX, base_offset, config.segment_index_bytes)
        self.time_index = TimeIndex(prefix + TIME_INDEX_SUFFIX, base_offset, config.segment_index_bytes)
        st = os.fstat(fd)
        self.size = st.st_size
        self._file_id = (st.st_dev, st.st_ino)  # which file _fd is (see _close_fd)
        if not active:
            OPEN_SEGMENT_FILES.keep_open(self, False)
        self.next_offset = base_offset
        self.max_timestamp = -1
        self.first_batch_timestamp: int | None = None
        self.last_epoch = -1
        self._bytes_since_index_entry = 0
        self._reserved_to = 0  # blocks reserved up to here (0: none beyond the file size)
        # base offset -> (position, header) of the batches appended last: a reader at the
        # log end (a consumer's long poll, a follower) asks for exactly such an offset, and
        # finds it without the index lookup and the scan of the headers after the entry
        # (up to index.interval.bytes of them). Cleared whenever the file is cut.
        self._recent: dict[int, tuple[int, BatchHeader]] = {}

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base_offset: int, config: LogConfig, now_ms: int) -> "LogSegment":
        path = os.path.join(directory, filename_prefix(base_offset) + LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        seg = cls(directory, base_offset, config, fd, now_ms)
        for idx in (seg.index, seg.time_index):
            idx.delete()
        return seg

    @classmethod
    def create_cleaned(cls, directory: str, base_offset: int, config: LogConfig, now_ms: int) -> "LogSegment":
        """A new segment whose three files carry the ``.cleaned`` suffix: the log cleaner's
        output before it is swapped in (``broker.log.swap`` renames the files, then
        ``set_file_suffix("")`` points the object at their final names)."""
        prefix = os.path.join(directory, filename_prefix(base_offset))
        fd = os.open(prefix + LOG_SUFFIX + CLEANED_SUFFIX, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        seg = cls(directory, base_offset, config, fd, now_ms)
        seg.set_file_suffix(CLEANED_SUFFIX)
        for idx in (seg.index, seg.time_index):
            idx.delete()
        return seg

    def set_file_suffix(self, suffix: str) -> None:
        """Name the segment's files ``<base>.log<suffix>`` etc. (the renames are the caller's)."""
        prefix = os.path.join(self.directory, filename_prefix(self.base_offset))
        self.log_path = prefix + LOG_SUFFIX + suffix
        self.index.path = prefix + INDEX_SUFFIX + suffix
        self.time_index.path = prefix + TIME_INDEX_SUFFIX + suffix

    @classmethod
    def open(cls, directory: str, base_offset: int, config: LogConfig) -> "LogSegment":
        """Open an existing segment. Call ``load_indexes`` or ``recover`` next."""
        path = os.path.join(directory, filename_prefix(base_offset) + LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            return cls(directory, base_offset, config, fd, int(os.fstat(fd).st_mtime * 1000), active=False)
        except BaseException:
            os.close(fd)
            raise

    # -- descriptors (see the module docstring) ------------------------------------------------

    def _pread(self, size: int, position: int) -> bytes:
        fd = OPEN_SEGMENT_FILES.acquire(self)
        try:
            return os.pread(fd, size, position)
        finally:
            OPEN_SEGMENT_FILES.release(self)

    def pread(self, size: int, position: int) -> bytes:
        """Up to ``size`` bytes of the ``.log`` file from ``position``, through the descriptor
        LRU: any thread may read a closed segment so (the log cleaner's worker does).
        SegmentClosedError once the segment was closed for good."""
        return self._pread(size, position)

    @property
    def holds_descriptor(self) -> bool:
        """Whether the ``.log`` file is open now (tests and tools)."""
        return self._fd >= 0

    def load_indexes(self) -> None:
        """Trust the index files (after a clean shutdown) if they pass the sanity checks.

        Raises CorruptIndexError (or FileNotFoundError) when they cannot be trusted.
        """
        self.index.load()
        self.time_index.load()
        self.index.sanity_check(self.size)
        self._load_tail_state()
        self.time_index.sanity_check(self.next_offset)

    def close(self) -> None:
        if self._fd >= 0:
            self.release_reserved()
        self.index.flush(fsync=False)
        self.time_index.flush(fsync=False)
        OPEN_SEGMENT_FILES.close(self)

    def delete(self) -> None:
        """Close and remove all three files."""
        OPEN_SEGMENT_FILES.close(self)
        for path in (self.log_path, self.index.path, self.time_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def flush(self) -> None:
        """fsync the log, and write and fsync both indexes."""
        fd = OPEN_SEGMENT_FILES.acquire(self)
        try:
            os.fsync(fd)
        finally:
            OPEN_SEGMENT_FILES.release(self)
        self.index.flush()
        self.time_index.flush()

    def fsync_closed(self) -> None:
        """fsync a rolled segment's files, from a worker thread: the log through its pinned
        descriptor, the indexes (written at the roll) by path and read-only, since a file
        replaced or removed meanwhile (a cleaner's swap, retention) is no longer this
        segment's to flush. Raises SegmentClosedError when the segment was closed for good."""
        fd = OPEN_SEGMENT_FILES.acquire(self)
        try:
            os.fsync(fd)
        finally:
            OPEN_SEGMENT_FILES.release(self)
        for path in (self.index.path, self.time_index.path):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    def set_last_modified(self, ms: int) -> None:
        """Date the segment ``ms``: its ``created_ms``, ``last_modified_ms`` and its ``.log``
        file's mtime, which ``open`` reads back as both (a closed segment that is not written
        again)."""
        self.created_ms = self.last_modified_ms = ms
        os.utime(self.log_path, ns=(ms * 1_000_000, ms * 1_000_000))

    def on_become_inactive(self) -> None:
        """The segment was rolled: seal the time index with its final maximum."""
        if self.size > 0:
            self.time_index.maybe_append(self.max_timestamp, self.next_offset - 1)
        self.release_reserved()
        self.index.flush(fsync=False)
        self.time_index.flush(fsync=False)
        OPEN_SEGMENT_FILES.keep_open(self, False)

    # -- writing -------------------------------------------------------------------------------

    def append(self, buf, batches: list[tuple[int, BatchHeader]]) -> None:
        """Append already validated batches (``buf`` holds them back to back; positions are
        relative to ``buf``). Updates the indexes every ``index.interval.bytes``."""
        start = self.size
        view = memoryview(buf)
        if not self._keep_open:  # appended to: the active segment, kept open from now on
            OPEN_SEGMENT_FILES.keep_open(self, True)
        if start + len(view) > self._reserved_to:
            self._reserve(start + len(view))
        written = 0
        while written < len(view):
            # pwrite at the segment's end: the fd's own position is not the end after open
            # (0), truncate_to or recover (both ftruncate without seeking).
            written += os.pwrite(self._fd, view[written:], start + written)
        interval = self.config.index_interval_bytes
        max_ts = self.max_timestamp
        for pos, h in batches:
            if h.max_timestamp > max_ts:
                max_ts = h.max_timestamp
            if self._bytes_since_index_entry > interval:
                self.index.append(h.base_offset, start + pos)
                self.time_index.maybe_append(max_ts, h.base_offset + h.last_offset_delta)
                self._bytes_since_index_entry = 0
            self._bytes_since_index_entry += h.batch_length + LOG_OVERHEAD
        if self.first_batch_timestamp is None and batches:
            self.first_batch_timestamp = batches[0][1].max_timestamp
        recent = self._recent
        if len(recent) > RECENT_BATCHES:
            recent.clear()
        for pos, h in batches[-RECENT_BATCHES:]:
            recent[h.base_offset] = (start + pos, h)
        last = batches[-1][1]
        self.max_timestamp = max_ts
        self.next_offset = last.base_offset + last.last_offset_delta + 1
        self.last_epoch = last.leader_epoch
        self.size = start + len(view)

    def _reserve(self, end: int) -> None:
        step = max(PREALLOCATE_STEP_BYTES, end - self.size)
        step = min(step, max(self.config.segment_bytes - self.size, end - self.size))
        if reserve_blocks(self._fd, self.size, step):
            self._reserved_to = self.size + step
        else:
            self._reserved_to = 1 << 62  # not supported here: stop trying

    def release_reserved(self) -> None:
        """Give back reserved blocks beyond the end of the data."""
        if self._fd >= 0 and self._reserved_to:
            os.ftruncate(self._fd, self.size)
        self._reserved_to = 0

    def can_hold(self, first_offset: int, last_offset: int) -> bool:
        """Whether offsets [first, last] fit this segment's 32-bit relative offsets."""
        return first_offset >= self.base_offset and last_offset - self.base_offset <= MAX_RELATIVE_OFFSET

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns bytes removed."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        pos, h = found
        self._recent.clear()
        self.index.truncate_to(h.base_offset)
        self.time_index.truncate_to(h.base_offset)
        removed = self.size - pos
        self._ftruncate(pos)
        self.size = pos
        self._reserved_to = 0
        self._load_tail_state()
        return removed

    # -- reading -------------------------------------------------------------------------------

    def headers_from(self, position: int = 0, end: int | None = None) -> Iterator[tuple[int, BatchHeader]]:
        """Headers of consecutive batches from ``position`` (framing only, no CRC)."""
        end = self.size if end is None else end
        chunk = 16384
        while position < end:
            data = self._pread(min(chunk, end - position), position)
            consumed = 0
            for p, h in iter_headers(data):
                yield position + p, h
                consumed = p + h.batch_length + LOG_OVERHEAD
            if consumed == 0:  # the next batch is larger than the chunk (or the tail is torn)
                if len(data) < HEADER_SIZE:
                    return
                h = read_header(data)
                if h.batch_length < MIN_BATCH_LENGTH or position + h.size > end:
                    return
                yield position, h
                consumed = h.size
            position += consumed
            chunk = min(chunk * 2, SCAN_CHUNK_BYTES)

    def translate_offset(self, offset: int) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= ``offset``: ``(position, header)``."""
        hit = self._recent.get(offset)
        if hit is not None:
            return hit
        position = self._scan_start(offset)
        end = position
        skipped: tuple[int, BatchHeader] | None = None
        for pos, h in self.headers_from(position):
            if h.last_offset_delta < 0:  # damaged (CRC-covered) header: skipping it would skip offsets
                raise CorruptRecordError(
                    f"{self.log_path}: the batch at position {pos} (base offset {h.base_offset}) has a "
                    f"damaged header (last offset delta {h.last_offset_delta}), so offset {offset} "
                    "cannot be located")
            if h.base_offset + h.last_offset_delta >= offset:
                if skipped is not None and h.base_offset > offset:
                    self._check_gap(*skipped, offset)
                return pos, h
            skipped = pos, h
            end = pos + h.size
        if end != self.size:  # the walk stopped at damaged framing: never answer "not here"
            raise CorruptRecordError(
                f"{self.log_path}: the batch at position {end} has a damaged header (length), "
                f"so offset {offset} cannot be located")
        return None

    def _check_gap(self, pos: int, h: BatchHeader, offset: int) -> None:
        """``offset`` falls in a gap after the batch at ``pos``. Compaction leaves such gaps,
        but so does a damaged last offset delta (it is covered by the CRC, which the header
        walk does not check): answered with the next batch, a read would skip offsets. So the
        batch before a gap is checked whole, once, when a lookup lands in it."""
        data = self._pread(h.size, pos)
        if h.magic not in MAGICS or len(data) < h.size or compute_crc(data, 0, h.size) != h.crc:
            raise CorruptRecordError(
                f"{self.log_path}: the batch at position {pos} (base offset {h.base_offset}) fails its CRC "
                f"check on disk, so offset {offset} cannot be located")

    def _scan_start(self, offset: int) -> int:
        """Where a forward scan for ``offset`` starts: the index's position, if the batch there
        is the one the index names. An index damaged after a clean shutdown can pass the
        sanity checks and still point past its target; believed, a lookup would skip batches."""
        entry, position = self.index.lookup(offset)
        if position:
            raw = self._pread(HEADER_SIZE, position)
            if len(raw) < HEADER_SIZE or read_header(raw).base_offset != entry:
                return 0
        return position

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_message: bool = True) -> bytes:
        """Whole batches from the one holding ``offset``, at most ``max_bytes`` of them
        (but at least one whole batch when ``min_one_message``), none that reaches
        ``max_offset``. Raises CorruptRecordError if the first batch is damaged."""
        found = self.translate_offset(offset)
        if found is None:
            return b""
        start, first = found
        if max_offset is not None and first.base_offset + first.last_offset_delta >= max_offset:
            return b""
        data = self._pread(min(max(max_bytes, 0), self.size - start), start)
        end = self._verified_prefix(data, start, max_offset)
        if end == 0 and min_one_message:
            data = self._pread(first.size, start)
            end = self._verified_prefix(data, start, max_offset)
        return data if end == len(data) else data[:end]

    def _verified_prefix(self, data: bytes, file_pos: int, max_offset: int | None) -> int:
        """Length of the leading whole batches of ``data`` below ``max_offset`` with valid CRCs."""
        end = 0
        for p, h in iter_headers(data):
            if max_offset is not None and h.base_offset + h.last_offset_delta >= max_offset:
                break
            if h.magic not in MAGICS or compute_crc(data, p, h.batch_length + LOG_OVERHEAD) != h.crc:
                if end == 0:
                    raise CorruptRecordError(
                        f"{self.log_path}: batch at position {file_pos + p} (base offset {h.base_offset}) "
                        + ("fails its CRC check on disk" if h.magic in MAGICS else
                           f"has magic {h.magic} on disk, not {MAGIC}"))
                break
            end = p + h.batch_length + LOG_OVERHEAD
        return end

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int = 0) -> tuple[int, int] | None:
        """The first record at or after ``starting_offset`` (the log start) with timestamp >=
        ``timestamp``: ``(offset, timestamp)``, or None."""
        if self.max_timestamp < timestamp:
            return None
        after = self.time_index.lookup_before(timestamp)
        start = max(self.base_offset if after is None else after + 1, starting_offset)
        position = self._scan_start(start)
        for pos, h in self.headers_from(position):
            if h.max_timestamp < timestamp or h.base_offset + h.last_offset_delta < start:
                continue
            data = self._pread(h.size, pos)
            for r in iter_records(data, 0, h):
                if r.timestamp >= timestamp and r.offset >= start:
                    return r.offset, r.timestamp
        return None

    def max_timestamp_from(self, start: int) -> int:
        """The largest timestamp of the records at or after ``start`` (the log start), -1 if
        none has one. ``max_timestamp`` counts every record in the file, those below the log
        start included (DeleteRecords leaves their bytes): below ``start`` the batches are
        walked, and the one ``start`` falls in read record by record."""
        if start <= self.base_offset:
            return self.max_timestamp
        after = self.time_index.lookup_before(self.max_timestamp)
        if after is not None and after + 1 >= start:  # the largest lies past ``after``: not below
            return self.max_timestamp
        found = self.translate_offset(start)
        if found is None:
            return -1
        largest = -1
        for pos, h in self.headers_from(found[0]):
            if h.base_offset >= start:
                largest = max(largest, h.max_timestamp)
            elif h.max_timestamp > largest:  # straddles ``start``: only its records from there
                data = self._pread(h.size, pos)
                largest = max([largest] + [r.timestamp for r in iter_records(data, 0, h) if r.offset >= start])
        return largest

    # -- recovery ------------------------------------------------------------------------------

    def recover(self) -> RecoveryResult:
        """Re-validate every batch, rebuild both indexes, truncate at the first bad byte."""
        self.index.reset()
        self.time_index.reset()
        self._recent.clear()
        self._bytes_since_index_entry = 0
        self.next_offset, self.max_timestamp, self.last_epoch = self.base_offset, -1, -1
        self.first_batch_timestamp = None
        valid, reason, stale = self._scan_valid()
        truncated = self.size - valid
        self._ftruncate(valid)  # also releases blocks reserved past the end before a crash
        self.size = valid
        self._reserved_to = 0
        if stale:  # the cut fell before a batch already accounted: account what is kept again
            self.recover()
        self.index.flush(fsync=False)
        self.time_index.flush(fsync=False)
        return RecoveryResult(truncated, valid, reason)

    def _scan_valid(self) -> tuple[int, str | None, bool]:
        """Validate batches from position 0, re-indexing as if appended; returns (valid, why,
        whether the indexes and offsets account batches at or beyond ``valid``)."""
        pos, need = 0, 0
        prev_last, prev_epoch = self.base_offset - 1, -1
        prev_pos, prev_jumped = 0, False
        while pos < self.size:
            data = self._pread(min(max(SCAN_CHUNK_BYTES, need), self.size - pos), pos)
            res = scan_batches(data)
            good = []
            for p, h in res.batches:
                why = self._offset_fault(h, prev_last, prev_epoch)
                if why and prev_jumped and h.base_offset <= prev_last:
                    # The previous batch left a gap and this one overlaps it: a flipped bit in the
                    # previous base offset (outside the CRC) is the likelier story. Keeping that
                    # batch would serve its records at offsets they were never appended at.
                    self._reindexed(pos, good)
                    return prev_pos, (f"batch at position {prev_pos}: its base offset jumps ahead "
                                      f"and the next batch overlaps it ({why})"), True
                if why:
                    return self._reindexed(pos, good), f"batch at position {pos + p}: {why}", False
                good.append((p, h))
                prev_pos, prev_jumped = pos + p, h.base_offset != prev_last + 1
                prev_last, prev_epoch = h.base_offset + h.last_offset_delta, max(prev_epoch, h.leader_epoch)
            self._reindexed(pos, good)
            if res.error is None:
                pos, need = pos + len(data), 0
                continue
            if res.valid_bytes:
                pos, need = pos + res.valid_bytes, 0
                continue
            claimed = _claimed_size(data)
            if claimed is not None and len(data) < claimed <= self.size - pos:
                need = claimed
                continue
            return pos, res.error.replace("position 0", f"position {pos}", 1), False
        return pos, None, False

    def _offset_fault(self, h: BatchHeader, prev_last: int, prev_epoch: int) -> str | None:
        if h.base_offset <= prev_last:
            return f"base offset {h.base_offset} does not follow the previous batch's last offset {prev_last}"
        if h.base_offset + h.last_offset_delta - self.base_offset > MAX_RELATIVE_OFFSET:
            return f"offset {h.base_offset} is out of range for segment {self.base_offset}"
        if h.leader_epoch < prev_epoch:
            return f"leader epoch {h.leader_epoch} below the previous batch's {prev_epoch}"
        return None

    def _reindexed(self, chunk_pos: int, batches: list[tuple[int, BatchHeader]]) -> int:
        """Account recovered batches as if freshly appended (indexes, offsets, timestamps)."""
        interval = self.config.index_interval_bytes
        for p, h in batches:
            if self.max_timestamp < h.max_timestamp:
                self.max_timestamp = h.max_timestamp
            if self._bytes_since_index_entry > interval:
                self.index.append(h.base_offset, chunk_pos + p)
                self.time_index.maybe_append(self.max_timestamp, h.base_offset + h.last_offset_delta)
                self._bytes_since_index_entry = 0
            self._bytes_since_index_entry += h.size
            if self.first_batch_timestamp is None:
                self.first_batch_timestamp = h.max_timestamp
            self.next_offset = h.base_offset + h.last_offset_delta + 1
            self.last_epoch = h.leader_epoch
        if batches:
            p, h = batches[-1]
            return chunk_pos + p + h.size
        return chunk_pos

    def _load_tail_state(self) -> None:
        """Derive next offset, max timestamp and epoch from the last index entry onwards."""
        _, position = self.index.last_entry
        ts, _ = self.time_index.last_entry
        self.next_offset, self.max_timestamp, self.last_epoch = self.base_offset, ts, -1
        self._bytes_since_index_entry = self.size - position
        first = next(self.headers_from(0), None)
        self.first_batch_timestamp = first[1].max_timestamp if first else None
        end = position
        for pos, h in self.headers_from(position):
            self.next_offset = h.base_offset + h.last_offset_delta + 1
            self.max_timestamp = max(self.max_timestamp, h.max_timestamp)
            self.last_epoch = h.leader_epoch
            end = pos + h.size
        if end != self.size:
            raise CorruptIndexError(
                f"{self.log_path}: batches end at position {end} but the file is {self.size} bytes")

    def read_all(self) -> bytes:
        """The whole file (tools and tests)."""
        return self._pread(self.size, 0)

    def _ftruncate(self, length: int) -> None:
        fd = OPEN_SEGMENT_FILES.acquire(self)
        try:
            os.ftruncate(fd, length)
        finally:
            OPEN_SEGMENT_FILES.release(self)

    def __repr__(self) -> str:
        return (f"LogSegment(base_offset={self.base_offset}, size={self.size}, "
                f"next_offset={self.next_offset})")


def _claimed_size(data: bytes) -> int | None:
    if len(data) < HEADER_SIZE:
        return None
    h = read_header(data)
    return h.size if h.batch_length >= MIN_BATCH_LENGTH else None


__all__ = ["LogSegment", "RecoveryResult", "CorruptIndexError", "SegmentClosedError", "StorageError",
           "filename_prefix", "parse_base_offset"]
