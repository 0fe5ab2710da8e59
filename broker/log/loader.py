"""Loading a partition log from disk, with recovery after an unclean shutdown.

After a *clean* shutdown (the log manager found ``.tidelog_cleanshutdown``) every segment's
indexes are loaded, sanity-checked, and rebuilt only if they fail. After an *unclean*
shutdown nothing written after the recovery point is trusted: every segment holding offsets
at or above the recovery point is re-read batch by batch (framing, magic, CRC-32C, offsets
increasing, epochs non-decreasing) and its indexes rebuilt. The log is cut at the first bad
batch, and every later segment is deleted: what was appended after the recovery point is
kept as a prefix of what was appended (an unflushed tail lost in a crash).

A segment that needs no recovery (clean shutdown, or wholly below the recovery point) but
whose indexes fail to load is re-read the same way. Its data was flushed (acknowledged,
usually replicated), so damage found there is disk corruption, not a lost tail: that segment
alone is cut at the first bad batch and the later segments are kept, as Kafka keeps them. The
hole left (the offsets from the cut to the next segment's base) is what reads skip, as in a
compacted log: a read in it returns the first batch after it. Its first offset is
``Log.damaged_from``, which the replica manager reports as a damaged replica, to be fetched
again from a replica in sync; it is kept in ``damaged-hole-checkpoint`` until then, so that a
later load reports it again and does not take it for a lost tail. Every cut is logged at ERROR level with the bytes and offsets
lost, and kept in ``Log.recovery_report``.

Leftovers of interrupted operations are cleaned first: a swap of cleaned segments that a
crash interrupted is completed or rolled back (``broker.log.swap``), then ``*.tmp``
(checkpoint writes), ``*.deleted`` (segment deletion) and ``*.cleaned`` are removed.
A compacted log's segments may end before the next one starts (the cleaner removed the
records in between): the rule that cuts the log after a lost unflushed tail does not apply
to them.
Index files without a ``.log`` are removed. A missing or corrupt leader-epoch checkpoint is
rebuilt from the epochs in the batch headers; entries starting at or beyond the recovered log
end are dropped (an epoch recorded before its first batch reached the disk). The idempotent producers' state is loaded from
the newest ``.snapshot`` at or below the log end and the batch headers after it (snapshots
beyond the recovered log end are deleted).
"""

from __future__ import annotations

import logging
import os

from tidelog.broker.log.checkpoint import (
    DAMAGED_HOLE_CHECKPOINT,
    LEADER_EPOCH_CHECKPOINT,
    CorruptCheckpointError,
    HoleCheckpoint,
    LeaderEpochCheckpoint,
)
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.epoch import LeaderEpochCache
from tidelog.broker.log.index import CorruptIndexError
from tidelog.broker.log.log import Clock, Log, wall_clock_ms
from tidelog.broker.log.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    RecoveryResult,
    parse_base_offset,
)
from tidelog.broker.log.swap import complete_interrupted_swaps
from tidelog.protocol.topics import TopicPartition

logger = logging.getLogger("tidelog.log.loader")

LEFTOVER_SUFFIXES = (".tmp", ".deleted", ".cleaned")


def load_log(directory: str, topic_partition: TopicPartition, config: LogConfig, *,
             recovery_point: int = 0, log_start_offset: int = 0, high_watermark: int = 0,
             had_clean_shutdown: bool = False, clock: Clock = wall_clock_ms,
             cleaned_offset: int = 0) -> Log:
    """Open (creating if needed) the log in ``directory`` and bring it to a consistent state.

    ``cleaned_offset``: the log cleaner's checkpoint (segments below it may end in a gap)."""
    os.makedirs(directory, exist_ok=True)
    report: list[str] = []
    swapped = complete_interrupted_swaps(directory)
    _remove_leftovers(directory)
    segments = _open_segments(directory, config)
    known_hole = _known_hole(directory, topic_partition)
    gaps_allowed = _GapsAllowed(config.compacts, cleaned_offset, swapped, known_hole)
    segments, hole = _recover(segments, recovery_point, had_clean_shutdown, topic_partition, report,
                              gaps_allowed)
    if not segments:
        segments = [LogSegment.create(directory, max(log_start_offset, 0), config, clock())]
    log_end = segments[-1].next_offset
    start = max(log_start_offset, segments[0].base_offset)
    epochs = _load_epoch_cache(directory, segments, topic_partition)
    log = Log(directory, topic_partition, config, segments, log_start_offset=start,
              recovery_point=min(recovery_point, log_end), high_watermark=0,
              epoch_cache=epochs, clock=clock)
    if start > log_end:
        report.append(f"{topic_partition}: log end offset {log_end} is below the log start offset "
                      f"{start}; restarting the log at {start}")
        logger.error(report[-1])
        log.truncate_fully_and_start_at(start)
    epochs.truncate_from_end(log.log_end_offset)
    epochs.truncate_from_start(log.log_start_offset)
    log.reload_producer_state()  # the latest snapshot, then the batch headers after it
    log.update_high_watermark(high_watermark)
    log.flush()  # what was re-validated is made durable; the recovery point moves to the LEO
    log.recovery_report = report
    holes = [h for h in (hole, known_hole) if h is not None]
    log.damaged_from = min(holes) if holes else None  # written through; None unless in the log
    return log


def _known_hole(directory: str, tp: TopicPartition) -> int | None:
    """The hole an earlier load found (``damaged-hole-checkpoint``), not fetched again yet."""
    try:
        return HoleCheckpoint(os.path.join(directory, DAMAGED_HOLE_CHECKPOINT)).read()
    except CorruptCheckpointError as e:
        logger.warning("%s: %s; no hole left by damage is known", tp, e)
        return None


