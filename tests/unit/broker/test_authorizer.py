"""The ACL authorizer's decision rules (broker/security/authorizer.py), the binding model and
filters (protocol/acls.py), the inter-broker rule, and the ZooKeeper encodings of ACLs."""

from __future__ import annotations

import pytest

from tidelog.broker.context import RequestContext, host_of
from tidelog.broker.security.authorizer import AclCache, Authorizer, cluster_action_problem, decide
from tidelog.broker.zookeeper.layout import (
    ZkPaths,
    check_acl_name,
    decode_acl_change,
    decode_acls,
    encode_acl_change,
    encode_acls,
)
from tidelog.protocol.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclError,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from tidelog.protocol.codec import ApiKey, RequestHeader

A, D = AclPermissionType.ALLOW, AclPermissionType.DENY
R, W, DESC, ALL = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE, AclOperation.ALL
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALICE, BOB = "User:alice", "User:bob"
HOST = "10.0.0.1"


def authorizer(*acls, super_users=(), allow_if_none=False) -> Authorizer:
    """acls: (type, name, pattern type, principal, host, operation, permission)."""
    a = Authorizer(super_users, allow_if_none)
    by_pattern: dict = {}
    for rtype, name, ptype, *entry in acls:
        by_pattern.setdefault((rtype, name, ptype), set()).add(tuple(entry))
    for pattern, entries in by_pattern.items():
        a.set_acls(*pattern, frozenset(entries))
    return a


# -- the rules -----------------------------------------------------------------------------------


def test_no_acl_refuses_unless_allow_everyone_if_no_acl_found():
    assert not authorizer().authorize(ALICE, HOST, R, TOPIC, "t")
    assert authorizer(allow_if_none=True).authorize(ALICE, HOST, R, TOPIC, "t")
    # an ACL for someone else on the resource: no longer "no ACL found"
    a = authorizer((TOPIC, "t", LIT, BOB, "*", R, A), allow_if_none=True)
    assert not a.authorize(ALICE, HOST, R, TOPIC, "t")
    assert a.authorize(ALICE, HOST, R, TOPIC, "other")


def test_allow_matches_principal_host_and_operation():
    a = authorizer((TOPIC, "t", LIT, ALICE, "*", R, A))
    assert a.authorize(ALICE, HOST, R, TOPIC, "t")
    assert not a.authorize(BOB, HOST, R, TOPIC, "t")
    assert not a.authorize(ALICE, HOST, W, TOPIC, "t")
    assert not a.authorize(ALICE, HOST, R, TOPIC, "t2")
    assert not a.authorize(ALICE, HOST, R, GROUP, "t")


def test_deny_wins_over_allow():
    a = authorizer((TOPIC, "t", LIT, ALICE, "*", ALL, A), (TOPIC, "t", LIT, ALICE, "*", W, D))
    assert a.authorize(ALICE, HOST, R, TOPIC, "t")
    assert not a.authorize(ALICE, HOST, W, TOPIC, "t")
    # a deny on the wildcard resource or principal, or a prefix, wins as well
    a = authorizer((TOPIC, "t", LIT, ALICE, "*", R, A), (TOPIC, "*", LIT, "User:*", "*", R, D))
    assert not a.authorize(ALICE, HOST, R, TOPIC, "t")
    a = authorizer((TOPIC, "orders", LIT, ALICE, "*", R, A), (TOPIC, "ord", PRE, ALICE, HOST, ALL, D))
    assert not a.authorize(ALICE, HOST, R, TOPIC, "orders")
    assert a.authorize(ALICE, "10.0.0.2", R, TOPIC, "orders")  # the deny names one host


def test_wildcards_principal_host_and_resource():
    a = authorizer((TOPIC, "*", LIT, "User:*", "*", R, A))
    assert a.authorize(ALICE, HOST, R, TOPIC, "anything")
    assert a.authorize(BOB, "::1", R, TOPIC, "t")
    assert not a.authorize(ALICE, HOST, R, GROUP, "anything")
    a = authorizer((TOPIC, "t", LIT, ALICE, "10.0.0.9", R, A))
    assert not a.authorize(ALICE, HOST, R, TOPIC, "t")
    assert a.authorize(ALICE, "10.0.0.9", R, TOPIC, "t")


