"""The log manager: every partition log of a broker, across its log directories.

Per log directory it owns ``meta.properties`` (broker id, cluster id, version), three
checkpoint files (recovery points, high watermarks, log start offsets, one line per
partition), the log cleaner's ``cleaner-offset-checkpoint`` (first dirty offset of each
compacted partition, read and written for ``broker.log.cleaner``) and the clean-shutdown
marker ``.tidelog_cleanshutdown``.

Each log dir is locked before anything in it is read: an exclusive ``flock`` on ``<dir>/.lock``
(created if missing, never removed), held from ``startup`` to ``shutdown``, as Kafka's
lockLogDirs. A second broker started on a dir in use (the same config started twice, or two
configs naming one dir) would recover the running broker's active segments under its appends,
finish or undo its cleaner's swaps and write checkpoints and the clean-shutdown marker into
the live dir; the lock refuses it (LogDirInUse) before it reads, writes or recovers anything in
any of its dirs. ``flock`` locks belong to an open file description, so a second manager in the
same process is refused as well. A manager that did not start writes nothing at ``shutdown``.

Startup loads every ``<topic>-<partition>`` directory. The marker is removed as soon as
the logs are loaded, so any later crash counts as unclean; ``shutdown`` flushes every log,
writes the checkpoints and only then writes the marker. Directories renamed for deletion
(``<topic>-<partition>.<id>-delete``) are removed at startup.

The manager creates, renames and deletes only partition directories that resolve inside its
log dirs and are named for a valid topic-partition (``broker.log.paths``): a topic name with
``..``, a separator, NUL or too many characters, or a directory that is a symlink to somewhere
else, is refused (LogPathError) or, at startup, left alone with a warning.

Retention (``cleanup_logs``), time-based flushing (``flush_dirty_logs``), producer id
expiration (``remove_expired_producers``) and checkpointing are methods for a periodic
caller; the manager keeps no threads or timers of its own.

A log directory fails when an operation on it meets an OSError (disk full, an I/O error, out
of descriptors), a log's or the manager's own (a checkpoint), as Kafka's LogDirFailureChannel
takes any IOException there. The failure is noted (``dir_failed``, from whichever thread met
it) and ``on_dir_failure_found`` wakes the owner, which takes the directory offline
(``take_dir_offline``): its logs are dropped with their descriptors closed and nothing
written, each of its partitions is *offline* here until the broker restarts (no log of it is
created in another directory: ``get_or_create_log`` refuses it), no new partition is placed
in it, and no checkpoint or clean-shutdown marker is written to it any more (its logs are
recovered at the next start). The periodic methods go on with the other directories.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import threading
from typing import Callable, Iterable

from tidelog.broker.log.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_CHECKPOINT,
    CorruptCheckpointError,
    OffsetCheckpoint,
    atomic_write,
    fsync_dir,
)
from tidelog.broker.log.cleaner import CLEANER_OFFSET_CHECKPOINT
from tidelog.broker.log.config import LogConfig
from tidelog.broker.log.loader import load_log
from tidelog.broker.log.log import Clock, Log, LogDirFailure, RolledFlush, dir_failure, wall_clock_ms
from tidelog.broker.log.paths import LogPathError, check_inside, check_partition_dir, delete_dir_name, partition_dir
from tidelog.protocol.errors import StorageError
from tidelog.protocol.topics import TopicPartition

logger = logging.getLogger("tidelog.log.manager")

CLEAN_SHUTDOWN_MARKER = ".tidelog_cleanshutdown"
LOCK_FILE = ".lock"
META_PROPERTIES = "meta.properties"
DELETE_DIR_SUFFIX = "-delete"


class LogDirInUse(StorageError):
    """Another broker (another process, or another manager in this one) holds a log dir's lock."""

    def __init__(self, log_dir: str):
        super().__init__(f"Failed to acquire lock on file {LOCK_FILE} in {log_dir}. A Tidelog broker in "
                         f"another process or thread is using this directory.")
        self.log_dir = log_dir


