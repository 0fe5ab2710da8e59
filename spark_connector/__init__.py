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

from typing import Any

__all__ = ["register", "TidelogDataSource"]


def register(spark: Any) -> None:
    """Register the ``tidelog`` format with ``spark`` (a SparkSession)."""
    from tidelog.spark.datasource import TidelogDataSource

    spark.dataSource.register(TidelogDataSource)


def __getattr__(name: str) -> Any:
    if name == "TidelogDataSource":
        from tidelog.spark.datasource import TidelogDataSource

        return TidelogDataSource
    raise AttributeError(f"module 'spark_connector' has no attribute {name!r}")