def test_a_literal_star_name_is_a_wildcard_but_not_a_prefix():
    a = authorizer((TOPIC, "*", PRE, ALICE, "*", R, A))  # the prefix "*": names starting with "*"
    assert not a.authorize(ALICE, HOST, R, TOPIC, "t")
    assert a.authorize(ALICE, HOST, R, TOPIC, "*t")


def test_prefixed_patterns_match_names_that_start_with_them():
    a = authorizer((TOPIC, "logs-", PRE, ALICE, "*", W, A), (TOPIC, "logs-secret", PRE, ALICE, "*", W, D),
                   (TOPIC, "l", PRE, BOB, "*", R, A))
    assert a.authorize(ALICE, HOST, W, TOPIC, "logs-app")
    assert a.authorize(ALICE, HOST, W, TOPIC, "logs-")
    assert not a.authorize(ALICE, HOST, W, TOPIC, "logs")
    assert not a.authorize(ALICE, HOST, W, TOPIC, "logs-secret-1")
    assert a.authorize(BOB, HOST, R, TOPIC, "logs-app")
    assert not a.authorize(BOB, HOST, R, TOPIC, "metrics")


def test_implied_operations():
    for op in (R, W, AclOperation.DELETE, AclOperation.ALTER):
        a = authorizer((TOPIC, "t", LIT, ALICE, "*", op, A))
        assert a.authorize(ALICE, HOST, DESC, TOPIC, "t"), op
        assert a.authorize(ALICE, HOST, op, TOPIC, "t")
    a = authorizer((TOPIC, "t", LIT, ALICE, "*", AclOperation.CREATE, A))
    assert not a.authorize(ALICE, HOST, DESC, TOPIC, "t")  # Create does not imply Describe
    a = authorizer((TOPIC, "t", LIT, ALICE, "*", AclOperation.ALTER_CONFIGS, A))
    assert a.authorize(ALICE, HOST, AclOperation.DESCRIBE_CONFIGS, TOPIC, "t")
    a = authorizer((TOPIC, "t", LIT, ALICE, "*", ALL, A))
    assert all(a.authorize(ALICE, HOST, op, TOPIC, "t") for op in AclOperation if op.value >= 3)
    # a deny is never widened: Deny Read does not deny Describe
    a = authorizer((TOPIC, "t", LIT, ALICE, "*", W, A), (TOPIC, "t", LIT, ALICE, "*", R, D))
    assert a.authorize(ALICE, HOST, DESC, TOPIC, "t")


def test_super_users_bypass_acls():
    a = authorizer((TOPIC, "t", LIT, "User:*", "*", ALL, D), super_users={"User:admin"})
    assert a.authorize("User:admin", HOST, W, TOPIC, "t")
    assert not a.authorize(ALICE, HOST, W, TOPIC, "t")


def test_decisions_are_forgotten_when_the_acls_change():
    a = authorizer()
    assert not a.authorize(ALICE, HOST, R, TOPIC, "t")
    a.set_acls(TOPIC, "t", LIT, frozenset({(ALICE, "*", R, A)}))
    assert a.authorize(ALICE, HOST, R, TOPIC, "t")
    a.set_acls(TOPIC, "t", LIT, frozenset())
    assert not a.authorize(ALICE, HOST, R, TOPIC, "t")
    changes = a.changes
    a.set_acls(TOPIC, "t", LIT, frozenset())  # no change: the decisions stay
    assert a.changes == changes


def test_the_decision_cache_is_bounded():
    a = Authorizer((), True, cache_size=10)
    for i in range(100):
        assert a.authorize(ALICE, HOST, R, TOPIC, f"t{i}")
    assert len(a._decisions) <= 10


