"""``tidelog groups``: list, describe, reset-offsets and delete consumer groups, like
kafka-consumer-groups, over the blocking ``Admin``.

``describe`` prints one line per partition (GROUP TOPIC PARTITION CURRENT-OFFSET
LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID, "-" where there is nothing), or the members
(``--members``), or the group's state (``--state``). ``reset-offsets`` computes a plan
(earliest, latest, an offset clamped into the partition's range, a shift from the committed
offset, or the first offset at a time), prints it, and applies it only with ``--execute``
and only while the group is inactive.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tidelog.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    UsageError,
    add_command,
    admin_actions,
    check_cluster,
    connection_options,
    or_dash,
    run_command,
    table,
)

__all__ = ["group_describe_lines", "register", "reset_plan", "run"]


def register(commands: Any) -> None:
    add_command(commands, "groups",
                "list, describe, reset offsets of and delete consumer groups (like kafka-consumer-groups)",
                "Manage consumer groups. describe prints each partition's committed offset, log end "
                "offset, lag and owner; reset-offsets prints its plan and applies it only with --execute.",
                arguments, run)


def arguments(p: argparse.ArgumentParser) -> None:
    action = admin_actions(p)

    action("list", "list the consumer groups, one per line")
    a = action("describe", "per partition: GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG "
                           "CONSUMER-ID HOST CLIENT-ID (like kafka-consumer-groups --describe)")
    a.add_argument("--group", action="append", dest="groups", metavar="GROUP", help="repeatable")
    a.add_argument("--all-groups", action="store_true", help="describe every group")
    a.add_argument("--members", action="store_true", help="list the members instead of the offsets")
    a.add_argument("--state", action="store_true", help="print the group's state, assignor and generation")
    a = action("reset-offsets", "reset a group's committed offsets (the group must be inactive); prints "
                                "the plan, applied only with --execute")
    _reset_arguments(a)
    a = action("delete", "delete consumer groups and their committed offsets (inactive groups only)")
    a.add_argument("--group", action="append", dest="groups", required=True, metavar="GROUP", help="repeatable")


def _reset_arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument("--group", required=True)
    a.add_argument("--topic", action="append", dest="topics", metavar="TOPIC[:P,P...]",
                   help="repeatable: every partition of TOPIC, or those listed")
    a.add_argument("--all-topics", action="store_true", help="every partition the group has a committed offset for")
    how = a.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true")
    how.add_argument("--to-latest", action="store_true")
    how.add_argument("--to-offset", type=int, metavar="N")
    how.add_argument("--shift-by", type=int, metavar="N", help="move by N (negative: back)")
    how.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS[.sss][TZ]",
                     help="the first offset at or after this time (ISO 8601; local time without a zone)")
    execution = a.add_mutually_exclusive_group()
    execution.add_argument("--dry-run", action="store_true", help="only print the plan (the default)")
    execution.add_argument("--execute", action="store_true", help="apply the plan")


def run(args: argparse.Namespace) -> int:
    action = args.action
    return run_command(f"groups {action}", _ACTIONS[action], args)


def _admin(args: argparse.Namespace) -> Any:
    from tidelog import Admin

    return Admin(args.bootstrap, client_id="tidelog-groups", request_timeout_ms=min(args.timeout_ms, 30000),
                 default_api_timeout_ms=args.timeout_ms, **connection_options(args))


def _list(args: argparse.Namespace) -> int:
    check_cluster(args)
    with _admin(args) as admin:
        for g in admin.list_groups():
            print(g.group_id)
    return EXIT_OK


def _describe(args: argparse.Namespace) -> int:
    if not args.groups and not args.all_groups:
        raise UsageError("give --group GROUP (repeatable) or --all-groups")
    check_cluster(args)
    with _admin(args) as admin:
        names = [g.group_id for g in admin.list_groups()] if args.all_groups else args.groups
        status = EXIT_OK
        for name in names:
            (d,) = admin.describe_groups([name])
            if d.state == "Dead":
                print(f"Error: Consumer group '{name}' does not exist.", file=sys.stderr)
                status = EXIT_FAILED
                continue
            if args.state:
                lines = _state_lines(d)
            elif args.members:
                lines = _member_lines(d)
            else:
                lines = group_describe_lines(d, _offsets_to_describe(admin, d))
            print()
            if not d.members and not args.state:
                print(f"Consumer group '{name}' has no active members.\n")
            for line in lines:
                print(line)
    return status


def _offsets_to_describe(admin: Any, description: Any) -> list[Any]:
    """The committed partitions' offsets, and the log end offset of the partitions a member
    owns without a commit (as kafka-consumer-groups shows it; their offset and lag are "-")."""
    offsets = list(admin.list_group_offsets(description.group_id))
    known = {o.partition for o in offsets}
    owned = sorted({tp for m in description.members for tp in m.assignment} - known)
    if owned:
        offsets += admin.list_group_offsets(description.group_id, owned)
    return offsets


def group_describe_lines(description: Any, offsets: Sequence[Any]) -> list[str]:
    """kafka-consumer-groups --describe: one line per partition the group has an offset for or
    a member owns, with the owner's member id, host and client id ("-" when none)."""
    owners = {tp: m for m in description.members for tp in m.assignment}
    by_tp = {o.partition: o for o in offsets}
    rows = [["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
             "HOST", "CLIENT-ID"]]
    for tp in sorted(set(by_tp) | set(owners)):
        o, m = by_tp.get(tp), owners.get(tp)
        rows.append([description.group_id, tp.topic, str(tp.partition),
                     or_dash(o.committed if o else None), or_dash(o.log_end_offset if o else None),
                     or_dash(o.lag if o else None), m.member_id if m else "-",
                     m.host if m else "-", m.client_id if m else "-"])
    return table(rows)


