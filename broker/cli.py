"""The ``tidelog`` command line (DESIGN.md section 7): one entry point, one subcommand per tool.

Each subcommand is a ``Command`` in ``COMMANDS``: a name, help texts, a function that adds its
arguments to its own parser, and a function that runs it and returns the exit status. A
command's ``run`` imports what it needs when it runs, so ``tidelog --help`` and the light
commands start without loading Trio, kazoo or the broker; this module imports only the stdlib.

``main`` returns the exit status instead of exiting, so tests can call it: 0 success, 1 the
command ran and failed (or, for ``dump-log``, found problems), 2 usage errors (argparse's
convention), 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

PROG = "tidelog"
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    help: str  # one line, for ``tidelog --help``
    description: str  # for ``tidelog NAME --help``
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# -- dump-log ---------------------------------------------------------------------------------


def _dump_log_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="segment files: <20-digit base offset>.log, .index or .timeindex")
    p.add_argument("--verify", action="store_true",
                   help="check batch framing and CRCs, offset order and records; check index "
                        "entries against the sibling .log (a .log's existing sibling indexes too)")
    p.add_argument("--print-data", action="store_true",
                   help="also print every record: offset, timestamp, key, payload and headers")


def _dump_log(args: argparse.Namespace) -> int:
    from tidelog.broker.log.dump import run

    _tolerate_unencodable(sys.stdout)
    return run(args.files, verify=args.verify, print_data=args.print_data,
               out=sys.stdout, err=sys.stderr)


# -- broker and dev ---------------------------------------------------------------------------


def _broker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="broker config (TOML, Kafka's key names)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                   help="override a config key (repeatable); env TIDELOG_<KEY> also overrides")
    p.add_argument("--log-level", default=os.environ.get("TIDELOG_LOG_LEVEL", "INFO"))


def _broker(args: argparse.Namespace) -> int:
    from tidelog.broker.main import run

    return run(args.config, args.set, args.log_level)


def _dev_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["up"], help="up: start ZooKeeper and the brokers, Ctrl-C stops them")
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    p.add_argument("--dir", default="tidelog-data/dev", help="where data, configs and logs live")
    p.add_argument("--zk-port", type=int, default=2181)
    p.add_argument("--base-port", type=int, default=9092, help="broker N listens on base-port + N - 1")


def _dev(args: argparse.Namespace) -> int:
    from tidelog.broker.devcluster import run_dev_up

    return run_dev_up(args.dir, args.brokers, args.zk_port, args.base_port)


# -- client commands: topics, produce, consume, perf (implemented in client/cli.py) ------------


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT]",
                   default=os.environ.get("TIDELOG_BOOTSTRAP", "localhost:9092"),
                   help="brokers to start from (env TIDELOG_BOOTSTRAP, default localhost:9092)")
    p.add_argument("--connect-timeout-ms", type=int, default=5000, metavar="MS",
                   help="fail if no broker answers within this long (default 5000)")


def _admin_actions(p: argparse.ArgumentParser) -> Callable[[str, str], argparse.ArgumentParser]:
    """A function adding one ACTION subcommand with the client options and ``--timeout-ms``."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = sub.add_parser(name, help=help, description=help)
        _client_options(a)
        a.add_argument("--timeout-ms", type=int, default=30000, metavar="MS",
                       help="bound on the admin requests (default 30000)")
        return a
    return action


def _topics_arguments(p: argparse.ArgumentParser) -> None:
    action = _admin_actions(p)

    a = action("create", "create a topic")
    a.add_argument("name")
    a.add_argument("--partitions", type=int, default=-1, help="default: the broker's num.partitions")
    a.add_argument("--replication-factor", type=int, default=-1,
                   help="default: the broker's default.replication.factor")
    a.add_argument("--config", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="a topic config override (repeatable), e.g. retention.ms=86400000")
    a.add_argument("--if-not-exists", action="store_true", help="succeed if the topic exists")
    action("list", "list the topics, one per line")
    a = action("describe", "kafka-topics --describe lines, with leader epoch, LEO and HW")
    a.add_argument("names", nargs="*", metavar="NAME", help="default: every topic")
    a.add_argument("--under-replicated-partitions", action="store_true",
                   help="only partitions whose ISR is smaller than their replica set")
    a.add_argument("--unavailable-partitions", action="store_true", help="only partitions without a leader")
    a = action("alter", "add partitions, or set or delete topic configs")
    a.add_argument("name")
    a.add_argument("--partitions", type=int, help="the new (larger) partition count")
    a.add_argument("--config", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="set a topic config override (repeatable)")
    a.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                   help="remove a topic config override (repeatable)")
    a = action("delete", "delete topics")
    a.add_argument("names", nargs="+", metavar="NAME")
    a = action("delete-records", "delete the records below an offset (like kafka-delete-records)")
    a.add_argument("name")
    a.add_argument("--offset", type=int, required=True,
                   help="delete every record below this offset; -1: below the high watermark")
    a.add_argument("--partition", type=int, action="append", default=[],
                   help="this partition (repeatable); default: every partition of the topic")
    a = action("elect-leaders", "move leadership back to each partition's preferred (first) replica")
    a.add_argument("names", nargs="*", metavar="NAME", help="default: every topic")
    a.add_argument("--partition", type=int, help="only this partition of the named topics")