def _remove_leftovers(directory: str) -> None:
    names = os.listdir(directory)
    bases = {parse_base_offset(n) for n in names if n.endswith(LOG_SUFFIX)}
    for name in names:
        path = os.path.join(directory, name)
        if name.endswith(LEFTOVER_SUFFIXES):
            logger.info("removing leftover file %s", path)
            os.unlink(path)
        elif name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX)) and parse_base_offset(name) not in bases:
            logger.info("removing index file %s that has no log segment", path)
            os.unlink(path)


def _open_segments(directory: str, config: LogConfig) -> list[LogSegment]:
    bases = sorted(b for n in os.listdir(directory)
                   if n.endswith(LOG_SUFFIX) and (b := parse_base_offset(n)) is not None)
    return [LogSegment.open(directory, b, config) for b in bases]


class _GapsAllowed:
    """Whether a segment may end before the next one starts: in a compacted log (the cleaner
    removes records, and a follower copies its leader's gaps), in a segment below the cleaner
    checkpoint (the topic may no longer be compacted), in one a swap just put in place, and
    at the hole an earlier load left in damaged flushed data (``damaged-hole-checkpoint``: a
    stale recovery point must not take it for a lost tail)."""

    def __init__(self, compacted: bool, cleaned_offset: int, swapped: set[int], known_hole: int | None = None):
        self.compacted, self.cleaned_offset, self.swapped = compacted, cleaned_offset, swapped
        self.known_hole = known_hole

    def __call__(self, seg: LogSegment, upper: int) -> bool:
        return (self.compacted or upper <= self.cleaned_offset or seg.base_offset in self.swapped
                or seg.next_offset == self.known_hole)


def _recover(segments: list[LogSegment], recovery_point: int, clean: bool,
             tp: TopicPartition, report: list[str],
             gaps_allowed=lambda seg, upper: False) -> tuple[list[LogSegment], int | None]:
    """The segments kept, and the first offset of a hole left by damage to flushed data."""
    hole: int | None = None
    for i, seg in enumerate(segments):
        upper = segments[i + 1].base_offset if i + 1 < len(segments) else None
        must_recover = not clean and (upper is None or upper > recovery_point)
        if not must_recover and _indexes_loaded(seg, tp):
            continue
        result = seg.recover()
        if upper is not None and seg.next_offset > upper:
            # its last batch claims offsets of the next segment: a damaged base offset (outside
            # the CRC); the file names are the trustworthy side
            end = seg.size
            seg.truncate_to(upper)
            result = RecoveryResult(result.truncated_bytes + end - seg.size, seg.size,
                                    f"batch at position {seg.size}: its offsets reach into the next "
                                    f"segment, which starts at offset {upper}")
        if (must_recover and upper is not None and seg.next_offset < upper and not result.truncated_bytes
                and not gaps_allowed(seg, upper)):
            # its unflushed tail was lost whole (the file ends at a batch boundary) while a later
            # segment survived: keeping that one would leave a hole, not a prefix. (Leader logs
            # have no gaps; a follower's copy of one is fetched again.)
            result = RecoveryResult(0, seg.size, f"its batches end at offset {seg.next_offset}, "
                                    f"but the next segment starts at offset {upper}")
        if not (result.truncated_bytes or result.reason) and i + 1 < len(segments):
            seg.on_become_inactive()  # a closed segment: rebuilt as rolled, with its final time entry
        if not (result.truncated_bytes or result.reason):
            continue
        cut = (f"{tp}: segment {seg.log_path} truncated at position {result.valid_bytes}: "
               f"{result.truncated_bytes} bytes removed ({result.reason})")
        if not must_recover:
            # flushed data (acknowledged, likely replicated) damaged on disk: the later segments
            # hold good data, kept around the hole (Kafka recovers such a segment alone)
            if upper is None:
                lost = f"offsets from {seg.next_offset} on lost"
            elif seg.next_offset < upper:
                lost = f"offsets {seg.next_offset} to {upper - 1} lost"
                hole = seg.next_offset if hole is None else hole
            else:
                lost = "no offsets lost"
            report.append(f"{cut}; {lost} from flushed data damaged on disk; the later segments are kept")
            logger.error(report[-1])
            if upper is not None:
                seg.on_become_inactive()
            continue
        lost_after = segments[i + 1:]  # a reason without bytes: a lost tail
        report.append(f"{cut}; log end offset is now {seg.next_offset}"
                      + (f"; {len(lost_after)} later segment(s) deleted: "
                         + ", ".join(s.log_path for s in lost_after) if lost_after else ""))
        logger.error(report[-1])
        for later in lost_after:
            later.delete()
        return segments[:i + 1], hole
    return segments, hole


def _indexes_loaded(seg: LogSegment, tp: TopicPartition) -> bool:
    try:
        seg.load_indexes()
        return True
    except (CorruptIndexError, FileNotFoundError) as e:
        logger.warning("%s: rebuilding the indexes of %s: %s", tp, seg.log_path, e)
        return False


def _load_epoch_cache(directory: str, segments: list[LogSegment], tp: TopicPartition) -> LeaderEpochCache:
    checkpoint = LeaderEpochCheckpoint(os.path.join(directory, LEADER_EPOCH_CHECKPOINT))
    try:
        if os.path.exists(checkpoint.path) or all(s.size == 0 for s in segments):
            return LeaderEpochCache(checkpoint, checkpoint.read())
    except CorruptCheckpointError as e:
        logger.warning("%s: %s; rebuilding it from the batch headers", tp, e)
    cache = LeaderEpochCache(checkpoint)
    for seg in segments:
        for _, h in seg.headers_from(0):
            if h.leader_epoch > cache.latest_epoch:
                cache.assign(h.leader_epoch, h.base_offset)
    cache.flush()
    return cache
