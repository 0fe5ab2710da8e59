"""Acceptance tests of issue 6: the tidelog Spark source and sink against a real 3-broker
cluster (RF 3) and a real local Spark (one session for the run, see conftest).

Queries run with Trigger.AvailableNow into ``foreachBatch`` (deterministic, and unlike the
memory sink it restarts from a checkpoint), so each test sees exactly which rows each
micro-batch produced.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import cluster_fixture, wait_topic_ready
from tests.support.waiting import wait_until
from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
from tidelog.broker.devcluster import DevCluster

COLUMNS = ["topic", "partition", "offset", "value"]
QUERY_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def cluster(request, tmp_path_factory, spark) -> Iterator[DevCluster]:
    """3 brokers for the module. ZooKeeper ticks every 2 s (sessions up to 40 s) and followers
    may lag 60 s before leaving the ISR, so a follower paused for up to 40 s holds the high
    watermark back; retention runs every 500 ms. Kafka listeners too, for kcat."""
    yield from cluster_fixture(request, tmp_path_factory.mktemp("spark-cluster"), 3,
                               {"log.retention.check.interval.ms": 500,
                                "zookeeper.session.timeout.ms": 40000,
                                "replica.lag.time.max.ms": 60000,
                                "auto.create.topics.enable": False,
                                "log.segment.min.bytes": 2048},  # 2 KiB segments below: allow them
                               zk_tick_time_ms=2000, kafka=True)


# -- helpers --------------------------------------------------------------------------------------


def create_topic(cluster: DevCluster, name: str, partitions: int, *, config: dict[str, str] | None = None,
                 assignment: dict[int, list[int]] | None = None) -> None:
    with Admin(cluster.bootstrap) as admin:
        if assignment is not None:
            admin.create_topics([NewTopic(name, replica_assignment=assignment, config=config or {})])
        else:
            admin.create_topics([NewTopic(name, partitions, 3, config=config or {})])
    wait_topic_ready(cluster, name, partitions, 3)


def produce(bootstrap: str, topic: str, values: list[bytes], *, acks: Any = "all", keys: bool = True,
            headers: bool = False, partition: int | None = None, one_by_one: bool = False,
            **options: Any) -> set[tuple]:
    """Send ``values`` (``one_by_one``: each its own request, so no produce request holds
    more than one small batch); returns {(topic, partition, offset, value)} of what was
    acknowledged."""
    with Producer(bootstrap, acks=acks, linger_ms=5, **options) as p:
        futures = []
        for i, v in enumerate(values):
            futures.append(p.send(topic, v, key=b"k%d" % (i % 10) if keys else None, partition=partition,
                                  headers=[("n", b"%d" % i), ("src", b"test")] if headers else None))
            if one_by_one:
                p.flush(30)
        p.flush(60)
        out = set()
        for v, f in zip(values, futures):
            md = f.result(10)
            out.add((md.topic, md.partition, md.offset, v))
        return out


def high_watermarks(bootstrap: str, topic: str, partitions: int, **options: Any) -> dict[int, int]:
    with Consumer(bootstrap, **options) as c:
        ends = c.end_offsets([TopicPartition(topic, p) for p in range(partitions)], timeout_ms=20000)
    return {tp.partition: o for tp, o in ends.items()}


def log_starts(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    with Consumer(bootstrap) as c:
        starts = c.beginning_offsets([TopicPartition(topic, p) for p in range(partitions)], timeout_ms=20000)
    return {tp.partition: o for tp, o in starts.items()}


def reader(spark, bootstrap: str, **options: Any):
    r = spark.readStream.format("tidelog").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


def run_available_now(spark, bootstrap: str, checkpoint: Path, columns=COLUMNS, **options: Any
                      ) -> list[tuple[int, list[tuple], int]]:
    """One Trigger.AvailableNow run into foreachBatch: [(batch id, rows, Spark partitions)]."""
    batches: list[tuple[int, list[tuple], int]] = []

    def collect(df, batch_id):
        batches.append((batch_id, [tuple(r) for r in df.select(*columns).collect()], df.rdd.getNumPartitions()))

    q = (reader(spark, bootstrap, **options).writeStream.foreachBatch(collect)
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert q.awaitTermination(QUERY_TIMEOUT_S), f"the query did not finish in {QUERY_TIMEOUT_S} s"
    finally:
        q.stop()
    return batches


def rows_of(batches) -> list[tuple]:
    return [row for _, rows, _ in batches for row in rows]


def assert_exactly(rows: list[tuple], expected: set[tuple]) -> None:
    dups = [r for r, n in Counter(rows).items() if n > 1]
    assert not dups, f"{len(dups)} duplicated rows, e.g. {dups[:3]}"
    missing, extra = expected - set(rows), set(rows) - expected
    assert not missing and not extra, (f"{len(missing)} missing (e.g. {sorted(missing)[:3]}), "
                                       f"{len(extra)} unexpected (e.g. {sorted(extra)[:3]})")


# -- streaming source -----------------------------------------------------------------------------


def test_checkpointed_restart_reads_everything_exactly_once(spark, cluster, tmp_path):
    """I14: 50,000 records, an AvailableNow run, 10,000 more, a restart from the checkpoint:
    the union is exactly what was produced. A replayed micro-batch (its commit removed)
    reads the same (partition, offset) set, and a run with nothing new reads nothing."""
    create_topic(cluster, "orders", 6)
    first = produce(cluster.bootstrap, "orders", [b"a-%06d" % i + b"." * 92 for i in range(50_000)])
    ckpt = tmp_path / "ckpt"
    opts = {"subscribe": "orders", "startingOffsets": "earliest"}

    run1 = run_available_now(spark, cluster.bootstrap, ckpt, **opts)
    assert_exactly(rows_of(run1), first)

    second = produce(cluster.bootstrap, "orders", [b"b-%06d" % i for i in range(10_000)])
    run2 = run_available_now(spark, cluster.bootstrap, ckpt, **opts)
    assert_exactly(rows_of(run2), second)
    assert_exactly(rows_of(run1) + rows_of(run2), first | second)

    last_id, last_rows, _ = run2[-1]
    for name in (str(last_id), f".{last_id}.crc"):  # as if the query died before committing it
        (ckpt / "commits" / name).unlink(missing_ok=True)
    replay = run_available_now(spark, cluster.bootstrap, ckpt, **opts)
    assert [b for b, _, _ in replay] == [last_id]
    assert sorted(rows_of(replay)) == sorted(last_rows)

    assert rows_of(run_available_now(spark, cluster.bootstrap, ckpt, **opts)) == []


def test_records_above_the_high_watermark_are_never_read(spark, cluster, tmp_path):
    """A paused follower holds the HW back while the leader takes acks=1 records: the query
    stops at the HW, and reads the rest once the follower has caught up."""
    create_topic(cluster, "held", 1, assignment={0: [1, 2, 3]})
    leader_only = f"127.0.0.1:{cluster.brokers[1].port}"
    fast = {"request_timeout_ms": 2000, "default_api_timeout_ms": 10000}
    committed = produce(leader_only, "held", [b"c-%d" % i for i in range(100)])
    wait_until(lambda: high_watermarks(leader_only, "held", 1, **fast) == {0: 100}, 10, "HW 100")
    ckpt = tmp_path / "ckpt"
    opts = {"assign": '{"held": [0]}', "startingOffsets": "earliest", "kafka.request.timeout.ms": 2000}
    # warm Spark's Python workers up first: the pause must stay shorter than the session
    assert len(rows_of(run_available_now(spark, leader_only, tmp_path / "warm-up", **opts))) == 100
    cluster.brokers[3].pause()
    try:
        uncommitted = produce(leader_only, "held", [b"u-%d" % i for i in range(50)], acks=1,
                              request_timeout_ms=2000)
        leo = max(offset for _, _, offset, _ in uncommitted) + 1
        assert leo == 150
        assert high_watermarks(leader_only, "held", 1, **fast) == {0: 100}  # HW < LEO
        run1 = run_available_now(spark, leader_only, ckpt, **opts)
        assert_exactly(rows_of(run1), committed)
        assert high_watermarks(leader_only, "held", 1, **fast) == {0: 100}  # still held back
    finally:
        cluster.brokers[3].resume()
    wait_until(lambda: high_watermarks(leader_only, "held", 1, **fast) == {0: 150}, 30, "HW 150")
    run2 = run_available_now(spark, leader_only, ckpt, **opts)
    assert_exactly(rows_of(run2), uncommitted)


def test_max_offsets_per_trigger_bounds_every_micro_batch(spark, cluster, tmp_path):
    create_topic(cluster, "limited", 3)
    produced = produce(cluster.bootstrap, "limited", [b"%d" % i for i in range(2_000)])
    batches = run_available_now(spark, cluster.bootstrap, tmp_path / "ckpt", subscribe="limited",
                                startingOffsets="earliest", maxOffsetsPerTrigger=300, minPartitions=5,
                                groupId="spark-limited")
    sizes = [len(rows) for _, rows, _ in batches]
    assert all(n <= 300 for n in sizes), sizes
    assert len(sizes) == 7 and sum(sizes) == 2_000, sizes
    assert all(parts >= 5 for _, rows, parts in batches if len(rows) >= 5)  # minPartitions splits
    assert_exactly(rows_of(batches), produced)


def test_group_id_shows_the_query_progress_as_the_group_committed_offsets(spark, cluster, tmp_path):
    """Spark's checkpoint is the truth; groupId makes the progress visible to operators:
    `tidelog groups describe` (Admin.list_group_offsets) shows the query's offsets and lag."""
    create_topic(cluster, "progress", 2)
    produced = produce(cluster.bootstrap, "progress", [b"%d" % i for i in range(600)])
    ends = Counter(partition for _, partition, _, _ in produced)
    ckpt, group = tmp_path / "ckpt", "spark-progress"
    opts = dict(subscribe="progress", startingOffsets="earliest", maxOffsetsPerTrigger=200, groupId=group)
    first = run_available_now(spark, cluster.bootstrap, ckpt, **opts)
    assert_exactly(rows_of(first), produced)

    def committed() -> dict[int, int | None]:
        with Admin(cluster.bootstrap) as admin:
            return {g.partition.partition: g.committed for g in admin.list_group_offsets(group)}

    # the batches before the run's last are committed, never more than was read
    after_first = committed()
    assert after_first and all(c is not None and 0 < c <= ends[p] for p, c in after_first.items()), after_first
    more = produce(cluster.bootstrap, "progress", [b"more-%d" % i for i in range(100)])
    ends.update(partition for _, partition, _, _ in more)
    second = run_available_now(spark, cluster.bootstrap, ckpt, **opts)
    assert_exactly(rows_of(second), more)
    # Spark commits a batch's end to the source when it plans the next batch: the first
    # run's last batch is committed by the second run, and the group shows it with its lag
    wait_until(lambda: committed() == {p: ends[p] - n for p, n in Counter(
        partition for _, partition, _, _ in more).items()}, 30, "the first run's end committed")
    with Admin(cluster.bootstrap) as admin:
        shown = {g.partition.partition: (g.committed, g.log_end_offset, g.lag) for g in admin.list_group_offsets(group)}
    assert shown == {p: (c, ends[p], ends[p] - c) for p, c in committed().items()}, shown


