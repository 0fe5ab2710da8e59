"""Where a partition's files may be: the log layer's own check, whatever its callers checked.

A partition's directory is ``<log dir>/<topic>-<partition>``, and the log layer creates,
renames and deletes nothing else (defence in depth: every API that carries a topic name
validates it first, see protocol/topics.py). ``partition_dir`` refuses a topic-partition whose
name is not a valid Kafka topic name (so no separator, NUL, ``..``, absolute path or name too
long for a file) or whose partition is not a non-negative int32, and a path that does not
*resolve* to a direct child of the log dir (a symlink planted in the log dir that points
elsewhere). ``check_partition_dir`` is the same check for a directory already in use.
"""

from __future__ import annotations

import os
import uuid

from tidelog.protocol.errors import INVALID_TOPIC_EXCEPTION, TidelogError
from tidelog.protocol.topics import TopicPartition, partition_problem, topic_name_problem

MAX_FILE_NAME = 255  # NAME_MAX of the file systems a broker runs on


class LogPathError(TidelogError, ValueError):
    """A path the log layer refuses to create, rename or delete."""

    error = INVALID_TOPIC_EXCEPTION


def partition_dir(log_dir: str, tp: TopicPartition) -> str:
    """The directory of ``tp`` in ``log_dir``; LogPathError if ``tp`` is not a valid
    topic-partition or the directory would not resolve inside ``log_dir``."""
    path = os.path.join(log_dir, dir_name(tp))
    check_inside(log_dir, path)
    return path


def dir_name(tp: TopicPartition) -> str:
    """``<topic>-<partition>``; LogPathError if ``tp`` is not a valid topic-partition or the
    name is longer than a file name may be (a 249-character topic leaves room for partition
    numbers up to 99,999)."""
    problem = topic_name_problem(tp.topic) or partition_problem(tp.partition)
    if problem is None and len(tp.dir_name) > MAX_FILE_NAME:
        problem = f"the directory name would be {len(tp.dir_name)} characters, more than {MAX_FILE_NAME}"
    if problem is not None:
        raise LogPathError(f"refusing a log directory for topic {str(tp.topic)[:300]!r} partition "
                           f"{tp.partition!r}: {problem}")
    return tp.dir_name


def delete_dir_name(tp: TopicPartition, suffix: str) -> str:
    """The name a partition directory is renamed to before it is deleted:
    ``<topic>-<partition>.<unique id><suffix>``, the topic cut short so that the name fits in
    a file name (as Kafka's ``logDeleteDirName``); startup removes any ``<suffix>`` directory."""
    tail = f"-{tp.partition}.{uuid.uuid4().hex}{suffix}"
    return tp.topic[:MAX_FILE_NAME - len(tail)] + tail


def check_inside(log_dir: str, path: str) -> None:
    """LogPathError unless ``path`` resolves (symlinks and all) to a direct child of
    ``log_dir``."""
    root = os.path.realpath(log_dir)
    real = os.path.realpath(path)
    if os.path.dirname(real) != root or os.path.basename(real) in ("", ".", ".."):
        raise LogPathError(f"refusing {path!r}: it resolves to {real!r}, not to an entry of the log "
                           f"directory {root!r}")


def check_partition_dir(directory: str, tp: TopicPartition) -> None:
    """LogPathError unless ``directory`` is ``tp``'s directory (valid name, named for ``tp``)
    inside the directory that holds it, resolved: what a log checks before it deletes its
    files."""
    if os.path.basename(os.path.normpath(directory)) != dir_name(tp):
        raise LogPathError(f"refusing {directory!r}: it is not the directory of {tp}")
    check_inside(os.path.dirname(os.path.abspath(directory)), directory)
