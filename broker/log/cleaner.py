"""Log compaction: the log cleaner, after Kafka's LogCleaner, Cleaner and LogCleanerManager.

Theory of operation
-------------------
A log with ``cleanup.policy`` ``compact`` (or ``compact,delete``) keeps at least the last
record of every key. Its segments are split by the *cleaner checkpoint* (``first dirty
offset``, one line per partition in ``cleaner-offset-checkpoint`` of each log directory, in
Kafka's checkpoint format): below it the log is *clean* (no key appears twice there), from it
on it is *dirty*. The *cleanable* part of the dirty section ends at the first uncleanable
offset: the base of the active segment, of the first segment not wholly below the high
watermark, or of the first dirty segment holding a record younger than
``min.compaction.lag.ms``. The cleaner only ever rewrites whole, closed segments below it.

Choosing a log (``LogCleaner.grab_filthiest_log``): the *dirty ratio* of a log is cleanable
bytes / (clean + cleanable bytes). Among compacted logs not being cleaned, the one with the
highest ratio is cleaned if that ratio exceeds its ``min.cleanable.dirty.ratio``, or if a
dirty record is older than ``max.compaction.lag.ms``.

Cleaning a log (``CleaningJob``):

1. *Offset map* (``build_offset_map``): key -> offset of its last record in the cleanable
   dirty section, read in offset order. The map holds at most ``log.cleaner.dedupe.buffer.size
   / 176 * log.cleaner.io.buffer.load.factor`` keys: Kafka's SkimpyOffsetMap packs a key in
   24 bytes (a 16-byte MD5 of the key and an 8-byte offset), but in a Python dict of digest
   -> offset a key costs up to 176 bytes (the objects and the table, while it grows), and
   the buffer size is a memory bound; when it is full, the map ends at the last offset it
   covers, and this round cleans only up to there (``end_offset``).
2. *Groups*: every segment from the log's first up to ``end_offset`` (clean ones too: they
   may hold records superseded in the dirty section), grouped so a group's files stay below
   ``segment.bytes`` and ``segment.index.bytes`` (``group_segments_by_size``).
3. *Cleaning a group* (``clean_group``, in a worker thread): every batch is read, its CRC
   checked, and each record kept or dropped (``retain_record``): a record past the map's
   last offset is kept; a keyless record is dropped (Kafka drops them: a compacted topic
   refuses them on produce, but a topic switched to compact may hold some); a record whose
   key has a later offset in the map is dropped; a tombstone (null value) is kept until its
   batch's *delete horizon* has passed. The delete horizon is Kafka's (KIP-534): the first
   time the cleaner keeps a batch with tombstones it stamps ``now + delete.retention.ms``
   into it (attribute bit 6, ``first_timestamp``), so a tombstone survives at least
   ``delete.retention.ms`` after it was first cleaned: long enough for a consumer that read
   the value before to see the delete. The last record of the last batch of each idempotent
   producer the log's producer state knows (Kafka's active producers) is kept, so its last
   sequence number survives a rebuild of the state from the log, unless a later record of
   its key supersedes it: Kafka keeps such a batch empty, but a batch here holds at least one
   record, and an old value kept would come back once the later records are gone (a
   tombstone past its delete horizon). A producer forgotten by
   producer id expiration is not protected any more (the log manager then moves the
   checkpoint back to its record, so the next cleaning reconsiders it): otherwise a compacted
   topic would keep one record for every producer id that ever wrote to it.
4. *Re-encoding*: a batch whose records are all kept is copied byte for byte (leader epoch,
   CRC and all). Otherwise each run of consecutive kept records becomes a batch of its own:
   this format's batch has consecutive offsets (``last_offset_delta = record_count - 1``), so a
   gap inside a batch becomes a gap between batches. Each new batch keeps the records'
   offsets, timestamps, keys, values and headers, and the batch's leader epoch, attributes
   (codec; left uncompressed when compression would not shrink the run), producer id and
   epoch; its base sequence is the sequence of its first record. Offsets are never
   renumbered: a compacted log has gaps, and readers skip them (a fetch returns the first
   batch whose last offset is at or after the fetch offset).
5. *Swap* (``swap``, on the log's owner thread): the group's output, written as
   ``.cleaned`` files and fsynced, replaces the group's segments through the crash-safe file
   protocol of ``broker.log.swap`` (``.cleaned`` -> ``.swap``, old files ``.deleted``, then
   ``.swap`` renamed into place) and ``Log.replace_segments``. A group the cleaner would not
   change is left alone. Output larger than ``segment.bytes`` (splitting batches costs headers)
   is written as several segments.
6. The checkpoint moves to ``end_offset``, unless the log was truncated meanwhile. A
   truncation lowers the checkpoint to the new log end itself, at once and whatever the
   cleaner's state of the log (``LogManager._truncated``, Kafka's maybeTruncateCheckpoint):
   what is written there again was never cleaned.

Threads: the log is owned by one thread (the broker's Trio thread) and is not thread-safe.
The heavy work (steps 1, 3, 4) runs in a worker thread on a *snapshot*: the closed segments
below the first uncleanable offset, their base offsets and sizes (the only ones a cleaning
reads), read up to those sizes, so neither a concurrent append nor a roll disturbs it. They
are read through the segments' own descriptors, in the process-wide LRU of
``log.max.open.segment.files`` (``segment``), one at a time: a log of more segments than
free descriptors is cleaned as any other. A segment dropped from the log under the cleaning
(retention, a truncation, the log's close) is never reopened by its path: reading it
abandons the cleaning, tried again later. The swap (step 5) runs on the owner thread and
first checks that the group's segments are still the log's, with the sizes of the snapshot;
if not (retention deleted one, a follower truncated), the group is abandoned and its output
deleted. A truncation anywhere, even of segments after the group,
or the log's close or deletion abandons the whole cleaning (``Log.cleaner_fence``, checked
per batch in the worker, before each swap and by ``done_cleaning``): the offset map may hold keys whose records
are gone, and a record they supersede must stay; and a deleted log's directory may already
hold a new topic of the same name. Readers run on the owner thread too, so no read is ever in
progress during a swap, and a read after it sees the new segments.

``cleaning_steps`` expresses one cleaning as a generator of the work to run off the owner
thread: ``LogCleaner.clean_once`` runs it inline (tests), the broker awaits each step with
``trio.to_thread.run_sync`` (broker/server.py). This module knows nothing of Trio.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple

from crc32c import crc32c

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.log import Clock, Log, LogDirFailure, dir_failure, wall_clock_ms
from tidelog.broker.log.segment import MAX_RELATIVE_OFFSET, LogSegment, SegmentClosedError
from tidelog.protocol.errors import CorruptRecordError, StorageError, TidelogError
from tidelog.protocol.records import (
    CODEC_MASK,
    DELETE_HORIZON_BIT,
    HEADER_SIZE,
    MIN_BATCH_LENGTH,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    Codec,
    compress,
    decode_items,
    decompress,
    encode_items,
    iter_headers,
    read_header,
    record_columns,
    validate_batch,
)
from tidelog.protocol.topics import TopicPartition

logger = logging.getLogger("tidelog.log.cleaner")

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
# memory of one key in OffsetMap (dict of 16-byte MD5 -> offset: bytes and int objects and
# the dict's table, at its peak while the table grows); Kafka's SkimpyOffsetMap needs 24
BYTES_PER_MAP_ENTRY = 176
READ_CHUNK_BYTES = 1 << 20
_HEAD = struct.Struct(">qiibI")
_TAIL = struct.Struct(">hiqqqhii")


class CleaningAborted(Exception):
    """The log changed under the cleaner (or the broker is stopping): try again later."""


@dataclass(frozen=True, slots=True)
class CleanerConfig:
    enable: bool = True
    threads: int = 1
    backoff_ms: int = 15000
    dedupe_buffer_size: int = 128 * 1024 * 1024
    io_buffer_load_factor: float = 0.9

    @property
    def map_capacity(self) -> int:
        """Keys one cleaner's offset map may hold (the buffer is shared by the threads)."""
        slots = self.dedupe_buffer_size // self.threads // BYTES_PER_MAP_ENTRY
        return max(1, int(slots * self.io_buffer_load_factor))

    @classmethod
    def from_broker_config(cls, c) -> "CleanerConfig":
        return cls(c.log_cleaner_enable, c.log_cleaner_threads, c.log_cleaner_backoff_ms,
                   c.log_cleaner_dedupe_buffer_size, c.log_cleaner_io_buffer_load_factor)


