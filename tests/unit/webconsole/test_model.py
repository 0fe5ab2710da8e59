"""The console's pure parts: a partition's replicas on one axis, paging, the bounded history
window, rates from counters, config edits and the ACL decisions of what to offer."""

from __future__ import annotations

import pytest

from tidelog.aio.admin import ReplicaInfo
from tidelog.aio.cluster import PartitionInfo
from tidelog.protocol.acls import AclBinding
from tidelog.protocol.topics import TopicPartition
from tidelog.webconsole.model import (
    MAX_PAGE_SIZE,
    BadRequest,
    Window,
    config_changes,
    decode_text,
    growth,
    matching,
    page,
    page_params,
    partition_counts,
    partition_view,
)
from tidelog.webconsole.permissions import ACLS, OPEN, READ_ONLY, Permissions, principal_of
from tidelog.webconsole.server import ConsoleConfig

TP = TopicPartition("orders", 0)


def replica(start: int, leo: int, hw: int, size: int = 100) -> ReplicaInfo:
    return ReplicaInfo(TP, size, 0, False, start, leo, hw)


def test_a_lagging_follower_is_drawn_behind_the_leader_and_apart_from_the_isr():
    info = PartitionInfo("orders", 0, leader=1, leader_epoch=4, replicas=(1, 2, 3), isr=(1, 2))
    view = partition_view(info, {1: replica(0, 120, 100), 2: replica(0, 120, 100), 3: replica(10, 40, 40)})
    assert (view.leader, view.leader_epoch, view.high_watermark) == (1, 4, 100)
    by_broker = {r.broker: r for r in view.replicas}
    assert by_broker[1].is_leader and by_broker[1].in_isr and by_broker[1].lag == 0
    assert not by_broker[3].in_isr and by_broker[3].lag == 80
    assert view.axis == (0, 120) and view.under_replicated
    assert view.to_json()["replicas"][2]["in_isr"] is False


def test_a_replica_whose_broker_did_not_answer_is_unknown_not_empty():
    info = PartitionInfo("orders", 0, leader=2, leader_epoch=1, replicas=(1, 2), isr=(2,), offline=(1,))
    view = partition_view(info, {2: replica(5, 50, 50)})
    r1 = view.replicas[0]
    assert (r1.log_end_offset, r1.lag, r1.offline) == (-1, None, True)
    assert view.axis == (5, 50)


def test_a_broker_that_stopped_answering_keeps_its_last_figures_marked_stale():
    info = PartitionInfo("orders", 0, leader=1, leader_epoch=2, replicas=(1, 3), isr=(1,), offline=(3,))
    view = partition_view(info, {1: replica(0, 500, 500), 3: replica(0, 200, 200)}, stale={3})
    r3 = view.replicas[1]
    assert (r3.stale, r3.log_end_offset, r3.lag, r3.in_isr) == (True, 200, 300, False)
    assert not view.replicas[0].stale


def test_without_the_leaders_answer_the_hw_is_the_best_known_of_the_isr():
    info = PartitionInfo("orders", 0, leader=1, leader_epoch=1, replicas=(1, 2, 3), isr=(1, 2, 3))
    view = partition_view(info, {2: replica(0, 30, 25), 3: replica(0, 30, 28)})
    assert view.high_watermark == 28 and all(r.lag is None for r in view.replicas)
    assert partition_view(info, {}).axis == (0, 0)


def test_pages_hold_at_most_their_size_and_a_page_past_the_end_is_the_last():
    names = [f"t{i:05d}" for i in range(10_000)]
    p = page(names, 3, 50)
    assert (p.items[0], len(p.items), p.pages, p.total) == ("t00100", 50, 200, 10_000)
    assert page(names, 999, 500).number == 20 and page([], 4, 10).to_json() == {
        "items": [], "page": 1, "size": 10, "total": 0, "pages": 1}


def test_page_parameters_are_checked_and_named():
    assert page_params({}) == (1, 50)
    with pytest.raises(BadRequest, match="size must be between 1 and 500"):
        page_params({"size": str(MAX_PAGE_SIZE + 1)})
    with pytest.raises(BadRequest, match="page must be an integer"):
        page_params({"page": "two"})


def test_matching_filters_case_insensitively_and_sorts():
    assert matching(["b-Orders", "a", "orders"], "ORD") == ["b-Orders", "orders"]
    assert matching(["b", "a"], "") == ["a", "b"]


def test_the_history_window_is_bounded_by_age_and_by_count():
    w = Window(span_ms=10_000, max_points=5)
    for t in range(0, 20_000, 1000):
        w.add(t, t)
    assert len(w) == 5 and w.points()[0][0] == 15_000
    w = Window(span_ms=3_000, max_points=100)
    for t in range(0, 10_000, 1000):
        w.add(t, 1)
    assert [t for t, _ in w.points()] == [6000, 7000, 8000, 9000]


