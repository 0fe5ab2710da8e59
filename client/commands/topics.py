"""``tidelog topics``: create, list, describe, alter, delete, delete-records and elect-leaders,
like kafka-topics (and kafka-delete-records, kafka-leader-election), through ``AsyncAdmin``.

``describe`` prints kafka-topics' lines plus each partition's leader epoch, log end offset
and high watermark: ``Admin.log_end_offsets`` and ``Admin.list_offsets`` (latest), asked of
each leader on its own, so a leader that does not answer in time leaves only its partitions
without them ("-"), like a partition without a leader.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tidelog.commands.common import (
    EXIT_OK,
    CommandError,
    UsageError,
    add_command,
    admin_actions,
    connection_options,
    key_value,
    or_dash,
    run_command,
    unreachable,
)

__all__ = ["describe_lines", "register", "run"]

OFFSETS_TIMEOUT_MS = 10000  # describe's bound on the offsets, within --timeout-ms


def register(commands: Any) -> None:
    add_command(commands, "topics", "create, list, describe, alter and delete topics (like kafka-topics)",
                "Manage topics. describe prints kafka-topics' lines plus each partition's leader epoch, "
                "log end offset and high watermark.", arguments, run)


def arguments(p: argparse.ArgumentParser) -> None:
    action = admin_actions(p)

    a = action("create", "create a topic")
    a.add_argument("name")
    a.add_argument("--partitions", type=int, default=-1, help="default: the broker's num.partitions")
    a.add_argument("--replication-factor", type=int, default=-1,
                   help="default: the broker's default.replication.factor")
    a.add_argument("--config", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="a topic config override (repeatable), e.g. retention.ms=86400000")
    a.add_argument("--if-not-exists", action="store_true", help="succeed if the topic exists")
    action("list", "list the topics, one per line")
    a = action("describe", "kafka-topics --describe lines, with leader epoch, LEO and HW")
    a.add_argument("names", nargs="*", metavar="NAME",
                   help="the topics to describe (default: every topic)")
    a.add_argument("--under-replicated-partitions", action="store_true",
                   help="only partitions whose ISR is smaller than their replica set")
    a.add_argument("--unavailable-partitions", action="store_true", help="only partitions without a leader")
    a.add_argument("--under-min-isr-partitions", action="store_true",
                   help="only partitions whose ISR is smaller than their min.insync.replicas")
    a.add_argument("--if-exists", action="store_true", help="leave out the named topics that do not exist")
    a = action("alter", "add partitions, or set or delete topic configs")
    a.add_argument("name")
    a.add_argument("--partitions", type=int, help="the new (larger) partition count")
    a.add_argument("--config", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="set a topic config override (repeatable)")
    a.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                   help="remove a topic config override (repeatable)")
    a.add_argument("--if-exists", action="store_true", help="do nothing (and succeed) if the topic does not exist")
    a = action("delete", "delete topics")
    a.add_argument("names", nargs="+", metavar="NAME")
    a.add_argument("--if-exists", action="store_true",
                   help="delete those of the topics that exist, and succeed if none does")
    a = action("delete-records", "delete the records below an offset (like kafka-delete-records)")
    a.add_argument("name")
    a.add_argument("--offset", type=int, required=True,
                   help="delete every record below this offset; -1: below the high watermark")
    a.add_argument("--partition", type=int, action="append", default=[],
                   help="this partition (repeatable); default: every partition of the topic")
    a = action("elect-leaders", "move leadership back to each partition's preferred (first) replica, or "
               "(--election-type unclean) elect a leader for partitions without one")
    a.add_argument("names", nargs="*", metavar="NAME",
                   help="default: every topic (then only the partitions elected or that failed are listed)")
    a.add_argument("--partition", type=int, help="only this partition of the named topics")
    a.add_argument("--election-type", type=str.lower, choices=("preferred", "unclean"), default="preferred",
                   help="preferred (default); unclean: a partition without a leader gets one from the ISR, "
                        "else from any live replica, losing the acknowledged records it lacks")


def run(args: argparse.Namespace) -> int:
    import trio

    action = args.action

    def body(a: argparse.Namespace) -> int:
        return trio.run(_ACTIONS[action], a)

    return run_command(f"topics {action}", body, args)


def _admin_session(args: argparse.Namespace) -> Any:
    from tidelog.aio import AsyncAdmin

    return AsyncAdmin(args.bootstrap, client_id="tidelog-topics",
                      request_timeout_ms=min(args.timeout_ms, 30000), default_api_timeout_ms=args.timeout_ms,
                      **connection_options(args))


async def _connect(admin: Any, args: argparse.Namespace) -> None:
    from tidelog.protocol.errors import TidelogError

    try:
        await admin.describe_cluster(timeout_ms=args.connect_timeout_ms)
    except TidelogError as e:
        raise CommandError(unreachable(args.bootstrap, e)) from None


async def _create(args: argparse.Namespace) -> int:
    from tidelog.aio import NewTopic
    from tidelog.protocol.errors import TOPIC_ALREADY_EXISTS, TidelogError

    for flag, value in (("--partitions", args.partitions), ("--replication-factor", args.replication_factor)):
        if value == 0 or value < -1:
            raise UsageError(f"{flag} must be positive (or -1 for the broker's default), got {value}")
    try:
        new_topic = NewTopic(args.name, args.partitions, args.replication_factor, config=dict(args.config))
    except ValueError as e:  # more than the request can carry
        raise UsageError(str(e)) from None
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        try:
            await admin.create_topics([new_topic], timeout_ms=args.timeout_ms)
        except TidelogError as e:
            if args.if_not_exists and getattr(e, "error", None) is TOPIC_ALREADY_EXISTS:
                return EXIT_OK
            raise
        print(f"Created topic {args.name}.")
        await _warn_acks_all_impossible(admin, args, args.name, args.replication_factor)
    return EXIT_OK


async def _warn_acks_all_impossible(admin: Any, args: argparse.Namespace, name: str, replication_factor: int) -> None:
    """A warning on stderr when the topic's replication factor is below its effective
    min.insync.replicas: an acks=all produce to it always fails with NOT_ENOUGH_REPLICAS (its
    high watermark follows its replicas: records written with acks=1 are readable). Best
    effort: nothing is said when the numbers cannot be read."""
    from tidelog.protocol.errors import TidelogError

    try:
        if replication_factor < 0:
            (d,) = await admin.describe_topics([name], timeout_ms=args.timeout_ms)
            replication_factor = len(d.partitions[0].replicas) if d.partitions else 0
        entry = (await admin.describe_configs(name, timeout_ms=args.timeout_ms)).get("min.insync.replicas")
        min_isr = int(entry.value) if entry is not None else 1
    except (TidelogError, ValueError):
        return
    if 0 < replication_factor < min_isr:
        print(f"Warning: topic {name} has replication factor {replication_factor}, below its min.insync.replicas "
              f"{min_isr}: every acks=all produce to it will fail with NOT_ENOUGH_REPLICAS (acks=1 works). "
              f"Lower it with: tidelog topics alter {name} --config min.insync.replicas={replication_factor}",
              file=sys.stderr)


async def _list(args: argparse.Namespace) -> int:
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        names = await admin.list_topics(timeout_ms=args.timeout_ms)
    for name in names:
        print(name)
    return EXIT_OK


async def _delete(args: argparse.Namespace) -> int:
    from tidelog.protocol.topics import is_internal_topic

    async with _admin_session(args) as admin:
        await _connect(admin, args)
        # all or nothing, as kafka-topics --delete: a typo must not leave the others deleted
        internal = [name for name in args.names if is_internal_topic(name)]
        if internal:  # kafka-topics' refusal: it exists, but is not the clients' to delete
            named = f"topic {internal[0]!r} is an internal topic" if len(internal) == 1 else \
                f"topics {', '.join(map(repr, internal))} are internal topics"
            raise CommandError(f"{named}, not allowed to be deleted: nothing was deleted")
        existing = set(await admin.list_topics(timeout_ms=args.timeout_ms))
        missing = sorted(set(args.names) - existing)
        if missing and not args.if_exists:
            raise CommandError(f"topic(s) {', '.join(map(repr, missing))} do not exist: nothing was deleted")
        names = [name for name in dict.fromkeys(args.names) if name in existing]
        deleted = await _delete_topics(admin, args, names) if names else []
    for name in deleted:
        print(f"Deleted topic {name}.")
    return EXIT_OK


async def _delete_topics(admin: Any, args: argparse.Namespace, names: list[str]) -> list[str]:
    """The topics deleted; with --if-exists one deleted meanwhile (by another command, or
    listed by a broker that had not heard yet) is left out, not an error."""
    from tidelog.protocol.errors import UNKNOWN_TOPIC_OR_PARTITION, TidelogError

    try:
        await admin.delete_topics(names, timeout_ms=args.timeout_ms)
    except TidelogError as e:
        results = getattr(e, "results", None)
        if not args.if_exists or results is None or any(
                r is not None and r.error is not UNKNOWN_TOPIC_OR_PARTITION for r in results.values()):
            raise
        return [name for name in names if results.get(name) is None]
    return names


async def _alter(args: argparse.Namespace) -> int:
    changes: dict[str, str | None] = dict(args.config)
    for key in args.delete_config:
        if key in changes:
            raise UsageError(f"config {key!r} is both set and deleted")
        changes[key] = None
    if args.partitions is None and not changes:
        raise UsageError("nothing to alter: give --partitions, --config or --delete-config")
    from tidelog.protocol.errors import UNKNOWN_TOPIC_OR_PARTITION, TidelogError

    async with _admin_session(args) as admin:
        await _connect(admin, args)
        if args.if_exists and args.name not in await admin.list_topics(include_internal=True,
                                                                        timeout_ms=args.timeout_ms):
            return EXIT_OK  # kafka-topics --if-exists: nothing to alter
        try:
            await _alter_topic(admin, args, changes)
        except TidelogError as e:  # with --if-exists, a topic deleted meanwhile is not an error
            if not (args.if_exists and e.error is UNKNOWN_TOPIC_OR_PARTITION):
                raise
    return EXIT_OK


async def _alter_topic(admin: Any, args: argparse.Namespace, changes: dict[str, str | None]) -> None:
    if args.partitions is not None:
        await admin.create_partitions({args.name: args.partitions}, timeout_ms=args.timeout_ms)
        print(f"Topic {args.name} now has {args.partitions} partitions.")
    if changes:
        await admin.alter_configs(args.name, changes, timeout_ms=args.timeout_ms)
        done = [f"set {k}={v}" for k, v in changes.items() if v is not None]
        done += [f"deleted {k}" for k, v in changes.items() if v is None]
        print(f"Updated the configuration of topic {args.name}: {', '.join(done)}.")
        if "min.insync.replicas" in changes:
            await _warn_acks_all_impossible(admin, args, args.name, -1)


async def _describe(args: argparse.Namespace) -> int:
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        names = args.names or None
        if names and args.if_exists:  # kafka-topics --if-exists: only those that exist
            existing = set(await admin.list_topics(include_internal=True, timeout_ms=args.timeout_ms))
            names = [name for name in names if name in existing]
            if not names:
                return EXIT_OK
        descriptions = await admin.describe_topics(names, timeout_ms=args.timeout_ms)
        configs = await _topic_configs(admin, args, [d.name for d in descriptions])
        offsets = await _log_offsets(admin, args, [p for d in descriptions for p in d.partitions])
        moves, racks = await _moves_and_racks(admin, args)
    for d in descriptions:
        overridden, min_isr = configs.get(d.name, ({}, 1))
        for line in describe_lines(d, overridden, offsets, min_isr=min_isr, moves=moves, racks=racks,
                                   under_replicated=args.under_replicated_partitions,
                                   unavailable=args.unavailable_partitions,
                                   under_min_isr=args.under_min_isr_partitions):
            print(line)
    return EXIT_OK


async def _moves_and_racks(admin: Any, args: argparse.Namespace) -> tuple[dict[Any, Any], dict[int, str]]:
    """The reassignments in progress (none shown when the principal may not list them) and
    the brokers' racks (none when no broker has one)."""
    from tidelog.protocol.errors import TidelogError

    try:
        moves = await admin.list_partition_reassignments(timeout_ms=args.timeout_ms)
    except TidelogError:
        moves = {}
    cluster = await admin.describe_cluster(timeout_ms=args.timeout_ms)
    return moves, {b.node_id: b.rack for b in cluster.brokers if b.rack}


