"""One member of a consumer group in a process of its own, for the group fault scenarios
(``test_group_faults``): an at-least-once application that records everything the oracle
needs to check I12 and I13.

    python -m tests.system.group_worker BOOTSTRAP GROUP TOPIC EVENTS_FILE [consumer options as JSON]

It subscribes to TOPIC in GROUP (auto commit off) and loops: ``poll``, record the batch,
"process" it (``process_s``), then commit synchronously the offsets after the records it
processed (at-least-once: the commit comes after the processing). Every event is one JSON line
appended to EVENTS_FILE and flushed before the worker goes on, each with its wall-clock time
``t`` (one clock for every process of the machine):

* ``{"e": "started", "pid"}``;
* ``{"e": "assigned", "tps": [p, ...], "generation": [id, member] | null,
  "committed": {"p": offset | null}}``: from ``on_partitions_assigned``, with the group's
  committed offsets of those partitions as the coordinator answers them then (``null`` when it
  could not be asked: ``committed_error`` says why); ``revoked`` / ``lost`` with ``tps``;
* ``{"e": "records", "p", "offsets": [...], "values": [...]}``: a batch of one partition, as
  received (values are the harness's ASCII ``b"<partition>:<seq>"``);
* ``{"e": "holding", "generation", "offsets"}``: the control file ``EVENTS_FILE.hold`` exists,
  so the worker stops between processing a batch and committing it, until the file is removed
  (the test kills or pauses it there: a kill or a pause *mid-batch*, deterministically);
* ``{"e": "committed", "generation", "offsets": {"p": o}}`` once the coordinator acknowledged a
  commit; ``commit_failed`` (CommitFailedError and its RebalanceInProgressError) or
  ``commit_error`` (any other error, e.g. a timeout while the coordinator moves), with
  ``error``, ``kind``, ``generation`` and ``offsets``;
* ``{"e": "closed"}`` after a clean close, which happens when ``EVENTS_FILE.stop`` exists.

The process dies with its parent (PR_SET_PDEATHSIG) and exits by itself after ``run_s``; the
client's log (INFO) goes to its stderr.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tidelog import CommitFailedError, Consumer, ConsumerRebalanceListener, TidelogError, TopicPartition

PR_SET_PDEATHSIG = 1
HOLD_MAX_S = 120.0


def die_with_parent() -> None:
    parent = os.getppid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


class Events:
    def __init__(self, path: str):
        self.out = open(path, "a", buffering=1)

    def emit(self, e: str, **fields: Any) -> None:
        self.out.write(json.dumps({"e": e, "t": time.time(), **fields}) + "\n")
        self.out.flush()


class Recorder(ConsumerRebalanceListener):
    def __init__(self, events: Events):
        self.events = events
        self.consumer: Consumer | None = None

    def on_partitions_assigned(self, assigned):
        committed: dict[str, int | None] = {}
        error = None
        if assigned:
            try:
                found = self.consumer.committed(sorted(assigned), timeout_ms=10000)
                committed = {str(tp.partition): o for tp, o in found.items()}
            except TidelogError as e:
                error = f"{type(e).__name__}: {e}"
        self.events.emit("assigned", tps=sorted(tp.partition for tp in assigned),
                         generation=self.consumer.group_generation, committed=committed, committed_error=error)

    def on_partitions_revoked(self, revoked):
        self.events.emit("revoked", tps=sorted(tp.partition for tp in revoked))

    def on_partitions_lost(self, lost):
        self.events.emit("lost", tps=sorted(tp.partition for tp in lost))


def hold_if_asked(events: Events, hold: Path, consumer: Consumer, offsets: dict[TopicPartition, int]) -> None:
    if not hold.exists():
        return
    events.emit("holding", generation=consumer.group_generation,
                offsets={str(tp.partition): o for tp, o in offsets.items()})
    deadline = time.monotonic() + HOLD_MAX_S
    while hold.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def commit(events: Events, consumer: Consumer, offsets: dict[TopicPartition, int]) -> None:
    generation = consumer.group_generation
    by_partition = {str(tp.partition): o for tp, o in offsets.items()}
    try:
        consumer.commit(offsets)
    except CommitFailedError as e:
        events.emit("commit_failed", kind=type(e).__name__, error=str(e), generation=generation, offsets=by_partition)
        return
    except TidelogError as e:
        events.emit("commit_error", kind=type(e).__name__, error=str(e), generation=generation, offsets=by_partition)
        return
    events.emit("committed", generation=generation, offsets=by_partition)


def main(bootstrap: str, group: str, topic: str, events_path: str, options: dict[str, Any]) -> None:
    die_with_parent()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    events = Events(events_path)
    hold, stop = Path(events_path + ".hold"), Path(events_path + ".stop")
    process_s = float(options.pop("process_s", 0.0))
    deadline = time.monotonic() + float(options.pop("run_s", 300.0))
    recorder = Recorder(events)
    consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                        client_id=Path(events_path).stem, **options)
    recorder.consumer = consumer
    events.emit("started", pid=os.getpid())
    consumer.subscribe([topic], listener=recorder)
    try:
        while time.monotonic() < deadline and not stop.exists():
            try:
                records = consumer.poll(timeout_ms=200)
            except TidelogError as e:
                events.emit("poll_error", kind=type(e).__name__, error=str(e))
                continue
            if not records:
                continue
            by_partition: dict[int, list] = {}
            for r in records:
                by_partition.setdefault(r.partition, []).append(r)
            for p, batch in by_partition.items():
                events.emit("records", p=p, offsets=[r.offset for r in batch],
                            values=[r.value.decode() if r.value is not None else None for r in batch])
            time.sleep(process_s)
            offsets = {TopicPartition(topic, p): batch[-1].offset + 1 for p, batch in by_partition.items()}
            hold_if_asked(events, hold, consumer, offsets)
            commit(events, consumer, offsets)
    finally:
        consumer.close(timeout=15)
        events.emit("closed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]) if len(sys.argv) > 5 else {})