def test_min_partitions_splits_ranges_in_a_batch_read(spark, cluster):
    create_topic(cluster, "split", 1)
    produced = produce(cluster.bootstrap, "split", [b"%d" % i for i in range(1_000)])
    df = (spark.read.format("tidelog").option("bootstrap.servers", cluster.bootstrap)
          .option("subscribe", "split").option("minPartitions", "4").load())
    assert df.rdd.getNumPartitions() == 4
    assert_exactly([tuple(r) for r in df.select(*COLUMNS).collect()], produced)
    sizes = df.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect()
    assert sizes == [250, 250, 250, 250]


def test_subscribe_pattern_picks_up_a_topic_created_while_the_query_runs(spark, cluster, tmp_path):
    create_topic(cluster, "pat-a", 2)
    seen: list[tuple] = []

    def collect(df, batch_id):
        seen.extend(tuple(r) for r in df.select(*COLUMNS).collect())

    q = (reader(spark, cluster.bootstrap, subscribePattern="pat-.*", startingOffsets="earliest")
         .writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="300 milliseconds").start())
    try:
        a = produce(cluster.bootstrap, "pat-a", [b"a%d" % i for i in range(100)])
        wait_until(lambda: len(seen) >= 100, 60, "pat-a's records")
        create_topic(cluster, "pat-b", 3)
        create_topic(cluster, "other", 1)
        b = produce(cluster.bootstrap, "pat-b", [b"b%d" % i for i in range(150)])
        produce(cluster.bootstrap, "other", [b"x"])
        wait_until(lambda: len(seen) >= 250, 60, "pat-b's records")
        with Admin(cluster.bootstrap) as admin:  # new partitions of a topic already read
            admin.create_partitions({"pat-a": 4})
        wait_topic_ready(cluster, "pat-a", 4, 3)
        for p in (2, 3):
            b |= produce(cluster.bootstrap, "pat-a", [b"a%d-%d" % (p, i) for i in range(20)], partition=p)
        wait_until(lambda: len(seen) >= 290, 60, "the records of pat-a's new partitions")
        q.processAllAvailable()
        assert q.exception() is None
    finally:
        q.stop()
    assert_exactly(seen, a | b)


