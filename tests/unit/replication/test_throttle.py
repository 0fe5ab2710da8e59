"""The replication throttle's rules (broker/replication/throttle.py, protocol/throttles.py):
the throttled-replica lists Kafka writes, and the byte-rate bucket, with time passed in."""

from __future__ import annotations

import pytest

from tidelog.broker.replication.throttle import ReplicationQuota
from tidelog.protocol.throttles import check_rate, is_throttled, normalize_throttled_replicas


def test_lists_are_kafkas_partition_broker_pairs_or_a_star():
    assert normalize_throttled_replicas(" 1:2, 0:3,1:2 ") == "0:3,1:2"
    assert normalize_throttled_replicas("*") == "*" and normalize_throttled_replicas("") == ""
    assert is_throttled("0:3,1:2", 1, 2) and not is_throttled("0:3,1:2", 1, 3)
    assert is_throttled("*", 7, 9) and not is_throttled("", 0, 1)
    for bad in ("1", "a:b", "1:2,", "1:-2"):
        with pytest.raises(ValueError, match="partition:broker"):
            normalize_throttled_replicas(bad)


def test_rates_are_positive_whole_bytes_per_second():
    check_rate("leader.replication.throttled.rate", "1048576")
    check_rate("leader.replication.throttled.rate", None)
    check_rate("leader.replication.throttled.rate", str(2**63 - 1))
    for bad in ("0", "-5", "1.5", "fast", "1" + "0" * 400, str(2**63)):
        with pytest.raises(ValueError, match="leader.replication.throttled.rate"):
            check_rate("leader.replication.throttled.rate", bad)


def test_the_bucket_holds_a_second_of_the_rate_and_refills_at_it():
    rate = {"now": 1000}
    q = ReplicationQuota(lambda: rate["now"])
    assert not q.exceeded(0.0)  # a new rate starts with a full second's worth
    q.record(1500, 0.0)  # one read may overdraw: the replica then waits
    assert q.exceeded(0.0) and q.exceeded(0.4)
    assert not q.exceeded(0.6)  # 600 bytes refilled over the 500 owed
    assert q.throttled_bytes == 1500
    q.record(10_000, 0.6)
    rate["now"] = None  # the throttle removed: nothing waits any more
    assert not q.exceeded(0.7)
    rate["now"] = 5000  # a new rate starts full again
    assert not q.exceeded(0.7)


def test_an_unset_rate_never_holds_anything():
    q = ReplicationQuota(lambda: None)
    q.record(10**9, 0.0)
    assert not q.exceeded(0.0) and q.throttled_bytes == 10**9


def test_bytes_read_for_an_answer_not_yet_charged_count_as_spent():
    q = ReplicationQuota(lambda: 1000)
    assert not q.exceeded(0.0, pending=999)  # one byte of the second's worth is left
    assert q.exceeded(0.0, pending=1000)  # a later partition of the same answer waits
    assert q.throttled_bytes == 0  # nothing charged until the answer is
