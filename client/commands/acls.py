"""``tidelog acls``: add, remove and list ACLs, in kafka-acls' shape, over the blocking ``Admin``.

    tidelog acls --add --allow-principal User:alice --operation Read --topic orders
    tidelog acls --add --allow-principal User:bob --producer --topic logs- --resource-pattern-type prefixed
    tidelog acls --add --deny-principal User:mallory --operation All --topic '*'
    tidelog acls --list [--topic orders] [--principal User:alice] [--resource-pattern-type match]
    tidelog acls --remove --allow-principal User:alice --operation Read --topic orders --force

One of ``--add``, ``--remove``, ``--list``. The resources are ``--topic``, ``--group``,
``--transactional-id`` (each repeatable) and ``--cluster``; the pattern type is
``--resource-pattern-type`` (literal, the default, or prefixed; for --list and --remove also
any, every pattern type with this exact name, and match, every ACL that affects the named
resource). Each ``--allow-principal`` / ``--deny-principal`` gets an Allow / Deny entry per
host (``--allow-host`` / ``--deny-host``, default ``*``) and per ``--operation`` (default
All). ``--producer`` stands for Write, Describe and Create on the topics (and Write, Describe
on the transactional ids); ``--consumer`` for Read, Describe on the topics and Read on the
groups. ``--remove`` asks before it deletes, unless ``--force``.

The operations a resource type accepts are kafka-acls' (``VALID_OPERATIONS``): Read on the
Cluster, say, is a usage error. Building the bindings and filters is pure
(``bindings_for``, ``filters_for``) and tested without a cluster.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tidelog.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    UsageError,
    add_command,
    client_options,
    connection_options,
    run_command,
    unreachable,
)

__all__ = ["VALID_OPERATIONS", "bindings_for", "filters_for", "register", "run"]

# kafka-acls' AclCommand: the operations that mean something for each resource type
VALID_OPERATIONS: dict[str, tuple[str, ...]] = {
    "Topic": ("Read", "Write", "Create", "Describe", "Delete", "Alter", "DescribeConfigs", "AlterConfigs", "All"),
    "Group": ("Read", "Describe", "Delete", "All"),
    "Cluster": ("Create", "ClusterAction", "DescribeConfigs", "AlterConfigs", "IdempotentWrite", "Alter",
                "Describe", "All"),
    "TransactionalId": ("Describe", "Write", "All"),
}
OPERATION_NAMES = ("Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "DescribeConfigs",
                   "AlterConfigs", "IdempotentWrite", "All")


def register(commands: Any) -> None:
    add_command(commands, "acls", "add, remove and list ACLs (like kafka-acls)",
                "Manage the ACLs the brokers' authorizer enforces (authorizer.class.name). --list prints "
                "the ACLs per resource pattern; --add and --remove take principals, hosts, operations "
                "and resources as kafka-acls does.", arguments, run)


def arguments(p: argparse.ArgumentParser) -> None:
    client_options(p)
    p.add_argument("--bootstrap-server", dest="bootstrap", metavar="HOST:PORT[,HOST:PORT]", help="same as --bootstrap")
    p.add_argument("--timeout-ms", type=int, default=30000, metavar="MS", help="bound on the admin requests")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="add the ACLs")
    action.add_argument("--remove", action="store_true", help="remove the ACLs (asks first unless --force)")
    action.add_argument("--list", action="store_true", help="list the ACLs (of the resources given, else all)")
    p.add_argument("--allow-principal", action="append", default=[], metavar="TYPE:NAME",
                   help="an Allow entry for this principal (repeatable; User:* is every principal)")
    p.add_argument("--deny-principal", action="append", default=[], metavar="TYPE:NAME",
                   help="a Deny entry for this principal (repeatable)")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                   help="host of the Allow entries (repeatable; default *)")
    p.add_argument("--deny-host", action="append", default=[], metavar="HOST",
                   help="host of the Deny entries (repeatable; default *)")
    p.add_argument("--operation", action="append", default=[], metavar="OPERATION",
                   help=f"repeatable, default All: one of {', '.join(OPERATION_NAMES)}")
    p.add_argument("--principal", action="append", default=[], metavar="TYPE:NAME",
                   help="with --list: only the ACLs of this principal (repeatable)")
    p.add_argument("--topic", action="append", default=[], metavar="TOPIC", help="repeatable; * is every topic")
    p.add_argument("--group", action="append", default=[], metavar="GROUP", help="repeatable; * is every group")
    p.add_argument("--transactional-id", action="append", default=[], metavar="ID", help="repeatable")
    p.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    p.add_argument("--resource-pattern-type", default="literal", type=str.lower,
                   choices=("literal", "prefixed", "any", "match"),
                   help="literal (default) or prefixed; --list and --remove also take any and match")
    p.add_argument("--producer", action="store_true",
                   help="the producer's ACLs: Write, Describe, Create on the topics (Write, Describe on the "
                        "transactional ids)")
    p.add_argument("--consumer", action="store_true",
                   help="the consumer's ACLs: Read, Describe on the topics, Read on the groups (needs --group)")
    p.add_argument("--force", action="store_true", help="--remove without asking")


def _resources(args: argparse.Namespace) -> list[tuple[str, str]]:
    out = [("Topic", t) for t in args.topic] + [("Group", g) for g in args.group]
    out += [("TransactionalId", t) for t in args.transactional_id]
    if args.cluster:
        out.append(("Cluster", "kafka-cluster"))
    return out


def _operations_by_resource(args: argparse.Namespace) -> list[tuple[str, str, list[str]]]:
    """(type, name, operations) for --add and --remove, with --producer/--consumer expanded and
    every operation checked against VALID_OPERATIONS."""
    ops = []
    for raw in args.operation or []:
        wanted = raw.replace("_", "").replace("-", "").lower()
        match = next((o for o in OPERATION_NAMES if o.lower() == wanted), None)
        if match is None:
            raise UsageError(f"--operation {raw!r} is not one of {', '.join(OPERATION_NAMES)}")
        ops.append(match)
    if (args.producer or args.consumer) and ops:
        raise UsageError("--operation cannot be combined with --producer or --consumer")
    if args.consumer and not args.group:
        raise UsageError("--consumer needs --group")
    resources = _resources(args)
    if not resources:
        raise UsageError("name at least one resource: --topic, --group, --transactional-id or --cluster")
    out = []
    for rtype, name in resources:
        if args.producer or args.consumer:
            chosen: list[str] = []
            if args.producer:
                chosen += {"Topic": ["Write", "Describe", "Create"], "TransactionalId": ["Write", "Describe"]}.get(rtype, [])
            if args.consumer:
                chosen += {"Topic": ["Read", "Describe"], "Group": ["Read"]}.get(rtype, [])
            chosen = list(dict.fromkeys(chosen))
            if not chosen:
                continue
        else:
            chosen = ops or ["All"]
        invalid = [o for o in chosen if o not in VALID_OPERATIONS[rtype]]
        if invalid:
            raise UsageError(f"operation {', '.join(invalid)} does not apply to a {rtype} resource (it takes "
                             f"{', '.join(VALID_OPERATIONS[rtype])})")
        out.append((rtype, name, chosen))
    return out


def _entries(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(principal, host, permission) of every entry --add or --remove names."""
    if not args.allow_principal and not args.deny_principal:
        raise UsageError("--add and --remove need --allow-principal or --deny-principal")
    if args.allow_host and not args.allow_principal or args.deny_host and not args.deny_principal:
        raise UsageError("--allow-host needs --allow-principal, --deny-host needs --deny-principal")
    out = [(p, h, "Allow") for p in args.allow_principal for h in (args.allow_host or ["*"])]
    out += [(p, h, "Deny") for p in args.deny_principal for h in (args.deny_host or ["*"])]
    return out