def test_data_loss_under_a_stopped_query(spark, cluster, tmp_path):
    """Retention deletes segments the stopped query has not read: the restart fails naming
    topic, partition and offsets; with failOnDataLoss=false it goes on from the log start."""
    from pyspark.errors import StreamingQueryException

    create_topic(cluster, "lossy", 1, config={"segment.bytes": "2048"})
    small = {"one_by_one": True}  # segments of 2 KiB take no produce request of more
    first = produce(cluster.bootstrap, "lossy", [b"f%03d" % i + b"." * 60 for i in range(200)], **small)
    ckpt = tmp_path / "ckpt"
    opts = {"subscribe": "lossy", "startingOffsets": "earliest"}
    assert_exactly(rows_of(run_available_now(spark, cluster.bootstrap, ckpt, **opts)), first)

    second = produce(cluster.bootstrap, "lossy", [b"s%03d" % i + b"." * 60 for i in range(200)], **small)
    with Admin(cluster.bootstrap) as admin:
        admin.alter_configs("lossy", {"retention.bytes": "4096"})
    start = wait_until(lambda: log_starts(cluster.bootstrap, "lossy", 1)[0] > 250, 30, "retention to delete segments")
    start = log_starts(cluster.bootstrap, "lossy", 1)[0]
    assert start < 400

    with pytest.raises(StreamingQueryException) as failure:
        run_available_now(spark, cluster.bootstrap, ckpt, **opts)
    message = str(failure.value)
    assert f"data loss in topic 'lossy' partition 0: offsets [200, {start}) of the planned range [200, 400)" \
        in message, message[:3000]
    assert "failOnDataLoss=false" in message

    resumed = run_available_now(spark, cluster.bootstrap, ckpt, failOnDataLoss="false", **opts)
    assert_exactly(rows_of(resumed), {r for r in second if r[2] >= start})