async def _topic_configs(admin: Any, args: argparse.Namespace, names: list[str]
                         ) -> dict[str, tuple[dict[str, str], int]]:
    """Each topic's configs that are not the broker's defaults (the header's ``Configs:``),
    and its effective ``min.insync.replicas`` (for the flags; 1 when it cannot be read)."""
    import trio

    configs: dict[str, tuple[dict[str, str], int]] = {}

    from tidelog.protocol.errors import TidelogError

    limit = trio.CapacityLimiter(16)  # a cluster of 10,000 topics: not 10,000 requests at once

    async def one(name: str) -> None:
        try:
            async with limit:
                entries = await admin.describe_configs(name, timeout_ms=args.timeout_ms)
        except TidelogError as e:  # not authorized, deleted meanwhile: the rest is still shown
            print(f"WARNING: cannot read the configs of topic {name!r}: {e}", file=sys.stderr)
            configs[name] = ({}, 1)
            return
        min_isr = entries.get("min.insync.replicas")
        configs[name] = ({k: e.value for k, e in entries.items() if not e.is_default},
                         int(min_isr.value) if min_isr is not None and str(min_isr.value).isdigit() else 1)

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(one, name)
    return configs


def describe_lines(description: Any, configs: dict[str, str],
                   offsets: dict[tuple[str, int], tuple[int | None, int | None]], *, min_isr: int = 1,
                   under_replicated: bool = False, unavailable: bool = False,
                   under_min_isr: bool = False, moves: dict[Any, Any] | None = None,
                   racks: dict[int, str] | None = None) -> list[str]:
    """kafka-topics --describe's lines for one topic: the header (not when filtering, like
    kafka-topics) and one line per partition with Epoch, LEO and HW ("-" when unknown),
    flagged "(offline)" (no leader), "(under-replicated)" (|ISR| < the replication factor:
    during a move, the replicas not being added),
    "(under-min-isr)" (|ISR| < ``min_isr``: acks=all produces fail) and, when |ISR| is also
    below the replica count, "(HW held ...)": the high watermark cannot move, so records past
    it stay invisible to consumers until the ISR grows back (``partition.effective_min_isr``).
    A partition being moved (``moves``: TopicPartition -> PartitionReassignment) shows Kafka's
    "Adding Replicas" and "Removing Replicas"; with ``racks``, each replica's rack follows."""
    from tidelog.protocol.topics import effective_min_isr

    filtered = under_replicated or unavailable or under_min_isr
    name = description.name
    parts = description.partitions
    lines = []
    if not filtered:
        rf = _replication_factor(parts[0], (moves or {}).get(_tp(name, parts[0].partition))) if parts else 0
        shown = ",".join(f"{k}={v}" for k, v in sorted(configs.items()))
        lines.append(f"Topic: {name}\tPartitionCount: {len(parts)}\tReplicationFactor: {rf}\tConfigs: {shown}")
    for p in parts:
        offline = p.leader < 0
        move = (moves or {}).get(_tp(name, p.partition))
        short = len(p.isr) < _replication_factor(p, move)
        below_min = len(p.isr) < min_isr
        if filtered and not ((under_replicated and short) or (unavailable and offline)
                             or (under_min_isr and below_min)):
            continue
        leo, hw = offsets.get((name, p.partition), (None, None))
        need = effective_min_isr(min_isr, len(p.replicas))
        flags = "".join(["\t(offline)" if offline else "", "\t(under-replicated)" if short else "",
                         "\t(under-min-isr)" if below_min else "",
                         f"\t(HW held: ISR {len(p.isr)} < {need} needed for it to advance)"
                         if len(p.isr) < need and not offline else ""])
        moving = (f"\tAdding Replicas: {','.join(map(str, move.adding_replicas))}"
                  f"\tRemoving Replicas: {','.join(map(str, move.removing_replicas))}") if move else ""
        placed = f"\tRacks: {','.join((racks or {}).get(r, '-') for r in p.replicas)}" if racks else ""
        lines.append(f"\tTopic: {name}\tPartition: {p.partition}\t"
                     f"Leader: {'none' if offline else p.leader}\t"
                     f"Replicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}{moving}\t"
                     f"Epoch: {p.leader_epoch}\tLEO: {or_dash(leo)}\tHW: {or_dash(hw)}{placed}{flags}")
    return lines


