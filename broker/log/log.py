"""The partition log: an ordered list of segments, and the offsets that describe it.

Theory of operation
-------------------
A log is the segments of one partition in base-offset order; only the last one, the
*active* segment, is appended to. Four offsets describe it:

* ``log_start_offset``: the first offset a reader may ask for. It only grows (retention,
  DeleteRecords); segments wholly below it are deleted.
* ``log_end_offset`` (LEO): the offset the next appended record gets. It is derived from the
  data (the active segment's next offset), so it can never disagree with the files.
* ``high_watermark`` (HW): everything below it is committed. The log only stores it (clamped
  to [log start, LEO]); replication decides it. Retention never deletes above it.
* ``recovery_point``: everything below it has been fsynced. After an unclean shutdown the
  loader re-validates every segment from the recovery point on.

Appends come in two kinds. ``append_as_leader`` validates the producer's batches (nothing
is written if any batch is bad): framing and CRC, then their records as Kafka's LogValidator
does (``check_produced_records``: the block decodes, its count and offset deltas match the
header, timestamps are in range and inside the KIP-937 window of the broker's clock, keys
are present in a compacted topic; compressed blocks inflate up to a bound only). It then
stamps each with its base offset and the leader epoch in place and appends the bytes. A
produce of large or compressed batches is validated in a worker thread first (``checked``
returns ``CheckedRecords``, which the append does not check again). ``append_as_follower``
validates framing and CRC and appends the leader's batches with the offsets they already
carry, whatever their size (``max.message.bytes`` bounds what producers write; a cleaned
batch may have grown past it, or the limit been lowered since). In both, the batch bytes
are never re-encoded.

Reads return whole stored batches starting with the one that holds the requested offset
(in a gap, the first after it: compaction's, or a hole loading left where flushed data was
damaged on disk, see ``damaged_from``), never one that reaches ``max_offset`` (the HW, for
consumers), checked against their CRCs.

``truncate_to`` removes everything at and above an offset (a follower whose log diverged
from its leader's); ``truncate_fully_and_start_at`` empties the log and restarts it at an
offset. Both keep the leader epoch cache in step.

The log owns its partition's idempotent-producer state (``producer_state``, see
``producer_state``): the leader's append checks each batch's producer id, epoch and
sequence against it inside the append (a duplicate of a recent batch returns the original
offsets and appends nothing); every append, leader or follower, updates it; truncation
rebuilds it from the latest snapshot and the batch headers after it; a rising log start
forgets no producer (Kafka 2.5+: only ``producer.id.expiration.ms`` does). A snapshot is
written at every roll and at ``close``; after each recovery-point checkpoint those below
the older of the recovery point's segment and the second-to-last segment are deleted
(``delete_snapshots_after_recovery_point_checkpoint``), so a log whose start never moves (a
compacted one) does not keep one per roll.

With ``cleanup.policy`` compact the log cleaner (``cleaner``) rewrites closed segments,
keeping the last record per key: offsets are never renumbered, so a compacted log has gaps
between batches (reads return the first batch at or after the offset asked for), and
``replace_segments`` swaps the cleaned segments in. A cleaning decides from a snapshot of
the log which records later ones supersede; whatever can invalidate those decisions
(truncation, close, delete) moves ``cleaner_fence``, and the cleaner abandons a cleaning
whose fence moved (Kafka aborts cleaning on truncation and deletion). A leader refuses
records without a key for a compacted topic (INVALID_RECORD).

The log is synchronous and not thread-safe: one owner serialises calls, with one exception:
``read``, ``offset_for_timestamp`` and ``offset_of_max_timestamp`` may run in a worker
thread (the group coordinator's load, a ListOffsets search by timestamp) while the owner
changes the log. For them the segments and their base offsets are one immutable
``SegmentView``, replaced whole by every change (roll, truncation, retention, a cleaned
swap) and published before the segments it drops are deleted; a reader takes one view and
uses only it. A segment dropped under a read is not reopened by its path
(``SegmentClosedError``, see ``segment``): the read starts again on the view that replaced
it, so it never skips records nor reads another file. Time is passed in through ``clock``
(milliseconds), so tests control it.

An OSError in any of the log's operations (disk full, an I/O error, out of descriptors) is
its log directory failing, as Kafka takes every IOException there: the operation raises
``LogDirFailure`` (a StorageError: KAFKA_STORAGE_ERROR) naming the directory, and tells the
log manager (``on_dir_failure``), which takes the whole directory offline. A log whose
directory failed is never written again: its state after a failed write is not trusted.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import operator
import os
import time
from typing import Callable, NamedTuple

from tidelog.broker.log.checkpoint import DAMAGED_HOLE_CHECKPOINT, HoleCheckpoint, fsync_dir
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.epoch import LeaderEpochCache
from tidelog.broker.log.paths import check_partition_dir
from tidelog.broker.log.producer_state import ProducerStateManager
from tidelog.broker.log.segment import DELETED_SUFFIX, OPEN_SEGMENT_FILES, LogSegment, SegmentClosedError
from tidelog.broker.log.swap import apply_ops, plan_swap
from tidelog.protocol.errors import (
    FENCED_LEADER_EPOCH,
    INVALID_RECORD,
    RECORD_LIST_TOO_LARGE,
    CorruptRecordError,
    OffsetOutOfRangeError,
    StorageError,
    TidelogError,
)
from tidelog.protocol.records import (
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    patch_batch,
    restamped,
    set_log_append_time,
    validate_batches,
    validate_records,
)
from tidelog.protocol.topics import TopicPartition

logger = logging.getLogger("tidelog.log")

# Benchmark switch only (bench/RESULTS.md measures the cost of record validation with it):
# TIDELOG_RECORD_VALIDATION=off skips the per-record checks of produced batches (framing and
# CRC are always checked). Never turn it off in production: a bad batch poisons consumers.
RECORD_VALIDATION = os.environ.get("TIDELOG_RECORD_VALIDATION", "on") != "off"
# A batch larger than this is unpacked in slices of this many records (see validate_records)
VALIDATION_CHUNK_RECORDS = 8192


class CheckedRecords(bytes):
    """Produced batches whose records were validated (``check_produced_records``) against
    ``config``, off the event loop; the leader's append does not check them again while the
    log's config is still that one."""

    config: LogConfig