def test_decide_is_the_rule_over_entry_sets():
    assert decide([], ALICE, HOST, R, allow_if_none=True)
    assert not decide([frozenset()], ALICE, HOST, R, allow_if_none=False)
    assert decide([frozenset({(ALICE, "*", ALL, A)})], ALICE, HOST, R, allow_if_none=False)


def test_acl_cache_finds_applying_sets_by_prefix_length():
    c = AclCache()
    for name in ("a", "ab", "abc", "b"):
        c.set(TOPIC, name, PRE, frozenset({(ALICE, "*", R, A)}))
    c.set(TOPIC, "abcd", LIT, frozenset({(BOB, "*", R, A)}))
    assert len(c.applying(TOPIC, "abcd")) == 4  # a, ab, abc and the literal
    assert len(c.applying(TOPIC, "b")) == 1
    assert c.applying(TOPIC, "") == []
    c.set(TOPIC, "ab", PRE, frozenset())
    assert len(c.applying(TOPIC, "abcd")) == 3
    assert sorted(p[1] for p in c.patterns()) == ["a", "abc", "abcd", "b"]


def test_authorize_any_is_kafkas_authorize_by_resource_type():
    assert not authorizer().authorize_any(ALICE, HOST, W, TOPIC)
    assert authorizer((TOPIC, "t", LIT, ALICE, "*", W, A)).authorize_any(ALICE, HOST, W, TOPIC)
    assert authorizer((TOPIC, "t-", PRE, ALICE, "*", ALL, A)).authorize_any(ALICE, HOST, W, TOPIC)
    # a deny on the same literal, on a prefix of it, or on "*" cancels
    assert not authorizer((TOPIC, "t", LIT, ALICE, "*", W, A),
                          (TOPIC, "t", LIT, ALICE, "*", W, D)).authorize_any(ALICE, HOST, W, TOPIC)
    assert not authorizer((TOPIC, "tx", LIT, ALICE, "*", W, A),
                          (TOPIC, "t", PRE, ALICE, "*", W, D)).authorize_any(ALICE, HOST, W, TOPIC)
    assert not authorizer((TOPIC, "t", LIT, ALICE, "*", W, A),
                          (TOPIC, "*", LIT, ALICE, "*", W, D)).authorize_any(ALICE, HOST, W, TOPIC)
    assert authorizer((TOPIC, "t", LIT, ALICE, "*", W, A),
                      (TOPIC, "u", LIT, ALICE, "*", W, D)).authorize_any(ALICE, HOST, W, TOPIC)
    assert authorizer(super_users={ALICE}).authorize_any(ALICE, HOST, W, TOPIC)
    assert not authorizer((TOPIC, "t", LIT, ALICE, "*", R, A)).authorize_any(ALICE, HOST, W, TOPIC)


# -- the inter-broker rule -------------------------------------------------------------------------

HEADER = RequestHeader(ApiKey.LEADER_AND_ISR, 0, 1, "c")


def ctx(principal="User:ANONYMOUS", protocol="PLAINTEXT", inter_broker=True, listener="BROKER") -> RequestContext:
    return RequestContext(HEADER, "10.0.0.1:5555", listener, principal, protocol, inter_broker)


def test_cluster_actions_only_on_the_inter_broker_listener():
    assert cluster_action_problem(None, frozenset(), None, "LeaderAndIsr") is None
    assert cluster_action_problem(ctx(), frozenset(), None, "LeaderAndIsr") is None  # PLAINTEXT: open
    problem = cluster_action_problem(ctx(inter_broker=False, listener="CLIENT"), frozenset(), None, "LeaderAndIsr")
    assert problem is not None and "User:ANONYMOUS" in problem and "CLIENT" in problem
    # even a broker principal, on a client listener
    assert cluster_action_problem(ctx("User:broker", "SASL_PLAINTEXT", False), frozenset({"User:broker"}),
                                  None, "StopReplica") is not None