def _replication_factor(p: Any, move: Any) -> int:
    """Kafka's TopicCommand's: while a move runs (some replica is still being added or
    removed), its replicas minus those being added; a replica catching up does not make the
    partition under-replicated. A move listed but since completed is ignored."""
    if move is not None and set(p.replicas) & (set(move.adding_replicas) | set(move.removing_replicas)):
        return len(move.replicas) - len(move.adding_replicas)
    return len(p.replicas)


def _tp(topic: str, partition: int) -> Any:
    from tidelog import TopicPartition

    return TopicPartition(topic, partition)


async def _log_offsets(admin: Any, args: argparse.Namespace, partitions: Sequence[Any]
                       ) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """``(topic, partition) -> (LEO, HW)`` of the partitions that have a leader. Each leader's
    partitions are asked for on their own: a leader that does not answer within the bound
    leaves out its partitions only."""
    import trio

    from tidelog.protocol.errors import TidelogError
    from tidelog.protocol.messages import LATEST_TIMESTAMP
    from tidelog.records import TopicPartition

    by_leader: dict[int, list[Any]] = {}
    for p in partitions:
        if p.leader >= 0:
            by_leader.setdefault(p.leader, []).append(TopicPartition(p.topic, p.partition))
    timeout_ms = min(args.timeout_ms, OFFSETS_TIMEOUT_MS)
    leo: dict[Any, int] = {}
    hw: dict[Any, int] = {}

    async def log_end(tps: list[Any]) -> None:
        leo.update(await admin.log_end_offsets(tps, timeout_ms=timeout_ms))

    async def high_watermark(tps: list[Any]) -> None:
        found = await admin.list_offsets({tp: LATEST_TIMESTAMP for tp in tps}, timeout_ms=timeout_ms)
        hw.update({tp: offset for tp, (offset, _) in found.items()})

    async def tolerant(ask: Callable[[list[Any]], Any], tps: list[Any]) -> None:
        try:
            await ask(tps)
        except TidelogError:
            pass  # printed as "-"

    async with trio.open_nursery() as nursery:
        for tps in by_leader.values():
            nursery.start_soon(tolerant, log_end, tps)
            nursery.start_soon(tolerant, high_watermark, tps)
    return {(tp.topic, tp.partition): (leo.get(tp), hw.get(tp)) for tp in leo.keys() | hw.keys()}


