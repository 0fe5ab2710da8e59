"""``tidelog reassign``: move partitions between brokers, in kafka-reassign-partitions' shape.

* ``--generate --topics-to-move-json-file F --broker-list 1,2,3``: prints the current
  assignment of the topics in F and a proposal that places them on the listed brokers with
  the rule topic creation uses (rack-aware when every listed broker has a rack, unless
  ``--disable-rack-aware``). Leaving a broker out of the list drains it.
* ``--execute --reassignment-json-file F``: prints the current assignment (keep it to roll
  back), then starts the moves (AlterPartitionReassignments). Refused while other moves run,
  unless ``--additional``. ``--throttle B`` bounds the copying to B bytes/s per broker
  (broker/replication/throttle.py: the brokers' rates and the topics' throttled replicas).
* ``--verify --reassignment-json-file F``: per partition, done or still moving; once all are
  done, the throttles ``--execute --throttle`` set are removed (unless ``--preserve-throttles``).
* ``--cancel --reassignment-json-file F``: cancels the moves of F's partitions still running
  (they return to their original replicas), then removes the throttles (unless
  ``--preserve-throttles``), even when none of the moves was still running.

The JSON files are Kafka's: ``{"version": 1, "topics": [{"topic": "foo"}]}`` and
``{"version": 1, "partitions": [{"topic": "foo", "partition": 0, "replicas": [1, 2],
"log_dirs": ["any", "any"]}]}`` (log_dirs optional, and only "any": one log dir per replica
is the broker's choice). Reading and writing them, and the proposal, are pure functions here.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
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

__all__ = ["generate", "parse_reassignment", "parse_topics_to_move", "reassignment_json", "register", "run",
           "throttled_replicas"]

Assignment = dict[tuple[str, int], list[int]]  # (topic, partition) -> replicas


def register(commands: Any) -> None:
    add_command(commands, "reassign", "move partitions between brokers (like kafka-reassign-partitions)",
                "Generate, execute, verify or cancel partition reassignments; the JSON files are "
                "kafka-reassign-partitions' own.", arguments, run)


def arguments(p: argparse.ArgumentParser) -> None:
    client_options(p)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--generate", action="store_true", help="propose an assignment of the topics onto the brokers")
    mode.add_argument("--execute", action="store_true", help="start the reassignment of the JSON file")
    mode.add_argument("--verify", action="store_true", help="tell which partitions of the JSON file are done")
    mode.add_argument("--cancel", action="store_true", help="cancel the moves of the JSON file still running")
    p.add_argument("--topics-to-move-json-file", metavar="FILE", help="--generate: the topics to move")
    p.add_argument("--broker-list", metavar="ID,ID,...", help="--generate: the brokers to place them on")
    p.add_argument("--disable-rack-aware", action="store_true", help="--generate: ignore the brokers' racks")
    p.add_argument("--reassignment-json-file", metavar="FILE", help="--execute/--verify/--cancel: the moves")
    p.add_argument("--additional", action="store_true",
                   help="--execute: start these moves even while others are running")
    p.add_argument("--throttle", type=int, metavar="BYTES/S",
                   help="--execute: copy the moving replicas at no more than this many bytes per second "
                        "(replicas that keep up are not held); --verify removes the throttle when done")
    p.add_argument("--preserve-throttles", action="store_true",
                   help="--verify/--cancel: leave the throttles in place")
    p.add_argument("--timeout-ms", type=int, default=30000, metavar="MS",
                   help="bound on the admin requests (default 30000)")


def run(args: argparse.Namespace) -> int:
    import trio

    mode = next(m for m in ("generate", "execute", "verify", "cancel") if getattr(args, m))

    def body(a: argparse.Namespace) -> int:
        return trio.run(_MODES[mode], a)

    return run_command(f"reassign --{mode}", body, args)


# -- the JSON files (pure) ------------------------------------------------------------------------


def _load(path: str | None, option: str) -> Any:
    if not path:
        raise UsageError(f"{option} is required here")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{option}: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"{option}: {path} is not JSON: {e}") from None


def parse_topics_to_move(doc: Any) -> list[str]:
    """``{"version": 1, "topics": [{"topic": "foo"}, ...]}`` -> the topic names (ValueError
    naming what is wrong)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("topics"), list):
        raise ValueError('expected {"version": 1, "topics": [{"topic": NAME}, ...]}')
    names = []
    for i, entry in enumerate(doc["topics"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("topic"), str):
            raise ValueError(f'topics[{i}]: expected {{"topic": NAME}}, got {entry!r:.100}')
        names.append(entry["topic"])
    if len(set(names)) != len(names):
        raise ValueError("a topic is listed more than once")
    if not names:
        raise ValueError("no topic to move")
    return names


def parse_reassignment(doc: Any) -> Assignment:
    """Kafka's reassignment JSON -> {(topic, partition): replicas} (ValueError naming the
    first problem, with Kafka's rules: no duplicate partition, a non-empty replica list
    without duplicates, log_dirs as long as the replicas and only "any")."""
    if not isinstance(doc, dict) or not isinstance(doc.get("partitions"), list):
        raise ValueError('expected {"version": 1, "partitions": [{"topic", "partition", "replicas"}, ...]}')
    out: Assignment = {}
    for i, entry in enumerate(doc["partitions"]):
        where = f"partitions[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object, got {entry!r:.100}")
        topic, partition, replicas = entry.get("topic"), entry.get("partition"), entry.get("replicas")
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"{where}: a topic name is required")
        if not isinstance(partition, int) or isinstance(partition, bool) or partition < 0:
            raise ValueError(f"{where} ({topic}): partition must be a non-negative integer, got {partition!r}")
        if not isinstance(replicas, list) or not all(isinstance(r, int) and not isinstance(r, bool) for r in replicas):
            raise ValueError(f"{where} ({topic}-{partition}): replicas must be a list of broker ids")
        if not replicas:
            raise ValueError(f"{where} ({topic}-{partition}): the replica list cannot be empty")
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"{where} ({topic}-{partition}): the replica list {replicas} names a broker twice")
        log_dirs = entry.get("log_dirs")
        if log_dirs is not None:
            if not isinstance(log_dirs, list) or len(log_dirs) != len(replicas):
                raise ValueError(f"{where} ({topic}-{partition}): log_dirs must list one entry per replica")
            if any(d != "any" for d in log_dirs):
                raise ValueError(f"{where} ({topic}-{partition}): only \"any\" log dirs are supported "
                                 "(each broker picks the directory of a new replica)")
        if (topic, partition) in out:
            raise ValueError(f"{where}: {topic}-{partition} is listed more than once")
        out[(topic, partition)] = list(replicas)
    if not out:
        raise ValueError("no partition to reassign")
    return out


