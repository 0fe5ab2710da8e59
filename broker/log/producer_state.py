"""Per-partition state of idempotent producers: what makes a retried batch a duplicate.

Theory of operation (Kafka's ProducerStateManager and ProducerAppendInfo)
-------------------------------------------------------------------------
An idempotent producer stamps every batch with its producer id, its producer epoch and a
base sequence: per partition, the sequences of one (id, epoch) count records from 0 with no
gap (``last sequence = base sequence + record count - 1``, wrapping from 2**31 - 1 to 0).
For each producer id it knows, the partition keeps its epoch and the
metadata of its last ``BATCH_METADATA_MAX`` (5) batches: first and last sequence, first and
last offset, max timestamp. Five, because a producer has at most five requests in flight
per connection, so a retried batch is always one of the last five it appended.

Tidelog's producer sends a partition's full batches as one run in one request, so one
request may carry more than five batches. Consecutive batches of a producer that continue
both its sequence and the offsets (nothing of another producer between them) are therefore
kept as one entry spanning them all (up to ``MAX_MERGED_RECORDS`` records), and a batch is a
duplicate when its sequence range lies inside an entry: inside an entry, offset and
sequence advance together, so its original offset is ``first offset + (its first sequence -
the entry's first sequence)``. An entry keeps the largest max timestamp of its batches;
batches stamped with their log append time (LogAppendTime topics: the attribute says so)
are merged only when stamped at the same time, that is by one append, so that a duplicate
answers the log append time of its own append, as Kafka's does. The merge depends only on
the batches appended, so leader, followers and a replay after a restart build the same
entries for the batches their segments hold.

The leader checks each batch of an append (``check_leader_append``) against that state,
reading only the header fields (producer id, epoch, base sequence: bytes 43..56), never
the records, and decides before anything is written:

* a batch of the current epoch whose sequences lie inside one of the last five: a
  *duplicate*. Nothing is appended; the produce answers NONE with the original offsets;
* an epoch older than the known one: INVALID_PRODUCER_EPOCH (a newer epoch took over);
* a newer epoch must start at sequence 0; the same epoch must continue at last + 1;
  anything else is a gap: OUT_OF_ORDER_SEQUENCE_NUMBER (nothing appended: the client
  resends the missing batch first);
* a producer id with no state (never seen, or forgotten by producer id expiration, see
  below) must start at sequence 0, else UNKNOWN_PRODUCER_ID, answered with the partition's
  real log start offset: the client then knows its records were not lost to an old broker
  and starts a new epoch (a Java producer since KIP-360, Tidelog's). Kafka 2.5+ accepts such
  a producer at any sequence instead; a client that writes two requests of one partition in
  an order other than their sequences' (two requests that waited for a connection) would
  then have its later records taken first and the earlier ones refused as a gap.

Several batches of one producer in one append are checked in order against each other. A
run of batches is appended whole or not at all, so a run that mixes duplicates with new
batches, or duplicates batches not consecutive in the log, is refused as INVALID_RECORD
(clients send a retried batch alone; Kafka allows one batch per partition in a Produce).
Not DUPLICATE_SEQUENCE_NUMBER: clients take it for "already written", and the new batches
would be lost.

Every appended batch (leader or follower: ``update``) moves the state, so a follower that
becomes leader deduplicates exactly as the old leader did. Truncation (a follower cutting
its divergent tail) rebuilds the state: the latest snapshot at or below the new log end,
then a replay of the batch headers after it.

The log start offset moving (retention, DeleteRecords) forgets no producer and no batch
(Kafka 2.5+'s ``onLogStartOffsetIncremented``): a producer whose batches were all removed
goes on at its next sequence, and a retry of one of them is still a duplicate (answered
with offsets now below the log start). An entry merged from batches on both sides of the
first offset still held is kept whole too: its deleted part holds some of the producer's
last requests, whose retries must stay duplicates (``trim_head`` cuts nothing). What the
state remembers beyond the segments lives on in the snapshots, which hold all of it (those
below the first segment's base are deleted; the one at that base, written when the segment
was rolled, holds the entries whole). A rebuild with no usable snapshot replays the
segments alone and knows only the producers with batches in them, and of an entry reaching
below the first segment only the part held; the others are then unknown producers (see
above).

Producer id expiration (Kafka's ``producer.id.expiration.ms``): a producer whose last batch
is older than the expiration time is forgotten (``remove_expired_producers``, run
periodically by the log manager). Without it the state of a log that retention does not
shorten (a compacted topic, where the cleaner also keeps each known producer's last record)
would grow by one entry for every producer id that ever wrote to it. A forgotten producer
that comes back is refused with UNKNOWN_PRODUCER_ID, and the client sends the refused batch
again under a new epoch.

Snapshots
---------
``<20-digit offset>.snapshot`` in the partition directory holds the state of every
producer as of ``offset`` (everything below it applied, nothing at or above), written at
segment roll and at clean shutdown (temp file and rename, so a reader sees a whole file or
none). The log deletes those it no longer needs (``Log.delete_snapshots_after_recovery_point_checkpoint``,
``trim_head``). Format::

    magic    4 bytes  b"TLPS"
    version  int16    1
    crc      uint32   CRC-32C of the body
    body     msgpack  [offset, [[producer_id, epoch, [[first_seq, last_seq, first_offset,
                                                      last_offset, max_timestamp], ...]], ...]]

A snapshot that fails any check (a torn write after a crash) is deleted and the next older
one is used: at worst the whole log is replayed. An OSError reading one (an I/O error, no
descriptors left) is raised instead, the log dir failing: the file may well be whole. Loading then replays the batch headers from
the snapshot's offset to the log end.

Pure and synchronous: no I/O but the snapshot files, no clock.
"""

