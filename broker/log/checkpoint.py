"""Checkpoint files in Kafka's text format, written atomically.

Format::

    <version>
    <entry count>
    <entry>          one line each: "topic partition offset", or "epoch start_offset"

Writes go to ``<file>.tmp``, are fsynced, renamed over the file and the directory is
fsynced, so a reader sees either the old or the new checkpoint, never a torn one. A file
that does not parse raises CorruptCheckpointError naming the file and the line; callers
treat that as "no checkpoint" and fall back to the safe choice (recover everything).
"""

from __future__ import annotations

import os
from typing import Callable, Generic, Iterable, TypeVar

from tidelog.protocol.errors import StorageError
from tidelog.protocol.topics import TopicPartition

T = TypeVar("T")

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
DAMAGED_HOLE_CHECKPOINT = "damaged-hole-checkpoint"  # in a partition's directory, while there is one


class CorruptCheckpointError(StorageError):
    pass


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename, fsync the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


class CheckpointFile(Generic[T]):
    """One checkpoint file: ``write(entries)`` and ``read() -> entries``."""

    VERSION = 0

    def __init__(self, path: str, format_entry: Callable[[T], str], parse_entry: Callable[[list[str]], T]):
        self.path = path
        self._format = format_entry
        self._parse = parse_entry

    def write(self, entries: Iterable[T]) -> None:
        lines = [self._format(e) for e in entries]
        text = f"{self.VERSION}\n{len(lines)}\n" + "".join(line + "\n" for line in lines)
        atomic_write(self.path, text.encode())

    def read(self) -> list[T]:
        """The entries; [] when the file does not exist. Raises CorruptCheckpointError."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return []
        try:
            lines = raw.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            raise self._corrupt("not UTF-8 text") from None
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) < 2:
            raise self._corrupt("missing the version or count line")
        if lines[0].strip() != str(self.VERSION):
            raise self._corrupt(f"unsupported version {lines[0]!r}")
        try:
            count = int(lines[1])
        except ValueError:
            raise self._corrupt(f"line 2: count {lines[1]!r} is not a number") from None
        if count != len(lines) - 2:
            raise self._corrupt(f"declares {count} entries but holds {len(lines) - 2}")
        out = []
        for n, line in enumerate(lines[2:], start=3):
            try:
                out.append(self._parse(line.split(" ")))
            except (ValueError, IndexError):
                raise self._corrupt(f"line {n}: cannot parse {line!r}") from None
        return out

    def _corrupt(self, why: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(f"checkpoint file {self.path} is corrupt: {why}")


def _format_tp(entry: tuple[TopicPartition, int]) -> str:
    tp, offset = entry
    return f"{tp.topic} {tp.partition} {offset}"


def _parse_tp(fields: list[str]) -> tuple[TopicPartition, int]:
    topic, partition, offset = fields
    p, o = int(partition), int(offset)
    if p < 0 or o < 0 or not topic:
        raise ValueError
    return TopicPartition(topic, p), o


class OffsetCheckpoint:
    """``topic partition offset`` per line: recovery points, high watermarks, log start offsets."""

    def __init__(self, path: str):
        self._file: CheckpointFile[tuple[TopicPartition, int]] = CheckpointFile(path, _format_tp, _parse_tp)

    @property
    def path(self) -> str:
        return self._file.path

    def write(self, offsets: dict[TopicPartition, int]) -> None:
        self._file.write(sorted(offsets.items()))

    def read(self) -> dict[TopicPartition, int]:
        return dict(self._file.read())


def _format_epoch(entry: tuple[int, int]) -> str:
    return f"{entry[0]} {entry[1]}"


def _parse_epoch(fields: list[str]) -> tuple[int, int]:
    epoch, offset = fields
    e, o = int(epoch), int(offset)
    if e < 0 or o < 0:
        raise ValueError
    return e, o


class LeaderEpochCheckpoint:
    """``epoch start_offset`` per line, in increasing order."""

    def __init__(self, path: str):
        self._file: CheckpointFile[tuple[int, int]] = CheckpointFile(path, _format_epoch, _parse_epoch)

    @property
    def path(self) -> str:
        return self._file.path

    def write(self, entries: Iterable[tuple[int, int]]) -> None:
        self._file.write(list(entries))

    def read(self) -> list[tuple[int, int]]:
        entries = self._file.read()
        for (e1, o1), (e2, o2) in zip(entries, entries[1:]):
            if e2 <= e1 or o2 < o1:
                raise self._file._corrupt(f"epochs not increasing: ({e1}, {o1}) then ({e2}, {o2})")
        return entries


def _parse_offset(fields: list[str]) -> int:
    (offset,) = fields
    o = int(offset)
    if o < 0:
        raise ValueError
    return o


class HoleCheckpoint:
    """The first offset of a hole that damage to flushed data left in a partition's log
    (``broker.log.loader``), one ``offset`` line, until the replica is fetched again there;
    no file: no hole. Kept so that a restart meanwhile neither forgets the hole (it would be
    served as if the records had never been) nor takes it for a lost tail."""

    def __init__(self, path: str):
        self._file: CheckpointFile[int] = CheckpointFile(path, str, _parse_offset)

    @property
    def path(self) -> str:
        return self._file.path

    def write(self, offset: int | None) -> None:
        """Record ``offset``; None removes the file (durably: a hole filled since must not
        come back)."""
        if offset is not None:
            self._file.write([offset])
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    def read(self) -> int | None:
        """The offset, or None. Raises CorruptCheckpointError."""
        entries = self._file.read()
        if len(entries) > 1:
            raise self._file._corrupt(f"holds {len(entries)} offsets, not one")
        return entries[0] if entries else None
