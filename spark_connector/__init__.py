"""Tidelog for Spark Structured Streaming, through PySpark's Python Data Source API.

    from tidelog.spark import register
    register(spark)
    spark.readStream.format("tidelog").option("bootstrap.servers", "localhost:9092") \\
        .option("subscribe", "orders").load()
    df.writeStream.format("tidelog").option("bootstrap.servers", "localhost:9092") \\
        .option("topic", "out").option("checkpointLocation", "...").start()

Modules: ``options`` (parsing), ``planning`` (offsets and ranges, pure), ``cluster`` (what the
driver asks the cluster), ``fetch`` (reading one range on an executor), ``produce`` (the
sink's sends), ``datasource`` (the Spark classes: the only module that imports pyspark).
Importing this package does not import pyspark; ``register`` and ``TidelogDataSource`` do.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["register", "TidelogDataSource"]


def register(spark: Any) -> None:
    """Register the ``tidelog`` format with ``spark`` (a SparkSession).

    The data source runs in Spark's Python workers, which must import ``tidelog``. PySpark
    starts them with ``PYSPARK_PYTHON`` (the ``python3`` on PATH when it is not set), which
    is often not the environment Tidelog is installed in; so when neither PYSPARK_PYTHON
    nor the ``spark.pyspark.python`` setting names one, the workers run this interpreter
    (``sys.executable``), as they must for a local session. On a cluster whose executors
    have their Python elsewhere, set PYSPARK_PYTHON (or spark.pyspark.python) to it."""
    from tidelog.spark.datasource import TidelogDataSource

    sc = spark.sparkContext
    configured = os.environ.get("PYSPARK_PYTHON") or sc.getConf().get("spark.pyspark.python", None)
    sc.pythonExec = configured or sys.executable
    spark.dataSource.register(TidelogDataSource)


def __getattr__(name: str) -> Any:
    if name == "TidelogDataSource":
        from tidelog.spark.datasource import TidelogDataSource

        return TidelogDataSource
    raise AttributeError(f"module 'spark_connector' has no attribute {name!r}")
