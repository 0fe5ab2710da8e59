"""The ``tidelog`` command line (docs/architecture.md, "CLI"): one entry point, one subcommand per tool.

The broker-side commands (broker, dev, health, dump-log) are each a ``Command`` in
``COMMANDS``: a name, help texts, a function that adds its arguments to its own parser, and a
function that runs it and returns the exit status. The client commands come in families, one
module of ``tidelog.commands`` each (``FAMILIES``: topics; console, i.e. produce and consume;
groups; acls; perf; configs), which add their own commands with ``register``. Every command imports what it
needs when it runs, so ``tidelog --help`` and the light commands start without loading kazoo
or the broker; this module imports only the stdlib, and the family modules only ``common``.

``main`` returns the exit status instead of exiting, so tests can call it: 0 success, 1 the
command ran and failed (or, for ``dump-log``, found problems), 2 usage errors (argparse's
convention), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Sequence

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
    p.add_argument("--security", choices=["PLAINTEXT", "SASL_SSL"], default="PLAINTEXT",
                   help="SASL_SSL: TLS with a CA made at start, SCRAM between brokers and for an admin "
                        "super user whose settings go to <dir>/client.properties (default PLAINTEXT)")


def _dev(args: argparse.Namespace) -> int:
    from tidelog.broker.devcluster import run_dev_up

    return run_dev_up(args.dir, args.brokers, args.zk_port, args.base_port, args.security)


# -- zookeeper-security-migration ----------------------------------------------------------------


def _zk_migration_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zookeeper.acl", dest="zookeeper_acl", required=True, choices=["secure", "unsecure"],
                   help="secure: ALL for the brokers' ZooKeeper identity, READ for others (none under "
                        "/config/users); unsecure: open to all")
    p.add_argument("--zookeeper.connect", dest="zookeeper_connect", required=True, metavar="HOST:PORT[/CHROOT]",
                   help="the cluster's ZooKeeper (chroot default /tidelog)")
    p.add_argument("--zk-auth-file", metavar="FILE",
                   help="TOML with zookeeper.digest.username and zookeeper.digest.password (a broker's "
                        "config file will do; env TIDELOG_ZOOKEEPER_DIGEST_* override it)")


def _zk_migration(args: argparse.Namespace) -> int:
    from tidelog.broker.zookeeper.security_migration import run

    return run(args.zookeeper_connect, args.zookeeper_acl, args.zk_auth_file, sys.stdout, sys.stderr)


# -- health -------------------------------------------------------------------------------------


def _health_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT]",
                   help="brokers to check, each must be ready (default: --config's listener, else "
                        "env TIDELOG_BOOTSTRAP, else localhost:9092)")
    p.add_argument("--config", metavar="FILE",
                   help="a broker config (with its TIDELOG_* environment, like `tidelog broker`): "
                        "check that broker, on its own listener, and require its broker.id")
    p.add_argument("--broker-id", type=int, metavar="ID", help="require this broker in the metadata")
    p.add_argument("--command-config", metavar="FILE", default=os.environ.get("TIDELOG_COMMAND_CONFIG"),
                   help="with --bootstrap: a properties file of security settings (security.protocol, "
                        "sasl.*, ssl.*), as the other commands take; env TIDELOG_COMMAND_CONFIG")
    p.add_argument("--timeout-ms", type=int, default=5000, metavar="MS", help="per attempt (default 5000)")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="keep trying until ready or this long has passed (default: one attempt)")
    p.add_argument("--quiet", "-q", action="store_true", help="print only problems")


def _health(args: argparse.Namespace) -> int:
    from tidelog.broker.health import run

    bootstrap = args.bootstrap or (None if args.config else os.environ.get("TIDELOG_BOOTSTRAP"))
    return run(bootstrap, args.config, args.broker_id, args.timeout_ms, args.wait, args.quiet,
               sys.stdout, sys.stderr, args.command_config)


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
    Command(
        "zookeeper-security-migration", "set the ACLs of every znode of the cluster (secure or unsecure)",
        "Give the chroot and every znode of the cluster the ACL brokers with zookeeper.set.acl create "
        "them with (--zookeeper.acl secure) or open them to all (unsecure), as Kafka's tool of that name. "
        "Runs as the brokers' ZooKeeper identity (--zk-auth-file). See docs/operations.md, "
        "\"ZooKeeper security\".", _zk_migration_arguments, _zk_migration),
)


# -- the entry point --------------------------------------------------------------------------


# the client command families, listed after the broker-side commands in ``tidelog --help``
FAMILIES: tuple[str, ...] = ("tidelog.commands.topics", "tidelog.commands.console",
                             "tidelog.commands.groups", "tidelog.commands.acls", "tidelog.commands.perf",
                             "tidelog.commands.configs", "tidelog.commands.reassign",
                             "tidelog.commands.webconsole")


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's), or "unknown" when Tidelog
    runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tidelog")
    except PackageNotFoundError:
        return "unknown"


def build_parser(commands: Sequence[Command] = COMMANDS,
                 families: Sequence[str] = FAMILIES) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Tidelog: a replicated, partitioned commit log.")
    parser.add_argument("--version", action="version", version=f"{PROG} {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands", required=True)
    for c in commands:
        p = sub.add_parser(c.name, help=c.help, description=c.description)
        c.add_arguments(p)
        p.set_defaults(run=c.run)
    for family in families:
        importlib.import_module(family).register(sub)
    if "configs" in sub.choices:  # the SDK's command reaches ZooKeeper through the broker's code
        sub.choices["configs"].set_defaults(zookeeper_session=_zookeeper_entity_configs)
    return parser


@contextlib.asynccontextmanager
async def _zookeeper_entity_configs(connect: str, auth_file: str | None = None) -> AsyncIterator[Callable]:
    """For ``tidelog configs --zookeeper``: a ZooKeeper session (chroot from ``connect``,
    else /tidelog) and the ``call`` that answers the entity-config requests with the brokers'
    own code (broker/security/entity_configs.py). With the brokers' ZooKeeper identity
    (``--zk-auth-file``, or TIDELOG_ZOOKEEPER_DIGEST_*) the session authenticates and what it
    creates gets the brokers' ACLs, as Kafka's tools do when their ZooKeeper client is secure."""
    from tidelog.broker.config import read_zookeeper_credentials
    from tidelog.broker.security.entity_configs import EntityConfigAdmin
    from tidelog.broker.zookeeper.zk import ZkClient

    auth = read_zookeeper_credentials(auth_file)
    async with ZkClient(connect, auth=auth, set_acl=auth is not None) as zk:
        yield EntityConfigAdmin(zk).call


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
