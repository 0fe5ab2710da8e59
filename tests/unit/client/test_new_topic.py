"""``NewTopic`` refuses what no broker would create, when it is built: a partition count or
replication factor that is neither positive nor -1 (the broker's default), one the request
cannot carry, or an explicit assignment given with either."""

from __future__ import annotations

import pytest

from tidelog.aio import NewTopic


@pytest.mark.parametrize("n", [0, -2, -(2**31)])
def test_a_partition_count_must_be_positive_or_minus_one(n):
    with pytest.raises(ValueError, match=rf"topic 't': num_partitions must be positive or -1 .*, got {n}$"):
        NewTopic("t", n)


@pytest.mark.parametrize("rf", [0, -2, -100])
def test_a_replication_factor_must_be_positive_or_minus_one(rf):
    with pytest.raises(ValueError, match=rf"topic 't': replication_factor must be positive or -1 .*, got {rf}$"):
        NewTopic("t", 1, rf)


def test_values_the_request_cannot_carry_are_refused():
    with pytest.raises(ValueError, match=r"num_partitions .* at most 2147483647, got 2147483648"):
        NewTopic("t", 2**31)
    with pytest.raises(ValueError, match=r"replication_factor .* at most 32767, got 32768"):
        NewTopic("t", 1, 2**15)
    with pytest.raises(TypeError, match=r"num_partitions must be an int, got '3'"):
        NewTopic("t", "3")
    with pytest.raises(TypeError, match=r"replication_factor must be an int, got True"):
        NewTopic("t", 1, True)


def test_an_assignment_excludes_the_counts():
    """As Kafka's broker refuses both (INVALID_REQUEST): the assignment sets them."""
    with pytest.raises(ValueError, match=r"topic 't': replica_assignment sets the partitions and replication "
                                         r"factor: give num_partitions=3 or it, not both"):
        NewTopic("t", 3, replica_assignment={0: [1]})
    with pytest.raises(ValueError, match=r"replication_factor=2 or it"):
        NewTopic("t", replication_factor=2, replica_assignment={0: [1]})


def test_the_defaults_and_positive_values_are_accepted():
    assert NewTopic("t").to_creatable().num_partitions == -1
    assert (NewTopic("t", 3, 2).to_creatable().replication_factor, NewTopic("t", 3).num_partitions) == (2, 3)
    assert NewTopic("t", replica_assignment={0: [1, 2]}).to_creatable().assignments == {"0": [1, 2]}