def test_a_deleted_topic_is_data_loss(spark, cluster, tmp_path):
    from pyspark.errors import StreamingQueryException

    create_topic(cluster, "doomed", 1)
    produce(cluster.bootstrap, "doomed", [b"%d" % i for i in range(10)])
    ckpt = tmp_path / "ckpt"
    assert len(rows_of(run_available_now(spark, cluster.bootstrap, ckpt, subscribe="doomed",
                                         startingOffsets="earliest"))) == 10
    with Admin(cluster.bootstrap) as admin:
        admin.delete_topics(["doomed"])
        wait_until(lambda: "doomed" not in admin.list_topics(), 30, "the topic to be deleted")
    with pytest.raises(StreamingQueryException, match=r"topic 'doomed' partition 0 \(query at offset 10\) "
                                                      "no longer exists"):
        run_available_now(spark, cluster.bootstrap, ckpt, subscribe="doomed")
    assert rows_of(run_available_now(spark, cluster.bootstrap, ckpt, subscribe="doomed",
                                     failOnDataLoss="false")) == []


# -- batch source ---------------------------------------------------------------------------------


def test_batch_read_of_explicit_offset_ranges(spark, cluster):
    create_topic(cluster, "ranges", 2)
    by_partition = {p: produce(cluster.bootstrap, "ranges", [b"p%d-%d" % (p, i) for i in range(100)],
                               partition=p, headers=True) for p in (0, 1)}
    df = (spark.read.format("tidelog").option("bootstrap.servers", cluster.bootstrap)
          .option("subscribe", "ranges").option("includeHeaders", "true")
          .option("startingOffsets", '{"ranges": {"0": 10, "1": -2}}')
          .option("endingOffsets", '{"ranges": {"0": 25, "1": 5}}').load())
    assert [f.name for f in df.schema.fields] == ["key", "value", "topic", "partition", "offset", "timestamp",
                                                  "timestampType", "headers"]
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int,"
                                        "headers:array<struct<key:string,value:binary>>>")
    rows = df.collect()
    expected = {r for r in by_partition[0] if 10 <= r[2] < 25} | {r for r in by_partition[1] if r[2] < 5}
    assert_exactly([(r.topic, r.partition, r.offset, r.value) for r in rows], expected)
    now = time.time()
    for r in rows:
        assert r.key == b"k%d" % (r.offset % 10)
        assert [(h.key, h.value) for h in r.headers] == [("n", b"%d" % r.offset), ("src", b"test")]
        assert r.timestampType == 0 and abs(r.timestamp.timestamp() - now) < 600

    whole = (spark.read.format("tidelog").option("bootstrap.servers", cluster.bootstrap)
             .option("assign", '{"ranges": [1]}').load())
    assert whole.count() == 100


