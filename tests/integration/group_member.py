"""A consumer group member in a process of its own, for the group acceptance tests.

    python -m tests.integration.group_member BOOTSTRAP GROUP TOPIC EVENTS_FILE [options as JSON]

It consumes TOPIC in GROUP, commits after every batch (synchronously, the offsets after the
records it processed), and appends one JSON line per event to EVENTS_FILE, flushed at once:
``{"e": "assigned"|"revoked"|"lost", "tps": [[topic, p], ...]}``, ``{"e": "records", "tp": [topic, p],
"offsets": [...]}`` (before the commit that covers them), ``{"e": "committed", "offsets": {"topic:p": o}}``
(after the coordinator acknowledged it), ``{"e": "commit_failed", "error": ...}``; each with
its wall-clock time ``t``.
It dies with its parent (PR_SET_PDEATHSIG) and exits after ``run_s`` seconds.
"""

from __future__ import annotations

import ctypes
import json
import signal
import sys
import time

from tidelog import CommitFailedError, Consumer, ConsumerRebalanceListener, TidelogError


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main(bootstrap: str, group: str, topic: str, events_path: str, options: dict) -> None:
    _die_with_parent()
    out = open(events_path, "a", buffering=1)

    def emit(**event) -> None:
        event["t"] = time.time()
        out.write(json.dumps(event) + "\n")
        out.flush()

    class Listener(ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned):
            emit(e="assigned", tps=sorted(assigned), generation=consumer.group_generation)

        def on_partitions_revoked(self, revoked):
            emit(e="revoked", tps=sorted(revoked))

        def on_partitions_lost(self, lost):
            emit(e="lost", tps=sorted(lost))

    delay_s = options.pop("delay_per_batch_s", 0.0)
    run_s = options.pop("run_s", 60.0)
    consumer = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                        **options)
    consumer.subscribe([topic], listener=Listener())
    deadline = time.monotonic() + run_s
    try:
        while time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=200)
            if not records:
                continue
            by_tp: dict = {}
            for r in records:
                by_tp.setdefault((r.topic, r.partition), []).append(r.offset)
            for tp, offsets in by_tp.items():
                emit(e="records", tp=list(tp), offsets=offsets)
            time.sleep(delay_s)
            offsets = {(t, p): offs[-1] + 1 for (t, p), offs in by_tp.items()}
            try:
                consumer.commit(offsets)
                emit(e="committed", offsets={f"{t}:{p}": o for (t, p), o in offsets.items()})
            except CommitFailedError as e:
                emit(e="commit_failed", error=str(e))
            except TidelogError as e:
                emit(e="commit_error", error=str(e))
    finally:
        consumer.close()
        emit(e="closed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]) if len(sys.argv) > 5 else {})