def test_an_authenticating_inter_broker_listener_needs_a_broker_principal():
    brokers = frozenset({"User:broker"})
    assert cluster_action_problem(ctx("User:broker", "SASL_PLAINTEXT"), brokers, None, "x") is None
    problem = cluster_action_problem(ctx(ALICE, "SASL_SSL"), brokers, None, "UpdateMetadata")
    assert problem is not None and ALICE in problem and "BROKER" in problem
    assert cluster_action_problem(ctx(ALICE, "SSL"), brokers, None, "x") is not None  # a client certificate
    # an SSL listener that asks for certificates (ssl.client.auth requested): a peer that sent
    # none is unauthenticated there, not a broker; one that asks for none is open
    no_certificate = RequestContext(HEADER, "10.0.0.1:5555", "BROKER", "User:ANONYMOUS", "SSL", True,
                                    client_certificates=True)
    assert cluster_action_problem(no_certificate, brokers, None, "LeaderAndIsr") is not None
    assert cluster_action_problem(no_certificate._replace(client_certificates=False), brokers, None, "x") is None
    # SASL without a proven principal is never a broker
    assert cluster_action_problem(ctx("User:ANONYMOUS", "SASL_PLAINTEXT"), brokers, None, "x") is not None
    # with the authorizer: ClusterAction on the Cluster makes a principal a broker
    a = authorizer((CLUSTER, CLUSTER_NAME, LIT, ALICE, "*", AclOperation.CLUSTER_ACTION, A))
    assert cluster_action_problem(ctx(ALICE, "SASL_PLAINTEXT"), brokers, a, "x") is None
    assert cluster_action_problem(ctx(BOB, "SASL_PLAINTEXT"), brokers, a, "x") is not None


# -- bindings and filters ------------------------------------------------------------------------


def test_bindings_parse_names_and_codes_and_validate():
    b = AclBinding("topic", "t", "Prefixed", ALICE, "*", "cluster-action", 3)
    assert (b.restype, b.resource_pattern_type, b.operation, b.permission_type) == (TOPIC, PRE, AclOperation.CLUSTER_ACTION, A)
    assert AclBinding(2, "t", 3, ALICE, "*", "IdempotentWrite", "DENY").operation is AclOperation.IDEMPOTENT_WRITE
    with pytest.raises(AclError, match="operation"):
        AclBinding(TOPIC, "t", LIT, ALICE, "*", "Fly", A)
    for bad, match in (((CLUSTER, "c", LIT, ALICE, "*", R, A), "kafka-cluster"),
                       ((TOPIC, "", LIT, ALICE, "*", R, A), "empty"),
                       ((TOPIC, "a/b", LIT, ALICE, "*", R, A), "'/'"),
                       ((TOPIC, "t", ResourcePatternType.MATCH, ALICE, "*", R, A), "MATCH"),
                       ((ResourceType.ANY, "t", LIT, ALICE, "*", R, A), "Any"),
                       ((TOPIC, "t", LIT, "alice", "*", R, A), "Type:name"),
                       ((TOPIC, "t", LIT, ALICE, "*", AclOperation.ANY, A), "ANY"),
                       ((TOPIC, "t", LIT, ALICE, "*", R, AclPermissionType.ANY), "Allow or Deny")):
        with pytest.raises(AclError, match=match):
            AclBinding(*bad).validate()


def test_filters_match_as_kafkas():
    lit = AclBinding(TOPIC, "orders", LIT, ALICE, "*", R, A)
    star = AclBinding(TOPIC, "*", LIT, ALICE, "*", R, A)
    pre = AclBinding(TOPIC, "ord", PRE, BOB, "h", W, D)
    every = [lit, star, pre]
    assert [b for b in every if AclBindingFilter().matches(b)] == every
    assert [b for b in every if AclBindingFilter(TOPIC, "orders", LIT).matches(b)] == [lit]
    assert [b for b in every if AclBindingFilter(TOPIC, "orders", "any").matches(b)] == [lit]
    assert [b for b in every if AclBindingFilter(TOPIC, "orders", "match").matches(b)] == every
    assert [b for b in every if AclBindingFilter(TOPIC, "ord", PRE).matches(b)] == [pre]
    assert [b for b in every if AclBindingFilter(principal=BOB).matches(b)] == [pre]
    assert [b for b in every if AclBindingFilter(host="h", permission_type=D).matches(b)] == [pre]
    assert [b for b in every if AclBindingFilter(operation=R).matches(b)] == [lit, star]
    assert not AclBindingFilter(GROUP).matches(lit)
    assert AclBindingFilter.of(lit).matches_at_most_one and not AclBindingFilter(TOPIC, "t").matches_at_most_one
    with pytest.raises(AclError, match="UNKNOWN"):
        AclBindingFilter(0).validate()


