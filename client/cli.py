"""The client commands of the ``tidelog`` CLI (DESIGN.md section 7): topics, produce, consume,
groups, perf. ``tidelog.broker.cli`` defines their arguments (so ``tidelog --help`` stays light) and calls
``topics``, ``produce``, ``consume`` or ``perf`` here with the parsed ``argparse.Namespace``;
each returns the exit status: 0 success, 1 failure (explained on stderr), 2 usage errors.

Every command first checks that some broker answers within ``--connect-timeout-ms``, so a
cluster that is down is reported as such within seconds; every later wait is bounded too
(``--timeout-ms`` for admin calls, the producer's delivery timeout, the consumer's idle
timeout).

``topics describe`` prints kafka-topics' lines plus the leader epoch, the log end offset and
the high watermark. ``groups`` follows kafka-consumer-groups: ``describe`` prints one line per
partition (GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID,
"-" where there is nothing); ``reset-offsets`` computes a plan (earliest, latest, an offset
clamped into the partition's range, a shift from the committed offset, or the first offset at
a time), prints it, and applies it only with ``--execute`` and only while the group is
inactive. ``consume --group`` commits the offsets of the records it printed after each batch
and when it exits (never past what it printed). The SDK has no call for the LEO: it is read with a ListOffsets request
of the replica kind (``replica_id`` = the leader's id, for which a broker answers with its
LEO instead of the HW), sent through ``tidelog.aio.cluster.Cluster``; "-" when unknown.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from typing import Any, BinaryIO

from tidelog.perf import PerfResult, Window
from tidelog.protocol.errors import (
    TOPIC_ALREADY_EXISTS,
    UNKNOWN_TOPIC_OR_PARTITION,
    TidelogError,
)

__all__ = [
    "consume",
    "groups",
    "group_describe_lines",
    "reset_plan",
    "describe_lines",
    "kafka_options",
    "perf",
    "produce",
    "progress_line",
    "result_json",
    "summary_line",
    "topics",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# bounds for the console producer unless --producer-property says otherwise (the SDK's
# defaults are 120 s delivery and 60 s max block: too long for a command at a terminal)
CONSOLE_PRODUCER_DEFAULTS = {"request_timeout_ms": 10000, "delivery_timeout_ms": 30000,
                             "max_block_ms": 10000}
MAX_ERRORS_SHOWN = 10


class CommandError(Exception):
    """A failure to report on stderr (exit 1)."""


class UsageError(CommandError):
    """A bad combination of arguments (exit 2)."""


def _run(name: str, body: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from tidelog.aio.cluster import parse_bootstrap

    try:
        try:
            parse_bootstrap(args.bootstrap)
        except ValueError as e:
            raise UsageError(f"--bootstrap: {e}") from None
        return body(args)
    except UsageError as e:
        print(f"tidelog {name}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (CommandError, TidelogError) as e:
        print(f"tidelog {name}: {e}", file=sys.stderr)
        return EXIT_FAILED


def kafka_options(pairs: Iterable[tuple[str, str]], config_type: type, what: str) -> dict[str, Any]:
    """``[("linger.ms", "5"), ...]`` (Kafka's property names) -> the SDK's keyword options
    (``{"linger_ms": 5}``), checked against ``config_type``'s fields. Integers become ints
    and true/false booleans; anything else stays a string."""
    known = {f.name for f in fields(config_type)} - {"bootstrap_servers"}
    out: dict[str, Any] = {}
    for key, raw in pairs:
        name = key.strip().replace(".", "_").replace("-", "_")
        if name not in known:
            raise UsageError(f"unknown {what} property {key!r} (known: "
                             f"{', '.join(sorted(k.replace('_', '.') for k in known))})")
        out[name] = property_value(raw)
    return out


def property_value(raw: Any) -> int | bool | str:
    """A Kafka property's text as the SDK option value: an integer, true/false, or the text."""
    value = str(raw).strip()
    if value.lstrip("-").isdigit():
        return int(value)
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _unreachable(bootstrap: str, e: BaseException) -> str:
    return f"cannot reach the cluster at {bootstrap}: {e}"


def _check_cluster(args: argparse.Namespace, topic: str | None = None) -> list[int]:
    """Fail (CommandError) unless some broker answers within --connect-timeout-ms; with
    ``topic``, return its partition ids (failing if it does not exist)."""
    from tidelog import Admin

    timeout_ms = args.connect_timeout_ms
    with Admin(args.bootstrap, client_id="tidelog-cli", request_timeout_ms=timeout_ms,
               default_api_timeout_ms=timeout_ms) as admin:
        try:
            admin.describe_cluster()
        except TidelogError as e:
            raise CommandError(_unreachable(args.bootstrap, e)) from None
        if topic is None:
            return []
        (description,) = admin.describe_topics([topic])
    partitions = [p.partition for p in description.partitions]
    if not partitions:
        raise CommandError(f"topic {topic!r} has no partitions")
    return partitions


def _binary_stdout() -> BinaryIO:
    sys.stdout.flush()
    return getattr(sys.stdout, "buffer", None) or _TextAsBinary(sys.stdout)


class _TextAsBinary:
    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode("utf-8", "backslashreplace"))

    def flush(self) -> None:
        self.stream.flush()