from __future__ import annotations

import logging
import os
import struct
from collections import deque
from typing import Iterable, NamedTuple

import msgpack
from crc32c import crc32c

from tidelog.protocol.errors import (
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    UNKNOWN_PRODUCER_ID,
    TidelogError,
)
from tidelog.protocol.records import TIMESTAMP_TYPE_BIT, BatchHeader

logger = logging.getLogger("tidelog.log.producer_state")

BATCH_METADATA_MAX = 5
MAX_MERGED_RECORDS = 1 << 20  # an entry spans at most this many records (offsets)
MAX_SEQUENCE = 2**31 - 1
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_MAGIC = b"TLPS"
SNAPSHOT_VERSION = 1
_SNAPSHOT_HEADER = struct.Struct(">4shI")
MAX_SNAPSHOT_BYTES = 256 << 20


class BatchMetadata(NamedTuple):
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    max_timestamp: int


class ProducerStateEntry:
    """One producer id on one partition: its epoch and its last few batches."""

    __slots__ = ("producer_id", "producer_epoch", "batches")

    def __init__(self, producer_id: int, producer_epoch: int, batches: Iterable[BatchMetadata] = ()):
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.batches: deque[BatchMetadata] = deque(batches, maxlen=BATCH_METADATA_MAX)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, first_seq: int, count: int) -> BatchMetadata | None:
        """The original of a batch of ``count`` records from ``first_seq``, if its sequences
        lie inside one of the entries."""
        for b in self.batches:
            delta = (first_seq - b.first_seq) & MAX_SEQUENCE
            if delta + count - 1 <= b.last_offset - b.first_offset:
                offset = b.first_offset + delta
                return BatchMetadata(first_seq, next_sequence(first_seq, count - 1), offset, offset + count - 1,
                                     b.max_timestamp)
        return None

    def add(self, epoch: int, batch: BatchMetadata, log_append_time: bool = False) -> None:
        """Remember an appended batch. A batch stamped with its log append time continues an
        entry only at the same time (one append): a duplicate answers its own append time."""
        if epoch != self.producer_epoch:
            self.producer_epoch = epoch
            self.batches.clear()
        elif self.batches:
            last = self.batches[-1]
            if (batch.first_offset == last.last_offset + 1 and in_sequence(last.last_seq, batch.first_seq)
                    and batch.last_offset - last.first_offset < MAX_MERGED_RECORDS
                    and not (log_append_time and batch.max_timestamp != last.max_timestamp)):
                self.batches[-1] = BatchMetadata(last.first_seq, batch.last_seq, last.first_offset, batch.last_offset,
                                                 max(last.max_timestamp, batch.max_timestamp))
                return
        self.batches.append(batch)

    def __eq__(self, other) -> bool:
        return (isinstance(other, ProducerStateEntry) and self.producer_id == other.producer_id
                and self.producer_epoch == other.producer_epoch and list(self.batches) == list(other.batches))

    def __repr__(self) -> str:
        return f"ProducerStateEntry({self.producer_id}, epoch={self.producer_epoch}, {list(self.batches)})"


def next_sequence(seq: int, increment: int = 1) -> int:
    """``seq + increment``, wrapping from 2**31 - 1 to 0 (Kafka's incrementSequence)."""
    return (seq + increment) & MAX_SEQUENCE


def in_sequence(last_seq: int, first_seq: int) -> bool:
    return first_seq == next_sequence(last_seq)


def batch_metadata(h: BatchHeader) -> BatchMetadata:
    """The metadata of a stamped batch (its base offset is set)."""
    return BatchMetadata(h.base_sequence, next_sequence(h.base_sequence, h.last_offset_delta), h.base_offset,
                         h.base_offset + h.last_offset_delta, h.max_timestamp)


