"""What the command families share: the exit statuses and the two errors that produce them,
the client options every command takes (``--bootstrap``, ``--connect-timeout-ms``,
``--command-config``), the
admin-style ``ACTION`` subcommands, Kafka property names as SDK options, the reachability
check, and table formatting.

Only the stdlib is imported here at import time; the SDK is imported by the functions that
talk to a cluster, when they run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import fields
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """A failure to report on stderr (exit 1)."""


class UsageError(CommandError):
    """A bad combination of arguments (exit 2)."""


# -- arguments --------------------------------------------------------------------------------


def add_command(commands: Any, name: str, help: str, description: str,
                arguments: Callable[[argparse.ArgumentParser], None],
                run: Callable[[argparse.Namespace], int]) -> None:
    """Add command ``name`` to ``commands`` (the ``tidelog`` parser's subparsers): ``help``
    is its line in ``tidelog --help``, ``description`` heads ``tidelog NAME --help``."""
    p = commands.add_parser(name, help=help, description=description)
    arguments(p)
    p.set_defaults(run=run)


def key_value(text: str) -> tuple[str, str]:
    """argparse type of ``KEY=VALUE`` options."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", metavar="HOST:PORT[,HOST:PORT]",
                   default=os.environ.get("TIDELOG_BOOTSTRAP", "localhost:9092"),
                   help="brokers to start from (env TIDELOG_BOOTSTRAP, default localhost:9092)")
    p.add_argument("--connect-timeout-ms", type=int, default=5000, metavar="MS",
                   help="fail if no broker answers within this long (default 5000)")
    p.add_argument("--command-config", metavar="FILE", default=os.environ.get("TIDELOG_COMMAND_CONFIG"),
                   help="a properties file of security settings (security.protocol, sasl.mechanism, "
                        "sasl.username, sasl.password, ssl.ca.location, ...; env TIDELOG_COMMAND_CONFIG)")


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The SDK's security options (``security_protocol``, ...) from ``--command-config``;
    {} without one. A property that is not a security setting is a usage error."""
    path = getattr(args, "command_config", None)
    if not path:
        return {}
    from tidelog.security import SecurityConfig, read_properties

    try:
        props = read_properties(path)
    except OSError as e:
        raise UsageError(f"--command-config: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"--command-config: {e}") from None
    if unknown := sorted(k for k in props if not SecurityConfig.knows(k)):
        raise UsageError(f"--command-config {path}: {', '.join(unknown)} is not a security setting "
                         "(the file holds security.protocol, sasl.*, ssl.* settings)")
    try:
        return SecurityConfig.from_properties(props).options()
    except ValueError as e:
        raise UsageError(f"--command-config {path}: {e}") from None


def admin_actions(p: argparse.ArgumentParser) -> Callable[[str, str], argparse.ArgumentParser]:
    """A function adding one ACTION subcommand with the client options and ``--timeout-ms``."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        a = sub.add_parser(name, help=help, description=help)
        client_options(a)
        a.add_argument("--timeout-ms", type=int, default=30000, metavar="MS",
                       help="bound on the admin requests (default 30000)")
        return a
    return action


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


# -- running ----------------------------------------------------------------------------------


def run_command(name: str, body: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``body(args)``'s exit status, or the error it raised printed as ``tidelog NAME: ...``
    (with 1, or 2 for usage errors); a malformed ``--bootstrap`` is a usage error."""
    from tidelog.aio.cluster import parse_bootstrap
    from tidelog.protocol.errors import TidelogError

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


def unreachable(bootstrap: str, e: BaseException) -> str:
    return f"cannot reach the cluster at {bootstrap}: {e}"


def check_cluster(args: argparse.Namespace, topic: str | None = None) -> list[int]:
    """Fail (CommandError) unless some broker answers within --connect-timeout-ms; with
    ``topic``, return its partition ids (failing if it does not exist)."""
    from tidelog import Admin
    from tidelog.protocol.errors import TidelogError

    timeout_ms = args.connect_timeout_ms
    with Admin(args.bootstrap, client_id="tidelog-cli", request_timeout_ms=timeout_ms,
               default_api_timeout_ms=timeout_ms, **connection_options(args)) as admin:
        try:
            admin.describe_cluster()
        except TidelogError as e:
            raise CommandError(unreachable(args.bootstrap, e)) from None
        if topic is None:
            return []
        (description,) = admin.describe_topics([topic])
    partitions = [p.partition for p in description.partitions]
    if not partitions:
        raise CommandError(f"topic {topic!r} has no partitions")
    return partitions


# -- output -----------------------------------------------------------------------------------


def or_dash(v: int | None) -> str:
    """An offset, or "-" when unknown (None or negative), as Kafka's tools print it."""
    return "-" if v is None or v < 0 else str(v)


def table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, as kafka-consumer-groups prints them."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [" ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