# =============================================================================================
# topics


def topics(args: argparse.Namespace) -> int:
    import trio

    action = args.action

    def body(a: argparse.Namespace) -> int:
        return trio.run(_TOPIC_ACTIONS[action], a)

    return _run(f"topics {action}", body, args)


def _admin_session(args: argparse.Namespace) -> Any:
    from tidelog.aio import AsyncAdmin

    return AsyncAdmin(args.bootstrap, client_id="tidelog-topics",
                      request_timeout_ms=min(args.timeout_ms, 30000), default_api_timeout_ms=args.timeout_ms)


async def _connect(admin: Any, args: argparse.Namespace) -> None:
    try:
        await admin.describe_cluster(timeout_ms=args.connect_timeout_ms)
    except TidelogError as e:
        raise CommandError(_unreachable(args.bootstrap, e)) from None


async def _topics_create(args: argparse.Namespace) -> int:
    from tidelog.aio import NewTopic

    config = dict(args.config)
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        try:
            await admin.create_topics([NewTopic(args.name, args.partitions, args.replication_factor,
                                                config=config)], timeout_ms=args.timeout_ms)
        except TidelogError as e:
            if args.if_not_exists and getattr(e, "error", None) is TOPIC_ALREADY_EXISTS:
                return EXIT_OK
            raise
    print(f"Created topic {args.name}.")
    return EXIT_OK


async def _topics_list(args: argparse.Namespace) -> int:
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        names = await admin.list_topics(timeout_ms=args.timeout_ms)
    for name in names:
        print(name)
    return EXIT_OK


async def _topics_delete(args: argparse.Namespace) -> int:
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        await admin.delete_topics(args.names, timeout_ms=args.timeout_ms)
    for name in args.names:
        print(f"Deleted topic {name}.")
    return EXIT_OK


async def _topics_alter(args: argparse.Namespace) -> int:
    changes: dict[str, str | None] = dict(args.config)
    for key in args.delete_config:
        if key in changes:
            raise UsageError(f"config {key!r} is both set and deleted")
        changes[key] = None
    if args.partitions is None and not changes:
        raise UsageError("nothing to alter: give --partitions, --config or --delete-config")
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        if args.partitions is not None:
            await admin.create_partitions({args.name: args.partitions}, timeout_ms=args.timeout_ms)
            print(f"Topic {args.name} now has {args.partitions} partitions.")
        if changes:
            await admin.alter_configs(args.name, changes, timeout_ms=args.timeout_ms)
            done = [f"set {k}={v}" for k, v in changes.items() if v is not None]
            done += [f"deleted {k}" for k, v in changes.items() if v is None]
            print(f"Updated the configuration of topic {args.name}: {', '.join(done)}.")
    return EXIT_OK


