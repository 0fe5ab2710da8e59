"""Assignors and the consumer protocol's bytes: Kafka's examples as tables, and properties
(every partition assigned once, balance within one, stickiness) with Hypothesis."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog.aio.assignors import (
    COOPERATIVE,
    EAGER,
    Assignment,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    Subscription,
    assignors_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    rebalance_protocol,
    sticky_assignment,
    valid_owners,
)
from tidelog.protocol.errors import INCONSISTENT_GROUP_PROTOCOL, TidelogError
from tidelog.protocol.topics import TopicPartition as TP


def subs(**topics_by_member):
    return {m: Subscription(tuple(ts)) for m, ts in topics_by_member.items()}


def parts(assignment):
    return {m: list(a.partitions) for m, a in assignment.items()}


# -- encoding -----------------------------------------------------------------------------------


def test_subscription_round_trip():
    s = Subscription(("b", "a"), b"u", (TP("a", 1), TP("a", 0), TP("b", 3)), 7)
    got = decode_subscription(encode_subscription(s), "inst-1")
    assert got == Subscription(("a", "b"), b"u", (TP("a", 0), TP("a", 1), TP("b", 3)), 7, "inst-1")


def test_assignment_round_trip_and_empty():
    a = Assignment((TP("t", 2), TP("t", 0)), None)
    assert decode_assignment(encode_assignment(a)).partitions == (TP("t", 0), TP("t", 2))
    assert decode_assignment(b"") == Assignment(())


def test_newer_versions_with_extra_fields_decode():
    data = msgpack.packb([3, ["t"], None, [["t", [0]]], 4, "rack-a", {"future": 1}], use_bin_type=True)
    assert decode_subscription(data) == Subscription(("t",), None, (TP("t", 0),), 4)
    data = msgpack.packb([2, [["t", [1]]], b"x", "extra"], use_bin_type=True)
    assert decode_assignment(data) == Assignment((TP("t", 1),), b"x")


def test_kafka_clients_consumer_protocol_bytes_decode():
    """What librdkafka and Java write: int16 version, then Kafka's fields."""
    v0 = b"\x00\x00" + b"\x00\x00\x00\x01" + b"\x00\x01t" + b"\xff\xff\xff\xff"
    assert decode_subscription(v0) == Subscription(("t",), None, (), -1)
    v3 = (b"\x00\x03" + b"\x00\x00\x00\x01\x00\x01t" + b"\x00\x00\x00\x01u"
          + b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x02" + b"\x00\x00\x00\x05" + b"\x00\x02r1"
          + b"future fields")
    assert decode_subscription(v3, "i") == Subscription(("t",), b"u", (TP("t", 2),), 5, "i")
    assignment = b"\x00\x00" + b"\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x01" + b"\xff\xff\xff\xff"
    assert decode_assignment(assignment) == Assignment((TP("t", 0), TP("t", 1)))


def test_what_tidelog_writes_is_kafkas_format():
    data = encode_subscription(Subscription(("t",), None, (TP("t", 1),), 4))
    assert data == (b"\x00\x03\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff\x00\x00\x00\x01\x00\x01t"
                    b"\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x04\xff\xff")
    assert encode_assignment(Assignment((TP("t", 0),))) == (
        b"\x00\x03\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x01\x00\x00\x00\x00\xff\xff\xff\xff")


@pytest.mark.parametrize("data, problem", [
    (b"\xc1", "shorter than a version"),
    (msgpack.packb({"a": 1}), "unknown version"),
    (b"\x00\x00\x00\x00\x00\x05", "announced"),  # Kafka's format: 5 topics in 2 bytes
    (b"\x00\x01\x00\x00\x00\x01\xff\xff", r"topics\[\]: length -1"),  # a null topic name
    (msgpack.packb([0, [], None, [], 1]), "version"),
    (msgpack.packb([1, [1], None, [], 1]), "topics"),
    (msgpack.packb([1, ["t"], None, [["t", [-1]]], 1]), "partition number"),
    (msgpack.packb([1, ["t"], "text", [], 1]), "user_data"),
    (msgpack.packb([1, ["t"], None, [["t"]], 1]), "partition entry"),
])
def test_malformed_subscription_names_the_problem(data, problem):
    with pytest.raises(TidelogError, match=problem) as info:
        decode_subscription(data)
    assert info.value.error is INCONSISTENT_GROUP_PROTOCOL