def check_produced_records(records, batches: list[tuple[int, BatchHeader]], config: LogConfig,
                           now_ms: int, tp: TopicPartition | str = "the partition") -> None:
    """Kafka's LogValidator for a leader's append: no batch carries a flag only the broker
    sets (``_NOT_FROM_CLIENTS``), and every batch's records decode and follow the topic's rules
    (``protocol.records.validate_records``), else the error names batch and record."""
    rules = config.record_rules
    for i, (pos, h) in enumerate(batches):
        if h.attributes & _NOT_FROM_CLIENTS:
            raise TidelogError(f"{tp}: batch {i} (position {pos}) of the produce: {_flags_refused(h)}",
                               error=INVALID_RECORD)
        if not RECORD_VALIDATION:
            continue
        chunk = VALIDATION_CHUNK_RECORDS if h.record_count > VALIDATION_CHUNK_RECORDS else None
        try:
            validate_records(records, pos, h, rules, now_ms, chunk=chunk)
        except TidelogError as e:
            raise type(e)(f"{tp}: batch {i} (position {pos}) of the produce: {e}", error=e.error) from None


# Batch attributes a client may not set: control batches are the broker's (transaction
# markers), transactions are not served, and the delete horizon is the log cleaner's
# (a client's would have its tombstones dropped at their first cleaning).
_CLIENT_REFUSED = ((CONTROL_BIT, "a control batch: control records are written by the broker only"),
                   (TRANSACTIONAL_BIT, "a transactional batch: this broker does not support transactions"),
                   (DELETE_HORIZON_BIT, "the delete-horizon flag: it is set by the log cleaner only"))
_NOT_FROM_CLIENTS = functools.reduce(operator.or_, (bit for bit, _ in _CLIENT_REFUSED))


def _flags_refused(h: BatchHeader) -> str:
    return "; ".join(why for bit, why in _CLIENT_REFUSED if h.attributes & bit) + \
        f" (attributes 0x{h.attributes:04x})"


def checked(records: bytes, config: LogConfig, now_ms: int, tp: TopicPartition) -> CheckedRecords:
    """Validate produced batches completely (framing, CRC, records) and mark them checked; for
    a worker thread (pure: reads only ``config``)."""
    batches = validate_batches(records, config.max_message_bytes)
    check_produced_records(records, batches, config, now_ms, tp)
    out = CheckedRecords(records)
    out.config = config
    return out

Clock = Callable[[], int]


class LogDirFailure(StorageError):
    """An I/O error on a log directory (an OSError from a log's files or checkpoints): the
    directory is failing and is to be taken offline (``LogManager.take_dir_offline``), every
    replica in it answering KAFKA_STORAGE_ERROR until the broker restarts (Kafka's
    KafkaStorageException, reported through its LogDirFailureChannel)."""

    def __init__(self, message: str, log_dir: str):
        super().__init__(message)
        self.log_dir = log_dir


def dir_failure(log_dir: str, e: OSError, what: str) -> LogDirFailure:
    return LogDirFailure(f"log dir {log_dir} failed while {what}: {e}", log_dir)


def _storage_io(what: str):
    """A Log method whose OSError is its log directory failing (see the module docstring): it
    raises ``LogDirFailure`` instead, once the log manager is told (``Log.on_dir_failure``).
    For the rarer operations; those on every batch (appends, reads) catch it in their bodies,
    without the wrapper's call."""
    def wrap(method):
        @functools.wraps(method)
        def io(self: "Log", *args, **kwargs):
            try:
                return method(self, *args, **kwargs)
            except OSError as e:
                raise self.dir_failed(e, what) from e
        return io
    return wrap


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class LogAppendInfo(NamedTuple):  # one per append: a tuple is made in one call
    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    record_count: int
    valid_bytes: int
    log_start_offset: int


class SegmentView(NamedTuple):
    """The log's segments and their base offsets, published together (see the module docstring)."""
    bases: tuple[int, ...]
    segments: tuple[LogSegment, ...]


def _view_of(segments) -> SegmentView:
    segments = tuple(segments)
    return SegmentView(tuple(s.base_offset for s in segments), segments)


@contextlib.contextmanager
def _pinned(segments):
    """Hold the segments' descriptors open while their files are renamed or removed: a read
    on another thread keeps reading them, never a file that took one of their names."""
    held = []
    try:
        for seg in segments:
            OPEN_SEGMENT_FILES.acquire(seg)
            held.append(seg)
        yield
    finally:
        for seg in held:
            OPEN_SEGMENT_FILES.release(seg)