def reassignment_json(assignment: Mapping[tuple[str, int], Iterable[int]]) -> str:
    """Kafka's reassignment JSON (with "any" log dirs), partitions in order."""
    parts = [{"topic": t, "partition": p, "replicas": list(r), "log_dirs": ["any"] * len(list(r))}
             for (t, p), r in sorted(assignment.items())]
    return json.dumps({"version": 1, "partitions": parts}, separators=(",", ":"))


def generate(current: Assignment, brokers: list[int], racks: Mapping[int, str | None] | None,
             rng: Any = None) -> Assignment:
    """The proposal of ``--generate``: each topic of ``current`` placed anew on ``brokers``
    with its partition count and replication factor, by topic creation's rule."""
    import random

    from tidelog.protocol.placement import assign_replicas

    by_topic: dict[str, dict[int, list[int]]] = {}
    for (t, p), replicas in current.items():
        by_topic.setdefault(t, {})[p] = replicas
    out: Assignment = {}
    for topic, parts in sorted(by_topic.items()):
        rf = len(parts[min(parts)])
        placed = assign_replicas(brokers, len(parts), rf, racks=racks, rng=rng or random)
        out.update({(topic, p): placed[i] for i, p in enumerate(sorted(parts))})
    return out


# -- the modes ------------------------------------------------------------------------------------


def _admin(args: argparse.Namespace) -> Any:
    from tidelog.aio import AsyncAdmin

    return AsyncAdmin(args.bootstrap, client_id="tidelog-reassign", request_timeout_ms=min(args.timeout_ms, 30000),
                      default_api_timeout_ms=args.timeout_ms, **connection_options(args))


async def _connect(admin: Any, args: argparse.Namespace) -> Any:
    from tidelog.protocol.errors import TidelogError

    try:
        return await admin.describe_cluster(timeout_ms=args.connect_timeout_ms)
    except TidelogError as e:
        raise CommandError(unreachable(args.bootstrap, e)) from None


async def _current(admin: Any, topics: Iterable[str]) -> Assignment:
    out: Assignment = {}
    for d in await admin.describe_topics(sorted(set(topics))):
        for p in d.partitions:
            out[(d.name, p.partition)] = list(p.replicas)
    return out