class ProducerStateManager:
    """The producer state of one partition (see the module docstring)."""

    def __init__(self, directory: str | None = None):
        self.directory = directory
        self.producers: dict[int, ProducerStateEntry] = {}
        self.map_end_offset = 0  # batches below this offset are applied

    # -- the leader's check (pure: nothing changes) ---------------------------------------------

    def check_leader_append(self, batches: list[tuple[int, BatchHeader]], where: object = "") -> BatchMetadata | None:
        """Check a producer's run of batches before it is appended. Returns None when every
        batch is new, the original batch's metadata (offsets spanning the whole run) when every
        batch is a duplicate; raises TidelogError with the error code otherwise."""
        pending: dict[int, tuple[int, int]] = {}  # producer id -> (epoch, last seq) within this run
        duplicates: list[BatchMetadata] = []
        fresh = 0
        for _, h in batches:
            pid = h.producer_id
            if pid < 0:
                fresh += 1
                continue
            if h.base_sequence < 0 or h.producer_epoch < 0:
                raise TidelogError(f"{where}: a batch of producer id {pid} has epoch {h.producer_epoch} and "
                                   f"base sequence {h.base_sequence}; an idempotent batch needs both",
                                   error=INVALID_RECORD)
            dup = self._check_batch(h, pending.get(pid), where)
            if dup is not None:
                duplicates.append(dup)
            else:
                fresh += 1
                pending[pid] = (h.producer_epoch, next_sequence(h.base_sequence, h.last_offset_delta))
        if not duplicates:
            return None
        # neither written nor already written: a client would take DUPLICATE_SEQUENCE_NUMBER
        # for "already written" and lose the new batches (Kafka allows one batch per request)
        if fresh:
            raise TidelogError(f"{where}: a run of {len(batches)} batches mixes {len(duplicates)} duplicate(s) "
                               f"of appended batches with {fresh} new one(s); send a retried batch alone",
                               error=INVALID_RECORD)
        if any(b.first_offset != a.last_offset + 1 for a, b in zip(duplicates, duplicates[1:])):
            raise TidelogError(f"{where}: a run of {len(batches)} batches duplicates appended batches that are "
                               "not consecutive in the log; send a retried batch alone", error=INVALID_RECORD)
        first, last = duplicates[0], duplicates[-1]
        return BatchMetadata(first.first_seq, last.last_seq, first.first_offset, last.last_offset,
                             max(d.max_timestamp for d in duplicates))

    def _check_batch(self, h: BatchHeader, pending: tuple[int, int] | None, where: object) -> BatchMetadata | None:
        pid, epoch, first_seq = h.producer_id, h.producer_epoch, h.base_sequence
        entry = self.producers.get(pid)
        if pending is not None:
            known_epoch, last_seq = pending
        elif entry is not None:
            known_epoch, last_seq = entry.producer_epoch, entry.last_seq
        else:
            if first_seq != 0:
                raise TidelogError(
                    f"{where}: no state for producer id {pid} (never seen, or forgotten by producer id "
                    f"expiration), and its batch starts at sequence {first_seq}, not 0", error=UNKNOWN_PRODUCER_ID)
            return None
        if epoch < known_epoch:
            raise TidelogError(f"{where}: producer id {pid} epoch {epoch} is older than its current epoch "
                               f"{known_epoch}", error=INVALID_PRODUCER_EPOCH)
        if epoch > known_epoch:
            if first_seq != 0:
                raise TidelogError(f"{where}: producer id {pid} starts its new epoch {epoch} at sequence "
                                   f"{first_seq}, not 0", error=OUT_OF_ORDER_SEQUENCE_NUMBER)
            return None
        if pending is None:
            dup = entry.find_duplicate(first_seq, h.last_offset_delta + 1)
            if dup is not None:
                return dup
        if not in_sequence(last_seq, first_seq):
            raise TidelogError(f"{where}: producer id {pid} epoch {epoch} sent sequence {first_seq}, expected "
                               f"{next_sequence(last_seq)}", error=OUT_OF_ORDER_SEQUENCE_NUMBER)
        return None

    # -- updates -------------------------------------------------------------------------------

    def update(self, batches: Iterable[tuple[int, BatchHeader]]) -> None:
        """Apply appended (stamped) batches, in offset order: leader, follower and replay."""
        producers = self.producers
        h = None
        for _, h in batches:
            if h.producer_id < 0:
                continue
            entry = producers.get(h.producer_id)
            if entry is None:
                entry = producers[h.producer_id] = ProducerStateEntry(h.producer_id, h.producer_epoch)
            entry.add(h.producer_epoch, batch_metadata(h), bool(h.attributes & TIMESTAMP_TYPE_BIT))
        if h is not None:
            self.map_end_offset = h.base_offset + h.last_offset_delta + 1

    def trim_head(self, log_start_offset: int, first_offset_held: int = 0) -> None:
        """Follow the log start offset and the first offset the segments hold (its first
        segment's base): no producer and no batch is forgotten, not even the deleted part of an
        entry merged from batches on both sides of ``first_offset_held`` (a retry of it is
        still a duplicate, see the module docstring). Snapshots below ``first_offset_held``
        go: a replay could not continue them; the one at it holds the entries whole."""
        self.map_end_offset = max(self.map_end_offset, log_start_offset)
        self.delete_snapshots(lambda offset: offset < first_offset_held)

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> list[ProducerStateEntry]:
        """Forget producers whose last batch's timestamp is ``expiration_ms`` or more before
        ``now_ms`` (Kafka's ``isProducerExpired``); returns their entries."""
        gone = [e for e in self.producers.values()
                if e.batches and now_ms - e.batches[-1].max_timestamp >= expiration_ms]
        for e in gone:
            del self.producers[e.producer_id]
        return gone

    def clear(self, offset: int = 0) -> None:
        self.producers.clear()
        self.map_end_offset = offset

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot_offsets(self) -> list[int]:
        if self.directory is None:
            return []
        return sorted(offset for name in os.listdir(self.directory) if (offset := _snapshot_offset(name)) is not None)

    def take_snapshot(self) -> str | None:
        """Write the state as of ``map_end_offset``; returns the file's path."""
        if self.directory is None:
            return None
        path = snapshot_path(self.directory, self.map_end_offset)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(encode_snapshot(self.map_end_offset, self.producers.values()))
        os.replace(tmp, path)
        return path

    def delete_snapshots(self, doomed) -> None:
        for offset in self.snapshot_offsets():
            if doomed(offset):
                _unlink(snapshot_path(self.directory, offset))

    def load_latest_snapshot(self, max_offset: int) -> int | None:
        """Adopt the newest valid snapshot at or below ``max_offset`` (newer ones are deleted:
        they describe batches no longer in the log); returns its offset, or None (empty state).
        Only a snapshot failing its format checks is deleted; an OSError (no descriptors left,
        an I/O error) says nothing of the file and is raised: the log dir is failing."""
        self.clear()
        for offset in reversed(self.snapshot_offsets()):
            path = snapshot_path(self.directory, offset)
            if offset > max_offset:
                _unlink(path)
                continue
            with open(path, "rb") as f:
                data = f.read(MAX_SNAPSHOT_BYTES + 1)
            try:
                snap_offset, entries = decode_snapshot(data)
                if snap_offset != offset:
                    raise ValueError(f"it holds offset {snap_offset}")
            except ValueError as e:
                logger.warning("deleting unreadable producer state snapshot %s: %s", path, e)
                _unlink(path)
                continue
            self.producers = {e.producer_id: e for e in entries}
            self.map_end_offset = offset
            return offset
        return None


