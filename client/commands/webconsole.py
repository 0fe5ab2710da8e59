"""``tidelog console``: the web console (tidelog.webconsole) for one cluster.

It talks to the cluster only through the SDK (Admin, a producer, a consumer per read of the
message browser), with ``--command-config``'s security settings, and serves its page on
127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from tidelog.commands.common import EXIT_OK, UsageError, add_command, client_options, connection_options, run_command

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    add_command(commands, "console", "serve the web console: brokers, replicas' offsets, groups' lag, live",
                "Serve a web console for the cluster: brokers, topics, each partition's replicas with their "
                "log start offset, log end offset and the high watermark, consumer groups and their lag, a "
                "message browser, and topic and group actions. It reaches the cluster only through the SDK.",
                arguments, run)


def arguments(p: argparse.ArgumentParser) -> None:
    client_options(p)
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to serve on (default 8080)")
    p.add_argument("--refresh-ms", type=int, default=1000, metavar="MS",
                   help="how often the console polls the cluster and the page refreshes (default 1000)")
    p.add_argument("--window-s", type=int, default=300, metavar="S",
                   help="how much history of rates and lags the console keeps in memory (default 300)")
    p.add_argument("--login-user", metavar="USER", default=os.environ.get("TIDELOG_CONSOLE_USER"),
                   help="require this user to log in (basic auth; needs --certfile/--keyfile); "
                        "the password is TIDELOG_CONSOLE_PASSWORD or --login-password-file")
    p.add_argument("--login-password-file", metavar="FILE", help="a file holding the login's password")
    p.add_argument("--certfile", metavar="PEM", help="serve HTTPS with this certificate (chain)")
    p.add_argument("--keyfile", metavar="PEM", help="the certificate's private key")


def run(args: argparse.Namespace) -> int:
    return run_command("console", _console, args)


def _login(args: argparse.Namespace) -> tuple[str, str] | None:
    if not args.login_user:
        return None
    if args.login_password_file:
        try:
            with open(args.login_password_file, encoding="utf-8") as f:
                return args.login_user, f.read().strip()
        except OSError as e:
            raise UsageError(f"--login-password-file: cannot read {args.login_password_file}: "
                             f"{e.strerror or e}") from None
    return args.login_user, os.environ.get("TIDELOG_CONSOLE_PASSWORD", "")


def _console(args: argparse.Namespace) -> int:
    import trio

    from tidelog.webconsole.server import ConsoleConfig, serve

    config = ConsoleConfig(args.bootstrap, args.host, args.port, args.refresh_ms, args.window_s,
                           connection_options(args), _login(args), args.certfile, args.keyfile)
    if (problem := config.problem()) is not None:
        raise UsageError(problem)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    trio.run(serve, config)
    return EXIT_OK