async def _elect_leaders(args: argparse.Namespace) -> int:
    """Leader election (kafka-leader-election --election-type preferred|unclean)."""
    from tidelog.protocol.errors import ELECTION_NOT_NEEDED, NONE, for_code
    from tidelog.records import TopicPartition

    if args.partition is not None and not args.names:  # else every partition would be elected
        raise UsageError("--partition needs the topic names it applies to")
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        partitions = None
        if args.names:
            descriptions = await admin.describe_topics(args.names, timeout_ms=args.timeout_ms)
            partitions = [TopicPartition(d.name, p.partition) for d in descriptions for p in d.partitions
                          if args.partition is None or p.partition == args.partition]
            if not partitions:
                raise CommandError(f"partition {args.partition} does not exist in {', '.join(args.names)}")
        election_type = getattr(args, "election_type", "preferred")
        results = await admin.elect_leaders(partitions, timeout_ms=args.timeout_ms, election_type=election_type)
    elected = "the preferred replica" if election_type == "preferred" else "a replica (unclean election)"
    if partitions is None and not results:  # of all partitions, those needing none are not answered
        print("No partition needed an election.")
    failed = 0
    for tp, (code, message) in sorted(results.items()):
        if code == NONE.code:
            print(f"Successfully elected {elected} as leader of {tp.topic}-{tp.partition}.")
        elif code == ELECTION_NOT_NEEDED.code:
            print(f"Valid replica already elected for {tp.topic}-{tp.partition}.")
        else:
            failed += 1
            print(f"Error for {tp.topic}-{tp.partition}: {for_code(code).name}: {message}", file=sys.stderr)
    return EXIT_OK if not failed else 1


async def _delete_records(args: argparse.Namespace) -> int:
    """kafka-delete-records: each partition's low watermark after the deletion."""
    from tidelog.records import TopicPartition

    if args.offset < -1:
        raise UsageError(f"--offset must be >= 0, or -1 for the high watermark, not {args.offset}")
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        partitions = args.partition
        if not partitions:
            (description,) = await admin.describe_topics([args.name], timeout_ms=args.timeout_ms)
            partitions = [p.partition for p in description.partitions]
        low = await admin.delete_records({TopicPartition(args.name, p): args.offset for p in partitions},
                                         timeout_ms=args.timeout_ms)
    for tp, low_watermark in sorted(low.items()):
        print(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {low_watermark}")
    return EXIT_OK


_ACTIONS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "create": _create, "list": _list, "describe": _describe, "alter": _alter, "delete": _delete,
    "delete-records": _delete_records, "elect-leaders": _elect_leaders}