# -- which log, which offsets (pure) ---------------------------------------------------------------


class OffsetsToClean(NamedTuple):
    first_dirty_offset: int
    first_uncleanable_offset: int
    force_update_checkpoint: bool  # the checkpoint was outside the log: reset it


def cleanable_offsets(log: Log, checkpoint: int | None, now_ms: int) -> OffsetsToClean:
    """The dirty range [first dirty, first uncleanable) that may be cleaned now (whole
    segments: the active one, one reaching the HW, or one younger than the compaction lag
    ends it)."""
    start, end = log.log_start_offset, log.log_end_offset
    dirty = start if checkpoint is None else checkpoint
    force = dirty < start or dirty > end
    if force:
        logger.warning("%s: cleaner checkpoint %s is outside the log [%d, %d]; cleaning from the log start",
                       log.topic_partition, checkpoint, start, end)
        dirty = start
    segments = log.segments
    uncleanable = segments[-1].base_offset
    lag = log.config.min_compaction_lag_ms
    for seg, upper in zip(segments, [s.base_offset for s in segments[1:]]):
        too_young = lag > 0 and upper > dirty and Log.segment_timestamp(seg) > now_ms - lag
        if upper > log.high_watermark or too_young:
            uncleanable = seg.base_offset
            break
    return OffsetsToClean(dirty, max(dirty, uncleanable), force)


