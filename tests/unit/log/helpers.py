"""Shared helpers for the storage-engine tests: making batches, opening logs, reading them back."""

from __future__ import annotations

import errno
import itertools
import os

from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.loader import load_log
from tidelog.broker.log.log import Log
from tidelog.broker.log.segment import LogSegment
from tidelog.protocol.records import (
    CRC_START,
    BatchBuilder,
    BatchRecord,
    Codec,
    iter_all_records,
    iter_headers,
    validate_batches,
)
from tidelog.protocol.topics import TopicPartition

TP = TopicPartition("events", 0)

_serial = itertools.count()


class FakeClock:
    """A millisecond clock the test moves by hand: ``load_log(..., clock=clock)``."""

    def __init__(self, now_ms: int = 1_700_000_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> int:
        self.now_ms += ms
        return self.now_ms


def make_batch(n_records: int = 1, size: int = 10, ts: int | list[int] = 1000, *,
               codec: int = Codec.NONE, values: list[bytes] | None = None,
               key: bytes | None = None) -> bytes:
    """One producer batch (base offset 0, epoch -1) of ``n_records`` records.

    Values are unique (a process-wide serial number padded to ``size`` bytes) unless given;
    ``ts`` is one timestamp for every record or one per record.
    """
    if values is None:
        values = [f"v{next(_serial)}:".encode().ljust(size, b".") for _ in range(n_records)]
    stamps = ts if isinstance(ts, list) else [ts] * len(values)
    b = BatchBuilder(codec)
    for t, v in zip(stamps, values):
        b.append(t, key, v)
    return b.build()


def open_log(path, config: LogConfig | None = None, **kw) -> Log:
    """``load_log`` of the partition directory ``path`` (a str or a pathlib.Path)."""
    return load_log(str(path), TP, config or LogConfig(), **kw)


def read_batches(log: Log, start: int | None = None, max_offset: int | None = None) -> bytes:
    """Every stored batch from ``start`` (default: the log start) up to the LEO, one read at a
    time, checking each read is whole valid batches that continue where the last one ended."""
    offset = log.log_start_offset if start is None else start
    out = bytearray()
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20, max_offset=max_offset)
        if not data:
            break
        batches = validate_batches(data)
        assert batches[0][1].last_offset >= offset
        out += data
        offset = batches[-1][1].next_offset
    return bytes(out)


def read_records(log: Log, start: int | None = None, max_offset: int | None = None) -> list[BatchRecord]:
    return list(iter_all_records(read_batches(log, start, max_offset)))


def headers_of(data: bytes):
    return [h for _, h in iter_headers(data)]


def segment_file_sizes(directory) -> dict[str, int]:
    """name -> size of every file in a partition directory."""
    d = str(directory)
    return {n: os.path.getsize(os.path.join(d, n)) for n in sorted(os.listdir(d))}


def checksummed_part(batch: bytes) -> bytes:
    """The bytes a leader never patches: everything from ``attributes`` on."""
    return batch[CRC_START:]


def merge_first_two(log: Log) -> None:
    """What the cleaner does with nothing to clean: the first two segments rewritten as one,
    swapped in (``Log.replace_segments``)."""
    old = log.segments[:2]
    new = LogSegment.create_cleaned(log.directory, old[0].base_offset, log.config, 0)
    for seg in old:
        data = seg.read_all()
        new.append(data, list(iter_headers(data)))
    new.on_become_inactive()
    new.flush()
    log.replace_segments([new], old)


class FailingDir:
    """``os.<call>`` raising ``code`` (ENOSPC: a full disk) for the files of one directory,
    given by descriptor (``pwrite``, ``pread``, ``fsync``) or by path (``open``), as a disk
    that fails under it; ``calls`` counts the refused calls. Installed with ``monkeypatch``
    (the ``os`` module's own function: every caller sees it, as every caller sees a disk)."""

    def __init__(self, monkeypatch, directory, call: str = "pwrite", code: int = errno.ENOSPC):
        self.prefix = os.path.realpath(directory) + os.sep
        self.code = code
        self.calls = 0
        real = getattr(os, call)

        def failing(target, *args, **kwargs):
            if self._inside(target):
                self.calls += 1
                raise OSError(code, os.strerror(code))
            return real(target, *args, **kwargs)

        monkeypatch.setattr(os, call, failing)

    def _inside(self, target) -> bool:
        try:
            path = os.readlink(f"/proc/self/fd/{target}") if isinstance(target, int) else os.path.realpath(target)
        except OSError:
            return False
        return path.startswith(self.prefix)
