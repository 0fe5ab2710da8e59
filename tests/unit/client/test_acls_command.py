"""``tidelog acls``: the bindings --add makes and the filters --remove and --list use, in
kafka-acls' shape (client/commands/acls.py), without a cluster."""

from __future__ import annotations

import argparse

import pytest

from tidelog.commands.acls import arguments, bindings_for, filters_for
from tidelog.commands.common import UsageError
from tidelog.protocol.acls import AclOperation, AclPermissionType, ResourcePatternType, ResourceType


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    arguments(p)
    return p.parse_args(list(argv))


def described(bindings) -> set[tuple]:
    return {(b.restype.kafka_name, b.name, b.resource_pattern_type.name, b.principal, b.host,
             b.operation.kafka_name, b.permission_type.kafka_name) for b in bindings}


def test_add_makes_one_binding_per_resource_principal_host_and_operation():
    args = parse("--add", "--allow-principal", "User:a", "--allow-principal", "User:b", "--allow-host", "10.0.0.1",
                 "--operation", "Read", "--operation", "describe", "--topic", "t", "--group", "g")
    assert described(bindings_for(args)) == {
        ("Topic", "t", "LITERAL", p, "10.0.0.1", op, "Allow") for p in ("User:a", "User:b") for op in ("Read", "Describe")
    } | {("Group", "g", "LITERAL", p, "10.0.0.1", op, "Allow") for p in ("User:a", "User:b") for op in ("Read", "Describe")}


def test_defaults_every_host_and_all_operations_and_deny_entries():
    args = parse("--add", "--deny-principal", "User:m", "--topic", "*")
    assert described(bindings_for(args)) == {("Topic", "*", "LITERAL", "User:m", "*", "All", "Deny")}


def test_producer_and_consumer_conveniences():
    args = parse("--add", "--allow-principal", "User:p", "--producer", "--topic", "logs-", "--transactional-id", "tx",
                 "--resource-pattern-type", "PREFIXED")
    assert described(bindings_for(args)) == {
        ("Topic", "logs-", "PREFIXED", "User:p", "*", op, "Allow") for op in ("Write", "Describe", "Create")
    } | {("TransactionalId", "tx", "PREFIXED", "User:p", "*", op, "Allow") for op in ("Write", "Describe")}
    args = parse("--add", "--allow-principal", "User:c", "--consumer", "--topic", "t", "--group", "g")
    assert described(bindings_for(args)) == {("Topic", "t", "LITERAL", "User:c", "*", "Read", "Allow"),
                                             ("Topic", "t", "LITERAL", "User:c", "*", "Describe", "Allow"),
                                             ("Group", "g", "LITERAL", "User:c", "*", "Read", "Allow")}


@pytest.mark.parametrize("argv,problem", [
    (("--add", "--allow-principal", "User:a", "--operation", "Read", "--cluster"), "does not apply to a Cluster"),
    (("--add", "--allow-principal", "User:a", "--operation", "Fly", "--topic", "t"), "is not one of"),
    (("--add", "--operation", "Read", "--topic", "t"), "need --allow-principal or --deny-principal"),
    (("--add", "--allow-principal", "User:a"), "name at least one resource"),
    (("--add", "--allow-principal", "alice", "--topic", "t"), "Type:name"),
    (("--add", "--allow-principal", "User:a", "--consumer", "--topic", "t"), "--consumer needs --group"),
    (("--add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type", "match"), "literal or prefixed"),
    (("--add", "--deny-host", "h", "--allow-principal", "User:a", "--topic", "t"), "--deny-host needs --deny-principal"),
])
def test_usage_errors_say_what_is_wrong(argv, problem):
    with pytest.raises(UsageError, match=problem):
        bindings_for(parse(*argv))


def test_remove_filters_name_the_entries_or_every_entry_of_the_resources():
    (f,) = filters_for(parse("--remove", "--allow-principal", "User:a", "--operation", "Write", "--topic", "t"))
    assert (f.restype, f.name, f.resource_pattern_type, f.principal, f.host, f.operation, f.permission_type) == (
        ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:a", "*", AclOperation.WRITE,
        AclPermissionType.ALLOW)
    (f,) = filters_for(parse("--remove", "--topic", "t", "--resource-pattern-type", "any"))
    assert (f.name, f.resource_pattern_type, f.principal, f.operation) == (
        "t", ResourcePatternType.ANY, None, AclOperation.ANY)
    with pytest.raises(UsageError, match="need a principal"):
        filters_for(parse("--remove", "--operation", "Read", "--topic", "t"))


def test_list_filters():
    (f,) = filters_for(parse("--list"))
    assert (f.restype, f.name, f.resource_pattern_type, f.principal) == (
        ResourceType.ANY, None, ResourcePatternType.ANY, None)
    fs = filters_for(parse("--list", "--topic", "t", "--resource-pattern-type", "match", "--principal", "User:a"))
    assert [(f.restype, f.name, f.resource_pattern_type, f.principal) for f in fs] == [
        (ResourceType.TOPIC, "t", ResourcePatternType.MATCH, "User:a")]