def test_starting_timestamp(spark, cluster):
    create_topic(cluster, "timed", 2)
    base = int(time.time() * 1000) - 600_000  # recent: retention.ms (7 days) keeps it
    with Producer(cluster.bootstrap, acks="all") as p:
        for i in range(100):
            p.send("timed", b"%d" % i, partition=i % 2, timestamp_ms=base + 1000 * i)
        p.flush(30)
    df = (spark.read.format("tidelog").option("bootstrap.servers", cluster.bootstrap).option("subscribe", "timed")
          .option("startingTimestamp", str(base + 1000 * 60 + 500)).load())
    assert sorted(int(r.value) for r in df.select("value").collect()) == list(range(61, 100))
    late = (spark.read.format("tidelog").option("bootstrap.servers", cluster.bootstrap).option("subscribe", "timed")
            .option("startingTimestamp", str(base + 10**9)).load())
    with pytest.raises(Exception, match="no record at or after timestamp"):
        late.collect()


# -- sink -----------------------------------------------------------------------------------------


def test_sink_round_trip_with_keys_and_headers(spark, cluster):
    create_topic(cluster, "sunk", 3)
    rows = [(b"key-%d" % i, "value-%d" % i, i % 3, [("i", b"%d" % i), ("empty", None)]) for i in range(300)]
    df = spark.createDataFrame(rows, "key binary, value string, partition int, "
                                     "headers array<struct<key: string, value: binary>>")
    (df.write.format("tidelog").option("bootstrap.servers", cluster.bootstrap).option("topic", "sunk")
     .mode("append").save())
    ends = high_watermarks(cluster.bootstrap, "sunk", 3)
    assert ends == {0: 100, 1: 100, 2: 100}
    got = []
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("sunk", p) for p in range(3)])
        deadline = time.monotonic() + 30
        while len(got) < 300 and time.monotonic() < deadline:
            got += c.poll(timeout_ms=500)
    assert sorted((r.key, r.value, r.partition, r.headers) for r in got) == \
        sorted((k, v.encode(), p, h) for k, v, p, h in rows)