def lock_log_dir(d: str) -> int:
    """Lock log dir ``d``: an exclusive, non-blocking ``flock`` on ``<d>/.lock``, held while the
    returned descriptor is open. LogDirInUse when another holds it; any other OSError is the
    dir failing."""
    fd = os.open(os.path.join(d, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise LogDirInUse(d) from None
        raise
    return fd


class LogManager:
    def __init__(self, log_dirs: Iterable[str], default_config: LogConfig | None = None, *,
                 broker_id: int = 0, cluster_id: str | None = None, clock: Clock = wall_clock_ms,
                 producer_id_expiration_ms: int = 86_400_000):
        self.log_dirs = [os.path.abspath(d) for d in log_dirs]
        if not self.log_dirs:
            raise ValueError("at least one log directory is required")
        self.default_config = default_config or LogConfig()
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self._clock = clock
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._logs: dict[TopicPartition, Log] = {}
        self._rolled: dict[TopicPartition, Log] = {}  # rolled since their closed segments' last fsync
        self._dir_of: dict[TopicPartition, str] = {}
        self._cleaned: dict[TopicPartition, int] = {}  # cleaner checkpoints of the dir being loaded
        self.had_clean_shutdown: dict[str, bool] = {}
        self._dir_locks: dict[str, int] = {}  # log dir -> the descriptor holding its lock
        self._started = False  # loaded, and not shut down: only then is anything written at shutdown
        self.offline_dirs: dict[str, str] = {}  # log dir -> the failure that took it offline
        # partitions of offline dirs -> their dir (None: not known, a dir failed while loading)
        self._offline: dict[TopicPartition, str | None] = {}
        self._failures: dict[str, str] = {}  # dirs found failing, not yet taken offline
        self._failures_lock = threading.Lock()  # a worker thread's read may find a failure
        # called when a failure is found (from the thread that found it): the owner takes the
        # directory offline
        self.on_dir_failure_found: Callable[[], None] | None = None

    # -- startup and shutdown --------------------------------------------------------------------

    def startup(self, topic_configs: dict[str, LogConfig] | None = None) -> None:
        """Load every log; ``topic_configs`` overrides the default config per topic.

        A log dir that fails while it is created or loaded (an OSError) is offline from the
        start and the others are loaded, as Kafka's loadLogs does: the partitions it holds are
        not known, so a LeaderAndIsr for a partition that has no log here and is not new is
        refused while any dir is offline (``get_or_create_log``). StorageError when every dir
        failed, or for what is no failure of a disk (another broker's or cluster's dir, a
        partition in two dirs); LogDirInUse, before anything is read, when another broker
        holds a dir's lock. A startup that raises closes what it opened and lets its locks go;
        ``shutdown`` then writes nothing (no checkpoint, no marker)."""
        topic_configs = topic_configs or {}
        self._lock_log_dirs()
        try:
            for d in self.live_log_dirs:
                try:
                    self._load_log_dir(d, topic_configs)
                except (OSError, LogDirFailure) as e:
                    failure = e if isinstance(e, LogDirFailure) else dir_failure(d, e, "loading its logs")
                    self.take_dir_offline(d, str(failure))
            if not self.live_log_dirs:
                raise StorageError("every log dir failed while loading: " + "; ".join(self.offline_dirs.values()))
        except BaseException:
            self.abandon()
            raise
        self._started = True
        logger.info("loaded %d logs from %s", len(self._logs), ", ".join(self.live_log_dirs))

    def _lock_log_dirs(self) -> None:
        """Create and lock every log dir, as Kafka's lockLogDirs: a dir that fails to (an
        OSError) is offline from the start; one another broker holds refuses the start, the
        locks taken so far let go."""
        for d in self.log_dirs:
            what = "creating it"
            try:
                os.makedirs(d, exist_ok=True)
                what = f"locking its {LOCK_FILE}"
                self._dir_locks[d] = lock_log_dir(d)
            except LogDirInUse:
                self._release_dir_locks()
                raise
            except OSError as e:
                self.take_dir_offline(d, str(dir_failure(d, e, what)))

    def _release_dir_locks(self) -> None:
        for d in list(self._dir_locks):
            self._release_dir_lock(d)

    def _release_dir_lock(self, d: str) -> None:
        fd = self._dir_locks.pop(d, None)
        if fd is not None:
            try:
                os.close(fd)  # the lock goes with the descriptor
            except OSError as e:
                logger.warning("closing the lock of log dir %s: %s", d, e)

    def _load_log_dir(self, d: str, topic_configs: dict[str, LogConfig]) -> None:
        self._check_meta(d)
        marker = os.path.join(d, CLEAN_SHUTDOWN_MARKER)
        clean = os.path.exists(marker)
        self.had_clean_shutdown[d] = clean
        recovery, hws, starts = (self._read_checkpoint(d, name) for name in
                                 (RECOVERY_POINT_CHECKPOINT, REPLICATION_CHECKPOINT,
                                  LOG_START_OFFSET_CHECKPOINT))
        self._cleaned = self._read_checkpoint(d, CLEANER_OFFSET_CHECKPOINT)
        for name in sorted(os.listdir(d)):
            self._load_dir(d, name, clean, recovery, hws, starts, topic_configs)
        if clean:
            os.unlink(marker)
            fsync_dir(d)

    def _load_dir(self, d: str, name: str, clean: bool, recovery, hws, starts, topic_configs) -> None:
        path = os.path.join(d, name)
        if not os.path.isdir(path):
            return
        try:
            check_inside(d, path)
        except LogPathError as e:
            logger.warning("ignoring %s: %s", path, e)
            return
        if name.endswith(DELETE_DIR_SUFFIX):
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            tp = TopicPartition.parse_dir_name(name)
        except ValueError:
            logger.warning("ignoring directory %s: not a <topic>-<partition> name", path)
            return
        if tp in self._logs:
            raise StorageError(f"partition {tp} found in two log directories: {self._dir_of[tp]} and {d}")
        config = topic_configs.get(tp.topic, self.default_config)
        # With no recovery-point checkpoint (missing or corrupt) everything is re-validated.
        try:
            log = load_log(path, tp, config, recovery_point=recovery.get(tp, 0),
                           log_start_offset=starts.get(tp, 0), high_watermark=hws.get(tp, 0),
                           had_clean_shutdown=clean and tp in recovery, clock=self._clock,
                           cleaned_offset=self._cleaned.get(tp, 0))
        except (OSError, LogDirFailure):
            self._offline[tp] = d  # its log is there, out of reach: the dir goes offline (startup)
            raise
        self._register(tp, log, d)

    def _read_checkpoint(self, d: str, name: str) -> dict[TopicPartition, int]:
        try:
            return OffsetCheckpoint(os.path.join(d, name)).read()
        except CorruptCheckpointError as e:
            logger.warning("%s; treating it as absent", e)
            return {}

    def join_cluster(self, cluster_id: str) -> None:
        """Record the cluster id learnt from ZooKeeper: every log dir's meta.properties must
        name it (or gets it written), so a data directory cannot move between clusters."""
        self.cluster_id = cluster_id
        for d in self.live_log_dirs:
            try:
                self._check_meta(d)
            except OSError as e:
                self.dir_failed(dir_failure(d, e, "writing its meta.properties"))

    def _check_meta(self, d: str) -> None:
        path = os.path.join(d, META_PROPERTIES)
        props = _read_properties(path)
        if props is None:
            self._write_meta(path)
            return
        stored = props.get("broker.id")
        if stored is not None and stored != str(self.broker_id):
            raise StorageError(f"{path} belongs to broker.id {stored}, but this broker is {self.broker_id}")
        stored_cluster = props.get("cluster.id")
        if self.cluster_id and stored_cluster and stored_cluster != self.cluster_id:
            raise StorageError(f"{path} belongs to cluster {stored_cluster}, not {self.cluster_id}")
        if self.cluster_id and not stored_cluster:
            self._write_meta(path)

    def _write_meta(self, path: str) -> None:
        lines = ["version=1", f"broker.id={self.broker_id}"]
        if self.cluster_id:
            lines.append(f"cluster.id={self.cluster_id}")
        atomic_write(path, ("\n".join(lines) + "\n").encode())

    def shutdown(self) -> None:
        """Flush every log, write the checkpoints, close the logs, then write the marker, and
        let the dirs' locks go; a log dir that fails on the way (or failed before) gets no
        marker: its logs are recovered at the next start. A manager that did not start (or
        has shut down already) writes nothing: the dirs may be another broker's."""
        if not self._started:
            self.abandon()
            return
        self._started = False
        for log in self.logs.values():
            _attempt(log.flush)
        self._take_failed_dirs_offline()
        self.checkpoint_all()
        for log in self.logs.values():
            _attempt(log.close)
        self._take_failed_dirs_offline()
        for d in self.live_log_dirs:
            try:
                atomic_write(os.path.join(d, CLEAN_SHUTDOWN_MARKER), b"")
            except OSError as e:
                logger.error("%s", dir_failure(d, e, "writing the clean-shutdown marker"))
        self._logs.clear()
        self._dir_of.clear()
        self._release_dir_locks()
        logger.info("log manager shut down%s", f"; log dirs offline: {sorted(self.offline_dirs)}"
                    if self.offline_dirs else " cleanly")

    def abandon(self) -> None:
        """Close every descriptor, the logs' and the dirs' locks, writing nothing: what a
        killed process leaves (its logs are recovered at the next start). For a startup that
        failed, and for a crash modelled in one process."""
        self._started = False
        for log in self._logs.values():
            log.close_handlers()
        self._logs.clear()
        self._dir_of.clear()
        self._release_dir_locks()

    def _take_failed_dirs_offline(self) -> None:
        for d, reason in self.pending_dir_failures().items():
            self.take_dir_offline(d, reason)

    # -- logs ----------------------------------------------------------------------------------

    def get_log(self, tp: TopicPartition) -> Log | None:
        return self._logs.get(tp)

    @property
    def logs(self) -> dict[TopicPartition, Log]:
        return dict(self._logs)

    def get_or_create_log(self, tp: TopicPartition, config: LogConfig | None = None, *,
                          is_new: bool = True) -> Log:
        """``tp``'s log, created in the log dir with the fewest partitions if there is none.
        StorageError for a partition of an offline log dir (its log is there, out of reach),
        and LogDirFailure when the creation fails (that partition is offline too).

        A replica that is not new (``is_new``, LeaderAndIsr's flag) and has no log here while
        a dir is offline may have its log in that dir: it is offline too (StorageError), for
        an empty log created elsewhere would be taken for a replica that lost its records
        (Kafka's getOrCreateLog)."""
        log = self._logs.get(tp)
        if log is not None:
            return log
        if not self._started:  # its dirs are not locked: they may be another broker's
            raise StorageError(f"{tp}: the log manager is not running")
        if tp not in self._offline and not is_new and self.offline_dirs:
            self._offline[tp] = None
        if tp in self._offline:
            raise StorageError(f"{tp}: {self.offline_reason(tp)}")
        d = self._next_log_dir()
        try:
            log = load_log(partition_dir(d, tp), tp, config or self.default_config, clock=self._clock)
        except (OSError, LogDirFailure) as e:
            failure = e if isinstance(e, LogDirFailure) else dir_failure(d, e, f"creating the log of {tp}")
            self._offline[tp] = d
            self.dir_failed(failure)
            raise failure from e
        self._register(tp, log, d)
        return log

    def _register(self, tp: TopicPartition, log: Log, d: str) -> None:
        self._logs[tp] = log
        self._dir_of[tp] = d
        log.on_truncation = self._truncated
        log.on_roll = self.note_rolled
        log.on_dir_failure = self.dir_failed

    def _truncated(self, log: Log, offset: int) -> None:
        """A truncation cut ``log`` at ``offset``: the directory's recovery points are written
        at once, and its cleaner checkpoint lowered to ``offset`` if above, as Kafka's
        truncateTo (maybeTruncateCheckpoint) does, whatever the cleaner's state of the log (in
        progress, uncleanable): see ``Log._note_truncation``."""
        tp = log.topic_partition
        d = self._dir_of.get(tp)
        if d is None or self._logs.get(tp) is not log:
            return
        self._checkpoint_dir(d, RECOVERY_POINT_CHECKPOINT, lambda log: log.recovery_point)
        log.delete_snapshots_after_recovery_point_checkpoint()
        if self._cleaner_checkpoints_of(d).get(tp, offset) > offset:
            self.update_cleaner_checkpoint(tp, offset)

    def _next_log_dir(self) -> str:
        live = self.live_log_dirs
        if not live:
            raise StorageError(f"every log dir is offline: {', '.join(self.log_dirs)}")
        counts = {d: 0 for d in live}
        for d in self._dir_of.values():
            if d in counts:
                counts[d] += 1
        return min(live, key=lambda d: counts[d])

    # -- log directory failure (see the module docstring) --------------------------------------

    @property
    def live_log_dirs(self) -> list[str]:
        return [d for d in self.log_dirs if d not in self.offline_dirs]

    def is_offline(self, tp: TopicPartition) -> bool:
        """Whether ``tp``'s replica here is in an offline log dir."""
        return tp in self._offline

    def offline_reason(self, tp: TopicPartition) -> str:
        d = self._offline.get(tp)
        if d is None:
            return (f"it has no log in the log dirs online, and may have one in those offline: "
                    f"{', '.join(sorted(self.offline_dirs))}")
        return f"its log dir {d} failed ({self.offline_dirs.get(d, 'being taken offline')})"

    def dir_failed(self, failure: LogDirFailure) -> None:
        """Note that ``failure.log_dir`` failed, for the owner to take it offline; any thread."""
        with self._failures_lock:
            d = failure.log_dir
            if d in self.offline_dirs or d in self._failures:
                return
            self._failures[d] = str(failure)
        if self.on_dir_failure_found is not None:
            self.on_dir_failure_found()

    def pending_dir_failures(self) -> dict[str, str]:
        """The dirs found failing since the last call, with what failed: to take offline."""
        with self._failures_lock:
            found, self._failures = self._failures, {}
        return found

    def take_dir_offline(self, d: str, reason: str) -> list[TopicPartition]:
        """Take log dir ``d`` offline until the broker restarts (Kafka's handleLogDirFailure):
        its logs are dropped, their descriptors closed and nothing written. Returns its
        partitions (those whose log could not be created in it included); none if it was
        offline already."""
        if d not in self.log_dirs or d in self.offline_dirs:
            return []
        self.offline_dirs[d] = reason
        self._release_dir_lock(d)  # nothing here is touched again: no descriptor keeps the disk
        gone = [tp for tp, where in self._offline.items() if where == d]  # their creation failed
        for tp in sorted(tp for tp, where in self._dir_of.items() if where == d):
            log = self._logs.pop(tp)
            del self._dir_of[tp]
            log.close_handlers()
            self._offline[tp] = d
            gone.append(tp)
        logger.error("%s; the dir is offline, and its %d partition(s) on broker %d until it restarts "
                     "(log dirs still online: %s)", reason, len(gone), self.broker_id,
                     ", ".join(self.live_log_dirs) or "none")
        return gone

    def delete_log(self, tp: TopicPartition) -> str | None:
        """Remove a partition's log and its files now (``delete_logs``, then the files).
        Returns the directory it was renamed to, gone by then (None if there was no log)."""
        doomed = self.delete_logs([tp])
        remove_deleted_dirs(doomed)
        return doomed[0] if doomed else None

    def delete_logs(self, tps: Iterable[TopicPartition]) -> list[str]:
        """Remove the logs of ``tps`` (those this broker has): each directory is renamed to
        ``<topic>-<partition>.<id>-delete`` at once, so a log created again under the name
        never meets the old files; then each log directory is fsynced and every checkpoint
        written once for them all. Returns the renamed directories: removing their files
        (``remove_deleted_dirs``, any thread; startup removes any left) is the caller's, to
        do off the event loop. A partition whose directory is not its own (LogPathError)
        raises before anything of it is touched; those renamed before it are accounted."""
        doomed: list[str] = []
        dirs: set[str] = set()
        try:
            for tp in tps:
                path = self._rename_away(tp)
                if path is not None:
                    doomed.append(path)
                    dirs.add(os.path.dirname(path))
        finally:
            if doomed:
                for d in sorted(dirs):
                    fsync_dir(d)
                self.checkpoint_all()
                for d in sorted(dirs):  # a topic created again under the name starts dirty
                    self._drop_cleaner_checkpoints(d)
        return doomed

    def _rename_away(self, tp: TopicPartition) -> str | None:
        log = self._logs.get(tp)
        if log is None:
            return None
        d = self._dir_of[tp]
        check_partition_dir(log.directory, tp)
        check_inside(d, log.directory)
        doomed = os.path.join(d, delete_dir_name(tp, DELETE_DIR_SUFFIX))
        check_inside(d, doomed)
        del self._logs[tp], self._dir_of[tp]
        log.close()
        os.replace(log.directory, doomed)
        return doomed

    def _drop_cleaner_checkpoints(self, d: str) -> None:
        """Drop the entries of partitions no longer in ``d`` from its cleaner checkpoint."""
        offsets = self._read_checkpoint(d, CLEANER_OFFSET_CHECKPOINT)
        kept = {tp: o for tp, o in offsets.items() if self._dir_of.get(tp) == d}
        if kept != offsets:
            OffsetCheckpoint(os.path.join(d, CLEANER_OFFSET_CHECKPOINT)).write(kept)

    def update_config(self, tp: TopicPartition, config: LogConfig) -> None:
        log = self._logs[tp]
        log.config = config
        for seg in log.segments:
            seg.config = config

    # -- periodic work -------------------------------------------------------------------------

    def cleanup_logs(self) -> int:
        """Apply retention to every log; returns the number of segments deleted."""
        deleted = 0
        for log in self.logs.values():
            deleted += len(_attempt(log.delete_old_segments) or ())
        if deleted:
            self.checkpoint_log_start_offsets()
        return deleted

    def remove_expired_producers(self) -> int:
        """Forget idle idempotent producers in every log (``producer.id.expiration.ms``);
        returns how many. In a compacted log the cleaner checkpoint moves back to the first
        record the cleaner kept only as such a producer's last one, so the next cleaning may
        remove it if a later record of its key supersedes it."""
        forgotten = 0
        for tp, log in self.logs.items():
            gone = log.remove_expired_producers(self.producer_id_expiration_ms)
            forgotten += len(gone)
            # (a producer's last record may lie below the log start: nothing to reconsider there)
            kept = [e.last_offset for e in gone if e.last_offset >= log.log_start_offset]
            if not kept or not log.config.compacts:
                continue
            first = min(kept)
            current = _attempt(self.cleaner_checkpoint, tp)  # None: none, or its dir failed
            if current is not None and current > first:
                _attempt(self.update_cleaner_checkpoint, tp, first)
        return forgotten

    def note_rolled(self, log: Log) -> None:
        """``log`` closed a segment: ``rolled_flushes`` has it made durable."""
        self._rolled[log.topic_partition] = log

    def rolled_flushes(self) -> list[RolledFlush]:
        """The fsyncs of every segment closed by a roll since the last ones, for a worker
        thread (``RolledFlush.run``, then ``Log.flushed`` here): as Kafka schedules a flush at
        each roll whatever ``log.flush.*`` say, so that the recovery point follows the rolls
        and a crash re-reads only active segments."""
        rolled, self._rolled = self._rolled, {}
        return [f for tp, log in rolled.items()
                if self._logs.get(tp) is log and (f := log.rolled_flush()) is not None]

    def flush_dirty_logs(self) -> None:
        """fsync segments closed by rolls, and whole logs whose last flush is older than flush.ms."""
        now = self._clock()
        for log in self.logs.values():
            if now - log.last_flush_ms >= log.config.flush_ms:
                _attempt(log.flush)
            else:
                _attempt(log.flush_rolled_segments)

    def checkpoint_all(self) -> None:
        self.checkpoint_recovery_points()
        self.checkpoint_high_watermarks()
        self.checkpoint_log_start_offsets()

    def checkpoint_recovery_points(self) -> None:
        """Write the recovery points; then the producer state snapshots no recovery or likely
        truncation needs go (``Log.delete_snapshots_after_recovery_point_checkpoint``)."""
        self._checkpoint(RECOVERY_POINT_CHECKPOINT, lambda log: log.recovery_point)
        for log in self.logs.values():
            _attempt(log.delete_snapshots_after_recovery_point_checkpoint)

    def checkpoint_high_watermarks(self) -> None:
        self._checkpoint(REPLICATION_CHECKPOINT, lambda log: log.high_watermark)

    def checkpoint_log_start_offsets(self) -> None:
        self._checkpoint(LOG_START_OFFSET_CHECKPOINT, lambda log: log.log_start_offset)

    def cleaner_checkpoints(self) -> dict[TopicPartition, int]:
        """The log cleaner's first dirty offset of every partition that has one. Raises
        LogDirFailure (noted: ``dir_failed``) when a dir's checkpoint cannot be read."""
        out: dict[TopicPartition, int] = {}
        for d in self.live_log_dirs:
            out.update(self._cleaner_checkpoints_of(d))
        return out

    def cleaner_checkpoint(self, tp: TopicPartition) -> int | None:
        """``tp``'s first dirty offset, from its own dir's checkpoint only (another dir
        failing does not hide it); LogDirFailure as ``cleaner_checkpoints``."""
        return self._cleaner_checkpoints_of(self._dir_of[tp]).get(tp)

    def _cleaner_checkpoints_of(self, d: str) -> dict[TopicPartition, int]:
        try:
            offsets = self._read_checkpoint(d, CLEANER_OFFSET_CHECKPOINT)
        except OSError as e:
            failure = dir_failure(d, e, f"reading {CLEANER_OFFSET_CHECKPOINT}")
            self.dir_failed(failure)
            raise failure from e
        return {tp: o for tp, o in offsets.items() if self._dir_of.get(tp) == d}

    def update_cleaner_checkpoint(self, tp: TopicPartition, offset: int) -> None:
        """Record ``tp``'s first dirty offset (entries of partitions no longer here are dropped)."""
        d = self._dir_of[tp]
        try:
            offsets = {t: o for t, o in self._read_checkpoint(d, CLEANER_OFFSET_CHECKPOINT).items()
                       if self._dir_of.get(t) == d}
            offsets[tp] = offset
            OffsetCheckpoint(os.path.join(d, CLEANER_OFFSET_CHECKPOINT)).write(offsets)
        except OSError as e:
            failure = dir_failure(d, e, f"writing {CLEANER_OFFSET_CHECKPOINT}")
            self.dir_failed(failure)
            raise failure from e

    def _checkpoint(self, name: str, offset_of) -> None:
        """Write checkpoint ``name`` in every live log dir; one that fails is noted, the others written."""
        for d in self.live_log_dirs:
            try:
                self._checkpoint_dir(d, name, offset_of)
            except OSError as e:
                self.dir_failed(dir_failure(d, e, f"writing {name}"))

    def _checkpoint_dir(self, d: str, name: str, offset_of) -> None:
        offsets = {tp: offset_of(log) for tp, log in self._logs.items() if self._dir_of[tp] == d}
        OffsetCheckpoint(os.path.join(d, name)).write(offsets)


def remove_deleted_dirs(paths: Iterable[str]) -> None:
    """Remove directories ``delete_logs`` renamed away, one after another (blocking: a
    worker thread's). What fails to go is left for the next startup to remove."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _attempt(operation, *args):
    """``operation(*args)``, or None when its log dir failed: noted already (``dir_failed``),
    and the caller goes on with the other logs."""
    try:
        return operation(*args)
    except LogDirFailure:
        return None


def _read_properties(path: str) -> dict[str, str] | None:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise StorageError(f"{path} is not a text properties file") from None
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise StorageError(f"{path}: cannot parse line {line!r}")
        props[key.strip()] = value.strip()
    return props