def snapshot_path(directory: str, offset: int) -> str:
    return os.path.join(directory, f"{offset:020d}{SNAPSHOT_SUFFIX}")


def _snapshot_offset(name: str) -> int | None:
    stem = name[:-len(SNAPSHOT_SUFFIX)]
    if not name.endswith(SNAPSHOT_SUFFIX) or len(stem) != 20 or not stem.isdigit():
        return None
    return int(stem)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def encode_snapshot(offset: int, entries: Iterable[ProducerStateEntry]) -> bytes:
    body = msgpack.packb([offset, [[e.producer_id, e.producer_epoch, [list(b) for b in e.batches]]
                                   for e in entries]])
    return _SNAPSHOT_HEADER.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, crc32c(body)) + body


def decode_snapshot(data: bytes) -> tuple[int, list[ProducerStateEntry]]:
    """Parse a snapshot file; raises ValueError naming what is wrong."""
    if len(data) < _SNAPSHOT_HEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than the {_SNAPSHOT_HEADER.size}-byte header")
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise ValueError(f"larger than {MAX_SNAPSHOT_BYTES} bytes")
    magic, version, crc = _SNAPSHOT_HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION:
        raise ValueError(f"magic {magic!r} version {version}, expected {SNAPSHOT_MAGIC!r} {SNAPSHOT_VERSION}")
    body = data[_SNAPSHOT_HEADER.size:]
    if crc32c(body) != crc:
        raise ValueError("CRC mismatch")
    try:
        offset, raw = msgpack.unpackb(body, use_list=True, strict_map_key=True)
        entries = [ProducerStateEntry(int(pid), int(epoch), [BatchMetadata(*map(int, b)) for b in batches])
                   for pid, epoch, batches in raw]
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise ValueError(f"malformed body: {e}") from None
    if type(offset) is not int or offset < 0:
        raise ValueError(f"malformed offset {offset!r}")
    return offset, entries