async def _topics_describe(args: argparse.Namespace) -> int:
    import trio

    filtered = args.under_replicated_partitions or args.unavailable_partitions
    async with _admin_session(args) as admin:
        await _connect(admin, args)
        descriptions = await admin.describe_topics(args.names or None, timeout_ms=args.timeout_ms)
        configs: dict[str, dict[str, str]] = {}
        if not filtered:
            async def one(name: str) -> None:
                entries = await admin.describe_configs(name, timeout_ms=args.timeout_ms)
                configs[name] = {k: e.value for k, e in entries.items() if not e.is_default}

            async with trio.open_nursery() as nursery:
                for d in descriptions:
                    nursery.start_soon(one, d.name)
    offsets = await _log_offsets(args, [p for d in descriptions for p in d.partitions])
    for d in descriptions:
        for line in describe_lines(d, configs.get(d.name, {}), offsets,
                                   under_replicated=args.under_replicated_partitions,
                                   unavailable=args.unavailable_partitions):
            print(line)
    return EXIT_OK


def describe_lines(description: Any, configs: dict[str, str],
                   offsets: dict[tuple[str, int], tuple[int | None, int | None]], *,
                   under_replicated: bool = False, unavailable: bool = False) -> list[str]:
    """kafka-topics --describe's lines for one topic: the header (not when filtering, like
    kafka-topics) and one line per partition with Epoch, LEO and HW ("-" when unknown),
    flagged "(under-replicated)" (|ISR| < |replicas|) or "(offline)" (no leader)."""
    filtered = under_replicated or unavailable
    name = description.name
    parts = description.partitions
    lines = []
    if not filtered:
        rf = len(parts[0].replicas) if parts else 0
        shown = ",".join(f"{k}={v}" for k, v in sorted(configs.items()))
        lines.append(f"Topic: {name}\tPartitionCount: {len(parts)}\tReplicationFactor: {rf}\tConfigs: {shown}")
    for p in parts:
        offline = p.leader < 0
        short = len(p.isr) < len(p.replicas)
        if filtered and not ((under_replicated and short) or (unavailable and offline)):
            continue
        leo, hw = offsets.get((name, p.partition), (None, None))
        flags = "".join(["\t(offline)" if offline else "", "\t(under-replicated)" if short else ""])
        lines.append(f"\tTopic: {name}\tPartition: {p.partition}\t"
                     f"Leader: {'none' if offline else p.leader}\t"
                     f"Replicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}\t"
                     f"Epoch: {p.leader_epoch}\tLEO: {_or_dash(leo)}\tHW: {_or_dash(hw)}{flags}")
    return lines


def _or_dash(v: int | None) -> str:
    return "-" if v is None or v < 0 else str(v)


async def _log_offsets(args: argparse.Namespace, partitions: Sequence[Any]
                       ) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """``(topic, partition) -> (LEO, HW)`` asked of each partition's leader: ListOffsets
    "latest" as a consumer (the HW) and as the leader itself (its LEO). Partitions without a
    leader, or whose leader does not answer in time, are left out."""
    import trio

    from tidelog.aio.cluster import Cluster
    from tidelog.protocol.errors import NONE
    from tidelog.protocol.messages import (
        LATEST_TIMESTAMP,
        ApiKey,
        ListOffsetsPartition,
        ListOffsetsRequest,
        ListOffsetsTopic,
    )

    by_leader: dict[int, dict[str, list[int]]] = {}
    for p in partitions:
        if p.leader >= 0:
            by_leader.setdefault(p.leader, {}).setdefault(p.topic, []).append(p.partition)
    found: dict[tuple[str, int], list[int | None]] = {}
    if not by_leader:
        return {}
    timeout = min(args.timeout_ms, 10000) / 1000
    cluster = Cluster(args.bootstrap, client_id="tidelog-topics", request_timeout_ms=int(timeout * 1000))

    async def ask(node: int, topics: dict[str, list[int]], replica_id: int, slot: int) -> None:
        request = ListOffsetsRequest(
            [ListOffsetsTopic(t, [ListOffsetsPartition(p, LATEST_TIMESTAMP) for p in ps])
             for t, ps in topics.items()], replica_id=replica_id)
        try:
            response = await cluster.request(node, request, api_key=ApiKey.LIST_OFFSETS, timeout=timeout)
        except TidelogError:
            return
        for t in response.topics:
            for r in t.partitions:
                if r.error_code == NONE.code:
                    found.setdefault((t.name, r.partition_index), [None, None])[slot] = r.offset

    async with trio.open_nursery() as nursery:
        await nursery.start(cluster.run)
        try:
            await cluster.refresh(sorted({p.topic for p in partitions}), timeout=timeout)
            async with trio.open_nursery() as asks:
                for node, topics_ in by_leader.items():
                    asks.start_soon(ask, node, topics_, node, 0)  # as the replica: the LEO
                    asks.start_soon(ask, node, topics_, -1, 1)  # as a consumer: the HW
        except TidelogError:
            pass
        finally:
            await cluster.aclose()
            nursery.cancel_scope.cancel()
    return {k: (v[0], v[1]) for k, v in found.items()}