def _member_lines(d: Any) -> list[str]:
    rows = [["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]]
    for m in d.members:
        assignment = ",".join(f"{tp.topic}-{tp.partition}" for tp in m.assignment) or "-"
        rows.append([d.group_id, m.member_id, m.group_instance_id or "-", m.host, m.client_id,
                     str(len(m.assignment)), assignment])
    return table(rows)


def _state_lines(d: Any) -> list[str]:
    rows = [["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "GENERATION", "#MEMBERS"],
            [d.group_id, str(d.coordinator), d.assignor or "-", d.state, str(d.generation), str(len(d.members))]]
    return table(rows)


def _delete(args: argparse.Namespace) -> int:
    check_cluster(args)
    with _admin(args) as admin:
        # all checked first: a missing name must not leave the groups before it deleted
        missing = [d.group_id for d in admin.describe_groups(list(args.groups)) if d.state == "Dead"]
        if missing:
            raise CommandError(f"group(s) {', '.join(map(repr, missing))} do not exist: nothing was deleted")
        for name in args.groups:
            admin.delete_groups([name])
            print(f"Deletion of requested consumer group '{name}' was successful.")
    return EXIT_OK


def _reset_offsets(args: argparse.Namespace) -> int:
    from tidelog import TopicPartition

    if not args.topics and not args.all_topics:
        raise UsageError("give --topic TOPIC[:P,P...] (repeatable) or --all-topics")
    target_ms = _parse_datetime(args.to_datetime) if args.to_datetime is not None else None
    check_cluster(args)
    with _admin(args) as admin:
        (d,) = admin.describe_groups([args.group])
        if d.state not in ("Empty", "Dead"):
            raise CommandError(f"assignments can only be reset if the group '{args.group}' is inactive, but "
                               f"the current state is {d.state} ({len(d.members)} members): stop its consumers first")
        committed = {o.partition: o.committed for o in admin.list_group_offsets(args.group)}
        tps = _reset_partitions(admin, args, committed, TopicPartition)
        earliest = {tp: o for tp, (o, _) in admin.list_offsets({tp: -2 for tp in tps}).items()}
        latest = {tp: o for tp, (o, _) in admin.list_offsets({tp: -1 for tp in tps}).items()}
        at_time = None
        if target_ms is not None:
            at_time = {tp: o for tp, (o, _) in admin.list_offsets({tp: target_ms for tp in tps}).items()}
        plan = reset_plan(tps, args, committed, earliest, latest, at_time)
        for line in table([["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]] +
                          [[args.group, tp.topic, str(tp.partition), str(o)] for tp, o in sorted(plan.items())]):
            print(line)
        if args.execute:
            admin.alter_group_offsets(args.group, plan)
        else:
            print("\n(dry run: nothing changed; add --execute to apply)", file=sys.stderr)
    return EXIT_OK


def _reset_partitions(admin: Any, args: argparse.Namespace, committed: dict, tp_cls: Any) -> list[Any]:
    """The partitions to reset: with --all-topics those the group has committed offsets for
    (kafka-consumer-groups'), else every partition of each --topic or those it names."""
    if args.all_topics:
        return sorted(tp for tp, offset in committed.items() if offset is not None)
    out = []
    for spec in args.topics:
        topic, _, parts = spec.partition(":")
        if parts:
            try:
                out += [tp_cls(topic, int(p)) for p in parts.split(",")]
            except ValueError:
                raise UsageError(f"--topic {spec!r}: expected TOPIC or TOPIC:P,P,...") from None
        else:
            (description,) = admin.describe_topics([topic])
            out += [tp_cls(topic, p.partition) for p in description.partitions]
    return sorted(set(out))


def reset_plan(tps: Sequence[Any], args: argparse.Namespace, committed: dict, earliest: dict, latest: dict,
               at_time: dict | None) -> dict:
    """The new committed offset of each partition (clamped into [earliest, latest], as
    kafka-consumer-groups does)."""
    plan = {}
    for tp in tps:
        lo, hi = earliest[tp], latest[tp]
        if args.to_earliest:
            target = lo
        elif args.to_latest:
            target = hi
        elif args.to_offset is not None:
            target = args.to_offset
        elif args.shift_by is not None:
            if tp not in committed:  # Kafka's rule: nothing to shift from
                raise CommandError(f"cannot shift the offset of {tp.topic}-{tp.partition}: the group has no "
                                   "committed offset there (use --to-earliest, --to-latest or --to-offset)")
            target = committed[tp] + args.shift_by
        else:
            found = at_time[tp]
            target = hi if found < 0 else found
        plan[tp] = min(max(target, lo), hi)
    return plan


def _parse_datetime(text: str) -> int:
    from datetime import datetime

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--to-datetime {text!r}: expected ISO 8601, e.g. 2024-05-01T12:00:00 or "
                         "2024-05-01T12:00:00+00:00") from None
    return int(when.timestamp() * 1000)


_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": _list, "describe": _describe, "reset-offsets": _reset_offsets, "delete": _delete,
}