@dataclass(slots=True)
class LogToClean:
    topic_partition: TopicPartition
    log: Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    need_compaction_now: bool = False

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def should_clean(self) -> bool:
        return ((self.need_compaction_now and self.cleanable_bytes > 0)
                or self.cleanable_ratio > self.log.config.min_cleanable_dirty_ratio)


def log_to_clean(tp: TopicPartition, log: Log, offsets: OffsetsToClean, now_ms: int) -> LogToClean:
    dirty, uncleanable = offsets.first_dirty_offset, offsets.first_uncleanable_offset
    clean = cleanable = 0
    earliest_dirty = None
    segments = log.segments
    for seg, upper in zip(segments, [s.base_offset for s in segments[1:]] + [log.log_end_offset]):
        if upper <= dirty:
            clean += seg.size
        elif dirty < uncleanable and seg.base_offset < uncleanable:  # [dirty, uncleanable) may be empty
            cleanable += seg.size
        if upper > dirty and seg is not segments[-1] and seg.first_batch_timestamp not in (None, -1):
            ts = seg.first_batch_timestamp
            earliest_dirty = ts if earliest_dirty is None else min(earliest_dirty, ts)
    max_lag = log.config.max_compaction_lag_ms
    overdue = earliest_dirty is not None and earliest_dirty < now_ms - max_lag
    return LogToClean(tp, log, dirty, uncleanable, clean, cleanable, overdue)


def filthiest(candidates: list[LogToClean]) -> LogToClean | None:
    """The log to clean next: the highest dirty ratio among those that should be cleaned."""
    eligible = [c for c in candidates if c.should_clean]
    return max(eligible, key=lambda c: c.cleanable_ratio, default=None)


def group_segments_by_size(segments: list[LogSegment], uppers: list[int], max_size: int,
                           max_index_bytes: int) -> list[list[int]]:
    """Consecutive segments (as indexes into ``segments``) grouped so that each group's log
    and index bytes stay within the limits and its offsets fit one segment's relative range.
    ``uppers[i]`` bounds segment i's offsets (the next segment's base)."""
    groups: list[list[int]] = []
    i = 0
    while i < len(segments):
        group = [i]
        size, index, time_index = segments[i].size, segments[i].index.size_bytes, segments[i].time_index.size_bytes
        j = i + 1
        while (j < len(segments)
               and size + segments[j].size <= max_size
               and index + segments[j].index.size_bytes <= max_index_bytes
               and time_index + segments[j].time_index.size_bytes <= max_index_bytes
               and uppers[j] - 1 - segments[i].base_offset <= MAX_RELATIVE_OFFSET):
            size += segments[j].size
            index += segments[j].index.size_bytes
            time_index += segments[j].time_index.size_bytes
            group.append(j)
            j += 1
        groups.append(group)
        i = j
    return groups


def retain_record(offset: int, key: bytes | None, value: bytes | None, latest_in_map: int,
                  map_offset: int, horizon: int | None, now_ms: int) -> bool:
    """Kafka's shouldRetainRecord. ``map_offset``: the offset the map holds for the key (-1
    if none); ``horizon``: the batch's delete horizon (None until it was first cleaned)."""
    if offset > latest_in_map:
        return True  # beyond what this round maps: not cleaned yet
    if key is None:
        return False  # a compacted topic has no use for a record without a key
    if offset < map_offset:
        return False  # superseded by a later record with the same key
    return value is not None or horizon is None or now_ms < horizon


# -- the key -> offset map ----------------------------------------------------------------------