def test_rates_sum_positive_growths_of_subjects_in_both_samples():
    before = {"a": ("t", 100, 1), "b": ("t", 50, 1), "gone": ("t", 7, 1), "c": ("u", 10, 2)}
    after = {"a": ("t", 300, 1), "b": ("t", 40, 1), "new": ("t", 10**9, 1), "c": ("u", 20, 2)}
    # a: +200; b shrank (retention, truncation): nothing; new and gone: not in both
    assert growth((1000, before), (3000, after)) == {"t": 100.0, "u": 10.0}
    assert growth((1000, before), (1000, after)) == {}
    assert growth((1000, {}), (2000, after)) == {}  # no subject in both: unknown, not 0


def test_partition_counts_find_under_replicated_and_offline():
    parts = [PartitionInfo("t", 0, 1, 0, (1, 2), (1, 2)), PartitionInfo("t", 1, 1, 0, (1, 2), (1,)),
             PartitionInfo("t", 2, -1, 0, (1, 2), (1,))]
    assert partition_counts(parts) == (3, 2, 1)


def test_config_edits_name_the_bad_key_or_value():
    assert config_changes({"set": {"retention.ms": 1000}, "delete": ["cleanup.policy"]}) == {
        "retention.ms": "1000", "cleanup.policy": None}
    with pytest.raises(BadRequest, match="'Bad Key' is not a config name"):
        config_changes({"set": {"Bad Key": "1"}})
    with pytest.raises(BadRequest, match="nothing to change"):
        config_changes({})
    with pytest.raises(BadRequest, match="must be a string or a number"):
        config_changes({"set": {"retention.ms": [1]}})


def test_values_that_are_not_utf8_have_no_text():
    assert decode_text(b"caf\xc3\xa9") == "café" and decode_text(b"\xff\xfe") is None and decode_text(None) is None


ALICE = "User:alice"


def acl(name, op, permission="ALLOW", restype="TOPIC", pattern="LITERAL", principal=ALICE, host="*"):
    return AclBinding(restype, name, pattern, principal, host, op, permission)


def test_actions_are_offered_only_where_the_acls_allow_them():
    p = Permissions.from_bindings(ALICE, [acl("orders", "READ"), acl("pay-", "ALL", pattern="PREFIXED"),
                                          acl("pay-secret", "DELETE", "DENY"), acl("*", "DESCRIBE", principal="User:*"),
                                          acl("g", "READ", restype="GROUP")])
    assert p.mode == ACLS
    assert p.can("READ", "TOPIC", "orders") and p.can("DESCRIBE", "TOPIC", "orders")  # Read implies Describe
    assert not p.can("WRITE", "TOPIC", "orders") and not p.can("DELETE", "TOPIC", "orders")
    assert p.can("DELETE", "TOPIC", "pay-in") and not p.can("DELETE", "TOPIC", "pay-secret")
    assert p.can("DESCRIBE", "TOPIC", "anything") and not p.can("CREATE", "TOPIC", "new")
    assert p.can("READ", "GROUP", "g") and not p.can("READ", "GROUP", "h")
    assert Permissions.from_bindings(ALICE, [acl("kafka-cluster", "CREATE", restype="CLUSTER")]).can(
        "CREATE", "TOPIC", "new")
    # the Create button: a prefixed Create on topics is enough to offer it (the name is checked)
    prefixed = Permissions.from_bindings(ALICE, [acl("team-", "CREATE", pattern="PREFIXED")])
    assert prefixed.can_create_topics() and prefixed.can("CREATE", "TOPIC", "team-x")
    assert not prefixed.can("CREATE", "TOPIC", "other") and p.can_create_topics()  # p: All on pay-*
    assert not Permissions.from_bindings(ALICE, [acl("orders", "READ")]).can_create_topics()


def test_a_principal_no_acl_names_is_a_super_user_and_unreadable_acls_offer_no_action():
    assert Permissions.from_bindings(ALICE, [acl("x", "READ", principal="User:bob")]).mode == OPEN
    ro = Permissions(READ_ONLY, ALICE)
    assert ro.can("READ", "TOPIC", "t") and not ro.can("WRITE", "TOPIC", "t") and not ro.can("DELETE", "TOPIC", "t")


def test_the_principal_is_the_sasl_user():
    assert principal_of({"security_protocol": "SASL_SSL", "sasl_plain_username": "ops"}) == "User:ops"
    assert principal_of({}) == "User:ANONYMOUS"


def test_a_login_without_tls_is_refused_with_the_reason():
    assert ConsoleConfig("h:1").problem() is None
    assert "needs TLS" in ConsoleConfig("h:1", login=("u", "p")).problem()
    assert "go together" in ConsoleConfig("h:1", certfile="c.pem").problem()
    assert "--port" in ConsoleConfig("h:1", port=0).problem()
    assert ConsoleConfig("h:1", login=("u", "p"), certfile="c", keyfile="k").problem() is None