async def _topics_elect_leaders(args: argparse.Namespace) -> int:
    """Preferred leader election (kafka-leader-election --election-type preferred)."""
    from tidelog.protocol.errors import ELECTION_NOT_NEEDED, NONE, for_code
    from tidelog.records import TopicPartition

    async with _admin_session(args) as admin:
        await _connect(admin, args)
        partitions = None
        if args.names:
            descriptions = await admin.describe_topics(args.names, timeout_ms=args.timeout_ms)
            partitions = [TopicPartition(d.name, p.partition) for d in descriptions for p in d.partitions
                          if args.partition is None or p.partition == args.partition]
        results = await admin.elect_leaders(partitions, timeout_ms=args.timeout_ms)
    failed = 0
    for tp, (code, message) in sorted(results.items()):
        if code == NONE.code:
            print(f"Successfully elected the preferred replica as leader of {tp.topic}-{tp.partition}.")
        elif code == ELECTION_NOT_NEEDED.code:
            print(f"Valid replica already elected for {tp.topic}-{tp.partition}.")
        else:
            failed += 1
            print(f"Error for {tp.topic}-{tp.partition}: {for_code(code).name}: {message}", file=sys.stderr)
    return EXIT_OK if not failed else 1


async def _topics_delete_records(args: argparse.Namespace) -> int:
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


_TOPIC_ACTIONS = {"create": _topics_create, "list": _topics_list, "describe": _topics_describe,
                  "alter": _topics_alter, "delete": _topics_delete, "delete-records": _topics_delete_records,
                  "elect-leaders": _topics_elect_leaders}


# =============================================================================================
# produce


def produce(args: argparse.Namespace) -> int:
    return _run("produce", _produce, args)


def _producer_options(args: argparse.Namespace) -> dict[str, Any]:
    from tidelog.aio.producer import ProducerConfig

    options = dict(CONSOLE_PRODUCER_DEFAULTS)
    options["acks"] = args.acks
    if args.compression is not None:
        options["compression_type"] = args.compression
    if args.linger_ms is not None:
        options["linger_ms"] = args.linger_ms
    options.update(kafka_options(args.producer_property, ProducerConfig, "producer"))
    return options


def _produce(args: argparse.Namespace) -> int:
    from tidelog import Producer

    options = _producer_options(args)
    separator = args.key_separator.encode() if args.key_separator is not None else None
    if separator == b"":
        raise UsageError("--key-separator must not be empty")
    _check_cluster(args)
    try:
        producer = Producer(args.bootstrap, client_id="tidelog-produce", **options)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    failures: list[str] = []
    sent = 0
    interrupted = False

    def on_done(future: Any, lineno: int) -> None:  # the producer's thread
        error = future.exception(0)
        if error is not None and not interrupted:
            failures.append(f"line {lineno}: {error}")
            if len(failures) <= MAX_ERRORS_SHOWN:
                print(f"tidelog produce: record from line {lineno} failed: {error}", file=sys.stderr)

    try:
        for lineno, line in enumerate(_stdin_lines(), 1):
            key = None
            value = line
            if separator is not None:
                key, found, value = line.partition(separator)
                if not found:
                    raise CommandError(f"line {lineno} has no key separator {args.key_separator!r}")
            try:
                future = producer.send(args.topic, value, key=key, partition=args.partition)
            except ValueError as e:
                raise CommandError(str(e)) from None
            future.add_done_callback(lambda f, n=lineno: on_done(f, n))
            sent += 1
        producer.flush()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        producer.close(5.0 if interrupted else None)
    if failures:
        more = len(failures) - MAX_ERRORS_SHOWN
        raise CommandError(f"{len(failures)} of {sent} records failed"
                           + (f" ({more} not shown)" if more > 0 else ""))
    return EXIT_OK


