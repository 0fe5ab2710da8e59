"""Spark connector benchmark: records/s read by a streaming query, and the cost of a trigger
that finds no new data.

A local cluster (ZooKeeper + 3 brokers from ``broker.devcluster.DevCluster``, or
``--bootstrap`` for a running one), a topic with 6 partitions (RF 3), 100-byte values
produced with acks=all, and one local[2] SparkSession with the test settings.

    .venv/bin/python bench/spark_bench.py [--records 500000] [--runs 3] [--idle-seconds 15]

read: each run is a fresh query (new checkpoint, startingOffsets=earliest,
Trigger.AvailableNow, the ``noop`` sink); the figure is records / (first batch start ..
last batch end) from the query's progress events, i.e. the reading itself without the
query's start-up, which is reported separately (start() .. termination).

small: the same query while 100 records arrive once a second: the median duration of those
micro-batches (planning, one task per partition with new data, commit).

idle: a query caught up with the topic, triggered every 100 ms with progress events for
empty triggers (``spark.sql.streaming.noDataProgressEventInterval=0``): the median
``triggerExecution`` and ``latestOffset`` durations of the empty triggers (what each
trigger costs when nothing new arrived: one metadata request and one ListOffsets per
leader through the source runner).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tidelog import Admin, NewTopic, Producer
from tidelog.broker.devcluster import DevCluster

TOPIC = "spark-bench"
CHECKPOINTS: list[str] = []  # removed at exit
VALUE = b"x" * 100


def spark_session():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from tidelog.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("tidelog-bench")
             .config("spark.driver.memory", "1g").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.default.parallelism", "2")
             .config("spark.sql.adaptive.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.streaming.noDataProgressEventInterval", "0")
             .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss1m")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def produce(bootstrap: str, n: int) -> float:
    t = time.perf_counter()
    with Producer(bootstrap, acks="all", linger_ms=10, batch_size=256 * 1024) as p:
        for i in range(n):
            p.send(TOPIC, VALUE, key=b"%d" % (i % 1000))
        p.flush()
    return n / (time.perf_counter() - t)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def read_run(spark, bootstrap: str, n: int, options: dict[str, str]) -> tuple[float, float, int, int]:
    """(records/s while reading, wall seconds start..end, rows, batches)."""
    ckpt = tempfile.mkdtemp(prefix="spark-bench-")
    CHECKPOINTS.append(ckpt)
    r = spark.readStream.format("tidelog").option("bootstrap.servers", bootstrap).option("subscribe", TOPIC) \
        .option("startingOffsets", "earliest")
    for k, v in options.items():
        r = r.option(k, v)
    t = time.perf_counter()
    q = r.load().writeStream.format("noop").option("checkpointLocation", ckpt).trigger(availableNow=True).start()
    q.awaitTermination()
    wall = time.perf_counter() - t
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in batches)
    first = _ts(batches[0]["timestamp"])
    last = max(_ts(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000 for p in batches)
    return rows / (last - first), wall, rows, len(batches)


def idle_run(spark, bootstrap: str, seconds: float) -> tuple[float, float, int]:
    """Median triggerExecution and latestOffset (ms) of triggers without new data."""
    ckpt = tempfile.mkdtemp(prefix="spark-bench-idle-")
    CHECKPOINTS.append(ckpt)
    q = (spark.readStream.format("tidelog").option("bootstrap.servers", bootstrap).option("subscribe", TOPIC)
         .option("startingOffsets", "latest").load()
         .writeStream.format("noop").option("checkpointLocation", ckpt).trigger(processingTime="100 milliseconds")
         .start())
    time.sleep(3)  # start-up and the first (empty) batch
    seen = len(q.recentProgress)
    time.sleep(seconds)
    progress = [p for p in q.recentProgress[seen:] if p["numInputRows"] == 0]
    q.stop()
    total = [p["durationMs"]["triggerExecution"] for p in progress]
    latest = [p["durationMs"].get("latestOffset", 0) for p in progress]
    return statistics.median(total), statistics.median(latest), len(progress)


def small_batches(spark, bootstrap: str, seconds: float) -> tuple[float, float, int]:
    """Median triggerExecution and addBatch (ms) of micro-batches of about 100 new records,
    produced once a second while the query runs."""
    ckpt = tempfile.mkdtemp(prefix="spark-bench-small-")
    CHECKPOINTS.append(ckpt)
    q = (spark.readStream.format("tidelog").option("bootstrap.servers", bootstrap).option("subscribe", TOPIC)
         .option("startingOffsets", "latest").load()
         .writeStream.format("noop").option("checkpointLocation", ckpt).trigger(processingTime="100 milliseconds")
         .start())
    time.sleep(3)
    seen = len(q.recentProgress)
    with Producer(bootstrap, acks="all", linger_ms=5) as p:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for i in range(100):
                p.send(TOPIC, VALUE, key=b"%d" % i)
            p.flush()
            time.sleep(1)
    time.sleep(2)
    progress = [p for p in q.recentProgress[seen:] if p["numInputRows"] > 0]
    q.stop()
    return (statistics.median(p["durationMs"]["triggerExecution"] for p in progress),
            statistics.median(p["durationMs"].get("addBatch", 0) for p in progress), len(progress))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle-seconds", type=float, default=15)
    ap.add_argument("--bootstrap", help="use a running cluster instead of starting one")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra source option, e.g. minPartitions=4")
    args = ap.parse_args()
    options = dict(kv.split("=", 1) for kv in args.option)
    cluster = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        cluster = DevCluster(tempfile.mkdtemp(prefix="spark-bench-cluster-"), brokers=3, zk_port=0, base_port=0)
        cluster.start()
        bootstrap = cluster.bootstrap
    try:
        with Admin(bootstrap) as admin:
            if TOPIC not in admin.list_topics():
                admin.create_topics([NewTopic(TOPIC, 6, 3)])
        time.sleep(1)
        rate = produce(bootstrap, args.records)
        print(f"produced {args.records} records of 100 bytes at {rate:,.0f} records/s (acks=all)", flush=True)
        spark = spark_session()
        read_run(spark, bootstrap, args.records, options)  # warm-up: Python workers, JIT
        rates = []
        for i in range(args.runs):
            rps, wall, rows, batches = read_run(spark, bootstrap, args.records, options)
            rates.append(rps)
            print(f"read run {i + 1}: {rows} rows in {batches} batch(es), {rps:,.0f} records/s while reading, "
                  f"{wall:.1f} s from start() to the end", flush=True)
        print(f"READ median {statistics.median(rates):,.0f} records/s "
              f"({', '.join(f'{r:,.0f}' for r in rates)})", flush=True)
        idles = []
        for i in range(args.runs):
            total, latest, n = idle_run(spark, bootstrap, args.idle_seconds)
            idles.append((total, latest))
            print(f"idle run {i + 1}: {n} empty triggers, median triggerExecution {total:.0f} ms, "
                  f"latestOffset {latest:.0f} ms", flush=True)
        print(f"IDLE median triggerExecution {statistics.median(t for t, _ in idles):.0f} ms, "
              f"latestOffset {statistics.median(x for _, x in idles):.0f} ms", flush=True)
        smalls = []
        for i in range(args.runs):
            total, add, n = small_batches(spark, bootstrap, args.idle_seconds)
            smalls.append((total, add))
            print(f"small-batch run {i + 1}: {n} batches of ~100 records, median triggerExecution {total:.0f} ms, "
                  f"addBatch {add:.0f} ms", flush=True)
        print(f"SMALL median triggerExecution {statistics.median(t for t, _ in smalls):.0f} ms, "
              f"addBatch {statistics.median(x for _, x in smalls):.0f} ms", flush=True)
        print(f"load average {os.getloadavg()[0]:.1f}")
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
            shutil.rmtree(cluster.dir, ignore_errors=True)
        for ckpt in CHECKPOINTS:
            shutil.rmtree(ckpt, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
