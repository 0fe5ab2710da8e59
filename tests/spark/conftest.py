"""Spark fixtures: ONE local SparkSession for the whole test run (a sync session fixture).

A Spark session costs about 1.4 GB and 5 s to start on this 2-core machine, so it is shared,
and never two at once (FEASIBILITY 3, pitfall 16); ``tests.support.spark`` builds it with
FEASIBILITY's recommended settings. The Spark tests are skipped, with the reason shown, only
when Java or pyspark is missing; the unit tests of this directory need neither.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.spark import local_session, spark_unavailable


@pytest.fixture(scope="session")
def spark(tmp_path_factory) -> Iterator[object]:
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    session = local_session(tmp_path_factory.mktemp("spark"), "tidelog-tests")
    try:
        yield session
    finally:
        for q in session.streams.active:
            q.stop()
        session.stop()