def _broker_list(text: str | None) -> list[int]:
    if not text:
        raise UsageError("--generate needs --broker-list")
    try:
        brokers = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise UsageError(f"--broker-list: expected broker ids separated by commas, got {text!r}") from None
    if not brokers or len(set(brokers)) != len(brokers):
        raise UsageError(f"--broker-list: expected distinct broker ids, got {text!r}")
    return brokers


def _file(args: argparse.Namespace) -> Assignment:
    doc = _load(args.reassignment_json_file, "--reassignment-json-file")
    try:
        return parse_reassignment(doc)
    except ValueError as e:
        raise UsageError(f"--reassignment-json-file {args.reassignment_json_file}: {e}") from None


async def _generate(args: argparse.Namespace) -> int:
    doc = _load(args.topics_to_move_json_file, "--topics-to-move-json-file")
    try:
        topics = parse_topics_to_move(doc)
    except ValueError as e:
        raise UsageError(f"--topics-to-move-json-file {args.topics_to_move_json_file}: {e}") from None
    brokers = _broker_list(args.broker_list)
    async with _admin(args) as admin:
        cluster = await _connect(admin, args)
        known = {b.node_id: b.rack for b in cluster.brokers}
        if unknown := sorted(set(brokers) - set(known)):
            raise CommandError(f"--broker-list names brokers that are not in the cluster: {unknown}")
        current = await _current(admin, topics)
    racks = None if args.disable_rack_aware or not all(known[b] for b in brokers) else {b: known[b] for b in brokers}
    try:
        proposal = generate(current, brokers, racks)
    except ValueError as e:
        raise CommandError(str(e)) from None
    print("Current partition replica assignment")
    print(reassignment_json(current))
    print()
    print("Proposed partition reassignment configuration")
    print(reassignment_json(proposal))
    return EXIT_OK


async def _execute(args: argparse.Namespace) -> int:
    wanted = _file(args)
    async with _admin(args) as admin:
        await _connect(admin, args)
        if not args.additional and (running := await admin.list_partition_reassignments()):
            names = ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(running)[:10])
            raise CommandError(f"partitions are being reassigned already ({names}); wait for them, or "
                               "pass --additional to start these moves too")
        current = await _current(admin, {t for t, _ in wanted})
        if missing := sorted(tp for tp in wanted if tp not in current):
            raise CommandError("no such partitions: " + ", ".join(f"{t}-{p}" for t, p in missing[:20]))
        print("Current partition replica assignment")
        print()
        print(reassignment_json({tp: current[tp] for tp in wanted}))
        print()
        print("Save this to use as the --reassignment-json-file option during rollback")
        if args.throttle is not None:
            if args.throttle <= 0:
                raise UsageError(f"--throttle must be a positive number of bytes per second, got {args.throttle}")
            await _set_throttles(admin, args, wanted, current)
        results = await admin.alter_partition_reassignments(_moves(wanted), timeout_ms=args.timeout_ms)
    return _report(results, "started partition reassignments")


async def _verify(args: argparse.Namespace) -> int:
    from tidelog import TopicPartition

    wanted = _file(args)
    async with _admin(args) as admin:
        cluster = await _connect(admin, args)
        moving = await admin.list_partition_reassignments([TopicPartition(t, p) for t, p in wanted])
        current = await _current(admin, {t for t, _ in wanted})
        if not moving and not args.preserve_throttles:
            await _clear_throttles(admin, args, [b.node_id for b in cluster.brokers], {t for t, _ in wanted})
    print("Status of partition reassignment:")
    status = EXIT_OK
    for (t, p), target in sorted(wanted.items()):
        if TopicPartition(t, p) in moving:
            print(f"Reassignment of partition {t}-{p} is still in progress.")
        elif current.get((t, p)) == target:
            print(f"Reassignment of partition {t}-{p} is completed.")
        else:
            status = EXIT_FAILED
            have = ",".join(map(str, current.get((t, p), []))) or "none (no such partition)"
            print(f"There is no active reassignment of partition {t}-{p}, but replica set is {have} "
                  f"rather than {','.join(map(str, target))}.")
    return status