# -- ZooKeeper encodings ---------------------------------------------------------------------------


def test_acl_znodes_are_kafkas():
    paths = ZkPaths("/tl")
    assert paths.acl(TOPIC, "t", LIT) == "/tl/kafka-acl/Topic/t"
    assert paths.acl(ResourceType.TRANSACTIONAL_ID, "x", PRE) == "/tl/kafka-acl-extended/prefixed/TransactionalId/x"
    assert paths.acl_change_prefix(LIT) == "/tl/kafka-acl-changes/acl_changes_"
    assert paths.acl_change_prefix(PRE) == "/tl/kafka-acl-extended-changes/acl_changes_"
    entries = frozenset({(ALICE, "*", AclOperation.CLUSTER_ACTION, A), (BOB, "h", R, D)})
    data = encode_acls(entries)
    assert data == (b'{"acls":[{"host":"*","operation":"ClusterAction","permissionType":"Allow","principal":'
                    b'"User:alice"},{"host":"h","operation":"Read","permissionType":"Deny","principal":"User:bob"}],'
                    b'"version":1}')
    assert decode_acls(data) == entries
    # what Kafka writes (other key order, spacing) reads the same
    kafka = b'{"version": 1, "acls": [{"host": "*", "permissionType": "Allow", "operation": "Read", "principal": "User:a"}]}'
    assert decode_acls(kafka) == {("User:a", "*", R, A)}
    for bad in (b"", b"[]", b'{"version":1}', b'{"version":1,"acls":[{"principal":"User:a","host":"*",'
                                                b'"operation":"Fly","permissionType":"Allow"}]}'):
        with pytest.raises(ValueError, match="ACL"):
            decode_acls(bad)


def test_change_notifications_round_trip_and_read_kafkas_forms():
    assert encode_acl_change(TOPIC, "a:b", LIT) == b"TOPIC:a:b"
    assert decode_acl_change(b"TOPIC:a:b", LIT) == (TOPIC, "a:b", LIT)
    assert decode_acl_change(b"Topic:x", LIT) == (TOPIC, "x", LIT)  # Kafka 1.x's spelling
    data = encode_acl_change(GROUP, "g", PRE)
    assert decode_acl_change(data, PRE) == (GROUP, "g", PRE)
    for bad in (b"nocolon", b"Fly:x", b"{}"):
        with pytest.raises(ValueError):
            decode_acl_change(bad, LIT if bad != b"{}" else PRE)


def test_acl_names_must_be_storable_znode_names():
    assert check_acl_name("a.b-c_d*") == "a.b-c_d*"
    for bad in ("", ".", "..", "a/b", "x\x00", "x\u0085", "x" * 1025):
        with pytest.raises(AclError):
            check_acl_name(bad)


def test_hosts_come_out_of_peer_addresses_and_decisions_are_forgotten_on_change():
    a = authorizer((TOPIC, "t", LIT, ALICE, "10.0.0.1", R, A), (TOPIC, "t", LIT, ALICE, "::1", W, A))
    assert a.authorize(ALICE, host_of("10.0.0.1:5000"), R, TOPIC, "t")
    assert not a.authorize(ALICE, host_of("10.0.0.2:5000"), R, TOPIC, "t")
    assert a.authorize(ALICE, host_of("::1:6000"), W, TOPIC, "t")  # IPv6, as the network layer writes it
    assert not a.authorize(ALICE, host_of("?"), R, TOPIC, "t")  # the socket could not tell
    a.set_acls(TOPIC, "t", LIT, frozenset())
    assert not a.authorize(ALICE, "10.0.0.1", R, TOPIC, "t")