def test_streaming_sink_and_the_topic_column(spark, cluster, tmp_path):
    """tidelog -> tidelog: each record is written to the topic its row names. The query is
    named (Spark passes the name to the sink as the option queryName)."""
    create_topic(cluster, "fan-in", 2)
    create_topic(cluster, "even", 1)
    create_topic(cluster, "odd", 1)
    produce(cluster.bootstrap, "fan-in", [b"%d" % i for i in range(400)])
    from pyspark.sql import functions as F

    src = reader(spark, cluster.bootstrap, subscribe="fan-in", startingOffsets="earliest")
    out = src.select(F.when(F.col("value").cast("string").cast("int") % 2 == 0, "even").otherwise("odd")
                     .alias("topic"), "key", "value")
    q = (out.writeStream.format("tidelog").queryName("even-odd").option("bootstrap.servers", cluster.bootstrap)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT_S)
    assert high_watermarks(cluster.bootstrap, "even", 1) == {0: 200}
    assert high_watermarks(cluster.bootstrap, "odd", 1) == {0: 200}


def test_a_failed_write_fails_the_task_with_the_brokers_error(spark, cluster):
    create_topic(cluster, "tiny", 1, config={"max.message.bytes": "1000"})
    df = spark.createDataFrame([("x" * 5000,)], "value string")
    with pytest.raises(Exception) as failure:
        (df.write.format("tidelog").option("bootstrap.servers", cluster.bootstrap).option("topic", "tiny")
         .mode("append").save())
    message = str(failure.value)
    assert "topic 'tiny' partition 0" in message and "TOO_LARGE" in message, message[:3000]


def test_bad_options_fail_at_start_with_a_clear_message(spark, cluster):
    with pytest.raises(Exception, match="exactly one of the options subscribe, subscribePattern and assign"):
        reader(spark, cluster.bootstrap).writeStream.foreachBatch(lambda df, i: None).start()
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="the sink needs a topic"):
        df.write.format("tidelog").option("bootstrap.servers", cluster.bootstrap).mode("append").save()



# -- the example pipeline (deploy/spark/windowed_counts.py) -------------------------------------------


def test_example_pipeline_counts_per_key_and_window(spark, cluster, tmp_path):
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[2] / "deploy" / "spark" / "windowed_counts.py"
    spec = importlib.util.spec_from_file_location("windowed_counts", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    create_topic(cluster, "events", 3)
    create_topic(cluster, "event-counts", 2)
    base = int(time.time()) // 10 * 10_000 - 120_000  # whole 10 s: the window [base, base + 10 s)
    sent = Counter()
    with Producer(cluster.bootstrap, acks="all") as p:
        for i in range(600):
            key = f"user-{i % 7 % 3}"
            p.send("events", b"{}", key=key, timestamp_ms=base + (i * 13) % 9000)
            sent[key] += 1
        p.send("events", b"{}", key="marker", timestamp_ms=base + 60_000)  # moves the watermark on
        p.flush(30)
    q = example.build_query(spark, bootstrap=cluster.bootstrap, source="events", sink="event-counts",
                            checkpoint=str(tmp_path / "ckpt"), window="10 seconds", watermark="5 seconds",
                            trigger={"availableNow": True}).start()
    assert q.awaitTermination(QUERY_TIMEOUT_S)
    ends = high_watermarks(cluster.bootstrap, "event-counts", 2)
    got = {}
    with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([TopicPartition("event-counts", p) for p in range(2)])
        deadline = time.monotonic() + 30
        while len(got) < sum(ends.values()) and time.monotonic() < deadline:
            for r in c.poll(timeout_ms=500):
                got[r.key.decode()] = json.loads(r.value)
    assert sum(ends.values()) == 3  # one final count per key and closed window, nothing else
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(base / 1000))
    assert {k: v["count"] for k, v in got.items()} == {f"{k}@{start}Z": n for k, n in sent.items()}
    assert all(v["window_start"] == f"{start}.000Z" for v in got.values())