def _stdin_lines() -> Iterable[bytes]:
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:  # a text stream (tests): encode back
        for line in sys.stdin:
            yield _chomp(line.encode())
        return
    for line in stream:
        yield _chomp(line)


def _chomp(line: bytes) -> bytes:
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    return line


# =============================================================================================
# consume


def consume(args: argparse.Namespace) -> int:
    return _run("consume", _consume, args)


def _consume(args: argparse.Namespace) -> int:
    from tidelog import Consumer, TopicPartition
    from tidelog.aio.consumer import ConsumerConfig

    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition")
    if args.group is not None and args.partition is not None:
        raise UsageError("--group cannot be combined with --partition (the group assigns partitions)")
    if args.max_messages is not None and args.max_messages <= 0:
        raise UsageError("--max-messages must be positive")
    offset = _parse_offset(args.offset) if args.offset is not None else None
    options = {"auto_offset_reset": "earliest" if args.from_beginning else "latest"}
    options.update(kafka_options(args.consumer_property, ConsumerConfig, "consumer"))
    partitions = _check_cluster(args, args.topic)
    if args.partition is not None and args.partition not in partitions:
        raise CommandError(f"topic {args.topic!r} has no partition {args.partition} "
                           f"(partitions 0-{max(partitions)})")
    if args.group is not None:
        options["group_id"] = args.group
        options["enable_auto_commit"] = False  # it commits what it printed, not what it fetched
    try:
        consumer = Consumer(args.bootstrap, client_id="tidelog-consume", **options)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    printed = [0]
    printed_upto: dict[Any, int] = {}  # partition -> the offset after the last record printed
    try:
        if args.group is not None:
            consumer.subscribe([args.topic])
        else:
            tps = [TopicPartition(args.topic, p) for p in
                   ([args.partition] if args.partition is not None else partitions)]
            consumer.assign(tps)
            if offset == "earliest" or (offset is None and args.from_beginning):
                consumer.seek_to_beginning(*tps)
            elif offset == "latest":
                consumer.seek_to_end(*tps)
            elif offset is not None:
                consumer.seek(tps[0], offset)
        on_batch = None
        if args.group is not None:
            def on_batch(records: Sequence[Any]) -> None:
                _commit_printed(consumer, records, printed_upto)
        _print_records(consumer, args, printed, on_batch)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how an unbounded consume ends
    finally:
        if printed_upto:
            try:
                consumer.commit(printed_upto)
            except TidelogError as e:
                print(f"tidelog consume: final commit failed: {e}", file=sys.stderr)
        consumer.close()
        print(f"Processed a total of {printed[0]} messages", file=sys.stderr)
    return EXIT_OK


def _parse_offset(text: str) -> int | str:
    if text in ("earliest", "latest"):
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"--offset must be a non-negative offset, 'earliest' or 'latest', not {text!r}")
    return value


def _print_records(consumer: Any, args: argparse.Namespace, printed: list[int],
                   on_batch: Callable[[Sequence[Any]], None] | None = None) -> None:
    """Print records until --max-messages or --timeout-ms; ``printed[0]`` counts them."""
    out = _binary_stdout()
    limit = args.max_messages
    idle_s = None if args.timeout_ms is None else args.timeout_ms / 1000
    count = 0
    last_data = time.monotonic()
    while limit is None or count < limit:
        wait_ms = 500
        if idle_s is not None:
            remaining = idle_s - (time.monotonic() - last_data)
            if remaining <= 0:
                break
            wait_ms = max(1, min(wait_ms, int(remaining * 1000)))
        records = consumer.poll(timeout_ms=wait_ms, max_records=None if limit is None else limit - count)
        if not records:
            continue
        last_data = time.monotonic()
        if limit is not None:
            records = records[:limit - count]
        out.write(b"".join([record_line(r, args) for r in records]))
        out.flush()
        count += len(records)
        printed[0] = count
        if on_batch is not None:
            on_batch(records)