# -- range and round robin (Kafka's RangeAssignorTest / RoundRobinAssignorTest cases) --------------


def test_range_two_members_two_topics_three_partitions():
    got = parts(RangeAssignor().assign({"t1": 3, "t2": 3}, subs(c1=["t1", "t2"], c2=["t1", "t2"])))
    assert got == {"c1": [TP("t1", 0), TP("t1", 1), TP("t2", 0), TP("t2", 1)],
                   "c2": [TP("t1", 2), TP("t2", 2)]}


def test_range_only_subscribed_members_share_a_topic():
    got = parts(RangeAssignor().assign({"t1": 3, "t2": 2}, subs(c1=["t1"], c2=["t1", "t2"])))
    assert got == {"c1": [TP("t1", 0), TP("t1", 1)], "c2": [TP("t1", 2), TP("t2", 0), TP("t2", 1)]}


def test_range_static_members_sort_by_instance_id():
    s = {"z-member": Subscription(("t",), group_instance_id="a"),
         "a-member": Subscription(("t",), group_instance_id="b")}
    assert parts(RangeAssignor().assign({"t": 2}, s)) == {"z-member": [TP("t", 0)], "a-member": [TP("t", 1)]}


def test_range_unknown_topics_and_more_members_than_partitions():
    got = parts(RangeAssignor().assign({"t": 1}, subs(a=["t", "gone"], b=["t"])))
    assert got == {"a": [TP("t", 0)], "b": []}


def test_round_robin_deals_in_turn_skipping_unsubscribed():
    got = parts(RoundRobinAssignor().assign({"t1": 3, "t2": 2}, subs(c0=["t1"], c1=["t1", "t2"], c2=["t2"])))
    # t1-0 c0, t1-1 c1, t1-2 (c2 not subscribed) c0, t2-0 c1, t2-1 c2
    assert got == {"c0": [TP("t1", 0), TP("t1", 2)], "c1": [TP("t1", 1), TP("t2", 0)], "c2": [TP("t2", 1)]}


def test_round_robin_no_members():
    assert RoundRobinAssignor().assign({"t": 3}, {}) == {}


# -- sticky -------------------------------------------------------------------------------------


def owned(topics, tps, generation=1):
    return Subscription(tuple(topics), None, tuple(tps), generation)


def test_sticky_member_leaving_moves_only_its_partitions():
    before = {"a": [TP("t", 0), TP("t", 3)], "b": [TP("t", 1), TP("t", 4)], "c": [TP("t", 2), TP("t", 5)]}
    s = {m: owned(["t"], tps) for m, tps in before.items() if m != "c"}
    got = parts(CooperativeStickyAssignor().assign({"t": 6}, s))
    assert set(before["a"]) <= set(got["a"]) and set(before["b"]) <= set(got["b"])
    assert len(got["a"]) == len(got["b"]) == 3


def test_cooperative_new_member_gets_nothing_until_owners_revoke():
    s = {"a": owned(["t"], [TP("t", p) for p in range(4)]), "b": owned(["t"], [])}
    first = parts(CooperativeStickyAssignor().assign({"t": 4}, s))
    assert len(first["a"]) == 2 and first["b"] == []  # two revoked from a, not yet given to b
    s = {"a": owned(["t"], first["a"], 2), "b": owned(["t"], [], 2)}
    second = parts(CooperativeStickyAssignor().assign({"t": 4}, s))
    assert second["a"] == first["a"] and len(second["b"]) == 2


def test_sticky_conflicting_claims_the_higher_generation_wins():
    s = {"a": owned(["t"], [TP("t", 0)], 3), "b": owned(["t"], [TP("t", 0)], 2)}
    got = parts(CooperativeStickyAssignor().assign({"t": 2}, s))
    assert got == {"a": [TP("t", 0)], "b": [TP("t", 1)]}


def test_sticky_drops_owned_partitions_of_unsubscribed_or_missing_topics():
    s = {"a": owned(["u"], [TP("t", 0), TP("u", 5)]), "b": owned(["t"], [])}
    got = parts(CooperativeStickyAssignor().assign({"t": 1, "u": 1}, s))
    assert got == {"a": [TP("u", 0)], "b": [TP("t", 0)]}