def bindings_for(args: argparse.Namespace) -> list[Any]:
    """The AclBindings ``--add`` creates (UsageError for a combination that makes none)."""
    from tidelog.protocol.acls import AclBinding, AclError

    if args.resource_pattern_type not in ("literal", "prefixed"):
        raise UsageError("--add needs --resource-pattern-type literal or prefixed")
    out = []
    for rtype, name, ops in _operations_by_resource(args):
        for principal, host, permission in _entries(args):
            for op in ops:
                try:
                    out.append(AclBinding(rtype, name, args.resource_pattern_type, principal, host, op,
                                          permission).validate())
                except AclError as e:
                    raise UsageError(str(e)) from None
    return list(dict.fromkeys(out))


def filters_for(args: argparse.Namespace) -> list[Any]:
    """The AclBindingFilters ``--remove`` deletes by (or ``--list`` lists by): each resource
    with the entries named, or every entry of the resource when no principal is given."""
    from tidelog.protocol.acls import AclBindingFilter, AclError

    pattern = args.resource_pattern_type
    try:
        if args.list:
            principals = args.principal or [None]
            resources = _resources(args) or [("Any", None)]
            return [AclBindingFilter(rtype, name, pattern if name is not None else "any", principal).validate()
                    for rtype, name in resources for principal in principals]
        if not args.allow_principal and not args.deny_principal:
            if args.operation or args.producer or args.consumer:
                raise UsageError("--operation, --producer and --consumer with --remove need a principal")
            resources = _resources(args)
            if not resources:
                raise UsageError("name at least one resource: --topic, --group, --transactional-id or --cluster")
            return [AclBindingFilter(rtype, name, pattern).validate() for rtype, name in resources]
        return list(dict.fromkeys(
            AclBindingFilter(rtype, name, pattern, principal, host, op, permission).validate()
            for rtype, name, ops in _operations_by_resource(args)
            for principal, host, permission in _entries(args) for op in ops))
    except AclError as e:
        raise UsageError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    return run_command("acls", _run, args)