_TIMESTAMP_TYPES = {0: b"CreateTime", 1: b"LogAppendTime"}


def record_line(r: Any, args: argparse.Namespace) -> bytes:
    """One record as kafka-console-consumer prints it: the fields asked for, in Kafka's
    order (timestamp, partition, offset, headers, key), tab-separated, then the value."""
    chunks = []
    if args.print_timestamp:
        chunks.append(b"NO_TIMESTAMP" if r.timestamp < 0 else
                      b"%s:%d" % (_TIMESTAMP_TYPES.get(r.timestamp_type, b"CreateTime"), r.timestamp))
    if args.print_partition:
        chunks.append(b"Partition:%d" % r.partition)
    if args.print_offset:
        chunks.append(b"Offset:%d" % r.offset)
    if args.print_headers:
        chunks.append(b",".join(k.encode() + b":" + (b"null" if v is None else v) for k, v in r.headers)
                      or b"NO_HEADERS")
    if args.print_key:
        chunks.append(b"null" if r.key is None else r.key)
    chunks.append(b"null" if r.value is None else r.value)
    return b"\t".join(chunks) + b"\n"


def _commit_printed(consumer: Any, records: Sequence[Any], printed_upto: dict[Any, int]) -> None:
    """Commit (in the background) the offset after the last printed record of each partition."""
    from tidelog import TopicPartition

    offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
    printed_upto.update(offsets)
    consumer.commit_async(offsets)


# =============================================================================================
# groups


def groups(args: argparse.Namespace) -> int:
    action = args.action
    return _run(f"groups {action}", _GROUP_ACTIONS[action], args)


def _admin(args: argparse.Namespace) -> Any:
    from tidelog import Admin

    return Admin(args.bootstrap, client_id="tidelog-groups", request_timeout_ms=min(args.timeout_ms, 30000),
                 default_api_timeout_ms=args.timeout_ms)


def _groups_list(args: argparse.Namespace) -> int:
    _check_cluster(args)
    with _admin(args) as admin:
        for g in admin.list_groups():
            print(g.group_id)
    return EXIT_OK


def _groups_describe(args: argparse.Namespace) -> int:
    if not args.groups and not args.all_groups:
        raise UsageError("give --group GROUP (repeatable) or --all-groups")
    _check_cluster(args)
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
                lines = group_describe_lines(d, admin.list_group_offsets(name))
            print()
            if not d.members and not args.state:
                print(f"Consumer group '{name}' has no active members.\n")
            for line in lines:
                print(line)
    return status


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [" ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


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
                     _or_dash(o.committed if o else None), _or_dash(o.log_end_offset if o else None),
                     _or_dash(o.lag if o else None), m.member_id if m else "-",
                     m.host if m else "-", m.client_id if m else "-"])
    return _table(rows)