async def _cancel(args: argparse.Namespace) -> int:
    from tidelog import TopicPartition

    wanted = _file(args)
    async with _admin(args) as admin:
        cluster = await _connect(admin, args)
        moving = await admin.list_partition_reassignments([TopicPartition(t, p) for t, p in wanted])
        results = {}
        if moving:
            results = await admin.alter_partition_reassignments({tp: None for tp in moving},
                                                                timeout_ms=args.timeout_ms)
        # as Kafka's cancelAssignment: the moves may have ended since --execute --throttle, and
        # the throttles they left must go all the same
        if not args.preserve_throttles:
            await _clear_throttles(admin, args, [b.node_id for b in cluster.brokers], {t for t, _ in wanted})
    if not moving:
        print("None of the specified partition reassignments are active.")
        return EXIT_OK
    return _report(results, "cancelled partition reassignments")


def throttled_replicas(wanted: Assignment, current: Assignment) -> dict[str, tuple[str, str]]:
    """Per topic, the (leader, follower) throttled-replica lists of a reassignment, as
    kafka-reassign-partitions sets them: the leader side of every current replica of a moving
    partition, the follower side of every replica being added."""
    leader: dict[str, set[tuple[int, int]]] = {}
    follower: dict[str, set[tuple[int, int]]] = {}
    for (t, p), target in wanted.items():
        now = current.get((t, p), [])
        if list(target) == list(now):
            continue
        leader.setdefault(t, set()).update((p, b) for b in now)
        follower.setdefault(t, set()).update((p, b) for b in target if b not in now)
    return {t: (",".join(f"{p}:{b}" for p, b in sorted(leader.get(t, ()))),
                ",".join(f"{p}:{b}" for p, b in sorted(follower.get(t, ())))) for t in sorted(leader)}


async def _set_throttles(admin: Any, args: argparse.Namespace, wanted: Assignment, current: Assignment) -> None:
    from tidelog.protocol.throttles import FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS

    for topic, lists in throttled_replicas(wanted, current).items():
        # added to what the topic lists already (the throttles of moves still running)
        existing = await admin.describe_configs(topic, [LEADER_REPLICAS, FOLLOWER_REPLICAS], timeout_ms=args.timeout_ms)
        merged = {}
        for key, new in zip((LEADER_REPLICAS, FOLLOWER_REPLICAS), lists):
            old = existing[key].value if key in existing and not existing[key].is_default else ""
            entries = {e for e in f"{old},{new}".split(",") if e}
            merged[key] = "*" if "*" in entries else ",".join(sorted(entries)) or None
        await admin.alter_configs(topic, merged, timeout_ms=args.timeout_ms)
    brokers = sorted({b for r in [*wanted.values(), *current.values()] for b in r})
    for b in brokers:
        await admin.alter_broker_configs(b, {LEADER_RATE: str(args.throttle), FOLLOWER_RATE: str(args.throttle)},
                                         timeout_ms=args.timeout_ms)
    print("Warning: You must run --verify periodically, until the reassignment completes, to ensure the "
          "throttle is removed.")
    print(f"The inter-broker throttle limit was set to {args.throttle} B/s")


async def _clear_throttles(admin: Any, args: argparse.Namespace, brokers: list[int], topics: set[str]) -> None:
    from tidelog.protocol.throttles import FOLLOWER_RATE, FOLLOWER_REPLICAS, LEADER_RATE, LEADER_REPLICAS

    for b in sorted(brokers):
        await admin.alter_broker_configs(b, {LEADER_RATE: None, FOLLOWER_RATE: None}, timeout_ms=args.timeout_ms)
    print(f"Clearing broker-level throttles on brokers {','.join(map(str, sorted(brokers)))}")
    for t in sorted(topics):
        await admin.alter_configs(t, {LEADER_REPLICAS: None, FOLLOWER_REPLICAS: None}, timeout_ms=args.timeout_ms)
        print(f"Clearing topic-level throttles on topic {t}")


def _moves(wanted: Assignment) -> dict:
    from tidelog import TopicPartition

    return {TopicPartition(t, p): r for (t, p), r in wanted.items()}


def _report(results: Mapping[Any, tuple[int, str | None]], what: str) -> int:
    from tidelog.protocol.errors import NONE

    ok = sorted(tp for tp, (code, _) in results.items() if code == NONE.code)
    failed = sorted((tp, msg) for tp, (code, msg) in results.items() if code != NONE.code)
    if ok:
        print(f"Successfully {what} for: " + ",".join(f"{tp.topic}-{tp.partition}" for tp in ok))
    for tp, msg in failed:
        print(f"Error for {tp.topic}-{tp.partition}: {msg}", file=sys.stderr)
    return EXIT_FAILED if failed else EXIT_OK


_MODES = {"generate": _generate, "execute": _execute, "verify": _verify, "cancel": _cancel}