def _run(args: argparse.Namespace) -> int:
    if not args.list and args.principal:
        raise UsageError("--principal filters --list; --add and --remove take --allow-principal/--deny-principal")
    if args.add:
        work = bindings_for(args)
    else:
        work = filters_for(args)
        if args.remove and not args.force and not _confirmed(work):
            print("nothing removed", file=sys.stderr)
            return EXIT_FAILED
    from tidelog import Admin
    from tidelog.protocol.errors import TidelogError

    timeout_ms = args.timeout_ms
    try:
        with Admin(args.bootstrap, client_id="tidelog-acls", request_timeout_ms=min(timeout_ms, 30000),
                   default_api_timeout_ms=timeout_ms, **connection_options(args)) as admin:
            if args.add:
                admin.create_acls(work)
                _print_grouped("Adding ACLs for resource", work)
            elif args.remove:
                deleted = admin.delete_acls(work)
                _print_grouped("Removed ACLs for resource", [b for f in work for b in deleted.get(f, [])])
            else:
                found = []
                for f in work:
                    found += [b for b in admin.describe_acls(f) if b not in found]
                _print_grouped("Current ACLs for resource", found)
    except TidelogError as e:
        if type(e).__name__ in ("NoBrokersAvailable", "BrokerConnectionError"):
            raise CommandError(unreachable(args.bootstrap, e)) from None
        raise
    return EXIT_OK


def _confirmed(filters: list[Any]) -> bool:
    print("Are you sure you want to remove the ACLs matching:", file=sys.stderr)
    for f in filters:
        print(f"\t{_describe_filter(f)}", file=sys.stderr)
    print("y/n? ", end="", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def _describe_filter(f: Any) -> str:
    return (f"{f.restype.kafka_name}:{f.resource_pattern_type.name}:{f.name if f.name is not None else '*any*'} "
            f"principal={f.principal or '*any*'} host={f.host or '*any*'} operation={f.operation.kafka_name} "
            f"permissionType={f.permission_type.kafka_name}")


def _print_grouped(heading: str, bindings: list[Any]) -> None:
    """kafka-acls' output: a heading per resource pattern, one entry per line."""
    by_pattern: dict[tuple, list[Any]] = {}
    for b in bindings:
        by_pattern.setdefault(b.pattern, []).append(b)
    for (rtype, name, ptype), group in sorted(by_pattern.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        print(f"{heading} `ResourcePattern(resourceType={rtype.kafka_name}, name={name}, patternType={ptype.name})`:")
        for b in sorted(group, key=lambda b: (b.principal, b.host, b.operation, b.permission_type)):
            print(f"\t(principal={b.principal}, host={b.host}, operation={b.operation.kafka_name}, "
                  f"permissionType={b.permission_type.kafka_name})")
        print()