class OffsetMap:
    """Key (by MD5, as Kafka's SkimpyOffsetMap) -> offset of its last record, bounded."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._map: dict[bytes, int] = {}
        self.latest_offset = -1  # every record up to here has been put (or had no key)

    def __len__(self) -> int:
        return len(self._map)

    @staticmethod
    def _digest(key: bytes) -> bytes:
        return hashlib.md5(key, usedforsecurity=False).digest()

    def put(self, key: bytes, offset: int) -> bool:
        """Record ``key`` at ``offset``; False (nothing stored) when a new key does not fit."""
        d = self._digest(key)
        if d not in self._map and len(self._map) >= self.capacity:
            return False
        self._map[d] = offset
        return True

    def get(self, key: bytes) -> int:
        return self._map.get(self._digest(key), -1)

    @property
    def utilization(self) -> float:
        return len(self._map) / self.capacity


# -- reading segment files (worker thread) ------------------------------------------------------


@dataclass(slots=True)
class SourceSegment:
    """A segment as the job saw it: the object (read through, and checked to be still the
    log's at swap time), its base, size, upper bound and time (what retention judges it by)."""

    segment: LogSegment
    base_offset: int
    size: int
    upper: int  # the next segment's base offset
    timestamp: int  # Log.segment_timestamp

    @classmethod
    def snapshot(cls, seg: LogSegment, upper: int) -> "SourceSegment":
        return cls(seg, seg.base_offset, seg.size, upper, Log.segment_timestamp(seg))

    def pread(self, size: int, position: int) -> bytes:
        """Bytes of the segment's file, through its descriptor in the segment LRU; a segment
        dropped from the log since (retention, a truncation, its log closed) is not read
        again by its path: the cleaning is abandoned, to be tried again."""
        try:
            return self.segment.pread(size, position)
        except SegmentClosedError:
            raise CleaningAborted(f"segment {self.base_offset} was dropped from the log while it "
                                  "was being cleaned") from None


def iter_file_batches(src: SourceSegment, check: Callable[[], None]) -> Iterator[tuple[BatchHeader, bytes]]:
    """Every batch of a segment up to the size the job saw, CRC-checked; ``check`` runs per
    batch (it raises CleaningAborted to stop). Raises CorruptRecordError for a bad batch."""
    position, size = 0, src.size
    while position < size:
        data = src.pread(min(READ_CHUNK_BYTES, size - position), position)
        consumed = 0
        for p, h in iter_headers(data):
            check()
            batch = data[p:p + h.size]
            validate_batch(batch)
            yield h, batch
            consumed = p + h.size
        if consumed == 0:  # a batch larger than the chunk
            if len(data) < HEADER_SIZE or (h := read_header(data)).batch_length < MIN_BATCH_LENGTH \
                    or position + h.size > size:
                raise CorruptRecordError(f"damaged batch framing at position {position}")
            batch = src.pread(h.size, position)
            validate_batch(batch)
            yield h, batch
            consumed = h.size
        position += consumed


def decode_records(batch: bytes, h: BatchHeader) -> tuple:
    """The raw records ``(timestamp_delta, offset_delta, key, value, headers)`` of a batch."""
    raw = decompress(h.codec, memoryview(batch)[HEADER_SIZE:h.size])
    items = decode_items(h, raw)
    if type(items) is not tuple or len(items) != h.record_count:
        raise CorruptRecordError(f"batch at offset {h.base_offset}: its records do not match its record count")
    for r in items:
        if (type(r) is not tuple or len(r) != 5 or type(r[0]) is not int
                or type(r[2]) not in (bytes, type(None)) or type(r[3]) not in (bytes, type(None))):
            raise CorruptRecordError(f"batch at offset {h.base_offset} holds a malformed record")
    return items


def encode_run(h: BatchHeader, first_offset: int, records: list[tuple[int, tuple]],
               horizon: int | None) -> bytes:
    """One batch of consecutive records of batch ``h`` starting at ``first_offset``;
    ``records``: ``(absolute timestamp, raw record)``."""
    n = len(records)
    base_ts = horizon if horizon is not None else records[0][0]
    body = encode_items(h.magic, [(ts - base_ts, i, r[2], r[3], r[4]) for i, (ts, r) in enumerate(records)])
    codec = h.codec
    if codec != Codec.NONE:
        packed = compress(codec, body)
        if len(packed) < len(body):
            body = packed
        else:
            codec = Codec.NONE
    if h.attributes & TIMESTAMP_TYPE_BIT:
        max_ts = h.max_timestamp  # LogAppendTime: the broker's append time for every record
    else:
        max_ts = max(NO_TIMESTAMP, max(ts for ts, _ in records))
    attributes = (h.attributes & ~(CODEC_MASK | DELETE_HORIZON_BIT)) | codec \
        | (DELETE_HORIZON_BIT if horizon is not None else 0)
    sequence = h.base_sequence
    if sequence != NO_SEQUENCE:
        sequence = (sequence + first_offset - h.base_offset) & 0x7FFFFFFF
    tail = _TAIL.pack(attributes, n - 1, base_ts, max_ts, h.producer_id, h.producer_epoch, sequence, n)
    crc = crc32c(body, crc32c(tail))
    return _HEAD.pack(first_offset, len(tail) + len(body) + 9, h.leader_epoch, h.magic, crc) + tail + body


# -- one cleaning -------------------------------------------------------------------------------


@dataclass(slots=True)
class CleanerStats:
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    batches_rewritten: int = 0
    map_records: int = 0
    start_s: float = field(default_factory=time.monotonic)


class _CleanedWriter:
    """Writes a group's output into ``.cleaned`` segments, rolling at segment.bytes. They are
    dated ``modified_ms``, the time of the segments they replace (see ``finish``)."""

    def __init__(self, directory: str, first_base: int, config: LogConfig, modified_ms: int):
        self.directory, self.first_base, self.config = directory, first_base, config
        self.modified_ms = modified_ms
        self.segments: list[LogSegment] = []

    def append(self, batch: bytes, h: BatchHeader) -> None:
        seg = self.segments[-1] if self.segments else None
        if seg is None or (seg.size and (seg.size + len(batch) > self.config.segment_bytes
                                         or seg.index.is_full or seg.time_index.is_full
                                         or not seg.can_hold(h.base_offset, h.last_offset))):
            base = self.first_base if seg is None else h.base_offset
            if seg is not None:
                seg.on_become_inactive()
            seg = LogSegment.create_cleaned(self.directory, base, self.config, self.modified_ms)
            self.segments.append(seg)
        seg.append(batch, [(0, h)])

    def finish(self, keep_empty: bool) -> list[LogSegment]:
        """The output, fsynced. Its files are dated as the segments they replace (Kafka sets
        the cleaned segment's lastModified so): an empty one (the log's first segment, whose
        records were all superseded) is judged by retention.ms by that date, in memory and,
        after a restart, by its file's, so it expires with the records of its age behind it
        instead of holding them for retention.ms after the cleaning."""
        if not self.segments and keep_empty:  # the log's first segment: keep its base offset
            self.segments.append(LogSegment.create_cleaned(self.directory, self.first_base, self.config,
                                                           self.modified_ms))
        for seg in self.segments:
            seg.on_become_inactive()
            seg.set_last_modified(self.modified_ms)
            seg.flush()
        return self.segments

    def discard(self) -> None:
        for seg in self.segments:
            seg.delete()
        self.segments = []


class CleaningJob:
    """Cleaning one log: built on the owner thread from a snapshot of the log; the offset
    map and the groups' output are computed off it, the swaps happen on it."""

    def __init__(self, tp: TopicPartition, log: Log, offsets: OffsetsToClean, map_capacity: int, now_ms: int):
        self.topic_partition = tp
        self.log = log
        self.config = log.config
        self.directory = log.directory
        self.first_dirty_offset = offsets.first_dirty_offset
        self.first_uncleanable_offset = offsets.first_uncleanable_offset
        self.now_ms = now_ms
        self.map = OffsetMap(map_capacity)
        self.stats = CleanerStats()
        self._aborted = threading.Event()
        self._fence = log.cleaner_fence
        self._idle = threading.Event()
        self._idle.set()
        segments = log.segments
        # the closed segments below the first uncleanable offset: all a cleaning reads
        self.sources = [SourceSegment.snapshot(s, nxt.base_offset) for s, nxt in zip(segments, segments[1:])
                        if s.base_offset < self.first_uncleanable_offset]
        self.first_segment = segments[0]
        self.end_offset = self.first_dirty_offset  # set by build_offset_map
        # the last offset of each known producer's last batch (read here, on the owner thread)
        self.last_batch_of_producer = {pid: e.last_offset for pid, e in log.producer_state.producers.items()}
        self.swapped_groups = 0
        self._dropped = False  # whether the last _filter_batch dropped records

    # -- control (any thread) ------------------------------------------------------------------

    def abort(self) -> None:
        self._aborted.set()

    @property
    def fenced(self) -> bool:
        """Whether the log was truncated, closed or deleted since the job began."""
        return self.log.cleaner_fence != self._fence  # an int read: safe from the worker thread

    def check(self) -> None:
        if self._aborted.is_set():
            raise CleaningAborted(f"cleaning of {self.topic_partition} aborted")
        if self.fenced:
            raise CleaningAborted(f"{self.topic_partition} was truncated, closed or deleted during its cleaning")

    def run_work(self, work: Callable[[], object]) -> object:
        """Run one step of work (in a worker thread); ``wait_idle`` waits for it to return."""
        self._idle.clear()
        try:
            return work()
        finally:
            self._idle.set()

    def wait_idle(self, timeout_s: float) -> bool:
        return self._idle.wait(timeout_s)

    # -- worker thread -------------------------------------------------------------------------

    def build_offset_map(self) -> None:
        """Map the cleanable dirty section; sets ``end_offset`` (where this round stops)."""
        m, dirty = self.map, self.first_dirty_offset
        m.latest_offset = dirty - 1
        for src in self.sources:
            if src.upper <= dirty:
                continue
            if src.base_offset >= self.first_uncleanable_offset:
                break
            if not self._map_segment(src):
                break
            m.latest_offset = src.upper - 1  # a trailing gap holds no keys either
        self.end_offset = m.latest_offset + 1

    def _map_segment(self, src: SourceSegment) -> bool:
        """Put the segment's keys; False if the map filled up (``latest_offset`` says where)."""
        m, dirty = self.map, self.first_dirty_offset
        for h, batch in iter_file_batches(src, self.check):
            self.stats.bytes_read += h.size
            if h.last_offset < dirty or h.is_control:
                continue
            for offset, key in zip(range(h.base_offset, h.next_offset), record_columns(batch, 0, h).keys):
                if offset >= dirty and key is not None:
                    if not m.put(key, offset):
                        return False
                    self.stats.map_records += 1
                m.latest_offset = offset
        return True

    def groups(self) -> list[list[SourceSegment]]:
        """The groups of this round: every segment from the first up to ``end_offset``."""
        sources = [s for s in self.sources if s.base_offset < self.end_offset
                   and s.base_offset < self.first_uncleanable_offset]
        groups = group_segments_by_size([s.segment for s in sources], [s.upper for s in sources],
                                        self.config.segment_bytes, self.config.segment_index_bytes)
        return [[sources[i] for i in g] for g in groups]

    def clean_group(self, group: list[SourceSegment]) -> list[LogSegment] | None:
        """Write the group's cleaned segments (``.cleaned`` files, fsynced); None when cleaning
        would change nothing."""
        writer = _CleanedWriter(self.directory, group[0].base_offset, self.config,
                                max(src.timestamp for src in group))
        try:
            changed = False
            for src in group:
                for h, batch in iter_file_batches(src, self.check):
                    self.stats.bytes_read += h.size
                    for out in self._filter_batch(h, batch):
                        changed |= out is not batch
                        writer.append(out, read_header(out))
                        self.stats.bytes_written += len(out)
                    changed |= self._dropped
            if not changed:
                writer.discard()
                return None
            return writer.finish(keep_empty=group[0].segment is self.first_segment)
        except BaseException:
            writer.discard()
            raise

    def _filter_batch(self, h: BatchHeader, batch: bytes) -> list[bytes]:
        """The batch itself when every record stays as it is, else one batch per run of kept
        records (none when nothing is kept)."""
        self._dropped = False
        self.stats.records_read += h.record_count
        if h.is_control or h.base_offset > self.map.latest_offset:
            self.stats.records_retained += h.record_count
            return [batch]
        records = decode_records(batch, h)
        horizon = h.delete_horizon_ms
        keep = [self._retain(h, offset, r, horizon) for offset, r in zip(range(h.base_offset, h.next_offset), records)]
        tombstones = any(k and r[3] is None for k, r in zip(keep, records))
        new_horizon = horizon if horizon is not None or not tombstones else self.now_ms + self.config.delete_retention_ms
        kept = sum(keep)
        self.stats.records_retained += kept
        if kept == len(keep) and new_horizon == horizon:
            return [batch]
        self._dropped = kept < len(keep)
        self.stats.batches_rewritten += 1
        return [encode_run(h, h.base_offset + run[0], [(h.first_timestamp + records[i][0], records[i])
                                                        for i in run], new_horizon)
                for run in _runs(keep)]

    def _retain(self, h: BatchHeader, offset: int, r: tuple, horizon: int | None) -> bool:
        key = r[2]
        map_offset = self.map.get(key) if key is not None else -1
        if retain_record(offset, key, r[3], self.map.latest_offset, map_offset, horizon, self.now_ms):
            return True
        # a known producer's last record carries its last sequence number: it stays, unless a
        # later record of its key supersedes it (kept, its old value would come back once the
        # later ones are gone, e.g. a tombstone past its delete horizon)
        return (h.producer_id >= 0 and offset == h.last_offset
                and self.last_batch_of_producer.get(h.producer_id) == offset
                and (key is None or offset >= map_offset))

    # -- owner thread --------------------------------------------------------------------------

    def swap(self, group: list[SourceSegment], cleaned: list[LogSegment] | None) -> None:
        """Replace the group's segments by ``cleaned`` if the log still holds them unchanged."""
        if cleaned is None:
            return
        try:
            self.check()
            self._check_unchanged(group)
        except CleaningAborted:
            for seg in cleaned:
                seg.delete()
            raise
        for seg in cleaned:
            seg.config = self.log.config
        self.log.replace_segments(cleaned, [s.segment for s in group])
        self.swapped_groups += 1

    def _check_unchanged(self, group: list[SourceSegment]) -> None:
        segments = self.log.segments
        try:
            i = next(i for i, s in enumerate(segments) if s is group[0].segment)
        except StopIteration:
            raise CleaningAborted(f"{self.topic_partition}: segment {group[0].base_offset} is gone") from None
        current = segments[i:i + len(group)]
        if (len(current) != len(group) or i + len(group) >= len(segments)
                or any(c is not s.segment or c.size != s.size for c, s in zip(current, group))):
            raise CleaningAborted(f"{self.topic_partition}: segments from {group[0].base_offset} changed "
                                  "while they were cleaned")


def _runs(keep: list[bool]) -> list[list[int]]:
    """Indexes of consecutive True values, run by run."""
    runs: list[list[int]] = []
    for i, k in enumerate(keep):
        if not k:
            continue
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def cleaning_steps(job: CleaningJob) -> Iterator[Callable[[], object]]:
    """One cleaning as a generator: it yields the work to run off the owner thread and is
    sent each work's result; everything else (the swaps) runs on the owner thread."""
    yield job.build_offset_map
    for group in (yield job.groups):
        cleaned = yield (lambda g=group: job.clean_group(g))
        job.swap(group, cleaned)


# -- the cleaner manager ------------------------------------------------------------------------


class LogCleaner:
    """Chooses logs to clean, keeps the cleaner checkpoints and the statistics.

    ``logs`` is the log manager (``logs``, ``cleaner_checkpoints()``, ``cleaner_checkpoint(tp)``,
    ``update_cleaner_checkpoint(tp, offset)``, ``dir_failed(failure)``). Called on the logs' owner thread only."""

    def __init__(self, logs, config: CleanerConfig | None = None, clock: Clock = wall_clock_ms):
        self.logs = logs
        self.config = config or CleanerConfig()
        self._clock = clock
        self.in_progress: dict[TopicPartition, CleaningJob] = {}
        # partitions whose cleaning failed: the log that failed and why. Keyed by that log, so
        # a log created again under the name (a topic deleted and created) is cleaned
        self.uncleanable: dict[TopicPartition, tuple[Log, str]] = {}
        self.max_dirty_ratio = 0.0
        self.last_run_ms = -1
        self.last_clean_ms = -1
        self.bytes_cleaned = 0  # bytes read by finished cleanings
        self.bytes_written = 0
        self.cleanings = 0
        self.last_stats: CleanerStats | None = None

    def grab_filthiest_log(self) -> CleaningJob | None:
        """The job for the filthiest log, or None. An OSError or StorageError (a checkpoint
        that cannot be read, say) is logged and the round skipped: the next one tries again;
        it never reaches the broker's root task."""
        try:
            return self._grab_filthiest_log()
        except (OSError, StorageError) as e:
            logger.error("the log cleaner could not choose or open a log to clean; "
                         "retrying after its backoff: %s", e)
            return None

    def _grab_filthiest_log(self) -> CleaningJob | None:
        now = self._clock()
        self.last_run_ms = now
        checkpoints = self.logs.cleaner_checkpoints()
        logs = self.logs.logs
        # Kafka's maintainUncleanablePartitions: forget the logs no longer there
        self.uncleanable = {tp: v for tp, v in self.uncleanable.items() if logs.get(tp) is v[0]}
        candidates = []
        for tp, log in logs.items():
            if not log.config.compacts or tp in self.in_progress or tp in self.uncleanable:
                continue
            offsets = cleanable_offsets(log, checkpoints.get(tp), now)
            if offsets.force_update_checkpoint:
                self.logs.update_cleaner_checkpoint(tp, offsets.first_dirty_offset)
            candidate = log_to_clean(tp, log, offsets, now)
            if candidate.total_bytes > 0:
                candidates.append(candidate)
        self.max_dirty_ratio = max((c.cleanable_ratio for c in candidates), default=0.0)
        chosen = filthiest(candidates)
        if chosen is None:
            return None
        offsets = OffsetsToClean(chosen.first_dirty_offset, chosen.first_uncleanable_offset, False)
        job = CleaningJob(chosen.topic_partition, chosen.log, offsets, self.config.map_capacity, now)
        self.in_progress[chosen.topic_partition] = job
        logger.info("cleaning %s: dirty ratio %.2f, offsets %d to %d", chosen.topic_partition,
                    chosen.cleanable_ratio, chosen.first_dirty_offset, chosen.first_uncleanable_offset)
        return job

    def done_cleaning(self, job: CleaningJob) -> None:
        """The job completed: move the checkpoint, account it. A checkpoint that cannot be read
        or written is its log dir failing (``LogDirFailure``, noted by the log manager): the
        dir goes offline, and this never raises it. Not for a log truncated since
        the job began (a last group left unchanged checks no fence): the truncation lowered
        the checkpoint, which must stay at or below it."""
        self._release(job)
        if job.fenced:
            logger.info("cleaning of %s abandoned: the log was truncated, closed or deleted", job.topic_partition)
            return
        if self.logs.logs.get(job.topic_partition) is job.log:
            try:
                self._move_checkpoint(job)
            except LogDirFailure as e:  # noted (dir_failed): that dir goes offline, not the cleaner
                logger.error("cleaned %s, but its cleaner checkpoint was not written: %s", job.topic_partition, e)
        s = job.stats
        self.bytes_cleaned += s.bytes_read
        self.bytes_written += s.bytes_written
        self.cleanings += 1
        self.last_clean_ms = self._clock()
        self.last_stats = s
        logger.info("cleaned %s up to offset %d in %.2f s: %d records read, %d kept, %d bytes read, %d written, "
                    "%d segment group(s) swapped, offset map %.0f%% full", job.topic_partition, job.end_offset,
                    time.monotonic() - s.start_s, s.records_read, s.records_retained, s.bytes_read,
                    s.bytes_written, job.swapped_groups, 100 * job.map.utilization)

    def _move_checkpoint(self, job: CleaningJob) -> None:
        end = job.end_offset
        current = self.logs.cleaner_checkpoint(job.topic_partition)
        if current is not None and current < job.first_dirty_offset:
            end = current  # moved back while the job ran (expired producers): it stays back
        self.logs.update_cleaner_checkpoint(job.topic_partition, end)

    def abandon(self, job: CleaningJob, error: BaseException | None = None) -> None:
        """The job did not complete. An abort is retried later, and so is any failure of a
        log truncated, closed or deleted meanwhile (a deletion renames the directory under
        the worker thread: FileNotFoundError, not CleaningAborted). Any other error marks the
        log uncleanable (as Kafka does) while it lives: until the broker restarts, or the
        partition's log is deleted; an OSError is its log dir failing besides (Kafka's cleaner
        reports an IOException to its LogDirFailureChannel): the log manager is told."""
        self._release(job)
        gone = job.fenced or self.logs.logs.get(job.topic_partition) is not job.log
        if error is None or isinstance(error, CleaningAborted) or gone:
            logger.info("cleaning of %s abandoned: %s", job.topic_partition, error or "stopped")
            return
        if isinstance(error, OSError):
            self.logs.dir_failed(dir_failure(job.log.log_dir, error, f"cleaning {job.topic_partition}"))
        self.uncleanable[job.topic_partition] = (job.log, str(error))
        logger.error("cleaning of %s failed; the partition is not cleaned again until the broker "
                     "restarts or the log is deleted: %s", job.topic_partition, error,
                     exc_info=not isinstance(error, (TidelogError, OSError, StorageError)))

    def _release(self, job: CleaningJob) -> None:
        if self.in_progress.get(job.topic_partition) is job:
            del self.in_progress[job.topic_partition]

    def clean_once(self) -> CleaningJob | None:
        """Clean the filthiest log inline (tests and tools); returns the job, or None."""
        job = self.grab_filthiest_log()
        if job is None:
            return None
        try:
            run_steps_inline(job)
        except BaseException as e:
            self.abandon(job, e)
            raise
        self.done_cleaning(job)
        return job


def run_steps_inline(job: CleaningJob) -> None:
    steps = cleaning_steps(job)
    result = None
    try:
        while True:
            work = steps.send(result)
            result = job.run_work(work)
    except StopIteration:
        pass