def _member_lines(d: Any) -> list[str]:
    rows = [["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]]
    for m in d.members:
        assignment = ",".join(f"{tp.topic}-{tp.partition}" for tp in m.assignment) or "-"
        rows.append([d.group_id, m.member_id, m.group_instance_id or "-", m.host, m.client_id,
                     str(len(m.assignment)), assignment])
    return _table(rows)


def _state_lines(d: Any) -> list[str]:
    rows = [["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "GENERATION", "#MEMBERS"],
            [d.group_id, str(d.coordinator), d.assignor or "-", d.state, str(d.generation), str(len(d.members))]]
    return _table(rows)


def _groups_delete(args: argparse.Namespace) -> int:
    _check_cluster(args)
    with _admin(args) as admin:
        for name in args.groups:
            (d,) = admin.describe_groups([name])
            if d.state == "Dead":
                raise CommandError(f"group '{name}' does not exist")
            admin.delete_groups([name])
            print(f"Deletion of requested consumer group '{name}' was successful.")
    return EXIT_OK


def _groups_reset_offsets(args: argparse.Namespace) -> int:
    from tidelog import TopicPartition

    if not args.topics and not args.all_topics:
        raise UsageError("give --topic TOPIC[:P,P...] (repeatable) or --all-topics")
    target_ms = _parse_datetime(args.to_datetime) if args.to_datetime is not None else None
    _check_cluster(args)
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
        for line in _table([["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]] +
                           [[args.group, tp.topic, str(tp.partition), str(o)] for tp, o in sorted(plan.items())]):
            print(line)
        if args.execute:
            admin.alter_group_offsets(args.group, plan)
        else:
            print("\n(dry run: nothing changed; add --execute to apply)", file=sys.stderr)
    return EXIT_OK


def _reset_partitions(admin: Any, args: argparse.Namespace, committed: dict, tp_cls: Any) -> list[Any]:
    specs = sorted({tp.topic for tp in committed}) if args.all_topics else args.topics
    out = []
    for spec in specs:
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
            base = committed.get(tp)
            target = (lo if base is None else base) + args.shift_by
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


_GROUP_ACTIONS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": _groups_list, "describe": _groups_describe, "reset-offsets": _groups_reset_offsets,
    "delete": _groups_delete,
}


# =============================================================================================
# perf


def perf(args: argparse.Namespace) -> int:
    return _run(f"perf {args.action}", _PERF_ACTIONS[args.action], args)


def summary_line(result: PerfResult) -> str:
    """kafka-producer-perf-test's final line."""
    lat = result.latency()
    return (f"{result.records} records sent, {result.records_per_sec:.2f} records/sec "
            f"({result.mb_per_sec:.2f} MB/sec), {lat.avg:.2f} ms avg latency, {lat.max:.2f} ms max latency, "
            f"{lat.p50:.2f} ms 50th, {lat.p95:.2f} ms 95th, {lat.p99:.2f} ms 99th, {lat.p999:.2f} ms 99.9th.")


def progress_line(window: Window) -> str:
    """kafka-producer-perf-test's progress line (one per reporting window)."""
    return (f"{window.records} records sent, {window.records_per_sec:.1f} records/sec "
            f"({window.mb_per_sec:.2f} MB/sec), {window.avg_ms:.1f} ms avg latency, "
            f"{window.max_ms:.1f} ms max latency.")


def result_json(result: PerfResult) -> dict[str, Any]:
    lat = result.latency()
    return {"records": result.records, "records_per_sec": round(result.records_per_sec, 3),
            "mb_per_sec": round(result.mb_per_sec, 6),
            "latency_ms": {"avg": round(lat.avg, 3), "max": round(lat.max, 3), "p50": round(lat.p50, 3),
                           "p95": round(lat.p95, 3), "p99": round(lat.p99, 3), "p999": round(lat.p999, 3)}}


def _print_progress(window: Window) -> None:
    print(progress_line(window), file=sys.stderr, flush=True)


def _report(result: PerfResult, args: argparse.Namespace, noun: str) -> int:
    if args.json:
        print(json.dumps(result_json(result)), flush=True)
    else:
        print(summary_line(result), flush=True)
    if result.failed:
        raise CommandError(f"{result.failed} of {result.expected} records failed; first error: "
                           f"{result.first_error}")
    if result.records < result.expected:
        raise CommandError(f"only {result.records} of {result.expected} records {noun} "
                           f"before the timeout")
    return EXIT_OK


def _check_perf_args(args: argparse.Namespace) -> None:
    if args.num_records <= 0:
        raise UsageError("--num-records must be positive")
    if getattr(args, "throughput", -1) == 0:
        raise UsageError("--throughput must be positive, or -1 for no limit")
    if getattr(args, "in_flight", 1) <= 0:
        raise UsageError("--in-flight must be positive")
    if getattr(args, "record_size", 1) <= 0:
        raise UsageError("--record-size must be positive")
    if getattr(args, "bulk", 0) < 0:
        raise UsageError("--bulk must be positive")


def _perf_produce(args: argparse.Namespace) -> int:
    from tidelog import Producer
    from tidelog.aio.producer import ProducerConfig
    from tidelog.perf import make_payload
    from tidelog.perf import produce as measure

    _check_perf_args(args)
    options = kafka_options(args.producer_props, ProducerConfig, "producer")
    _check_cluster(args)
    try:
        delivery_s = ProducerConfig(**options).delivery_timeout_ms / 1000
        producer = Producer(args.bootstrap, client_id="tidelog-perf-producer", **options)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    try:
        if args.bulk and not hasattr(producer, "send_many"):
            raise UsageError("--bulk: this SDK's Producer has no bulk API (send_many)")
        result = measure(producer, args.topic, num_records=args.num_records,
                         payload=make_payload(args.record_size), throughput=args.throughput,
                         progress=_print_progress, flush_timeout_s=delivery_s + 5.0, bulk=args.bulk)
    finally:
        producer.close(5.0)
    return _report(result, args, "acknowledged")


def _perf_consume(args: argparse.Namespace) -> int:
    from tidelog import Consumer, TopicPartition
    from tidelog.aio.consumer import ConsumerConfig
    from tidelog.perf import consume as measure

    _check_perf_args(args)
    options = {"auto_offset_reset": "earliest"}
    options.update(kafka_options(args.consumer_props, ConsumerConfig, "consumer"))
    partitions = _check_cluster(args, args.topic)
    try:
        consumer = Consumer(args.bootstrap, client_id="tidelog-perf-consumer", **options)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise UsageError(str(e)) from None
    try:
        tps = [TopicPartition(args.topic, p) for p in partitions]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        result = measure(consumer, num_records=args.num_records, idle_timeout_s=args.timeout_ms / 1000,
                         progress=_print_progress)
    finally:
        consumer.close()
    return _report(result, args, "received")


def _perf_e2e(args: argparse.Namespace) -> int:
    from tidelog import Admin, Consumer, NewTopic, Producer, TopicPartition
    from tidelog.aio.consumer import ConsumerConfig
    from tidelog.aio.producer import ProducerConfig
    from tidelog.perf import end_to_end

    _check_perf_args(args)
    producer_options: dict[str, Any] = {"acks": 1, "linger_ms": 0}
    producer_options.update(kafka_options(args.producer_props, ProducerConfig, "producer"))
    consumer_options: dict[str, Any] = {"auto_offset_reset": "latest", "fetch_max_wait_ms": 100}
    consumer_options.update(kafka_options(args.consumer_props, ConsumerConfig, "consumer"))
    _check_cluster(args)
    with Admin(args.bootstrap, client_id="tidelog-cli", default_api_timeout_ms=30000) as admin:
        try:
            (description,) = admin.describe_topics([args.topic])
        except TidelogError as e:  # like Kafka's EndToEndLatency: create a missing topic
            if getattr(e, "error", None) is not UNKNOWN_TOPIC_OR_PARTITION:
                raise
            try:
                admin.create_topics([NewTopic(args.topic, 1)])
            except TidelogError as e:
                if getattr(e, "error", None) is not TOPIC_ALREADY_EXISTS:
                    raise
            (description,) = admin.describe_topics([args.topic])
    try:
        producer = Producer(args.bootstrap, client_id="tidelog-perf-e2e", **producer_options)
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    try:
        consumer = Consumer(args.bootstrap, client_id="tidelog-perf-e2e", **consumer_options)
    except (TypeError, ValueError, NotImplementedError) as e:
        producer.close(0)
        raise UsageError(str(e)) from None
    try:
        tps = [TopicPartition(args.topic, p.partition) for p in description.partitions]
        consumer.assign(tps)
        consumer.seek_to_end(*tps)
        for tp in tps:  # resolve the end offsets now, before the first record is sent
            consumer.position(tp)
        result = end_to_end(producer, consumer, args.topic, num_records=args.num_records,
                            record_size=args.record_size, throughput=args.throughput,
                            in_flight=args.in_flight, idle_timeout_s=args.timeout_ms / 1000,
                            progress=_print_progress)
    finally:
        producer.close(5.0)
        consumer.close()
    return _report(result, args, "received")


_PERF_ACTIONS = {"produce": _perf_produce, "consume": _perf_consume, "e2e": _perf_e2e}
