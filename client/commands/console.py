"""``tidelog produce`` and ``tidelog consume``: the console producer and consumer (like
kafka-console-producer and kafka-console-consumer), over the blocking ``Producer`` and
``Consumer``.

``produce`` sends each stdin line as a record and, at EOF, waits for every acknowledgement
(exit 1 if any record failed). ``consume`` prints records as kafka-console-consumer does
(``record_line``); with ``--group`` it commits the offsets of the records it printed after
each batch and when it exits, never past what it printed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, BinaryIO

from tidelog.commands.common import (
    EXIT_OK,
    CommandError,
    UsageError,
    add_command,
    check_cluster,
    client_options,
    connection_options,
    kafka_options,
    key_value,
    run_command,
)

__all__ = ["record_line", "register", "consume", "produce"]

# bounds for the console producer unless --producer-property says otherwise (the SDK's
# defaults are 120 s delivery and 60 s max block: too long for a command at a terminal)
CONSOLE_PRODUCER_DEFAULTS = {"request_timeout_ms": 10000, "delivery_timeout_ms": 30000,
                             "max_block_ms": 10000}
MAX_ERRORS_SHOWN = 10


def register(commands: Any) -> None:
    add_command(commands, "produce", "send stdin lines as records (like kafka-console-producer)",
                "Read lines from stdin and send each as a record (key<S>value with --key-separator); "
                "at EOF wait for every acknowledgement. Exit status 1 if any record failed.",
                produce_arguments, produce)
    add_command(commands, "consume", "print records (like kafka-console-consumer)",
                "Print records' values (key<TAB>value with --print-key), from the end of the topic, "
                "or from the beginning, or from an offset; until --max-messages, --timeout-ms, or Ctrl-C.",
                consume_arguments, consume)


# =============================================================================================
# produce


def produce_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    client_options(p)
    p.add_argument("--key-separator", metavar="S", help='lines are "key<S>value"')
    p.add_argument("--acks", choices=["all", "-1", "1", "0"], default="all")
    p.add_argument("--partition", type=int, help="send every record to this partition")
    p.add_argument("--compression", choices=["none", "gzip", "lz4", "zstd"])
    p.add_argument("--linger-ms", type=int)
    p.add_argument("--producer-property", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="a producer setting by Kafka's name (repeatable), e.g. delivery.timeout.ms=60000")


def produce(args: argparse.Namespace) -> int:
    return run_command("produce", _produce, args)


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
    check_cluster(args)
    try:
        producer = Producer(args.bootstrap, client_id="tidelog-produce", **options, **connection_options(args))
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


def consume_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    client_options(p)
    p.add_argument("--group", help="consume as a member of this consumer group (committing as it goes)")
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset, not the end")
    p.add_argument("--partition", type=int, help="consume only this partition")
    p.add_argument("--offset", help="with --partition: an offset, 'earliest' or 'latest'")
    p.add_argument("--max-messages", type=int, metavar="N", help="exit after N records")
    p.add_argument("--timeout-ms", type=int, metavar="MS", help="exit when no record arrived for this long")
    p.add_argument("--print-key", action="store_true", help="print key<TAB>value")
    p.add_argument("--print-offset", action="store_true", help='prefix "Offset:N<TAB>"')
    p.add_argument("--print-partition", action="store_true", help='prefix "Partition:N<TAB>"')
    p.add_argument("--print-timestamp", action="store_true",
                   help='prefix "CreateTime:MS<TAB>" (or LogAppendTime:, as the topic says)')
    p.add_argument("--print-headers", action="store_true",
                   help='prefix "name:value,name:value<TAB>" ("NO_HEADERS" when there are none)')
    p.add_argument("--consumer-property", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="a consumer setting by Kafka's name (repeatable), e.g. fetch.max.wait.ms=100")


def consume(args: argparse.Namespace) -> int:
    return run_command("consume", _consume, args)


def _check_consume_args(args: argparse.Namespace) -> None:
    if args.offset is not None and args.partition is None:
        raise UsageError("--offset needs --partition")
    if args.group is not None and args.partition is not None:
        raise UsageError("--group cannot be combined with --partition (the group assigns partitions)")
    if args.max_messages is not None and args.max_messages <= 0:
        raise UsageError("--max-messages must be positive")


def _consume(args: argparse.Namespace) -> int:
    from tidelog import Consumer
    from tidelog.aio.consumer import ConsumerConfig
    from tidelog.protocol.errors import CorruptRecordError, TidelogError

    _check_consume_args(args)
    offset = _parse_offset(args.offset) if args.offset is not None else None
    options = {"auto_offset_reset": "earliest" if args.from_beginning else "latest"}
    options.update(kafka_options(args.consumer_property, ConsumerConfig, "consumer"))
    partitions = check_cluster(args, args.topic)
    if args.partition is not None and args.partition not in partitions:
        raise CommandError(f"topic {args.topic!r} has no partition {args.partition} "
                           f"(partitions 0-{max(partitions)})")
    if args.group is not None:
        options["group_id"] = args.group
        options["enable_auto_commit"] = False  # it commits what it printed, not what it fetched
    try:
        consumer = Consumer(args.bootstrap, client_id="tidelog-consume", **options, **connection_options(args))
    except (TypeError, ValueError) as e:
        raise UsageError(str(e)) from None
    printed = [0]
    printed_upto: dict[Any, int] = {}  # partition -> the offset after the last record printed
    try:
        _start(consumer, args, partitions, offset)
        on_batch = None
        if args.group is not None:
            def on_batch(records: Sequence[Any]) -> None:
                _commit_printed(consumer, records, printed_upto)
        _print_records(consumer, args, printed, on_batch)
    except CorruptRecordError as e:
        raise CommandError(unreadable_batch_message(e, args)) from None
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


def unreadable_batch_message(e: Any, args: argparse.Namespace) -> str:
    """A batch the consumer cannot read, with the command that skips it (the SDK's error
    names ``consumer.seek``, which a console user cannot call): a group's committed offset is
    moved with ``groups reset-offsets`` (the group is inactive once this command exits); else
    ``consume`` starts again past the batch."""
    tp, skip = e.topic_partition, e.skip_offset
    what = str(e).split(" The partition is stopped")[0]
    if args.group is not None:
        how = (f"tidelog groups reset-offsets --group {args.group} --topic {tp.topic}:{tp.partition} "
               f"--to-offset {skip} --execute")
    else:
        how = f"tidelog consume {tp.topic} --partition {tp.partition} --offset {skip}"
    return f"{what}. To skip the batch (its records are lost to this reader): {how}"


def _start(consumer: Any, args: argparse.Namespace, partitions: list[int], offset: int | str | None) -> None:
    """Subscribe (with --group), or assign the partitions and seek where the options say."""
    from tidelog import TopicPartition

    if args.group is not None:
        consumer.subscribe([args.topic])
        return
    tps = [TopicPartition(args.topic, p) for p in
           ([args.partition] if args.partition is not None else partitions)]
    consumer.assign(tps)
    if offset == "earliest" or (offset is None and args.from_beginning):
        consumer.seek_to_beginning(*tps)
    elif offset == "latest":
        consumer.seek_to_end(*tps)
    elif offset is not None:
        consumer.seek(tps[0], offset)


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


def _binary_stdout() -> BinaryIO:
    sys.stdout.flush()
    return getattr(sys.stdout, "buffer", None) or _TextAsBinary(sys.stdout)


class _TextAsBinary:
    """stdout as a byte stream when it is a text stream without ``buffer`` (tests' capture)."""

    def __init__(self, stream: Any):
        self.stream = stream

    def write(self, data: bytes) -> None:
        self.stream.write(data.decode("utf-8", "backslashreplace"))

    def flush(self) -> None:
        self.stream.flush()
