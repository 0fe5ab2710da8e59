"""A local Spark session as the tests run one: the Spark tests' shared session
(tests/spark/conftest.py) and the fault matrix's driver process (tests/system/spark_driver.py).

A session costs about 1.4 GB and 5 s to start on this 2-core machine: never two running at
once (FEASIBILITY 3, pitfall 16). The settings are FEASIBILITY's recommended ones.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop
logger.hadoop.level = error
"""


def spark_unavailable() -> str | None:
    """Why Spark cannot run here, or None."""
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))):
        return "Java is not installed (Spark needs a JRE 17+: apt-get install default-jre-headless)"
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        return f"pyspark is not installed ({e}): pip install -r requirements-spark-lock.txt"
    return None


def local_session(directory: Path, app_name: str) -> Any:
    """A ``local[2]`` SparkSession whose files (config, scratch, warehouse, temporary) are under
    ``directory``, with the ``tidelog`` format registered. Sets the process's Spark
    environment first: workers run this interpreter (else `python3` from PATH)."""
    for sub in ("conf", "local", "warehouse", "tmp"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    (directory / "conf" / "log4j2.properties").write_text(LOG4J2)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["SPARK_CONF_DIR"] = str(directory / "conf")
    from pyspark.sql import SparkSession

    from tidelog.spark import register

    session = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.driver.memory", "1g")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.python.worker.reuse", "true")
               .config("spark.sql.streaming.stopTimeout", "10s")
               .config("spark.local.dir", str(directory / "local"))
               .config("spark.sql.warehouse.dir", str(directory / "warehouse"))
               # the JVM's own temporary files too (a killed driver leaves them behind)
               .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss1m "
                       f"-Djava.io.tmpdir={directory / 'tmp'}")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session