def _topics(args: argparse.Namespace) -> int:
    from tidelog.cli import topics

    return topics(args)


def _produce_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    _client_options(p)
    p.add_argument("--key-separator", metavar="S", help='lines are "key<S>value"')
    p.add_argument("--acks", choices=["all", "-1", "1", "0"], default="all")
    p.add_argument("--partition", type=int, help="send every record to this partition")
    p.add_argument("--compression", choices=["none", "gzip", "lz4", "zstd"])
    p.add_argument("--linger-ms", type=int)
    p.add_argument("--producer-property", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="a producer setting by Kafka's name (repeatable), e.g. delivery.timeout.ms=60000")


def _produce(args: argparse.Namespace) -> int:
    from tidelog.cli import produce

    return produce(args)


def _consume_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    _client_options(p)
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
    p.add_argument("--consumer-property", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                   help="a consumer setting by Kafka's name (repeatable), e.g. fetch.max.wait.ms=100")


def _consume(args: argparse.Namespace) -> int:
    from tidelog.cli import consume

    return consume(args)


def _groups_arguments(p: argparse.ArgumentParser) -> None:
    action = _admin_actions(p)

    action("list", "list the consumer groups, one per line")
    a = action("describe", "per partition: GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG "
                           "CONSUMER-ID HOST CLIENT-ID (like kafka-consumer-groups --describe)")
    a.add_argument("--group", action="append", dest="groups", metavar="GROUP", help="repeatable")
    a.add_argument("--all-groups", action="store_true", help="describe every group")
    a.add_argument("--members", action="store_true", help="list the members instead of the offsets")
    a.add_argument("--state", action="store_true", help="print the group's state, assignor and generation")
    a = action("reset-offsets", "reset a group's committed offsets (the group must be inactive); prints "
                                "the plan, applied only with --execute")
    a.add_argument("--group", required=True)
    a.add_argument("--topic", action="append", dest="topics", metavar="TOPIC[:P,P...]",
                   help="repeatable; default with --all-topics: every topic the group has offsets for")
    a.add_argument("--all-topics", action="store_true", help="every partition of the topics the group has offsets for")
    how = a.add_mutually_exclusive_group(required=True)
    how.add_argument("--to-earliest", action="store_true")
    how.add_argument("--to-latest", action="store_true")
    how.add_argument("--to-offset", type=int, metavar="N")
    how.add_argument("--shift-by", type=int, metavar="N", help="move by N (negative: back)")
    how.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS[.sss][TZ]",
                     help="the first offset at or after this time (ISO 8601; local time without a zone)")
    run = a.add_mutually_exclusive_group()
    run.add_argument("--dry-run", action="store_true", help="only print the plan (the default)")
    run.add_argument("--execute", action="store_true", help="apply the plan")
    a = action("delete", "delete consumer groups and their committed offsets (inactive groups only)")
    a.add_argument("--group", action="append", dest="groups", required=True, metavar="GROUP", help="repeatable")


def _groups(args: argparse.Namespace) -> int:
    from tidelog.cli import groups

    return groups(args)


def _perf_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = sub.add_parser(name, help=help, description=help)
        _client_options(a)
        a.add_argument("--topic", required=True)
        a.add_argument("--num-records", type=int, required=True)
        a.add_argument("--json", action="store_true", help="print the result as one JSON object")
        return a

    props = {"type": _key_value, "nargs": "+", "default": [], "metavar": "KEY=VALUE"}
    a = action("produce", "like kafka-producer-perf-test: send records, report throughput and latency")
    a.add_argument("--record-size", type=int, required=True, help="bytes per record")
    a.add_argument("--throughput", type=float, required=True, help="records/sec at most; -1: no limit")
    a.add_argument("--producer-props", **props, help="producer settings by Kafka's names (acks, linger.ms, ...)")
    a.add_argument("--bulk", type=int, nargs="?", const=1000, default=0, metavar="N",
                   help="send N records per Producer.send_many call (default N: 1000)")
    a = action("consume", "like kafka-consumer-perf-test: read records from the beginning (latency: "
                          "how long the poll that returned each record waited)")
    a.add_argument("--consumer-props", **props, help="consumer settings by Kafka's names")
    a.add_argument("--timeout-ms", type=int, default=10000, help="give up after this long without records")
    a = action("e2e", "like Kafka's EndToEndLatency: produce-to-consume latency, one record at a time "
                      "(or up to --in-flight records awaiting acknowledgement, for a latency at a rate)")
    a.add_argument("--record-size", type=int, default=100)
    a.add_argument("--throughput", type=float, default=-1, help="records/sec at most (default -1: no limit)")
    a.add_argument("--in-flight", type=int, default=1, metavar="N",
                   help="records sent before waiting for the oldest one's acknowledgement (default 1: "
                        "one at a time, as EndToEndLatency; with --throughput 10000 and N 1000, the "
                        "latency at 10,000 records/s)")
    a.add_argument("--producer-props", **props, help="producer settings (default acks=1, linger.ms=0)")
    a.add_argument("--consumer-props", **props, help="consumer settings")
    a.add_argument("--timeout-ms", type=int, default=10000,
                   help="give up waiting for records after this long without any")


