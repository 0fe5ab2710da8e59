"""Example Spark pipeline: events per key in tumbling event-time windows, topic to topic.

    .venv/bin/tidelog dev up                                      # terminal 1
    .venv/bin/python deploy/spark/produce_events.py --seconds 60  # terminal 2
    .venv/bin/python deploy/spark/windowed_counts.py              # terminal 3
    .venv/bin/tidelog consume event-counts --from-beginning --print-key

Reads ``--source`` (default ``events``) with the tidelog streaming source, counts records per
key in ``--window`` tumbling windows of the records' timestamps (late records accepted for
``--watermark``), and writes each window's final count to ``--sink`` (default
``event-counts``) with the tidelog sink, in output mode "append": once the watermark (the
latest record time seen minus ``--watermark``) has passed a window's end, one record per key
and window, keyed ``<key>@<window start>``, value JSON ``{"key", "window_start",
"window_end", "count"}``. (Python data source sinks support the append and complete modes,
not update.) The checkpoint (``--checkpoint``) makes a restart carry on exactly where the
previous run stopped. ``--available-now`` processes what is there and exits; windows that
the watermark has not passed yet are written by a later run. On a secured cluster,
TIDELOG_COMMAND_CONFIG names the client's security settings (a ``--command-config``
properties file), passed to the connector as ``kafka.*`` options.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def security_options() -> dict[str, Any]:
    """The SDK's security options from the properties file TIDELOG_COMMAND_CONFIG names (the
    tools' --command-config; docker-compose.yml sets it), {} without one."""
    path = os.environ.get("TIDELOG_COMMAND_CONFIG")
    if not path:
        return {}
    from tidelog.security import SecurityConfig, read_properties

    return SecurityConfig.from_properties(read_properties(path)).options()


def build_query(spark: Any, *, bootstrap: str, source: str, sink: str, checkpoint: str, window: str = "10 seconds",
                watermark: str = "5 seconds", starting_offsets: str = "earliest",
                max_offsets_per_trigger: int | None = None, trigger: dict[str, Any] | None = None,
                security: dict[str, Any] | None = None):
    """The streaming query (not started): tidelog ``source`` -> windowed counts -> tidelog ``sink``.
    ``security``: the SDK's security options, passed to the connector as ``kafka.*`` options."""
    from pyspark.sql import functions as F

    client = {f"kafka.{k.replace('_', '.')}": str(v) for k, v in (security or {}).items() if v is not None}
    reader = (spark.readStream.format("tidelog").option("bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", starting_offsets).options(**client))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    events = reader.load().select(F.coalesce(F.col("key").cast("string"), F.lit("(none)")).alias("key"),
                                  F.col("timestamp"))
    counts = (events.withWatermark("timestamp", watermark)
              .groupBy(F.window("timestamp", window), "key").count())
    out = counts.select(
        F.concat_ws("@", "key", F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss'Z'")).alias("key"),
        F.to_json(F.struct("key", F.col("window.start").alias("window_start"),
                           F.col("window.end").alias("window_end"), "count")).alias("value"))
    return (out.writeStream.format("tidelog").option("bootstrap.servers", bootstrap).option("topic", sink)
            .option("checkpointLocation", checkpoint).options(**client).outputMode("append")
            .trigger(**(trigger or {"processingTime": "5 seconds"})))


def main() -> int:
    ap = argparse.ArgumentParser(description="Windowed per-key counts from one tidelog topic to another.")
    ap.add_argument("--bootstrap", default=os.environ.get("TIDELOG_BOOTSTRAP", "localhost:9092"))
    ap.add_argument("--source", default="events")
    ap.add_argument("--sink", default="event-counts")
    ap.add_argument("--checkpoint", default="tidelog-data/spark/windowed-counts")
    ap.add_argument("--window", default="10 seconds")
    ap.add_argument("--watermark", default="5 seconds")
    ap.add_argument("--starting-offsets", default="earliest", help="earliest, latest or JSON offsets")
    ap.add_argument("--max-offsets-per-trigger", type=int)
    ap.add_argument("--trigger", default="5 seconds", help="processing-time trigger interval")
    ap.add_argument("--available-now", action="store_true", help="process what is there, then exit")
    ap.add_argument("--sink-partitions", type=int, default=3, help="partitions of the sink topic if it is created")
    ap.add_argument("--wait", type=float, default=120.0, help="seconds to wait for the source topic to exist")
    args = ap.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from tidelog import Admin, NewTopic

    security = security_options()
    with Admin(args.bootstrap, **security) as admin:
        deadline = time.monotonic() + args.wait
        while args.source not in (topics := set(admin.list_topics())):
            if time.monotonic() >= deadline:
                print(f"topic {args.source!r} does not exist: run deploy/spark/produce_events.py first",
                      file=sys.stderr)
                return 1
            print(f"waiting for topic {args.source!r} (deploy/spark/produce_events.py creates it)", flush=True)
            time.sleep(5)
        if args.sink not in topics:
            rf = min(3, len(admin.describe_cluster().brokers))
            admin.create_topics([NewTopic(args.sink, args.sink_partitions, rf)])
            print(f"created topic {args.sink!r} ({args.sink_partitions} partitions, replication factor {rf})")

    from pyspark.sql import SparkSession

    from tidelog.spark import register

    spark = (SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local[2]")).appName("tidelog-windowed-counts")
             .config("spark.sql.shuffle.partitions", "2").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    trigger = {"availableNow": True} if args.available_now else {"processingTime": args.trigger}
    query = build_query(spark, bootstrap=args.bootstrap, source=args.source, sink=args.sink,
                        checkpoint=args.checkpoint, window=args.window, watermark=args.watermark,
                        starting_offsets=args.starting_offsets,
                        max_offsets_per_trigger=args.max_offsets_per_trigger, trigger=trigger,
                        security=security).start()
    print(f"reading {args.source!r}, writing counts per key and {args.window} window to {args.sink!r} "
          f"(checkpoint {args.checkpoint}); Ctrl-C stops", flush=True)
    try:
        while query.isActive:
            query.awaitTermination(10)
            p = query.lastProgress
            if p and p["numInputRows"]:
                print(f"batch {p['batchId']}: {p['numInputRows']} records in, "
                      f"{p['sink'].get('numOutputRows', '?')} counts out", flush=True)
    except KeyboardInterrupt:
        print("stopping ...", flush=True)
        query.stop()
    if query.exception() is not None:
        print(f"the query failed: {query.exception()}", file=sys.stderr)
        return 1
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
