"""Swapping cleaned segments into a log's directory, crash-safely.

The log cleaner writes its output as new segments whose files carry the ``.cleaned`` suffix
(``<base>.log.cleaned``, ``<base>.index.cleaned``, ``<base>.timeindex.cleaned``), fsyncs
them, and then replaces the segments it cleaned (the *old* segments, consecutive, never the
active one) with them in these steps (``plan_swap``), Kafka's suffixes in an order that makes
the outcome exact:

1. rename every old segment's files to ``.deleted`` (out of the way, still on disk);
2. rename every new segment's files ``.cleaned`` -> ``.swap``: the new segments in
   descending base offset order and, within one, the indexes before the ``.log``; fsync the
   directory. The swap is *decided* once no ``.cleaned`` file is left, that is once the
   lowest new segment's ``.log`` is renamed;
3. unlink the ``.deleted`` files;
4. rename the ``.swap`` files to their final names (``<base>.log`` ...); fsync the directory.

When all of the old segments' records were removed there are no new segments: an empty
``<base>.log.cleaned`` marker, created first, plays the part of the new files (step 2
unlinks it).

After a crash at any point, the loader (``complete_interrupted_swaps``, before any segment is
opened) rolls the swap back or completes it:

* if a ``.cleaned`` file is left, the swap was not decided: the ``.swap`` and ``.cleaned``
  files are removed and the ``.deleted`` files renamed back: the old segments, whole;
* otherwise the ``.deleted`` files are removed and the ``.swap`` files renamed into place:
  the new segments, whole (they were fsynced before step 1).

Kafka renames the old files only after the decision and, when recovering, infers which
segments a swap replaced from the offsets the new ones hold; that leaves old segments whose
records were all removed in place. Moving them aside first makes a crash end in exactly the
old or exactly the new segments. (Tidelog deletes segments outright otherwise, so a
``.deleted`` file only ever belongs to a swap.)

Steps are data (``FileOp``) so tests can stop after any one of them and reload the log.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Iterable

from tidelog.broker.log.checkpoint import fsync_dir
from tidelog.broker.log.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    filename_prefix,
    parse_base_offset,
)

logger = logging.getLogger("tidelog.log.swap")

SEGMENT_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, LOG_SUFFIX)  # the .log last: it decides


@dataclass(frozen=True, slots=True)
class FileOp:
    kind: str  # "rename" | "unlink" | "create" | "fsync_dir"
    path: str
    target: str | None = None

    def apply(self) -> None:
        if self.kind == "fsync_dir":
            fsync_dir(self.path)
            return
        if self.kind == "create":
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            return
        try:
            if self.kind == "rename":
                os.replace(self.path, self.target)
            else:
                os.unlink(self.path)
        except FileNotFoundError:
            # an index file may never have been written (a segment without index entries)
            if self.path.endswith(LOG_SUFFIX) or self.path.endswith(LOG_SUFFIX + SWAP_SUFFIX):
                raise


def _files(directory: str, base: int, suffix: str) -> list[str]:
    prefix = os.path.join(directory, filename_prefix(base))
    return [prefix + s + suffix for s in SEGMENT_SUFFIXES]


def plan_swap(directory: str, new_bases: Iterable[int], old_bases: Iterable[int]) -> list[FileOp]:
    """The file operations that replace the old segments by the new ``.cleaned`` ones (an
    empty ``new_bases``: the old ones go, with a marker, see the module docstring)."""
    new, old = sorted(new_bases), sorted(old_bases)
    ops = []
    if not new:
        marker = os.path.join(directory, filename_prefix(old[0]) + LOG_SUFFIX + CLEANED_SUFFIX)
        ops.append(FileOp("create", marker))
    ops += [FileOp("rename", p, p + DELETED_SUFFIX) for b in old for p in _files(directory, b, "")]
    ops += [FileOp("rename", p + CLEANED_SUFFIX, p + SWAP_SUFFIX)
            for b in reversed(new) for p in _files(directory, b, "")]
    if not new:
        ops.append(FileOp("unlink", marker))
    ops.append(FileOp("fsync_dir", directory))
    ops += [FileOp("unlink", p + DELETED_SUFFIX) for b in old for p in _files(directory, b, "")]
    ops += [FileOp("rename", p + SWAP_SUFFIX, p) for b in new for p in _files(directory, b, "")]
    ops.append(FileOp("fsync_dir", directory))
    return ops


def apply_ops(ops: Iterable[FileOp]) -> None:
    for op in ops:
        op.apply()


# -- recovery (the loader) -----------------------------------------------------------------------


def _suffixed(names: list[str], suffix: str) -> dict[str, int]:
    out = {}
    for n in names:
        if n.endswith(suffix) and (base := parse_base_offset(n)) is not None:
            out[n] = base
    return out


def complete_interrupted_swaps(directory: str) -> set[int]:
    """Roll back or complete a swap a crash interrupted; returns the base offsets of the
    segments it swapped in. Leaves no ``.cleaned``, ``.swap`` or ``.deleted`` file."""
    names = os.listdir(directory)
    cleaned, swaps = _suffixed(names, CLEANED_SUFFIX), _suffixed(names, SWAP_SUFFIX)
    deleted = _suffixed(names, DELETED_SUFFIX)
    if cleaned:  # not decided: back to the old segments
        for name in [*swaps, *cleaned]:
            _remove(directory, name, "part of a swap of cleaned segments that did not complete")
        for name in deleted:
            os.replace(os.path.join(directory, name), os.path.join(directory, name[:-len(DELETED_SUFFIX)]))
            logger.warning("%s: restored %s: the swap that replaced it did not complete", directory, name)
        if deleted:
            fsync_dir(directory)
        return set()
    for name in deleted:
        _remove(directory, name, "segment replaced by a swap of cleaned segments")
    for name in swaps:
        os.replace(os.path.join(directory, name), os.path.join(directory, name[:-len(SWAP_SUFFIX)]))
    logs = {b for n, b in swaps.items() if n.endswith(LOG_SUFFIX + SWAP_SUFFIX)}
    if swaps or deleted:
        logger.warning("%s: completed the swap of cleaned segment(s) %s interrupted by a crash",
                       directory, sorted(logs))
        fsync_dir(directory)
    return logs


def _remove(directory: str, name: str, why: str) -> None:
    logger.info("%s: removing %s: %s", directory, name, why)
    try:
        os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        pass