def _perf(args: argparse.Namespace) -> int:
    from tidelog.cli import perf

    return perf(args)


# -- health -------------------------------------------------------------------------------------


def _health_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT]",
                   help="brokers to check, each must be ready (default: --config's listener, else "
                        "env TIDELOG_BOOTSTRAP, else localhost:9092)")
    p.add_argument("--config", metavar="FILE",
                   help="a broker config (with its TIDELOG_* environment, like `tidelog broker`): "
                        "check that broker, on its own listener, and require its broker.id")
    p.add_argument("--broker-id", type=int, metavar="ID", help="require this broker in the metadata")
    p.add_argument("--timeout-ms", type=int, default=5000, metavar="MS", help="per attempt (default 5000)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="keep trying until ready or this long has passed (default: one attempt)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only problems")


def _health(args: argparse.Namespace) -> int:
    from tidelog.broker.health import run

    bootstrap = args.bootstrap or (None if args.config else os.environ.get("TIDELOG_BOOTSTRAP"))
    return run(bootstrap, args.config, args.broker_id, args.timeout_ms, args.wait, args.quiet,
               sys.stdout, sys.stderr)


COMMANDS: tuple[Command, ...] = (
    Command("broker", "run one broker in the foreground (SIGTERM: controlled shutdown)",
            "Run a broker. The config file is TOML with Kafka's key names (broker.id, listeners, "
            "log.dirs, zookeeper.connect, ...).", _broker_arguments, _broker),
    Command("dev", "run a local cluster: ZooKeeper and N brokers as child processes",
            "tidelog dev up: start a real ZooKeeper and N brokers under --dir (reused on the next "
            "run), print the bootstrap address, and stop everything on Ctrl-C.", _dev_arguments, _dev),
    Command("health", "is a broker ready? (registered, logs loaded, has metadata): exit 0 or 1",
            "Check broker readiness with a Metadata request: the broker must know the cluster "
            "(it is registered in ZooKeeper, has loaded its logs and received metadata from the "
            "controller). Exit status 0 when every broker checked is ready, 1 otherwise, 2 for "
            "usage or config errors. For container healthchecks: tidelog health --config FILE.",
            _health_arguments, _health),
    Command(
        "dump-log", "print and check log segment files (like kafka-dump-log)",
        "Print the batches of .log segment files (and with --print-data their records), the "
        "entries of .index and .timeindex files, and report torn or corrupt data. Exit status: "
        "0 all is well, 1 problems were found (lines starting with ERROR:), 2 usage errors.",
        _dump_log_arguments, _dump_log),
    Command("topics", "create, list, describe, alter and delete topics (like kafka-topics)",
            "Manage topics. describe prints kafka-topics' lines plus each partition's leader epoch, "
            "log end offset and high watermark.", _topics_arguments, _topics),
    Command("produce", "send stdin lines as records (like kafka-console-producer)",
            "Read lines from stdin and send each as a record (key<S>value with --key-separator); "
            "at EOF wait for every acknowledgement. Exit status 1 if any record failed.",
            _produce_arguments, _produce),
    Command("consume", "print records (like kafka-console-consumer)",
            "Print records' values (key<TAB>value with --print-key), from the end of the topic, "
            "or from the beginning, or from an offset; until --max-messages, --timeout-ms, or Ctrl-C.",
            _consume_arguments, _consume),
    Command("groups", "list, describe, reset offsets of and delete consumer groups (like kafka-consumer-groups)",
            "Manage consumer groups. describe prints each partition's committed offset, log end "
            "offset, lag and owner; reset-offsets prints its plan and applies it only with --execute.",
            _groups_arguments, _groups),
    Command("perf", "producer, consumer and end-to-end benchmarks (like kafka-*-perf-test)",
            "perf produce|consume|e2e: progress every 5 s on stderr, then kafka-producer-perf-test's "
            "summary line (or --json) on stdout.", _perf_arguments, _perf),
)


# -- the entry point --------------------------------------------------------------------------


def build_parser(commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Tidelog: a replicated, partitioned commit log.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", required=True)
    for c in commands:
        p = sub.add_parser(c.name, help=c.help, description=c.description)
        c.add_arguments(p)
        p.set_defaults(run=c.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tidelog`` with ``argv`` (default: the process's arguments); returns the exit status."""
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the (sub)command they were given to, with its usage
            _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help (0), or a usage error argparse has already explained (2)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (``tidelog dump-log ... | head``)
        _silence_stdout()
        return 1


def _chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that ``args`` came through (``tidelog groups describe``)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else ()):
            return parser
        parser = subs[0].choices[chosen]


def _tolerate_unencodable(stream) -> None:
    """Print what the terminal's encoding cannot show as escapes rather than failing."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")


def _silence_stdout() -> None:
    # Python flushes stdout at exit; pointing it at /dev/null keeps that from failing again
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
