"""A Spark Structured Streaming driver in a process of its own, for the fault matrix's F16
(``test_spark_faults``): Tidelog topic -> Tidelog topic, with a checkpoint.

    python -m tests.system.spark_driver SPEC_JSON

SPEC_JSON holds ``bootstrap``, ``source`` and ``sink`` (topics), ``checkpoint`` (the query's
checkpoint directory, kept across runs), ``work_dir`` (this run's Spark scratch files),
``events`` (a JSON-lines file), ``run`` (this incarnation's number) and ``source_options``
(extra options of the tidelog source, e.g. maxOffsetsPerTrigger).

The query reads ``source`` from its earliest offsets with the tidelog source and writes, with
the tidelog streaming sink, one record per input record to ``sink``: the input's value, the
key ``b"<partition>:<offset>"`` of the input record, and a header ``run`` naming the driver
incarnation that wrote it. So the output itself tells which input records each run read and
wrote; the checkpoint's ``offsets/`` and ``commits/`` logs tell which batches were planned and
which completed.

Events, one JSON line each, flushed at once, with the wall-clock time ``t``: ``started``
(``pid``, ``run``), ``query`` (the query started, ``spark_s``: the seconds it took to get a
session), ``progress`` (``batch``, ``rows``, ``start`` and ``end`` offsets as the source's JSON;
one per batch, written by a StreamingQueryListener as Spark reports the batch, once it is
committed), ``failed`` (``error``) and ``stopped``. The driver stops cleanly (query, then session) when the
file ``<events>.stop`` exists. It dies with its parent (PR_SET_PDEATHSIG); its JVM exits when
this process does (PySpark's gateway exits at the end of its standard input), and Spark's
Python workers when the JVM does.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.spark import local_session
from tests.system.group_worker import Events, die_with_parent

STOP_POLL_S = 0.2
RETAIN_BATCHES = 1_000_000  # keep every entry of the offsets log: the oracle reads every batch's range


def _offsets(value: Any) -> Any:
    """A source offset as Spark's progress JSON carries it (a JSON text, or already parsed)."""
    return json.loads(value) if isinstance(value, str) else value


class LockedEvents(Events):
    """Events written from two threads: the main one and the listener's (py4j's callback server)."""

    def __init__(self, path: str):
        super().__init__(path)
        self._lock = threading.Lock()

    def emit(self, e: str, **fields: Any) -> None:
        with self._lock:
            super().emit(e, **fields)


def progress_recorder(events: Events) -> Any:
    """A StreamingQueryListener that writes the progress of every batch that read from the
    source, as Spark's listener bus delivers it (once the batch committed)."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Recorder(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            j = json.loads(event.progress.json)
            source = (j.get("sources") or [{}])[0]
            if source.get("endOffset") is not None:
                events.emit("progress", batch=j["batchId"], rows=j["numInputRows"],
                            start=_offsets(source.get("startOffset")), end=_offsets(source["endOffset"]))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass
    return Recorder()


def start_query(spark: Any, spec: dict) -> Any:
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("tidelog").option("bootstrap.servers", spec["bootstrap"])
              .option("subscribe", spec["source"]).option("startingOffsets", "earliest"))
    for k, v in spec.get("source_options", {}).items():
        reader = reader.option(k, str(v))
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", str(RETAIN_BATCHES))
    run = F.lit(str(spec["run"])).cast("binary")
    out = reader.load().select(
        F.format_string("%d:%d", "partition", "offset").cast("binary").alias("key"), "value",
        F.array(F.struct(F.lit("run").alias("key"), run.alias("value"))).alias("headers"))
    return (out.writeStream.format("tidelog").queryName("f16").option("bootstrap.servers", spec["bootstrap"])
            .option("topic", spec["sink"]).option("checkpointLocation", spec["checkpoint"]).start())


def main(spec: dict) -> int:
    die_with_parent()
    events = LockedEvents(spec["events"])
    stop = Path(spec["events"] + ".stop")
    events.emit("started", pid=os.getpid(), run=spec["run"])
    began = time.monotonic()
    spark = local_session(Path(spec["work_dir"]), f"f16-run-{spec['run']}")
    spark.streams.addListener(progress_recorder(events))
    query = start_query(spark, spec)
    events.emit("query", spark_s=round(time.monotonic() - began, 2))
    status = 0
    try:
        while not stop.exists():
            if not query.isActive:
                events.emit("failed", error=str(query.exception()))
                status = 1
                break
            time.sleep(STOP_POLL_S)
    finally:
        query.stop()
        spark.stop()
        events.emit("stopped")
    return status

if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