# -- options added with issue 17 --------------------------------------------------------------------


def test_batch_read_up_to_an_ending_timestamp(spark, cluster):
    """endingTimestamp: every partition stops before its first record at or after the time;
    endingOffsetsByTimestamp does it for the partitions it names (the others read to the end)."""
    create_topic(cluster, "timed-end", 2)
    base = int(time.time() * 1000) - 600_000
    with Producer(cluster.bootstrap, acks="all") as p:
        for i in range(100):
            p.send("timed-end", b"%d" % i, partition=i % 2, timestamp_ms=base + 1000 * i)
        p.flush(30)

    def values(**options: str) -> list[int]:
        r = spark.read.format("tidelog").option("bootstrap.servers", cluster.bootstrap).option("subscribe",
                                                                                              "timed-end")
        for k, v in options.items():
            r = r.option(k, v)
        return sorted(int(row.value) for row in r.load().select("value").collect())

    assert values(endingTimestamp=str(base + 1000 * 60 + 500)) == list(range(61))
    assert values(endingOffsetsByTimestamp=json.dumps({"timed-end": {"0": base + 1000 * 20}})) == \
        sorted([i for i in range(0, 20, 2)] + list(range(1, 100, 2)))
    assert values(endingTimestamp=str(base + 10**9)) == list(range(100)), "no later record: to the end"


def test_min_offsets_per_trigger_skips_small_triggers(spark, cluster, tmp_path):
    """After the first batch of a run, a trigger with fewer than minOffsetsPerTrigger new
    offsets runs no batch (maxTriggerDelay is an hour here); once enough arrive, one batch
    reads them all."""
    create_topic(cluster, "gated", 1)
    produce(cluster.bootstrap, "gated", [b"a%d" % i for i in range(5)])
    batches: list[list[tuple]] = []

    def collect(df, batch_id):
        batches.append([tuple(r) for r in df.select(*COLUMNS).collect()])

    q = (reader(spark, cluster.bootstrap, subscribe="gated", startingOffsets="earliest", minOffsetsPerTrigger=10,
                maxTriggerDelay="1h").writeStream.foreachBatch(collect)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: len(batches) >= 1, QUERY_TIMEOUT_S, "the first batch")
        produce(cluster.bootstrap, "gated", [b"b%d" % i for i in range(3)])
        time.sleep(2)  # several triggers see 3 new offsets: none may run a batch
        produce(cluster.bootstrap, "gated", [b"c%d" % i for i in range(7)])
        wait_until(lambda: sum(len(b) for b in batches) >= 15, QUERY_TIMEOUT_S, "all 15 records")
    finally:
        q.stop()
    sizes = [len(b) for b in batches if b]
    assert sizes == [5, 10], sizes


