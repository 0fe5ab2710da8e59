"""The Spark row of the fault matrix (docs/reliability.md): F16, the Spark driver SIGKILLed mid-batch
and restarted from its checkpoint, checked by I14 and the sink's at-least-once guarantee
(``spark_harness``, which explains the oracle) on top of the harness's oracle for the input topic.

The harness's 3-broker cluster, its topic (3 partitions, RF 3, min ISR 2) fed by its acks=all
producer and read by one live consumer, and a Structured Streaming query in a driver process of
its own (``spark_driver``: a local Spark, the tidelog source from the earliest offsets, at most
``MAX_OFFSETS_PER_TRIGGER`` offsets a batch, the tidelog sink into a second topic of 3
partitions, RF 3). ``KILLS`` times (x ``--soak``): once the run has committed a batch (after a
kill: the replay), the driver's processes (Python driver, JVM, Spark's Python workers) are
SIGKILLed while the next batch is in flight, ``KILL_DELAYS_S[i]`` after it was planned, and a
new driver starts on the same checkpoint. Then the last run commits a batch (the replay) under
the load, the producer stops, the run catches up with the high watermarks and stops cleanly,
the output topic is read, and both oracles run.

The tidelog sink is at-least-once (README, "The sink"): a batch in flight at a kill may have
written some or all of its rows, and its replay writes them all again. So the oracle allows
exactly those duplicates, and no others, and no loss.

One driver runs at a time: each costs ~1.4 GB and, on a loaded 2-core machine, 10-20 s to get
its Spark session and about as long again for its first batch (Spark's Python workers start).
The scenario takes about 85 s; with ``--soak`` about 4 minutes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.spark import spark_unavailable
from tests.system.harness import Scenario
from tests.system.spark_harness import SparkDriver, check_spark, read_output

RATE = 300                      # records/s from the harness's producer
WARMUP_ACKS = 300               # acknowledged records before the first driver starts
KILLS = 1                       # x --soak
KILL_DELAYS_S = (0.5, 0.0)      # how long a batch runs before the kill (cycled): while it writes, or at once
MAX_OFFSETS_PER_TRIGGER = 3000  # 10 s of input: a run's first batches catch up in a few steps
OUTPUT = "spark-out"


def test_f16_spark_driver_killed_mid_batch(tmp_path: Path, soak: int) -> None:
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    with Scenario(tmp_path, "F16 spark driver killed mid-batch", rate=RATE, consumers=1) as s:
        s.create_topic(OUTPUT, s.partitions, 3, {"min.insync.replicas": "2"})
        s.wait_acked(WARMUP_ACKS)
        with SparkDriver(s, tmp_path / "spark", OUTPUT,
                         {"maxOffsetsPerTrigger": MAX_OFFSETS_PER_TRIGGER}) as driver:
            driver.start()
            for i in range(KILLS * soak):
                driver.kill_mid_batch(delay_s=KILL_DELAYS_S[i % len(KILL_DELAYS_S)])
                driver.start()
            driver.wait_batches(1)  # the replay, still under the load
            ends = s.stop_workload()
            committed = driver.wait_caught_up(ends)
            driver.stop()
            written = read_output(s.bootstrap, OUTPUT, s.partitions)
            s.note(f"read {len(written)} records from {OUTPUT!r}")
        report = s.check()
    report.assert_ok()
    spark = check_spark(s.final_log, driver.checkpoint.planned_ends(), committed, driver.kills, driver.run,
                        {run: driver.progress(run) for run in range(1, driver.run + 1)}, written)
    spark.assert_ok()