def test_protocols():
    assert rebalance_protocol(assignors_for(["cooperative-sticky"])) == COOPERATIVE
    assert rebalance_protocol(assignors_for(["range", "cooperative-sticky"])) == EAGER
    assert [a.name for a in assignors_for("roundrobin, range")] == ["roundrobin", "range"]
    with pytest.raises(ValueError, match="unknown partition assignor 'sticky'"):
        assignors_for(["sticky"])


# -- properties ---------------------------------------------------------------------------------


@st.composite
def groups(draw, equal_subscriptions=True):
    topics = {f"t{i}": draw(st.integers(0, 8)) for i in range(draw(st.integers(1, 3)))}
    members = [f"m{i}" for i in range(draw(st.integers(1, 6)))]
    if equal_subscriptions:
        chosen = {m: tuple(topics) for m in members}
    else:
        chosen = {m: tuple(draw(st.sets(st.sampled_from(sorted(topics)), min_size=1))) for m in members}
    return topics, chosen


def _check_complete(topics, chosen, assignment):
    seen = [tp for a in assignment.values() for tp in a.partitions]
    assert len(seen) == len(set(seen)), "a partition assigned twice"
    wanted = {TP(t, p) for t, n in topics.items() for p in range(n)
              if any(t in ts for ts in chosen.values())}
    assert set(seen) == wanted
    for m, a in assignment.items():
        assert all(tp.topic in chosen[m] for tp in a.partitions), "assigned an unsubscribed topic"


@settings(max_examples=150)
@given(groups(equal_subscriptions=False),
       st.sampled_from([RangeAssignor, RoundRobinAssignor, CooperativeStickyAssignor]))
def test_every_partition_assigned_exactly_once(group, assignor):
    topics, chosen = group
    assignment = assignor().assign(topics, {m: Subscription(ts) for m, ts in chosen.items()})
    _check_complete(topics, chosen, assignment)


@settings(max_examples=150)
@given(groups(), st.sampled_from([RoundRobinAssignor, CooperativeStickyAssignor]))
def test_balanced_within_one_with_equal_subscriptions(group, assignor):
    topics, chosen = group
    sizes = [len(a.partitions) for a in
             assignor().assign(topics, {m: Subscription(ts) for m, ts in chosen.items()}).values()]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=150)
@given(groups(), st.data())
def test_sticky_keeps_owned_partitions_where_balanced(group, data):
    """From any earlier (possibly unbalanced) ownership of a changed membership: the result
    is complete and balanced, each member keeps min(owned, floor(P/N)) of its partitions, and
    a balanced complete ownership is kept exactly (no partition moves)."""
    topics, chosen = group
    all_tps = [TP(t, p) for t, n in topics.items() for p in range(n)]
    members = list(chosen)
    before = {m: [] for m in members}
    for tp in all_tps:  # an arbitrary earlier owner, or none (its owner left)
        owner = data.draw(st.sampled_from(members + [None]))
        if owner is not None:
            before[owner].append(tp)
    s = {m: owned(chosen[m], before[m]) for m in members}
    sticky = sticky_assignment(topics, s, valid_owners(topics, s))
    _check_complete(topics, chosen, {m: Assignment(tuple(v)) for m, v in sticky.items()})
    sizes = [len(v) for v in sticky.values()]
    assert max(sizes) - min(sizes) <= 1
    floor = len(all_tps) // len(members)
    for m in members:
        assert len(set(before[m]) & set(sticky[m])) >= min(len(before[m]), floor)
    balanced = max(len(v) for v in before.values()) - min(len(v) for v in before.values()) <= 1
    if balanced and sum(len(v) for v in before.values()) == len(all_tps):
        assert {m: set(v) for m, v in sticky.items()} == {m: set(v) for m, v in before.items()}
    # the cooperative step only holds back partitions that change owner
    cooperative = CooperativeStickyAssignor().assign_partitions(topics, s)
    for m in members:
        held_back = set(sticky[m]) - set(cooperative[m])
        assert set(cooperative[m]) <= set(sticky[m])
        assert all(tp in before[o] and o != m for tp in held_back for o in members if tp in before[o])
        assert all(any(tp in before[o] for o in members if o != m) for tp in held_back)