def _readme_spark_blocks() -> list[str]:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("\n## Spark\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_spark_snippets_run_as_written(spark, cluster, tmp_path, monkeypatch):
    """README.md's Spark snippets, verbatim but for the bootstrap address and the checkpoint
    path, in a session whose Python workers would run the ``python3`` on PATH
    (PYSPARK_PYTHON unset): ``register(spark)`` points them at this interpreter."""
    import ast

    blocks = _readme_spark_blocks()
    assert blocks, "README.md's Spark section has no python snippet"
    with Admin(cluster.bootstrap) as admin:
        for name in ("orders", "orders-upper"):
            if name not in admin.list_topics():
                admin.create_topics([NewTopic(name, 1, 3)])
                wait_topic_ready(cluster, name, 1, 3)
        orders_partitions = len(admin.describe_topics(["orders"])[0].partitions)
    produce(cluster.bootstrap, "orders", [b"order-%d" % i for i in range(200)], partition=0)
    orders_total = sum(high_watermarks(cluster.bootstrap, "orders", orders_partitions).values())
    before = sum(high_watermarks(cluster.bootstrap, "orders-upper", 1).values())
    sc = spark.sparkContext
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setattr(sc, "pythonExec", "python3")
    namespace: dict[str, Any] = {"spark": spark}
    last = None
    try:
        for block in blocks:
            code = block.replace("localhost:9092", cluster.bootstrap).replace("/tmp/ckpt", str(tmp_path / "ckpt"))
            tree = ast.parse(code)
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                exec(compile(ast.Module(tree.body[:-1], []), "README.md", "exec"), namespace)
                last = eval(compile(ast.Expression(tree.body[-1].value), "README.md", "eval"), namespace)
            else:
                exec(compile(tree, "README.md", "exec"), namespace)
        assert sc.pythonExec == sys.executable
        rows = last.select("topic", "partition", "offset").collect()  # partition 0's offsets [100, 200)
        assert sorted(r.offset for r in rows if r.partition == 0) == list(range(100, 200))
        end = wait_until(lambda: (n := sum(high_watermarks(cluster.bootstrap, "orders-upper", 1).values()))
                         >= before + orders_total and n, QUERY_TIMEOUT_S, "the streaming query's output")
        got: list[bytes] = []
        with Consumer(cluster.bootstrap, auto_offset_reset="earliest") as c:
            c.assign([TopicPartition("orders-upper", 0)])
            c.seek(TopicPartition("orders-upper", 0), before)
            deadline = time.monotonic() + 60
            while len(got) < end - before and time.monotonic() < deadline:
                got += [r.value for r in c.poll(timeout_ms=500)]
        assert all(v == v.upper() for v in got)
        assert {b"ORDER-%d" % i for i in range(200)} <= set(got)
    finally:
        for q in spark.streams.active:
            q.stop()
        monkeypatch.undo()
        from tidelog.spark import register

        register(spark)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (./dev setup installs it)")
def test_kcat_and_spark_read_each_others_records_byte_for_byte(spark, cluster):
    """kcat (librdkafka) on the Kafka listener -> the tidelog source; the tidelog sink -> kcat."""
    create_topic(cluster, "from-kcat", 1)
    values = [bytes([i % 256]) * (i % 7 + 1) + b"\x00\xff" for i in range(50)]
    payload = b"".join(b"key%d\t%s\n" % (i, v.hex().encode()) for i, v in enumerate(values))
    # kcat splits on the delimiter, so the values travel hex-encoded and are compared decoded
    subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, "-t", "from-kcat", "-P", "-K", "\t", "-z", "lz4",
                    "-H", "origin=kcat", "-X", "acks=all"], input=payload, check=True, timeout=60)
    rows = (spark.read.format("tidelog").option("bootstrap.servers", cluster.bootstrap)
            .option("subscribe", "from-kcat").option("includeHeaders", "true").load().collect())
    assert sorted((r.offset, r.key, bytes.fromhex(r.value.decode()), [(h.key, h.value) for h in r.headers])
                  for r in rows) == [(i, b"key%d" % i, v, [("origin", b"kcat")]) for i, v in enumerate(values)]

    create_topic(cluster, "to-kcat", 1)
    df = spark.createDataFrame([(b"k%d" % i, v.hex().encode()) for i, v in enumerate(values)],
                               "key binary, value binary")
    (df.write.format("tidelog").option("bootstrap.servers", cluster.bootstrap).option("topic", "to-kcat")
     .mode("append").save())
    out = subprocess.run(["kcat", "-b", cluster.kafka_bootstrap, "-t", "to-kcat", "-C", "-e", "-o", "beginning",
                          "-f", "%k %s\\n"], capture_output=True, check=True, timeout=60).stdout
    got = sorted(line.split(b" ") for line in out.splitlines())
    assert sorted((k, bytes.fromhex(v.decode())) for k, v in got) == sorted(
        (b"k%d" % i, v) for i, v in enumerate(values))