class RolledFlush(NamedTuple):
    """The fsyncs that make a log's rolled segments durable (``Log.rolled_flush``)."""
    log: "Log"
    segments: tuple[LogSegment, ...]
    target: int  # the recovery point once they are durable: the active segment's base
    truncations: int
    files: int
    directory_too: bool

    def run(self) -> None:
        """In a worker thread. Raises OSError."""
        for seg in self.segments:
            try:
                seg.fsync_closed()
            except SegmentClosedError:
                pass  # deleted by retention, or replaced by a cleaner's swap (which fsyncs its own)
        if self.directory_too:
            fsync_dir(self.log.directory)


class Log:
    def __init__(self, directory: str, topic_partition: TopicPartition, config: LogConfig,
                 segments: list[LogSegment], *, log_start_offset: int, recovery_point: int,
                 high_watermark: int, epoch_cache: LeaderEpochCache, clock: Clock = wall_clock_ms,
                 producer_state: ProducerStateManager | None = None):
        if not segments:
            raise ValueError("a log has at least one segment")
        self.directory = directory
        self.topic_partition = topic_partition
        self.config = config
        self._view = _view_of(segments)
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._high_watermark = high_watermark
        self.epoch_cache = epoch_cache
        self._clock = clock
        self.last_flush_ms = clock()
        self.recovery_report: list[str] = []
        self._damaged_from: int | None = None  # see ``damaged_from``
        self.cleaner_fence = 0  # moved by truncation, close and delete (see the module docstring)
        # the last leader append, readable from memory: (first offset, end offset, its bytes,
        # the cleaner fence then); see ``append_as_leader`` and ``read``
        self._appended: tuple[int, int, bytearray, int] | None = None
        # segment files created, and created before the directory's last fsync: while they
        # differ a flush fsyncs the directory too
        self._files_created = self._files_synced = 0
        self._truncations = 0  # a flush decided before one must not move the recovery point
        # called with the new log end after a truncation (the log manager writes down the
        # lowered recovery point and cleaner checkpoint)
        self.on_truncation: Callable[[Log, int], None] | None = None
        # called after a roll (the log manager has the closed segments fsynced: ``rolled_flush``)
        self.on_roll: Callable[[Log], None] | None = None
        # called, from whichever thread met it, when an operation met an OSError (the log
        # manager takes the directory offline)
        self.on_dir_failure: Callable[[LogDirFailure], None] | None = None
        if producer_state is None:
            producer_state = ProducerStateManager(directory)
            producer_state.map_end_offset = self.log_end_offset
        self.producer_state = producer_state

    # -- state ---------------------------------------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._view.segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._view.segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._view.segments[-1]

    @property
    def size(self) -> int:
        return sum(s.size for s in self._view.segments)

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache.latest_epoch

    @property
    def damaged_from(self) -> int | None:
        """The first offset of a hole that loading left in flushed data damaged on disk (the
        damaged segment cut, the later ones kept; see ``loader``), while the log still holds
        records on both sides of it: the replica is to be repaired from another (the replica
        manager reports it). A truncation to it, or the log start moving past it, ends it."""
        d = self._damaged_from
        if d is not None and not self.log_start_offset <= d < self.log_end_offset:
            self.damaged_from = d = None
        return d

    @damaged_from.setter
    def damaged_from(self, offset: int | None) -> None:
        """Set (by the loader) or end the hole, written through to ``damaged-hole-checkpoint``
        (rare: a load that found damage, a truncation that ends it)."""
        if offset is not None and not self.log_start_offset <= offset < self.log_end_offset:
            offset = None
        HoleCheckpoint(os.path.join(self.directory, DAMAGED_HOLE_CHECKPOINT)).write(offset)
        self._damaged_from = offset

    @property
    def log_dir(self) -> str:
        """The log directory holding this partition's directory."""
        return os.path.dirname(self.directory)

    def dir_failed(self, e: OSError, what: str) -> LogDirFailure:
        """The failure of this log's directory that ``e`` is, the log manager told of it."""
        failure = dir_failure(self.log_dir, e, f"{what} {self.topic_partition}")
        if self.on_dir_failure is not None:
            self.on_dir_failure(failure)
        return failure

    def update_high_watermark(self, offset: int) -> int:
        """Set the HW, clamped to [log start offset, LEO]; returns the value stored."""
        self._high_watermark = min(max(offset, self.log_start_offset), self.log_end_offset)
        return self._high_watermark

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    @_storage_io("writing the leader epochs of")
    def assign_epoch(self, epoch: int, start_offset: int) -> bool:
        """``LeaderEpochCache.assign``, written through to the checkpoint."""
        return self.epoch_cache.assign(epoch, start_offset)

    @_storage_io("writing the leader epochs of")
    def truncate_epochs_from_end(self, end_offset: int) -> None:
        """``LeaderEpochCache.truncate_from_end``, written through to the checkpoint."""
        self.epoch_cache.truncate_from_end(end_offset)

    # -- appends -------------------------------------------------------------------------------

    def append_as_leader(self, records: bytes, leader_epoch: int) -> LogAppendInfo:
        """Validate, assign offsets and the leader epoch, append. Nothing is written on error.
        The appended batches stay readable from memory (``read`` at their first offset: the
        fetches waiting at the log end that this append answers) until ``release_appended``."""
        batches = self._validate(records, self.config.max_message_bytes)
        if not (isinstance(records, CheckedRecords) and records.config is self.config):
            check_produced_records(records, batches, self.config, self._clock(), self.topic_partition)
        if leader_epoch < self.epoch_cache.latest_epoch:
            # recovery cuts a segment where epochs go backwards: such an append would be lost
            raise TidelogError(
                f"{self.topic_partition}: append as leader in epoch {leader_epoch}, below the "
                f"log's latest epoch {self.epoch_cache.latest_epoch}", error=FENCED_LEADER_EPOCH)
        for _, h in batches:
            if h.producer_id >= 0:  # idempotent batches: checked against the producer state
                duplicate = self.producer_state.check_leader_append(batches, self.topic_partition)
                if duplicate is not None:
                    return self._duplicate_info(duplicate)
                break
        buf = bytearray(records)
        offset = first = self.log_end_offset
        now = self._clock() if self.config.log_append_time else -1
        stamped = []
        for pos, h in batches:
            patch_batch(buf, pos, offset, leader_epoch)
            if now >= 0:
                set_log_append_time(buf, pos, h.batch_length + 12, now)
                h = h._replace(attributes=h.attributes | TIMESTAMP_TYPE_BIT, max_timestamp=now)
            stamped.append((pos, restamped(h, offset, leader_epoch)))
            offset += h.record_count
        info = self._append(buf, stamped, first, offset - 1, now)
        if len(buf) <= self.config.segment_bytes:  # in one segment, as a read of it would be
            self._appended = (first, offset, buf, self.cleaner_fence)
        return info

    def release_appended(self) -> None:
        """Forget the batches of the last leader append: once the waiting fetches it completes
        are answered, later reads go to the segment (no append is held in memory longer)."""
        self._appended = None

    def _duplicate_info(self, d) -> LogAppendInfo:
        """A retried batch already in the log: its original offsets, nothing appended."""
        append_time = d.max_timestamp if self.config.log_append_time else -1
        return LogAppendInfo(d.first_offset, d.last_offset, d.max_timestamp, append_time, 0, 0,
                             self.log_start_offset)

    def append_as_follower(self, records: bytes) -> LogAppendInfo:
        """Append the leader's batches as they are; offsets must follow this log's end.

        Their size is not checked against ``max.message.bytes``, as in Kafka (the leader
        accepted them): a cleaned batch can be larger than its producer's (its first
        timestamp is the delete horizon, see ``cleaner``), and the limit may have been
        lowered since it was written. Refusing one would stop this replica for good."""
        batches = self._validate(records, None)
        expected, epoch = self.log_end_offset, self.epoch_cache.latest_epoch
        for pos, h in batches:
            if h.base_offset < expected:
                raise CorruptRecordError(
                    f"{self.topic_partition}: follower append of batch with base offset {h.base_offset} "
                    f"below the expected offset {expected}")
            if h.leader_epoch < epoch:  # recovery would cut the log here
                raise CorruptRecordError(
                    f"{self.topic_partition}: follower append of batch with leader epoch "
                    f"{h.leader_epoch} below the log's epoch {epoch}")
            expected, epoch = h.base_offset + h.last_offset_delta + 1, h.leader_epoch
        first = batches[0][1].base_offset
        return self._append(records, batches, first, expected - 1, -1)

    def check_records(self, records: bytes, batches: list[tuple[int, BatchHeader]], now_ms: int) -> None:
        """The records of every batch against the topic's rules (``records.validate_records``:
        decodes, count, offset deltas, timestamps, keys in a compacted topic). Raises naming
        the batch and record; reads only the immutable config, so a worker thread may run it."""
        check_produced_records(records, batches, self.config, now_ms, self.topic_partition)

    def _validate(self, records: bytes, max_batch_bytes: int | None) -> list[tuple[int, BatchHeader]]:
        """Every batch valid, at most ``max_batch_bytes`` (None: any size) and each small
        enough for a segment (a set of batches larger than a segment is fine: it is spread
        over several, see ``_append``)."""
        batches = validate_batches(records, max_batch_bytes)
        for pos, h in batches:
            if h.batch_length + 12 > self.config.segment_bytes:
                raise TidelogError(
                    f"batch at position {pos} is {h.batch_length + 12} bytes, larger than "
                    f"segment.bytes {self.config.segment_bytes}", error=RECORD_LIST_TOO_LARGE)
        return batches

    def _append(self, buf, batches: list[tuple[int, BatchHeader]], first: int, last: int,
                log_append_time: int) -> LogAppendInfo:
        """Every append's writes (epoch checkpoint, segments, rolls, flush): an OSError among
        them is the log dir failing (see the module docstring)."""
        try:
            max_ts, count = -1, 0
            for _, h in batches:
                if h.leader_epoch > self.epoch_cache.latest_epoch:
                    # recorded (and checkpointed) before the data, as Kafka does: a crash between
                    # the two leaves an entry at the log end, which loading drops, never records
                    # of an epoch the cache does not know (OffsetsForLeaderEpoch would answer wrong)
                    self.epoch_cache.assign(h.leader_epoch, h.base_offset)
                if h.max_timestamp > max_ts:
                    max_ts = h.max_timestamp
                count += h.record_count
            if len(buf) <= self.config.segment_bytes:  # the usual append: one segment's worth
                self._append_group(buf, batches)
            else:
                for group in self._segment_sized_groups(buf, batches):
                    self._append_group(*group)
            if self.log_end_offset - self.recovery_point >= self.config.flush_messages:
                self.flush()
            return LogAppendInfo(first, last, max_ts, log_append_time, count, len(buf), self.log_start_offset)
        except OSError as e:
            raise self.dir_failed(e, "appending to") from e

    def _segment_sized_groups(self, buf, batches: list[tuple[int, BatchHeader]]):
        """Split back-to-back batches larger than a segment into runs that each fit in one."""
        limit = self.config.segment_bytes
        view = memoryview(buf)
        start, run = 0, []
        for pos, h in batches:
            end = pos + h.batch_length + 12
            if run and end - start > limit:
                yield view[start:pos], [(p - start, x) for p, x in run]
                start, run = pos, []
            run.append((pos, h))
        yield view[start:], [(p - start, x) for p, x in run]

    def _append_group(self, buf, batches: list[tuple[int, BatchHeader]]) -> None:
        first = batches[0][1].base_offset
        last_h = batches[-1][1]
        segment = self._maybe_roll(len(buf), batches, first, last_h.base_offset + last_h.last_offset_delta)
        segment.append(buf, batches)
        if segment.max_timestamp < 0:  # no record timestamp yet: dated by its last write
            segment.last_modified_ms = self._clock()
        self.producer_state.update(batches)

    def _maybe_roll(self, size: int, batches, first: int, last: int) -> LogSegment:
        seg = self._view.segments[-1]
        if seg.size == 0:
            if seg.base_offset != first:  # an empty active segment can simply move
                self._replace_empty_active(first)
            return self._view.segments[-1]
        # the segment's age: by the timestamps of its first batch and of this append, else
        # (either has none) by the clock since the segment was created
        max_ts = max([h.max_timestamp for _, h in batches])
        if seg.first_batch_timestamp is not None and seg.first_batch_timestamp >= 0 and max_ts >= 0:
            age = max_ts - seg.first_batch_timestamp
        else:
            age = self._clock() - seg.created_ms
        if (seg.size + size > self.config.segment_bytes or age > self.config.segment_ms
                or seg.index.is_full or seg.time_index.is_full or not seg.can_hold(first, last)):
            return self.roll(first)
        return seg

    def _replace_empty_active(self, base_offset: int) -> None:
        old = self._view.segments
        self._add_segment(base_offset, after=old[:-1])
        old[-1].delete()

    def _add_segment(self, base_offset: int, after: tuple[LogSegment, ...] | None = None) -> LogSegment:
        """A new active segment after ``after`` (default: every segment)."""
        seg = LogSegment.create(self.directory, base_offset, self.config, self._clock())
        self._view = _view_of((self._view.segments if after is None else after) + (seg,))
        self._files_created += 1
        return seg

    @_storage_io("rolling")
    def roll(self, base_offset: int | None = None) -> LogSegment:
        """Close the active segment for appends and start a new one at the log end.

        The closed segment is not fsynced here (that would stall the caller for as long as
        the disk needs): ``on_roll`` tells the log manager, which has it fsynced in a worker
        thread (``rolled_flush``) and the recovery point moved past it, as Kafka schedules a
        flush at each roll: a crash then re-reads only the active segment.
        """
        base = self.log_end_offset if base_offset is None else base_offset
        old = self._view.segments[-1]
        if old.size == 0:
            if old.base_offset != base:
                self._replace_empty_active(base)
            return self._view.segments[-1]
        old.on_become_inactive()
        self._snapshot_producer_state()
        seg = self._add_segment(base)
        if self.on_roll is not None:
            self.on_roll(self)
        return seg

    def _snapshot_producer_state(self) -> None:
        """Snapshot at the log end; older snapshots inside the active segment are superseded."""
        ps, leo = self.producer_state, self.log_end_offset
        if ps.map_end_offset == leo:
            base = self._view.segments[-1].base_offset
            ps.delete_snapshots(lambda offset: base < offset < leo)
            ps.take_snapshot()

    @_storage_io("flushing")
    def flush_rolled_segments(self) -> None:
        """fsync the segments closed by rolls since the last flush (not the active one)."""
        if self.active_segment.base_offset > self.recovery_point:
            self.flush(self.active_segment.base_offset)

    def rolled_flush(self) -> RolledFlush | None:
        """What makes the segments closed by rolls durable, for a worker thread to do
        (``RolledFlush.run``); ``flushed`` then moves the recovery point. None: nothing."""
        target = self.active_segment.base_offset
        if target <= self.recovery_point:
            return None
        segs = self._view.segments
        closed = tuple(seg for seg, nxt in zip(segs, segs[1:]) if nxt.base_offset > self.recovery_point)
        return RolledFlush(self, closed, target, self._truncations, self._files_created,
                           self._files_created != self._files_synced)

    def flushed(self, done: RolledFlush) -> None:
        """On the owner's thread, after ``done`` ran: the recovery point moves to its target,
        unless a truncation came since (the fsynced segments may no longer be the log)."""
        if done.truncations == self._truncations and done.target <= self.log_end_offset:
            self.recovery_point = max(self.recovery_point, done.target)
            self._files_synced = max(self._files_synced, done.files)

    # -- reads ---------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None,
             min_one_message: bool = True) -> bytes:
        """Whole batches from the one holding ``offset``; ``b""`` at the end of the log.

        ``max_offset`` (exclusive, e.g. the HW) bounds what is returned. Raises
        OffsetOutOfRangeError when ``offset`` is below the log start or above the LEO.
        """
        view = self._view  # the one this read uses (see the module docstring)
        leo = view.segments[-1].next_offset
        if offset < self.log_start_offset or offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.topic_partition}: "
                f"log start offset {self.log_start_offset}, log end offset {leo}")
        if offset == leo or (max_offset is not None and offset >= max_offset):
            return b""
        a = self._appended
        if (a is not None and offset == a[0] and a[1] == leo and a[3] == self.cleaner_fence
                and (max_offset is None or leo <= max_offset) and len(a[2]) <= max_bytes):
            # the append that answers a waiting fetch: its bytes, still in memory, are the
            # segment's (no truncation since, nothing after them), read without a syscall
            return bytes(a[2])
        i = max(0, bisect.bisect_right(view.bases, offset) - 1)
        try:
            for seg in view.segments[i:]:
                if seg.next_offset <= offset:
                    continue  # empty, or ends in a gap before ``offset``: its batch is further on
                # the segment holding ``offset`` answers, even with b"" (its batch does not fit or
                # reaches max_offset): a later segment's batches would not start with ``offset``
                return seg.read(offset, max_bytes, max_offset, min_one_message)
        except SegmentClosedError:
            if self._view is view:  # the log itself was closed or deleted
                raise
            # a worker thread's read, the segment dropped by the owner: again on the new view
            return self.read(offset, max_bytes, max_offset, min_one_message)
        except OSError as e:
            raise self.dir_failed(e, "reading") from e
        return b""

    @_storage_io("reading")
    def bytes_below(self, offset: int, end: int, cap: int) -> int:
        """About the bytes a ``read(offset, cap, max_offset=end)`` would return, at most
        ``cap``, found from segment positions (an index lookup and a header walk, no record
        read or checked): a waiting fetch's try (Kafka's DelayedFetch estimates the same
        way). ``cap`` when ``end`` lies beyond the segment holding ``offset``, as in Kafka.
        Raises what locating ``offset`` or ``end`` raises (CorruptRecordError)."""
        if end <= offset:
            return 0
        view = self._view
        i = max(0, bisect.bisect_right(view.bases, offset) - 1)
        seg = view.segments[i]
        if end > seg.next_offset or seg.next_offset <= offset:
            return cap  # the rest of a segment at least (or a gap after it: a read tells)
        start = seg.translate_offset(offset)
        if start is None:
            return 0
        stop = seg.size
        if end < seg.next_offset:  # the batch holding ``end`` reaches it: not read
            found = seg.translate_offset(end)
            stop = seg.size if found is None else found[0]
        return max(0, min(cap, stop - start[0]))

    @_storage_io("reading")
    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """The first record with a timestamp >= ``timestamp``: ``(offset, timestamp)`` or None."""
        view = self._view
        try:
            for seg in view.segments:
                if seg.max_timestamp >= timestamp:
                    # records below the log start are not there for a reader: search from it
                    found = seg.find_offset_by_timestamp(timestamp, self.log_start_offset)
                    if found is not None:
                        return found
        except SegmentClosedError:
            if self._view is view:
                raise
            return self.offset_for_timestamp(timestamp)  # as in ``read``
        return None

    @_storage_io("reading")
    def offset_of_max_timestamp(self) -> tuple[int, int] | None:
        """The first record with the largest timestamp of those at or above the log start:
        ``(offset, timestamp)``, or None when none has a timestamp (ListOffsets MAX_TIMESTAMP:
        the segment with the largest, searched for it). Records below the log start are not
        the log's any more, though a segment may still hold them (DeleteRecords, before
        retention deletes the segment): only the segment the log start falls in is walked
        for its largest from there (Kafka's answer counts them, naming an offset no fetch
        can read). A worker thread may run it, as ``offset_for_timestamp``."""
        view, start = self._view, self.log_start_offset
        try:
            best, best_ts = None, -1
            for seg in view.segments:
                if seg.next_offset <= start:  # wholly below the log start
                    continue
                ts = seg.max_timestamp_from(start)
                if ts > best_ts:  # the earliest segment wins a tie
                    best, best_ts = seg, ts
            return None if best is None else best.find_offset_by_timestamp(best_ts, start)
        except SegmentClosedError:
            if self._view is view:
                raise
            return self.offset_of_max_timestamp()  # as in ``read``

    # -- truncation ----------------------------------------------------------------------------

    @_storage_io("truncating")
    def truncate_to(self, offset: int) -> bool:
        """Remove every batch that reaches ``offset`` or beyond; True if anything was removed.

        A batch that straddles ``offset`` is removed whole, so the new LEO may be below it.
        """
        if offset < 0:
            raise ValueError(f"cannot truncate {self.topic_partition} to negative offset {offset}")
        if offset >= self.log_end_offset:
            return False
        segs = self._view.segments
        if offset <= segs[0].base_offset:
            self.truncate_fully_and_start_at(offset)
            return True
        self.cleaner_fence += 1
        keep = bisect.bisect_left(self._view.bases, offset)  # the segments starting below it
        if keep < len(segs):
            self._view = _view_of(segs[:keep])
            for seg in reversed(segs[keep:]):
                seg.delete()
        try:
            segs[keep - 1].truncate_to(offset)  # CorruptRecordError: its framing is damaged
        finally:
            # whether or not the last cut worked, what depends on the end follows the end
            # there is now (the later segments are gone either way)
            leo = self.log_end_offset
            # truncating below a log start inside the first segment (after DeleteRecords)
            # moves the start down with the end, as Kafka does: a log never starts beyond its end
            self.log_start_offset = min(self.log_start_offset, leo)
            self.epoch_cache.truncate_from_end(leo)
            self._high_watermark = min(self._high_watermark, leo)
            self.recovery_point = min(self.recovery_point, leo)
            if self._damaged_from is not None and leo <= self._damaged_from:
                self.damaged_from = None  # the hole is gone: what is appended now fills it
            self._note_truncation(leo)
            self.reload_producer_state()
        logger.info("%s: truncated to offset %d (log end offset now %d)", self.topic_partition, offset, leo)
        return True

    def truncate_damaged(self, offset: int) -> int:
        """Drop the batch holding ``offset``, found damaged on disk, and everything after it,
        to fetch them again; returns the new LEO. When the damage hides where that batch
        starts (its framing), the whole segment holding it goes (and the one before, if its
        own framing cannot be walked to its end either)."""
        target = offset
        while True:
            try:
                self.truncate_to(target)
                break
            except CorruptRecordError:
                bases = self._view.bases
                i = max(0, bisect.bisect_right(bases, target - 1) - 1)
                logger.warning("%s: the segment at %d cannot be walked to offset %d: dropping it whole",
                               self.topic_partition, bases[i], target)
                target = bases[i]
        logger.warning("%s: dropped the damaged records from offset %d on (log end offset now %d)",
                       self.topic_partition, offset, self.log_end_offset)
        return self.log_end_offset

    @_storage_io("truncating")
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Delete every segment and restart the (empty) log at ``offset``."""
        self.cleaner_fence += 1
        old = self._view.segments
        same_name = [seg for seg in old if seg.base_offset == offset]
        with _pinned(same_name):  # a read holding it keeps its file, the new one takes its name
            for seg in same_name:
                seg.delete()
            self._add_segment(offset, after=())
        for seg in old:
            if seg.base_offset != offset:
                seg.delete()
        self.log_start_offset = offset
        self._high_watermark = offset
        self.recovery_point = offset
        if self._damaged_from is not None:
            self.damaged_from = None
        self.epoch_cache.clear()
        self.producer_state.clear(offset)
        self.producer_state.delete_snapshots(lambda _: True)
        self._note_truncation(offset)
        logger.info("%s: truncated fully, restarting at offset %d", self.topic_partition, offset)

    def _note_truncation(self, offset: int) -> None:
        """Written down before anything is appended again (``on_truncation``, the log manager),
        as Kafka's truncateTo does: the lowered recovery point (a checkpoint left above it
        would have a crash's recovery trust the records appended since, never flushed, as
        flushed, and keep a segment cut short by the crash as if whole, with a hole after
        it), and the cleaner checkpoint, lowered to ``offset`` if above (what is appended
        there next was never cleaned; left above, an old value and its tombstone there
        would never be compared, and the value would come back once the tombstone expired).
        A cleaning in progress is abandoned (``cleaner_fence``)."""
        self._truncations += 1
        if self.on_truncation is not None:
            self.on_truncation(self, offset)

    # -- retention -----------------------------------------------------------------------------

    @_storage_io("moving the log start of")
    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Move the log start offset up (DeleteRecords); never beyond the HW."""
        if offset > self._high_watermark:
            raise OffsetOutOfRangeError(
                f"cannot move the log start of {self.topic_partition} to {offset}, "
                f"above the high watermark {self._high_watermark}")
        if offset <= self.log_start_offset:
            return False
        self.log_start_offset = offset
        self.epoch_cache.truncate_from_start(offset)
        self.producer_state.trim_head(offset, self._view.bases[0])
        return True

    @_storage_io("applying retention to")
    def delete_old_segments(self) -> list[int]:
        """Apply retention; returns the base offsets of the segments deleted.

        Only whole segments entirely below the HW are deleted, oldest first: those wholly
        below the log start offset, then (with ``cleanup.policy`` delete) those whose newest
        record is older than ``retention.ms``, then the oldest while the partition is larger
        than ``retention.bytes``.
        """
        deleted = self._delete_prefix(lambda seg, upper: upper <= self.log_start_offset, "log start offset")
        if not self.config.deletes:
            return deleted
        if self.config.retention_ms >= 0:
            now = self._clock()
            deleted += self._delete_prefix(
                lambda seg, upper: now - self.segment_timestamp(seg) > self.config.retention_ms,
                f"retention.ms {self.config.retention_ms}")
        if self.config.retention_bytes >= 0:
            excess = self.size - self.config.retention_bytes

            def over(seg: LogSegment, upper: int) -> bool:
                nonlocal excess
                if excess - seg.size < 0:
                    return False
                excess -= seg.size
                return True
            deleted += self._delete_prefix(over, f"retention.bytes {self.config.retention_bytes}")
        return deleted

    @staticmethod
    def segment_timestamp(seg: LogSegment) -> int:
        """What ``retention.ms`` and ``min.compaction.lag.ms`` judge a segment by: its newest
        record's timestamp, or, with none (empty, or no timestamps), its last write (Kafka's
        largestTimestamp, with the file's lastModified): kept in memory on append, the file's
        mtime after a restart. Never its creation: records written just now into a segment
        created long ago are as young as they are."""
        return seg.max_timestamp if seg.max_timestamp >= 0 else seg.last_modified_ms

    def _delete_prefix(self, predicate, reason: str) -> list[int]:
        n = 0
        segs = self._view.segments
        for i, seg in enumerate(segs):
            upper = segs[i + 1].base_offset if i + 1 < len(segs) else self.log_end_offset
            empty_active = seg.size == 0 and i == len(segs) - 1  # (a cleaned segment may be empty)
            if empty_active or upper > self._high_watermark or not predicate(seg, upper):
                break
            n += 1
        if n == 0:
            return []
        if n == len(segs):
            self.roll()
        segs = self._view.segments
        doomed = segs[:n]
        self._view = _view_of(segs[n:])
        first = segs[n].base_offset
        self.log_start_offset = max(self.log_start_offset, first)
        self.epoch_cache.truncate_from_start(self.log_start_offset)
        self.producer_state.trim_head(self.log_start_offset, first)
        for seg in doomed:
            logger.info("%s: deleting segment %d (%d bytes, offsets below %d) because of %s",
                        self.topic_partition, seg.base_offset, seg.size, seg.next_offset, reason)
            seg.delete()
        return [s.base_offset for s in doomed]

    # -- compaction ----------------------------------------------------------------------------

    @_storage_io("swapping cleaned segments into")
    def replace_segments(self, new: list[LogSegment], old: list[LogSegment]) -> None:
        """Swap the log cleaner's output ``new`` (fsynced ``.cleaned`` segments) in for the
        consecutive segments ``old`` (never the active one), crash-safely: the file protocol
        and its recovery are in ``broker.log.swap``. A read in progress on another thread keeps
        reading ``old`` (pinned open while their files are renamed) or starts again on the
        new view; the next read sees the new segments."""
        segs = self._view.segments
        i = segs.index(old[0])
        if list(segs[i:i + len(old)]) != old or i + len(old) >= len(segs):
            raise ValueError(f"{self.topic_partition}: segments to replace are not consecutive closed segments")
        with _pinned(old):
            apply_ops(plan_swap(self.directory, [s.base_offset for s in new], [s.base_offset for s in old]))
            for seg in new:
                seg.set_file_suffix("")
            self._view = _view_of(segs[:i] + tuple(new) + segs[i + len(old):])
            for seg in old:
                seg.set_file_suffix(DELETED_SUFFIX)  # its files are gone; close without touching the new ones
                seg.delete()
        self._appended = None  # its batches may have been cleaned away
        logger.info("%s: swapped in cleaned segment(s) %s for segment(s) %s", self.topic_partition,
                    [s.base_offset for s in new], [s.base_offset for s in old])

    # -- durability ----------------------------------------------------------------------------

    @_storage_io("flushing")
    def flush(self, offset: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery point, ``offset``); advance it."""
        target = self.log_end_offset if offset is None else min(offset, self.log_end_offset)
        self.last_flush_ms = self._clock()
        if target <= self.recovery_point:
            return
        segs = self._view.segments
        for i, seg in enumerate(segs):
            upper = segs[i + 1].base_offset if i + 1 < len(segs) else self.log_end_offset + 1
            if seg.base_offset < target and upper > self.recovery_point:
                seg.flush()
        if self._files_created != self._files_synced:
            # a file's data is durable, its name in the directory is not until the directory
            # is: a segment created since the last flush could vanish whole (Kafka's flushDir)
            self._files_synced = self._files_created
            fsync_dir(self.directory)
        self.recovery_point = target

    @_storage_io("loading the producer state of")
    def reload_producer_state(self) -> None:
        """Rebuild the producer state from the newest snapshot at or below the log end and the
        batch headers after it (loading, truncation)."""
        ps, leo = self.producer_state, self.log_end_offset
        start = ps.load_latest_snapshot(leo)
        bases, segs = self._view
        start = max(start or 0, bases[0])
        i = max(0, bisect.bisect_right(bases, start) - 1)
        for seg in segs[i:]:
            found = seg.translate_offset(start) if seg.next_offset > start else None
            if found is not None:
                ps.update(seg.headers_from(found[0]))
        ps.map_end_offset = leo
        ps.trim_head(self.log_start_offset, bases[0])

    @_storage_io("deleting producer snapshots of")
    def delete_snapshots_after_recovery_point_checkpoint(self) -> int:
        """Delete the producer state snapshots below the base of the segment holding the
        offset before the recovery point, or of the second-to-last segment, whichever is lower
        (Kafka's rule); returns that offset. Kept: those of the last two segments (a follower's
        truncation is most often inside them) and every one from the recovery point's segment
        on (a crash's recovery replays from there and finds a snapshot to start from)."""
        bases = self._view.bases
        two_segments = bases[-2] if len(bases) > 1 else bases[-1]
        i = bisect.bisect_left(bases, self.recovery_point) - 1
        recovery = bases[i] if i >= 0 else self.recovery_point
        keep_from = min(recovery, two_segments)
        self.producer_state.delete_snapshots(lambda offset: offset < keep_from)
        return keep_from

    def remove_expired_producers(self, expiration_ms: int) -> list:
        """Forget producers idle for ``expiration_ms`` (producer.id.expiration.ms); returns
        their entries (see ``producer_state``)."""
        return self.producer_state.remove_expired_producers(self._clock(), expiration_ms)

    @_storage_io("closing")
    def close(self) -> None:
        """Close the segments, with a snapshot of the producer state at the log end (so the
        next start loads it and replays nothing)."""
        self.cleaner_fence += 1
        self._snapshot_producer_state()
        for seg in self._view.segments:
            seg.close()

    def close_handlers(self) -> None:
        """Close the segments' descriptors, writing nothing (Kafka's closeHandlers): the log of
        a directory that failed, whose files are not touched again."""
        self.cleaner_fence += 1
        for seg in self._view.segments:
            with contextlib.suppress(OSError):
                OPEN_SEGMENT_FILES.close(seg)

    def delete(self) -> None:
        """Remove the log's files and directory: only a valid topic-partition's own directory
        (LogPathError otherwise, before anything is removed; broker.log.paths)."""
        check_partition_dir(self.directory, self.topic_partition)
        self.cleaner_fence += 1
        for seg in self._view.segments:
            seg.delete()
        for name in os.listdir(self.directory):
            os.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)

    def __repr__(self) -> str:
        return (f"Log({self.topic_partition}, log_start_offset={self.log_start_offset}, "
                f"log_end_offset={self.log_end_offset}, high_watermark={self._high_watermark}, "
                f"segments={len(self._view.segments)})")
